/* Decode attention over the token pool, float32, one query token per request (CPU).
 *
 * Reads each request's keys straight from the pool through its req_to_token row: no gather,
 * no padding, no per-request calls from Python. One task per request computes all its query
 * heads in two passes over the keys, each in blocks of KEY_BLOCK keys: a block comes from
 * memory once and stays in L1 while every query head reads it, so each head's dot products
 * and output row stay in registers (1.3-1.4x over visiting all heads per key, min of 5, one
 * thread, 200-4,000 keys):
 *
 *   scores[j][t] = sm_scale * <q_j, k_t[j / G]>        pass 1 reads K once (G = Hq / Hkv, GQA)
 *   p = exp(scores - max_t), l = sum_t p              per query head j
 *   out_j = sum_t p[j][t] * v_t[j / G] / l_j           pass 2 reads V once
 *
 * A request with more than KEY_CHUNK keys is split into chunks of that many, attended
 * separately and merged by their log-sum-exps (flash-decoding), so one long request uses every
 * thread. Tasks are spread over the spinning pool of spin_pool.h (torch's thread count) when
 * there are enough keys (PARALLEL_MIN_KEYS), taken one at a time from a shared counter. Not
 * OpenMP: the matmuls of the same step run on that pool, and an OpenMP worker spinning after
 * its region kept one of them off a core (on 2 CPUs, a batch-32 step lost ~20 % that way).
 */
#include <math.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common.h"
#include "spin_pool.h"

static inline float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Below this many keys in all a call stays on the calling thread. (On torch's OpenMP pool the
 * threshold was 1,024: waking it cost ~100 us per call; the spinning pool hands off in a few.) */
#define PARALLEL_MIN_KEYS 256

/* A request with more keys than this is split into chunks of this many (see decode_attention_f32). */
#define KEY_CHUNK 128

/* Keys are visited in blocks that stay in L1 while every query head of their KV head reads them. */
#define KEY_BLOCK 32
/* values_group_vf prefetches the value row this many bytes of one head's rows ahead (16 keys of a
 * float32 pool at head_dim 64, 64 keys of an 8-bit one). 30 layers of 32 requests x 200-600
 * keys in runs of slots: float 19.5 -> 17.7 ms, int8 10.9 -> 9.5 ms against 8 keys ahead. */
#define VALUE_PREFETCH_BYTES 4096

/* Every cache line of the n bytes at p (which need not start a line). */
static inline __attribute__((always_inline)) void prefetch_bytes(const uint8_t *p, int n) {
    for (int b = 0; b < n; b += 64) __builtin_prefetch(p + b, 0, 3);
    __builtin_prefetch(p + n - 1, 0, 3);
}

#if defined(VF_WIDTH) /* common.h: AVX-512 (16 lanes) or AVX2 + FMA (8) */
/* dst[u] = scale * <qj, row u> for the n <= VF_WIDTH rows base + idx[u] * stride (idx NULL: base +
 * u * stride): VF_WIDTH dot products accumulate in as many vectors and reduce together
 * (vf_lane_sums). */
static inline __attribute__((always_inline)) void dots_vf(
        const float *qj, const float *base, const int64_t *idx, int64_t stride, int n, const int chunks,
        vf scale, float *dst) {
    vf acc[VF_WIDTH];
#pragma GCC unroll 16
    for (int u = 0; u < VF_WIDTH; u++) { /* past the last row: row 0 again, not stored */
        const int r = u < n ? u : 0;
        const float *kr = base + (idx ? idx[r] : r) * stride;
        acc[u] = vf_mul(vf_load(qj), vf_load(kr));
        for (int c = 1; c < chunks; c++)
            acc[u] = vf_fmadd(vf_load(qj + VF_WIDTH * c), vf_load(kr + VF_WIDTH * c), acc[u]);
    }
    vf_store_first(dst, vf_mul(scale, vf_lane_sums(acc)), n);
}

/* scores_pass for a float32 pool, head_dim a multiple of VF_WIDTH: VF_WIDTH keys' dot products
 * with one query head at a time (dots_vf), the key rows read straight from the pool. 32 requests
 * x 200 keys, 9 query heads of 64 over 3 KV heads, a layer, AVX-512: 272 -> 239 us (and 239 ->
 * 151 with values_group_vf). */
