/* Paged decode attention for the CPU engine, fp32, read straight from the paged KV cache.
 *
 * One work unit is a request, or with few requests a (request, KV head): the query heads that
 * share a KV head are computed together, so each cached K/V row is read once, and only rows
 * below the request's length are read (no gather, no padding). Online softmax a block at a time, as FlashAttention does.
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

#define MAX_HEADS 64
#define MAX_BLOCK 256
#define MAX_DIM 256

typedef struct {
    const float *q, *k_cache, *v_cache;
    const int64_t *block_tables, *seq_lens, *rows;  /* rows: request b's row of q and out (NULL: b) */
    float *out;
    int batch, num_heads, num_kv_heads, head_dim, block_size, table_width, heads_per_unit;
    float scale;
} DecodeArgs;

/* Starts reading the next block while this one is computed: blocks lie anywhere in the pool,
 * and hardware prefetchers stop at page boundaries (a 16-token block of 3 KV heads at d = 64
 * is 12 KiB). About 6% of the kernel's time at 64 decodes. */
static void prefetch_block(const DecodeArgs *a, int64_t block, int h0) {
    const int64_t row_stride = (int64_t)a->num_kv_heads * a->head_dim;
    const int64_t span = ((a->block_size - 1) * row_stride + (int64_t)a->heads_per_unit * a->head_dim) * 4;
    const char *k = (const char *)(a->k_cache + (block * a->block_size * a->num_kv_heads + h0) * a->head_dim);
    const char *v = (const char *)(a->v_cache + (block * a->block_size * a->num_kv_heads + h0) * a->head_dim);
    for (int64_t off = 0; off < span; off += 64) {
        __builtin_prefetch(k + off, 0, 3);
        __builtin_prefetch(v + off, 0, 3);
    }
}

/* One unit: request b's KV heads h0 .. h0 + heads_per_unit - 1 and their query heads. */
static void attend_unit(const DecodeArgs *a, int unit) {
    const int units_per_request = a->num_kv_heads / a->heads_per_unit;
    const int b = unit / units_per_request, h0 = (unit % units_per_request) * a->heads_per_unit;
    const int group = a->num_heads / a->num_kv_heads, d = a->head_dim, bs = a->block_size;
    const int nq = a->heads_per_unit * group;  /* this unit's query heads, consecutive in q */
    const int64_t len = a->seq_lens[b];
    const int64_t row_stride = (int64_t)a->num_kv_heads * d;  /* between tokens in a block */
    const int64_t *table = a->block_tables + (int64_t)b * a->table_width;
    float acc[MAX_HEADS][MAX_DIM], m[MAX_HEADS], l[MAX_HEADS], s[MAX_HEADS][MAX_BLOCK];
    const int64_t row = a->rows != NULL ? a->rows[b] : b;
    const float *q = a->q + (row * a->num_heads + (int64_t)h0 * group) * d;
    for (int j = 0; j < nq; j++) {
        m[j] = -INFINITY;
        l[j] = 0.0f;
        memset(acc[j], 0, sizeof(float) * d);
    }
    for (int64_t start = 0; start < len; start += bs) {
        const int n = (int)(len - start < bs ? len - start : bs);
        const int64_t block = table[start / bs];
        if (start + bs < len) prefetch_block(a, table[start / bs + 1], h0);
        const float *k = a->k_cache + (block * bs * a->num_kv_heads + h0) * d;
        const float *v = a->v_cache + (block * bs * a->num_kv_heads + h0) * d;
        for (int t = 0; t < n; t++) {
            const float *kt = k + t * row_stride;
            for (int j = 0; j < nq; j++) {
                const float *qj = q + j * d, *kh = kt + (j / group) * d;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int i = 0; i < d; i++) dot += qj[i] * kh[i];
                s[j][t] = dot * a->scale;
            }
        }
        for (int j = 0; j < nq; j++) {
            float mx = m[j];
            for (int t = 0; t < n; t++) mx = s[j][t] > mx ? s[j][t] : mx;
            const float alpha = expf(m[j] - mx);  /* 0 on the first block: m = -inf */
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int t = 0; t < n; t++) {
                s[j][t] = expf(s[j][t] - mx);
                sum += s[j][t];
            }
            l[j] = l[j] * alpha + sum;
            m[j] = mx;
#pragma omp simd
            for (int i = 0; i < d; i++) acc[j][i] *= alpha;
        }
        for (int t = 0; t < n; t++) {
            const float *vt = v + t * row_stride;
            for (int j = 0; j < nq; j++) {
                const float p = s[j][t], *vh = vt + (j / group) * d;
                float *aj = acc[j];
#pragma omp simd
                for (int i = 0; i < d; i++) aj[i] += p * vh[i];
            }
        }
    }
    float *out = a->out + (row * a->num_heads + (int64_t)h0 * group) * d;
    for (int j = 0; j < nq; j++) {
        const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
        for (int i = 0; i < d; i++) out[j * d + i] = acc[j][i] * inv;
    }
}

/* Returns 0 on success, a positive code when a shape is outside the kernel's limits. */
int paged_decode_f32(const float *q, const float *k_cache, const float *v_cache,
                     const int64_t *block_tables, const int64_t *seq_lens, const int64_t *rows, float *out,
                     int batch, int num_heads, int num_kv_heads, int head_dim, int block_size,
                     int table_width, float scale, int num_threads) {
    if (num_kv_heads <= 0 || num_heads % num_kv_heads || num_heads > MAX_HEADS) return 1;
    if (head_dim > MAX_DIM || block_size > MAX_BLOCK) return 2;
    /* Whole requests per unit once there are enough to keep every thread busy: a unit then
     * reads each cached row whole (all KV heads side by side) rather than one head's slice of
     * it, 1.5x faster at 64 decodes of the default model. Fewer requests: one KV head each. */
    const int heads_per_unit = batch >= 4 * num_threads ? num_kv_heads : 1;
    const DecodeArgs a = {q, k_cache, v_cache, block_tables, seq_lens, rows, out, batch, num_heads,
                          num_kv_heads, head_dim, block_size, table_width, heads_per_unit, scale};
    const int units = batch * (num_kv_heads / heads_per_unit);
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int u = 0; u < units; u++) attend_unit(&a, u);
    return 0;
}
