// nf4-tune matmul, structure MMA-ROWS (NF4T_MMA_MMA_ROWS): tensor cores with W's rows as the mma's M
// (tensor.cuh's operands, window and decode), each warp owning its row tiles over the CTA's K slice.
// Joined after codes.cuh, matmul/common.cuh and matmul/tensor.cuh.
//
// What changes against mma-ks is who does what:
//   - a CTA owns warps x NF4T_ROWS_PER_WARP rows and a K slice, and warp w owns its rows over the whole
//     slice: no warp's sums meet another's, so there is no reduction in shared memory and no barrier
//     after the start (mma-ks splits a tile's K over its warps and reduces at every tile);
//   - the CTA stages its batch rows of A for the slice in shared memory once, in the operand order
//     (tc_a_slot): A leaves L2 once per CTA of up to 512 rows, not once per 16 or 32 rows, and a lane's
//     run of a window is LOAD_BYTES/4 16-byte shared loads without bank conflicts;
//   - a group's statistics are loaded once per row and window, not once per lane: lane (g, t) loads the
//     block of window t % UNROLL for rows g, g+8 of each tile, finishes those scales, and the quad passes
//     them round by shuffles. A window's part in one block takes one multiply by its scale.
// A group of NF4T_UNROLL windows is loaded at once. Warps whose rows are all < N load without bounds and
// with the statistics' kind fixed at compile time, but for a slice's last, partial group.
//
// Knobs (besides common.cuh's and tensor.cuh's):
//   NF4T_ROWS_PER_WARP  16 or 32: m16 tiles per warp.
//   NF4T_MTILE          8, 16, 32 or 64: n8 tiles of the batch (mtile / span batch rows per CTA).
//   NF4T_LUT            NF4T_LUT_PAIR, NF4T_LUT_PAIRX or NF4T_LUT_PRMT (16-bit code pairs).
//   NF4T_SPAN           blocks a window spans (1, 2, 4). 1: a window lies in one block (8 x LOAD_BYTES <=
//                       blocksize). 2, 4 (16-byte loads at blocksize 64 or 32): the mma's n8 columns are
//                       (batch row, part) pairs, column c = batch row c / SPAN, part c % SPAN, and lane
//                       (g, t) feeds its run of A only into the column of its own part (g % SPAN ==
//                       t*SPAN/4; zeros elsewhere). So one mma per window still gives each part's sums
//                       apart, in the columns a lane already holds (2t, 2t+1); each is scaled by its part's
//                       block, and the parts of a batch row are added once, at the end. At M = 1 the
//                       columns are free (7 of 8 held padding). The statistics: SPAN blocks per window,
//                       UNROLL x SPAN per group, shared out over the quad as before. The plan asks SPAN ==
//                       8 x LOAD_BYTES / blocksize (at least 1). Span 4 never won a served entry
//                       (experimental).
//   NF4T_PREFETCH       0: a group is loaded, then computed; 1: the next group is issued before the
//                       current one is computed; 2 (16-byte loads): two groups ahead (three times the
//                       registers for W), so each compute overlaps two groups' loads. On the H100
//                       (2026-12-05) the span kernel's per-SM rate followed its warps (latency per warp)
//                       and the L1 pipe was not its bound; two groups ahead add bytes in flight per warp
//                       without the coarser groups of unroll 4. Measured equal to 1 on the H200
//                       (2026-12-06); never served (experimental).
//   NF4T_PRMT_QUARTERS  (lut pairx, 8- or 16-byte loads) quarters of a lane's packed bytes decoded by lut
//                       prmt's byte permutes instead of the pair table (0, 1, 2): the byte pairs h of a load
//                       with h % 4 < PRMT_QUARTERS. pairx costs a permute and a shared load per byte (the
//                       L1 pipe that W's loads share: 84% busy in an ncu profile on the H100, 2026-12-05),
//                       prmt about 5.5 ALU instructions and no memory; a mix moves part of the decode off
//                       the L1 pipe. The same 16-bit codes: the same sums bit for bit. Screened on the
//                       H100 (2026-12-05): no gain (28672x8192, M = 1: 52.29 / 52.40 / 52.69 us for 0 / 1
//                       / 2); experimental.
//   NF4T_PERSIST        1: stream-K: the grid is the CTAs resident at once (times ksplit: the plan's CTAs
//                       per resident slot; the kernel takes gridDim.x as it comes), and each takes an equal
//                       run of the (row tile, group of K) units, row tile major, as slices of one tile at a
//                       time; a tile cut between CTAs is summed in the split-K workspace and finished by its
//                       last CTA. A CTA per (row tile, K slice) runs only as many warps as the tiles have:
//                       28672 rows of 256-row tiles are 112 CTAs on 132 SMs (H100, 2026-12-05: the time
//                       follows the warps in flight). 16-row warps and the 8-row batch tile only.
//   NF4T_REGCAP         (without stream-K) 0: no cap; N: __maxnreg__(N), at most N registers a thread, so
//                       that more warps fit an SM's four register sub-partitions (16,384 registers each,
//                       allocated 256 a warp: 80 registers fit 6 warps a sub-partition, 72 fit 7, against 4
//                       at 104-128). An ncu profile on the H100 (2026-12-07, M = 16): the served kernel
//                       (8-byte loads, 16-row batch tile, unroll 4) ran one CTA of 14 warps an SM at 103
//                       registers, latency-bound (21.6% occupancy, long-scoreboard stalls first). Capped
//                       at 80 (NVRTC 13.5, sm_90) it spills 72 bytes, 45 instructions of them in its
//                       loops. Swept on the H100 (2026-12-07): no gain (the best capped config 1.8% slower
//                       at 28672x8192, M = 16); experimental.
//   NF4T_ACHUNK         0: a window's runs of A are read from shared memory at once, LOAD_BYTES registers a
//                       batch tile (8 batch rows) held through the window's k-steps; 1: one 16-byte chunk at
//                       a time (its loads for every batch tile, then its two k-steps): 4 registers a batch
//                       tile. NVRTC 13.5, sm_90 (2026-12-07): the served M = 16 kernel (8-byte loads,
//                       unroll 4) 109 -> 89 registers, the 16-byte span-2 kernel with the 32-row batch
//                       tile 182 -> 128, no spills: a window's A was the largest live set (the asm volatile
//                       loads and mmas keep their order, so all of a window's loads were issued, and live,
//                       before its first mma). The mmas run in the same order: the same sums bit for bit.
//                       The shared loads' latency is then exposed per chunk, hidden by the warps the
//                       registers free.
// Launch: warps per CTA up to 16 (one pair table and one stage of A for more warps).

