#!/usr/bin/env bash
# doc_snippets.sh COMPILER [DIR] - compiles every code block of README.md, of
# docs/*.md and of mixprec.h's doc block, as written, with the project's
# warnings as errors,
# so that the documentation cannot drift from the API. COMPILER is gcc or
# clang (the C blocks: -std=c99 -Wall -Wextra -Wpedantic -Werror) or g++
# (the C++ blocks: -std=c++11 and the same warnings). Its files go into
# DIR/COMPILER (build/snippets/COMPILER). Run from `make test`.
#
# Which text is a code block:
# - README.md and docs/*.md: a fenced block tagged ```c is C, one tagged
#   ```cpp is C++.
#   Blocks with any other tag or none (```text, ```sh, program output) and
#   indented blocks are not compiled: use them for what is not C.
# - mixprec.h: in the doc block (the comment that opens the file), a block is
#   a run of lines indented by 8 spaces or more, after a blank line, whose
#   first line is indented by exactly 8. It is C++ when the last line of
#   text before it ends with "C++:", C otherwise.
#
# How a block is compiled:
# - A block that defines main() is a whole program: compiled and linked
#   (-lm) exactly as written, as a user would from the repository's root.
# - Any other block is a fragment of a program. Its leading preprocessor
#   lines stay at file scope, followed by #include "mixprec.h"; the rest is
#   the body of a function, `void snippet(PARAMS) { ... }`. PARAMS declares
#   what the fragment uses without declaring it (a model the text before it
#   built, ...): in a Markdown file an HTML comment on the line before the fence,
#   <!-- snippet(mp_model *m, mp_fit_desc fd) -->, which Markdown does not
#   show; without one, and always in the doc block, (void): the fragment
#   declares everything it uses. Fragments are compiled, not linked.
# - A block that includes mpi/mixprec_mpi.h gets MPI's include flags from
#   `mpicc --showme:compile`; without mpicc it is skipped, by name.
# Errors point at the block's lines in the page (README.md, docs/NAME.md) or
# mixprec.h (#line).
set -u
cd "$(dirname "$0")/.." || exit 2
cc=${1:?usage: tests/doc_snippets.sh gcc|clang|g++}
D=${2:-build/snippets}/$cc
rm -rf "$D" && mkdir -p "$D"
WARNINGS="-Wall -Wextra -Wpedantic -Werror"
case $cc in
*++) want=cpp flags="-std=c++11 $WARNINGS -x c++" ;;
*) want=c flags="-std=c99 $WARNINGS" ;;
esac

# Writes each block as $D/SOURCE_LINE.LANG (SOURCE: the file's path with _ for
# /, LINE: the block's first line),
# the fragments already wrapped as described above.
awk -v dir="$D" '
function emit(src, line, lang, params,    i, n, head, body, text, file) {
    n = 0; head = ""; body = ""
    for (i = 1; i <= nlines; i++) if (lines[i] ~ /(^|[^a-z_])main[ \t]*\(/) n = 1
    file = src; gsub(/\//, "_", file); file = dir "/" file "_" line "." lang
    if (n) { # a whole program, as written
        printf "#line %d \"%s\"\n", line, src > file
        for (i = 1; i <= nlines; i++) print lines[i] > file
    } else {
        for (i = 1; i <= nlines && lines[i] ~ /^[ \t]*(#.*)?$/; i++) head = head lines[i] "\n"
        printf "#line %d \"%s\"\n%s#include \"mixprec.h\"\nvoid snippet(%s) {\n#line %d \"%s\"\n",
               line, src, head, params == "" ? "void" : params, line + i - 1, src > file
        for (; i <= nlines; i++) print lines[i] > file
        print "}" > file
    }
    close(file)
    nlines = 0
}
FNR == 1 { inblock = 0; prev = ""; prevtext = ""; doc = (FILENAME ~ /\.h$/) }
# Markdown pages: fenced blocks
!doc && !inblock && /^```(c|cpp)[ \t]*$/ {
    inblock = 1; lang = substr($0, 4); sub(/[ \t]+$/, "", lang); start = FNR + 1; nlines = 0
    params = ""
    if (match(prev, /^<!-- snippet\(.*\) -->$/)) { params = prev; sub(/^<!-- snippet\(/, "", params); sub(/\) -->$/, "", params) }
    next
}
!doc && inblock && /^```[ \t]*$/ { emit(FILENAME, start, lang, params); inblock = 0; next }
!doc && inblock { lines[++nlines] = $0; next }
!doc { prev = $0; next }
# mixprec.h: indented blocks in the doc block, which ends at the first "*/"
doc && done { next }
doc && /^\*\// { if (inblock) emit("mixprec.h", start, lang, ""); done = 1; next }
doc && inblock && ($0 ~ /^        / || $0 ~ /^[ \t]*$/) { lines[++nlines] = substr($0, 9); next }
doc && inblock {
    while (nlines > 0 && lines[nlines] ~ /^[ \t]*$/) nlines--
    emit("mixprec.h", start, lang, ""); inblock = 0
}
doc && !inblock && /^        [^ ]/ && prev ~ /^[ \t]*$/ {
    inblock = 1; start = FNR; nlines = 0; lines[++nlines] = substr($0, 9)
    lang = (prevtext ~ /C\+\+:[ \t]*$/) ? "cpp" : "c"
    next
}
doc { if ($0 !~ /^[ \t]*$/) prevtext = $0; prev = $0 }
' README.md docs/*.md mixprec.h

status=0 count=0
for f in "$D"/*."$want"; do
    [ -e "$f" ] || continue
    count=$((count + 1))
    extra=
    if grep -q 'mixprec_mpi\.h' "$f"; then # MPI's headers: where mpicc says they are
        if ! extra=$(mpicc --showme:compile 2>/dev/null); then
            echo "$(basename "$f"): skipped (mpicc not found: apt-get install libopenmpi-dev)"
            continue
        fi
    fi
    if grep -Eq '(^|[^a-z_])main[[:space:]]*\(' "$f"; then
        out=$($cc $flags -O2 -I. $extra "$f" -o "${f%.*}" -lm 2>&1)
    else
        out=$($cc $flags -O2 -I. $extra -c "$f" -o "${f%.*}.o" 2>&1)
    fi
    if [ $? -ne 0 ]; then
        status=1
        echo "$(basename "$f"): does not compile as written ($cc):"
        echo "$out" | head -20
    fi
done
if [ "$count" -eq 0 ]; then echo "no $want code blocks found: the extraction is broken"; exit 1; fi
echo "$count $want code blocks compiled with $cc"
exit $status
