/* check.h - the tests' tiny harness. Each CHECK counts one pass or one
   failure; a failure prints where, in which test and what. check_done()
   prints the binary's tally as `NAME: N passed, N failed` (the Makefile adds
   them up) and gives the exit status.

   main() runs each test through RUN(test_name(args)) after
   check_args(argc, argv). A test's name is the call without `test_` and
   without `()`: RUN(test_grad_conv()) is grad_conv, RUN(test_resume_fit(MP_ADAM))
   is resume_fit(MP_ADAM). Names on the command line run only those tests
   (`./build/test_train grad_conv`; `resume_fit` runs every resume_fit(...));
   --list prints the names. An argument with a '/' is a path the program
   reads (check_path), never a name. --quick (what `make check` passes to
   every program) asks for the program's fast case: check_quick is set, and
   a program with a long run (test_numerics) samples it. */
#ifndef MIXPREC_CHECK_H
#define MIXPREC_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long check_passed, check_failed;
static const char *check_test = "main"; /* the test running now */
static char check_name_buf[128];
static char *check_names[32];    /* the names asked for, or none: run all */
static int check_name_count, check_listing, check_quick;
static unsigned long check_matched; /* bit i: name i ran a test */
static const char *check_path_arg;  /* the first argument with a '/' */

static int check_report(int ok, const char *file, int line, const char *what) {
    if (ok) {
        check_passed++;
    } else {
        check_failed++;
        if (check_failed <= 50) fprintf(stderr, "%s:%d: %s: FAILED: %s\n", file, line, check_test, what);
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

static void check_args(int argc, char **argv) {
    int i;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) check_listing = 1;
        else if (strcmp(argv[i], "--quick") == 0) check_quick = 1;
        else if (strchr(argv[i], '/')) { if (!check_path_arg) check_path_arg = argv[i]; }
        else if (check_name_count < 32) check_names[check_name_count++] = argv[i];
    }
}
/* The path given on the command line, or NULL. */
/* Checks whose number depends on the machine (how many blocks a SIMD path
   allocates, say) count as one, so that every machine's tally is the same:
   check_fold_begin(), the checks, then CHECK_FOLD("what"): one pass if
   none of them failed (each failure is printed where it happened). */
static unsigned long check_fold_passed, check_fold_failed;
static inline void check_fold_begin(void) { check_fold_passed = check_passed, check_fold_failed = check_failed; }
static inline int check_fold_end(const char *file, int line, const char *what) {
    int ok = check_failed == check_fold_failed;
    check_passed = check_fold_passed, check_failed = check_fold_failed;
    return check_report(ok, file, line, what);
}
#define CHECK_FOLD(what) check_fold_end(__FILE__, __LINE__, what)

static inline const char *check_path(void) { return check_path_arg; }

/* The test's name from its call's text: "test_grad_conv()" -> "grad_conv". */
static const char *check_name_of(const char *call) {
    size_t n;
    if (strncmp(call, "test_", 5) == 0) call += 5;
    n = strlen(call);
    if (n >= 2 && strcmp(call + n - 2, "()") == 0) n -= 2;
    if (n >= sizeof check_name_buf) n = sizeof check_name_buf - 1;
    memcpy(check_name_buf, call, n);
    check_name_buf[n] = '\0';
    return check_name_buf;
}

/* Whether the test named `name` runs; it becomes check_test if so. */
static int check_begin(const char *call) {
    const char *name = check_name_of(call);
    size_t base = strcspn(name, "(");
    int i, run = check_name_count == 0;
    for (i = 0; i < check_name_count; i++) {
        const char *want = strncmp(check_names[i], "test_", 5) == 0 ? check_names[i] + 5 : check_names[i];
        if (strcmp(want, name) == 0 || (strlen(want) == base && strncmp(want, name, base) == 0)) {
            check_matched |= 1ul << i;
            run = 1;
        }
    }
    if (check_listing) {
        printf("%s\n", name);
        return 0;
    }
    check_test = run ? name : "main";
    return run;
}

#define RUN(call)                                                                          \
    do {                                                                                   \
        if (check_begin(#call)) {                                                          \
            call;                                                                          \
            check_test = "main";                                                           \
        }                                                                                  \
    } while (0)

static int check_done(const char *name) {
    int i;
    if (check_listing) exit(0);
    for (i = 0; i < check_name_count; i++)
        if (!(check_matched & (1ul << i))) {
            fprintf(stderr, "%s: no test is named %s (--list prints the names)\n", name, check_names[i]);
            check_failed++;
        }
    printf("%s: %lu passed, %lu failed\n", name, check_passed, check_failed);
    return check_failed != 0;
}
#endif
