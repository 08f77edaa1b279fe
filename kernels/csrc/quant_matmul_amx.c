/* Float activations on AMX tiles: the tiled layout (quant_matmul_f32's layout 3) and its matmul.
 * Called through quant_matmul_f32 and quant_dequantize_rows (quant_matmul.c); quant_tile and
 * quant_tile_supported are the library's own entry points. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "quant_common.h"
#include "spin_pool.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVX512F__)
#include <immintrin.h>
#endif

/* ------------------------------------------- float activations on AMX tiles (layout 3, "tiled")
 *
 * On CPUs with AMX (Intel Sapphire Rapids on), the bf16 tile multiply does 16 x 16 x 32 products
 * per instruction. It gives float32 results here with nothing rounded but the sums: a float32
 * activation of normal range is the exact sum of three bf16 values (hi, the rounded remainder,
 * the rest: 8 + 8 + 8 significant bits), a quant (Q4 nibble, Q4_0 less 8, Q8_0 byte) is an exact
 * bf16 integer, and the tile unit forms each product of two bf16 exactly and sums in float32.
 * (The conversion and the tile unit treat bf16 below 2^-126 as zero: parts of activations below
 * ~2^-100 are lost, and an infinite activation gives NaN, where the packed path gives the
 * infinity. Real activations are far from both.) Per block of 32 inputs and 16 outputs,
 * the three parts' products go into one float32 tile C = sum_k q[o, k] * x[r, k]; then
 * y[r, o] += d[o] * C[r, o] (+ m[o] * sum_k x[r, k] for Q4_1) in AVX-512, blocks in order. So the
 * result is the float model's up to the order of the sums (per block, then d applied to the
 * block's sum rather than to each weight), and a row's bits do not depend on the rows beside it:
 * every row is its own tile row (a lone tile of fewer than 16 rows is configured at its size,
 * the last of several is padded with zero rows), and the tile unit sums each row alike.
 * Measured per call (2 threads, 3072 x 576 Q4_1, rows 1 / 8 / 32 / 128): 43 / 90 / 238 / 847 us
 * against the packed float path's 49 / 154 / 491 / 1,794.
 *
 * The layout: per group of 16 outputs, per block, one record: the quants as the tile unit's B
 * operand wants them (row i holds inputs 2i and 2i+1 of the 16 outputs in turn: element c is
 * output c / 2, input 2i + c % 2), Q4 as nibbles (bytes 32j + c: low nibble row 2j, high nibble
 * row 2j + 1), Q8_0 as its bytes; then the 16 fp16 scales, then (Q4_1) the 16 fp16 minimums.
 * 16 records of a group take 16 rows' GGUF bytes, so the weight keeps its GGUF size and shape. */

static int64_t tiled_rec_bytes(int fmt) {
    switch (fmt) {
    case Q4_0: return 256 + 32;
    case Q4_1: return 256 + 64;
    case Q8_0: return 512 + 32;
    default: return 0;
    }
}

/* Bytes of a record's quants: 16 B operand rows of 32 values, as nibbles or bytes. */
static inline int64_t tiled_qbytes(int fmt) { return fmt == Q8_0 ? 512 : 256; }

/* Where input k (0..31) of output o (0..15) sits among a record's quants: B operand row k / 2,
 * element 2o + k % 2; its byte, and (Q4: two rows per 32 bytes) its nibble's shift. */
static inline int tiled_at(int fmt, int o, int k, int *shift) {
    const int i = k / 2, c = 2 * o + k % 2;
    *shift = fmt == Q8_0 ? 0 : 4 * (i % 2);
    return fmt == Q8_0 ? 32 * i + c : 32 * (i / 2) + c;
}

