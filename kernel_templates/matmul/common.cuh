// nf4-tune matmul family: fused 4-bit (NF4 / FP4) matmul for decode, bitsandbytes format.
//
//   y[m, n] = sum_k A[m, k] * W[n, k]  (+ bias[n])       W = dequant(B, quant_state), N x K
//
// straight from bnb's packed weight B (row n's K/2 bytes at B + n*K/2, first value of a byte in
// its HIGH nibble) and its QuantState, the nested absmax decoded in the kernel:
//
//   scale[b] = fl( fl(code2[absmax_q[b]] * absmax2[b >> log2_g]) + offset )   nested
//   scale[b] = absmax_f[b]                                                   plain
//   b        = (n*K + k) >> log2_blocksize            (K % blocksize == 0: a block never
//                                                      straddles two rows)
//
// A variant's source is ONE text: the knob macros (kernel_templates.render), then
// kernel_templates/codes.cuh (the 16-entry code), this file (what every structure shares: types,
// the code tables and decoders, loads, scales, the kernel's parameters, the output and split-K
// epilogue, the mma instruction), then the structure the config's NF4T_MMA picks:
//   NF4T_MMA_SIMT      matmul/simt.cu: fp32 FMAs on the CUDA cores
//   NF4T_MMA_MMA       matmul/mma.cu: tensor cores, a warp per row tile, every weight scaled
//                      (experimental: it never won a served table entry)
//   NF4T_MMA_MMA_KS    matmul/tensor.cuh + matmul/ks.cuh + matmul/mma_ks.cu (or mma_ks_bulk.cu
//                      with the bulk feed): tensor cores, a CTA's warps splitting K
//   NF4T_MMA_MMA_ROWS  matmul/tensor.cuh + matmul/mma_rows.cu: tensor cores, warps owning row tiles
//   NF4T_MMA_MMA_COLS  matmul/mma_cols.cu: tensor cores, the mma's n8 columns carrying the blocks
// (tuner/families/matmul/ declares the knobs and which files each structure takes). Each file's
// header says what its structure does and what each of its knobs changes; the knobs read here:
//   NF4T_LOAD_BYTES     bytes of W one lane loads per row per step: 4, 8 or 16 (one load of that
//                       width; 8, 16 or 32 values).
//   NF4T_PDL            0 or 1: programmatic dependent launch (pdl_wait below; experimental).
//   NF4T_ROWS_PER_WARP  rows of W per warp (SIMT: all their loads issued before first use; the
//                       tensor-core paths: m16 tiles), all reusing one load of A.
//   NF4T_MTILE          rows of A (the batch) per CTA.
//   NF4T_LUT            how a packed byte becomes code values:
//     NF4T_LUT_SHARED   the 16-entry code in shared memory (16 entries in 16 banks: a warp's lookups
//                       never conflict); a word's nibbles become table offsets with two masks per word
//                       and one byte permute per nibble;
//     NF4T_LUT_REGISTER a 4-level select tree in registers (lut_select), no memory;
//     NF4T_LUT_PAIR     a 256-entry table of (code[hi], code[lo]) pairs, one lookup per packed byte:
//                       SIMT float pairs replicated 16 times (32 KiB; the 16 lanes of a load phase
//                       hit distinct banks), the tensor-core paths 16-bit operand pairs per lane (32 KiB);
//     NF4T_LUT_PRMT     (16-bit activations) the codes as 16-bit operands in two byte tables in
//                       registers, four nibbles looked up per byte permute (prmt_pair), no memory;
//     NF4T_LUT_PAIRX    (16-bit activations) the 16-bit pair table with 256-byte rows (64 KiB of
//                       dynamic shared memory, half of every row unused), so a lookup's offset,
//                       byte << 8 | lane << 2, is one byte permute of the packed word and the lane's
//                       offset (row_offset): two instructions and one 4-byte shared load per packed
//                       byte (pair's 128-byte rows need a shift, a mask-and-merge and an add first);
//     NF4T_LUT_PAIRF    (SIMT) pairx's geometry with float pairs: (code[hi], code[lo]) as two fp32
//                       values per lane in 256-byte rows (64 KiB); per packed byte a permute, an
//                       8-byte load and two FMAs; the exact codes, so the same sums as lut shared;
//     NF4T_LUT_PAIRMIX  (SIMT, 16-bit activations) pairf and pairx in one 64 KiB table: each row
//                       holds the float pairs of lanes 0-15 (bytes 0-127) and the 16-bit pairs of the
//                       32 lanes (bytes 128-255); even rows of a warp decode through the float pairs
//                       (fewer instructions, two wavefronts a lookup), odd rows through the 16-bit
//                       pairs (two more instructions, one wavefront).
//                       SIMT turns a 16-bit pair into two floats: the codes rounded to the dtype.
//   NF4T_WLOAD          NF4T_WLOAD_PLAIN loads of W, or NF4T_WLOAD_STREAM:
//                       ld.global.nc.L1::no_allocate (W is read once).
//   NF4T_PRMT_QUARTERS  (mma-rows with lut pairx) quarters of a lane's packed bytes decoded by lut
//                       prmt's permutes instead of the pair table (pair16; see mma_rows.cu).
//   NF4T_FEED           (mma-ks) NF4T_FEED_BULK adds a producer warp that the epilogue leaves out.
//   NF4T_DTYPE          activations, output and bias: NF4T_DTYPE_BF16, NF4T_DTYPE_FP16, NF4T_DTYPE_FP32.
//   NF4T_QUANT          NF4T_QUANT_NF4 or NF4T_QUANT_FP4 (codes.cuh).
// Launch knobs (not macros): threads per CTA (warps x 32, read as blockDim.x) and the split-K
// count (gridDim.y).
//
// Split-K (gridDim.y > 1): every CTA adds its partial sums to an fp32 workspace with atomics and
// counts itself in per-tile counters; the last CTA of a tile adds the bias, rounds, writes y and
// puts the workspace and the counter back to zero, so one launch does it all and the workspace
// stays ready for the next (no memset launch; CUDA-graph friendly).
//
// Multiplies and adds of the scale are __fmul_rn / __fadd_rn, as bnb's dequantize computes them.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned char u8;

