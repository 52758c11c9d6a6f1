#!/usr/bin/env bash
# matrix.sh - the build and test matrix behind `make test`. Each build or
# check counts as one test; each test binary adds its own tally (its line
# `NAME: N passed, N failed`). Only bash, make and gcc are needed: a step
# whose tool is missing (clang, g++, a sanitizer runtime, a cross compiler,
# ...) is a named skip, never a failure, and the run ends with one line
# naming what was skipped and the apt-get line that enables it (`make deps`
# installs it all). The last line is `N passed, N failed[, N skipped]`.
set -u
cd "$(dirname "$0")/.." || exit 2
B=${B:-build}/matrix
mkdir -p "$B"
WARN="-std=c99 -Wall -Wextra -Wpedantic -Werror"
CORE="$WARN -Wconversion -Wdouble-promotion -Wshadow"  # the header itself: strictest
SAN="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
passed=0 failed=0 skipped=0

have() { command -v "$1" >/dev/null 2>&1; }

# The Debian package (bookworm) of each tool a step may name.
declare -A PACKAGE=([gcc]=gcc [g++]=g++ [clang]=clang [clang++]=clang
                    [s390x-linux-gnu-gcc]="gcc-s390x-linux-gnu libc6-dev-s390x-cross")

# usable CMD...: whether the compiler (or tool) CMD starts with is here and,
# when CMD builds with sanitizers, links their runtimes; if not, sets
# $why and $pkgs for skip.
declare -A SAN_OK=()
usable() {
    local tool=$1 lang=c
    case $tool in make | bash) return 0 ;; esac
    if ! have "$tool"; then
        why="$tool not installed" pkgs=${PACKAGE[$tool]:-$tool}
        return 1
    fi
    case " $* " in *" -fsanitize=address,undefined "*) ;; *) return 0 ;; esac
    case $tool in *++) lang=c++ ;; esac
    if [ -z "${SAN_OK[$tool]:-}" ]; then
        SAN_OK[$tool]=no
        echo 'int main(void) { return 0; }' | $tool $SAN -x $lang - -o $B/san_probe >/dev/null 2>&1 && SAN_OK[$tool]=yes
    fi
    [ "${SAN_OK[$tool]}" = yes ] && return 0
    why="$tool's ASan and UBSan runtimes not installed"
    pkgs=$(sanitizer_package "$tool")
    return 1
}

# The package of a compiler's sanitizer runtimes: clang's are versioned
# (libclang-rt-14-dev on bookworm), gcc's come with gcc.
sanitizer_package() {
    case $1 in
    clang*) echo "libclang-rt-$($1 -dumpversion | cut -d. -f1)-dev" ;;
    *) echo "$1" ;;
    esac
}

# The sanitizer probes once, before the jobs (each job has its own copy
# of SAN_OK).
for tool in gcc clang g++ clang++; do usable $tool $SAN || true; done

# step NAME CMD...: a build or check that passes or fails as a whole; skipped
# (and so is the run after it) when its tool is missing
step_skipped=0
step() {
    local name=$1 out
    shift
    step_skipped=0
    if ! usable "$@"; then step_skipped=1; skip "$name" "$why" "$pkgs"; return; fi
    if out=$("$@" 2>&1); then
        passed=$((passed + 1)); echo "ok    $name"
    else
        failed=$((failed + 1)); echo "FAIL  $name"; echo "$out" | head -25 | sed 's/^/      /'
    fi
}

