# mixprec: `make` builds the examples, `make demo` runs them, `make check`
# runs each test program's fast case once (gcc, no sanitizers, about a
# minute on 2 cores), `make test-NAME` one test program (T=name runs one test in it), `make test` the
# whole matrix CI runs (last line: N passed, N failed), `make bench` the
# benchmarks. They need make and gcc; `make deps` (as root) installs the rest
# of what the full test matrix uses, which otherwise skips, by name, what is
# missing.
CC     ?= cc
ARCH   ?= -march=native
CFLAGS ?= -O2
WARN    = -std=c99 -Wall -Wextra -Wpedantic -Werror
B       = build

EXAMPLES = $(B)/overflow $(B)/mnist_mlp $(B)/custom_loop $(B)/conv_memory $(B)/numerics $(B)/callbacks $(B)/resnet \
           $(B)/tiny_gpt
# Data-parallel training over MPI (mpi/mixprec_mpi.h): built where mpicc is.
MPICC   ?= $(shell command -v mpicc 2>/dev/null)
EXAMPLES += $(if $(MPICC),$(B)/mnist_mpi)
BENCHES  = $(B)/bench_convert_gcc $(B)/bench_convert_clang $(B)/bench_gemm $(B)/bench_train $(B)/bench_convnet \
           $(B)/bench_attention $(B)/bench_gpt
# The GEMM and training benchmarks: gcc, as the issue's figures were taken.
BENCH_CC ?= gcc
# OpenBLAS, the GEMM benchmark's reference column: there when a program that
# calls openblas_set_num_threads (OpenBLAS's own, not any CBLAS's) links.
# A deferred `=`: only building bench_gemm pays for the probe.
OPENBLAS = $(shell echo 'int main(void) { openblas_set_num_threads(1); return 0; }' | \
              $(BENCH_CC) -x c -include cblas.h - -o /dev/null -lopenblas 2>/dev/null && echo 1)
GEMM_BLAS = $(if $(OPENBLAS),-DBENCH_OPENBLAS)
GEMM_LIBS = $(if $(OPENBLAS),-lopenblas)
# Fashion-MNIST as Debian packages it (dataset-fashion-mnist): the examples
# read its .gz files as they are; `make data` unpacks them for the readers
# of plain IDX files (bench/gpu_train.py's PyTorch peer, tests/matrix.sh).
FMNIST_PKG = /usr/share/datasets/fashion-mnist
FMNIST     = $(B)/fashion-mnist
# Debian's fortunes package, plain text (entries between `%` lines): `make
# data` joins its files into one text for the language-model examples,
# which make a synthetic text of their own where it is missing.
FORTUNES_PKG = /usr/share/games/fortunes
FORTUNES     = $(B)/fortunes.txt

.PHONY: all deps examples data demo check print-tests test $(TESTS:%=test-%) test-mpi bench bench-dp nccl bench-build bench-quick cuda examples-cuda bench-gpu clean

all: examples
examples: $(EXAMPLES)

# Debian 12's packages for every step of the test matrix (.ci/run installs
# them the same way): compilers, sanitizer runtimes and libFuzzer, the cross
# targets and qemu, the data set, OpenBLAS, gnuplot. Not the CUDA toolkit.
DEPS = make gcc g++ clang libclang-rt-14-dev libc6-dev \
       gcc-arm-none-eabi libnewlib-arm-none-eabi \
       gcc-s390x-linux-gnu libc6-dev-s390x-cross qemu-user \
       gzip dataset-fashion-mnist fortunes libopenblas-dev gnuplot-nox openmpi-bin libopenmpi-dev

deps:
	@if [ "$$(id -u)" -ne 0 ]; then echo "deps: apt-get needs root: sudo make deps"; exit 1; fi
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(DEPS)

$(B):
	mkdir -p $(B)

$(B)/%: examples/%.c examples/example.h examples/summary.h examples/fashion_mnist.h examples/resnet_model.h examples/gpt_model.h mixprec.h | $(B)
	$(CC) $(WARN) $(CFLAGS) $(ARCH) $< -o $@ -lm