#if NF4T_DTYPE == NF4T_DTYPE_FP32
typedef float act_t;
#else
typedef unsigned short act_t;
#endif

#define NF4T_VPL (2 * NF4T_LOAD_BYTES)          // values of W per lane per row per k-iteration
#define NF4T_WWORDS (NF4T_LOAD_BYTES / 4 > 0 ? NF4T_LOAD_BYTES / 4 : 1)

__shared__ float nf4t_lut[16];
extern __shared__ __align__(16) unsigned char nf4t_dyn[];
#if NF4T_LUT == NF4T_LUT_PAIR && (NF4T_MMA == NF4T_MMA_MMA_KS || NF4T_MMA == NF4T_MMA_MMA_ROWS)
__shared__ __align__(16) u32 nf4t_pairs16[256 * 32];   // [byte][lane]: operand-dtype pair, per lane
#elif NF4T_LUT == NF4T_LUT_PAIRX
// [byte][64]: the pair in words 0..31 (per lane); 64 KiB exceed static shared memory: the first
// NF4T_DYN_TABLE bytes of the dynamic shared memory
#define nf4t_pairs16 (reinterpret_cast<u32*>(nf4t_dyn))
#define NF4T_DYN_TABLE (256 * 64 * 4)
#elif NF4T_LUT == NF4T_LUT_PAIRF
// [byte][lane]: the float pair per lane, 256-byte rows, the first NF4T_DYN_TABLE bytes of the dynamic
// shared memory (64 KiB exceed static shared memory)
#define nf4t_pairsf (reinterpret_cast<float2*>(nf4t_dyn))
#define NF4T_DYN_TABLE (256 * 32 * 8)
#elif NF4T_LUT == NF4T_LUT_PAIRMIX
// [byte]: 16 float pairs (lane & 15), then 32 16-bit pairs (lane); 256-byte rows in the first
// NF4T_DYN_TABLE bytes of the dynamic shared memory
#define NF4T_DYN_TABLE (256 * 256)
#elif NF4T_LUT == NF4T_LUT_PAIR
__shared__ __align__(16) float2 nf4t_pairs[256 * 16];
#endif
#if NF4T_MMA != NF4T_MMA_MMA
// the nested statistics' code (256 floats): a warp's 16 lookups of one step fall in 32 banks, not in
// up to 8 L1 lines
__shared__ float nf4t_code2[256];
#endif

