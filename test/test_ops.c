/* test_ops.c: every op of the backend table as rows of one table, checked by one runner.
 *
 * A row names an op and declares its arguments: for each one whether it is an input (random data
 * in a stated range, never zero), a written output (poisoned with NaN, or 0x5A bytes for integers,
 * before the call, so an element the op forgets to write shows up) or an accumulated output (read
 * and written: starts from random values); and how it is stored: in the row's dtype (activations
 * and the parameters ops read), in fp32 (parameter gradients, statistics), or as int32 / uint8 /
 * fp64. A row lists its shape cases (a few integer parameters each; sizes that are no multiple of
 * a vector width and sizes above the CPU's parallel grain), optional variants (activation kinds,
 * flags), the dtypes it runs in, tolerances, and optionally an fp64 reference.
 *
 * The runner, for every row, dtype, shape case and variant, fills the arguments from a fixed seed
 * (CT_TEST_SEED=N picks another), uploads them, runs the op and compares:
 *   CT_TEST_DEVICE unset or "cpu": the CPU backend
 *     - on 1 and on 2 threads: every output bit for bit equal;
 *     - in f16/bf16: bit for bit equal to the fp32 op run on the widened inputs with each 16-bit
 *       output rounded once (what backend.h defines and core/cpu/cpu_dtype.c promises), except
 *       the cases the CPU computes on a path of its own (bf16 x bf16 GEMMs where the CPU
 *       multiplies bf16 natively, core/cpu/cpu_onednn_bf16.c: setup sets `own_path`), which
 *       the fp64 reference alone checks;
 *     - against the row's fp64 reference in the dtypes the row gives reference tolerances for:
 *       |got - want| <= atol + rtol |want| (+ the row's bound for the element, `ref_bound`:
 *       the GEMMs' error bound from k) per element.
 *   CT_TEST_DEVICE=capped: the CPU's capped device (CTRAIN_CAPPED_DEVICE, or 1 GiB) against the
 *     CPU backend: every output bit for bit equal (the same kernels, behind its copies);
 *   CT_TEST_DEVICE=cuda[:N]: that backend against the CPU backend on the same inputs and dtype:
 *     every element of every output within |got - cpu| <= rtol (|cpu| + rms), rtol by the
 *     output's storage (fp32 2e-5: sums in another order; fp16 3e-3, bf16 2.4e-2: about three
 *     ulps, a rounding more or less than the CPU's and the fp32 differences under it) and rms the
 *     root mean square of the CPU's array, the atol of elements where a sum cancelled; an
 *     optimizer's state is compared by its change in the call (DELTA), not by its values, which
 *     the change hardly moves. Or relative per element, or bit for bit, as the argument says.
 *     Without a usable device (or in a build without CUDA) it prints "no CUDA device: skipped"
 *     and exits 77.
 * A failure names the op, dtype, shape case, variant, argument and its worst element.
 *
 * Adding a row for a new op:
 *   1. Shape cases: a static int64_t table, one row of parameters per case (`params` names them).
 *   2. setup(k): the element count of each argument from k->s (0: the op gets NULL); it may adjust
 *      an argument for the case (kind, storage, range, tolerance) or return false to skip it.
 *   3. run(be, k, p): the call, with p[i] the i-th argument in backend memory and k->dt /
 *      k->adt[i] the dtypes of this run (ops that return host values write them into an F64
 *      output with be->mem.copy_h2d).
 *   4. Optionally ref(k, v): the op in double on v[i] (inputs and the outputs' starting values
 *      as stored), overwriting the outputs; init(k, v) for inputs that must be consistent
 *      (labels, saved statistics, argmax positions); ref_bound(k, v, bound) for an error bound
 *      per output element added to the tolerance (a sum's rounding bound from its terms).
 *   5. The row in ROWS[] with its arguments, dtypes and tolerances: reference tolerances per dtype
 *      in .ref_tol (an argument may give its own .ref), device rtols default to 2e-5 (fp32
 *      storage), 3e-3 (fp16) and 2.4e-2 (bf16) and may be given per row or argument (.dev); .cmp
 *      says how a device output is compared (CLOSE to the CPU's, its DELTA from the start value,
 *      EACH element relative to itself, EXACT values, BITS).
 * The CPU's 1 vs 2 threads and widened-fp32 checks need nothing from the row; NO_WIDEN turns the
 * latter off for rows whose dtype is not the storage of their arguments (round_to, optimizers).
 * Checks that are not one call compared with a reference stay in test_cpu_ops.c and
 * test_cuda_ops.c. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/backend/backend.h"
#include "core/cpu/cpu.h"
#include "core/cpu/cpu_internal.h"
#include "core/util/rng.h"
#include "test/conv_ref.h"
#include "test/cuda_pair.h"

/* ---- the table's vocabulary ---- */

typedef enum { IN, OUT, ACC } arg_kind;                  /* input, written output, accumulated output */
typedef enum { DT, F32, F64, I32, U8, OTHER16 } arg_store; /* OTHER16: the 16-bit dtype that is not dt */
/* How a device output is compared with the CPU's: each element within rtol (|cpu| + rms(cpu))
 * (CLOSE); the same for the change from the start value, plus two ulps of the stored result
 * (DELTA: optimizer state, whose update is small next to its value); each element relative to
 * itself (EACH: scalars); the same values (EXACT: any NaN matches any NaN) or the same bits
 * (BITS). */
typedef enum { CLOSE = 0, DELTA, EACH, EXACT, BITS } arg_cmp;

typedef struct {
    double rtol, atol;
    bool set;
} tol;
#define TOL(r, a) {(r), (a), true}

#define MAX_ARGS 8
#define NS 14 /* shape parameters per case */

typedef struct {
    const char *name;
    arg_kind kind;
    arg_store store;
    float lo, hi;    /* inputs and accumulated outputs: uniform in [lo, hi) (integers for I32, U8) */
    arg_cmp cmp;
    tol ref;         /* against the fp64 reference; unset: the row's for the dtype */
    double dev[3];   /* device vs CPU per dtype (f32, f16, bf16); 0: the row's or the default */
    /* CLOSE outputs whose elements are sums of terms that may cancel to (near) 0, e.g. dy times a
     * derivative that crosses 0: 1 + the index of the input whose rms bounds the terms' size. The
     * device may then also be off by rtol times that rms in every element, the rounding of terms
     * that no longer shows in the result's own size (0 or tiny: rms(cpu) of a 1-element array is
     * the element). 0: none. */
    int terms;
    int64_t n;       /* elements in this case (setup); 0: NULL */
} op_arg;

enum { D_F32 = 1, D_F16 = 2, D_BF16 = 4, D_16 = D_F16 | D_BF16, D_ALL = 7 };
enum { NO_WIDEN = 1, SPECIALS = 2, KEEP = 4 };
/* SPECIALS: on the CPU in 16 bits, every 29th element of the dt arguments is one of fp16's
 * overflowing values, its maximum, tiny and subnormal values or a signed zero.
 * KEEP: elements of accumulated outputs that the reference leaves as they were must keep their
 * bits (the parts of a strided matrix outside the rows, channels of another group). */

typedef struct op_case op_case;
typedef struct op_row {
    const char *name;
    unsigned dts;
    const int64_t (*shapes)[NS];
    int n_shapes;
    const char *params;  /* names of the shape parameters, for messages */
    const char *vars;    /* names of the variants, space separated (NULL: one) */
    op_arg args[MAX_ARGS];
    bool (*setup)(op_case *k);
    void (*run)(ct_backend *be, const op_case *k, void **p);
    void (*init)(const op_case *k, double **v);
    void (*ref)(const op_case *k, double **v);
    tol ref_tol[3];      /* per dtype; unset: no reference comparison in that dtype */
    /* optional: bound[i][j] >= 0 added to output i's tolerance at element j, from the inputs v */
    void (*ref_bound)(const op_case *k, double **v, double **bound);
    double dev[3];
    unsigned flags;
} op_row;

typedef enum { T_F32, T_F16, T_BF16, T_F64, T_I32, T_U8 } elem_t;

struct op_case {
    const op_row *row;
    int shape, var;
    const int64_t *s;           /* this case's shape parameters */
    ct_dtype dt;                /* the op's dtype in this run */
    op_arg a[MAX_ARGS];         /* the row's arguments with this case's counts */
    elem_t t[MAX_ARGS];         /* how each argument is stored in this run */
    ct_dtype adt[MAX_ARGS];     /* the same as a ct_dtype (F32, F16, BF16, I32, U8) */
    int nargs;
    /* CPU: this case runs on a path with its own summation order (native bf16 GEMMs), so the
     * widened fp32 op is not its bits: the fp64 reference alone checks it (set by setup) */
    bool own_path;
};

#define SHAPES(a) .shapes = (a), .n_shapes = CT_ARRAY_LEN(a)

/* ---- the runner's state ---- */

static uint64_t seed = 2024;
static const char *device;     /* CT_TEST_DEVICE when not the CPU */
static ct_backend *be1, *be2;  /* CPU mode: 1 and 2 worker threads */
static ct_backend *cpu, *dev;  /* device mode: the reference and the backend under test */

static const ct_dtype DTYPES[3] = {CT_F32, CT_F16, CT_BF16};
static int dt_index(ct_dtype dt) { return dt == CT_F16 ? 1 : dt == CT_BF16 ? 2 : 0; }

/* ---- elements ---- */

static size_t elem_size(elem_t t) {
    static const size_t sz[] = {4, 2, 2, 8, 4, 1};
    return sz[t];
}
static bool elem_float(elem_t t) { return t <= T_F64; }
static bool elem_16(elem_t t) { return t == T_F16 || t == T_BF16; }

static double get_elem(const void *p, elem_t t, int64_t i) {
    switch (t) {
    case T_F32: return ((const float *)p)[i];
    case T_F16: return ct_f16_to_f32(((const uint16_t *)p)[i]);
    case T_BF16: return ct_bf16_to_f32(((const uint16_t *)p)[i]);
    case T_F64: return ((const double *)p)[i];
    case T_I32: return ((const int32_t *)p)[i];
    case T_U8: return ((const uint8_t *)p)[i];
    }
    return 0;
}

