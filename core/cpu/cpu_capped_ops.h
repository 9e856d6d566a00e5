/* cpu_capped_ops.h: every op of the backend table (backend.h's blas, elt, conv, norm, embed, attn,
 * loss and optim sub-tables), as X-macro rows for the capped device's wrappers (cpu_capped.c):
 *   XV(table, op, return type, (parameters), (arguments)) for an op that returns void,
 *   XR(...) for one that returns a value.
 * A new op of those sub-tables needs its row here: test_backend's capped_wraps_every_op fails
 * until it has one (the capped device would run it without waiting for the copies before it). */
#ifndef CT_CPU_CAPPED_OPS_H
#define CT_CPU_CAPPED_OPS_H

#define CT_CAPPED_OPS(XV, XR) \
    XV(blas, gemm, void, (ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, \
        const void *a, ct_dtype a_dt, int64_t lda, const void *b, ct_dtype b_dt, int64_t ldb, float beta, void *c, \
        ct_dtype c_dt, int64_t ldc), (be, ta, tb, m, n, k, alpha, a, a_dt, lda, b, b_dt, ldb, beta, c, c_dt, ldc)) \
    XV(blas, gemm_batched, void, (ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, \
        const float *a, int64_t lda, int64_t sa, const float *b, int64_t ldb, int64_t sb, float beta, float *c, \
        int64_t ldc, int64_t sc, int64_t batch), (be, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, \
        sc, batch)) \
    XV(blas, linear_forward, void, (ct_backend *be, void *y, const void *x, const void *w, const void *bias, \
        int64_t rows, int64_t in, int64_t out, ct_act act, float alpha, ct_dtype dt), (be, y, x, w, bias, rows, in, \
        out, act, alpha, dt)) \
    XV(elt, fill, void, (ct_backend *be, void *x, float v, int64_t n, ct_dtype dt), (be, x, v, n, dt)) \
    XV(elt, scale, void, (ct_backend *be, void *x, float s, int64_t n, ct_dtype dt), (be, x, s, n, dt)) \
    XV(elt, axpy, void, (ct_backend *be, void *y, float a, const void *x, int64_t n, ct_dtype dt), (be, y, a, x, n, \
        dt)) \
    XV(elt, add, void, (ct_backend *be, void *y, const void *a, const void *b, int64_t n, ct_dtype dt), (be, y, a, b, \
        n, dt)) \
    XV(elt, copy_rows, void, (ct_backend *be, void *y, int64_t ldy, const void *x, int64_t ldx, int64_t rows, \
        int64_t cols, bool accumulate, ct_dtype dt), (be, y, ldy, x, ldx, rows, cols, accumulate, dt)) \
    XV(elt, cast, void, (ct_backend *be, void *y, ct_dtype y_dt, const void *x, ct_dtype x_dt, int64_t n), (be, y, \
        y_dt, x, x_dt, n)) \
    XV(elt, round_to, void, (ct_backend *be, float *x, int64_t n, ct_dtype dt), (be, x, n, dt)) \
    XV(elt, normalize_u8, void, (ct_backend *be, void *y, const uint8_t *x, const uint8_t *flip, \
        const ct_u8_normalize *p, ct_dtype dt), (be, y, x, flip, p, dt)) \
    XV(elt, bias_act_forward, void, (ct_backend *be, void *x, const void *bias, int64_t rows, int64_t cols, \
        int64_t inner, ct_act act, float alpha, ct_dtype dt), (be, x, bias, rows, cols, inner, act, alpha, dt)) \
    XV(elt, bias_backward, void, (ct_backend *be, float *db, const void *dy, int64_t rows, int64_t cols, \
        int64_t inner, ct_dtype dt), (be, db, dy, rows, cols, inner, dt)) \
    XV(elt, act_forward, void, (ct_backend *be, void *y, const void *x, int64_t n, ct_act act, float alpha, \
        ct_dtype dt), (be, y, x, n, act, alpha, dt)) \
    XV(elt, act_backward, void, (ct_backend *be, void *dx, const void *dy, const void *x, const void *y, int64_t n, \
        ct_act act, float alpha, ct_dtype dt), (be, dx, dy, x, y, n, act, alpha, dt)) \
    XV(elt, dropout_forward, void, (ct_backend *be, void *y, uint8_t *mask, const void *x, int64_t n, float p, \
        uint64_t seed, uint64_t stream, ct_dtype dt), (be, y, mask, x, n, p, seed, stream, dt)) \
    XV(elt, dropout_backward, void, (ct_backend *be, void *dx, const void *dy, const uint8_t *mask, int64_t n, \
        float p, ct_dtype dt), (be, dx, dy, mask, n, p, dt)) \
    XV(elt, init_fill, void, (ct_backend *be, float *x, int64_t first, int64_t n, const ct_init_dist *d, \
        uint64_t seed, uint64_t stream), (be, x, first, n, d, seed, stream)) \
    XV(elt, swiglu_forward, void, (ct_backend *be, void *y, const void *x, int64_t rows, int64_t f, ct_dtype dt), \
        (be, y, x, rows, f, dt)) \
    XV(elt, swiglu_backward, void, (ct_backend *be, void *dx, const void *dy, const void *x, int64_t rows, int64_t f, \
        ct_dtype dt), (be, dx, dy, x, rows, f, dt)) \
    XV(conv, im2col, void, (ct_backend *be, void *col, const void *img, const ct_conv2d_geom *g, int64_t group, \
        ct_dtype dt), (be, col, img, g, group, dt)) \
    XV(conv, col2im, void, (ct_backend *be, void *img, const void *col, const ct_conv2d_geom *g, int64_t group, \
        ct_dtype dt), (be, img, col, g, group, dt)) \
    XV(conv, conv2d_forward, void, (ct_backend *be, void *y, const void *x, const void *w, const void *bias, \
        const ct_conv2d_geom *g, ct_dtype dt), (be, y, x, w, bias, g, dt)) \
    XV(conv, conv2d_backward, void, (ct_backend *be, void *dx, float *dw, float *db, const void *dy, const void *x, \
        const void *w, const ct_conv2d_geom *g, ct_dtype dt), (be, dx, dw, db, dy, x, w, g, dt)) \
    XV(conv, conv2d_act_forward, void, (ct_backend *be, void *y, const void *x, const void *w, const void *bias, \
        const ct_conv2d_geom *g, ct_act act, ct_dtype dt), (be, y, x, w, bias, g, act, dt)) \
    XV(conv, conv2d_act_backward, void, (ct_backend *be, void *dx, float *dw, float *db, const void *dy, \
        const void *y, const void *x, const void *w, const ct_conv2d_geom *g, ct_act act, ct_dtype dt), (be, dx, dw, \
        db, dy, y, x, w, g, act, dt)) \
    XV(conv, conv2d_act_pool_forward, void, (ct_backend *be, void *y, int32_t *argmax, const void *x, const void *w, \
        const void *bias, const ct_conv2d_geom *g, ct_act act, ct_dtype dt), (be, y, argmax, x, w, bias, g, act, \
        dt)) \
    XV(conv, conv2d_act_pool_backward, void, (ct_backend *be, void *dx, float *dw, float *db, const void *dy, \
        const void *y, const int32_t *argmax, const void *x, const void *w, const ct_conv2d_geom *g, ct_act act, \
        ct_dtype dt), (be, dx, dw, db, dy, y, argmax, x, w, g, act, dt)) \
    XV(conv, maxpool2d_forward, void, (ct_backend *be, void *y, int32_t *argmax, const void *x, \
        const ct_pool2d_geom *g, ct_dtype dt), (be, y, argmax, x, g, dt)) \
    XV(conv, maxpool2d_backward, void, (ct_backend *be, void *dx, const void *dy, const int32_t *argmax, \
        const ct_pool2d_geom *g, ct_dtype dt), (be, dx, dy, argmax, g, dt)) \
    XV(conv, avgpool2d_forward, void, (ct_backend *be, void *y, const void *x, const ct_pool2d_geom *g, ct_dtype dt), \
        (be, y, x, g, dt)) \
    XV(conv, avgpool2d_backward, void, (ct_backend *be, void *dx, const void *dy, const ct_pool2d_geom *g, \
        ct_dtype dt), (be, dx, dy, g, dt)) \
    XV(norm, batchnorm_forward, void, (ct_backend *be, void *y, const void *x, const void *gamma, const void *beta, \
        float *running_mean, float *running_var, float *save_mean, float *save_invstd, int64_t n, int64_t c, \
        int64_t hw, float eps, float momentum, bool train, ct_dtype dt), (be, y, x, gamma, beta, running_mean, \
        running_var, save_mean, save_invstd, n, c, hw, eps, momentum, train, dt)) \
    XV(norm, batchnorm_backward, void, (ct_backend *be, void *dx, float *dgamma, float *dbeta, const void *dy, \
        const void *x, const void *gamma, const float *save_mean, const float *save_invstd, int64_t n, int64_t c, \
        int64_t hw, ct_dtype dt), (be, dx, dgamma, dbeta, dy, x, gamma, save_mean, save_invstd, n, c, hw, dt)) \
    XV(norm, layernorm_forward, void, (ct_backend *be, void *y, float *save_mean, float *save_rstd, const void *x, \
        const void *gamma, const void *beta, int64_t rows, int64_t d, float eps, ct_dtype dt), (be, y, save_mean, \
        save_rstd, x, gamma, beta, rows, d, eps, dt)) \
    XV(norm, layernorm_backward, void, (ct_backend *be, void *dx, float *dgamma, float *dbeta, const void *dy, \
        const void *x, const void *gamma, const float *save_mean, const float *save_rstd, int64_t rows, int64_t d, \
        ct_dtype dt), (be, dx, dgamma, dbeta, dy, x, gamma, save_mean, save_rstd, rows, d, dt)) \
    XV(norm, rmsnorm_forward, void, (ct_backend *be, void *y, float *save_rstd, const void *x, const void *gamma, \
        int64_t rows, int64_t d, float eps, ct_dtype dt), (be, y, save_rstd, x, gamma, rows, d, eps, dt)) \
    XV(norm, rmsnorm_backward, void, (ct_backend *be, void *dx, float *dgamma, const void *dy, const void *x, \
        const void *gamma, const float *save_rstd, int64_t rows, int64_t d, ct_dtype dt), (be, dx, dgamma, dy, x, \
        gamma, save_rstd, rows, d, dt)) \
    XV(embed, embedding_forward, void, (ct_backend *be, void *y, const int32_t *ids, const void *table, \
        int64_t n_ids, int64_t dim, ct_dtype dt), (be, y, ids, table, n_ids, dim, dt)) \
    XV(embed, embedding_backward, void, (ct_backend *be, float *dtable, const void *dy, const int32_t *ids, \
        int64_t n_ids, int64_t vocab, int64_t dim, ct_dtype dt), (be, dtable, dy, ids, n_ids, vocab, dim, dt)) \
    XV(attn, causal_attention_forward, void, (ct_backend *be, void *y, float *lse, const void *qkv, int64_t B, \
        int64_t T, int64_t H, int64_t D, float p, uint64_t seed, uint64_t stream, ct_dtype dt), (be, y, lse, qkv, B, \
        T, H, D, p, seed, stream, dt)) \
    XV(attn, causal_attention_backward, void, (ct_backend *be, void *dqkv, const void *dy, const void *qkv, \
        const void *y, const float *lse, int64_t B, int64_t T, int64_t H, int64_t D, float p, uint64_t seed, \
        uint64_t stream, ct_dtype dt), (be, dqkv, dy, qkv, y, lse, B, T, H, D, p, seed, stream, dt)) \
    XV(attn, rope_gqa_forward, void, (ct_backend *be, void *qkv, const void *x, int64_t B, int64_t T, int64_t H, \
        int64_t KV, int64_t D, const ct_rope *r, ct_dtype dt), (be, qkv, x, B, T, H, KV, D, r, dt)) \
    XV(attn, rope_gqa_backward, void, (ct_backend *be, void *dx, const void *dqkv, int64_t B, int64_t T, int64_t H, \
        int64_t KV, int64_t D, const ct_rope *r, ct_dtype dt), (be, dx, dqkv, B, T, H, KV, D, r, dt)) \
    XV(attn, kv_attention_forward, void, (ct_backend *be, void *y, void *kv, const void *qkv, int64_t B, int64_t T, \
        int64_t pos0, int64_t cap, int64_t H, int64_t KV, int64_t D, ct_dtype dt), (be, y, kv, qkv, B, T, pos0, cap, \
        H, KV, D, dt)) \
    XV(loss, softmax_xent, void, (ct_backend *be, void *dlogits, float *result, const void *logits, \
        const int32_t *labels, int64_t rows, int64_t classes, int64_t ld, float label_smoothing, float grad_scale, \
        ct_dtype dt), (be, dlogits, result, logits, labels, rows, classes, ld, label_smoothing, grad_scale, dt)) \
    XV(loss, mse_loss, void, (ct_backend *be, void *dpred, float *result, const void *pred, const float *target, \
        int64_t n_rows, int64_t n_cols, float grad_scale, ct_dtype dt), (be, dpred, result, pred, target, n_rows, \
        n_cols, grad_scale, dt)) \
    XV(loss, bce_logits_loss, void, (ct_backend *be, void *dlogits, float *result, const void *logits, \
        const float *target, int64_t n_rows, int64_t n_cols, float grad_scale, ct_dtype dt), (be, dlogits, result, \
        logits, target, n_rows, n_cols, grad_scale, dt)) \
    XR(optim, sum_squares, double, (ct_backend *be, const float *x, int64_t n), (be, x, n)) \
    XR(optim, all_finite, bool, (ct_backend *be, const float *x, int64_t n), (be, x, n)) \
    XV(optim, adam_step, void, (ct_backend *be, float *param, const float *grad, float *m, float *v, int64_t n, \
        const ct_adam_args *a), (be, param, grad, m, v, n, a)) \
    XV(optim, sgd_step, void, (ct_backend *be, float *param, const float *grad, float *mom, int64_t n, \
        const ct_sgd_args *a), (be, param, grad, mom, n, a)) \
    XV(optim, lamb_direction, void, (ct_backend *be, float *upd, const float *param, const float *grad, float *m, \
        float *v, int64_t n, const ct_lamb_args *a, double *w_norm_host, double *u_norm_host), (be, upd, param, grad, \
        m, v, n, a, w_norm_host, u_norm_host))

#endif
