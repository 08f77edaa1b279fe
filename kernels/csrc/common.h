/* Helpers shared by the CPU kernels in this folder. */
#ifndef RADIXGEN_CSRC_COMMON_H
#define RADIXGEN_CSRC_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) for x <= 0 (scores minus their max, or -|g|) in a form the compiler vectorizes
 * without fast-math flags (only integer selects): 2^(x log2 e) split into an integer power k,
 * built in the exponent bits, and 2^f, |f| <= 1/2, by Cephes' exp2f polynomial. Relative error
 * ~1e-6 for x >= -20 (measured against double exp); results below 2^-126 flush to 0; NaN and
 * -inf give NaN (neither occurs in these kernels unless the model already overflowed). */
static inline float exp_nonpositive(float x) {
    const float t = x * 1.44269504088896341f;
    const int32_t k0 = (int32_t)(t - 0.5f); /* round to nearest for t <= 0 */
    const int32_t keep = -(int32_t)(k0 >= -126); /* all ones while 2^k is a normal float */
    const int32_t k = k0 >= -126 ? k0 : -126;
    const float f = t - (float)k;
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    const int32_t scale_bits = (k + 127) << 23;
    float scale, r;
    int32_t r_bits;
    memcpy(&scale, &scale_bits, sizeof scale);
    r = p * scale;
    memcpy(&r_bits, &r, sizeof r);
    r_bits &= keep;
    memcpy(&r, &r_bits, sizeof r);
    return r + (x - x); /* x - x is 0, or NaN for NaN/inf input */
}

/* exp_nonpositive's polynomial for 2^f, |f| <= 1/2, with a vector type's multiply-add and
 * broadcast (Horner's order, the scalar loop's) */
#define EXP2_POLY(fmadd, set1, f)                                                                  \
    fmadd(fmadd(fmadd(fmadd(fmadd(fmadd(set1(1.535336188319500e-4f), f, set1(1.339887440266574e-3f)), f, \
                                  set1(9.618437357674640e-3f)),                                    \
                            f, set1(5.550332471162809e-2f)),                                       \
                      f, set1(2.402264791363012e-1f)),                                             \
                f, set1(6.931472028550421e-1f)),                                                   \
          f, set1(1.0f))

#if defined(__AVX512F__)
#include <immintrin.h>
/* exp_nonpositive's polynomial on 16 lanes with AVX-512, where -inf gives 0 (masked scores):
 * 2^(x log2 e) as 2^k * 2^f, f in [-0.5, 0.5], 2^k by scalef (down to 0 below 2^-149). */
static inline __m512 exp_nonpositive16(__m512 x) {
    const __m512 t = _mm512_max_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _mm512_set1_ps(-150.0f));
    const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, k);
    const __m512 p = EXP2_POLY(_mm512_fmadd_ps, _mm512_set1_ps, f);
    return _mm512_scalef_ps(p, k); /* p * 2^k; underflows to 0 below 2^-149 */
}

/* The lane sums of v[0..15] as one vector (lane t: the sum of v[t]): halving rounds that each
 * add two vectors' halves side by side, 46 operations for the 16 where 16 reductions take ~130.
 * Each sum pairs its lanes as reduce_add16 does (t + 8, then t + 4, t + 2, t + 1), so a value
 * reduced either way has the same bits. */
static inline __m512 reduce16_ps(const __m512 v[16]) {
    __m512 r1[8], r2[4], r3[2];
    for (int i = 0; i < 8; i++) /* lanes 0-7: v[i]'s 8 partial sums, 8-15: v[i + 8]'s */
        r1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xee));
    for (int i = 0; i < 4; i++) /* quarters: 4 partials of v[i], v[i + 8], v[i + 4], v[i + 12] */
        r2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r1[i], r1[i + 4], 0x88), _mm512_shuffle_f32x4(r1[i], r1[i + 4], 0xdd));
    for (int i = 0; i < 2; i++) /* each quarter: 2 partials of r2[i]'s vector, 2 of r2[i + 2]'s */
        r3[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(r2[i]), _mm512_castps_pd(r2[i + 2]))),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(r2[i]), _mm512_castps_pd(r2[i + 2]))));
    const __m512 r4 = _mm512_add_ps(_mm512_shuffle_ps(r3[0], r3[1], 0x88), _mm512_shuffle_ps(r3[0], r3[1], 0xdd));
    /* r4 holds v 0 2 1 3 | 8 10 9 11 | 4 6 5 7 | 12 14 13 15: put them in order */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15), r4);
}

/* The sum of v's lanes, paired as reduce16_ps pairs them (GCC's _mm512_reduce_add_ps does the
 * same, but another compiler's need not): kernels that must give a value the same bits however
 * they batch it reduce with these two. */
static inline float reduce_add16(__m512 v) {
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 h8 = _mm256_add_ps(lo, hi); /* t + (t + 8) */
    const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}
#endif

/* The KV pool's storage (kv_quant.py): float32, or 8 bits with one float32 scale per token and
 * KV head. A stored value reads back as q * scale. */
