/* Every decoder layer of a decode step in one native call (float32 CPU, weights in blocks).
 *
 * A decode step of a small model is many small calls: per layer two norms, four quantized
 * matmuls, rotary and KV store, attention and SiLU, each a ctypes call from Python costing
 * ~5-13 us of dispatch and argument marshalling, about a quarter of a batch-1 step of
 * SmolLM2-135M. This driver runs the same C kernels (layer_ops.c, quant_matmul.c,
 * decode_attention.c) in the same order on the same inputs, so its output equals the per-call
 * path's bit for bit; only the Python between them is gone.
 *
 * Per layer, for N decode tokens (hidden and residual [N, H] in and out, scratch as laid out
 * in decode_layers_f32):
 *   normed, residual = add_rms_norm(hidden, residual)      (layer 0: residual = hidden)
 *   q = rotary(qkv(normed)), k/v rotated into their pool slots
 *   hidden = o(attention(q))
 *   normed, residual = add_rms_norm(hidden, residual)
 *   hidden = down(silu(gate) * up), gate|up = gate_up(normed)
 */
#include <stdint.h>
#include <string.h>

/* The kernels this driver strings together (same library). */
int quant_matmul_f32(int fmt, int packed, const uint8_t *w, int64_t row_bytes, int64_t out_features,
                     int64_t in, const float *x, int64_t stride_x, int64_t rows, float *y,
                     int64_t stride_y, const float *bias, int act_q8);
void add_rms_norm_f32(const float *x, int64_t stride_x, const float *residual, int64_t stride_r,
                      const float *weight, float *out, float *h_out, int64_t rows, int64_t hidden, float eps);
void silu_mul_f32(const float *gate_up, int64_t stride, float *out, int64_t rows, int64_t inter);
int rotary_store_f32(const float *qkv, int64_t stride_t, const int64_t *positions, const float *cos_sin,
                     int64_t max_pos, const int64_t *slots, void *k_buffer, void *v_buffer, int kv_fmt,
                     float *k_scale, float *v_scale, int64_t num_slots, float *q_out, int64_t tokens,
                     int num_q_heads, int num_kv_heads, int64_t head_dim);
int decode_attention_f32(const float *q, const void *k_buffer, const void *v_buffer, int kv_fmt,
                         const float *k_scale, const float *v_scale, const void *table,
                         int table_is_i64, int64_t table_stride, const int64_t *rows, const int64_t *seq_lens,
                         const int64_t *starts, int64_t num_slots, int batch, int num_q_heads,
                         int num_kv_heads, int head_dim, float sm_scale, float *out, float *lse);

/* One quantized linear layer: the arguments of quant_matmul_f32 that do not change per step. */
typedef struct {
    int32_t fmt, packed, act_q8, pad;
    const uint8_t *w;
    int64_t row_bytes, out_features, in_features;
    const float *bias; /* [out_features] or NULL */
} DecodeLinear;

typedef struct {
    const float *input_norm, *post_norm; /* [H] */
    DecodeLinear qkv, o, gate_up, down;
    void *k_buffer, *v_buffer; /* this layer's pool [S, Hkv, D], in the model's kv_fmt */
    float *k_scale, *v_scale;  /* [S, Hkv] for an 8-bit pool, else NULL */
} DecodeLayer;

typedef struct {
    int32_t num_layers, num_q_heads, num_kv_heads, head_dim;
    int32_t kv_fmt, pad; /* the pool's format: KV_F32, KV_INT8, KV_FP8_E4M3 (common.h) */
    int64_t hidden, inter, num_slots, max_pos;
    float eps, sm_scale;
    const float *cos_sin; /* [max_pos, D] */
    const DecodeLayer *layers;
} DecodeModel;

