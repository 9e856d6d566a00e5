/* overrides.c: the command-line options that become config overrides, shared by a training run
 * (ctrain.c) and `ctrain eval` (eval.c) so both take them in the same forms (commands.h). */
#include "cmd/commands.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool ct_cli_is_override(const char *s) {
    const char *eq = strchr(s, '=');
    if (!eq || eq == s) return false;
    for (const char *p = s; p < eq; p++)
        if (!(*p == '.' || *p == '_' || *p == '-' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
              (*p >= 'A' && *p <= 'Z')))
            return false;
    return s[0] != '.' && eq[-1] != '.';
}

static void add(ct_cli_overrides *o, const char *kv) {
    o->items = ct_xrealloc(o->items, (size_t)(o->n + 1) * sizeof *o->items);
    o->items[o->n++] = kv;
}

/* KEY=VALUE built here (the shorthands), owned by o. */
void ct_cli_overrides_add(ct_cli_overrides *o, const char *key, const char *value) {
    size_t n = strlen(key) + strlen(value) + 2;
    char *s = ct_xmalloc(n);
    snprintf(s, n, "%s=%s", key, value);
    o->owned = ct_xrealloc(o->owned, (size_t)(o->n_owned + 1) * sizeof *o->owned);
    o->owned[o->n_owned++] = s;
    add(o, s);
}

int ct_cli_take_override(int argc, char **argv, int *i, ct_cli_overrides *o, bool *taken, ct_err *err) {
    const char *arg = argv[*i], *v;
    *taken = true;
    if ((v = ct_cli_option_value(argc, argv, i, "--device"))) {
        if (!*v) return ct_errf(err, CT_ERR_CONFIG, "--device needs auto, cpu, cuda or cuda:N");
        if (strlen(v) > 64) return ct_errf(err, CT_ERR_CONFIG, "--device: \"%s\" is not a device (auto, cpu, cuda, cuda:N)", v);
        char quoted[96]; /* the override value must be a JSON string */
        snprintf(quoted, sizeof quoted, "\"%s\"", v);
        ct_cli_overrides_add(o, "train.device", quoted);
    } else if ((v = ct_cli_option_value(argc, argv, i, "--seed"))) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if (!*v || *end || errno || v[0] == '-')
            return ct_errf(err, CT_ERR_CONFIG, "--seed: expected a non-negative integer, got \"%s\"", v);
        (void)s;
        ct_cli_overrides_add(o, "train.seed", v);
    } else if ((v = ct_cli_option_value(argc, argv, i, "--set"))) {
        if (!ct_cli_is_override(v))
            return ct_errf(err, CT_ERR_CONFIG, "--set: expected KEY=VALUE with a dotted KEY, got \"%s\"", v);
        add(o, v);
    } else if (arg[0] == '-' && arg[1] == '-' && ct_cli_is_override(arg + 2)) {
        add(o, arg + 2); /* --optimizer.params.lr=3e-4, as sweep agents write it */
    } else if (arg[0] != '-' && ct_cli_is_override(arg)) {
        add(o, arg);     /* optimizer.params.lr=3e-4 */
    } else {
        *taken = false;
    }
    return CT_OK;
}

void ct_cli_overrides_free(ct_cli_overrides *o) {
    for (int i = 0; i < o->n_owned; i++) free(o->owned[i]);
    free(o->owned);
    free(o->items);
    *o = (ct_cli_overrides){0};
}