__device__ __forceinline__ float lut(u32 q) {
#if NF4T_LUT == NF4T_LUT_SHARED
    return nf4t_lut[q];
#else
    return lut_select(q);
#endif
}

// byte j of x, zero-extended (one byte permute)
__device__ __forceinline__ u32 byte_at(u32 x, int j) {
    u32 r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(x), "r"(0x4440u | (u32)j));
    return r;
}

// the code value at a byte offset (4 x nibble) into the 16-entry shared table
__device__ __forceinline__ float lut_at(u32 offset) {
    return *reinterpret_cast<const float*>(reinterpret_cast<const char*>(nf4t_lut) + offset);
}



// (first, second) rounded to the 16-bit operand dtype, the first in the low half
__device__ __forceinline__ u32 pack_pair(float first, float second) {
    u32 r;
#if NF4T_DTYPE == NF4T_DTYPE_BF16
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(second), "f"(first));
#elif NF4T_DTYPE == NF4T_DTYPE_FP16
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(second), "f"(first));
#else
    r = 0u;   // no 16-bit operands for fp32 activations (the MMA paths refuse fp32)
#endif
    return r;
}

__device__ __forceinline__ void setup_tables() {
    const float v[16] = {NF4T_V0, NF4T_V1, NF4T_V2, NF4T_V3, NF4T_V4, NF4T_V5, NF4T_V6, NF4T_V7,
                         NF4T_V8, NF4T_V9, NF4T_V10, NF4T_V11, NF4T_V12, NF4T_V13, NF4T_V14, NF4T_V15};
#if NF4T_LUT == NF4T_LUT_SHARED
    if (threadIdx.x < 16) nf4t_lut[threadIdx.x] = v[threadIdx.x];
#elif (NF4T_LUT == NF4T_LUT_PAIR && (NF4T_MMA == NF4T_MMA_MMA_KS || NF4T_MMA == NF4T_MMA_MMA_ROWS)) || NF4T_LUT == NF4T_LUT_PAIRX
    // the 16-bit pair table: 256 pairs, each written to its 32 lane copies with 16-byte stores
    for (u32 i = threadIdx.x; i < 256 * 8; i += blockDim.x) {
        const u32 e = i >> 3;
        const u32 p = pack_pair(lut_select(e >> 4), lut_select(e & 15u));
        *reinterpret_cast<uint4*>(nf4t_pairs16 + e * (NF4T_LUT == NF4T_LUT_PAIRX ? 64 : 32) + (i & 7) * 4) = make_uint4(p, p, p, p);
    }
#elif NF4T_LUT == NF4T_LUT_PAIRF
    // the float pair table: 256 pairs, each written to its 32 lane copies, two per 16-byte store
    for (u32 i = threadIdx.x; i < 256 * 16; i += blockDim.x) {
        const u32 e = i >> 4;
        const float first = lut_select(e >> 4), second = lut_select(e & 15u);
        *reinterpret_cast<float4*>(nf4t_pairsf + e * 32 + (i & 15u) * 2) = make_float4(first, second, first, second);
    }
#elif NF4T_LUT == NF4T_LUT_PAIRMIX
    // a row in 16 16-byte stores: 8 of two float pairs, 8 of four 16-bit pairs
    for (u32 i = threadIdx.x; i < 256 * 16; i += blockDim.x) {
        const u32 e = i >> 4, q = i & 15u;
        const float first = lut_select(e >> 4), second = lut_select(e & 15u);
        unsigned char* row = nf4t_dyn + e * 256u;
        if (q < 8u) {
            *reinterpret_cast<float4*>(row + q * 16u) = make_float4(first, second, first, second);
        } else {
            const u32 p = pack_pair(first, second);
            *reinterpret_cast<uint4*>(row + q * 16u) = make_uint4(p, p, p, p);
        }
    }
#elif NF4T_LUT == NF4T_LUT_PAIR
    for (u32 i = threadIdx.x; i < 256 * 16; i += blockDim.x) {
        const u32 e = i >> 4;
        nf4t_pairs[i] = make_float2(lut_select(e >> 4), lut_select(e & 15u));
    }
#endif
    (void)v;
}

