// nf4-tune matmul, structure MMA-KS (NF4T_MMA_MMA_KS with NF4T_FEED_LANES): tensor cores with W's
// rows as the mma's M, the CTA's warps splitting K. Joined after codes.cuh, matmul/common.cuh,
// matmul/tensor.cuh (the operands, the window, the decode) and matmul/ks.cuh (the groups, the ring,
// the scale table, the epilogue).
//
// A CTA owns NF4T_ROWS_PER_WARP rows of W (m16 tiles) and NF4T_MTILE rows of A; its warps split the
// CTA's K slice window by window, so a warp's 16-row tiles are few and its loads are many: every load of
// a group of NF4T_UNROLL windows is issued before any is used. The warps' sums meet in shared memory and
// are added in warp order (deterministic).
//
// Knobs (besides common.cuh's, tensor.cuh's and ks.cuh's):
//   NF4T_ROWS_PER_WARP  16 or 32: the rows of the CTA's tile (one or two m16 tiles for every warp).
//   NF4T_MTILE          8 or 16: one or two n8 tiles of the batch.
//   NF4T_PREFETCH       0: a warp loads a group, then computes it; 1: the next group (or the next tile's
//                       first group) is issued before the current one is computed.
//   NF4T_PERSIST        0: a CTA per row tile; 1: a few CTAs per SM loop over the row tiles, so the
//                       tables are filled once per CTA, not once per tile.
//   NF4T_STAGES         0: W in registers; 4: the per-warp cp.async ring of ks.cuh (experimental).
// Launch: warps per CTA (up to 8: the warps x rows x mtile partial sums fill an 8 KiB buffer).

