#!/usr/bin/env bash
# mpi.sh BUILD_DIR - data-parallel training under Open MPI (mpi/mixprec_mpi.h):
# builds tests/test_mpi.c with mpicc and runs it under mpirun with 2 and 3
# ranks (--oversubscribe: 3 ranks on 2 cores), saves on 2 ranks and resumes
# on 1 and 3, and checks that a rank that dies or a failing all-reduce ends
# the job with a clear message and no hang (each run bounded by timeout).
# Prints one line per run and the tally `test_mpi_suite: N passed, N failed`;
# without mpicc or mpirun it says it skipped and exits 0.
set -u
cd "$(dirname "$0")/.." || exit 2
B=${1:-build/mpi}
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
    echo "test_mpi_suite: skipped (mpicc or mpirun not found: apt-get install openmpi-bin libopenmpi-dev)"
    exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # CI runs as root
MPIRUN="timeout 120 mpirun --oversubscribe"
passed=0 failed=0
mkdir -p "$B"
rm -rf "$B/ckpt" && mkdir -p "$B/ckpt"

# tally NAME OUT RC: the run's own `test_mpi: N passed, N failed`
tally() {
    local p f
    p=$(echo "$2" | sed -nE 's/^test_mpi: ([0-9]+) passed, ([0-9]+) failed$/\1/p')
    f=$(echo "$2" | sed -nE 's/^test_mpi: ([0-9]+) passed, ([0-9]+) failed$/\2/p')
    [ -n "$p" ] || { p=0; f=1; }
    [ "$3" -eq 0 ] || [ "$f" -ne 0 ] || f=1
    passed=$((passed + p)) failed=$((failed + f))
    if [ "$f" -eq 0 ]; then echo "ok    $1 ($p checks)"; else echo "FAIL  $1"; echo "$2" | sed 's/^/      /'; fi
}

# ends NAME WANT OUT RC: the job ended (not the timeout's 124), non-zero, saying WANT
ends() {
    if [ "$4" -ne 0 ] && [ "$4" -ne 124 ] && echo "$3" | grep -q "$2"; then
        passed=$((passed + 1)); echo "ok    $1 (exit $4)"
    else
        failed=$((failed + 1)); echo "FAIL  $1 (exit $4)"; echo "$3" | tail -20 | sed 's/^/      /'
    fi
}

if ! out=$(mpicc -std=c99 -Wall -Wextra -Wpedantic -Werror -O2 tests/test_mpi.c -o "$B/test_mpi" -lm 2>&1); then
    echo "FAIL  build test_mpi (mpicc)"; echo "$out" | sed 's/^/      /'
    echo "test_mpi_suite: 0 passed, 1 failed"; exit 1
fi
for np in 2 3; do
    out=$($MPIRUN -np $np "$B/test_mpi" train 2>&1); tally "test_mpi on $np ranks" "$out" $?
done
out=$($MPIRUN -np 2 "$B/test_mpi" save "$B/ckpt" 2>&1); tally "test_mpi: fit and save on 2 ranks" "$out" $?
for np in 1 3; do
    out=$($MPIRUN -np $np "$B/test_mpi" resume "$B/ckpt" 2>&1); tally "test_mpi: resume on $np ranks" "$out" $?
done
out=$($MPIRUN -np 2 "$B/test_mpi" die 2>&1); ends "a rank that dies ends the job" "exited with non-zero status" "$out" $?
out=$($MPIRUN -np 2 "$B/test_mpi" fail 2>&1)
ends "a failing all-reduce ends the job with the model's error" "MP_ERR_COMM.*all-reduce.*planted failure" "$out" $?
echo "test_mpi_suite: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
