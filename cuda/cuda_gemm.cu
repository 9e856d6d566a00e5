/* cuda_gemm.cu: GEMM and strided-batched GEMM through cuBLASLt.
 *
 * cuBLASLt is column-major; a row-major matrix X[r, c] with row stride ld is the column-major
 * matrix X^T[c, r] with the same ld. So row-major C = op(A) op(B) is computed as column-major
 * C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" is our A, with the transposes kept.
 *
 * Accumulation is always fp32 (CUBLAS_COMPUTE_32F); TF32 only when ct_cuda_set_tf32() asked.
 * Natively supported storage: all fp32; or A and B both fp16 (bf16) with C fp16 (bf16) or fp32.
 * Other mixes, and layouts the heuristic has no kernel for, are promoted to packed fp32 scratch
 * copies (correct, slower; no layer uses them yet).
 *
 * Descriptors and the heuristic's algorithm are cached per shape, so a training step that
 * repeats its GEMMs pays for the heuristic only in its first step. */
#include "cuda/cuda_internal.h"

#include <stdio.h>
#include <string.h>

static cudaDataType_t lt_type(ct_dtype t) {
    switch (t) {
    case CT_F32: return CUDA_R_32F;
    case CT_F16: return CUDA_R_16F;
    case CT_BF16: return CUDA_R_16BF;
    default: break;
    }
    ct_cuda_fail_at("internal", "GEMM operand dtype must be f32, f16 or bf16", "lt_type", __FILE__,
                    __LINE__);
    return CUDA_R_32F;
}

static bool native_combo(ct_dtype a, ct_dtype b, ct_dtype c) {
    if (a != b) return false;
    if (a == CT_F32) return c == CT_F32;
    return (a == CT_F16 || a == CT_BF16) && (c == a || c == CT_F32);
}

/* Largest power of two <= 16 that divides the address (cuBLASLt's alignment preference). */
static int ptr_align(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 16;
    while (a > 1 && (u % (uintptr_t)a) != 0) a /= 2;
    return a;
}

static void plan_release(ct_cuda_gemm_plan *p) {
    if (!p->used) return;
    CT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
    CT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
    CT_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lc));
    CT_CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->op));
    p->used = 0;
}

void ct_cuda_gemm_plans_destroy(ct_cuda *cu) {
    for (int i = 0; i < CT_CUDA_GEMM_CACHE; i++) plan_release(&cu->plans[i]);
}

static cublasLtMatrixLayout_t make_layout(ct_dtype dt, int64_t rows, int64_t cols, int64_t ld,
                                          int64_t batch, int64_t stride) {
    cublasLtMatrixLayout_t l;
    CT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, lt_type(dt), (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        int32_t count = (int32_t)batch;
        CT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof count));
        CT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
    return l;
}

/* bias: the epilogue's bias vector (NULL without one); the heuristic reads its alignment. */
static void plan_build(ct_cuda *cu, ct_cuda_gemm_plan *p, const ct_cuda_gemm_key *k,
                       const void *bias) {
    p->key = *k;
    cublasComputeType_t ct = k->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F));
    if (k->epi != 0) {
        /* bias elements have D's type (cublasLt.h, BIAS_DATA_TYPE default), i.e. the op's dt */
        cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epi;
        CT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                       sizeof epi));
        CT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias, sizeof bias));
    }
    cublasOperation_t op_a = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A is our B */
    cublasOperation_t op_b = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's B is our A */
    CT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                   sizeof op_a));
    CT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                   sizeof op_b));
    /* our B: [K,N] row-major = col-major [N,K]; when tb it is [N,K] row-major = col-major [K,N] */
    p->la = make_layout((ct_dtype)k->b_dt, k->tb ? k->k : k->n, k->tb ? k->n : k->k, k->ldb,
                        k->batch, k->sb);
    /* our A: [M,K] row-major = col-major [K,M]; when ta it is [K,M] row-major = col-major [M,K] */
    p->lb = make_layout((ct_dtype)k->a_dt, k->ta ? k->m : k->k, k->ta ? k->k : k->m, k->lda,
                        k->batch, k->sa);
    /* C [M,N] row-major = col-major [N,M] */
    p->lc = make_layout((ct_dtype)k->c_dt, k->n, k->m, k->ldc, k->batch, k->sc);

    cublasLtMatmulPreference_t pref;
    CT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = cu->lt_workspace_bytes;
    CT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t align = (uint32_t)k->align;
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        CT_CUBLAS_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &align, sizeof align));
    if (k->c_dt != CT_F32) {
        /* split-K may reduce partial sums in the output type (INPLACE, OUTPUT_TYPE schemes): a
         * 16-bit output would be rounded more than once; backend.h promises one rounding */
        uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        CT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme));
    }
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    /* NOT_SUPPORTED means "no algorithm for this configuration": the caller falls back */
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(cu->lt, p->op, p->la, p->lb, p->lc, p->lc,
                                                       pref, 1, &res, &found);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED) found = 0;
    else CT_CUBLAS_CHECK(hs);
    CT_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    p->used = 1;
    p->has_algo = found >= 1 && res.state == CUBLAS_STATUS_SUCCESS;
    if (p->has_algo) p->algo = res.algo;
}