static void set_elem(void *p, elem_t t, int64_t i, double v) {
    switch (t) {
    case T_F32: ((float *)p)[i] = (float)v; break;
    case T_F16: ((uint16_t *)p)[i] = ct_f32_to_f16((float)v); break;
    case T_BF16: ((uint16_t *)p)[i] = ct_f32_to_bf16((float)v); break;
    case T_F64: ((double *)p)[i] = v; break;
    case T_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case T_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

/* v rounded to what t can hold. */
static double representable(double v, elem_t t) {
    unsigned char b[8];
    set_elem(b, t, 0, v);
    return get_elem(b, t, 0);
}

static uint16_t round16(float v, elem_t t) { return t == T_F16 ? ct_f32_to_f16(v) : ct_f32_to_bf16(v); }

static ct_dtype ct_of(elem_t t) {
    static const ct_dtype d[] = {CT_F32, CT_F16, CT_BF16, CT_I64, CT_I32, CT_U8};
    return d[t];
}

static elem_t elem_of(arg_store s, ct_dtype dt) {
    switch (s) {
    case DT: return dt == CT_F16 ? T_F16 : dt == CT_BF16 ? T_BF16 : T_F32;
    case OTHER16: return dt == CT_F16 ? T_BF16 : dt == CT_BF16 ? T_F16 : T_F32;
    case F32: return T_F32;
    case F64: return T_F64;
    case I32: return T_I32;
    case U8: return T_U8;
    }
    return T_F32;
}

static bool is_output(const op_arg *a) { return a->kind != IN; }

/* ---- failures ---- */

typedef struct {
    int failures, runs, own_path;
    char first[1024];
} report;

static void describe(const op_case *k, char *out, size_t cap) {
    int len = snprintf(out, cap, "%s [%s] case %d (", k->row->name, ct_dtype_name(k->dt), k->shape);
    const char *p = k->row->params ? k->row->params : "";
    for (int i = 0; *p && i < NS && len < (int)cap; i++) {
        int w = (int)strcspn(p, " ");
        len += snprintf(out + len, cap - (size_t)len, "%s%.*s=%lld", i ? " " : "", w, p, (long long)k->s[i]);
        p += w;
        while (*p == ' ') p++;
    }
    if (len < (int)cap) len += snprintf(out + len, cap - (size_t)len, ")");
    if (k->row->vars && len < (int)cap) {
        const char *v = k->row->vars;
        for (int i = 0; i < k->var; i++) v += strcspn(v, " "), v += strspn(v, " ");
        snprintf(out + len, cap - (size_t)len, " %.*s", (int)strcspn(v, " "), v);
    }
}

static void failf(report *r, const op_case *k, int arg, const char *fmt, ...) {
    char where[256], what[384];
    describe(k, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL %s: %s: %s\n", where, arg >= 0 ? k->a[arg].name : "", what);
    if (r->failures++ == 0) snprintf(r->first, sizeof r->first, "%s: %s: %s", where, arg >= 0 ? k->a[arg].name : "", what);
}

/* ---- values ---- */

static const float SPECIAL_VALUES[] = {7e4f, -7e4f, 65504.0f, 3e-6f, -1e-7f, 1e-40f, 0.0f, -0.0f};

/* The starting values of every argument as doubles: random inputs and accumulated outputs, the
 * poison of written outputs, then the row's init and (CPU, 16-bit, SPECIALS) the special values;
 * every value already representable in its storage. */
static double **make_values(const op_case *k, int row_index) {
    double **v = calloc(MAX_ARGS, sizeof *v);
    for (int i = 0; i < k->nargs; i++) {
        const op_arg *a = &k->a[i];
        v[i] = malloc((size_t)(a->n > 0 ? a->n : 1) * sizeof(double));
        if (a->kind == OUT) {
            for (int64_t j = 0; j < a->n; j++) v[i][j] = elem_float(k->t[i]) ? NAN : (k->t[i] == T_U8 ? 0x5A : 0x5A5A5A5A);
            continue;
        }
        ct_rng r;
        ct_rng_init(&r, seed, CT_RNG_INIT,
                    ((uint64_t)row_index << 40) ^ ((uint64_t)k->shape << 28) ^ ((uint64_t)k->var << 16) ^
                        ((uint64_t)dt_index(k->dt) << 8) ^ (uint64_t)i);
        for (int64_t j = 0; j < a->n; j++) {
            if (!elem_float(k->t[i])) {
                v[i][j] = a->lo + ct_rng_below(&r, (uint32_t)(a->hi - a->lo));
                continue;
            }
            float x = a->lo + (a->hi - a->lo) * ct_rng_uniform(&r);
            double s = representable(x, k->t[i]);
            v[i][j] = s != 0.0 ? s : representable(0.5 * (a->lo + a->hi) + 0.125, k->t[i]);
        }
    }
    if (k->row->init) k->row->init(k, v);
    bool specials = (k->row->flags & SPECIALS) && !device && k->dt != CT_F32;
    for (int i = 0; i < k->nargs; i++) {
        if (specials && k->a[i].store == DT && k->a[i].kind != OUT)
            for (int64_t j = 3; j < k->a[i].n; j += 29) v[i][j] = SPECIAL_VALUES[(j / 29) % CT_ARRAY_LEN(SPECIAL_VALUES)];
        for (int64_t j = 0; j < k->a[i].n; j++) v[i][j] = representable(v[i][j], k->t[i]);
    }
    return v;
}

static void free_values(double **v, int nargs) {
    for (int i = 0; i < nargs; i++) free(v[i]);
    free(v);
}

/* Host bytes of every argument as stored in run k. */
static void **encode(const op_case *k, double **v) {
    void **h = calloc(MAX_ARGS, sizeof *h);
    for (int i = 0; i < k->nargs; i++) {
        h[i] = malloc((size_t)(k->a[i].n > 0 ? k->a[i].n : 1) * elem_size(k->t[i]));
        if (k->a[i].kind == OUT && !elem_float(k->t[i]))
            memset(h[i], 0x5A, (size_t)k->a[i].n * elem_size(k->t[i]));
        else
            for (int64_t j = 0; j < k->a[i].n; j++) set_elem(h[i], k->t[i], j, v[i][j]);
    }
    return h;
}

static void free_bytes(void **h, int nargs) {
    for (int i = 0; i < nargs; i++) free(h[i]);
    free(h);
}

/* Runs k on be with the arguments' bytes h; returns the bytes of every argument afterwards. */
static void **run_on(ct_backend *be, const op_case *k, void **h) {
    void *p[MAX_ARGS] = {0};
    void **got = calloc(MAX_ARGS, sizeof *got);
    for (int i = 0; i < k->nargs; i++) {
        size_t bytes = (size_t)k->a[i].n * elem_size(k->t[i]);
        got[i] = malloc(bytes ? bytes : 1);
        if (!bytes) continue;
        p[i] = be->mem.alloc(be, bytes, CT_MEM_ACTIVATIONS);
        ck_assert_ptr_nonnull(p[i]);
        be->mem.copy_h2d(be, p[i], h[i], bytes);
    }
    k->row->run(be, k, p);
    for (int i = 0; i < k->nargs; i++) {
        size_t bytes = (size_t)k->a[i].n * elem_size(k->t[i]);
        if (!bytes) continue;
        be->mem.copy_d2h(be, got[i], p[i], bytes);
        be->mem.free(be, p[i]);
    }
    return got;
}

/* ---- comparisons ---- */

/* Argument i of two runs must have the same bytes (nan_any: any NaN matches any NaN). */
static void compare_arg_bits(report *r, const op_case *k, int i, void **a, void **b, const char *what, bool nan_any) {
    size_t es = elem_size(k->t[i]);
    int64_t bad = 0, first = -1;
    for (int64_t j = 0; j < k->a[i].n; j++) {
        if (memcmp((char *)a[i] + j * es, (char *)b[i] + j * es, es) == 0) continue;
        if (nan_any && elem_float(k->t[i]) && isnan(get_elem(a[i], k->t[i], j)) && isnan(get_elem(b[i], k->t[i], j)))
            continue;
        if (first < 0) first = j;
        bad++;
    }
    if (bad)
        failf(r, k, i, "%s: %lld of %lld elements differ, first [%lld]: %.9g vs %.9g", what, (long long)bad,
              (long long)k->a[i].n, (long long)first, get_elem(a[i], k->t[i], first), get_elem(b[i], k->t[i], first));
}

/* The 16-bit run's outputs against the fp32 run on the widened inputs, rounded once. */
static void compare_widened(report *r, const op_case *k, void **got, void **wide) {
    for (int i = 0; i < k->nargs; i++) {
        if (!is_output(&k->a[i])) continue;
        if (!elem_16(k->t[i])) {
            compare_arg_bits(r, k, i, got, wide, "vs the fp32 op", k->a[i].cmp != BITS);
            continue;
        }
        const uint16_t *h = got[i];
        const float *w = wide[i];
        int64_t bad = 0, first = -1;
        for (int64_t j = 0; j < k->a[i].n; j++) {
            if (h[j] == round16(w[j], k->t[i])) continue;
            if (k->a[i].cmp != BITS && isnan(w[j]) && isnan(get_elem(h, k->t[i], j))) continue;
            if (first < 0) first = j;
            bad++;
        }
        if (bad)
            failf(r, k, i, "%lld of %lld elements are not the fp32 op rounded once, first [%lld]: 0x%04x, fp32 op %.9g -> 0x%04x",
                  (long long)bad, (long long)k->a[i].n, (long long)first, h[first], w[first],
                  round16(w[first], k->t[i]));
    }
}

static tol ref_tol_of(const op_case *k, int i) {
    return k->a[i].ref.set ? k->a[i].ref : k->row->ref_tol[dt_index(k->dt)];
}

/* The backend's outputs against the fp64 reference. */
static void compare_ref(report *r, const op_case *k, void **got, double **start, double **want, double **bound) {
    for (int i = 0; i < k->nargs; i++) {
        if (!is_output(&k->a[i])) continue;
        tol t = ref_tol_of(k, i);
        bool exact = !elem_float(k->t[i]);
        bool keep = (k->row->flags & KEEP) && k->a[i].kind == ACC;
        int64_t bad = 0, worst = -1;
        double worst_ratio = 0, worst_allowed = 0;
        for (int64_t j = 0; j < k->a[i].n; j++) {
            double g = get_elem(got[i], k->t[i], j), w = want[i][j], ratio = 0, allowed = 0;
            if (keep && (w == start[i][j]) && g != w) {
                ratio = INFINITY;
            } else if (isnan(w) || isnan(g)) {
                ratio = isnan(w) && isnan(g) ? 0 : INFINITY;
            } else if (isinf(w) || isinf(g) || exact) {
                ratio = g == w ? 0 : INFINITY;
            } else {
                allowed = t.atol + t.rtol * fabs(w) + (bound ? bound[i][j] : 0);
                double err = fabs(g - w);
                ratio = allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0);
            }
            if (ratio > 1) bad++;
            if (worst < 0 || ratio > worst_ratio) worst = j, worst_ratio = ratio, worst_allowed = allowed;
        }
        if (bad)
            failf(r, k, i, "%lld of %lld elements off the fp64 reference, worst [%lld]: got %.9g want %.9g (allowed %.3g: rtol %.1g atol %.1g%s)%s",
                  (long long)bad, (long long)k->a[i].n, (long long)worst, get_elem(got[i], k->t[i], worst),
                  want[i][worst], worst_allowed, t.rtol, t.atol, bound ? " + the bound from the terms" : "",
                  k->own_path ? " on the CPU's native bf16 path" : "");
    }
}

/* The device's rtol for argument i: the argument's, the row's, else by its storage. */
static double dev_tol_of(const op_case *k, int i) {
    int d = dt_index(k->dt);
    if (k->a[i].dev[d] > 0) return k->a[i].dev[d];
    if (k->row->dev[d] > 0) return k->row->dev[d];
    return k->t[i] == T_F16 ? 3e-3 : k->t[i] == T_BF16 ? 2.4e-2 : 2e-5;
}

/* The distance from v to the next representable value of t away from zero. */
static double ulp_of(double v, elem_t t) {
    if (t == T_F64) return fabs(nextafter(v, v < 0 ? -INFINITY : INFINITY) - v);
    float f = (float)fabs(v);
    double up = nextafterf(f, INFINITY) - f;
    if (t == T_F16) return fmax(up * 8192.0, ldexp(1.0, -24)); /* 10 bits instead of 23 */
    if (t == T_BF16) return up * 65536.0;                       /* 7 bits */
    return up;
}

/* Root mean square of the finite values among v[0, n). */
static double rms_of(const double *v, int64_t n) {
    double sq = 0;
    int64_t finite = 0;
    for (int64_t j = 0; j < n; j++)
        if (isfinite(v[j])) sq += v[j] * v[j], finite++;
    return finite ? sqrt(sq / (double)finite) : 0;
}

/* The device's outputs g against the CPU backend's c, started from the values v: each element
 * |got - cpu| <= rtol (|cpu| + rms(cpu)) (DELTA: of got - start and cpu - start, plus two ulps of
 * the stored cpu value), or relative to itself (EACH), or the same values or bits. */
static void compare_device(report *r, const op_case *k, void **g, void **c, double **v) {
    for (int i = 0; i < k->nargs; i++) {
        const op_arg *a = &k->a[i];
        if (!is_output(a)) continue;
        elem_t t = k->t[i];
        if (a->cmp == EXACT || a->cmp == BITS || !elem_float(t)) {
            compare_arg_bits(r, k, i, g, c, "device vs CPU", a->cmp == EXACT);
            continue;
        }
        bool delta = a->cmp == DELTA && a->kind == ACC;
        double rtol = dev_tol_of(k, i), sq = 0, worst_ratio = -1;
        int64_t worst = -1, nonfinite = -1, bad = 0, finite = 0;
        for (int64_t j = 0; j < a->n; j++) {
            double y = get_elem(c[i], t, j) - (delta ? v[i][j] : 0);
            if (isfinite(y)) sq += y * y, finite++;
        }
        double rms = finite ? sqrt(sq / (double)finite) : 0;
        if (a->terms) rms += rms_of(v[a->terms - 1], k->a[a->terms - 1].n);
        for (int64_t j = 0; j < a->n; j++) {
            double x = get_elem(g[i], t, j), y = get_elem(c[i], t, j);
            if (!isfinite(x) || !isfinite(y)) {
                bool same = (isnan(x) && isnan(y)) || x == y;
                if (!same && nonfinite < 0) nonfinite = j;
                continue;
            }
            double allowed, d = fabs(x - y);
            if (a->cmp == EACH) {
                allowed = rtol * fabs(y);
            } else if (delta) {
                allowed = rtol * (fabs(y - v[i][j]) + rms) + 2 * ulp_of(y, t);
            } else {
                allowed = rtol * (fabs(y) + rms);
            }
            double ratio = allowed > 0 ? d / allowed : (d > 0 ? INFINITY : 0);
            if (ratio > 1) bad++;
            if (ratio > worst_ratio) worst_ratio = ratio, worst = j;
        }
        if (nonfinite >= 0) {
            failf(r, k, i, "element %lld is %g on the device, %g on the CPU (unwritten?)", (long long)nonfinite,
                  get_elem(g[i], t, nonfinite), get_elem(c[i], t, nonfinite));
            continue;
        }
        if (bad)
            failf(r, k, i, "%lld of %lld elements off the CPU's (%s, rtol %.1g%s), worst [%lld]: device %.9g, CPU %.9g%s",
                  (long long)bad, (long long)a->n, a->cmp == EACH ? "relative" : delta ? "their change" : "elementwise",
                  rtol, a->cmp == EACH ? "" : delta ? ", atol rtol x rms of the changes + 2 ulps" : ", atol rtol x rms",
                  (long long)worst, get_elem(g[i], t, worst), get_elem(c[i], t, worst),
                  delta ? " (compared as changes from the start value)" : "");
    }
}

/* ---- one row ---- */

static int count_words(const char *s) {
    int n = 0;
    while (s && *s) {
        s += strspn(s, " ");
        if (!*s) break;
        n++;
        s += strcspn(s, " ");
    }
    return n;
}

/* The fp32 run on widened copies: 16-bit arguments stored as fp32, dt = F32. */
static void widen_case(const op_case *k, void **h, op_case *kw, void ***hw) {
    *kw = *k;
    kw->dt = CT_F32;
    *hw = calloc(MAX_ARGS, sizeof **hw);
    for (int i = 0; i < k->nargs; i++) {
        size_t n = (size_t)(k->a[i].n > 0 ? k->a[i].n : 1);
        if (!elem_16(k->t[i])) {
            (*hw)[i] = malloc(n * elem_size(k->t[i]));
            memcpy((*hw)[i], h[i], (size_t)k->a[i].n * elem_size(k->t[i]));
            continue;
        }
        kw->t[i] = T_F32, kw->adt[i] = CT_F32;
        float *w = malloc(n * sizeof(float));
        for (int64_t j = 0; j < k->a[i].n; j++) w[j] = (float)get_elem(h[i], k->t[i], j);
        (*hw)[i] = w;
    }
}

static void check_case(report *r, op_case *k, int row_index) {
    const op_row *row = k->row;
    double **v = make_values(k, row_index);
    void **h = encode(k, v);
    r->runs++;
    if (device && strcmp(device, "capped") == 0) {   /* the CPU's kernels behind copies: the same bits */
        void **g = run_on(dev, k, h), **c = run_on(cpu, k, h);
        for (int i = 0; i < k->nargs; i++)
            if (is_output(&k->a[i])) compare_arg_bits(r, k, i, g, c, "capped device vs CPU", false);
        free_bytes(g, k->nargs), free_bytes(c, k->nargs);
    } else if (device) {
        void **g = run_on(dev, k, h), **c = run_on(cpu, k, h);
        compare_device(r, k, g, c, v);
        free_bytes(g, k->nargs), free_bytes(c, k->nargs);
    } else {
        void **g2 = run_on(be2, k, h), **g1 = run_on(be1, k, h);
        for (int i = 0; i < k->nargs; i++)
            if (is_output(&k->a[i])) compare_arg_bits(r, k, i, g1, g2, "1 vs 2 threads", false);
        free_bytes(g1, k->nargs);
        if (k->own_path) r->own_path++;
        if (k->dt != CT_F32 && !(row->flags & NO_WIDEN) && !k->own_path) {
            op_case kw;
            void **hw;
            widen_case(k, h, &kw, &hw);
            void **w = run_on(be2, &kw, hw);
            compare_widened(r, k, g2, w);
            free_bytes(w, k->nargs), free_bytes(hw, k->nargs);
        }
        if (row->ref && row->ref_tol[dt_index(k->dt)].set) {
            double **want = calloc(MAX_ARGS, sizeof *want);
            for (int i = 0; i < k->nargs; i++) {
                size_t bytes = (size_t)(k->a[i].n > 0 ? k->a[i].n : 1) * sizeof(double);
                want[i] = malloc(bytes);
                memcpy(want[i], v[i], (size_t)k->a[i].n * sizeof(double));
            }
            row->ref(k, want);
            double **bound = NULL;
            if (row->ref_bound) {
                bound = calloc(MAX_ARGS, sizeof *bound);
                for (int i = 0; i < k->nargs; i++) bound[i] = calloc((size_t)(k->a[i].n > 0 ? k->a[i].n : 1), sizeof(double));
                row->ref_bound(k, v, bound);
            }
            compare_ref(r, k, g2, v, want, bound);
            free_values(want, k->nargs);
            if (bound) free_values(bound, k->nargs);
        }
        free_bytes(g2, k->nargs);
    }
    free_bytes(h, k->nargs);
    free_values(v, k->nargs);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void check_row(const op_row *row, int row_index) {
    report r = {0};
    double t0 = now();
    int nargs = 0;
    while (nargs < MAX_ARGS && row->args[nargs].name) nargs++;
    int nvars = row->vars ? count_words(row->vars) : 1;
    for (int d = 0; d < 3; d++) {
        if (!(row->dts & (1u << d))) continue;
        for (int s = 0; s < row->n_shapes; s++)
            for (int var = 0; var < nvars; var++) {
                op_case k = {.row = row, .shape = s, .var = var, .s = row->shapes[s], .dt = DTYPES[d], .nargs = nargs};
                memcpy(k.a, row->args, sizeof k.a);
                if (!row->setup(&k)) continue;
                for (int i = 0; i < nargs; i++) {
                    k.t[i] = elem_of(k.a[i].store, k.dt);
                    k.adt[i] = ct_of(k.t[i]);
                }
                check_case(&r, &k, row_index);
            }
    }
    printf("%-20s %4d runs, %d failed (%.1f s)", row->name, r.runs, r.failures, now() - t0);
    if (r.own_path) printf(" (%d on the CPU's native bf16 path: the fp64 reference, not the widened op)", r.own_path);
    printf("\n");
    ck_assert_msg(r.failures == 0, "%d comparison(s) failed; first: %s", r.failures, r.first);
    ck_assert_int_gt(r.runs, 0);
}

/* ---- helpers of the rows ---- */

#define S(i) (k->s[i])
#define N(i) (k->a[i].n)

static void set_n(op_case *k, int64_t n) {
    for (int i = 0; i < k->nargs; i++) k->a[i].n = n;
}
/* Every argument has n = the first shape parameter. */
static bool n_setup(op_case *k) {
    set_n(k, S(0));
    return true;
}

/* ======================================================================================== */
/* ---- rows: element-wise ---- */

/* n, and the magnitude of the inputs of scale and add (the last case: values that overflow f16
 * when scaled or added) */
static const int64_t VEC_SIZES[][NS] = {{1, 3}, {7, 3}, {33, 3}, {1000, 3}, {100003, 3}, {3001, 50000}};

static bool vec_setup(op_case *k) {
    set_n(k, S(0));
    for (int i = 0; i < k->nargs; i++)
        if (k->a[i].kind != OUT) k->a[i].lo = (float)-S(1), k->a[i].hi = (float)S(1);
    return true;
}

static const float FILL_V[] = {1.5f, 0.375f, 7e4f};
static void fill_run(ct_backend *be, const op_case *k, void **p) { be->elt.fill(be, p[0], FILL_V[k->var], N(0), k->dt); }
static void fill_ref(const op_case *k, double **v) {
    for (int64_t j = 0; j < N(0); j++) v[0][j] = FILL_V[k->var];
}

static const float SCALE_S[] = {3.0f, 1.5f, 1.7f};
static void scale_run(ct_backend *be, const op_case *k, void **p) { be->elt.scale(be, p[0], SCALE_S[k->var], N(0), k->dt); }
static void scale_ref(const op_case *k, double **v) {
    for (int64_t j = 0; j < N(0); j++) v[0][j] *= SCALE_S[k->var];
}

static const float AXPY_A[] = {-0.25f, -0.7f, -0.3f};
static void axpy_run(ct_backend *be, const op_case *k, void **p) { be->elt.axpy(be, p[0], AXPY_A[k->var], p[1], N(0), k->dt); }
static void axpy_ref(const op_case *k, double **v) {
    for (int64_t j = 0; j < N(0); j++) v[0][j] += (double)AXPY_A[k->var] * v[1][j];
}

static void add_run(ct_backend *be, const op_case *k, void **p) { be->elt.add(be, p[0], p[1], p[2], N(0), k->dt); }
static void add_ref(const op_case *k, double **v) {
    for (int64_t j = 0; j < N(0); j++) v[0][j] = v[1][j] + v[2][j];
}

/* copy_rows: y [rows, ldy] (the op writes columns col0 .. col0 + cols), x [rows, ldx] */
static const int64_t COPY_ROWS_SHAPES[][NS] = {
    {37, 11, 13, 29, 5}, {37, 19, 23, 50, 7}, {37, 22, 24, 27, 0}, {1000, 40, 41, 100, 30}, {1, 1, 1, 1, 0}};
static bool copy_rows_setup(op_case *k) {
    N(0) = S(0) * S(3);
    N(1) = S(0) * S(2);
    return true;
}
static void copy_rows_run(ct_backend *be, const op_case *k, void **p) {
    char *y = (char *)p[0] + S(4) * ct_dtype_size(k->adt[0]);
    be->elt.copy_rows(be, y, S(3), p[1], S(2), S(0), S(1), k->var == 1, k->dt);
}
static void copy_rows_ref(const op_case *k, double **v) {
    for (int64_t r = 0; r < S(0); r++)
        for (int64_t j = 0; j < S(1); j++) {
            double *y = &v[0][r * S(3) + S(4) + j], x = v[1][r * S(2) + j];
            *y = k->var == 1 ? (double)((float)*y + (float)x) : x; /* one fp32 addition */
        }
}

/* cast: variants name the direction; OTHER16 is the 16-bit dtype that is not dt */
static const int64_t CAST_SIZES[][NS] = {{1}, {7}, {1000}, {70001}, {100003}};
static bool cast_setup(op_case *k) {
    set_n(k, S(0));
    static const arg_store y_of[] = {DT, F32, DT, DT}, x_of[] = {F32, DT, DT, OTHER16};
    k->a[0].store = y_of[k->var];
    k->a[1].store = x_of[k->var];
    return true;
}
static void cast_init(const op_case *k, double **v) {
    const double special[] = {NAN, 1e-6, -3e-8, INFINITY, 65520.0, -65520.0, 0x1.8p-24, 1.0 + 0x1p-11};
    for (int i = 0; i < CT_ARRAY_LEN(special) && i < N(1); i++) v[1][i] = special[i];
}
static void cast_run(ct_backend *be, const op_case *k, void **p) { be->elt.cast(be, p[0], k->adt[0], p[1], k->adt[1], N(0)); }
static void cast_ref(const op_case *k, double **v) { memcpy(v[0], v[1], (size_t)N(0) * sizeof(double)); }

/* round_to: x fp32 rounded in place to dt's values (F32: nothing) */
static void round_to_init(const op_case *k, double **v) {
    const double special[] = {1e-6, -3e-8, INFINITY, 65520.0, 1.0 + 0x1p-11, 0x1.8p-24};
    for (int i = 0; i < CT_ARRAY_LEN(special) && i + 1 < N(0); i++) v[0][i + 1] = special[i];
    for (int64_t j = 7; j < N(0); j += 3) v[0][j] = (double)((float)v[0][j] * 1e-9f); /* fp16 subnormals */
}
static void round_to_run(ct_backend *be, const op_case *k, void **p) { be->elt.round_to(be, p[0], N(0), k->dt); }
static void round_to_ref(const op_case *k, double **v) {
    for (int64_t j = 0; j < N(0); j++) {
        float x = (float)v[0][j];
        v[0][j] = k->dt == CT_F16 ? ct_f16_to_f32(ct_f32_to_f16(x)) : k->dt == CT_BF16 ? ct_bf16_to_f32(ct_f32_to_bf16(x)) : x;
    }
}

/* normalize_u8: y [n, c, h, w] from uint8 x; flip per sample (variant "no_flip": NULL) */
static const int64_t NORMALIZE_SHAPES[][NS] = {{3, 3, 5, 7, 0}, {5, 3, 17, 23, 1}, {2, 1, 9, 130, 0}};
static ct_u8_normalize normalize_of(const op_case *k) {
    static const float mean[2][3] = {{0.5f, 0.25f, 0.1f}, {0.485f, 0.456f, 0.406f}};
    static const float std[2][3] = {{0.3f, 0.2f, 0.7f}, {0.229f, 0.224f, 0.225f}};
    ct_u8_normalize p = {.n = S(0), .c = S(1), .h = S(2), .w = S(3)};
    for (int c = 0; c < 3; c++) p.mean[c] = mean[S(4)][c], p.std[c] = std[S(4)][c];
    return p;
}
static bool normalize_setup(op_case *k) {
    N(0) = N(1) = S(0) * S(1) * S(2) * S(3);
    N(2) = k->var == 0 ? S(0) : 0;
    return true;
}
static void normalize_run(ct_backend *be, const op_case *k, void **p) {
    ct_u8_normalize q = normalize_of(k);
    be->elt.normalize_u8(be, p[0], p[1], p[2], &q, k->dt);
}
static void normalize_ref(const op_case *k, double **v) {
    ct_u8_normalize q = normalize_of(k);
    for (int64_t i = 0; i < q.n; i++)
        for (int64_t c = 0; c < q.c; c++)
            for (int64_t y = 0; y < q.h; y++)
                for (int64_t x = 0; x < q.w; x++) {
                    bool mirror = N(2) && v[2][i] != 0;
                    int64_t src = ((i * q.c + c) * q.h + y) * q.w + (mirror ? q.w - 1 - x : x);
                    float u = (float)v[1][src];
                    v[0][((i * q.c + c) * q.h + y) * q.w + x] = ((u / 255.0f - q.mean[c]) / q.std[c]); /* in fp32 */
                }
}

/* ---- activations ---- */

static double act_ref(double x, ct_act act, double alpha) {
    switch (act) {
    case CT_ACT_NONE: return x;
    case CT_ACT_RELU: return x <= 0 ? 0 : x; /* NaN stays NaN, as in PyTorch */
    case CT_ACT_LEAKY_RELU: return x > 0 ? x : alpha * x;
    case CT_ACT_GELU: return 0.5 * x * (1 + erf(x / sqrt(2.0)));
    case CT_ACT_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case CT_ACT_SILU: return x / (1 + exp(-x));
    case CT_ACT_TANH: return tanh(x);
    case CT_ACT_SIGMOID: return 1 / (1 + exp(-x));
    }
    return 0;
}
#define ACTS "none relu leaky_relu gelu gelu_tanh silu tanh sigmoid"
#define ALPHA 0.1f

/* A NaN in every 101st element from the 6th (n >= 7): every activation must give NaN for it
 * (relu too: mapping NaN to 0 would hide a 16-bit forward that overflowed). */
static void put_nans(double *x, int64_t n) {
    for (int64_t j = 5; j < n; j += 101) x[j] = NAN;
}

/* bias_act_forward / bias_backward: x [rows, cols, inner] */
static const int64_t BIAS_SHAPES[][NS] = {{1, 1, 1},   {7, 33, 1},  {33, 7, 1},    {5, 3, 49},  {2, 64, 196},
                                          {300, 10, 1}, {33, 130, 1}, {7, 16, 49}, {1000, 10, 1}, {3, 5, 1025},
                                          {37, 24, 1},  {3, 24, 5}};
static const ct_act BIAS_ACT[] = {CT_ACT_GELU, CT_ACT_LEAKY_RELU, CT_ACT_RELU};
static bool bias_act_setup(op_case *k) {
    N(0) = S(0) * S(1) * S(2);
    N(1) = k->var == 2 ? 0 : S(1);
    return true;
}
static void bias_act_init(const op_case *k, double **v) { put_nans(v[0], N(0)); }
static void bias_act_run(ct_backend *be, const op_case *k, void **p) {
    be->elt.bias_act_forward(be, p[0], p[1], S(0), S(1), S(2), BIAS_ACT[k->var], ALPHA, k->dt);
}
static void bias_act_ref(const op_case *k, double **v) {
    for (int64_t j = 0; j < N(0); j++)
        v[0][j] = act_ref(v[0][j] + (N(1) ? v[1][(j / S(2)) % S(1)] : 0), BIAS_ACT[k->var], ALPHA);
}
static bool bias_backward_setup(op_case *k) {
    N(0) = S(1);
    N(1) = S(0) * S(1) * S(2);
    return true;
}
static void bias_backward_run(ct_backend *be, const op_case *k, void **p) {
    be->elt.bias_backward(be, p[0], p[1], S(0), S(1), S(2), k->dt);
}
static void bias_backward_ref(const op_case *k, double **v) {
    for (int64_t j = 0; j < N(1); j++) v[0][(j / S(2)) % S(1)] += v[1][j];
}

/* act_forward / act_backward: n elements; variants are the activations */
static const int64_t ACT_SIZES[][NS] = {{1}, {7}, {33}, {1000}, {3001}, {50021}, {100003}};
/* x away from relu's kink, so that a central difference means something */
static void away_from_kink(double *x, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        if (fabs(x[j]) < 1e-3) x[j] = 0.5;
}
static void act_forward_init(const op_case *k, double **v) {
    away_from_kink(v[1], N(1));
    put_nans(v[1], N(1));
}
/* ... and y = act(x), as the forward pass stored it */
static void act_backward_init(const op_case *k, double **v) {
    away_from_kink(v[2], N(2));
    for (int64_t j = 0; j < N(3); j++) v[3][j] = representable(act_ref(v[2][j], (ct_act)k->var, ALPHA), k->t[3]);
}
static void act_forward_run(ct_backend *be, const op_case *k, void **p) {
    be->elt.act_forward(be, p[0], p[1], N(0), (ct_act)k->var, ALPHA, k->dt);
}
static void act_forward_ref(const op_case *k, double **v) {
    for (int64_t j = 0; j < N(0); j++) v[0][j] = act_ref(v[1][j], (ct_act)k->var, ALPHA);
}
static void act_backward_run(ct_backend *be, const op_case *k, void **p) {
    be->elt.act_backward(be, p[0], p[1], p[2], p[3], N(0), (ct_act)k->var, ALPHA, k->dt);
}
static void act_backward_ref(const op_case *k, double **v) {
    const double h = 1e-5;
    ct_act act = (ct_act)k->var;
    for (int64_t j = 0; j < N(0); j++)
        v[0][j] = v[1][j] * (act_ref(v[2][j] + h, act, ALPHA) - act_ref(v[2][j] - h, act, ALPHA)) / (2 * h);
}

/* ---- dropout ---- */

static const int64_t DROPOUT_SIZES[][NS] = {{1}, {5}, {7}, {33}, {1000}, {3001}, {4099}, {100003}};
static const float DROPOUT_P[] = {0.3f, 0.0f, 1.0f};
#define DROPOUT_SEED 7
static float keep_scale(float p) { return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p); }
static void dropout_forward_run(ct_backend *be, const op_case *k, void **p) {
    be->elt.dropout_forward(be, p[0], p[1], p[2], N(0), DROPOUT_P[k->var], DROPOUT_SEED, 11 + (uint64_t)k->shape, k->dt);
}
static void dropout_forward_ref(const op_case *k, double **v) {
    float p = DROPOUT_P[k->var];
    for (int64_t j = 0; j < N(0); j++) {
        bool keep = (double)ct_rng_at(DROPOUT_SEED, CT_RNG_DROPOUT, 11 + (uint64_t)k->shape, (uint64_t)j) >=
                    (double)p * 4294967296.0;
        v[1][j] = keep;
        v[0][j] = keep ? (float)v[2][j] * keep_scale(p) : 0.0f; /* one fp32 product */
    }
}
static void dropout_backward_run(ct_backend *be, const op_case *k, void **p) {
    be->elt.dropout_backward(be, p[0], p[1], p[2], N(0), DROPOUT_P[k->var], k->dt);
}
static void dropout_backward_ref(const op_case *k, double **v) {
    float s = keep_scale(DROPOUT_P[k->var]);
    for (int64_t j = 0; j < N(0); j++) v[0][j] = (float)v[1][j] * ((float)v[2][j] * s);
}

/* ---- embedding: n_ids, vocab, dim, skewed ids (repeats, one id < 0, one >= vocab) ---- */

static const int64_t EMBED_SHAPES[][NS] = {{1000, 50, 33, 0}, {4099, 1000, 67, 1}, {37, 50, 24, 0}, {1, 1, 1, 0}};
static bool embed_forward_setup(op_case *k) {
    N(0) = S(0) * S(2);
    N(1) = S(0);
    N(2) = (S(1) + 10) * S(2); /* the forward's table has rows past vocab: ids there read them */
    k->a[1].hi = (float)S(1);
    return true;
}
static bool embed_backward_setup(op_case *k) {
    N(0) = S(1) * S(2);
    N(1) = S(0) * S(2);
    N(2) = S(0);
    k->a[2].hi = (float)S(1);
    return true;
}
static void embed_ids_init(const op_case *k, int ids, double **v) {
    if (!S(3)) return;
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_INIT, 991);
    for (int64_t i = 0; i < S(0); i += 5) v[ids][i] = ct_rng_below(&r, 8);
    v[ids][3] = -1;
    v[ids][10] = (double)S(1) + 5; /* the backward skips it */
}
static void embed_forward_init(const op_case *k, double **v) { embed_ids_init(k, 1, v); }
static void embed_backward_init(const op_case *k, double **v) { embed_ids_init(k, 2, v); }
static void embed_forward_run(ct_backend *be, const op_case *k, void **p) {
    be->embed.embedding_forward(be, p[0], p[1], p[2], S(0), S(2), k->dt);
}
static void embed_forward_ref(const op_case *k, double **v) {
    for (int64_t i = 0; i < S(0); i++)
        for (int64_t j = 0; j < S(2); j++) {
            int64_t id = (int64_t)v[1][i];
            v[0][i * S(2) + j] = id < 0 ? 0.0 : v[2][id * S(2) + j];
        }
}
static void embed_backward_run(ct_backend *be, const op_case *k, void **p) {
    be->embed.embedding_backward(be, p[0], p[1], p[2], S(0), S(1), S(2), k->dt);
}
static void embed_backward_ref(const op_case *k, double **v) {
    for (int64_t i = 0; i < S(0); i++) {
        int64_t id = (int64_t)v[2][i];
        if (id < 0 || id >= S(1)) continue;
        for (int64_t j = 0; j < S(2); j++) v[0][id * S(2) + j] += v[1][i * S(2) + j];
    }
}

/* ---- convolution: n c h w oc kh kw stride_h stride_w pad_h pad_w dil_h dil_w groups ---- */

#define CONV_PARAMS "n c h w oc kh kw sh sw ph pw dh dw groups"
static const int64_t CONV_SHAPES[][NS] = {
    /* whole-batch convolutions: 19 images end dw's blocks of 8 in a partial block */
    {19, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},
    {19, 4, 9, 8, 6, 3, 2, 2, 1, 2, 1, 2, 1, 2},
    {5, 3, 12, 12, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1},
    {5, 4, 13, 11, 6, 3, 3, 2, 2, 1, 1, 1, 1, 2},
    {5, 6, 9, 10, 9, 3, 3, 2, 2, 2, 2, 2, 2, 3},
    {3, 4, 9, 8, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1},
    /* single images: strides, dilation, groups, and the "same" unit-stride shapes of im2col's
     * shifted-copy path (dilated, uneven padding, a kernel larger than the image) */
    {1, 3, 7, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},
    {1, 4, 11, 8, 6, 3, 2, 2, 3, 2, 1, 2, 1, 2},
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1},
    {1, 6, 28, 28, 6, 5, 5, 1, 2, 2, 2, 1, 1, 3},
    {1, 2, 6, 5, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1},
    {1, 3, 4, 7, 2, 2, 3, 1, 1, 0, 1, 1, 1, 1},
    {1, 1, 3, 3, 1, 7, 7, 1, 1, 3, 3, 1, 1, 1},
    {1, 3, 28, 28, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1},
    {1, 4, 13, 11, 8, 3, 3, 2, 2, 1, 1, 1, 1, 2},
    {1, 6, 15, 17, 9, 3, 3, 2, 2, 2, 2, 2, 2, 3},
};

