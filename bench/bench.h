/* bench.h - what every benchmark shares: a monotonic clock, allocation that
   ends the run when memory is short (zeroed, so the pages are faulted in
   before anything is timed), and check(), which ends it when a mixprec call
   fails. Define BENCH_NAME (the program's name in messages) first, and
   BENCH_NO_MODEL_ERROR for what to print when a failing call has no model. */
#ifndef MIXPREC_BENCH_H
#define MIXPREC_BENCH_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef BENCH_NO_MODEL_ERROR
#define BENCH_NO_MODEL_ERROR ""
#endif

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "%s: cannot allocate %zu bytes\n", BENCH_NAME, bytes);
        exit(1);
    }
    memset(p, 0, bytes);
    return p;
}

static inline void check(mp_status s, const mp_model *m, const char *what) {
    if (s == MP_OK) return;
    fprintf(stderr, "%s: %s: %s: %s\n", BENCH_NAME, what, mp_status_message(s), m ? mp_model_error(m) : BENCH_NO_MODEL_ERROR);
    exit(1);
}
#endif