# run NAME CMD...: a test binary; adds its tally, and one failure if it
# crashed or exited non-zero without reporting one. LIVE=1: its output is
# shown as it comes (a long test's progress), not only at the end.
run() {
    local name=$1 out rc tally p f
    shift
    if [ "$step_skipped" = 1 ]; then skip "$name" "$why" "$pkgs"; return; fi
    if [ "${LIVE:-0}" = 1 ]; then
        "$@" 2>&1 | tee $B/live.log | sed -u 's/^/      /'; rc=${PIPESTATUS[0]}
        out=$(cat $B/live.log)
    else
        out=$("$@" 2>&1); rc=$?
    fi
    tally=$(echo "$out" | grep -E '^[a-z_]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    p=0 f=0
    if [ -n "$tally" ]; then
        p=$(echo "$tally" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
        f=$(echo "$tally" | sed -E 's/.* ([0-9]+) failed$/\1/')
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" -eq 0 ]; then echo "ok    $name ($p checks)"; else echo "FAIL  $name"; fi
    if [ "$f" -ne 0 ] && [ "${LIVE:-0}" = 1 ]; then return; fi
    if [ "$f" -ne 0 ] || [ "${VERBOSE:-0}" = 1 ]; then echo "$out" | sed 's/^/      /'; fi
}

# skip NAME WHY [PACKAGES]: a step that cannot run here. Each reason is
# counted for the summary, and PACKAGES (what would let the step run) go
# into its apt-get line.
skip() {
    echo "skip  $1: $2${3:+ (apt-get install $3)}"
    note skip_reason "$2" "${3:-}"
}
declare -A SKIPS=()
skip_reasons=() skip_packages=()
skip_reason() {
    skipped=$((skipped + 1))
    [ -n "${SKIPS[$1]:-}" ] || skip_reasons+=("$1")
    SKIPS[$1]=$((${SKIPS[$1]:-0} + 1))
    local p
    for p in $2; do
        case " ${skip_packages[*]} " in *" $p "*) ;; *) skip_packages+=("$p") ;; esac
    done
}

# Jobs: `par CMD...` runs CMD (a build and its run, or a function of
# steps) in the background, up to $JOBS (the CPUs) at once, its output and
# tallies going to files, which are replayed in the order the jobs were
# started: the log reads as a serial run's, a job's lines coming once the
# jobs before it are done, and the counts add up the same. `flush` waits
# for all of them. A job that needs another's files (a test binary, an
# object) waits for it (`after`). The builds are most of the matrix's time,
# one compiler process each: on two cores this halves it.
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 1)}
J=$B/jobs
rm -rf "$J" && mkdir -p "$J"
IN_JOB=0 queued=0 replayed=0 last_job=
declare -A JOB_PID=()
par() {
    local id=$queued
    queued=$((queued + 1))
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; replay; done
    (
        IN_JOB=1 REC=$J/$id.rec passed=0 failed=0
        : >"$REC"
        "$@"
        echo "count $passed $failed" >>"$REC"
        : >"$J/$id.done"
    ) >"$J/$id.out" 2>&1 &
    JOB_PID[$id]=$! last_job=$id
}
# after ID CMD...: CMD once job ID has ended
after() {
    until [ -e "$J/$1.done" ]; do sleep 1; done
    shift
    "$@"
}
# section TITLE: a heading, in its place among the jobs' output
section() {
    echo "$1" >"$J/$queued.out" && : >"$J/$queued.rec" && : >"$J/$queued.done"
    queued=$((queued + 1))
    replay
}
count() { passed=$((passed + $1)) failed=$((failed + $2)); }
# note CMD ARGS...: bookkeeping for the summary (a skip's reason, a test's
# count): done at once, or in a job written to its record for the replay
note() {
    if [ "$IN_JOB" = 1 ]; then printf '%q ' "$@" >>"$REC" && echo >>"$REC"; else "$@"; fi
}
# replay [wait]: the jobs' output and tallies in order, up to the first
# one still running; with `wait`, all of them
replay() {
    while [ "$replayed" -lt "$queued" ]; do
        if [ ! -e "$J/$replayed.done" ]; then
            [ "${1:-}" = wait ] || return 0
            wait "${JOB_PID[$replayed]}" 2>/dev/null
        fi
        cat "$J/$replayed.out"
        . "$J/$replayed.rec"
        if [ ! -e "$J/$replayed.done" ]; then
            failed=$((failed + 1)); echo "FAIL  the job above ended before its last step"
        fi
        replayed=$((replayed + 1))
    done
}
flush() { replay wait; }
# build_run NAME CMD... -- RUN_NAME BINARY [ARGS...]: a build and its run,
# for one job
build_run() {
    local name=$1 build=()
    shift
    while [ "$1" != -- ]; do build+=("$1"); shift; done
    shift
    step "$name" "${build[@]}"
    run "$@"
}

