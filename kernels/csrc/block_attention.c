/* Attention of many query rows against one run of keys, float32 CPU: a shared prefix attended
 * once for every request behind it (cascade.py), and extend (a prompt chunk over its cached prefix
 * and itself, causally).
 *
 * The query heads of one KV head over a block of ROWS (token, head) rows are the lanes of two
 * vectors (32 rows with AVX-512, 16 with AVX2; common.h's vf); the block's queries are
 * transposed once ([D][ROWS]), so a key's scores for the block are D broadcast-multiply-adds, the
 * online softmax (running max, rescale, sums) runs ROWS rows at a time, and the output
 * accumulates transposed ([D][ROWS]) from each key's values. Keys are taken 16 at a time from
 * the first on, through a slot list (the pool as it is), so a row's result depends on its
 * query, its keys and its limit alone, not on the rows beside it or the chunk that holds it. An
 * 8-bit pool's block of keys and values is made floats, times their scales, once per task; the
 * torch path gathered and dequantized each request's keys before. Tasks (KV head, row block)
 * run on the spinning pool (spin_pool.h): torch's SDPA in between the pool's kernels ran at
 * about half its own speed, its OpenMP threads contending with the pool's spinning ones.
 *
 * Without AVX-512 or AVX2 + FMA the entry point returns -1 and the caller keeps torch's SDPA.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "common.h"
#include "spin_pool.h"

#if defined(VF_WIDTH) /* common.h: AVX-512 (16 lanes) or AVX2 + FMA (8) */

#define ROWS (2 * VF_WIDTH) /* query rows per task: two vectors */
#define KEYS 16             /* keys per block of scores */
#define MAX_DIM 256         /* head sizes up to this */
/* keys per pass of the scores, values of d per pass of the output (2 accumulators each; head
 * sizes: multiples of DU): as many as the registers hold */
#define KU (VF_WIDTH / 2)
#define DU (VF_WIDTH / 2)

typedef struct {
    const float *q;           /* [T, Hq, D] */
    const void *k, *v;        /* [*, Hkv, D]: the slots' rows, in format fmt */
    int fmt;                  /* KV_F32, KV_INT8 or KV_FP8_E4M3 (common.h) */
    const float *k_scale, *v_scale; /* [*, Hkv] for the 8-bit formats */
    const int64_t *slots;     /* [num_keys] */
    const int64_t *limits;    /* [T]: keys token t attends to (the first ones), or NULL: all */
    int64_t tokens, num_keys;
    int num_q_heads, num_kv_heads, head_dim;
    float sm_scale;
    float *out;               /* [T, Hq, D] */
    float *lse;               /* [T, Hq] natural log-sum-exp of the scaled scores, or NULL */
} BlockJob;