// ---------------------------------------------------------------- conversions
__device__ __forceinline__ float act_to_float(act_t v) {
#if NF4T_DTYPE == NF4T_DTYPE_BF16
    return __uint_as_float(((u32)v) << 16);
#elif NF4T_DTYPE == NF4T_DTYPE_FP16
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
#else
    return v;
#endif
}

__device__ __forceinline__ act_t float_to_act(float v) {
#if NF4T_DTYPE == NF4T_DTYPE_BF16
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#elif NF4T_DTYPE == NF4T_DTYPE_FP16
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#else
    return v;
#endif
}

// two words of packed 16-bit activations -> floats (low half first)
__device__ __forceinline__ void unpack2(u32 w, float& lo, float& hi) {
#if NF4T_DTYPE == NF4T_DTYPE_BF16
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
#elif NF4T_DTYPE == NF4T_DTYPE_FP16
    asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}"
        : "=f"(lo), "=f"(hi) : "r"(w));
#endif
}

// ---------------------------------------------------------------- 16-bit code pairs and the decoder
#if NF4T_LUT == NF4T_LUT_PRMT || NF4T_PRMT_QUARTERS > 0
// NF4T_LUT_PRMT: the 16 codes rounded to the operand dtype, as two byte tables (low bytes
// T_L0..3, high bytes T_H0..3: 4 entries per register) held in registers; byte permutes look up
// four nibbles at once (prmt picks a byte out of 8 by a 3-bit index: codes 0-7 from one register
// pair, 8-15 from the other, the nibble's top bit choosing between them through a sign-replicated
// byte mask). No memory is touched: the decode leaves the shared-memory / L1 pipe to the loads.
// The constants are the cvt.rn roundings of the NF4T_V code values (tests check them against the
// 16-entry shared table's).
#if NF4T_QUANT == NF4T_QUANT_NF4 && NF4T_DTYPE == NF4T_DTYPE_BF16
#define T_L0 0xca063280u
#define T_L1 0x00ba3d92u
#define T_L2 0xad7c25a3u
#define T_L3 0x803910e2u
#define T_H0 0xbebfbfbfu
#define T_H1 0x00bdbebeu
#define T_H2 0x3e3e3e3du
#define T_H3 0x3f3f3f3eu
#elif NF4T_QUANT == NF4T_QUANT_NF4
#define T_L0 0x52339200u
#define T_L1 0x00d4ea8du
#define T_L2 0x68e02618u
#define T_L3 0x00c9800du
#define T_H0 0xb6b8b9bcu
#define T_H1 0x00adb1b4u
#define T_H2 0x3533312du
#define T_H3 0x3c393837u
#elif NF4T_DTYPE == NF4T_DTYPE_BF16
#define T_L0 0x802bab00u
#define T_L1 0x802b00abu
#define T_L2 0x802bab00u
#define T_L3 0x802b00abu
#define T_H0 0x3f3f3b00u
#define T_H1 0x3e3e3f3eu
#define T_H2 0xbfbfbb80u
#define T_H3 0xbebebfbeu
#else
#define T_L0 0x00555500u
#define T_L1 0x00550055u
#define T_L2 0x00555500u
#define T_L3 0x00550055u
#define T_H0 0x3c391d00u
#define T_H1 0x34313835u
#define T_H2 0xbcb99d80u
#define T_H3 0xb4b1b8b5u
#endif

