/* Elementwise parts of a decoder layer, float32, CPU: RMSNorm (with the residual add that
 * precedes it), SiLU(gate) * up, and rotary embedding. Each replaces several torch ops whose
 * per-call cost, at decode sizes (tens of rows), is mostly dispatch and thread wake-ups.
 * Work is spread over the spinning pool of spin_pool.h (as the matmuls beside them are, so a
 * step never has two pools of threads spinning on the same cores) only when there is enough
 * of it to pay for the hand-off.
 */
#include <math.h>
#include <stdint.h>

#include "common.h"
#include "spin_pool.h"

/* Below this many floats a call stays on the calling thread (waking the pool costs more). */
#define PARALLEL_MIN_ELEMENTS 32768

typedef struct {
    const float *x, *residual, *weight;
    int64_t stride_x, stride_r;
    float *out, *h_out;
    int64_t rows, hidden;
    float eps;
} RmsJob;

/* Rows [begin, end) of the part: an equal share of n. */
#define PART_RANGE(n, part, parts, begin, end)                                                     \
    const int64_t begin = (n) * (part) / (parts), end = (n) * ((part) + 1) / (parts)

static void rms_part(void *p, int part, int parts) {
    const RmsJob *j = p;
    const int64_t hidden = j->hidden;
    PART_RANGE(j->rows, part, parts, r_begin, r_end);
    for (int64_t r = r_begin; r < r_end; r++) {
        const float *xr = j->x + r * j->stride_x;
        float *o = j->out + r * hidden;
        const float *h = xr;
        if (j->residual) {
            float *hr = j->h_out + r * hidden;
            const float *rr = j->residual + r * j->stride_r;
#pragma omp simd
            for (int64_t i = 0; i < hidden; i++) hr[i] = xr[i] + rr[i];
            h = hr;
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < hidden; i++) sum += h[i] * h[i];
        const float inv = 1.0f / sqrtf(sum / (float)hidden + j->eps);
        const float *w = j->weight;
#pragma omp simd
        for (int64_t i = 0; i < hidden; i++) o[i] = h[i] * inv * w[i];
    }
}

static int parts_for(int64_t elements) {
    return elements >= PARALLEL_MIN_ELEMENTS ? spin_pool_threads() : 1;
}

/* h = x + residual (when residual is not NULL, else h = x); out = h * rsqrt(mean(h^2) + eps) * w.
 * h_out may be NULL when residual is NULL. */
