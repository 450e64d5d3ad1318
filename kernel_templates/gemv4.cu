// nf4-tune kernel family: fused 4-bit (NF4 / FP4) matmul for decode, bitsandbytes format.
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
// Work: a CTA owns WARPS x ROWS_PER_WARP rows of W, a slice of K (split-K: gridDim.y slices)
// and MTILE rows of A (gridDim.z tiles). A lane always covers whole, block-aligned runs of K
// (8, 16 or 32 values), so one scale serves a lane's run.
//
// The knobs arrive as macros, written by the family declaration (tuner/families/matmul.py):
//   NF4T_MMA     0 SIMT: fp32 FMAs on CUDA cores. Per k-iteration each lane loads its run of A
//                once (to fp32 registers) and reuses it for all ROWS_PER_WARP rows: A is read
//                once per ROWS_PER_WARP rows, not once per row.
//                1 tensor cores: mma.sync.m16n8k16 (bf16/fp16) with the batch padded to 8 or 16.
//                The weight is decoded to the operand dtype exactly as bnb's dequantize_4bit
//                rounds it (fl(lut * scale), round to nearest even) and accumulated in fp32.
//                K is permuted consistently on both operands (lane (g, t) takes K run t*32 of
//                each 128-wide window), so the weights are loaded with 16-byte loads as they lie.
//                2 tensor cores with W rows as the mma's M, the CTA's warps splitting K (mma-ks);
//                3 the same operands with each warp owning its row tiles over the CTA's K slice and
//                A staged in shared memory (mma-rows); each has its section below.
//   NF4T_LOAD    bytes of W one lane loads per row per k-iteration: 4, 8 or 16 (one load of that
//                width; 8, 16 or 32 values). The MMA path loads 16.
//   NF4T_RPW     rows of W per warp: SIMT 1..32 (all their loads issued before first use: more
//                bytes in flight); MMA 16, 32 or 64 (tiles of 16 rows).
//   NF4T_MTILE   rows of A per CTA: SIMT 1, 2, 4, 8 (each its own fp32 registers); MMA 8 or 16
//                (one or two n8 tiles of the mma).
//   NF4T_LUT     0 shared: the 16-entry code in shared memory (16 entries in 16 banks: a warp's
//                lookups never conflict); a word's nibbles are turned into table offsets with
//                two masks per word and one byte permute per nibble;
//                1 register: a 4-level select tree, no memory;
//                3 prmt (16-bit activations; not the mma path): the codes as 16-bit operands in two byte
//                tables in registers, four nibbles looked up per byte permute (see prmt_pair), no memory;
//                SIMT turns each pair into two floats (the codes rounded to the activation dtype);
//                2 pair: a 256-entry table of (code[hi], code[lo]) float pairs, one lookup per
//                packed byte (one 8-byte load for two values), replicated 16 times so that the
//                16 lanes of a load phase always hit distinct banks (32 KiB of shared memory);
//                4 pairx (16-bit activations; not the mma path): a 256-entry table of 16-bit operand pairs
//                with 256-byte rows (64 KiB of dynamic shared memory, half of every row unused), so a
//                lookup's offset, byte << 8 | lane << 2, is one byte permute of the packed word and the
//                lane's offset: two instructions and one 4-byte shared load per packed byte (the
//                128-byte rows of pair need a shift, a mask-and-merge and an add first; SIMT's float
//                pairs of lut 2 take an 8-byte load per byte, lut 0 a 4-byte load per value). SIMT
//                turns each pair into two floats (the codes rounded to the activation dtype).
//                5 pairf (SIMT only; any activation dtype): pairx's geometry with float pairs, a 256-entry
//                table of (code[hi], code[lo]) as two fp32 values per lane in 256-byte rows (32 lanes x
//                8 bytes, 64 KiB of dynamic shared memory, every byte used). A lookup's offset,
//                byte << 8 | lane << 3, is one byte permute as in pairx, and its 8-byte load gives the two
//                exact codes ready for the FMAs: per packed byte a permute, a load and two FMAs (pairx adds
//                two instructions to widen its 16-bit pair; lut 2's 128-byte rows need a shift-and-add).
//                The 16 lanes of a load phase read 16 distinct bank pairs; a lookup is two wavefronts.
//                The products are lut 0's, in the same order: the same sums bit for bit.
//                6 pairmix (SIMT only; 16-bit activations): pairf and pairx in one 64 KiB table and both
//                used: each 256-byte row holds the float pairs of lanes 0-15 (bytes 0-127; a lane reads its
//                lane & 15 copy) and the 16-bit pairs of the 32 lanes (bytes 128-255), so either lookup's
//                offset is one byte permute. Even rows of a warp decode through the float pairs (fewer
//                instructions, two wavefronts a lookup), odd rows through the 16-bit pairs (two more
//                instructions, one wavefront): between pairx's instructions and pairf's wavefronts.
//   NF4T_ASTAGE  0 global: each warp reads its run of A per k-iteration from global memory (L1
//                and L2 hits: A is small and every CTA reads it); 1 shared: the CTA copies its
//                K slice of A x MTILE into shared memory once (dynamic shared memory). SIMT stages
//                it lane-major (see a_slot): a lane's run is 64 bytes apart from its neighbour's, so
//                read as it lies each 16-byte load of a warp would touch 16 lines (global) or
//                conflict 4-way (shared); lane-major, a warp's k-th 16-byte chunks are 512
//                contiguous bytes (4 wavefronts).
//   NF4T_SCALE   0 value: every weight scaled before the product (w = fl(lut * scale));
//                1 block: sum lut[q] * a over the lane's run, then one multiply by the scale.
//                (SIMT only; the MMA path scales per value.)
//   NF4T_WLOAD   0 plain loads of W; 1 streaming: ld.global.nc.L1::no_allocate (W is read once).
//   NF4T_PREFETCH 0: a warp loads W (and the statistics) of a k-iteration, waits, computes;
//                1: software pipelined: the next k-iteration's W and statistics are loaded before
//                the current one is computed, so a warp always has loads in flight (twice the
//                registers for W).
//                2 (mma-rows, 16-byte loads): two groups ahead (three times the registers for W): the
//                group after next is issued before the current one is computed, so each compute overlaps
//                two groups' loads. Session 13/14: the span kernel's per-SM rate follows its warps (latency
//                per warp), and the L1 pipe is not its bound; this adds bytes in flight per warp without
//                the coarser groups of unroll 4.
//   NF4T_UNROLL  mma-ks: windows of K per group (all loads of a group issued before the first is used).
//   NF4T_SPAN    mma-rows: blocks a window spans (1, 2, 4). 1: a window lies in one block (8*LOAD <=
//                blocksize). 2, 4: the window's runs lie in SPAN blocks (lane t's run in part t*SPAN/4),
//                and each part takes its own columns of the mma's n8 (8/SPAN batch rows per n8 tile), so
//                one mma still covers the window and the parts' sums are scaled apart and added at the
//                end: 16-byte loads at blocksize 64 without a second mma per block.
//   NF4T_PRMTQ   mma-rows with lut pairx, 8- or 16-byte loads: quarters of a lane's packed bytes decoded by lut prmt's byte
//                permutes instead of the pair table (0, 1, 2): the byte pairs h of a load with h % 4 < PRMTQ.
//                pairx costs a permute and a shared load per byte (the L1 pipe that W's loads share:
//                84% busy in session 13's profile), prmt about 5.5 ALU instructions and no memory; a mix
//                moves part of the decode off the L1 pipe. The same 16-bit codes: the same sums bit for bit.
//   NF4T_PERSIST mma-ks: 1 a few CTAs per SM loop over the row tiles.
//                mma-rows: 1 stream-K: the grid is the CTAs resident at once (times ksplit: the plan's CTAs per
//                resident slot; the kernel takes gridDim.x as it comes), and each takes an equal run of
//                the (row tile, group of K) units, row tile major, as slices of one tile at a time; a tile
//                cut between CTAs is summed in the split-K workspace and finished by its last CTA. A CTA per
//                (row tile, K slice) runs only as many warps as the tiles have: 28672 rows of 256-row tiles
//                are 112 CTAs on 132 SMs (sessions 13-14: the time follows the warps in flight).
//   NF4T_STAGES  mma-ks: 0 W goes global -> registers (NF4T_PREFETCH decides how far ahead); N > 0:
//                W goes global -> shared memory by cp.async, in a per-warp ring N groups deep, so the
//                bytes in flight per SM are bound by shared memory (228 KiB) instead of registers.
//   NF4T_FEED    mma-ks with NF4T_STAGES > 0: 0 lanes: each lane copies its own bytes (and their
//                statistics) into its warp's ring; 1 bulk: a producer warp (one more per CTA) copies
//                each chunk (W's and A's rows by cp.async.bulk, one instruction per row; the rows'
//                statistics by cp.async) into a ring of chunks the CTA's warps share, guarded by
//                mbarriers (sm_90 and newer); the other warps only read shared memory and compute.
//   NF4T_STATS   mma-ks, register feed or per-warp ring (not the bulk feed): 0 lanes: every lane loads the raw statistics
//                of its rows' runs (absmax byte and group absmax, or the float absmax) with each window and
//                finishes the scale itself, the four lanes of a quad the same block's; 1 tile: before a row
//                tile's windows the CTA decodes every scale of the tile's K slice into shared memory (each
//                block once per CTA; a thread issues the loads of 8 entries before it decodes them), and a lane's
//                scale is then one ld.shared per row and window: no statistics' addresses, loads or decode
//                in the loop, and no statistics registers in flight (the per-warp ring copies W only).
//   NF4T_MAXNREG mma-rows without stream-K: 0 no cap; N: __maxnreg__(N), at most N registers a thread, so
//                that more warps fit an SM's four register sub-partitions (16,384 registers each, allocated
//                256 a warp: 80 registers fit 6 warps a sub-partition, 72 fit 7, against 4 at 104-128).
//                Session 23's profile (H100, M = 16): the served kernel (8-byte loads, 16-row batch tile,
//                unroll 4) runs one CTA of 14 warps an SM at 103 registers, latency-bound (21.6% occupancy,
//                long-scoreboard stalls first). Capped at 80 (NVRTC 13.5, sm_90) it spills 72 bytes, 45
//                instructions of them in its loops; unroll 2 spills 4. A's stage must shrink too (ksplit 4
//                or 8) for a second or third CTA an SM. Spills go to local memory (L1): the cap trades them
//                for warps; the sweep decides.
//   NF4T_ACHUNK  mma-rows: 0 a window's runs of A are read from shared memory at once, LOAD registers a batch
//                tile (8 batch rows) held through the window's k-steps; 1 one 16-byte chunk at a time (its
//                loads for every batch tile, then its two k-steps): 4 registers a batch tile. Session 25 (CPU,
//                NVRTC 13.5, sm_90): the served M = 16 kernel (8-byte loads, unroll 4) 109 -> 89 registers, the
//                16-byte span-2 kernel with the 32-row batch tile 182 -> 128, M = 8's 135 -> 103, no spills: a
//                window's A was the largest live set (LOAD x NT registers; the asm volatile loads and mmas keep
//                their order, so all of a window's loads were issued, and live, before its first mma). The
//                mmas run in the same order: the same sums bit for bit. The shared loads' latency is then
//                exposed per chunk, hidden by the warps the registers free.
//   NF4T_ACT     0 bf16, 1 fp16, 2 fp32 activations (and output, bias)
//   NF4T_QUANT   0 nf4, 1 fp4
// Launch knobs (not macros): threads per CTA (WARPS x 32, read as blockDim.x) and the split-K
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

