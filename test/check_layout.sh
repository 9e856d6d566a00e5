#!/bin/sh
# check_layout.sh: the module order, checked from the #include lines and from the objects' symbols.
#
# A module is a folder directly below core/, or cmd/, or cuda/. MODULES below is the written order:
# one row per module, its rank and its line budget. A module may use only modules of a lower rank
# (two modules of one rank, cpu and cuda, not each other). The script prints every module with
# its rank, the modules it includes, its lines and its budget, and fails (exit 1) when
#   * a file includes a file of a module of the same or a higher rank (named: file, line, include),
#     or another module's internal header (*internal.h: a module's own files only);
#   * with BUILD given: an object of one module calls (or reads) a symbol an object of another
#     module defines, and that module is not of a lower rank, or declares the symbol in none of
#     its headers (internal ones do not count): a call the #include lines do not show;
#   * a module folder is not in MODULES, or a MODULES row has no folder, or a .c or .h file sits
#     directly in core/;
#   * docs/DESIGN.md's generated module table (between the "check_layout.sh" markers) differs from
#     what this script writes (`--write-design` rewrites it; its lines column is not compared).
# It warns (and still passes) when a module is past its budget or a production file past 800
# lines: ask whether the lines are worth it before raising the budget here, in the same commit.
#
# An include is looked up next to the including file first, then from the repository root (the
# compiler's -I.); one found in neither place is a system header, not an edge.
#
# Usage: sh test/check_layout.sh [BUILD] [--write-design]
#   BUILD: a build directory (build/); its objects of core/, cmd/ and cuda/ are read with nm.
#   Run by test/run_tests.sh with its build directory.
set -u
cd "$(dirname "$0")/.." || exit 2

# The written order (docs/DESIGN.md, "Modules"): rank, module, budget in lines (.c .h .cu .cuh).
# dist sits below cpu and cuda: the NCCL communicator (cuda/cuda_comm_nccl.cu) implements
# core/dist/comm.h. device, the factory that makes a backend by name (and dlopens the CUDA one),
# sits above both.
MODULES='
0  util     3000
1  config   3700
2  backend  1000
3  dist     2400
4  cpu      6000
4  cuda     6300
5  device    400
6  params    700
7  graph    6100
8  optim     900
9  ckpt     3900
10 data     9100
11 report   2700
12 zero     2500
13 train    5300
14 cmd      2800
'
FILE_BUDGET=800

build="" write_design=0
for a in "$@"; do
    case "$a" in
    --write-design) write_design=1 ;;
    -*) echo "check_layout: unknown option $a (usage: check_layout.sh [BUILD] [--write-design])" >&2; exit 2 ;;
    *) build=$a ;;
    esac
done
if [ -n "$build" ] && [ ! -d "$build/core" ]; then
    echo "check_layout: $build/core: no such directory: give a build directory (make all first)" >&2
    exit 2
fi

files=$(find core cmd cuda -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | LC_ALL=C sort)
if [ -z "$files" ]; then
    echo "check_layout: no source files found under core/, cmd/, cuda/" >&2
    exit 2
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/check_layout.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT

# Includes, one record each: "I<TAB>FILE<TAB>LINE<TAB>INCLUDED<TAB>RESOLVED" (RESOLVED empty when
# not found).
for f in $files; do
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
    printf 'I\t%s\t%s\t%s\t%s\n' "$f" "$line" "$inc" "$res"
done > "$tmp/records"

# Lines per file: "L<TAB>FILE<TAB>LINES".
for f in $files; do printf 'L\t%s\t%s\n' "$f" "$(wc -l < "$f")"; done >> "$tmp/records"

# Symbols of the objects whose source still exists: "D<TAB>SOURCE<TAB>SYMBOL" for a definition,
# "U<TAB>SOURCE<TAB>SYMBOL" for a use.
nobj=0
if [ -n "$build" ]; then
    for o in $(find "$build/core" "$build/cmd" "$build/cuda" -name '*.o' 2>/dev/null | LC_ALL=C sort); do
        s=${o#"$build"/}; s=${s%.o}
        if [ -f "$s.c" ]; then s=$s.c; elif [ -f "$s.cu" ]; then s=$s.cu; else continue; fi
        nobj=$((nobj + 1))
        nm -P -g "$o" 2>/dev/null | awk -v s="$s" '
            $2 == "U" { printf "U\t%s\t%s\n", s, $1; next }
            $2 ~ /^[TDBRCGSVW]$/ { printf "D\t%s\t%s\n", s, $1 }'
    done >> "$tmp/records"
    if [ "$nobj" -eq 0 ]; then
        echo "check_layout: no objects under $build/core, $build/cmd, $build/cuda: build first (make all)" >&2
        exit 2
    fi
fi

# The headers' words, for "declared in a header of its module": "H<TAB>HEADER<TAB>WORD".
for f in $files; do
    case "$f" in *.h|*.cuh) ;; *) continue ;; esac
    case "${f##*/}" in *internal.h) continue ;; esac
    tr -cs 'A-Za-z0-9_' '\n' < "$f" | awk -v f="$f" 'NF && !seen[$0]++ { printf "H\t%s\t%s\n", f, $0 }'