static ct_conv2d_geom conv_of(const op_case *k) {
    ct_conv2d_geom g = {.n = S(0), .c = S(1), .h = S(2), .w = S(3), .oc = S(4), .kh = S(5), .kw = S(6),
                        .stride_h = S(7), .stride_w = S(8), .pad_h = S(9), .pad_w = S(10), .dil_h = S(11),
                        .dil_w = S(12), .groups = S(13)};
    g.oh = (g.h + 2 * g.pad_h - g.dil_h * (g.kh - 1) - 1) / g.stride_h + 1;
    g.ow = (g.w + 2 * g.pad_w - g.dil_w * (g.kw - 1) - 1) / g.stride_w + 1;
    return g;
}
static int64_t conv_kg(const ct_conv2d_geom *g) { return g->c / g->groups * g->kh * g->kw; }
/* Input row iy (or column) of output position o and kernel tap t, or -1 outside the image. */

/* im2col / col2im of one image, one group per variant */
#define GROUPS "group0 group1 group2"
static bool im2col_setup(op_case *k) {
    ct_conv2d_geom g = conv_of(k);
    if (S(0) != 1 || k->var >= g.groups) return false;
    N(0) = conv_kg(&g) * g.oh * g.ow;
    N(1) = g.c * g.h * g.w;
    return true;
}
static bool col2im_setup(op_case *k) {
    ct_conv2d_geom g = conv_of(k);
    if (S(0) != 1 || k->var >= g.groups) return false;
    N(0) = g.c * g.h * g.w;
    N(1) = conv_kg(&g) * g.oh * g.ow;
    return true;
}
/* f(col index, image index) for every col element inside the image (one group). */
static void im2col_pairs(const op_case *k, void (*f)(double **v, int64_t col, int64_t img, bool to_col), double **v,
                         bool to_col) {
    ct_conv2d_geom g = conv_of(k);
    int64_t cg = g.c / g.groups, p = g.oh * g.ow;
    for (int64_t ci = 0; ci < cg; ci++)
        for (int64_t ky = 0; ky < g.kh; ky++)
            for (int64_t kx = 0; kx < g.kw; kx++)
                for (int64_t oy = 0; oy < g.oh; oy++)
                    for (int64_t ox = 0; ox < g.ow; ox++) {
                        int64_t col = ((ci * g.kh + ky) * g.kw + kx) * p + oy * g.ow + ox;
                        int64_t iy = conv_at(oy, ky, g.stride_h, g.pad_h, g.dil_h, g.h);
                        int64_t ix = conv_at(ox, kx, g.stride_w, g.pad_w, g.dil_w, g.w);
                        int64_t img = iy < 0 || ix < 0 ? -1 : ((k->var * cg + ci) * g.h + iy) * g.w + ix;
                        f(v, col, img, to_col);
                    }
}
static void gather_one(double **v, int64_t col, int64_t img, bool to_col) {
    if (to_col) v[0][col] = img < 0 ? 0.0 : v[1][img];
    else if (img >= 0) v[0][img] += v[1][col];
}
static void im2col_run(ct_backend *be, const op_case *k, void **p) {
    ct_conv2d_geom g = conv_of(k);
    be->conv.im2col(be, p[0], p[1], &g, k->var, k->dt);
}
static void im2col_ref(const op_case *k, double **v) { im2col_pairs(k, gather_one, v, true); }
static void col2im_run(ct_backend *be, const op_case *k, void **p) {
    ct_conv2d_geom g = conv_of(k);
    be->conv.col2im(be, p[0], p[1], &g, k->var, k->dt);
}
static void col2im_ref(const op_case *k, double **v) { im2col_pairs(k, gather_one, v, false); }

/* conv2d_forward: y, x, w, bias (variant "no_bias": NULL) */
static bool conv_forward_setup(op_case *k) {
    ct_conv2d_geom g = conv_of(k);
    N(0) = g.n * g.oc * g.oh * g.ow;
    N(1) = g.n * g.c * g.h * g.w;
    N(2) = g.oc * conv_kg(&g);
    N(3) = k->var == 0 ? g.oc : 0;
    return true;
}
static void conv_forward_run(ct_backend *be, const op_case *k, void **p) {
    ct_conv2d_geom g = conv_of(k);
    be->conv.conv2d_forward(be, p[0], p[1], p[2], p[3], &g, k->dt);
}
static void conv_forward_ref(const op_case *k, double **v) {
    ct_conv2d_geom g = conv_of(k);
    conv_direct(&g, v[1], v[2], N(3) ? v[3] : NULL, v[0], NULL, NULL, NULL, NULL);
}
/* conv2d_backward: dx, dw, db, dy, x, w (variant "dw_only": dx and db NULL) */
static bool conv_backward_setup(op_case *k) {
    ct_conv2d_geom g = conv_of(k);
    bool all = k->var == 0;
    N(0) = all ? g.n * g.c * g.h * g.w : 0;
    N(1) = g.oc * conv_kg(&g);
    N(2) = all ? g.oc : 0;
    N(3) = g.n * g.oc * g.oh * g.ow;
    N(4) = g.n * g.c * g.h * g.w;
    N(5) = g.oc * conv_kg(&g);
    return true;
}
static void conv_backward_run(ct_backend *be, const op_case *k, void **p) {
    ct_conv2d_geom g = conv_of(k);
    be->conv.conv2d_backward(be, p[0], p[1], p[2], p[3], p[4], p[5], &g, k->dt);
}
static void conv_backward_ref(const op_case *k, double **v) {
    ct_conv2d_geom g = conv_of(k);
    conv_direct(&g, v[4], v[5], NULL, NULL, v[3], N(0) ? v[0] : NULL, v[1], N(2) ? v[2] : NULL);
}

/* ---- pooling: n c h w kh kw stride_h stride_w pad_h pad_w ---- */