#define NF4T_GK (NF4T_U * NF4T_WIN)     // K per group
#define NF4T_CH (NF4T_LOAD_BYTES / 4)         // 16-byte chunks (8 values) of A in a lane's run
#define NF4T_AREGS (NF4T_ACHUNK ? 4 : NF4T_LOAD_BYTES)   // registers of A a batch tile holds
#define NF4T_CPR (8 / NF4T_SPAN)        // batch rows per n8 tile
#define NF4T_SPART (NF4T_WIN / NF4T_SPAN) // K per span part of a window (in one block)
#define NF4T_SB (NF4T_U * NF4T_SPAN)    // blocks per row and group
#define NF4T_SQ ((NF4T_SB + 3) / 4)     // of which a lane loads NF4T_SQ per row
#if NF4T_SPAN != 1 && NF4T_SPAN != 2 && NF4T_SPAN != 4
#error "NF4T_SPAN is 1, 2 or 4"
#endif

struct RowsGroup {
    u32 w[NF4T_U][NF4T_RT][2][NF4T_WWORDS];   // window u: rows g, g+8 of each tile
    ScaleRaw raw[NF4T_SQ][NF4T_RT][2];         // slot q: block (4q + t) % SB of the group, rows g, g+8 of each tile
};

// Offset in K from a group's start of the block a lane's statistics slot q holds: the group's block j =
// (4q + t) % SB is part j % SPAN of window j / SPAN (SPAN 1: the block of window t % U)
__device__ __forceinline__ u32 rows_stat_offset(u32 q, u32 t) {
    const u32 j = (4u * q + t) % NF4T_SB;
    return (j / NF4T_SPAN) * NF4T_WIN + (j % NF4T_SPAN) * NF4T_SPART;
}

