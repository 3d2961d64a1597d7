/* Paged decode attention for the CPU engine, fp32, read straight from the paged KV cache.
 *
 * One work unit is (request, KV head): the G query heads that share the KV head are computed
 * together, so each cached K/V row is read once, and only rows below the request's length are
 * read (no gather, no padding). Online softmax a block at a time, as FlashAttention does.
 * Units are handed out dynamically, since requests' lengths differ, by OpenMP: linked by
 * soname, it is the libgomp torch already loaded, so the kernel runs on torch's own threads
 * (a second thread pool would fight torch's spinning workers for the same cores).
 * Built by kernels/cpu_native.py with -O3 -march=native -fopenmp -ffast-math (compile only: linked without it)
 * -fno-finite-math-only: the simd pragmas vectorise the dot products.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUP 16
#define MAX_BLOCK 256
#define MAX_DIM 256

typedef struct {
    const float *q, *k_cache, *v_cache;
    const int64_t *block_tables, *seq_lens;
    float *out;
    int batch, num_heads, num_kv_heads, head_dim, block_size, table_width;
    float scale;
} DecodeArgs;

static void attend_unit(const DecodeArgs *a, int unit) {
    const int b = unit / a->num_kv_heads, h = unit % a->num_kv_heads;
    const int group = a->num_heads / a->num_kv_heads, d = a->head_dim, bs = a->block_size;
    const int64_t len = a->seq_lens[b];
    const int64_t row_stride = (int64_t)a->num_kv_heads * d;  /* between tokens in a block */
    float acc[MAX_GROUP][MAX_DIM], m[MAX_GROUP], l[MAX_GROUP], s[MAX_GROUP][MAX_BLOCK];
    const float *q = a->q + ((int64_t)b * a->num_heads + (int64_t)h * group) * d;
    for (int g = 0; g < group; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
        memset(acc[g], 0, sizeof(float) * d);
    }
    for (int64_t start = 0; start < len; start += bs) {
        const int n = (int)(len - start < bs ? len - start : bs);
        const int64_t block = a->block_tables[(int64_t)b * a->table_width + start / bs];
        const float *k = a->k_cache + (block * bs * a->num_kv_heads + h) * d;
        const float *v = a->v_cache + (block * bs * a->num_kv_heads + h) * d;
        for (int t = 0; t < n; t++) {
            const float *kt = k + t * row_stride;
            for (int g = 0; g < group; g++) {
                const float *qg = q + g * d;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int i = 0; i < d; i++) dot += qg[i] * kt[i];
                s[g][t] = dot * a->scale;
            }
        }
        for (int g = 0; g < group; g++) {
            float mx = m[g];
            for (int t = 0; t < n; t++) mx = s[g][t] > mx ? s[g][t] : mx;
            const float alpha = expf(m[g] - mx);  /* 0 on the first block: m = -inf */
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int t = 0; t < n; t++) {
                s[g][t] = expf(s[g][t] - mx);
                sum += s[g][t];
            }
            l[g] = l[g] * alpha + sum;
            m[g] = mx;
#pragma omp simd
            for (int i = 0; i < d; i++) acc[g][i] *= alpha;
        }
        for (int t = 0; t < n; t++) {
            const float *vt = v + t * row_stride;
            for (int g = 0; g < group; g++) {
                const float p = s[g][t];
                float *ag = acc[g];
#pragma omp simd
                for (int i = 0; i < d; i++) ag[i] += p * vt[i];
            }
        }
    }
    float *out = a->out + ((int64_t)b * a->num_heads + (int64_t)h * group) * d;
    for (int g = 0; g < group; g++) {
        const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
        for (int i = 0; i < d; i++) out[g * d + i] = acc[g][i] * inv;
    }
}

/* Returns 0 on success, a positive code when a shape is outside the kernel's limits. */
int paged_decode_f32(const float *q, const float *k_cache, const float *v_cache,
                     const int64_t *block_tables, const int64_t *seq_lens, float *out,
                     int batch, int num_heads, int num_kv_heads, int head_dim, int block_size,
                     int table_width, float scale, int num_threads) {
    if (num_kv_heads <= 0 || num_heads % num_kv_heads || num_heads / num_kv_heads > MAX_GROUP) return 1;
    if (head_dim > MAX_DIM || block_size > MAX_BLOCK) return 2;
    const DecodeArgs a = {q, k_cache, v_cache, block_tables, seq_lens, out, batch, num_heads,
                          num_kv_heads, head_dim, block_size, table_width, scale};
    const int units = batch * num_kv_heads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int u = 0; u < units; u++) attend_unit(&a, u);
    return 0;
}