#if NF4T_QUANT == 0
#define NF4T_V0 -1.0f
#define NF4T_V1 -0.6961928009986877f
#define NF4T_V2 -0.5250730514526367f
#define NF4T_V3 -0.39491748809814453f
#define NF4T_V4 -0.28444138169288635f
#define NF4T_V5 -0.18477343022823334f
#define NF4T_V6 -0.09105003625154495f
#define NF4T_V7 0.0f
#define NF4T_V8 0.07958029955625534f
#define NF4T_V9 0.16093020141124725f
#define NF4T_V10 0.24611230194568634f
#define NF4T_V11 0.33791524171829224f
#define NF4T_V12 0.44070982933044434f
#define NF4T_V13 0.5626170039176941f
#define NF4T_V14 0.7229568362236023f
#define NF4T_V15 1.0f
#else
#define NF4T_V0 0.0f
#define NF4T_V1 0.005208333333f
#define NF4T_V2 0.66666667f
#define NF4T_V3 1.0f
#define NF4T_V4 0.33333333f
#define NF4T_V5 0.5f
#define NF4T_V6 0.16666667f
#define NF4T_V7 0.25f
#define NF4T_V8 -0.0f
#define NF4T_V9 -0.005208333333f
#define NF4T_V10 -0.66666667f
#define NF4T_V11 -1.0f
#define NF4T_V12 -0.33333333f
#define NF4T_V13 -0.5f
#define NF4T_V14 -0.16666667f
#define NF4T_V15 -0.25f
#endif

#if NF4T_ACT == 2
typedef float act_t;
#else
typedef unsigned short act_t;
#endif

#define NF4T_VPL (2 * NF4T_LOAD)          // values of W per lane per row per k-iteration
#define NF4T_WWORDS (NF4T_LOAD / 4 > 0 ? NF4T_LOAD / 4 : 1)

// ---------------------------------------------------------------- lookup table
__device__ __forceinline__ float lut_select(u32 q) {
    const bool b0 = q & 1, b1 = q & 2, b2 = q & 4, b3 = q & 8;
    const float a0 = b0 ? NF4T_V1 : NF4T_V0,   a1 = b0 ? NF4T_V3 : NF4T_V2;
    const float a2 = b0 ? NF4T_V5 : NF4T_V4,   a3 = b0 ? NF4T_V7 : NF4T_V6;
    const float a4 = b0 ? NF4T_V9 : NF4T_V8,   a5 = b0 ? NF4T_V11 : NF4T_V10;
    const float a6 = b0 ? NF4T_V13 : NF4T_V12, a7 = b0 ? NF4T_V15 : NF4T_V14;
    const float c0 = b1 ? a1 : a0, c1 = b1 ? a3 : a2, c2 = b1 ? a5 : a4, c3 = b1 ? a7 : a6;
    const float d0 = b2 ? c1 : c0, d1 = b2 ? c3 : c2;
    return b3 ? d1 : d0;
}

