/* Attention for one decode step on the CPU: the query rows of each KV head against its cached keys and values.

   Built on the user's machine by engine/backends/cpu_attention.py (cc -O3 -march=native -fopenmp, when a
   compiler is there) and called through ctypes by the lean decode step. Why it exists: torch's CPU attention
   reaches the K/V cache through MKL matrix products of 1-3 query rows, which pack their operands and read the
   cache at 6-8 GB/s on a 2-core AMD EPYC, where a plain read runs at 13-21. Here each thread streams a piece of
   one head's positions once for the keys and once for the values, with the dot products unrolled for the
   head size, and the pieces are merged by their softmax statistics (as flash attention merges blocks).

   All arithmetic is float32, as torch's; results differ from torch's by summation order (~1e-7). */

#include <math.h>

#define MAX_GROUP 16
#define MAX_DIM 256

/* The positions [j0, j1) of one KV head, for its `group` query rows: scores s, then the piece's softmax
   statistics, max m[g] and sum l[g] of exp(s - m[g]), and acc[g][:] = sum_j exp(s_j - m[g]) v_j. */
static inline __attribute__((always_inline)) void attend_piece(
        const float *q, const float *kh, const float *vh, long row_stride, long j0, long j1,
        int group, int dim, float scale, float *s, float *m, float *l, float *acc) {
    long len = j1 - j0;
    for (long j = 0; j < len; j++) {
        const float *kj = kh + (j0 + j) * row_stride;
        for (int g = 0; g < group; g++) {
            const float *qg = q + g * dim;
            float a = 0.f;
            #pragma omp simd reduction(+:a)
            for (int d = 0; d < dim; d++) a += qg[d] * kj[d];
            s[j * group + g] = a * scale;
        }
    }
    for (int g = 0; g < group; g++) { m[g] = -INFINITY; l[g] = 0.f; }
    for (long j = 0; j < len; j++)
        for (int g = 0; g < group; g++) m[g] = s[j * group + g] > m[g] ? s[j * group + g] : m[g];
    for (long j = 0; j < len; j++)
        for (int g = 0; g < group; g++) { float e = expf(s[j * group + g] - m[g]); s[j * group + g] = e; l[g] += e; }
    for (int i = 0; i < group * dim; i++) acc[i] = 0.f;
    for (long j = 0; j < len; j++) {
        const float *vj = vh + (j0 + j) * row_stride;
        for (int g = 0; g < group; g++) {
            float p = s[j * group + g];
            float *ag = acc + g * dim;
            #pragma omp simd
            for (int d = 0; d < dim; d++) ag[d] += p * vj[d];
        }
    }
}

/* The head size as a constant where it is a common one: the compiler then unrolls the dot products. */
static void attend_piece_any(const float *q, const float *kh, const float *vh, long rs, long j0, long j1,
                             int group, int dim, float scale, float *s, float *m, float *l, float *acc) {
    switch (dim) {
    case 64: attend_piece(q, kh, vh, rs, j0, j1, group, 64, scale, s, m, l, acc); break;
    case 128: attend_piece(q, kh, vh, rs, j0, j1, group, 128, scale, s, m, l, acc); break;
    default: attend_piece(q, kh, vh, rs, j0, j1, group, dim, scale, s, m, l, acc);
    }
}

/* 1 when built with OpenMP (the work is spread over threads), 0 when every call runs on one thread. */
int decode_attention_threaded(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* The floats `scratch` must hold for these sizes: every head's scores, then each piece's statistics. */
long decode_attention_scratch(int heads, int group, int dim, long n, int pieces) {
    return (long)heads * n * group + (long)heads * pieces * group * (2 + dim);
}

/* out[h][g][:] = softmax(scale * q[h][g] . k[h][j], over j < n) @ v[h][j], for every KV head h and
   each of its `group` query rows. Row j of head h is at k + h * head_stride + j * row_stride (and so for v).
   Each head's positions are cut into `pieces` pieces run in parallel; the pieces are merged in a fixed
   order, so the result does not depend on which thread ran which. Returns 0, or -1 for shapes it does not take. */
int decode_attention(const float *q, const float *k, const float *v, float *out, float *scratch,
                     int heads, int group, int dim, long n, long head_stride, long row_stride,
                     float scale, int pieces, int threads) {
    if (group < 1 || group > MAX_GROUP || dim < 1 || dim > MAX_DIM || n < 1 || pieces < 1 || threads < 1) return -1;
    long per = (n + pieces - 1) / pieces;
    long stat = (long)group * (2 + dim);
    float *stats = scratch + (long)heads * n * group;
    int items = heads * pieces;
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int it = 0; it < items; it++) {
        int h = it / pieces, c = it % pieces;
        long j0 = c * per, j1 = j0 + per < n ? j0 + per : n;
        float *st = stats + it * stat;
        if (j0 >= j1) {
            for (int g = 0; g < group; g++) { st[g] = -INFINITY; st[group + g] = 0.f; }
            for (int i = 0; i < group * dim; i++) st[2 * group + i] = 0.f;
            continue;
        }
        attend_piece_any(q + (long)h * group * dim, k + h * head_stride, v + h * head_stride, row_stride, j0, j1,
                         group, dim, scale, scratch + ((long)h * n + j0) * group, st, st + group, st + 2 * group);
    }
    for (int h = 0; h < heads; h++) {
        for (int g = 0; g < group; g++) {
            float top = -INFINITY, total = 0.f;
            for (int c = 0; c < pieces; c++) {
                float mc = stats[(h * pieces + c) * stat + g];
                top = mc > top ? mc : top;
            }
            float *o = out + ((long)h * group + g) * dim;
            for (int d = 0; d < dim; d++) o[d] = 0.f;
            for (int c = 0; c < pieces; c++) {
                const float *st = stats + (h * pieces + c) * stat;
                if (st[group + g] == 0.f) continue;
                float w = expf(st[g] - top);
                total += w * st[group + g];
                for (int d = 0; d < dim; d++) o[d] += w * st[2 * group + g * dim + d];
            }
            for (int d = 0; d < dim; d++) o[d] /= total;
        }
    }
    return 0;
}