/* GGUF rows (src) -> the tiled layout (dst, as many bytes); rows a multiple of 16. */
int quant_tile(int fmt, const uint8_t *src, int64_t src_row_bytes, int64_t rows, int64_t in,
               uint8_t *dst) {
    const int64_t bb = quant_block_bytes(fmt), rec = tiled_rec_bytes(fmt);
    if (rec == 0 || in % 32 || rows % AMX_GROUP || src_row_bytes != in / 32 * bb) return -1;
    const int64_t nb = in / 32, groups = rows / AMX_GROUP, qbytes = tiled_qbytes(fmt);
    const int sq_off = fmt == Q4_1 ? 4 : 2;
#pragma omp parallel for schedule(static) if (rows * in >= 4 * PARALLEL_MIN_MACS)
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *r = dst + (g * nb + b) * rec;
            memset(r, 0, (size_t)rec);
            for (int o = 0; o < AMX_GROUP; o++) {
                const uint8_t *s = src + (g * AMX_GROUP + o) * src_row_bytes + b * bb;
                memcpy(r + qbytes + 2 * o, s, 2);
                if (fmt == Q4_1) memcpy(r + qbytes + 32 + 2 * o, s + 2, 2);
                const uint8_t *sq = s + sq_off;
                for (int k = 0; k < 32; k++) {
                    int shift;
                    const int at = tiled_at(fmt, o, k, &shift);
                    const uint8_t q = fmt == Q8_0 ? sq[k] : k < 16 ? sq[k] & 0xf : sq[k - 16] >> 4;
                    r[at] |= (uint8_t)(q << shift);
                }
            }
        }
    return 0;
}

/* Row r of a tiled weight to floats: its blocks rebuilt in GGUF's bytes, then dequant_block. */
void quant_dequant_tiled_row(int fmt, const uint8_t *w, int64_t in, int64_t r, float *out) {
    const int64_t nb = in / 32, rec = tiled_rec_bytes(fmt), qbytes = tiled_qbytes(fmt);
    const int o = (int)(r % AMX_GROUP), sq_off = fmt == Q4_1 ? 4 : 2;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *t = w + ((r / AMX_GROUP) * nb + b) * rec;
        uint8_t gguf[34] = {0};
        memcpy(gguf, t + qbytes + 2 * o, 2);
        if (fmt == Q4_1) memcpy(gguf + 2, t + qbytes + 32 + 2 * o, 2);
        for (int k = 0; k < 32; k++) {
            int shift;
            const uint8_t v = t[tiled_at(fmt, o, k, &shift)];
            if (fmt == Q8_0)
                gguf[sq_off + k] = v;
            else
                gguf[sq_off + k % 16] |= (uint8_t)(((v >> shift) & 0xf) << (k < 16 ? 0 : 4));
        }
        quant_dequant_block(fmt, gguf, out + 32 * b);
    }
}

#if defined(__AVX512F__) && defined(__F16C__) && defined(__FMA__) && defined(__AVX512BW__) && defined(__AVX512BF16__) && \
    defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define QM_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Whether this build has the tiled path and the kernel lets this process use the tile registers
 * (Linux asks each process to request them once). */
int quant_tile_supported(void) {
#if defined(QM_AMX)
    static int state = -1; /* asked once; asking again is harmless, so a race costs one syscall */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s < 0) {
        s = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s;
#else
    return 0;
#endif
}

#if defined(QM_AMX)
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* Rows per row tile (the tile unit's M). */
#define TILED_RT 16
/* Most blocks whose B operands are built at once (1 KiB each, kept in L1). */
#define TILED_CHUNK 24
/* How far ahead of the records in use their successors are asked for (bytes). */
#define TILED_PREFETCH 4096

typedef struct {
    int fmt;
    const uint8_t *w;
    int64_t nb, groups;
    const uint16_t *xs; /* [row tile][block][part][16 rows][32] bf16: A operands, 1 KiB each */
    const float *sx;    /* [row][block]: each block's sum of x (Q4_1) */
    int64_t rows;
    float *y;
    int64_t stride_y;
    const float *bias;
} TiledJob;

/* A block's record -> its B operand (16 rows of 32 bf16) at bt. */
static inline __attribute__((always_inline)) void tiled_b(const int fmt, const uint8_t *r, uint16_t *bt) {
    if (fmt == Q8_0) {
        for (int i = 0; i < 16; i++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(r + 32 * i));
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
            _mm512_store_si512((__m512i *)(bt + 32 * i), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
        return;
    }
    /* the bf16 of each nibble's value (entries i and i + 16 alike: vpermw reads 5 index bits) */
    const __m512i table = fmt == Q4_1
        ? _mm512_set_epi16(0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100, 0x40e0,
                           0x40c0, 0x40a0, 0x4080, 0x4040, 0x4000, 0x3f80, 0x0000, 0x4170, 0x4160,
                           0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100, 0x40e0, 0x40c0, 0x40a0,
                           0x4080, 0x4040, 0x4000, 0x3f80, 0x0000)
        : _mm512_set_epi16(0x40e0, 0x40c0, 0x40a0, 0x4080, 0x4040, 0x4000, 0x3f80, 0x0000,
                           (short)0xbf80, (short)0xc000, (short)0xc040, (short)0xc080, (short)0xc0a0,
                           (short)0xc0c0, (short)0xc0e0, (short)0xc100, 0x40e0, 0x40c0, 0x40a0,
                           0x4080, 0x4040, 0x4000, 0x3f80, 0x0000, (short)0xbf80, (short)0xc000,
                           (short)0xc040, (short)0xc080, (short)0xc0a0, (short)0xc0c0,
                           (short)0xc0e0, (short)0xc100);
    for (int j = 0; j < 8; j++) {
        const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(r + 32 * j)));
        _mm512_store_si512((__m512i *)(bt + 64 * j), _mm512_permutexvar_epi16(v, table));
        _mm512_store_si512((__m512i *)(bt + 64 * j + 32), _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table));
    }
}

