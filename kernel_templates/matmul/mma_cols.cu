// nf4-tune matmul, structure MMA-COLS (NF4T_MMA_MMA_COLS): tensor cores with the mma's n8 columns carrying
// the quantization blocks, so a block's statistics are applied once per (row, block) and, at M = 1, no
// column of the tensor-core tile is padding. Joined after codes.cuh and matmul/common.cuh (its types,
// conversions, pack_pair, load_w16, Scales, mma16816, emit, finish_split and NF4T_MATMUL_PARAMS).
// Gated on an H100 (2026-12-07); serves 4096x14336 at M = 8 there (docs/kernels.md has the screens).
//
// ---- The operands (mma.sync m16n8k16, bf16/fp16, fp32 accumulators). Lane (g, t) = (lane >> 2, lane & 3).
// W's rows are the mma's M (a warp owns COLS_RT tiles of 16 rows over the CTA's K slice), the batch its N.
// K is cut in PARTS of NF4T_PART values (the plan asks blocksize == NF4T_PART: a part is one block), and the
// 8 columns of an n8 tile are (part, batch row) pairs: column c = part c / MB, batch row c % MB (MB =
// NF4T_COLS_MB). A WINDOW is the COLS_NP = 8 / MB parts whose sums lie side by side in the columns; the K
// positions of a k-step are permuted (the same way on both operands) so that pair p (mma k-rows 2p, 2p+1;
// p = t for a0/a1, p = t + 4 for a2/a3) belongs to part part(p), and column g of the activations' operand
// holds A only where part(p) is column g's part, zeros elsewhere (predicated shared loads into registers that
// stay zero in the other lanes). One mma adds every part's products into its own column; after a window each
// accumulator is multiplied by the scale of its (row, part) once: 4 FFMA a window per n8 tile, never a
// multiply per weight, no shuffle moving a scale.
//   MB = 1 (M = 1): part(p) = p, 8 parts a window. Lane (g, t) reads two contiguous runs of PART/2 bytes per
//     row (part t and part t + 4; rows g and g + 8): a0/a1 = byte s of the first run, a2/a3 = byte s of the
//     second at k-step s. Its 4 accumulators are rows g, g+8 x parts 2t, 2t+1: each of the 128 (row, part)
//     scales of a 16-row tile is finished by exactly one lane.
//   MB = 2, 4, 8: part(p) = p % COLS_NP: a lane's a0 and a2 are bytes 2s and 2s+1 of one contiguous run of
//     PART/MB bytes per row (part t % COLS_NP, the (t / COLS_NP)-th slice of it); its columns 2t, 2t+1 are one
//     part (2t / MB) and batch rows (2t) % MB, (2t+1) % MB.
// A is staged once per CTA in shared memory in the operand order (cols_a_slot): MB 1 stages each word of A
// as a (b0, b1) register pair with the other half zero (parts 0-3 of a window (word, 0), parts 4-7 (0, word)),
// so one predicated 16-byte load gives two k-steps' operand pairs as the mma takes them (b0, b1 must be an
// aligned register pair: two streams would cost two moves a k-step); MB > 1 stages A as it lies.
// ---- The decode: lut pairx's 256 16-bit code pairs in 256-byte rows, a lane's copy at lane << 2 (a lookup's
// shared address is one PRMT of the packed word and the lane's offset, then one LDS). The free upper half of
// every row holds code2[row] (nested statistics) for the 32 lanes, so a scale's code lookup is one PRMT of the
// absmax byte(s) and one LDS too, without bank conflicts.
// ---- Per window and lane at MB = 1, PART = 64, one row tile, the prefetch (128 bytes of W a lane per 16-row
// tile and window), the steady-state loop of the full-warp nested-statistics path in the SASS (sm_90, NVRTC
// 13.5, counted on the CPU, 2026-12-07): 128 PRMT + 128 LDS (decode), 32 HMMA, 8 LDG.128 (W), 16 predicated
// LDS.128 (A), 2 LDG.U16 + 2 LDG (statistics of 4 blocks), 4 x (PRMT, LDS, FMUL, FADD, FFMA) (scales), the
// cursors and loop control: about 361 warp-instructions for 4 KiB of W, 11.3 bytes of W per warp-instruction
// (nf4tune.kernel.sass.bytes_per_instruction; the served M = 1 mma-rows loop: 8.2).
//
// Knobs (besides common.cuh's):
//   NF4T_COLS_MB        1, 2, 4, 8: batch rows per n8 tile (8 / MB parts a window).
//   NF4T_MTILE          batch rows per CTA, MB x COLS_NT (COLS_NT n8 tiles, 1..8).
//   NF4T_ROWS_PER_WARP  16 or 32: m16 tiles per warp (COLS_RT).
//   NF4T_PART           32, 64, 128: values per part (= the blocksize the plan serves).
//   NF4T_PREFETCH       0: a window is loaded, then computed; 1: two window register sets used in turn, the
//                       next window's W and statistics issued before the current one is computed (no set is
//                       ever copied into another).
//   NF4T_WLOAD          NF4T_WLOAD_STREAM: W by ld.global.nc.L1::no_allocate; NF4T_WLOAD_PLAIN: plain loads.
//   NF4T_TABLE64        1: the pair table at the first 64 KiB-aligned shared address of the dynamic shared
//                       memory, so the PRMT that puts the byte in bits 8-15 and the lane's offset in bits 0-7
//                       also copies the table's upper address bits from the lane register: its result IS the
//                       LDS address, whatever ptxas does with a base (an earlier version of this kernel got one
//                       IMAD.IADD per byte where the base was added: 8.3 against 11.3 bytes of W per
//                       warp-instruction). Takes 128 KiB of dynamic shared memory (A's stage below the table
//                       when it fits there, else above): one CTA an SM.
//                       0: the table at the start of the dynamic shared memory, A's stage after it (64 KiB +
//                       the stage: more CTAs an SM). NVRTC 13.5 (sm_90, 2026-12-07) folded the base into the
//                       LDS ([R+UR]) in every variant counted: within 1% of table64 1's count.
//   NF4T_LUT            NF4T_LUT_PAIRX only; NF4T_LOAD_BYTES is not read (the runs follow PART and MB).
// Full warps with nested statistics, blocksize == PART and (MB 1) K a multiple of 2 x PART run a cursor path
// (per row a W pointer, an absmax-byte pointer, one 16-bit load giving blocks 2t and 2t+1 at MB 1, a block
// index for the group absmax; immediate offsets inside a window); everything else (rows past N, the slice's
// last partial window, plain statistics) takes a bounds-checked path with the same operand layout.
// Launch: block = warps x 32, grid = (ceil(N / (warps x 16 x COLS_RT)), K splits, ceil(M / MTILE)), K per
// split a multiple of the window (tuner/families/matmul/resources.py: cols_window, cols_stage_bytes,
// cols_smem). Split-K as the family's (finish_split).

