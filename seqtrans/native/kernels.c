/* Native CPU kernels for decoding (seqtrans.native). Each splits its work over `threads`
 * POSIX threads, the calling thread included.
 *
 * seqtrans_beam_attention: decoder self-attention of one new query per hypothesis over keys
 * and values that stay where they were written: position s of hypothesis r is in buffer row
 * rows[r, s] (the row its ancestor wrote at step s), so that following the beam never
 * copies them.
 *
 *   out[r, h] = sum_s softmax_s(scale * q[r, h] . k[rows[r, s], h, s]) * v[rows[r, s], h, s]
 *
 * Shapes (float32, contiguous): q, out [n, heads, dim]; k, v [buffer rows, heads, capacity,
 * dim]; rows [n, row_stride] int64, positions 0 .. length-1 used. Two passes over the
 * positions (scores, then the weighted values) with the maximum subtracted before exp. The
 * hypotheses of one sentence (`group` consecutive rows) share most of their ancestors, so
 * each head of a group is done for all its rows in turn, while the positions they share are
 * still in the processor's cache.
 *
 * seqtrans_quantize_rows and seqtrans_dequantize: the two float passes around an int8
 * product (seqtrans.linear.int8), each one pass over its rows instead of PyTorch's five
 * or six, with the same arithmetic in the same order, so that they give the same bits as
 * the PyTorch operators. The library is built without reassociating float arithmetic or
 * contracting a * b + c into one rounding unless asked (seqtrans.native.FLAGS); sums and maxima over a
 * row run in LANES independent lanes instead, which the compiler vectorizes as written.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_THREADS 256
#define LANES 16
#define AHEAD 6 /* positions */

static inline void prefetch(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(x + i);
}

typedef void (*RangeFn)(void *context, int64_t begin, int64_t end);

typedef struct {
    RangeFn fn;
    void *context;
    int64_t begin, end;
} Part;

static void *part_main(void *part) {
    Part *p = (Part *)part;
    p->fn(p->context, p->begin, p->end);
    return NULL;
}

/* fn(context, begin, end) over 0 .. work-1 in `threads` contiguous parts. */
static void parallel(RangeFn fn, void *context, int64_t work, int64_t threads) {
    if (work <= 0) return;
    if (threads > work) threads = work;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads < 1) threads = 1;
    Part parts[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS];
    for (int64_t i = 0; i < threads; i++) {
        Part p = {fn, context, work * i / threads, work * (i + 1) / threads};
        parts[i] = p;
    }
    for (int64_t i = 1; i < threads; i++)
        started[i] = pthread_create(&ids[i], NULL, part_main, &parts[i]) == 0;
    part_main(&parts[0]);
    for (int64_t i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(ids[i], NULL);
        else
            part_main(&parts[i]); /* no thread to spare: this one does it */
    }
}

/* x . y in LANES lanes, summed pairwise (a tree the compiler keeps in vector registers) */
static float dot_product(const float *x, const float *y, int64_t n) {
    float lanes[LANES] = {0.0f};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) lanes[j] += x[i + j] * y[i + j];
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int j = 0; j < width; j++) lanes[j] += lanes[j + width];
    float dot = lanes[0];
    for (; i < n; i++) dot += x[i] * y[i];
    return dot;
}

static float max_abs(const float *x, int64_t n) {
    float lanes[LANES] = {0.0f};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) {
            const float a = fabsf(x[i + j]);
            lanes[j] = a > lanes[j] ? a : lanes[j];
        }
    float most = 0.0f;
    for (int j = 0; j < LANES; j++) most = lanes[j] > most ? lanes[j] : most;
    for (; i < n; i++) most = fabsf(x[i]) > most ? fabsf(x[i]) : most;
    return most;
}

typedef struct {
    const float *q, *k, *v;
    const int64_t *rows;
    float *out;
    int64_t n, group, heads, dim, length, capacity, row_stride;
    float scale;
    volatile int failed;
} Attention;

