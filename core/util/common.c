/* common.c: errors, the fatal handler, warnings, checked allocation, timing, suggestions. */
#include "core/util/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int ct_errf(ct_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int ct_err_io(int e, int otherwise) {
    switch (e) {
    case EMFILE: case ENFILE: case ENOMEM: case EAGAIN: case ENOBUFS: return CT_ERR_RUNTIME;
    default: return otherwise;
    }
}

void ct_err_append(ct_err *err, const char *fmt, ...) {
    if (!err) return;
    size_t len = strlen(err->msg);
    if (len + 2 >= sizeof err->msg) return;
    err->msg[len++] = '\n';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + len, sizeof err->msg - len, fmt, ap);
    va_end(ap);
}

void ct_warnf(ct_warnings *w, const char *fmt, ...) {
    if (!w) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->items[i], buf) == 0) return; /* each warning once */
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 8;
        w->items = ct_xrealloc(w->items, (size_t)w->cap * sizeof *w->items);
    }
    w->items[w->n++] = ct_xstrdup(buf);
}

void ct_warnings_free(ct_warnings *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->items[i]);
    free(w->items);
    w->items = NULL;
    w->n = w->cap = 0;
}

/* Process-wide by necessity: a fatal error can happen in any thread and deep inside an op that
 * has no error path (and in the dlopen'ed CUDA library), so the handler cannot travel as an
 * argument. Besides cmd/ctrain.c's signal flag this is ctrain's only mutable global state; it is
 * written once, at start-up, before any thread exists. */
static struct {
    ct_fatal_fn fn;
    void *ctx;
} g_fatal;

void ct_set_fatal_handler(ct_fatal_fn fn, void *ctx) {
    g_fatal.fn = fn;
    g_fatal.ctx = ctx;
}

void ct_fatal(const char *fmt, ...) {
    /* on the stack: the failure may be that malloc has nothing left */
    char msg[CT_ERR_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_fatal.fn) g_fatal.fn(g_fatal.ctx, msg);
    fprintf(stderr, "ctrain: fatal: %s\n", msg);
    abort();
}

void ct_die_oom_at(size_t n, const char *file, int line) {
    ct_fatal("out of host memory allocating %zu bytes (%s:%d)", n, file, line);
}

static void *try_failed(size_t n, const char *what, ct_err *err) {
    ct_errf(err, CT_ERR_RUNTIME, "out of host memory: %zu bytes (%.1f GiB) for %s", n, (double)n / (1u << 30), what);
    return NULL;
}

void *ct_try_malloc(size_t n, const char *what, ct_err *err) {
    void *p = malloc(n ? n : 1);
    return p ? p : try_failed(n, what, err);
}

void *ct_try_calloc(size_t n, size_t size, const char *what, ct_err *err) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    return p ? p : try_failed(size && n > SIZE_MAX / size ? SIZE_MAX : n * size, what, err);
}

void *ct_try_realloc(void *p, size_t n, const char *what, ct_err *err) {
    void *q = realloc(p, n ? n : 1);
    return q ? q : try_failed(n, what, err);
}

void *ct_xmalloc_at(size_t n, const char *file, int line) {
    void *p = malloc(n ? n : 1);
    if (!p) ct_die_oom_at(n, file, line);
    return p;
}

void *ct_xcalloc_at(size_t n, size_t sz, const char *file, int line) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) ct_die_oom_at(n * sz, file, line);
    return p;
}

void *ct_xrealloc_at(void *p, size_t n, const char *file, int line) {
    void *q = realloc(p, n ? n : 1);
    if (!q) ct_die_oom_at(n, file, line);
    return q;
}

char *ct_xstrdup_at(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    char *d = ct_xmalloc_at(n, file, line);
    memcpy(d, s, n);
    return d;
}