enum { KV_F32 = 0, KV_INT8 = 1, KV_FP8_E4M3 = 2 };

/* float8 e4m3fn bits -> float, exactly, in integer ops a loop vectorizes: the low 7 bits go to
 * the top of a float's exponent and mantissa, which reads as 2^-120 times the e4m3 value (a
 * float32 denormal for e4m3's subnormals), and the product by 2^120 is exact. The NaN bits
 * 0x7f / 0xff read as 480; the writers never store them (they saturate at 448). */
static inline float fp8_e4m3_to_float(uint8_t b) {
    const uint32_t bits = ((uint32_t)(b & 0x80) << 24) | ((uint32_t)(b & 0x7f) << 20);
    float v;
    memcpy(&v, &bits, sizeof v);
    return v * 0x1p120f;
}

/* The widest float vector of the build, for kernels written once for both widths: VF_WIDTH lanes
 * of `vf` with AVX-512 (16) or AVX2 + FMA (8); VF_ACCUMULATORS of them can stay in registers
 * beside a few temporaries. Undefined without either (the kernels' plain loops run). */
#if defined(__AVX512F__)
#define VF_WIDTH 16
#define VF_ACCUMULATORS 24
typedef __m512 vf;
#define vf_load _mm512_loadu_ps
#define vf_store _mm512_storeu_ps
#define vf_set1 _mm512_set1_ps
#define vf_zero _mm512_setzero_ps
#define vf_mul _mm512_mul_ps
#define vf_fmadd _mm512_fmadd_ps
#define vf_max _mm512_max_ps
#define vf_add _mm512_add_ps
#define vf_sub _mm512_sub_ps
#define vf_lane_sums reduce16_ps
#define vf_exp_nonpositive exp_nonpositive16
typedef __m512i vi; /* VF_WIDTH int32 lanes */
#define vi_load(p) _mm512_loadu_si512((const void *)(p))
#define vi_set1 _mm512_set1_epi32
/* a's lanes where key < limit, other's elsewhere */
static inline __attribute__((always_inline)) vf vf_where_lt(vi key, vi limit, vf a, vf other) {
    return _mm512_mask_mov_ps(other, _mm512_cmplt_epi32_mask(key, limit), a);
}
/* v with its -inf lanes made 0 */
static inline __attribute__((always_inline)) vf vf_neg_inf_to_zero(vf v) {
    return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), _mm512_setzero_ps());
}
/* dst[0..n) = v's first n lanes, 0 < n <= 16 */
static inline __attribute__((always_inline)) void vf_store_first(float *dst, vf v, int n) {
    _mm512_mask_storeu_ps(dst, (__mmask16)((1u << n) - 1), v);
}
/* 16 values of an 8-bit pool (KV_INT8 or KV_FP8_E4M3) from byte offset `at`, as floats before
 * their scale: the values a cast of the int8, or fp8_e4m3_to_float, gives. */
static inline __attribute__((always_inline)) vf vf_load_8bit(const void *buffer, const int fmt, int64_t at) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)((const uint8_t *)buffer + at));
    if (fmt == KV_INT8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
    const __m512i x = _mm512_cvtepu8_epi32(bytes);
    const __m512i bits = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x80)), 24),
                                         _mm512_slli_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0x7f)), 20));
    return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(0x1p120f));
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VF_WIDTH 8
#define VF_ACCUMULATORS 12
typedef __m256 vf;
#define vf_load _mm256_loadu_ps
#define vf_store _mm256_storeu_ps
#define vf_set1 _mm256_set1_ps
#define vf_zero _mm256_setzero_ps
#define vf_mul _mm256_mul_ps
#define vf_fmadd _mm256_fmadd_ps
#define vf_max _mm256_max_ps
#define vf_add _mm256_add_ps
#define vf_sub _mm256_sub_ps
typedef __m256i vi; /* VF_WIDTH int32 lanes */
#define vi_load(p) _mm256_loadu_si256((const __m256i *)(p))
#define vi_set1 _mm256_set1_epi32
static inline __attribute__((always_inline)) vf vf_where_lt(vi key, vi limit, vf a, vf other) {
    return _mm256_blendv_ps(other, a, _mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, key)));
}
static inline __attribute__((always_inline)) vf vf_neg_inf_to_zero(vf v) {
    return _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(v, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
}
/* exp_nonpositive16's polynomial on 8 lanes, -inf giving 0; 2^k built in the exponent bits, so
 * results below 2^-126 flush to 0 (AVX-512's scalef keeps them down to 2^-149). */
static inline vf vf_exp_nonpositive(vf x) {
    const __m256 t = _mm256_max_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(-150.0f));
    const __m256 k = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(t, k);
    const __m256 p = EXP2_POLY(_mm256_fmadd_ps, _mm256_set1_ps, f);
    const __m256i ki = _mm256_cvtps_epi32(k);
    const __m256i normal = _mm256_cmpgt_epi32(ki, _mm256_set1_epi32(-127)); /* 2^k a normal float */
    const __m256i bits = _mm256_and_si256(_mm256_slli_epi32(_mm256_add_epi32(ki, _mm256_set1_epi32(127)), 23), normal);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
/* The lane sums of v[0..7] as one vector (lane t: the sum of v[t]): two rounds of pairwise
 * horizontal adds within 128-bit halves, then the halves added. */
static inline __m256 vf_lane_sums(const __m256 v[8]) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    /* a: lanes 0-3 v[0..3]'s low-half sums, 4-7 their high-half sums; b the same for v[4..7] */
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
/* dst[0..n) = v's first n lanes, 0 < n <= 8 */
static inline __attribute__((always_inline)) void vf_store_first(float *dst, vf v, int n) {
    if (n == 8) {
        _mm256_storeu_ps(dst, v);
        return;
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    memcpy(dst, lanes, sizeof(float) * (size_t)n);
}
/* 8 values of an 8-bit pool from byte offset `at`, as floats before their scale (as above). */
static inline __attribute__((always_inline)) vf vf_load_8bit(const void *buffer, const int fmt, int64_t at) {
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)((const uint8_t *)buffer + at));
    if (fmt == KV_INT8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    const __m256i x = _mm256_cvtepu8_epi32(bytes);
    const __m256i bits = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24),
                                         _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7f)), 20));
    return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0x1p120f));
}
#endif

