// nf4-tune: the 16-entry 4-bit code of bitsandbytes, shared by every kernel family.
//
// NF4T_V0 .. NF4T_V15 are the float32 code values of the 4-bit indices 0..15 (as bnb's CUDA source
// writes them), NF4T_VALUES the 16 of them in order, and lut_select(q) the value of index q by a
// 4-level select tree (no memory: each bit of q picks between two halves).
//
//   NF4T_QUANT   NF4T_QUANT_NF4: the NF4 code (normal-float quantiles, -1.0 .. 1.0);
//                NF4T_QUANT_FP4: bnb's FP4 code, bit 3 the sign: lut[v & 7] * (v & 8 ? -1 : 1), so
//                code 0b1000 is -0.0, as on bnb's CUDA path.

#if NF4T_QUANT == NF4T_QUANT_NF4
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
// bnb CUDA: fp4_dequantization_lut[v & 7] * (v & 8 ? -1 : 1); code 0b1000 is -0.0.
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
#define NF4T_VALUES NF4T_V0, NF4T_V1, NF4T_V2, NF4T_V3, NF4T_V4, NF4T_V5, NF4T_V6, NF4T_V7, \
    NF4T_V8, NF4T_V9, NF4T_V10, NF4T_V11, NF4T_V12, NF4T_V13, NF4T_V14, NF4T_V15

// the code value of index q (0..15) by a select tree on its bits: no memory, no branch
__device__ __forceinline__ float lut_select(unsigned int q) {
    const bool b0 = q & 1, b1 = q & 2, b2 = q & 4, b3 = q & 8;
    const float a0 = b0 ? NF4T_V1 : NF4T_V0,   a1 = b0 ? NF4T_V3 : NF4T_V2;
    const float a2 = b0 ? NF4T_V5 : NF4T_V4,   a3 = b0 ? NF4T_V7 : NF4T_V6;
    const float a4 = b0 ? NF4T_V9 : NF4T_V8,   a5 = b0 ? NF4T_V11 : NF4T_V10;
    const float a6 = b0 ? NF4T_V13 : NF4T_V12, a7 = b0 ? NF4T_V15 : NF4T_V14;
    const float c0 = b1 ? a1 : a0, c1 = b1 ? a3 : a2, c2 = b1 ? a5 : a4, c3 = b1 ? a7 : a6;
    const float d0 = b2 ? c1 : c0, d1 = b2 ? c3 : c2;
    return b3 ? d1 : d0;
}