// A's stage: byte offset of the 16-byte chunk holding slice offset kk (a multiple of 8) in a batch row.
// Chunk c of run t of window v lies at ((v*CH + c)*4 + t)*16, so a quad's four runs of a chunk are 64
// contiguous bytes; batch rows lie tc_a_pitch apart (64 mod 128), so a quarter warp's two quads hit
// all 32 banks. tuner/families/matmul/resources.py sizes the stage with the same pitch.
__device__ __forceinline__ u32 tc_a_slot(u32 kk) {
    const u32 v = kk / NF4T_WIN, r = kk % NF4T_WIN;
    return ((v * NF4T_CH + (r % NF4T_RUN) / 8u) * 4u + r / NF4T_RUN) * 16u;
}
__device__ __forceinline__ u32 tc_a_pitch(u32 kper) { return ((kper * 2u + 127u) & ~127u) + 64u; }

// A group's W (zeros past N or past the slice) and its statistics, with bounds; the statistics' kind
// chosen at run time
__device__ __forceinline__ void rows_load(RowsGroup& G, const u8* __restrict__ B, const Scales& s, u32 row0, u32 N,
                                          u32 K, u32 k_end, u32 g, u32 t, u32 kw) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
        const u32 k = kw + u * NF4T_WIN + t * NF4T_RUN;
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 n = row0 + rt * 16 + g + 8 * h;
                if (n < N && k < k_end) {
                    load_w(B + (((u64)n * K + k) >> 1), G.w[u][rt][h]);
                } else {
#pragma unroll
                    for (int i = 0; i < NF4T_WWORDS; ++i) G.w[u][rt][h][i] = 0u;
                }
            }
    }
#pragma unroll
    for (int q = 0; q < NF4T_SQ; ++q) {
        const u32 ks = kw + rows_stat_offset(q, t);   // the block this slot holds
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 n = row0 + rt * 16 + g + 8 * h;
                if (n < N && ks < k_end) {
                    G.raw[q][rt][h] = scale_load(s, n * K + ks);
                } else {
                    G.raw[q][rt][h].q = 0u;
                    G.raw[q][rt][h].a = 0.0f;
                }
            }
    }
}

// Full warps (every row < N) walk W by pointers: the lane's run of each row at the next group's first
// window, and the element index of the block its statistics slot 0 holds (slot q: 4q/SPAN windows on);
// a group is then loads at fixed offsets from them, and one add each to move on (n*K + k < 2^31: the
// family refuses larger weights)
struct RowsCursor {
    const u8* w[NF4T_RT][2];
    u32 e[NF4T_RT][2];
};
__device__ __forceinline__ RowsCursor rows_cursor(const u8* __restrict__ B, u32 row0, u32 K, u32 g, u32 t, u32 kw) {
    RowsCursor c;
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 e = (row0 + rt * 16 + g + 8 * h) * K + kw;
            c.w[rt][h] = B + ((e + t * NF4T_RUN) >> 1);
            c.e[rt][h] = e + rows_stat_offset(0u, t);
        }
    return c;
}
template <bool kNested>
__device__ __forceinline__ void rows_load_full(RowsGroup& G, RowsCursor& c, const Scales& s) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u)
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h) load_w(c.w[rt][h] + u * (NF4T_WIN / 2), G.w[u][rt][h]);
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int q = 0; q < NF4T_SQ; ++q) {
                const u32 b = (c.e[rt][h] + q * (4 / NF4T_SPAN) * NF4T_WIN) >> s.log2_bs;
                G.raw[q][rt][h].q = kNested ? (u32)__ldg(s.absmax_q + b) : 0u;
                G.raw[q][rt][h].a = kNested ? __ldg(s.absmax2 + (b >> s.log2_g)) : __ldg(s.absmax_f + b);
            }
            c.w[rt][h] += NF4T_GK / 2;
            c.e[rt][h] += NF4T_GK;
        }
}