#if NF4T_DTYPE == NF4T_DTYPE_FP32
#error "mma-cols: 16-bit activations only (the family refuses fp32)"
#endif
#if NF4T_COLS_MB != 1 && NF4T_COLS_MB != 2 && NF4T_COLS_MB != 4 && NF4T_COLS_MB != 8
#error "NF4T_COLS_MB is 1, 2, 4 or 8"
#endif
#if NF4T_PART != 32 && NF4T_PART != 64 && NF4T_PART != 128
#error "NF4T_PART is 32, 64 or 128"
#endif
#if NF4T_MTILE % NF4T_COLS_MB != 0 || NF4T_MTILE / NF4T_COLS_MB > 8
#error "NF4T_MTILE is 1 to 8 n8 tiles of NF4T_COLS_MB batch rows"
#endif

#define COLS_MB NF4T_COLS_MB
#define COLS_NT (NF4T_MTILE / NF4T_COLS_MB)           // n8 tiles (batch rows MB x NT)
#define COLS_RT (NF4T_ROWS_PER_WARP / 16)             // m16 tiles per warp
#define COLS_NP (8 / COLS_MB)                         // parts per window
#define COLS_WIN (COLS_NP * NF4T_PART)                // K per window
#define COLS_STEPS (NF4T_PART / (2 * COLS_MB))        // mma k-steps per window
#define COLS_WB (NF4T_PART / COLS_MB)                 // bytes of W a lane takes per row per window
#define COLS_WW (COLS_WB / 4)                         // ... in words
#define COLS_NRUN (COLS_MB == 1 ? 2 : 1)              // contiguous runs per row
#define COLS_RUNB (COLS_WB / COLS_NRUN)               // bytes per run
#define COLS_RUNW (COLS_RUNB / 4)
#define COLS_SCS (COLS_MB == 1 ? 2 : 1)               // parts (scales) a lane finishes per row per window
#define COLS_ACH 2                                    // k-steps per 16-byte load of A (b0, b1, b0', b1')
// A's stage, bytes per part: MB 1 (b0, b1) pairs (4 bytes a value), MB > 1 as A lies; 16 bytes of padding
#define COLS_PSTR ((COLS_MB == 1 ? 4 : 2) * NF4T_PART + 16)
#define COLS_TABLE (256 * 256)                        // the pair table's bytes

