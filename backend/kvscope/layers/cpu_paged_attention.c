/* Paged attention for CPUs: queries read their keys and values where they lie in the block
 * pool, following their block tables; nothing is copied out first. Two kernels:
 *
 * paged_decode_*: one query row at a time, each with its own context (decode rows, and
 * spans of a few tokens). A sequence is one task, run in parallel with the others (or one
 * task per KV head when there are too few sequences to keep every thread busy). The query
 * heads that share a KV head (grouped-query attention) are handled together, so each key
 * and value is loaded once for all of them. Positions are taken a chunk at a time (CHUNK
 * tokens, whole blocks): scores for the chunk, then an online-softmax update (running max
 * and sum, the accumulator rescaled when the max grows), then the values weighted by the
 * chunk's probabilities. Long chunks keep the exponentials in vectorised loops.
 *
 * paged_prefill_*: causal attention for spans (prompts, chunks), a tile of TILE query
 * positions at a time, so each key is loaded once for the whole tile instead of once per
 * query. Further below.
 *
 * Layouts (all contiguous): q, out [n_seqs, n_heads, head_dim]; k_cache, v_cache
 * [num_blocks, block_size, n_kv_heads, head_dim]; block_tables [n_seqs, table_width] int32;
 * context_lens [n_seqs] int32, each >= 1. Query head h reads KV head h / (n_heads / n_kv_heads).
 * A watched decode row (someone draws its attention) also keeps its scores as it goes and
 * writes its softmax weights at the end, so they cost no second pass over the keys (`watch`). */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

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
        TASK(q, k_cache, v_cache, table, len, out, n_kv_heads, GROUP, DIM, block_size, kvh, nkv, scale, \
             probs, width);                                                                      \
        return 1;                                                                                \
    }
#define KNOWN_SHAPES(TASK)                                                                       \
    SHAPE(TASK, 32, 1) SHAPE(TASK, 32, 2) SHAPE(TASK, 32, 4) SHAPE(TASK, 32, 8)                  \
    SHAPE(TASK, 64, 1) SHAPE(TASK, 64, 2) SHAPE(TASK, 64, 4) SHAPE(TASK, 64, 8)                  \
    SHAPE(TASK, 128, 1) SHAPE(TASK, 128, 2) SHAPE(TASK, 128, 4) SHAPE(TASK, 128, 8)

/* A watched row's place in the decode kernel's `watch` descriptor, or -1. The descriptor: the
 * addresses of int32 slots [n_slots] (each row's watched index, -1: not watched), float16
 * weights [n_watched, n_heads, width] and means [n_watched, width], then n_slots, n_watched,
 * width. Whoever fills it may be wrong about this step: nothing is read or written outside
 * what it names. */
enum { WATCH_SLOTS, WATCH_WEIGHTS, WATCH_MEANS, WATCH_N_SLOTS, WATCH_N_WATCHED, WATCH_WIDTH, WATCH_FIELDS };

static inline int watched_slot(const int64_t *watch, int s, int len) {
    if (s >= watch[WATCH_N_SLOTS] || len > watch[WATCH_WIDTH]) return -1;
    const int w = ((const int32_t *)(intptr_t)watch[WATCH_SLOTS])[s];
    return w < watch[WATCH_N_WATCHED] ? w : -1;
}

static void watched_weights(const int64_t *watch, const float *scratch, const int32_t *context_lens,
                            int n_seqs, int n_heads);

/* One task: a sequence's KV heads kvh .. kvh + nkv - 1 and their query heads. Taking a
 * sequence's KV heads together reads each block's rows whole, in address order.
 * always_inline, so each call site below with a constant head_dim becomes its own
 * specialised, fully vectorised copy. */
#define DEFINE_KERNEL(NAME, T, LOAD, STORE)                                                      \
static inline __attribute__((always_inline)) void NAME##_task(                                  \
        const T *q, const T *k_cache, const T *v_cache, const int32_t *table, int len, T *out,  \
        int n_kv_heads, int group, int head_dim, int block_size, int kvh, int nkv, float scale,  \
        float *probs, int width) {                                                               \
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
            if (probs) memcpy(probs + (long)h * width + start, ph, sizeof(float) * n);  /* watched */ \
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
        if (probs) {                     /* a watched row's scores become its probabilities */  \
            float *ph = probs + (long)h * width;                                                 \
            for (int i = 0; i < len; i++) ph[i] = expf(ph[i] - row_max[h]) * inv;                \
        }                                                                                        \
    }                                                                                            \
}                                                                                                \
                                                                                                 \
