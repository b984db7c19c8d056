/* Native CPU kernels for decoding (seqtrans.native). Each splits its work over `threads`
 * OpenMP threads.
 *
 * seqtrans_beam_attention: decoder self-attention of one new query per hypothesis over keys
 * and values that stay where they were written: position s of hypothesis r is in buffer row
 * rows[r, s] (the row its ancestor wrote at step s), so that following the beam never
 * copies them.
 *
 *   out[r, h] = sum_s softmax_s(scale * q[r, h] . k[rows[r, s], h, s] + bias[h, s]) * v[rows[r, s], h, s]
 *
 * Shapes (float32, contiguous): q, out [n, heads, dim]; k, v [buffer rows, heads, capacity,
 * dim]; rows [n, row_stride] int64, positions 0 .. length-1 used, or 0 .. lengths[r]-1 for
 * row r where `lengths` [n] is given (encoder-decoder attention over padded sources); bias
 * [heads, length] or NULL (none added: a relative position bias is the same for every
 * hypothesis, as every one's new query is at the same position). Each
 * row's sums run over its own positions in the same order whatever the other rows, so a
 * row gets the same bits alone as in any batch. Two passes over the
 * positions (scores, then the weighted values) with the maximum subtracted before exp. The
 * hypotheses of one sentence (`group` consecutive rows) share most of their ancestors, so
 * each head of a group is done for all its rows, a block of positions at a time, while the
 * positions they share are still in the processor's cache.
 *
 * seqtrans_quantize_rows and seqtrans_dequantize: the two float passes around an int8
 * product (seqtrans.linear.int8), each one pass over its rows instead of PyTorch's five
 * or six, with the same arithmetic in the same order, so that they give the same bits as
 * the PyTorch operators (checked by tests/test_native.py).
 *
 * seqtrans_rms_norm: RMSNorm over rows, summing the squares in PyTorch's CPU order, so the
 * same bits as F.rms_norm (checked by the caller, seqtrans.model.norms).
 *
 * seqtrans_layer_norm: LayerNorm over rows in a fixed summing order of its own, for the int8
 * decoding copies, whose every path uses it (seqtrans.model.norms.NativeLayerNorm).
 *
 * seqtrans_topk_rows: the k largest of each row, for beam search's candidates (twice the
 * beam among the beam's hypotheses times the vocabulary), in one pass over each row.
 *
 * seqtrans_int8_product and seqtrans_int8_linear: the int8 product of a step's rows with
 * a weight, and a whole int8 layer (quantize, product, dequantize) in one call;
 * built only where the processor has AVX-512 VNNI or AVX2 (seqtrans_int8_product_available).
 *
 * The library is built without reassociating float arithmetic or contracting a * b + c
 * into one rounding unless the code asks (seqtrans.native.FLAGS). With AVX-512 (built with
 * -march=native where the processor has it) the inner loops use its intrinsics; elsewhere
 * plain loops, which the compiler vectorizes where it can, with the same results to
 * rounding (the same bits for the int8 passes).
 */
#include <math.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>

#define LANES 16
#define BLOCK 16 /* positions of one group's hypotheses read together */
/* below these, waking a second thread costs more than it saves */
#define SMALL_ATTENTION 2048 /* query-key pairs */
#define SMALL_WORK (1 << 17) /* elements */

typedef void (*RangeFn)(void *context, int64_t begin, int64_t end);

/* fn(context, begin, end) over 0 .. work-1 in `threads` contiguous parts: in OpenMP's
 * threads where the library is built with it (the process's own pool, PyTorch's, whose
 * threads are already running), else one after another. */
static void parallel(RangeFn fn, void *context, int64_t work, int64_t threads) {
    if (work <= 0) return;
    if (threads > work) threads = work;
    if (threads < 1) threads = 1;
    if (threads == 1) {
        fn(context, 0, work);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int64_t i = 0; i < threads; i++) fn(context, work * i / threads, work * (i + 1) / threads);
}

/* x . y: with AVX-512 or AVX2 in one vector register of fused multiply-adds, summed by
 * the instruction set's own reduction (a sum through an array in memory stalls on
 * reading back what was just stored); else in LANES lanes the compiler vectorizes. */
#if defined(__AVX512F__)
static inline float dot_product(const float *x, const float *y, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc);
    float dot = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) dot = fmaf(x[i], y[i], dot);
    return dot;
}
#elif defined(__AVX2__) && defined(__FMA__)
/* the sum of acc's eight lanes, in the order every AVX2 dot product here adds them */
static inline float sum_lanes(__m256 acc) {
    __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    half = _mm_add_ps(half, _mm_movehl_ps(half, half));
    half = _mm_add_ss(half, _mm_movehdup_ps(half));
    return _mm_cvtss_f32(half);
}

static inline float dot_product(const float *x, const float *y, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc);
    float dot = sum_lanes(acc);
    for (; i < n; i++) dot = fmaf(x[i], y[i], dot);
    return dot;
}
#else
static inline float dot_product(const float *x, const float *y, int64_t n) {
    float lanes[LANES] = {0.0f};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) lanes[j] = fmaf(x[i + j], y[i + j], lanes[j]);
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int j = 0; j < width; j++) lanes[j] += lanes[j + width];
    float dot = lanes[0];
    for (; i < n; i++) dot = fmaf(x[i], y[i], dot);
    return dot;
}
#endif

/* out[:dim] += sum_s p[s] * rows[from[s] * row_step + s * position_step][:dim] for s in
 * [begin, end): with AVX-512, 16 dimensions at a time in two registers that take
 * alternate positions (one register's chain of dependent additions would set the pace);
 * else one pass over the positions. */
static void weighted_sum(float *out, const float *p, const float *rows, const int64_t *from, int64_t begin,
                         int64_t end, int64_t row_step, int64_t position_step, int64_t dim) {
    int64_t i = 0;
#define ROW(s) (rows + from[s] * row_step + (s) * position_step)
#if defined(__AVX512F__)
    for (; i + 16 <= dim; i += 16) {
        __m512 even = _mm512_loadu_ps(out + i), odd = _mm512_setzero_ps();
        int64_t s = begin;
        for (; s + 1 < end; s += 2) {
            even = _mm512_fmadd_ps(_mm512_set1_ps(p[s]), _mm512_loadu_ps(ROW(s) + i), even);
            odd = _mm512_fmadd_ps(_mm512_set1_ps(p[s + 1]), _mm512_loadu_ps(ROW(s + 1) + i), odd);
        }
        if (s < end) even = _mm512_fmadd_ps(_mm512_set1_ps(p[s]), _mm512_loadu_ps(ROW(s) + i), even);
        _mm512_storeu_ps(out + i, _mm512_add_ps(even, odd));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    /* each output's multiply-adds in the order of the loop below (the same bits), its sum
     * kept in a register over the positions rather than stored and read back at each one:
     * 64 dimensions (a head's usual width) in eight registers, then eight at a time */
    for (; i + 64 <= dim; i += 64) {
        __m256 o[8];
        for (int c = 0; c < 8; c++) o[c] = _mm256_loadu_ps(out + i + 8 * c);
        for (int64_t s = begin; s < end; s++) {
            const __m256 weight = _mm256_set1_ps(p[s]);
            const float *row = ROW(s) + i;
            for (int c = 0; c < 8; c++) o[c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + 8 * c), o[c]);
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(out + i + 8 * c, o[c]);
    }
    for (; i + 8 <= dim; i += 8) {
        __m256 o = _mm256_loadu_ps(out + i);
        for (int64_t s = begin; s < end; s++)
            o = _mm256_fmadd_ps(_mm256_set1_ps(p[s]), _mm256_loadu_ps(ROW(s) + i), o);
        _mm256_storeu_ps(out + i, o);
    }
#endif
    for (int64_t s = begin; s < end; s++)
        for (int64_t j = i; j < dim; j++) out[j] = fmaf(p[s], ROW(s)[j], out[j]);
#undef ROW
}

/* score[s] = (q . keys at position s) * scale for s in [begin, end), the key of position s
 * in buffer row from[s]: dot_product's sums. With AVX2 (not AVX-512), four positions at a
 * time, each in its own register and summed as dot_product sums (the same bits), so that
 * their chains of dependent multiply-adds overlap: one position's chain set the pace. */
static void scaled_dots(float *score, const float *q, const float *keys, const int64_t *from, int64_t begin,
                        int64_t end, int64_t row_step, int64_t dim, float scale) {
#define KEY(s) (keys + from[s] * row_step + (s) * dim)
    int64_t s = begin;
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
    const int64_t full = dim & ~(int64_t)7;
    for (; s + 4 <= end; s += 4) {
        const float *k[4] = {KEY(s), KEY(s + 1), KEY(s + 2), KEY(s + 3)};
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t i = 0; i < full; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            for (int j = 0; j < 4; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[j] + i), acc[j]);
        }
        for (int j = 0; j < 4; j++) {
            float dot = sum_lanes(acc[j]);
            for (int64_t i = full; i < dim; i++) dot = fmaf(q[i], k[j][i], dot);
            score[s + j] = dot * scale;
        }
    }
