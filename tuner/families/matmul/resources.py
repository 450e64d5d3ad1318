"""What a matmul variant holds, computed on the host: its registers of loads in flight, its shared
memory (the rings, A's stage, the scale table), the span of a window, and stream-K's runs. The
constraints (:mod:`.space`) bound the first, the launch plan (:mod:`.plan`) sizes the second; both
follow the templates (kernel_templates/matmul/), whose headers say what each knob changes."""

from __future__ import annotations

__all__ = ["ks_registers", "rows_registers", "rows_span", "rows_stage_bytes", "scale_table_bytes", "ring_bytes",
           "bulk_chunk", "bulk_row_bytes", "bulk_stage_bytes", "bulk_ring_bytes", "stream_k_runs", "stream_k_cta",
           "stream_k_parts"]


def ks_registers(load_bytes, rows_per_warp, mtile, unroll, prefetch, stages=0, feed="lanes", stats="lanes") -> int:
    """32-bit registers the K-split path holds for its loads in flight: per window, W (two rows of
    each m16 tile), the raw statistics (with the tile's scale table: one block column instead),
    and the batch rows' run of A; twice that when the next group is prefetched. With the per-warp
    shared-memory ring (``stages`` > 0) W and the statistics are in shared memory: the registers
    hold A for two groups. With the bulk feed everything is in
    shared memory: the registers hold one group (W, the statistics and A) read back."""
    words = max(1, load_bytes // 4)
    rt, nt = rows_per_warp // 16, mtile // 8
    if stages and feed == "bulk":
        return unroll * (rt * 2 * words + rt * 4 + nt * load_bytes)
    if stages:
        return 2 * unroll * nt * load_bytes
    per_window = rt * 2 * words + (1 if stats == "tile" else rt * 4) + nt * load_bytes
    return (1 + prefetch) * unroll * per_window


def rows_registers(load_bytes, rows_per_warp, unroll, prefetch, span=1) -> int:
    """32-bit registers the row-tile tensor-core path (mma-rows) holds for its loads in flight: per
    group, W of ``unroll`` windows (rows g and g+8 of each m16 tile) and the raw statistics of a lane's
    share of the group's ``unroll`` x ``span`` blocks per row (a quad loads them: one block per lane and
    row while there are at most 4); twice that with the prefetch, three times two groups ahead (prefetch 2).
    A is read from its shared-memory stage window by window."""
    words = max(1, load_bytes // 4)
    rt = rows_per_warp // 16
    slots = -(-unroll * span // 4)
    return (1 + prefetch) * (unroll * rt * 2 * words + slots * rt * 2 * 2)


def rows_span(load_bytes, blocksize) -> int:
    """The blocks a window of the row-tile tensor-core path spans (its ``span`` knob must match): a
    window is 8 x ``load_bytes`` values."""
    return max(1, 8 * load_bytes // blocksize)


def rows_stage_bytes(kper, arows, act_bytes=2) -> int:
    """The row-tile tensor-core path's stage of A: ``arows`` batch rows of the K slice in the operand
    order, a row's 2 x kper bytes rounded up to 128 plus 64 (mma_rows.cu's tc_a_pitch: a quarter warp's
    two quads then hit all 32 banks)."""
    return arows * (-(-kper * act_bytes // 128) * 128 + 64)


def scale_table_bytes(rows_per_warp, kper, blocksize) -> int:
    """Shared memory of the tile's scale table (``stats`` tile): a float per block column of the K
    slice (a slice not on a block boundary touches one more) and row of the tile, rows padded by one."""
    return (-(-kper // blocksize) + 1) * (rows_per_warp + 1) * 4


def ring_bytes(load_bytes, rows_per_warp, unroll, stages, warps, stats="lanes") -> int:
    """Shared memory of the K-split path's ring: ``stages`` groups per warp, each W (``load_bytes``
    per lane and row pair) and its statistics (8 bytes per lane and row pair; none with the tile's
    scale table)."""
    return warps * stages * unroll * (rows_per_warp // 16) * 2 * 32 * (load_bytes + (0 if stats == "tile" else 8))


def bulk_chunk(load_bytes, warps, unroll) -> int:
    """K per chunk of the bulk feed: warps x unroll windows of 8 x load_bytes values."""
    return warps * unroll * 8 * load_bytes


def bulk_row_bytes(load_bytes, warps, unroll) -> int:
    """The bulk feed's stride between a chunk's W rows in shared memory: a row's KC/2 bytes rounded
    up to 128, plus 4 x load_bytes so that the rows of one load phase fall in distinct banks."""
    return -(-bulk_chunk(load_bytes, warps, unroll) // 2 // 128) * 128 + 4 * load_bytes


def bulk_stage_bytes(load_bytes, rows_per_warp, unroll, warps, arows, act_bytes=2) -> tuple:
    """(stage bytes, zero row bytes) of the bulk feed (mma_ks_bulk.cu's bulk_geometry): W rows, then
    ``arows`` batch rows of A (2 x KC rounded up to 128, plus 16), then each W row's statistics
    (the aligned words of its absmax bytes and two group absmax, or a float per block of 32 values
    at least)."""
    kc = bulk_chunk(load_bytes, warps, unroll)
    arowb = -(-kc * act_bytes // 128) * 128 + 16
    nested, plain = 4 * ((kc // 32 + 3) // 4 + 1) + 8, kc // 8
    sb = -(-max(nested, plain) // 16) * 16
    stage = rows_per_warp * (bulk_row_bytes(load_bytes, warps, unroll) + sb) + arows * arowb
    return stage, kc * act_bytes


def bulk_ring_bytes(load_bytes, rows_per_warp, unroll, stages, warps, arows) -> int:
    """Shared memory of the bulk feed's ring: ``stages`` chunks, and one zero row of A."""
    stage, zero = bulk_stage_bytes(load_bytes, rows_per_warp, unroll, warps, arows)
    return stages * stage + zero



def stream_k_runs(units: int, ctas: int) -> list:
    """Stream-K's even shares (mma-rows with persist): CTA c takes units [c*units//ctas, (c+1)*units//ctas),
    as the kernel computes them."""
    if not 0 < ctas <= units:
        raise ValueError(f"stream-K needs 1..{units} CTAs for {units} units, not {ctas}")
    return [(c * units // ctas, (c + 1) * units // ctas) for c in range(ctas)]


def stream_k_cta(u: int, units: int, ctas: int) -> int:
    """The CTA whose stream-K run holds unit ``u`` (the template's stream_k_cta)."""
    return ((u + 1) * ctas - 1) // units


def stream_k_parts(tiles: int, groups: int, ctas: int) -> list:
    """For each row tile of ``groups`` units: how many CTAs' runs it is cut into (the kernel's count of the
    CTAs that add a slice of it to the workspace; 1: one CTA writes it whole)."""
    units = tiles * groups
    return [stream_k_cta((r + 1) * groups - 1, units, ctas) - stream_k_cta(r * groups, units, ctas) + 1
            for r in range(tiles)]