$(B)/mnist_mpi: examples/mnist_mpi.c examples/example.h examples/fashion_mnist.h mixprec.h mpi/mixprec_mpi.h | $(B)
	$(MPICC) $(WARN) $(CFLAGS) $(ARCH) -pthread $< -o $@ -lm

# Unpack the packaged files once (a .tmp first, so an interrupted run
# leaves no truncated file); without the package, say how to get it.
data:
	@if ! ls $(FMNIST_PKG)/*.gz >/dev/null 2>&1; then \
	    echo "data: $(FMNIST_PKG) is missing: apt-get install dataset-fashion-mnist"; \
	else \
	    mkdir -p $(FMNIST) && for gz in $(FMNIST_PKG)/*.gz; do \
	        f=$(FMNIST)/$$(basename $$gz .gz); \
	        [ -f $$f ] || { gzip -dc $$gz > $$f.tmp && mv $$f.tmp $$f; } || exit 1; \
	    done; echo "data: Fashion-MNIST in $(FMNIST)"; \
	fi
	@if ! [ -f $(FORTUNES_PKG)/fortunes ]; then \
	    echo "data: $(FORTUNES_PKG) is missing: apt-get install fortunes"; \
	else \
	    mkdir -p $(B) && LC_ALL=C find $(FORTUNES_PKG) -maxdepth 1 -type f ! -name '*.*' | LC_ALL=C sort | \
	        xargs cat > $(FORTUNES).tmp && mv $(FORTUNES).tmp $(FORTUNES) && \
	        echo "data: the fortunes text in $(FORTUNES) ($$(wc -c < $(FORTUNES)) bytes)"; \
	fi

# Every example, sized to finish in about a minute on 2 cores, on the
# package's files where installed (each says so when it falls back to a
# synthetic data set, and why). custom_loop starts its loss scale at 2^24
# (Keras: 2^15) so that the demo shows the scale falling, skipping steps,
# to a value where float16 gradients fit.
# Each example adds a line on what it showed to $(B)/demo_summary.txt (see
# ex_summary in examples/summary.h); the demo ends with them.
demo: export MIXPREC_DEMO_SUMMARY = $(B)/demo_summary.txt
demo: data $(EXAMPLES)
	@rm -f $(B)/demo_summary.txt
	./$(B)/overflow
	./$(B)/mnist_mlp --units 256 --epochs 2 --batch-size 128
	./$(B)/custom_loop --units 128 --epochs 2 --batch-size 128 --initial-scale 16777216
	./$(B)/conv_memory --image-size 32 --images 200
	./$(B)/numerics
	./$(B)/callbacks --units 128 --epochs 3 --checkpoint $(B)/best.mpc
	./$(B)/resnet --width 8 --train-limit 3000 --bn-momentum 0.9
	./$(B)/tiny_gpt --steps 80 --layers 2 --context 64 --channels 64 --sample 80
	@echo; echo "== What the demo showed"; cat $(B)/demo_summary.txt

# The matrix runs its builds and tests as parallel jobs, one per CPU;
# JOBS=N sets how many (JOBS=1: one at a time).
test:
	@bash tests/matrix.sh

# The test programs, tests/test_NAME.c: the one list `make check`, `make
# test-NAME` and the matrix (tests/matrix.sh reads `make -s print-tests`)
# run. Each has a fast case, which `make check` and each build of the matrix
# run (--quick: test_numerics samples its 2^32 sweeps, the others run whole),
# and its whole run, which `make test-NAME` and the matrix's last step (the
# exhaustive test_numerics) run. T=name runs one test of a program (T may
# name several; `T=--list` lists them): `make test-train T=grad_conv`.
TESTS = core train graph errors gemm backend diagnostics checkpoint amp reliability callbacks comm threads data numerics

print-tests:
	@echo $(TESTS)

# One build of each (CC, CFLAGS, ARCH as above), one job per CPU unless
# make already has a job server (make -jN check). A program with
# `#ifndef TEST_LINKS_MIXPREC` links $(B)/mixprec.o (tests/header_only.c,
# the implementation compiled once), as a user's program links the one .c
# file that defines it; the others compile the implementation themselves
# (they reach its internals or bring their own allocator).
$(B)/mixprec.o: tests/header_only.c mixprec.h | $(B)
	$(CC) $(WARN) $(CFLAGS) $(ARCH) -pthread -c $< -o $@

$(B)/test_%: tests/test_%.c tests/*.h examples/gpt_model.h mixprec.h $(B)/mixprec.o | $(B)
	$(CC) $(WARN) $(CFLAGS) $(ARCH) -pthread $(if $(shell grep -l '^\#ifndef TEST_LINKS_MIXPREC' $<),\
	    -DTEST_LINKS_MIXPREC $< $(B)/mixprec.o,$<) -o $@ -lm

CHECK_JOBS = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 1))

# Every program's fast case, then the sum of their tallies; a failing
# program's whole output is shown.
check:
	@$(MAKE) --no-print-directory $(CHECK_JOBS) $(TESTS:%=$(B)/test_%)
	@p=0; f=0; for t in $(TESTS); do \
	    out=$$($(B)/test_$$t --quick 2>&1); rc=$$?; \
	    tally=$$(echo "$$out" | grep -E '^test_[a-z]+: [0-9]+ passed, [0-9]+ failed$$' | tail -n 1); \
	    tp=$$(echo "$$tally" | sed -nE 's/.*: ([0-9]+) passed.*/\1/p'); tf=$$(echo "$$tally" | sed -nE 's/.* ([0-9]+) failed$$/\1/p'); \
	    [ -n "$$tp" ] || tp=0; [ -n "$$tf" ] || tf=0; [ $$rc -eq 0 ] || [ $$tf -ne 0 ] || tf=1; \
	    p=$$((p + tp)); f=$$((f + tf)); \
	    if [ $$tf -eq 0 ]; then echo "ok    test_$$t"; else echo "FAIL  test_$$t"; echo "$$out" | sed 's/^/      /'; fi; \
	done; echo "$$p passed, $$f failed"; [ $$f -eq 0 ]

