/* pathlist.h: the files of a format that reads several (WebDataset shards, TFRecord files, token
 * shards): one path, a brace pattern, or a JSON list of paths, relative to the config file; and,
 * for the formats that call ct_pathlist_glob (tokens), shell globs.
 *
 * A brace range {A..B} keeps the zero padding of A ({000000..000127}: 000000 to 000127); {x,y}
 * lists alternatives; several groups multiply, as the braceexpand package does. */
#ifndef CT_DATA_PATHLIST_H
#define CT_DATA_PATHLIST_H

#include <cjson/cJSON.h>

#include "core/config/config.h"
#include "core/util/common.h"

typedef struct ct_pathlist {
    char **paths;
    int n;
} ct_pathlist;

/* entry[key] into l (empty at the call). path: "data.train" and what: "paths of .tar shards", for
 * messages; example: a pattern to show. CT_ERR_CONFIG at the key's position when it is missing,
 * not a string or list of strings, a URL ("https://...", "pipe:...": ctrain reads local files), or
 * a brace group is malformed. */
int ct_pathlist_parse(ct_pathlist *l, const ct_config *cfg, const cJSON *entry, const char *path,
                      const char *key, const char *what, const char *example, ct_err *err);
/* Expand one pattern (already resolved) onto the end of l; where: the position, for messages. */
int ct_pathlist_expand(ct_pathlist *l, const char *pattern, const char *where, ct_err *err);
/* Replace each path of l that holds a glob character (*, ? or [) and is not itself an existing
 * file by the paths it matches (glob(3): * and ? do not match "/" or a leading "."), sorted by
 * byte value whatever the locale, as llm.c's loader sorts its shards' glob; other paths stay where
 * they are. A pattern that matches nothing is CT_ERR_DATA naming it; where: the position, for
 * messages. */
int ct_pathlist_glob(ct_pathlist *l, const char *where, ct_err *err);
void ct_pathlist_free(ct_pathlist *l);

#endif