/* Block b's C (tile row r = row r) into the accumulators: times d (+ m times the block's sum). */
static inline __attribute__((always_inline)) void
tiled_scale(const int fmt, const float *cbuf, const uint8_t *rb, const float *sx, int64_t nb,
            __m512 *acc, const int RT) {
    const int64_t qbytes = tiled_qbytes(fmt);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rb + qbytes)));
#pragma GCC unroll 16
    for (int r = 0; r < RT; r++) acc[r] = _mm512_fmadd_ps(_mm512_load_ps(cbuf + 16 * r), d, acc[r]);
    if (fmt == Q4_1) {
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rb + qbytes + 32)));
#pragma GCC unroll 16
        for (int r = 0; r < RT; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(sx[r * nb]), m, acc[r]);
    }
}

/* One block's three products into C (tile register c): B in 0, A's parts in 1-3. */
#define TILED_BLOCK(c, bop, aop)                                                                   \
    do {                                                                                           \
        _tile_zero(c);                                                                             \
        _tile_loadd(0, (bop), 64);                                                                 \
        _tile_loadd(1, (aop), 64);                                                                 \
        _tile_loadd(2, (aop) + 512, 64);                                                           \
        _tile_loadd(3, (aop) + 1024, 64);                                                          \
        _tile_dpbf16ps(c, 1, 0);                                                                   \
        _tile_dpbf16ps(c, 2, 0);                                                                   \
        _tile_dpbf16ps(c, 3, 0);                                                                   \
    } while (0)

/* Blocks b0..b1-1 of one row tile (RT rows, a constant) of one group, in order, their B operands
 * at bt (block b0 first): the row tile's sums start at zero (first) or from y, and go back to y,
 * with the bias after the last block. C alternates between tile registers 4 and 5, so one block's
 * products run while the previous block's are scaled. */
static inline __attribute__((always_inline)) void
tiled_rows(const int fmt, const TiledJob *j, const uint8_t *wg, const uint16_t *bt, int64_t g,
           int64_t t, int64_t b0, int64_t b1, int first, int last, const int RT) {
    const int64_t nb = j->nb, rec = tiled_rec_bytes(fmt);
    const uint16_t *a = j->xs + t * nb * (3 * 512);
    const float *sx = j->sx + t * TILED_RT * nb;
    float *y = j->y + t * TILED_RT * j->stride_y + g * AMX_GROUP;
    float cbuf[TILED_RT * 16] __attribute__((aligned(64))); /* [row][16 outputs]: one block's C */
    __m512 acc[TILED_RT];                                    /* [row]: 16 outputs' sums */
    for (int r = 0; r < RT; r++) acc[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + r * j->stride_y);
    TILED_BLOCK(4, bt, a + b0 * 1536);
    for (int64_t b = b0; b < b1; b += 2) {
        if (b + 1 < b1) TILED_BLOCK(5, bt + 512 * (b + 1 - b0), a + (b + 1) * 1536);
        _tile_stored(4, cbuf, 64);
        tiled_scale(fmt, cbuf, wg + b * rec, sx + b, nb, acc, RT);
        if (b + 1 < b1) {
            if (b + 2 < b1) TILED_BLOCK(4, bt + 512 * (b + 2 - b0), a + (b + 2) * 1536);
            _tile_stored(5, cbuf, 64);
            tiled_scale(fmt, cbuf, wg + (b + 1) * rec, sx + b + 1, nb, acc, RT);
        }
    }
    const __m512 bias = last && j->bias ? _mm512_loadu_ps(j->bias + g * AMX_GROUP) : _mm512_setzero_ps();
    for (int r = 0; r < RT; r++) _mm512_storeu_ps(y + r * j->stride_y, _mm512_add_ps(acc[r], bias));
}