$(TESTS:%=test-%): test-%: $(B)/test_%
	$(B)/test_$* $(T)

# Data-parallel training under Open MPI (mpicc, mpirun): 2 and 3 ranks.
test-mpi:
	@bash tests/mpi.sh $(B)/mpi

# test_cuda runs the CUDA backend under tests/cuda_emu.h, a host emulation
# built against the stand-in headers of tests/cuda_emu/ (no CUDA toolkit
# needed).
test-cuda: $(B)/test_cuda_emu
	$(B)/test_cuda_emu $(T)

$(B)/cuda_emu.o: cuda/mixprec_cuda.cu cuda/mixprec_cuda.h tests/cuda_emu.h tests/cuda_emu/*.h mixprec.h | $(B)
	g++ -std=c++14 -Wall -Wextra -Werror -O1 -x c++ -include tests/cuda_emu.h -Itests/cuda_emu -c $< -o $@

$(B)/test_cuda_emu: tests/test_cuda.c tests/*.h $(B)/cuda_emu.o $(B)/mixprec.o
	$(CC) $(WARN) $(CFLAGS) $(ARCH) -DTEST_LINKS_MIXPREC $< -o $@ -x none $(B)/cuda_emu.o $(B)/mixprec.o -lstdc++ -lm

# The conversion benchmark, built by gcc and by clang side by side (gcc 12
# at -O2 does not vectorise the portable path; clang does).
$(B)/bench_convert_%: bench/convert.c bench/bench.h mixprec.h | $(B)
	@if command -v $* >/dev/null; then $* $(WARN) -O2 $(ARCH) $< -o $@ -lm; \
	else printf '#!/bin/sh\necho "bench=convert cc=$* available=0"\n' > $@; chmod +x $@; fi

$(B)/bench_gemm: bench/gemm.c bench/bench.h mixprec.h | $(B)
	$(BENCH_CC) $(WARN) -O2 $(ARCH) -pthread $(GEMM_BLAS) $< -o $@ $(GEMM_LIBS) -lm

$(B)/bench_train: bench/train.c bench/bench.h mixprec.h | $(B)
	$(BENCH_CC) $(WARN) -O2 $(ARCH) -pthread $< -o $@ -lm

$(B)/bench_gpt: bench/gpt.c bench/bench.h examples/gpt_model.h mixprec.h | $(B)
	$(BENCH_CC) $(WARN) -O2 $(ARCH) -pthread $< -o $@ -lm

$(B)/bench_convnet: bench/convnet.c bench/bench.h mixprec.h | $(B)
	$(BENCH_CC) $(WARN) -O2 $(ARCH) -pthread $< -o $@ -lm

$(B)/bench_attention: bench/attention.c bench/bench.h mixprec.h | $(B)
	$(BENCH_CC) $(WARN) -O2 $(ARCH) -pthread $< -o $@ -lm

# Data-parallel training over MPI (bench/dp.sh): where mpicc is.
$(B)/bench_dp: bench/dp.c bench/bench.h mixprec.h mpi/mixprec_mpi.h | $(B)
	$(MPICC) $(WARN) -O2 $(ARCH) -pthread $< -o $@ -lm

bench-dp:
	@if [ -z "$(MPICC)" ]; then echo "bench=dp available=0 reason=mpicc_not_found"; \
	else $(MAKE) --no-print-directory $(B)/bench_dp && bash bench/dp.sh $(B)/bench_dp; fi

bench-build: $(BENCHES)

# The whole set takes several minutes on 2 cores; bench-quick checks that
# every benchmark runs, in well under a minute (its figures are rougher).
# Both print their key=value lines and write them as a table, with the CPU,
# compilers, date and load, to $(B)/bench/results.md (bench/table.sh).
BENCH_TABLE = BENCH_COMPILERS="$(BENCH_CC) clang" bash bench/table.sh $(B)/bench/results.md
bench: bench-build
	@bash -c 'set -o pipefail; { for b in $(BENCHES); do $$b || exit 1; done && $(B)/bench_convnet --model resnet; } | \
	    $(BENCH_TABLE) "make bench"'

bench-quick: bench-build
	@bash -c 'set -o pipefail; { $(B)/bench_convert_gcc --n 1048576 --reps 2 && $(B)/bench_gemm --quick && \
	    $(B)/bench_train --quick && $(B)/bench_convnet --quick && $(B)/bench_convnet --quick --model resnet && \
	    $(B)/bench_attention --quick && $(B)/bench_gpt --quick; } | \
	    $(BENCH_TABLE) "make bench-quick"'

# The CUDA backend (cuda/): nvcc from PATH or /usr/local/cuda, CUDA 12 or
# 13. Real code for each of sm_70 ... sm_90 this nvcc still builds (CUDA 13
# dropped sm_70) and PTX for compute_90, which newer GPUs compile at load.
# --fmad=false: no contraction, so elementwise kernels round as the C code.
NVCC      ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc))
CUDA_LIB   = $(abspath $(dir $(shell command -v $(NVCC) 2>/dev/null))../lib64)
CUDA_SMS   = 70 75 80 86 89 90
CUDA_CODES = $(if $(NVCC),$(shell $(NVCC) --list-gpu-code 2>/dev/null))
comma     := ,
CUDA_GENCODE = $(foreach s,$(CUDA_SMS),$(if $(filter sm_$(s),$(CUDA_CODES)),-gencode arch=compute_$(s)$(comma)code=sm_$(s))) \
               -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O2
CUDA_LIBS  = -L$(B) -lmixprec_cuda -L$(CUDA_LIB) -Wl,-rpath,$(CUDA_LIB) -lcublasLt -lcudart -lstdc++ -lm

# Without nvcc `make cuda` says so and succeeds: the backend is optional.
cuda:
	@if [ -z "$(NVCC)" ]; then echo "cuda: nvcc not found (put it on PATH or set NVCC=...): the CUDA backend is not built"; \
	else $(MAKE) --no-print-directory $(B)/libmixprec_cuda.a; fi

$(B)/libmixprec_cuda.a: cuda/mixprec_cuda.cu cuda/mixprec_cuda.h mixprec.h | $(B)
	$(NVCC) $(NVCCFLAGS) --fmad=false $(CUDA_GENCODE) -Xcompiler -fPIC,-Wall,-Wextra -c $< -o $(B)/mixprec_cuda.o
	ar rcs $@ $(B)/mixprec_cuda.o

# The examples built against the CUDA library: each takes `--backend cuda`
# (build/cuda-examples/NAME). Without nvcc it says so and succeeds.
examples-cuda:
	@if [ -z "$(NVCC)" ]; then echo "examples-cuda: nvcc not found (put it on PATH or set NVCC=...): not built"; \
	else $(MAKE) --no-print-directory $(B)/libmixprec_cuda.a && mkdir -p $(B)/cuda-examples && \
	    for e in $(notdir $(filter-out %/mnist_mpi,$(EXAMPLES))); do \
	        $(CC) $(WARN) $(CFLAGS) $(ARCH) -DEXAMPLE_CUDA examples/$$e.c -o $(B)/cuda-examples/$$e $(CUDA_LIBS) || exit 1; \
	    done; echo "examples-cuda: $(B)/cuda-examples/ (run with --backend cuda)"; fi

# The NCCL communicator (cuda/mixprec_nccl.h): where nvcc, nccl.h and mpicc
# are. test_nccl runs on one GPU (mpirun -np 1); without one it skips.
NCCL_OK = $(if $(NVCC),$(if $(MPICC),$(shell echo '\#include <nccl.h>' | $(NVCC) -E -x cu - >/dev/null 2>&1 && echo 1)))
nccl:
	@if [ -z "$(NCCL_OK)" ]; then echo "nccl: nvcc, nccl.h or mpicc not found: the NCCL communicator is not built"; \
	else $(MAKE) --no-print-directory $(B)/libmixprec_nccl.a $(B)/test_nccl; fi

$(B)/libmixprec_nccl.a: cuda/mixprec_nccl.cu cuda/mixprec_nccl.h cuda/mixprec_cuda.h mixprec.h | $(B)
	$(NVCC) $(NVCCFLAGS) $(shell $(MPICC) --showme:compile 2>/dev/null) -Xcompiler -fPIC,-Wall,-Wextra,-Werror -c $< -o $(B)/mixprec_nccl.o
	ar rcs $@ $(B)/mixprec_nccl.o

$(B)/test_nccl: tests/test_nccl.c tests/check.h cuda/mixprec_nccl.h $(B)/libmixprec_nccl.a $(B)/libmixprec_cuda.a
	$(MPICC) $(WARN) -O2 -isystem $(dir $(NVCC))../include $< -o $@ -L$(B) -lmixprec_nccl -lnccl $(CUDA_LIBS)

# The GPU benchmark: its PyTorch peer (bench/gpu_train.py) runs from it
# where python3 has torch; the whole Fashion-MNIST fit where `make data` left
# the data set. Without a GPU it prints available=0.
$(B)/bench_gpu_train: bench/gpu_train.c bench/bench.h cuda/mixprec_cuda.h mixprec.h $(B)/libmixprec_cuda.a
	$(CC) $(WARN) -O2 $(ARCH) $< -o $@ $(CUDA_LIBS)

bench-gpu:
	@if [ -z "$(NVCC)" ]; then echo "bench=gpu_train available=0 reason=nvcc_not_found"; \
	else $(MAKE) --no-print-directory $(B)/bench_gpu_train && \
	    $(B)/bench_gpu_train $(if $(wildcard $(FMNIST)/train-images-idx3-ubyte),--fashion $(FMNIST)); fi

clean:
	rm -rf $(B)