const char *ct_cli_option_value(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    const char *arg = argv[*i];
    if (strncmp(arg, name, n) != 0) return NULL;
    if (arg[n] == '=') return arg + n + 1;
    if (arg[n] != '\0') return NULL; /* a longer option that starts with name */
    return *i + 1 < argc ? argv[++*i] : "";
}

/* Bytes of the valid UTF-8 character at s[0..left) that is not a control (2 to 4), or 0. */
static size_t utf8_printable_len(const unsigned char *s, size_t left) {
    unsigned c = s[0];
    size_t k = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (!k || k > left) return 0;
    uint32_t cp = c & (k == 2 ? 0x1f : k == 3 ? 0x0f : 0x07);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp <= 0x9f) return 0;
    return k;
}

/* The text ct_printable writes for the character at p[i..len): into piece (up to 4 bytes, or an
 * escape), its length returned, *k the input bytes it stands for. */
static size_t printable_piece(const unsigned char *p, size_t i, size_t len, int flags, char piece[8], size_t *k) {
    unsigned c = p[i];
    *k = 1;
    if ((c >= 0x20 && c < 0x7f) || ((flags & CT_PRINT_LINES) && (c == '\n' || c == '\t'))) {
        piece[0] = (char)c;
        return 1;
    }
    size_t u = c >= 0x80 ? utf8_printable_len(p + i, len - i) : 0;
    if (u) {
        memcpy(piece, p + i, u);
        *k = u;
        return u;
    }
    return (size_t)snprintf(piece, 8, "\\x%02x", c);
}

char *ct_printable(char *out, size_t n, const char *s, size_t len, int flags) {
    if (!n) return out;
    const unsigned char *p = (const unsigned char *)s;
    char piece[8];
    size_t k, total = 0;
    for (size_t i = 0; i < len; i += k) total += printable_piece(p, i, len, flags, piece, &k);
    bool cut = total > n - 1;
    size_t room = cut ? (n > 4 ? n - 4 : 0) : n - 1, at = 0;   /* a cut keeps 3 bytes for "..." */
    for (size_t i = 0; i < len; i += k) {
        size_t w = printable_piece(p, i, len, flags, piece, &k);
        if (at + w > room) break;
        memcpy(out + at, piece, w);
        at += w;
    }
    if (cut && n > 4) {
        memcpy(out + at, "...", 3);
        at += 3;
    }
    out[at] = '\0';
    return out;
}

void ct_fputs_printable_line(const char *prefix, const char *s, FILE *f) {
    const unsigned char *p = (const unsigned char *)s;
    size_t len = strlen(s), pre = strlen(prefix), k, at = pre;
    /* an escape is at most 4 bytes per byte of s; on an allocation failure, the line unescaped but whole */
    char *buf = malloc(pre + 4 * len + 2);
    if (!buf) {
        fprintf(f, "%s%s\n", prefix, s);
        return;
    }
    memcpy(buf, prefix, pre);
    char piece[8];
    for (size_t i = 0; i < len; i += k) {
        size_t w = printable_piece(p, i, len, CT_PRINT_LINES, piece, &k);
        memcpy(buf + at, piece, w);
        at += w;
    }
    buf[at++] = '\n';
    fwrite(buf, 1, at, f);
    free(buf);
}

double ct_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ct_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return 1 << 20; /* keys are short; do not spend time on long strings */
    int d[65][65];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

const char *ct_suggest(const char *word, const char *const *candidates, int n) {
    const char *best = NULL;
    int best_d = 1 << 20;
    for (int i = 0; i < n; i++) {
        int d = ct_edit_distance(word, candidates[i]);
        if (d < best_d) {
            best_d = d;
            best = candidates[i];
        }
    }
    /* Close enough: at most a third of the word's length (at least 1, at most 4) edits. */
    int len = (int)strlen(word);
    int limit = len / 3;
    if (limit < 1) limit = 1;
    if (limit > 4) limit = 4;
    return best_d <= limit ? best : NULL;
}
