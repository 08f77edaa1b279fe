/* Matmuls on GGUF block-quantized weights, float32 activations, CPU: y[r, o] = x[r, :] . W[o, :]
 * (+ bias[o]) with W kept in its blocks (ggml's layouts, byte for byte), never expanded in memory.
 *
 * Two ways to form the dot products, both reading each weight row once per call:
 *   - act_q8 = 0: float32 products of the dequantized weights (exact up to accumulation order;
 *     every format). Packed Q4_0/Q4_1/Q8_0 expand weights in registers for a few rows (AVX-512:
 *     a nibble's value is one permute of its block's 16-value table), and into an L1-resident
 *     tile for the small GEMM beyond; on AVX-512 and on AVX2 both sum a row in the same order,
 *     so a row's bits do not depend on the rows beside it. Other formats expand each weight row
 *     into a float buffer on the stack, and sum it in the small GEMM's order too.
 *   - act_q8 = 1: as llama.cpp does, activations are first quantized to 8 bits per block of 32
 *     (one float scale per block, round to nearest), and blocks are multiplied in integers
 *     (AVX2 maddubs, or AVX-512 VNNI dpbusd), one float multiply-add per block. Q4_0, Q4_1, Q8_0.
 *   - the tiled layout (float activations, AMX-BF16): the float products again, on the tile unit,
 *     from activations split into three exact bf16 parts (see "float activations on AMX tiles").
 * Work is split over output rows on the spinning pool of spin_pool.h (torch's thread count) when
 * there is enough of it; dequantizing whole weights (prefill) uses OpenMP.
 *
 * Formats (ggml type ids): Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 (blocks of 32), Q4_K = 12, Q5_K = 13,
 * Q6_K = 14 (super-blocks of 256). fp16 scales are converted with F16C where the compiler may use
 * it, else bit by bit.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "quant_common.h"
#include "spin_pool.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define QM_AVX2 1
#endif
#if defined(QM_AVX2) && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
#define QM_VNNI 1
#endif
/* The AVX-512 float paths (16-wide expansion, the few-row register tile), which also sum a row
 * alike whatever the rows beside it. */
#if defined(QM_AVX2) && defined(__F16C__) && defined(__AVX512F__)
#define QM_AVX512 1
#endif

/* Longest weight row the float-activation path expands on the stack (floats). */
#define MAX_ROW 16384

static inline float fp16_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            exp = 1;
            while (!(mant & 0x400)) {
                mant <<= 1;
                exp--;
            }
            mant &= 0x3ff;
            bits = sign | ((exp + 112) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000 | (mant << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

static inline uint16_t read_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Elements per block and bytes per block; 0 for an unknown format. */
int64_t quant_block_elements(int fmt) {
    switch (fmt) {
    case Q4_0: case Q4_1: case Q8_0: return 32;
    case Q4_K: case Q5_K: case Q6_K: return 256;
    default: return 0;
    }
}

int64_t quant_block_bytes(int fmt) {
    switch (fmt) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
    }
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block (ggml's packing). */
static inline void k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One block (of quant_block_elements(fmt) values) to floats. */
static void dequant_block(int fmt, const uint8_t *b, float *out) {
    switch (fmt) {
    case Q4_0: {
        const float d = fp16_to_float(read_u16(b));
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            out[j] = (float)((qs[j] & 0xf) - 8) * d;
            out[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
        break;
    }
    case Q4_1: {
        const float d = fp16_to_float(read_u16(b)), m = fp16_to_float(read_u16(b + 2));
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            out[j] = (float)(qs[j] & 0xf) * d + m;
            out[j + 16] = (float)(qs[j] >> 4) * d + m;
        }
        break;
    }
    case Q8_0: {
        const float d = fp16_to_float(read_u16(b));
        const int8_t *qs = (const int8_t *)(b + 2);
        for (int j = 0; j < 32; j++) out[j] = (float)qs[j] * d;
        break;
    }
    case Q4_K: case Q5_K: {
        const float d = fp16_to_float(read_u16(b)), dmin = fp16_to_float(read_u16(b + 2));
        const uint8_t *scales = b + 4;
        const uint8_t *qh = fmt == Q5_K ? b + 16 : NULL;
        const uint8_t *qs = fmt == Q5_K ? b + 48 : b + 16;
        for (int pair = 0; pair < 4; pair++) { /* 64 values: 32 low nibbles, then 32 high */
            uint8_t sc0, m0, sc1, m1;
            k_scale_min(2 * pair, scales, &sc0, &m0);
            k_scale_min(2 * pair + 1, scales, &sc1, &m1);
            const float d0 = d * sc0, d1 = d * sc1, n0 = dmin * m0, n1 = dmin * m1;
            const uint8_t *q = qs + 32 * pair;
            float *o = out + 64 * pair;
            for (int l = 0; l < 32; l++) {
                int lo = q[l] & 0xf, hi = q[l] >> 4;
                if (qh) {
                    lo += ((qh[l] >> (2 * pair)) & 1) << 4;
                    hi += ((qh[l] >> (2 * pair + 1)) & 1) << 4;
                }
                o[l] = d0 * (float)lo - n0;
                o[l + 32] = d1 * (float)hi - n1;
            }
        }
        break;
    }
    case Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = fp16_to_float(read_u16(b + 208));
        for (int half = 0; half < 2; half++) { /* 128 values each */
            const uint8_t *l8 = ql + 64 * half, *h8 = qh + 32 * half;
            const int8_t *s = sc + 8 * half;
            float *o = out + 128 * half;
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = (int)((l8[l] & 0xf) | (((h8[l] >> 0) & 3) << 4)) - 32;
                const int q2 = (int)((l8[l + 32] & 0xf) | (((h8[l] >> 2) & 3) << 4)) - 32;
                const int q3 = (int)((l8[l] >> 4) | (((h8[l] >> 4) & 3) << 4)) - 32;
                const int q4 = (int)((l8[l + 32] >> 4) | (((h8[l] >> 6) & 3) << 4)) - 32;
                o[l] = d * s[is] * q1;
                o[l + 32] = d * s[is + 2] * q2;
                o[l + 64] = d * s[is + 4] * q3;
                o[l + 96] = d * s[is + 6] * q4;
            }
        }
        break;
    }
    default:
        break;
    }
}

/* ---------------------------------------------------------- the packed layout (Q4_0, Q4_1, Q8_0)
 *
 * The same blocks, rearranged per row so that the 8-bit kernel reads them with wide loads: the
 * fp16 scales of the row's nb blocks first, as an array padded with zeros to a multiple of 8
 * (nb8) so that 8 convert at once (Q4_1: then its minimums, likewise), then the quants. Q8_0's
 * are the blocks' 32 bytes in order; Q4's come in pairs of blocks, 32 bytes per pair whose low
 * nibbles are block 2p's elements 0..31 and high nibbles block 2p+1's (an odd last block pairs
 * with zeros), so one 256-bit load and two masks give two blocks. Values are bit for bit those
 * of the GGUF blocks. */

void quant_dequant_block(int fmt, const uint8_t *b, float *out) { dequant_block(fmt, b, out); }

static inline int64_t pad8(int64_t nb) { return (nb + 7) & ~(int64_t)7; }

int64_t quant_packed_row_bytes(int fmt, int64_t in) {
    const int64_t nb = in / 32, nb8 = pad8(nb);
    switch (fmt) {
    case Q4_0: return 2 * nb8 + 32 * ((nb + 1) / 2);
    case Q4_1: return 4 * nb8 + 32 * ((nb + 1) / 2);
    case Q8_0: return 2 * nb8 + 32 * nb;
    default: return 0;
    }
}

/* GGUF rows (src, src_row_bytes apart) -> packed rows (dst, quant_packed_row_bytes apart). */
int quant_repack(int fmt, const uint8_t *src, int64_t src_row_bytes, int64_t rows, int64_t in,
                 uint8_t *dst) {
    const int64_t prb = quant_packed_row_bytes(fmt, in), bb = quant_block_bytes(fmt);
    if (prb == 0 || in % 32 || src_row_bytes != in / 32 * bb) return -1;
    const int64_t nb = in / 32, nb8 = pad8(nb);
#pragma omp parallel for schedule(static) if (rows * in >= 4 * PARALLEL_MIN_MACS)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *s = src + r * src_row_bytes;
        uint8_t *d = dst + r * prb;
        memset(d, 0, (size_t)prb);
        uint8_t *scales = d, *mins = d + 2 * nb8;
        uint8_t *qs = d + (fmt == Q4_1 ? 4 : 2) * nb8;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = s + b * bb;
            memcpy(scales + 2 * b, blk, 2);
            if (fmt == Q8_0) {
                memcpy(qs + 32 * b, blk + 2, 32);
                continue;
            }
            if (fmt == Q4_1) memcpy(mins + 2 * b, blk + 2, 2);
            const uint8_t *q = blk + (fmt == Q4_1 ? 4 : 2);
            uint8_t *pair = qs + 32 * (b / 2);
            const int shift = (b % 2) * 4;
            for (int j = 0; j < 16; j++) {
                pair[j] |= (uint8_t)((q[j] & 0xf) << shift);
                pair[j + 16] |= (uint8_t)((q[j] >> 4) << shift);
            }
        }
    }
    return 0;
}