__shared__ float nf4t_lut[16];
extern __shared__ __align__(16) unsigned char nf4t_dyn[];
#if NF4T_LUT == 2 && (NF4T_MMA == 2 || NF4T_MMA == 3)
__shared__ __align__(16) u32 nf4t_pairs16[256 * 32];   // [byte][lane]: operand-dtype pair, per lane
#elif NF4T_LUT == 4
// [byte][64]: the pair in words 0..31 (per lane); 64 KiB exceed static shared memory: the first
// NF4T_DYN_TABLE bytes of the dynamic shared memory
#define nf4t_pairs16 (reinterpret_cast<u32*>(nf4t_dyn))
#define NF4T_DYN_TABLE (256 * 64 * 4)
#elif NF4T_LUT == 5
// [byte][lane]: the float pair per lane, 256-byte rows, the first NF4T_DYN_TABLE bytes of the dynamic
// shared memory (64 KiB exceed static shared memory)
#define nf4t_pairsf (reinterpret_cast<float2*>(nf4t_dyn))
#define NF4T_DYN_TABLE (256 * 32 * 8)
#elif NF4T_LUT == 6
// [byte]: 16 float pairs (lane & 15), then 32 16-bit pairs (lane); 256-byte rows in the first
// NF4T_DYN_TABLE bytes of the dynamic shared memory
#define NF4T_DYN_TABLE (256 * 256)
#elif NF4T_LUT == 2
__shared__ __align__(16) float2 nf4t_pairs[256 * 16];
#endif
#if NF4T_MMA != 1
// the nested statistics' code (256 floats): a warp's 16 lookups of one step fall in 32 banks, not in
// up to 8 L1 lines
__shared__ float nf4t_code2[256];
#endif

__device__ __forceinline__ float lut(u32 q) {
#if NF4T_LUT == 0
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
#if NF4T_ACT == 0
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(second), "f"(first));
#elif NF4T_ACT == 1
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(second), "f"(first));
#else
    r = 0u;   // no 16-bit operands for fp32 activations (the MMA paths refuse fp32)
#endif
    return r;
}

__device__ __forceinline__ void setup_tables() {
    const float v[16] = {NF4T_V0, NF4T_V1, NF4T_V2, NF4T_V3, NF4T_V4, NF4T_V5, NF4T_V6, NF4T_V7,
                         NF4T_V8, NF4T_V9, NF4T_V10, NF4T_V11, NF4T_V12, NF4T_V13, NF4T_V14, NF4T_V15};
#if NF4T_LUT == 0
    if (threadIdx.x < 16) nf4t_lut[threadIdx.x] = v[threadIdx.x];
#elif (NF4T_LUT == 2 && (NF4T_MMA == 2 || NF4T_MMA == 3)) || NF4T_LUT == 4
    // the 16-bit pair table: 256 pairs, each written to its 32 lane copies with 16-byte stores
    for (u32 i = threadIdx.x; i < 256 * 8; i += blockDim.x) {
        const u32 e = i >> 3;
        const u32 p = pack_pair(lut_select(e >> 4), lut_select(e & 15u));
        *reinterpret_cast<uint4*>(nf4t_pairs16 + e * (NF4T_LUT == 4 ? 64 : 32) + (i & 7) * 4) = make_uint4(p, p, p, p);
    }
#elif NF4T_LUT == 5
    // the float pair table: 256 pairs, each written to its 32 lane copies, two per 16-byte store
    for (u32 i = threadIdx.x; i < 256 * 16; i += blockDim.x) {
        const u32 e = i >> 4;
        const float first = lut_select(e >> 4), second = lut_select(e & 15u);
        *reinterpret_cast<float4*>(nf4t_pairsf + e * 32 + (i & 15u) * 2) = make_float4(first, second, first, second);
    }
#elif NF4T_LUT == 6
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
#elif NF4T_LUT == 2
    for (u32 i = threadIdx.x; i < 256 * 16; i += blockDim.x) {
        const u32 e = i >> 4;
        nf4t_pairs[i] = make_float2(lut_select(e >> 4), lut_select(e & 15u));
    }
#endif
    (void)v;
}

// ---------------------------------------------------------------- conversions
__device__ __forceinline__ float act_to_float(act_t v) {
#if NF4T_ACT == 0
    return __uint_as_float(((u32)v) << 16);
#elif NF4T_ACT == 1
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
#else
    return v;
#endif
}

__device__ __forceinline__ act_t float_to_act(float v) {
#if NF4T_ACT == 0
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#elif NF4T_ACT == 1
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
#else
    return v;
#endif
}

// two words of packed 16-bit activations -> floats (low half first)
__device__ __forceinline__ void unpack2(u32 w, float& lo, float& hi) {
#if NF4T_ACT == 0
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
#elif NF4T_ACT == 1
    asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}"
        : "=f"(lo), "=f"(hi) : "r"(w));
#endif
}

// ---------------------------------------------------------------- 16-bit code pairs and the decoder
#if NF4T_LUT == 3 || NF4T_PRMTQ > 0
// NF4T_LUT 3 (prmt): the 16 codes rounded to the operand dtype, as two byte tables (low bytes
// T_L0..3, high bytes T_H0..3: 4 entries per register) held in registers; byte permutes look up
// four nibbles at once (prmt picks a byte out of 8 by a 3-bit index: codes 0-7 from one register
// pair, 8-15 from the other, the nibble's top bit choosing between them through a sign-replicated
// byte mask). No memory is touched: the decode leaves the shared-memory / L1 pipe to the loads.
// The constants are the cvt.rn roundings of the NF4T_V code values (tests check them against the
// 16-entry shared table's).
#if NF4T_QUANT == 0 && NF4T_ACT == 0
#define T_L0 0xca063280u
#define T_L1 0x00ba3d92u
#define T_L2 0xad7c25a3u
#define T_L3 0x803910e2u
#define T_H0 0xbebfbfbfu
#define T_H1 0x00bdbebeu
#define T_H2 0x3e3e3e3du
#define T_H3 0x3f3f3f3eu
#elif NF4T_QUANT == 0
#define T_L0 0x52339200u
#define T_L1 0x00d4ea8du
#define T_L2 0x68e02618u
#define T_L3 0x00c9800du
#define T_H0 0xb6b8b9bcu
#define T_H1 0x00adb1b4u
#define T_H2 0x3533312du
#define T_H3 0x3c393837u
#elif NF4T_ACT == 0
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
#if NF4T_LUT == 3
    return prmt_pair(w, j & 3);
#elif NF4T_LUT == 2 && (NF4T_MMA == 2 || NF4T_MMA == 3)
    const u32 off = (((w >> (8 * (j & 3))) & 0xffu) << 7) | lane4;
    return *reinterpret_cast<const u32*>(reinterpret_cast<const char*>(nf4t_pairs16) + off);
#elif NF4T_LUT == 4
#if NF4T_PRMTQ > 0
    if (((j >> 1) & 3) < NF4T_PRMTQ) return prmt_pair(w, j & 3);   // j is a compile-time index: no branch
#endif
    return *reinterpret_cast<const u32*>(reinterpret_cast<const char*>(nf4t_pairs16) + row_offset(w, j, lane4));
#elif NF4T_LUT == 0
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
#if NF4T_LUT == 6
        const u32 off = row_offset(w, j, (r & 1) ? lane_off16 : lane_off);
        if (r & 1) {
            unpack2(*reinterpret_cast<const u32*>(nf4t_dyn + off), first, second);
        } else {
            const float2 v = *reinterpret_cast<const float2*>(nf4t_dyn + off);
            first = v.x;
            second = v.y;
        }
#elif NF4T_LUT == 0
        const u32 hi4 = (w >> 2) & 0x3c3c3c3cu, lo4 = (w << 2) & 0x3c3c3c3cu;   // nibble x 4 in every byte
        first = lut_at(byte_at(hi4, j));
        second = lut_at(byte_at(lo4, j));
#elif NF4T_LUT == 1
        const u32 byte = (w >> (j * 8)) & 0xffu;
        first = lut_select(byte >> 4);
        second = lut_select(byte & 15u);