done >> "$tmp/records"

# docs/DESIGN.md's generated table, as written: "G<TAB>LINE".
design=docs/DESIGN.md
begin='<!-- check_layout.sh: begin (sh test/check_layout.sh --write-design) -->'
end='<!-- check_layout.sh: end -->'
if [ -f "$design" ]; then
    awk -v b="$begin" -v e="$end" '$0 == e { on = 0 } on { printf "G\t%s\n", $0 } $0 == b { on = 1 }' "$design" >> "$tmp/records"
fi

awk -F '\t' -v modules="$MODULES" -v file_budget="$FILE_BUDGET" -v files="$(printf '%s ' $files)" \
    -v nobj="$nobj" -v write_design="$write_design" -v table="$tmp/table" '
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
function folder(m) { return (m == "cmd" || m == "cuda") ? m "/" : "core/" m "/" }
function below(a, b) { return rank[a] < rank[b] }   # may b use a?
BEGIN {
    nm_ = split(modules, rows, "\n")
    for (i = 1; i <= nm_; i++) {
        if (split(rows[i], w, " ") < 3) continue
        order[++nmods] = w[2]; rank[w[2]] = w[1] + 0; budget[w[2]] = w[3] + 0
    }
    nf = split(files, flist, " ")
    for (i = 1; i <= nf; i++) {
        m = module(flist[i])
        if (m == "core") { if (flist[i] ~ /\.[ch]$/) stray[++nstray] = flist[i]; continue }
        if (!(m in rank) && !(m in unranked)) { unranked[m] = flist[i]; nunranked++ }
        has_files[m] = 1
    }
}
$1 == "I" && $5 != "" {
    target = normalize($5)
    if (target !~ /^(core|cmd|cuda)\//) next
    from = module($2); to = module(target)
    if (from == to || from == "core" || to == "core") next
    if (!((from, to) in edge)) edge[from, to] = 1
    where = $2 ":" $3 ": #include \"" $4 "\""
    if (target ~ /internal\.h$/)
        bad[++nbad] = sprintf("%s: another module'"'"'s internal header (%s is for %s%s own files)", where, target, folder(to), "")
    else if ((from in rank) && (to in rank) && !below(to, from))
        bad[++nbad] = sprintf("%s: %s (rank %d) may not include %s (rank %d)", where, from, rank[from], to, rank[to])
    next
}
$1 == "L" { lines[module($2)] += $3; if ($3 > file_budget && $2 ~ /\.(c|cu)$/) big[$2] = $3; next }
$1 == "D" { if (!(($3, module($2)) in defmod)) { defmod[$3, module($2)] = 1; ndef[$3]++; defby[$3] = $2 } next }
$1 == "U" { use[++nuse] = $2 "\t" $3; next }
$1 == "H" { declared[$3, module($2)] = 1; if (!(($3, module($2)) in declhdr)) declhdr[$3, module($2)] = $2; anyhdr[$3] = $2; next }
$1 == "G" { written[++nwritten] = $2; next }
END {
    # the generated order and table
    line = ""
    for (i = 1; i <= nmods; i++)
        line = line (i == 1 ? "" : rank[order[i]] == rank[order[i - 1]] ? ", " : " < ") order[i]
    gen[++ngen] = "The order: `" line "`"
    gen[++ngen] = ""
    gen[++ngen] = "| rank | module | includes | lines | budget |"
    gen[++ngen] = "|---:|---|---|---:|---:|"
    for (i = 1; i <= nmods; i++) {
        a = order[i]; deps = ""
        for (j = 1; j <= nmods; j++) if ((a, order[j]) in edge) deps = deps (deps == "" ? "" : " ") order[j]
        gen[++ngen] = sprintf("| %d | %s | %s | %d | %d |", rank[a], a, deps == "" ? "(nothing)" : deps, lines[a], budget[a])
    }
    print "modules by rank: what each includes, its lines and its budget (test/check_layout.sh, MODULES):"
    for (i = 1; i <= nmods; i++) {
        a = order[i]; deps = ""
        for (j = 1; j <= nmods; j++) if ((a, order[j]) in edge) deps = deps " " order[j]
        printf "  %2d %-8s ->%-60s %6d lines (budget %d)\n", rank[a], a, deps == "" ? " (nothing)" : deps, lines[a], budget[a]
    }
    fail = 0
    for (i = 1; i <= nstray; i++) {
        printf "check_layout: FAIL: %s sits directly in core/; move it into a module folder (core/<module>/)\n", stray[i]
        fail = 1
    }
    for (m in unranked) {
        printf "check_layout: FAIL: module %s (%s) has no row in MODULES (test/check_layout.sh): give it a rank and a budget, and its row in docs/DESIGN.md\n", m, unranked[m]
        fail = 1
    }
    for (i = 1; i <= nmods; i++) if (!(order[i] in has_files)) {
        printf "check_layout: FAIL: MODULES names %s, which has no files under %s\n", order[i], folder(order[i])
        fail = 1
    }
    for (i = 1; i <= nbad; i++) { printf "check_layout: FAIL: %s\n", bad[i]; fail = 1 }
    # link level: a symbol one module uses and exactly one other module defines
    nlink = 0
    for (i = 1; i <= nuse; i++) {
        split(use[i], u, "\t"); src = u[1]; sym = u[2]; from = module(src)
        if (ndef[sym] != 1) continue
        def = defby[sym]; to = module(def)
        if (to == from || (from, to, sym) in done) continue
        done[from, to, sym] = 1; nlink++
        if ((from in rank) && (to in rank) && !below(to, from)) {
            printf "check_layout: FAIL: %s uses %s, which %s defines: %s (rank %d) may not use %s (rank %d)\n", src, sym, def, from, rank[from], to, rank[to]
            fail = 1
        } else if (!((sym, to) in declared)) {
            printf "check_layout: FAIL: %s uses %s, which %s defines but no header of %s declares%s: declare it in a header of %s (or do not call it from %s)\n", src, sym, def, folder(to), (sym in anyhdr) ? " (" anyhdr[sym] " does)" : "", folder(to), from
            fail = 1
        }
    }
    # docs/DESIGN.md: the table as written, its lines column aside
    if (write_design) {
        for (i = 1; i <= ngen; i++) print gen[i] > table
        close(table)
    } else if (nwritten == 0) {
        print "check_layout: FAIL: docs/DESIGN.md has no generated module table (its markers are missing): run sh test/check_layout.sh --write-design"
        fail = 1
    } else {
        same = (nwritten == ngen)
        for (i = 1; same && i <= ngen; i++) {
            x = written[i]; y = gen[i]
            n1 = split(x, xa, "|"); n2 = split(y, ya, "|")
            if (n1 != n2) { same = 0; break }
            for (k = 1; k <= n1; k++) if ((k != 5 || n1 < 7) && xa[k] != ya[k]) same = 0
        }
        if (!same) {
            print "check_layout: FAIL: docs/DESIGN.md'"'"'s module table differs from the order here; run sh test/check_layout.sh --write-design (and say why in the commit). Written:"
            for (i = 1; i <= nwritten; i++) print "    " written[i]
            print "  expected:"
            for (i = 1; i <= ngen; i++) print "    " gen[i]
            fail = 1
        }
    }
    for (i = 1; i <= nmods; i++) if (lines[order[i]] > budget[order[i]])
        printf "check_layout: warning: %s has %d lines, past its budget of %d: are they worth it? (the budget: MODULES in test/check_layout.sh)\n", order[i], lines[order[i]], budget[order[i]]
    for (f in big) printf "check_layout: warning: %s has %d lines, past %d: split it by concern?\n", f, big[f], file_budget
    if (fail) exit 1
    printf "check_layout: ok: %d files, %d modules in rank order%s, DESIGN.md'"'"'s table up to date\n", nf, nmods, nobj ? sprintf(" (includes, and %d cross-module symbols of %d objects)", nlink, nobj) : " (includes only: give a build directory for the symbols)"
}' "$tmp/records"
rc=$?
if [ "$write_design" = 1 ] && [ -f "$tmp/table" ]; then
    awk -v b="$begin" -v e="$end" -v t="$tmp/table" '
        $0 == e { while ((getline l < t) > 0) print l; on = 0 }
        !on { print }
        $0 == b { on = 1 }' "$design" > "$tmp/design" && cat "$tmp/design" > "$design"
    echo "check_layout: wrote $design's module table"
fi
exit $rc
