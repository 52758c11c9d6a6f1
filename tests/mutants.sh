#!/usr/bin/env bash
# mutants.sh [--fast] [NAME...] - whether `make check` catches small bugs.
# Each mutant below is a one-line change to the library (a file, a string
# that occurs in it exactly once, its replacement, and the bug it plants);
# each must make `make check` fail. The script copies the tree once into a
# temporary directory (never touching the working files), applies each
# mutant there in turn, runs `make check` and prints, per mutant, `caught`,
# `MISSED`, `no-build` (the mutant does not compile: fix the list) or
# `stale` (its string is not in the file, or not once: the code moved on;
# fix the list). The last line is `N caught, N missed, N stale`; the exit
# status is 0 when every mutant was caught.
#
# --fast: instead of the whole `make check`, the mutant's `first` programs,
# then the rest of the list (`make -s print-tests`), one at a time with the
# same --quick, stopping at the first that fails: the same verdict (make
# check fails exactly when one of its programs does), much sooner.
# --list: each mutant's name and why, or `stale`, without building.
# NAME...: only those mutants. Slow (each mutant rebuilds the tests): run it
# before a release, not in `make test`. Needs bash, make, gcc, tar, perl.
set -u
cd "$(dirname "$0")/.." || exit 2
fast=0 list=0
case ${1:-} in
--fast) fast=1; shift ;;
--list) list=1; shift ;;
esac