#define POOL_PARAMS "n c h w kh kw sh sw ph pw"
static const int64_t POOL_SHAPES[][NS] = {
    {2, 3, 8, 8, 2, 2, 2, 2, 0, 0},  {1, 5, 7, 9, 3, 3, 2, 1, 1, 1},   {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
    {3, 2, 7, 9, 2, 2, 2, 2, 0, 0},  {2, 3, 9, 9, 3, 3, 3, 3, 0, 0},   {3, 2, 5, 5, 5, 5, 1, 1, 0, 0},
    {4, 3, 28, 28, 2, 2, 2, 2, 0, 0}, {2, 5, 13, 11, 3, 3, 2, 2, 1, 1}, {3, 2, 9, 10, 3, 3, 1, 1, 1, 1},
    {2, 3, 9, 8, 3, 2, 2, 2, 1, 0},  {8, 16, 30, 30, 3, 3, 2, 2, 1, 1},
};
static ct_pool2d_geom pool_of(const op_case *k, bool include_pad) {
    ct_pool2d_geom g = {.n = S(0), .c = S(1), .h = S(2), .w = S(3), .kh = S(4), .kw = S(5), .stride_h = S(6),
                        .stride_w = S(7), .pad_h = S(8), .pad_w = S(9), .count_include_pad = include_pad};
    g.oh = (g.h + 2 * g.pad_h - g.kh) / g.stride_h + 1;
    g.ow = (g.w + 2 * g.pad_w - g.kw) / g.stride_w + 1;
    return g;
}
/* Window of output (oy, ox) clipped to the image: rows [*y0, *y1), columns [*x0, *x1). */
static void pool_window(const ct_pool2d_geom *g, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1, int64_t *x0,
                        int64_t *x1) {
    int64_t a = oy * g->stride_h - g->pad_h, b = ox * g->stride_w - g->pad_w;
    *y0 = a < 0 ? 0 : a, *y1 = a + g->kh > g->h ? g->h : a + g->kh;
    *x0 = b < 0 ? 0 : b, *x1 = b + g->kw > g->w ? g->w : b + g->kw;
}

/* maxpool2d_forward: y, argmax, x. Inputs quantised (many ties: the first maximum in window
 * order must win); variant "nan": a NaN at the last element of output 0's window, which wins. */
static bool maxpool_forward_setup(op_case *k) {
    ct_pool2d_geom g = pool_of(k, false);
    if (k->var == 1 && (g.pad_h || g.pad_w)) return false;
    N(0) = N(1) = g.n * g.c * g.oh * g.ow;
    N(2) = g.n * g.c * g.h * g.w;
    return true;
}
static void maxpool_forward_init(const op_case *k, double **v) {
    ct_pool2d_geom g = pool_of(k, false);
    for (int64_t j = 0; j < N(2); j++) v[2][j] = round(v[2][j] * 2.0);
    if (k->var == 1) v[2][(g.kh - 1) * g.w + (g.kw - 1)] = NAN;
}
static void maxpool_forward_run(ct_backend *be, const op_case *k, void **p) {
    ct_pool2d_geom g = pool_of(k, false);
    be->conv.maxpool2d_forward(be, p[0], p[1], p[2], &g, k->dt);
}
static void maxpool_forward_ref(const op_case *k, double **v) {
    ct_pool2d_geom g = pool_of(k, false);
    for (int64_t pl = 0; pl < g.n * g.c; pl++)
        for (int64_t oy = 0; oy < g.oh; oy++)
            for (int64_t ox = 0; ox < g.ow; ox++) {
                int64_t y0, y1, x0, x1, best_i = -1;
                double best = -INFINITY;
                pool_window(&g, oy, ox, &y0, &y1, &x0, &x1);
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++) {
                        double x = v[2][(pl * g.h + iy) * g.w + ix];
                        if (best_i < 0 || x > best || isnan(x)) best = x, best_i = iy * g.w + ix;
                    }
                int64_t o = (pl * g.oh + oy) * g.ow + ox;
                v[0][o] = best;
                v[1][o] = (double)best_i;
            }
}
/* maxpool2d_backward: dx, dy, argmax (a random position inside each output's window) */
static bool maxpool_backward_setup(op_case *k) {
    ct_pool2d_geom g = pool_of(k, false);
    N(0) = g.n * g.c * g.h * g.w;
    N(1) = N(2) = g.n * g.c * g.oh * g.ow;
    return true;
}
static void maxpool_backward_init(const op_case *k, double **v) {
    ct_pool2d_geom g = pool_of(k, false);
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_INIT, 992);
    for (int64_t o = 0; o < N(2); o++) {
        int64_t y0, y1, x0, x1, at = o % (g.oh * g.ow);
        pool_window(&g, at / g.ow, at % g.ow, &y0, &y1, &x0, &x1);
        int64_t iy = y0 + ct_rng_below(&r, (uint32_t)(y1 - y0)), ix = x0 + ct_rng_below(&r, (uint32_t)(x1 - x0));
        v[2][o] = (double)(iy * g.w + ix);
    }
}
static void maxpool_backward_run(ct_backend *be, const op_case *k, void **p) {
    ct_pool2d_geom g = pool_of(k, false);
    be->conv.maxpool2d_backward(be, p[0], p[1], p[2], &g, k->dt);
}
static void maxpool_backward_ref(const op_case *k, double **v) {
    ct_pool2d_geom g = pool_of(k, false);
    memset(v[0], 0, (size_t)N(0) * sizeof(double));
    for (int64_t o = 0; o < N(1); o++) {
        int64_t plane = o / (g.oh * g.ow);
        v[0][plane * g.h * g.w + (int64_t)v[2][o]] += v[1][o];
    }
}

/* avgpool2d: y, x / dx, dy; variants: count_include_pad false and true */
static bool avgpool_forward_setup(op_case *k) {
    ct_pool2d_geom g = pool_of(k, k->var);
    N(0) = g.n * g.c * g.oh * g.ow;
    N(1) = g.n * g.c * g.h * g.w;
    return true;
}
static bool avgpool_backward_setup(op_case *k) {
    ct_pool2d_geom g = pool_of(k, k->var);
    N(0) = g.n * g.c * g.h * g.w;
    N(1) = g.n * g.c * g.oh * g.ow;
    return true;
}
/* Average pooling in double: forward y = mean of the window; backward dx += dy / divisor over it. */
static void avgpool_direct(const op_case *k, double **v, bool forward) {
    ct_pool2d_geom g = pool_of(k, k->var);
    if (!forward) memset(v[0], 0, (size_t)N(0) * sizeof(double));
    for (int64_t pl = 0; pl < g.n * g.c; pl++)
        for (int64_t oy = 0; oy < g.oh; oy++)
            for (int64_t ox = 0; ox < g.ow; ox++) {
                int64_t y0, y1, x0, x1, o = (pl * g.oh + oy) * g.ow + ox;
                pool_window(&g, oy, ox, &y0, &y1, &x0, &x1);
                double div = g.count_include_pad ? (double)(g.kh * g.kw) : (double)((y1 - y0) * (x1 - x0)), s = 0;
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++) {
                        int64_t i = (pl * g.h + iy) * g.w + ix;
                        if (forward) s += v[1][i];
                        else v[0][i] += v[1][o] / div;
                    }
                if (forward) v[0][o] = s / div;
            }
}
static void avgpool_forward_run(ct_backend *be, const op_case *k, void **p) {
    ct_pool2d_geom g = pool_of(k, k->var);
    be->conv.avgpool2d_forward(be, p[0], p[1], &g, k->dt);
}
static void avgpool_forward_ref(const op_case *k, double **v) { avgpool_direct(k, v, true); }
static void avgpool_backward_run(ct_backend *be, const op_case *k, void **p) {
    ct_pool2d_geom g = pool_of(k, k->var);
    be->conv.avgpool2d_backward(be, p[0], p[1], &g, k->dt);
}
static void avgpool_backward_ref(const op_case *k, double **v) { avgpool_direct(k, v, false); }

/* ---- batch norm: n c hw ---- */

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f
static const int64_t BN_SHAPES[][NS] = {{4, 3, 25},  {1, 7, 33}, {16, 33, 1}, {2, 1, 1000},
                                        {8, 16, 49}, {64, 10, 1}, {2, 3, 4099}, {3, 4, 17}};
/* forward: y, x, gamma, beta, running_mean, running_var, save_mean, save_invstd; variants train
 * (running stats updated, saved stats written) and eval (running stats read, nothing saved) */
static bool bn_forward_setup(op_case *k) {
    int64_t tot = S(0) * S(1) * S(2);
    bool train = k->var == 0;
    N(0) = N(1) = tot;
    N(2) = N(3) = N(4) = N(5) = S(1);
    N(6) = N(7) = train ? S(1) : 0;
    k->a[4].kind = k->a[5].kind = train ? ACC : IN;
    return true;
}
static void bn_forward_run(ct_backend *be, const op_case *k, void **p) {
    be->norm.batchnorm_forward(be, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], S(0), S(1), S(2), BN_EPS,
                               BN_MOMENTUM, k->var == 0, k->dt);
}
/* Mean and biased variance of channel ch of x [n, c, hw]. */
static void bn_stats(const op_case *k, const double *x, int64_t ch, double *mean, double *var) {
    int64_t m = S(0) * S(2);
    double s = 0, q = 0;
    for (int64_t i = 0; i < S(0); i++)
        for (int64_t j = 0; j < S(2); j++) s += x[(i * S(1) + ch) * S(2) + j];
    *mean = s / (double)m;
    for (int64_t i = 0; i < S(0); i++)
        for (int64_t j = 0; j < S(2); j++) q += pow(x[(i * S(1) + ch) * S(2) + j] - *mean, 2);
    *var = q / (double)m;
}
static void bn_forward_ref(const op_case *k, double **v) {
    int64_t m = S(0) * S(2);
    double mom = BN_MOMENTUM, keep = 1.0f - BN_MOMENTUM;
    for (int64_t ch = 0; ch < S(1); ch++) {
        double mean, var, invstd;
        if (k->var == 0) {
            bn_stats(k, v[1], ch, &mean, &var);
            invstd = 1 / sqrt(var + BN_EPS);
            v[6][ch] = mean, v[7][ch] = invstd;
            v[4][ch] = keep * v[4][ch] + mom * mean;
            v[5][ch] = keep * v[5][ch] + mom * (m > 1 ? var * m / (m - 1) : var);
        } else {
            mean = v[4][ch], invstd = 1 / sqrt(v[5][ch] + BN_EPS);
        }
        for (int64_t i = 0; i < S(0); i++)
            for (int64_t j = 0; j < S(2); j++) {
                int64_t at = (i * S(1) + ch) * S(2) + j;
                v[0][at] = (v[1][at] - mean) * invstd * v[2][ch] + v[3][ch];
            }
    }
}
/* backward: dx, dgamma, dbeta, dy, x, gamma, save_mean, save_invstd (the batch's, from x) */
static bool bn_backward_setup(op_case *k) {
    int64_t tot = S(0) * S(1) * S(2);
    N(0) = N(3) = N(4) = tot;
    N(1) = N(2) = N(5) = N(6) = N(7) = S(1);
    return true;
}
static void bn_backward_init(const op_case *k, double **v) {
    for (int64_t ch = 0; ch < S(1); ch++) {
        double mean, var;
        bn_stats(k, v[4], ch, &mean, &var);
        v[6][ch] = mean, v[7][ch] = 1 / sqrt(var + BN_EPS);
    }
}
static void bn_backward_run(ct_backend *be, const op_case *k, void **p) {
    be->norm.batchnorm_backward(be, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], S(0), S(1), S(2), k->dt);
}
static void bn_backward_ref(const op_case *k, double **v) {
    int64_t m = S(0) * S(2);
    for (int64_t ch = 0; ch < S(1); ch++) {
        double mean = v[6][ch], is = v[7][ch], sdy = 0, sdyx = 0;
        for (int64_t i = 0; i < S(0); i++)
            for (int64_t j = 0; j < S(2); j++) {
                int64_t at = (i * S(1) + ch) * S(2) + j;
                sdy += v[3][at];
                sdyx += v[3][at] * (v[4][at] - mean) * is;
            }
        v[1][ch] += sdyx;
        v[2][ch] += sdy;
        for (int64_t i = 0; i < S(0); i++)
            for (int64_t j = 0; j < S(2); j++) {
                int64_t at = (i * S(1) + ch) * S(2) + j;
                double xh = (v[4][at] - mean) * is;
                v[0][at] = v[5][ch] * is * (v[3][at] - sdy / m - xh * sdyx / m);
            }
    }
}

/* ---- layer norm: rows d ---- */

#define LN_EPS 1e-5f
static const int64_t LN_SHAPES[][NS] = {{1, 1},  {7, 33},    {33, 7}, {3, 1000}, {300, 64},
                                        {64, 768}, {1000, 10}, {3, 5000}, {37, 24}};
static void ln_row_stats(const op_case *k, const double *x, int64_t r, double *mean, double *rstd) {
    double s = 0, q = 0;
    for (int64_t j = 0; j < S(1); j++) s += x[r * S(1) + j];
    *mean = s / (double)S(1);
    for (int64_t j = 0; j < S(1); j++) q += pow(x[r * S(1) + j] - *mean, 2);
    *rstd = 1 / sqrt(q / (double)S(1) + LN_EPS);
}
/* forward: y, mean, rstd, x, gamma, beta */
static bool ln_forward_setup(op_case *k) {
    N(0) = N(3) = S(0) * S(1);
    N(1) = N(2) = S(0);
    N(4) = N(5) = S(1);
    return true;
}
static void ln_forward_run(ct_backend *be, const op_case *k, void **p) {
    be->norm.layernorm_forward(be, p[0], p[1], p[2], p[3], p[4], p[5], S(0), S(1), LN_EPS, k->dt);
}
static void ln_forward_ref(const op_case *k, double **v) {
    for (int64_t r = 0; r < S(0); r++) {
        double mean, rstd;
        ln_row_stats(k, v[3], r, &mean, &rstd);
        v[1][r] = mean, v[2][r] = rstd;
        for (int64_t j = 0; j < S(1); j++) v[0][r * S(1) + j] = (v[3][r * S(1) + j] - mean) * rstd * v[4][j] + v[5][j];
    }
}
/* backward: dx, dgamma, dbeta, dy, x, gamma, mean, rstd (the rows', from x) */
static bool ln_backward_setup(op_case *k) {
    N(0) = N(3) = N(4) = S(0) * S(1);
    N(1) = N(2) = N(5) = S(1);
    N(6) = N(7) = S(0);
    return true;
}
static void ln_backward_init(const op_case *k, double **v) {
    for (int64_t r = 0; r < S(0); r++) ln_row_stats(k, v[4], r, &v[6][r], &v[7][r]);
}
static void ln_backward_run(ct_backend *be, const op_case *k, void **p) {
    be->norm.layernorm_backward(be, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], S(0), S(1), k->dt);
}
static void ln_backward_ref(const op_case *k, double **v) {
    int64_t d = S(1);
    for (int64_t r = 0; r < S(0); r++) {
        double mean = v[6][r], rs = v[7][r], sg = 0, sgx = 0;
        for (int64_t j = 0; j < d; j++) {
            double dy = v[3][r * d + j], xh = (v[4][r * d + j] - mean) * rs;
            sg += dy * v[5][j];
            sgx += dy * v[5][j] * xh;
            v[1][j] += dy * xh;
            v[2][j] += dy;
        }
        for (int64_t j = 0; j < d; j++) {
            double xh = (v[4][r * d + j] - mean) * rs;
            v[0][r * d + j] = rs * (v[3][r * d + j] * v[5][j] - sg / d - xh * sgx / d);
        }
    }
}

/* ---- causal attention: B T H D ---- */

/* T = 1, T and D that are no multiple of a tile or vector width, the largest head dim, and a case
 * big enough (T^2 D above the CPU's grain) to be cut between threads. */
/* D of 32, 64 and 128 take the GPU's tensor-core kernels for fp16/bf16 (tiles of 64 rows: T of
 * 130 and 200 cross tile edges and leave partial tiles); the other D the CUDA-core ones. */
static const int64_t ATTN_SHAPES[][NS] = {{1, 1, 1, 1},   {2, 5, 2, 3},    {1, 33, 3, 8},
                                          {2, 17, 1, 64}, {1, 6, 2, 128},  {3, 70, 2, 16},
                                          {2, 130, 1, 32}, {1, 200, 2, 64}};
static const float ATTN_P[] = {0.0f, 0.25f};
#define ATTN_SEED 77
static uint64_t attn_stream(const op_case *k) { return 5 + (uint64_t)k->shape; }
/* Element d of q (which 0), k (1) or v (2) of head h at token (b, t), and of y/dy. */
static int64_t attn_qkv_at(const op_case *k, int64_t b, int64_t t, int which, int64_t h) {
    return ((b * S(1) + t) * 3 + which) * S(2) * S(3) + h * S(3);
}
static int64_t attn_y_at(const op_case *k, int64_t b, int64_t t, int64_t h) {
    return ((b * S(1) + t) * S(2) + h) * S(3);
}
/* The dropout factor of score (b, h, t, j): dropout_forward's rule on element ((b H + h) T + t) T + j. */
static double attn_keep(const op_case *k, int64_t b, int64_t h, int64_t t, int64_t j) {
    double p = ATTN_P[k->var];
    uint64_t e = (uint64_t)(((b * S(2) + h) * S(1) + t) * S(1) + j);
    return (double)ct_rng_at(ATTN_SEED, CT_RNG_DROPOUT, attn_stream(k), e) >= p * 4294967296.0 ? 1.0 / (1.0 - p) : 0.0;
}
/* P [T, T] (causal softmax of the scaled scores, 0 above the diagonal) and lse [T] of (b, h), from qkv. */
static void attn_probs(const op_case *k, const double *qkv, int64_t b, int64_t h, double *P, double *lse) {
    int64_t T = S(1), D = S(3);
    for (int64_t t = 0; t < T; t++) {
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j <= t; j++) {
            double sc = 0;
            for (int64_t d = 0; d < D; d++) sc += qkv[attn_qkv_at(k, b, t, 0, h) + d] * qkv[attn_qkv_at(k, b, j, 1, h) + d];
            P[t * T + j] = sc / sqrt((double)D);
            m = fmax(m, P[t * T + j]);
        }
        for (int64_t j = 0; j <= t; j++) l += exp(P[t * T + j] - m);
        for (int64_t j = 0; j < T; j++) P[t * T + j] = j <= t ? exp(P[t * T + j] - m) / l : 0.0;
        lse[t] = m + log(l);
    }
}
/* y and lse of the whole batch in double: y[b,t,h] = sum_j P keep v_j. */
static void attn_forward_double(const op_case *k, const double *qkv, double *y, double *lse) {
    int64_t T = S(1), H = S(2), D = S(3);
    double *P = malloc(sizeof(double) * (size_t)(T * T));
    for (int64_t b = 0; b < S(0); b++)
        for (int64_t h = 0; h < H; h++) {
            attn_probs(k, qkv, b, h, P, lse + (b * H + h) * T);
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= t; j++)
                        acc += P[t * T + j] * attn_keep(k, b, h, t, j) * qkv[attn_qkv_at(k, b, j, 2, h) + d];
                    y[attn_y_at(k, b, t, h) + d] = acc;
                }
        }
    free(P);
}
/* forward: y, lse, qkv */
static bool attn_forward_setup(op_case *k) {
    N(0) = S(0) * S(1) * S(2) * S(3);
    N(1) = S(0) * S(2) * S(1);
    N(2) = 3 * N(0);
    return true;
}
static void attn_forward_run(ct_backend *be, const op_case *k, void **p) {
    be->attn.causal_attention_forward(be, p[0], p[1], p[2], S(0), S(1), S(2), S(3), ATTN_P[k->var], ATTN_SEED,
                                      attn_stream(k), k->dt);
}
static void attn_forward_ref(const op_case *k, double **v) { attn_forward_double(k, v[2], v[0], v[1]); }
/* backward: dqkv, dy, qkv, y, lse (y and lse the forward's, from qkv) */
static bool attn_backward_setup(op_case *k) {
    N(1) = N(3) = S(0) * S(1) * S(2) * S(3);
    N(0) = N(2) = 3 * N(1);
    N(4) = S(0) * S(2) * S(1);
    return true;
}
static void attn_backward_init(const op_case *k, double **v) { attn_forward_double(k, v[2], v[3], v[4]); }
static void attn_backward_run(ct_backend *be, const op_case *k, void **p) {
    be->attn.causal_attention_backward(be, p[0], p[1], p[2], p[3], p[4], S(0), S(1), S(2), S(3), ATTN_P[k->var],
                                       ATTN_SEED, attn_stream(k), k->dt);
}
/* The gradient of sum(dy . y) by the plain formula with T x T matrices: dP = keep (dy . v),
 * dS = P (dP - sum_j P dP), dq = scale dS k, dk = scale dS^T q, dv = (P keep)^T dy. */
