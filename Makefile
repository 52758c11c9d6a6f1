# mixprec: `make` builds the examples, `make demo` runs them, `make test` runs
# the test matrix (last line: N passed, N failed), `make bench` the benchmarks.
CC     ?= cc
ARCH   ?= -march=native
CFLAGS ?= -O2
WARN    = -std=c99 -Wall -Wextra -Wpedantic -Werror
B       = build

EXAMPLES = $(B)/overflow
BENCHES  = $(B)/bench_convert_gcc $(B)/bench_convert_clang

.PHONY: all examples demo test bench bench-build clean

all: examples
examples: $(EXAMPLES)

$(B):
	mkdir -p $(B)

$(B)/%: examples/%.c mixprec.h | $(B)
	$(CC) $(WARN) $(CFLAGS) $(ARCH) $< -o $@ -lm

demo: $(B)/overflow
	./$(B)/overflow

test:
	@bash tests/matrix.sh

# The conversion benchmark, built by gcc and by clang side by side (gcc 12
# at -O2 does not vectorise the portable path; clang does).
$(B)/bench_convert_%: bench/convert.c mixprec.h | $(B)
	@if command -v $* >/dev/null; then $* $(WARN) -O2 $(ARCH) $< -o $@ -lm; \
	else printf '#!/bin/sh\necho "bench=convert cc=$* available=0"\n' > $@; chmod +x $@; fi

bench-build: $(BENCHES)

bench: bench-build
	@for b in $(BENCHES); do ./$$b; done

clean:
	rm -rf $(B)
