"""What a matmul variant holds, computed on the host: its registers of loads in flight, its shared
memory (the rings, A's stage, the scale table, mma-cols' table and stage), the span of a window, and
stream-K's runs. The constraints (:mod:`.space`) bound the first, the launch plan (:mod:`.plan`) sizes
the second; both follow the templates (kernel_templates/matmul/), whose headers say what each knob changes."""

from __future__ import annotations

__all__ = ["ks_registers", "rows_registers", "rows_span", "rows_stage_bytes", "scale_table_bytes", "ring_bytes",
           "bulk_chunk", "bulk_row_bytes", "bulk_stage_bytes", "bulk_ring_bytes", "stream_k_runs", "stream_k_cta",
           "stream_k_parts", "cols_registers", "cols_window", "cols_pitch", "cols_stage_bytes", "cols_smem",
           "COLS_TABLE_BYTES", "COLS_STAGE_BELOW"]


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



#: mma-cols' pair table (256 rows of 256 bytes: the 16-bit pairs per lane, the nested code in the upper halves)
COLS_TABLE_BYTES = 256 * 256
#: mma-cols with table64: A's stage at most this big goes below the 64 KiB-aligned table (the space between
#: the dynamic shared memory's start and the next 64 KiB boundary: 64 KiB less the static shared memory and
#: what the runtime reserves before it, taken as at most 5.4 KiB); a larger stage goes above it
COLS_STAGE_BELOW = 60000


def cols_registers(part, cols_mb, rows_per_warp, prefetch, mtile) -> int:
    """32-bit registers the column tensor-core path (mma-cols) holds for its windows (an estimate the space
    bounds; the rest of the kernel takes about 50 more): W, a window's part / cols_mb bytes per lane and row
    (rows g and g + 8 of each m16 tile), two window sets with the prefetch; the accumulators, a window's sums
    and the totals, 4 each per (m16 tile, n8 tile); A's operand chunk, 4 per n8 tile."""
    rt, nt = rows_per_warp // 16, mtile // cols_mb
    return (1 + prefetch) * rt * 2 * (part // cols_mb // 4) + 2 * 4 * rt * nt + 4 * nt


def cols_window(part, cols_mb) -> int:
    """K per window of mma-cols: its 8 / cols_mb parts (the split-K slices are whole windows)."""
    return 8 // cols_mb * part


def cols_pitch(kper, part, cols_mb) -> int:
    """Bytes per staged batch row of A in mma-cols (mma_cols.cu's cols_a_pitch): per part of the K slice
    2 x part bytes (cols_mb 1: 4 x part, A's words as (b0, b1) register pairs with a zero) plus 16, rounded up
    to 128, plus 16."""
    pstr = (4 if cols_mb == 1 else 2) * part + 16
    return -(-(kper // part) * pstr // 128) * 128 + 16


def cols_stage_bytes(kper, part, cols_mb, arows) -> int:
    """mma-cols' stage of A: ``arows`` batch rows of the K slice (kper, whole windows)."""
    return arows * cols_pitch(kper, part, cols_mb)


def cols_smem(stage, table64) -> int:
    """mma-cols' dynamic shared memory for a stage of A of ``stage`` bytes: with table64, two 64 KiB spans (the
    table starts at the first 64 KiB boundary inside them) and the stage above the table when it does not fit
    below (COLS_STAGE_BELOW); without, the table then the stage."""
    if table64:
        return 2 * COLS_TABLE_BYTES + (stage if stage > COLS_STAGE_BELOW else 0)
    return COLS_TABLE_BYTES + stage


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