#if COLS_STEPS % COLS_ACH != 0
#error "a window's k-steps must be a whole number of A chunks"
#endif

// ---------------------------------------------------------------- the table
// Row r (256 bytes): words 0..31 the 16-bit pair (code[r >> 4], code[r & 15]) for each lane, words 32..63
// code2[r] (the nested statistics' code) for each lane (zeros when the statistics are plain).
__device__ __forceinline__ void cols_setup_table(unsigned char* table, const float* __restrict__ code2) {
    for (u32 i = threadIdx.x; i < 256 * 16; i += blockDim.x) {
        const u32 e = i >> 4, q = i & 15u;
        uint4 v;
        if (q < 8u) {
            const u32 p = pack_pair(lut_select(e >> 4), lut_select(e & 15u));
            v = make_uint4(p, p, p, p);
        } else {
            const u32 c = code2 != nullptr ? __float_as_uint(__ldg(code2 + e)) : 0u;
            v = make_uint4(c, c, c, c);
        }
        *reinterpret_cast<uint4*>(table + e * 256u + q * 16u) = v;
    }
}

#if NF4T_TABLE64
// bytes 0, 2, 3 from the lane register (its offset and the table's upper address bits), byte 1 the packed byte
#define COLS_SEL 0x7604u
__device__ __forceinline__ u32 cols_table_at(u32 addr) {
    u32 v;
    asm("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}
#else
// byte 0 the lane's offset, byte 1 the packed byte, bytes 2-3 zero (common.cuh's row_offset)
#define COLS_SEL 0x5504u
__device__ __forceinline__ u32 cols_table_at(u32 off) { return *reinterpret_cast<const u32*>(nf4t_dyn + off); }
#endif
__device__ __forceinline__ u32 cols_prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
// the 16-bit code pair of byte j (0..3) of w: byte << 8 | lane << 2 (one PRMT), one LDS
__device__ __forceinline__ u32 cols_pair(u32 w, int j, u32 lane_off) {
    return cols_table_at(cols_prmt(w, lane_off, COLS_SEL | ((u32)j << 4)));
}
// code2[byte j of q] from the table's upper halves (lane_hi = 128 | lane << 2)
__device__ __forceinline__ float cols_code2(u32 q, int j, u32 lane_hi) {
    return __uint_as_float(cols_table_at(cols_prmt(q, lane_hi, COLS_SEL | ((u32)j << 4))));
}

// ---------------------------------------------------------------- loads
template <int NB>
__device__ __forceinline__ void cols_load_run(const u8* p, u32* w) {   // NB bytes (4..64) at p into w
    if (NB >= 16) {
#pragma unroll
        for (int i = 0; i < NB / 16; ++i) {
            const uint4 v = load_w16(p + 16 * i);
            w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
        }
    } else if (NB == 8) {
#if NF4T_WLOAD == NF4T_WLOAD_STREAM
        asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
#else
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        w[0] = v.x; w[1] = v.y;
#endif
    } else {
#if NF4T_WLOAD == NF4T_WLOAD_STREAM
        asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
#else
        w[0] = *reinterpret_cast<const u32*>(p);
#endif
    }
}

// a 16-byte chunk of A's stage into v where the lane feeds this column; elsewhere v keeps its zeros
__device__ __forceinline__ void cols_lds128_if(u32 (&v)[4], u32 in, u32 addr) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %4, 0;\n\t@p ld.shared.v4.u32 {%0, %1, %2, %3}, [%5];\n\t}"
                 : "+r"(v[0]), "+r"(v[1]), "+r"(v[2]), "+r"(v[3]) : "r"(in), "r"(addr));
}

// ---------------------------------------------------------------- the lane's geometry
struct ColsLane {
    u32 g, t, lane_off, lane_hi;
    u32 run_off;       // byte offset of the lane's first run in a window's row
    u32 part0;         // the first part whose scale the lane finishes (rows g, g + 8)
};

