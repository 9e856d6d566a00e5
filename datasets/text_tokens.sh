#!/bin/sh
# text_tokens.sh: byte-level token files for a language model from text files: every byte is one
# token (vocabulary 256), in ctrain's tokens format (docs/formats.md), through
# `ctrain pack --from text`. `make data-text` runs it on the licence texts every Debian system has.
#
# Usage: datasets/text_tokens.sh [--eval-fraction F] [--ctrain BIN] OUT_DIR FILE...
#   --eval-fraction F  the last F of the bytes go to OUT_DIR/eval.bin, the rest to OUT_DIR/train.bin
#                      (default 0.05); 0: one file, OUT_DIR/tokens.bin
#   --ctrain BIN       the ctrain to run (default: build/ctrain next to this script, else ctrain on PATH)
# The files are joined in byte-wise name order (LC_ALL=C sort), so the same files give the same
# tokens whatever the order or locale they were named in. gzip'd files (.gz or gzip's magic) would
# be packed as compressed bytes, and directories or unreadable files cannot be: those are skipped,
# each named on stderr. Exit status: ctrain pack's (2 usage, 3 unreadable data), 2 when no file is
# left.
set -eu
usage="usage: datasets/text_tokens.sh [--eval-fraction F] [--ctrain BIN] OUT_DIR FILE..."
frac=0.05
ctrain=""
while [ $# -gt 0 ]; do
    case $1 in
    --eval-fraction) [ $# -ge 2 ] || { echo "text_tokens: --eval-fraction needs a value; $usage" >&2; exit 2; }
        frac=$2; shift 2 ;;
    --ctrain) [ $# -ge 2 ] || { echo "text_tokens: --ctrain needs a path; $usage" >&2; exit 2; }
        ctrain=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "text_tokens: unknown option $1; $usage" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -ge 2 ] || { echo "text_tokens: need an output directory and at least one file; $usage" >&2; exit 2; }
out=$1
shift
if [ -z "$ctrain" ]; then
    here=$(dirname "$0")
    if [ -x "$here/../build/ctrain" ]; then ctrain=$here/../build/ctrain; else ctrain=ctrain; fi
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/text_tokens.XXXXXX")
trap 'rm -rf "$T"' EXIT
# One name a line: a name holding a newline would be split, so such files are skipped.
for f in "$@"; do
    case $f in
    *'
'*) echo "text_tokens: skipping a file whose name holds a newline" >&2; continue ;;
    esac
    if [ ! -f "$f" ] || [ ! -r "$f" ]; then
        echo "text_tokens: skipping $f: not a readable regular file" >&2; continue
    fi
    # gzip's magic 1f 8b, read with od (a .gz name alone would miss renamed files)
    case $f in *.gz) magic="1f8b" ;; *) magic=$(od -A n -t x1 -N 2 "$f" | tr -d ' \n') ;; esac
    if [ "$magic" = "1f8b" ]; then
        echo "text_tokens: skipping $f: gzip'd (decompress it first)" >&2; continue
    fi
    printf '%s\n' "$f"
done | LC_ALL=C sort >"$T/files"
n=$(wc -l <"$T/files")
[ "$n" -gt 0 ] || { echo "text_tokens: no readable text file among the $# named" >&2; exit 2; }
set --
while IFS= read -r f; do
    # a name starting with "-" would read as an option of ctrain pack
    case $f in -*) f=./$f ;; esac
    set -- "$@" "$f"
done <"$T/files"
if [ "$frac" = 0 ]; then
    "$ctrain" pack --from text "$@" --out "$out"
else
    "$ctrain" pack --from text "$@" --out "$out" --eval-fraction "$frac"
fi