/* n rows of an 8-bit pool's KV head h (slots[0..n)) as floats, each times its scale:
 * out[t * out_stride + d] = value(slots[t], h, d) * scale[slots[t], h]. VF_WIDTH values at a
 * time where head_dim is a multiple of it (the same values). */
static inline __attribute__((always_inline)) void dequantize_rows(
        const void *buffer, const float *scale, const int fmt, const int64_t *slots, int64_t n, int h,
        int num_kv_heads, const int head_dim, float *out, int64_t out_stride) {
    const int64_t row_stride = (int64_t)num_kv_heads * head_dim;
    for (int64_t t = 0; t < n; t++) {
        const int64_t at = slots[t] * row_stride + (int64_t)h * head_dim;
        const float s = scale[slots[t] * num_kv_heads + h];
        float *o = out + t * out_stride;
#if defined(VF_WIDTH)
        if (head_dim % VF_WIDTH == 0) {
            for (int d = 0; d < head_dim; d += VF_WIDTH)
                vf_store(o + d, vf_mul(vf_load_8bit(buffer, fmt, at + d), vf_set1(s)));
            continue;
        }
#endif
        if (fmt == KV_INT8) {
            const int8_t *q = (const int8_t *)buffer + at;
#pragma omp simd
            for (int d = 0; d < head_dim; d++) o[d] = (float)q[d] * s;
        } else {
            const uint8_t *q = (const uint8_t *)buffer + at;
#pragma omp simd
            for (int d = 0; d < head_dim; d++) o[d] = fp8_e4m3_to_float(q[d]) * s;
        }
    }
}

/* float (|y| <= 448, not NaN) -> float8 e4m3fn bits, rounded to nearest, ties to even, as
 * torch's conversion does. */
static inline uint8_t float_to_fp8_e4m3(float y) {
    uint32_t bits;
    memcpy(&bits, &y, sizeof bits);
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
    bits &= 0x7fffffffu;
    float a;
    memcpy(&a, &bits, sizeof a);
    if (a < 0.015625f) /* below 2^-6: a subnormal, m * 2^-9 (m = 8 is the smallest normal) */
        return sign | (uint8_t)(int)__builtin_nearbyintf(a * 512.0f);
    bits = (bits + 0x7ffffu + ((bits >> 20) & 1)) >> 20; /* 3 mantissa bits, ties to even */
    return sign | (uint8_t)(bits - (120u << 3));          /* rebias the exponent: 127 -> 7 */
}

/* One row of n floats into the pool as 8 bits (fmt KV_INT8 or KV_FP8_E4M3), its scale amax / qmax
 * into *scale; the same values as kv_quant.quantize_kv. */
static inline void quantize_kv_row(const float *x, int64_t n, int fmt, void *dst, float *scale) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float a = x[i] < 0 ? -x[i] : x[i];
        amax = a > amax ? a : amax;
    }
    const float s = amax / (fmt == KV_INT8 ? 127.0f : 448.0f), div = s > 0 ? s : 1.0f;
    *scale = s;
    if (fmt == KV_INT8) {
        int8_t *q = dst;
        for (int64_t i = 0; i < n; i++) {
            float y = __builtin_nearbyintf(x[i] / div);
            q[i] = (int8_t)(y > 127.0f ? 127.0f : y < -127.0f ? -127.0f : y);
        }
    } else {
        uint8_t *q = dst;
        for (int64_t i = 0; i < n; i++) {
            const float y = x[i] / div;
            q[i] = float_to_fp8_e4m3(y > 448.0f ? 448.0f : y < -448.0f ? -448.0f : y);
        }
    }
}

#endif