static inline __attribute__((always_inline)) void scores_pass_f32_vf(
        const float *qb, const float *k_buffer, const int64_t *slots, int64_t len, int num_q_heads,
        int num_kv_heads, const int head_dim, float sm_scale, float *scores) {
    const int group = num_q_heads / num_kv_heads, chunks = head_dim / VF_WIDTH;
    const int64_t row_stride = (int64_t)num_kv_heads * head_dim;
    const vf scale = vf_set1(sm_scale);
    for (int64_t t0 = 0; t0 < len; t0 += KEY_BLOCK) {
        const int64_t t1 = t0 + KEY_BLOCK < len ? t0 + KEY_BLOCK : len;
        /* the next block's key rows, while this one computes: the slots are scattered over the
         * pool, so the hardware prefetchers cannot guess them */
        const int64_t t2 = t1 + KEY_BLOCK < len ? t1 + KEY_BLOCK : len;
        for (int64_t t = t0 ? t1 : 0; t < t2; t++)
            for (int64_t b = 0; b < row_stride; b += 16) __builtin_prefetch(k_buffer + slots[t] * row_stride + b, 0, 3);
        for (int j = 0; j < num_q_heads; j++) {
            const float *qj = qb + (int64_t)j * head_dim;
            const int64_t offset = (int64_t)(j / group) * head_dim;
            for (int64_t tt = t0; tt < t1; tt += VF_WIDTH)
                dots_vf(qj, k_buffer + offset, slots + tt, row_stride,
                        t1 - tt < VF_WIDTH ? (int)(t1 - tt) : VF_WIDTH, chunks, scale, scores + j * len + tt);
        }
    }
}

/* scores_pass for an 8-bit pool, head_dim a multiple of VF_WIDTH. A block of one KV head's keys
 * is made floats times their scales (dequantize_rows) in L1, once for the G query heads that
 * read it; then VF_WIDTH keys' dot products with a query head at a time (dots_vf). The generic
 * loop took one horizontal sum per key: 30 layers of 32 requests x 60-180 keys in runs of slots
 * took 6.1 ms over an int8 pool (as long as over a float one), 2.9-3.1 ms now (AVX-512). */
static inline __attribute__((always_inline)) void scores_pass_8bit_vf(
        const float *qb, const void *k_buffer, const float *k_scale, const int fmt, const int64_t *slots,
        int64_t len, int num_q_heads, int num_kv_heads, const int head_dim, float sm_scale, float *scores) {
    const int group = num_q_heads / num_kv_heads, chunks = head_dim / VF_WIDTH;
    const int64_t row_stride = (int64_t)num_kv_heads * head_dim; /* bytes per pool slot */
    const vf scale = vf_set1(sm_scale);
    float tile[KEY_BLOCK * head_dim];
    for (int64_t t0 = 0; t0 < len; t0 += KEY_BLOCK) {
        const int64_t t1 = t0 + KEY_BLOCK < len ? t0 + KEY_BLOCK : len;
        const int64_t t2 = t1 + KEY_BLOCK < len ? t1 + KEY_BLOCK : len;
        for (int64_t t = t0 ? t1 : 0; t < t2; t++) /* the next block's rows (and the first's) */
            prefetch_bytes((const uint8_t *)k_buffer + slots[t] * row_stride, (int)row_stride);
        for (int h = 0; h < num_kv_heads; h++) {
            dequantize_rows(k_buffer, k_scale, fmt, slots + t0, t1 - t0, h, num_kv_heads, head_dim, tile, head_dim);
            for (int j = h * group; j < (h + 1) * group; j++) {
                const float *qj = qb + (int64_t)j * head_dim;
                for (int64_t tt = t0; tt < t1; tt += VF_WIDTH)
                    dots_vf(qj, tile + (tt - t0) * head_dim, NULL, head_dim,
                            t1 - tt < VF_WIDTH ? (int)(t1 - tt) : VF_WIDTH, chunks, scale, scores + j * len + tt);
            }
        }
    }
}
#endif

