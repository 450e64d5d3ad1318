// nf4-tune kernel family: fused 4-bit (NF4 / FP4) dequantization, bitsandbytes format.
//
// One launch turns bnb's packed 4-bit tensor plus its QuantState into bf16 / fp16 / fp32:
// it decodes the nested (double-quantized) absmax itself, so bnb's three launches become one.
//
//   scale[b] = fl( fl(code2[absmax_q[b]] * absmax2[b / gsize]) + offset )   nested statistics
//   scale[b] = absmax_f[b]                                                  plain float32 absmax
//   out[i]   = round_nearest_even_T( fl(lut[nibble(i)] * scale[i / blocksize]) )
//
// Multiplies and adds are __fmul_rn / __fadd_rn (never contracted to FMA) and the program is
// built with -ftz=true, which is what bnb's --use_fast_math CUDA build computes.  The first
// value of a byte is its HIGH nibble.
//
// The knobs arrive as macros (tuner/families/dequant.py declares them; kernel_templates.render
// writes each as NF4T_<KNOB>, an enum knob's values as named constants NF4T_<KNOB>_<VALUE>), after
// kernel_templates/codes.cuh (the 16-entry code of NF4T_QUANT and lut_select). Each changes:
//   NF4T_BYTES_PER_THREAD  packed bytes a thread loads per step: 1, 2, 4, 8, 16 (one load of
//                that width). Wider steps mean fewer, wider memory instructions and 16-byte
//                output stores.
//   NF4T_UNROLL  independent steps per thread per tile, all loads issued before the first use
//                (1, 2, 4, 8): more bytes in flight to cover DRAM latency.
//   NF4T_LUT     where the 16-entry code lives:
//                  NF4T_LUT_BRANCH    an if-tree on the nibble bits (warps diverge on data)
//                  NF4T_LUT_GLOBAL    a __device__ array, as bnb does (an L1-cached load per value)
//                  NF4T_LUT_CONSTANT  __constant__ memory (serialises when a warp reads many
//                                     addresses)
//                  NF4T_LUT_SHARED    copied to shared memory per CTA (32 banks serve divergent reads)
//                  NF4T_LUT_REGISTER  no memory: a 4-level select tree on the nibble bits
//   NF4T_INDEX   how a value finds its scale:
//                  NF4T_INDEX_DIV     integer division by the run-time blocksize, per packed byte
//                  NF4T_INDEX_SHIFT   shift by log2(blocksize), per packed byte
//                  NF4T_INDEX_HOISTED one scale per step (a step never straddles a quantization
//                                     block: 2*NF4T_BYTES_PER_THREAD <= 32 <= blocksize and steps
//                                     are aligned)
//   NF4T_STORE   NF4T_STORE_PLAIN stores, or NF4T_STORE_STREAMING (st.global.cs: evict-first, the
//                output is not re-read by this kernel)
//   NF4T_DTYPE   the output: NF4T_DTYPE_BF16, NF4T_DTYPE_FP16, NF4T_DTYPE_FP32
//   NF4T_QUANT   NF4T_QUANT_NF4 or NF4T_QUANT_FP4 (codes.cuh)
// Threads per block and the grid (one tile per CTA, or a persistent grid-stride loop) are
// launch parameters: the loop below serves both, a one-shot grid runs it once.
//
// No __launch_bounds__: capping registers for 1024 threads made a seventh of the space spill;
// the host refuses a (registers x threads) that cannot launch.
//
// Tails: a step whose outputs all lie inside n takes the vector path; the last, partial steps
// go through a byte-by-byte path that never reads past the packed bytes nor writes past n.
// The host side checks alignment and the 32-bit index range before it launches.

typedef unsigned int u32;
typedef unsigned long long u64;

#if NF4T_DTYPE == NF4T_DTYPE_FP32
typedef float out_t;
#define NF4T_WORDS_PER_BYTE 2
#else
typedef unsigned short out_t;
#define NF4T_WORDS_PER_BYTE 1
#endif

#define NF4T_LOAD_WORDS ((NF4T_BYTES_PER_THREAD + 3) / 4)
#define NF4T_OUT_WORDS (NF4T_BYTES_PER_THREAD * NF4T_WORDS_PER_BYTE)

// ---------------------------------------------------------------- lookup table
__device__ __forceinline__ float lut_branch(u32 q) {
    if (q & 8) {
        if (q & 4) {
            if (q & 2) return (q & 1) ? NF4T_V15 : NF4T_V14;
            else       return (q & 1) ? NF4T_V13 : NF4T_V12;
        } else {
            if (q & 2) return (q & 1) ? NF4T_V11 : NF4T_V10;
            else       return (q & 1) ? NF4T_V9 : NF4T_V8;
        }
    } else {
        if (q & 4) {
            if (q & 2) return (q & 1) ? NF4T_V7 : NF4T_V6;
            else       return (q & 1) ? NF4T_V5 : NF4T_V4;
        } else {
            if (q & 2) return (q & 1) ? NF4T_V3 : NF4T_V2;
            else       return (q & 1) ? NF4T_V1 : NF4T_V0;
        }
    }
}