static void attend(void *context, int64_t begin, int64_t end) {
    Attention *a = (Attention *)context;
    const int64_t heads = a->heads, dim = a->dim, length = a->length, group = a->group;
    float *scores = malloc(sizeof(float) * (size_t)(length > 0 ? length : 1));
    if (scores == NULL) {
        a->failed = 1;
        return;
    }
    for (int64_t gh = begin; gh < end; gh++) { /* (group, head) pairs */
        const int64_t g = gh / heads, h = gh % heads;
        const int64_t last = (g + 1) * group < a->n ? (g + 1) * group : a->n;
        for (int64_t r = g * group; r < last; r++) {
            const int64_t rh = r * heads + h;
            const float *q = a->q + rh * dim;
            const int64_t *from = a->rows + r * a->row_stride;
            float most = -INFINITY;
            for (int64_t s = 0; s < length; s++) {
                const float *key = a->k + ((from[s] * heads + h) * a->capacity + s) * dim;
                if (s + AHEAD < length) /* the next rows are anywhere: fetch them ahead */
                    prefetch(a->k + ((from[s + AHEAD] * heads + h) * a->capacity + s + AHEAD) * dim, dim);
                float dot = dot_product(q, key, dim) * a->scale;
                scores[s] = dot;
                if (dot > most) most = dot;
            }
            float total = 0.0f;
            for (int64_t s = 0; s < length; s++) {
                scores[s] = expf(scores[s] - most);
                total += scores[s];
            }
            float *o = a->out + rh * dim;
            for (int64_t i = 0; i < dim; i++) o[i] = 0.0f;
            const float norm = 1.0f / total;
            for (int64_t s = 0; s < length; s++) {
                const float *value = a->v + ((from[s] * heads + h) * a->capacity + s) * dim;
                if (s + AHEAD < length)
                    prefetch(a->v + ((from[s + AHEAD] * heads + h) * a->capacity + s + AHEAD) * dim, dim);
                const float p = scores[s] * norm;
                for (int64_t i = 0; i < dim; i++) o[i] += p * value[i];
            }
        }
    }
    free(scores);
}

/* Returns 0, or -1 when working memory could not be allocated (out is then incomplete). */
int seqtrans_beam_attention(const float *q, const float *k, const float *v, const int64_t *rows, float *out,
                            int64_t n, int64_t heads, int64_t dim, int64_t length, int64_t capacity,
                            int64_t row_stride, int64_t group, float scale, int64_t threads) {
    if (group < 1) group = 1;
    Attention a = {q, k, v, rows, out, n, group, heads, dim, length, capacity, row_stride, scale, 0};
    parallel(attend, &a, (n + group - 1) / group * heads, threads);
    return a.failed ? -1 : 0;
}

typedef struct {
    const float *x;
    int64_t cols, stride;
    void *q;
    float *scale;
    int is_unsigned;
} Quantize;

static void quantize(void *context, int64_t begin, int64_t end) {
    Quantize *c = (Quantize *)context;
    const int64_t cols = c->cols;
    for (int64_t r = begin; r < end; r++) {
        const float *x = c->x + r * c->stride;
        float scale = max_abs(x, cols) / 127.0f;
        if (!(scale > 0.0f)) scale = 1.0f; /* a row of zeros stays zeros */
        c->scale[r] = scale;
        if (c->is_unsigned) {
            uint8_t *q = (uint8_t *)c->q + r * cols;
            for (int64_t i = 0; i < cols; i++) q[i] = (uint8_t)(int32_t)(rintf(x[i] / scale) + 128.0f);
        } else {
            int8_t *q = (int8_t *)c->q + r * cols;
            for (int64_t i = 0; i < cols; i++) q[i] = (int8_t)(int32_t)rintf(x[i] / scale);
        }
    }
}

/* x [m, cols] float32 (rows `stride` apart) -> q [m, cols] int8, or uint8 holding q + 128
 * (`is_unsigned`), and scale [m]: scale = max|x| / 127 (1 for a row of zeros), q = x / scale
 * rounded to the nearest, ties to even. */
void seqtrans_quantize_rows(const float *x, int64_t m, int64_t cols, int64_t stride, void *q, float *scale,
                            int64_t is_unsigned, int64_t threads) {
    Quantize c = {x, cols, stride, q, scale, (int)is_unsigned};
    parallel(quantize, &c, m, m * cols < 65536 ? 1 : threads);
}

typedef struct {
    const int32_t *acc, *compensation;
    const float *row_scale, *col_scale, *bias;
    float *out;
    int64_t cols;
} Dequantize;

static void dequantize(void *context, int64_t begin, int64_t end) {
    Dequantize *c = (Dequantize *)context;
    const int64_t cols = c->cols;
    for (int64_t r = begin; r < end; r++) {
        const int32_t *acc = c->acc + r * cols;
        float *out = c->out + r * cols;
        const float row = c->row_scale[r];
        for (int64_t i = 0; i < cols; i++) {
            const int32_t a = c->compensation ? acc[i] - c->compensation[i] : acc[i];
            const float y = (float)a * row;
            /* one rounding for the bias, as PyTorch's vectorized addcmul does */
            out[i] = c->bias ? fmaf(y, c->col_scale[i], c->bias[i]) : y * c->col_scale[i];
        }
    }
}

/* acc [m, cols] int32 -> out [m, cols] float32:
 * ((acc - compensation[col]) * row_scale[row]) * col_scale[col] + bias[col], the last two
 * in one rounding (fused multiply-add);
 * compensation and bias may be NULL. */
void seqtrans_dequantize(const int32_t *acc, const int32_t *compensation, const float *row_scale,
                         const float *col_scale, const float *bias, float *out, int64_t m, int64_t cols,
                         int64_t threads) {
    Dequantize c = {acc, compensation, row_scale, col_scale, bias, out, cols};
    parallel(dequantize, &c, m, m * cols < 65536 ? 1 : threads);
}
