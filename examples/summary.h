/* summary.h - ex_summary, the lines of the summary `make demo` ends with.
   Included by example.h, and by the examples that need nothing else. */
#ifndef EXAMPLE_SUMMARY_H
#define EXAMPLE_SUMMARY_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* What the example showed, in one line: appended to the file
   $MIXPREC_DEMO_SUMMARY names, when it is set (make demo sets it). */
static inline void ex_summary(const char *example, const char *fmt, ...) {
    const char *path = getenv("MIXPREC_DEMO_SUMMARY");
    FILE *f = path ? fopen(path, "a") : NULL;
    va_list ap;
    if (!f) return;
    fprintf(f, "  %-12s ", example);
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

#endif /* EXAMPLE_SUMMARY_H */