static __attribute__((unused)) void dequant_packed_row(int fmt, const uint8_t *row, float *out,
                                                       int64_t in) {
    const int64_t nb = in / 32, nb8 = pad8(nb);
    const uint8_t *scales = row, *mins = row + 2 * nb8;
    const uint8_t *qs = row + (fmt == Q4_1 ? 4 : 2) * nb8;
    for (int64_t b = 0; b < nb; b++) {
        const float d = fp16_to_float(read_u16(scales + 2 * b));
        float *o = out + 32 * b;
        if (fmt == Q8_0) {
            const int8_t *q = (const int8_t *)(qs + 32 * b);
            for (int j = 0; j < 32; j++) o[j] = (float)q[j] * d;
            continue;
        }
        const uint8_t *pair = qs + 32 * (b / 2);
        const int shift = (b % 2) * 4;
        if (fmt == Q4_1) {
            const float m = fp16_to_float(read_u16(mins + 2 * b));
            for (int j = 0; j < 32; j++) o[j] = (float)((pair[j] >> shift) & 0xf) * d + m;
        } else {
            for (int j = 0; j < 32; j++) o[j] = (float)(((pair[j] >> shift) & 0xf) - 8) * d;
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* The values of 8 quants (the low 8 bytes of q): Q8_0 q * d; Q4_1 q * d + m, Q4_0 (q - 8) * d
 * (nibbles, one per byte). The one expression of a weight's value on the 8-wide paths, so the
 * small GEMM's expansion and the few-row tile round alike (GCC 12 contracts q * d + m into one
 * FMA: it does so in both). */
static inline __attribute__((always_inline)) __m256 q8_values(__m128i q, __m256 d) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
}

static inline __attribute__((always_inline)) __m256 q4_values(const int fmt, __m128i q, __m256 d, __m256 m) {
    const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
    return fmt == Q4_1 ? _mm256_add_ps(_mm256_mul_ps(v, d), m) : _mm256_mul_ps(_mm256_sub_ps(v, _mm256_set1_ps(8.0f)), d);
}

/* dequant_packed_row with 8-wide conversions (q4_values, q8_values), for the batch GEMM and
 * prefill that expand whole weights. */
static __attribute__((unused)) void dequant_packed_row_avx2(int fmt, const uint8_t *row, float *out,
                                                            int64_t in) {
    const int64_t nb = in / 32, nb8 = pad8(nb);
    const uint8_t *scales = row, *mins = row + 2 * nb8;
    const uint8_t *qs = row + (fmt == Q4_1 ? 4 : 2) * nb8;
    for (int64_t b = 0; b < nb; b++) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(read_u16(scales + 2 * b)));
        float *o = out + 32 * b;
        if (fmt == Q8_0) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * b));
            const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
            const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (int i = 0; i < 4; i++) _mm256_storeu_ps(o + 8 * i, q8_values(parts[i], d));
            continue;
        }
        const __m256i pair = _mm256_loadu_si256((const __m256i *)(qs + 32 * (b / 2)));
        const __m256i nib = _mm256_and_si256(b % 2 ? _mm256_srli_epi16(pair, 4) : pair, _mm256_set1_epi8(0xf));
        const __m128i lo = _mm256_castsi256_si128(nib), hi = _mm256_extracti128_si256(nib, 1);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        const __m256 m = _mm256_set1_ps(fmt == Q4_1 ? _cvtsh_ss(read_u16(mins + 2 * b)) : 0.0f);
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(o + 8 * i, q4_values(fmt, parts[i], d, m));
    }
}
#endif

#if defined(QM_AVX512)
/* The 16 values a Q4 block's nibbles stand for (q = 0..15), rounded as dequant_packed_row_avx2
 * rounds them: a nibble's value is then one permute (vpermps reads the low 4 bits of its index). */
static inline __m512 pz_q4_table(const int fmt, float d, float m) {
    const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 dv = _mm512_set1_ps(d);
    if (fmt == Q4_1) return _mm512_add_ps(_mm512_mul_ps(q, dv), _mm512_set1_ps(m));
    return _mm512_mul_ps(_mm512_sub_ps(q, _mm512_set1_ps(8.0f)), dv);
}

/* dequant_packed_row_avx2 16 values at a time, the same values: a Q4 nibble is a permute of its
 * block's table (which the small GEMM spent a sixth of a 32-row decode step expanding at 8). */
static void dequant_packed_row_avx512(int fmt, const uint8_t *row, float *out, int64_t in) {
    const int64_t nb = in / 32, nb8 = pad8(nb);
    const uint8_t *scales = row, *mins = row + 2 * nb8;
    const uint8_t *qs = row + (fmt == Q4_1 ? 4 : 2) * nb8;
    for (int64_t b = 0; b < nb; b += fmt == Q8_0 ? 1 : 2) {
        const float d0 = _cvtsh_ss(read_u16(scales + 2 * b));
        float *o = out + 32 * b;
        if (fmt == Q8_0) {
            const __m512 d = _mm512_set1_ps(d0);
            for (int i = 0; i < 2; i++) {
                const __m128i q = _mm_loadu_si128((const __m128i *)(qs + 32 * b + 16 * i));
                _mm512_storeu_ps(o + 16 * i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d));
            }
            continue;
        }
        const uint8_t *pair = qs + 16 * b; /* 32 bytes per pair of blocks */
        const __m512i z0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)pair));
        const __m512i z1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(pair + 16)));
        const __m512 t0 = pz_q4_table(fmt, d0, fmt == Q4_1 ? _cvtsh_ss(read_u16(mins + 2 * b)) : 0.0f);
        _mm512_storeu_ps(o, _mm512_permutexvar_ps(z0, t0));
        _mm512_storeu_ps(o + 16, _mm512_permutexvar_ps(z1, t0));
        if (b + 1 < nb) {
            const __m512 t1 = pz_q4_table(fmt, _cvtsh_ss(read_u16(scales + 2 * (b + 1))),
                                          fmt == Q4_1 ? _cvtsh_ss(read_u16(mins + 2 * (b + 1))) : 0.0f);
            _mm512_storeu_ps(o + 32, _mm512_permutexvar_ps(_mm512_srli_epi32(z0, 4), t1));
            _mm512_storeu_ps(o + 48, _mm512_permutexvar_ps(_mm512_srli_epi32(z1, 4), t1));
        }
    }
}
#endif

static void dequant_row(int fmt, int packed, const uint8_t *row, float *out, int64_t n) {
    if (packed) {
#if defined(QM_AVX512)
        dequant_packed_row_avx512(fmt, row, out, n);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
        dequant_packed_row_avx2(fmt, row, out, n);
#else
        dequant_packed_row(fmt, row, out, n);
#endif
        return;
    }
    const int64_t be = quant_block_elements(fmt), bb = quant_block_bytes(fmt);
    for (int64_t b = 0; b < n / be; b++) dequant_block(fmt, row + b * bb, out + b * be);
}

/* The row bytes of `in` values in fmt's GGUF (packed = 0), packed (1), interleaved (2) or tiled
 * (3) layout (the last two GGUF's bytes); 0 if it has none. */
static int64_t row_bytes_of(int fmt, int packed, int64_t in) {
    const int64_t be = quant_block_elements(fmt);
    if (be == 0 || in % be || packed < 0 || packed > 3) return 0;
    if (packed >= 2 && fmt != Q4_0 && fmt != Q4_1 && fmt != Q8_0) return 0;
    return packed == 1 ? quant_packed_row_bytes(fmt, in) : in / be * quant_block_bytes(fmt);
}

static void dequant_il_row(int fmt, const uint8_t *w, int64_t in, int64_t r, float *out);

/* out[i, :] = dequantized row ids[i] of w ([rows, row_bytes]); ids are checked by the caller
 * (an embedding lookup) or are 0..n-1 (a whole weight). Returns -1 for a format, layout or
 * row size it does not know. */
