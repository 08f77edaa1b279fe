/* Elementwise parts of a decoder layer, float32, CPU: RMSNorm (with the residual add that
 * precedes it), SiLU(gate) * up, and rotary embedding. Each replaces several torch ops whose
 * per-call cost, at decode sizes (tens of rows), is mostly dispatch and thread wake-ups.
 * Work is spread over OpenMP threads only when there is enough of it to pay for waking them.
 */
#include <math.h>
#include <stdint.h>

#include "common.h"

/* Below this many floats a call stays on the calling thread (waking the pool costs more). */
#define PARALLEL_MIN_ELEMENTS 32768

/* h = x + residual (when residual is not NULL, else h = x); out = h * rsqrt(mean(h^2) + eps) * w.
 * h_out may be NULL when residual is NULL. */
void add_rms_norm_f32(const float *x, int64_t stride_x, const float *residual, int64_t stride_r,
                      const float *weight, float *out, float *h_out, int64_t rows, int64_t hidden, float eps) {
#pragma omp parallel for schedule(static) if (rows * hidden >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * stride_x;
        float *o = out + r * hidden;
        const float *h = xr;
        if (residual) {
            float *hr = h_out + r * hidden;
            const float *rr = residual + r * stride_r;
#pragma omp simd
            for (int64_t i = 0; i < hidden; i++) hr[i] = xr[i] + rr[i];
            h = hr;
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < hidden; i++) sum += h[i] * h[i];
        const float inv = 1.0f / sqrtf(sum / (float)hidden + eps);
#pragma omp simd
        for (int64_t i = 0; i < hidden; i++) o[i] = h[i] * inv * weight[i];
    }
}

/* |x| capped at 88 (exp(-88) is below the smallest normal float, so exp_nonpositive gives 0);
 * inf and NaN come out as 88 too. Integer select only, so the loop stays vectorized. */
static inline float abs_capped(float x) {
    const int32_t cap_bits = 0x42b00000; /* 88.0f */
    int32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits &= 0x7fffffff;
    bits = bits < cap_bits ? bits : cap_bits;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* out[r] = silu(gate_up[r, :inter]) * gate_up[r, inter:], silu(g) = g / (1 + exp(-g)).
 * As in torch, silu(+inf) = inf and silu(-inf) = silu(NaN) = NaN (g carries them through). */
void silu_mul_f32(const float *gate_up, int64_t stride, float *out, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= PARALLEL_MIN_ELEMENTS)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * stride;
        const float *u = g + inter;
        float *o = out + r * inter;
#pragma omp simd
        for (int64_t i = 0; i < inter; i++) {
            const float gi = g[i];
            const float e = exp_nonpositive(-abs_capped(gi)); /* exp(-|g|): never overflows */
            const float positive = (float)(gi > 0.0f);     /* no float select: keeps the loop vectorized */
            o[i] = gi * (e + (1.0f - e) * positive) / (1.0f + e) * u[i]; /* sigmoid(g) = 1/(1+e) or e/(1+e) */
        }
    }
}

/* Rotate-half (NeoX) rotary of one head vector x [D] into y with cos/sin rows [D/2]. */
static inline void rotate(const float *x, float *y, const float *cos, const float *sin, int64_t half) {
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        const float x1 = x[i], x2 = x[i + half];
        y[i] = x1 * cos[i] - x2 * sin[i];
        y[i + half] = x2 * cos[i] + x1 * sin[i];
    }
}

/* q_out [N, Hq, D] and k_out [N, Hkv, D] (contiguous) from q, k (any token/head strides, unit
 * last stride) at positions [N]; cos_sin [max_pos, D] = cat(cos, sin). Returns 1 when a
 * position lies outside [0, max_pos). */
