/* cpu_loss.c: losses with their gradients, mean reduction, PyTorch semantics.
 *
 * softmax_xent matches torch.nn.functional.cross_entropy(label_smoothing=eps):
 *   loss_row = (1 - eps) * (-log p[label]) + eps * mean_j(-log p[j])
 * A negative label (or one >= classes) marks an ignored row, as ignore_index does: it adds no
 * loss and no gradient and is not counted in the mean. MSE and BCE-with-logits average over
 * every element. Loss sums go through the deterministic chunked reduction.
 *
 * softmax_xent's rows are ld apart; the columns [classes, ld) are vocabulary padding: never read
 * into the softmax, gradient 0. Every loss may write its gradient over its input: a row's (or
 * element's) values are read before its gradient is written. */
#include <math.h>
#include <string.h>

#include "core/cpu/cpu_internal.h"

typedef struct {
    float *grad;
    const float *x, *target;
    const int32_t *labels;
    int64_t rows, cols, ld, n, rows_per_chunk;
    float smoothing;
    float grad_mul; /* grad_scale / count */
} loss_ctx;

static bool label_valid(int32_t label, int64_t classes) { return label >= 0 && label < classes; }

static void xent_chunk(void *c, int64_t chunk, double *out) {
    loss_ctx *k = c;
    int64_t r0 = chunk * k->rows_per_chunk;
    int64_t r1 = r0 + k->rows_per_chunk < k->rows ? r0 + k->rows_per_chunk : k->rows;
    double loss = 0.0, correct = 0.0;
    int64_t C = k->cols;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = k->x + r * k->ld;
        float *g = k->grad ? k->grad + r * k->ld : NULL;
        int32_t label = k->labels[r];
        if (g && k->ld > C) memset(g + C, 0, (size_t)(k->ld - C) * sizeof(float));
        if (!label_valid(label, C)) {
            if (g) memset(g, 0, (size_t)C * sizeof(float));
            continue;
        }
        float mx = x[0];
        int64_t arg = 0;
        for (int64_t j = 1; j < C; j++)
            if (x[j] > mx) {
                mx = x[j];
                arg = j;
            }
        double sum_exp = 0.0, sum_x = 0.0;
        for (int64_t j = 0; j < C; j++) {
            sum_exp += exp((double)(x[j] - mx));
            sum_x += x[j];
        }
        double lse = mx + log(sum_exp);
        double nll = lse - x[label];
        double smooth = lse - sum_x / (double)C; /* mean over classes of -log p */
        loss += (1.0 - k->smoothing) * nll + k->smoothing * smooth;
        correct += arg == label;
        if (!g) continue;
        float off = k->smoothing / (float)C;
        for (int64_t j = 0; j < C; j++) {
            float p = (float)exp((double)x[j] - lse);
            g[j] = (p - off) * k->grad_mul;
        }
        g[label] -= (1.0f - k->smoothing) * k->grad_mul;
    }
    out[0] = loss;
    out[1] = correct;
}

void ct_cpu_f32_softmax_xent(ct_backend *be, float *dlogits, float *loss_host, int64_t *correct_host,
                             const float *logits, const int32_t *labels, int64_t rows,
                             int64_t classes, int64_t ld, float label_smoothing, float grad_scale) {
    int64_t valid = 0;
    for (int64_t r = 0; r < rows; r++) valid += label_valid(labels[r], classes);
    loss_ctx k = {.grad = dlogits, .x = logits, .labels = labels, .rows = rows, .cols = classes, .ld = ld,
                  .smoothing = label_smoothing,
                  .grad_mul = valid ? grad_scale / (float)valid : 0.0f,
                  .rows_per_chunk = ld >= CT_CPU_CHUNK ? 1 : CT_CPU_CHUNK / (ld > 0 ? ld : 1)};
    double total[2];
    ct_cpu_reduce_chunks(ct_cpu_pool_of(be), ct_cpu_ceil_div(rows, k.rows_per_chunk), 2, xent_chunk,
                         &k, total);
    if (loss_host) *loss_host = valid ? (float)(total[0] / (double)valid) : 0.0f;
    if (correct_host) *correct_host = (int64_t)total[1];
}

static void mse_chunk(void *c, int64_t chunk, double *out) {
    loss_ctx *k = c;
    int64_t i0, i1;
    ct_cpu_chunk_bounds(chunk, k->n, &i0, &i1);
    double sum = 0.0;
    for (int64_t i = i0; i < i1; i++) {
        float d = k->x[i] - k->target[i];
        sum += (double)d * d;
        if (k->grad) k->grad[i] = 2.0f * d * k->grad_mul;
    }
    out[0] = sum;
}

static void bce_chunk(void *c, int64_t chunk, double *out) {
    loss_ctx *k = c;
    int64_t i0, i1;
    ct_cpu_chunk_bounds(chunk, k->n, &i0, &i1);
    double sum = 0.0;
    for (int64_t i = i0; i < i1; i++) {
        float x = k->x[i], t = k->target[i];
        /* max(x, 0) - x t + log(1 + e^-|x|): no overflow for large |x| */
        sum += (double)(x > 0.0f ? x : 0.0f) - (double)x * t + log1p(exp(-fabs((double)x)));
        if (k->grad) {
            float s = 1.0f / (1.0f + expf(-x));
            k->grad[i] = (s - t) * k->grad_mul;
        }
    }
    out[0] = sum;
}

static void elementwise_loss(ct_backend *be, ct_cpu_chunk_fn fn, float *grad, float *loss_host,
                             const float *x, const float *target, int64_t n, float grad_scale) {
    loss_ctx k = {.grad = grad, .x = x, .target = target, .n = n,
                  .grad_mul = n > 0 ? grad_scale / (float)n : 0.0f};
    double total;
    ct_cpu_reduce_chunks(ct_cpu_pool_of(be), ct_cpu_ceil_div(n, CT_CPU_CHUNK), 1, fn, &k, &total);
    if (loss_host) *loss_host = n > 0 ? (float)(total / (double)n) : 0.0f;
}

void ct_cpu_f32_mse_loss(ct_backend *be, float *dpred, float *loss_host, const float *pred,
                         const float *target, int64_t n_rows, int64_t n_cols, float grad_scale) {
    elementwise_loss(be, mse_chunk, dpred, loss_host, pred, target, n_rows * n_cols, grad_scale);
}

void ct_cpu_f32_bce_logits_loss(ct_backend *be, float *dlogits, float *loss_host, const float *logits,
                                const float *target, int64_t n_rows, int64_t n_cols, float grad_scale) {
    elementwise_loss(be, bce_chunk, dlogits, loss_host, logits, target, n_rows * n_cols, grad_scale);
}

void ct_cpu_loss_install(ct_backend *be) {
}
