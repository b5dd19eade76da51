/* Paged decode attention for CPUs: one query per sequence reads its keys and values where
 * they lie in the block pool, following its block table; nothing is copied out first.
 *
 * Each (sequence, KV head) pair is one task, run in parallel. The query heads that share the
 * KV head (grouped-query attention) are handled together, so each key and value is loaded
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
        TASK(q, k_cache, v_cache, table, len, out, n_kv_heads, GROUP, DIM, block_size, kvh, scale); \
        return 1;                                                                                \
    }
#define KNOWN_SHAPES(TASK)                                                                       \
    SHAPE(TASK, 32, 1) SHAPE(TASK, 32, 2) SHAPE(TASK, 32, 4) SHAPE(TASK, 32, 8)                  \
    SHAPE(TASK, 64, 1) SHAPE(TASK, 64, 2) SHAPE(TASK, 64, 4) SHAPE(TASK, 64, 8)                  \
    SHAPE(TASK, 128, 1) SHAPE(TASK, 128, 2) SHAPE(TASK, 128, 4) SHAPE(TASK, 128, 8)

/* One (sequence, KV head) task. always_inline, so each call site below with a constant
 * head_dim becomes its own specialised, fully vectorised copy. */
#define DEFINE_KERNEL(NAME, T, LOAD, STORE)                                                      \
static inline __attribute__((always_inline)) void NAME##_task(                                  \
        const T *q, const T *k_cache, const T *v_cache, const int32_t *table, int len, T *out,  \
        int n_kv_heads, int group, int head_dim, int block_size, int kvh, float scale) {        \
    const int D = head_dim, G = group, BS = block_size;                                          \
    const int CH = BS >= CHUNK ? BS : CHUNK / BS * BS;                                           \
    const long slot_stride = (long)n_kv_heads * D;                                               \
    float qs[G * D], acc[G * D], row_max[G], row_sum[G], p[G * CH];                              \
    for (int i = 0; i < G * D; i++) { qs[i] = LOAD(q[i]) * scale; acc[i] = 0.f; }                \
    /* finite: -ffast-math assumes no infinities; exp(-3e38 - score) is 0 all the same */       \
    for (int g = 0; g < G; g++) { row_max[g] = -3.0e38f; row_sum[g] = 0.f; }                     \
    for (int start = 0; start < len; start += CH) {                                              \
        const int n = len - start < CH ? len - start : CH;                                       \
        for (int i = 0; i < n; i += BS) {                /* scores: q . k for each position */ \
            const T *kb = k_cache + ((long)table[(start + i) / BS] * BS * n_kv_heads + kvh) * D; \
            const int count = n - i < BS ? n - i : BS;                                           \
            const T *next = i + BS < n ? k_cache + ((long)table[(start + i) / BS + 1] * BS * n_kv_heads + kvh) * D \
                                       : v_cache + ((long)table[start / BS] * BS * n_kv_heads + kvh) * D; \
            for (int t = 0; t < count; t++) {                                                    \
                const T *k = kb + t * slot_stride;                                               \
                PREFETCH_ROW(T, next + t * slot_stride, D)                                       \
                for (int g = 0; g < G; g++) {                                                    \
                    float s = 0.f;                                                               \
                    for (int d = 0; d < D; d++) s += qs[g * D + d] * LOAD(k[d]);                 \
                    p[g * CH + i + t] = s;                                                       \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int g = 0; g < G; g++) {                    /* online softmax over the chunk */    \
            float *pg = p + g * CH, new_max = row_max[g], sum = 0.f;                             \
            for (int i = 0; i < n; i++) new_max = pg[i] > new_max ? pg[i] : new_max;             \
            const float rescale = expf(row_max[g] - new_max);                                    \
            for (int i = 0; i < n; i++) { pg[i] = expf(pg[i] - new_max); sum += pg[i]; }         \
            row_sum[g] = row_sum[g] * rescale + sum;                                             \
            row_max[g] = new_max;                                                                \
            for (int d = 0; d < D; d++) acc[g * D + d] *= rescale;                               \
        }                                                                                        \
        for (int i = 0; i < n; i += BS) {                /* values weighted by probability */   \
            const T *vb = v_cache + ((long)table[(start + i) / BS] * BS * n_kv_heads + kvh) * D; \
            const int count = n - i < BS ? n - i : BS;                                           \
            const T *next = i + BS < n ? v_cache + ((long)table[(start + i) / BS + 1] * BS * n_kv_heads + kvh) * D \
                          : start + n < len ? k_cache + ((long)table[(start + n) / BS] * BS * n_kv_heads + kvh) * D \
                          : vb;                                                                  \
            for (int t = 0; t < count; t++) {                                                    \
                const T *v = vb + t * slot_stride;                                               \
                PREFETCH_ROW(T, next + t * slot_stride, D)                                       \
                for (int g = 0; g < G; g++) {                                                    \
                    const float w = p[g * CH + i + t];                                           \
                    for (int d = 0; d < D; d++) acc[g * D + d] += w * LOAD(v[d]);                \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }                                                                                            \
    for (int g = 0; g < G; g++) {                                                                \
        const float inv = 1.f / row_sum[g];                                                      \
        for (int d = 0; d < D; d++) out[g * D + d] = STORE(acc[g * D + d] * inv);                \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
static int NAME##_known_shape(const T *q, const T *k_cache, const T *v_cache,                   \
        const int32_t *table, int len, T *out, int n_kv_heads, int group, int head_dim,          \
        int block_size, int kvh, float scale) {                                                  \
    KNOWN_SHAPES(NAME##_task)                                                                    \
    return 0;                                                                                    \
}                                                                                                \
                                                                                                 \
void NAME(const T *q, const T *k_cache, const T *v_cache, const int32_t *block_tables,           \
          const int32_t *context_lens, T *out, int n_seqs, int n_heads, int n_kv_heads,          \
          int head_dim, int block_size, int table_width, float scale, int n_threads) {           \
    const int G = n_heads / n_kv_heads;                                                          \
    _Pragma("omp parallel for collapse(2) schedule(dynamic, 1) num_threads(n_threads) if(n_threads > 1)") \
    for (int s = 0; s < n_seqs; s++)                                                             \
        for (int kvh = 0; kvh < n_kv_heads; kvh++) {                                             \
            const long off = ((long)s * n_heads + (long)kvh * G) * head_dim;                     \
            const int32_t *table = block_tables + (long)s * table_width;                         \
            const int len = context_lens[s];                                                     \
            /* common shapes get their own copies, with every loop bound known */              \
            if (!NAME##_known_shape(q + off, k_cache, v_cache, table, len, out + off, n_kv_heads,\
                                    G, head_dim, block_size, kvh, scale))                        \
                NAME##_task(q + off, k_cache, v_cache, table, len, out + off, n_kv_heads, G,     \
                            head_dim, block_size, kvh, scale);                                   \
        }                                                                                        \
}

DEFINE_KERNEL(paged_decode_f32, float, LOAD_F32, STORE_F32)
DEFINE_KERNEL(paged_decode_bf16, uint16_t, bf16_to_f32, f32_to_bf16)
