// nf4-tune matmul: the K-split tensor-core structure's groups (mma-ks), shared by its two kernels:
// matmul/mma_ks.cu (W fed by the lanes: registers or a per-warp ring) and matmul/mma_ks_bulk.cu (a
// producer warp's bulk copies). Joined after codes.cuh, matmul/common.cuh and matmul/tensor.cuh.
//
// A CTA's warps split its K slice window by window (warp w takes windows w, w + warps, ...); a group
// is NF4T_UNROLL windows of a warp, all their loads issued before the first is used (KsGroup: rows g,
// g+8 of each row tile, their raw statistics, batch row g of A). ks_compute multiplies a group on the
// tensor cores; where a window spans several blocks (blocksize < window), one mma per block takes the B
// operand masked to the lanes whose run lies in that block. ks_epilogue adds the warps' sums in shared
// memory in warp order (deterministic), then writes y or the split-K workspace.
//
// Knobs read here:
//   NF4T_STAGES   0: W goes global -> registers; N > 0: W (and its statistics) go global -> shared memory
//                 by cp.async into a per-warp ring N groups deep (the "ring" section below), so the bytes
//                 in flight per SM are bound by shared memory (228 KiB) instead of registers.
//                 Experimental: the ring never won a served table entry.
//   NF4T_STATS    NF4T_STATS_LANES: every lane loads the raw statistics of its rows' runs (absmax byte and
//                 group absmax, or the float absmax) with each window and finishes the scale itself, the
//                 four lanes of a quad the same block's; NF4T_STATS_TILE: before a row tile's windows the
//                 CTA decodes every scale of the tile's K slice into shared memory (each block once per
//                 CTA; a thread issues the loads of 8 entries before it decodes them), and a lane's scale
//                 is then one ld.shared per row and window: no statistics' addresses, loads or decode in
//                 the loop, and no statistics registers in flight (the per-warp ring copies W only).
//   NF4T_WLOAD    with the ring: NF4T_WLOAD_STREAM gives W's copies an L2 evict-first policy.

struct KsGroup {                                   // the loads of one group of NF4T_U windows
    u32 w[NF4T_U][NF4T_RT][2][NF4T_WWORDS];        // rows g, g+8 of each row tile
    ScaleRaw raw[NF4T_U][NF4T_RT][2];
#if NF4T_STATS == NF4T_STATS_TILE
    u32 j[NF4T_U];                                 // the block column of each window's run (K / blocksize)
#endif
    u32 a[NF4T_U][NF4T_NT][NF4T_LOAD_BYTES];             // the batch row g of each n8 tile, 16-bit pairs
};

#if NF4T_STATS == NF4T_STATS_TILE
// the block column of each window's run in the group (past the slice: the last one, a finite scale
// that meets zeros)
__device__ __forceinline__ void ks_columns(KsGroup& G, u32 log2_bs, u32 k_end, u32 t, u32 kw, u32 kstep) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) G.j[u] = min(kw + u * kstep + t * NF4T_RUN, k_end - 1u) >> log2_bs;
}
#endif

// the batch rows' runs of A for a group (16-bit pairs; rows past the batch and K past the slice are 0)
__device__ __forceinline__ void ks_load_a(u32 (&a)[NF4T_U][NF4T_NT][NF4T_LOAD_BYTES], const act_t* __restrict__ A,
                                          u32 K, u32 k_end, u32 m0, u32 mrows, u32 g, u32 t, u32 kw, u32 kstep) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
        const u32 k = kw + u * kstep + t * NF4T_RUN;
        const bool in_k = k < k_end;
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt) {
            const u32 m = nt * 8 + g;
#pragma unroll
            for (int i = 0; i < NF4T_LOAD_BYTES; i += 4) {
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (in_k && m < mrows) v = *reinterpret_cast<const uint4*>(A + (u64)(m0 + m) * K + k + 2 * i);
                a[u][nt][i] = v.x; a[u][nt][i + 1] = v.y; a[u][nt][i + 2] = v.z; a[u][nt][i + 3] = v.w;
            }
        }
    }
}

