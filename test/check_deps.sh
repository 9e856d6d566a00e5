#!/bin/sh
# check_deps.sh: the Makefile's Debian package list (DEB_PKGS, what `make deps` installs) covers
# what the build and the tests use, and datasets/deps.sh behaves on machines it cannot install on.
#
# 1. What is used, found by reading the files (no package tool is run):
#    * commands: every command a recipe or a $(shell ...) of the Makefile runs ($(CC) as the
#      compiler driver it names, $(MAKE) as make), and every command test/*.sh, .ci/run and
#      datasets/venv.sh (the tests' Python environment, which runs after the Debian packages) run,
#      found by a small shell lexer (quotes, $(...), here-documents, case patterns, functions,
#      `command -v X`, `exec`/`env`/`timeout`/`nice`/`xargs X`, `trap`/`sh -c` code, VAR=/usr/bin/X);
#      shell builtins and the functions a script defines (or sources) need no package;
#    * libraries: -lNAME in the Makefile, and on the lines of test/*.sh that link (LIBS, cc);
#    * pkg-config modules: the words after `pkg-config --cflags/--libs`;
#    * paths: /usr/include/... and /usr/share/... in the Makefile, test/*.sh and configs/*.json;
#    * python modules: what the python code in test/*.sh and datasets/venv.sh (-c strings,
#      here-documents) and the test/*.py and test/ref/*.py files they run import.
#    Each is looked up in the table below (written with `dpkg -S` on Debian 12), whose package must
#    be in DEB_PKGS or brought by one that is (the `has` lines: Depends, not Recommends). A name
#    missing from the table fails, naming the file and line: add it with its package. Packages of
#    DEB_PKGS that nothing found uses are listed as a note, not a failure.
#    Then the check is run again without libpng-dev and without the compiler, and must fail.
# 2. datasets/deps.sh, run with stand-ins for id, dpkg-query, apt-get and sudo on a PATH of its own:
#    --check; not root and no sudo (exit 2 and the apt-get command to run as root, nothing run);
#    not root with sudo (says so, installs through sudo); a failing apt-get (exit 1, the log's path
#    and its end); a log it cannot write (a temporary one instead); no dpkg (exit 2); and at most a
#    few lines on the terminal.
#
# Usage: sh test/check_deps.sh [--list]   (from anywhere; run by test/run_tests.sh; no network, no
# root). --list: also print each name found, its package and where it is first used.
set -u
list=0
[ "${1:-}" = "--list" ] && list=1
cd "$(dirname "$0")/.." || exit 2
T=$(mktemp -d) || exit 2
trap 'rm -rf "$T"' EXIT

# --- the table: KIND NAME PACKAGE. KIND: cmd, lib (-lNAME), pc (pkg-config module), path (a
# directory and everything below it), py (python module). PACKAGE @cuda: from the CUDA toolkit or
# the NVIDIA driver (GPU machines only, not a Debian package); @built: built by the Makefile;
# @optional: used only when present; @venv: a Python package pinned in
# datasets/requirements-test.txt, which `make deps` installs into the tests' virtual environment
# (checked below). "has PACKAGE DEP...": installing PACKAGE installs DEP...
cat >"$T/table" <<'TABLE'
cmd cc gcc
cmd gcc gcc
cmd c++ g++
cmd g++ g++
cmd make make
cmd ar binutils
cmd strip binutils
cmd nm binutils
cmd objdump binutils
cmd readelf binutils
cmd pkg-config pkg-config
cmd ldd libc-bin
cmd getconf libc-bin
cmd ldconfig libc-bin
cmd python3 python3
cmd sh dash
cmd bash bash
cmd awk mawk
cmd sed sed
cmd grep grep
cmd find findutils
cmd xargs findutils
cmd cmp diffutils
cmd diff diffutils
cmd gzip gzip
cmd gunzip gzip
cmd zcat gzip
cmd tar tar
cmd mount mount
cmd umount mount
cmd mountpoint util-linux
cmd flock util-linux
cmd setpriv util-linux
cmd rev util-linux
cmd unshare util-linux
cmd script bsdutils
cmd ps procps
cmd pgrep procps
cmd pkill procps
cmd file file
cmd xxd xxd
cmd git git
cmd clang clang
cmd mpicc openmpi-bin
cmd mpirun openmpi-bin
cmd nvcc @cuda
cmd nvidia-smi @cuda
cmd compute-sanitizer @cuda
TABLE
for c in basename cat chmod comm cp cut date dd df dirname du env expr fold head id install join \
         ln ls md5sum mkdir mkfifo mknod mktemp mv nice nohup nproc od paste readlink realpath rm \
         rmdir chroot seq sha1sum sha256sum sleep sort split stat sync tail tee timeout touch tr truncate \
         uname uniq wc yes; do
    echo "cmd $c coreutils"