__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// the operand pair of byte j (0..3) of w
__device__ __forceinline__ u32 prmt_pair(u32 w, int j) {
    const u32 half = j < 2 ? w : w >> 16;              // nibbles 0..3: lo(byte), hi(byte), lo, hi
    const u32 sel = half & 0x7777u;
    const u32 lo_a = prmt(T_L0, T_L1, sel), lo_b = prmt(T_L2, T_L3, sel);
    const u32 hi_a = prmt(T_H0, T_H1, sel), hi_b = prmt(T_H2, T_H3, sel);
    const u32 m = prmt(half << 4, half, 0xD9C8u);     // byte k: 0xff where nibble k >= 8
    const u32 lo = (lo_b & m) | (lo_a & ~m), hi = (hi_b & m) | (hi_a & ~m);
    // first value (high nibble) in the low half
    return (j & 1) ? prmt(lo, hi, 0x6273u) : prmt(lo, hi, 0x4051u);
}
#endif

// The byte offset of a lane's copy of packed byte j's entry in a pair table of 256-byte rows
// (pairx, pairf, pairmix): byte j of w << 8 | lane_off (lane_off < 256), one byte permute
// (byte 0: lane_off's, byte 1: byte j of w, bytes 2-3: lane_off's zeros).
__device__ __forceinline__ u32 row_offset(u32 w, int j, u32 lane_off) {
    u32 off;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(off) : "r"(w), "r"(lane_off), "r"(0x5504u | ((u32)(j & 3) << 4)));
    return off;
}

// the 16-bit operand pair (values 2j, 2j+1 of the run) of byte j of word w
__device__ __forceinline__ u32 pair16(u32 w, int j, u32 lane4) {
#if NF4T_LUT == NF4T_LUT_PRMT
    return prmt_pair(w, j & 3);
#elif NF4T_LUT == NF4T_LUT_PAIR && (NF4T_MMA == NF4T_MMA_MMA_KS || NF4T_MMA == NF4T_MMA_MMA_ROWS)
    const u32 off = (((w >> (8 * (j & 3))) & 0xffu) << 7) | lane4;
    return *reinterpret_cast<const u32*>(reinterpret_cast<const char*>(nf4t_pairs16) + off);
#elif NF4T_LUT == NF4T_LUT_PAIRX
#if NF4T_PRMT_QUARTERS > 0
    if (((j >> 1) & 3) < NF4T_PRMT_QUARTERS) return prmt_pair(w, j & 3);   // j is a compile-time index: no branch
#endif
    return *reinterpret_cast<const u32*>(reinterpret_cast<const char*>(nf4t_pairs16) + row_offset(w, j, lane4));
#elif NF4T_LUT == NF4T_LUT_SHARED
    const u32 hi4 = (w >> 2) & 0x3c3c3c3cu, lo4 = (w << 2) & 0x3c3c3c3cu;
    return pack_pair(lut_at(byte_at(hi4, j & 3)), lut_at(byte_at(lo4, j & 3)));
#else
    const u32 byte = (w >> ((j & 3) * 8)) & 0xffu;
    return pack_pair(lut_select(byte >> 4), lut_select(byte & 15u));
#endif
}

