#!/bin/bash
# tests/gpu.sh - the CUDA backend on a real GPU, in one run: the machine,
# the build as a user makes it (make cuda, make examples-cuda, the test and
# benchmark binaries), test_cuda three times (their tallies side by side),
# the examples with --backend cuda under each policy while test_cuda runs
# under compute-sanitizer's four tools, initcheck on tests/initcheck_probe.cu,
# Nsight Compute on the products of one mixed step, and last, alone on the
# GPU, the benchmark. Each step has a time limit, so a hang costs one step,
# not the run. About 3 minutes on an H200.
#
#   tests/gpu.sh [LOGDIR]     (default: $OUT, else build/gpu)
#   GPU_STEPS="build test examples sanitize probe ncu bench"  the steps to run
#
# Logs: LOGDIR/gpu.log (everything in order), LOGDIR/san_TOOL.log (each
# sanitizer's report on test_cuda, folded), LOGDIR/san_probe.log and
# LOGDIR/bench.log. The last lines of gpu.log summarise each step's status.
set -u
D=${1:-${OUT:-build/gpu}}
mkdir -p "$D"
LOG=$D/gpu.log
STEPS=${GPU_STEPS:-build test examples sanitize probe ncu bench}
B=build
EX=$B/cuda-examples
SUMMARY=()
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_LIB=$(dirname "$NVCC")/../lib64
LINK="-L$B -lmixprec_cuda -L$CUDA_LIB -Wl,-rpath,$CUDA_LIB -lcublasLt -lcudart -lstdc++ -lm"

say() { echo "$*" | tee -a "$LOG"; }
# run SECONDS NAME CMD...: the command's output goes to the log; its status
# (124: the time limit) to the summary.
run() {
    local t=$1 name=$2; shift 2
    local t0=$SECONDS
    say "== $name ($*)"
    timeout "$t" "$@" >>"$LOG" 2>&1
    local rc=$?
    say "-- $name: rc=$rc in $((SECONDS - t0)) s"
    SUMMARY+=("$name rc=$rc $((SECONDS - t0))s")
    return $rc
}
want() { [[ " $STEPS " == *" $1 "* ]]; }

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm --format=csv
    "$NVCC" --version | tail -2
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
    gcc --version | head -1
    command -v make compute-sanitizer ncu
} >>"$LOG" 2>&1

if want build; then
    run 300 "make cuda" make cuda CUDA_SMS=90 NVCCFLAGS="-O2 -lineinfo"
    run 120 "make examples-cuda" make examples-cuda CUDA_SMS=90
    run 60 "build test_cuda" gcc -std=c99 -O2 -g -Wall -Wextra -Werror tests/test_cuda.c -o $B/test_cuda $LINK
    run 60 "build bench_gpu_train" make $B/bench_gpu_train CUDA_SMS=90
fi

if want test; then
    for i in 1 2 3; do run 120 "test_cuda #$i" $B/test_cuda; done
    say "tallies: $(grep -E '^test_cuda: [0-9]+ passed|skipped' "$LOG" | sort | uniq -c | tr '\n' ';')"
fi

# compute-sanitizer's four tools on test_cuda, in the background while the
# examples run (correctness only: nothing is timed until they are done).
SAN_TOOLS="memcheck racecheck synccheck initcheck"
# memcheck: no API errors, since test_sticky_error asks cudaMalloc for more
# than the device has on purpose; leaks are reported.
san_args() { [ "$1" = memcheck ] && echo "--report-api-errors no --leak-check full"; }
# compute-sanitizer's report folded: each kind of error and each "at" line
# once, with its count (test_cuda makes millions of accesses).
san_fold() { awk '/^=========     at /{sub(/\+0x[0-9a-f]+ /, " "); n[$0]++; next}
                  /^========= [A-Z][a-z]+ .* (read|write|access|hazard|barrier)/{n[$0]++; next}
                  /^=========     |^=========         |^========= *$/{next}
                  {print} END{for (k in n) print n[k] " x " k}'; }
san() { # san TOOL NAME PROGRAM...: its folded log in $D/san_NAME.log
    local tool=$1 log=$D/san_$2.log t0=$SECONDS; shift 2
    timeout ${SAN_SECONDS:-180} compute-sanitizer --tool $tool --print-limit 1000000 --error-exitcode 9 $(san_args $tool) "$@" 2>&1 |
        san_fold >"$log"
    echo "-- $tool: rc=${PIPESTATUS[0]} in $((SECONDS - t0)) s" >>"$log"
}
san_pids=()
if want sanitize; then
    for tool in $SAN_TOOLS; do
        san $tool $tool $B/test_cuda &
        san_pids+=($!)
    done
fi

if want examples; then
    for p in float32 mixed_float16 mixed_bfloat16; do
        run 120 "mnist_mlp $p" $EX/mnist_mlp --backend cuda --policy $p --units 512 --epochs 2 --batch-size 256 --train-limit 20000
    done
    run 120 "custom_loop" $EX/custom_loop --backend cuda --epochs 1 --train-limit 20000
    run 120 "conv_memory" $EX/conv_memory --backend cuda --image-size 32 --images 200
    run 120 "numerics" $EX/numerics --backend cuda
fi

if want sanitize; then
    wait "${san_pids[@]}"
    for tool in $SAN_TOOLS; do
        SUMMARY+=("sanitizer $(tail -1 "$D/san_$tool.log") | $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$D/san_$tool.log")")
    done
fi

if want probe; then
    # Whether initcheck sees cuBLASLt's stores: a product into memory that
    # nothing else wrote, then a kernel reading it (tests/initcheck_probe.cu).
    run 60 "build initcheck_probe" "$NVCC" -O2 -arch=sm_90 tests/initcheck_probe.cu -o $B/initcheck_probe -lcublasLt &&
        san initcheck probe $B/initcheck_probe
    # which kernels ran each product: the one whose stores initcheck missed
    run 60 "probe kernels (ncu)" ncu --clock-control none --metrics gpu__time_duration.sum $B/initcheck_probe
    SUMMARY+=("probe $(tail -1 "$D/san_probe.log") | $(grep -m1 'ERROR SUMMARY' "$D/san_probe.log")")
fi

if want ncu; then
    # The products of a mixed_float16 step: their kernel names and the
    # tensor pipe's instruction count (nonzero: Tensor Cores ran).
    NCU="ncu --clock-control none --kernel-name regex:gemm|nvjet|xmma|cutlass|sm90 --launch-skip 6 --launch-count 6"
    STEP="$EX/mnist_mlp --backend cuda --policy mixed_float16 --units 1024 --epochs 1 --batch-size 1024 --train-limit 4096"
    run 90 "ncu tensor ops of a mixed_float16 step" $NCU \
        --metrics gpu__time_duration.sum,sm__inst_executed_pipe_tensor.sum $STEP ||
        run 90 "ncu SpeedOfLight of a mixed_float16 step" $NCU --section SpeedOfLight $STEP
fi

if want bench; then
    # with Fashion-MNIST's fit where `make data` (or a copy) left it
    FASHION=$([ -e $B/fashion-mnist/train-images-idx3-ubyte ] && echo "--fashion $B/fashion-mnist")
    run 240 "bench_gpu_train" bash -c "$B/bench_gpu_train $FASHION 2>&1 | tee $D/bench.log"
fi

say "== summary"
for s in "${SUMMARY[@]}"; do say "$s"; done