void add_rms_norm_f32(const float *x, int64_t stride_x, const float *residual, int64_t stride_r,
                      const float *weight, float *out, float *h_out, int64_t rows, int64_t hidden, float eps) {
    RmsJob job = {x, residual, weight, stride_x, stride_r, out, h_out, rows, hidden, eps};
    spin_pool_run(rms_part, &job, parts_for(rows * hidden));
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

typedef struct {
    const float *gate_up;
    int64_t stride;
    float *out;
    int64_t rows, inter;
} SiluJob;

static void silu_part(void *p, int part, int parts) {
    const SiluJob *j = p;
    const int64_t inter = j->inter;
    PART_RANGE(j->rows, part, parts, r_begin, r_end);
    for (int64_t r = r_begin; r < r_end; r++) {
        const float *g = j->gate_up + r * j->stride;
        const float *u = g + inter;
        float *o = j->out + r * inter;
#pragma omp simd
        for (int64_t i = 0; i < inter; i++) {
            const float gi = g[i];
            const float e = exp_nonpositive(-abs_capped(gi)); /* exp(-|g|): never overflows */
            const float positive = (float)(gi > 0.0f);     /* no float select: keeps the loop vectorized */
            o[i] = gi * (e + (1.0f - e) * positive) / (1.0f + e) * u[i]; /* sigmoid(g) = 1/(1+e) or e/(1+e) */
        }
    }
}

/* out[r] = silu(gate_up[r, :inter]) * gate_up[r, inter:], silu(g) = g / (1 + exp(-g)).
 * As in torch, silu(+inf) = inf and silu(-inf) = silu(NaN) = NaN (g carries them through). */
void silu_mul_f32(const float *gate_up, int64_t stride, float *out, int64_t rows, int64_t inter) {
    SiluJob job = {gate_up, stride, out, rows, inter};
    spin_pool_run(silu_part, &job, parts_for(rows * inter));
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

typedef struct {
    const float *q, *k, *qkv;
    int64_t stride_qt, stride_qh, stride_kt, stride_kh, stride_t;
    const int64_t *positions;
    int64_t max_pos;
    const int64_t *slots;
    const float *cos_sin;
    float *q_out, *k_out;
    void *k_buffer, *v_buffer; /* the pool, in format kv_fmt */
    int64_t tokens, head_dim;
    int num_q_heads, num_kv_heads;
    int kv_fmt;                /* KV_F32, KV_INT8 or KV_FP8_E4M3 (common.h) */
    float *k_scale, *v_scale;  /* [S, Hkv] for the 8-bit formats */
} RotaryJob;

/* rotary_f32's tokens of the part; a token whose position is out of range is left as it was. */
static void rotary_part(void *p, int part, int parts) {
    const RotaryJob *j = p;
    const int64_t head_dim = j->head_dim, half = head_dim / 2;
    PART_RANGE(j->tokens, part, parts, t_begin, t_end);
    for (int64_t t = t_begin; t < t_end; t++) {
        const int64_t pos = j->positions[t];
        if (pos < 0 || pos >= j->max_pos) continue;
        const float *cos = j->cos_sin + pos * head_dim, *sin = cos + half;
        for (int h = 0; h < j->num_q_heads; h++)
            rotate(j->q + t * j->stride_qt + h * j->stride_qh, j->q_out + (t * j->num_q_heads + h) * head_dim,
                   cos, sin, half);
        for (int h = 0; h < j->num_kv_heads; h++)
            rotate(j->k + t * j->stride_kt + h * j->stride_kh, j->k_out + (t * j->num_kv_heads + h) * head_dim,
                   cos, sin, half);
    }
}

/* q_out [N, Hq, D] and k_out [N, Hkv, D] (contiguous) from q, k (any token/head strides, unit
 * last stride) at positions [N]; cos_sin [max_pos, D] = cat(cos, sin). Returns 1 when a
 * position lies outside [0, max_pos) (those tokens' outputs are left as they were). */
int rotary_f32(const float *q, int64_t stride_qt, int64_t stride_qh, const float *k, int64_t stride_kt,
               int64_t stride_kh, const int64_t *positions, const float *cos_sin, int64_t max_pos,
               float *q_out, float *k_out, int64_t tokens, int num_q_heads, int num_kv_heads, int64_t head_dim) {
    int bad = 0;
    for (int64_t t = 0; t < tokens; t++) bad |= positions[t] < 0 || positions[t] >= max_pos;
    RotaryJob job = {q, k, NULL, stride_qt, stride_qh, stride_kt, stride_kh, 0, positions, max_pos, NULL,
                     cos_sin, q_out, k_out, NULL, NULL, tokens, head_dim, num_q_heads, num_kv_heads,
                     KV_F32, NULL, NULL};
    spin_pool_run(rotary_part, &job, parts_for(tokens * (num_q_heads + num_kv_heads) * head_dim));
    return bad;
}

/* rotary_store_f32's tokens of the part. */
static void rotary_store_part(void *p, int part, int parts) {
    const RotaryJob *j = p;
    const int64_t head_dim = j->head_dim, half = head_dim / 2, kv_row = (int64_t)j->num_kv_heads * head_dim;
    float rotated[head_dim]; /* an 8-bit pool's k head before it is quantized */
    PART_RANGE(j->tokens, part, parts, t_begin, t_end);
    for (int64_t t = t_begin; t < t_end; t++) {
        const float *cos = j->cos_sin + j->positions[t] * head_dim, *sin = cos + half;
        const float *q = j->qkv + t * j->stride_t, *k = q + (int64_t)j->num_q_heads * head_dim, *v = k + kv_row;
        for (int h = 0; h < j->num_q_heads; h++)
            rotate(q + h * head_dim, j->q_out + (t * j->num_q_heads + h) * head_dim, cos, sin, half);
        if (j->kv_fmt == KV_F32) {
            float *k_dst = (float *)j->k_buffer + j->slots[t] * kv_row, *v_dst = (float *)j->v_buffer + j->slots[t] * kv_row;
            for (int h = 0; h < j->num_kv_heads; h++) rotate(k + h * head_dim, k_dst + h * head_dim, cos, sin, half);
            memcpy(v_dst, v, sizeof(float) * (size_t)kv_row);
            continue;
        }
        uint8_t *k_dst = (uint8_t *)j->k_buffer + j->slots[t] * kv_row, *v_dst = (uint8_t *)j->v_buffer + j->slots[t] * kv_row;
        float *k_scale = j->k_scale + j->slots[t] * j->num_kv_heads, *v_scale = j->v_scale + j->slots[t] * j->num_kv_heads;
        for (int h = 0; h < j->num_kv_heads; h++) {
            rotate(k + h * head_dim, rotated, cos, sin, half);
            quantize_kv_row(rotated, head_dim, j->kv_fmt, k_dst + h * head_dim, k_scale + h);
            quantize_kv_row(v + h * head_dim, head_dim, j->kv_fmt, v_dst + h * head_dim, v_scale + h);
        }
    }
}

/* The step after the qkv projection, for tokens t < N: q_out[t] = rotary(q_t) [Hq, D]
 * (contiguous), and into the KV pool k_buffer[slots[t]] = rotary(k_t), v_buffer[slots[t]] = v_t
 * ([S, Hkv, D], contiguous), in the pool's format kv_fmt (common.h): float32, or 8 bits with
 * each head's scale into k_scale / v_scale [S, Hkv]. qkv rows [N, (Hq + 2 Hkv) D] are q | k | v
 * with row stride stride_t. Every position and slot is checked before anything is written:
 * returns 1 when a position lies outside [0, max_pos), 2 when a slot lies outside
 * [0, num_slots). */
int rotary_store_f32(const float *qkv, int64_t stride_t, const int64_t *positions, const float *cos_sin,
                     int64_t max_pos, const int64_t *slots, void *k_buffer, void *v_buffer, int kv_fmt,
                     float *k_scale, float *v_scale, int64_t num_slots, float *q_out, int64_t tokens,
                     int num_q_heads, int num_kv_heads, int64_t head_dim) {
    for (int64_t t = 0; t < tokens; t++) {
        if (positions[t] < 0 || positions[t] >= max_pos) return 1;
        if (slots[t] < 0 || slots[t] >= num_slots) return 2;
    }
    RotaryJob job = {NULL, NULL, qkv, 0, 0, 0, 0, stride_t, positions, max_pos, slots, cos_sin,
                     q_out, NULL, k_buffer, v_buffer, tokens, head_dim, num_q_heads, num_kv_heads,
                     kv_fmt, k_scale, v_scale};
    spin_pool_run(rotary_store_part, &job, parts_for(tokens * (num_q_heads + 2 * num_kv_heads) * head_dim));
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
