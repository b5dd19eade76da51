/* Paged decode attention for CPUs: one query per sequence reads its keys and values where
 * they lie in the block pool, following its block table; nothing is copied out first.
 *
 * A sequence is one task, run in parallel with the others (or one task per KV head when
 * there are too few sequences to keep every thread busy). The query heads that share a KV
 * head (grouped-query attention) are handled together, so each key and value is loaded
 * once for all of them. Positions are taken a chunk at a time (CHUNK tokens, whole blocks):
 * scores for the chunk, then an online-softmax update (running max and sum, the
 * accumulator rescaled when the max grows), then the values weighted by the chunk's
 * probabilities. Long chunks keep the exponentials in vectorised loops.
 *
 * Layouts (all contiguous): q, out [n_seqs, n_heads, head_dim]; k_cache, v_cache
 * [num_blocks, block_size, n_kv_heads, head_dim]; block_tables [n_seqs, table_width] int32;
 * context_lens [n_seqs] int32, each >= 1. Query head h reads KV head h / (n_heads / n_kv_heads). */
#include <stdint.h>
#include <math.h>

#define CHUNK 256

static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)x << 16;
    return c.f;
}

static inline uint16_t f32_to_bf16(float f) {   /* round to nearest even, as torch does */
    union { uint32_t u; float f; } c;
    c.f = f;
    if ((c.u & 0x7fffffff) > 0x7f800000) return (uint16_t)((c.u >> 16) | 0x40);   /* NaN */
    return (uint16_t)((c.u + 0x7fff + ((c.u >> 16) & 1)) >> 16);
}

/* Blocks lie anywhere in the pool, a page or less each, so the hardware prefetcher, which
 * follows a stream within a page, starts cold at every block. While a block is read, the
 * same rows of the block read next are requested, one row per row read. */
#define PREFETCH_ROW(T, row, D)                                                                 \
    for (int pl = 0; pl < ((int)sizeof(T) * (D) + 63) / 64; pl++)                               \
        __builtin_prefetch((const char *)(row) + 64 * pl, 0, 3);

#define LOAD_F32(x) (x)
#define STORE_F32(x) (x)

/* head_dim x query heads per KV head that get their own specialised copy */
#define SHAPE(TASK, DIM, GROUP)                                                                  \
    if (head_dim == DIM && group == GROUP) {                                                     \
        TASK(q, k_cache, v_cache, table, len, out, n_kv_heads, GROUP, DIM, block_size, kvh, nkv, scale); \
        return 1;                                                                                \
    }
#define KNOWN_SHAPES(TASK)                                                                       \
    SHAPE(TASK, 32, 1) SHAPE(TASK, 32, 2) SHAPE(TASK, 32, 4) SHAPE(TASK, 32, 8)                  \
    SHAPE(TASK, 64, 1) SHAPE(TASK, 64, 2) SHAPE(TASK, 64, 4) SHAPE(TASK, 64, 8)                  \
    SHAPE(TASK, 128, 1) SHAPE(TASK, 128, 2) SHAPE(TASK, 128, 4) SHAPE(TASK, 128, 8)

/* One task: a sequence's KV heads kvh .. kvh + nkv - 1 and their query heads. Taking a
 * sequence's KV heads together reads each block's rows whole, in address order.
 * always_inline, so each call site below with a constant head_dim becomes its own
 * specialised, fully vectorised copy. */
