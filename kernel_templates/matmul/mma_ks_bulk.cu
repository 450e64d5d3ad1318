// nf4-tune matmul, structure MMA-KS with the bulk feed (NF4T_MMA_MMA_KS with NF4T_FEED_BULK): the
// K-split tensor-core structure of mma_ks.cu with W and A copied into shared memory by a producer warp.
// Experimental: it never won a served table entry (on the H200 a bulk-copy ring kept the consumers busy
// and still ran at 31-34% of the read bandwidth at M = 1: the instruction budget binds first); kept for
// the work that builds on it. Joined after codes.cuh, matmul/common.cuh, matmul/tensor.cuh and
// matmul/ks.cuh.
//
// Knobs (besides common.cuh's, tensor.cuh's and ks.cuh's):
//   NF4T_STAGES   2 or 4 chunks in the ring the CTA's warps share.
//   NF4T_STATS    NF4T_STATS_LANES only: the producer copies the statistics itself.
//   NF4T_WLOAD    NF4T_WLOAD_STREAM: W's bulk copies carry an L2 evict-first policy.
//   NF4T_PERSIST  1: a few CTAs per SM loop over the row tiles.
// Launch: one more warp than the consumers (the producer); needs sm_90 or newer.

#if NF4T_STATS == NF4T_STATS_TILE
#error "the tile's scale table (stats tile) is not a structure of the bulk feed (it copies the statistics itself)"
#endif

// ---- the bulk feed: a producer warp (the CTA's last) fills a ring of NF4T_STAGES
// chunks in shared memory; the consumer warps only read shared memory, decode and multiply.
// A chunk is the tile's RPW rows x KC values of K (KC = consumer warps x NF4T_U windows: consumer warp
// w takes windows u*WARPS + w, as the register path takes its groups). Per chunk the producer copies
//   - W: each row's KC/2 bytes (contiguous in B) by one cp.async.bulk per row (the copy engine, not
//     the lanes), completing on the stage's "full" mbarrier as transaction bytes;
//   - A: the CTA's batch rows' KC values (contiguous too), one cp.async.bulk per row; batch rows past
//     M read a zero row instead (the mma's n8 tile);
//   - the statistics of each row's blocks (the aligned words holding the absmax bytes and the 1-2
//     group absmax, or the float absmax) by 4-byte cp.async, tracked by the same mbarrier.
// So a consumer's chunk is loads from shared memory at fixed offsets, no address arithmetic on
// global pointers and no registers held across chunks; it releases the stage on its "empty" mbarrier
// (one arrival per warp) before computing. Rows are padded (W: KC/2 rounded up to 128, plus 4*LOAD;
// A: 2*KC rounded up to 128, plus 16) so a load phase's rows hit distinct banks. Bytes past N or past
// the slice's K are never copied: the A and statistics areas start zeroed and a partial chunk's A
// tail is zeroed by the producer, so the stale W there (finite codes) multiplies zeros, and rows past
// N feed outputs that are never written.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "the bulk feed (cp.async.bulk, mbarrier transaction counts) needs sm_90 or newer"
#endif
__shared__ __align__(8) u64 nf4t_bars[2 * NF4T_STAGES];   // full[0..S), empty[0..S)

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// this thread's cp.async copies so far complete on the barrier (before its phase can complete)
__device__ __forceinline__ void mbar_track_cp_async(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// NF4T_WLOAD_STREAM: W carries an L2 evict-first policy (read once; A and the statistics stay)
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar, bool evict_first) {
#if NF4T_WLOAD == NF4T_WLOAD_STREAM
    if (evict_first) {
        u64 pol;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], "
                     "%2, [%3], %4;" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol) : "memory");
        return;
    }
#endif
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ float lds_f32(u32 a) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ u32 lds_u8(u32 a) {
    u32 v;
    asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}

// The geometry of a stage (bytes; tuner/families/matmul/resources.py computes the same to size the ring):
// W rows at rowb, then the batch rows of A at arowb, then each W row's statistics at sb.
struct BulkGeometry {
    u32 kc, rowb, arowb, sb, arows, stage;
};
__device__ __forceinline__ BulkGeometry bulk_geometry(u32 warps, u32 M) {
    BulkGeometry G;
    G.kc = NF4T_U * warps * NF4T_WIN;
    G.rowb = (((G.kc >> 1) + 127u) & ~127u) + 4u * NF4T_LOAD_BYTES;
    G.arowb = ((G.kc * 2u + 127u) & ~127u) + 16u;
    const u32 nested = 4u * (((G.kc >> 5) + 3u) / 4u + 1u) + 8u, plain = G.kc >> 3;
    G.sb = ((nested > plain ? nested : plain) + 15u) & ~15u;
    G.arows = min((u32)NF4T_MTILE, M);
    G.stage = NF4T_ROWS_PER_WARP * (G.rowb + G.sb) + G.arows * G.arowb;
    return G;
}