/* scores[j][t] = sm_scale * <q_j, k_t[j / group]>. Inlined with a constant head_dim (64, 128)
 * the dot runs in registers; one query head at a time over a block of keys. An 8-bit pool's
 * block is first made floats once per KV head (dequantize_rows), for all its query heads. */
static inline __attribute__((always_inline)) void scores_pass(
        const float *qb, const void *k_buffer, const float *k_scale, const int fmt, const int64_t *slots,
        int64_t len, int num_q_heads, int num_kv_heads, const int head_dim, float sm_scale, float *scores) {
    const int group = num_q_heads / num_kv_heads;
    const int64_t row_stride = (int64_t)num_kv_heads * head_dim; /* values per pool slot */
#if defined(VF_WIDTH)
    if (fmt == KV_F32 && head_dim % VF_WIDTH == 0) {
        scores_pass_f32_vf(qb, (const float *)k_buffer, slots, len, num_q_heads, num_kv_heads, head_dim,
                           sm_scale, scores);
        return;
    }
    if (fmt != KV_F32 && head_dim % VF_WIDTH == 0) {
        scores_pass_8bit_vf(qb, k_buffer, k_scale, fmt, slots, len, num_q_heads, num_kv_heads, head_dim,
                            sm_scale, scores);
        return;
    }
#endif
    float tile[fmt == KV_F32 ? 1 : KEY_BLOCK * head_dim];
    for (int64_t t0 = 0; t0 < len; t0 += KEY_BLOCK) {
        const int64_t t1 = t0 + KEY_BLOCK < len ? t0 + KEY_BLOCK : len;
        if (fmt == KV_F32) {
            for (int j = 0; j < num_q_heads; j++) {
                const float *qj = qb + (int64_t)j * head_dim;
                const int64_t offset = (int64_t)(j / group) * head_dim;
                for (int64_t t = t0; t < t1; t++)
                    scores[j * len + t] =
                        sm_scale * dot(qj, (const float *)k_buffer + slots[t] * row_stride + offset, head_dim);
            }
            continue;
        }
        for (int h = 0; h < num_kv_heads; h++) {
            dequantize_rows(k_buffer, k_scale, fmt, slots + t0, t1 - t0, h, num_kv_heads, head_dim, tile, head_dim);
            for (int j = h * group; j < (h + 1) * group; j++) {
                const float *qj = qb + (int64_t)j * head_dim;
                for (int64_t t = t0; t < t1; t++)
                    scores[j * len + t] = sm_scale * dot(qj, tile + (t - t0) * head_dim, head_dim);
            }
        }
    }
}

#if defined(VF_WIDTH)
/* values_pass, head_dim a multiple of VF_WIDTH: the G query heads of one KV head accumulate in
 * registers (G x P vectors, P of a row's head_dim / VF_WIDTH at a time, values_part: the whole
 * row of 64 with AVX-512 at G <= 6, half of it with AVX2 at G = 2 or 3) over all the keys, each
 * value row (part) read once for the group (the generic loop kept its output rows in memory: a
 * load and a store per product). An 8-bit pool's row is made floats times its scale in
 * registers, the values dequantize_rows makes. */