__device__ __forceinline__ ColsLane cols_lane(u32 table_hi) {
    ColsLane L;
    const u32 lane = threadIdx.x & 31u;
    L.g = lane >> 2;
    L.t = lane & 3u;
    L.lane_off = table_hi | (lane << 2);      // TABLE64: the table's upper address bits; else 0
    L.lane_hi = table_hi | 128u | (lane << 2);
    asm volatile("" : "+r"(L.lane_off), "+r"(L.lane_hi));   // kept in registers, not recomputed from %tid
#if COLS_MB == 1
    L.run_off = L.t * (NF4T_PART / 2);
    L.part0 = 2u * L.t;
#else
    L.run_off = (L.t % COLS_NP) * (NF4T_PART / 2) + (L.t / COLS_NP) * COLS_WB;
    L.part0 = (2u * L.t) / COLS_MB;
#endif
    return L;
}

// A window's loads for the warp's rows: W and the raw statistics
struct ColsWin {
    u32 w[COLS_RT][2][COLS_WW];      // rows g, g + 8 of each tile
    u32 q[COLS_RT][2][COLS_SCS];     // absmax bytes (cursor path, MB 1: both parts' bytes in q[..][0]); 0 plain
    float a[COLS_RT][2][COLS_SCS];   // the group absmax (nested) or the absmax (plain)
};

// The cursor path (full warps, whole windows, nested statistics, blocksize == PART, MB 1: K a multiple of
// 2 PART): the lane's rows walk W by pointers, their statistics by block (n*K + k < 2^31)
struct ColsCursor {
    const u8* w[COLS_RT][2];      // the lane's first run of the row at the next window
    const u8* q[COLS_RT][2];      // absmax_q + the block of the lane's first part at the next window
    u32 b[COLS_RT][2];            // ... its block index (for the group absmax)
};

__device__ __forceinline__ void cols_load_fast(ColsWin& W, ColsCursor& c, const Scales& s) {
#pragma unroll
    for (int rt = 0; rt < COLS_RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            cols_load_run<COLS_RUNB>(c.w[rt][h], W.w[rt][h]);
            if (COLS_NRUN == 2) cols_load_run<COLS_RUNB>(c.w[rt][h] + 2 * NF4T_PART, W.w[rt][h] + COLS_RUNW);
#if COLS_MB == 1
            // blocks b (even) and b + 1: one 16-bit load, one group
            W.q[rt][h][0] = __ldg(reinterpret_cast<const unsigned short*>(c.q[rt][h]));
#else
            W.q[rt][h][0] = __ldg(c.q[rt][h]);
#endif
            W.a[rt][h][0] = __ldg(s.absmax2 + (c.b[rt][h] >> s.log2_g));
            c.w[rt][h] += COLS_WIN / 2;
            c.q[rt][h] += COLS_NP;           // blocksize == PART: NP blocks a window
            c.b[rt][h] += COLS_NP;
        }
}

// Any warp, any window (bounds checked: zeros past N or the slice's end), any statistics
__device__ __forceinline__ void cols_load_checked(ColsWin& W, const u8* __restrict__ B, const Scales& s,
                                                  const ColsLane& L, u32 row0, u32 N, u32 K, u32 kw, u32 k_end) {
#pragma unroll
    for (int rt = 0; rt < COLS_RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 n = row0 + rt * 16 + L.g + 8 * h;
#pragma unroll
            for (int r = 0; r < COLS_NRUN; ++r) {
                const u32 off = L.run_off + r * 2 * NF4T_PART;          // bytes into the window's row
                const u32 k = kw + 2 * off;                              // the run's first value (its part lies
                if (n < N && k < k_end) {                                //   wholly in or out of the slice)
                    cols_load_run<COLS_RUNB>(B + (((u64)n * K + k) >> 1), W.w[rt][h] + r * COLS_RUNW);
                } else {
#pragma unroll
                    for (int i = 0; i < COLS_RUNW; ++i) W.w[rt][h][r * COLS_RUNW + i] = 0u;
                }
            }
#pragma unroll
            for (int j = 0; j < COLS_SCS; ++j) {
                const u32 k = kw + (L.part0 + j) * NF4T_PART;
                W.q[rt][h][j] = 0u;
                W.a[rt][h][j] = 0.0f;
                if (n < N && k < k_end) {
                    const u32 b = (n * K + k) >> s.log2_bs;
                    if (s.absmax_f != nullptr) {
                        W.a[rt][h][j] = __ldg(s.absmax_f + b);
                    } else {
                        W.q[rt][h][j] = __ldg(s.absmax_q + b);
                        W.a[rt][h][j] = __ldg(s.absmax2 + (b >> s.log2_g));
                    }
                }
            }
        }
}