#endif
    for (; s < end; s++) score[s] = dot_product(q, KEY(s), dim) * scale;
#undef KEY
}

/* x[i] = exp(x[i]) for x[i] <= 0, in a form the compiler vectorizes (glibc's expf is one
 * call per value): exp(x) = 2^n exp(r) with n = round(x / ln 2), |r| <= ln 2 / 2, exp(r)
 * by Cephes's polynomial (relative error about 1e-7); below -87 (where exp(x) < 2^-125,
 * nothing beside the maximum's exp(0) = 1) as exp(-87). */
static void exp_nonpositive(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i] < -87.0f ? -87.0f : x[i];
        const float k = floorf(v * 1.44269504088896341f + 0.5f);
        float r = v - k * 0.693359375f;
        r = r - k * -2.12194440e-4f;
        float y = 1.9875691500e-4f;
        y = fmaf(y, r, 1.3981999507e-3f);
        y = fmaf(y, r, 8.3334519073e-3f);
        y = fmaf(y, r, 4.1665795894e-2f);
        y = fmaf(y, r, 1.6666665459e-1f);
        y = fmaf(y, r, 5.0000001201e-1f);
        y = fmaf(y, r * r, r) + 1.0f;
        union { int32_t bits; float value; } two_to_k = {.bits = ((int32_t)k + 127) << 23};
        x[i] = y * two_to_k.value;
    }
}

static float max_abs(const float *x, int64_t n) {
    int64_t i = 0;
    float most = 0.0f;
#if defined(__AVX512F__)
    __m512 lanes = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) lanes = _mm512_max_ps(lanes, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    most = _mm512_reduce_max_ps(lanes);
#endif
    for (; i < n; i++) most = fabsf(x[i]) > most ? fabsf(x[i]) : most;
    return most;
}

typedef struct {
    const float *q, *k, *v;
    const int64_t *rows, *lengths;
    const float *bias; /* [heads, length] added to every row's logits, or NULL */
    float *out;
    int64_t n, group, heads, dim, length, capacity, row_stride;
    float scale;
    volatile int failed;
} Attention;

/* the positions row r attends to */
#define KEYS(r) (a->lengths != NULL ? a->lengths[r] : length)

static void attend(void *context, int64_t begin, int64_t end) {
    Attention *a = (Attention *)context;
    const int64_t heads = a->heads, dim = a->dim, length = a->length, group = a->group;
    const int64_t row_step = heads * a->capacity * dim; /* from one buffer row to the next */
    /* the scores of one group's hypotheses, then their weights; their outputs */
    float *scores = malloc(sizeof(float) * (size_t)(group * (length > 0 ? length : 1)));
    float *sums = malloc(sizeof(float) * (size_t)(group * dim));
    if (scores == NULL || sums == NULL) {
        free(scores);
        free(sums);
        a->failed = 1;
        return;
    }
    for (int64_t gh = begin; gh < end; gh++) { /* (group, head) pairs */
        const int64_t g = gh / heads, h = gh % heads;
        const int64_t first = g * group, last = (g + 1) * group < a->n ? (g + 1) * group : a->n;
        const float *keys = a->k + h * a->capacity * dim, *values = a->v + h * a->capacity * dim;
        /* a block of positions for every hypothesis of the group in turn, so that the rows
         * they share are read from memory once */
        for (int64_t s0 = 0; s0 < length; s0 += BLOCK) {
            const int64_t s1 = s0 + BLOCK < length ? s0 + BLOCK : length;
            for (int64_t r = first; r < last; r++) {
                const float *q = a->q + (r * heads + h) * dim;
                const int64_t *from = a->rows + r * a->row_stride;
                float *score = scores + (r - first) * length;
                const int64_t end = KEYS(r) < s1 ? KEYS(r) : s1;
                scaled_dots(score, q, keys, from, s0, end, row_step, dim, a->scale);
                if (a->bias != NULL)
                    for (int64_t s = s0; s < end; s++) score[s] += a->bias[h * length + s];
            }
        }
        for (int64_t r = first; r < last; r++) {
            float *score = scores + (r - first) * length, most = -INFINITY, total = 0.0f;
            const int64_t keys_r = KEYS(r);
            for (int64_t s = 0; s < keys_r; s++) most = score[s] > most ? score[s] : most;
            for (int64_t s = 0; s < keys_r; s++) score[s] -= most;
            exp_nonpositive(score, keys_r);
            for (int64_t s = 0; s < keys_r; s++) total += score[s];
            const float norm = 1.0f / total;
            for (int64_t s = 0; s < keys_r; s++) score[s] *= norm;
        }
        for (int64_t i = 0; i < (last - first) * dim; i++) sums[i] = 0.0f;
        for (int64_t s0 = 0; s0 < length; s0 += BLOCK) {
            const int64_t s1 = s0 + BLOCK < length ? s0 + BLOCK : length;
            for (int64_t r = first; r < last; r++)
                if (s0 < KEYS(r))
                    weighted_sum(sums + (r - first) * dim, scores + (r - first) * length, values,
                                 a->rows + r * a->row_stride, s0, KEYS(r) < s1 ? KEYS(r) : s1, row_step, dim,
                                 dim);
        }
        for (int64_t r = first; r < last; r++)
            for (int64_t i = 0; i < dim; i++) a->out[(r * heads + h) * dim + i] = sums[(r - first) * dim + i];
    }
    free(scores);
    free(sums);
}
#undef KEYS

/* Returns 0, or -1 when working memory could not be allocated (out is then incomplete). */
int seqtrans_beam_attention(const float *q, const float *k, const float *v, const int64_t *rows,
                            const int64_t *lengths, const float *bias, float *out, int64_t n, int64_t heads,
                            int64_t dim, int64_t length, int64_t capacity, int64_t row_stride, int64_t group,
                            float scale, int64_t threads) {
    if (group < 1) group = 1;
    Attention a = {q, k, v, rows, lengths, bias, out, n, group, heads, dim, length, capacity, row_stride, scale, 0};
    const int64_t pairs = n * heads * length;
    parallel(attend, &a, (n + group - 1) / group * heads, pairs < SMALL_ATTENTION ? 1 : threads);
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
        const int offset = c->is_unsigned ? 128 : 0;
        int8_t *q = (int8_t *)c->q + r * cols;
        int64_t i = 0;
#if defined(__AVX512F__)
        const __m512 divisor = _mm512_set1_ps(scale);
        const __m512i shift = _mm512_set1_epi32(offset);
        for (; i + 16 <= cols; i += 16) {
            const __m512 rounded = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + i), divisor),
                                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512i value = _mm512_add_epi32(_mm512_cvtps_epi32(rounded), shift);
            /* the low byte of each: the value, or the value + 128 as an unsigned byte */
            _mm_storeu_si128((__m128i *)(q + i), _mm512_cvtepi32_epi8(value));
        }
#endif
        for (; i < cols; i++) q[i] = (int8_t)(uint8_t)((int32_t)rintf(x[i] / scale) + offset);
    }
}

/* x [m, cols] float32 (rows `stride` apart) -> q [m, cols] int8, or uint8 holding q + 128
 * (`is_unsigned`), and scale [m]: scale = max|x| / 127 (1 for a row of zeros), q = x / scale
 * rounded to the nearest, ties to even. */
void seqtrans_quantize_rows(const float *x, int64_t m, int64_t cols, int64_t stride, void *q, float *scale,
                            int64_t is_unsigned, int64_t threads) {
    Quantize c = {x, cols, stride, q, scale, (int)is_unsigned};
    parallel(quantize, &c, m, m * cols < SMALL_WORK ? 1 : threads);
}

/* seqtrans_rms_norm: out[r] = (x[r] * (1 / sqrt(mean(x[r]^2) + eps))) * w, the mean of squares
 * summed as PyTorch's CPU sum sums a contiguous row (so the bits are F.rms_norm's, which the
 * caller checks once): vectors of `lanes` lanes (its vector width), four partial sums taken
 * over every fourth vector, in cascading levels of 16, then the vectors past a multiple of
 * four added to the first, the four added in order, the elements past the last whole vector
 * added one by one from zero, then each lane in order; the sum divided by n. One call in
 * place of PyTorch's seven operators, each as long to call as the pass itself at a decoding
 * step's few rows. */
#define RMS_LEVELS 4
#define RMS_ILP 4
#define RMS_LEVEL_POWER 4 /* log2 of a level's size, for rows of fewer than 2^16 vectors of four */
#define RMS_MAX_LANES 16

typedef struct {
    const float *x, *w;
    float *out;
    int64_t n, x_stride, out_stride;
    int lanes;
    float eps;
} RmsNorm;

/* acc[l] += the squares of the `lanes` elements at v */
static inline void add_squares(float *acc, const float *v, int lanes) {
    for (int l = 0; l < lanes; l++) acc[l] += v[l] * v[l];
}