# name, file, first (the programs expected to catch it), why, from, to: one
# record per mutant, blank lines between. `\n` in from and to is a newline.
MUTANTS=$(cat <<'EOF'
name  numbers/f16_sub_reversed
file  mixprec.h
first core numerics
why   float16 subtraction computes b - a
from  MP__ARITH(mp_f16, sub, x - y);
to    MP__ARITH(mp_f16, sub, y - x);

name  numbers/f16_round_ties_away
file  mixprec.h
first core numerics
why   float32 -> float16 rounds ties away from zero, not to even
from  uint32_t normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
to    uint32_t normal = (a - 0x38000000u + 0x1000u) >> 13;

name  numbers/bf16_truncates
file  mixprec.h
first core numerics
why   float32 -> bfloat16 truncates instead of rounding
from  uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
to    uint32_t rounded = x >> 16;

name  numbers/f16_subnormal_widen
file  mixprec.h
first core numerics
why   float16 subnormals widen to twice their value
from  uint32_t sub = (113u - k) << 23 | (m & 0x3FFu) << 13; /* 2^(10-k-24), biased */
to    uint32_t sub = (114u - k) << 23 | (m & 0x3FFu) << 13; /* 2^(10-k-24), biased */

name  numbers/signed_zero_unequal
file  mixprec.h
first core
why   +0 and -0 compare unequal (IEEE 754 5.11: they are equal)
from  static int mp__h_eq(uint16_t a, uint16_t b, uint16_t inf) { return !mp__h_unordered(a, b, inf) && mp__h_key(a) == mp__h_key(b); }
to    static int mp__h_eq(uint16_t a, uint16_t b, uint16_t inf) { return !mp__h_unordered(a, b, inf) && a == b; }

name  casts/overflow_threshold
file  mixprec.h
first core numerics
why   the cast stats miss the float16 overflow at exactly 65520 (the tie that rounds to Inf)
from  {0x33000001u, 0x387FE000u, 0x477FF000u},  /* float16
to    {0x33000001u, 0x387FE000u, 0x477FF001u},  /* float16

name  casts/underflow_threshold
file  mixprec.h
first core numerics
why   the cast stats count 2^-25 (the tie that rounds to zero) as a subnormal result
from  {0x33000001u, 0x387FE000u, 0x477FF000u},  /* float16
to    {0x33000000u, 0x387FE000u, 0x477FF000u},  /* float16

name  casts/overflow_not_added_up
file  mixprec.h
first core numerics
why   a call's overflow count is its last block's, not the sum over its blocks
from  st->overflow += s->overflow;
to    st->overflow = s->overflow;

name  casts/min_abs_stuck_at_zero
file  mixprec.h
first core numerics
why   min_abs never leaves its initial zero
from  if (st->min_abs == 0.0f || lo < st->min_abs) st->min_abs = lo;
to    if (lo < st->min_abs) st->min_abs = lo;

name  matmul/transposed_run_flags
file  mixprec.h
first gemm
why   the product run as C^T = op(B)^T op(A)^T keeps the operands' transposes instead of flipping them
from  t.trans_a = !g->trans_b, t.trans_b = !g->trans_a;
to    t.trans_a = g->trans_b, t.trans_b = g->trans_a;

name  matmul/split_k_drops_slice
file  mixprec.h
first gemm
why   the split-K merge adds every thread's slices but the last
from  for (j = j0; j < j1; j++) mp__add_run(acc, ws[u].part + (j - j0) * s->stride + r * g->n, g->n);
to    for (j = j0; j + 1 < j1; j++) mp__add_run(acc, ws[u].part + (j - j0) * s->stride + r * g->n, g->n);

name  matmul/bias_from_column_0
file  mixprec.h
first gemm train
why   the epilogue adds the bias of the first panel's columns to every panel
from  mp__load(tmp, mp__at(g->bias, g->biast, j0), g->biast, nc);
to    mp__load(tmp, mp__at(g->bias, g->biast, 0), g->biast, nc);

name  layers/col2im_row_stride
file  mixprec.h
first train
why   col2im (the convolution's input gradient) steps columns by the row stride
from  int iy = oy * g->sh - g->pt + ky, ix = ox * g->sw - g->pl + kx;\n                        float *px;
to    int iy = oy * g->sh - g->pt + ky, ix = ox * g->sh - g->pl + kx;\n                        float *px;

name  layers/col2im_top_pad_for_left
file  mixprec.h
first train
why   col2im (the convolution's input gradient) pads columns by the top padding
from  int iy = oy * g->sh - g->pt + ky, ix = ox * g->sw - g->pl + kx;\n                        float *px;
to    int iy = oy * g->sh - g->pt + ky, ix = ox * g->sw - g->pt + kx;\n                        float *px;

name  layers/im2col_top_pad_for_left
file  mixprec.h
first train
why   im2col pads columns by the top padding
from  int iy = oy * g->sh - g->pt + ky, ix = ox * g->sw - g->pl + kx;\n                        if (iy < 0
to    int iy = oy * g->sh - g->pt + ky, ix = ox * g->sw - g->pt + kx;\n                        if (iy < 0

name  layers/max_pool_last_tie
file  mixprec.h
first train
why   max pooling gives a tie's gradient to the last maximum (Keras/TensorFlow: the first)
from  if (pos == 0 || t[j] > best[j] || (t[j] != t[j] && best[j] == best[j])) { best[j] = t[j]; arg[j] = pos; }
to    if (pos == 0 || t[j] >= best[j] || (t[j] != t[j] && best[j] == best[j])) { best[j] = t[j]; arg[j] = pos; }

name  layers/dropout_backward_unscaled
file  mixprec.h
first train
why   Dropout's backward pass leaves out the 1 / (1 - rate) scale its forward applied
from  batch * l->in_size, mp__dropout_scale(l));
to    batch * l->in_size, 1.0f);

name  layers/dropout_scale_rate
file  mixprec.h
first train
why   Dropout scales by 1 / rate instead of 1 / (1 - rate) (the same at 0.5)
from  static float mp__dropout_scale(const mp__layer *l) { return 1.0f / (1.0f - l->desc.rate); }
to    static float mp__dropout_scale(const mp__layer *l) { return 1.0f / l->desc.rate; }

name  layers/relu_grad_at_zero
file  mixprec.h
first train
why   relu's gradient passes where its output is 0 (in a run's tail past blocks of 16)
from  for (; j < n; j++) g[j] = y[j] > 0.0f ? g[j] : 0.0f;
to    for (; j < n; j++) g[j] = y[j] >= 0.0f ? g[j] : 0.0f;

name  losses/logits_shift_first
file  mixprec.h
first train
why   crossentropy from logits shifts by the first logit, not the largest: exp overflows on a wide spread
from  (void)mp__argmax_value(p, n, &mx);
to    mx = p[0];

name  losses/binary_logits_unstable
file  mixprec.h
first train
why   binary crossentropy from logits takes exp(-z), which overflows for z far below 0
from  loss += (v > 0.0f ? v : 0.0f) - v * y + log1pf(expf(-fabsf(v)));
to    loss += (v > 0.0f ? v : 0.0f) - v * y + log1pf(expf(-v));

name  losses/mse_gradient_half
file  mixprec.h
first train
why   mean squared error's gradient without its factor 2
from  p[j] = 2.0f * d * inv_n;
to    p[j] = d * inv_n;

name  losses/argmax_last_tie
file  mixprec.h
first train
why   accuracy's argmax takes the last of equal maxima (Keras/NumPy: the first)
from  return a > b || (a == b && i < j);
to    return a > b || (a == b && i > j);

name  optimizers/nesterov_sign
file  mixprec.h
first train
why   Nesterov's step adds lr g instead of subtracting it (w += momentum m + lr g)
from  wv = P##add(wv, o->nesterov ? P##sub(P##mul(P##set(o->momentum), m), lr_g) : m);
to    wv = P##add(wv, o->nesterov ? P##add(P##mul(P##set(o->momentum), m), lr_g) : m);

name  optimizers/nesterov_ignored
file  mixprec.h
first train
why   SGD ignores nesterov (plain momentum)
from  wv = P##add(wv, o->nesterov ? P##sub(P##mul(P##set(o->momentum), m), lr_g) : m);
to    wv = P##add(wv, m);

name  optimizers/momentum_ignored
file  mixprec.h
first train
why   the velocity keeps all of itself (momentum taken as 1)
from  P##f m = P##sub(P##mul(P##set(o->momentum), P##ld(s1)), lr_g);
to    P##f m = P##sub(P##ld(s1), lr_g);

name  optimizers/rmsprop_epsilon_outside
file  mixprec.h
first train
why   RMSprop divides by sqrt(v) + eps (Keras 3: sqrt(v + eps))
from  wv = P##sub(wv, P##div(lr_g, P##sqrt(P##add(v, P##set(o->epsilon)))));
to    wv = P##sub(wv, P##div(lr_g, P##add(P##sqrt(v), P##set(o->epsilon))));

name  optimizers/adam_no_bias_correction
file  mixprec.h
first train
why   Adam's step without the first moment's bias correction
from  sqrtf(1.0f - powf(o->beta_2, t)) / (1.0f - powf(o->beta_1, t)) : 0.0f;
to    sqrtf(1.0f - powf(o->beta_2, t)) : 0.0f;

name  loss_scaling/growth_late
file  mixprec.h
first train
why   the loss scale doubles one good step after growth_interval
from  if (++ls->good_steps >= (uint64_t)ls->config.growth_interval) {
to    if (++ls->good_steps > (uint64_t)ls->config.growth_interval) {

name  loss_scaling/quartered
file  mixprec.h
first train
why   a non-finite step quarters the scale instead of halving it
from  float halved = ls->scale * 0.5f;
to    float halved = ls->scale * 0.25f;

name  loss_scaling/good_steps_kept
file  mixprec.h
first train
why   a skipped step does not restart the count of good steps
from      ls->good_steps = 0;\n    if (--ls->overflows_left <= 0) {
to        if (--ls->overflows_left <= 0) {

name  loss_scaling/no_ceiling
file  mixprec.h
first train
why   the scale grows past max_scale
from  if (grown <= ls->config.max_scale) ls->scale = grown;
to    ls->scale = grown;

name  checkpoints/crc_unchecked
file  mixprec.h
first checkpoint
why   a corrupt checkpoint is read: the checksum is not compared
from  if (mp__crc32(b, len - 4) != mp__le_get(b + len - 4, 4))
to    if (0)

name  checkpoints/overflows_left_unchecked
file  mixprec.h
first reliability checkpoint
why   a checkpoint whose loss scale state has no overflows left is accepted
from  c->ls.overflows_left < 1 || c->ls.overflows_left > ls.config.hysteresis ||
to    c->ls.overflows_left > ls.config.hysteresis ||

name  checkpoints/nesterov_not_restored
file  mixprec.h
first checkpoint
why   loading a checkpoint keeps the model's own nesterov flag, not the file's
from  to->cfg.nesterov = mp__io_int(io, from->cfg.nesterov);
to    to->cfg.nesterov = ((void)mp__io_int(io, from->cfg.nesterov), from->cfg.nesterov);

name  amp/exp_on_infer_list
file  mixprec.h
first amp
why   AMP puts Exp on the float16 infer list (TensorFlow: deny)
from  {"Exp", MP__DENY, MP__DENY},
to    {"Exp", MP__INFER, MP__DENY},
EOF
)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mixprec-mutants.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$tmp" || exit 2
tests=$(make -s --no-print-directory print-tests) || exit 2

# check_fast FIRST: the programs FIRST, then the others of the list, until one fails
check_fast() {
    local t done=" "
    for t in $1 $tests; do
        case $done in *" $t "*) continue ;; esac
        done+="$t "
        make -s -C "$tmp" "build/test_$t" >"$tmp/out" 2>&1 || return 2
        timeout 900 "$tmp/build/test_$t" --quick >"$tmp/out" 2>&1 || { caught_by=test_$t; return 1; }
    done
    return 0
}
check_whole() {
    timeout 3600 make -s -C "$tmp" check >"$tmp/out" 2>&1 && return 0
    caught_by=$(sed -n 's/^FAIL  \(test_[a-z]*\).*/\1/p' "$tmp/out" | tr '\n' ' ')
    [ -n "$caught_by" ] && return 1
    return 2
}