#elif NF4T_LUT == 3 || NF4T_LUT == 4
        unpack2(pair16(w, j, lane_off), first, second);   // the codes rounded to the 16-bit dtype
#elif NF4T_LUT == 5
        const float2 v =
            *reinterpret_cast<const float2*>(reinterpret_cast<const char*>(nf4t_pairsf) + row_offset(w, j, lane_off));
        first = v.x;
        second = v.y;
#elif NF4T_MMA != 2 && NF4T_MMA != 3
        const float2 v = *reinterpret_cast<const float2*>(
            reinterpret_cast<const char*>(nf4t_pairs) + ((byte_at(w, j) << 7) + lane_off));
        first = v.x;
        second = v.y;
#endif
    }
};

__device__ __forceinline__ Decoder make_decoder() {
    Decoder d;
#if NF4T_LUT == 4
    d.lane_off = (threadIdx.x & 31u) << 2;     // word lane of each 256-byte row
#elif NF4T_LUT == 5
    d.lane_off = (threadIdx.x & 31u) << 3;     // float2 lane of each 256-byte row
#elif NF4T_LUT == 6
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
#if NF4T_WLOAD == 1
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
    v = *reinterpret_cast<const uint4*>(p);
#endif
    return v;
}

__device__ __forceinline__ void load_w(const u8* p, u32 (&w)[NF4T_WWORDS]) {
#if NF4T_LOAD == 16
    const uint4 v = load_w16(p);
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
#elif NF4T_LOAD == 8
#if NF4T_WLOAD == 1
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
#else
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x; w[1] = v.y;
#endif
#else
#if NF4T_WLOAD == 1
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

// The kernel's parameters, the same on every path (tuner/families/matmul.py: MatmulPlan.PARAM_KINDS)
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
#if NF4T_MMA == 0
    return __fadd_rn(__fmul_rn(nf4t_code2[r.q], r.a), s.offset);
#else
    return __fadd_rn(__fmul_rn(__ldg(s.code2 + r.q), r.a), s.offset);
#endif
}