int quant_dequantize_rows(int fmt, int packed, const uint8_t *w, int64_t row_bytes, int64_t in,
                          const int64_t *ids, int64_t n, float *out, int64_t stride_out) {
    if (row_bytes_of(fmt, packed, in) == 0 || row_bytes != row_bytes_of(fmt, packed, in)) return -1;
#pragma omp parallel for schedule(static) if (n * in >= 4 * PARALLEL_MIN_MACS)
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = ids ? ids[i] : i;
        if (packed == 2)
            dequant_il_row(fmt, w, in, r, out + i * stride_out);
        else if (packed == 3)
            quant_dequant_tiled_row(fmt, w, in, r, out + i * stride_out);
        else
            dequant_row(fmt, packed, w + r * row_bytes, out + i * stride_out, in);
    }
    return 0;
}

/* ------------------------------------------------------------------ float activations */

#if defined(QM_AVX2)
/* The sum of v's 8 lanes (the AVX2 small GEMM's and the few-row paths' last step). */
static inline float hsum_ps(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
#endif

typedef struct {
    int fmt, packed;
    const uint8_t *w;
    int64_t row_bytes, out_features, in;
    const float *x;
    int64_t stride_x, rows;
    float *y;
    int64_t stride_y;
    const float *bias;
} F32Job;

static void f32_part(void *p, int part, int parts) {
    const F32Job j = *(const F32Job *)p; /* a local copy: y's stores cannot alias it */
    const int64_t o_begin = j.out_features * part / parts, o_end = j.out_features * (part + 1) / parts;
    const int64_t in = j.in;
    float wrow[MAX_ROW] __attribute__((aligned(64)));
    for (int64_t o = o_begin; o < o_end; o++) {
        dequant_row(j.fmt, j.packed, j.w + o * j.row_bytes, wrow, in);
        const float b = j.bias ? j.bias[o] : 0.0f;
        for (int64_t r = 0; r < j.rows; r++) {
            const float *xr = j.x + r * j.stride_x;
            /* summed as the small GEMM (gemm_part) sums a row, so a row's bits do not depend on
             * the rows beside it: lane l adds k = l mod width in order of k (K is a multiple
             * of the blocks' 32), then the lanes */
#if defined(QM_AVX2) && defined(__AVX512F__)
            __m512 acc = _mm512_setzero_ps();
            for (int64_t i = 0; i < in; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(xr + i), _mm512_load_ps(wrow + i), acc);
            j.y[r * j.stride_y + o] = reduce_add16(acc) + b;
#elif defined(QM_AVX2)
            __m256 acc = _mm256_setzero_ps();
            for (int64_t i = 0; i < in; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(xr + i), _mm256_load_ps(wrow + i), acc);
            j.y[r * j.stride_y + o] = hsum_ps(acc) + b;
#else /* no small GEMM: every row count comes here */
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t i = 0; i < in; i++) acc += wrow[i] * xr[i];
            j.y[r * j.stride_y + o] = acc + b;
#endif
        }
    }
}

static int parts_for(int64_t macs) { return macs >= PARALLEL_MIN_MACS ? spin_pool_threads() : 1; }
int quant_parts_for(int64_t macs) { return parts_for(macs); }

/* ------------------------------------------------------------------ 8-bit activations */

/* Activations quantized per block of 32 (ggml's quantize_row_q8_0: d = max|x| / 127, q =
 * round(x / d)), laid out for the packed weights: per row nb8 blocks of 32 int8 (zeros past nb),
 * the scales d[nb8] and d * sum(q) [nb8] (zeros past nb). */
typedef struct {
    int8_t *qs;
    float *d;
    float *ds; /* d * sum(q) */
    int64_t nb8;
} QActs;

static void quantize_acts(const float *x, int64_t stride_x, int64_t rows, int64_t in, QActs *a) {
    const int64_t nb = in / 32;
    for (int64_t r = 0; r < rows; r++) {
        int8_t *qs = a->qs + r * a->nb8 * 32;
        float *d = a->d + r * a->nb8, *ds = a->ds + r * a->nb8;
        for (int64_t b = 0; b < a->nb8; b++) {
            if (b >= nb) {
                memset(qs + 32 * b, 0, 32);
                d[b] = ds[b] = 0.0f;
                continue;
            }
            const float *xb = x + r * stride_x + 32 * b;
#if defined(QM_AVX512)
            /* the scalar loop's values 16 at a time for finite x (a 32-row call spent ~50 us
             * here, scalar): max|x| in any order, x * inv rounded to nearest even as lrintf
             * rounds. A NaN element becomes -128 here (0 there); a model that produced one has
             * already failed */
            const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
            const __m512 sign = _mm512_set1_ps(-0.0f);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(
                _mm512_andnot_ps(sign, x1), _mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_setzero_ps())));
            const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(inv)));
            const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(inv)));
            _mm_storeu_si128((__m128i *)(qs + 32 * b), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(qs + 32 * b + 16), _mm512_cvtsepi32_epi8(q1));
            const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
#else
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
            const float scale = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                const int q = (int)lrintf(xb[j] * inv);
                qs[32 * b + j] = (int8_t)q;
                sum += q;
            }
#endif
            d[b] = scale;
            ds[b] = scale * (float)sum;
        }
    }
}

/* x's rows quantized into a (its buffers malloc'ed; qacts_free gives them back); -1 when memory
 * could not be had. */
static int qacts_make(const float *x, int64_t stride_x, int64_t rows, int64_t in, QActs *a) {
    const int64_t nb8 = pad8(in / 32);
    a->qs = malloc((size_t)(rows * nb8 * 32));
    a->d = malloc(sizeof(float) * (size_t)(rows * nb8 * 2));
    a->nb8 = nb8;
    if (!a->qs || !a->d) {
        free(a->qs);
        free(a->d);
        return -1;
    }
    a->ds = a->d + rows * nb8;
    quantize_acts(x, stride_x, rows, in, a);
    return 0;
}

static void qacts_free(QActs *a) {
    free(a->qs);
    free(a->d);
}

/* A tile of y: OT consecutive weight rows against RT activation rows, accumulators in
 * registers (OT, RT and fmt are constants at every call, see TILE). */
#define OUT_TILE 4
#define ROW_TILE 4 /* 1 or 2 rows with OUT_TILE outputs; 3 or 4 with half of them, twice */