static inline __attribute__((always_inline)) void values_group_vf(
        const void *v_buffer, const float *v_scale, const int fmt, const int64_t *slots, int64_t len, int h,
        const int G, const int P, const int num_kv_heads, const int head_dim, const float *scores, float *ob) {
    const int64_t row_stride = (int64_t)num_kv_heads * head_dim; /* values per pool slot */
    const int width = fmt == KV_F32 ? 4 : 1;                     /* bytes per value */
    const float *p = scores + (int64_t)h * G * len;
    const int part_bytes = P * VF_WIDTH * width, ahead = VALUE_PREFETCH_BYTES / (head_dim * width);
    const int64_t slot_bytes = row_stride * width;
    for (int c0 = 0; c0 < head_dim / VF_WIDTH; c0 += P) {
        vf acc[VF_ACCUMULATORS];
        for (int i = 0; i < G * P; i++) acc[i] = vf_zero();
        /* scattered rows: each is asked for `ahead` keys before it is read (the first ones up front) */
        const uint8_t *part_rows = (const uint8_t *)v_buffer + ((int64_t)h * head_dim + c0 * VF_WIDTH) * width;
        for (int64_t t = 0; t < ahead && t < len; t++) prefetch_bytes(part_rows + slots[t] * slot_bytes, part_bytes);
        for (int64_t t = 0; t < len; t++) {
            if (t + ahead < len) prefetch_bytes(part_rows + slots[t + ahead] * slot_bytes, part_bytes);
            const int64_t at = slots[t] * row_stride + (int64_t)h * head_dim + c0 * VF_WIDTH;
            const vf s = vf_set1(fmt == KV_F32 ? 1.0f : v_scale[slots[t] * num_kv_heads + h]);
            for (int c = 0; c < P; c++) {
                const vf vc = fmt == KV_F32 ? vf_load((const float *)v_buffer + at + VF_WIDTH * c)
                                            : vf_mul(vf_load_8bit(v_buffer, fmt, at + VF_WIDTH * c), s);
                for (int g = 0; g < G; g++)
                    acc[g * P + c] = vf_fmadd(vf_set1(p[g * len + t]), vc, acc[g * P + c]);
            }
        }
        for (int g = 0; g < G; g++)
            for (int c = 0; c < P; c++)
                vf_store(ob + ((int64_t)h * G + g) * head_dim + VF_WIDTH * (c0 + c), acc[g * P + c]);
    }
}

/* The most vectors of a row values_group_vf takes at a time for G query heads: the largest
 * divisor of the row's head_dim / VF_WIDTH whose G x P accumulators fit in registers. */
static inline __attribute__((always_inline)) int values_part(const int G, const int head_dim) {
    const int chunks = head_dim / VF_WIDTH;
    int P = VF_ACCUMULATORS / G < chunks ? VF_ACCUMULATORS / G : chunks;
    while (P > 1 && chunks % P) P--;
    return P;
}

/* 1 when values_group_vf took the pass: the group's accumulators for half a row or all of it fit
 * in registers (more passes over the keys were not measured against the plain loop). */
static inline __attribute__((always_inline)) int values_pass_vf(
        const void *v_buffer, const float *v_scale, const int fmt, const int64_t *slots, int64_t len,
        int num_q_heads, int num_kv_heads, const int head_dim, const float *scores, float *ob) {
    const int group = num_q_heads / num_kv_heads;
    if (head_dim % VF_WIDTH || group > VF_ACCUMULATORS || 2 * values_part(group, head_dim) < head_dim / VF_WIDTH)
        return 0;
    for (int h = 0; h < num_kv_heads; h++) {
#define GROUP(G) \
    values_group_vf(v_buffer, v_scale, fmt, slots, len, h, G, values_part(G, head_dim), num_kv_heads, head_dim, scores, ob)
        switch (group) {
        case 1: GROUP(1); break;
        case 2: GROUP(2); break;
        case 3: GROUP(3); break;
        case 4: GROUP(4); break;
        case 6: GROUP(6); break;
        default: return 0;
        }
#undef GROUP
    }
    return 1;
}
#endif

/* out_j = sum_t p[j][t] * v_t[j / group]: per query head, a block of keys accumulates into the
 * output row (in registers when head_dim is a constant); an 8-bit pool's block is made floats
 * once per KV head, as in scores_pass. */
