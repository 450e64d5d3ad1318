// nf4-tune matmul, structure SIMT (NF4T_MMA_SIMT): fp32 FMAs on the CUDA cores.
// Joined after codes.cuh and matmul/common.cuh (see common.cuh for the family and the shared knobs).
//
// A CTA owns warps x NF4T_ROWS_PER_WARP rows of W, a slice of K (split-K: gridDim.y slices) and
// NF4T_MTILE rows of A (gridDim.z tiles). Per k-step each lane loads its run of W (2 x
// NF4T_LOAD_BYTES values, block-aligned, so one scale serves it) for all NF4T_ROWS_PER_WARP rows, and
// its run of A once (to fp32 registers), reused for every row: A is read once per ROWS_PER_WARP rows.
// The warp's sums are reduced by shuffles; lane (m * ROWS_PER_WARP + r) % 32 emits output (m, r).
// A warp whose rows are all < N runs the steps without per-row bounds and with the statistics' kind
// (nested or plain) fixed at compile time; the last warps keep the checked loads (three
// instantiations of simt_steps, the same products in the same order).
//
// Knobs (besides common.cuh's):
//   NF4T_ROWS_PER_WARP  1..32: more rows, more loads of W in flight per lane.
//   NF4T_MTILE          1, 2, 4, 8 batch rows, each its own fp32 accumulators.
//   NF4T_ASTAGE         NF4T_ASTAGE_GLOBAL: each warp reads its run of A per step from global memory
//                       (L1 and L2 hits: A is small and every CTA reads it); NF4T_ASTAGE_SHARED: the
//                       CTA copies its K slice of A x MTILE into shared memory once, lane-major (see
//                       a_slot): a lane's run is 64 bytes from its neighbour's, so read as it lies each
//                       16-byte load of a warp would touch 16 lines (global) or conflict 4-way (shared);
//                       lane-major, a warp's k-th 16-byte chunks are 512 contiguous bytes, and only one
//                       chunk of A is live at a time (dot_staged), so fewer registers hold A.
//   NF4T_SCALE          NF4T_SCALE_VALUE: every weight scaled before the product (w = fl(lut * scale));
//                       NF4T_SCALE_BLOCK: sum lut[q] * a over the lane's run, then one multiply by the
//                       scale.
//   NF4T_PREFETCH       0: a warp loads W (and the statistics) of a step, waits, computes; 1: software
//                       pipelined: the next step's W and statistics are loaded before the current one is
//                       computed, so a warp always has loads in flight (twice the registers for W).

__device__ __forceinline__ void load_a_run(const act_t* __restrict__ src, float (&a)[NF4T_VPL]) {
#if NF4T_DTYPE == NF4T_DTYPE_FP32
#pragma unroll
    for (int i = 0; i < NF4T_VPL; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(src + i);
        a[i] = v.x; a[i + 1] = v.y; a[i + 2] = v.z; a[i + 3] = v.w;
    }
#else
#pragma unroll
    for (int i = 0; i < NF4T_VPL; i += 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(src + i);
        unpack2(v.x, a[i], a[i + 1]);
        unpack2(v.y, a[i + 2], a[i + 3]);
        unpack2(v.z, a[i + 4], a[i + 5]);
        unpack2(v.w, a[i + 6], a[i + 7]);
    }
#endif
}

#if NF4T_ASTAGE == NF4T_ASTAGE_SHARED
// A staged lane-major (SIMT): within each warp step of 32 x VPL values, chunk c (16 bytes) of lane
// L's run sits at chunk c * 32 + L, so the warp's loads of chunk c are 512 contiguous bytes.
// kk: the value's offset in the K slice (a multiple of the chunk).
#define NF4T_ACH (16 / (int)sizeof(act_t))          // values per 16-byte chunk
__device__ __forceinline__ u32 a_slot(u32 kk) {
    const u32 r = kk % (32u * NF4T_VPL);
    return kk - r + ((r % NF4T_VPL) / NF4T_ACH * 32u + r / NF4T_VPL) * NF4T_ACH;
}