// The group at kn: by the cursor where the warp's rows are full and the group lies inside the slice, else
// with bounds
template <bool kFull, bool kNested>
__device__ __forceinline__ void rows_load_next(RowsGroup& G, RowsCursor& cur, const u8* __restrict__ B, const Scales& s,
                                               u32 row0, u32 N, u32 K, u32 k_end, u32 g, u32 t, u32 kn) {
    if (kFull && kn + NF4T_GK <= k_end) rows_load_full<kNested>(G, cur, s);
    else rows_load(G, B, s, row0, N, K, k_end, g, t, kn);
}

// A 16-byte chunk of A's stage into v where the lane's batch row exists; elsewhere v keeps what it held
// (the mma's column of a batch row past M only reaches outputs that are never written), so no zeros
// are moved in
template <int L>
__device__ __forceinline__ void lds128_if(u32 (&v)[NF4T_NT][L], int nt, int i, bool in, u32 addr) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %4, 0;\n\t@p ld.shared.v4.u32 {%0, %1, %2, %3}, [%5];\n\t}"
        : "+r"(v[nt][i]), "+r"(v[nt][i + 1]), "+r"(v[nt][i + 2]), "+r"(v[nt][i + 3]) : "r"((u32)in), "r"(addr));
}

// A group's windows on the tensor cores, added to acc. a_lane: the shared address of the lane's chunk 0
// of the group's first window in batch tile 0's row g; a_in[nt]: batch row nt*8 + g exists; a: the
// runs of A (NF4T_ACHUNK 1: one 16-byte chunk of them), held across calls (see lds128_if).
template <bool kFull, bool kNested>
__device__ __forceinline__ void rows_compute(const RowsGroup& G, float (&acc)[NF4T_RT][NF4T_NT][4], const Scales& s,
                                             u32 a_lane, u32 pitch, const bool (&a_in)[NF4T_NT],
                                             u32 (&a)[NF4T_NT][NF4T_AREGS], u32 lane, u32 lane4) {
    float own[NF4T_SQ][NF4T_RT][2];
#pragma unroll
    for (int q = 0; q < NF4T_SQ; ++q)
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                own[q][rt][h] = kFull ? scale_finish_known<kNested>(s, G.raw[q][rt][h]) : ks_scale(s, G.raw[q][rt][h]);
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
#if NF4T_SPAN == 1
        float sc[NF4T_RT][2];
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                sc[rt][h] = NF4T_U == 1 ? own[0][rt][h] : __shfl_sync(0xffffffffu, own[0][rt][h], (lane & ~3u) | (u32)u);
#else
        // column 2t + i holds part (2t + i) % SPAN: the group's block j = u*SPAN + that part, held in slot
        // j / 4 (the same for the whole quad) of lane j % 4
        float sc[NF4T_RT][2][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 src = (lane & ~3u) | ((u * NF4T_SPAN + (2u * (lane & 3u) + i) % NF4T_SPAN) & 3u);
#pragma unroll
            for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
                for (int h = 0; h < 2; ++h) sc[rt][h][i] = __shfl_sync(0xffffffffu, own[u * NF4T_SPAN / 4][rt][h], src);
        }
#endif
        // chunk c of the window's runs of A in batch tile nt
        auto a_chunk = [&](int nt, int c) { return a_lane + nt * NF4T_CPR * pitch + (u * NF4T_CH + c) * 64; };
        float cp[NF4T_RT][NF4T_NT][4];
        zero_frags(cp);
#if NF4T_ACHUNK
        // a chunk of A at a time: its 16-byte loads for every batch tile, then the chunk's two k-steps
#pragma unroll
        for (int c = 0; c < NF4T_CH; ++c) {
#pragma unroll
            for (int nt = 0; nt < NF4T_NT; ++nt)
                lds128_if(a, nt, 0, a_in[nt], a_chunk(nt, c));
            tc_chunk_mma(G.w[u], a, c, lane4, cp);
        }
#else
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
            for (int c = 0; c < NF4T_CH; ++c)
                lds128_if(a, nt, 4 * c, a_in[nt], a_chunk(nt, c));
        tc_window_mma(G.w[u], a, lane4, cp);
#endif
        tc_scale_add(acc, cp, sc);
    }
}