extern "C" __global__ void nf4t_matmul(NF4T_MATMUL_PARAMS) {
    // (make_scales's fields set in place: through the helper, ptxas schedules this kernel differently)
    Scales s;
    s.absmax_q = absmax_q; s.code2 = code2; s.absmax2 = absmax2; s.absmax_f = absmax_f;
    s.offset = offset_ptr != nullptr ? __ldg(offset_ptr) : 0.0f;
    s.log2_bs = log2_bs; s.log2_g = log2_g;

    const u32 warps = blockDim.x >> 5;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 g = lane >> 2, t = lane & 3, lane4 = lane << 2;
    const u32 m0 = blockIdx.z * NF4T_MTILE;
    const u32 mrows = min((u32)NF4T_MTILE, M - m0);
    const u32 k_begin = blockIdx.y * kper;
    const u32 k_end = min(K, k_begin + kper);
    const u32 nb = ((NF4T_WIN - 1) >> log2_bs) + 1;          // blocks per window
    const u32 sub = (t * NF4T_RUN) >> log2_bs;                 // the block of this lane's run
    const u32 kstep = warps * NF4T_WIN;
    const u32 gstep = NF4T_U * kstep;
    const u32 tiles = (N + NF4T_ROWS_PER_WARP - 1) / NF4T_ROWS_PER_WARP;
    float* red = reinterpret_cast<float*>(nf4t_dyn + NF4T_DYN_TABLE);   // [warps][MTILE][RPW]
#if NF4T_STAGES > 0
    // this warp's ring: NF4T_STAGES slots after the reduction buffer
    const u32 ring_base = (u32)__cvta_generic_to_shared(nf4t_dyn + NF4T_DYN_TABLE + warps * NF4T_MTILE * NF4T_ROWS_PER_WARP * 4) +
                          warp * NF4T_STAGES * NF4T_SLOT;
    const u64 pol = w_policy();
    const u32 nblocks = (N * K) >> log2_bs;
#endif
#if NF4T_STATS == NF4T_STATS_TILE
    // the scale table after the partial sums (and the warps' rings): the slice's block columns jb0 .. jb0 + nj - 1
#if NF4T_STAGES > 0
    float* tab = red + warps * NF4T_MTILE * NF4T_ROWS_PER_WARP + warps * NF4T_STAGES * NF4T_SLOT / 4;
#else
    float* tab = red + warps * NF4T_MTILE * NF4T_ROWS_PER_WARP;
#endif
    const u32 jb0 = k_begin >> log2_bs, nj = ((k_end - 1u) >> log2_bs) - jb0 + 1u;
    const float* stab = tab - jb0 * NF4T_SROW + g;
#else
    const float* stab = nullptr;
#endif

    pdl_wait();                                           // A (the first window's, loaded with W) from here on
    u32 tile = blockIdx.x;
#if NF4T_STAGES == 0
    KsGroup G;
    u32 kw = k_begin + warp * NF4T_WIN;
#if NF4T_PREFETCH == 1
    if (kw < k_end) ks_load(G, A, B, s, tile * NF4T_ROWS_PER_WARP, N, K, k_end, m0, mrows, g, t, kw, kstep);
#endif
#endif
    setup_tables();
    if (code2 != nullptr)
        for (u32 i = threadIdx.x; i < 256; i += blockDim.x) nf4t_code2[i] = __ldg(code2 + i);
    __syncthreads();

    for (; tile < tiles; tile += (NF4T_PERSIST ? gridDim.x : tiles)) {
        const u32 row0 = tile * NF4T_ROWS_PER_WARP;
        float acc[NF4T_RT][NF4T_NT][4];
        zero_frags(acc);
#if NF4T_STATS == NF4T_STATS_TILE
        ks_fill_scales(tab, s, row0, N, K, jb0, nj);
        work_sync();
#endif

#if NF4T_STAGES > 0
        {
            const u32 kw0 = k_begin + warp * NF4T_WIN;
            const u32 ngroups = kw0 < k_end ? (k_end - kw0 + gstep - 1) / gstep : 0u;
            u32 a_next[NF4T_U][NF4T_NT][NF4T_LOAD_BYTES];
#pragma unroll
            for (int p = 0; p < NF4T_STAGES - 1; ++p) {
                if ((u32)p < ngroups)
                    ks_issue(ring_base + p * NF4T_SLOT, B, s, nblocks, row0, N, K, k_end, g, t, lane,
                             kw0 + p * gstep, kstep, pol);
                else
                    asm volatile("cp.async.commit_group;" ::: "memory");
            }
            if (ngroups) ks_load_a(a_next, A, K, k_end, m0, mrows, g, t, kw0, kstep);
            for (u32 i = 0; i < ngroups; i += NF4T_STAGES) {
#pragma unroll
                for (int st = 0; st < NF4T_STAGES; ++st) {
                    const u32 j = i + st;
                    if (j < ngroups) {
                        const int nx = (st + NF4T_STAGES - 1) % NF4T_STAGES;   // the slot of group j - 1
                        if (j + NF4T_STAGES - 1 < ngroups)
                            ks_issue(ring_base + nx * NF4T_SLOT, B, s, nblocks, row0, N, K, k_end, g, t, lane,
                                     kw0 + (j + NF4T_STAGES - 1) * gstep, kstep, pol);
                        else
                            asm volatile("cp.async.commit_group;" ::: "memory");
                        asm volatile("cp.async.wait_group %0;" ::"n"(NF4T_STAGES - 1) : "memory");   // group j landed
                        KsGroup G;
                        ks_read_slot(ring_base + st * NF4T_SLOT, lane, G, s, row0, K, k_end, g, t, kw0 + j * gstep, kstep);
#pragma unroll
                        for (int u = 0; u < NF4T_U; ++u)
#pragma unroll
                            for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
                                for (int q = 0; q < NF4T_LOAD_BYTES; ++q) G.a[u][nt][q] = a_next[u][nt][q];
                        if (j + 1 < ngroups) ks_load_a(a_next, A, K, k_end, m0, mrows, g, t, kw0 + (j + 1) * gstep, kstep);
                        ks_compute(G, acc, s, nb, sub, lane, lane4, stab);
                    }
                }
            }
        }
#else
        for (kw = k_begin + warp * NF4T_WIN; kw < k_end; kw += gstep) {
#if NF4T_PREFETCH == 1
            KsGroup Gn;
            const bool more = kw + gstep < k_end;
            const u32 next_tile = tile + (NF4T_PERSIST ? gridDim.x : tiles);
            if (more) ks_load(Gn, A, B, s, row0, N, K, k_end, m0, mrows, g, t, kw + gstep, kstep);
            else if (next_tile < tiles)
                ks_load(Gn, A, B, s, next_tile * NF4T_ROWS_PER_WARP, N, K, k_end, m0, mrows, g, t,
                        k_begin + warp * NF4T_WIN, kstep);
            ks_compute(G, acc, s, nb, sub, lane, lane4, stab);
            G = Gn;
#else
            ks_load(G, A, B, s, row0, N, K, k_end, m0, mrows, g, t, kw, kstep);
            ks_compute(G, acc, s, nb, sub, lane, lane4, stab);
#endif
        }
#endif

        ks_epilogue(acc, red, warp, warps, g, t, row0, tile, tiles, m0, mrows, N, bias, out, ws, counters);
    }
}