static float sum_of_squares(const float *x, int64_t n, int lanes) {
    float acc[RMS_LEVELS][RMS_ILP][RMS_MAX_LANES] = {{{0.0f}}};
    const int64_t vectors = n / lanes, groups = vectors / RMS_ILP, step = (int64_t)1 << RMS_LEVEL_POWER;
    int64_t i = 0;
    while (i + step <= groups) {
        for (int64_t j = 0; j < step; j++, i++)
            for (int k = 0; k < RMS_ILP; k++) add_squares(acc[0][k], x + (i * RMS_ILP + k) * lanes, lanes);
        for (int level = 1; level < RMS_LEVELS; level++) {
            for (int k = 0; k < RMS_ILP; k++)
                for (int l = 0; l < lanes; l++) {
                    acc[level][k][l] += acc[level - 1][k][l];
                    acc[level - 1][k][l] = 0.0f;
                }
            if (i & ((step - 1) << (level * RMS_LEVEL_POWER))) break;
        }
    }
    for (; i < groups; i++)
        for (int k = 0; k < RMS_ILP; k++) add_squares(acc[0][k], x + (i * RMS_ILP + k) * lanes, lanes);
    for (int level = 1; level < RMS_LEVELS; level++)
        for (int k = 0; k < RMS_ILP; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += acc[level][k][l];
    for (int64_t v = groups * RMS_ILP; v < vectors; v++) add_squares(acc[0][0], x + v * lanes, lanes);
    for (int k = 1; k < RMS_ILP; k++)
        for (int l = 0; l < lanes; l++) acc[0][0][l] += acc[0][k][l];
    float total = 0.0f;
    for (int64_t e = vectors * lanes; e < n; e++) total += x[e] * x[e];
    for (int l = 0; l < lanes; l++) total += acc[0][0][l];
    return total;
}

static void rms_norm_rows(void *context, int64_t begin, int64_t end) {
    const RmsNorm *c = (const RmsNorm *)context;
    for (int64_t r = begin; r < end; r++) {
        const float *x = c->x + r * c->x_stride;
        float *y = c->out + r * c->out_stride;
        const float mean = sum_of_squares(x, c->n, c->lanes) / (float)c->n;
        const float scale = 1.0f / sqrtf(mean + c->eps);
        for (int64_t e = 0; e < c->n; e++) y[e] = (x[e] * scale) * c->w[e];
    }
}

/* Returns 0, or -1 for a vector width it does not sum in (nothing written). */
int seqtrans_rms_norm(const float *x, int64_t rows, int64_t n, int64_t x_stride, const float *w, float eps,
                      int64_t lanes, float *out, int64_t out_stride, int64_t threads) {
    if (lanes < 1 || lanes > RMS_MAX_LANES) return -1;
    RmsNorm c = {x, w, out, n, x_stride, out_stride, (int)lanes, eps};
    parallel(rms_norm_rows, &c, rows, rows * n < SMALL_WORK ? 1 : threads);
    return 0;
}

/* seqtrans_layer_norm: out[r] = ((x[r] - mean) * (1 / sqrt(var + eps))) * w + b, the mean
 * and then the variance (the mean of (x - mean)^2) each summed in one fixed order of our
 * own: element e into partial sum e % LN_PARTS, the partial sums added pairwise in halves.
 * Not F.layer_norm's bits (PyTorch's Welford merges were not reproduced exactly), so only
 * decoding copies that use it in every path call it (seqtrans.model.norms.NativeLayerNorm,
 * the int8 copies); the fixed order is written out, so vectorizing does not change it. */
#define LN_PARTS 32

typedef struct {
    const float *x, *w, *b;
    float *out;
    int64_t n, x_stride, out_stride;
    float eps;
} LayerNormRows;

/* sum of (x[e] - shift), or of its squares, in the fixed order above */
static float fixed_sum(const float *x, int64_t n, float shift, int squares) {
    float acc[LN_PARTS] = {0.0f};
    const int64_t whole = n - n % LN_PARTS;
    for (int64_t i = 0; i < whole; i += LN_PARTS)
        for (int j = 0; j < LN_PARTS; j++) {
            const float d = x[i + j] - shift;
            acc[j] += squares ? d * d : d;
        }
    for (int64_t i = whole; i < n; i++) {
        const float d = x[i] - shift;
        acc[i - whole] += squares ? d * d : d;
    }
    for (int half = LN_PARTS / 2; half > 0; half /= 2)
        for (int j = 0; j < half; j++) acc[j] += acc[j + half];
    return acc[0];
}

static void layer_norm_rows(void *context, int64_t begin, int64_t end) {
    const LayerNormRows *c = (const LayerNormRows *)context;
    for (int64_t r = begin; r < end; r++) {
        const float *x = c->x + r * c->x_stride;
        float *y = c->out + r * c->out_stride;
        const float mean = fixed_sum(x, c->n, 0.0f, 0) / (float)c->n;
        const float variance = fixed_sum(x, c->n, mean, 1) / (float)c->n;
        const float scale = 1.0f / sqrtf(variance + c->eps);
        for (int64_t e = 0; e < c->n; e++) y[e] = ((x[e] - mean) * scale) * c->w[e] + c->b[e];
    }
}

void seqtrans_layer_norm(const float *x, int64_t rows, int64_t n, int64_t x_stride, const float *w, const float *b,
                         float eps, float *out, int64_t out_stride, int64_t threads) {
    LayerNormRows c = {x, w, b, out, n, x_stride, out_stride, eps};
    parallel(layer_norm_rows, &c, rows, rows * n < SMALL_WORK ? 1 : threads);
}

typedef struct {
    const int32_t *acc, *compensation;
    const float *row_scale, *col_scale, *bias;
    float *out;
    int64_t cols;
    int relu, bias_after;
} Dequantize;

static void dequantize(void *context, int64_t begin, int64_t end) {
    Dequantize *c = (Dequantize *)context;
    const int64_t cols = c->cols;
    for (int64_t r = begin; r < end; r++) {
        const int32_t *acc = c->acc + r * cols;
        float *out = c->out + r * cols;
        const float row = c->row_scale[r];
        int64_t i = 0;
#if defined(__AVX512F__)
        const __m512 rows = _mm512_set1_ps(row);
        const __m512 zero = _mm512_setzero_ps();
        for (; i + 16 <= cols; i += 16) {
            __m512i a = _mm512_loadu_si512(acc + i);
            if (c->compensation) a = _mm512_sub_epi32(a, _mm512_loadu_si512(c->compensation + i));
            const __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(a), rows);
            const __m512 scale = _mm512_loadu_ps(c->col_scale + i);
            __m512 z;
            if (!c->bias) z = _mm512_mul_ps(y, scale);
            else if (c->bias_after) z = _mm512_add_ps(_mm512_mul_ps(y, scale), _mm512_loadu_ps(c->bias + i));
            else z = _mm512_fmadd_ps(y, scale, _mm512_loadu_ps(c->bias + i));
            /* (0 > z) ? 0 : z, which keeps a NaN as PyTorch's relu does */
            if (c->relu) z = _mm512_max_ps(zero, z);
            _mm512_storeu_ps(out + i, z);
        }
#endif
        for (; i < cols; i++) {
            const int32_t a = c->compensation ? acc[i] - c->compensation[i] : acc[i];
            const float y = (float)a * row;
            /* one rounding for the bias, as PyTorch's vectorized addcmul does, or (bias_after)
             * its own, as adding it to the layer's output does (built with -ffp-contract=off) */
            const float scaled = y * c->col_scale[i];
            const float z = !c->bias       ? scaled
                            : c->bias_after ? scaled + c->bias[i]
                                            : fmaf(y, c->col_scale[i], c->bias[i]);
            out[i] = c->relu && 0.0f > z ? 0.0f : z;
        }
    }
}

/* acc [m, cols] int32 -> out [m, cols] float32 (out may be acc itself: each element is
 * read before it is written):
 * ((acc - compensation[col]) * row_scale[row]) * col_scale[col] + bias[col], the last two
 * in one rounding (fused multiply-add), or with `bias_after` each rounded (the bias added
 * to the scaled product, as to a layer's output), then max(0, .) where `relu` (a
 * feed-forward layer's inner product: its activation without a pass of its own);
 * compensation and bias may be NULL. */
void seqtrans_dequantize(const int32_t *acc, const int32_t *compensation, const float *row_scale,
                         const float *col_scale, const float *bias, float *out, int64_t m, int64_t cols,
                         int64_t relu, int64_t bias_after, int64_t threads) {
    Dequantize c = {acc, compensation, row_scale, col_scale, bias, out, cols, (int)relu, (int)bias_after};
    parallel(dequantize, &c, m, m * cols < SMALL_WORK ? 1 : threads);
}

typedef struct {
    const float *x;
    int64_t n, stride, k;
    float *values;
    int64_t *index;
    int found_nan;
} TopK;

#define TOPK_BLOCK 64 /* elements checked against the k-th best at once */

/* Puts x[i] into the row's sorted k best (descending; of equal values the earlier index
 * first) when it belongs there; `filled` of them so far. */
