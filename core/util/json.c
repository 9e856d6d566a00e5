/* json.c: recursive-descent JSON reader with source positions (see json.h).
 *
 * The parser reads a byte buffer with an explicit length and never looks past it. It builds the
 * tree with cJSON's own constructors, so the rest of ctrain (and cJSON_Delete) treat it like any
 * cJSON tree, and records in a side table where each node came from. Every byte is examined
 * once, plus the decoding of strings and numbers, so time is linear in the input; duplicate keys
 * are found with a hash table for the same reason (a fuzzer will try an object with 10^5 keys). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strtod_l */
#endif
#include "core/util/json.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CT_JSON_MAX_FILE (64u << 20) /* a config larger than 64 MiB is a mistake, not a config */
#define TOKEN_SHOW 40                /* longest token quoted in a message */
#define SHOW_BUF (TOKEN_SHOW * 4 + 8) /* room for a shown token, each byte escaped */

/* ---- side table: node -> position / origin ------------------------------------------------- */

typedef struct pos_entry {
    const cJSON *node; /* NULL once forgotten */
    int line, col;     /* key position for object members, value position otherwise */
    int vline, vcol;   /* value position */
    char *origin;      /* "--set" etc., or NULL for nodes read from the file */
} pos_entry;

struct ct_json_doc {
    char *filename;
    cJSON *root;
    pos_entry *ents; /* append-only; slots index into it */
    size_t n_ents, cap_ents;
    size_t *slots; /* open addressing: entry index + 1, 0 = empty */
    size_t n_slots;
};

static size_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

/* Slot holding the live entry for node, or the empty slot where it would go. */
static size_t *pos_slot(const ct_json_doc *doc, const cJSON *node) {
    size_t mask = doc->n_slots - 1;
    for (size_t i = hash_ptr(node) & mask;; i = (i + 1) & mask) {
        size_t *s = &doc->slots[i];
        if (*s == 0 || doc->ents[*s - 1].node == node) return s;
    }
}

static void pos_grow(ct_json_doc *doc) {
    size_t old_n = doc->n_slots;
    size_t *old = doc->slots;
    doc->n_slots = old_n ? 2 * old_n : 64;
    doc->slots = ct_xcalloc(doc->n_slots, sizeof *doc->slots);
    for (size_t i = 0; i < old_n; i++) {
        if (old[i] == 0 || doc->ents[old[i] - 1].node == NULL) continue; /* drop forgotten */
        *pos_slot(doc, doc->ents[old[i] - 1].node) = old[i];
    }
    free(old);
}

static const pos_entry *pos_find(const ct_json_doc *doc, const cJSON *node) {
    if (!doc || !node || doc->n_slots == 0) return NULL;
    size_t s = *pos_slot(doc, node);
    return s ? &doc->ents[s - 1] : NULL;
}

/* The entry for node, created (with no position) when there is none. */
static pos_entry *pos_get(ct_json_doc *doc, const cJSON *node) {
    if (2 * (doc->n_ents + 1) > doc->n_slots) pos_grow(doc);
    size_t *s = pos_slot(doc, node);
    if (*s) return &doc->ents[*s - 1];
    if (doc->n_ents == doc->cap_ents) {
        doc->cap_ents = doc->cap_ents ? 2 * doc->cap_ents : 64;
        doc->ents = ct_xrealloc(doc->ents, doc->cap_ents * sizeof *doc->ents);
    }
    pos_entry *e = &doc->ents[doc->n_ents++];
    *e = (pos_entry){.node = node};
    *s = doc->n_ents;
    return e;
}

/* ---- duplicate-key table: (object, key) -> member ----------------------------------------- */

typedef struct key_table {
    const cJSON **members; /* member nodes; the key is member->string, the object is stored beside */
    const cJSON **parents;
    size_t n, cap; /* cap is a power of two */
} key_table;

static size_t hash_key(const cJSON *parent, const char *key) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *k = (const unsigned char *)key; *k; k++) h = (h ^ *k) * 1099511628211ull;
    return (size_t)(h ^ hash_ptr(parent));
}

static size_t key_index(const key_table *t, const cJSON *parent, const char *key) {
    size_t mask = t->cap - 1;
    for (size_t i = hash_key(parent, key) & mask;; i = (i + 1) & mask)
        if (!t->members[i] || (t->parents[i] == parent && strcmp(t->members[i]->string, key) == 0)) return i;
}

static const cJSON *key_find(const key_table *t, const cJSON *parent, const char *key) {
    return t->cap ? t->members[key_index(t, parent, key)] : NULL;
}

static void key_insert(key_table *t, const cJSON *parent, const cJSON *member) {
    if (2 * (t->n + 1) > t->cap) {
        key_table old = *t;
        t->cap = old.cap ? 2 * old.cap : 64;
        t->members = ct_xcalloc(t->cap, sizeof *t->members);
        t->parents = ct_xcalloc(t->cap, sizeof *t->parents);
        for (size_t i = 0; i < old.cap; i++) {
            if (!old.members[i]) continue;
            size_t j = key_index(t, old.parents[i], old.members[i]->string);
            t->members[j] = old.members[i];
            t->parents[j] = old.parents[i];
        }
        free(old.members);
        free(old.parents);
    }
    size_t i = key_index(t, parent, member->string);
    t->members[i] = member;
    t->parents[i] = parent;
    t->n++;
}