// A warp's groups from kw to the slice's end; G holds the first group's loads. kFull: every row of the
// warp is < N (the slice's last, partial group still takes the checked loads), kNested: the statistics
// are nested (with kFull)
template <bool kFull, bool kNested>
__device__ __forceinline__ void rows_steps(RowsGroup& G, float (&acc)[NF4T_RT][NF4T_NT][4], const u8* __restrict__ B,
                                           const Scales& s, u32 a_lane, u32 pitch,
                                           const bool (&a_in)[NF4T_NT], u32 row0, u32 N, u32 K, u32 kw, u32 k_end,
                                           u32 g, u32 t, u32 lane, u32 lane4) {
    u32 a[NF4T_NT][NF4T_AREGS];
#pragma unroll
    for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
        for (int i = 0; i < NF4T_AREGS; ++i) a[nt][i] = 0u;
    RowsCursor cur;
    if (kFull) cur = rows_cursor(B, row0, K, g, t, kw + NF4T_GK);
#if NF4T_PREFETCH == 2
    // two groups ahead: G holds the group at kw, G1 the next (loaded here); each step issues the group after
    // G1's before computing G's, so two groups' loads are in flight through every compute. The cursor
    // advances in load order (kw + GK, kw + 2 GK, ...), as with one group ahead.
    RowsGroup G1;
    if (kw + NF4T_GK < k_end) rows_load_next<kFull, kNested>(G1, cur, B, s, row0, N, K, k_end, g, t, kw + NF4T_GK);
#endif
    for (; kw < k_end; kw += NF4T_GK, a_lane += 2 * NF4T_GK) {
        const u32 kn = kw + NF4T_GK;
#if NF4T_PREFETCH == 2
        RowsGroup G2;
        if (kn + NF4T_GK < k_end) rows_load_next<kFull, kNested>(G2, cur, B, s, row0, N, K, k_end, g, t, kn + NF4T_GK);
        rows_compute<kFull, kNested>(G, acc, s, a_lane, pitch, a_in, a, lane, lane4);
        G = G1;
        G1 = G2;
#elif NF4T_PREFETCH == 1
        RowsGroup Gn;
        if (kn < k_end) rows_load_next<kFull, kNested>(Gn, cur, B, s, row0, N, K, k_end, g, t, kn);
        rows_compute<kFull, kNested>(G, acc, s, a_lane, pitch, a_in, a, lane, lane4);
        G = Gn;
#else
        rows_compute<kFull, kNested>(G, acc, s, a_lane, pitch, a_in, a, lane, lane4);
        if (kn < k_end) rows_load_next<kFull, kNested>(G, cur, B, s, row0, N, K, k_end, g, t, kn);
#endif
    }
}