static inline void topk_insert(float *v, int64_t *ix, int64_t *filled, int64_t k, float value, int64_t i) {
    int64_t p = *filled < k ? *filled : k - 1;
    if (*filled == k && !(value > v[k - 1])) return;
    while (p > 0 && v[p - 1] < value) {
        v[p] = v[p - 1];
        ix[p] = ix[p - 1];
        p--;
    }
    v[p] = value;
    ix[p] = i;
    if (*filled < k) (*filled)++;
}

static void topk(void *context, int64_t begin, int64_t end) {
    TopK *c = (TopK *)context;
    const int64_t n = c->n, k = c->k;
    for (int64_t r = begin; r < end; r++) {
        const float *x = c->x + r * c->stride;
        float *v = c->values + r * k;
        int64_t *ix = c->index + r * k, filled = 0;
        for (int64_t i = 0; i < n; i += TOPK_BLOCK) {
            const int64_t stop = i + TOPK_BLOCK < n ? i + TOPK_BLOCK : n;
            if (filled == k) { /* most blocks hold nothing better than the k-th best: one vector pass */
                const float least = v[k - 1];
                int more = 0;
                for (int64_t j = i; j < stop; j++) more |= !(x[j] <= least); /* NaN too */
                if (!more) continue;
            }
            for (int64_t j = i; j < stop; j++) {
                if (x[j] != x[j]) {
                    c->found_nan = 1;
                    return;
                }
                topk_insert(v, ix, &filled, k, x[j], j);
            }
        }
    }
}

/* The k largest of each row of x [m, n] (rows `stride` apart), largest first, of equal
 * values the one at the lower index first: values [m, k], index [m, k] (int64). 1 <= k <= n.
 * Returns 1, with the outputs unfinished, where a row holds a NaN (the caller ranks those
 * itself), else 0. One pass over each row, comparing a block of elements with the k-th
 * best so far at once: for the small k of beam search (twice the beam) over rows of tens
 * of thousands, few blocks hold a new candidate. */
int seqtrans_topk_rows(const float *x, int64_t m, int64_t n, int64_t stride, int64_t k, float *values,
                       int64_t *index, int64_t threads) {
    TopK c = {x, n, stride, k, values, index, 0};
    parallel(topk, &c, m, m * n < SMALL_WORK ? 1 : threads);
    return c.found_nan;
}

/* seqtrans_beam_candidates: beam search's candidates from a step's logits without the [rows, n]
 * log-probabilities. For row r of x [m, n] (rows `stride` apart) with max M and
 * shift = log(sum_j exp(x[j] - M)), the score of column j is
 *
 *   total[j] = ((x[j] - M) - shift) + prefix[r]
 *
 * in that order of float operations (torch.log_softmax's, then the prefix added), or -inf
 * where j is excluded: in `never` (every row), not only[r] where only[r] >= 0 (only[r] >= n:
 * no column), or among the row's own banned[banned_start[r] .. banned_start[r+1]-1]
 * (only and banned_start may be NULL). values/index [m, k]: the k best columns, largest first,
 * of equal scores the lower column first, as seqtrans_topk_rows ranks the whole row; shift [m].
 * The shift's sum adds exp in float lanes within blocks of CANDIDATE_BLOCK and the blocks
 * in double, so it differs from torch's only in rounding. Returns 1, with the outputs
 * unfinished, where a row's max is not finite (a NaN, +inf, or no finite logit), whose
 * log-softmax the caller leaves to torch; else 0. */
typedef struct {
    const float *x, *prefix;
    int64_t n, stride, k;
    const int64_t *never, *only, *banned_start, *banned;
    int64_t never_count;
    float *values, *shift;
    int64_t *index;
    volatile int not_finite;
} Candidates;

#define CANDIDATE_BLOCK 1024

static int excluded(const Candidates *c, int64_t r, int64_t j) {
    for (int64_t i = 0; i < c->never_count; i++)
        if (c->never[i] == j) return 1;
    if (c->banned_start != NULL)
        for (int64_t i = c->banned_start[r]; i < c->banned_start[r + 1]; i++)
            if (c->banned[i] == j) return 1;
    return 0;
}

/* log(sum exp(x - most)) over a row, its sums in float lanes within a block, then in double */
static float row_shift(const float *x, int64_t n, float most) {
    float part[CANDIDATE_BLOCK];
    double total = 0.0;
    for (int64_t b = 0; b < n; b += CANDIDATE_BLOCK) {
        const int64_t len = n - b < CANDIDATE_BLOCK ? n - b : CANDIDATE_BLOCK;
        for (int64_t j = 0; j < len; j++) part[j] = x[b + j] - most;
        exp_nonpositive(part, len);
        float lanes[LANES] = {0.0f};
        int64_t j = 0;
        for (; j + LANES <= len; j += LANES)
            for (int l = 0; l < LANES; l++) lanes[l] += part[j + l];
        for (; j < len; j++) lanes[0] += part[j];
        for (int l = 0; l < LANES; l++) total += lanes[l];
    }
    return (float)log(total);
}

/* A row that may take only column `only` (or none, past the end): its score first where it is
 * finite, then -inf at the lowest columns, as ranking the whole row would give. */
static void only_column(const Candidates *c, int64_t r, float most, float shift, float *v, int64_t *ix) {
    const int64_t only = c->only[r];
    float score = -INFINITY;
    int64_t filled = 0;
    if (only < c->n && !excluded(c, r, only)) score = ((c->x[r * c->stride + only] - most) - shift) + c->prefix[r];
    const int placed = score > -INFINITY;
    if (placed) {
        v[0] = score;
        ix[filled++] = only;
    }
    for (int64_t j = 0; j < c->n && filled < c->k; j++)
        if (j != only || !placed) {
            v[filled] = -INFINITY;
            ix[filled++] = j;
        }
}

/* The row's largest value, and whether it holds a NaN: in lanes the compiler vectorizes */
static float row_max(const float *x, int64_t n, int *nan) {
    float most[LANES];
    int odd[LANES] = {0};
    for (int l = 0; l < LANES; l++) most[l] = -INFINITY;
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) {
            odd[l] |= x[j + l] != x[j + l];
            most[l] = x[j + l] > most[l] ? x[j + l] : most[l];
        }
    for (; j < n; j++) {
        odd[0] |= x[j] != x[j];
        most[0] = x[j] > most[0] ? x[j] : most[0];
    }
    for (int l = 1; l < LANES; l++) {
        odd[0] |= odd[l];
        most[0] = most[l] > most[0] ? most[l] : most[0];
    }
    *nan = odd[0];
    return most[0];
}

static void candidates(void *context, int64_t begin, int64_t end) {
    Candidates *c = (Candidates *)context;
    const int64_t n = c->n, k = c->k;
    float score[TOPK_BLOCK];
    for (int64_t r = begin; r < end; r++) {
        const float *x = c->x + r * c->stride;
        float most, *v = c->values + r * k;
        int64_t *ix = c->index + r * k, filled = 0;
        int nan;
        most = row_max(x, n, &nan);
        if (nan || !isfinite(most)) {
            c->not_finite = 1;
            return;
        }
        const float shift = c->shift[r] = row_shift(x, n, most), prefix = c->prefix[r];
        if (c->only != NULL && c->only[r] >= 0) {
            only_column(c, r, most, shift, v, ix);
            continue;
        }
        for (int64_t i = 0; i < n; i += TOPK_BLOCK) {
            const int64_t stop = i + TOPK_BLOCK < n ? i + TOPK_BLOCK : n;
            int more = filled < k;
            for (int64_t j = i; j < stop; j++) {
                score[j - i] = ((x[j] - most) - shift) + prefix;
                more |= filled == k && score[j - i] > v[k - 1];
            }
            if (!more) continue; /* most blocks hold nothing better than the k-th best */
            for (int64_t j = i; j < stop; j++)
                topk_insert(v, ix, &filled, k, excluded(c, r, j) ? -INFINITY : score[j - i], j);
        }
    }
}

int seqtrans_beam_candidates(const float *x, int64_t m, int64_t n, int64_t stride, const float *prefix,
                             int64_t k, const int64_t *never, int64_t never_count, const int64_t *only,
                             const int64_t *banned_start, const int64_t *banned, float *values, int64_t *index,
                             float *shift, int64_t threads) {
    Candidates c = {x, prefix, n, stride, k, never, only, banned_start, banned, never_count, values, shift,
                    index, 0};
    parallel(candidates, &c, m, m * n < SMALL_WORK ? 1 : threads);
    return c.not_finite;
}

/* seqtrans_int8_product: out[m, o] = sum_k x[m, k] * w[o, k] in int32, exact, for the few
 * rows of a decoding step (seqtrans.linear.int8): x [rows, cols] unsigned bytes, w
 * [outputs, cols] signed bytes, both with contiguous rows (w as the layer keeps it, so
 * nothing is repacked). Each block of 4 weight rows is read once for all the activation
 * rows, 64 bytes at a time with AVX-512 VNNI (u8 x s8 sums of four into int32 lanes),
 * while it is in the first-level cache, and the rows PREFETCH_ROWS ahead are asked for
 * meanwhile: in decoding a step's weights come from memory, not the cache, and without
 * the prefetches the loads waited (docs/speed.md, benchmarks/small_steps.py).
 * With AVX2 but no VNNI, 16 bytes at a time widened to 16 bits: there PyTorch's int8
 * product is a plain loop (over ten times slower than float32 at a step's rows), so this
 * one serves every row count, and from MANY_ROWS rows on (a beam of four and more) in tiles
 * that keep their sums in registers (wide_product). Integer sums, so any order,
 * and either way, gives the same result. Built
 * only with AVX-512 VNNI or AVX2: without either seqtrans_int8_product_available() is 0
 * and the caller uses PyTorch's product. */