int rotary_f32(const float *q, int64_t stride_qt, int64_t stride_qh, const float *k, int64_t stride_kt,
               int64_t stride_kh, const int64_t *positions, const float *cos_sin, int64_t max_pos,
               float *q_out, float *k_out, int64_t tokens, int num_q_heads, int num_kv_heads, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    int bad = 0;
#pragma omp parallel for schedule(static) if (tokens * (num_q_heads + num_kv_heads) * head_dim >= PARALLEL_MIN_ELEMENTS) reduction(| : bad)
    for (int64_t t = 0; t < tokens; t++) {
        const int64_t pos = positions[t];
        if (pos < 0 || pos >= max_pos) {
            bad = 1;
            continue;
        }
        const float *cos = cos_sin + pos * head_dim, *sin = cos + half;
        for (int h = 0; h < num_q_heads; h++)
            rotate(q + t * stride_qt + h * stride_qh, q_out + (t * num_q_heads + h) * head_dim, cos, sin, half);
        for (int h = 0; h < num_kv_heads; h++)
            rotate(k + t * stride_kt + h * stride_kh, k_out + (t * num_kv_heads + h) * head_dim, cos, sin, half);
    }
    return bad;
}

/* The step after the qkv projection, for tokens t < N: q_out[t] = rotary(q_t) [Hq, D]
 * (contiguous), and into the KV pool k_buffer[slots[t]] = rotary(k_t), v_buffer[slots[t]] = v_t
 * ([S, Hkv, D], contiguous). qkv rows [N, (Hq + 2 Hkv) D] are q | k | v with row stride
 * stride_t. Every position and slot is checked before anything is written: returns 1 when a
 * position lies outside [0, max_pos), 2 when a slot lies outside [0, num_slots). */
int rotary_store_f32(const float *qkv, int64_t stride_t, const int64_t *positions, const float *cos_sin,
                     int64_t max_pos, const int64_t *slots, float *k_buffer, float *v_buffer, int64_t num_slots,
                     float *q_out, int64_t tokens, int num_q_heads, int num_kv_heads, int64_t head_dim) {
    for (int64_t t = 0; t < tokens; t++) {
        if (positions[t] < 0 || positions[t] >= max_pos) return 1;
        if (slots[t] < 0 || slots[t] >= num_slots) return 2;
    }
    const int64_t half = head_dim / 2, kv_row = (int64_t)num_kv_heads * head_dim;
#pragma omp parallel for schedule(static) if (tokens * (num_q_heads + 2 * num_kv_heads) * head_dim >= PARALLEL_MIN_ELEMENTS)
    for (int64_t t = 0; t < tokens; t++) {
        const float *cos = cos_sin + positions[t] * head_dim, *sin = cos + half;
        const float *q = qkv + t * stride_t, *k = q + (int64_t)num_q_heads * head_dim, *v = k + kv_row;
        float *k_dst = k_buffer + slots[t] * kv_row, *v_dst = v_buffer + slots[t] * kv_row;
        for (int h = 0; h < num_q_heads; h++)
            rotate(q + h * head_dim, q_out + (t * num_q_heads + h) * head_dim, cos, sin, half);
        for (int h = 0; h < num_kv_heads; h++) rotate(k + h * head_dim, k_dst + h * head_dim, cos, sin, half);
        memcpy(v_dst, v, sizeof(float) * (size_t)kv_row);
    }
    return 0;
}

/* Grammar masks (bitmask.py): for each listed row, logits[row, t] = -inf for every token t whose
 * bit in that row's bitmask words is 0, and for every t >= 32 * num_words. In place; rows are
 * distinct. All-ones words are skipped, all-zero words written whole. */
void apply_token_bitmask_f32(float *logits, int64_t stride_l, const int32_t *bitmask, int64_t stride_b,
                             const int64_t *rows, int64_t num_rows, int64_t vocab, int64_t num_words) {
    const float neg = -__builtin_inff();
    for (int64_t i = 0; i < num_rows; i++) {
        float *row = logits + rows[i] * stride_l;
        const uint32_t *words = (const uint32_t *)(bitmask + rows[i] * stride_b);
        int64_t covered = 32 * num_words < vocab ? 32 * num_words : vocab;
        for (int64_t w = 0; 32 * w < covered; w++) {
            uint32_t bits = words[w];
            if (bits == 0xffffffffu) continue;
            int64_t base = 32 * w, end = base + 32 < covered ? base + 32 : covered;
            if (bits == 0) {
                for (int64_t t = base; t < end; t++) row[t] = neg;
                continue;
            }
            for (int64_t t = base; t < end; t++)
                if (!((bits >> (t - base)) & 1)) row[t] = neg;
        }
        for (int64_t t = covered; t < vocab; t++) row[t] = neg;
    }
}