static int NAME##_known_shape(const T *q, const T *k_cache, const T *v_cache,                   \
        const int32_t *table, int len, T *out, int n_kv_heads, int group, int head_dim,          \
        int block_size, int kvh, int nkv, float scale, float *probs, int width) {                \
    KNOWN_SHAPES(NAME##_task)                                                                    \
    return 0;                                                                                    \
}                                                                                                \
                                                                                                 \
void NAME(const T *q, const T *k_cache, const T *v_cache, const int32_t *block_tables,           \
          const int32_t *context_lens, T *out, const int64_t *watch, int n_seqs, int n_heads,    \
          int n_kv_heads, int head_dim, int block_size, int table_width, float scale, int n_threads) { \
    const int G = n_heads / n_kv_heads;                                                          \
    /* watched rows keep their scores while the keys are read: no second pass over them */     \
    if (watch && !watch[WATCH_SLOTS]) watch = NULL;                                              \
    const int width = watch ? (int)watch[WATCH_WIDTH] : 0;                                       \
    float *scratch = watch ? malloc(sizeof(float) * watch[WATCH_N_WATCHED] * n_heads * width) : NULL; \
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
            const int w = scratch ? watched_slot(watch, s, len) : -1;                            \
            float *probs = w < 0 ? NULL : scratch + ((long)w * n_heads + (long)kvh * G) * width; \
            /* common shapes get their own copies, with every loop bound known */              \
            if (!NAME##_known_shape(q + off, k_cache, v_cache, table, len, out + off, n_kv_heads,\
                                    G, head_dim, block_size, kvh, nkv, scale, probs, width))     \
                NAME##_task(q + off, k_cache, v_cache, table, len, out + off, n_kv_heads, G,     \
                            head_dim, block_size, kvh, nkv, scale, probs, width);                \
        }                                                                                        \
    if (scratch) {                                                                               \
        watched_weights(watch, scratch, context_lens, n_seqs, n_heads);                          \
        free(scratch);                                                                           \
    }                                                                                            \
}

DEFINE_KERNEL(paged_decode_f32, float, LOAD_F32, STORE_F32)
DEFINE_KERNEL(paged_decode_bf16, uint16_t, bf16_to_f32, f32_to_bf16)


/* ---- spans: causal attention over a tile of query positions ---------------------------------
 * A task is one KV head and a tile of up to TILE consecutive positions of one span, whose
 * rows are those positions times the query heads of that KV head. Keys come KEYS at a time
 * (read through the block table, transposed into a local buffer), and each ROWS rows score
 * them together: their sums are independent, so the multiply-adds overlap instead of
 * waiting on each other. A row sees keys up to its own position (causal), and a chunk
 * past every row of the tile is never read. GCC/clang vector types give the 16-lane
 * arithmetic on any target; -march=native turns each into one AVX-512 instruction.
 *
 * Layouts: q, out [tokens, n_heads, head_dim]; span s has q_lens[s] rows from q_starts[s],
 * at positions starts[s] .. starts[s] + q_lens[s] - 1, and its context (positions 0 ..
 * starts[s] + q_lens[s] - 1, this step's keys already written) in block_tables row s. */

#define TILE 16
#define KEYS 16
#define ROWS 8

typedef float vf __attribute__((vector_size(KEYS * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(KEYS * sizeof(int32_t))));

static inline vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf vselect(vi keep, vf a, vf b) { return (vf)(((vi)a & keep) | ((vi)b & ~keep)); }
static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }
static inline vf vadd(vf a, vf b) { return a + b; }
#if defined(__clang__) || __GNUC__ >= 12
/* lane reductions in four halvings (a loop over lanes compiles to sixteen scalar steps) */
#define REDUCE(OP, x)                                                                            \
    x = OP(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7)); \
    x = OP(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3));   \
    x = OP(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1));   \
    x = OP(x, __builtin_shufflevector(x, x, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0));   \
    return x[0];
#else
#define REDUCE(OP, x)                                                                            \
    vf acc = x;                                                                                  \
    for (int i = 1; i < KEYS; i++) acc[0] = OP(acc, __extension__ (vf){x[i]})[0];                \
    return acc[0];
#endif
static inline float hmax(vf x) { REDUCE(vmax, x) }
static inline float hsum(vf x) { REDUCE(vadd, x) }