#if NF4T_MMA != 1
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
// (NF4T_FEED 1, the CTA's last warp), which only copies W and takes no part in the epilogue.
__device__ __forceinline__ u32 work_threads() { return blockDim.x - 32u * NF4T_FEED; }
__device__ __forceinline__ void work_sync() {
#if NF4T_FEED == 1
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

// d += a * b on the tensor cores: m16n8k16, 16-bit operands, fp32 accumulators
__device__ __forceinline__ void mma16816(float (&c)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if NF4T_ACT == 0
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


#if NF4T_MMA == 0
// ================================================================ SIMT
__device__ __forceinline__ void load_a_run(const act_t* __restrict__ src, float (&a)[NF4T_VPL]) {
#if NF4T_ACT == 2
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

#if NF4T_ASTAGE == 1
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
__device__ __forceinline__ void dot_staged(const Decoder& dec, const u32 (&w)[NF4T_RPW][NF4T_WWORDS],
                                           const act_t* first, const float (&sc)[NF4T_RPW], float (&acc)[NF4T_RPW]) {
    float part[NF4T_RPW];
#pragma unroll
    for (int r = 0; r < NF4T_RPW; ++r) part[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < NF4T_VPL / NF4T_ACH; ++c) {
        const uint4 v = *reinterpret_cast<const uint4*>(first + c * 32 * NF4T_ACH);
        float a[NF4T_ACH];
#if NF4T_ACT == 2
        a[0] = __uint_as_float(v.x); a[1] = __uint_as_float(v.y); a[2] = __uint_as_float(v.z); a[3] = __uint_as_float(v.w);
#else
        unpack2(v.x, a[0], a[1]);
        unpack2(v.y, a[2], a[3]);
        unpack2(v.z, a[4], a[5]);
        unpack2(v.w, a[6], a[7]);
#endif
#pragma unroll
        for (int r = 0; r < NF4T_RPW; ++r) {
#pragma unroll
            for (int jj = 0; jj < NF4T_ACH / 2; ++jj) {
                const int j = c * (NF4T_ACH / 2) + jj;          // byte j of the run: values 2j, 2j+1
                float first_v, second_v;
                dec.values(w[r][j >> 2], j & 3, first_v, second_v, r);
#if NF4T_SCALE == 0
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
    for (int r = 0; r < NF4T_RPW; ++r) {
#if NF4T_SCALE == 1
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
    for (int j = 0; j < NF4T_LOAD; ++j) {
        float first, second;
        dec.values(w[j >> 2], j & 3, first, second, r);
#if NF4T_SCALE == 0
        acc = fmaf(__fmul_rn(first, sc), a[2 * j], acc);
        acc = fmaf(__fmul_rn(second, sc), a[2 * j + 1], acc);
#else
        acc = fmaf(first, a[2 * j], acc);
        acc = fmaf(second, a[2 * j + 1], acc);
#endif
    }
#if NF4T_SCALE == 1
    acc = acc * sc;
#endif
    return acc;
}

// W of a lane's run for the warp's rows (zeros past N) and the raw statistics of their blocks
__device__ __forceinline__ void simt_load(const u8* __restrict__ B, const Scales& s, u32 row0, u32 N, u32 K, u32 k,
                                          u32 (&w)[NF4T_RPW][NF4T_WWORDS], ScaleRaw (&raw)[NF4T_RPW]) {
#pragma unroll
    for (int r = 0; r < NF4T_RPW; ++r) {
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
                                               u32 (&w)[NF4T_RPW][NF4T_WWORDS], ScaleRaw (&raw)[NF4T_RPW]) {
    u32 e = row0 * K + k;
#pragma unroll
    for (int r = 0; r < NF4T_RPW; ++r) {
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
                                               u32 (&w)[NF4T_RPW][NF4T_WWORDS], ScaleRaw (&raw)[NF4T_RPW]) {
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
                                           u32 (&w)[NF4T_RPW][NF4T_WWORDS], ScaleRaw (&raw)[NF4T_RPW],
                                           float (&acc)[NF4T_MTILE][NF4T_RPW]) {
    const u32 kstride = 32 * NF4T_VPL;
    (void)a_sh; (void)k_begin; (void)kper; (void)lane;
    for (; k < k_end; k += kstride) {
#if NF4T_PREFETCH == 1
        u32 wn[NF4T_RPW][NF4T_WWORDS];
        ScaleRaw rawn[NF4T_RPW];
        if (k + kstride < k_end) simt_load_step<kFull, kNested>(B, s, row0, N, K, k + kstride, wn, rawn);
#endif
        float sc[NF4T_RPW];
#pragma unroll
        for (int r = 0; r < NF4T_RPW; ++r) sc[r] = kFull ? scale_finish_known<kNested>(s, raw[r])
                                                        : ((row0 + r < N) ? scale_finish(s, raw[r]) : 0.0f);
#pragma unroll
        for (int m = 0; m < NF4T_MTILE; ++m) {
            if (m < (int)mrows) {
#if NF4T_ASTAGE == 1
                dot_staged(dec, w, a_sh + m * kper + (k - k_begin) - lane * (NF4T_VPL - NF4T_ACH), sc, acc[m]);
#else
                float a[NF4T_VPL];
                load_a_run(A + (u64)(m0 + m) * K + k, a);
#pragma unroll
                for (int r = 0; r < NF4T_RPW; ++r) acc[m][r] += dot_run(dec, w[r], a, sc[r], r);
#endif
            }
        }
#if NF4T_PREFETCH == 1
#pragma unroll
        for (int r = 0; r < NF4T_RPW; ++r) {
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
    const u32 row_first = blockIdx.x * warps * NF4T_RPW;
    const u32 row0 = row_first + warp * NF4T_RPW;
    const u32 m0 = blockIdx.z * NF4T_MTILE;
    const u32 mrows = min((u32)NF4T_MTILE, M - m0);
    const u32 k_begin = blockIdx.y * kper;
    const u32 k_end = min(K, k_begin + kper);

    // the first step's W and statistics are loaded before the tables are filled and A is staged
    u32 w[NF4T_RPW][NF4T_WWORDS];
    ScaleRaw raw[NF4T_RPW];
    u32 k = k_begin + lane * NF4T_VPL;
    if (k < k_end) simt_load(B, s, row0, N, K, k, w, raw);
    setup_tables();
    if (code2 != nullptr)
        for (u32 i = threadIdx.x; i < 256; i += blockDim.x) nf4t_code2[i] = __ldg(code2 + i);
#if NF4T_ASTAGE == 1
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

    float acc[NF4T_MTILE][NF4T_RPW];
#pragma unroll
    for (int m = 0; m < NF4T_MTILE; ++m)
#pragma unroll
        for (int r = 0; r < NF4T_RPW; ++r) acc[m][r] = 0.0f;
#if NF4T_ASTAGE == 1
    const act_t* a_stage = a_sh;
#else
    const act_t* a_stage = nullptr;
#endif
    if (row0 + NF4T_RPW > N)
        simt_steps<false, false>(dec, A, B, s, a_stage, row0, N, K, k, k_begin, k_end, kper, m0, mrows, lane, w, raw, acc);
    else if (absmax_f == nullptr)
        simt_steps<true, true>(dec, A, B, s, a_stage, row0, N, K, k, k_begin, k_end, kper, m0, mrows, lane, w, raw, acc);
    else
        simt_steps<true, false>(dec, A, B, s, a_stage, row0, N, K, k, k_begin, k_end, kper, m0, mrows, lane, w, raw, acc);

    // warp sums; lane (m*RPW + r) % 32 emits (m, r)
#pragma unroll
    for (int m = 0; m < NF4T_MTILE; ++m) {
#pragma unroll
        for (int r = 0; r < NF4T_RPW; ++r) {
            float v = acc[m][r];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            const u32 n = row0 + r;
            if (lane == (u32)((m * NF4T_RPW + r) & 31) && m < (int)mrows && n < N)
                emit(v, m0 + m, n, N, bias, out, ws);
        }
    }
    if (ws != nullptr) {
        const u32 rows = min(warps * NF4T_RPW, N - row_first);
        finish_split(blockIdx.z * gridDim.x + blockIdx.x, row_first, rows, m0, mrows, N, bias, out, ws, counters,
                     gridDim.y);
    }
}

#elif NF4T_MMA == 1
// ================================================================ tensor cores (mma.sync)
#define NF4T_NT (NF4T_MTILE / 8)      // n8 tiles of the batch
#define NF4T_RT (NF4T_RPW / 16)       // m16 tiles of W rows per warp

// exact weight pair of byte j of word w: (fl(lut[hi] * s), fl(lut[lo] * s)) rounded to the
// operand dtype, the first value (high nibble) in the low half, as bnb's dequantize_4bit rounds them
__device__ __forceinline__ u32 wpair(const Decoder& dec, u32 w, int j, float sc) {
    float first, second;
    dec.values(w, j, first, second);
    first = __fmul_rn(first, sc);
    second = __fmul_rn(second, sc);
    u32 r;
#if NF4T_ACT == 0
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(second), "f"(first));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(second), "f"(first));
#endif
    return r;
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
    const u32 row_first = blockIdx.x * warps * NF4T_RPW;
    const u32 row0 = row_first + warp * NF4T_RPW;
    const u32 m0 = blockIdx.z * NF4T_MTILE;
    const u32 mrows = min((u32)NF4T_MTILE, M - m0);
    const u32 k_begin = blockIdx.y * kper;
    const u32 k_end = min(K, k_begin + kper);

#if NF4T_ASTAGE == 1
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
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) c[rt][nt][i] = 0.0f;

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
#if NF4T_ASTAGE == 1
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
        const u32 rows = min(warps * NF4T_RPW, N - row_first);
        finish_split(blockIdx.z * gridDim.x + blockIdx.x, row_first, rows, m0, mrows, N, bias, out, ws, counters,
                     gridDim.y);
    }
}
#else
// ================================================================ tensor cores, K over the warps (NF4T_MMA 2)
// A CTA owns NF4T_RPW rows of W (m16 tiles) and MTILE rows of A; its warps split the CTA's K
// slice window by window (warp w takes windows w, w + WARPS, ...), so a warp's 16-row tiles are
// few and its loads are many: every load of a group of NF4T_UNROLL windows is issued before any is
// used (NF4T_PREFETCH 1: the next group is issued before the current one is computed). The warps'
// sums meet in shared memory and are added in warp order (deterministic).
//   Orientation: W rows are the mma's M (16), the batch its N (8): a batch of 1..8 wastes at most
//   7/8 of an n8 tile, not 15/16 of an m16 one.
//   Window: a quad of lanes (t = 0..3) covers 4 runs of 2*LOAD values; lane (g, t) holds rows g
//   and g+8 of its run of W (one load each) and row g of the batch for the same run, so K is
//   permuted identically on both operands and both are loaded as they lie.
//   Decode: NF4T_LUT 2 looks each packed byte up as a pair of 16-bit operands, (code[hi],
//   code[lo]) rounded to the operand dtype, in a 256-entry table replicated per lane (32 KiB,
//   [byte][lane], so a warp's 32 lookups hit 32 banks): one shift, one mask and one load per two
//   values. NF4T_LUT 0 / 1 build the pair from two code lookups and one conversion.
//   Scale: applied once per window and block (NF4T_SCALE 1 only): the mma sums code * a over the
//   window, one multiply by the block's scale per accumulator follows. Where a window spans
//   several blocks (blocksize < window), one mma per block takes the B operand masked to the
//   lanes whose run lies in that block. The weight is thus code rounded to the operand dtype
//   times the fp32 scale (bnb's dequantize rounds code * scale instead; both are one rounding of
//   the operand dtype away from the float32 weight).
//   NF4T_PERSIST 1: the grid is a few CTAs per SM and a CTA loops over row tiles, so the tables
//   are filled once per CTA, not once per tile.
#define NF4T_NT (NF4T_MTILE / 8)
#define NF4T_RT (NF4T_RPW / 16)
#define NF4T_RUN (2 * NF4T_LOAD)             // values of K per lane per row per window
#define NF4T_WIN (4 * NF4T_RUN)              // K per window
#define NF4T_NBMAX (NF4T_WIN / 32)           // blocks a window can span (blocksize 32)
#define NF4T_U NF4T_UNROLL
#if NF4T_STATS == 1 && NF4T_FEED == 1
#error "the tile's scale table (NF4T_STATS 1) is not a structure of the bulk feed (it copies the statistics itself)"
#endif



struct KsGroup {                                   // the loads of one group of NF4T_U windows
    u32 w[NF4T_U][NF4T_RT][2][NF4T_WWORDS];        // rows g, g+8 of each row tile
    ScaleRaw raw[NF4T_U][NF4T_RT][2];
#if NF4T_STATS == 1
    u32 j[NF4T_U];                                 // the block column of each window's run (K / blocksize)
#endif
    u32 a[NF4T_U][NF4T_NT][NF4T_LOAD];             // the batch row g of each n8 tile, 16-bit pairs
};

#if NF4T_STATS == 1
// the block column of each window's run in the group (past the slice: the last one, a finite scale
// that meets zeros)
__device__ __forceinline__ void ks_columns(KsGroup& G, u32 log2_bs, u32 k_end, u32 t, u32 kw, u32 kstep) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) G.j[u] = min(kw + u * kstep + t * NF4T_RUN, k_end - 1u) >> log2_bs;
}
#endif

// the batch rows' runs of A for a group (16-bit pairs; rows past the batch and K past the slice are 0)
__device__ __forceinline__ void ks_load_a(u32 (&a)[NF4T_U][NF4T_NT][NF4T_LOAD], const act_t* __restrict__ A,
                                          u32 K, u32 k_end, u32 m0, u32 mrows, u32 g, u32 t, u32 kw, u32 kstep) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
        const u32 k = kw + u * kstep + t * NF4T_RUN;
        const bool in_k = k < k_end;
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt) {
            const u32 m = nt * 8 + g;
#pragma unroll
            for (int i = 0; i < NF4T_LOAD; i += 4) {
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
#if NF4T_STATS == 0
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
#if NF4T_STATS == 1
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
#define NF4T_SLOT_W (NF4T_U * NF4T_RT * 2 * 32 * NF4T_LOAD)    // W of one group of one warp
#if NF4T_STATS == 1
#define NF4T_SLOT NF4T_SLOT_W                                      // the scales are in the tile's table
#else
#define NF4T_SLOT (NF4T_SLOT_W + NF4T_U * NF4T_RT * 2 * 32 * 8)  // ... and its statistics
#endif

// NF4T_WLOAD 1 (stream): the copies of W carry an L2 evict-first policy (W is read once; A and the
// statistics stay); 16-byte copies bypass L1 (.cg) either way.
__device__ __forceinline__ u64 w_policy() {
    u64 pol = 0;
#if NF4T_WLOAD == 1
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}

__device__ __forceinline__ void cp_async_w(u32 dst, const u8* src, bool valid, u64 pol) {
    const u32 n = valid ? (u32)NF4T_LOAD : 0u;                  // 0: the slot is zero-filled, nothing read
#if NF4T_LOAD == 16 && NF4T_WLOAD == 1
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src), "r"(n),
                 "l"(pol) : "memory");
#elif NF4T_LOAD == 16
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
#elif NF4T_WLOAD == 1
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], %2, %3, %4;" ::"r"(dst), "l"(src),
                 "n"(NF4T_LOAD), "r"(n), "l"(pol) : "memory");
#else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(NF4T_LOAD), "r"(n)
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
                cp_async_w(slot + i * NF4T_LOAD, valid ? B + (((u64)n * K + k) >> 1) : B, valid, pol);
#if NF4T_STATS == 0
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
#if NF4T_STATS == 1
    ks_columns(G, s.log2_bs, k_end, t, kw, kstep);
#endif
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u)
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 i = ((u * NF4T_RT + rt) * 2 + h) * 32 + lane;
                const u32 src = slot + i * NF4T_LOAD;
#if NF4T_LOAD == 16
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(G.w[u][rt][h][0]), "=r"(G.w[u][rt][h][1]), "=r"(G.w[u][rt][h][2]),
                               "=r"(G.w[u][rt][h][3])
                             : "r"(src) : "memory");
#elif NF4T_LOAD == 8
                asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(G.w[u][rt][h][0]), "=r"(G.w[u][rt][h][1])
                             : "r"(src) : "memory");
