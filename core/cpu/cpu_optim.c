/* cpu_optim.c: fused optimizer updates over flat fp32 master buffers.
 *
 * Adam/AdamW follow DeepSpeed's FusedAdam (multi_tensor_adam):
 *   g = grad * grad_scale;  L2 mode: g += wd * p
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   update = (m / bc1) / (sqrt(v / bc2) + eps);  adam_w_mode: update += wd * p
 *   p -= lr * update
 * SGD follows torch.optim.SGD (weight decay into the gradient, dampening, nesterov, and a momentum
 * buffer that starts as a copy of the first gradient). Lamb writes FusedLamb's direction
 * m_hat / (sqrt(v_hat) + eps) + wd * p (eps inside the sqrt when asked) and the two norms the
 * caller needs for the trust ratio. Adam and SGD also write the 16-bit copy of the parameters they
 * just updated when asked (args.copy), in the same pass. Adam's element kernels (baseline, AVX2,
 * AVX-512, all giving the same bits) are in cpu_adam.c. */
#include <math.h>

#include "core/cpu/cpu_internal.h"

typedef struct {
    float *param, *m, *v, *upd;
    const float *grad;
    int64_t n;
    const ct_adam_args *adam;
    const ct_sgd_args *sgd;
    const ct_lamb_args *lamb;
} opt_ctx;

enum { OPT_BLOCK = 256 }; /* elements per block of the Lamb kernel */

/* Adam runs the widest kernel of cpu_adam.c that this CPU has, chosen once per step. */
typedef struct {
    opt_ctx k;
    int isa;
} adam_ctx;

static void adam_range(void *c, int64_t i0, int64_t i1) {
    const adam_ctx *a = c;
    ct_cpu_adam_range(a->k.param, a->k.grad, a->k.m, a->k.v, i0, i1, a->k.adam, a->isa);
}

static void cpu_adam_step(ct_backend *be, float *param, const float *grad, float *m, float *v,
                          int64_t n, const ct_adam_args *a) {
    adam_ctx c = {.k = {.param = param, .grad = grad, .m = m, .v = v, .n = n, .adam = a},
                  .isa = ct_cpu_adam_isa(-1)};
    ct_cpu_parallel(ct_cpu_pool_of(be), n, CT_CPU_GRAIN / 4, adam_range, &c);
}

static void sgd_range(void *c, int64_t i0, int64_t i1) {
    opt_ctx *k = c;
    const ct_sgd_args *a = k->sgd;
    float *restrict p = k->param, *restrict buf = k->m;
    const float *restrict g = k->grad;
    bool use_mom = a->momentum != 0.0f && buf;
    for (int64_t i = i0; i < i1; i++) {
        float d = g[i] * a->grad_scale + a->weight_decay * p[i];
        if (use_mom) {
            buf[i] = a->first_step ? d : a->momentum * buf[i] + (1.0f - a->dampening) * d;
            d = a->nesterov ? d + a->momentum * buf[i] : buf[i];
        }
        p[i] -= a->lr * d;
    }
    if (a->copy) ct_cpu_cast_range(a->copy, a->copy_dt, p, CT_F32, i0, i1);
}

static void cpu_sgd_step(ct_backend *be, float *param, const float *grad, float *mom, int64_t n,
                         const ct_sgd_args *a) {
    opt_ctx k = {.param = param, .grad = grad, .m = mom, .n = n, .sgd = a};
    ct_cpu_parallel(ct_cpu_pool_of(be), n, CT_CPU_GRAIN / 4, sgd_range, &k);
}

/* One chunk of the Lamb direction; out = {sum p^2, sum upd^2}. Blocked like adam_range. */
static void lamb_chunk(void *c, int64_t chunk, double *out) {
    opt_ctx *k = c;
    const ct_lamb_args *a = k->lamb;
    int64_t i0, i1;
    ct_cpu_chunk_bounds(chunk, k->n, &i0, &i1);
    float *restrict m = k->m, *restrict v = k->v, *restrict upd = k->upd;
    const float *restrict g = k->grad, *restrict p = k->param;
    float b1 = a->beta1, b2 = a->beta2, scale = a->grad_scale;
    float eps_in = a->eps_inside_sqrt ? a->eps : 0.0f, eps_out = a->eps_inside_sqrt ? 0.0f : a->eps;
    float denom[OPT_BLOCK];
    double wsq = 0.0, usq = 0.0;
    for (int64_t s = i0; s < i1; s += OPT_BLOCK) {
        int64_t n = i1 - s < OPT_BLOCK ? i1 - s : OPT_BLOCK;
        for (int64_t j = 0; j < n; j++) {
            int64_t i = s + j;
            float gi = g[i] * scale;
            m[i] = b1 * m[i] + (1.0f - b1) * gi;
            v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
            denom[j] = v[i] / a->bias_c2 + eps_in;
        }
        ct_cpu_sqrt_block(denom, denom, n);
        for (int64_t j = 0; j < n; j++) {
            int64_t i = s + j;
            upd[i] = (m[i] / a->bias_c1) / (denom[j] + eps_out) + a->weight_decay * p[i];
        }
        /* the norms in a fixed order (a double sum does not vectorise without reassociation) */
        for (int64_t j = 0; j < n; j++) {
            wsq += (double)p[s + j] * p[s + j];
            usq += (double)upd[s + j] * upd[s + j];
        }
    }
    out[0] = wsq;
    out[1] = usq;
}

static void cpu_lamb_direction(ct_backend *be, float *upd, const float *param, const float *grad,
                               float *m, float *v, int64_t n, const ct_lamb_args *a,
                               double *w_norm_host, double *u_norm_host) {
    opt_ctx k = {.param = (float *)param, .grad = grad, .m = m, .v = v, .upd = upd, .n = n, .lamb = a};
    double total[2];
    ct_cpu_reduce_chunks(ct_cpu_pool_of(be), ct_cpu_ceil_div(n, CT_CPU_CHUNK), 2, lamb_chunk, &k, total);
    if (w_norm_host) *w_norm_host = sqrt(total[0]);
    if (u_norm_host) *u_norm_host = sqrt(total[1]);
}

void ct_cpu_optim_install(ct_backend *be) {
    be->optim.adam_step = cpu_adam_step;
    be->optim.sgd_step = cpu_sgd_step;
    be->optim.lamb_direction = cpu_lamb_direction;
}