__device__ __forceinline__ void ks_load(KsGroup& G, const act_t* __restrict__ A, const u8* __restrict__ B,
                                        const Scales& s, u32 row0, u32 N, u32 K, u32 k_end, u32 m0, u32 mrows,
                                        u32 g, u32 t, u32 kw, u32 kstep) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
        const u32 k = kw + u * kstep + t * NF4T_RUN;
        const bool in_k = k < k_end;
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 n = row0 + rt * 16 + g + 8 * h;
                if (in_k && n < N) {
                    load_w(B + (((u64)n * K + k) >> 1), G.w[u][rt][h]);
#if NF4T_STATS == NF4T_STATS_LANES
                    G.raw[u][rt][h] = scale_load(s, n * K + k);
#endif
                } else {
#pragma unroll
                    for (int i = 0; i < NF4T_WWORDS; ++i) G.w[u][rt][h][i] = 0u;
                    G.raw[u][rt][h].q = 0u;
                    G.raw[u][rt][h].a = 0.0f;
                }
            }
        }
    }
#if NF4T_STATS == NF4T_STATS_TILE
    ks_columns(G, s.log2_bs, k_end, t, kw, kstep);
#endif
    ks_load_a(G.a, A, K, k_end, m0, mrows, g, t, kw, kstep);
}

#if NF4T_STAGES > 0
// ---- the shared-memory ring (NF4T_STAGES > 0): W and its statistics go global -> shared memory by
// cp.async, NF4T_STAGES groups deep per warp, so the bytes in flight are bound by shared memory, not
// registers, and no load's register scoreboard is shared with a later group's (a warp has only a few:
// statistics loaded into registers groups ahead made every step wait for the newest group's loads).
// A lane copies exactly the bytes it later reads (its slot: [stage] x {W: [u][rt][h][lane] x LOAD
// bytes, statistics: [u][rt][h][lane] x (the 4-byte word holding the absmax byte, the group absmax)
// or (the float absmax, 0)}; a warp's copy of one (u, rt, h) is contiguous: no bank conflicts), so the
// ring needs no barrier: a lane's own cp.async.wait_group makes its copies visible to it. A, small
// and an L1/L2 hit, is loaded into registers one group ahead.
#define NF4T_SLOT_W (NF4T_U * NF4T_RT * 2 * 32 * NF4T_LOAD_BYTES)    // W of one group of one warp
#if NF4T_STATS == NF4T_STATS_TILE
#define NF4T_SLOT NF4T_SLOT_W                                      // the scales are in the tile's table
#else
#define NF4T_SLOT (NF4T_SLOT_W + NF4T_U * NF4T_RT * 2 * 32 * 8)  // ... and its statistics
#endif

// NF4T_WLOAD_STREAM: the copies of W carry an L2 evict-first policy (W is read once; A and the
// statistics stay); 16-byte copies bypass L1 (.cg) either way.
__device__ __forceinline__ u64 w_policy() {
    u64 pol = 0;
#if NF4T_WLOAD == NF4T_WLOAD_STREAM
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}

__device__ __forceinline__ void cp_async_w(u32 dst, const u8* src, bool valid, u64 pol) {
    const u32 n = valid ? (u32)NF4T_LOAD_BYTES : 0u;                  // 0: the slot is zero-filled, nothing read
#if NF4T_LOAD_BYTES == 16 && NF4T_WLOAD == NF4T_WLOAD_STREAM
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src), "r"(n),
                 "l"(pol) : "memory");
#elif NF4T_LOAD_BYTES == 16
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
#elif NF4T_WLOAD == NF4T_WLOAD_STREAM
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], %2, %3, %4;" ::"r"(dst), "l"(src),
                 "n"(NF4T_LOAD_BYTES), "r"(n), "l"(pol) : "memory");
#else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(NF4T_LOAD_BYTES), "r"(n)
                 : "memory");