#if (defined(__AVX512VNNI__) && defined(__AVX512BW__)) || defined(__AVX2__)
typedef struct {
    const uint8_t *x;
    const int8_t *w;
    int32_t *out;
    int64_t rows, cols, outputs;
    const int16_t *wide; /* AVX2, many rows: x widened to 16 bits, rows `padded` apart */
    int64_t padded;
} Int8Product;

#define PRODUCT_OUTPUTS 4 /* weight rows a tile reads together */
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 16
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* [sum(a), sum(b), sum(c), sum(d)] of four vectors of 16 int32 */
static inline __m128i sum4(__m512i a, __m512i b, __m512i c, __m512i d) {
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    const __m512i abcd = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    const __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

/* The products of activation rows r .. r+R-1 with weight rows o .. o+3 (R = 4 or 1); rows
 * past the end repeat the last one (their sums are not stored). */
static inline __attribute__((always_inline)) void product_tile(const Int8Product *c, int64_t r, int64_t o,
                                                               const int R) {
    const int64_t cols = c->cols;
    const uint8_t *x[4];
    const int8_t *w[PRODUCT_OUTPUTS];
    for (int i = 0; i < R; i++) x[i] = c->x + (r + i < c->rows ? r + i : c->rows - 1) * cols;
    for (int j = 0; j < PRODUCT_OUTPUTS; j++) w[j] = c->w + (o + j < c->outputs ? o + j : c->outputs - 1) * cols;
    __m512i acc[4][PRODUCT_OUTPUTS];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < PRODUCT_OUTPUTS; j++) acc[i][j] = _mm512_setzero_si512();
    for (int64_t k = 0; k < cols; k += 64) {
        const __mmask64 mask = cols - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1) << (cols - k)) - 1;
        __m512i xv[4];
        for (int i = 0; i < R; i++) xv[i] = _mm512_maskz_loadu_epi8(mask, x[i] + k);
        for (int j = 0; j < PRODUCT_OUTPUTS; j++) {
            _mm_prefetch((const char *)(w[j] + PREFETCH_ROWS * cols + k), _MM_HINT_T0);
            const __m512i wv = _mm512_maskz_loadu_epi8(mask, w[j] + k);
            for (int i = 0; i < R; i++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], xv[i], wv);
        }
    }
    const int64_t stored = c->outputs - o < PRODUCT_OUTPUTS ? c->outputs - o : PRODUCT_OUTPUTS;
    for (int i = 0; i < R && r + i < c->rows; i++) {
        const __m128i sums = sum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
        int32_t *y = c->out + (r + i) * c->outputs + o;
        if (stored == PRODUCT_OUTPUTS) _mm_storeu_si128((__m128i *)y, sums);
        else _mm_mask_storeu_epi32(y, (__mmask8)((1 << stored) - 1), sums);
    }
}

#else
/* AVX2 without VNNI: the bytes widened to 16 bits and multiplied in pairs into int32
 * lanes (vpmaddwd). Not the byte multiply (vpmaddubsw), whose 16-bit pair sums saturate
 * at 255 * 127 * 2: widening is exact for every byte, in as many instructions per
 * product. */

/* [sum(a), sum(b), sum(c), sum(d)] of four vectors of 8 int32, by unpacks (a horizontal add
 * is several micro-operations on some processors, and a tile's sums are many at short K) */
static inline __m128i sum4(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
    const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
    const __m256i abcd = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

static inline __attribute__((always_inline)) void product_tile(const Int8Product *c, int64_t r, int64_t o,
                                                               const int R) {
    const int64_t cols = c->cols, full = cols & ~(int64_t)15;
    const uint8_t *x[4];
    const int8_t *w[PRODUCT_OUTPUTS];
    for (int i = 0; i < R; i++) x[i] = c->x + (r + i < c->rows ? r + i : c->rows - 1) * cols;
    for (int j = 0; j < PRODUCT_OUTPUTS; j++) w[j] = c->w + (o + j < c->outputs ? o + j : c->outputs - 1) * cols;
    __m256i acc[4][PRODUCT_OUTPUTS];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < PRODUCT_OUTPUTS; j++) acc[i][j] = _mm256_setzero_si256();
    for (int64_t k = 0; k < full; k += 16) {
        __m256i xv[4];
        for (int i = 0; i < R; i++) xv[i] = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(x[i] + k)));
        for (int j = 0; j < PRODUCT_OUTPUTS; j++) {
            _mm_prefetch((const char *)(w[j] + PREFETCH_ROWS * cols + k), _MM_HINT_T0);
            const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w[j] + k)));
            for (int i = 0; i < R; i++) acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(xv[i], wv));
        }
    }
    const int64_t stored = c->outputs - o < PRODUCT_OUTPUTS ? c->outputs - o : PRODUCT_OUTPUTS;
    for (int i = 0; i < R && r + i < c->rows; i++) {
        int32_t sums[PRODUCT_OUTPUTS];
        _mm_storeu_si128((__m128i *)sums, sum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        for (int j = 0; j < stored; j++) {
            for (int64_t k = full; k < cols; k++) sums[j] += (int32_t)x[i][k] * (int32_t)w[j][k];
            c->out[(r + i) * c->outputs + o + j] = sums[j];
        }
    }
}

/* From MANY_ROWS rows on, the rows are widened to 16 bits once for the whole product, and a
 * tile of TILE_ROWS rows by TILE_OUTPUTS weight rows keeps its twelve sums in registers:
 * each widened weight vector serves four rows and each row's vector three weight rows, so
 * that the sixteen registers of AVX2 hold the tile (the 4 x 4 tile above spills). The first
 * block of rows prefetches the weight as the few rows' tile does. From four rows (a beam
 * of 4 at batch 1) this is faster than the few rows' tile, with the weight in the cache or
 * in memory (docs/speed.md, "A beam's four rows on AVX2"). */
#ifndef MANY_ROWS
#define MANY_ROWS 4
#endif
#define TILE_ROWS 4
#define TILE_OUTPUTS 3
/* a thread's weight rows go TILE_OUTPUTS at a time through all the rows in panels of
 * about this many bytes, so that a panel read from memory stays in the first-level cache
 * for every block of rows */
#define PANEL_BYTES 16384

/* sum += the products of xv and w, 16 pairs of 16-bit values summed into 8 int32 lanes. The
 * empty asm keeps each sum in a register of its own: without it GCC computes a tile's
 * products first and spills the sums to memory, at two thirds of the speed. */
#define ACCUMULATE(sum, xv, w)                                        \
    do {                                                              \
        (sum) = _mm256_add_epi32((sum), _mm256_madd_epi16((xv), (w))); \
        __asm__("" : "+x"(sum));                                      \
    } while (0)

/* the sums of tile row i, 16 columns from k */
#define TILE_ROW(i, s0, s1, s2, k)                                                         \
    do {                                                                                   \
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (i) * padded + (k))); \
        ACCUMULATE(s0, xv, w0);                                                            \
        ACCUMULATE(s1, xv, w1);                                                            \
        ACCUMULATE(s2, xv, w2);                                                            \
    } while (0)

/* out[r .. r+3, o .. o+2] (rows and weight rows past the end computed but not stored: the
 * widened rows are zeros there, a weight row past the end repeats row o); the columns past
 * the last whole 16 are summed one by one */