// The sums over a lane's run for the warp's rows, A read chunk by chunk from the lane-major stage
// (first = the lane's chunk 0, the next chunks 32 apart): only one chunk of A (8 or 4 floats) is live,
// not the whole run, so fewer registers hold A. Per row the same products are added in the same
// order as dot_run's.
__device__ __forceinline__ void dot_staged(const Decoder& dec, const u32 (&w)[NF4T_ROWS_PER_WARP][NF4T_WWORDS],
                                           const act_t* first, const float (&sc)[NF4T_ROWS_PER_WARP], float (&acc)[NF4T_ROWS_PER_WARP]) {
    float part[NF4T_ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) part[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < NF4T_VPL / NF4T_ACH; ++c) {
        const uint4 v = *reinterpret_cast<const uint4*>(first + c * 32 * NF4T_ACH);
        float a[NF4T_ACH];
#if NF4T_DTYPE == NF4T_DTYPE_FP32
        a[0] = __uint_as_float(v.x); a[1] = __uint_as_float(v.y); a[2] = __uint_as_float(v.z); a[3] = __uint_as_float(v.w);
#else
        unpack2(v.x, a[0], a[1]);
        unpack2(v.y, a[2], a[3]);
        unpack2(v.z, a[4], a[5]);
        unpack2(v.w, a[6], a[7]);
#endif
#pragma unroll
        for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) {
#pragma unroll
            for (int jj = 0; jj < NF4T_ACH / 2; ++jj) {
                const int j = c * (NF4T_ACH / 2) + jj;          // byte j of the run: values 2j, 2j+1
                float first_v, second_v;
                dec.values(w[r][j >> 2], j & 3, first_v, second_v, r);
#if NF4T_SCALE == NF4T_SCALE_VALUE
                part[r] = fmaf(__fmul_rn(first_v, sc[r]), a[2 * jj], part[r]);
                part[r] = fmaf(__fmul_rn(second_v, sc[r]), a[2 * jj + 1], part[r]);
#else
                part[r] = fmaf(first_v, a[2 * jj], part[r]);
                part[r] = fmaf(second_v, a[2 * jj + 1], part[r]);
#endif
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) {
#if NF4T_SCALE == NF4T_SCALE_BLOCK
        acc[r] += part[r] * sc[r];
#else
        acc[r] += part[r];
#endif
    }
}
#endif

// sum over a lane's run: byte j of the run holds values 2j (high nibble) and 2j+1 (low nibble)
__device__ __forceinline__ float dot_run(const Decoder& dec, const u32 (&w)[NF4T_WWORDS], const float (&a)[NF4T_VPL],
                                         float sc, int r) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < NF4T_LOAD_BYTES; ++j) {
        float first, second;
        dec.values(w[j >> 2], j & 3, first, second, r);
#if NF4T_SCALE == NF4T_SCALE_VALUE
        acc = fmaf(__fmul_rn(first, sc), a[2 * j], acc);
        acc = fmaf(__fmul_rn(second, sc), a[2 * j + 1], acc);
#else
        acc = fmaf(first, a[2 * j], acc);
        acc = fmaf(second, a[2 * j + 1], acc);
#endif
    }
#if NF4T_SCALE == NF4T_SCALE_BLOCK
    acc = acc * sc;
#endif
    return acc;
}

// W of a lane's run for the warp's rows (zeros past N) and the raw statistics of their blocks
__device__ __forceinline__ void simt_load(const u8* __restrict__ B, const Scales& s, u32 row0, u32 N, u32 K, u32 k,
                                          u32 (&w)[NF4T_ROWS_PER_WARP][NF4T_WWORDS], ScaleRaw (&raw)[NF4T_ROWS_PER_WARP]) {
#pragma unroll
    for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) {
        const u32 n = row0 + r;
        if (n < N) {
            load_w(B + (((u64)n * K + k) >> 1), w[r]);
            raw[r] = scale_load(s, n * K + k);
        } else {
#pragma unroll
            for (int i = 0; i < NF4T_WWORDS; ++i) w[r][i] = 0u;
            raw[r].q = 0u;
            raw[r].a = 0.0f;
        }
    }
}