#if NF4T_LUT == NF4T_LUT_GLOBAL
__device__ float nf4t_lut_global[16] = {NF4T_VALUES};
#elif NF4T_LUT == NF4T_LUT_CONSTANT
__constant__ float nf4t_lut_constant[16] = {NF4T_VALUES};
#elif NF4T_LUT == NF4T_LUT_SHARED
__shared__ float nf4t_lut_shared[16];
#endif

__device__ __forceinline__ float lut(u32 q) {
#if NF4T_LUT == NF4T_LUT_BRANCH
    return lut_branch(q);
#elif NF4T_LUT == NF4T_LUT_GLOBAL
    return nf4t_lut_global[q];
#elif NF4T_LUT == NF4T_LUT_CONSTANT
    return nf4t_lut_constant[q];
#elif NF4T_LUT == NF4T_LUT_SHARED
    return nf4t_lut_shared[q];
#else
    return lut_select(q);
#endif
}

// ---------------------------------------------------------------- scales
struct Scales {
    const unsigned char* __restrict__ absmax_q;  // nested: one byte per block
    const float* __restrict__ code2;             // nested: 256-entry dynamic code
    const float* __restrict__ absmax2;           // nested: one float per group of blocks
    const float* __restrict__ absmax_f;          // not nested: one float per block (else null)
    float offset;
    u32 blocksize, log2_blocksize, groupsize, log2_groupsize;
};

__device__ __forceinline__ float scale_of_block(const Scales& s, u32 b, u32 g) {
    if (s.absmax_f != nullptr) return s.absmax_f[b];
    return __fadd_rn(__fmul_rn(s.code2[s.absmax_q[b]], s.absmax2[g]), s.offset);
}

// Scale of the block holding element e, with this variant's index arithmetic.
__device__ __forceinline__ float scale_of_element(const Scales& s, u32 e) {
#if NF4T_INDEX == NF4T_INDEX_DIV
    const u32 b = e / s.blocksize;
    return scale_of_block(s, b, b / s.groupsize);
#else
    const u32 b = e >> s.log2_blocksize;
    return scale_of_block(s, b, b >> s.log2_groupsize);
#endif
}

// ---------------------------------------------------------------- conversion and stores
__device__ __forceinline__ u32 pack_pair(float first, float second) {
    u32 r;
#if NF4T_DTYPE == NF4T_DTYPE_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(second), "f"(first));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(second), "f"(first));
#endif
    return r;
}

__device__ __forceinline__ void store_one(out_t* out, u32 e, float v) {
#if NF4T_DTYPE == NF4T_DTYPE_FP32
    out[e] = v;
#else
    unsigned short h;
#if NF4T_DTYPE == NF4T_DTYPE_BF16
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
#else
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
#endif
    out[e] = h;
#endif
}

__device__ __forceinline__ void store_v4(u32* p, u32 a, u32 b, u32 c, u32 d) {
#if NF4T_STORE == NF4T_STORE_STREAMING
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
#else
    *reinterpret_cast<uint4*>(p) = make_uint4(a, b, c, d);
#endif
}
__device__ __forceinline__ void store_v2(u32* p, u32 a, u32 b) {
#if NF4T_STORE == NF4T_STORE_STREAMING
    asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(a), "r"(b) : "memory");
#else
    *reinterpret_cast<uint2*>(p) = make_uint2(a, b);
#endif
}
__device__ __forceinline__ void store_v1(u32* p, u32 a) {
#if NF4T_STORE == NF4T_STORE_STREAMING
    asm volatile("st.global.cs.u32 [%0], %1;" :: "l"(p), "r"(a) : "memory");
#else
    *p = a;
#endif
}

// ---------------------------------------------------------------- one step
__device__ __forceinline__ void load_step(const unsigned char* __restrict__ A, u32 step, u32 (&w)[NF4T_LOAD_WORDS]) {
    const unsigned char* p = A + (u64)step * NF4T_BYTES_PER_THREAD;
#if NF4T_BYTES_PER_THREAD == 16
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
#elif NF4T_BYTES_PER_THREAD == 8
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x; w[1] = v.y;
#elif NF4T_BYTES_PER_THREAD == 4
    w[0] = *reinterpret_cast<const u32*>(p);
#elif NF4T_BYTES_PER_THREAD == 2
    w[0] = *reinterpret_cast<const unsigned short*>(p);
#else
    w[0] = *p;
#endif
}