// the scales sc[rt][h][j] of the lane's (row, part) pairs: bnb's recipe, __fmul_rn then __fadd_rn
template <bool kFast>
__device__ __forceinline__ void cols_scales(const ColsWin& W, const Scales& s, const ColsLane& L,
                                            float (&sc)[COLS_RT][2][COLS_SCS]) {
#pragma unroll
    for (int rt = 0; rt < COLS_RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < COLS_SCS; ++j) {
                if (kFast) {
                    const float c = cols_code2(W.q[rt][h][0], j, L.lane_hi);
                    sc[rt][h][j] = __fadd_rn(__fmul_rn(c, W.a[rt][h][0]), s.offset);
                } else if (s.absmax_f != nullptr) {
                    sc[rt][h][j] = W.a[rt][h][j];
                } else {
                    const float c = cols_code2(W.q[rt][h][j], 0, L.lane_hi);
                    sc[rt][h][j] = __fadd_rn(__fmul_rn(c, W.a[rt][h][j]), s.offset);
                }
            }
}

// One window on the tensor cores, its sums scaled into acc. a_lane: the shared address of the lane's first A
// chunk of this window (MB 1: part t where g == t, part t + 4 where g == t + 4); the n8 tiles' chunks lie
// nt_stride apart; in[nt]: the lane feeds its column of n8 tile nt (elsewhere av keeps zeros).
template <bool kFast>
__device__ __forceinline__ void cols_compute(const ColsWin& W, float (&acc)[COLS_RT][COLS_NT][4], const Scales& s,
                                             const ColsLane& L, u32 a_lane, u32 nt_stride, const u32 (&in)[COLS_NT],
                                             u32 (&av)[COLS_NT][4]) {
    float d[COLS_RT][COLS_NT][4];
    zero_frags(d);
#pragma unroll
    for (int c = 0; c < COLS_STEPS / COLS_ACH; ++c) {
#pragma unroll
        for (int nt = 0; nt < COLS_NT; ++nt) cols_lds128_if(av[nt], in[nt], a_lane + nt * nt_stride + 16 * c);
#pragma unroll
        for (int jj = 0; jj < COLS_ACH; ++jj) {
            const int st = c * COLS_ACH + jj;
#pragma unroll
            for (int rt = 0; rt < COLS_RT; ++rt) {
#if COLS_MB == 1
                // byte st of run 0 (a0: row g, a1: row g + 8) and of run 1 (a2, a3)
                const int wi = st >> 2, bj = st & 3;
                const u32 a0 = cols_pair(W.w[rt][0][wi], bj, L.lane_off);
                const u32 a1 = cols_pair(W.w[rt][1][wi], bj, L.lane_off);
                const u32 a2 = cols_pair(W.w[rt][0][COLS_RUNW + wi], bj, L.lane_off);
                const u32 a3 = cols_pair(W.w[rt][1][COLS_RUNW + wi], bj, L.lane_off);
#else
                // bytes 2 st (a0, a1) and 2 st + 1 (a2, a3) of the run
                const int wi = (2 * st) >> 2, bj = (2 * st) & 3;
                const u32 a0 = cols_pair(W.w[rt][0][wi], bj, L.lane_off);
                const u32 a1 = cols_pair(W.w[rt][1][wi], bj, L.lane_off);
                const u32 a2 = cols_pair(W.w[rt][0][wi], bj + 1, L.lane_off);
                const u32 a3 = cols_pair(W.w[rt][1][wi], bj + 1, L.lane_off);
#endif
#pragma unroll
                for (int nt = 0; nt < COLS_NT; ++nt)
                    mma16816(d[rt][nt], a0, a1, a2, a3, av[nt][2 * jj], av[nt][2 * jj + 1]);
            }
        }
    }
    float sc[COLS_RT][2][COLS_SCS];
    cols_scales<kFast>(W, s, L, sc);
#pragma unroll
    for (int rt = 0; rt < COLS_RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < COLS_NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                acc[rt][nt][i] = fmaf(sc[rt][i >> 1][COLS_MB == 1 ? (i & 1) : 0], d[rt][nt][i], acc[rt][nt][i]);
}

// A's stage: byte offset of slice value kk (a multiple of 8) in a batch row (MB 1: of its first (b0, b1) pair)
__device__ __forceinline__ u32 cols_a_slot(u32 kk) {
    return (kk / NF4T_PART) * COLS_PSTR + (kk % NF4T_PART) * (COLS_MB == 1 ? 4u : 2u);
}
// bytes per staged batch row (a multiple of 128, plus 16: rows start in different banks; resources.py's
// cols_pitch computes the same)
__device__ __forceinline__ u32 cols_a_pitch(u32 kper) {
    return (((kper / NF4T_PART) * COLS_PSTR + 127u) & ~127u) + 16u;
}

// The cursor of the warp's rows at kw (kFast) and the first window's loads into X
template <bool kFast>
__device__ __forceinline__ void cols_start(ColsWin& X, ColsCursor& cur, const u8* __restrict__ B, const Scales& s,
                                           const ColsLane& L, u32 row0, u32 N, u32 K, u32 kw, u32 k_end) {
    if (kFast) {
#pragma unroll
        for (int rt = 0; rt < COLS_RT; ++rt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const u32 e = (row0 + rt * 16 + L.g + 8 * h) * K + kw;
                cur.w[rt][h] = B + (e >> 1) + L.run_off;
                cur.b[rt][h] = (e + L.part0 * NF4T_PART) >> s.log2_bs;
                cur.q[rt][h] = s.absmax_q + cur.b[rt][h];
            }
        cols_load_fast(X, cur, s);
    } else {
        cols_load_checked(X, B, s, L, row0, N, K, kw, k_end);
    }
}

// The warp's windows over [kw, k_end), X holding the first one's loads (cols_start); kFast: the cursor path
// (the windows must be whole)
template <bool kFast>
__device__ __forceinline__ void cols_run(ColsWin& X, ColsCursor& cur, float (&acc)[COLS_RT][COLS_NT][4],
                                         const u8* __restrict__ B, const Scales& s, const ColsLane& L, u32 row0,
                                         u32 N, u32 K, u32 kw, u32 k_end, u32 a_lane, u32 nt_stride,
                                         const u32 (&in)[COLS_NT]) {
    if (kw >= k_end) return;
    u32 av[COLS_NT][4];
#pragma unroll
    for (int nt = 0; nt < COLS_NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) av[nt][i] = 0u;
    const u32 astep = COLS_NP * COLS_PSTR;
#if NF4T_PREFETCH
    // two register sets used in turn, so no set is copied into another; X holds window kw
    ColsWin Y;
    while (kw + 2 * COLS_WIN < k_end) {
        if (kFast) cols_load_fast(Y, cur, s); else cols_load_checked(Y, B, s, L, row0, N, K, kw + COLS_WIN, k_end);
        cols_compute<kFast>(X, acc, s, L, a_lane, nt_stride, in, av);
        if (kFast) cols_load_fast(X, cur, s); else cols_load_checked(X, B, s, L, row0, N, K, kw + 2 * COLS_WIN, k_end);
        cols_compute<kFast>(Y, acc, s, L, a_lane + astep, nt_stride, in, av);
        kw += 2 * COLS_WIN;
        a_lane += 2 * astep;
    }
    if (kw + COLS_WIN < k_end) {
        if (kFast) cols_load_fast(Y, cur, s); else cols_load_checked(Y, B, s, L, row0, N, K, kw + COLS_WIN, k_end);
        cols_compute<kFast>(X, acc, s, L, a_lane, nt_stride, in, av);
        cols_compute<kFast>(Y, acc, s, L, a_lane + astep, nt_stride, in, av);
    } else {
        cols_compute<kFast>(X, acc, s, L, a_lane, nt_stride, in, av);
    }
#else
    for (;;) {
        cols_compute<kFast>(X, acc, s, L, a_lane, nt_stride, in, av);
        kw += COLS_WIN;
        a_lane += astep;
        if (kw >= k_end) break;
        if (kFast) cols_load_fast(X, cur, s); else cols_load_checked(X, B, s, L, row0, N, K, kw, k_end);
    }
#endif
}

extern "C" __global__ void nf4t_matmul(NF4T_MATMUL_PARAMS) {
    const Scales s = make_scales(absmax_q, code2, absmax2, absmax_f, offset_ptr, log2_bs, log2_g);

    const u32 warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const u32 k_begin = blockIdx.y * kper, k_end = min(K, k_begin + kper);
    const u32 m0 = blockIdx.z * NF4T_MTILE;
    const u32 mrows = min((u32)NF4T_MTILE, M - m0);
    // the table (64 KiB) and A's stage in the dynamic shared memory
    const u32 dyn_base = (u32)__cvta_generic_to_shared(nf4t_dyn);
    u32 dyn_size;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_size));
    const u32 pitch = cols_a_pitch(kper);
    const u32 stage_bytes = mrows * pitch;