#if defined(QM_AVX2)
static inline __m256i dot_u8_s8(__m256i u, __m256i s) {
#if defined(QM_VNNI)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    const __m256i pairs = _mm256_maddubs_epi16(u, s); /* |15 * 127 * 2| and |127 * 127 * 2| fit */
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

static inline __m256 load_fp16x8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#endif

typedef struct {
    int fmt;
    const uint8_t *w;
    int64_t row_bytes, out_features, nb;
    const QActs *a;
    int64_t rows;
    float *y;
    int64_t stride_y;
    const float *bias;
} Q8Job;

static inline __attribute__((always_inline)) void
dot_tile(const int fmt, const Q8Job *j, const uint8_t *w0, const int OT, int64_t r0, const int RT,
         float out[OUT_TILE][ROW_TILE]) {
    const QActs *a = j->a;
    const int64_t nb = j->nb, nb8 = a->nb8, row_bytes = j->row_bytes;
    const int64_t qs_off = (fmt == Q4_1 ? 4 : 2) * nb8;
#if defined(QM_AVX2)
    __m256 acc[OUT_TILE][ROW_TILE], extra[OUT_TILE][ROW_TILE];
    for (int o = 0; o < OT; o++)
        for (int r = 0; r < RT; r++) acc[o][r] = extra[o][r] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0xf);
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        /* scales of these 8 blocks: dw * dx per (output, row); the offset terms as vectors */
        float sc[OUT_TILE][ROW_TILE][8] __attribute__((aligned(32)));
        for (int o = 0; o < OT; o++) {
            const uint8_t *wr = w0 + o * row_bytes;
            const __m256 dv = load_fp16x8(wr + 2 * b0);
#if defined(QM_VNNI)
            const __m256 mv = fmt == Q4_1   ? load_fp16x8(wr + 2 * nb8 + 2 * b0)
                              : fmt == Q4_0 ? _mm256_mul_ps(dv, _mm256_set1_ps(-8.0f))
                                            : _mm256_mul_ps(dv, _mm256_set1_ps(-128.0f));
#else
            const __m256 mv = fmt == Q4_1   ? load_fp16x8(wr + 2 * nb8 + 2 * b0)
                              : fmt == Q4_0 ? _mm256_mul_ps(dv, _mm256_set1_ps(-8.0f))
                                            : _mm256_setzero_ps();
#endif
            for (int r = 0; r < RT; r++) {
                _mm256_store_ps(sc[o][r], _mm256_mul_ps(dv, _mm256_loadu_ps(a->d + (r0 + r) * nb8 + b0)));
                extra[o][r] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(a->ds + (r0 + r) * nb8 + b0), extra[o][r]);
            }
        }
        const int64_t end = nb - b0 < 8 ? nb - b0 : 8;
        if (fmt == Q8_0) {
            for (int64_t j = 0; j < end; j++) {
                for (int o = 0; o < OT; o++) {
                    const __m256i wq =
                        _mm256_loadu_si256((const __m256i *)(w0 + o * row_bytes + qs_off + 32 * (b0 + j)));
#if defined(QM_VNNI)
                    const __m256i wu = _mm256_xor_si256(wq, _mm256_set1_epi8((char)0x80)); /* w + 128 */
#else
                    const __m256i wu = _mm256_sign_epi8(wq, wq);
#endif
                    for (int r = 0; r < RT; r++) {
                        const __m256i xq =
                            _mm256_loadu_si256((const __m256i *)(a->qs + ((r0 + r) * nb8 + b0 + j) * 32));
#if defined(QM_VNNI)
                        const __m256i dot = dot_u8_s8(wu, xq);
#else
                        const __m256i dot = dot_u8_s8(wu, _mm256_sign_epi8(xq, wq));
#endif
                        acc[o][r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[o][r][j]), _mm256_cvtepi32_ps(dot), acc[o][r]);
                    }
                }
            }
        } else {
            for (int64_t j = 0; j < end; j += 2) { /* a pair of blocks per load */
                for (int o = 0; o < OT; o++) {
                    const __m256i v =
                        _mm256_loadu_si256((const __m256i *)(w0 + o * row_bytes + qs_off + 16 * (b0 + j)));
                    const __m256i lo = _mm256_and_si256(v, low4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                    for (int r = 0; r < RT; r++) {
                        const int8_t *xq = a->qs + ((r0 + r) * nb8 + b0 + j) * 32;
                        const __m256i d0 = dot_u8_s8(lo, _mm256_loadu_si256((const __m256i *)xq));
                        const __m256i d1 = dot_u8_s8(hi, _mm256_loadu_si256((const __m256i *)(xq + 32)));
                        acc[o][r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[o][r][j]), _mm256_cvtepi32_ps(d0), acc[o][r]);
                        acc[o][r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[o][r][j + 1]), _mm256_cvtepi32_ps(d1), acc[o][r]);
                    }
                }
            }
        }
    }
    for (int o = 0; o < OT; o++)
        for (int r = 0; r < RT; r++) out[o][r] = hsum_ps(_mm256_add_ps(acc[o][r], extra[o][r]));
#else
    for (int o = 0; o < OT; o++) {
        const uint8_t *wr = w0 + o * row_bytes;
        for (int r = 0; r < RT; r++) {
            const int8_t *xq = a->qs + (r0 + r) * nb8 * 32;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const float dw = fp16_to_float(read_u16(wr + 2 * b));
                float mw = 0.0f;
                int dot = 0;
                if (fmt == Q8_0) {
                    const int8_t *q = (const int8_t *)(wr + qs_off + 32 * b);
                    for (int j = 0; j < 32; j++) dot += (int)q[j] * (int)xq[32 * b + j];
                } else {
                    const uint8_t *pair = wr + qs_off + 32 * (b / 2);
                    const int shift = (b % 2) * 4;
                    for (int j = 0; j < 32; j++) dot += ((pair[j] >> shift) & 0xf) * (int)xq[32 * b + j];
                    mw = fmt == Q4_1 ? fp16_to_float(read_u16(wr + 2 * nb8 + 2 * b)) : -8.0f * dw;
                }
                acc += dw * a->d[(r0 + r) * nb8 + b] * (float)dot + mw * a->ds[(r0 + r) * nb8 + b];
            }
            out[o][r] = acc;
        }
    }
#endif
}

/* A tile function with the format and a full tile's sizes as constants (so the accumulators stay in
 * registers); partial tiles one (output, row) pair at a time. FN(fmt, job, w0, OT, r0, RT, out). */
#define TILE_CASE(FN, F)                                                                           \
    case F:                                                                                        \
        if (nout == OUT_TILE && nrows == 2)                                                        \
            FN(F, j, w0, OUT_TILE, r0, 2, out);                                                    \
        else if (nout == OUT_TILE && nrows == 1)                                                   \
            FN(F, j, w0, OUT_TILE, r0, 1, out);                                                    \
        else if (nout == OUT_TILE && nrows == 3) {                                                 \
            FN(F, j, w0, OUT_TILE / 2, r0, 3, out);                                                \
            FN(F, j, w0 + OUT_TILE / 2 * j->row_bytes, OUT_TILE / 2, r0, 3, out + OUT_TILE / 2);   \
        } else if (nout == OUT_TILE && nrows == 4) {                                               \
            FN(F, j, w0, OUT_TILE / 2, r0, 4, out);                                                \
            FN(F, j, w0 + OUT_TILE / 2 * j->row_bytes, OUT_TILE / 2, r0, 4, out + OUT_TILE / 2);   \
        } else                                                                                     \
            for (int o = 0; o < nout; o++)                                                         \
                for (int r = 0; r < nrows; r++) {                                                  \
                    float one[OUT_TILE][ROW_TILE];                                                 \
                    FN(F, j, w0 + o * j->row_bytes, 1, r0 + r, 1, one);                            \
                    out[o][r] = one[0][0];                                                         \
                }                                                                                  \
        break;

/* The part function of a tiled job (fields w, row_bytes, out_features, rows, fmt, y, stride_y,
 * bias): its share of OUT_TILE-output tiles, each against the rows ROW_TILE at a time through
 * FN (TILE_CASE), plus the bias. */
/* Decode reads every weight once per step, from memory (the model is bigger than the cache):
 * each tile asks for the one PREFETCH_TILES ahead. The hardware prefetchers alone left the
 * loads and the arithmetic in series; with this, 30 layers of the default model's matmuls at
 * batch 1 went from 4.0-4.7 to 2.6-2.8 ms (2 threads; 2.0 ms with the weights in cache). */
#define PREFETCH_TILES 4