static inline __attribute__((always_inline)) void values_pass(
        const void *v_buffer, const float *v_scale, const int fmt, const int64_t *slots, int64_t len,
        int num_q_heads, int num_kv_heads, const int head_dim, const float *scores, float *ob) {
    const int group = num_q_heads / num_kv_heads;
    const int64_t row_stride = (int64_t)num_kv_heads * head_dim;
#if defined(VF_WIDTH)
    if (values_pass_vf(v_buffer, v_scale, fmt, slots, len, num_q_heads, num_kv_heads, head_dim, scores, ob))
        return;
#endif
    float tile[fmt == KV_F32 ? 1 : KEY_BLOCK * head_dim];
    for (int64_t t0 = 0; t0 < len; t0 += KEY_BLOCK) {
        const int64_t t1 = t0 + KEY_BLOCK < len ? t0 + KEY_BLOCK : len;
        for (int h = 0; h < num_kv_heads; h++) {
            const float *rows = (const float *)v_buffer + h * head_dim; /* float32: the pool */
            int64_t stride = row_stride;
            if (fmt != KV_F32) {
                dequantize_rows(v_buffer, v_scale, fmt, slots + t0, t1 - t0, h, num_kv_heads, head_dim, tile, head_dim);
                rows = tile;
                stride = head_dim;
            }
            for (int j = h * group; j < (h + 1) * group; j++) {
                const float *p = scores + j * len;
                float *o = ob + (int64_t)j * head_dim;
                for (int64_t t = t0; t < t1; t++) {
                    const float *v = fmt == KV_F32 ? rows + slots[t] * stride : rows + (t - t0) * stride;
                    const float pt = p[t];
#pragma omp simd
                    for (int d = 0; d < head_dim; d++) o[d] += pt * v[d];
                }
            }
        }
    }
}

/* PASS(format, head_dim) specialised for the common head sizes of each pool format. */
#define KV_DISPATCH(PASS, fmt, head_dim)                                                           \
    do {                                                                                           \
        if (fmt == KV_F32) {                                                                       \
            if (head_dim == 64) PASS(KV_F32, 64);                                                  \
            else if (head_dim == 128) PASS(KV_F32, 128);                                           \
            else PASS(KV_F32, head_dim);                                                           \
        } else if (fmt == KV_INT8) {                                                               \
            if (head_dim == 64) PASS(KV_INT8, 64);                                                 \
            else if (head_dim == 128) PASS(KV_INT8, 128);                                          \
            else PASS(KV_INT8, head_dim);                                                          \
        } else {                                                                                   \
            if (head_dim == 64) PASS(KV_FP8_E4M3, 64);                                             \
            else if (head_dim == 128) PASS(KV_FP8_E4M3, 128);                                      \
            else PASS(KV_FP8_E4M3, head_dim);                                                      \
        }                                                                                          \
    } while (0)

static inline int64_t slot_at(const void *row, int table_is_i64, int64_t t) {
    return table_is_i64 ? ((const int64_t *)row)[t] : (int64_t)((const int32_t *)row)[t];
}

/* One request: returns 0, 1 when scratch allocation failed, 2 when a slot lies outside the pool. */
static int attend_one(const float *qb, const void *k_buffer, const void *v_buffer, int fmt, const float *k_scale,
                      const float *v_scale, const void *row, int table_is_i64, int64_t len, int64_t num_slots,
                      int num_q_heads, int num_kv_heads, int head_dim, float sm_scale, float *ob, float *lse) {
    for (int64_t i = 0; i < (int64_t)num_q_heads * head_dim; i++) ob[i] = 0.0f;
    if (len <= 0) { /* no keys: output 0, log-sum-exp -inf (weight 0 when merged) */
        if (lse)
            for (int j = 0; j < num_q_heads; j++) lse[j] = -INFINITY;
        return 0;
    }
    float *scores = malloc(sizeof(float) * (size_t)len * num_q_heads); /* [Hq][len] */
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)len);
    if (!scores || !slots) {
        free(scores); free(slots);
        return 1;
    }
    for (int64_t t = 0; t < len; t++) {
        slots[t] = slot_at(row, table_is_i64, t);
        if (slots[t] < 0 || slots[t] >= num_slots) {
            free(scores); free(slots);
            return 2;
        }
    }
#define SCORES(F, D) scores_pass(qb, k_buffer, k_scale, F, slots, len, num_q_heads, num_kv_heads, D, sm_scale, scores)
    KV_DISPATCH(SCORES, fmt, head_dim);
#undef SCORES
    for (int j = 0; j < num_q_heads; j++) {
        float *s = scores + j * len;
        float peak = -INFINITY, total = 0.0f;
        for (int64_t t = 0; t < len; t++) peak = s[t] > peak ? s[t] : peak;
#pragma omp simd reduction(+ : total)
        for (int64_t t = 0; t < len; t++) {
            s[t] = exp_nonpositive(s[t] - peak);
            total += s[t];
        }
        const float inv = 1.0f / total;
#pragma omp simd
        for (int64_t t = 0; t < len; t++) s[t] *= inv;
        if (lse) lse[j] = peak + logf(total);
    }