#if NF4T_TABLE64
    // the table at the first 64 KiB-aligned shared address; A's stage below it if it fits there, else above
    const u32 tbl_off = (0u - dyn_base) & 0xffffu;
    unsigned char* table = nf4t_dyn + tbl_off;
    unsigned char* a_st = stage_bytes <= tbl_off ? nf4t_dyn : table + COLS_TABLE;
    const u32 table_hi = (dyn_base + tbl_off) & 0xffff0000u;
#else
    unsigned char* table = nf4t_dyn;
    unsigned char* a_st = nf4t_dyn + COLS_TABLE;
    const u32 table_hi = 0u;
#endif
    if ((u32)(table - nf4t_dyn) + COLS_TABLE > dyn_size || (u32)(a_st - nf4t_dyn) + stage_bytes > dyn_size) __trap();
    ColsLane L = cols_lane(table_hi);
    const u32 row_first = blockIdx.x * warps * (COLS_RT * 16);
    const u32 row0 = row_first + warp * (COLS_RT * 16);

    // the first window's W and statistics are loaded before the table is filled and A is staged
    const bool active = row0 < N && k_begin < k_end;
    u32 k_whole = k_begin + (k_end - k_begin) / COLS_WIN * COLS_WIN;
    asm volatile("" : "+r"(k_whole));
    const bool fast = active && k_whole > k_begin && row0 + COLS_RT * 16 <= N && absmax_f == nullptr &&
                      (1u << log2_bs) == NF4T_PART && (COLS_MB != 1 || K % (2 * NF4T_PART) == 0);
    ColsWin X;
    ColsCursor cur;
    if (fast) cols_start<true>(X, cur, B, s, L, row0, N, K, k_begin, k_end);
    else if (active) cols_start<false>(X, cur, B, s, L, row0, N, K, k_begin, k_end);

    cols_setup_table(table, code2);
    pdl_wait();                                           // A and y from here on
    // A's stage: the CTA's batch rows x its K slice in whole windows (zeros past the slice)
    if (k_begin < k_end) {
        const u32 len = k_end - k_begin;
        const u32 chunks = (len + COLS_WIN - 1) / COLS_WIN * COLS_WIN / 8u;
        for (u32 i = threadIdx.x; i < mrows * chunks; i += blockDim.x) {
            const u32 m = i / chunks, kk = (i % chunks) * 8u;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (kk < len) v = *reinterpret_cast<const uint4*>(A + (u64)(m0 + m) * K + k_begin + kk);
            unsigned char* dst = a_st + m * pitch + cols_a_slot(kk);
#if COLS_MB == 1
            if ((kk / NF4T_PART) % 8u < 4u) {      // (word, 0) pairs
                *reinterpret_cast<uint4*>(dst) = make_uint4(v.x, 0u, v.y, 0u);
                *reinterpret_cast<uint4*>(dst + 16) = make_uint4(v.z, 0u, v.w, 0u);
            } else {                                // (0, word) pairs
                *reinterpret_cast<uint4*>(dst) = make_uint4(0u, v.x, 0u, v.y);
                *reinterpret_cast<uint4*>(dst + 16) = make_uint4(0u, v.z, 0u, v.w);
            }
#else
            *reinterpret_cast<uint4*>(dst) = v;
#endif
        }
    }
    __syncthreads();
    // every table address is built from lane_off / lane_hi: laundered here, after the barrier, so that no lookup
    // (a plain asm with register inputs only) can be hoisted above the barrier that publishes the table
    asm volatile("" : "+r"(L.lane_off), "+r"(L.lane_hi) :: "memory");

    // which columns this lane feeds: MB 1: b0 (part t) where g == t, b1 (part t + 4) where g == t + 4, batch row
    // nt; MB > 1: both where column g's part g / MB is the lane's part t % NP, batch row nt * MB + g % MB
    u32 in[COLS_NT];
    const u32 st_base = (u32)__cvta_generic_to_shared(a_st);
    u32 a_lane, nt_stride;