static void attn_backward_ref(const op_case *k, double **v) {
    int64_t T = S(1), H = S(2), D = S(3);
    const double *qkv = v[2], *dy = v[1];
    double *P = malloc(sizeof(double) * (size_t)(T * T)), *lse = malloc(sizeof(double) * (size_t)T);
    double *dP = malloc(sizeof(double) * (size_t)(T * T)), scale = 1 / sqrt((double)D);
    for (int64_t i = 0; i < N(0); i++) v[0][i] = 0;
    for (int64_t b = 0; b < S(0); b++)
        for (int64_t h = 0; h < H; h++) {
            attn_probs(k, qkv, b, h, P, lse);
            for (int64_t t = 0; t < T; t++) {
                double dsum = 0;
                for (int64_t j = 0; j <= t; j++) {
                    double dv = 0;
                    for (int64_t d = 0; d < D; d++) dv += dy[attn_y_at(k, b, t, h) + d] * qkv[attn_qkv_at(k, b, j, 2, h) + d];
                    dP[t * T + j] = attn_keep(k, b, h, t, j) * dv;
                    dsum += P[t * T + j] * dP[t * T + j];
                }
                for (int64_t j = 0; j <= t; j++) {
                    double ds = P[t * T + j] * (dP[t * T + j] - dsum) * scale, pk = P[t * T + j] * attn_keep(k, b, h, t, j);
                    for (int64_t d = 0; d < D; d++) {
                        v[0][attn_qkv_at(k, b, t, 0, h) + d] += ds * qkv[attn_qkv_at(k, b, j, 1, h) + d];
                        v[0][attn_qkv_at(k, b, j, 1, h) + d] += ds * qkv[attn_qkv_at(k, b, t, 0, h) + d];
                        v[0][attn_qkv_at(k, b, j, 2, h) + d] += pk * dy[attn_y_at(k, b, t, h) + d];
                    }
                }
            }
        }
    free(P);
    free(lse);
    free(dP);
}

/* ---- losses ---- */

/* softmax_xent: dlogits, result, logits, labels. rows classes grad_scale logit_range
 * logit_offset pad: logits uniform in offset +- range, rows of classes + pad elements (the pad
 * columns are a padded vocabulary: set far above every real logit, so a kernel that reads them
 * into the softmax or the argmax fails, and their gradient must be 0); variants: label smoothing 0
 * and 0.1, the loss alone (dlogits NULL), and the gradient written over the logits in place. Rows
 * 1 and 2 are ignored (labels `classes` and -100), every third row's label logit is offset +
 * max(20, range) so some predictions are right. The offsets of +-1000 make exp(x) overflow (or
 * every exp(x) underflow) in fp32 and fp64 alike: only a softmax that subtracts the row's maximum
 * passes them. */
static const int64_t XENT_SHAPES[][NS] = {{1, 1, 2, 4},    {7, 10, 2, 4},   {33, 7, 2, 4}, {5, 1000, 2, 4},
                                          {300, 3, 2, 4}, {256, 10, 64, 8}, {33, 1000, 64, 8}, {4, 50257, 64, 8},
                                          {37, 24, 3, 6}, {5000, 5, 1, 4},
                                          {33, 10, 2, 4, 1000}, {33, 10, 2, 4, -1000}, {7, 1000, 64, 3, 1000},
                                          {300, 3, 2, 1000, 0}, {5000, 5, 1, 2, -1000},
                                          {7, 10, 2, 4, 0, 6}, {33, 1000, 64, 8, 0, 24}, {4, 50257, 64, 8, 0, 47},
                                          {37, 3, 2, 4, 1000, 1}};
enum { XENT_EPS0, XENT_EPS, XENT_LOSS_ONLY, XENT_IN_PLACE };
static float xent_smoothing(const op_case *k) { return k->var == XENT_EPS || k->var == XENT_LOSS_ONLY ? 0.1f : 0.0f; }
static int64_t xent_ld(const op_case *k) { return S(1) + S(5); }
static bool xent_setup(op_case *k) {
    N(0) = k->var == XENT_LOSS_ONLY ? 0 : S(0) * xent_ld(k);
    N(1) = 2;
    N(4) = 1;
    N(2) = S(0) * xent_ld(k);
    N(3) = S(0);
    k->a[2].lo = (float)(S(4) - S(3)), k->a[2].hi = (float)(S(4) + S(3));
    k->a[3].hi = (float)S(1);
    return true;
}
static void xent_init(const op_case *k, double **v) {
    int64_t rows = S(0), C = S(1), ld = xent_ld(k);
    double top = (double)S(4) + (S(3) > 20 ? S(3) : 20);
    if (rows > 3) v[3][1] = (double)C, v[3][2] = -100;
    for (int64_t r = 0; r < rows; r += 3)
        if (v[3][r] >= 0 && v[3][r] < C) v[2][r * ld + (int64_t)v[3][r]] = top;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = C; j < ld; j++) v[2][r * ld + j] = top + 30 + (double)(j - C);
}
/* result[1] (the count) is copied into an output of its own, so that it is compared exactly */
static void copy_count(ct_backend *be, void **p, int to) { be->mem.copy_d2d(be, p[to], (float *)p[1] + 1, sizeof(float)); }
static void xent_run(ct_backend *be, const op_case *k, void **p) {
    const void *logits = p[2];
    if (k->var == XENT_IN_PLACE) {   /* the logits become their gradient */
        be->mem.copy_d2d(be, p[0], p[2], (size_t)N(2) * ct_dtype_size(k->dt));
        logits = p[0];
    }
    be->loss.softmax_xent(be, p[0], p[1], logits, p[3], S(0), S(1), xent_ld(k), xent_smoothing(k), (float)S(2),
                          k->dt);
    copy_count(be, p, 4);
}
static void xent_ref(const op_case *k, double **v) {
    int64_t rows = S(0), C = S(1), ld = xent_ld(k), valid = 0, correct = 0;
    double eps = xent_smoothing(k), total = 0;
    for (int64_t r = 0; r < rows; r++) valid += v[3][r] >= 0 && v[3][r] < C;
    for (int64_t j = 0; j < N(0); j++) v[0][j] = 0;   /* ignored rows and padding columns */
    for (int64_t r = 0; r < rows; r++) {
        const double *x = v[2] + r * ld;
        int64_t label = (int64_t)v[3][r];
        if (label < 0 || label >= C) continue;
        int64_t arg = 0;
        for (int64_t j = 1; j < C; j++)
            if (x[j] > x[arg]) arg = j;
        double se = 0, sx = 0;
        for (int64_t j = 0; j < C; j++) se += exp(x[j] - x[arg]), sx += x[j];
        double lse = x[arg] + log(se);
        total += (1 - eps) * (lse - x[label]) + eps * (lse - sx / C);
        correct += arg == label;
        for (int64_t j = 0; N(0) && j < C; j++)
            v[0][r * ld + j] = S(2) / (double)valid * (exp(x[j] - lse) - eps / C - (j == label ? 1 - eps : 0));
    }
    v[1][0] = valid ? total / valid : 0;
    v[1][1] = v[4][0] = (double)correct;
}

/* mse_loss / bce_logits_loss: grad, result, prediction, target. rows cols grad_scale(x1000)
 * range; variants: with gradient, loss alone; mse also "target = prediction" (loss exactly 0). */
static const int64_t MSE_SHAPES[][NS] = {{1, 1, 500, 30},    {7, 1, 500, 30},      {1, 33, 500, 30},
                                         {1, 1000, 500, 30}, {1, 100003, 500, 30}, {129, 37, 8000, 3},
                                         {37, 24, 500, 6}};
static const int64_t BCE_SHAPES[][NS] = {{1, 1, 1000, 30},    {7, 1, 1000, 30},      {1, 33, 1000, 30},
                                         {1, 1000, 1000, 30}, {1, 100003, 1000, 30}, {129, 37, 8000, 3},
                                         {37, 24, 1000, 6},
                                         /* |x| up to 1000: exp(|x|) overflows in fp32 and fp64 */
                                         {129, 37, 1000, 1000}, {1, 5000, 1000, 300}};
static float loss_scale(const op_case *k) { return (float)S(2) / 1000.0f; }
static bool elt_loss_setup(op_case *k) {
    int64_t n = S(0) * S(1);
    N(0) = k->var == 1 ? 0 : n;
    N(1) = 2;
    N(4) = 1;
    N(2) = N(3) = n;
    k->a[2].lo = (float)-S(3), k->a[2].hi = (float)S(3);
    return true;
}
static void mse_init(const op_case *k, double **v) {
    if (k->var == 2) memcpy(v[3], v[2], (size_t)N(2) * sizeof(double));
}
static void mse_run(ct_backend *be, const op_case *k, void **p) {
    be->loss.mse_loss(be, p[0], p[1], p[2], p[3], S(0), S(1), loss_scale(k), k->dt);
    copy_count(be, p, 4);
}
static void mse_ref(const op_case *k, double **v) {
    int64_t n = N(2);
    double s = 0;
    for (int64_t j = 0; j < n; j++) {
        double d = v[2][j] - v[3][j];
        s += d * d;
        if (N(0)) v[0][j] = loss_scale(k) * 2 * d / n;
    }
    v[1][0] = s / n, v[1][1] = v[4][0] = 0;
}
static void bce_init(const op_case *k, double **v) {
    v[2][0] = 100.0; /* large |x| must not overflow */
    if (N(2) > 1) v[2][1] = -100.0;
}
static void bce_run(ct_backend *be, const op_case *k, void **p) {
    be->loss.bce_logits_loss(be, p[0], p[1], p[2], p[3], S(0), S(1), loss_scale(k), k->dt);
    copy_count(be, p, 4);
}
static void bce_ref(const op_case *k, double **v) {
    int64_t n = N(2);
    double s = 0;
    for (int64_t j = 0; j < n; j++) {
        double x = v[2][j], t = v[3][j];
        s += (x > 0 ? x : 0) - x * t + log1p(exp(-fabs(x)));
        if (N(0)) v[0][j] = loss_scale(k) * (1 / (1 + exp(-x)) - t) / n;
    }
    v[1][0] = s / n, v[1][1] = v[4][0] = 0;
}

/* ---- reductions: results to the host, written into an fp64 output here ---- */

static const int64_t REDUCE_SIZES[][NS] = {{1}, {7}, {33}, {1000}, {100003}, {3000017}, {20000000}};
static bool reduce_setup(op_case *k) {
    /* 20M elements are for a GPU's multi-block reduction; on the CPU 3000017 already spans 733
     * chunks of the fixed-order sum */
    if (S(0) > 10000000 && !device) return false;
    N(0) = S(0);
    N(1) = 1;
    return true;
}
static void sum_squares_run(ct_backend *be, const op_case *k, void **p) {
    double s = be->optim.sum_squares(be, p[0], N(0));
    be->mem.copy_h2d(be, p[1], &s, sizeof s);
}
static void sum_squares_ref(const op_case *k, double **v) {
    long double s = 0;
    for (int64_t j = 0; j < N(0); j++) s += (long double)v[0][j] * v[0][j];
    v[1][0] = (double)s;
}
/* all_finite: variants put a non-finite value at the end or the middle */
static void all_finite_init(const op_case *k, double **v) {
    static const double bad[] = {0, INFINITY, -INFINITY, NAN, INFINITY, NAN};
    if (k->var > 0) v[0][k->var <= 3 ? N(0) - 1 : N(0) / 2] = bad[k->var];
}
static void all_finite_run(ct_backend *be, const op_case *k, void **p) {
    double f = be->optim.all_finite(be, p[0], N(0)) ? 1.0 : 0.0;
    be->mem.copy_h2d(be, p[1], &f, sizeof f);
}
static void all_finite_ref(const op_case *k, double **v) {
    v[1][0] = 1;
    for (int64_t j = 0; j < N(0); j++)
        if (!isfinite(v[0][j])) v[1][0] = 0;
}

/* ---- optimizers: the row's dtype is the dtype of the fused 16-bit copy (f32: no copy) ---- */

static const int64_t OPT_SHAPES[][NS] = {{1000, 1}, {50001, 1}, {65537, 1}, {100003, 1}, {100003, 3}};
static double round_to_dt(double x, ct_dtype dt) {
    float f = (float)x;
    return dt == CT_F16 ? ct_f16_to_f32(ct_f32_to_f16(f)) : dt == CT_BF16 ? ct_bf16_to_f32(ct_f32_to_bf16(f)) : f;
}

/* adam_step: param, grad, m, v, copy. steps; variants: L2 weight decay, decoupled (AdamW), and
 * the fused-copy test's settings */
static const ct_adam_args ADAM_ARGS[] = {
    {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f, .bias_c1 = 1 - 0.9f * 0.9f,
     .bias_c2 = 1 - 0.999f * 0.999f, .grad_scale = 0.5f, .decoupled = false},
    {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.05f, .bias_c1 = 1 - 0.9f * 0.9f,
     .bias_c2 = 1 - 0.999f * 0.999f, .grad_scale = 0.5f, .decoupled = true},
    {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .bias_c1 = 0.1f, .bias_c2 = 0.001f,
     .grad_scale = 0.5f, .decoupled = true},
};
static bool opt_setup(op_case *k) {
    for (int i = 0; i < k->nargs; i++) k->a[i].n = S(0);
    N(k->nargs - 1) = k->dt == CT_F32 ? 0 : S(0); /* the copy */
    return true;
}
static void adam_run(ct_backend *be, const op_case *k, void **p) {
    ct_adam_args a = ADAM_ARGS[k->var];
    a.copy = p[4], a.copy_dt = k->dt;
    for (int64_t step = 0; step < S(1); step++) be->optim.adam_step(be, p[0], p[1], p[2], p[3], S(0), &a);
}
static void adam_ref(const op_case *k, double **v) {
    const ct_adam_args *a = &ADAM_ARGS[k->var];
    double b1 = a->beta1, b2 = a->beta2, wd = a->weight_decay, lr = a->lr, eps = a->eps;
    for (int64_t step = 0; step < S(1); step++)
        for (int64_t j = 0; j < S(0); j++) {
            double g = v[1][j] * a->grad_scale, p = v[0][j];
            if (!a->decoupled) g += wd * p;
            v[2][j] = b1 * v[2][j] + (1 - b1) * g;
            v[3][j] = b2 * v[3][j] + (1 - b2) * g * g;
            double upd = (v[2][j] / a->bias_c1) / (sqrt(v[3][j] / a->bias_c2) + eps);
            if (a->decoupled) upd += wd * p;
            v[0][j] = p - lr * upd;
        }
    for (int64_t j = 0; j < N(4); j++) v[4][j] = round_to_dt(v[0][j], k->dt);
}

/* sgd_step: param, grad, momentum buffer, copy. Variants: {momentum, dampening, weight_decay,
 * nesterov, first_step} with lr 0.1 and grad_scale 2 (the first six) or 0.25 (the next four),
 * and the fused-copy test's settings. */
static const float SGD_CFG[][6] = {
    {0, 0, 0, 0, 1, 2},        {0.9f, 0, 1e-2f, 0, 1, 2},    {0.9f, 0, 1e-2f, 0, 0, 2},   {0.9f, 0.1f, 0, 0, 0, 2},
    {0.9f, 0, 1e-3f, 1, 0, 2}, {0.9f, 0, 1e-3f, 1, 1, 2},    {0, 0.1f, 1e-4f, 0, 0, 0.25f}, {0.9f, 0.1f, 1e-4f, 0, 0, 0.25f},
    {0.9f, 0.1f, 1e-4f, 1, 0, 0.25f}, {0.9f, 0.1f, 1e-4f, 0, 1, 0.25f}, {0.9f, 0, 0, 0, 0, 0.5f}};
static ct_sgd_args sgd_args(const op_case *k) {
    const float *c = SGD_CFG[k->var];
    ct_sgd_args a = {.lr = 0.1f, .momentum = c[0], .dampening = c[1], .weight_decay = c[2], .grad_scale = c[5],
                     .nesterov = c[3] != 0, .first_step = c[4] != 0};
    return a;
}
static void sgd_run(ct_backend *be, const op_case *k, void **p) {
    ct_sgd_args a = sgd_args(k);
    a.copy = p[3], a.copy_dt = k->dt;
    for (int64_t step = 0; step < S(1); step++) be->optim.sgd_step(be, p[0], p[1], p[2], S(0), &a);
}
static void sgd_ref(const op_case *k, double **v) {
    ct_sgd_args a = sgd_args(k);
    for (int64_t step = 0; step < S(1); step++)
        for (int64_t j = 0; j < S(0); j++) {
            double d = v[1][j] * (double)a.grad_scale + a.weight_decay * v[0][j];
            if (a.momentum != 0) {
                v[2][j] = a.first_step ? d : a.momentum * v[2][j] + (1 - (double)a.dampening) * d;
                d = a.nesterov ? d + a.momentum * v[2][j] : v[2][j];
            }
            v[0][j] -= (double)a.lr * d;
        }
    for (int64_t j = 0; j < N(3); j++) v[3][j] = round_to_dt(v[0][j], k->dt);
}

/* lamb_direction: update, param, grad, m, v, ||param||, ||update||. Variants: eps outside / inside
 * the sqrt, with two sets of the other settings. */