static ct_cuda_gemm_plan *plan_get(ct_cuda *cu, const ct_cuda_gemm_key *k, const void *bias) {
    ct_cuda_gemm_plan *victim = &cu->plans[0];
    cu->plan_clock++;
    for (int i = 0; i < CT_CUDA_GEMM_CACHE; i++) {
        ct_cuda_gemm_plan *p = &cu->plans[i];
        if (p->used && memcmp(&p->key, k, sizeof *k) == 0) {
            p->last_use = cu->plan_clock;
            return p;
        }
        if (!p->used) victim = p;
        else if (victim->used && p->last_use < victim->last_use) victim = p;
    }
    plan_release(victim);
    plan_build(cu, victim, k, bias);
    victim->last_use = cu->plan_clock;
    return victim;
}

/* Shape checks: a wrong leading dimension would read the wrong elements silently. */
static void check_dims(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                       int64_t ldc, int64_t batch) {
    CT_CUDA_REQUIRE(m >= 0 && n >= 0 && k >= 0 && batch >= 0, "negative GEMM size");
    CT_CUDA_REQUIRE(lda >= (ta ? m : k) && lda >= 1, "GEMM lda smaller than a row of A");
    CT_CUDA_REQUIRE(ldb >= (tb ? k : n) && ldb >= 1, "GEMM ldb smaller than a row of B");
    CT_CUDA_REQUIRE(ldc >= n && ldc >= 1, "GEMM ldc smaller than a row of C");
    CT_CUDA_REQUIRE(batch <= INT32_MAX, "GEMM batch count above 2^31");
}

/* One cuBLASLt call with every operand in a native combination. False (nothing queued) when the
 * heuristic has no algorithm for this shape, dtype and alignment. epi (a cublasLtEpilogue_t, 0 for
 * none) with bias: the fused epilogue of linear_forward (bias per column of our row-major C). */
static bool lt_matmul_epi(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                          float alpha, const void *a, ct_dtype a_dt, int64_t lda, int64_t sa,
                          const void *b, ct_dtype b_dt, int64_t ldb, int64_t sb, float beta, void *c,
                          ct_dtype c_dt, int64_t ldc, int64_t sc, int64_t batch, int epi,
                          const void *bias) {
    ct_cuda *cu = ct_cuda_of(be);
    ct_cuda_gemm_key key;
    memset(&key, 0, sizeof key); /* padding takes part in memcmp */
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.batch = batch;
    if (batch > 1) key.sa = sa, key.sb = sb, key.sc = sc;
    key.ta = ta, key.tb = tb, key.a_dt = a_dt, key.b_dt = b_dt, key.c_dt = c_dt;
    int al = ptr_align(a);
    if (ptr_align(b) < al) al = ptr_align(b);
    if (ptr_align(c) < al) al = ptr_align(c);
    if (bias && ptr_align(bias) < al) al = ptr_align(bias);
    if (batch > 1) { /* every item's matrix must be as aligned as the first (conv's group views) */
        const int64_t off[3] = {sa * (int64_t)ct_dtype_size(a_dt), sb * (int64_t)ct_dtype_size(b_dt),
                                sc * (int64_t)ct_dtype_size(c_dt)};
        for (int i = 0; i < 3; i++) {
            int oa = off[i] == 0 ? 16 : ptr_align((const void *)(uintptr_t)off[i]);
            if (oa < al) al = oa;
        }
    }
    key.align = al;
    /* the heuristic reads the bias pointer's own alignment (cublasLt.h, BIAS_POINTER), and no
     * preference bounds it: plans for differently aligned biases must not be shared */
    key.bias_align = bias ? ptr_align(bias) : 0;
    key.tf32 = cu->tf32 && a_dt == CT_F32 && b_dt == CT_F32 && c_dt == CT_F32;
    key.epi = epi;
    ct_cuda_gemm_plan *p = plan_get(cu, &key, bias);
    if (!p->has_algo) return false;
    if (epi != 0) /* the cached descriptor holds the previous call's bias */
        CT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias, sizeof bias));
    CT_CUBLAS_CHECK(cublasLtMatmul(cu->lt, p->op, &alpha, b, p->la, a, p->lb, &beta, c, p->lc, c,
                                   p->lc, &p->algo, cu->lt_workspace, cu->lt_workspace_bytes,
                                   cu->compute));
    return true;
}

