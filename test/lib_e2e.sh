# lib_e2e.sh: helpers shared by the end-to-end scripts (not itself a test); sourced from the repository root
# (`. test/lib_e2e.sh`). Each check prints "ok   ..." or "FAIL ..."; $fails counts failures.
fails=0
ok()  { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
# has FILE PATTERN DESCRIPTION: FILE contains PATTERN (grep), else show the end of FILE.
has() { if grep -q -- "$2" "$1"; then ok "$3"; else bad "$3: no '$2'"; sed 's/^/     /' "$1" | tail -5; fi; }
