/* What quant_matmul.c shares with the layouts kept in files of their own (quant_matmul_amx.c):
 * the ggml type ids of the formats, their block sizes, one block's dequantization and the
 * spinning pool's part count. */
#ifndef QUANT_COMMON_H
#define QUANT_COMMON_H

#include <stdint.h>

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

/* Below this many multiply-adds a call stays on the calling thread. */
#define PARALLEL_MIN_MACS 200000

int64_t quant_block_elements(int fmt);
int64_t quant_block_bytes(int fmt);
/* One block of fmt (GGUF's bytes at b) -> its float values at out. */
void quant_dequant_block(int fmt, const uint8_t *b, float *out);
/* How many parts of the spinning pool a call of `macs` multiply-adds takes. */
int quant_parts_for(int64_t macs);

/* The tiled layout (quant_matmul_amx.c): 16 rows' blocks in the AMX tile unit's operand order. */
#define AMX_GROUP 16
/* Row r of a tiled weight [out, in] -> floats at out. */
void quant_dequant_tiled_row(int fmt, const uint8_t *w, int64_t in, int64_t r, float *out);
/* y = x @ W^T (+ bias) on AMX tiles; -1 where this build or process has none. */
int quant_matmul_tiled(int fmt, const uint8_t *w, int64_t out_features, int64_t in, const float *x,
                       int64_t stride_x, int64_t rows, float *y, int64_t stride_y, const float *bias);

#endif
