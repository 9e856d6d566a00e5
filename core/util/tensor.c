/* tensor.c: dtype names and shape helpers. */
#include "core/util/tensor.h"

#include <stdio.h>

const char *ct_dtype_name(ct_dtype t) {
    static const char *names[CT_DTYPE_COUNT] = {"f32", "f16", "bf16", "i32", "i64", "u8", "u16"};
    return (unsigned)t < CT_DTYPE_COUNT ? names[t] : "?";
}

const char *ct_dtype_safetensors_name(ct_dtype t) {
    static const char *names[CT_DTYPE_COUNT] = {"F32", "F16", "BF16", "I32", "I64", "U8", "U16"};
    return (unsigned)t < CT_DTYPE_COUNT ? names[t] : "?";
}

ct_shape ct_shape_make(int ndim, const int64_t *d) {
    ct_shape s = {0, {0}};
    if (ndim < 0) ndim = 0;
    if (ndim > CT_MAX_DIMS) ndim = CT_MAX_DIMS;
    s.ndim = ndim;
    for (int i = 0; i < ndim; i++) s.d[i] = d[i];
    return s;
}

const char *ct_shape_str(const ct_shape *s, char *buf, size_t n) {
    if (n == 0) return buf;
    size_t len = 0;
    buf[0] = '\0';
    len += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < s->ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)s->d[i]);
    if (len < n) snprintf(buf + len, n - len, "]");
    return buf;
}