// The two code values of packed byte j of word w: (first = high nibble, second = low nibble).
struct Decoder {
    u32 lane_off;     // pair tables: this lane's copy (bytes)
    u32 lane_off16;   // pairmix: this lane's 16-bit pair (bytes)
    // r: the row of the warp's rows (pairmix decodes even and odd rows differently)
    __device__ __forceinline__ void values(u32 w, int j, float& first, float& second, int r = 0) const {
#if NF4T_LUT == NF4T_LUT_PAIRMIX
        const u32 off = row_offset(w, j, (r & 1) ? lane_off16 : lane_off);
        if (r & 1) {
            unpack2(*reinterpret_cast<const u32*>(nf4t_dyn + off), first, second);
        } else {
            const float2 v = *reinterpret_cast<const float2*>(nf4t_dyn + off);
            first = v.x;
            second = v.y;
        }
#elif NF4T_LUT == NF4T_LUT_SHARED
        const u32 hi4 = (w >> 2) & 0x3c3c3c3cu, lo4 = (w << 2) & 0x3c3c3c3cu;   // nibble x 4 in every byte
        first = lut_at(byte_at(hi4, j));
        second = lut_at(byte_at(lo4, j));
#elif NF4T_LUT == NF4T_LUT_REGISTER
        const u32 byte = (w >> (j * 8)) & 0xffu;
        first = lut_select(byte >> 4);
        second = lut_select(byte & 15u);
#elif NF4T_LUT == NF4T_LUT_PRMT || NF4T_LUT == NF4T_LUT_PAIRX
        unpack2(pair16(w, j, lane_off), first, second);   // the codes rounded to the 16-bit dtype
#elif NF4T_LUT == NF4T_LUT_PAIRF
        const float2 v =
            *reinterpret_cast<const float2*>(reinterpret_cast<const char*>(nf4t_pairsf) + row_offset(w, j, lane_off));
        first = v.x;
        second = v.y;
#elif NF4T_MMA != NF4T_MMA_MMA_KS && NF4T_MMA != NF4T_MMA_MMA_ROWS
        const float2 v = *reinterpret_cast<const float2*>(
            reinterpret_cast<const char*>(nf4t_pairs) + ((byte_at(w, j) << 7) + lane_off));
        first = v.x;
        second = v.y;
#endif
    }
};

__device__ __forceinline__ Decoder make_decoder() {
    Decoder d;
#if NF4T_LUT == NF4T_LUT_PAIRX
    d.lane_off = (threadIdx.x & 31u) << 2;     // word lane of each 256-byte row
#elif NF4T_LUT == NF4T_LUT_PAIRF
    d.lane_off = (threadIdx.x & 31u) << 3;     // float2 lane of each 256-byte row
#elif NF4T_LUT == NF4T_LUT_PAIRMIX
    d.lane_off = (threadIdx.x & 15u) << 3;             // float2 lane & 15 in bytes 0-127
    d.lane_off16 = 128u | ((threadIdx.x & 31u) << 2);  // 16-bit pair lane in bytes 128-255
#else
    d.lane_off = (threadIdx.x & 15u) << 3;     // float2 lane & 15 of each 128-byte row
#endif
    return d;
}

// ---------------------------------------------------------------- loads
__device__ __forceinline__ uint4 load_w16(const u8* p) {
    uint4 v;
#if NF4T_WLOAD == NF4T_WLOAD_STREAM
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
    v = *reinterpret_cast<const uint4*>(p);
#endif
    return v;
}

__device__ __forceinline__ void load_w(const u8* p, u32 (&w)[NF4T_WWORDS]) {
#if NF4T_LOAD_BYTES == 16
    const uint4 v = load_w16(p);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
#elif NF4T_LOAD_BYTES == 8
#if NF4T_WLOAD == NF4T_WLOAD_STREAM
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
#else
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x; w[1] = v.y;
#endif
#else
#if NF4T_WLOAD == NF4T_WLOAD_STREAM
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
#else
    w[0] = *reinterpret_cast<const u32*>(p);
#endif
#endif
}