#define TILED_ROWS(F, RT) \
    case RT: tiled_rows(F, j, wg, bt, g, t, b0, b1, first, last, RT); break;
#define TILED_FORMAT(F)                                                                            \
    static void tiled_tile_##F(const TiledJob *j, const uint8_t *wg, const uint16_t *bt, int64_t g, \
                               int64_t t, int64_t b0, int64_t b1, int first, int last, int rt) {  \
        switch (rt) {                                                                              \
            TILED_ROWS(F, 1) TILED_ROWS(F, 2) TILED_ROWS(F, 3) TILED_ROWS(F, 4)                    \
            TILED_ROWS(F, 5) TILED_ROWS(F, 6) TILED_ROWS(F, 7) TILED_ROWS(F, 8)                    \
            TILED_ROWS(F, 9) TILED_ROWS(F, 10) TILED_ROWS(F, 11) TILED_ROWS(F, 12)                 \
            TILED_ROWS(F, 13) TILED_ROWS(F, 14) TILED_ROWS(F, 15) TILED_ROWS(F, 16)                \
        default: break;                                                                            \
        }                                                                                          \
    }
TILED_FORMAT(Q4_0)
TILED_FORMAT(Q4_1)
TILED_FORMAT(Q8_0)

static void tiled_part(void *p, int part, int parts) {
    const TiledJob job = *(const TiledJob *)p, *j = &job;
    const int64_t g_begin = j->groups * part / parts, g_end = j->groups * (part + 1) / parts;
    if (g_begin == g_end) return;
    /* the B operands of up to TILED_CHUNK blocks at a time: an L1-sized buffer */
    const int64_t chunks = (j->nb + TILED_CHUNK - 1) / TILED_CHUNK;
    /* [block of the chunk][16 rows][32] bf16: B operands, 1 KiB each */
    static __thread uint16_t bt[TILED_CHUNK * 512] __attribute__((aligned(64)));
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    /* one row tile of fewer rows is configured at its size (its products then cost less); more
     * tiles are padded with zero rows */
    const int ar = j->rows < TILED_RT ? (int)j->rows : TILED_RT;
    for (int i = 0; i < 6; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = i == 0 ? 16 : ar;
    }
    _tile_loadconfig(&cfg);
    const int64_t rec = tiled_rec_bytes(j->fmt), row_tiles = (j->rows + TILED_RT - 1) / TILED_RT;
    for (int64_t g = g_begin; g < g_end; g++) {
        const uint8_t *wg = j->w + g * j->nb * rec;
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t b0 = j->nb * c / chunks, b1 = j->nb * (c + 1) / chunks;
            for (int64_t b = b0; b < b1; b++) {
                /* the weights come from memory once: ask for them TILED_PREFETCH bytes ahead */
                const int64_t at = (g * j->nb + b) * rec + TILED_PREFETCH, size = j->groups * j->nb * rec;
                for (int64_t o = 0; o < rec && at + o < size; o += 64) __builtin_prefetch(j->w + at + o, 0, 3);
                switch (j->fmt) {
                case Q4_0: tiled_b(Q4_0, wg + b * rec, bt + 512 * (b - b0)); break;
                case Q4_1: tiled_b(Q4_1, wg + b * rec, bt + 512 * (b - b0)); break;
                default: tiled_b(Q8_0, wg + b * rec, bt + 512 * (b - b0)); break;
                }
            }
            for (int64_t t = 0; t < row_tiles; t++) {
                const int rt = j->rows - t * TILED_RT < TILED_RT ? (int)(j->rows - t * TILED_RT) : TILED_RT;
                const int first = c == 0, last = c == chunks - 1;
                switch (j->fmt) {
                case Q4_0: tiled_tile_Q4_0(j, wg, bt, g, t, b0, b1, first, last, rt); break;
                case Q4_1: tiled_tile_Q4_1(j, wg, bt, g, t, b0, b1, first, last, rt); break;
                default: tiled_tile_Q8_0(j, wg, bt, g, t, b0, b1, first, last, rt); break;
                }
            }
        }
    }
    _tile_release();
}