#else
                asm volatile("ld.shared.u32 %0, [%1];" : "=r"(G.w[u][rt][h][0]) : "r"(src) : "memory");
#endif
#if NF4T_STATS == 0
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

__device__ __forceinline__ float ks_scale(const Scales& s, ScaleRaw r) {
    if (s.absmax_f != nullptr) return r.a;
    return __fadd_rn(__fmul_rn(nf4t_code2[r.q], r.a), s.offset);
}

#if NF4T_STATS == 1
// ---- the tile's scale table (NF4T_STATS 1): tab[j][r] = the scale of block column jb0 + j of the tile's row r
// (rows past N: a finite stand-in, they meet zero W). Row r fastest, so a warp's stores hit distinct banks;
// a thread issues the loads of NF4T_SFILL entries before it decodes any (one memory latency per pass).
#define NF4T_SROW (NF4T_RPW + 1)      // floats per table row, padded: lanes (g, t) of a window never conflict
#define NF4T_SFILL 8
__device__ __forceinline__ void ks_fill_scales(float* tab, const Scales& s, u32 row0, u32 N, u32 K, u32 jb0, u32 nj) {
    const u32 kb = K >> s.log2_bs, total = nj * NF4T_RPW, step = work_threads();
    for (u32 i0 = threadIdx.x; i0 < total; i0 += NF4T_SFILL * step) {
        ScaleRaw raw[NF4T_SFILL];
#pragma unroll
        for (int p = 0; p < NF4T_SFILL; ++p) {
            const u32 i = i0 + p * step, n = row0 + i % NF4T_RPW;
            raw[p].q = 0u;
            raw[p].a = 0.0f;
            if (i < total && n < N) raw[p] = scale_load_block(s, n * kb + jb0 + i / NF4T_RPW);
        }
#pragma unroll
        for (int p = 0; p < NF4T_SFILL; ++p) {
            const u32 i = i0 + p * step;
            if (i < total) tab[(i / NF4T_RPW) * NF4T_SROW + i % NF4T_RPW] = ks_scale(s, raw[p]);
        }
    }
}
#endif