// A's stage after lut pairx's table: the CTA's batch rows x the slice [k_begin, k_end) in whole groups
// (zeros past it)
__device__ __forceinline__ void rows_stage_a(const act_t* __restrict__ A, unsigned char* a_st, u32 pitch, u32 m0,
                                             u32 mrows, u32 K, u32 k_begin, u32 k_end) {
    if (k_begin < k_end) {
        const u32 len = k_end - k_begin;                                   // a multiple of 32 values
        const u32 chunks = (len + NF4T_GK - 1) / NF4T_GK * NF4T_GK / 8u;
        for (u32 i = threadIdx.x; i < mrows * chunks; i += blockDim.x) {
            const u32 m = i / chunks, kk = (i % chunks) * 8u;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (kk < len) v = *reinterpret_cast<const uint4*>(A + (u64)(m0 + m) * K + k_begin + kk);
            *reinterpret_cast<uint4*>(a_st + m * pitch + tc_a_slot(kk)) = v;
        }
    }
}

// A warp's sums over the staged slice [k_begin, k_end) of its rows row0.. (G holds the first group's
// loads), written to y (ws == nullptr) or added to the workspace (a slice of a split tile)
__device__ __forceinline__ void rows_slice(RowsGroup& G, const u8* __restrict__ B, const Scales& s,
                                           const float* __restrict__ absmax_f, const act_t* __restrict__ bias,
                                           act_t* __restrict__ out, float* __restrict__ ws, unsigned char* a_st,
                                           u32 pitch, u32 row0, u32 m0, u32 mrows, u32 N, u32 K, u32 k_begin,
                                           u32 k_end, u32 g, u32 t, u32 lane, u32 lane4) {
    float acc[NF4T_RT][NF4T_NT][4];
    zero_frags(acc);
    bool a_in[NF4T_NT];     // column g of batch tile nt takes this lane's run of A (batch row nt*CPR + g/SPAN)
#if NF4T_SPAN == 1
#pragma unroll
    for (int nt = 0; nt < NF4T_NT; ++nt) a_in[nt] = nt * 8 + g < mrows;
    const u32 a_lane = (u32)__cvta_generic_to_shared(a_st) + g * pitch + t * 16u;
#else
#pragma unroll
    for (int nt = 0; nt < NF4T_NT; ++nt)
        a_in[nt] = nt * NF4T_CPR + g / NF4T_SPAN < mrows && g % NF4T_SPAN == t * NF4T_SPAN / 4u;
    const u32 a_lane = (u32)__cvta_generic_to_shared(a_st) + (g / NF4T_SPAN) * pitch + t * 16u;
#endif
    if (row0 < N) {
        if (row0 + NF4T_ROWS_PER_WARP > N)
            rows_steps<false, false>(G, acc, B, s, a_lane, pitch, a_in, row0, N, K, k_begin, k_end, g, t, lane, lane4);
        else if (absmax_f == nullptr)
            rows_steps<true, true>(G, acc, B, s, a_lane, pitch, a_in, row0, N, K, k_begin, k_end, g, t, lane, lane4);
        else
            rows_steps<true, false>(G, acc, B, s, a_lane, pitch, a_in, row0, N, K, k_begin, k_end, g, t, lane, lane4);
    }

#if NF4T_SPAN == 1
    // c0, c1: row g, batch rows 2t, 2t+1; c2, c3: row g + 8
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 n = row0 + rt * 16 + g + (i >= 2 ? 8u : 0u), m = nt * 8 + 2 * t + (i & 1);
                if (n < N && m < mrows) emit(acc[rt][nt][i], m0 + m, n, N, bias, out, ws);
            }
#else
    // c0, c1: row g, columns 2t, 2t+1 (c2, c3: row g + 8): parts of batch row 2t / SPAN, added here (SPAN 4:
    // the other two parts are lane t ^ 1's)
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v = acc[rt][nt][2 * h] + acc[rt][nt][2 * h + 1];
#if NF4T_SPAN == 4
                v += __shfl_xor_sync(0xffffffffu, v, 1);