static const ct_lamb_args LAMB_ARGS[] = {
    {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .weight_decay = 0.01f, .bias_c1 = 0.19f, .bias_c2 = 0.002f,
     .grad_scale = 0.25f, .eps_inside_sqrt = false},
    {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .weight_decay = 0.01f, .bias_c1 = 0.19f, .bias_c2 = 0.002f,
     .grad_scale = 0.25f, .eps_inside_sqrt = true},
    {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .weight_decay = 0.01f, .bias_c1 = 0.1f, .bias_c2 = 0.001f,
     .grad_scale = 1.0f, .eps_inside_sqrt = false},
    {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .weight_decay = 0.01f, .bias_c1 = 0.1f, .bias_c2 = 0.001f,
     .grad_scale = 1.0f, .eps_inside_sqrt = true},
};
static const int64_t LAMB_SIZES[][NS] = {{33333}, {70001}, {1}};
static bool lamb_setup(op_case *k) {
    set_n(k, S(0));
    N(5) = N(6) = 1;
    return true;
}
static void lamb_run(ct_backend *be, const op_case *k, void **p) {
    double wn, un;
    be->optim.lamb_direction(be, p[0], p[1], p[2], p[3], p[4], S(0), &LAMB_ARGS[k->var], &wn, &un);
    be->mem.copy_h2d(be, p[5], &wn, sizeof wn);
    be->mem.copy_h2d(be, p[6], &un, sizeof un);
}
static void lamb_ref(const op_case *k, double **v) {
    const ct_lamb_args *a = &LAMB_ARGS[k->var];
    double b1 = a->beta1, b2 = a->beta2, eps = a->eps, wd = a->weight_decay;
    long double wsq = 0, usq = 0;
    for (int64_t j = 0; j < S(0); j++) {
        double g = v[2][j] * a->grad_scale;
        v[3][j] = b1 * v[3][j] + (1 - b1) * g;
        v[4][j] = b2 * v[4][j] + (1 - b2) * g * g;
        double vh = v[4][j] / a->bias_c2, den = a->eps_inside_sqrt ? sqrt(vh + eps) : sqrt(vh) + eps;
        v[0][j] = v[3][j] / a->bias_c1 / den + wd * v[1][j];
        wsq += (long double)v[1][j] * v[1][j];
        usq += (long double)v[0][j] * v[0][j];
    }
    v[5][0] = sqrt((double)wsq);
    v[6][0] = sqrt((double)usq);
}

/* ---- GEMM ---- */

/* C [m, ldc] = alpha op(A) op(B) + beta C in double (beta 0: C is not read); A, B row-major with
 * leading dimensions; columns n .. ldc of C are left alone. */
static void gemm_direct(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, double alpha, const double *a, int64_t lda,
                        const double *b, int64_t ldb, double beta, double *c, int64_t ldc) {
    double *bb = malloc((size_t)(kk * n > 0 ? kk * n : 1) * sizeof(double)), *acc = malloc((size_t)n * sizeof(double));
    for (int64_t p = 0; p < kk; p++)
        for (int64_t j = 0; j < n; j++) bb[p * n + j] = tb ? b[j * ldb + p] : b[p * ldb + j];
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) acc[j] = 0;
        for (int64_t p = 0; p < kk; p++) {
            double av = ta ? a[p * lda + i] : a[i * lda + p];
            for (int64_t j = 0; j < n; j++) acc[j] += av * bb[p * n + j];
        }
        for (int64_t j = 0; j < n; j++) {
            double *cij = &c[i * ldc + j];
            if (kk == 0) *cij = beta != 0 ? (double)(float)(beta * *cij) : 0.0; /* one fp32 product */
            else *cij = alpha * acc[j] + (beta != 0 ? beta * *cij : 0);
        }
    }
    free(bb), free(acc);
}

/* gemm (fp32): m n k padded(lda+3, ldb+1, ldc+2) scalars; variants are the transposes.
 * Scalars: 0: alpha 0.7, beta 0.3; 1: alpha 1, beta 0 (C written: poisoned); 2: alpha 1, beta 1. */
static const float GEMM_ALPHA[] = {0.7f, 1.0f, 1.0f}, GEMM_BETA[] = {0.3f, 0.0f, 1.0f};
static const int64_t GEMM_SHAPES[][NS] = {
    {1, 1, 1, 1, 0},     {1, 1, 1, 1, 1},     {7, 33, 5, 1, 0},     {7, 33, 5, 1, 1},    {33, 7, 1000, 1, 0},
    {33, 7, 1000, 1, 1}, {64, 50, 3, 1, 0},   {64, 50, 3, 1, 1},    {37, 53, 29, 1, 0},  {37, 53, 29, 1, 1},
    {128, 64, 256, 1, 0}, {128, 64, 256, 1, 1}, {5, 300, 1000, 1, 0}, {5, 300, 1000, 1, 1}, {9, 11, 0, 1, 0},
    {9, 11, 0, 1, 1},
    /* big enough to be cut into tiles; the padded ones check that a tile offsets A, B and C by
     * their leading dimensions (columns of C for m < n, rows for m >= n) */
    {128, 512, 784, 0, 2}, {784, 512, 128, 0, 2}, {64, 196, 288, 0, 2}, {1000, 33, 300, 0, 2},
    {128, 512, 300, 1, 0}, {784, 512, 128, 1, 2}, {1000, 33, 300, 1, 1}};
#define TRANSPOSES "nn tn nt tt"
typedef struct {
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
} gemm_dims;
static gemm_dims gemm_dims_of(bool ta, bool tb, int64_t m, int64_t n, int64_t kk, bool pad) {
    gemm_dims d = {ta, tb, m, n, kk, (ta ? m : kk) + 3 * pad, (tb ? kk : n) + pad, n + 2 * pad};
    if (d.lda == 0) d.lda = 1;
    return d;
}
static void gemm_sizes(op_case *k, gemm_dims d) {
    N(0) = (d.ta ? d.k : d.m) * d.lda;
    N(1) = (d.tb ? d.n : d.k) * d.ldb;
    N(2) = d.m * d.ldc;
}
static gemm_dims gemm_case_dims(const op_case *k) { return gemm_dims_of(k->var & 1, k->var & 2, S(0), S(1), S(2), S(3)); }
static bool gemm_setup(op_case *k) {
    if (S(2) == 0 && k->var != 0) return false; /* k = 0: not transposed only */
    gemm_sizes(k, gemm_case_dims(k));
    k->a[2].kind = GEMM_BETA[S(4)] == 0 ? OUT : ACC;
    k->a[2].ref = S(2) == 0 ? (tol)TOL(0, 0) : (tol)TOL(1e-4, 1e-4 * sqrt((double)S(2)));
    return true;
}
static void gemm_run(ct_backend *be, const op_case *k, void **p) {
    gemm_dims d = gemm_case_dims(k);
    be->blas.gemm(be, d.ta, d.tb, d.m, d.n, d.k, GEMM_ALPHA[S(4)], p[0], k->adt[0], d.lda, p[1], k->adt[1], d.ldb,
                  GEMM_BETA[S(4)], p[2], k->adt[2], d.ldc);
}
static void gemm_ref(const op_case *k, double **v) {
    gemm_dims d = gemm_case_dims(k);
    gemm_direct(d.ta, d.tb, d.m, d.n, d.k, GEMM_ALPHA[S(4)], v[0], d.lda, v[1], d.ldb, GEMM_BETA[S(4)], v[2], d.ldc);
}

/* gemm with 16-bit operands: ta tb m n k padded scalars a_fp32 b_fp32 c_fp32 range; C in fp32 or
 * dt (rounded once), the mixes cuBLASLt lacks included. Scalars index GEMM16_AB.
 *
 * Two paths compute these on the CPU. The widened one (every fp16 case, and bf16 where the CPU
 * has no bf16 instructions) is the fp32 GEMM on exact fp32 copies: the runner checks it bit for
 * bit against the fp32 op. The native one (bf16 x bf16 where the CPU has AVX512-BF16 or AMX,
 * core/cpu/cpu_onednn_bf16.c, or CTRAIN_CPU_BF16=emulate anywhere) sums the same exact products
 * in its own order with denormals flushed, so its bits are its own (issue 28: on an AMX Xeon 6
 * cases here differed from the widened op in the last bit of 3-70% of the elements): setup marks
 * those cases own_path. Every case, either path, is then held to the fp64 reference of the values
 * as stored (the bf16-rounded operands) within gemm16_bound, a bound from k that holds for any
 * summation order; and 1 vs 2 threads bit for bit, which the native path promises as well (its
 * tiles come from the shape). */
static const float GEMM16_ALPHA[] = {1.0f, 1.0f, 0.5f, 0.7f, 1.0f}, GEMM16_BETA[] = {0.5f, 0.0f, 1.0f, 1.0f, 0.25f};
static const int64_t GEMM16_SHAPES[][NS] = {
    {0, 0, 9, 17, 40, 0, 0, 0, 0, 1, 2},   {0, 0, 9, 17, 40, 0, 0, 0, 0, 0, 2},   {0, 1, 37, 19, 24, 0, 0, 0, 0, 0, 2},
    {1, 0, 24, 24, 37, 0, 3, 0, 0, 1, 2},  {0, 0, 33, 65, 130, 1, 1, 0, 0, 1, 1}, {1, 0, 33, 65, 130, 1, 2, 0, 0, 1, 1},
    {0, 0, 64, 64, 64, 1, 1, 0, 0, 0, 1},  {1, 1, 17, 31, 47, 1, 0, 0, 0, 0, 1},  {0, 1, 20, 30, 40, 1, 1, 0, 1, 1, 1},
    {0, 0, 20, 30, 40, 1, 4, 1, 1, 0, 1},
    /* every transpose with 16-bit A, B and C, all three padded */
    {0, 1, 20, 30, 40, 1, 1, 0, 0, 0, 1},  {1, 0, 24, 19, 37, 1, 0, 0, 0, 0, 2},  {0, 0, 7, 33, 5, 1, 2, 0, 0, 0, 2},
    /* cut into tiles, padded: C in fp32 (a tile offsets C by ldc), or one fp32 operand (by lda or
     * ldb) next to a 16-bit one */
    {0, 0, 784, 512, 128, 1, 1, 0, 0, 1, 1}, {1, 1, 128, 512, 300, 1, 0, 0, 0, 1, 1},
    {0, 1, 512, 256, 200, 1, 1, 1, 0, 1, 1}, {1, 1, 128, 512, 300, 1, 1, 0, 1, 1, 1},
    {1, 0, 300, 128, 512, 1, 0, 0, 0, 0, 1}};
static gemm_dims gemm16_dims(const op_case *k) { return gemm_dims_of(S(0), S(1), S(2), S(3), S(4), S(5)); }
static bool gemm16_setup(op_case *k) {
    gemm_sizes(k, gemm16_dims(k));
    for (int i = 0; i < 3; i++) k->a[i].store = S(7 + i) ? F32 : DT;
    for (int i = 0; i < 2; i++) k->a[i].lo = (float)-S(10), k->a[i].hi = (float)S(10);
    k->a[2].kind = GEMM16_BETA[S(6)] == 0 ? OUT : ACC;
    /* beyond gemm16_bound (the fp32 result's): a 16-bit C rounds that result once more, by at most
     * half its ulp: 2^-8 relative in bf16 (8 significant bits), 2^-11 in fp16 (11), and 2^-25
     * among fp16's subnormals */
    if (k->a[2].store == F32) k->a[2].ref = (tol)TOL(0, 0);
    else k->a[2].ref = k->dt == CT_F16 ? (tol)TOL(0x1p-11, 0x1p-25) : (tol)TOL(0x1p-8, 0);
    k->own_path = !device && k->dt == CT_BF16 && !S(7) && !S(8) && ct_cpu_bf16_native();
    return true;
}
static void gemm16_run(ct_backend *be, const op_case *k, void **p) {
    gemm_dims d = gemm16_dims(k);
    be->blas.gemm(be, d.ta, d.tb, d.m, d.n, d.k, GEMM16_ALPHA[S(6)], p[0], k->adt[0], d.lda, p[1], k->adt[1], d.ldb,
                  GEMM16_BETA[S(6)], p[2], k->adt[2], d.ldc);
}
static void gemm16_ref(const op_case *k, double **v) {
    gemm_dims d = gemm16_dims(k);
    gemm_direct(d.ta, d.tb, d.m, d.n, d.k, GEMM16_ALPHA[S(6)], v[0], d.lda, v[1], d.ldb, GEMM16_BETA[S(6)], v[2],
                d.ldc);
}

/* How far an fp32 GEMM may be from the exact C = alpha op(A) op(B) + beta C0, whatever order it
 * sums in, per element of C:
 *     |c - exact| <= gamma(k + 2) (|alpha| sum_p |a_ip b_pj| + |beta c0_ij|) + 2 (k + 3) FLT_MIN,
 *     gamma(n) = n u / (1 - n u), u = 2^-23.
 * Why this holds for the widened path, oneDNN's fp32 kernels and the native bf16 path alike:
 *   - a product of two 16-bit values is exact in fp32 (bf16: 8 x 8 significant bits, fp16: 11 x
 *     11, both within fp32's 24 and its exponent range); a product with an fp32 operand is kept
 *     whole by an FMA or rounded once;
 *   - however a kernel orders and blocks the sum (FMA chains, OpenBLAS's k blocks with alpha on
 *     each, VDPBF16PS's pairs, AMX tiles, oneDNN's k blocking), it is a tree of k additions over
 *     the k products and beta c0, each addition rounded once: on its way to C a product meets its
 *     own rounding, at most k additions (a tree over k + 1 terms has k) and alpha's scaling, k + 2
 *     roundings in all. A sum of terms each carried through at most m roundings is within
 *     gamma(m) of the sum of their magnitudes (the standard bound for floating-point sums in any
 *     order);
 *   - u = 2^-23 is one ulp, twice what rounding to nearest costs (2^-24), so the bound also holds
 *     for a kernel that truncated its sums. Intel documents round to nearest even for VDPBF16PS
 *     and TDPBF16PS; this project's AVX2 build machine cannot run them, and the factor 2 keeps the
 *     test from depending on that detail while a real defect (a wrong stride, a dropped alpha or
 *     tile, a sum kept in bf16) is larger: at the largest k here (512, range 1) the bound is
 *     ~1e-3 of a typical |C|, one bf16 rounding up to 2^-8 ~ 4e-3;
 *   - the bf16 instructions flush denormal results to zero and read denormal operands as zero:
 *     each flushed result moves the sum by less than FLT_MIN (at most k + 2 of them, each scaled
 *     by alpha <= 1 and at most doubled by the roundings after it), and no operand here is
 *     denormal (uniform draws in [-range, range), never 0).
 * A 16-bit C adds its own rounding (gemm16_setup's tolerance): the bound is then that of the fp32
 * value, which the rounding scales by at most 1 + 2^-8. */
static void gemm16_bound(const op_case *k, double **v, double **bound) {
    gemm_dims d = gemm16_dims(k);
    double *mag[3];
    for (int i = 0; i < 3; i++) {
        mag[i] = malloc((size_t)N(i) * sizeof(double));
        for (int64_t j = 0; j < N(i); j++) mag[i][j] = fabs(v[i][j]);
    }
    /* the terms' magnitudes: the same GEMM on |A|, |B|, |C0| with |alpha|, |beta| */
    gemm_direct(d.ta, d.tb, d.m, d.n, d.k, fabs(GEMM16_ALPHA[S(6)]), mag[0], d.lda, mag[1], d.ldb,
                fabs(GEMM16_BETA[S(6)]), mag[2], d.ldc);
    double u = 0x1p-23, n = (double)d.k + 2, gamma = n * u / (1 - n * u);
    double c16 = k->a[2].store == F32 ? 1 : 1 + 0x1p-8;
    for (int64_t i = 0; i < d.m; i++)
        for (int64_t j = 0; j < d.n; j++)
            bound[2][i * d.ldc + j] = c16 * (gamma * mag[2][i * d.ldc + j] + 2 * (n + 1) * FLT_MIN);
    for (int i = 0; i < 3; i++) free(mag[i]);
}

/* gemm_batched (fp32): ta tb m n k batch padded alpha(x10) beta(x10); items stride past their
 * matrices (sa, sb, sc), so the gaps between them must stay as they were. */
static const int64_t BATCHED_SHAPES[][NS] = {
    {0, 1, 9, 17, 40, 37, 0, 20, 10},  {0, 1, 9, 17, 40, 400, 0, 20, 10}, {0, 0, 19, 23, 31, 5, 1, 9, 4},
    {1, 0, 19, 23, 31, 5, 1, 9, 4},    {0, 1, 19, 23, 31, 5, 1, 9, 4},    {1, 1, 19, 23, 31, 5, 1, 9, 4},
    {0, 0, 256, 256, 64, 2, 0, 10, 0}};
typedef struct {
    gemm_dims d;
    int64_t sa, sb, sc;
} batched_dims;
static batched_dims batched_of(const op_case *k) {
    batched_dims b = {.d = gemm_dims_of(S(0), S(1), S(2), S(3), S(4), false)};
    if (S(6)) b.d.lda += 1, b.d.ldb += 2, b.d.ldc += 3;
    b.sa = (b.d.ta ? b.d.k : b.d.m) * b.d.lda + (S(6) ? 7 : 5);
    b.sb = (b.d.tb ? b.d.n : b.d.k) * b.d.ldb + (S(6) ? 5 : 2);
    b.sc = b.d.m * b.d.ldc + 1;
    return b;
}
static bool batched_setup(op_case *k) {
    batched_dims b = batched_of(k);
    N(0) = b.sa * S(5), N(1) = b.sb * S(5), N(2) = b.sc * S(5);
    return true;
}
static void batched_run(ct_backend *be, const op_case *k, void **p) {
    batched_dims b = batched_of(k);
    be->blas.gemm_batched(be, b.d.ta, b.d.tb, b.d.m, b.d.n, b.d.k, (float)S(7) / 10, p[0], b.d.lda, b.sa, p[1],
                          b.d.ldb, b.sb, (float)S(8) / 10, p[2], b.d.ldc, b.sc, S(5));
}
static void batched_ref(const op_case *k, double **v) {
    batched_dims b = batched_of(k);
    for (int64_t i = 0; i < S(5); i++)
        gemm_direct(b.d.ta, b.d.tb, b.d.m, b.d.n, b.d.k, (float)S(7) / 10, v[0] + i * b.sa, b.d.lda, v[1] + i * b.sb,
                    b.d.ldb, (float)S(8) / 10, v[2] + i * b.sc, b.d.ldc);
}


/* ======================================================================================== */
/* ---- rows: Llama-family blocks (RMSNorm, SwiGLU, rotary positions with grouped-query heads) ---- */

/* rmsnorm: rows d (LN_SHAPES); eps 1e-5 */
#define RMS_EPS 1e-5f
static double rms_rstd(const op_case *k, const double *x, int64_t r) {
    double q = 0;
    for (int64_t j = 0; j < S(1); j++) q += x[r * S(1) + j] * x[r * S(1) + j];
    return 1 / sqrt(q / (double)S(1) + RMS_EPS);
}
/* forward: y, rstd, x, gamma; variants with the weight and without (gamma NULL) */
static bool rms_forward_setup(op_case *k) {
    N(0) = N(2) = S(0) * S(1);
    N(1) = S(0);
    N(3) = k->var == 0 ? S(1) : 0;
    return true;
}
static void rms_forward_run(ct_backend *be, const op_case *k, void **p) {
    be->norm.rmsnorm_forward(be, p[0], p[1], p[2], p[3], S(0), S(1), RMS_EPS, k->dt);
}
static void rms_forward_ref(const op_case *k, double **v) {
    for (int64_t r = 0; r < S(0); r++) {
        double rs = rms_rstd(k, v[2], r);
        v[1][r] = rs;
        for (int64_t j = 0; j < S(1); j++) v[0][r * S(1) + j] = v[2][r * S(1) + j] * rs * (N(3) ? v[3][j] : 1.0);
    }
}
/* backward: dx, dgamma, dy, x, gamma, rstd (the rows', from x); variants: all, the weight's
 * gradient alone (dx NULL), dx alone (dgamma NULL) */