/* query row r's element d, stored ROWS rows at a time as [d][row]: the rows scored
 * together read consecutive floats */
#define QIDX(r, d) (((r) / ROWS * DP + (d)) * ROWS + (r) % ROWS)

#define DEFINE_PREFILL(NAME, T, LOAD, STORE)                                                     \
static inline __attribute__((always_inline)) void NAME##_task(                                  \
        const T *q, const T *k_cache, const T *v_cache, const int32_t *table, T *out,            \
        int first, int count, int n_heads, int n_kv_heads, int group, int head_dim,              \
        int block_size, int kvh, float scale) {                                                  \
    /* head_dim padded with zeros to whole vectors: padded dims add 0 to scores and outputs */ \
    const int D = head_dim, DP = (head_dim + KEYS - 1) / KEYS * KEYS, DV = DP / KEYS, G = group; \
    const int RP = (count * G + ROWS - 1) / ROWS * ROWS;                                         \
    const long row_stride = (long)n_heads * D, slot_stride = (long)n_kv_heads * D;               \
    float qs[RP * DP], row_max[RP], row_sum[RP], kt[DP * KEYS], p[ROWS * KEYS], m_new[ROWS], resc[ROWS]; \
    vf acc[RP * DV], vv[KEYS * DV];                                                              \
    float *vflat = (float *)vv;                                                                  \
    const vi iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};                      \
    memset(qs, 0, sizeof qs);                                                                    \
    memset(vv, 0, sizeof vv);                                                                    \
    memset(acc, 0, sizeof acc);                                                                  \
    for (int i = 0; i < count; i++)                                                              \
        for (int g = 0; g < G; g++)                                                              \
            for (int d = 0; d < D; d++)                                                          \
                qs[QIDX(i * G + g, d)] = LOAD(q[i * row_stride + (kvh * G + g) * D + d]) * scale; \
    for (int r = 0; r < RP; r++) { row_max[r] = -3.0e38f; row_sum[r] = 0.f; }                    \
    const int end = first + count;            /* the tile's last row sees keys 0 .. end - 1 */  \
    for (int k0 = 0; k0 < end; k0 += KEYS) {                                                     \
        const int n = end - k0 < KEYS ? end - k0 : KEYS;                                         \
        for (int j = 0; j < n; j++) {                                                            \
            const int pos = k0 + j;                                                              \
            const long slot = (long)table[pos / block_size] * block_size + pos % block_size;     \
            const T *k = k_cache + slot * slot_stride + kvh * D, *v = v_cache + slot * slot_stride + kvh * D; \
            for (int d = 0; d < D; d++) { kt[d * KEYS + j] = LOAD(k[d]); vflat[j * DP + d] = LOAD(v[d]); } \
        }                                                                                        \
        for (int j = n; j < KEYS; j++)       /* past the context: finite, and masked below */   \
            for (int d = 0; d < D; d++) { kt[d * KEYS + j] = 0.f; vflat[j * DP + d] = 0.f; }     \
        const int i0 = k0 > first ? k0 - first : 0;   /* rows before i0 see none of the chunk */\
        for (int r0 = i0 * G / ROWS * ROWS; r0 < RP; r0 += ROWS) {                               \
            vf s[ROWS];                                                                          \
            for (int b = 0; b < ROWS; b++) s[b] = (vf){0};                                       \
            for (int d = 0; d < D; d++) {                                                        \
                const vf k = vload(kt + d * KEYS);                                               \
                for (int b = 0; b < ROWS; b++) s[b] += qs[QIDX(r0 + b, d)] * k;                  \
            }                                                                                    \
            for (int b = 0; b < ROWS; b++) {                                                     \
                const int visible = first + (r0 + b) / G - k0 + 1;   /* keys this row sees */   \
                if (visible < KEYS)                                                              \
                    s[b] = vselect(iota < visible, s[b], (vf){0} - 3.0e38f);                     \
                const float m = hmax(s[b]);                                                      \
                m_new[b] = m > row_max[r0 + b] ? m : row_max[r0 + b];                            \
                /* within exp's fast range (glibc's vector exp takes a slow path per lane      \
                 * outside it): a masked key weighs e^-87, 1e-38 of the row's largest */        \
                const vf x = s[b] - m_new[b];                                                    \
                vstore(p + b * KEYS, vselect(x > -87.f, x, (vf){0} - 87.f));                     \
            }                                                                                    \
            _Pragma("omp simd")                                                                  \
            for (int x = 0; x < ROWS * KEYS; x++) p[x] = expf(p[x]);                             \
            _Pragma("omp simd")                                                                  \
            for (int b = 0; b < ROWS; b++) resc[b] = expf(row_max[r0 + b] - m_new[b]);           \
            vf a[ROWS * DV];                                                                     \
            for (int b = 0; b < ROWS; b++) {                                                     \
                row_sum[r0 + b] = row_sum[r0 + b] * resc[b] + hsum(vload(p + b * KEYS));         \
                row_max[r0 + b] = m_new[b];                                                      \
                for (int dv = 0; dv < DV; dv++) a[b * DV + dv] = acc[(r0 + b) * DV + dv] * resc[b]; \
            }                                                                                    \
            for (int j = 0; j < KEYS; j++)                                                       \
                for (int b = 0; b < ROWS; b++) {                                                 \
                    const float w = p[b * KEYS + j];                                             \
                    for (int dv = 0; dv < DV; dv++) a[b * DV + dv] += w * vv[j * DV + dv];       \
                }                                                                                \
            memcpy(acc + r0 * DV, a, sizeof a);                                                  \
        }                                                                                        \
    }                                                                                            \
    for (int i = 0; i < count; i++)                                                              \
        for (int g = 0; g < G; g++) {                                                            \
            const float inv = 1.f / row_sum[i * G + g];                                          \
            const float *ar = (const float *)(acc + (i * G + g) * DV);                           \
            for (int d = 0; d < D; d++)                                                          \
                out[i * row_stride + (kvh * G + g) * D + d] = STORE(ar[d] * inv);                \
        }                                                                                        \
}                                                                                                \
                                                                                                 \