// W and the raw statistics of a full warp's rows (every row < N), the statistics' kind known at compile
// time: no bounds branch and no choice of statistics per row, and the rows' element indices one add apart
// (n*K + k < 2^31: the family refuses larger weights)
template <bool kNested>
__device__ __forceinline__ void simt_load_full(const u8* __restrict__ B, const Scales& s, u32 row0, u32 K, u32 k,
                                               u32 (&w)[NF4T_ROWS_PER_WARP][NF4T_WWORDS], ScaleRaw (&raw)[NF4T_ROWS_PER_WARP]) {
    u32 e = row0 * K + k;
#pragma unroll
    for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) {
        load_w(B + (e >> 1), w[r]);
        const u32 b = e >> s.log2_bs;
        if (kNested) {
            raw[r].q = __ldg(s.absmax_q + b);
            raw[r].a = __ldg(s.absmax2 + (b >> s.log2_g));
        } else {
            raw[r].q = 0u;
            raw[r].a = __ldg(s.absmax_f + b);
        }
        e += K;
    }
}

template <bool kFull, bool kNested>
__device__ __forceinline__ void simt_load_step(const u8* __restrict__ B, const Scales& s, u32 row0, u32 N, u32 K, u32 k,
                                               u32 (&w)[NF4T_ROWS_PER_WARP][NF4T_WWORDS], ScaleRaw (&raw)[NF4T_ROWS_PER_WARP]) {
    if (kFull)
        simt_load_full<kNested>(B, s, row0, K, k, w, raw);
    else
        simt_load(B, s, row0, N, K, k, w, raw);
}

// A warp's k-steps, its rows' sums added to acc. kFull: every row of the warp is < N (all warps but
// the last ones of the last row tile), kNested: the statistics are nested (with kFull; the
// bounds-checked path chooses per row at run time, as the first load does). The three instantiations
// compute the same products in the same order.
template <bool kFull, bool kNested>
__device__ __forceinline__ void simt_steps(const Decoder& dec, const act_t* __restrict__ A, const u8* __restrict__ B,
                                           const Scales& s, const act_t* a_sh, u32 row0, u32 N, u32 K, u32 k,
                                           u32 k_begin, u32 k_end, u32 kper, u32 m0, u32 mrows, u32 lane,
                                           u32 (&w)[NF4T_ROWS_PER_WARP][NF4T_WWORDS], ScaleRaw (&raw)[NF4T_ROWS_PER_WARP],
                                           float (&acc)[NF4T_MTILE][NF4T_ROWS_PER_WARP]) {
    const u32 kstride = 32 * NF4T_VPL;
    (void)a_sh; (void)k_begin; (void)kper; (void)lane;
    for (; k < k_end; k += kstride) {
#if NF4T_PREFETCH == 1
        u32 wn[NF4T_ROWS_PER_WARP][NF4T_WWORDS];
        ScaleRaw rawn[NF4T_ROWS_PER_WARP];
        if (k + kstride < k_end) simt_load_step<kFull, kNested>(B, s, row0, N, K, k + kstride, wn, rawn);
#endif
        float sc[NF4T_ROWS_PER_WARP];
#pragma unroll
        for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) sc[r] = kFull ? scale_finish_known<kNested>(s, raw[r])
                                                        : ((row0 + r < N) ? scale_finish(s, raw[r]) : 0.0f);
#pragma unroll
        for (int m = 0; m < NF4T_MTILE; ++m) {
            if (m < (int)mrows) {
#if NF4T_ASTAGE == NF4T_ASTAGE_SHARED
                dot_staged(dec, w, a_sh + m * kper + (k - k_begin) - lane * (NF4T_VPL - NF4T_ACH), sc, acc[m]);
#else
                float a[NF4T_VPL];
                load_a_run(A + (u64)(m0 + m) * K + k, a);
#pragma unroll
                for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) acc[m][r] += dot_run(dec, w[r], a, sc[r], r);
#endif
            }
        }
#if NF4T_PREFETCH == 1
#pragma unroll
        for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) {
            raw[r] = rawn[r];
#pragma unroll
            for (int i = 0; i < NF4T_WWORDS; ++i) w[r][i] = wn[r][i];
        }
#else
        if (k + kstride < k_end) simt_load_step<kFull, kNested>(B, s, row0, N, K, k + kstride, w, raw);
#endif
    }
}