done >>"$T/table"
cat >>"$T/table" <<'TABLE'
lib c libc6-dev
lib m libc6-dev
lib pthread libc6-dev
lib dl libc6-dev
lib rt libc6-dev
lib cjson libcjson-dev
lib png libpng-dev
lib jpeg libjpeg62-turbo-dev
lib z zlib1g-dev
lib openblas libopenblas-dev
lib check check
lib subunit libsubunit-dev
lib stdc++ libstdc++-12-dev
lib ctrain_cuda @built
lib ctrain_absent_dep @built
lib cudart @cuda
lib cublas @cuda
lib cublasLt @cuda
pc libcjson libcjson-dev
pc libpng libpng-dev
pc zlib zlib1g-dev
pc check check
path /usr/include/openblas libopenblas-dev
path /usr/share/datasets/fashion-mnist dataset-fashion-mnist
path /usr/share/common-licenses base-files
path /usr/share/doc base-files
py numpy python3-numpy
py PIL python3-pil
py h5py python3-h5py
py pyarrow @venv
py torch python3-torch
py tensorboard @venv
py transformers @venv
py tokenizers @venv
py site python3
py venv python3-venv
py ensurepip python3-venv
has build-essential gcc g++ make libc6-dev dpkg-dev
has gcc gcc-12 cpp binutils
has gcc-12 cpp-12 binutils libgcc-12-dev
has g++ g++-12 gcc
has g++-12 gcc-12 libstdc++-12-dev
has pkg-config pkgconf
has python3 python3-minimal libpython3-stdlib
has python3-numpy python3
TABLE
# python's standard library (Debian's python3 and what it depends on; not tkinter, venv, distutils)
for m in abc argparse array ast atexit base64 binascii bisect bz2 calendar codecs collections \
         concurrent contextlib copy csv ctypes dataclasses datetime decimal difflib enum errno \
         fcntl filecmp fnmatch fractions functools gc getopt glob gzip hashlib heapq hmac html http \
         inspect io itertools json locale logging lzma math mmap multiprocessing numbers operator os \
         pathlib pickle platform pprint queue random re resource secrets select shlex shutil signal \
         socket sqlite3 stat statistics string struct subprocess sys tarfile tempfile textwrap \
         threading time timeit traceback types typing unicodedata unittest urllib uuid warnings \
         weakref zipfile zlib; do
    echo "py $m python3"
done >>"$T/table"
# test/'s own python files, which import each other (make_tfrecord.py uses make_wds.py; the e2e
# scripts import test/ref/gen_hf_llama.py's readers)
for f in test/*.py test/ref/*.py; do
    echo "py $(basename "$f" .py) python3"
done >>"$T/table"

# --- DEB_PKGS, one a line: its `:=`, `=` or `+=` lines and their continuation lines
awk '
    /^DEB_PKGS[ \t]*(:|\+|\?)?=/ { on = 1; sub(/^DEB_PKGS[ \t]*(:|\+|\?)?=/, "") }
    on { more = sub(/\\$/, ""); n = split($0, w, /[ \t]+/); for (i = 1; i <= n; i++) if (w[i] != "") print w[i]; on = more }
' Makefile >"$T/pkgs"
if [ ! -s "$T/pkgs" ]; then
    echo "check_deps: FAIL: no DEB_PKGS list found in the Makefile" >&2
    exit 1
fi

# --- the Makefile as shell code, line for line: a recipe line is its command (make's variables
# as shell variables, $(CC) and $(MAKE) as the commands they name, $(if C,X) as X); any other line
# is the $(shell ...) calls it makes, joined with ";"; the rest is blank.
awk '
function mkrefs(t,    name, val) {
    gsub(/\$\$/, "\001", t)                   # $$: a dollar for the shell
    gsub(/\$\(shell[ \t]+/, "\002", t)        # $(shell X): the command substitution $(X)
    gsub(/\$[@<^*?]/, "x", t)                 # automatic variables: plain words
    while (match(t, /\$\([^$()\002]*\)/)) {   # the innermost $(NAME) or $(function args)
        name = substr(t, RSTART + 2, RLENGTH - 3)
        if (name == "CC") val = cc
        else if (name == "MAKE") val = "make"
        else if (name == "NVCC") val = "nvcc"
        else if (name ~ /^if[ \t]/) { val = name; sub(/^if[ \t][^,]*,/, "", val) }
        else { val = name; sub(/[ \t:].*/, "", val); val = "\001" val }
        t = substr(t, 1, RSTART - 1) val substr(t, RSTART + RLENGTH)
    }
    gsub(/\002/, "$(", t)
    gsub(/\001/, "$", t)
    return t
}
function shells(t,    out, i, j, d, c) {
    out = ""
    while ((i = index(t, "$(shell ")) > 0) {
        d = 0
        for (j = i + 1; j <= length(t); j++) {
            c = substr(t, j, 1)
            if (c == "(") d++
            else if (c == ")") { d--; if (d == 0) break }
        }
        out = out (out == "" ? "" : "; ") mkrefs(substr(t, i, j - i + 1))
        t = substr(t, j + 1)
    }
    return out
}
BEGIN { cc = "cc" }
/^CC[ \t]*[?:]?=/ { v = $0; sub(/^CC[ \t]*[?:]?=[ \t]*/, "", v); sub(/[ \t].*/, "", v); if (v != "") cc = v }
/^\t/ { t = substr($0, 2); sub(/^[@+-]+/, "", t); print mkrefs(t); next }
{ print shells($0) }
' Makefile >"$T/Makefile.sh"