/* ---- parser state ------------------------------------------------------------------------- */

enum { WARN_TRAILING_COMMA, WARN_MISSING_COMMA, WARN_COMMENT, WARN_KINDS };

typedef struct path_seg {
    const char *key; /* NULL for an array element */
    int index;
} path_seg;

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    int line;          /* line of s[pos], 1-based */
    size_t line_start; /* offset of the first byte of that line (col = pos - line_start + 1) */
    const char *file;
    ct_json_doc *doc;
    ct_warnings *warn;
    ct_err *err;
    bool failed;
    bool warned[WARN_KINDS];
    key_table keys;
    path_seg path[CT_JSON_MAX_DEPTH + 2];
    int depth;
    char *buf; /* scratch for decoding strings */
    size_t buf_len, buf_cap;
    locale_t c_locale; /* numbers are read the same whatever the process locale */
} parser;

static int cur(const parser *p) { return p->pos < p->len ? p->s[p->pos] : -1; }
static int peek(const parser *p, size_t ahead) {
    return p->len - p->pos > ahead ? p->s[p->pos + ahead] : -1;
}
static int col_of(const parser *p) { return (int)(p->pos - p->line_start + 1); }

static void newline(parser *p) {
    p->pos++;
    p->line++;
    p->line_start = p->pos;
}

/* Offset of line 1's first byte: a UTF-8 byte order mark is not part of the text. */
static size_t text_start(const parser *p) {
    return p->len >= 3 && p->s[0] == 0xEF && p->s[1] == 0xBB && p->s[2] == 0xBF ? 3 : 0;
}

/* Line and column of offset off (<= p->pos). Offsets on earlier lines are rare (messages only),
 * so they are found by rescanning. */
static void pos_of(const parser *p, size_t off, int *line, int *col) {
    if (off >= p->line_start) {
        *line = p->line;
        *col = (int)(off - p->line_start + 1);
        return;
    }
    int l = 1;
    size_t start = text_start(p);
    for (size_t i = start; i < off; i++)
        if (p->s[i] == '\n') l++, start = i + 1;
    *line = l;
    *col = off < start ? 1 : (int)(off - start + 1);
}

/* Printable form of a token or key for messages: escapes non-printable bytes, cuts long text. */
static void show_text(char *out, size_t n, const char *text, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (i == TOKEN_SHOW) {
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        if (c == '"' || c == '\\') o += (size_t)snprintf(out + o, n - o, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(out + o, n - o, "\\x%02X", c);
        else out[o++] = (char)c;
    }
    out[o] = '\0';
}

/* "zero_optimization.offload_param" or "model.layers[3]" for the value being parsed. */
static void path_text(const parser *p, char *out, size_t n) {
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < p->depth && o + 8 < n; i++) {
        char seg[SHOW_BUF];
        if (p->path[i].key) {
            show_text(seg, sizeof seg, p->path[i].key, strlen(p->path[i].key));
            o += (size_t)snprintf(out + o, n - o, "%s%s", o ? "." : "", seg);
        } else {
            o += (size_t)snprintf(out + o, n - o, "[%d]", p->path[i].index);
        }
        if (o >= n) o = n - 1;
    }
}