static bool rms_backward_setup(op_case *k) {
    N(0) = k->var == 1 ? 0 : S(0) * S(1);
    N(1) = k->var == 2 ? 0 : S(1);
    N(2) = N(3) = S(0) * S(1);
    N(4) = S(1);
    N(5) = S(0);
    return true;
}
static void rms_backward_init(const op_case *k, double **v) {
    for (int64_t r = 0; r < S(0); r++) v[5][r] = rms_rstd(k, v[3], r);
}
static void rms_backward_run(ct_backend *be, const op_case *k, void **p) {
    be->norm.rmsnorm_backward(be, p[0], p[1], p[2], p[3], p[4], p[5], S(0), S(1), k->dt);
}
static void rms_backward_ref(const op_case *k, double **v) {
    int64_t d = S(1);
    for (int64_t r = 0; r < S(0); r++) {
        double rs = v[5][r], sgx = 0;
        for (int64_t j = 0; j < d; j++) sgx += v[2][r * d + j] * v[4][j] * v[3][r * d + j];
        for (int64_t j = 0; j < d; j++) {
            int64_t at = r * d + j;
            if (N(1)) v[1][j] += v[2][at] * v[3][at] * rs;
            if (N(0)) v[0][at] = rs * (v[2][at] * v[4][j] - v[3][at] * rs * rs * sgx / d);
        }
    }
}

/* swiglu: rows f; x [rows, 2f] = gate | up */
static const int64_t SWIGLU_SHAPES[][NS] = {{1, 1}, {7, 33}, {33, 7}, {3, 1000}, {300, 64}, {37, 24}, {64, 768}};
static double silu_d(double g) { return g / (1 + exp(-g)); }
/* forward: y, x */
static bool swiglu_forward_setup(op_case *k) {
    N(0) = S(0) * S(1);
    N(1) = 2 * S(0) * S(1);
    return true;
}
static void swiglu_forward_run(ct_backend *be, const op_case *k, void **p) {
    be->elt.swiglu_forward(be, p[0], p[1], S(0), S(1), k->dt);
}
static void swiglu_forward_ref(const op_case *k, double **v) {
    for (int64_t r = 0; r < S(0); r++)
        for (int64_t j = 0; j < S(1); j++)
            v[0][r * S(1) + j] = silu_d(v[1][r * 2 * S(1) + j]) * v[1][r * 2 * S(1) + S(1) + j];
}
/* backward: dx, dy, x */
static bool swiglu_backward_setup(op_case *k) {
    N(0) = N(2) = 2 * S(0) * S(1);
    N(1) = S(0) * S(1);
    return true;
}
static void swiglu_backward_run(ct_backend *be, const op_case *k, void **p) {
    be->elt.swiglu_backward(be, p[0], p[1], p[2], S(0), S(1), k->dt);
}
static void swiglu_backward_ref(const op_case *k, double **v) {
    int64_t f = S(1);
    for (int64_t r = 0; r < S(0); r++)
        for (int64_t j = 0; j < f; j++) {
            double g = v[2][r * 2 * f + j], u = v[2][r * 2 * f + f + j], dy = v[1][r * f + j];
            double s = 1 / (1 + exp(-g));
            v[0][r * 2 * f + j] = dy * u * s * (1 + g * (1 - s));
            v[0][r * 2 * f + f + j] = dy * silu_d(g);
        }
}

/* rope_gqa: B T H KV D theta factor_x10 pos0. theta 0: no rotation (the grouped heads alone); the
 * rest 10^4 and 5 * 10^5 (Llama 3's), positions past 4000 (fp32 angles of thousands of radians),
 * linear scaling, one kv head (multi-query), as many as the heads, head dims of 2 to 128. */
static const int64_t ROPE_SHAPES[][NS] = {
    {1, 1, 1, 1, 2, 10000, 10, 0},  {2, 5, 4, 2, 8, 10000, 10, 0},   {1, 33, 3, 1, 16, 10000, 10, 0},
    {2, 17, 4, 4, 64, 10000, 10, 0}, {1, 6, 2, 1, 128, 500000, 10, 3}, {3, 70, 6, 3, 32, 10000, 40, 0},
    {2, 130, 8, 2, 64, 10000, 10, 0}, {1, 3, 2, 1, 64, 10000, 10, 4000}, {2, 5, 4, 1, 10, 0, 10, 0},
    {1, 9, 2, 2, 6, 0, 10, 0},      {1, 40, 2, 1, 128, 10000, 25, 100}};
static ct_rope rope_args(const op_case *k) {
    return (ct_rope){.theta = (double)S(5), .factor = (double)S(6) / 10.0, .pos0 = S(7)};
}
/* The op's documented fp32 steps for the angle of pair i at position t; cos and sin in double. */
static void rope_cs(const op_case *k, int64_t t, int64_t i, double *c, double *s) {
    ct_rope r = rope_args(k);
    float e = (float)(2 * i) / (float)S(4);
    float f = 1.0f / (float)pow((double)(float)r.theta, (double)e);
    if (r.factor != 1.0) f = f / (float)r.factor;
    float a = (float)(r.pos0 + t) * f;
    *c = r.theta != 0 ? cos((double)a) : 1.0;
    *s = r.theta != 0 ? sin((double)a) : 0.0;
}
static int64_t rope_in_numel(const op_case *k) { return S(0) * S(1) * (S(2) + 2 * S(3)) * S(4); }
static int64_t rope_out_numel(const op_case *k) { return S(0) * S(1) * 3 * S(2) * S(4); }
/* forward: qkv, x */
static bool rope_forward_setup(op_case *k) {
    N(0) = rope_out_numel(k);
    N(1) = rope_in_numel(k);
    return true;
}
static void rope_forward_run(ct_backend *be, const op_case *k, void **p) {
    ct_rope r = rope_args(k);
    be->attn.rope_gqa_forward(be, p[0], p[1], S(0), S(1), S(2), S(3), S(4), &r, k->dt);
}
/* y[head] = x[src] turned by t's angles (v heads: copied) */
static void rope_forward_ref(const op_case *k, double **v) {
    int64_t H = S(2), KV = S(3), D = S(4), half = D / 2, rep = H / KV;
    for (int64_t bt = 0; bt < S(0) * S(1); bt++) {
        const double *x = v[1] + bt * (H + 2 * KV) * D;
        double *y = v[0] + bt * 3 * H * D;
        for (int64_t which = 0; which < 3; which++)
            for (int64_t h = 0; h < H; h++) {
                int64_t src = which == 0 ? h : which == 1 ? H + h / rep : H + KV + h / rep;
                const double *xs = x + src * D;
                double *ys = y + (which * H + h) * D;
                for (int64_t i = 0; i < half; i++) {
                    double c, s;
                    rope_cs(k, bt % S(1), i, &c, &s);
                    if (which == 2) c = 1, s = 0;
                    ys[i] = xs[i] * c - xs[half + i] * s;
                    ys[half + i] = xs[half + i] * c + xs[i] * s;
                }
            }
    }
}
/* backward: dx, dqkv */
static bool rope_backward_setup(op_case *k) {
    N(0) = rope_in_numel(k);
    N(1) = rope_out_numel(k);
    return true;
}
static void rope_backward_run(ct_backend *be, const op_case *k, void **p) {
    ct_rope r = rope_args(k);
    be->attn.rope_gqa_backward(be, p[0], p[1], S(0), S(1), S(2), S(3), S(4), &r, k->dt);
}
/* The transpose: every query head's gradient turned back into its source head, summed. */
static void rope_backward_ref(const op_case *k, double **v) {
    int64_t H = S(2), KV = S(3), D = S(4), half = D / 2, rep = H / KV;
    for (int64_t j = 0; j < N(0); j++) v[0][j] = 0;
    for (int64_t bt = 0; bt < S(0) * S(1); bt++) {
        double *dx = v[0] + bt * (H + 2 * KV) * D;
        const double *d = v[1] + bt * 3 * H * D;
        for (int64_t which = 0; which < 3; which++)
            for (int64_t h = 0; h < H; h++) {
                int64_t src = which == 0 ? h : which == 1 ? H + h / rep : H + KV + h / rep;
                const double *ds = d + (which * H + h) * D;
                for (int64_t i = 0; i < half; i++) {
                    double c, s;
                    rope_cs(k, bt % S(1), i, &c, &s);
                    if (which == 2) c = 1, s = 0;
                    dx[src * D + i] += ds[i] * c + ds[half + i] * s;
                    dx[src * D + half + i] += ds[half + i] * c - ds[i] * s;
                }
            }
    }
}

/* kv_attention_forward: B T pos0 cap H KV D. One new token at the first position, one after a
 * cached prefix (grouped heads, multi-query, one head per kv head), several new tokens, a prefill
 * from position 0 (causal attention alone), caches over 256 rows (the CUDA kernel's chunk) and a
 * cache filled to its last row; head dims of 1 to 128. Variants: attend (y written), store_only
 * (y NULL: only the cache rows change). */
static const int64_t KVATT_SHAPES[][NS] = {
    {1, 1, 0, 1, 1, 1, 1},   {1, 1, 5, 9, 4, 2, 8},     {2, 3, 4, 8, 4, 1, 16}, {1, 7, 0, 7, 2, 1, 10},
    {1, 1, 299, 300, 2, 2, 64}, {2, 2, 30, 40, 6, 3, 32}, {1, 1, 10, 16, 4, 4, 128}, {1, 2, 600, 700, 2, 1, 24}};
static int64_t kvatt_cache_at(const op_case *k, int64_t which, int64_t b, int64_t g, int64_t pos) {
    return (((which * S(0) + b) * S(5) + g) * S(3) + pos) * S(6);
}
/* y, kv, qkv */
static bool kvatt_setup(op_case *k) {
    N(0) = k->var == 1 ? 0 : S(0) * S(1) * S(4) * S(6);
    N(1) = 2 * S(0) * S(5) * S(3) * S(6);
    N(2) = S(0) * S(1) * 3 * S(4) * S(6);
    return true;
}
static void kvatt_run(ct_backend *be, const op_case *k, void **p) {
    be->attn.kv_attention_forward(be, p[0], p[1], p[2], S(0), S(1), S(2), S(3), S(4), S(5), S(6), k->dt);
}
/* The new rows into the cache (kv head g from query head g H/KV), then each query over rows
 * 0 .. pos0 + t of its kv head. */
static void kvatt_ref(const op_case *k, double **v) {
    int64_t B = S(0), T = S(1), pos0 = S(2), H = S(4), KV = S(5), D = S(6), rep = H / KV;
    double *kv = v[1], scale = 1 / sqrt((double)D);
    const double *qkv = v[2];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t g = 0; g < KV; g++)
                for (int64_t which = 0; which < 2; which++)
                    for (int64_t d = 0; d < D; d++)
                        kv[kvatt_cache_at(k, which, b, g, pos0 + t) + d] =
                            qkv[((b * T + t) * 3 + 1 + which) * H * D + g * rep * D + d];
    if (!N(0)) return;
    double *p = malloc(sizeof(double) * (size_t)(pos0 + T));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                int64_t L = pos0 + t + 1, g = h / rep;
                const double *q = qkv + ((b * T + t) * 3) * H * D + h * D;
                double m = -INFINITY, l = 0;
                for (int64_t j = 0; j < L; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += q[d] * kv[kvatt_cache_at(k, 0, b, g, j) + d];
                    p[j] = dot * scale;
                    m = p[j] > m ? p[j] : m;
                }
                for (int64_t j = 0; j < L; j++) l += (p[j] = exp(p[j] - m));
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < L; j++) acc += p[j] / l * kv[kvatt_cache_at(k, 1, b, g, j) + d];
                    v[0][((b * T + t) * H + h) * D + d] = acc;
                }
            }
    free(p);
}

/* ======================================================================================== */
/* ---- the table ---- */

#define REF_F32(r, a) .ref_tol = {TOL(r, a)}
#define F32_ONLY_REF_EXACT REF_F32(0, 0)

