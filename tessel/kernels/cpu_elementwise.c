/* Elementwise ops of the CPU engine's decode step, fp32: RMSNorm (optionally after the residual
 * add), SiLU-and-mul, and neox-style RoPE. Each is one pass over its rows in one OpenMP parallel
 * region, where the torch references run 3-8 ops, each its own parallel region and temporary.
 *
 * Rows (tokens) are the parallel axis; the inner loops are unit-stride so they vectorise.
 * A parallel region costs a few microseconds to wake torch's libgomp team, more than a handful
 * of decode rows take to compute, so small inputs run on the calling thread (PARALLEL_MIN).
 * Built by kernels/cpu_native.py with -O3 -march=native -fopenmp -ffast-math
 * -fno-finite-math-only (compile only: linked without it, see there).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* Elements below which one thread beats waking the team: 4 decode rows of a 576-wide model
 * (~2k floats, about a microsecond of work) run serially, 32 rows go parallel. A rough number
 * from benchmarks/cpu_elementwise.py on 2 cores; it is not critical within a factor of two. */
#define PARALLEL_MIN 8192

#if defined(__x86_64__) && defined(__GLIBC__)
/* glibc's math.h only declares its vector expf (libmvec) under __FAST_MATH__, which
 * -fno-finite-math-only turns off; without it the SiLU loop calls scalar expf per element. */
#pragma omp declare simd notinbranch
extern float expf(float);
#endif

/* out = x * rsqrt(mean(x^2) + eps) * w per row of width `hidden`, rows packed in `out`. x's rows
 * are `heads` per token, `head_stride` apart within one and `token_stride` between tokens, so
 * Qwen3's per-head q/k norms read their views into the qkv projection without a copy (a plain
 * [rows, hidden] x is heads = 1, token_stride = hidden). With `res` non-NULL (x then packed), x
 * is first replaced by x + res, which is also written to res_out (the new residual). Sums of
 * squares accumulate in double: the row is in cache anyway, and it keeps the result within an
 * ulp or two of torch's pairwise fp32 mean. */
void rms_norm_f32(const float *x, const float *res, const float *w, float *out, float *res_out,
                  int64_t rows, int64_t hidden, int64_t heads, int64_t token_stride,
                  int64_t head_stride, float eps, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * hidden > PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + (r / heads) * token_stride + (r % heads) * head_stride;
        float *o = out + r * hidden;
        double sum = 0.0;
        if (res != NULL) {
            const float *rr = res + r * hidden;
            float *ro = res_out + r * hidden;
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < hidden; i++) {
                const float s = xr[i] + rr[i];
                ro[i] = s;
                sum += (double)s * s;
            }
            xr = ro;
        } else {
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < hidden; i++) sum += (double)xr[i] * xr[i];
        }
        /* rounded to fp32 like torch's mean, then the same (x * rstd) * w order as the reference */
        const float mean = (float)(sum / (double)hidden);
        const float rstd = (float)(1.0 / sqrt((double)(mean + eps)));
#pragma omp simd
        for (int64_t i = 0; i < hidden; i++) o[i] = (xr[i] * rstd) * w[i];
    }
}

/* x [rows, 2d] (gate | up) -> out [rows, d]: silu(gate) * up, silu as torch writes it. */
void silu_and_mul_f32(const float *x, float *out, int64_t rows, int64_t d, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * d > PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = x + r * 2 * d, *u = g + d;
        float *o = out + r * d;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

static void rotate_heads(const float *x, float *o, int heads, int half, const float *cos,
                         const float *sin) {
    for (int h = 0; h < heads; h++) {
        const float *x1 = x + (int64_t)h * 2 * half, *x2 = x1 + half;
        float *o1 = o + (int64_t)h * 2 * half, *o2 = o1 + half;
#pragma omp simd
        for (int i = 0; i < half; i++) {
            o1[i] = x1[i] * cos[i] - x2[i] * sin[i];
            o2[i] = x2[i] * cos[i] + x1[i] * sin[i];
        }
    }
}

/* Neox RoPE: q [T, hq, D] and k [T, hkv, D] whose tokens are `q_stride`/`k_stride` floats apart
 * (they are views into the fused qkv projection's rows), heads packed within a token, into
 * contiguous q_out/k_out. cache [max_pos, D] holds cos | sin halves per position.
 * Returns 0, or 1 when a position is outside the cache (nothing is written then). */
int rope_f32(const float *q, const float *k, float *q_out, float *k_out, const int64_t *positions,
             const float *cache, int64_t tokens, int hq, int hkv, int head_dim, int64_t q_stride,
             int64_t k_stride, int64_t max_pos, int num_threads) {
    for (int64_t t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_pos) return 1;
    const int half = head_dim / 2;
    const int64_t work = tokens * (int64_t)(hq + hkv) * head_dim;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (work > PARALLEL_MIN)
    for (int64_t t = 0; t < tokens; t++) {
        const float *cos = cache + positions[t] * head_dim, *sin = cos + half;
        rotate_heads(q + t * q_stride, q_out + t * hq * head_dim, hq, half, cos, sin);
        rotate_heads(k + t * k_stride, k_out + t * hkv * head_dim, hkv, half, cos, sin);
    }
    return 0;
}