/* Record the first error: "FILE:L:C: [path: ]message". */
__attribute__((format(printf, 3, 4))) static void fail_at(parser *p, size_t off, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = true;
    char msg[1024], path[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    path_text(p, path, sizeof path);
    int line, col;
    pos_of(p, off, &line, &col);
    ct_errf(p->err, CT_ERR_CONFIG, "%s:%d:%d: %s%s%s", p->file, line, col, path, path[0] ? ": " : "", msg);
}

static void fail_oom(parser *p) {
    if (p->failed) return;
    p->failed = true;
    ct_errf(p->err, CT_ERR_RUNTIME, "%s: out of memory while reading the config", p->file);
}

static void warn_once(parser *p, int kind, size_t off, const char *what) {
    if (p->warned[kind]) return;
    p->warned[kind] = true;
    int line, col;
    pos_of(p, off, &line, &col);
    ct_warnf(p->warn, "%s:%d:%d: %s (accepted, as DeepSpeed does)", p->file, line, col, what);
}

/* ---- UTF-8 -------------------------------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s (at most avail bytes), 0 when ill-formed:
 * no overlong forms, no surrogates, nothing above U+10FFFF. Sets *cp to the code point. */
static size_t utf8_len(const unsigned char *s, size_t avail, uint32_t *cp) {
    unsigned c = s[0];
    size_t n;
    uint32_t v, min;
    if (c < 0x80) { *cp = c; return 1; }
    if (c >= 0xC2 && c <= 0xDF) n = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (avail < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

static void fail_utf8(parser *p, size_t off) {
    fail_at(p, off, "invalid UTF-8 at byte offset %zu (byte 0x%02X); save the file as UTF-8", off, p->s[off]);
}

/* Consume one well-formed UTF-8 character, or fail. */
static bool skip_utf8(parser *p) {
    uint32_t cp;
    size_t n = utf8_len(p->s + p->pos, p->len - p->pos, &cp);
    if (n == 0) {
        fail_utf8(p, p->pos);
        return false;
    }
    p->pos += n;
    return true;
}

/* ---- whitespace and comments -------------------------------------------------------------- */

static bool skip_line_comment(parser *p) {
    while (p->pos < p->len && p->s[p->pos] != '\n')
        if (!skip_utf8(p)) return false;
    return true;
}

static bool skip_block_comment(parser *p) {
    size_t open = p->pos;
    p->pos += 2;
    for (;;) {
        int c = cur(p);
        if (c < 0) {
            fail_at(p, open, "unterminated block comment: no closing */");
            return false;
        }
        if (c == '*' && peek(p, 1) == '/') {
            p->pos += 2;
            return true;
        }
        if (c == '\n') newline(p);
        else if (!skip_utf8(p)) return false;
    }
}

/* Skip whitespace and comments. Returns false on a malformed comment. */
static bool skip_ws(parser *p) {
    for (;;) {
        int c = cur(p);
        if (c == ' ' || c == '\t' || c == '\r') {
            p->pos++;
        } else if (c == '\n') {
            newline(p);
        } else if (c == '#' || (c == '/' && (peek(p, 1) == '/' || peek(p, 1) == '*'))) {
            warn_once(p, WARN_COMMENT, p->pos, "comment");
            bool ok = c == '/' && peek(p, 1) == '*' ? skip_block_comment(p) : skip_line_comment(p);
            if (!ok) return false;
        } else {
            return true;
        }
    }
}

/* ---- error text for an unexpected byte ---------------------------------------------------- */

/* Describe the character at off ("'x'", "U+201C", "end of file") for "expected ..., got ..." */
static void describe_at(parser *p, size_t off, char *out, size_t n) {
    if (off >= p->len) {
        snprintf(out, n, "end of file");
        return;
    }
    unsigned char c = p->s[off];
    uint32_t cp;
    if (c >= 0x20 && c < 0x7f) snprintf(out, n, "'%c'", c);
    else if (c < 0x80) snprintf(out, n, "byte 0x%02X", c);
    else if (utf8_len(p->s + off, p->len - off, &cp)) snprintf(out, n, "U+%04X", (unsigned)cp);
    else snprintf(out, n, "byte 0x%02X", c);
}

/* Fail on a byte that cannot start what was expected, with the most useful explanation. */
static void fail_unexpected(parser *p, const char *expected) {
    size_t off = p->pos;
    char got[32];
    uint32_t cp = 0;
    int c = cur(p);
    if (c >= 0x80 && utf8_len(p->s + off, p->len - off, &cp) == 0) {
        fail_utf8(p, off);
    } else if (c == 0) {
        fail_at(p, off, "unexpected NUL byte at byte offset %zu (is the file UTF-16 or binary? save it as UTF-8 "
                        "text)", off);
    } else if (cp == 0x201C || cp == 0x201D || cp == 0x2018 || cp == 0x2019) {
        fail_at(p, off, "typographic quote U+%04X: JSON needs straight double quotes \"", (unsigned)cp);
    } else {
        describe_at(p, off, got, sizeof got);
        fail_at(p, off, "expected %s, got %s", expected, got);
    }
}

/* ---- strings ------------------------------------------------------------------------------ */

static void buf_put(parser *p, const void *bytes, size_t n) {
    if (p->buf_len + n + 1 > p->buf_cap) {
        p->buf_cap = 2 * (p->buf_len + n + 1) + 64;
        p->buf = ct_xrealloc(p->buf, p->buf_cap);
    }
    memcpy(p->buf + p->buf_len, bytes, n);
    p->buf_len += n;
}

static void buf_put_cp(parser *p, uint32_t cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (unsigned char)cp, n = 1;
    else if (cp < 0x800) u[0] = (unsigned char)(0xC0 | (cp >> 6)), u[1] = (unsigned char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000) {
        u[0] = (unsigned char)(0xE0 | (cp >> 12));
        u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (unsigned char)(0xF0 | (cp >> 18));
        u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    buf_put(p, u, n);
}

/* Four hex digits at s[at..at+3] (bounds checked), or -1. */
static long hex4(const parser *p, size_t at) {
    if (p->len < 4 || at > p->len - 4) return -1;
    long v = 0;
    for (size_t i = 0; i < 4; i++) {
        int c = p->s[at + i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    return v;
}

/* \uXXXX at p->pos (pointing at the backslash), including a surrogate pair. */
static bool parse_u_escape(parser *p) {
    size_t at = p->pos;
    long hi = hex4(p, at + 2);
    if (hi < 0) {
        fail_at(p, at, "invalid \\u escape: expected 4 hex digits after \\u");
        return false;
    }
    p->pos += 6;
    uint32_t cp = (uint32_t)hi;
    if (hi >= 0xDC00 && hi <= 0xDFFF) {
        fail_at(p, at, "lone low surrogate \\u%04lX in string (it must follow a high surrogate \\uD800-\\uDBFF)", hi);
        return false;
    }
    if (hi >= 0xD800 && hi <= 0xDBFF) {
        long lo = cur(p) == '\\' && peek(p, 1) == 'u' ? hex4(p, p->pos + 2) : -1;
        if (lo < 0xDC00 || lo > 0xDFFF) {
            fail_at(p, at, "lone high surrogate \\u%04lX in string (it must be followed by a low surrogate "
                           "\\uDC00-\\uDFFF)", hi);
            return false;
        }
        p->pos += 6;
        cp = 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
    }
    if (cp == 0) {
        fail_at(p, at, "\\u0000 (NUL) is not supported in config strings");
        return false;
    }
    buf_put_cp(p, cp);
    return true;
}

static bool parse_escape(parser *p) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    int c = peek(p, 1);
    if (c == 'u') return parse_u_escape(p);
    if (c < 0) {
        fail_at(p, p->pos, "unterminated string: the file ends after a backslash");
        return false;
    }
    const char *hit = c > 0 ? strchr(from, c) : NULL;
    if (!hit) {
        char got[32];
        describe_at(p, p->pos + 1, got, sizeof got);
        fail_at(p, p->pos, "invalid escape: backslash followed by %s; valid escapes are \\\" \\\\ \\/ \\b \\f \\n "
                           "\\r \\t \\uXXXX", got);
        return false;
    }
    buf_put(p, &to[hit - from], 1);
    p->pos += 2;
    return true;
}

/* Decode the string at p->pos (an opening quote) into p->buf (NUL-terminated). */
static bool parse_string_raw(parser *p) {
    size_t open = p->pos;
    p->buf_len = 0;
    p->pos++;
    for (;;) {
        int c = cur(p);
        if (c < 0) {
            fail_at(p, open, "unterminated string: no closing quote before the end of the file");
            return false;
        }
        if (c == '"') break;
        if (c == '\\') {
            if (!parse_escape(p)) return false;
        } else if (c == '\n') {
            fail_at(p, open, "unterminated string: the line ends before the closing quote");
            return false;
        } else if (c < 0x20) {
            fail_at(p, p->pos, "control character 0x%02X inside a string; write it as an escape such as \\t or "
                               "\\u%04X", c, c);
            return false;
        } else {
            size_t start = p->pos;
            if (!skip_utf8(p)) return false;
            buf_put(p, p->s + start, p->pos - start);
        }
    }
    p->pos++;
    buf_put(p, "", 1);
    p->buf_len--;
    return true;
}

/* ---- numbers and words -------------------------------------------------------------------- */

static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_word_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' || c == '$' || c == '.' ||
           c == '-';
}

/* End offset of the word starting at off (letters, digits, _ $ . -, and ${...}). */
static size_t word_end(const parser *p, size_t off) {
    size_t e = off;
    while (e < p->len && is_word_char(p->s[e])) {
        if (p->s[e] == '$' && e + 1 < p->len && p->s[e + 1] == '{') { /* ${VAR} */
            size_t f = e + 2;
            while (f < p->len && f - e < 64 && p->s[f] != '}' && p->s[f] != '\n') f++;
            if (f < p->len && p->s[f] == '}') {
                e = f + 1;
                continue;
            }
        }
        e++;
    }
    return e;
}

static size_t skip_digits(const parser *p, size_t at) {
    while (at < p->len && is_digit(p->s[at])) at++;
    return at;
}

static void fail_number(parser *p, size_t start, size_t end, const char *why) {
    char tok[SHOW_BUF];
    size_t e = word_end(p, end);
    show_text(tok, sizeof tok, (const char *)p->s + start, e - start);
    fail_at(p, start, "invalid number %s: %s", tok, why);
}

/* A number per RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static cJSON *parse_number(parser *p) {
    size_t start = p->pos, at = start;
    if (at < p->len && p->s[at] == '-') at++;
    if (at >= p->len || !is_digit(p->s[at])) {
        fail_number(p, start, at, "expected a digit after '-'");
        return NULL;
    }
    if (p->s[at] == '0' && at + 1 < p->len && is_digit(p->s[at + 1])) {
        fail_number(p, start, at, "leading zeros are not allowed");
        return NULL;
    }
    at = skip_digits(p, at);
    if (at < p->len && p->s[at] == '.') {
        if (at + 1 >= p->len || !is_digit(p->s[at + 1])) {
            fail_number(p, start, at, "expected a digit after '.'");
            return NULL;
        }
        at = skip_digits(p, at + 1);
    }
    if (at < p->len && (p->s[at] == 'e' || p->s[at] == 'E')) {
        size_t e = at + 1;
        if (e < p->len && (p->s[e] == '+' || p->s[e] == '-')) e++;
        if (e >= p->len || !is_digit(p->s[e])) {
            fail_number(p, start, at, "expected digits in the exponent");
            return NULL;
        }
        at = skip_digits(p, e);
    }
    if (at < p->len && is_word_char(p->s[at])) {
        fail_number(p, start, at, "unexpected characters after the number");
        return NULL;
    }
    size_t n = at - start;
    char small[64];
    char *text = n < sizeof small ? small : ct_xmalloc(n + 1);
    memcpy(text, p->s + start, n);
    text[n] = '\0';
    double v = strtod_l(text, NULL, p->c_locale);
    if (text != small) free(text);
    if (isinf(v)) {
        char tok[SHOW_BUF];
        show_text(tok, sizeof tok, (const char *)p->s + start, n);
        fail_at(p, start, "number out of range: %s does not fit in a double (largest is about 1.8e308)", tok);
        return NULL;
    }
    p->pos = at;
    cJSON *node = cJSON_CreateNumber(v);
    if (!node) fail_oom(p);
    return node;
}

static bool word_is(const char *w, size_t n, const char *lit) { return strlen(lit) == n && memcmp(w, lit, n) == 0; }

/* An unquoted word that names a shell/sed template variable: GBSIZE, CL_1st_MIN, $X, ${X}. */
static bool looks_like_placeholder(const char *w, size_t n) {
    bool upper = false, lower = false, underscore = false;
    for (size_t i = 0; i < n; i++) {
        upper |= w[i] >= 'A' && w[i] <= 'Z';
        lower |= w[i] >= 'a' && w[i] <= 'z';
        underscore |= w[i] == '_';
    }
    return w[0] == '$' || (upper && (!lower || underscore));
}

/* Offset just past the string, comment or single byte at i, counting the newlines it crosses. */
static size_t lex_skip(const parser *p, size_t i, int *line, size_t *line_start) {
    const unsigned char *s = p->s;
    size_t len = p->len;
    if (s[i] == '"') {
        for (i++; i < len && s[i] != '"' && s[i] != '\n'; i++)
            if (s[i] == '\\' && i + 1 < len && s[i + 1] != '\n') i++;
        return i < len && s[i] == '"' ? i + 1 : i;
    }
    if (s[i] == '#' || (s[i] == '/' && i + 1 < len && s[i + 1] == '/')) {
        while (i < len && s[i] != '\n') i++;
        return i;
    }
    if (s[i] == '/' && i + 1 < len && s[i + 1] == '*') {
        for (i += 2; i < len && !(s[i] == '*' && i + 1 < len && s[i + 1] == '/'); i++)
            if (s[i] == '\n') ++*line, *line_start = i + 1;
        return i < len ? i + 2 : i;
    }
    if (s[i] == '\n') ++*line, *line_start = i + 1;
    return i + 1;
}

/* After a placeholder error, name the other placeholders further on, so that a template (a file
 * a launch script fills in with sed) is recognised as one at once. */
static void list_more_placeholders(parser *p, size_t from) {
    enum { SHOWN = 4 };
    int line = p->line, count = 0;
    size_t line_start = p->line_start, o = 0;
    char names[SHOWN * (SHOW_BUF + 32)];
    names[0] = '\0';
    for (size_t i = from; i < p->len;) {
        int c = p->s[i];
        bool word_start = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == '$';
        if (!word_start || is_word_char(p->s[i - 1])) {
            i = lex_skip(p, i, &line, &line_start);
            continue;
        }
        size_t e = word_end(p, i);
        const char *w = (const char *)p->s + i;
        if (looks_like_placeholder(w, e - i) && ++count <= SHOWN) {
            char tok[SHOW_BUF];
            show_text(tok, sizeof tok, w, e - i);
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s (%d:%d)", o ? ", " : "", tok, line,
                                  (int)(i - line_start + 1));
            if (o >= sizeof names) o = sizeof names - 1;
        }
        i = e;
    }
    if (count > 0)
        ct_err_append(p->err, "  %d more placeholder%s follow%s: %s%s; this file is a template that a launch script "
                              "fills in", count, count > 1 ? "s" : "", count > 1 ? "" : "s", names,
                      count > SHOWN ? ", ..." : "");
}

static void fail_word(parser *p, const char *w, size_t n) {
    static const char *const nonfinite[] = {"NaN", "nan", "Infinity", "infinity", "inf", "Inf", "-Infinity",
                                            "-inf", "-Inf", "-infinity", "-NaN", "-nan"};
    static const char *const literal[][2] = {{"True", "true"},   {"TRUE", "true"},   {"False", "false"},
                                             {"FALSE", "false"}, {"None", "null"},   {"NULL", "null"},
                                             {"Null", "null"},   {"nil", "null"},    {"undefined", "null"}};
    char tok[SHOW_BUF];
    show_text(tok, sizeof tok, w, n);
    for (int i = 0; i < CT_ARRAY_LEN(nonfinite); i++)
        if (word_is(w, n, nonfinite[i])) {
            fail_at(p, p->pos, "%s is not a JSON number; use a finite number", tok);
            return;
        }
    for (int i = 0; i < CT_ARRAY_LEN(literal); i++)
        if (word_is(w, n, literal[i][0])) {
            fail_at(p, p->pos, "unquoted word %s: JSON literals are lowercase; write %s", tok, literal[i][1]);
            return;
        }
    if (looks_like_placeholder(w, n)) {
        fail_at(p, p->pos, "unquoted word %s: looks like a template placeholder; replace it with a value", tok);
        list_more_placeholders(p, (size_t)(w - (const char *)p->s) + n);
    } else
        fail_at(p, p->pos, "unquoted word %s: strings must be in double quotes (\"%s\")", tok, tok);
}

/* true, false, null, or an error naming the word. */
static cJSON *parse_word(parser *p) {
    size_t e = word_end(p, p->pos);
    const char *w = (const char *)p->s + p->pos;
    size_t n = e - p->pos;
    cJSON *node = NULL;
    if (word_is(w, n, "true")) node = cJSON_CreateTrue();
    else if (word_is(w, n, "false")) node = cJSON_CreateFalse();
    else if (word_is(w, n, "null")) node = cJSON_CreateNull();
    else {
        fail_word(p, w, n);
        return NULL;
    }
    if (!node) fail_oom(p);
    else p->pos = e;
    return node;
}

/* ---- values, arrays, objects -------------------------------------------------------------- */

static cJSON *parse_value(parser *p, int depth);

static void record(parser *p, const cJSON *node, int kline, int kcol, int vline, int vcol) {
    pos_entry *e = pos_get(p->doc, node);
    e->line = kline;
    e->col = kcol;
    e->vline = vline;
    e->vcol = vcol;
}

/* Could the byte at p->pos start a value? (used to accept a newline in place of a comma) */
static bool starts_value(const parser *p) {
    int c = cur(p);
    return c == '"' || c == '{' || c == '[' || c == '-' || is_digit(c) || c == 't' || c == 'f' || c == 'n';
}

/* Fail where an object key was expected but p->pos is not a '"'. */
static void fail_key(parser *p) {
    int c = cur(p);
    if (c >= 0 && is_word_char(c) && c != '.' && c != '-') {
        char tok[SHOW_BUF];
        size_t e = word_end(p, p->pos);
        show_text(tok, sizeof tok, (const char *)p->s + p->pos, e - p->pos);
        fail_at(p, p->pos, "unquoted key %s: object keys must be in double quotes (\"%s\")", tok, tok);
    } else if (c == '\'') {
        fail_at(p, p->pos, "single-quoted key: JSON strings use double quotes");
    } else {
        fail_unexpected(p, "a key in double quotes");
    }
}

/* Fail after item (member or element `index`) of the container opened at `open`. Kept out of
 * after_item so the recursion's stack frames stay small. */
__attribute__((noinline)) static void fail_after_item(parser *p, int closer, size_t open, const cJSON *item,
                                                      int index) {
    char expected[SHOW_BUF + 64];
    bool is_obj = closer == '}';
    if (cur(p) < 0) {
        int ol, oc;
        pos_of(p, open, &ol, &oc);
        snprintf(expected, sizeof expected, "',' or '%c' (the %s opened at %d:%d is not closed)", closer,
                 is_obj ? "object" : "array", ol, oc);
    } else if (is_obj) {
        char key[SHOW_BUF];
        show_text(key, sizeof key, item->string, strlen(item->string));
        snprintf(expected, sizeof expected, "',' or '}' after member \"%s\"", key);
    } else {
        snprintf(expected, sizeof expected, "',' or ']' after element [%d]", index);
    }
    fail_unexpected(p, expected);
}

/* After an element or member: ',' or the closer, Hjson's trailing comma / newline separator.
 * Returns 1 when another item follows, 0 at the closer (consumed), -1 on error. */
static int after_item(parser *p, int closer, size_t open, const cJSON *item, int index) {
    size_t value_end = p->pos;
    int line_before = p->line;
    if (!skip_ws(p)) return -1;
    int c = cur(p);
    if (c == ',') {
        size_t comma = p->pos;
        p->pos++;
        if (!skip_ws(p)) return -1;
        if (cur(p) == closer) {
            warn_once(p, WARN_TRAILING_COMMA, comma, "trailing comma");
            p->pos++;
            return 0;
        }
        return 1;
    }
    if (c == closer) {
        p->pos++;
        return 0;
    }
    bool is_obj = closer == '}';
    if (p->line > line_before && (is_obj ? c == '"' : starts_value(p))) {
        warn_once(p, WARN_MISSING_COMMA, value_end,
                  is_obj ? "missing comma between members; a newline separates them"
                         : "missing comma between elements; a newline separates them");
        return 1;
    }
    if (p->line > line_before && c >= 'A' && is_word_char(c)) { /* Hjson's quoteless key or value */
        if (is_obj) fail_key(p);
        else fail_word(p, (const char *)p->s + p->pos, word_end(p, p->pos) - p->pos);
        return -1;
    }
    fail_after_item(p, closer, open, item, index);
    return -1;
}

static bool check_depth(parser *p, int depth) {
    if (depth <= CT_JSON_MAX_DEPTH) return true;
    fail_at(p, p->pos, "nesting deeper than %d levels", CT_JSON_MAX_DEPTH);
    return false;
}

static cJSON *parse_array(parser *p, int depth) {
    if (!check_depth(p, depth)) return NULL;
    size_t open = p->pos;
    cJSON *arr = cJSON_CreateArray();
    if (!arr) {
        fail_oom(p);
        return NULL;
    }
    p->pos++;
    if (!skip_ws(p)) goto fail;
    if (cur(p) == ']') {
        p->pos++;
        return arr;
    }
    for (int i = 0;; i++) {
        int vline = p->line, vcol = col_of(p);
        p->path[p->depth++] = (path_seg){.key = NULL, .index = i};
        cJSON *item = parse_value(p, depth + 1);
        p->depth--;
        if (!item) goto fail;
        if (!cJSON_AddItemToArray(arr, item)) {
            cJSON_Delete(item);
            fail_oom(p);
            goto fail;
        }
        record(p, item, vline, vcol, vline, vcol);
        int more = after_item(p, ']', open, item, i);
        if (more < 0) goto fail;
        if (more == 0) return arr;
    }
fail:
    cJSON_Delete(arr);
    return NULL;
}

__attribute__((noinline)) static void fail_colon(parser *p, const char *key) {
    char shown[SHOW_BUF], expected[SHOW_BUF + 32];
    show_text(shown, sizeof shown, key, strlen(key));
    snprintf(expected, sizeof expected, "':' after key \"%s\"", shown);
    fail_unexpected(p, expected);
}

__attribute__((noinline)) static void fail_duplicate(parser *p, size_t key_off, const cJSON *first) {
    char key[SHOW_BUF];
    show_text(key, sizeof key, p->buf, p->buf_len);
    const pos_entry *e = pos_find(p->doc, first);
    fail_at(p, key_off, "duplicate key \"%s\" (first at %d:%d)", key, e ? e->line : 0, e ? e->col : 0);
}

/* One "key": value member of obj; returns the member or NULL on error. */
static cJSON *parse_member(parser *p, cJSON *obj, int depth) {
    if (cur(p) != '"') {
        fail_key(p);
        return NULL;
    }
    size_t key_off = p->pos;
    int kline = p->line, kcol = col_of(p);
    if (!parse_string_raw(p)) return NULL;
    const cJSON *first = key_find(&p->keys, obj, p->buf);
    if (first) {
        fail_duplicate(p, key_off, first);
        return NULL;
    }
    char *key = ct_xstrdup(p->buf);
    if (!skip_ws(p)) goto fail;
    if (cur(p) != ':') {
        fail_colon(p, key);
        goto fail;
    }
    p->pos++;
    if (!skip_ws(p)) goto fail;
    int vline = p->line, vcol = col_of(p);
    p->path[p->depth++] = (path_seg){.key = key, .index = 0};
    cJSON *val = parse_value(p, depth + 1);
    p->depth--;
    if (!val) goto fail;
    if (!cJSON_AddItemToObject(obj, key, val)) {
        cJSON_Delete(val);
        fail_oom(p);
        goto fail;
    }
    free(key);
    record(p, val, kline, kcol, vline, vcol);
    key_insert(&p->keys, obj, val);
    return val;
fail:
    free(key);
    return NULL;
}

static cJSON *parse_object(parser *p, int depth) {
    if (!check_depth(p, depth)) return NULL;
    size_t open = p->pos;
    cJSON *obj = cJSON_CreateObject();
    if (!obj) {
        fail_oom(p);
        return NULL;
    }
    p->pos++;
    if (!skip_ws(p)) goto fail;
    if (cur(p) == '}') {
        p->pos++;
        return obj;
    }
    for (;;) {
        cJSON *member = parse_member(p, obj, depth);
        if (!member) goto fail;
        int more = after_item(p, '}', open, member, 0);
        if (more < 0) goto fail;
        if (more == 0) return obj;
    }
fail:
    cJSON_Delete(obj);
    return NULL;
}

static cJSON *parse_value(parser *p, int depth) {
    int c = cur(p);
    if (c == '{') return parse_object(p, depth);
    if (c == '[') return parse_array(p, depth);
    if (c == '-' || is_digit(c)) {
        size_t e = word_end(p, p->pos);
        if (c == '-' && p->pos + 1 < p->len && !is_digit(p->s[p->pos + 1]) && e > p->pos + 1) {
            fail_word(p, (const char *)p->s + p->pos, e - p->pos); /* -Infinity, -NaN */
            return NULL;
        }
        return parse_number(p);
    }
    if (c == '"') {
        if (!parse_string_raw(p)) return NULL;
        cJSON *node = cJSON_CreateString(p->buf);
        if (!node) fail_oom(p);
        return node;
    }
    if (c == '.' && is_digit(peek(p, 1))) {
        fail_number(p, p->pos, p->pos + 1, "JSON numbers need a digit before '.' (write 0.5, not .5)");
        return NULL;
    }
    if (c >= 0 && is_word_char(c)) return parse_word(p); /* letters, '_', '$', '.' */
    if (c == '+') {
        fail_number(p, p->pos, p->pos + 1, "JSON numbers cannot start with '+'");
    } else if (c == '\'') {
        fail_at(p, p->pos, "single-quoted string: JSON strings use double quotes");
    } else if (c < 0) {
        fail_at(p, p->pos, "unexpected end of file: expected a value");
    } else {
        fail_unexpected(p, "a value");
    }
    return NULL;
}

/* ---- public API --------------------------------------------------------------------------- */

static ct_json_doc *doc_new(const char *filename) {
    ct_json_doc *doc = ct_xcalloc(1, sizeof *doc);
    doc->filename = ct_xstrdup(filename ? filename : "<config>");
    return doc;
}

/* Parse the whole buffer; p->doc receives the root. */
static void parse_document(parser *p) {
    if (p->len >= 2 && ((p->s[0] == 0xFF && p->s[1] == 0xFE) || (p->s[0] == 0xFE && p->s[1] == 0xFF))) {
        fail_at(p, 0, "the file is UTF-16 encoded (byte order mark 0x%02X 0x%02X); save it as UTF-8", p->s[0],
                p->s[1]);
        return;
    }
    p->pos = p->line_start = text_start(p); /* a UTF-8 byte order mark is accepted silently */
    if (!skip_ws(p)) return;
    if (cur(p) < 0) {
        fail_at(p, 0, "empty file: expected a JSON object");
        return;
    }
    int vline = p->line, vcol = col_of(p);
    cJSON *root = parse_value(p, 1);
    if (!root) return;
    p->doc->root = root;
    record(p, root, vline, vcol, vline, vcol);
    if (!skip_ws(p)) return;
    if (cur(p) >= 0) {
        char expected[64];
        snprintf(expected, sizeof expected, "end of file after the value that starts at %d:%d", vline, vcol);
        fail_unexpected(p, expected);
    }
}

ct_json_doc *ct_json_parse(const char *text, size_t len, const char *filename, ct_warnings *warn, ct_err *err) {
    ct_json_doc *doc = doc_new(filename);
    parser p = {.s = (const unsigned char *)(text ? text : ""), .len = text ? len : 0, .line = 1,
                .file = doc->filename, .doc = doc, .warn = warn, .err = err};
    p.c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!p.c_locale) fail_oom(&p);
    else parse_document(&p);
    if (p.c_locale) freelocale(p.c_locale);
    free(p.buf);
    free(p.keys.members);
    free(p.keys.parents);
    if (p.failed) {
        ct_json_free(doc);
        return NULL;
    }
    return doc;
}

/* Read all of f (any kind of file, pipes included), failing above the size cap. */
static int read_all(FILE *f, const char *path, char **out, size_t *out_len, ct_err *err) {
    const size_t limit = (size_t)CT_JSON_MAX_FILE + 1; /* one byte more tells "too large" */
    size_t cap = 1 << 16, n = 0;
    char *data = ct_xmalloc(cap);
    while (n < limit) {
        if (n == cap) {
            cap = 2 * cap < limit ? 2 * cap : limit;
            data = ct_xrealloc(data, cap);
        }
        size_t got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        int e = errno;
        free(data);
        return ct_errf(err, ct_err_io(e, CT_ERR_CONFIG), "cannot read %s: %s", path, strerror(e ? e : EIO));
    }
    if (n > CT_JSON_MAX_FILE) {
        free(data);
        return ct_errf(err, CT_ERR_CONFIG, "%s: file is larger than %u MiB; that is not a config file", path,
                       CT_JSON_MAX_FILE >> 20);
    }
    *out = data;
    *out_len = n;
    return CT_OK;
}

ct_json_doc *ct_json_parse_file(const char *path, ct_warnings *warn, ct_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ct_errf(err, ct_err_io(errno, CT_ERR_CONFIG), "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    char *data = NULL;
    size_t len = 0;
    errno = 0;
    int rc = read_all(f, path, &data, &len, err);
    fclose(f);
    if (rc != CT_OK) return NULL;
    ct_json_doc *doc = ct_json_parse(data, len, path, warn, err);
    free(data);
    return doc;
}

cJSON *ct_json_root(const ct_json_doc *doc) { return doc ? doc->root : NULL; }

const char *ct_json_filename(const ct_json_doc *doc) { return doc ? doc->filename : NULL; }

bool ct_json_pos(const ct_json_doc *doc, const cJSON *node, int *line, int *col) {
    const pos_entry *e = pos_find(doc, node);
    bool known = e && e->line > 0;
    if (line) *line = known ? e->line : 0;
    if (col) *col = known ? e->col : 0;
    return known;
}

bool ct_json_value_pos(const ct_json_doc *doc, const cJSON *node, int *line, int *col) {
    const pos_entry *e = pos_find(doc, node);
    bool known = e && e->vline > 0;
    if (line) *line = known ? e->vline : 0;
    if (col) *col = known ? e->vcol : 0;
    return known;
}

void ct_json_set_origin(ct_json_doc *doc, const cJSON *node, const char *origin) {
    if (!doc || !node) return;
    pos_entry *e = pos_get(doc, node);
    free(e->origin);
    e->origin = origin ? ct_xstrdup(origin) : NULL;
}

const char *ct_json_origin(const ct_json_doc *doc, const cJSON *node) {
    const pos_entry *e = pos_find(doc, node);
    return e ? e->origin : NULL;
}

void ct_json_forget(ct_json_doc *doc, const cJSON *node) {
    if (!doc || !node) return;
    for (const cJSON *c = node->child; c; c = c->next) ct_json_forget(doc, c);
    pos_entry *e = (pos_entry *)pos_find(doc, node);
    if (!e) return;
    free(e->origin);
    e->origin = NULL;
    e->node = NULL; /* the slot stays occupied; lookups skip it and the next grow drops it */
}

const char *ct_json_where(const ct_json_doc *doc, const cJSON *node, char *buf, size_t n) {
    if (!buf || n == 0) return "";
    const pos_entry *e = pos_find(doc, node);
    const char *file = doc ? doc->filename : "<config>";
    if (e && e->origin) snprintf(buf, n, "%s", e->origin);
    else if (e && e->line > 0) snprintf(buf, n, "%s:%d:%d", file, e->line, e->col);
    else snprintf(buf, n, "%s", file);
    return buf;
}

void ct_json_free(ct_json_doc *doc) {
    if (!doc) return;
    cJSON_Delete(doc->root);
    for (size_t i = 0; i < doc->n_ents; i++) free(doc->ents[i].origin);
    free(doc->ents);
    free(doc->slots);
    free(doc->filename);
    free(doc);
}