// one chunk (rows row0.., K kc0..kc0+len) into the stage at w: W and A by bulk copies, the statistics
// by cp.async; every lane then arrives on the stage's full barrier
__device__ __forceinline__ void bulk_produce(u32 w, const BulkGeometry& G, u32 full, const act_t* __restrict__ A,
                                             const u8* __restrict__ B, const Scales& s, u32 nblocks, u32 row0,
                                             u32 rows, u32 m0, u32 mrows, u32 K, u32 kc0, u32 len, u32 lane) {
    const u32 a_st = w + NF4T_ROWS_PER_WARP * G.rowb, s_st = a_st + G.arows * G.arowb;
    if (lane == 0) mbar_expect(full, rows * (len >> 1) + mrows * len * (u32)sizeof(act_t));
    __syncwarp();
    for (u32 r = lane; r < rows; r += 32) {
        const u32 n = row0 + r;
        bulk_copy(w + r * G.rowb, B + (((u64)n * K + kc0) >> 1), len >> 1, full, true);
        const u32 b0 = (n * K + kc0) >> s.log2_bs, b1 = (n * K + kc0 + len - 1) >> s.log2_bs;
        const u32 st = s_st + r * G.sb;
        if (s.absmax_f != nullptr) {
            for (u32 b = b0; b <= b1; ++b) cp_async4(st + 4u * (b - b0), s.absmax_f + b, 4u);
        } else {
            const u32 g0 = b0 >> s.log2_g, g1 = b1 >> s.log2_g;
            cp_async4(st, s.absmax2 + g0, 4u);
            if (g1 != g0) cp_async4(st + 4u, s.absmax2 + g1, 4u);
            for (u32 q = b0 & ~3u; q <= b1; q += 4u)          // the aligned words, never past the last block
                cp_async4(st + 8u + (q - (b0 & ~3u)), s.absmax_q + q, min(4u, nblocks - q));
        }
    }
    for (u32 m = lane; m < mrows; m += 32)
        bulk_copy(a_st + m * G.arowb, A + (u64)(m0 + m) * K + kc0, len * (u32)sizeof(act_t), full, false);
    if (len < G.kc) {
        // a partial chunk: A's tail reads zeros (what an earlier chunk left there would meet stale W)
        const u32 tail = (G.kc - len) * (u32)sizeof(act_t);
        for (u32 i = lane * 16u; i < mrows * tail; i += 32u * 16u) {
            const u32 m = i / tail, o = i % tail;
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};"
                         ::"r"(a_st + m * G.arowb + len * (u32)sizeof(act_t) + o), "r"(0u) : "memory");
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");   // before the next bulk write there
    }
    mbar_track_cp_async(full);
    mbar_arrive(full);
}

// a consumer lane's group (W, A, raw statistics) of one chunk, from its stage
__device__ __forceinline__ void bulk_consume(KsGroup& Gr, u32 w, const BulkGeometry& G, u32 zero, const Scales& s,
                                             u32 row0, u32 K, u32 kc0, u32 mrows, u32 g, u32 t, u32 warp,
                                             u32 warps) {
    const u32 a_st = w + NF4T_ROWS_PER_WARP * G.rowb, s_st = a_st + G.arows * G.arowb;
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
        const u32 off = (u * warps + warp) * NF4T_WIN + t * NF4T_RUN;       // the lane's run in the chunk
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 r = rt * 16 + g + 8 * h;
                const u32 src = w + r * G.rowb + (off >> 1);
#if NF4T_LOAD_BYTES == 16
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(Gr.w[u][rt][h][0]), "=r"(Gr.w[u][rt][h][1]), "=r"(Gr.w[u][rt][h][2]),
                               "=r"(Gr.w[u][rt][h][3]) : "r"(src) : "memory");
#elif NF4T_LOAD_BYTES == 8
                asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(Gr.w[u][rt][h][0]), "=r"(Gr.w[u][rt][h][1])
                             : "r"(src) : "memory");
#else
                asm volatile("ld.shared.u32 %0, [%1];" : "=r"(Gr.w[u][rt][h][0]) : "r"(src) : "memory");
#endif
                // the run's block, counted from the row's first block in the chunk: off >> log2_bs, as a
                // chunk starts on a block boundary or lies inside one block (kc0 a multiple of KC, both
                // powers of two; the plan rounds the split-K slices to whole chunks)
                const u32 blk = off >> s.log2_bs;
                const u32 st = s_st + r * G.sb;
                if (s.absmax_f != nullptr) {
                    Gr.raw[u][rt][h].q = 0u;
                    Gr.raw[u][rt][h].a = lds_f32(st + 4u * blk);
                } else {
                    const u32 b0 = ((row0 + r) * K + kc0) >> s.log2_bs;
                    Gr.raw[u][rt][h].q = lds_u8(st + 8u + (b0 & 3u) + blk);
                    Gr.raw[u][rt][h].a = lds_f32(st + 4u * (((b0 + blk) >> s.log2_g) - (b0 >> s.log2_g)));
                }
            }
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt) {
            const u32 m = nt * 8 + g;
            const u32 src = (m < mrows ? a_st + m * G.arowb : zero) + off * (u32)sizeof(act_t);
#pragma unroll
            for (int i = 0; i < NF4T_LOAD_BYTES; i += 4)
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(Gr.a[u][nt][i]), "=r"(Gr.a[u][nt][i + 1]), "=r"(Gr.a[u][nt][i + 2]),
                               "=r"(Gr.a[u][nt][i + 3]) : "r"(src + 4u * i) : "memory");
        }
    }
}