__device__ __forceinline__ void tc_zero(float (&c)[NF4T_RT][NF4T_NT][4]) {
#pragma unroll
    for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) c[rt][nt][i] = 0.0f;
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
                                              const u32 (&a)[NF4T_NT][NF4T_LOAD], u32 lane4,
                                              float (&cp)[NF4T_RT][NF4T_NT][4]) {
#pragma unroll
    for (int st = 0; st < NF4T_LOAD / 2; ++st) tc_step_mma(w, a, st, 2 * st, lane4, cp);
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

// stab (NF4T_STATS 1): the tile's scale table, offset to block column 0 and to the lane's row g
__device__ __forceinline__ void ks_compute(const KsGroup& G, float (&acc)[NF4T_RT][NF4T_NT][4], const Scales& s,
                                           u32 nb, u32 sub, u32 lane, u32 lane4, const float* stab) {
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
        float sc[NF4T_RT][2];
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt) {
#if NF4T_STATS == 1
            sc[rt][0] = stab[G.j[u] * NF4T_SROW + rt * 16];
            sc[rt][1] = stab[G.j[u] * NF4T_SROW + rt * 16 + 8];
#else
            sc[rt][0] = ks_scale(s, G.raw[u][rt][0]);
            sc[rt][1] = ks_scale(s, G.raw[u][rt][1]);
#endif
        }
        if (NF4T_NBMAX == 1 || nb == 1) {
            float cp[NF4T_RT][NF4T_NT][4];
            tc_zero(cp);
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
            for (int st = 0; st < NF4T_LOAD / 2; ++st) {
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
                red[(warp * NF4T_MTILE + ml) * NF4T_RPW + nl] = acc[rt][nt][i];
            }
    work_sync();
    for (u32 idx = threadIdx.x; idx < NF4T_RPW * NF4T_MTILE; idx += work_threads()) {
        const u32 ml = idx / NF4T_RPW, nl = idx % NF4T_RPW, n = row0 + nl;
        if (n < N && ml < mrows) {
            float v = 0.0f;
            for (u32 w = 0; w < warps; ++w) v += red[(w * NF4T_MTILE + ml) * NF4T_RPW + nl];
            emit(v, m0 + ml, n, N, bias, out, ws);
        }
    }
    if (ws != nullptr)
        finish_split(blockIdx.z * tiles + tile, row0, min((u32)NF4T_RPW, N - row0), m0, mrows, N, bias, out, ws,
                     counters, gridDim.y);
    else
        work_sync();      // red is written again by the next tile
}

#if NF4T_MMA == 3
// ---- tensor cores, warps owning row tiles (NF4T_MMA 3, "mma-rows"). W rows are the mma's M and the
// batch its N, as in mma-ks, with the same window (a quad's four runs of 2*LOAD values; lane (g, t):
// rows g and g+8 of each m16 tile, batch row g, run t) and the same decode (16-bit code pairs). What
// changes is who does what:
//   - a CTA owns WARPS x NF4T_RPW rows and a K slice, and warp w owns rows w*RPW .. +RPW over the
//     whole slice: no warp's sums meet another's, so there is no reduction in shared memory and no
//     barrier after the start (mma-ks splits a tile's K over its warps and reduces at every tile);
//   - the CTA stages its batch rows of A for the slice in shared memory once, in the operand order
//     (tc_a_slot): A leaves L2 once per CTA of up to 512 rows, not once per 16 or 32 rows, and a
//     lane's run of a window is LOAD/4 16-byte shared loads without bank conflicts;
//   - a group's statistics are loaded once per row and window, not once per lane: lane (g, t) loads
//     the block of window t % U for rows g, g+8 of each tile, finishes those scales, and the quad
//     passes them round by shuffles. A window lies in one block (the plan asks 8*LOAD <= blocksize),
//     so a window's sums take one multiply by its scale.
// A group of NF4T_U windows is loaded at once (NF4T_PREFETCH 1: the next group before the current one
// is computed). Warps whose rows are all < N load without bounds and with the statistics' kind fixed
// at compile time, but for a slice's last, partial group.
//   NF4T_SPAN > 1 (a window over SPAN blocks: 16-byte loads at blocksize 64): the mma's n8 columns are
// (batch row, part) pairs, column c = batch row c / SPAN, part c % SPAN, and lane (g, t) feeds its run of
// A only into the column of its own part (g % SPAN == t*SPAN/4; zeros elsewhere). So one mma per window
// still gives each part's sums apart, in the columns a lane already holds (2t, 2t+1); each is scaled by
// its part's block, and the parts of a batch row are added once, at the end. At M = 1 the columns are
// free (7 of 8 held padding). The statistics: SPAN blocks per window, U*SPAN per group, shared out over
// the quad as before.
#define NF4T_GK (NF4T_U * NF4T_WIN)     // K per group
#define NF4T_CH (NF4T_LOAD / 4)         // 16-byte chunks (8 values) of A in a lane's run
#define NF4T_AREGS (NF4T_ACHUNK ? 4 : NF4T_LOAD)   // registers of A a batch tile holds
#define NF4T_CPR (8 / NF4T_SPAN)        // batch rows per n8 tile
#define NF4T_PART (NF4T_WIN / NF4T_SPAN)  // K per part of a window (in one block)
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
    return (j / NF4T_SPAN) * NF4T_WIN + (j % NF4T_SPAN) * NF4T_PART;
}