static void NAME##_tile(const T *q, const T *k_cache, const T *v_cache, const int32_t *table,    \
        T *out, int first, int count, int n_heads, int n_kv_heads, int group, int head_dim,      \
        int block_size, int kvh, float scale) {                                                  \
    PREFILL_SHAPES(NAME##_task)                                                                  \
    NAME##_task(q, k_cache, v_cache, table, out, first, count, n_heads, n_kv_heads, group,       \
                head_dim, block_size, kvh, scale);                                               \
}                                                                                                \
                                                                                                 \
void NAME(const T *q, const T *k_cache, const T *v_cache, const int32_t *block_tables,           \
          const int32_t *q_starts, const int32_t *q_lens, const int32_t *starts, T *out,         \
          int n_spans, int n_heads, int n_kv_heads, int head_dim, int block_size,                \
          int table_width, float scale, int n_threads) {                                         \
    int n_tiles = 0;                                                                             \
    for (int s = 0; s < n_spans; s++) n_tiles += (q_lens[s] + TILE - 1) / TILE;                  \
    int tile_span[n_tiles + 1], tile_first[n_tiles + 1];   /* a step's tokens / 16: small */ \
    for (int s = 0, t = 0; s < n_spans; s++)                                                     \
        for (int i = 0; i < q_lens[s]; i += TILE, t++) { tile_span[t] = s; tile_first[t] = i; }  \
    const int G = n_heads / n_kv_heads, n_tasks = n_tiles * n_kv_heads;                          \
    /* a span's last tiles read the most keys: they go first, the short ones fill in */        \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(n_threads) if(n_threads > 1)")   \
    for (int task = n_tasks - 1; task >= 0; task--) {                                            \
        const int t = task / n_kv_heads, kvh = task % n_kv_heads, s = tile_span[t], i = tile_first[t]; \
        const int count = q_lens[s] - i < TILE ? q_lens[s] - i : TILE;                           \
        const long row = (long)(q_starts[s] + i) * n_heads * head_dim;                          \
        NAME##_tile(q + row, k_cache, v_cache, block_tables + (long)s * table_width, out + row,  \
                    starts[s] + i, count, n_heads, n_kv_heads, G, head_dim, block_size, kvh, scale); \
    }                                                                                            \
}

#define PREFILL_SHAPE(TASK, DIM, GROUP)                                                          \
    if (head_dim == DIM && group == GROUP) {                                                     \
        TASK(q, k_cache, v_cache, table, out, first, count, n_heads, n_kv_heads, GROUP, DIM,     \
             block_size, kvh, scale);                                                            \
        return;                                                                                  \
    }
#define PREFILL_SHAPES(TASK)                                                                     \
    PREFILL_SHAPE(TASK, 32, 1) PREFILL_SHAPE(TASK, 32, 2) PREFILL_SHAPE(TASK, 32, 4) PREFILL_SHAPE(TASK, 32, 8) \
    PREFILL_SHAPE(TASK, 64, 1) PREFILL_SHAPE(TASK, 64, 2) PREFILL_SHAPE(TASK, 64, 4) PREFILL_SHAPE(TASK, 64, 8) \
    PREFILL_SHAPE(TASK, 128, 1) PREFILL_SHAPE(TASK, 128, 2) PREFILL_SHAPE(TASK, 128, 4) PREFILL_SHAPE(TASK, 128, 8)

DEFINE_PREFILL(paged_prefill_f32, float, LOAD_F32, STORE_F32)
DEFINE_PREFILL(paged_prefill_bf16, uint16_t, bf16_to_f32, f32_to_bf16)


/* ---- weights: the softmax a row's query gives its context, written out ---------------------
 * For capture (instrumentation/capture.py): a watched row's attention weights, read from the
 * keys where they lie, as the decode kernel reads them, instead of copying each row's
 * context out of the pool first. A task is one row: its scores for every position below its
 * length, each slot's keys read whole (every KV head) in address order with the next
 * block's rows requested ahead, then a softmax per query head, in float32, written out in
 * float16 (what is sent to a browser), with the mean over the heads beside it (the widget's
 * "all heads" view), so no pass over the weights is left to do after the call. Positions from
 * the row's length to out_width are written as 0, so rows of different lengths share one
 * output. A causal span is rows of one block table with lengths position + 1.
 *
 * Layouts: q [n_rows, n_heads, head_dim]; block_tables [n_rows, table_width];
 * context_lens [n_rows], each >= 1; out [n_rows, n_heads, out_width] float16; mean
 * [n_rows, out_width] float16, or NULL for none. */

/* float32 -> float16, rounding to nearest even as torch does: eight at a time with F16C's
 * instruction where the CPU has it (compilers do not vectorise the conversion themselves),
 * else the compiler's half type, else by hand (F. Giesen's float_to_half_fast3_rtne). */
#if defined(__F16C__)
#include <immintrin.h>
static inline uint16_t f32_to_f16(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#elif defined(__FLT16_MAX__)
static inline uint16_t f32_to_f16(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}
#else
static inline uint16_t f32_to_f16(float f) {
    union { uint32_t u; float f; } c;
    c.f = f;
    const uint32_t sign = c.u & 0x80000000u;
    c.u ^= sign;
    uint16_t o;
    if (c.u >= (143u << 23)) o = c.u > (255u << 23) ? 0x7e00 : 0x7c00;   /* too large: inf; NaN */
    else if (c.u < (113u << 23)) {   /* a subnormal half: 0.5 lines its bits up at the bottom */
        c.f += 0.5f;
        o = (uint16_t)(c.u - (126u << 23));
    } else {
        const uint32_t odd = (c.u >> 13) & 1;
        c.u += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
        o = (uint16_t)(c.u >> 13);
    }
    return o | (uint16_t)(sign >> 16);
}
#endif

static inline void to_halves(const float *x, uint16_t *out, int n) {
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) out[i] = f32_to_f16(x[i]);
}

/* The watched rows' probabilities (scratch [n_watched, n_heads, width], float32) into the
 * descriptor's weights, and their mean over the heads into its means, in half precision. */
static void watched_weights(const int64_t *watch, const float *scratch, const int32_t *context_lens,
                            int n_seqs, int n_heads) {
    const int width = (int)watch[WATCH_WIDTH];
    uint16_t *weights = (uint16_t *)(intptr_t)watch[WATCH_WEIGHTS], *means = (uint16_t *)(intptr_t)watch[WATCH_MEANS];
    float *total = malloc(sizeof(float) * width);
    for (int s = 0; s < n_seqs; s++) {
        const int len = context_lens[s], w = watched_slot(watch, s, len);
        if (w < 0) continue;
        memset(total, 0, sizeof(float) * len);
        for (int h = 0; h < n_heads; h++) {
            const float *p = scratch + ((long)w * n_heads + h) * width;
            uint16_t *half = weights + ((long)w * n_heads + h) * width;
            to_halves(p, half, len);
            memset(half + len, 0, sizeof(uint16_t) * (width - len));
            for (int i = 0; i < len; i++) total[i] += p[i];
        }
        uint16_t *m = means + (long)w * width;
        for (int i = 0; i < len; i++) total[i] *= 1.f / n_heads;
        to_halves(total, m, len);
        memset(m + len, 0, sizeof(uint16_t) * (width - len));
    }
    free(total);
}

static inline __attribute__((always_inline)) void weights_scores(const float *qs, const float *k,
        float *o, int H, int G, int D, int stride, int pos) {
    for (int kvh = 0; kvh < H / G; kvh++)
        for (int h = kvh * G; h < (kvh + 1) * G; h++) {
            float s = 0.f;
            for (int d = 0; d < D; d++) s += qs[h * D + d] * k[kvh * D + d];
            o[(long)h * stride + pos] = s;
        }
}

#define DEFINE_WEIGHTS(NAME, T, LOAD)                                                            \
void NAME(const T *q, const T *k_cache, const int32_t *block_tables, const int32_t *context_lens, \
          void *out_halves, void *mean_halves, int n_rows, int n_heads, int n_kv_heads, int head_dim, \
          int block_size, int table_width, int out_width, float scale, int n_threads) {          \
    const int H = n_heads, G = n_heads / n_kv_heads, D = head_dim, W = n_kv_heads * head_dim;    \
    uint16_t *out = out_halves, *mean = mean_halves;                                             \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(n_threads) if(n_threads > 1)")   \
    for (int r = 0; r < n_rows; r++) {                                                           \
        const int len = context_lens[r];                                                         \
        const int32_t *table = block_tables + (long)r * table_width;                             \
        float *o = malloc(sizeof(float) * (H + 1L) * len);  /* scores, then weights; their sum */ \
        float *restrict total = o + (long)H * len;                                               \
        memset(total, 0, sizeof(float) * len);                                                   \
        float qs[H * D], k[W];                                                                   \
        for (int i = 0; i < H * D; i++) qs[i] = LOAD(q[(long)r * H * D + i]) * scale;            \
        for (int b = 0; b * block_size < len; b++) {        /* a block at a time, in order */  \
            const T *kb = k_cache + (long)table[b] * block_size * W;                             \
            const int count = len - b * block_size < block_size ? len - b * block_size : block_size; \
            const T *next = (b + 1) * block_size < len ? k_cache + (long)table[b + 1] * block_size * W : kb; \
            for (int t = 0; t < count; t++) {                                                    \
                const int pos = b * block_size + t;                                              \
                PREFETCH_ROW(T, next + (long)t * W, W)                                           \
                for (int d = 0; d < W; d++) k[d] = LOAD(kb[(long)t * W + d]);                    \
                /* constant head_dim for the common shapes: the dot products vectorise */       \
                if (D == 32) weights_scores(qs, k, o, H, G, 32, len, pos);                       \
                else if (D == 64) weights_scores(qs, k, o, H, G, 64, len, pos);                  \
                else if (D == 128) weights_scores(qs, k, o, H, G, 128, len, pos);                \
                else weights_scores(qs, k, o, H, G, D, len, pos);                                \
            }                                                                                    \
        }                                                                                        \
        for (int h = 0; h < H; h++) {                                                            \
            float *restrict oh = o + (long)h * len, top = -3.0e38f, sum = 0.f;                   \
            uint16_t *half = out + ((long)r * H + h) * out_width;                                \
            for (int i = 0; i < len; i++) top = oh[i] > top ? oh[i] : top;                       \
            for (int i = 0; i < len; i++) { oh[i] = expf(oh[i] - top); sum += oh[i]; }           \
            const float inv = 1.f / sum;                                                         \
            /* plain loops, each vectorised */                                                  \
            for (int i = 0; i < len; i++) oh[i] *= inv;                                          \
            to_halves(oh, half, len);                                                            \
            for (int i = 0; i < len; i++) total[i] += oh[i];                                     \
            memset(half + len, 0, sizeof(uint16_t) * (out_width - len));                         \
        }                                                                                        \
        if (mean) {                                                                              \
            uint16_t *m = mean + (long)r * out_width;                                            \
            const float inv_heads = 1.f / H;                                                     \
            for (int i = 0; i < len; i++) total[i] *= inv_heads;                                 \
            to_halves(total, m, len);                                                            \
            memset(m + len, 0, sizeof(uint16_t) * (out_width - len));                            \
        }                                                                                        \
        free(o);                                                                                 \
    }                                                                                            \
}

DEFINE_WEIGHTS(paged_weights_f32, float, LOAD_F32)
DEFINE_WEIGHTS(paged_weights_bf16, uint16_t, bf16_to_f32)