static void block_task(const BlockJob *j, int h, int64_t r0) {
    const int group = j->num_q_heads / j->num_kv_heads, d_len = j->head_dim;
    const int64_t rows = j->tokens * group, kv_stride = (int64_t)j->num_kv_heads * d_len;
    float qt[MAX_DIM][ROWS] __attribute__((aligned(64)));
    float ot[MAX_DIM][ROWS] __attribute__((aligned(64)));
    float pt[KEYS][ROWS] __attribute__((aligned(64)));
    /* an 8-bit pool's block of keys and values, made floats together: the values' loads start
     * before the scores need them (one tile reused for both was 1.2x slower behind a shared
     * prefix); 32 KB of the task's ~100 KB of stack */
    float kt[KEYS][MAX_DIM] __attribute__((aligned(64))), vt[KEYS][MAX_DIM] __attribute__((aligned(64)));
    const float *k = j->k, *v = j->v; /* a float32 pool */
    int32_t lim[ROWS] __attribute__((aligned(64)));
    int64_t most = 0; /* the block's longest row */
    for (int i = 0; i < ROWS; i++) {
        const int64_t r = r0 + i;
        if (r >= rows) { /* past the last row: no keys, nothing stored */
            lim[i] = 0;
            for (int d = 0; d < d_len; d++) qt[d][i] = 0.0f;
            continue;
        }
        const int64_t t = r / group;
        const float *qr = j->q + (t * j->num_q_heads + (int64_t)h * group + r % group) * d_len;
        for (int d = 0; d < d_len; d++) qt[d][i] = qr[d] * j->sm_scale;
        const int64_t n = j->limits ? j->limits[t] : j->num_keys;
        lim[i] = (int32_t)(n < j->num_keys ? n : j->num_keys);
        most = lim[i] > most ? lim[i] : most;
    }
    for (int d = 0; d < d_len; d++) {
        vf_store(ot[d], vf_zero());
        vf_store(ot[d] + VF_WIDTH, vf_zero());
    }
    const vf neg_inf = vf_set1(-INFINITY);
    vf m[2] = {neg_inf, neg_inf}, l[2] = {vf_zero(), vf_zero()};
    const vi lim_v[2] = {vi_load(lim), vi_load(lim + VF_WIDTH)};
    for (int64_t t0 = 0; t0 < most; t0 += KEYS) {
        const int nk = most - t0 < KEYS ? (int)(most - t0) : KEYS;
        if (j->fmt != KV_F32) { /* the block's keys and values as floats, once for the ROWS rows */
            dequantize_rows(j->k, j->k_scale, j->fmt, j->slots + t0, nk, h, j->num_kv_heads, d_len, kt[0], MAX_DIM);
            dequantize_rows(j->v, j->v_scale, j->fmt, j->slots + t0, nk, h, j->num_kv_heads, d_len, vt[0], MAX_DIM);
        }
        /* scores of KEYS keys (KU at a time) for the ROWS rows, masked past each row's limit */
        for (int kk = 0; kk < KEYS; kk += KU) {
            const float *kp[KU];
            for (int u = 0; u < KU; u++) { /* past the block's last key: key t0 again, masked */
                const int key = kk + u < nk ? kk + u : 0;
                kp[u] = j->fmt != KV_F32 ? kt[key] : k + j->slots[t0 + key] * kv_stride + (int64_t)h * d_len;
            }
            vf a[KU][2];
            for (int u = 0; u < KU; u++) a[u][0] = a[u][1] = vf_zero();
            for (int d = 0; d < d_len; d++) {
                vf q0 = vf_load(qt[d]), q1 = vf_load(qt[d] + VF_WIDTH);
                __asm__("" : "+v"(q0), "+v"(q1)); /* in registers: GCC folds them into every FMA */
                for (int u = 0; u < KU; u++) {
                    const vf kb = vf_set1(kp[u][d]);
                    a[u][0] = vf_fmadd(kb, q0, a[u][0]);
                    a[u][1] = vf_fmadd(kb, q1, a[u][1]);
                }
            }
            for (int u = 0; u < KU; u++) {
                const vi key = vi_set1((int32_t)(t0 + kk + u));
                for (int s = 0; s < 2; s++) /* past each row's limit (or the block's last key): -inf */
                    vf_store(pt[kk + u] + VF_WIDTH * s,
                             kk + u < nk ? vf_where_lt(key, lim_v[s], a[u][s], neg_inf) : neg_inf);
            }
        }
        /* online softmax: new running max, rescale what was summed, probabilities in place */
        vf alpha[2];
        for (int s = 0; s < 2; s++) {
            vf peak = m[s];
            for (int kk = 0; kk < KEYS; kk++) peak = vf_max(peak, vf_load(pt[kk] + VF_WIDTH * s));
            /* a row with no key yet keeps max -inf: subtract 0 instead (its scores are all -inf) */
            const vf base = vf_neg_inf_to_zero(peak);
            alpha[s] = vf_exp_nonpositive(vf_sub(m[s], base));
            vf sum = vf_zero();
            for (int kk = 0; kk < KEYS; kk++) {
                const vf p = vf_exp_nonpositive(vf_sub(vf_load(pt[kk] + VF_WIDTH * s), base));
                vf_store(pt[kk] + VF_WIDTH * s, p);
                sum = vf_add(sum, p);
            }
            l[s] = vf_fmadd(l[s], alpha[s], sum);
            m[s] = peak;
        }
        /* out^T[d] = alpha * out^T[d] + sum_k p_k v_k[d], DU values of d at a time */
        const float *vp[KEYS];
        for (int kk = 0; kk < KEYS; kk++) {
            const int key = kk < nk ? kk : 0;
            vp[kk] = j->fmt != KV_F32 ? vt[key] : v + j->slots[t0 + key] * kv_stride + (int64_t)h * d_len;
        }
        for (int d0 = 0; d0 < d_len; d0 += DU) {
            vf acc[DU][2];
            for (int u = 0; u < DU; u++)
                for (int s = 0; s < 2; s++) acc[u][s] = vf_mul(vf_load(ot[d0 + u] + VF_WIDTH * s), alpha[s]);
            for (int kk = 0; kk < KEYS; kk++) {
                vf p0 = vf_load(pt[kk]), p1 = vf_load(pt[kk] + VF_WIDTH);
                __asm__("" : "+v"(p0), "+v"(p1));
                for (int u = 0; u < DU; u++) {
                    const vf vb = vf_set1(vp[kk][d0 + u]);
                    acc[u][0] = vf_fmadd(vb, p0, acc[u][0]);
                    acc[u][1] = vf_fmadd(vb, p1, acc[u][1]);
                }
            }
            for (int u = 0; u < DU; u++)
                for (int s = 0; s < 2; s++) vf_store(ot[d0 + u] + VF_WIDTH * s, acc[u][s]);
        }
    }
    float sum[ROWS] __attribute__((aligned(64))), peak[ROWS] __attribute__((aligned(64)));
    for (int s = 0; s < 2; s++) {
        vf_store(sum + VF_WIDTH * s, l[s]);
        vf_store(peak + VF_WIDTH * s, m[s]);
    }
    for (int i = 0; i < ROWS && r0 + i < rows; i++) {
        const int64_t r = r0 + i, t = r / group, head = (int64_t)h * group + r % group;
        float *o = j->out + (t * j->num_q_heads + head) * d_len;
        if (lim[i] == 0) { /* no keys: output 0, log-sum-exp -inf (weight 0 when merged) */
            for (int d = 0; d < d_len; d++) o[d] = 0.0f;
            if (j->lse) j->lse[t * j->num_q_heads + head] = -INFINITY;
            continue;
        }
        const float inv = 1.0f / sum[i];
        for (int d = 0; d < d_len; d++) o[d] = ot[d][i] * inv;
        if (j->lse) j->lse[t * j->num_q_heads + head] = peak[i] + logf(sum[i]);
    }
}

