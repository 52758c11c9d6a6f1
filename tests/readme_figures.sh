#!/usr/bin/env bash
# readme_figures.sh EXAMPLES_DIR DATA_DIR - the figures README.md quotes from
# the examples on Fashion-MNIST are the ones they print now. They are exact
# (the same bits on every SIMD path and thread count, as the tests check);
# times are not, and are not compared. On a mismatch it prints what README
# should say. Run from `make test` where the data set is installed.
set -u
cd "$(dirname "$0")/.." || exit 2
ex=${1:?usage: tests/readme_figures.sh EXAMPLES_DIR DATA_DIR} data=${2:?missing DATA_DIR}
status=0

# README's paragraph that starts with $1, joined into one line
paragraph() {
    awk -v start="$1" 'index($0, start) == 1 { on = 1 } on && /^$/ { exit } on { printf "%s ", $0 }' README.md |
        tr -s ' '
}

# 1. the sample fit line: make demo's 256-unit model under mixed_float16,
#    its last epoch, from the loss on
want=$("$ex/mnist_mlp" --units 256 --epochs 2 --batch-size 128 --policy mixed_float16 --data "$data" |
    grep '^375/375 ' | tail -n 1 | sed 's/.*s\/step - //')
have=$(grep '^    375/375 ' README.md | sed 's/.*s\/step - //')
if [ -z "$want" ] || [ "$want" != "$have" ]; then
    status=1
    echo "README's sample fit line ends \"$have\"; mnist_mlp prints \"$want\""
fi

# 2. the custom loop's loss scale settling, its skipped steps and accuracy
cmd='./build/custom_loop --units 128 --epochs 2 --initial-scale 16777216'
out=$("$ex/custom_loop" ${cmd#./build/custom_loop } --data "$data")
steps=$(echo "$out" | sed -n 's/^ *step *\([0-9]*\): loss scale.*/\1/p')
last=$(echo "$out" | grep '^Epoch' | tail -n 1)
scale=$(echo "$last" | sed -n 's/.*loss scale \([0-9]*\),.*/\1/p')
accuracy=$(echo "$last" | sed -n 's/.*test accuracy=\([0-9.]*\).*/\1/p')
list=$(echo $steps | sed 's/ /, /g; s/\(.*\), /\1 and /')
want="it halves and skips at steps $list ($(echo "$steps" | wc -w) skipped steps), then holds at $scale; test accuracy $accuracy after two epochs."
have=$(paragraph "\`$cmd\`")
case $have in
*"$want"*) ;;
*) status=1; echo "README's paragraph on \`$cmd\` should say: $want" ;;
esac
exit $status
