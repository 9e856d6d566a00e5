/* common.h: status codes, error messages and the warning list shared by every module.
 *
 * Functions that can fail on user input return a status (CT_OK or one of the exit codes below)
 * and fill a ct_err; only cmd/ctrain.c decides to print and exit. */
#ifndef CT_COMMON_H
#define CT_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef CT_VERSION
#define CT_VERSION "0.0.0"
#endif

/* cuda/ includes this header from C++ and resolves these symbols from the executable (the CUDA
 * library is dlopen'ed), so they keep C linkage there. */
#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes, documented in README.md and the man page. */
enum {
    CT_OK = 0,
    CT_ERR_RUNTIME = 1,   /* internal or system failure (I/O, out of memory, CUDA) */
    CT_ERR_CONFIG = 2,    /* usage or configuration error */
    CT_ERR_DATA = 3,      /* unreadable or corrupt data / checkpoint */
    CT_ERR_DIVERGED = 4,  /* NaN loss, loss scale at its minimum */
    /* Stopped by a signal after saving: 128 + the signal's number, the shells' convention. */
    CT_EXIT_SIGHUP = 129,
    CT_EXIT_SIGINT = 130,
    CT_EXIT_SIGTERM = 143,
};

#define CT_ERR_MSG 2048
typedef struct ct_err {
    int code;             /* CT_OK when no error */
    char msg[CT_ERR_MSG]; /* one or more lines, no trailing newline, no "ctrain: error:" prefix */
} ct_err;

/* Set err (if not NULL) and return code. printf-style. */
int ct_errf(ct_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The exit code for an input that could not be opened or read with errno e: CT_ERR_RUNTIME when
 * e is about the process, not the file (EMFILE and ENFILE: ulimit -n; ENOMEM; EAGAIN; ENOBUFS),
 * which a retry with more resources fixes; else `otherwise`, the input's own code (CT_ERR_DATA for
 * data and checkpoints, CT_ERR_CONFIG for config files). */
int ct_err_io(int e, int otherwise);
/* Append a line ("\n" + text) to an existing message. */
void ct_err_append(ct_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Warnings collected while loading a config or building a model; the CLI prints each once. */
typedef struct ct_warnings {
    char **items;
    int n, cap;
} ct_warnings;
void ct_warnf(ct_warnings *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ct_warnings_free(ct_warnings *w);

/* Internal failures that no caller can handle (host memory exhausted, a CUDA call failing inside an
 * op that returns void) end in ct_fatal: library code never calls exit(). ct_fatal formats the
 * message and calls the installed handler, which may end the process its own way (cmd/ctrain.c
 * prints "ctrain: error: <msg>" and exits CT_ERR_RUNTIME) or longjmp out (tests). Without a
 * handler, or when the handler returns, it prints "ctrain: fatal: <msg>" to stderr and aborts.
 * Install the handler before starting threads; msg is only valid during the call. */
typedef void (*ct_fatal_fn)(void *ctx, const char *msg);
void ct_set_fatal_handler(ct_fatal_fn fn, void *ctx);
void ct_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* Checked allocation for internal buffers: ct_fatal with file:line on failure (not user input). */
void *ct_xmalloc_at(size_t n, const char *file, int line);
void *ct_xcalloc_at(size_t n, size_t sz, const char *file, int line);
void *ct_xrealloc_at(void *p, size_t n, const char *file, int line);
char *ct_xstrdup_at(const char *s, const char *file, int line);
/* Allocation whose size comes from input (a data file's header, a record's length, the number of
 * samples): NULL and CT_ERR_RUNTIME "out of host memory: N bytes (X.X GiB) for WHAT" in err instead
 * of ending the process, so the caller's message names the file and the run writes its summary. */
void *ct_try_malloc(size_t n, const char *what, ct_err *err);
void *ct_try_calloc(size_t n, size_t size, const char *what, ct_err *err);
void *ct_try_realloc(void *p, size_t n, const char *what, ct_err *err);   /* p kept on failure */

/* ct_fatal naming the size and the place: host memory ran out. */
void ct_die_oom_at(size_t n, const char *file, int line) __attribute__((noreturn));
#define ct_die_oom(n) ct_die_oom_at((n), __FILE__, __LINE__)
#define ct_xmalloc(n) ct_xmalloc_at((n), __FILE__, __LINE__)
#define ct_xcalloc(n, sz) ct_xcalloc_at((n), (sz), __FILE__, __LINE__)
#define ct_xrealloc(p, n) ct_xrealloc_at((p), (n), __FILE__, __LINE__)
#define ct_xstrdup(s) ct_xstrdup_at((s), __FILE__, __LINE__)

/* A command-line option with a value, "--name VALUE" or "--name=VALUE": returns the value ("" when
 * it is missing), or NULL when argv[*i] is not this option. Advances *i past a separate value. */
const char *ct_cli_option_value(int argc, char **argv, int *i, const char *name);

/* Text from outside ctrain (names read from data files, paths, messages quoting them) made safe to
 * print on a terminal: every byte that is not printable ASCII or part of a valid UTF-8 character
 * other than a control (ESC and the other C0 controls, DEL, the C1 controls U+0080..U+009F,
 * invalid or overlong UTF-8) becomes "\xNN", so a name cannot move the cursor, recolour the
 * terminal or forge a line of its own. s: len bytes (NUL bytes included). CT_PRINT_LINES keeps
 * '\n' and '\t' (a multi-line message); without it they are escaped too (a name). out receives at
 * most n bytes with the NUL, cut at a whole escape or character, "..." marking a cut; returns out. */
enum { CT_PRINT_NAME = 0, CT_PRINT_LINES = 1 };
char *ct_printable(char *out, size_t n, const char *s, size_t len, int flags);
/* ct_printable of a NUL-terminated string, as a name (CT_PRINT_NAME). */
#define ct_printable_name(out, n, s) ct_printable((out), (n), (s), strlen(s), CT_PRINT_NAME)
/* prefix, then s as ct_printable(CT_PRINT_LINES) writes it however long, then '\n', in ONE write: how
 * messages that may quote names from files (errors, warnings, report lines) reach the terminal. One
 * write, because stderr is unbuffered and the ranks of a job share it: written piece by piece, two
 * ranks' errors interleave character by character. */
void ct_fputs_printable_line(const char *prefix, const char *s, FILE *f);

/* Monotonic seconds. */
double ct_now(void);

/* Edit distance for "did you mean" suggestions (Damerau-Levenshtein, optimal string alignment). */
int ct_edit_distance(const char *a, const char *b);
/* Closest of `n` candidates to `word`, or NULL when none is close enough to suggest. */
const char *ct_suggest(const char *word, const char *const *candidates, int n);

#define CT_ARRAY_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

#ifdef __cplusplus
}
#endif

#endif