static void block_part(void *arg, int part, int parts) {
    const BlockJob *j = arg;
    const int64_t blocks = (j->tokens * (j->num_q_heads / j->num_kv_heads) + ROWS - 1) / ROWS;
    const int64_t tasks = blocks * j->num_kv_heads;
    for (int64_t task = tasks * part / parts; task < tasks * (part + 1) / parts; task++)
        block_task(j, (int)(task % j->num_kv_heads), task / j->num_kv_heads * ROWS);
}
#endif

/* out[t, hq] = softmax(sm_scale q[t, hq] . k[s]) v over the first limits[t] (all: NULL) of the
 * keys slots[0..num_keys), k and v rows of num_kv_heads x head_dim values per slot (num_slots of
 * them) in format fmt: float32, or 8 bits times k_scale / v_scale [num_slots, num_kv_heads] (each
 * block of 16 keys made floats once per task). lse (may be NULL) gets each row's natural
 * log-sum-exp (-inf with no keys, out 0). Returns 0; -2 for a slot outside 0..num_slots - 1; -1
 * without AVX-512 or AVX2 + FMA, or for a head size over MAX_DIM or not a multiple of DU (8 with
 * AVX-512, 4 with AVX2; of 16 / 8 for an 8-bit pool), or query heads that are not a multiple of
 * the KV heads (the caller then uses torch). */
int block_attention_f32(const float *q, const void *k, const void *v, int fmt, const float *k_scale,
                        const float *v_scale, int64_t num_slots, const int64_t *slots, int64_t num_keys,
                        const int64_t *limits, int64_t tokens, int num_q_heads, int num_kv_heads, int head_dim,
                        float sm_scale, float *out, float *lse) {
#if defined(VF_WIDTH)
    if (head_dim > MAX_DIM || head_dim % DU || num_kv_heads <= 0 || num_q_heads % num_kv_heads ||
        (fmt != KV_F32 && (head_dim % VF_WIDTH || !k_scale || !v_scale)))
        return -1;
    if (tokens <= 0) return 0;
    for (int64_t i = 0; i < num_keys; i++)
        if (slots[i] < 0 || slots[i] >= num_slots) return -2;
    BlockJob job = {q, k, v, fmt, k_scale, v_scale, slots, limits, tokens, num_keys, num_q_heads, num_kv_heads,
                    head_dim, sm_scale, out, lse};
    const int64_t macs = tokens * num_q_heads * (num_keys + 1) * head_dim * 2;
    spin_pool_run(block_part, &job, macs >= 200000 ? spin_pool_threads() : 1);
    return 0;
#else
    (void)q; (void)k; (void)v; (void)fmt; (void)k_scale; (void)v_scale; (void)num_slots; (void)slots;
    (void)num_keys; (void)limits; (void)tokens; (void)num_q_heads; (void)num_kv_heads; (void)head_dim;
    (void)sm_scale; (void)out; (void)lse;
    return -1;
#endif
}
