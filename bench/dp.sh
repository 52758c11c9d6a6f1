#!/usr/bin/env bash
# dp.sh BENCH_DP [ROUNDS] - data-parallel images/s (bench/dp.c): 1, 2 and 3
# ranks of one thread each (3 oversubscribe 2 cores) against one process
# with as many threads at the same global batch, and the ranks again with the
# gradients summed in float16, alternating, ROUNDS times
# (3). One key=value line per run (bench=dp ...), the machine's load in each.
set -u
BIN=${1:?usage: dp.sh BENCH_DP [ROUNDS]}
ROUNDS=${2:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 300 mpirun --oversubscribe"
for round in $(seq "$ROUNDS"); do
    "$BIN" --threads 1 --batch 128
    $MPIRUN -np 2 "$BIN" --threads 1 --batch 128
    $MPIRUN -np 2 "$BIN" --threads 1 --batch 128 --allreduce float16
    "$BIN" --threads 2 --batch 256
    $MPIRUN -np 3 "$BIN" --threads 1 --batch 128
    $MPIRUN -np 3 "$BIN" --threads 1 --batch 128 --allreduce float16
    "$BIN" --threads 3 --batch 384
done