extern "C" __global__ void nf4t_matmul(NF4T_MATMUL_PARAMS) {
    const Decoder dec = make_decoder();
    Scales s = make_scales(absmax_q, code2, absmax2, absmax_f, offset_ptr, log2_bs, log2_g);

    const u32 warps = blockDim.x >> 5;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 row_first = blockIdx.x * warps * NF4T_ROWS_PER_WARP;
    const u32 row0 = row_first + warp * NF4T_ROWS_PER_WARP;
    const u32 m0 = blockIdx.z * NF4T_MTILE;
    const u32 mrows = min((u32)NF4T_MTILE, M - m0);
    const u32 k_begin = blockIdx.y * kper;
    const u32 k_end = min(K, k_begin + kper);

    // the first step's W and statistics are loaded before the tables are filled and A is staged
    u32 w[NF4T_ROWS_PER_WARP][NF4T_WWORDS];
    ScaleRaw raw[NF4T_ROWS_PER_WARP];
    u32 k = k_begin + lane * NF4T_VPL;
    if (k < k_end) simt_load(B, s, row0, N, K, k, w, raw);
    setup_tables();
    if (code2 != nullptr)
        for (u32 i = threadIdx.x; i < 256; i += blockDim.x) nf4t_code2[i] = __ldg(code2 + i);
    pdl_wait();                                           // A and y from here on
#if NF4T_ASTAGE == NF4T_ASTAGE_SHARED
    // [MTILE][kper] lane-major (a_slot), after lut pairx's / pairf's / pairmix's table; kper is a multiple of the warp step
    act_t* a_sh = reinterpret_cast<act_t*>(nf4t_dyn + NF4T_DYN_TABLE);
    if (k_begin < k_end) {
        const u32 len = k_end - k_begin;                  // a multiple of 32 values
        const u32 vec = 16 / sizeof(act_t);
        for (u32 i = threadIdx.x; i < NF4T_MTILE * len / vec; i += blockDim.x) {
            const u32 m = i / (len / vec), kk = (i % (len / vec)) * vec;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (m < mrows) v = *reinterpret_cast<const uint4*>(A + (u64)(m0 + m) * K + k_begin + kk);
            *reinterpret_cast<uint4*>(a_sh + m * kper + a_slot(kk)) = v;
        }
    }
#endif
    __syncthreads();

    float acc[NF4T_MTILE][NF4T_ROWS_PER_WARP];
#pragma unroll
    for (int m = 0; m < NF4T_MTILE; ++m)
#pragma unroll
        for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) acc[m][r] = 0.0f;
#if NF4T_ASTAGE == NF4T_ASTAGE_SHARED
    const act_t* a_stage = a_sh;
#else
    const act_t* a_stage = nullptr;
#endif
    if (row0 + NF4T_ROWS_PER_WARP > N)
        simt_steps<false, false>(dec, A, B, s, a_stage, row0, N, K, k, k_begin, k_end, kper, m0, mrows, lane, w, raw, acc);
    else if (absmax_f == nullptr)
        simt_steps<true, true>(dec, A, B, s, a_stage, row0, N, K, k, k_begin, k_end, kper, m0, mrows, lane, w, raw, acc);
    else
        simt_steps<true, false>(dec, A, B, s, a_stage, row0, N, K, k, k_begin, k_end, kper, m0, mrows, lane, w, raw, acc);

    // warp sums; lane (m*RPW + r) % 32 emits (m, r)
#pragma unroll
    for (int m = 0; m < NF4T_MTILE; ++m) {
#pragma unroll
        for (int r = 0; r < NF4T_ROWS_PER_WARP; ++r) {
            float v = acc[m][r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            const u32 n = row0 + r;
            if (lane == (u32)((m * NF4T_ROWS_PER_WARP + r) & 31) && m < (int)mrows && n < N)
                emit(v, m0 + m, n, N, bias, out, ws);
        }
    }
    if (ws != nullptr) {
        const u32 rows = min(warps * NF4T_ROWS_PER_WARP, N - row_first);
        finish_split(blockIdx.z * gridDim.x + blockIdx.x, row_first, rows, m0, mrows, N, bias, out, ws, counters,
                     gridDim.y);
    }
}