# --- the commands: records "cmd NAME FILE LINE [probe|path]", "FUNC NAME FILE", "SRC PATH FILE"
awk -v alias="$T/Makefile.sh" '
function flushpend() {
    if (pend != "") printf "cmd\t%s\t%s\t%d\t%s\n", pend, F, pendline, pendkind
    pend = ""; pendkind = ""
}
function startword() {
    if (!win[lv]) { flushpend(); win[lv] = 1; wraw[lv] = ""; wval[lv] = ""; wline[lv] = ln; wq[lv] = 0 }
}
# the command a word in command position names; "" when it cannot be known (a variable, a path)
function cmdname(raw, val,    r) {
    r = raw
    gsub(/["\047]/, "", r)
    if (r ~ /^\$\{[A-Za-z_][A-Za-z0-9_]*:?-[A-Za-z0-9_.+-]+\}$/) { sub(/^[^-]*-/, "", r); sub(/\}$/, "", r); return r }
    if (r ~ /^\$/) return ""
    if (val ~ /^\/(usr\/)?s?bin\/[A-Za-z0-9_.+-]+$/) { sub(/.*\//, "", val); return val }
    if (val ~ /\//) return ""
    return val
}
function emit(name, line, kind) { if (name != "") printf "cmd\t%s\t%s\t%d\t%s\n", name, F, line, kind }
function endword(    raw, val, quoted, name, v) {
    if (!win[lv]) return
    win[lv] = 0
    raw = wraw[lv]; val = wval[lv]; quoted = wq[lv]
    if (redir[lv]) {                      # a redirection target, or a here-document delimiter
        redir[lv] = 0
        if (hdwant[lv]) { hdwant[lv] = 0; hd[++nhd] = val }
        return
    }
    if (pat[lv]) { if (!quoted && raw == "esac") { pat[lv] = 0; cmdpos[lv] = 0 }; return }
    if (mode[lv] != "") { modeword(raw, val, quoted); return }
    if (casein[lv]) { if (!quoted && raw == "in") { casein[lv] = 0; pat[lv] = 1 }; return }
    if (!cmdpos[lv]) return
    if (raw ~ /^[A-Za-z_][A-Za-z0-9_]*=/) {           # an assignment; VAR=/usr/bin/X names X
        v = val; sub(/^[A-Za-z_][A-Za-z0-9_]*=/, "", v)
        if (v ~ /^\/(usr\/)?s?bin\/[A-Za-z0-9_.+-]+$/) { sub(/.*\//, "", v); emit(v, wline[lv], "path") }
        return
    }
    if (!quoted && raw ~ /^(if|then|else|elif|while|until|do|!|\{)$/) return
    if (!quoted && raw ~ /^(fi|done|esac|\})$/) { cmdpos[lv] = 0; return }
    if (!quoted && raw == "case") { cmdpos[lv] = 0; casein[lv] = 1; return }
    if (!quoted && raw == "for") { cmdpos[lv] = 0; return }
    name = cmdname(raw, val)
    cmdpos[lv] = 0
    if (name != "") { pend = name; pendline = wline[lv]; pendkind = "" }
    if (name ~ /^(exec|nohup)$/) cmdpos[lv] = 1
    else if (name ~ /^(env|timeout|nice|command|xargs|trap|sh|bash|dash|\.|source)$/) { mode[lv] = name; mstate[lv] = 0 }
}
# the words after a command that runs another command (or code)
function modeword(raw, val, quoted,    m, name) {
    m = mode[lv]
    if (m == "env") {
        if (raw ~ /^-/ || raw ~ /^[A-Za-z_][A-Za-z0-9_]*=/) return
    } else if (m == "nice" || m == "timeout" || m == "xargs") {
        if (mstate[lv] == 1) { mstate[lv] = 0; return }               # an option argument
        if ((m == "nice" && raw == "-n") || (m == "timeout" && raw ~ /^-[sk]$/) ||
            (m == "xargs" && raw ~ /^-[nILPsd]$/)) { mstate[lv] = 1; return }
        if (raw ~ /^-/) return
        if (m == "timeout" && mstate[lv] == 0) { mstate[lv] = 2; return }   # the duration
    } else if (m == "command") {
        if (raw == "-v" || raw == "-V") { mstate[lv] = 3; return }
        if (raw ~ /^-/) return
        if (mstate[lv] == 3) { mode[lv] = ""; emit(cmdname(raw, val), wline[lv], "probe"); return }
    } else if (m == "trap") {
        mode[lv] = ""; code[++ncode] = val; codeline[ncode] = wline[lv]; return
    } else if (m == "sh" || m == "bash" || m == "dash") {
        if (mstate[lv] == 1) { mode[lv] = ""; code[++ncode] = val; codeline[ncode] = wline[lv]; return }
        if (raw == "-c") { mstate[lv] = 1; return }
        if (raw !~ /^-/) mode[lv] = ""
        return
    } else if (m == "." || m == "source") {
        mode[lv] = ""; printf "SRC\t%s\t%s\n", val, F; return
    }
    mode[lv] = ""; cmdpos[lv] = 1                                    # the command it runs
    win[lv] = 1; wraw[lv] = raw; wval[lv] = val; wq[lv] = quoted
    endword()
}
function reset(l) {
    win[l] = 0; cmdpos[l] = 1; mode[l] = ""; pat[l] = 0; casein[l] = 0; redir[l] = 0; hdwant[l] = 0
    q[l] = ""; par[l] = 0; bt[l] = 0
}
function op() { endword(); flushpend(); cmdpos[lv] = 1; mode[lv] = ""; redir[lv] = 0 }
# index of the character closing the one at I (O, E: "(" and ")", or "{" and "}")
function closing(s, i, o, e,    d, c) {
    for (d = 0; i <= length(s); i++) {
        c = substr(s, i, 1)
        if (c == "\n") ln++
        else if (c == o) d++
        else if (c == e && --d == 0) return i
    }
    return length(s)
}
# at the newline I: skip the pending here-documents; the index of the last newline skipped
function heredocs(s, i,    k, e, l) {
    for (k = 1; k <= nhd; k++)
        while (i < length(s)) {
            e = index(substr(s, i + 1), "\n")
            if (e == 0) e = length(s) - i + 1
            l = substr(s, i + 1, e - 1); i += e; ln++
            sub(/^\t+/, "", l)
            if (l == hd[k]) break
        }
    nhd = 0
    return i
}
# lex(S, L0): the shell code S, whose first line is line L0
function lex(s, l0,    i, n, c, c2, j, d) {
    n = length(s); ln = l0; lv = 0; reset(0); nhd = 0; pend = ""
    for (i = 1; i <= n; i++) {
        c = substr(s, i, 1)
        if (c == "\n") ln++
        if (q[lv] == "S") { wraw[lv] = wraw[lv] c; if (c == "\047") q[lv] = ""; else wval[lv] = wval[lv] c; continue }
        if (q[lv] == "D") {
            wraw[lv] = wraw[lv] c
            if (c == "\\") { c2 = substr(s, ++i, 1); if (c2 == "\n") ln++; wval[lv] = wval[lv] c2; wraw[lv] = wraw[lv] c2; continue }
            if (c == "\"") { q[lv] = ""; continue }
            if (c == "$" && substr(s, i + 1, 2) == "((") { i = closing(s, i + 1, "(", ")"); continue }
            if (c == "$" && substr(s, i + 1, 1) == "(") { i++; reset(++lv); continue }
            if (c == "$" && substr(s, i + 1, 1) == "{") { j = closing(s, i + 1, "{", "}"); wraw[lv] = wraw[lv] substr(s, i + 1, j - i); i = j; continue }
            if (c == "`") { reset(++lv); bt[lv] = 1; continue }
            wval[lv] = wval[lv] c
            continue
        }
        if (c == "\\") {
            c2 = substr(s, ++i, 1)
            if (c2 == "\n") { ln++; continue }
            startword(); wval[lv] = wval[lv] c2; wraw[lv] = wraw[lv] c c2; wq[lv] = 1; continue
        }
        if (c == "#" && !win[lv]) { while (i < n && substr(s, i + 1, 1) != "\n") i++; continue }
        if (c == " " || c == "\t") { endword(); continue }
        if (c == "\n") {
            endword()
            if (nhd > 0) i = heredocs(s, i)
            if (pat[lv] || casein[lv]) flushpend(); else op()
            continue
        }
        if (c == "\047") { startword(); q[lv] = "S"; wq[lv] = 1; wraw[lv] = wraw[lv] c; continue }
        if (c == "\"") { startword(); q[lv] = "D"; wq[lv] = 1; wraw[lv] = wraw[lv] c; continue }
        if (c == "$") {
            startword()
            if (substr(s, i + 1, 2) == "((") { j = closing(s, i + 1, "(", ")"); wraw[lv] = wraw[lv] substr(s, i, j - i + 1); i = j; continue }
            if (substr(s, i + 1, 1) == "(") { wraw[lv] = wraw[lv] "$("; i++; reset(++lv); continue }
            if (substr(s, i + 1, 1) == "{") { j = closing(s, i + 1, "{", "}"); wraw[lv] = wraw[lv] substr(s, i, j - i + 1); i = j; continue }
            wraw[lv] = wraw[lv] c; continue
        }
        if (c == "`") {
            if (bt[lv]) { op(); lv--; continue }
            startword(); reset(++lv); bt[lv] = 1; continue
        }
        if (c == ";") {
            if (substr(s, i + 1, 1) == ";") { i++; endword(); flushpend(); pat[lv] = 1; continue }
            op(); continue
        }
        if (c == "&" || c == "|") { if (substr(s, i + 1, 1) == c) i++; op(); continue }
        if (c == "(") {
            endword()
            if (pat[lv]) continue
            if (pend != "" && match(substr(s, i + 1), /^[ \t]*\)/)) {   # NAME() { ...: a function
                printf "FUNC\t%s\t%s\n", pend, F; pend = ""
                i += RLENGTH; cmdpos[lv] = 1; continue
            }
            op(); par[lv]++; continue
        }
        if (c == ")") {
            endword()
            if (pat[lv]) { pat[lv] = 0; cmdpos[lv] = 1; continue }
            if (par[lv] > 0) { flushpend(); par[lv]--; cmdpos[lv] = 0; continue }
            if (lv > 0) { flushpend(); lv--; continue }
            continue
        }
        if (c == "<" || c == ">") {
            if (win[lv] && wraw[lv] ~ /^[0-9]+$/) win[lv] = 0        # 2>: a file descriptor
            else endword()
            d = c
            while (substr(s, i + 1, 1) ~ /[<>&|-]/) d = d substr(s, ++i, 1)
            redir[lv] = 1
            if (d ~ /^<<-?$/) hdwant[lv] = 1
            continue
        }
        startword(); wval[lv] = wval[lv] c; wraw[lv] = wraw[lv] c
    }
    endword(); flushpend()
}
{
    if (!(FILENAME in text)) order[++nf] = FILENAME
    text[FILENAME] = text[FILENAME] $0 "\n"
}
END {
    for (k = 1; k <= nf; k++) {
        F = order[k] == alias ? "Makefile" : order[k]
        ncode = 0
        lex(text[order[k]], 1)
        for (c = 1; c <= ncode; c++) lex(code[c], codeline[c])
    }
}
' "$T/Makefile.sh" test/*.sh .ci/run datasets/venv.sh >"$T/uses"

# --- libraries, pkg-config modules, paths, python modules: "KIND NAME FILE LINE"
pyfiles=$(grep -ho 'test/[A-Za-z0-9_/]*\.py' test/*.sh | sort -u)
# shellcheck disable=SC2086
awk '
function out(kind, name) { printf "%s\t%s\t%s\t%d\n", kind, name, FILENAME, FNR }
# the python modules of an import statement at the start of S
function imports(s,    n, m, i, x) {
    if (match(s, /^from[ \t]+[A-Za-z_][A-Za-z0-9_.]*[ \t]+import/)) {
        x = substr(s, 6); sub(/^[ \t]+/, "", x); sub(/[ \t.].*/, "", x); out("py", x); return
    }
    if (!match(s, /^import[ \t]+[A-Za-z_][A-Za-z0-9_., \t]*/)) return     # import A, B.C as D
    n = split(substr(s, 7, RLENGTH - 6), m, ",")
    for (i = 1; i <= n; i++) { sub(/^[ \t]+/, "", m[i]); sub(/[ \t.].*/, "", m[i]); if (m[i] != "") out("py", m[i]) }
}
/^[ \t]*#/ || FILENAME == "test/check_deps.sh" { next }   # this file: its tables
{
    line = $0
    if (FILENAME ~ /\.py$/) { sub(/^[ \t]+/, "", line); imports(line); next }
    # -lNAME: anywhere in the Makefile; in a script, on the lines that link
    if (FILENAME == "Makefile" || line ~ /LIBS|(^|[^A-Za-z0-9_-])(cc|gcc|clang)([^A-Za-z0-9_-]|$)|\$\{?CC/) {
        s = " " line
        while (match(s, /[ \t"\047(=]-l[A-Za-z0-9_+.]+/)) { out("lib", substr(s, RSTART + 3, RLENGTH - 3)); s = substr(s, RSTART + RLENGTH) }
    }
    # pkg-config --OPTION... MODULE...
    s = line
    while (match(s, /pkg-config[ \t]+--/)) {
        s = substr(s, RSTART + 11); x = s
        sub(/[)|;&<>"\047].*/, "", x); sub(/[ \t]+[0-9]+$/, "", x)
        n = split(x, w, /[ \t]+/)
        for (j = 1; j <= n; j++) if (w[j] != "" && w[j] !~ /^[-$]/) out("pc", w[j])
    }
    # /usr/include/DIR and /usr/share/DIR/DIR
    s = line
    while (match(s, /\/usr\/(include|share)\/[A-Za-z0-9_.+-]+(\/[A-Za-z0-9_.+-]+)?/)) {
        x = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
        if (x ~ /^\/usr\/include\//) sub(/^\/usr\/include\/[^\/]+/, "&\001", x); sub(/\001.*/, "", x)
        out("path", x)
    }
    # python: an import at the start of the line, of a -c string, or after a ";"
    if (FILENAME ~ /\.sh$/) {
        n = split(line, st, /(-c[ \t]+["\047]|;)/)
        for (j = 1; j <= n; j++) { x = st[j]; sub(/^[ \t]+/, "", x); imports(x) }
    }
}
' Makefile test/*.sh datasets/venv.sh configs/*.json $pyfiles >>"$T/uses"

# --- resolve: every use has a package of DEB_PKGS (or brought by one), a builtin or a function
resolve() {   # resolve PKGS_FILE [LIST]: messages on stdout; exit 1 on a failure
    awk -F '\t' -v list="${2:-0}" '
    function cl(p, into,    i, n, d) {   # p and what installing p installs, into into[]
        if (p in into) return
        into[p] = 1
        n = split(has[p], d, " ")
        for (i = 1; i <= n; i++) cl(d[i], into)
    }
    FILENAME == ARGV[1] {
        split($0, w, " ")
        if (w[1] == "has") { for (i = 3; i in w; i++) has[w[2]] = has[w[2]] " " w[i]; next }
        pkg[w[1], w[2]] = w[3]; if (w[1] == "path") paths[w[2]] = 1
        next
    }
    FILENAME == ARGV[2] { if ($1 in listed) dup = dup " " $1; listed[$1] = ++npk; order[npk] = $1; next }
    $1 == "FUNC" { fn[$3, $2] = 1; next }
    $1 == "SRC" { src[$3] = src[$3] " " $2; next }
    { nu++; kind[nu] = $1; name[nu] = $2; file[nu] = $3; line[nu] = $4 }
    END {
        n = split(". : [ alias bg break cd command continue echo eval exec exit export false fc fg " \
                  "getopts hash jobs kill local printf pwd read readonly return set shift test times " \
                  "trap true type ulimit umask unalias unset wait", b, " ")
        for (i = 1; i <= n; i++) builtin[b[i]] = 1
        what["cmd"] = "command"; what["lib"] = "library -l"; what["pc"] = "pkg-config module "
        what["path"] = "path "; what["py"] = "python module "
        for (p in listed) cl(p, cov)
        fails = 0
        if (dup != "") { printf "check_deps: FAIL: DEB_PKGS names these more than once:%s\n", dup; fails++ }
        for (u = 1; u <= nu; u++) {
            k = kind[u]; nm = name[u]; f = file[u]; at = f ":" line[u]
            if (k == "cmd") {
                if (nm in builtin) continue
                if ((f, nm) in fn) continue
                m = split(src[f], s, " "); known = 0
                for (i = 1; i <= m; i++) if ((s[i], nm) in fn) known = 1
                if (known) continue
            }
            key = k SUBSEP nm
            if (k == "path") {   # the longest directory of the table holding the path
                best = ""
                for (d in paths) if ((nm == d || index(nm, d "/") == 1) && length(d) > length(best)) best = d
                if (best != "") key = k SUBSEP best
            }
            label = what[k] (k == "cmd" ? " " : "") nm
            if (!(key in pkg)) {
                if (k == "cmd")
                    printf "check_deps: FAIL: %s: %s is neither a shell builtin nor in the command table of test/check_deps.sh: add it with its package (dpkg -S \"$(command -v %s)\")\n", at, label, nm
                else
                    printf "check_deps: FAIL: %s: %s is in no table of test/check_deps.sh: add it with its Debian package\n", at, label
                fails++; continue
            }
            p = pkg[key]
            if (!((k, nm) in seen)) {
                seen[k, nm] = 1; count[k]++
                if (list) printf "  %-4s %-22s %-22s %s\n", k, nm, p, at
            }
            if (p ~ /^@/) continue
            needed[p] = 1
            if (!(p in cov) && !((k, nm, p) in told)) {
                told[k, nm, p] = 1
                printf "check_deps: FAIL: %s: %s comes from the package %s, which DEB_PKGS (Makefile) lacks\n", at, label, p
                fails++
            }
        }
        if (fails) { printf "check_deps: %d problem(s) with DEB_PKGS\n", fails; exit 1 }
        printf "check_deps: ok: the %d packages of DEB_PKGS provide the %d commands, %d libraries, %d pkg-config modules, %d paths and %d python modules that the Makefile, test/*.sh, datasets/venv.sh and configs/ use\n", \
            npk, count["cmd"], count["lib"], count["pc"], count["path"], count["py"]
        unused = ""
        for (i = 1; i <= npk; i++) {
            split("", c1); cl(order[i], c1); u = 0
            for (p in c1) if (p in needed) u = 1
            if (!u) unused = unused " " order[i]
        }
        if (unused != "") printf "check_deps: note: nothing found here uses%s\n", unused
    }' "$T/table" "$1" "$T/uses"
}
fails=0
resolve "$T/pkgs" $list || fails=1

# The check must notice a package taken away: without libpng-dev, and without the compiler.
grep -v -x libpng-dev "$T/pkgs" >"$T/pkgs.nopng"
grep -v -x -e build-essential -e gcc "$T/pkgs" >"$T/pkgs.nocc"
if resolve "$T/pkgs.nopng" >"$T/nopng.out"; then
    echo "check_deps: FAIL: the check passes without libpng-dev in DEB_PKGS"; fails=1
elif ! grep -q "libpng-dev, which DEB_PKGS" "$T/nopng.out"; then
    echo "check_deps: FAIL: without libpng-dev the check fails, but not naming libpng-dev:"; sed 's/^/    /' "$T/nopng.out"; fails=1
fi
if resolve "$T/pkgs.nocc" >"$T/nocc.out"; then
    echo "check_deps: FAIL: the check passes without a compiler in DEB_PKGS"; fails=1
elif ! grep -q "command cc comes from the package gcc" "$T/nocc.out"; then
    echo "check_deps: FAIL: without the compiler the check fails, but not naming cc:"; sed 's/^/    /' "$T/nocc.out"; fails=1
fi
[ $fails -eq 0 ] && echo "check_deps: ok: without libpng-dev, or without the compiler, the check fails"

# --- datasets/deps.sh with stand-ins for the package tools, on a PATH of its own
SH=$(command -v sh)
mkdir "$T/bin" "$T/sudo"
for tool in grep sed tr tail mkdir mktemp dirname env; do
    p=$(command -v "$tool") || { echo "check_deps: FAIL: $tool not found"; exit 1; }
    ln -s "$p" "$T/bin/$tool"
done
cat >"$T/bin/id" <<'EOF'
#!/bin/sh
[ "$1" = -u ] && echo "$FAKE_UID"
EOF
cat >"$T/bin/dpkg-query" <<'EOF'
#!/bin/sh
rc=0
for p in "$@"; do
    case $p in
    -*) ;;
    *) if grep -q -x -- "$p" "$FAKE_DB"; then echo "$p install ok installed"
       else echo "dpkg-query: no packages found matching $p" >&2; rc=1; fi ;;
    esac
done
exit $rc
EOF
cat >"$T/bin/apt-get" <<'EOF'
#!/bin/sh
echo "apt-get $* (DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-})" >>"$FAKE_CALLS"
case $1 in
update) i=0; while [ $i -lt 40 ]; do echo "Get:$i http://deb.example/debian bookworm InRelease"; i=$((i + 1)); done ;;
install)
    if [ -n "${FAKE_FAIL:-}" ]; then echo "Reading package lists..."; echo "E: Unable to locate package $FAKE_FAIL"; exit 100; fi
    for a in "$@"; do
        case $a in install|-*) ;; *) echo "Selecting previously unselected package $a."; echo "Setting up $a ..."; echo "$a" >>"$FAKE_DB" ;; esac
    done ;;
esac
EOF
cat >"$T/sudo/sudo" <<'EOF'
#!/bin/sh
echo "sudo $*" >>"$FAKE_CALLS"
exec "$@"
EOF
chmod +x "$T/bin/id" "$T/bin/dpkg-query" "$T/bin/apt-get" "$T/sudo/sudo"
# deps UID PATH ARGS...: run deps.sh as user UID with PATH; output in $T/out, status in $rc
deps() {
    uid=$1; path=$2; shift 2
    : >"$T/calls"
    env -i PATH="$path" TMPDIR="$T" FAKE_UID="$uid" FAKE_DB="$T/db" FAKE_CALLS="$T/calls" \
        FAKE_FAIL="${FAKE_FAIL:-}" "$SH" datasets/deps.sh "$@" >"$T/out" 2>&1
    rc=$?
}
bad() { echo "check_deps: FAIL: deps.sh: $1"; sed 's/^/    /' "$T/out"; fails=1; }
want() { grep -q -F -- "$1" "$2" 2>/dev/null || bad "$3: no '$1' in $(basename "$2")"; }
printf '%s\n' libc6 zlib1g-dev >"$T/db"
deps 1000 "$T/bin" --check zlib1g-dev
[ $rc -eq 0 ] && [ ! -s "$T/out" ] || bad "--check with everything installed: exit $rc (want 0, silent)"
deps 1000 "$T/bin" --check zlib1g-dev libpng-dev
[ $rc -eq 1 ] || bad "--check with libpng-dev missing: exit $rc, want 1"
want "missing: libpng-dev" "$T/out" "--check with libpng-dev missing"
deps 1000 "$T/bin" --log "$T/log" zlib1g-dev libpng-dev check
[ $rc -eq 2 ] || bad "not root, no sudo: exit $rc, want 2"
want "as root, run:" "$T/out" "not root, no sudo"
want "    apt-get update && apt-get install -y --no-install-recommends libpng-dev check" "$T/out" "not root, no sudo"
[ -s "$T/calls" ] && bad "not root, no sudo: it ran $(cat "$T/calls")"
deps 1000 "$T/sudo:$T/bin" --log "$T/log" zlib1g-dev libpng-dev check
[ $rc -eq 0 ] || bad "not root, with sudo: exit $rc, want 0"
want "through sudo" "$T/out" "not root, with sudo"
want "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libpng-dev check" "$T/calls" "not root, with sudo"
want "apt-get install -y --no-install-recommends libpng-dev check (DEBIAN_FRONTEND=noninteractive)" "$T/calls" "not root, with sudo"
want "Setting up libpng-dev" "$T/log" "not root, with sudo: the log"
grep -q "^Setting up\|^Get:" "$T/out" && bad "apt-get's output reached the terminal"
[ "$(wc -l <"$T/out")" -le 4 ] || bad "installing printed $(wc -l <"$T/out") lines (at most 4 wanted)"
deps 1000 "$T/bin" --check zlib1g-dev libpng-dev check
[ $rc -eq 0 ] || bad "--check after the install: exit $rc, want 0"
FAKE_FAIL=nosuch-pkg deps 0 "$T/sudo:$T/bin" --log "$T/log" nosuch-pkg
[ $rc -eq 1 ] || bad "a failing apt-get install: exit $rc, want 1"
want "output is in $T/log" "$T/out" "a failing apt-get install"
want "E: Unable to locate package nosuch-pkg" "$T/out" "a failing apt-get install"
[ "$(wc -l <"$T/out")" -le 25 ] || bad "a failing install printed $(wc -l <"$T/out") lines (at most 25 wanted)"
grep -q "^sudo" "$T/calls" && bad "root used sudo"
echo "a file" >"$T/file"
deps 0 "$T/bin" --log "$T/file/deps.log" xxd
[ $rc -eq 0 ] || bad "a log that cannot be written: exit $rc, want 0"
want "output in $T/ctrain-deps." "$T/out" "a log that cannot be written: a temporary one instead"
rm "$T/bin/dpkg-query"
deps 0 "$T/bin" zlib1g-dev
[ $rc -eq 2 ] || bad "no dpkg-query: exit $rc, want 2"
want "not a Debian system" "$T/out" "no dpkg-query"
[ $fails -eq 0 ] && echo "check_deps: ok: datasets/deps.sh: --check, not root without sudo (exit 2, the command for root), with sudo, a failing apt-get (the log), an unwritable log, no dpkg"

# --- the tests' Python packages: every module the table says comes from the virtual environment
# (@venv) is pinned in datasets/requirements-test.txt, and every line there is NAME==VERSION
vfails=0
for m in $(awk '$1 == "py" && $3 == "@venv" { print $2 }' "$T/table"); do
    grep -q -i "^$m==" datasets/requirements-test.txt ||
        { echo "check_deps: FAIL: python module $m (@venv in the table) is not pinned in datasets/requirements-test.txt"; vfails=1; }
done
bad_pins=$(grep -v -e '^#' -e '^$' -e '^[A-Za-z0-9_.-]*==[0-9][0-9A-Za-z.]*$' datasets/requirements-test.txt || true)
[ -z "$bad_pins" ] || { echo "check_deps: FAIL: datasets/requirements-test.txt: not NAME==VERSION: $bad_pins"; vfails=1; }

# --- datasets/venv.sh with a stand-in python ($VENV_PYTHON) whose venv module makes an environment
# whose python answers `-c ""` and `-m pip install`, each call logged
mkdir "$T/vpy"
cat >"$T/vpy/python3" <<'PY3'
#!/bin/sh
echo "python3 $*" >>"$FAKE_CALLS"
case "$1 $2" in
"-c import venv, ensurepip") [ -z "${FAKE_NOVENV:-}" ] ;;
"-m venv") for d; do :; done; mkdir -p "$d/bin" && cp "$FAKE_VENV_PY" "$d/bin/python" && chmod +x "$d/bin/python" ;;
*) exit 9 ;;
esac
PY3
cat >"$T/vpy/venv_python" <<'VPY'
#!/bin/sh
echo "env-python $*" >>"$FAKE_CALLS"
case "$1 $2" in
"-c ") exit 0 ;;
"-m pip")
    echo "Collecting tensorboard==2.17.1"
    if [ -n "${FAKE_PIPFAIL:-}" ]; then echo "ERROR: No matching distribution found for $FAKE_PIPFAIL"; exit 1; fi
    echo "Successfully installed tensorboard-2.17.1" ;;
*) exit 9 ;;
esac
VPY
chmod +x "$T/vpy/python3"
printf 'tensorboard==2.17.1\npyarrow==17.0.0\n' >"$T/reqs"
# venv ARGS...: venv.sh ARGS with the stand-in; its output in $T/vout, status in $rc, calls in $T/vcalls
venv() {
    : >"$T/vcalls"
    env VENV_PYTHON="$T/vpy/python3" FAKE_VENV_PY="$T/vpy/venv_python" FAKE_CALLS="$T/vcalls" TMPDIR="$T" \
        FAKE_NOVENV="${FAKE_NOVENV:-}" FAKE_PIPFAIL="${FAKE_PIPFAIL:-}" "$SH" datasets/venv.sh "$@" >"$T/vout" 2>&1
    rc=$?
}
vbad() { echo "check_deps: FAIL: venv.sh: $1"; sed 's/^/    /' "$T/vout"; vfails=1; }
venv --check "$T/env" "$T/reqs"
[ $rc -eq 1 ] || vbad "--check without an environment: exit $rc, want 1"
grep -q "no environment in $T/env" "$T/vout" || vbad "--check without an environment: not said"
venv --log "$T/vlog" "$T/env" "$T/reqs"
[ $rc -eq 0 ] || vbad "making the environment: exit $rc, want 0"
grep -q -x "python3 -m venv --clear --system-site-packages $T/env" "$T/vcalls" ||
    vbad "no 'python3 -m venv --clear --system-site-packages DIR' call: $(cat "$T/vcalls")"