#define TILED_PART(NAME, JOB, FN)                                                                  \
    static void NAME(void *p, int part, int parts) {                                               \
        const JOB job = *(const JOB *)p, *j = &job; /* a local copy: y's stores cannot alias it */ \
        const int64_t tiles = (j->out_features + OUT_TILE - 1) / OUT_TILE;                         \
        const int64_t t_begin = tiles * part / parts, t_end = tiles * (part + 1) / parts;          \
        for (int64_t t = t_begin; t < t_end; t++) {                                                \
            const int64_t o0 = t * OUT_TILE;                                                       \
            const int nout = j->out_features - o0 < OUT_TILE ? (int)(j->out_features - o0) : OUT_TILE; \
            const uint8_t *w0 = j->w + o0 * j->row_bytes;                                          \
            if (t + PREFETCH_TILES < t_end) /* written out here: as an inline function GCC 12 \
                                               * dropped it from one of the two parts */          \
                for (int64_t b = 0; b < j->row_bytes * OUT_TILE; b += 64)                          \
                    __builtin_prefetch(w0 + PREFETCH_TILES * j->row_bytes * OUT_TILE + b, 0, 3);   \
            for (int64_t r0 = 0; r0 < j->rows; r0 += ROW_TILE) {                                   \
                const int nrows = j->rows - r0 < ROW_TILE ? (int)(j->rows - r0) : ROW_TILE;        \
                float out[OUT_TILE][ROW_TILE];                                                     \
                switch (j->fmt) {                                                                  \
                    TILE_CASE(FN, Q4_0)                                                            \
                    TILE_CASE(FN, Q4_1)                                                            \
                    TILE_CASE(FN, Q8_0)                                                            \
                default:                                                                           \
                    break;                                                                         \
                }                                                                                  \
                for (int o = 0; o < nout; o++) {                                                   \
                    const float b = j->bias ? j->bias[o0 + o] : 0.0f;                              \
                    for (int r = 0; r < nrows; r++) j->y[(r0 + r) * j->stride_y + o0 + o] = out[o][r] + b; \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

TILED_PART(q8_part, Q8Job, dot_tile)

static int matmul_q8_act(int fmt, const uint8_t *w, int64_t row_bytes, int64_t out_features,
                         int64_t in, const float *x, int64_t stride_x, int64_t rows, float *y,
                         int64_t stride_y, const float *bias) {
    QActs a;
    if (qacts_make(x, stride_x, rows, in, &a)) return -2;
    Q8Job job = {fmt, w, row_bytes, out_features, in / 32, &a, rows, y, stride_y, bias};
    spin_pool_run(q8_part, &job, parts_for(out_features * rows * in));
    qacts_free(&a);
    return 0;
}


/* ----------------------- 8-bit activations on the interleaved layout (AVX-512 VNNI, layout 2)
 *
 * Q4_0, Q4_1 and Q8_0 weights whose row count is a multiple of 16, for 8-bit activations: the
 * rows in groups of 16, each group's blocks in order. A block of a group holds its 16 rows' fp16
 * scales (32 bytes), Q4_1's 16 fp16 minimums (32 bytes), then the quants as 64-byte vectors of 16
 * dword lanes, lane o for row o of the group:
 *   - Q4 (4 vectors): vector i, lane o is GGUF's quant bytes 4i..4i+3 of row o's block: byte j's
 *     low nibble is element 4i + j, its high nibble element 16 + 4i + j;
 *   - Q8_0 (8 vectors): vector i, lane o, byte j is element 4i + j plus 128, unsigned.
 * A group's block has the bytes of 16 GGUF blocks, so a weight keeps GGUF's [out, row_bytes].
 *
 * One vpdpbusd multiplies 4 elements of 16 rows by 4 of one activation row in integers: per block
 * of 32, 8 instructions serve 16 outputs of one row, where float32 takes 32 multiply-adds (the
 * packed q8 tile, dot_tile, also converts and scales each 8-lane partial). Every output sums,
 * for its blocks b in order and whatever the rows beside it:
 *   acc = fma(float(sum_k q_k x_k), d_w * d_x, acc);  acc = fma(m_w, d_x * sum_k x_k, acc)
 * with m_w Q4_1's minimum, -8 d_w for Q4_0 and -128 d_w for Q8_0 (whose quants are stored + 128).
 * The integer sums are exact, so a row's bits do not depend on the number of rows in its call. */
#if defined(QM_AVX512) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define QM_IL 1
#endif
#define IL_GROUP 16
#define IL_MAX_RT 8
#define IL_PREFETCH_GROUPS 2

/* GGUF rows (src) -> the interleaved layout (dst, as many bytes); rows a multiple of 16. */
int quant_interleave(int fmt, const uint8_t *src, int64_t src_row_bytes, int64_t rows, int64_t in,
                     uint8_t *dst) {
    const int64_t bb = quant_block_bytes(fmt);
    if ((fmt != Q4_0 && fmt != Q4_1 && fmt != Q8_0) || in % 32 || rows % IL_GROUP ||
        src_row_bytes != in / 32 * bb)
        return -1;
    const int64_t nb = in / 32, ib = IL_GROUP * bb, groups = rows / IL_GROUP;
    const int64_t q_off = fmt == Q4_1 ? 64 : 32, sq_off = fmt == Q4_1 ? 4 : 2;
#pragma omp parallel for schedule(static) if (rows * in >= 4 * PARALLEL_MIN_MACS)
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = dst + (g * nb + b) * ib;
            for (int o = 0; o < IL_GROUP; o++) {
                const uint8_t *s = src + (g * IL_GROUP + o) * src_row_bytes + b * bb;
                memcpy(blk + 2 * o, s, 2);
                if (fmt == Q4_1) memcpy(blk + 32 + 2 * o, s + 2, 2);
                uint8_t *q = blk + q_off + 4 * o;
                const uint8_t *sq = s + sq_off;
                for (int i = 0; i < (fmt == Q8_0 ? 8 : 4); i++)
                    for (int k = 0; k < 4; k++)
                        q[64 * i + k] = fmt == Q8_0 ? (uint8_t)(sq[4 * i + k] ^ 0x80) : sq[4 * i + k];
            }
        }
    return 0;
}

/* Row r of an interleaved weight to floats: its blocks rebuilt in GGUF's bytes, then
 * dequant_block (the same values). */
static void dequant_il_row(int fmt, const uint8_t *w, int64_t in, int64_t r, float *out) {
    const int64_t bb = quant_block_bytes(fmt), nb = in / 32, ib = IL_GROUP * bb;
    const int64_t q_off = fmt == Q4_1 ? 64 : 32, sq_off = fmt == Q4_1 ? 4 : 2;
    const int o = (int)(r % IL_GROUP);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + ((r / IL_GROUP) * nb + b) * ib;
        uint8_t gguf[34];
        memcpy(gguf, blk + 2 * o, 2);
        if (fmt == Q4_1) memcpy(gguf + 2, blk + 32 + 2 * o, 2);
        const uint8_t *q = blk + q_off + 4 * o;
        for (int i = 0; i < (fmt == Q8_0 ? 8 : 4); i++)
            for (int k = 0; k < 4; k++)
                gguf[sq_off + 4 * i + k] = fmt == Q8_0 ? (uint8_t)(q[64 * i + k] ^ 0x80) : q[64 * i + k];
        dequant_block(fmt, gguf, out + 32 * b);
    }
}

int quant_interleave_supported(void) {
#if defined(QM_IL)
    return 1;
#else
    return 0;
#endif
}

#if defined(QM_IL)
typedef struct {
    int fmt;
    const uint8_t *w;
    int64_t nb, groups;
    const QActs *a;
    int64_t rows;
    float *y;
    int64_t stride_y;
    const float *bias;
} ILJob;

static inline int32_t act_quad(const QActs *a, int64_t r, int64_t b, int i) {
    int32_t v;
    memcpy(&v, a->qs + (r * a->nb8 + b) * 32 + 4 * i, sizeof v);
    return v;
}

/* The 16 outputs of a group (at w0, from output o0) for RT rows from r0 (fmt, RT: constants);
 * pf (or NULL): a later group, whose blocks are prefetched one per block here. */
static inline __attribute__((always_inline)) void
il_tile(const int fmt, const ILJob *j, const uint8_t *w0, int64_t o0, int64_t r0, const int RT,
        const uint8_t *pf) {
    const QActs *a = j->a;
    const int64_t nb = j->nb, nb8 = a->nb8, ib = IL_GROUP * quant_block_bytes(fmt);
    const int64_t q_off = fmt == Q4_1 ? 64 : 32;
    const __m512i low4 = _mm512_set1_epi8(0xf);
    __m512 acc[IL_MAX_RT];
#pragma GCC unroll 8
    for (int r = 0; r < RT; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w0 + b * ib, *q = blk + q_off;
        if (pf)
            for (int64_t l = 0; l < ib; l += 64) __builtin_prefetch(pf + b * ib + l, 0, 3);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 m = fmt == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)))
                                     : _mm512_mul_ps(d, _mm512_set1_ps(fmt == Q4_0 ? -8.0f : -128.0f));
        /* NC chains of integer sums per row (exact, so any split sums alike): with few rows one
         * chain of 8 dependent vpdpbusd per block was bound by their latency */
        const int NC = RT >= 4 ? 1 : RT >= 2 ? 2 : 4;
        __m512i s[4][IL_MAX_RT];
#pragma GCC unroll 4
        for (int c = 0; c < NC; c++)
#pragma GCC unroll 8
            for (int r = 0; r < RT; r++) s[c][r] = _mm512_setzero_si512();
        if (fmt == Q8_0) {
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++) {
                const __m512i wv = _mm512_loadu_si512((const void *)(q + 64 * i));
#pragma GCC unroll 8
                for (int r = 0; r < RT; r++)
                    s[i % NC][r] = _mm512_dpbusd_epi32(s[i % NC][r], wv, _mm512_set1_epi32(act_quad(a, r0 + r, b, i)));
            }
        } else {
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * i));
                const __m512i lo = _mm512_and_si512(v, low4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 8
                for (int r = 0; r < RT; r++) {
                    const int c0 = (2 * i) % NC, c1 = (2 * i + 1) % NC;
                    s[c0][r] = _mm512_dpbusd_epi32(s[c0][r], lo, _mm512_set1_epi32(act_quad(a, r0 + r, b, i)));
                    s[c1][r] = _mm512_dpbusd_epi32(s[c1][r], hi, _mm512_set1_epi32(act_quad(a, r0 + r, b, 4 + i)));
                }
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
            for (int c = 1; c < NC; c++) s[0][r] = _mm512_add_epi32(s[0][r], s[c][r]);
#pragma GCC unroll 8
        for (int r = 0; r < RT; r++) {
            const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(a->d[(r0 + r) * nb8 + b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[0][r]), dd, acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(a->ds[(r0 + r) * nb8 + b]), acc[r]);
        }
    }
    const __m512 bias = j->bias ? _mm512_loadu_ps(j->bias + o0) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < RT; r++) _mm512_storeu_ps(j->y + (r0 + r) * j->stride_y + o0, _mm512_add_ps(acc[r], bias));
}