caught=0 missed=0 stale=0 nobuild=0
while IFS= read -r -d '' record; do
    declare -A f=()
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        key=${line%% *} value=${line#* }
        value=${value#"${value%%[! ]*}"} # leading spaces
        f[$key]=${value//\\n/$'\n'}
    done <<<"$record"
    name=${f[name]:-}
    [ -n "$name" ] || continue
    if [ $# -gt 0 ]; then
        case " $* " in *" $name "*) ;; *) continue ;; esac
    fi
    file=$tmp/${f[file]}
    n=$(FROM=${f[from]} perl -0777 -ne 'my $n = () = /\Q$ENV{FROM}\E/g; print $n' "$file")
    if [ "$n" != 1 ]; then
        stale=$((stale + 1)); printf '%-42s stale (its string is %s times in %s)\n' "$name" "$n" "${f[file]}"
        continue
    fi
    if [ $list = 1 ]; then printf '%-42s %s\n' "$name" "${f[why]}"; continue; fi
    cp "$file" "$tmp/original"
    FROM=${f[from]} TO=${f[to]} perl -0777 -pi -e 's/\Q$ENV{FROM}\E/$ENV{TO}/' "$file"
    caught_by=
    if [ $fast = 1 ]; then check_fast "${f[first]:-}"; else check_whole; fi
    rc=$?
    cp "$tmp/original" "$file"
    case $rc in
    0) missed=$((missed + 1)); printf '%-42s MISSED: %s\n' "$name" "${f[why]}" ;;
    1) caught=$((caught + 1)); printf '%-42s caught (%s)\n' "$name" "${caught_by% }" ;;
    *) nobuild=$((nobuild + 1)); printf '%-42s no-build: %s\n' "$name" "$(grep -m1 -i error "$tmp/out")" ;;
    esac
done < <(printf '%s\n\n' "$MUTANTS" | awk 'BEGIN { RS = ""; ORS = "\0" } { print }')
if [ $list = 1 ]; then echo "$stale stale"; [ $stale -eq 0 ]; exit; fi
echo "$caught caught, $missed missed, $stale stale, $nobuild no-build"
[ $missed -eq 0 ] && [ $stale -eq 0 ] && [ $nobuild -eq 0 ]