grep -q -x "env-python -m pip install --no-deps --no-input --disable-pip-version-check -r $T/reqs" "$T/vcalls" ||
    vbad "no 'pip install --no-deps ... -r REQUIREMENTS' call: $(cat "$T/vcalls")"
cmp -s "$T/reqs" "$T/env/.requirements" || vbad "the environment is not marked with the requirements it has"
grep -q "Successfully installed" "$T/vlog" || vbad "pip's output is not in the log"
grep -q -e "Successfully installed" -e "Collecting" "$T/vout" && vbad "pip's output reached the terminal"
[ "$(wc -l <"$T/vout")" -le 3 ] || vbad "making the environment printed $(wc -l <"$T/vout") lines (at most 3 wanted)"
venv --check "$T/env" "$T/reqs"
[ $rc -eq 0 ] && [ ! -s "$T/vout" ] || vbad "--check of a complete environment: exit $rc (want 0, silent)"
echo "six==1.17.0" >>"$T/reqs"
venv --check "$T/env" "$T/reqs"
[ $rc -eq 1 ] || vbad "--check after the requirements changed: exit $rc, want 1"
venv --log "$T/vlog" "$T/env" "$T/reqs"
[ $rc -eq 0 ] || vbad "updating the environment: exit $rc, want 0"
grep -q -e "-m venv" "$T/vcalls" && vbad "updating a working environment made it again"
grep -q -e "-m pip install" "$T/vcalls" || vbad "updating the environment did not run pip"
echo "pyarrow==99" >>"$T/reqs"
FAKE_PIPFAIL=pyarrow==99 venv --log "$T/vlog" "$T/env" "$T/reqs"
[ $rc -eq 1 ] || vbad "a failing pip: exit $rc, want 1"
grep -q "output is in $T/vlog" "$T/vout" && grep -q "No matching distribution found for pyarrow==99" "$T/vout" ||
    vbad "a failing pip: the log's path and its end are not shown"
venv --check "$T/env" "$T/reqs"
[ $rc -eq 1 ] || vbad "--check after a failed install: exit $rc, want 1"
printf '#!/bin/sh\nexit 1\n' >"$T/env/bin/python"
venv --log "$T/vlog" "$T/env" "$T/reqs"
grep -q -e "-m venv --clear" "$T/vcalls" || vbad "an environment whose python does not run is not made again"
FAKE_NOVENV=1 venv --log "$T/vlog" "$T/env2" "$T/reqs"
[ $rc -eq 2 ] || vbad "no venv module: exit $rc, want 2"
grep -q "python3-venv" "$T/vout" || vbad "no venv module: python3-venv is not named"
[ -e "$T/env2" ] && vbad "no venv module: it made something"
[ $vfails -eq 0 ] && echo "check_deps: ok: the tests' Python packages are pinned; datasets/venv.sh: --check, made, complete, updated, a failing pip (the log), a broken environment made again, no venv module (exit 2)"
[ $vfails -eq 0 ] || fails=1
exit $fails
