/* json.h: JSON reader with source positions, for config files.
 *
 * Builds a cJSON tree (so the rest of ctrain uses cJSON's API) and remembers where every value
 * and every object key came from (line:column, 1-based), so errors can point into the file.
 * Accepts strict JSON (RFC 8259) plus the Hjson forms found in real DeepSpeed files:
 *   - trailing commas before } or ]
 *   - a newline in place of a comma between members/elements
 *   - comments: // to end of line, # to end of line, block comments
 * Each accepted non-strict form is reported once as a warning "FILE:LINE:COL: <what> (accepted, as
 * DeepSpeed does)". Rejected, with FILE:LINE:COL and exit code CT_ERR_CONFIG:
 *   - duplicate keys at any level ("duplicate key \"k\" (first at L:C)")
 *   - unquoted words (template placeholders such as GBSIZE): "unquoted word GBSIZE ... looks like a
 *     template placeholder; replace it with a value"
 *   - invalid UTF-8, control characters in strings, bad escapes, lone surrogates
 *   - nesting deeper than CT_JSON_MAX_DEPTH
 *   - numbers that overflow a double (1e999) and NaN/Infinity literals
 *   - anything else that is not JSON, with what was expected.
 * Errors inside a value also name its JSON path ("FILE:3:22: zero_optimization.stage: ...").
 * Not accepted although Hjson has them: quoteless keys and strings, single quotes, ''' strings;
 * "\u0000" is rejected too (cJSON strings end at NUL). A UTF-8 byte order mark is skipped; UTF-16
 * is an error. Columns count bytes (a tab is one column). Files are capped at 64 MiB.
 * Never crashes or reads out of bounds on any input (fuzzed: test/fuzz/fuzz_json.c). */
#ifndef CT_JSON_H
#define CT_JSON_H

#include <cjson/cJSON.h>

#include "core/util/common.h"

#define CT_JSON_MAX_DEPTH 64

typedef struct ct_json_doc ct_json_doc;

/* Parse `len` bytes of `text` (need not be NUL-terminated). `filename` is used in messages.
 * Returns NULL and fills err on failure. Warnings for accepted Hjson forms go to `warn`. */
ct_json_doc *ct_json_parse(const char *text, size_t len, const char *filename, ct_warnings *warn,
                           ct_err *err);
/* Read and parse a file. A missing or unreadable file is CT_ERR_CONFIG naming the path. */
ct_json_doc *ct_json_parse_file(const char *path, ct_warnings *warn, ct_err *err);

cJSON *ct_json_root(const ct_json_doc *doc);
const char *ct_json_filename(const ct_json_doc *doc);

/* Position of a node that came from this document: for an object member, the position of its key;
 * for an array element, the position of the value. Returns false (and 0:0) for nodes the
 * document does not know (e.g. inserted by an override). */
bool ct_json_pos(const ct_json_doc *doc, const cJSON *node, int *line, int *col);

/* Position of the value itself (for a member, where its value starts rather than its key). */
bool ct_json_value_pos(const ct_json_doc *doc, const cJSON *node, int *line, int *col);

/* Record a position for a node created after parsing (e.g. a --set override), so messages about it
 * can say where it came from. `origin` is a short text such as "--set" (copied). */
void ct_json_set_origin(ct_json_doc *doc, const cJSON *node, const char *origin);
/* Origin text of a node ("--set", or NULL when it came from the file). */
const char *ct_json_origin(const ct_json_doc *doc, const cJSON *node);

/* Drop what the document knows about node and its children, before they are deleted: positions
 * are keyed by address, and a node allocated later at the same address must not inherit them. */
void ct_json_forget(ct_json_doc *doc, const cJSON *node);

/* "FILE:LINE:COL" for the node (or "FILE" when unknown, or the origin text). Writes to buf. */
const char *ct_json_where(const ct_json_doc *doc, const cJSON *node, char *buf, size_t n);

void ct_json_free(ct_json_doc *doc);

#endif