#define VALUES(F, D) values_pass(v_buffer, v_scale, F, slots, len, num_q_heads, num_kv_heads, D, scores, ob)
    KV_DISPATCH(VALUES, fmt, head_dim);
#undef VALUES
    free(scores); free(slots);
    return 0;
}

typedef struct {
    const float *q;
    const void *k_buffer, *v_buffer;
    int kv_fmt;                      /* KV_F32, KV_INT8, KV_FP8_E4M3 (common.h) */
    const float *k_scale, *v_scale;  /* [S, Hkv] for the 8-bit formats */
    const void *table;
    int table_is_i64;
    int64_t table_stride;
    const int64_t *rows, *seq_lens, *starts;
    int64_t num_slots;
    int num_q_heads, num_kv_heads, head_dim;
    float sm_scale;
    float *out, *lse;
    int64_t tasks;
    const int32_t *task_req;   /* [tasks] the request of each task */
    const int64_t *task_first; /* [tasks] its first key (from the request's start) */
    const int32_t *chunks;     /* [B] tasks of each request */
    float *part_out, *part_lse; /* [tasks, Hq, D], [tasks, Hq]: results of split requests */
    _Atomic int64_t next;      /* the next task to take */
    _Atomic int failed;        /* the largest status any task returned */
} AttnJob;

static void attn_part(void *p, int part, int parts) {
    (void)part;
    (void)parts;
    AttnJob *j = p;
    const int64_t head_elems = (int64_t)j->num_q_heads * j->head_dim;
    for (int64_t t; (t = atomic_fetch_add(&j->next, 1)) < j->tasks;) {
        const int b = j->task_req[t];
        const int64_t start = (j->starts ? j->starts[b] : 0) + j->task_first[t];
        const int64_t keys = j->seq_lens[b] - start;
        const char *row =
            (const char *)j->table + (j->rows[b] * j->table_stride + start) * (j->table_is_i64 ? 8 : 4);
        float *ob = j->out + b * head_elems, *lse = j->lse ? j->lse + (int64_t)b * j->num_q_heads : NULL;
        if (j->chunks[b] > 1) {
            ob = j->part_out + t * head_elems;
            lse = j->part_lse + t * j->num_q_heads;
        }
        const int status = attend_one(j->q + b * head_elems, j->k_buffer, j->v_buffer, j->kv_fmt, j->k_scale,
                                      j->v_scale, row, j->table_is_i64,
                                      keys < KEY_CHUNK ? keys : KEY_CHUNK, j->num_slots,
                                      j->num_q_heads, j->num_kv_heads, j->head_dim, j->sm_scale, ob, lse);
        for (int seen = atomic_load(&j->failed); status > seen;)
            if (atomic_compare_exchange_weak(&j->failed, &seen, status)) break;
    }
}

/* Request b's chunks merged by their log-sum-exps, in chunk order, into out (and lse). */
static void merge_chunks(const AttnJob *j, int b, int64_t first, int n) {
    const int hq = j->num_q_heads, d = j->head_dim;
    float *ob = j->out + (int64_t)b * hq * d;
    for (int h = 0; h < hq; h++) {
        float peak = -INFINITY, total = 0.0f;
        for (int c = 0; c < n; c++) {
            const float l = j->part_lse[(first + c) * hq + h];
            peak = l > peak ? l : peak;
        }
        float *o = ob + (int64_t)h * d;
        for (int i = 0; i < d; i++) o[i] = 0.0f;
        for (int c = 0; c < n; c++) {
            const float w = expf(j->part_lse[(first + c) * hq + h] - peak);
            const float *oc = j->part_out + ((first + c) * hq + h) * (int64_t)d;
            total += w;
#pragma omp simd
            for (int i = 0; i < d; i++) o[i] += w * oc[i];
        }
        const float inv = 1.0f / total;
#pragma omp simd
        for (int i = 0; i < d; i++) o[i] *= inv;
        if (j->lse) j->lse[(int64_t)b * hq + h] = peak + logf(total);
    }
}