#define DEFINE_KERNEL(NAME, T, LOAD, STORE)                                                      \
static inline __attribute__((always_inline)) void NAME##_task(                                  \
        const T *q, const T *k_cache, const T *v_cache, const int32_t *table, int len, T *out,  \
        int n_kv_heads, int group, int head_dim, int block_size, int kvh, int nkv, float scale) { \
    const int D = head_dim, G = group, BS = block_size, H = nkv * group;                         \
    const int CH = BS >= CHUNK ? BS : CHUNK / BS * BS;                                           \
    const long slot_stride = (long)n_kv_heads * D;                                               \
    float qs[H * D], acc[H * D], row_max[H], row_sum[H], p[H * CH];                              \
    for (int i = 0; i < H * D; i++) { qs[i] = LOAD(q[i]) * scale; acc[i] = 0.f; }                \
    /* finite: -ffast-math assumes no infinities; exp(-3e38 - score) is 0 all the same */       \
    for (int h = 0; h < H; h++) { row_max[h] = -3.0e38f; row_sum[h] = 0.f; }                     \
    for (int start = 0; start < len; start += CH) {                                              \
        const int n = len - start < CH ? len - start : CH;                                       \
        for (int i = 0; i < n; i += BS) {                /* scores: q . k for each position */ \
            const T *kb = k_cache + ((long)table[(start + i) / BS] * BS * n_kv_heads + kvh) * D; \
            const int count = n - i < BS ? n - i : BS;                                           \
            const T *next = i + BS < n ? k_cache + ((long)table[(start + i) / BS + 1] * BS * n_kv_heads + kvh) * D \
                                       : v_cache + ((long)table[start / BS] * BS * n_kv_heads + kvh) * D; \
            for (int t = 0; t < count; t++) {                                                    \
                PREFETCH_ROW(T, next + t * slot_stride, nkv * D)                                 \
                for (int j = 0; j < nkv; j++) {                                                  \
                    const T *k = kb + t * slot_stride + j * D;                                   \
                    for (int g = 0; g < G; g++) {                                                \
                        float s = 0.f;                                                           \
                        for (int d = 0; d < D; d++) s += qs[(j * G + g) * D + d] * LOAD(k[d]);   \
                        p[(j * G + g) * CH + i + t] = s;                                         \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int h = 0; h < H; h++) {                    /* online softmax over the chunk */    \
            float *ph = p + h * CH, new_max = row_max[h], sum = 0.f;                             \
            for (int i = 0; i < n; i++) new_max = ph[i] > new_max ? ph[i] : new_max;             \
            const float rescale = expf(row_max[h] - new_max);                                    \
            for (int i = 0; i < n; i++) { ph[i] = expf(ph[i] - new_max); sum += ph[i]; }         \
            row_sum[h] = row_sum[h] * rescale + sum;                                             \
            row_max[h] = new_max;                                                                \
            for (int d = 0; d < D; d++) acc[h * D + d] *= rescale;                               \
        }                                                                                        \
        for (int i = 0; i < n; i += BS) {                /* values weighted by probability */   \
            const T *vb = v_cache + ((long)table[(start + i) / BS] * BS * n_kv_heads + kvh) * D; \
            const int count = n - i < BS ? n - i : BS;                                           \
            const T *next = i + BS < n ? v_cache + ((long)table[(start + i) / BS + 1] * BS * n_kv_heads + kvh) * D \
                          : start + n < len ? k_cache + ((long)table[(start + n) / BS] * BS * n_kv_heads + kvh) * D \
                          : vb;                                                                  \
            for (int t = 0; t < count; t++) {                                                    \
                PREFETCH_ROW(T, next + t * slot_stride, nkv * D)                                 \
                for (int j = 0; j < nkv; j++) {                                                  \
                    const T *v = vb + t * slot_stride + j * D;                                   \
                    for (int g = 0; g < G; g++) {                                                \
                        const float w = p[(j * G + g) * CH + i + t];                             \
                        for (int d = 0; d < D; d++) acc[(j * G + g) * D + d] += w * LOAD(v[d]);  \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    for (int h = 0; h < H; h++) {                                                                \
        const float inv = 1.f / row_sum[h];                                                      \
        for (int d = 0; d < D; d++) out[h * D + d] = STORE(acc[h * D + d] * inv);                \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
static int NAME##_known_shape(const T *q, const T *k_cache, const T *v_cache,                   \
        const int32_t *table, int len, T *out, int n_kv_heads, int group, int head_dim,          \
        int block_size, int kvh, int nkv, float scale) {                                         \
    KNOWN_SHAPES(NAME##_task)                                                                    \
    return 0;                                                                                    \
}                                                                                                \
                                                                                                 \
void NAME(const T *q, const T *k_cache, const T *v_cache, const int32_t *block_tables,           \
          const int32_t *context_lens, T *out, int n_seqs, int n_heads, int n_kv_heads,          \
          int head_dim, int block_size, int table_width, float scale, int n_threads) {           \
    const int G = n_heads / n_kv_heads;                                                          \
    /* a sequence's KV heads in one task, unless that leaves threads without work */            \
    const int nkv = n_seqs >= 2 * n_threads ? n_kv_heads : 1;                                    \
    const int tasks_per_seq = n_kv_heads / nkv;                                                  \
    _Pragma("omp parallel for collapse(2) schedule(dynamic, 1) num_threads(n_threads) if(n_threads > 1)") \
    for (int s = 0; s < n_seqs; s++)                                                             \
        for (int task = 0; task < tasks_per_seq; task++) {                                       \
            const int kvh = task * nkv;                                                          \
            const long off = ((long)s * n_heads + (long)kvh * G) * head_dim;                     \
            const int32_t *table = block_tables + (long)s * table_width;                         \
            const int len = context_lens[s];                                                     \
            /* common shapes get their own copies, with every loop bound known */              \
            if (!NAME##_known_shape(q + off, k_cache, v_cache, table, len, out + off, n_kv_heads,\
                                    G, head_dim, block_size, kvh, nkv, scale))                   \
                NAME##_task(q + off, k_cache, v_cache, table, len, out + off, n_kv_heads, G,     \
                            head_dim, block_size, kvh, nkv, scale);                              \
        }                                                                                        \
}

DEFINE_KERNEL(paged_decode_f32, float, LOAD_F32, STORE_F32)
DEFINE_KERNEL(paged_decode_bf16, uint16_t, bf16_to_f32, f32_to_bf16)