// ---------------------------------------------------------------- scales
struct Scales {
    const u8* __restrict__ absmax_q;
    const float* __restrict__ code2;
    const float* __restrict__ absmax2;
    const float* __restrict__ absmax_f;
    float offset;
    u32 log2_bs, log2_g;
};

__device__ __forceinline__ Scales make_scales(const u8* absmax_q, const float* code2, const float* absmax2,
                                              const float* absmax_f, const float* offset_ptr, u32 log2_bs, u32 log2_g) {
    Scales s;
    s.absmax_q = absmax_q; s.code2 = code2; s.absmax2 = absmax2; s.absmax_f = absmax_f;
    s.offset = offset_ptr != nullptr ? __ldg(offset_ptr) : 0.0f;
    s.log2_bs = log2_bs; s.log2_g = log2_g;
    return s;
}

// ---------------------------------------------------------------- programmatic dependent launch
// NF4T_PDL 1 (experimental, sm_90+; the runtime with NF4TUNE_PDL=1): launched with programmatic stream
// serialization, the kernel may start while the kernel before it in the stream is still running. What a kernel
// does before pdl_wait() reads only the packed weight, its statistics and constants (the first window's W, the
// tables): never A, never y, the workspace or the counters, which the kernel before may still write or read.
// pdl_wait() waits for that kernel to finish and its writes to be visible (at once when the launch had no such
// dependency), then lets the kernel after this one start its own prologue while this one's last CTAs run.
// NF4T_PDL 0: nothing (the source compiles as before the knob existed).
__device__ __forceinline__ void pdl_wait() {
#if NF4T_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The kernel's parameters, the same on every path (tuner/families/matmul/plan.py: MatmulPlan.PARAM_KINDS)
#define NF4T_MATMUL_PARAMS                                                                                       \
    const act_t* __restrict__ A, const u8* __restrict__ B, const u8* __restrict__ absmax_q,                    \
        const float* __restrict__ code2, const float* __restrict__ absmax2, const float* __restrict__ absmax_f, \
        const float* __restrict__ offset_ptr, const act_t* __restrict__ bias, act_t* __restrict__ out,          \
        float* __restrict__ ws, u32* __restrict__ counters, u32 M, u32 N, u32 K, u32 log2_bs, u32 log2_g,      \
        u32 kper

__device__ __forceinline__ float scale_of(const Scales& s, u32 e) {  // e = n*K + k
    const u32 b = e >> s.log2_bs;
    if (s.absmax_f != nullptr) return __ldg(s.absmax_f + b);
    return __fadd_rn(__fmul_rn(__ldg(s.code2 + __ldg(s.absmax_q + b)), __ldg(s.absmax2 + (b >> s.log2_g))), s.offset);
}

// The statistics of a block in two halves, so that a prefetch issues the loads from DRAM (the
// absmax byte and group absmax, or the plain absmax) and the use finishes the scale later (the
// code lookup hits L1): no load waits on another before the current step is computed.
struct ScaleRaw {
    u32 q;
    float a;
};
__device__ __forceinline__ ScaleRaw scale_load_block(const Scales& s, u32 b) {
    ScaleRaw r;
    if (s.absmax_f != nullptr) {
        r.q = 0u;
        r.a = __ldg(s.absmax_f + b);
    } else {
        r.q = __ldg(s.absmax_q + b);
        r.a = __ldg(s.absmax2 + (b >> s.log2_g));
    }
    return r;
}
__device__ __forceinline__ ScaleRaw scale_load(const Scales& s, u32 e) { return scale_load_block(s, e >> s.log2_bs); }
__device__ __forceinline__ float scale_finish(const Scales& s, ScaleRaw r) {   // SIMT: the code in shared memory
    if (s.absmax_f != nullptr) return r.a;
#if NF4T_MMA == NF4T_MMA_SIMT
    return __fadd_rn(__fmul_rn(nf4t_code2[r.q], r.a), s.offset);
#else
    return __fadd_rn(__fmul_rn(__ldg(s.code2 + r.q), r.a), s.offset);
#endif
}

#if NF4T_MMA != NF4T_MMA_MMA
// the scale with the statistics' kind known at compile time (nested: the code in shared memory)
template <bool kNested>
__device__ __forceinline__ float scale_finish_known(const Scales& s, ScaleRaw r) {
    if (!kNested) return r.a;
    return __fadd_rn(__fmul_rn(nf4t_code2[r.q], r.a), s.offset);
}
#endif

// ---------------------------------------------------------------- output
// Add the bias, round and store y[m, n]; or, split over K, add the partial sum to the workspace.
__device__ __forceinline__ void emit(float v, u32 m, u32 n, u32 N, const act_t* __restrict__ bias,
                                     act_t* __restrict__ out, float* __restrict__ ws) {
    if (ws != nullptr) {
        atomicAdd(ws + (u64)m * N + n, v);
    } else {
        if (bias != nullptr) v += act_to_float(bias[n]);
        out[(u64)m * N + n] = float_to_act(v);
    }
}

// The threads that compute and write y: all of the CTA's, but the producer warp of the bulk feed
// (NF4T_FEED_BULK: the CTA's last warp), which only copies W and takes no part in the epilogue.
#if NF4T_FEED == NF4T_FEED_BULK
#define NF4T_PRODUCER_WARPS 1
#else
#define NF4T_PRODUCER_WARPS 0
#endif
__device__ __forceinline__ u32 work_threads() { return blockDim.x - 32u * NF4T_PRODUCER_WARPS; }
__device__ __forceinline__ void work_sync() {
#if NF4T_FEED == NF4T_FEED_BULK
    asm volatile("bar.sync 1, %0;" ::"r"(work_threads()) : "memory");
#else
    __syncthreads();
#endif
}

// Split-K: the last CTA of this (row tile, m tile) finishes it; parts: the CTAs that add to it (the
// split count gridDim.y, or stream-K's count for the tile). Every working thread of the CTA calls this.
__device__ __forceinline__ void finish_split(u32 tile, u32 row_first, u32 rows, u32 m_first, u32 mrows, u32 N,
                                             const act_t* __restrict__ bias, act_t* __restrict__ out,
                                             float* __restrict__ ws, u32* __restrict__ counters, u32 parts) {
    __shared__ u32 last;
    __threadfence();
    work_sync();
    if (threadIdx.x == 0) {
        const u32 prev = atomicAdd(counters + tile, 1u);
        last = (prev == parts - 1);
        if (last) counters[tile] = 0u;
    }
    work_sync();
    if (!last) return;
    __threadfence();
    for (u32 i = threadIdx.x; i < rows * mrows; i += work_threads()) {
        const u32 m = m_first + i / rows, n = row_first + i % rows;
        float* p = ws + (u64)m * N + n;
        float v = __ldcg(p);
        *p = 0.0f;
        if (bias != nullptr) v += act_to_float(bias[n]);
        out[(u64)m * N + n] = float_to_act(v);
    }
}

#ifndef NF4T_DYN_TABLE
#define NF4T_DYN_TABLE 0
#endif

// Zeroes a warp's mma accumulator fragments: R row tiles x C n8 tiles x 4 floats (every tensor-core structure)
template <int R, int C>
__device__ __forceinline__ void zero_frags(float (&c)[R][C][4]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int n = 0; n < C; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) c[r][n][i] = 0.0f;
}

// d += a * b on the tensor cores: m16n8k16, 16-bit operands, fp32 accumulators
__device__ __forceinline__ void mma16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if NF4T_DTYPE == NF4T_DTYPE_BF16
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