#endif
}

// 4 bytes (the first n of them; the rest of the word zero-filled), src 4-byte aligned
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, u32 n) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

__device__ __forceinline__ void ks_issue(u32 slot, const u8* __restrict__ B, const Scales& s, u32 nblocks,
                                         u32 row0, u32 N, u32 K, u32 k_end, u32 g, u32 t, u32 lane, u32 kw,
                                         u32 kstep, u64 pol) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
        const u32 k = kw + u * kstep + t * NF4T_RUN;
        const bool in_k = k < k_end;
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 n = row0 + rt * 16 + g + 8 * h;
                const bool valid = in_k && n < N;
                const u32 i = ((u * NF4T_RT + rt) * 2 + h) * 32 + lane;
                cp_async_w(slot + i * NF4T_LOAD_BYTES, valid ? B + (((u64)n * K + k) >> 1) : B, valid, pol);
#if NF4T_STATS == NF4T_STATS_LANES
                const u32 b = valid ? (n * K + k) >> s.log2_bs : 0u;
                const u32 st = slot + NF4T_SLOT_W + i * 8;
                if (s.absmax_f != nullptr) {
                    cp_async4(st, s.absmax_f + b, valid ? 4u : 0u);
                    cp_async4(st + 4, s.absmax_f, 0u);
                } else {
                    // the aligned word holding absmax byte b, never past the last block
                    const u32 w0 = b & ~3u;
                    cp_async4(st, s.absmax_q + w0, valid ? min(4u, nblocks - w0) : 0u);
                    cp_async4(st + 4, s.absmax2 + (b >> s.log2_g), valid ? 4u : 0u);
                }
#endif
            }
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// the group's W and raw statistics from this lane's slot back into registers
__device__ __forceinline__ void ks_read_slot(u32 slot, u32 lane, KsGroup& G, const Scales& s, u32 row0, u32 K,
                                             u32 k_end, u32 g, u32 t, u32 kw, u32 kstep) {
#if NF4T_STATS == NF4T_STATS_TILE
    ks_columns(G, s.log2_bs, k_end, t, kw, kstep);
#endif
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u)
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 i = ((u * NF4T_RT + rt) * 2 + h) * 32 + lane;
                const u32 src = slot + i * NF4T_LOAD_BYTES;
#if NF4T_LOAD_BYTES == 16
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(G.w[u][rt][h][0]), "=r"(G.w[u][rt][h][1]), "=r"(G.w[u][rt][h][2]),
                               "=r"(G.w[u][rt][h][3])
                             : "r"(src) : "memory");
#elif NF4T_LOAD_BYTES == 8
                asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(G.w[u][rt][h][0]), "=r"(G.w[u][rt][h][1])
                             : "r"(src) : "memory");
#else
                asm volatile("ld.shared.u32 %0, [%1];" : "=r"(G.w[u][rt][h][0]) : "r"(src) : "memory");
#endif
#if NF4T_STATS == NF4T_STATS_LANES
                u32 qw, aw;
                asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(qw), "=r"(aw)
                             : "r"(slot + NF4T_SLOT_W + i * 8) : "memory");
                if (s.absmax_f != nullptr) {
                    G.raw[u][rt][h].q = 0u;
                    G.raw[u][rt][h].a = __uint_as_float(qw);
                } else {
                    const u32 n = row0 + rt * 16 + g + 8 * h;
                    const u32 k = kw + u * kstep + t * NF4T_RUN;
                    const u32 b = (n * K + k) >> s.log2_bs;           // (a lane past N or K reads zeros)
                    G.raw[u][rt][h].q = (qw >> (8 * (b & 3u))) & 0xffu;
                    G.raw[u][rt][h].a = __uint_as_float(aw);
                }
#endif
            }
}
#endif