static bool lt_matmul(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const void *a, ct_dtype a_dt, int64_t lda, int64_t sa, const void *b,
                      ct_dtype b_dt, int64_t ldb, int64_t sb, float beta, void *c, ct_dtype c_dt,
                      int64_t ldc, int64_t sc, int64_t batch) {
    return lt_matmul_epi(be, ta, tb, m, n, k, alpha, a, a_dt, lda, sa, b, b_dt, ldb, sb, beta, c,
                         c_dt, ldc, sc, batch, 0, NULL);
}

/* fp32 copy of a strided operand in scratch (rows x cols per batch item, packed). */
static float *promote(ct_backend *be, const void *x, ct_dtype dt, int64_t rows, int64_t cols,
                      int64_t ld, int64_t stride, int64_t batch) {
    float *t = (float *)CT_CUDA_SCRATCH(be, (size_t)(rows * cols * batch) * sizeof(float));
    ct_cuda_cast_2d(be, t, CT_F32, cols, rows * cols, x, dt, ld, stride, rows, cols, batch);
    return t;
}

void ct_cuda_gemm_strided(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const void *a, ct_dtype a_dt, int64_t lda, int64_t sa, const void *b,
                     ct_dtype b_dt, int64_t ldb, int64_t sb, float beta, void *c, ct_dtype c_dt,
                     int64_t ldc, int64_t sc, int64_t batch) {
    CT_CUDA_REQUIRE(ct_cuda_float_dtype(a_dt) && ct_cuda_float_dtype(b_dt) &&
                        ct_cuda_float_dtype(c_dt),
                    "GEMM dtypes must be f32, f16 or bf16");
    check_dims(ta, tb, m, n, k, lda, ldb, ldc, batch);
    if (m == 0 || n == 0 || batch == 0) return;
    if (k == 0) { /* op(A) op(B) is empty: C = beta C */
        ct_cuda_scale_2d(be, c, c_dt, ldc, sc, beta, m, n, batch);
        return;
    }
    if (native_combo(a_dt, b_dt, c_dt) &&
        lt_matmul(be, ta, tb, m, n, k, alpha, a, a_dt, lda, sa, b, b_dt, ldb, sb, beta, c, c_dt,
                  ldc, sc, batch))
        return;
    /* A mix cuBLASLt lacks, or a layout (odd leading dimension, misaligned view) it has no kernel
     * for: packed, 256-byte-aligned fp32 copies of every operand, one fp32 GEMM, C cast back. */
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    float *a32 = promote(be, a, a_dt, ar, ac, lda, sa, batch);
    float *b32 = promote(be, b, b_dt, br, bc, ldb, sb, batch);
    float *c32 = promote(be, c, c_dt, m, n, ldc, sc, batch);
    bool ok = lt_matmul(be, ta, tb, m, n, k, alpha, a32, CT_F32, ac, ar * ac, b32, CT_F32, bc, br * bc,
                        beta, c32, CT_F32, n, m * n, batch);
    if (!ok) {
        char msg[200];
        snprintf(msg, sizeof msg, "cuBLASLt has no fp32 algorithm for m=%lld n=%lld k=%lld batch %lld",
                 (long long)m, (long long)n, (long long)k, (long long)batch);
        ct_cuda_fail_at("cuBLAS", msg, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    }
    ct_cuda_cast_2d(be, c, c_dt, ldc, sc, c32, CT_F32, n, m * n, m, n, batch);
    ct_cuda_scratch_free(be, a32);
    ct_cuda_scratch_free(be, b32);
    ct_cuda_scratch_free(be, c32);
}

static void cu_gemm(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                    const void *a, ct_dtype a_dt, int64_t lda, const void *b, ct_dtype b_dt,
                    int64_t ldb, float beta, void *c, ct_dtype c_dt, int64_t ldc) {
    ct_cuda_gemm_strided(be, ta, tb, m, n, k, alpha, a, a_dt, lda, 0, b, b_dt, ldb, 0, beta, c,
                         c_dt, ldc, 0, 1);
}

static void cu_gemm_batched(ct_backend *be, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, int64_t sa, const float *b,
                            int64_t ldb, int64_t sb, float beta, float *c, int64_t ldc, int64_t sc,
                            int64_t batch) {
    ct_cuda_gemm_strided(be, ta, tb, m, n, k, alpha, a, CT_F32, lda, sa, b, CT_F32, ldb, sb, beta, c,
                         CT_F32, ldc, sc, batch);
}

/* y[rows, out] = act(x[rows, in] w[out, in]^T + bias[out]), all in dt. The bias and the
 * activation ride in a cuBLASLt epilogue where one computes ours: BIAS, and, for 16-bit outputs
 * only, GELU(_BIAS) for the tanh form (cuBLASLt's GELU is the tanh approximation; its fast tanh is
 * well inside 16-bit rounding but not inside fp32's 1e-5 budget). Not RELU(_BIAS): cuBLASLt
 * documents it as max(x, 0), which on the GPU maps NaN to 0, and our ReLU keeps NaN (an
 * overflowed 16-bit forward must reach the loss check); the ReLU then runs in bias_act_forward.
 * Otherwise, or when the heuristic has no fused kernel, a plain GEMM followed by
 * bias_act_forward. In cuBLASLt's column-major view D is [out, rows], so the bias runs along D's
 * rows as the epilogue requires. */
static bool linear_act_fused(ct_act act, ct_dtype dt) {
    return act == CT_ACT_NONE || (act == CT_ACT_GELU_TANH && dt != CT_F32);
}

static int linear_epilogue(ct_act act, ct_dtype dt, bool has_bias) {
    if (!linear_act_fused(act, dt)) act = CT_ACT_NONE; /* bias only; the activation follows */
    switch (act) {
    case CT_ACT_NONE: return has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    case CT_ACT_GELU_TANH: return has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    default: return has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    }
}

static void cu_linear_forward(ct_backend *be, void *y, const void *x, const void *w,
                              const void *bias, int64_t rows, int64_t in, int64_t out, ct_act act,
                              float alpha, ct_dtype dt) {
    CT_CUDA_REQUIRE(ct_cuda_float_dtype(dt), "linear_forward: dtype must be f32, f16 or bf16");
    check_dims(false, true, rows, out, in, in, in, out, 1);
    if (rows == 0 || out == 0) return;
    if (in > 0) {
        int epi = linear_epilogue(act, dt, bias != NULL);
        if (lt_matmul_epi(be, false, true, rows, out, in, 1.0f, x, dt, in, 0, w, dt, in, 0, 0.0f, y,
                          dt, out, 0, 1, epi, bias)) {
            if (!linear_act_fused(act, dt)) be->elt.bias_act_forward(be, y, NULL, rows, out, 1, act, alpha, dt);
            return;
        }
    }
    cu_gemm(be, false, true, rows, out, in, 1.0f, x, dt, in, w, dt, in, 0.0f, y, dt, out);
    be->elt.bias_act_forward(be, y, bias, rows, out, 1, act, alpha, dt);
}

void ct_cuda_gemm_install(ct_backend *be) {
    be->blas.gemm = cu_gemm;
    be->blas.gemm_batched = cu_gemm_batched;
    be->blas.linear_forward = cu_linear_forward;
}
