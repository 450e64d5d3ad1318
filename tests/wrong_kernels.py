"""Wrong kernels that the gate must reject: a config's rendered source with one line changed.

Each mutation names a text that must occur exactly once in the config's source. The GPU tests hand the changed
source to the gate; ``tests/test_matmul_kernels.py`` checks on the CPU that every anchor still occurs once, so a
template edit that moves one fails there, not first on a GPU machine."""

from nf4tune.families import MATMUL as MM

#: SIMT at the served M = 1 shape (16-byte loads, 4 rows per warp, one scale per run)
SIMT = MM.config(load_bytes=16, rows_per_warp=4, mtile=1, warps=4, ksplit=1, m=1)
#: the tensor-core path that scales every weight (experimental)
MMA = MM.config(mma="mma", rows_per_warp=16, mtile=8, warps=4, ksplit=1, scale="value", m=8)
#: mma-cols at M = 1 (one batch row per n8 tile, two runs of a row per lane)
COLS = MM.config(mma="mma-cols", lut="pairx", astage="shared", load_bytes=16, scale="block", warps=8,
                 rows_per_warp=16, mtile=1, prefetch=1, m=1)

#: name -> (config, text, replacement)
MUTATIONS = {
    # the second value of each byte multiplied where the first belongs
    "simt-swapped-values": (SIMT, "acc = fmaf(first, a[2 * j], acc);", "acc = fmaf(second, a[2 * j], acc);"),
    # the first value of each byte left unscaled
    "mma-unscaled": (MMA, "return pack_pair(__fmul_rn(first, sc), __fmul_rn(second, sc));",
                     "return pack_pair(first, __fmul_rn(second, sc));"),
    # the second run of a row (part t + 4) fed as the first's
    "cols-first-run-twice": (COLS, "cols_pair(W.w[rt][0][COLS_RUNW + wi]", "cols_pair(W.w[rt][0][wi]"),
    # the scale of every part taken from its first block
    "cols-one-scale": (COLS, "cols_code2(W.q[rt][h][0], j, L.lane_hi)", "cols_code2(W.q[rt][h][0], 0, L.lane_hi)"),
}


def wrong_source(name: str, config=None) -> str:
    """The mutation's config's source (or ``config``'s, a launchable variant of it) with its one line changed; an
    error if the text is not there exactly once."""
    base, old, new = MUTATIONS[name]
    config = config or base
    src = config.render()
    if src.count(old) != 1:
        raise AssertionError(f"{name}: {old!r} occurs {src.count(old)} times in {config.short()}'s source, not once")
    return src.replace(old, new)