#if COLS_MB == 1
#pragma unroll
    for (int nt = 0; nt < COLS_NT; ++nt) in[nt] = (L.g == L.t || L.g == L.t + 4u) && (u32)nt < mrows;
    a_lane = st_base + L.g * COLS_PSTR;          // part g: t where g == t, t + 4 where g == t + 4
    nt_stride = pitch;
#else
#pragma unroll
    for (int nt = 0; nt < COLS_NT; ++nt)
        in[nt] = L.g / COLS_MB == L.t % COLS_NP && nt * COLS_MB + L.g % COLS_MB < mrows;
    a_lane = st_base + (L.g % COLS_MB) * pitch + (L.t % COLS_NP) * COLS_PSTR +
             (L.t / COLS_NP) * (4u * NF4T_PART / COLS_MB);
    nt_stride = COLS_MB * pitch;
#endif
#pragma unroll
    for (int nt = 0; nt < COLS_NT; ++nt) asm volatile("" : "+r"(in[nt]));   // kept, not recomputed in the loop

    float acc[COLS_RT][COLS_NT][4];
    zero_frags(acc);

    if (fast) {
        cols_run<true>(X, cur, acc, B, s, L, row0, N, K, k_begin, k_whole, a_lane, nt_stride, in);
        if (k_whole < k_end) {
            const u32 adv = (k_whole - k_begin) / COLS_WIN * (COLS_NP * COLS_PSTR);
            cols_start<false>(X, cur, B, s, L, row0, N, K, k_whole, k_end);
            cols_run<false>(X, cur, acc, B, s, L, row0, N, K, k_whole, k_end, a_lane + adv, nt_stride, in);
        }
    } else if (active) {
        cols_run<false>(X, cur, acc, B, s, L, row0, N, K, k_begin, k_end, a_lane, nt_stride, in);
    }

    // the parts of a (row, batch row) lie in the quad's columns: add them up, then one lane writes