extern "C" __global__ void nf4t_matmul(NF4T_MATMUL_PARAMS) {
    Scales s = make_scales(absmax_q, code2, absmax2, absmax_f, offset_ptr, log2_bs, log2_g);

    const u32 warps = (blockDim.x >> 5) - 1;                  // consumer warps; warp `warps` copies
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 g = lane >> 2, t = lane & 3, lane4 = lane << 2;
    const u32 m0 = blockIdx.z * NF4T_MTILE;
    const u32 mrows = min((u32)NF4T_MTILE, M - m0);
    const u32 k_begin = blockIdx.y * kper;
    const u32 k_end = min(K, k_begin + kper);
    const u32 nb = ((NF4T_WIN - 1) >> log2_bs) + 1;
    const u32 sub = (t * NF4T_RUN) >> log2_bs;
    const u32 tiles = (N + NF4T_ROWS_PER_WARP - 1) / NF4T_ROWS_PER_WARP;
    const u32 tstep = NF4T_PERSIST ? gridDim.x : tiles;
    const BulkGeometry G = bulk_geometry(warps, M);
    float* red = reinterpret_cast<float*>(nf4t_dyn + NF4T_DYN_TABLE);   // [warps][MTILE][RPW]
    const u32 ring = (u32)__cvta_generic_to_shared(nf4t_dyn + NF4T_DYN_TABLE + warps * NF4T_MTILE * NF4T_ROWS_PER_WARP * 4);
    const u32 zero = ring + NF4T_STAGES * G.stage;            // a zero row of A (batch rows past M)
    const u32 full = (u32)__cvta_generic_to_shared(nf4t_bars), empty = full + 8u * NF4T_STAGES;

    if (threadIdx.x == 0) {
#pragma unroll
        for (int i = 0; i < NF4T_STAGES; ++i) {
            mbar_init(full + 8u * i, 32u);                     // the producer's lanes
            mbar_init(empty + 8u * i, warps);                  // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    // A's and the statistics' areas of every stage, and the zero row, start zeroed
    for (u32 st = 0; st < NF4T_STAGES; ++st) {
        const u32 a_st = ring + st * G.stage + NF4T_ROWS_PER_WARP * G.rowb;
        for (u32 i = threadIdx.x * 16u; i < G.stage - NF4T_ROWS_PER_WARP * G.rowb; i += blockDim.x * 16u)
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(a_st + i), "r"(0u) : "memory");
    }
    for (u32 i = threadIdx.x * 16u; i < G.kc * (u32)sizeof(act_t); i += blockDim.x * 16u)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(zero + i), "r"(0u) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    setup_tables();
    if (code2 != nullptr)
        for (u32 i = threadIdx.x; i < 256; i += blockDim.x) nf4t_code2[i] = __ldg(code2 + i);
    pdl_wait();                                           // the producer's copies of A from here on
    __syncthreads();

    if (warp == warps) {
        // the producer: every (tile, chunk) in the consumers' order
        const u32 nblocks = (N * K) >> log2_bs;
        u32 it = 0;
        for (u32 tile = blockIdx.x; tile < tiles; tile += tstep) {
            const u32 row0 = tile * NF4T_ROWS_PER_WARP, rows = min((u32)NF4T_ROWS_PER_WARP, N - row0);
            for (u32 kc0 = k_begin; kc0 < k_end; kc0 += G.kc, ++it) {
                const u32 st = it % NF4T_STAGES;
                if (it >= NF4T_STAGES) mbar_wait(empty + 8u * st, ((it / NF4T_STAGES) & 1u) ^ 1u);
                bulk_produce(ring + st * G.stage, G, full + 8u * st, A, B, s, nblocks, row0, rows, m0, mrows, K, kc0,
                             min(G.kc, k_end - kc0), lane);
            }
        }
        return;
    }

    // the consumers
    u32 it = 0;
    for (u32 tile = blockIdx.x; tile < tiles; tile += tstep) {
        const u32 row0 = tile * NF4T_ROWS_PER_WARP;
        float acc[NF4T_RT][NF4T_NT][4];
        zero_frags(acc);
        for (u32 kc0 = k_begin; kc0 < k_end; kc0 += G.kc, ++it) {
            const u32 st = it % NF4T_STAGES;
            mbar_wait(full + 8u * st, (it / NF4T_STAGES) & 1u);
            KsGroup Gr;
            bulk_consume(Gr, ring + st * G.stage, G, zero, s, row0, K, kc0, mrows, g, t, warp, warps);
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + 8u * st);
            ks_compute(Gr, acc, s, nb, sub, lane, lane4, nullptr);
        }
        ks_epilogue(acc, red, warp, warps, g, t, row0, tile, tiles, m0, mrows, N, bias, out, ws, counters);
    }
}