static const op_row ROWS[] = {
    /* element-wise */
    {"fill", D_ALL, SHAPES(VEC_SIZES), "n range", "v=1.5 v=0.375 v=7e4",
     {{"x", OUT, DT, .cmp = EXACT}},
     vec_setup, fill_run, NULL, fill_ref, F32_ONLY_REF_EXACT},
    {"scale", D_ALL, SHAPES(VEC_SIZES), "n range", "s=3 s=1.5 s=1.7",
     {{"x", ACC, DT}},
     vec_setup, scale_run, NULL, scale_ref, REF_F32(1e-6, 1e-6), .flags = SPECIALS},
    {"axpy", D_ALL, SHAPES(VEC_SIZES), "n range", "a=-0.25 a=-0.7 a=-0.3",
     {{"y", ACC, DT, -3, 3}, {"x", IN, DT, -3, 3}},
     n_setup, axpy_run, NULL, axpy_ref, REF_F32(1e-6, 1e-6), .flags = SPECIALS},
    {"add", D_ALL, SHAPES(VEC_SIZES), "n range", NULL,
     {{"y", OUT, DT}, {"a", IN, DT}, {"b", IN, DT}},
     vec_setup, add_run, NULL, add_ref, REF_F32(1e-7, 0), .flags = SPECIALS},
    {"copy_rows", D_ALL, SHAPES(COPY_ROWS_SHAPES), "rows cols ldx ldy col0", "copy accumulate",
     {{"y", ACC, DT, -2, 2}, {"x", IN, DT, -2, 2}},
     copy_rows_setup, copy_rows_run, NULL, copy_rows_ref, F32_ONLY_REF_EXACT, .flags = SPECIALS | KEEP},
    {"cast", D_ALL, SHAPES(CAST_SIZES), "n", "dt<-f32 f32<-dt dt<-dt dt<-other16",
     {{"y", OUT, DT, .cmp = BITS}, {"x", IN, F32, -70000, 70000}},
     cast_setup, cast_run, cast_init, cast_ref, F32_ONLY_REF_EXACT},
    {"round_to", D_ALL, SHAPES(CAST_SIZES), "n", NULL,
     {{"x", ACC, F32, -70000, 70000, .cmp = BITS}},
     n_setup, round_to_run, round_to_init, round_to_ref, {TOL(0, 0), TOL(0, 0), TOL(0, 0)}, .flags = NO_WIDEN},
    {"normalize_u8", D_ALL, SHAPES(NORMALIZE_SHAPES), "n c h w mean_std", "flip no_flip",
     {{"y", OUT, DT}, {"x", IN, U8, 0, 256}, {"flip", IN, U8, 0, 2}},
     normalize_setup, normalize_run, NULL, normalize_ref, F32_ONLY_REF_EXACT},
    {"bias_act_forward", D_ALL, SHAPES(BIAS_SHAPES), "rows cols inner", "gelu leaky_relu relu_no_bias",
     {{"x", ACC, DT, -2, 2}, {"bias", IN, DT, -1, 1}},
     bias_act_setup, bias_act_run, bias_act_init, bias_act_ref, REF_F32(1e-5, 1e-6), .flags = SPECIALS},
    {"bias_backward", D_ALL, SHAPES(BIAS_SHAPES), "rows cols inner", NULL,
     {{"db", ACC, F32, -1, 1}, {"dy", IN, DT, -2, 2}},
     bias_backward_setup, bias_backward_run, NULL, bias_backward_ref, REF_F32(1e-5, 1e-5), .flags = SPECIALS},
    {"act_forward", D_ALL, SHAPES(ACT_SIZES), "n", ACTS,
     {{"y", OUT, DT}, {"x", IN, DT, -6, 6}},
     n_setup, act_forward_run, act_forward_init, act_forward_ref, REF_F32(1e-5, 1e-6), .flags = SPECIALS},
    {"act_backward", D_ALL, SHAPES(ACT_SIZES), "n", ACTS,
     /* dx = dy act'(x), act' a sum of terms no larger than about 1 (gelu' crosses 0 at -0.75) */
     {{"dx", OUT, DT, .terms = 2}, {"dy", IN, DT, -1, 1}, {"x", IN, DT, -6, 6}, {"y", IN, DT}},
     n_setup, act_backward_run, act_backward_init, act_backward_ref, REF_F32(1e-4, 1e-5), .flags = SPECIALS},
    {"dropout_forward", D_ALL, SHAPES(DROPOUT_SIZES), "n", "p=0.3 p=0 p=1",
     {{"y", OUT, DT}, {"mask", OUT, U8}, {"x", IN, DT, -1, 1}},
     n_setup, dropout_forward_run, NULL, dropout_forward_ref, F32_ONLY_REF_EXACT, .flags = SPECIALS},
    {"dropout_backward", D_ALL, SHAPES(DROPOUT_SIZES), "n", "p=0.3 p=0 p=1",
     {{"dx", OUT, DT}, {"dy", IN, DT, -1, 1}, {"mask", IN, U8, 0, 2}},
     n_setup, dropout_backward_run, NULL, dropout_backward_ref, F32_ONLY_REF_EXACT, .flags = SPECIALS},
    /* embedding */
    {"embedding_forward", D_ALL, SHAPES(EMBED_SHAPES), "n_ids vocab dim skewed", NULL,
     {{"y", OUT, DT, .cmp = EXACT}, {"ids", IN, I32, 0, 1}, {"table", IN, DT, -1, 1}},
     embed_forward_setup, embed_forward_run, embed_forward_init, embed_forward_ref, F32_ONLY_REF_EXACT},
    {"embedding_backward", D_ALL, SHAPES(EMBED_SHAPES), "n_ids vocab dim skewed", NULL,
     {{"dtable", ACC, F32, -1, 1, .cmp = EXACT}, {"dy", IN, DT, -1, 1}, {"ids", IN, I32, 0, 1}},
     embed_backward_setup, embed_backward_run, embed_backward_init, embed_backward_ref, REF_F32(1e-5, 1e-5),
     .flags = KEEP},
    /* convolution and pooling */
    {"im2col", D_ALL, SHAPES(CONV_SHAPES), CONV_PARAMS, GROUPS,
     {{"col", OUT, DT, .cmp = EXACT}, {"img", IN, DT, -1, 1}},
     im2col_setup, im2col_run, NULL, im2col_ref, F32_ONLY_REF_EXACT},
    {"col2im", D_ALL, SHAPES(CONV_SHAPES), CONV_PARAMS, GROUPS,
     {{"img", ACC, DT, -1, 1}, {"col", IN, DT, -1, 1}},
     col2im_setup, col2im_run, NULL, col2im_ref, REF_F32(1e-5, 1e-5), .flags = KEEP},
    {"conv2d_forward", D_ALL, SHAPES(CONV_SHAPES), CONV_PARAMS, "bias no_bias",
     {{"y", OUT, DT}, {"x", IN, DT, -1, 1}, {"w", IN, DT, -1, 1}, {"bias", IN, DT, -1, 1}},
     conv_forward_setup, conv_forward_run, NULL, conv_forward_ref, REF_F32(1e-5, 1e-5)},
    {"conv2d_backward", D_ALL, SHAPES(CONV_SHAPES), CONV_PARAMS, "all dw_only",
     {{"dx", OUT, DT},
      {"dw", ACC, F32, -1, 1, .ref = TOL(1e-4, 1e-4)},
      {"db", ACC, F32, -1, 1},
      {"dy", IN, DT, -1, 1},
      {"x", IN, DT, -1, 1},
      {"w", IN, DT, -1, 1}},
     conv_backward_setup, conv_backward_run, NULL, conv_backward_ref, REF_F32(1e-5, 1e-5)},
    {"maxpool2d_forward", D_ALL, SHAPES(POOL_SHAPES), POOL_PARAMS, "ties nan",
     {{"y", OUT, DT, .cmp = EXACT}, {"argmax", OUT, I32}, {"x", IN, DT, -1, 1}},
     maxpool_forward_setup, maxpool_forward_run, maxpool_forward_init, maxpool_forward_ref, F32_ONLY_REF_EXACT},
    {"maxpool2d_backward", D_ALL, SHAPES(POOL_SHAPES), POOL_PARAMS, NULL,
     {{"dx", OUT, DT}, {"dy", IN, DT, -1, 1}, {"argmax", IN, I32, 0, 1}},
     maxpool_backward_setup, maxpool_backward_run, maxpool_backward_init, maxpool_backward_ref, REF_F32(1e-6, 1e-6)},
    {"avgpool2d_forward", D_ALL, SHAPES(POOL_SHAPES), POOL_PARAMS, "exclude_pad include_pad",
     {{"y", OUT, DT}, {"x", IN, DT, -3, 3}},
     avgpool_forward_setup, avgpool_forward_run, NULL, avgpool_forward_ref, REF_F32(1e-6, 1e-6)},
    {"avgpool2d_backward", D_ALL, SHAPES(POOL_SHAPES), POOL_PARAMS, "exclude_pad include_pad",
     {{"dx", OUT, DT}, {"dy", IN, DT, -1, 1}},
     avgpool_backward_setup, avgpool_backward_run, NULL, avgpool_backward_ref, REF_F32(1e-5, 1e-6)},
    /* normalization */
    {"batchnorm_forward", D_ALL, SHAPES(BN_SHAPES), "n c hw", "train eval",
     {{"y", OUT, DT},
      {"x", IN, DT, -2, 3},
      {"gamma", IN, DT, 0.5f, 1.5f},
      {"beta", IN, DT, -1, 1},
      {"running_mean", ACC, F32, -0.1f, 0.1f, .ref = TOL(1e-5, 1e-6)},
      {"running_var", ACC, F32, 0.5f, 1.5f, .ref = TOL(1e-5, 1e-6)},
      {"save_mean", OUT, F32, .ref = TOL(1e-5, 1e-6)},
      {"save_invstd", OUT, F32, .ref = TOL(1e-5, 0)}},
     bn_forward_setup, bn_forward_run, NULL, bn_forward_ref, REF_F32(1e-4, 1e-5)},
    {"batchnorm_backward", D_ALL, SHAPES(BN_SHAPES), "n c hw", NULL,
     {{"dx", OUT, DT},
      {"dgamma", ACC, F32, -1, 1, .ref = TOL(1e-4, 1e-4), .dev = {1e-5, 1e-4, 1e-4}},
      {"dbeta", ACC, F32, -1, 1, .ref = TOL(1e-5, 1e-5)},
      {"dy", IN, DT, -1, 1},
      {"x", IN, DT, -2, 3},
      {"gamma", IN, DT, 0.5f, 1.5f},
      {"save_mean", IN, F32},
      {"save_invstd", IN, F32}},
     bn_backward_setup, bn_backward_run, bn_backward_init, bn_backward_ref, REF_F32(1e-3, 1e-4)},
    {"layernorm_forward", D_ALL, SHAPES(LN_SHAPES), "rows d", NULL,
     {{"y", OUT, DT},
      {"mean", OUT, F32, .ref = TOL(1e-5, 1e-6)},
      {"rstd", OUT, F32, .ref = TOL(1e-4, 0)},
      {"x", IN, DT, -2, 3},
      {"gamma", IN, DT, 0.5f, 1.5f},
      {"beta", IN, DT, -1, 1}},
     ln_forward_setup, ln_forward_run, NULL, ln_forward_ref, REF_F32(1e-4, 1e-5)},
    {"layernorm_backward", D_ALL, SHAPES(LN_SHAPES), "rows d", NULL,
     {{"dx", OUT, DT},
      {"dgamma", ACC, F32, -1, 1, .ref = TOL(1e-4, 1e-4), .dev = {1e-5, 1e-4, 1e-4}},
      {"dbeta", ACC, F32, -1, 1, .ref = TOL(1e-5, 1e-5)},
      {"dy", IN, DT, -1, 1},
      {"x", IN, DT, -2, 3},
      {"gamma", IN, DT, 0.5f, 1.5f},
      {"mean", IN, F32},
      {"rstd", IN, F32}},
     ln_backward_setup, ln_backward_run, ln_backward_init, ln_backward_ref, REF_F32(1e-3, 1e-4)},
    /* attention: scores in [-2, 2] for qkv in [-1, 1] (D <= 128 terms / sqrt(D)), so the softmax
     * is far from one-hot; fp32 sums of at most 128 products and 70 keys: 1e-5 relative, with an
     * atol for outputs that cancel (y is a convex mix of v, gradients sums of signed terms) */
    {"causal_attention_forward", D_ALL, SHAPES(ATTN_SHAPES), "B T H D", "p=0 p=0.25",
     {{"y", OUT, DT}, {"lse", OUT, F32, .ref = TOL(1e-5, 1e-5)}, {"qkv", IN, DT, -1, 1}},
     attn_forward_setup, attn_forward_run, NULL, attn_forward_ref, REF_F32(1e-4, 1e-5)},
    {"causal_attention_backward", D_ALL, SHAPES(ATTN_SHAPES), "B T H D", "p=0 p=0.25",
     {{"dqkv", OUT, DT}, {"dy", IN, DT, -1, 1}, {"qkv", IN, DT, -1, 1}, {"y", IN, DT}, {"lse", IN, F32}},
     attn_backward_setup, attn_backward_run, attn_backward_init, attn_backward_ref, REF_F32(1e-4, 1e-4)},
    /* losses */
    {"softmax_xent", D_ALL, SHAPES(XENT_SHAPES), "rows classes grad_scale logit_range logit_offset pad",
     "eps=0 eps=0.1 loss_only in_place",
     {{"dlogits", OUT, DT, .ref = TOL(1e-3, 1e-6)},
      {"result", OUT, F32, .cmp = EACH},
      {"logits", IN, DT},
      {"labels", IN, I32, 0, 1},
      {"result[1]", OUT, F32, .cmp = EXACT, .ref = TOL(0, 0)}},
     xent_setup, xent_run, xent_init, xent_ref, REF_F32(1e-5, 1e-6)},
    {"mse_loss", D_ALL, SHAPES(MSE_SHAPES), "rows cols grad_scale_x1000 range", "grad loss_only target=pred",
     {{"dpred", OUT, DT, .ref = TOL(1e-5, 1e-12)},
      {"result", OUT, F32, .cmp = EACH},
      {"pred", IN, DT},
      {"target", IN, F32, -1, 1},
      {"result[1]", OUT, F32, .cmp = EXACT, .ref = TOL(0, 0)}},
     elt_loss_setup, mse_run, mse_init, mse_ref, REF_F32(1e-5, 0)},
    {"bce_logits_loss", D_ALL, SHAPES(BCE_SHAPES), "rows cols grad_scale_x1000 range", "grad loss_only",
     {{"dlogits", OUT, DT, .ref = TOL(1e-4, 1e-9)},
      {"result", OUT, F32, .cmp = EACH},
      {"logits", IN, DT},
      {"target", IN, F32, 0, 1},
      {"result[1]", OUT, F32, .cmp = EXACT, .ref = TOL(0, 0)}},
     elt_loss_setup, bce_run, bce_init, bce_ref, REF_F32(1e-4, 0)},
    /* reductions */
    {"sum_squares", D_F32, SHAPES(REDUCE_SIZES), "n", NULL,
     {{"x", IN, F32, -3, 3}, {"sum", OUT, F64, .cmp = EACH}},
     reduce_setup, sum_squares_run, NULL, sum_squares_ref, REF_F32(1e-12, 0), .dev = {1e-10}},
    {"all_finite", D_F32, SHAPES(REDUCE_SIZES), "n", "finite inf_last -inf_last nan_last inf_middle nan_middle",
     {{"x", IN, F32, -1, 1}, {"finite", OUT, F64, .cmp = EXACT}},
     reduce_setup, all_finite_run, all_finite_init, all_finite_ref, F32_ONLY_REF_EXACT},
    /* optimizers */
    {"adam_step", D_ALL, SHAPES(OPT_SHAPES), "n steps", "l2 decoupled fused_copy",
     {{"param", ACC, F32, -1, 1, .cmp = DELTA, .ref = TOL(1e-5, 1e-6)},
      {"grad", IN, F32, -1, 1},
      {"m", ACC, F32, -0.1f, 0.1f, .cmp = DELTA, .ref = TOL(1e-5, 1e-7)},
      {"v", ACC, F32, 0.001f, 0.01f, .cmp = DELTA, .ref = TOL(1e-5, 1e-12)},
      {"copy", OUT, DT}},
     opt_setup, adam_run, NULL, adam_ref, {TOL(0, 0), TOL(1e-3, 1e-6), TOL(8e-3, 1e-6)}, .flags = NO_WIDEN},
    {"sgd_step", D_ALL, SHAPES(OPT_SHAPES), "n steps", "plain first_step momentum dampening nesterov nesterov_first "
                                                      "no_momentum damp damp_nesterov damp_first fused_copy",
     {{"param", ACC, F32, -1, 1, .cmp = DELTA, .ref = TOL(1e-5, 1e-6)},
      {"grad", IN, F32, -1, 1},
      {"momentum_buffer", ACC, F32, -0.5f, 0.5f, .cmp = DELTA, .ref = TOL(1e-5, 1e-6)},
      {"copy", OUT, DT}},
     opt_setup, sgd_run, NULL, sgd_ref, {TOL(0, 0), TOL(1e-3, 1e-6), TOL(8e-3, 1e-6)}, .flags = NO_WIDEN},
    {"lamb_direction", D_F32, SHAPES(LAMB_SIZES), "n", "a a_eps_inside b b_eps_inside",
     {{"update", OUT, F32, .ref = TOL(1e-4, 1e-6)},
      {"param", IN, F32, -1, 1},
      {"grad", IN, F32, -1, 1},
      {"m", ACC, F32, -0.1f, 0.1f, .cmp = DELTA, .ref = TOL(1e-5, 1e-7)},
      {"v", ACC, F32, 0.001f, 0.01f, .cmp = DELTA, .ref = TOL(1e-5, 1e-12)},
      {"w_norm", OUT, F64, .cmp = EACH, .ref = TOL(1e-9, 0)},
      {"u_norm", OUT, F64, .cmp = EACH, .ref = TOL(1e-4, 0)}},
     lamb_setup, lamb_run, NULL, lamb_ref, REF_F32(1e-4, 1e-6)},
    /* matrix products */
    {"gemm", D_F32, SHAPES(GEMM_SHAPES), "m n k padded scalars", TRANSPOSES,
     {{"a", IN, DT, -1, 1}, {"b", IN, DT, -1, 1}, {"c", ACC, DT, -1, 1}},
     gemm_setup, gemm_run, NULL, gemm_ref, REF_F32(1e-4, 1e-4), .flags = KEEP},
    {"gemm_16bit", D_16, SHAPES(GEMM16_SHAPES), "ta tb m n k padded scalars a_f32 b_f32 c_f32 range", NULL,
     {{"a", IN, DT}, {"b", IN, DT}, {"c", ACC, DT, -1, 1}},
     /* the reference tolerance is c's, which setup sets from its storage */
     /* device: the 16-bit rtols for C in fp32 too (cuBLASLt may accumulate in its own order and precision) */
     gemm16_setup, gemm16_run, NULL, gemm16_ref, {{0}, TOL(0, 0), TOL(0, 0)}, .ref_bound = gemm16_bound,
     .dev = {0, 3e-3, 2.4e-2}, .flags = KEEP},
    {"gemm_batched", D_F32, SHAPES(BATCHED_SHAPES), "ta tb m n k batch padded alpha_x10 beta_x10", NULL,
     {{"a", IN, F32, -1, 1}, {"b", IN, F32, -1, 1}, {"c", ACC, F32, -1, 1}},
     batched_setup, batched_run, NULL, batched_ref, REF_F32(1e-4, 1e-4), .flags = KEEP},
    /* Llama-family blocks */
    {"rmsnorm_forward", D_ALL, SHAPES(LN_SHAPES), "rows d", "weight no_weight",
     {{"y", OUT, DT}, {"rstd", OUT, F32, .ref = TOL(1e-4, 0)}, {"x", IN, DT, -2, 3}, {"gamma", IN, DT, 0.5f, 1.5f}},
     rms_forward_setup, rms_forward_run, NULL, rms_forward_ref, REF_F32(1e-4, 1e-5)},
    {"rmsnorm_backward", D_ALL, SHAPES(LN_SHAPES), "rows d", "all dgamma_only dx_only",
     {{"dx", OUT, DT},
      {"dgamma", ACC, F32, -1, 1, .ref = TOL(1e-4, 1e-4), .dev = {1e-5, 1e-4, 1e-4}},
      {"dy", IN, DT, -1, 1},
      {"x", IN, DT, -2, 3},
      {"gamma", IN, DT, 0.5f, 1.5f},
      {"rstd", IN, F32}},
     rms_backward_setup, rms_backward_run, rms_backward_init, rms_backward_ref, REF_F32(1e-3, 1e-4)},
    {"swiglu_forward", D_ALL, SHAPES(SWIGLU_SHAPES), "rows f", NULL,
     {{"y", OUT, DT}, {"x", IN, DT, -6, 6}},
     swiglu_forward_setup, swiglu_forward_run, NULL, swiglu_forward_ref, REF_F32(1e-5, 1e-6), .flags = SPECIALS},
    {"swiglu_backward", D_ALL, SHAPES(SWIGLU_SHAPES), "rows f", NULL,
     /* d gate = dy up silu'(gate), silu' crossing 0 at -1.28: terms of dy's size */
     {{"dx", OUT, DT, .terms = 2}, {"dy", IN, DT, -1, 1}, {"x", IN, DT, -6, 6}},
     swiglu_backward_setup, swiglu_backward_run, NULL, swiglu_backward_ref, REF_F32(1e-5, 1e-5), .flags = SPECIALS},
    {"rope_gqa_forward", D_ALL, SHAPES(ROPE_SHAPES), "B T H KV D theta factor_x10 pos0", NULL,
     {{"qkv", OUT, DT, .terms = 2}, {"x", IN, DT, -1, 1}},
     rope_forward_setup, rope_forward_run, NULL, rope_forward_ref, REF_F32(1e-5, 1e-6)},
    {"rope_gqa_backward", D_ALL, SHAPES(ROPE_SHAPES), "B T H KV D theta factor_x10 pos0", NULL,
     {{"dx", OUT, DT, .terms = 2}, {"dqkv", IN, DT, -1, 1}},
     rope_backward_setup, rope_backward_run, NULL, rope_backward_ref, REF_F32(1e-5, 1e-5)},
    /* the cache's rows are copies (bits on every backend); y as causal attention's */
    {"kv_attention_forward", D_ALL, SHAPES(KVATT_SHAPES), "B T pos0 cap H KV D", "attend store_only",
     {{"y", OUT, DT}, {"kv", ACC, DT, -1, 1, .cmp = BITS}, {"qkv", IN, DT, -1, 1}},
     kvatt_setup, kvatt_run, NULL, kvatt_ref, REF_F32(1e-4, 1e-5), .flags = KEEP},
};

/* ---- Check glue ---- */

static void setup(void) {
    if (device) return;
    be1 = ct_cpu_backend_create(1);
    be2 = ct_cpu_backend_create(2);
    ck_assert_ptr_nonnull(be1);
    ck_assert_ptr_nonnull(be2);
}
static void teardown(void) {
    if (device) return;
    ct_backend_destroy(be1);
    ct_backend_destroy(be2);
}

/* CT_TEST_OPS=a,b: only the rows named (the sanitizer runs of gpu_check.sh pick a few). */
static bool row_selected(const char *name) {
    const char *only = getenv("CT_TEST_OPS");
    if (!only || !*only) return true;
    size_t n = strlen(name);
    for (const char *p = only; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        p += len + (end != NULL);
    }
    return false;
}

START_TEST(op_row_test) {
    if (row_selected(ROWS[_i].name)) check_row(&ROWS[_i], _i);
}
END_TEST

int main(void) {
    const char *env = getenv("CT_TEST_SEED");
    if (env && *env) seed = strtoull(env, NULL, 10);
    const char *d = getenv("CT_TEST_DEVICE");
    if (d && *d && strcmp(d, "cpu") != 0) {
        device = d;
        int rc = cuda_pair_open(device, &cpu, &dev);
        if (rc) return rc;
        printf("test_ops: %s (%s) against the CPU backend, seed %llu\n", device, dev->device_desc,
               (unsigned long long)seed);
    } else {
        printf("test_ops: the CPU backend (1 vs 2 threads, widened fp32, fp64 references), seed %llu\n",
               (unsigned long long)seed);
        /* which bf16 GEMM path the rows check here, and so what this CPU leaves unchecked */
        ct_err err = {0};
        if (ct_cpu_blas_load(&err) == CT_OK)
            printf("test_ops: bf16 x bf16 GEMMs: %s\n%s", ct_cpu_bf16_note(), ct_cpu_bf16_native() ? "" :
                   "test_ops: not checked on this CPU: the native bf16 path (test/e2e_gemm_paths.sh runs it "
                   "emulated: CTRAIN_CPU_BF16=emulate)\n");
    }
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("rows");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, op_row_test, 0, CT_ARRAY_LEN(ROWS));
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    /* a CUDA context does not survive fork() */
    if (device) srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (dev) ct_backend_destroy(dev);
    if (cpu) ct_backend_destroy(cpu);
    return failed ? 1 : 0;
}