#define IL_ROWS(F, RT)                                                                             \
    case RT:                                                                                       \
        il_tile(F, j, w0, o0, r0, RT, pf);                                                         \
        break;
#define IL_FORMAT(F)                                                                               \
    static void il_tiles_##F(const ILJob *j, const uint8_t *w0, int64_t o0, int64_t r0, int rt,    \
                             const uint8_t *pf) {                                                  \
        switch (rt) {                                                                              \
            IL_ROWS(F, 1) IL_ROWS(F, 2) IL_ROWS(F, 3) IL_ROWS(F, 4)                                \
            IL_ROWS(F, 5) IL_ROWS(F, 6) IL_ROWS(F, 7) IL_ROWS(F, 8)                                \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }
IL_FORMAT(Q4_0)
IL_FORMAT(Q4_1)
IL_FORMAT(Q8_0)

static void il_part(void *p, int part, int parts) {
    const ILJob job = *(const ILJob *)p, *j = &job; /* a local copy: y's stores cannot alias it */
    const int64_t gbytes = j->nb * IL_GROUP * quant_block_bytes(j->fmt);
    const int64_t g_begin = j->groups * part / parts, g_end = j->groups * (part + 1) / parts;
    const int64_t chunks = (j->rows + IL_MAX_RT - 1) / IL_MAX_RT; /* near-equal groups of rows */
    for (int64_t g = g_begin; g < g_end; g++) {
        const uint8_t *w0 = j->w + g * gbytes;
        /* the weights come from memory: the first pass over a group asks for the group
         * IL_PREFETCH_GROUPS ahead, a block at a time */
        const uint8_t *pf = g + IL_PREFETCH_GROUPS < g_end ? w0 + IL_PREFETCH_GROUPS * gbytes : NULL;
        for (int64_t c = 0; c < chunks; c++, pf = NULL) {
            const int64_t r0 = j->rows * c / chunks, rt = j->rows * (c + 1) / chunks - r0;
            switch (j->fmt) {
            case Q4_0: il_tiles_Q4_0(j, w0, g * IL_GROUP, r0, (int)rt, pf); break;
            case Q4_1: il_tiles_Q4_1(j, w0, g * IL_GROUP, r0, (int)rt, pf); break;
            case Q8_0: il_tiles_Q8_0(j, w0, g * IL_GROUP, r0, (int)rt, pf); break;
            default: break;
            }
        }
    }
}

static int matmul_q8_interleaved(int fmt, const uint8_t *w, int64_t out_features, int64_t in,
                                 const float *x, int64_t stride_x, int64_t rows, float *y,
                                 int64_t stride_y, const float *bias) {
    QActs a;
    if (qacts_make(x, stride_x, rows, in, &a)) return -2;
    ILJob job = {fmt, w, in / 32, out_features / IL_GROUP, &a, rows, y, stride_y, bias};
    spin_pool_run(il_part, &job, parts_for(out_features * rows * in));
    qacts_free(&a);
    return 0;
}
#endif

/* ------------------------------------------------ float activations on the packed layout (AVX2)
 *
 * A few rows (below GEMM_MIN_ROWS) sum as the small GEMM (gemm_part, AVX2) does, bit for bit:
 * each weight value as dequant_packed_row_avx2 rounds it (the same inline helpers), lane l of one
 * 8-lane accumulator per (output, row) summing k = l mod 8 in order of k, the lanes summed by
 * hsum_ps. So a row's result does not depend on how many rows share its call (decode rows, a
 * verify pass and the prefill of the same tokens agree), as on AVX-512. The weights are expanded
 * in registers, 8 values at a time, each conversion shared by the tile's rows. */
#if defined(QM_AVX2)
typedef struct {
    int fmt;
    const uint8_t *w;
    int64_t row_bytes, out_features, nb, nb8;
    const float *x;
    int64_t stride_x, rows;
    float *y;
    int64_t stride_y;
    const float *bias;
} PF32Job;

static inline __attribute__((always_inline)) void
pf32_tile(const int fmt, const PF32Job *j, const uint8_t *w0, const int OT, int64_t r0, const int RT,
          float out[OUT_TILE][ROW_TILE]) {
    const int64_t nb = j->nb, nb8 = j->nb8, row_bytes = j->row_bytes;
    const int64_t qs_off = (fmt == Q4_1 ? 4 : 2) * nb8;
    __m256 acc[OUT_TILE][ROW_TILE];
    for (int o = 0; o < OT; o++)
        for (int r = 0; r < RT; r++) acc[o][r] = _mm256_setzero_ps();
    const float *xr[ROW_TILE];
    for (int r = 0; r < RT; r++) xr[r] = j->x + (r0 + r) * j->stride_x;
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        float dsc[OUT_TILE][8] __attribute__((aligned(32))), msc[OUT_TILE][8] __attribute__((aligned(32)));
        for (int o = 0; o < OT; o++) { /* the scales (and minimums) of 8 blocks at once */
            const uint8_t *wr = w0 + o * row_bytes;
            _mm256_store_ps(dsc[o], load_fp16x8(wr + 2 * b0));
            if (fmt == Q4_1) _mm256_store_ps(msc[o], load_fp16x8(wr + 2 * nb8 + 2 * b0));
        }
        const int64_t end = nb - b0 < 8 ? nb - b0 : 8;
        /* Q4: a pair of blocks' nibbles, masked 32 bytes at a time, then read 8 at a time */
        uint8_t nib[OUT_TILE][64] __attribute__((aligned(32)));
        for (int64_t k = 0; k < end; k++) {
            const int64_t b = b0 + k;
            if (fmt != Q8_0 && b % 2 == 0)
                for (int o = 0; o < OT; o++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(w0 + o * row_bytes + qs_off + 16 * b));
                    const __m256i low4 = _mm256_set1_epi8(0xf);
                    _mm256_store_si256((__m256i *)nib[o], _mm256_and_si256(v, low4));
                    _mm256_store_si256((__m256i *)(nib[o] + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
                }
            __m256 d[OUT_TILE], m[OUT_TILE];
            for (int o = 0; o < OT; o++) {
                d[o] = _mm256_set1_ps(dsc[o][k]);
                m[o] = _mm256_set1_ps(fmt == Q4_1 ? msc[o][k] : 0.0f);
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) { /* 8 values of the block at a time, in order of k */
#pragma GCC unroll 4
                for (int o = 0; o < OT; o++) {
                    const __m128i q = fmt == Q8_0
                        ? _mm_loadl_epi64((const __m128i *)(w0 + o * row_bytes + qs_off + 32 * b + 8 * i))
                        : _mm_loadl_epi64((const __m128i *)(nib[o] + 32 * (b % 2) + 8 * i));
                    const __m256 wv = fmt == Q8_0 ? q8_values(q, d[o]) : q4_values(fmt, q, d[o], m[o]);
#pragma GCC unroll 4
                    for (int r = 0; r < RT; r++)
                        acc[o][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr[r] + 32 * b + 8 * i), wv, acc[o][r]);
                }
            }
        }
    }
    for (int o = 0; o < OT; o++)
        for (int r = 0; r < RT; r++) out[o][r] = hsum_ps(acc[o][r]);
}

TILED_PART(pf32_part, PF32Job, pf32_tile)

static int matmul_packed_f32(int fmt, const uint8_t *w, int64_t row_bytes, int64_t out_features,
                             int64_t in, const float *x, int64_t stride_x, int64_t rows, float *y,
                             int64_t stride_y, const float *bias) {
    const int64_t nb = in / 32;
    PF32Job job = {fmt, w, row_bytes, out_features, nb, pad8(nb), x, stride_x, rows, y, stride_y, bias};
    spin_pool_run(pf32_part, &job, parts_for(out_features * rows * in));
    return 0;
}
#endif