static void wide_tile(const Int8Product *c, int64_t r, int64_t o, const int prefetch) {
    const int64_t cols = c->cols, full = cols & ~(int64_t)15, padded = c->padded;
    const int16_t *x = c->wide + r * padded;
    const int8_t *w[TILE_OUTPUTS] = {c->w + o * cols, c->w + (o + 1 < c->outputs ? o + 1 : o) * cols,
                                     c->w + (o + 2 < c->outputs ? o + 2 : o) * cols};
    __m256i s00 = _mm256_setzero_si256(), s01 = s00, s02 = s00, s10 = s00, s11 = s00, s12 = s00;
    __m256i s20 = s00, s21 = s00, s22 = s00, s30 = s00, s31 = s00, s32 = s00;
    for (int64_t k = 0; k < full; k += 16) {
        if (prefetch) { /* the first rows' pass reads the weight from memory; the others, from the cache */
            _mm_prefetch((const char *)(w[0] + PREFETCH_ROWS * cols + k), _MM_HINT_T0);
            _mm_prefetch((const char *)(w[1] + PREFETCH_ROWS * cols + k), _MM_HINT_T0);
            _mm_prefetch((const char *)(w[2] + PREFETCH_ROWS * cols + k), _MM_HINT_T0);
        }
        const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w[0] + k)));
        const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w[1] + k)));
        const __m256i w2 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w[2] + k)));
        TILE_ROW(0, s00, s01, s02, k);
        TILE_ROW(1, s10, s11, s12, k);
        TILE_ROW(2, s20, s21, s22, k);
        TILE_ROW(3, s30, s31, s32, k);
    }
    const __m256i zero = _mm256_setzero_si256();
    const __m128i sums[TILE_ROWS] = {sum4(s00, s01, s02, zero), sum4(s10, s11, s12, zero),
                                     sum4(s20, s21, s22, zero), sum4(s30, s31, s32, zero)};
    const int64_t stored = c->outputs - o < TILE_OUTPUTS ? c->outputs - o : TILE_OUTPUTS;
    for (int64_t i = 0; i < TILE_ROWS && r + i < c->rows; i++) {
        int32_t *y = c->out + (r + i) * c->outputs + o;
        if (stored == TILE_OUTPUTS && full == cols) {
            _mm_storel_epi64((__m128i *)y, sums[i]);
            y[2] = _mm_extract_epi32(sums[i], 2);
            continue;
        }
        int32_t part[4];
        _mm_storeu_si128((__m128i *)part, sums[i]);
        for (int64_t j = 0; j < stored; j++) {
            for (int64_t k = full; k < cols; k++) part[j] += (int32_t)x[i * padded + k] * (int32_t)w[j][k];
            y[j] = part[j];
        }
    }
}
#undef TILE_ROW
#undef ACCUMULATE

/* tiles begin .. end-1 of TILE_OUTPUTS weight rows, a panel of them at a time for all the rows */
static void wide_product(void *context, int64_t begin, int64_t end) {
    const Int8Product *c = (const Int8Product *)context;
    int64_t panel = PANEL_BYTES / (TILE_OUTPUTS * c->cols);
    if (panel < 1) panel = 1;
    for (int64_t p = begin; p < end; p += panel) {
        const int64_t stop = p + panel < end ? p + panel : end;
        for (int64_t r = 0; r < c->rows; r += TILE_ROWS) {
            for (int64_t t = p; t < stop; t++) wide_tile(c, r, t * TILE_OUTPUTS, r == 0);
        }
    }
}

/* The rows widened to 16 bits, `padded` apart, and zero rows up to a whole tile's, in
 * *memory (to be freed), or NULL where there is no memory for them. Aligned to a cache
 * line: at calloc's 16 bytes every other 32-byte load of a row spans two lines. Aligned by
 * hand, as C99 can everywhere (posix_memalign is POSIX's, aligned_alloc C11's). */
static int16_t *widened(const uint8_t *x, int64_t rows, int64_t cols, int64_t padded, void **memory) {
    const int64_t tiled = (rows + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
    *memory = calloc((size_t)(tiled * padded) * sizeof(int16_t) + 64, 1);
    if (*memory == NULL) return NULL;
    int16_t *wide = (int16_t *)(((uintptr_t)*memory + 63) & ~(uintptr_t)63);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < cols; k++) wide[r * padded + k] = (int16_t)x[r * cols + k];
    return wide;
}
#endif

/* weight-row blocks begin .. end-1, each for all the activation rows while it is cached */
static void int8_product(void *context, int64_t begin, int64_t end) {
    const Int8Product *c = (const Int8Product *)context;
    for (int64_t b = begin; b < end; b++) {
        const int64_t o = b * PRODUCT_OUTPUTS;
        int64_t r = 0;
        for (; r + 4 <= c->rows; r += 4) product_tile(c, r, o, 4);
        for (; r < c->rows; r++) product_tile(c, r, o, 1);
    }
}

int seqtrans_int8_product_available(void) { return 1; }

void seqtrans_int8_product(const uint8_t *x, const int8_t *w, int32_t *out, int64_t rows, int64_t cols,
                           int64_t outputs, int64_t threads) {
    Int8Product c = {x, w, out, rows, cols, outputs, NULL, 0};
    if (rows * cols * outputs < 16 * SMALL_WORK) threads = 1;
#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
    c.padded = (cols + 15) & ~(int64_t)15;
    void *memory = NULL;
    if (rows >= MANY_ROWS && cols > 0 && (c.wide = widened(x, rows, cols, c.padded, &memory)) != NULL) {
        parallel(wide_product, &c, (outputs + TILE_OUTPUTS - 1) / TILE_OUTPUTS, threads);
        free(memory);
        return;
    } /* without the memory for the widened rows, the few rows' product: the same integers */
#endif
    parallel(int8_product, &c, (outputs + PRODUCT_OUTPUTS - 1) / PRODUCT_OUTPUTS, threads);
}

/* A whole int8 linear layer for a step's few rows, in one call (one call's Python glue
 * instead of three, at every step): x [rows, cols] float32 (rows `stride` apart)
 * quantized per row as seqtrans_quantize_rows does (unsigned), multiplied by w [outputs,
 * cols] as seqtrans_int8_product does, and dequantized into out [rows, outputs] as
 * seqtrans_dequantize does: the same bits as the three calls. Returns 1 where its
 * working memory could not be had (nothing written), else 0. */
int seqtrans_int8_linear(const float *x, int64_t rows, int64_t cols, int64_t stride, const int8_t *w,
                         int64_t outputs, const float *col_scale, const int32_t *compensation, const float *bias,
                         int64_t relu, int64_t bias_after, float *out, int64_t threads) {
    uint8_t *q = (uint8_t *)malloc((size_t)(rows * cols + 1));
    float *row_scale = (float *)malloc((size_t)(rows + 1) * sizeof(float));
    if (!q || !row_scale) {
        free(q);
        free(row_scale);
        return 1;
    }
    seqtrans_quantize_rows(x, rows, cols, stride, q, row_scale, 1, threads);
    seqtrans_int8_product(q, w, (int32_t *)out, rows, cols, outputs, threads);
    seqtrans_dequantize((const int32_t *)out, compensation, row_scale, col_scale, bias, out, rows, outputs, relu,
                        bias_after, threads);
    free(q);
    free(row_scale);
    return 0;
}
#else
int seqtrans_int8_product_available(void) { return 0; }

int seqtrans_int8_linear(const float *x, int64_t rows, int64_t cols, int64_t stride, const int8_t *w,
                         int64_t outputs, const float *col_scale, const int32_t *compensation, const float *bias,
                         int64_t relu, int64_t bias_after, float *out, int64_t threads) {
    (void)x, (void)rows, (void)cols, (void)stride, (void)w, (void)outputs, (void)col_scale, (void)compensation;
    (void)bias, (void)relu, (void)bias_after, (void)out, (void)threads;
    return 1;
}

void seqtrans_int8_product(const uint8_t *x, const int8_t *w, int32_t *out, int64_t rows, int64_t cols,
                           int64_t outputs, int64_t threads) {
    (void)x, (void)w, (void)out, (void)rows, (void)cols, (void)outputs, (void)threads;
}
#endif

/* seqtrans_packed_linear: out[r, o] = sum_k x[r, k] * w[o, k] (+ bias[o]; then max(0, .)
 * with relu) for the few rows of a decoding step (seqtrans.linear.onednn), reading a
 * float32 weight where oneDNN's packing put it: blocks of PACKED_OUTPUTS outputs, each
 * [cols][PACKED_OUTPUTS] (the outputs of one k side by side; past `outputs`, zeros). Each
 * output is summed as oneDNN's own kernel for processors with AVX2 sums it: fused
 * multiply-adds in order of k within chunks of PACKED_CHUNK, the chunks' sums added in
 * order, then the bias. So a row gets the same bits here as in oneDNN's product of any
 * batch; the caller checks that on each layer before using this (another processor's
 * oneDNN may pack or sum otherwise). oneDNN's call costs tens of microseconds before its
 * first multiply, as much as a small layer's whole product at a step's few rows, and its
 * kernel reads the weight more slowly than memory gives it (docs/speed.md). Rows `x_stride`
 * apart, outputs `out_stride` apart (a block of the columns of a wider output). */
#if defined(__AVX2__) && defined(__FMA__)
#define PACKED_OUTPUTS 64
#define PACKED_CHUNK 1024
#define PACKED_STEP 64 /* k read for every row while in the first-level cache (16 KiB of the block) */
#define PACKED_ROWS 16 /* rows summed at once (a call takes more in turn) */

typedef struct {
    const float *x, *w, *bias;
    float *out;
    int64_t rows, cols, x_stride, outputs, out_stride;
    int relu;
} PackedLinear;

/* one row's 64 sums over k0 .. k1-1, continued from and left in acc[64]: eight vectors,
 * each summed in order of k, that the weight's rows stream through */