#pragma unroll
    for (int rt = 0; rt < COLS_RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < COLS_NT; ++nt) {
            float v[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] = acc[rt][nt][i];
#if COLS_MB == 1
            v[0] += v[1];
            v[2] += v[3];
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
            v[2] += __shfl_xor_sync(0xffffffffu, v[2], 1);
            v[0] += __shfl_xor_sync(0xffffffffu, v[0], 2);
            v[2] += __shfl_xor_sync(0xffffffffu, v[2], 2);
            const bool writer = L.t == 0;
            const u32 mb0 = 0, mb1 = 0;
#elif COLS_MB == 2
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                v[i] += __shfl_xor_sync(0xffffffffu, v[i], 1);
                v[i] += __shfl_xor_sync(0xffffffffu, v[i], 2);
            }
            const bool writer = L.t == 0;
            const u32 mb0 = 0, mb1 = 1;
#elif COLS_MB == 4
#pragma unroll
            for (int i = 0; i < 4; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], 2);
            const bool writer = L.t < 2;
            const u32 mb0 = 2 * L.t, mb1 = 2 * L.t + 1;
#else
            const bool writer = true;
            const u32 mb0 = 2 * L.t, mb1 = 2 * L.t + 1;
#endif
            if (writer && row0 < N) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    if (COLS_MB == 1 && (i & 1)) continue;
                    const u32 n = row0 + rt * 16 + L.g + (i >= 2 ? 8 : 0);
                    const u32 ml = nt * COLS_MB + ((i & 1) ? mb1 : mb0);
                    if (n < N && ml < mrows) emit(v[i], m0 + ml, n, N, bias, out, ws);
                }
            }
        }
    if (ws != nullptr && row_first < N) {
        const u32 rows = min(warps * (COLS_RT * 16), N - row_first);
        finish_split(blockIdx.z * gridDim.x + blockIdx.x, row_first, rows, m0, mrows, N, bias, out, ws, counters,
                     gridDim.y);
    }
}
