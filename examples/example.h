/* example.h - what every example shares: checked calls, `--flag value`
   parsing and a reproducible random generator.

   Include after mixprec.h (the example defines MIXPREC_IMPLEMENTATION). */
#ifndef EXAMPLE_H
#define EXAMPLE_H

#include "../mixprec.h"

#include "summary.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Errors: every mp_ call is checked; on failure say which call, the status
   and, when there is a model, its detailed message, then stop. */

static void check_status(mp_status st, const mp_model *m, const char *call, int line) {
    if (st == MP_OK) return;
    fprintf(stderr, "error at line %d: %s\n  %s: %s\n", line, call, mp_status_name(st),
            mp_status_message(st));
    if (m) fprintf(stderr, "  model: %s\n", mp_model_error(m));
    exit(1);
}
#define CHECK(call, model) check_status((call), (model), #call, __LINE__)

/* ------------------------------------------------------------------------ */
/* Flags: `--name value` pairs. */

/* The integer value of flag argv[i] (i + 1 must exist), at least min. */
static long flag_long(int argc, char **argv, int i, long min) {
    char *end;
    long v;
    if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", argv[i]);
        exit(2);
    }
    v = strtol(argv[i + 1], &end, 10);
    if (*argv[i + 1] == '\0' || *end != '\0' || v < min) {
        fprintf(stderr, "%s: '%s' is not an integer >= %ld\n", argv[i], argv[i + 1], min);
        exit(2);
    }
    return v;
}

/* `--backend cpu|cuda`: the models' backend (NULL: the CPU). cuda exists in
   builds against the CUDA library (`make examples-cuda`: EXAMPLE_CUDA). */
#ifdef EXAMPLE_CUDA
#include "../cuda/mixprec_cuda.h"
#endif
static const mp_backend *ex_backend;

/* 1 when argv[i] is --backend (its value taken), else 0. */
static inline int flag_backend(int argc, char **argv, int i) {
    if (strcmp(argv[i], "--backend") != 0) return 0;
    if (i + 1 < argc && strcmp(argv[i + 1], "cpu") == 0) ex_backend = NULL;
#ifdef EXAMPLE_CUDA
    else if (i + 1 < argc && strcmp(argv[i + 1], "cuda") == 0) ex_backend = mp_cuda_backend();
#endif
    else {
        fprintf(stderr, "--backend: cpu%s (this build: %s)\n",
#ifdef EXAMPLE_CUDA
                " or cuda", "with the CUDA library"
#else
                "", "without CUDA; `make examples-cuda` builds the examples with it"
#endif
        );
        exit(2);
    }
    return 1;
}

/* Weights in and out as safetensors files (mixprec.h's >>safetensors), so
   that what one example trains PyTorch can serve, or the reverse:
   --save-weights PATH   the trained weights, after the test
   --load-weights PATH   weights to start from (--epochs 0, tiny_gpt's --steps 0: only evaluate them)
   --weights-layout keras|pytorch   names and kernel shapes (keras)
   --weights-dtype float32|float16|bfloat16   what --save-weights stores (float32) */
typedef struct ex_weights {
    const char *save, *load;
    mp_safetensors_desc desc;
} ex_weights;
static ex_weights ex_weights_flags;

/* 1 when argv[i] is one of the weights flags (its value taken), else 0. */
static inline int flag_weights(int argc, char **argv, int i) {
    const char *v = i + 1 < argc ? argv[i + 1] : "";
    if (strcmp(argv[i], "--save-weights") == 0) ex_weights_flags.save = v;
    else if (strcmp(argv[i], "--load-weights") == 0) ex_weights_flags.load = v;
    else if (strcmp(argv[i], "--weights-layout") == 0) {
        if (strcmp(v, "keras") != 0 && strcmp(v, "pytorch") != 0) {
            fprintf(stderr, "--weights-layout: keras or pytorch, not '%s'\n", v);
            exit(2);
        }
        ex_weights_flags.desc.layout = strcmp(v, "pytorch") == 0 ? MP_LAYOUT_PYTORCH : MP_LAYOUT_KERAS;
    } else if (strcmp(argv[i], "--weights-dtype") == 0) {
        if (mp_dtype_from_name(v, &ex_weights_flags.desc.dtype) != MP_OK || ex_weights_flags.desc.dtype == MP_INT32) {
            fprintf(stderr, "--weights-dtype: float32, float16 or bfloat16, not '%s'\n", v);
            exit(2);
        }
    } else return 0;
    return 1;
}

/* --policy NAME|all: the dtype policies an example trains under, one
   after another from the same initial weights; all three by default. */
enum { EX_POLICIES = 3 };
typedef struct ex_policies {
    const char *name[EX_POLICIES];
    int count;
} ex_policies;

static inline void ex_all_policies(ex_policies *p) {
    static const char *const all[EX_POLICIES] = {"float32", "mixed_float16", "mixed_bfloat16"};
    int k;
    for (k = 0; k < EX_POLICIES; k++) p->name[k] = all[k];
    p->count = EX_POLICIES;
}

/* 1 when argv[i] is --policy with a known policy or all (its value taken),
   else 0 (the caller's usage then names the choices). */
static inline int flag_policy(int argc, char **argv, int i, ex_policies *p) {
    mp_policy known;
    if (strcmp(argv[i], "--policy") != 0 || i + 1 >= argc) return 0;
    if (strcmp(argv[i + 1], "all") == 0) ex_all_policies(p);
    else if (mp_policy_from_name(argv[i + 1], &known) != MP_OK) return 0;
    else p->name[0] = argv[i + 1], p->count = 1;
    return 1;
}

/* --load-weights into m (built): a file refused stops the example with
   the library's message. */
static inline void ex_load_weights(mp_model *m) {
    if (!ex_weights_flags.load) return;
    CHECK(mp_model_load_safetensors(m, ex_weights_flags.load, &ex_weights_flags.desc), m);
    printf("loaded the weights of %s\n", ex_weights_flags.load);
}

static inline void ex_save_weights(mp_model *m) {
    if (!ex_weights_flags.save) return;
    CHECK(mp_model_save_safetensors(m, ex_weights_flags.save, &ex_weights_flags.desc), m);
    printf("saved the weights to %s\n", ex_weights_flags.save);
}

/* `flag` 0 (--epochs, --steps: how long to train) evaluates loaded
   weights; --save-weights writes one model's. */
static inline void ex_check_weights_flags(const char *flag, int length, int models) {
    if (length == 0 && !ex_weights_flags.load) {
        fprintf(stderr, "%s 0 evaluates the weights of --load-weights: give it\n", flag);
        exit(2);
    }
    if (ex_weights_flags.save && models != 1) {
        fprintf(stderr, "--save-weights writes one model's weights: give one --policy\n");
        exit(2);
    }
}

/* The model's peak memory: host_peak on the CPU, the device's own on a GPU
   (where the host holds only staging). */
static inline size_t ex_peak_bytes(const mp_model *m, size_t host_peak) {
    mp_model_memory mm;
    if (!ex_backend) return host_peak;
    CHECK(mp_model_memory_info(m, &mm), m);
    return mm.peak;
}

/* splitmix64: a tiny deterministic generator, the same on every platform. */
static uint64_t ex_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float ex_uniform(uint64_t *state) { /* [0, 1) */
    return (float)(ex_next(state) >> 40) * (1.0f / 16777216.0f);
}

#endif /* EXAMPLE_H */
