/* Fused elementwise steps of a decoder layer for eager float32 passes on a CPU.
 *
 * Eagerly, PyTorch runs RMSNorm as pow, mean, rsqrt and two multiplies, RoPE as two
 * multiplies, a roll and an add, and SwiGLU as silu then a multiply: each a pass over a
 * prompt's activations, which at a prefill step's 2,048 rows do not fit in L2. Each
 * function below makes one pass: it reads its input once and writes its output once.
 * The arithmetic is PyTorch's, in float32; only the order of the sums of squares differs,
 * as it does between PyTorch's own kernels.
 *
 * Rows are split among threads when there are enough of them to pay for waking threads. */
#include <math.h>
#include <stdint.h>

#define PARALLEL_MIN_FLOATS 16384
#define MAX_HEAD_DIM 512

/* out = weight * x / sqrt(mean(x * x) + eps) over one row of dim floats */
static inline void norm_row(const float *x, const float *weight, int dim, float eps, float *out) {
    float squares = 0.f;
    for (int d = 0; d < dim; d++) squares += x[d] * x[d];
    const float inv = 1.f / sqrtf(squares / (float)dim + eps);
    for (int d = 0; d < dim; d++) out[d] = weight[d] * (x[d] * inv);
}

/* RMSNorm of rows of a strided matrix into a contiguous one: n_groups groups of
 * rows_per_group rows; row (g, i) starts at x + g * group_stride + i * row_stride. */
void rms_norm_f32(const float *x, long group_stride, long row_stride, int n_groups, int rows_per_group,
                  const float *weight, int dim, float eps, float *out, int n_threads) {
    const long rows = (long)n_groups * rows_per_group;
    #pragma omp parallel for schedule(static) num_threads(n_threads) \
        if (n_threads > 1 && rows * dim >= PARALLEL_MIN_FLOATS)
    for (long r = 0; r < rows; r++) {
        const float *row = x + (r / rows_per_group) * group_stride + (r % rows_per_group) * row_stride;
        norm_row(row, weight, dim, eps, out + r * dim);
    }
}

/* Rotate a head by its token's angles: out = x * cos + (-x2, x1) * sin, where sin comes
 * with its first half already negated (layers/rotary.py). */
static inline void rope_row(const float *x, const float *cos, const float *signed_sin, int dim, float *out) {
    const int half = dim / 2;
    for (int d = 0; d < half; d++) out[d] = x[d] * cos[d] + x[d + half] * signed_sin[d];
    for (int d = half; d < dim; d++) out[d] = x[d] * cos[d] + x[d - half] * signed_sin[d];
}

/* Queries and keys of a packed qkv matrix [tokens, (n_heads + n_kv_heads + n_kv_heads) * dim]
 * (row_stride floats apart): each head normalised (when its weight is given: Qwen3's q/k
 * norm), then rotated by its token's cos/sin rows ([tokens, dim] each), into contiguous
 * q_out [tokens, n_heads, dim] and k_out [tokens, n_kv_heads, dim]. */
void qk_norm_rope_f32(const float *qkv, long row_stride, int tokens, int n_heads, int n_kv_heads, int dim,
                      const float *q_weight, const float *k_weight, float eps,
                      const float *cos, const float *signed_sin, float *q_out, float *k_out, int n_threads) {
    const int heads = n_heads + n_kv_heads;
    #pragma omp parallel for schedule(static) num_threads(n_threads) \
        if (n_threads > 1 && (long)tokens * heads * dim >= PARALLEL_MIN_FLOATS)
    for (int t = 0; t < tokens; t++) {
        float normed[MAX_HEAD_DIM];
        for (int h = 0; h < heads; h++) {
            const int is_q = h < n_heads;
            const float *x = qkv + (long)t * row_stride + (long)h * dim;
            const float *weight = is_q ? q_weight : k_weight;
            float *out = is_q ? q_out + ((long)t * n_heads + h) * dim
                              : k_out + ((long)t * n_kv_heads + h - n_heads) * dim;
            if (weight) {
                norm_row(x, weight, dim, eps, normed);
                x = normed;
            }
            rope_row(x, cos + (long)t * dim, signed_sin + (long)t * dim, dim, out);
        }
    }
}

/* SwiGLU's gate: out [rows, inter] = silu(gate) * up, where each row of gate_up (row_stride
 * floats apart) holds gate then up, inter floats each. silu(x) = x / (1 + exp(-x)). */
void silu_mul_f32(const float *gate_up, long row_stride, int rows, int inter, float *out, int n_threads) {
    #pragma omp parallel for schedule(static) num_threads(n_threads) \
        if (n_threads > 1 && (long)rows * inter >= PARALLEL_MIN_FLOATS)
    for (int r = 0; r < rows; r++) {
        const float *gate = gate_up + (long)r * row_stride, *up = gate + inter;
        float *o = out + (long)r * inter;
        for (int i = 0; i < inter; i++) {
            /* -ffast-math assumes no infinities: exp's argument stays finite, and below
             * -88, where exp(-x) would overflow, silu(x) is -0 in float32 */
            const float e = expf(fminf(-gate[i], 88.f));
            o[i] = (gate[i] < -88.f ? -0.f : gate[i] / (1.f + e)) * up[i];
        }
    }
}