#if defined(QM_AVX2)
/* ------------------------------------------- float activations, batches: a small GEMM (AVX2)
 *
 * From GEMM_MIN_ROWS rows on, each tile of 4 outputs is expanded once into floats (4 rows of K,
 * L1-resident) and multiplied with the activations 4 rows at a time: 16 vector accumulators over
 * k (per 8 values of k, 8 loads and 16 FMAs make 128 products), summed across lanes at the end.
 * Any format (dequant_row), either layout. */
#define GEMM_MIN_ROWS 10
#define GEMM_T 4

typedef struct {
    int fmt, packed;
    const uint8_t *w;
    int64_t row_bytes, out_features, in;
    const float *x;
    int64_t stride_x, rows;
    float *y;
    int64_t stride_y;
    const float *bias;
    int failed; /* set when a part could not get its buffer */
} GemmJob;

static void gemm_part(void *p, int part, int parts) {
    GemmJob *job = p;
    const GemmJob j = *job;
    const int64_t k_len = j.in;
    const int64_t tiles = (j.out_features + GEMM_T - 1) / GEMM_T;
    const int64_t t_begin = tiles * part / parts, t_end = tiles * (part + 1) / parts;
    float *wt = aligned_alloc(64, (size_t)(GEMM_T * k_len * 4 + 64));
    if (!wt) {
        job->failed = 1;
        return;
    }
    for (int64_t t = t_begin; t < t_end; t++) {
        const int64_t o0 = t * GEMM_T;
        const int nout = j.out_features - o0 < GEMM_T ? (int)(j.out_features - o0) : GEMM_T;
        if (t + PREFETCH_TILES < t_end) /* as TILED_PART: the weights come from memory */
            for (int64_t b = 0; b < j.row_bytes * GEMM_T; b += 64)
                __builtin_prefetch(j.w + (o0 + PREFETCH_TILES * GEMM_T) * j.row_bytes + b, 0, 3);
        for (int o = 0; o < GEMM_T; o++) /* past the last output: expand it again, store nothing */
            dequant_row(j.fmt, j.packed, j.w + (o0 + (o < nout ? o : nout - 1)) * j.row_bytes,
                        wt + o * k_len, k_len);
        for (int64_t r0 = 0; r0 < j.rows; r0 += GEMM_T) {
            const float *xr[GEMM_T];
            for (int r = 0; r < GEMM_T; r++) /* past the last row: read it again, store nothing */
                xr[r] = j.x + (r0 + r < j.rows ? r0 + r : j.rows - 1) * j.stride_x;
#if defined(__AVX512F__)
            __m512 c[GEMM_T][GEMM_T]; /* 16 lanes of k: K is a multiple of 32 (the blocks) */
            for (int r = 0; r < GEMM_T; r++)
                for (int o = 0; o < GEMM_T; o++) c[r][o] = _mm512_setzero_ps();
            for (int64_t k = 0; k < k_len; k += 16) {
                __m512 wv[GEMM_T], xv[GEMM_T];
                /* each in a register: GCC otherwise folds the loads of one operand into the 16
                 * FMAs, 20 loads where 8 do */
                for (int o = 0; o < GEMM_T; o++) {
                    wv[o] = _mm512_load_ps(wt + o * k_len + k);
                    __asm__("" : "+v"(wv[o]));
                }
                for (int r = 0; r < GEMM_T; r++) {
                    xv[r] = _mm512_loadu_ps(xr[r] + k);
                    __asm__("" : "+v"(xv[r]));
                }
                for (int r = 0; r < GEMM_T; r++)
                    for (int o = 0; o < GEMM_T; o++) c[r][o] = _mm512_fmadd_ps(xv[r], wv[o], c[r][o]);
            }
            _Static_assert(GEMM_T * GEMM_T == 16, "reduce16_ps sums 16 accumulators");
            float sums[GEMM_T * GEMM_T]; /* the 16 reductions together, paired as reduce_add16 */
            _mm512_storeu_ps(sums, reduce16_ps(&c[0][0]));
            for (int r = 0; r < GEMM_T && r0 + r < j.rows; r++) {
                float *yr = j.y + (r0 + r) * j.stride_y + o0;
                for (int o = 0; o < nout; o++) yr[o] = sums[r * GEMM_T + o] + (j.bias ? j.bias[o0 + o] : 0.0f);
            }
#else
            __m256 c[GEMM_T][GEMM_T];
            for (int r = 0; r < GEMM_T; r++)
                for (int o = 0; o < GEMM_T; o++) c[r][o] = _mm256_setzero_ps();
            for (int64_t k = 0; k < k_len; k += 8) {
                __m256 wv[GEMM_T], xv[GEMM_T];
                for (int o = 0; o < GEMM_T; o++) wv[o] = _mm256_load_ps(wt + o * k_len + k);
                for (int r = 0; r < GEMM_T; r++) xv[r] = _mm256_loadu_ps(xr[r] + k);
                for (int r = 0; r < GEMM_T; r++)
                    for (int o = 0; o < GEMM_T; o++) c[r][o] = _mm256_fmadd_ps(xv[r], wv[o], c[r][o]);
            }
            for (int r = 0; r < GEMM_T && r0 + r < j.rows; r++) {
                float *yr = j.y + (r0 + r) * j.stride_y + o0;
                for (int o = 0; o < nout; o++) yr[o] = hsum_ps(c[r][o]) + (j.bias ? j.bias[o0 + o] : 0.0f);
            }
#endif
        }
    }
    free(wt);
}
#endif

#if defined(QM_AVX512)
/* --------------------------- float activations on the packed layout, AVX-512: rows like the GEMM
 *
 * A row's outputs here are the small GEMM's (gemm_part, AVX-512) bit for bit: each weight value is
 * dequantized as dequant_packed_row_avx2 rounds it, lane l of one 16-lane accumulator per
 * (output, row) sums k = l mod 16 in order of k, and the lanes are summed in reduce_add16's order.
 * So a row's result does not depend on how many rows share its call: a decode row, a verify row
 * and a prefill row of the same token agree, whatever the batch. Unlike the GEMM, the weights are
 * expanded in registers (never stored), and a tile of 4 outputs (2 from 5 rows on) serves up to 8
 * rows, so each conversion is shared by more rows. */
#define PZ_MAX_RT 8
/* Up to this many rows, then the small GEMM (which sums a row alike here): measured per call on
 * the default model's matrices (stop 40, with the tile's loops unrolled), the GEMM's expanded
 * tile was faster from 7 rows on for Q4_1 (3072 x 576: 6 rows 82 against 92 us, 7 rows 97
 * against 91) and from 12 for the Q8_0 head (10 rows 1,868 against 2,064 us, 12 rows 2,188
 * against 2,092). */
#define PZ_MAX_ROWS 6
#define PZ_MAX_ROWS_Q8 10

/* y for OT outputs from w0 against RT rows from r0 (OT, RT, fmt: constants at every call). */
static inline __attribute__((always_inline)) void
pz_tile(const int fmt, const PF32Job *j, const uint8_t *w0, int64_t o0, const int OT, int64_t r0, const int RT) {
    const int64_t nb = j->nb, nb8 = j->nb8, row_bytes = j->row_bytes;
    const int64_t qs_off = (fmt == Q4_1 ? 4 : 2) * nb8;
    __m512 acc[4][PZ_MAX_RT];
    for (int o = 0; o < OT; o++)
        for (int r = 0; r < RT; r++) acc[o][r] = _mm512_setzero_ps();
    const float *xr[PZ_MAX_RT];
    for (int r = 0; r < RT; r++) xr[r] = j->x + (r0 + r) * j->stride_x;
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
        float dsc[4][8] __attribute__((aligned(32))), msc[4][8] __attribute__((aligned(32)));
        for (int o = 0; o < OT; o++) { /* the scales (and minimums) of 8 blocks at once */
            const uint8_t *wr = w0 + o * row_bytes;
            _mm256_store_ps(dsc[o], load_fp16x8(wr + 2 * b0));
            if (fmt == Q4_1) _mm256_store_ps(msc[o], load_fp16x8(wr + 2 * nb8 + 2 * b0));
        }
        const int64_t end = nb - b0 < 8 ? nb - b0 : 8;
        const int step = fmt == Q8_0 ? 1 : 2; /* blocks per 32 bytes of quants */
        for (int64_t k = 0; k < end; k += step) {
            const int64_t b = b0 + k;
            const int nv = fmt == Q8_0 || k + 1 == end ? 2 : 4; /* Q4: an odd last block pairs with zeros */
            /* unrolled, so the accumulators live in registers: GCC had kept them on the stack (a
             * load and a store around each FMA group; 4 rows of 3072 x 576 Q4_1 66 -> 58 us) */
#pragma GCC unroll 4
            for (int o = 0; o < OT; o++) {
                const uint8_t *wq = w0 + o * row_bytes + qs_off + 32 * (b / step);
                __m512 wv[4];
                if (fmt == Q8_0) {
                    const __m512 d = _mm512_set1_ps(dsc[o][k]);
                    wv[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)wq))), d);
                    wv[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wq + 16)))), d);
                } else {
                    const __m512i z0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)wq));
                    const __m512i z1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wq + 16)));
                    const __m512 t0 = pz_q4_table(fmt, dsc[o][k], fmt == Q4_1 ? msc[o][k] : 0.0f);
                    wv[0] = _mm512_permutexvar_ps(z0, t0); /* low nibbles: block b */
                    wv[1] = _mm512_permutexvar_ps(z1, t0);
                    if (nv == 4) { /* high nibbles: block b + 1 */
                        const __m512 t1 = pz_q4_table(fmt, dsc[o][k + 1], fmt == Q4_1 ? msc[o][k + 1] : 0.0f);
                        wv[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(z0, 4), t1);
                        wv[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(z1, 4), t1);
                    }
                }