static inline void packed_row(const float *x, const float *w, int64_t k0, int64_t k1, float *acc) {
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8), a2 = _mm256_loadu_ps(acc + 16),
           a3 = _mm256_loadu_ps(acc + 24), a4 = _mm256_loadu_ps(acc + 32), a5 = _mm256_loadu_ps(acc + 40),
           a6 = _mm256_loadu_ps(acc + 48), a7 = _mm256_loadu_ps(acc + 56);
    for (int64_t k = k0; k < k1; k++) {
        const float *wk = w + k * PACKED_OUTPUTS;
        const __m256 xv = _mm256_broadcast_ss(x + k);
        a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wk), a0);
        a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wk + 8), a1);
        a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wk + 16), a2);
        a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wk + 24), a3);
        a4 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wk + 32), a4);
        a5 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wk + 40), a5);
        a6 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wk + 48), a6);
        a7 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wk + 56), a7);
    }
    _mm256_storeu_ps(acc, a0), _mm256_storeu_ps(acc + 8, a1), _mm256_storeu_ps(acc + 16, a2);
    _mm256_storeu_ps(acc + 24, a3), _mm256_storeu_ps(acc + 32, a4), _mm256_storeu_ps(acc + 40, a5);
    _mm256_storeu_ps(acc + 48, a6), _mm256_storeu_ps(acc + 56, a7);
}

/* three rows' sums of 32 of the 64 outputs (acc rows as packed_row's): twelve vectors, each
 * weight vector read once for the three, so that the arithmetic, not the loads, bounds them */
static inline void packed_three_rows(const float *x0, const float *x1, const float *x2, const float *w, int64_t k0,
                                     int64_t k1, float *c0, float *c1, float *c2) {
    __m256 a00 = _mm256_loadu_ps(c0), a01 = _mm256_loadu_ps(c0 + 8), a02 = _mm256_loadu_ps(c0 + 16),
           a03 = _mm256_loadu_ps(c0 + 24), a10 = _mm256_loadu_ps(c1), a11 = _mm256_loadu_ps(c1 + 8),
           a12 = _mm256_loadu_ps(c1 + 16), a13 = _mm256_loadu_ps(c1 + 24), a20 = _mm256_loadu_ps(c2),
           a21 = _mm256_loadu_ps(c2 + 8), a22 = _mm256_loadu_ps(c2 + 16), a23 = _mm256_loadu_ps(c2 + 24);
    for (int64_t k = k0; k < k1; k++) {
        const float *wk = w + k * PACKED_OUTPUTS;
        const __m256 v0 = _mm256_broadcast_ss(x0 + k), v1 = _mm256_broadcast_ss(x1 + k),
                     v2 = _mm256_broadcast_ss(x2 + k);
        __m256 wv = _mm256_loadu_ps(wk);
        a00 = _mm256_fmadd_ps(v0, wv, a00), a10 = _mm256_fmadd_ps(v1, wv, a10), a20 = _mm256_fmadd_ps(v2, wv, a20);
        wv = _mm256_loadu_ps(wk + 8);
        a01 = _mm256_fmadd_ps(v0, wv, a01), a11 = _mm256_fmadd_ps(v1, wv, a11), a21 = _mm256_fmadd_ps(v2, wv, a21);
        wv = _mm256_loadu_ps(wk + 16);
        a02 = _mm256_fmadd_ps(v0, wv, a02), a12 = _mm256_fmadd_ps(v1, wv, a12), a22 = _mm256_fmadd_ps(v2, wv, a22);
        wv = _mm256_loadu_ps(wk + 24);
        a03 = _mm256_fmadd_ps(v0, wv, a03), a13 = _mm256_fmadd_ps(v1, wv, a13), a23 = _mm256_fmadd_ps(v2, wv, a23);
    }
    _mm256_storeu_ps(c0, a00), _mm256_storeu_ps(c0 + 8, a01), _mm256_storeu_ps(c0 + 16, a02);
    _mm256_storeu_ps(c0 + 24, a03), _mm256_storeu_ps(c1, a10), _mm256_storeu_ps(c1 + 8, a11);
    _mm256_storeu_ps(c1 + 16, a12), _mm256_storeu_ps(c1 + 24, a13), _mm256_storeu_ps(c2, a20);
    _mm256_storeu_ps(c2 + 8, a21), _mm256_storeu_ps(c2 + 16, a22), _mm256_storeu_ps(c2 + 24, a23);
}

static void packed_linear(void *context, int64_t begin, int64_t end) {
    const PackedLinear *c = (const PackedLinear *)context;
    float acc[PACKED_ROWS][PACKED_OUTPUTS];
    for (int64_t b = begin; b < end; b++) {
        const float *block = c->w + b * c->cols * PACKED_OUTPUTS;
        const int64_t o = b * PACKED_OUTPUTS;
        const int64_t valid = c->outputs - o < PACKED_OUTPUTS ? c->outputs - o : PACKED_OUTPUTS;
        for (int64_t k0 = 0; k0 < c->cols; k0 += PACKED_CHUNK) {
            const int64_t k1 = k0 + PACKED_CHUNK < c->cols ? k0 + PACKED_CHUNK : c->cols;
            const int first = k0 == 0, last = k1 == c->cols;
            for (int64_t r = 0; r < c->rows; r++)
                for (int j = 0; j < PACKED_OUTPUTS; j++) acc[r][j] = 0.0f;
            for (int64_t s = k0; s < k1; s += PACKED_STEP) {
                const int64_t e = s + PACKED_STEP < k1 ? s + PACKED_STEP : k1;
                int64_t r = 0;
                for (; r + 3 <= c->rows; r += 3)
                    for (int half = 0; half < PACKED_OUTPUTS; half += 32)
                        packed_three_rows(c->x + r * c->x_stride, c->x + (r + 1) * c->x_stride,
                                          c->x + (r + 2) * c->x_stride, block + half, s, e, acc[r] + half,
                                          acc[r + 1] + half, acc[r + 2] + half);
                for (; r < c->rows; r++) packed_row(c->x + r * c->x_stride, block, s, e, acc[r]);
            }
            for (int64_t r = 0; r < c->rows; r++) {
                float *y = c->out + r * c->out_stride + o;
                for (int64_t j = 0; j < valid; j++) {
                    float v = first ? acc[r][j] : y[j] + acc[r][j];
                    if (last && c->bias != NULL) v = v + c->bias[o + j];
                    if (last && c->relu) v = v > 0.0f ? v : 0.0f;
                    y[j] = v;
                }
            }
        }
    }
}

int seqtrans_packed_linear_available(void) { return 1; }

void seqtrans_packed_linear(const float *x, int64_t rows, int64_t cols, int64_t x_stride, const float *w,
                            int64_t outputs, const float *bias, int64_t relu, float *out, int64_t out_stride,
                            int64_t threads) {
    const int64_t blocks = (outputs + PACKED_OUTPUTS - 1) / PACKED_OUTPUTS;
    for (int64_t r = 0; r < rows; r += PACKED_ROWS) { /* the sums of PACKED_ROWS rows at most at once */
        const int64_t n = rows - r < PACKED_ROWS ? rows - r : PACKED_ROWS;
        PackedLinear c = {x + r * x_stride, w, bias, out + r * out_stride, n, cols, x_stride, outputs, out_stride,
                          (int)relu};
        parallel(packed_linear, &c, blocks, n * outputs * cols < SMALL_WORK ? 1 : threads);
    }
}
#else
int seqtrans_packed_linear_available(void) { return 0; }

void seqtrans_packed_linear(const float *x, int64_t rows, int64_t cols, int64_t x_stride, const float *w,
                            int64_t outputs, const float *bias, int64_t relu, float *out, int64_t out_stride,
                            int64_t threads) {
    (void)x, (void)rows, (void)cols, (void)x_stride, (void)w, (void)outputs, (void)bias, (void)relu, (void)out;
    (void)out_stride, (void)threads;
}
#endif

/* seqtrans_decoder_step: a decoder's whole stack of layers for one new position of each of
 * `rows` hypotheses, in one call (seqtrans.linear.native_step), where PyTorch's path makes a
 * few dozen calls a layer from Python, each costing as long as its pass at a beam's few
 * rows. Each part is the very kernel that path calls, with the same arguments, so a row
 * gets the same bits either way: RMSNorm (seqtrans_rms_norm) or the int8 copies' LayerNorm
 * (seqtrans_layer_norm), int8 layers
 * (seqtrans_int8_linear) or float32 ones from oneDNN's packing (seqtrans_packed_linear),
 * self-attention over a cache the beam never copies and
 * cross-attention over the source (seqtrans_beam_attention); the residual sums are single
 * float additions. Pre-norm x + f(N(x)) or post-norm N(x + f(x)); a ReLU feed-forward. */
typedef struct {
    const int8_t *w; /* int8 (packed 0), or float32 in oneDNN's packing (packed 1) */
    const float *scale;
    const int32_t *compensation;
    const float *bias; /* or NULL */
    int64_t outputs, bias_after, packed;
} StepLinear;