#if NF4T_STATS == NF4T_STATS_TILE
// ---- the tile's scale table (NF4T_STATS_TILE): tab[j][r] = the scale of block column jb0 + j of the tile's row r
// (rows past N: a finite stand-in, they meet zero W). Row r fastest, so a warp's stores hit distinct banks;
// a thread issues the loads of NF4T_SFILL entries before it decodes any (one memory latency per pass).
#define NF4T_SROW (NF4T_ROWS_PER_WARP + 1)      // floats per table row, padded: lanes (g, t) of a window never conflict
#define NF4T_SFILL 8
__device__ __forceinline__ void ks_fill_scales(float* tab, const Scales& s, u32 row0, u32 N, u32 K, u32 jb0, u32 nj) {
    const u32 kb = K >> s.log2_bs, total = nj * NF4T_ROWS_PER_WARP, step = work_threads();
    for (u32 i0 = threadIdx.x; i0 < total; i0 += NF4T_SFILL * step) {
        ScaleRaw raw[NF4T_SFILL];
#pragma unroll
        for (int p = 0; p < NF4T_SFILL; ++p) {
            const u32 i = i0 + p * step, n = row0 + i % NF4T_ROWS_PER_WARP;
            raw[p].q = 0u;
            raw[p].a = 0.0f;
            if (i < total && n < N) raw[p] = scale_load_block(s, n * kb + jb0 + i / NF4T_ROWS_PER_WARP);
        }
#pragma unroll
        for (int p = 0; p < NF4T_SFILL; ++p) {
            const u32 i = i0 + p * step;
            if (i < total) tab[(i / NF4T_ROWS_PER_WARP) * NF4T_SROW + i % NF4T_ROWS_PER_WARP] = ks_scale(s, raw[p]);
        }
    }
}
#endif

// stab (NF4T_STATS_TILE): the tile's scale table, offset to block column 0 and to the lane's row g
__device__ __forceinline__ void ks_compute(const KsGroup& G, float (&acc)[NF4T_RT][NF4T_NT][4], const Scales& s,
                                           u32 nb, u32 sub, u32 lane, u32 lane4, const float* stab) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
        float sc[NF4T_RT][2];
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt) {
#if NF4T_STATS == NF4T_STATS_TILE
            sc[rt][0] = stab[G.j[u] * NF4T_SROW + rt * 16];
            sc[rt][1] = stab[G.j[u] * NF4T_SROW + rt * 16 + 8];
#else
            sc[rt][0] = ks_scale(s, G.raw[u][rt][0]);
            sc[rt][1] = ks_scale(s, G.raw[u][rt][1]);
#endif
        }
        if (NF4T_NBMAX == 1 || nb == 1) {
            float cp[NF4T_RT][NF4T_NT][4];
            zero_frags(cp);
            tc_window_mma(G.w[u], G.a[u], lane4, cp);
            // tc_scale_add's FMAs, written in place: through the helper ptxas schedules 4 of 114 cubins differently
#pragma unroll
            for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
                for (int nt = 0; nt < NF4T_NT; ++nt) {
                    acc[rt][nt][0] = fmaf(sc[rt][0], cp[rt][nt][0], acc[rt][nt][0]);
                    acc[rt][nt][1] = fmaf(sc[rt][0], cp[rt][nt][1], acc[rt][nt][1]);
                    acc[rt][nt][2] = fmaf(sc[rt][1], cp[rt][nt][2], acc[rt][nt][2]);
                    acc[rt][nt][3] = fmaf(sc[rt][1], cp[rt][nt][3], acc[rt][nt][3]);
                }
        } else {
            // the window spans nb blocks: lane t's run lies in block sub; one mma per block with
            // the batch operand kept only in the lanes of that block
            float cp[NF4T_NBMAX][NF4T_RT][NF4T_NT][4];
#pragma unroll
            for (int j = 0; j < NF4T_NBMAX; ++j)
#pragma unroll
                for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
                    for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
                        for (int i = 0; i < 4; ++i) cp[j][rt][nt][i] = 0.0f;
#pragma unroll
            for (int st = 0; st < NF4T_LOAD_BYTES / 2; ++st) {
#pragma unroll
                for (int rt = 0; rt < NF4T_RT; ++rt) {
                    const u32 a0 = pair16(G.w[u][rt][0][(2 * st) >> 2], 2 * st, lane4);
                    const u32 a1 = pair16(G.w[u][rt][1][(2 * st) >> 2], 2 * st, lane4);
                    const u32 a2 = pair16(G.w[u][rt][0][(2 * st + 1) >> 2], 2 * st + 1, lane4);
                    const u32 a3 = pair16(G.w[u][rt][1][(2 * st + 1) >> 2], 2 * st + 1, lane4);
#pragma unroll
                    for (int j = 0; j < NF4T_NBMAX; ++j) {
                        if ((u32)j < nb) {
                            const u32 keep = (sub == (u32)j) ? 0xffffffffu : 0u;
#pragma unroll
                            for (int nt = 0; nt < NF4T_NT; ++nt)
                                mma16816(cp[j][rt][nt], a0, a1, a2, a3, G.a[u][nt][2 * st] & keep,
                                         G.a[u][nt][2 * st + 1] & keep);
                        }
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < NF4T_NBMAX; ++j) {
                if ((u32)j < nb) {
                    const u32 src = (lane & ~3u) | ((u32)j * (4u / nb));   // a lane whose run is in block j
#pragma unroll
                    for (int rt = 0; rt < NF4T_RT; ++rt) {
                        const float s0 = __shfl_sync(0xffffffffu, sc[rt][0], src);
                        const float s1 = __shfl_sync(0xffffffffu, sc[rt][1], src);
#pragma unroll
                        for (int nt = 0; nt < NF4T_NT; ++nt) {
                            acc[rt][nt][0] = fmaf(s0, cp[j][rt][nt][0], acc[rt][nt][0]);
                            acc[rt][nt][1] = fmaf(s0, cp[j][rt][nt][1], acc[rt][nt][1]);
                            acc[rt][nt][2] = fmaf(s1, cp[j][rt][nt][2], acc[rt][nt][2]);
                            acc[rt][nt][3] = fmaf(s1, cp[j][rt][nt][3], acc[rt][nt][3]);
                        }
                    }
                }
            }
        }
    }
}

