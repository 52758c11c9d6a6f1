/* check.h - the tests' tiny harness. Each CHECK counts one pass or one
   failure; a failure prints where and what. check_done() prints the binary's
   tally as `NAME: N passed, N failed` (the Makefile adds them up) and gives
   the exit status. */
#ifndef MIXPREC_CHECK_H
#define MIXPREC_CHECK_H
#include <stdio.h>

static unsigned long check_passed, check_failed;

static int check_report(int ok, const char *file, int line, const char *what) {
    if (ok) {
        check_passed++;
    } else {
        check_failed++;
        if (check_failed <= 50) fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what);
    }
    return ok;
}

#define CHECK(cond) check_report((cond) != 0, __FILE__, __LINE__, #cond)
/* equality of unsigned integers (bit patterns), printing both on failure */
#define CHECK_EQ(a, b)                                                                     \
    do {                                                                                   \
        unsigned long long check_a_ = (a), check_b_ = (b);                                 \
        if (!check_report(check_a_ == check_b_, __FILE__, __LINE__, #a " == " #b))         \
            fprintf(stderr, "    got 0x%llx, want 0x%llx\n", check_a_, check_b_);          \
    } while (0)

static int check_done(const char *name) {
    printf("%s: %lu passed, %lu failed\n", name, check_passed, check_failed);
    return check_failed != 0;
}
#endif