typedef struct {
    const float *norm[3]; /* the norms' weights of self-attention, cross-attention, feed-forward */
    const float *norm_bias[3]; /* their biases (LayerNorm), or NULL (RMSNorm) */
    StepLinear qkv, self_out, cross_q, cross_out, inner, outer;
    float *cache_k, *cache_v; /* [buffer rows, heads, capacity, head_dim] */
    int64_t *sources;         /* [rows, sources_stride]: the buffer row of each position */
    int64_t capacity, sources_stride;
    const float *cross_k, *cross_v; /* [sentences, heads, source_length, head_dim] */
    const int64_t *cross_rows;      /* [rows, source_length]: each hypothesis's sentence */
    const int64_t *cross_lengths;   /* [rows]: its source's real tokens */
    int64_t source_length;
} StepLayer;

typedef struct {
    int64_t layers, d_model, heads, head_dim, pre_norm, lanes, group, has_final_norm, has_output_scale;
    float eps, self_scale, cross_scale, output_scale;
    const float *final_norm, *final_norm_bias; /* the bias: LayerNorm's, or NULL (RMSNorm) */
} StepModel;

/* 1: int8 layers; 2: float32 layers in oneDNN's packing; 3: both */
int seqtrans_decoder_step_available(void) {
    return seqtrans_int8_product_available() | (seqtrans_packed_linear_available() << 1);
}

static int step_linear(const StepLinear *l, const float *x, int64_t rows, int64_t cols, int64_t relu, float *out,
                       int64_t threads) {
    if (l->packed) {
        seqtrans_packed_linear(x, rows, cols, cols, (const float *)l->w, l->outputs, l->bias, relu, out, l->outputs,
                               threads);
        return 0;
    }
    return seqtrans_int8_linear(x, rows, cols, cols, l->w, l->outputs, l->scale, l->compensation, l->bias, relu,
                                l->bias_after, out, threads);
}

/* out = N(x) over rows of d_model: RMSNorm, or LayerNorm where the norm has a bias */
static void normalize(const StepModel *m, const float *x, const float *w, const float *b, int64_t rows, float *out,
                      int64_t threads) {
    if (b != NULL) seqtrans_layer_norm(x, rows, m->d_model, m->d_model, w, b, m->eps, out, m->d_model, threads);
    else seqtrans_rms_norm(x, rows, m->d_model, m->d_model, w, m->eps, m->lanes, out, m->d_model, threads);
}

/* x [rows, d] += add [rows, d], then (post-norm) x = N(x) */
static void residual(const StepModel *m, float *x, const float *add, const float *norm, const float *norm_bias,
                     int64_t rows, float *work, int64_t threads) {
    const int64_t n = rows * m->d_model;
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + add[i];
    if (!m->pre_norm) {
        normalize(m, x, norm, norm_bias, rows, work, threads);
        for (int64_t i = 0; i < n; i++) x[i] = work[i];
    }
}

/* what a sub-layer reads: N(x) for pre-norm (into h), x itself for post-norm */
static const float *sublayer_input(const StepModel *m, const float *x, const float *norm, const float *norm_bias,
                                   int64_t rows, float *h, int64_t threads) {
    if (!m->pre_norm) return x;
    normalize(m, x, norm, norm_bias, rows, h, threads);
    return h;
}

/* a step's working memory: h [rows, d], wide [rows, max(3 * inner, d_ff)], q and attended
 * [rows, inner], out [rows, d] */
typedef struct {
    float *h, *wide, *q, *attended, *out;
} StepWork;

static void free_work(StepWork *w) {
    free(w->h);
    free(w->wide);
    free(w->q);
    free(w->attended);
    free(w->out);
}

/* 1 where it could not be had (nothing to free then) */
static int alloc_work(const StepModel *m, const StepLayer *layers, int64_t count, int64_t rows, StepWork *w) {
    const int64_t d = m->d_model, inner = m->heads * m->head_dim;
    int64_t widest = 3 * inner;
    for (int64_t l = 0; l < count; l++)
        if (layers[l].inner.outputs > widest) widest = layers[l].inner.outputs;
    w->h = malloc(sizeof(float) * (size_t)(rows * d + 1));
    w->wide = malloc(sizeof(float) * (size_t)(rows * widest + 1));
    w->q = malloc(sizeof(float) * (size_t)(rows * inner + 1));
    w->attended = malloc(sizeof(float) * (size_t)(rows * inner + 1));
    w->out = malloc(sizeof(float) * (size_t)(rows * d + 1));
    if (w->h && w->wide && w->q && w->attended && w->out) return 0;
    free_work(w);
    return 1;
}

/* w->out [rows, d] = sub-layer `which` of layer L (0 self-attention, its new keys and values
 * into the cache at `position`; 1 cross-attention; 2 the feed-forward layer) of `in`, what
 * it reads. Returns 0, or 1 where working memory could not be had. */
static int sublayer(const StepModel *m, const StepLayer *L, int64_t which, const float *in, int64_t rows,
                    int64_t position, const float *bias, StepWork *w, int64_t threads) {
    const int64_t d = m->d_model, heads = m->heads, dim = m->head_dim, inner = heads * dim;
    int failed = 0;
    if (which == 0) { /* each row its own buffer row of the cache */
        if (step_linear(&L->qkv, in, rows, d, 0, w->wide, threads)) return 1;
        for (int64_t r = 0; r < rows; r++) {
            const float *row = w->wide + r * 3 * inner;
            for (int64_t e = 0; e < heads; e++) {
                const int64_t at = ((r * heads + e) * L->capacity + position) * dim;
                for (int64_t i = 0; i < dim; i++) {
                    w->q[(r * heads + e) * dim + i] = row[e * dim + i];
                    L->cache_k[at + i] = row[inner + e * dim + i];
                    L->cache_v[at + i] = row[2 * inner + e * dim + i];
                }
            }
            L->sources[r * L->sources_stride + position] = r;
        }
        failed |= seqtrans_beam_attention(w->q, L->cache_k, L->cache_v, L->sources, NULL, bias, w->attended, rows,
                                          heads, dim, position + 1, L->capacity, L->sources_stride, m->group,
                                          m->self_scale, threads) != 0;
        return failed || step_linear(&L->self_out, w->attended, rows, inner, 0, w->out, threads);
    }
    if (which == 1) { /* over each hypothesis's own source */
        failed |= step_linear(&L->cross_q, in, rows, d, 0, w->q, threads);
        failed |= seqtrans_beam_attention(w->q, L->cross_k, L->cross_v, L->cross_rows, L->cross_lengths, NULL,
                                          w->attended, rows, heads, dim, L->source_length, L->source_length,
                                          L->source_length, m->group, m->cross_scale, threads) != 0;
        return failed || step_linear(&L->cross_out, w->attended, rows, inner, 0, w->out, threads);
    }
    /* its ReLU in the inner product's last pass */
    failed |= step_linear(&L->inner, in, rows, d, 1, w->wide, threads);
    return failed || step_linear(&L->outer, w->wide, rows, L->inner.outputs, 0, w->out, threads);
}

/* x [rows, d_model] in place, for the position `position` (0-based; the caches hold the
 * ones before it); bias [heads, position + 1] added to the self-attention logits, or NULL.
 * Returns 0, or 1 where working memory could not be had (x is then incomplete). */
int seqtrans_decoder_step(const StepModel *m, const StepLayer *layers, float *x, int64_t rows, int64_t position,
                          const float *bias, int64_t threads) {
    const int64_t d = m->d_model;
    StepWork w;
    if (alloc_work(m, layers, m->layers, rows, &w)) return 1;
    int failed = 0;
    for (int64_t l = 0; l < m->layers && !failed; l++) {
        const StepLayer *L = &layers[l];
        for (int64_t which = 0; which < 3 && !failed; which++) {
            const float *in = sublayer_input(m, x, L->norm[which], L->norm_bias[which], rows, w.h, threads);
            failed |= sublayer(m, L, which, in, rows, position, bias, &w, threads);
            if (!failed) residual(m, x, w.out, L->norm[which], L->norm_bias[which], rows, w.h, threads);
        }
    }
    if (!failed && m->has_final_norm) {
        normalize(m, x, m->final_norm, m->final_norm_bias, rows, w.h, threads);
        for (int64_t i = 0; i < rows * d; i++) x[i] = w.h[i];
    }
    if (!failed && m->has_output_scale)
        for (int64_t i = 0; i < rows * d; i++) x[i] = x[i] * m->output_scale;
    free_work(&w);
    return failed;
}

/* One sub-layer of one layer (`which` as for sublayer()) for a step whose norms the caller
 * computes (PyTorch's LayerNorm, whose bits no kernel here gives): x [rows, d_model] += the
 * sub-layer of `in` [rows, d_model], what it reads (the norm of x, or x itself). The rest as
 * seqtrans_decoder_step. */
int seqtrans_decoder_sublayer(const StepModel *m, const StepLayer *L, int64_t which, const float *in, float *x,
                              int64_t rows, int64_t position, const float *bias, int64_t threads) {
    StepWork w;
    if (which < 0 || which > 2 || alloc_work(m, L, 1, rows, &w)) return 1;
    const int failed = sublayer(m, L, which, in, rows, position, bias, &w, threads);
    if (!failed)
        for (int64_t i = 0; i < rows * m->d_model; i++) x[i] = x[i] + w.out[i];
    free_work(&w);
    return failed;
}