// the warps' sums of a tile, added in warp order; the bias, the rounding and y (or the split-K workspace)
__device__ __forceinline__ void ks_epilogue(const float (&acc)[NF4T_RT][NF4T_NT][4], float* red, u32 warp, u32 warps,
                                            u32 g, u32 t, u32 row0, u32 tile, u32 tiles, u32 m0, u32 mrows, u32 N,
                                            const act_t* __restrict__ bias, act_t* __restrict__ out,
                                            float* __restrict__ ws, u32* __restrict__ counters) {
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 nl = rt * 16 + g + (i >= 2 ? 8 : 0), ml = nt * 8 + 2 * t + (i & 1);
                red[(warp * NF4T_MTILE + ml) * NF4T_ROWS_PER_WARP + nl] = acc[rt][nt][i];
            }
    work_sync();
    for (u32 idx = threadIdx.x; idx < NF4T_ROWS_PER_WARP * NF4T_MTILE; idx += work_threads()) {
        const u32 ml = idx / NF4T_ROWS_PER_WARP, nl = idx % NF4T_ROWS_PER_WARP, n = row0 + nl;
        if (n < N && ml < mrows) {
            float v = 0.0f;
            for (u32 w = 0; w < warps; ++w) v += red[(w * NF4T_MTILE + ml) * NF4T_ROWS_PER_WARP + nl];
            emit(v, m0 + ml, n, N, bias, out, ws);
        }
    }
    if (ws != nullptr)
        finish_split(blockIdx.z * tiles + tile, row0, min((u32)NF4T_ROWS_PER_WARP, N - row0), m0, mrows, N, bias, out, ws,
                     counters, gridDim.y);
    else
        work_sync();      // red is written again by the next tile
}
