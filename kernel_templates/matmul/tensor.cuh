// nf4-tune matmul: what the two row-operand tensor-core structures share (mma-ks and mma-rows).
// Joined after codes.cuh and matmul/common.cuh, before matmul/ks.cuh + mma_ks.cu / mma_ks_bulk.cu or
// matmul/mma_rows.cu.
//
// mma.sync.m16n8k16 with W's rows as the mma's M (16) and the batch as its N (8): a batch of 1..8
// wastes at most 7/8 of an n8 tile, not 15/16 of an m16 one.
//   Window: a quad of lanes (t = 0..3) covers 4 runs of 2 x NF4T_LOAD_BYTES values; lane (g, t) holds
//   rows g and g+8 of its run of W (one load each) and row g of the batch for the same run, so K is
//   permuted identically on both operands and both are loaded as they lie.
//   Decode: each packed byte becomes a pair of 16-bit operands, (code[hi], code[lo]) rounded to the
//   operand dtype (pair16: lut pair's 256-entry table replicated per lane, [byte][lane], so a warp's 32
//   lookups hit 32 banks; lut pairx's 256-byte rows; lut prmt's permutes; lut shared / register build
//   the pair from two code lookups and one conversion).
//   Scale: once per window and block (NF4T_SCALE_BLOCK): the mma sums code * a over the window, one
//   multiply by the block's scale per accumulator follows (tc_scale_add). The weight is thus the code
//   rounded to the operand dtype times the fp32 scale (bnb's dequantize rounds code * scale instead;
//   both are one rounding of the operand dtype away from the float32 weight).
//
// Knobs read here: NF4T_ROWS_PER_WARP (16 or 32: m16 tiles), NF4T_MTILE (8, 16, 32, 64: n8 tiles),
// NF4T_LOAD_BYTES (the run), NF4T_UNROLL (windows per group).

#define NF4T_NT (NF4T_MTILE / 8)
#define NF4T_RT (NF4T_ROWS_PER_WARP / 16)
#define NF4T_RUN (2 * NF4T_LOAD_BYTES)             // values of K per lane per row per window
#define NF4T_WIN (4 * NF4T_RUN)              // K per window
#define NF4T_NBMAX (NF4T_WIN / 32)           // blocks a window can span (blocksize 32)
#define NF4T_U NF4T_UNROLL

__device__ __forceinline__ float ks_scale(const Scales& s, ScaleRaw r) {
    if (s.absmax_f != nullptr) return r.a;
    return __fadd_rn(__fmul_rn(nf4t_code2[r.q], r.a), s.offset);
}

// One k-step st of a window on the tensor cores: cp += the code pairs of W's row tiles for that step (lane (g, t):
// rows g and g + 8 of each tile) times A's columns col, col + 1 of each batch tile in a
template <int L>
__device__ __forceinline__ void tc_step_mma(const u32 (&w)[NF4T_RT][2][NF4T_WWORDS], const u32 (&a)[NF4T_NT][L],
                                            int st, int col, u32 lane4, float (&cp)[NF4T_RT][NF4T_NT][4]) {
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt) {
        const u32 a0 = pair16(w[rt][0][(2 * st) >> 2], 2 * st, lane4);
        const u32 a1 = pair16(w[rt][1][(2 * st) >> 2], 2 * st, lane4);
        const u32 a2 = pair16(w[rt][0][(2 * st + 1) >> 2], 2 * st + 1, lane4);
        const u32 a3 = pair16(w[rt][1][(2 * st + 1) >> 2], 2 * st + 1, lane4);
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt) mma16816(cp[rt][nt], a0, a1, a2, a3, a[nt][col], a[nt][col + 1]);
    }
}

// One window: the code pairs of W's row tiles (the lane's run of the window) times the batch tiles' runs of A
// (the lane's batch row g, the same run), for windows that lie in one block (the scale follows, tc_scale_add)
__device__ __forceinline__ void tc_window_mma(const u32 (&w)[NF4T_RT][2][NF4T_WWORDS],
                                              const u32 (&a)[NF4T_NT][NF4T_LOAD_BYTES], u32 lane4,
                                              float (&cp)[NF4T_RT][NF4T_NT][4]) {
#pragma unroll
    for (int st = 0; st < NF4T_LOAD_BYTES / 2; ++st) tc_step_mma(w, a, st, 2 * st, lane4, cp);
}

// ... one 16-byte chunk c of the lane's run (k-steps 2c, 2c + 1), A's chunk in a[nt][0..3]
__device__ __forceinline__ void tc_chunk_mma(const u32 (&w)[NF4T_RT][2][NF4T_WWORDS], const u32 (&a)[NF4T_NT][4],
                                             int c, u32 lane4, float (&cp)[NF4T_RT][NF4T_NT][4]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) tc_step_mma(w, a, 2 * c + j, 2 * j, lane4, cp);
}

// acc += the block's scale x a window's sums: sc[rt][0] for row g (c0, c1), sc[rt][1] for row g + 8 (c2, c3)
__device__ __forceinline__ void tc_scale_add(float (&acc)[NF4T_RT][NF4T_NT][4], const float (&cp)[NF4T_RT][NF4T_NT][4],
                                             const float (&sc)[NF4T_RT][2]) {
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt) {
            acc[rt][nt][0] = fmaf(sc[rt][0], cp[rt][nt][0], acc[rt][nt][0]);
            acc[rt][nt][1] = fmaf(sc[rt][0], cp[rt][nt][1], acc[rt][nt][1]);
            acc[rt][nt][2] = fmaf(sc[rt][1], cp[rt][nt][2], acc[rt][nt][2]);
            acc[rt][nt][3] = fmaf(sc[rt][1], cp[rt][nt][3], acc[rt][nt][3]);
        }
}

// ... with a scale per column (mma-rows, NF4T_SPAN > 1: column 2t + i holds a part of its own block):
// sc[rt][h][i] for row g + 8h, column 2t + i
__device__ __forceinline__ void tc_scale_add(float (&acc)[NF4T_RT][NF4T_NT][4], const float (&cp)[NF4T_RT][NF4T_NT][4],
                                             const float (&sc)[NF4T_RT][2][2]) {
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[rt][nt][i] = fmaf(sc[rt][i >> 1][i & 1], cp[rt][nt][i], acc[rt][nt][i]);
}
