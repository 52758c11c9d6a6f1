#!/usr/bin/env bash
# readme_figures.sh EXAMPLES_DIR DATA_DIR - the exact figures README.md and
# docs/*.md quote from programs are the ones those programs print now: the
# quick start's casts, the sample fit line of the guide's model and the custom
# loop's loss scale on Fashion-MNIST. They are exact (the same bits on every
# SIMD path and thread count, as the tests check); times are not, and are not
# compared, and neither are check counts. On a mismatch it prints what the
# page should say. Run from `make test` where the data set is installed.
set -u
cd "$(dirname "$0")/.." || exit 2
ex=${1:?usage: tests/readme_figures.sh EXAMPLES_DIR DATA_DIR} data=${2:?missing DATA_DIR}
pages="README.md docs/*.md"
status=0

# the paragraph of the pages that starts with $1, joined into one line
paragraph() {
    awk -v start="$1" 'index($0, start) == 1 { on = 1 } on && /^$/ { exit } on { printf "%s ", $0 }' $pages |
        tr -s ' '
}

# 1. README's quick start: what its casts print (the block after "It prints")
dir=$(mktemp -d) || exit 2
trap 'rm -rf "$dir"' EXIT
awk '/^```c$/ { on = 1; next } on && /^```$/ { exit } on' README.md > "$dir/quick_start.c"
want=$(awk '/^It prints/ { on = 1 } on && /^```text$/ { t = 1; next } t && /^```$/ { exit } t' README.md)
if ! ${CC:-cc} -std=c99 -O2 -I. "$dir/quick_start.c" -o "$dir/quick_start" -lm; then
    status=1; echo "README's quick start does not build"
else
    have=$("$dir/quick_start" | head -n "$(echo "$want" | wc -l)")
    if [ -z "$want" ] || [ "$want" != "$have" ]; then
        status=1
        printf "README's quick start output should say:\n%s\n" "$have"
    fi
fi

# 2. the sample fit line: make demo's 256-unit model under mixed_float16,
#    its last epoch, from the loss on
want=$("$ex/mnist_mlp" --units 256 --epochs 2 --batch-size 128 --policy mixed_float16 --data "$data" |
    grep '^375/375 ' | tail -n 1 | sed 's/.*s\/step - //')
have=$(grep -h '^    375/375 ' $pages | sed 's/.*s\/step - //')
if [ -z "$want" ] || [ "$want" != "$have" ]; then
    status=1
    echo "the sample fit line ends \"$have\"; mnist_mlp prints \"$want\""
fi

# 3. the custom loop's loss scale settling, its skipped steps and accuracy
cmd='./build/custom_loop --units 128 --epochs 2 --initial-scale $((1 << 24))'
out=$("$ex/custom_loop" --units 128 --epochs 2 --initial-scale $((1 << 24)) --data "$data")
steps=$(echo "$out" | sed -n 's/^ *step *\([0-9]*\): loss scale.*/\1/p')
last=$(echo "$out" | grep '^Epoch' | tail -n 1)
scale=$(echo "$last" | sed -n 's/.*loss scale \([0-9]*\),.*/\1/p')
accuracy=$(echo "$last" | sed -n 's/.*test accuracy=\([0-9.]*\).*/\1/p')
list=$(echo $steps | sed 's/ /, /g; s/\(.*\), /\1 and /')
want="it halves and skips at steps $list ($(echo "$steps" | wc -w) skipped steps), then holds at $scale; test accuracy $accuracy after two epochs."
have=$(paragraph "\`$cmd\`")
case $have in
*"$want"*) ;;
*) status=1; echo "the paragraph on \`$cmd\` should say: $want" ;;
esac
exit $status