# The line before the tally: every reason for a skip (how many steps it
# skipped), then the one apt-get line that enables the steps it can.
skip_summary() {
    local r line=""
    for r in "${skip_reasons[@]}"; do line+="${line:+; }$r (${SKIPS[$r]})"; done
    if [ ${#skip_packages[@]} -gt 0 ]; then
        line+=". To run them: apt-get install ${skip_packages[*]} (as root; or make deps for the whole matrix)"
    fi
    echo "skipped: $line"
}

# should_fail NAME CMD...: a build that must be refused
should_fail() {
    local name=$1
    shift
    if ! usable "$@"; then skip "$name" "$why" "$pkgs"; return; fi
    if "$@" >/dev/null 2>&1; then failed=$((failed + 1)); echo "FAIL  $name (it built)"
    else passed=$((passed + 1)); echo "ok    $name"; fi
}

section "== the header under every compiler and setting"
par step "gcc, strict core warnings (-Wconversion -Wdouble-promotion)" gcc $CORE -O2 -c tests/header_only.c -o $B/h1.o
par step "gcc, strict, SIMD path (-march=native)" gcc $CORE -O2 -march=native -c tests/header_only.c -o $B/h2.o
par step "clang, strict core warnings" clang $CORE -O2 -c tests/header_only.c -o $B/h3.o
par step "clang, strict, SIMD path (-march=native)" clang $CORE -O2 -march=native -c tests/header_only.c -o $B/h4.o
par step "gcc, MIXPREC_STATIC" gcc $CORE -O2 -DMIXPREC_STATIC -c tests/header_only.c -o $B/h5.o
par step "gcc, MIXPREC_NO_SIMD" gcc $CORE -O2 -march=native -DMIXPREC_NO_SIMD -c tests/header_only.c -o $B/h6.o
par step "g++ -std=c++11, the header as C++" g++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -O2 -march=native -x c++ -c tests/header_only.c -o $B/h7.o
par step "g++ -std=c++20 (MP_OP designators: the CPU table's order)" g++ -std=c++20 -Wall -Wextra -Wpedantic -Werror -O2 -x c++ -c tests/header_only.c -o $B/h7b.o
par step "gcc, custom MIXPREC_MALLOC and MIXPREC_FREE" gcc $CORE -DMIXPREC_MALLOC=malloc -DMIXPREC_FREE=free -include stdlib.h -c tests/header_only.c -o $B/h8.o
par should_fail "MIXPREC_MALLOC without MIXPREC_FREE is an #error" gcc $WARN -DMIXPREC_MALLOC=malloc -c tests/header_only.c -o $B/h9.o

section "== the code blocks of README.md, docs/ and the header's doc block compile as written"
for cc in gcc clang g++; do
    if have $cc; then par step "tests/doc_snippets.sh $cc" bash tests/doc_snippets.sh $cc $B/snippets
    else par skip "tests/doc_snippets.sh $cc" "$cc not installed" "${PACKAGE[$cc]}"; fi
done

# -march=native builds one SIMD path; the AVX2+FMA one (F16C casts, the 6x16
# GEMM tile) gets builds of its own wherever the CPU runs it, so that a
# machine with AVX-512 compiles and runs it too (an AVX2 build once failed
# to compile while every -march=native build here passed).
if grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo; then
    for t in test_core test_gemm test_train; do
        par build_run "build $t for AVX2 without AVX-512 (gcc -march=x86-64-v3)" \
            gcc $WARN -O2 -march=x86-64-v3 tests/$t.c -o $B/${t}_avx2 -lm -- "$t, AVX2 path" $B/${t}_avx2
    done
else
    par skip "the AVX2 builds of test_core, test_gemm and test_train" "this CPU has no AVX2, FMA or F16C"
fi

# The test programs: the Makefile's list (TESTS), as `make check` runs them.
TESTS=$(make -s --no-print-directory print-tests) || { echo "make print-tests failed"; exit 2; }

section "== the test programs (make print-tests: $TESTS), their fast cases, in every build"
# name, compiler and flags of each build; every program's fast case (what
# make check runs, --quick) in each, the exhaustive test_numerics at the end
TRAIN_BUILDS=(
    "gcc|gcc $WARN -O2 -march=native"
    "clang|clang $WARN -O2 -march=native"
    "portable|gcc $WARN -O2 -march=native -DMIXPREC_NO_SIMD"
    "cpp|g++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -O2 -march=native -x c++"
    "asan_gcc|gcc $WARN $SAN -march=native"
    "asan_clang|clang $WARN $SAN -march=native"
    "nothreads|gcc $WARN -O2 -march=native -DMIXPREC_NO_THREADS"
)
# A program that leaves the implementation to another object (it has
# `#ifndef TEST_LINKS_MIXPREC`) links its build's one, tests/header_only.c
# compiled once, as a user's program links the one .c file that defines
# it; the others (they reach the internals or bring their own allocator)
# compile it themselves. The implementations first, then the programs that
# compile their own, then the linked ones: no job waits for an object.
links() { grep -q '^#ifndef TEST_LINKS_MIXPREC' "$1"; }
declare -A IMPL_JOB=()
for build in "${TRAIN_BUILDS[@]}"; do
    tag=${build%%|*} cc=${build#*|}
    par step "build the implementation (tests/header_only.c), $tag" $cc -pthread -c tests/header_only.c -o $B/mixprec_$tag.o
    IMPL_JOB[$tag]=$last_job
done
for linked in 0 1; do
    for build in "${TRAIN_BUILDS[@]}"; do
        tag=${build%%|*} cc=${build#*|}
        for name in $TESTS; do
            t=test_$name
            if links tests/$t.c; then [ $linked = 1 ] || continue; else [ $linked = 0 ] || continue; fi
            if [ $linked = 1 ]; then
                par after "${IMPL_JOB[$tag]}" build_run "build $t, $tag" $cc -pthread -DTEST_LINKS_MIXPREC tests/$t.c \
                    -x none $B/mixprec_$tag.o -o $B/${t}_$tag -lm -- "$t, $tag" $B/${t}_$tag --quick
            else
                par build_run "build $t, $tag" $cc -pthread tests/$t.c -o $B/${t}_$tag -lm -- "$t, $tag" $B/${t}_$tag --quick
            fi
            if [ "$t,$tag" = test_train,gcc ]; then train_gcc=$last_job; fi
        done
    done
done
# Two threads at once under ThreadSanitizer: a race on anything the
# threads share is a report, and a report fails the run (exit status 66).
TSAN="-O1 -g -fsanitize=thread"
if ! have clang; then
    par skip "test_threads under ThreadSanitizer" "clang not installed" clang
elif echo 'int main(void) { return 0; }' | clang $TSAN -x c - -o $B/tsan_probe >/dev/null 2>&1 && $B/tsan_probe; then
    par build_run "build test_threads, clang ThreadSanitizer" clang $WARN $TSAN -march=native tests/test_threads.c \
        -o $B/test_threads_tsan -lm -- "test_threads, clang ThreadSanitizer" $B/test_threads_tsan
else
    par skip "test_threads under ThreadSanitizer" "clang's ThreadSanitizer does not build or run here" \
        "$(sanitizer_package clang)"
fi
if echo '#include <cblas.h>' | gcc -E - >/dev/null 2>&1 && [ -e /usr/lib/x86_64-linux-gnu/libopenblas.so ]; then
    par build_run "build test_gemm, MIXPREC_USE_CBLAS with OpenBLAS" \
        gcc $WARN -O2 -march=native -DMIXPREC_USE_CBLAS tests/test_gemm.c -o $B/gemm_cblas -lopenblas -lm -- \
        "test_gemm, float32 products through cblas_sgemm" $B/gemm_cblas
else
    par skip "MIXPREC_USE_CBLAS" "OpenBLAS not installed" libopenblas-dev
fi
# Where the CPU has AMX, -march=native builds run bfloat16 products on its
# tiles, and on an Intel core without them (AVX512_FP16) they widen to
# float32 (MIXPREC_BF16_DOT); these builds keep the AVX512_BF16 (vdpbf16ps)
# tiles tested there.
native_macros=$(gcc -march=native -dM -E - </dev/null)
if grep -qE '__AMX_BF16__|__AVX512FP16__' <<<"$native_macros" && grep -q '__AVX512BF16__' <<<"$native_macros"; then
    for t in test_gemm test_train; do
        par build_run "build $t, AVX512_BF16 without AMX (-mno-amx-tile -DMIXPREC_BF16_DOT=1)" \
            gcc $WARN -O2 -march=native -mno-amx-tile -DMIXPREC_BF16_DOT=1 tests/$t.c -o $B/${t}_noamx -lm -- \
            "$t, bfloat16 products by vdpbf16ps" $B/${t}_noamx
    done
fi
if have s390x-linux-gnu-gcc && have qemu-s390x; then
    par build_run "build test_errors for s390x (big-endian IDX headers)" \
        s390x-linux-gnu-gcc $WARN -O2 -static tests/test_errors.c -o $B/errors_s390x -lm -- \
        "test_errors on s390x under qemu-user" qemu-s390x $B/errors_s390x
    par build_run "build test_checkpoint for s390x (big-endian checkpoints)" \
        s390x-linux-gnu-gcc $WARN -O2 -static tests/test_checkpoint.c -o $B/checkpoint_s390x -lm -- \
        "test_checkpoint on s390x under qemu-user (the x86 files' bytes)" qemu-s390x $B/checkpoint_s390x
fi

section "== Fashion-MNIST: mixed_float16 against float32 on real data"
make -s data B=build >/dev/null
if [ -f build/fashion-mnist/t10k-labels-idx1-ubyte ]; then
    VERBOSE=1 par after "$train_gcc" run "test_train on Fashion-MNIST" $B/test_train_gcc build/fashion-mnist
else
    par skip "Fashion-MNIST run" "the Fashion-MNIST data set not installed" dataset-fashion-mnist
fi

section "== fuzzing (libFuzzer, bounded)"
# Each reader for 20 s from seeds its target writes; ASan's leak check is on.
# On a failure the last lines (the sanitizer's report) are shown and the
# input is kept as $B/crash-*; replay it with `$B/fuzz_NAME $B/crash-...`.
fuzz() {
    rm -rf $B/corpus_$1 && mkdir -p $B/corpus_$1
    step "build $1 (clang libFuzzer, ASan+UBSan)" clang $WARN -fsanitize=fuzzer,address,undefined \
        -fno-sanitize-recover=all -g -O1 tests/$1.c -o $B/$1 -lm
    step "$1: 20 s with no crash, leak or hang" bash -c "set -o pipefail; MP_FUZZ_SEEDS=$B/corpus_$1 $B/$1 \
        $B/corpus_$1 -max_total_time=20 -timeout=5 -rss_limit_mb=2048 -artifact_prefix=$B/ 2>&1 | tail -n 25"
}
if ! have clang; then
    par skip "fuzzing" "clang not installed" clang
elif printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' |
        clang -fsanitize=fuzzer -x c - -o $B/fuzz_probe >/dev/null 2>&1; then
    for f in fuzz_checkpoint fuzz_idx fuzz_gzip fuzz_safetensors; do par fuzz $f; done
else
    par skip "fuzzing" "clang's libFuzzer not installed" "$(sanitizer_package clang)"
fi

section "== data-parallel training under Open MPI (tests/mpi.sh: 2 and 3 ranks, resume, failures)"
if have mpicc && have mpirun; then
    VERBOSE=1 par run "test_mpi under mpirun (tests/mpi.sh)" bash tests/mpi.sh $B/mpi
else
    par skip "data-parallel under MPI" "mpicc or mpirun not found" "openmpi-bin libopenmpi-dev"
fi

section "== CUDA backend (cuda/)"
# The backend's logic runs everywhere under tests/cuda_emu.h, a host
# emulation of the CUDA runtime and cuBLASLt calls, built by g++/clang++
# against the stand-in headers of tests/cuda_emu/ (no CUDA toolkit needed).
# Where nvcc is, the real library is built against the real headers too,
# and its test runs on a GPU when there is one.
mkdir -p $B/cuda && rm -f $B/cuda/emu*.o $B/cuda/test_cuda_*
EMU="-std=c++14 -Wall -Wextra -Werror -x c++ -include tests/cuda_emu.h -Itests/cuda_emu -c cuda/mixprec_cuda.cu"
# the emulated backend: plain, and with each sanitizer runtime (under ASan
# the kernels' reads and writes of "device" memory are checked; clang's
# C++-only UBSan checks need a runtime its C driver does not link)
EMU_BUILDS=("emu|g++ -O1" "emu_asan_gcc|g++ $SAN" "emu_asan_clang|clang++ $SAN -fno-sanitize=function,vptr")
declare -A EMU_JOB=()
for build in "${EMU_BUILDS[@]}"; do
    tag=${build%%|*} cxx=${build#*|}
    par step "build the emulated backend ($tag, ${cxx%% *})" $cxx $EMU -o $B/cuda/$tag.o
    EMU_JOB[$tag]=$last_job
done
par step "the emulated backend as C++20 (its table's names and order)" g++ -O1 $EMU -std=c++20 -o $B/cuda/emu20.o
# emu_test TAG CC EMU_OBJECT: test_cuda of one of TRAIN_BUILDS on the emulation
emu_test() {
    if [ ! -e "$3" ]; then skip "test_cuda under the emulation, $1" "its emulated backend was not built (see above)"; return; fi
    step "build test_cuda under the emulation, $1" $2 -DTEST_LINKS_MIXPREC tests/test_cuda.c -o $B/cuda/test_cuda_$1 \
        -x none $3 $B/mixprec_$1.o -lstdc++ -lm
    run "test_cuda under the emulation, $1" $B/cuda/test_cuda_$1
}
for build in "${TRAIN_BUILDS[@]}"; do
    tag=${build%%|*} cc=${build#*|} emu=emu
    case $tag in asan_*) emu=emu_$tag ;; esac
    par after "${EMU_JOB[$emu]}" after "${IMPL_JOB[$tag]}" emu_test "$tag" "$cc" $B/cuda/$emu.o
    if [ "$tag" = gcc ]; then emu_gcc=$last_job; fi
done
# the emulation's own rules, on the CUDA and cuBLASLt calls themselves
par build_run "build test_cuda_emu (g++ ASan+UBSan)" g++ -std=c++14 -Wall -Wextra -Werror $SAN -Itests/cuda_emu \
    tests/test_cuda_emu.cpp -o $B/cuda/test_cuda_emu -- "test_cuda_emu: the emulation's rules" $B/cuda/test_cuda_emu
# the gcc build again under the emulation's switches
emu_variants() {
    [ -x $B/cuda/test_cuda_gcc ] || return 0
    run "test_cuda under the emulation, no bfloat16 GEMM (the float32 fallback)" env MIXPREC_CUDA_EMU_NO_BF16=1 $B/cuda/test_cuda_gcc
    run "test_cuda under the emulation, other streams first at every wait (MIXPREC_CUDA_EMU_EAGER)" env MIXPREC_CUDA_EMU_EAGER=1 $B/cuda/test_cuda_gcc
}
par after "$emu_gcc" emu_variants
# the examples with --backend cuda, once each, small, on the emulated backend
EX_RUNS=("mnist_mlp|--policy mixed_float16 --units 16 --epochs 1 --batch-size 64 --train-limit 512"
         "custom_loop|--units 16 --epochs 1 --batch-size 64 --train-limit 512"
         "conv_memory|--image-size 8 --images 20 --filters 8 --batch-size 10"
         "numerics|--units 16 --train-limit 300")
emu_example() {
    [ -e $B/cuda/emu.o ] || return 0
    step "examples/$1 --backend cuda under the emulation" bash -c "gcc $WARN -O2 -march=native -DEXAMPLE_CUDA \
        examples/$1.c -o $B/cuda/ex_$1 -x none $B/cuda/emu.o -lstdc++ -lm && $B/cuda/ex_$1 --backend cuda $2"
}
for ex in "${EX_RUNS[@]}"; do par after "${EMU_JOB[emu]}" emu_example "${ex%%|*}" "${ex#*|}"; done
# the real library, its test (on a GPU when there is one), the GPU
# benchmark, the examples against it and the NCCL communicator
# gpu_outcome NAME OUT RC: a GPU test's run, or its skip where it found no GPU
gpu_outcome() {
    if [ "$3" -eq 0 ] && echo "$2" | grep -q "^[a-z_]*: skipped"; then
        skip "$1" "$(echo "$2" | sed -n 's/^[a-z_]*: skipped (\(.*\)).*$/\1/p')"
    else
        run "$1" sh -c 'printf "%s\n" "$1"; exit "$2"' _ "$2" "$3"
    fi
}
cuda_library() {
    local cuda_dir out rc
    cuda_dir=$(dirname "$NVCC")/..
    step "make cuda (nvcc, the static library, the real CUDA headers)" make -s cuda B=$B/cuda NVCC="$NVCC"
    step "build test_cuda against the library" gcc $WARN -O2 -march=native tests/test_cuda.c -o $B/cuda/test_cuda \
        -L$B/cuda -lmixprec_cuda -L$cuda_dir/lib64 -Wl,-rpath,$cuda_dir/lib64 -lcublasLt -lcudart -lstdc++ -lm
    out=$($B/cuda/test_cuda 2>&1); rc=$?
    gpu_outcome "test_cuda on a GPU" "$out" "$rc"
    step "build bench/gpu_train" make -s B=$B/cuda NVCC="$NVCC" $B/cuda/bench_gpu_train
    step "make examples-cuda (the examples against the library)" make -s examples-cuda B=$B/cuda NVCC="$NVCC"
    # the NCCL communicator: built where nccl.h and mpicc are; it runs on a GPU only
    step "make nccl (cuda/mixprec_nccl.cu, test_nccl)" make -s nccl B=$B/cuda NVCC="$NVCC"
    if [ -x $B/cuda/test_nccl ]; then
        out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun -np 1 $B/cuda/test_nccl 2>&1); rc=$?
        gpu_outcome "test_nccl on a GPU" "$out" "$rc"
    else
        skip "NCCL communicator" "nccl.h or mpicc not found"
    fi
}
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
if [ -n "$NVCC" ]; then
    par cuda_library
else
    par skip "the CUDA library (make cuda), test_cuda on a GPU, bench/gpu_train, make examples-cuda" \
        "nvcc not found: these need the CUDA toolkit (nvcc, cuBLASLt); the backend's logic ran above under the emulation"
fi

section "== examples and benchmarks build"
examples() {
    step "make examples" make -s examples B=$B/ex
    if [ -f build/fashion-mnist/t10k-labels-idx1-ubyte ]; then
        step "README's figures from the examples on Fashion-MNIST (tests/readme_figures.sh)" \
            bash tests/readme_figures.sh $B/ex build/fashion-mnist
    else
        skip "README's figures from the examples" "the Fashion-MNIST data set not installed" dataset-fashion-mnist
    fi
}
benchmarks() {
    step "make bench-build" make -s bench-build B=$B/bench
    if have mpicc; then step "build bench/dp.c (mpicc)" make -s B=$B/bench $B/bench/bench_dp; fi
}
# a fit's per-step CSV log, drawn by examples/plot_log.gp: a 900x500 PNG
plot() {
    step "plot_log.gp draws a fit's CSV log as a PNG (gnuplot)" bash -c "
        rm -f $B/plot_mixed_float16.csv $B/plot.png &&
        $B/ex/mnist_mlp --policy mixed_float16 --units 64 --epochs 1 --batch-size 128 --train-limit 4000 \
            --csv $B/plot >/dev/null &&
        [ \$(grep -c '^step,' $B/plot_mixed_float16.csv) -ge 20 ] &&
        gnuplot -e \"log='$B/plot_mixed_float16.csv'; out='$B/plot.png'\" examples/plot_log.gp &&
        od -An -tx1 -N24 $B/plot.png | tr -d ' \n' | grep -q '^89504e470d0a1a0a0000000d4948445200000384000001f4'"
}
par examples
examples_job=$last_job
par benchmarks
if have gnuplot; then par after "$examples_job" plot
else par skip "plot_log.gp" "gnuplot not installed" gnuplot-nox; fi

section "== embedded and big-endian targets"
cortex_m4() {
    step "Cortex-M4 bare metal (arm-none-eabi-gcc, MIXPREC_NO_STDIO)" arm-none-eabi-gcc -mcpu=cortex-m4 -mthumb \
        -mfloat-abi=hard -mfpu=fpv4-sp-d16 $CORE -O2 -c tests/embedded.c -o $B/embedded.o
    # a single-precision FPU: any double arithmetic would call __aeabi_d* routines
    step "Cortex-M4 object uses no double-precision arithmetic" \
        bash -c "! arm-none-eabi-nm $B/embedded.o | grep -E ' U __aeabi_(d|[lu]?[il]2d|f2d)'"
}
if have arm-none-eabi-gcc; then par cortex_m4
else par skip "Cortex-M4 bare metal" "arm-none-eabi-gcc not installed" "gcc-arm-none-eabi libnewlib-arm-none-eabi"; fi
if have s390x-linux-gnu-gcc && have qemu-s390x; then
    par build_run "build test_core for s390x (big-endian)" s390x-linux-gnu-gcc $WARN -O2 -static tests/test_core.c \
        -o $B/core_s390x -lm -- "test_core on s390x under qemu-user" qemu-s390x $B/core_s390x
else
    par skip "big-endian s390x" "s390x-linux-gnu-gcc or qemu-s390x not installed" "gcc-s390x-linux-gnu libc6-dev-s390x-cross qemu-user"
fi

section "== against the real Keras (optional: never in CI's default path)"
# MIXPREC_KERAS_PYTHON: a python with tensorflow-cpu and tf-keras, outside the
# repository (python3 -m venv DIR; DIR/bin/pip install tensorflow-cpu;
# DIR/bin/pip install --no-deps tf-keras)
keras_peer() {
    step "build keras_peer" gcc $WARN -O2 tests/keras_peer/peer.c -o $B/keras_peer -lm
    step "Keras 3 and tf_keras: losses and gradients of softmax/sigmoid models" \
        "$MIXPREC_KERAS_PYTHON" tests/keras_peer/loss_from_logits.py $B/keras_peer.txt
    step "TensorFlow's AMP rewrite on the guide's MLP (float16, bfloat16)" \
        "$MIXPREC_KERAS_PYTHON" tests/keras_peer/amp_paint.py $B/keras_peer_amp.txt
    step "Keras 3: BatchNormalization, LayerNormalization and a residual Add, three policies and float64" \
        "$MIXPREC_KERAS_PYTHON" tests/keras_peer/layers.py $B/keras_peer_layers.txt
    step "Keras 3: AdamW, the clip modes, accumulation, the LossScaleOptimizer with global_clipnorm" \
        "$MIXPREC_KERAS_PYTHON" tests/keras_peer/optimizers.py $B/keras_peer_opt.txt
    run "keras_peer: mixprec against Keras 3 (the graph layers and optimizer options too), tf_keras and TensorFlow's AMP" \
        $B/keras_peer $B/keras_peer.txt $B/keras_peer_amp.txt $B/keras_peer_layers.txt $B/keras_peer_opt.txt
    run "keras_differences: README's facts about Keras 3 and tf_keras" "$MIXPREC_KERAS_PYTHON" tests/keras_peer/differences.py
}
if [ -n "${MIXPREC_KERAS_PYTHON:-}" ] && [ -x "$MIXPREC_KERAS_PYTHON" ]; then par keras_peer
else par skip "keras_peer" "MIXPREC_KERAS_PYTHON does not name a python with tensorflow-cpu and tf-keras"; fi

section "== against PyTorch: safetensors both ways, the GPT's gradients and AdamW steps (optional: never in CI's default path)"
# MIXPREC_TORCH_PYTHON: a python with torch and safetensors, outside the
# repository, as the benchmarks' PyTorch peer (python3 -m venv DIR;
# DIR/bin/pip install torch safetensors)
torch_peer() {
    step "build torch_peer" gcc $WARN -O2 -pthread tests/torch_peer/peer.c -o $B/torch_peer -lm
    run "torch_interop: mixprec's safetensors in PyTorch and PyTorch's in mixprec, the same predictions and bytes" \
        "$MIXPREC_TORCH_PYTHON" tests/torch_peer/interop.py $B/torch_peer $B/torch_interop
    run "torch_gpt: the GPT's logits, loss and every gradient as PyTorch's from the same weights and tokens, and ten AdamW steps' losses" \
        "$MIXPREC_TORCH_PYTHON" tests/torch_peer/gpt.py $B/torch_peer $B/torch_gpt
}
if [ -n "${MIXPREC_TORCH_PYTHON:-}" ] && [ -x "$MIXPREC_TORCH_PYTHON" ] &&
    "$MIXPREC_TORCH_PYTHON" -c 'import torch, safetensors' >/dev/null 2>&1; then par torch_peer
else par skip "torch_peer" "MIXPREC_TORCH_PYTHON does not name a python with torch and safetensors"; fi

section "== exhaustive numerics (all 2^32 float32 inputs, all float16 pairs; a few minutes)"
# Where -march=native took the AVX-512 casts, the AVX2 ones get every input
# too (every float16 and bfloat16, all 2^32 float32, the long calls; not
# the float16 arithmetic, which neither path touches). Elsewhere the run
# above was theirs. The runs take every core, so they come after the jobs.
par step "build test_numerics, gcc -O2 -march=native" gcc $WARN -O2 -march=native -pthread tests/test_numerics.c -o $B/numerics -lm
avx2_numerics=0
if grep -q '__AVX512BW__' <<<"$native_macros"; then
    avx2_numerics=1
    par step "build test_numerics for AVX2 without AVX-512 (gcc -march=x86-64-v3)" gcc $WARN -O2 -march=x86-64-v3 -pthread tests/test_numerics.c -o $B/numerics_avx2 -lm
fi
flush
LIVE=1 run "test_numerics" $B/numerics
if [ $avx2_numerics = 1 ]; then
    LIVE=1 run "test_numerics, the AVX2 casts" $B/numerics_avx2 all_16bit bulk_vs_portable bulk_long narrow_all_f32
fi

echo
if [ "$skipped" -gt 0 ]; then skip_summary; echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