/* x -> the A operands (three bf16 parts per row, zero rows past the last) and (Q4_1) each
 * block's sum, in a buffer of the calling thread that grows to the largest call and is kept
 * (a decode step calls this ~150 times, and a fresh buffer of a few hundred KiB per call would
 * be a fresh mapping, page faults included): at most rows x in x 6 + rows x in / 8 bytes, 128
 * prefill rows at once (DIRECT_MAX_ROWS). */
static __thread void *tiled_buf;
static __thread size_t tiled_cap;

static inline __m512 bf16_to_ps(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

int quant_matmul_tiled(int fmt, const uint8_t *w, int64_t out_features, int64_t in, const float *x,
                       int64_t stride_x, int64_t rows, float *y, int64_t stride_y, const float *bias) {
    if (!quant_tile_supported()) return -1;
    const int64_t nb = in / 32, row_tiles = (rows + TILED_RT - 1) / TILED_RT;
    const int64_t padded = row_tiles > 1 ? row_tiles * TILED_RT : rows; /* one tile: its rows only */
    const size_t xs_bytes = (size_t)(row_tiles * nb * 3 * 1024), need = xs_bytes + (size_t)(padded * nb * 4);
    if (need > tiled_cap) {
        free(tiled_buf);
        tiled_buf = aligned_alloc(64, (need + 63) & ~(size_t)63);
        tiled_cap = tiled_buf ? need : 0;
        if (!tiled_buf) return -2;
    }
    uint16_t *xs = tiled_buf;
    float *sx = (float *)((uint8_t *)tiled_buf + xs_bytes);
    for (int64_t r = 0; r < padded; r++) {
        const int64_t t = r / TILED_RT, tr = r % TILED_RT;
        uint16_t *p = xs + t * nb * 1536 + tr * 32; /* block 0, part 0, row tr */
        const float *xr = x + (r < rows ? r : 0) * stride_x;
        for (int64_t b = 0; b < nb; b++, p += 1536) {
            if (r >= rows) {
                for (int s = 0; s < 3; s++) memset(p + 512 * s, 0, 64);
                continue;
            }
            for (int h = 0; h < 2; h++) {
                const __m512 v = _mm512_loadu_ps(xr + 32 * b + 16 * h);
                const __m256i hi = (__m256i)_mm512_cvtneps_pbh(v);
                const __m512 r1 = _mm512_sub_ps(v, bf16_to_ps(hi));
                const __m256i mid = (__m256i)_mm512_cvtneps_pbh(r1);
                const __m512 r2 = _mm512_sub_ps(r1, bf16_to_ps(mid));
                _mm256_store_si256((__m256i *)(p + 16 * h), hi);
                _mm256_store_si256((__m256i *)(p + 512 + 16 * h), mid);
                _mm256_store_si256((__m256i *)(p + 1024 + 16 * h), (__m256i)_mm512_cvtneps_pbh(r2));
            }
        }
        if (fmt == Q4_1)
            for (int64_t b = 0; b < nb; b++)
                sx[r * nb + b] = r >= rows ? 0.0f
                                           : reduce_add16(_mm512_add_ps(_mm512_loadu_ps(xr + 32 * b),
                                                                        _mm512_loadu_ps(xr + 32 * b + 16)));
    }
    TiledJob job = {fmt, w, nb, out_features / AMX_GROUP, xs, sx, rows, y, stride_y, bias};
    spin_pool_run(tiled_part, &job, quant_parts_for(out_features * rows * in));
    return 0;
}
#endif


#if !defined(QM_AMX)
int quant_matmul_tiled(int fmt, const uint8_t *w, int64_t out_features, int64_t in, const float *x,
                       int64_t stride_x, int64_t rows, float *y, int64_t stride_y, const float *bias) {
    (void)fmt, (void)w, (void)out_features, (void)in, (void)x, (void)stride_x, (void)rows, (void)y;
    (void)stride_y, (void)bias;
    return -1;
}
#endif