// Decode a full step (all 2*NF4T_BYTES_PER_THREAD outputs inside n) into NF4T_OUT_WORDS 32-bit words.
__device__ __forceinline__ void decode_step(const Scales& s, u32 step, const u32 (&w)[NF4T_LOAD_WORDS],
                                            float hoisted_scale, u32 (&o)[NF4T_OUT_WORDS]) {
    const u32 e0 = step * (2 * NF4T_BYTES_PER_THREAD);
#pragma unroll
    for (int j = 0; j < NF4T_BYTES_PER_THREAD; ++j) {
        const u32 byte = (w[j >> 2] >> ((j & 3) * 8)) & 0xffu;
#if NF4T_INDEX == NF4T_INDEX_HOISTED
        const float sc = hoisted_scale;
#else
        const float sc = scale_of_element(s, e0 + 2 * j);
#endif
        const float first = __fmul_rn(lut(byte >> 4), sc);
        const float second = __fmul_rn(lut(byte & 15u), sc);
#if NF4T_DTYPE == NF4T_DTYPE_FP32
        o[2 * j] = __float_as_uint(first);
        o[2 * j + 1] = __float_as_uint(second);
#else
        o[j] = pack_pair(first, second);
#endif
    }
}

// Decode a full step and store it with wide stores.
__device__ __forceinline__ void decode_store_step(const Scales& s, out_t* __restrict__ out, u32 step,
                                                  const u32 (&w)[NF4T_LOAD_WORDS], float hoisted_scale) {
    u32 o[NF4T_OUT_WORDS];
    decode_step(s, step, w, hoisted_scale, o);
    u32* dst = reinterpret_cast<u32*>(out + step * (2 * NF4T_BYTES_PER_THREAD));
#if NF4T_OUT_WORDS >= 4
#pragma unroll
    for (int k = 0; k < NF4T_OUT_WORDS; k += 4) store_v4(dst + k, o[k], o[k + 1], o[k + 2], o[k + 3]);
#elif NF4T_OUT_WORDS == 2
    store_v2(dst, o[0], o[1]);
#else
    store_v1(dst, o[0]);
#endif
}

// A step that reaches past n (or past the packed bytes): byte by byte, bounds checked.
// Kept rolled (#pragma unroll 1): it runs in the last tile only, and unrolled it doubles the code.
__device__ __forceinline__ void tail_step(const unsigned char* __restrict__ A, const Scales& s,
                                          out_t* __restrict__ out, u32 step, u32 n) {
    const u32 nbytes = (n + 1) >> 1;
#pragma unroll 1
    for (int j = 0; j < NF4T_BYTES_PER_THREAD; ++j) {
        const u32 bi = step * NF4T_BYTES_PER_THREAD + j;
        if (bi >= nbytes) return;
        const u32 byte = A[bi];
        const u32 e = 2 * bi;
        const float sc = scale_of_element(s, e);
        store_one(out, e, __fmul_rn(lut(byte >> 4), sc));
        if (e + 1 < n) store_one(out, e + 1, __fmul_rn(lut(byte & 15u), sc));
    }
}

// ---------------------------------------------------------------- the kernel
extern "C" __global__ void
nf4t_dequantize(const unsigned char* __restrict__ A,
                const unsigned char* __restrict__ absmax_q, const float* __restrict__ code2,
                const float* __restrict__ absmax2, const float* __restrict__ absmax_f, float offset,
                out_t* __restrict__ out, u32 n,
                u32 blocksize, u32 log2_blocksize, u32 groupsize, u32 log2_groupsize, u32 ntiles) {
#if NF4T_LUT == NF4T_LUT_SHARED
    if (threadIdx.x < 16) nf4t_lut_shared[threadIdx.x] = lut_branch(threadIdx.x);
    __syncthreads();
#endif
    Scales s;
    s.absmax_q = absmax_q; s.code2 = code2; s.absmax2 = absmax2; s.absmax_f = absmax_f; s.offset = offset;
    s.blocksize = blocksize; s.log2_blocksize = log2_blocksize;
    s.groupsize = groupsize; s.log2_groupsize = log2_groupsize;

    const u32 threads = blockDim.x;
    const u32 tile_steps = threads * NF4T_UNROLL;
    for (u32 tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        const u32 first = tile * tile_steps + threadIdx.x;
        const u32 last = first + (NF4T_UNROLL - 1) * threads;
        if ((u64)(last + 1) * (2 * NF4T_BYTES_PER_THREAD) <= (u64)n) {
            u32 w[NF4T_UNROLL][NF4T_LOAD_WORDS];
            float sc[NF4T_UNROLL];
#pragma unroll
            for (int u = 0; u < NF4T_UNROLL; ++u) load_step(A, first + u * threads, w[u]);
#pragma unroll
            for (int u = 0; u < NF4T_UNROLL; ++u) {
#if NF4T_INDEX == NF4T_INDEX_HOISTED
                const u32 b = ((first + u * threads) * (2 * NF4T_BYTES_PER_THREAD)) >> log2_blocksize;
                sc[u] = scale_of_block(s, b, b >> log2_groupsize);
#else
                sc[u] = 0.0f;
#endif
            }
#pragma unroll
            for (int u = 0; u < NF4T_UNROLL; ++u) decode_store_step(s, out, first + u * threads, w[u], sc[u]);
        } else {
#pragma unroll 1
            for (int u = 0; u < NF4T_UNROLL; ++u) tail_step(A, s, out, first + u * threads, n);
        }
    }
}