/* Attention of request b over its keys starts[b] .. seq_lens[b] - 1 (all of them when starts is
 * NULL), over a pool in format kv_fmt (float32, or 8 bits with k_scale / v_scale [S, Hkv]).
 * lse (may be NULL) receives each query head's natural log-sum-exp of the scaled scores,
 * so partial results over disjoint key sets merge exactly. Returns 0; 1 when a scratch
 * allocation failed, 2 when a slot lies outside the pool (out is then incomplete). */
int decode_attention_f32(
    const float *q,           /* [B, Hq, D] contiguous */
    const void *k_buffer,     /* [S, Hkv, D] contiguous, in format kv_fmt */
    const void *v_buffer,     /* [S, Hkv, D] contiguous */
    int kv_fmt,               /* KV_F32, KV_INT8 or KV_FP8_E4M3 */
    const float *k_scale,     /* [S, Hkv] for the 8-bit formats, else NULL */
    const float *v_scale,
    const void *table,        /* [R, table_stride] int32 or int64 */
    int table_is_i64,
    int64_t table_stride,
    const int64_t *rows,      /* [B] row of each request in table */
    const int64_t *seq_lens,  /* [B] keys per request */
    const int64_t *starts,    /* [B] first key to attend to, or NULL for 0 */
    int64_t num_slots,        /* S */
    int batch, int num_q_heads, int num_kv_heads, int head_dim,
    float sm_scale,
    float *out,               /* [B, Hq, D] */
    float *lse)               /* [B, Hq], or NULL */
{
    /* Tasks: each request's keys in chunks of KEY_CHUNK (one task when it has no more), so that
     * one long request (a batch of 1) spreads over the threads too. The split depends only on
     * the request's own key count, never on the batch, so a row's result does not depend on
     * its batch-mates (and a speculative verify row equals the decode row it stands for). */
    if (batch <= 0) return 0;
    int32_t *chunks = malloc(sizeof(int32_t) * (size_t)batch);
    if (!chunks) return 1;
    int64_t tasks = 0, total_keys = 0, split = 0;
    for (int b = 0; b < batch; b++) {
        const int64_t keys = seq_lens[b] - (starts ? starts[b] : 0);
        chunks[b] = keys > KEY_CHUNK ? (int32_t)((keys + KEY_CHUNK - 1) / KEY_CHUNK) : 1;
        tasks += chunks[b];
        split += chunks[b] > 1;
        total_keys += keys > 0 ? keys : 0;
    }
    int32_t *task_req = malloc(sizeof(int32_t) * (size_t)tasks);
    int64_t *task_first = malloc(sizeof(int64_t) * (size_t)tasks);
    float *part_out = split ? malloc(sizeof(float) * (size_t)(tasks * num_q_heads * head_dim)) : NULL;
    float *part_lse = split ? malloc(sizeof(float) * (size_t)(tasks * num_q_heads)) : NULL;
    int failed = 0;
    if (!task_req || !task_first || (split && (!part_out || !part_lse))) {
        failed = 1;
        goto done;
    }
    for (int b = 0, t = 0; b < batch; b++)
        for (int c = 0; c < chunks[b]; c++, t++) {
            task_req[t] = b;
            task_first[t] = (int64_t)c * KEY_CHUNK;
        }
    AttnJob job = {q, k_buffer, v_buffer, kv_fmt, k_scale, v_scale, table, table_is_i64, table_stride, rows, seq_lens, starts,
                   num_slots, num_q_heads, num_kv_heads, head_dim, sm_scale, out, lse, tasks, task_req,
                   task_first, chunks, part_out, part_lse, 0, 0};
    spin_pool_run(attn_part, &job, tasks > 1 && total_keys >= PARALLEL_MIN_KEYS ? spin_pool_threads() : 1);
    failed = atomic_load(&job.failed);
    if (!failed && split)
        for (int b = 0, t = 0; b < batch; t += chunks[b], b++)
            if (chunks[b] > 1) merge_chunks(&job, b, t, chunks[b]);
done:
    free(task_req);
    free(chunks);
    free(task_first);
    free(part_out);
    free(part_lse);
    return failed;
}
