#!/bin/sh
# check_layout.sh: the module layout, checked from the #include lines.
#
# A module is a folder directly below core/ (util, config, backend, cpu, graph, params, optim,
# ckpt, data, report, dist, zero, train), or cmd/, or cuda/. Every `#include "..."` of every source file
# in core/, cmd/ and cuda/ (.c, .h, .cu, .cuh) is one edge from the module of the file to the
# module of the included file. The script prints each module and the modules it includes, and
# fails (exit 1) when
#   * modules include each other in a cycle (named as a chain of files and their #include lines), or
#   * a .c or .h file sits directly in core/ (every file belongs to a module folder).
# An include is looked up next to the including file first, then from the repository root (the
# compiler's -I.); one that is found in neither place is not an edge (a system header).
#
# Usage: sh test/check_layout.sh   (from anywhere; run by test/run_tests.sh)
set -u
cd "$(dirname "$0")/.." || exit 2

files=$(find core cmd cuda -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | LC_ALL=C sort)
if [ -z "$files" ]; then
    echo "check_layout: no source files found under core/, cmd/, cuda/" >&2
    exit 2
fi

# One record per include: "FILE<TAB>LINE<TAB>INCLUDED<TAB>RESOLVED" (RESOLVED empty when not found).
edges=$(for f in $files; do
    awk -v f="$f" '
        /^[ \t]*#[ \t]*include[ \t]*"/ {
            s = $0
            sub(/^[ \t]*#[ \t]*include[ \t]*"/, "", s)
            sub(/".*$/, "", s)
            printf "%s\t%d\t%s\n", f, FNR, s
        }' "$f"
done | while IFS='	' read -r f line inc; do
    dir=${f%/*}
    if [ -f "$dir/$inc" ]; then res="$dir/$inc"; elif [ -f "$inc" ]; then res=$inc; else res=""; fi
    printf '%s\t%s\t%s\t%s\n' "$f" "$line" "$inc" "$res"
done)

printf '%s\n' "$edges" | awk -F '\t' -v files="$(printf '%s ' $files)" '
# module of a path: the folder below core/, or the top folder (cmd, cuda); "core" for a file
# directly in core/ (reported separately).
function module(p,    n, parts) {
    n = split(p, parts, "/")
    if (parts[1] == "core") return n > 2 ? parts[2] : "core"
    return parts[1]
}
function normalize(p,    n, parts, out, i, k, stack) {
    # "core/data/../util/x.h" -> "core/util/x.h"
    n = split(p, parts, "/")
    k = 0
    for (i = 1; i <= n; i++) {
        if (parts[i] == "." || parts[i] == "") continue
        if (parts[i] == ".." && k > 0) { k--; continue }
        stack[++k] = parts[i]
    }
    out = ""
    for (i = 1; i <= k; i++) out = out (i > 1 ? "/" : "") stack[i]
    return out
}
BEGIN {
    nf = split(files, flist, " ")
    for (i = 1; i <= nf; i++) {
        m = module(flist[i])
        if (!(m in seen_mod)) { seen_mod[m] = 1; mods[++nmods] = m }
        if (m == "core" && flist[i] ~ /\.[ch]$/) stray[++nstray] = flist[i]
    }
}
NF >= 3 && $4 != "" {
    target = normalize($4)
    if (target !~ /^(core|cmd|cuda)\//) next
    from = module($1); to = module(target)
    if (!(to in seen_mod)) { seen_mod[to] = 1; mods[++nmods] = to }
    if (from == to) next
    if (!((from, to) in edge)) {
        edge[from, to] = 1
        why[from, to] = $1 ":" $2 ": #include \"" $3 "\""
    }
}
END {
    # modules in name order
    for (i = 2; i <= nmods; i++) {
        v = mods[i]
        for (j = i - 1; j >= 1 && mods[j] > v; j--) mods[j + 1] = mods[j]
        mods[j + 1] = v
    }
    print "modules and the modules they include (a module: a folder of core/, or cmd/, or cuda/):"
    for (i = 1; i <= nmods; i++) {
        a = mods[i]; deps = ""
        for (j = 1; j <= nmods; j++) if ((a, mods[j]) in edge) deps = deps " " mods[j]
        printf "  %-8s ->%s\n", a, deps == "" ? " (nothing)" : deps
    }
    fail = 0
    for (i = 1; i <= nstray; i++) {
        printf "check_layout: FAIL: %s sits directly in core/; move it into a module folder (core/<module>/)\n", stray[i]
        fail = 1
    }
    # One cycle through each module not yet on a reported cycle: breadth-first search from s;
    # an edge back to s closes the shortest cycle through s.
    ncyc = 0
    for (i = 1; i <= nmods; i++) {
        s = mods[i]
        if (s in on_cycle) continue
        split("", parent); split("", queue)
        head = 1; tail = 0; queue[++tail] = s; parent[s] = ""; closing = ""
        while (head <= tail && closing == "") {
            u = queue[head++]
            for (j = 1; j <= nmods; j++) {
                w = mods[j]
                if (!((u, w) in edge)) continue
                if (w == s) { closing = u; break }
                if (!(w in parent)) { parent[w] = u; queue[++tail] = w }
            }
        }
        if (closing == "") continue
        # the chain s -> ... -> closing -> s
        n = 0; v = closing
        while (v != "") { rev[++n] = v; v = (v == s) ? "" : parent[v] }
        for (k = 1; k <= n; k++) chain[k] = rev[n - k + 1]
        chain[n + 1] = s
        names = chain[1]
        for (k = 2; k <= n + 1; k++) names = names " -> " chain[k]
        for (k = 1; k <= n; k++) on_cycle[chain[k]] = 1
        printf "check_layout: FAIL: modules include each other in a cycle: %s\n", names
        for (k = 1; k <= n; k++)
            printf "    %s    (%s -> %s)\n", why[chain[k], chain[k + 1]], chain[k], chain[k + 1]
        fail = 1
    }
    if (fail) exit 1
    printf "check_layout: ok: %d files, %d modules, no module cycle, no file directly in core/\n", nf, nmods
}'