// A's stage: byte offset of the 16-byte chunk holding slice offset kk (a multiple of 8) in a batch row.
// Chunk c of run t of window v lies at ((v*CH + c)*4 + t)*16, so a quad's four runs of a chunk are 64
// contiguous bytes; batch rows lie tc_a_pitch apart (64 mod 128), so a quarter warp's two quads hit
// all 32 banks. tuner/families/matmul.py sizes the stage with the same pitch.
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
        tc_zero(cp);
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
    tc_zero(acc);
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
        if (row0 + NF4T_RPW > N)
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
// the largest c with c*T/P <= u (tuner/families/matmul.py: stream_k_runs computes the same; the plan
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
    const u32 row0 = row_first + warp * NF4T_RPW;
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
#elif NF4T_MAXNREG > 0
// NF4T_MAXNREG: the registers a thread may take, capped so that more warps fit an SM (see the header)
extern "C" __global__ void __maxnreg__(NF4T_MAXNREG) nf4t_matmul(NF4T_MATMUL_PARAMS) {
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
    const u32 row_first = blockIdx.x * warps * NF4T_RPW;
    const u32 row0 = row_first + warp * NF4T_RPW;
    const u32 k_begin = blockIdx.y * kper;
    const u32 k_end = min(K, k_begin + kper);

    // the first group's W and statistics are loaded before the tables are filled and A is staged
    RowsGroup G;
    if (row0 < N && k_begin < k_end) rows_load(G, B, s, row0, N, K, k_end, g, t, k_begin);
    setup_tables();
    if (code2 != nullptr)
        for (u32 i = threadIdx.x; i < 256; i += blockDim.x) nf4t_code2[i] = __ldg(code2 + i);
    unsigned char* a_st = nf4t_dyn + NF4T_DYN_TABLE;
    const u32 pitch = tc_a_pitch(kper);
    rows_stage_a(A, a_st, pitch, m0, mrows, K, k_begin, k_end);
    __syncthreads();
    rows_slice(G, B, s, absmax_f, bias, out, ws, a_st, pitch, row0, m0, mrows, N, K, k_begin, k_end, g, t, lane, lane4);
    if (ws != nullptr) {
        const u32 rows = min(warps * NF4T_RPW, N - row_first);
        finish_split(blockIdx.z * gridDim.x + blockIdx.x, row_first, rows, m0, mrows, N, bias, out, ws, counters,
                     gridDim.y);
    }
#else
    // stream-K: this CTA's run of units, a slice of one row tile at a time (kper: the longest slice, so A's
    // stage holds any). A tile's slice is written to y if it is the whole K, else added to the workspace and
    // the last of the tile's CTAs finishes it.
    const u32 tiles = (N + warps * NF4T_RPW - 1) / (warps * NF4T_RPW);
    const u32 gpt = (K + NF4T_GK - 1) / NF4T_GK;                       // groups per row tile
    const u32 units = tiles * gpt, ctas = gridDim.x;                     // units <= N*K / 512 < 2^22
    u32 u = (u32)((u64)blockIdx.x * units / ctas);
    const u32 u_end = (u32)((u64)(blockIdx.x + 1u) * units / ctas);
    for (bool first = true; u < u_end; first = false) {
        const u32 tile = u / gpt, g0 = u % gpt, g1 = min(gpt, g0 + (u_end - u));
        const u32 row_first = tile * warps * NF4T_RPW;
        const bool whole = g0 == 0 && g1 == gpt;
        rows_segment(A, B, s, code2, absmax_f, bias, out, whole ? nullptr : ws, N, K, kper, m0, mrows, row_first,
                     g0 * NF4T_GK, min(K, g1 * NF4T_GK), first);
        if (!whole) {
            const u32 rows = min(warps * NF4T_RPW, N - row_first);
            const u32 parts = stream_k_cta((tile + 1u) * gpt - 1u, units, ctas) - stream_k_cta(tile * gpt, units, ctas) + 1u;
            finish_split(blockIdx.z * tiles + tile, row_first, rows, m0, mrows, N, bias, out, ws, counters, parts);
        }
        u += g1 - g0;
    }
#endif
}
#elif NF4T_FEED == 1
// ---- the bulk feed (NF4T_FEED 1): a producer warp (the CTA's last) fills a ring of NF4T_STAGES
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
// NF4T_WLOAD 1 (stream): W carries an L2 evict-first policy (read once; A and the statistics stay)
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar, bool evict_first) {
#if NF4T_WLOAD == 1
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

// The geometry of a stage (bytes; tuner/families/matmul.py computes the same to size the ring):
// W rows at rowb, then the batch rows of A at arowb, then each W row's statistics at sb.
struct BulkGeometry {
    u32 kc, rowb, arowb, sb, arows, stage;
};
__device__ __forceinline__ BulkGeometry bulk_geometry(u32 warps, u32 M) {
    BulkGeometry G;
    G.kc = NF4T_U * warps * NF4T_WIN;
    G.rowb = (((G.kc >> 1) + 127u) & ~127u) + 4u * NF4T_LOAD;
    G.arowb = ((G.kc * 2u + 127u) & ~127u) + 16u;
    const u32 nested = 4u * (((G.kc >> 5) + 3u) / 4u + 1u) + 8u, plain = G.kc >> 3;
    G.sb = ((nested > plain ? nested : plain) + 15u) & ~15u;
    G.arows = min((u32)NF4T_MTILE, M);
    G.stage = NF4T_RPW * (G.rowb + G.sb) + G.arows * G.arowb;
    return G;
}

// one chunk (rows row0.., K kc0..kc0+len) into the stage at w: W and A by bulk copies, the statistics
// by cp.async; every lane then arrives on the stage's full barrier
__device__ __forceinline__ void bulk_produce(u32 w, const BulkGeometry& G, u32 full, const act_t* __restrict__ A,
                                             const u8* __restrict__ B, const Scales& s, u32 nblocks, u32 row0,
                                             u32 rows, u32 m0, u32 mrows, u32 K, u32 kc0, u32 len, u32 lane) {
    const u32 a_st = w + NF4T_RPW * G.rowb, s_st = a_st + G.arows * G.arowb;
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
    const u32 a_st = w + NF4T_RPW * G.rowb, s_st = a_st + G.arows * G.arowb;
#pragma unroll
    for (int u = 0; u < NF4T_U; ++u) {
        const u32 off = (u * warps + warp) * NF4T_WIN + t * NF4T_RUN;       // the lane's run in the chunk
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 r = rt * 16 + g + 8 * h;
                const u32 src = w + r * G.rowb + (off >> 1);
#if NF4T_LOAD == 16
                asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(Gr.w[u][rt][h][0]), "=r"(Gr.w[u][rt][h][1]), "=r"(Gr.w[u][rt][h][2]),
                               "=r"(Gr.w[u][rt][h][3]) : "r"(src) : "memory");
#elif NF4T_LOAD == 8
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
            for (int i = 0; i < NF4T_LOAD; i += 4)
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
    const u32 tiles = (N + NF4T_RPW - 1) / NF4T_RPW;
    const u32 tstep = NF4T_PERSIST ? gridDim.x : tiles;
    const BulkGeometry G = bulk_geometry(warps, M);
    float* red = reinterpret_cast<float*>(nf4t_dyn + NF4T_DYN_TABLE);   // [warps][MTILE][RPW]
    const u32 ring = (u32)__cvta_generic_to_shared(nf4t_dyn + NF4T_DYN_TABLE + warps * NF4T_MTILE * NF4T_RPW * 4);
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
        const u32 a_st = ring + st * G.stage + NF4T_RPW * G.rowb;
        for (u32 i = threadIdx.x * 16u; i < G.stage - NF4T_RPW * G.rowb; i += blockDim.x * 16u)
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(a_st + i), "r"(0u) : "memory");
    }
    for (u32 i = threadIdx.x * 16u; i < G.kc * (u32)sizeof(act_t); i += blockDim.x * 16u)
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(zero + i), "r"(0u) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    setup_tables();
    if (code2 != nullptr)
        for (u32 i = threadIdx.x; i < 256; i += blockDim.x) nf4t_code2[i] = __ldg(code2 + i);
    __syncthreads();

    if (warp == warps) {
        // the producer: every (tile, chunk) in the consumers' order
        const u32 nblocks = (N * K) >> log2_bs;
        u32 it = 0;
        for (u32 tile = blockIdx.x; tile < tiles; tile += tstep) {
            const u32 row0 = tile * NF4T_RPW, rows = min((u32)NF4T_RPW, N - row0);
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
        const u32 row0 = tile * NF4T_RPW;
        float acc[NF4T_RT][NF4T_NT][4];
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[rt][nt][i] = 0.0f;
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
#else
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
    const u32 tiles = (N + NF4T_RPW - 1) / NF4T_RPW;
    float* red = reinterpret_cast<float*>(nf4t_dyn + NF4T_DYN_TABLE);   // [warps][MTILE][RPW]
#if NF4T_STAGES > 0
    // this warp's ring: NF4T_STAGES slots after the reduction buffer
    const u32 ring_base = (u32)__cvta_generic_to_shared(nf4t_dyn + NF4T_DYN_TABLE + warps * NF4T_MTILE * NF4T_RPW * 4) +
                          warp * NF4T_STAGES * NF4T_SLOT;
    const u64 pol = w_policy();
    const u32 nblocks = (N * K) >> log2_bs;
#endif
#if NF4T_STATS == 1
    // the scale table after the partial sums (and the warps' rings): the slice's block columns jb0 .. jb0 + nj - 1
#if NF4T_STAGES > 0
    float* tab = red + warps * NF4T_MTILE * NF4T_RPW + warps * NF4T_STAGES * NF4T_SLOT / 4;
#else
    float* tab = red + warps * NF4T_MTILE * NF4T_RPW;
#endif
    const u32 jb0 = k_begin >> log2_bs, nj = ((k_end - 1u) >> log2_bs) - jb0 + 1u;
    const float* stab = tab - jb0 * NF4T_SROW + g;
#else
    const float* stab = nullptr;
#endif

    u32 tile = blockIdx.x;
#if NF4T_STAGES == 0
    KsGroup G;
    u32 kw = k_begin + warp * NF4T_WIN;
#if NF4T_PREFETCH == 1
    if (kw < k_end) ks_load(G, A, B, s, tile * NF4T_RPW, N, K, k_end, m0, mrows, g, t, kw, kstep);
#endif
#endif
    setup_tables();
    if (code2 != nullptr)
        for (u32 i = threadIdx.x; i < 256; i += blockDim.x) nf4t_code2[i] = __ldg(code2 + i);
    __syncthreads();

    for (; tile < tiles; tile += (NF4T_PERSIST ? gridDim.x : tiles)) {
        const u32 row0 = tile * NF4T_RPW;
        float acc[NF4T_RT][NF4T_NT][4];
#pragma unroll
        for (int rt = 0; rt < NF4T_RT; ++rt)
#pragma unroll
            for (int nt = 0; nt < NF4T_NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[rt][nt][i] = 0.0f;
#if NF4T_STATS == 1
        ks_fill_scales(tab, s, row0, N, K, jb0, nj);
        work_sync();
#endif

#if NF4T_STAGES > 0
        {
            const u32 kw0 = k_begin + warp * NF4T_WIN;
            const u32 ngroups = kw0 < k_end ? (k_end - kw0 + gstep - 1) / gstep : 0u;
            u32 a_next[NF4T_U][NF4T_NT][NF4T_LOAD];
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
                                for (int q = 0; q < NF4T_LOAD; ++q) G.a[u][nt][q] = a_next[u][nt][q];
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
                ks_load(Gn, A, B, s, next_tile * NF4T_RPW, N, K, k_end, m0, mrows, g, t,
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
#endif   // NF4T_FEED
#endif