#endif
                const u32 n = row0 + rt * 16 + g + 8u * h, m = nt * NF4T_CPR + 2u * t / NF4T_SPAN;
                if ((NF4T_SPAN == 2 || (t & 1u) == 0u) && n < N && m < mrows) emit(v, m0 + m, n, N, bias, out, ws);
            }
#endif
}

#if NF4T_PERSIST == 1
// Stream-K (NF4T_PERSIST 1): the work is units of (row tile, group of K), row tile major; CTA c of P takes
// the units [c*T/P, (c+1)*T/P) of all T, so every CTA of the grid (as many as are resident at once) has
// the same share, where a CTA per (row tile, K slice) leaves SMs idle when the tiles are not a multiple
// of the resident CTAs (28672 rows of 256-row tiles: 112 CTAs on 132 SMs). The CTA holding unit u:
// the largest c with c*T/P <= u (tuner/families/matmul/resources.py: stream_k_runs computes the same; the plan
// keeps P <= T, so no CTA's run is empty and every CTA counted for a tile adds to it).
__device__ __forceinline__ u32 stream_k_cta(u32 u, u32 units, u32 ctas) {
    return (u32)(((u64)(u + 1u) * ctas - 1u) / units);
}

// One slice of a row tile (rows row_first.., K from k_begin to k_end): its W's first group, (the tables,
// for the CTA's first slice,) A's stage, the warps' sums to y or the workspace. Not inlined: inlined in the
// run's loop (or unrolled twice), ptxas moved the pair table's shared base out of the uniform registers and
// added it to every lookup (290-306 instructions a group against the one-slice kernel's 229, NVRTC 13, sm_90);
// as a function the group takes 243 and its loop no local memory (the call's saves are once per slice).
__device__ __noinline__ void rows_segment(const act_t* __restrict__ A, const u8* __restrict__ B, const Scales s,
                                          const float* __restrict__ code2, const float* __restrict__ absmax_f,
                                          const act_t* __restrict__ bias, act_t* __restrict__ out,
                                          float* __restrict__ ws, u32 N, u32 K, u32 kper, u32 m0, u32 mrows,
                                          u32 row_first, u32 k_begin, u32 k_end, bool first) {
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 g = lane >> 2, t = lane & 3, lane4 = lane << 2;
    const u32 row0 = row_first + warp * NF4T_ROWS_PER_WARP;
    RowsGroup G;
    if (row0 < N) rows_load(G, B, s, row0, N, K, k_end, g, t, k_begin);
    if (first) {
        setup_tables();
        if (code2 != nullptr)
            for (u32 i = threadIdx.x; i < 256; i += blockDim.x) nf4t_code2[i] = __ldg(code2 + i);
    } else {
        __syncthreads();                    // every warp is done with the previous slice's A
    }
    unsigned char* a_st = nf4t_dyn + NF4T_DYN_TABLE;
    const u32 pitch = tc_a_pitch(kper);
    rows_stage_a(A, a_st, pitch, m0, mrows, K, k_begin, k_end);
    __syncthreads();
    rows_slice(G, B, s, absmax_f, bias, out, ws, a_st, pitch, row0, m0, mrows, N, K, k_begin, k_end, g, t, lane, lane4);
}
#endif