typedef struct {
    int64_t tokens;                   /* N decode tokens, one per request */
    const int64_t *positions, *slots; /* [N] */
    const void *table;                /* req_to_token [R, table_stride], int32 or int64 */
    int64_t table_stride;
    int32_t table_is_i64, pad;
    const int64_t *rows, *seq_lens; /* [N] */
    float *hidden, *residual;       /* [N, H] */
    float *scratch;                 /* decode_layers_scratch floats */
} DecodeStep;

/* Floats of scratch one step needs: normed [N, H], qkv [N, (Hq + 2 Hkv) D], q and attention
 * output [N, Hq D] each, gate|up [N, 2 I] and its product [N, I]. */
int64_t decode_layers_scratch(const DecodeModel *m, int64_t tokens) {
    const int64_t q_size = (int64_t)m->num_q_heads * m->head_dim;
    const int64_t qkv_size = q_size + 2 * (int64_t)m->num_kv_heads * m->head_dim;
    return tokens * (m->hidden + qkv_size + 2 * q_size + 3 * m->inter);
}

static int linear(const DecodeLinear *l, const float *x, int64_t rows, float *y) {
    return quant_matmul_f32(l->fmt, l->packed, l->w, l->row_bytes, l->out_features, l->in_features, x,
                            l->in_features, rows, y, l->out_features, l->bias, l->act_q8);
}

/* Runs every layer. Returns 0; -(1 + layer) when a matmul declined its weight (shapes the
 * caller checked, so a bug); 1 a position outside the cos/sin cache; 2 a slot outside the pool
 * (nothing written for that layer: both are checked by the first layer's rotary before any
 * write); 3 attention scratch could not be allocated; 4 the table holds a slot outside the pool. */
int decode_layers_f32(const DecodeModel *m, const DecodeStep *s) {
    const int64_t n = s->tokens, h = m->hidden, inter = m->inter;
    const int64_t q_size = (int64_t)m->num_q_heads * m->head_dim;
    const int64_t qkv_size = q_size + 2 * (int64_t)m->num_kv_heads * m->head_dim;
    float *normed = s->scratch, *qkv = normed + n * h, *q = qkv + n * qkv_size, *attn = q + n * q_size;
    float *gate_up = attn + n * q_size, *act = gate_up + n * 2 * inter;
    for (int i = 0; i < m->num_layers; i++) {
        const DecodeLayer *l = &m->layers[i];
        if (i == 0) {
            add_rms_norm_f32(s->hidden, h, NULL, 0, l->input_norm, normed, NULL, n, h, m->eps);
            memcpy(s->residual, s->hidden, sizeof(float) * (size_t)(n * h));
        } else {
            add_rms_norm_f32(s->hidden, h, s->residual, h, l->input_norm, normed, s->residual, n, h, m->eps);
        }
        if (linear(&l->qkv, normed, n, qkv)) return -(1 + i);
        int bad = rotary_store_f32(qkv, qkv_size, s->positions, m->cos_sin, m->max_pos, s->slots, l->k_buffer,
                                   l->v_buffer, m->kv_fmt, l->k_scale, l->v_scale, m->num_slots, q, n,
                                   m->num_q_heads, m->num_kv_heads, m->head_dim);
        if (bad) return bad;
        bad = decode_attention_f32(q, l->k_buffer, l->v_buffer, m->kv_fmt, l->k_scale, l->v_scale, s->table, s->table_is_i64, s->table_stride, s->rows,
                                   s->seq_lens, NULL, m->num_slots, (int)n, m->num_q_heads, m->num_kv_heads,
                                   m->head_dim, m->sm_scale, attn, NULL);
        if (bad) return 2 + bad;
        if (linear(&l->o, attn, n, s->hidden)) return -(1 + i);
        add_rms_norm_f32(s->hidden, h, s->residual, h, l->post_norm, normed, s->residual, n, h, m->eps);
        if (linear(&l->gate_up, normed, n, gate_up)) return -(1 + i);
        silu_mul_f32(gate_up, 2 * inter, act, n, inter);
        if (linear(&l->down, act, n, s->hidden)) return -(1 + i);
    }
    return 0;
}