#pragma GCC unroll 8
                for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
                    for (int i = 0; i < nv; i++)
                        acc[o][r] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[r] + 32 * b + 16 * i), wv[i], acc[o][r]);
            }
        }
    }
    for (int r = 0; r < RT; r++) {
        float *yr = j->y + (r0 + r) * j->stride_y + o0;
        for (int o = 0; o < OT; o++) yr[o] = reduce_add16(acc[o][r]) + (j->bias ? j->bias[o0 + o] : 0.0f);
    }
}

/* One (format, rows) pair's tile over a whole tile of 4 outputs: 4 at once up to 4 rows, 2 and 2
 * from 5; a partial tile one output at a time. */
#define PZ_ROWS(F, RT)                                                                             \
    case RT:                                                                                       \
        if (nout == 4 && RT <= 4)                                                                  \
            pz_tile(F, j, w0, o0, 4, r0, RT);                                                      \
        else if (nout == 4) {                                                                      \
            pz_tile(F, j, w0, o0, 2, r0, RT);                                                      \
            pz_tile(F, j, w0 + 2 * j->row_bytes, o0 + 2, 2, r0, RT);                               \
        } else                                                                                     \
            for (int o = 0; o < nout; o++) pz_tile(F, j, w0 + o * j->row_bytes, o0 + o, 1, r0, RT); \
        break;
#define PZ_FORMAT(F)                                                                               \
    static void pz_tiles_##F(const PF32Job *j, const uint8_t *w0, int64_t o0, int nout, int64_t r0, int rt) { \
        switch (rt) {                                                                              \
            PZ_ROWS(F, 1) PZ_ROWS(F, 2) PZ_ROWS(F, 3) PZ_ROWS(F, 4)                                \
            PZ_ROWS(F, 5) PZ_ROWS(F, 6) PZ_ROWS(F, 7) PZ_ROWS(F, 8)                                \
        default:                                                                                   \
            break;                                                                                 \
        }                                                                                          \
    }
PZ_FORMAT(Q4_0)
PZ_FORMAT(Q4_1)
PZ_FORMAT(Q8_0)

static void pz_part(void *p, int part, int parts) {
    const PF32Job job = *(const PF32Job *)p, *j = &job; /* a local copy: y's stores cannot alias it */
    const int64_t tiles = (j->out_features + 3) / 4;
    const int64_t t_begin = tiles * part / parts, t_end = tiles * (part + 1) / parts;
    const int64_t chunks = (j->rows + PZ_MAX_RT - 1) / PZ_MAX_RT; /* near-equal groups of rows */
    for (int64_t t = t_begin; t < t_end; t++) {
        const int64_t o0 = t * 4;
        const int nout = j->out_features - o0 < 4 ? (int)(j->out_features - o0) : 4;
        const uint8_t *w0 = j->w + o0 * j->row_bytes;
        if (t + PREFETCH_TILES < t_end)
            for (int64_t b = 0; b < j->row_bytes * 4; b += 64)
                __builtin_prefetch(w0 + PREFETCH_TILES * j->row_bytes * 4 + b, 0, 3);
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t r0 = j->rows * c / chunks, rt = j->rows * (c + 1) / chunks - r0;
            switch (j->fmt) {
            case Q4_0: pz_tiles_Q4_0(j, w0, o0, nout, r0, (int)rt); break;
            case Q4_1: pz_tiles_Q4_1(j, w0, o0, nout, r0, (int)rt); break;
            case Q8_0: pz_tiles_Q8_0(j, w0, o0, nout, r0, (int)rt); break;
            default: break;
            }
        }
    }
}

static int matmul_packed_pz(int fmt, const uint8_t *w, int64_t row_bytes, int64_t out_features,
                            int64_t in, const float *x, int64_t stride_x, int64_t rows, float *y,
                            int64_t stride_y, const float *bias) {
    const int64_t nb = in / 32;
    PF32Job job = {fmt, w, row_bytes, out_features, nb, pad8(nb), x, stride_x, rows, y, stride_y, bias};
    spin_pool_run(pz_part, &job, parts_for(out_features * rows * in));
    return 0;
}
#endif

/* y[rows, out] (row stride stride_y) = x[rows, in] (row stride stride_x) @ W^T (+ bias).
 * W is [out, row_bytes] in format fmt, GGUF layout (packed = 0), packed (packed = 1),
 * interleaved (packed = 2: 8-bit activations only, out a multiple of 16, a build with AVX-512
 * VNNI) or tiled (packed = 3: float activations only, out a multiple of 16, AMX granted).
 * act_q8 needs the packed or interleaved layout. Returns 0, or -1 for what it does not handle
 * (unknown format, a row size that does not match, a row longer than MAX_ROW on the float path,
 * act_q8 with a K-quant or the GGUF layout, a tiled weight without AMX), -2 when scratch memory
 * could not be had. */
int quant_matmul_f32(int fmt, int packed, const uint8_t *w, int64_t row_bytes, int64_t out_features,
                     int64_t in, const float *x, int64_t stride_x, int64_t rows, float *y,
                     int64_t stride_y, const float *bias, int act_q8) {
    const int64_t expected = row_bytes_of(fmt, packed, in);
    if (expected == 0 || row_bytes != expected) return -1;
    if (packed == 2 && (!act_q8 || out_features % IL_GROUP)) return -1;
    if (packed == 3 && (act_q8 || out_features % AMX_GROUP)) return -1;
    if (rows == 0 || out_features == 0) return 0;
    if (packed == 3) return quant_matmul_tiled(fmt, w, out_features, in, x, stride_x, rows, y, stride_y, bias);
    if (packed == 2) {
#if defined(QM_IL)
        return matmul_q8_interleaved(fmt, w, out_features, in, x, stride_x, rows, y, stride_y, bias);
#else
        return -1;
#endif
    }
    if (act_q8) {
        if (!packed) return -1;
        return matmul_q8_act(fmt, w, row_bytes, out_features, in, x, stride_x, rows, y, stride_y, bias);
    }
#if defined(QM_AVX2)
    int gemm = rows >= GEMM_MIN_ROWS;
#if defined(QM_AVX512)
    if (packed && rows <= (fmt == Q8_0 ? PZ_MAX_ROWS_Q8 : PZ_MAX_ROWS))
        return matmul_packed_pz(fmt, w, row_bytes, out_features, in, x, stride_x, rows, y, stride_y, bias);
    gemm |= packed; /* the same sums either way here: the faster one */
#endif
    if (gemm) {
        GemmJob job = {fmt, packed, w, row_bytes, out_features, in, x, stride_x, rows, y, stride_y, bias, 0};
        spin_pool_run(gemm_part, &job, parts_for(out_features * rows * in));
        return job.failed ? -2 : 0;
    }
    if (packed) return matmul_packed_f32(fmt, w, row_bytes, out_features, in, x, stride_x, rows, y, stride_y, bias);
#endif
    if (in > MAX_ROW) return -1;
    F32Job job = {fmt, packed, w, row_bytes, out_features, in, x, stride_x, rows, y, stride_y, bias};
    spin_pool_run(f32_part, &job, parts_for(out_features * rows * in));
    return 0;
}

/* Whether the 8-bit path multiplies with VNNI (2), AVX2 (1) or plain C (0): for logs. */
int quant_simd_level(void) {
#if defined(QM_VNNI)
    return 2;
#elif defined(QM_AVX2)
    return 1;
#else
    return 0;
#endif
}
