// nf4-tune matmul, structure MMA (NF4T_MMA_MMA): tensor cores, a warp per row tile, every weight
// scaled. Experimental: it never won a served table entry (the row-operand paths mma-ks and mma-rows
// serve the tensor-core shapes); kept searchable with --experimental.
// Joined after codes.cuh and matmul/common.cuh (see common.cuh for the family and the shared knobs).
//
// mma.sync.m16n8k16 (bf16/fp16 operands, fp32 accumulators) with W rows as the mma's M and the batch
// padded to its N (8 or 16). The weight is decoded to the operand dtype exactly as bnb's
// dequantize_4bit rounds it (fl(lut * scale), round to nearest even). K is permuted consistently on
// both operands (lane (g, t) takes K run t*32 of each 128-wide window), so the weights are loaded with
// 16-byte loads as they lie.
//
// Knobs (besides common.cuh's):
//   NF4T_LOAD_BYTES     16 (a lane's run of 32 values).
//   NF4T_ROWS_PER_WARP  16, 32 or 64: m16 tiles of W per warp.
//   NF4T_MTILE          8 or 16: one or two n8 tiles of the batch.
//   NF4T_ASTAGE         NF4T_ASTAGE_SHARED: the CTA copies its K slice of A x MTILE into shared memory
//                       once; NF4T_ASTAGE_GLOBAL: read per window from global memory.
//   NF4T_SCALE          NF4T_SCALE_VALUE only (every weight scaled, as bnb rounds it).

#define NF4T_NT (NF4T_MTILE / 8)      // n8 tiles of the batch
#define NF4T_RT (NF4T_ROWS_PER_WARP / 16)       // m16 tiles of W rows per warp

// exact weight pair of byte j of word w: (fl(lut[hi] * s), fl(lut[lo] * s)) rounded to the
// operand dtype, the first value (high nibble) in the low half, as bnb's dequantize_4bit rounds them
__device__ __forceinline__ u32 wpair(const Decoder& dec, u32 w, int j, float sc) {
    float first, second;
    dec.values(w, j, first, second);
    return pack_pair(__fmul_rn(first, sc), __fmul_rn(second, sc));
}

__device__ __forceinline__ u32 word_of(const uint4& v, int j) {   // the word holding byte j
    return j < 4 ? v.x : j < 8 ? v.y : j < 12 ? v.z : v.w;
}

extern "C" __global__ void nf4t_matmul(NF4T_MATMUL_PARAMS) {
    setup_tables();
    const Decoder dec = make_decoder();
    Scales s = make_scales(absmax_q, code2, absmax2, absmax_f, offset_ptr, log2_bs, log2_g);

    const u32 warps = blockDim.x >> 5;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 g = lane >> 2, t = lane & 3;
    const u32 row_first = blockIdx.x * warps * NF4T_ROWS_PER_WARP;
    const u32 row0 = row_first + warp * NF4T_ROWS_PER_WARP;
    const u32 m0 = blockIdx.z * NF4T_MTILE;
    const u32 mrows = min((u32)NF4T_MTILE, M - m0);
    const u32 k_begin = blockIdx.y * kper;
    const u32 k_end = min(K, k_begin + kper);
    pdl_wait();                                           // A and y from here on

#if NF4T_ASTAGE == NF4T_ASTAGE_SHARED
    act_t* a_sh = reinterpret_cast<act_t*>(nf4t_dyn);     // [MTILE][kper]
    if (k_begin < k_end) {
        const u32 len = k_end - k_begin;
        const u32 vec = 8;                                 // 16 bytes of 16-bit values
        for (u32 i = threadIdx.x; i < NF4T_MTILE * len / vec; i += blockDim.x) {
            const u32 m = i / (len / vec), kk = (i % (len / vec)) * vec;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (m < mrows) v = *reinterpret_cast<const uint4*>(A + (u64)(m0 + m) * K + k_begin + kk);
            *reinterpret_cast<uint4*>(a_sh + m * kper + kk) = v;
        }
    }
#endif
    __syncthreads();

    float c[NF4T_RT][NF4T_NT][4];
    zero_frags(c);

    for (u32 kw = k_begin; kw < k_end; kw += 128) {
        const u32 k = kw + t * 32;                 // this lane's run of 32 values
        const bool in_k = k < k_end;
        uint4 wa[NF4T_RT], wb[NF4T_RT];
        float sa[NF4T_RT], sb[NF4T_RT];
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt) {
            const u32 na = row0 + rt * 16 + g, nb = na + 8;
            wa[rt] = (in_k && na < N) ? load_w16(B + (((u64)na * K + k) >> 1)) : make_uint4(0u, 0u, 0u, 0u);
            wb[rt] = (in_k && nb < N) ? load_w16(B + (((u64)nb * K + k) >> 1)) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt) {
            const u32 na = row0 + rt * 16 + g, nb = na + 8;
            sa[rt] = (in_k && na < N) ? scale_of(s, na * K + k) : 0.0f;
            sb[rt] = (in_k && nb < N) ? scale_of(s, nb * K + k) : 0.0f;
        }
        // activations of batch row m0 + nt*8 + g, the same run of 32 values: 16 words
        u32 bf[NF4T_NT][16];
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt) {
            const u32 m = nt * 8 + g;
#pragma unroll
            for (int i = 0; i < 16; i += 4) {
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (in_k && m < mrows) {
#if NF4T_ASTAGE == NF4T_ASTAGE_SHARED
                    v = *reinterpret_cast<const uint4*>(a_sh + m * kper + (k - k_begin) + 2 * i);
#else
                    v = *reinterpret_cast<const uint4*>(A + (u64)(m0 + m) * K + k + 2 * i);
#endif
                }
                bf[nt][i] = v.x; bf[nt][i + 1] = v.y; bf[nt][i + 2] = v.z; bf[nt][i + 3] = v.w;
            }
        }
#pragma unroll
        for (int st = 0; st < 8; ++st) {           // k-step: values 4st..4st+3 of the run
#pragma unroll
            for (int rt = 0; rt < NF4T_RT; ++rt) {
                const u32 a0 = wpair(dec, word_of(wa[rt], 2 * st), (2 * st) & 3, sa[rt]);
                const u32 a1 = wpair(dec, word_of(wb[rt], 2 * st), (2 * st) & 3, sb[rt]);
                const u32 a2 = wpair(dec, word_of(wa[rt], 2 * st + 1), (2 * st + 1) & 3, sa[rt]);
                const u32 a3 = wpair(dec, word_of(wb[rt], 2 * st + 1), (2 * st + 1) & 3, sb[rt]);
#pragma unroll
                for (int nt = 0; nt < NF4T_NT; ++nt) mma16816(c[rt][nt], a0, a1, a2, a3, bf[nt][2 * st], bf[nt][2 * st + 1]);
            }
        }
    }

    // c[rt][nt]: rows (g, g+8) of tile rt, batch columns nt*8 + 2t, +1
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt) {
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 n = row0 + rt * 16 + g + (i >= 2 ? 8 : 0);
                const u32 m = nt * 8 + 2 * t + (i & 1);
                if (n < N && m < mrows) emit(c[rt][nt][i], m0 + m, n, N, bias, out, ws);
            }
        }
    }
    if (ws != nullptr) {
        const u32 rows = min(warps * NF4T_ROWS_PER_WARP, N - row_first);
        finish_split(blockIdx.z * gridDim.x + blockIdx.x, row_first, rows, m0, mrows, N, bias, out, ws, counters,
                     gridDim.y);
    }
}