#if NF4T_PERSIST == 1
// stream-K: at most 16 warps per CTA (the family's largest); without the bound the call to rows_segment took
// 159 registers (16 warps need at most 128); with it the slice's loop keeps its registers (no spills in it)
extern "C" __global__ void __launch_bounds__(512) nf4t_matmul(NF4T_MATMUL_PARAMS) {
#elif NF4T_REGCAP > 0
// NF4T_REGCAP: the registers a thread may take, capped so that more warps fit an SM (see the header)
extern "C" __global__ void __maxnreg__(NF4T_REGCAP) nf4t_matmul(NF4T_MATMUL_PARAMS) {
#else
extern "C" __global__ void nf4t_matmul(NF4T_MATMUL_PARAMS) {
#endif
    Scales s = make_scales(absmax_q, code2, absmax2, absmax_f, offset_ptr, log2_bs, log2_g);

    const u32 warps = blockDim.x >> 5;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 g = lane >> 2, t = lane & 3, lane4 = lane << 2;
    const u32 m0 = blockIdx.z * (NF4T_MTILE / NF4T_SPAN);              // batch rows per CTA: MTILE / SPAN
    const u32 mrows = min((u32)(NF4T_MTILE / NF4T_SPAN), M - m0);
#if NF4T_PERSIST == 0
    const u32 row_first = blockIdx.x * warps * NF4T_ROWS_PER_WARP;
    const u32 row0 = row_first + warp * NF4T_ROWS_PER_WARP;
    const u32 k_begin = blockIdx.y * kper;
    const u32 k_end = min(K, k_begin + kper);

    // the first group's W and statistics are loaded before the tables are filled and A is staged
    RowsGroup G;
    if (row0 < N && k_begin < k_end) rows_load(G, B, s, row0, N, K, k_end, g, t, k_begin);
    setup_tables();
    if (code2 != nullptr)
        for (u32 i = threadIdx.x; i < 256; i += blockDim.x) nf4t_code2[i] = __ldg(code2 + i);
    pdl_wait();                                           // A and y from here on
    unsigned char* a_st = nf4t_dyn + NF4T_DYN_TABLE;
    const u32 pitch = tc_a_pitch(kper);
    rows_stage_a(A, a_st, pitch, m0, mrows, K, k_begin, k_end);
    __syncthreads();
    rows_slice(G, B, s, absmax_f, bias, out, ws, a_st, pitch, row0, m0, mrows, N, K, k_begin, k_end, g, t, lane, lane4);
    if (ws != nullptr) {
        const u32 rows = min(warps * NF4T_ROWS_PER_WARP, N - row_first);
        finish_split(blockIdx.z * gridDim.x + blockIdx.x, row_first, rows, m0, mrows, N, bias, out, ws, counters,
                     gridDim.y);
    }
#else
    // stream-K: this CTA's run of units, a slice of one row tile at a time (kper: the longest slice, so A's
    // stage holds any). A tile's slice is written to y if it is the whole K, else added to the workspace and
    // the last of the tile's CTAs finishes it.
    const u32 tiles = (N + warps * NF4T_ROWS_PER_WARP - 1) / (warps * NF4T_ROWS_PER_WARP);
    const u32 gpt = (K + NF4T_GK - 1) / NF4T_GK;                       // groups per row tile
    const u32 units = tiles * gpt, ctas = gridDim.x;                     // units <= N*K / 512 < 2^22
    u32 u = (u32)((u64)blockIdx.x * units / ctas);
    const u32 u_end = (u32)((u64)(blockIdx.x + 1u) * units / ctas);
    pdl_wait();                                           // A, y and the workspace from here on
    for (bool first = true; u < u_end; first = false) {
        const u32 tile = u / gpt, g0 = u % gpt, g1 = min(gpt, g0 + (u_end - u));
        const u32 row_first = tile * warps * NF4T_ROWS_PER_WARP;
        const bool whole = g0 == 0 && g1 == gpt;
        rows_segment(A, B, s, code2, absmax_f, bias, out, whole ? nullptr : ws, N, K, kper, m0, mrows, row_first,
                     g0 * NF4T_GK, min(K, g1 * NF4T_GK), first);
        if (!whole) {
            const u32 rows = min(warps * NF4T_ROWS_PER_WARP, N - row_first);
            const u32 parts = stream_k_cta((tile + 1u) * gpt - 1u, units, ctas) - stream_k_cta(tile * gpt, units, ctas) + 1u;
            finish_split(blockIdx.z * tiles + tile, row_first, rows, m0, mrows, N, bias, out, ws, counters, parts);
        }
        u += g1 - g0;
    }
#endif
}
