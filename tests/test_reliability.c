/* test_reliability.c - what a hostile user tries, one section per class:
   1. a failed call changes nothing: for every public call that changes a
      model, in states that matter (first build, AMP compile after float32
      training and back, a new loss scale, loads, fit with a new batch), an
      allocation failure at each of its allocations in turn; the model must
      then equal an untouched twin: layers and dtypes, AMP report, loss-scale
      state, whether a layer can still be added, checkpoint bytes, and the
      weights and checkpoint after the same training, bit for bit;
   2. sizes from user input that overflow (fit's validation count near
      2^24, windows near INT_MAX, n x features x 4 past SIZE_MAX);
   3. constructors that fail early leak nothing;
   4. non-finite targets and settings, impossible optimizer state in a
      checkpoint with a valid checksum: refused, naming the field;
   5. reads are bounded: /dev/zero, a FIFO, files longer or shorter than
      their header says;
   6. every out-parameter is left as it was on error;
   7. two processes saving to one path while a third reads: every read is
      a whole file, no temporary is left, and each save fsyncs the file and
      its directory although this file asks only for _POSIX_C_SOURCE
      199309L (a counting fsync replaces libc's here).
   mixprec allocates through a counting allocator that fails on request. */
#define _POSIX_C_SOURCE 199309L /* fork, mkfifo, clock_gettime: less than mixprec's fsync once needed */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* >>the counting allocator: fails its t_fail_at-th allocation (1-based) */
typedef union { long double ld; long long ll; void *p; double d; } t_align;
#define T_HDR sizeof(t_align)
#define T_CAP ((size_t)1 << 32) /* refuse bigger requests as a real malloc would (ASan aborts) */
static size_t t_live_blocks, t_count, t_fail_at, t_injected;
static int t_failed;

static void *t_malloc(size_t sz) {
    unsigned char *p;
    if (t_fail_at && ++t_count == t_fail_at) {
        t_failed = 1;
        t_injected++;
        return NULL;
    }
    if (sz > T_CAP || !(p = (unsigned char *)malloc(T_HDR + sz))) return NULL;
    t_live_blocks++;
    return p + T_HDR;
}
static void t_free(void *q) {
    if (!q) return;
    t_live_blocks--;
    free((unsigned char *)q - T_HDR);
}

/* >>fsync, counted: by kind of file (the test's files need no disk) */
static int t_fsync_files, t_fsync_dirs;
int fsync(int fd) {
    struct stat st;
    if (fstat(fd, &st) == 0) {
        if (S_ISDIR(st.st_mode)) t_fsync_dirs++;
        else if (S_ISREG(st.st_mode)) t_fsync_files++;
    }
    return 0;
}

#define MIXPREC_MALLOC(sz) t_malloc(sz)
#define MIXPREC_FREE(p) t_free(p)
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"
#include "forge.h"

static char tmp_dir[64];
static char *in_tmp(const char *name) {
    static char paths[8][160];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, sizeof paths[0], "%s/%s", tmp_dir, name);
    return p;
}

/* a status and a model error that mentions word */
static int expect(mp_status got, mp_status want, const mp_model *m, const char *word, const char *file, int line) {
    char what[200];
    int ok = got == want && (!m || !word || strstr(mp_model_error(m), word));
    snprintf(what, sizeof what, "want %s mentioning '%s'", mp_status_name(want), word ? word : "");
    if (!check_report(ok, file, line, what))
        fprintf(stderr, "    got %s: %s\n", mp_status_name(got), m ? mp_model_error(m) : "");
    return ok;
}
#define EXPECT(call, want, m, word) expect((call), (want), (m), (word), __FILE__, __LINE__)

/* >>data: 16 samples of 4 features, 3 classes */
#define NS 16
static float sx[NS * 4];
static int32_t sl[NS];

static mp_fit_desc fit_of(int batch, int epochs) { return silent_fit(sx, 4, sl, NS, batch, epochs); }
static mp_compile_desc compile_of(mp_optimizer_kind opt, int amp) {
    mp_compile_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.optimizer.kind = opt;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.amp.enabled = amp;
    return cd;
}

/* input 4 -> Dense(8, relu) -> Dropout -> Dense(3, softmax), seed 7, threads 1 (fork-safe) */
static mp_model *fresh(const char *policy, int layers) {
    mp_model_desc md;
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4;
    md.seed = 7;
    md.threads = 1;
    mp_set_global_policy_name(policy);
    if (mp_model_create(&m, &md) != MP_OK) m = NULL;
    if (m && layers)
        if (mp_model_add(m, mp_dense(8, MP_RELU)) != MP_OK || mp_model_add(m, mp_dropout(0.25f)) != MP_OK ||
            mp_model_add(m, mp_dense(3, MP_SOFTMAX)) != MP_OK)
            mp_model_destroy(m), m = NULL;
    mp_set_global_policy_name("float32");
    if (!m) fprintf(stderr, "cannot make the test model\n"), exit(2);
    return m;
}
static void must(mp_status st, const mp_model *m, const char *what) {
    if (st != MP_OK) fprintf(stderr, "setup failed: %s: %s: %s\n", what, mp_status_name(st), mp_model_error(m)), exit(2);
}

/* ======================================================================== */
/* 1. A failed call changes nothing */

static unsigned char *ckpt_bytes(mp_model *m, size_t *len) {
    unsigned char *b;
    *len = 0;
    if (mp_model_save_to_memory(m, NULL, 0, len) != MP_OK) return NULL;
    b = (unsigned char *)zalloc(*len);
    if (mp_model_save_to_memory(m, b, *len, len) != MP_OK) free(b), b = NULL;
    return b;
}

static int same_bytes(mp_model *a, mp_model *b) {
    size_t la, lb;
    unsigned char *x = ckpt_bytes(a, &la), *y = ckpt_bytes(b, &lb);
    int same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

/* everything a caller can see without changing the model */
static int same_visible(const mp_model *a, const mp_model *b) {
    char ra[512], rb[512];
    const mp_loss_scale *la = mp_model_loss_scale(a), *lb = mp_model_loss_scale(b);
    int i, n = mp_model_layer_count(a), same = n == mp_model_layer_count(b);
    for (i = 0; same && i < n; i++) {
        mp_layer_info x, y;
        same = mp_model_layer_info(a, i, &x) == MP_OK && mp_model_layer_info(b, i, &y) == MP_OK &&
               strcmp(x.name, y.name) == 0 && x.compute_dtype == y.compute_dtype && x.output_dtype == y.output_dtype &&
               x.params == y.params && x.rank == y.rank && memcmp(x.output_shape, y.output_shape, sizeof x.output_shape) == 0;
    }
    same = same && mp_model_param_count(a) == mp_model_param_count(b) &&
           mp_optimizer_slot_count(a) == mp_optimizer_slot_count(b) && !la == !lb && (!la || memcmp(la, lb, sizeof *la) == 0);
    if (same) {
        mp_status sa = mp_model_amp_report(a, ra, sizeof ra), sb = mp_model_amp_report(b, rb, sizeof rb);
        same = sa == sb && (sa != MP_OK || strcmp(ra, rb) == 0);
    }
    return same;
}

/* The same further life for both: a layer added if it can be, the
   checkpoint, a compile if there was none, two epochs, the checkpoint and
   the weights again. */
static int same_after_training(mp_model *a, mp_model *b) {
    mp_fit_desc fd = fit_of(4, 2);
    mp_compile_desc cd = compile_of(MP_ADAM, 0);
    mp_status sa = mp_model_add(a, mp_dense(3, MP_SOFTMAX)), sb = mp_model_add(b, mp_dense(3, MP_SOFTMAX));
    int same = sa == sb && same_bytes(a, b);
    sa = mp_model_fit(a, &fd);
    sb = mp_model_fit(b, &fd);
    if (same && sa == MP_ERR_STATE && sb == MP_ERR_STATE) {
        must(mp_model_compile(a, &cd), a, "compile a");
        must(mp_model_compile(b, &cd), b, "compile b");
        sa = mp_model_fit(a, &fd);
        sb = mp_model_fit(b, &fd);
    }
    return same && sa == MP_OK && sb == MP_OK && same_bytes(a, b) && same_visible(a, b);
}

typedef struct scenario {
    const char *name;
    mp_model *(*make)(void); /* the state before the call, the same every time */
    mp_status (*call)(mp_model *m);
} scenario;

static mp_model *make_empty(void) { return fresh("float32", 0); }
static mp_model *make_eight(void) {
    mp_model *m = fresh("float32", 0);
    int i;
    for (i = 0; i < 8; i++) must(mp_model_add(m, mp_dense(4, MP_RELU)), m, "add");
    return m;
}
static mp_model *make_layers(void) { return fresh("float32", 1); }
static mp_model *make_trained(int amp) {
    mp_model *m = fresh("float32", 1);
    mp_compile_desc cd = compile_of(MP_ADAM, amp);
    mp_fit_desc fd = fit_of(4, 1);
    must(mp_model_compile(m, &cd), m, "compile");
    must(mp_model_fit(m, &fd), m, "fit");
    return m;
}
static mp_model *make_trained_f32(void) { return make_trained(0); }
static mp_model *make_trained_amp(void) { return make_trained(1); }
static mp_model *make_trained_mixed(void) {
    mp_model *m = fresh("mixed_float16", 1);
    mp_compile_desc cd = compile_of(MP_RMSPROP, 0);
    mp_fit_desc fd = fit_of(4, 1);
    must(mp_model_compile(m, &cd), m, "compile");
    must(mp_model_fit(m, &fd), m, "fit");
    return m;
}

static mp_status call_add(mp_model *m) { return mp_model_add(m, mp_dense(5, MP_TANH)); }
static mp_status call_build(mp_model *m) { return mp_model_build(m); }
static mp_status call_compile_f32(mp_model *m) {
    mp_compile_desc cd = compile_of(MP_ADAM, 0);
    return mp_model_compile(m, &cd);
}
static mp_status call_compile_amp(mp_model *m) {
    mp_compile_desc cd = compile_of(MP_ADAM, 1);
    return mp_model_compile(m, &cd);
}
static mp_status call_compile_scale(mp_model *m) { /* another optimizer and loss scale */
    mp_compile_desc cd = compile_of(MP_SGD, 0);
    cd.optimizer.momentum = 0.9f;
    cd.loss_scale = MP_LOSS_SCALE_ON;
    cd.loss_scale_config.initial_scale = 256.0f;
    return mp_model_compile(m, &cd);
}
static mp_status call_set_weights(mp_model *m) {
    static float w[67];
    size_t i;
    for (i = 0; i < 67; i++) w[i] = (float)i / 67.0f - 0.5f;
    return mp_model_set_weights(m, w, 67);
}
static mp_status call_load(mp_model *m) { return mp_model_load(m, in_tmp("later.ckpt")); }
static mp_status call_import(mp_model *m) { return mp_model_import_weights(m, in_tmp("later.f16")); }
static mp_status call_fit_new_batch(mp_model *m) {
    mp_fit_desc fd = fit_of(8, 1);
    fd.validation_split = 0.25f;
    return mp_model_fit(m, &fd);
}
static mp_status call_predict(mp_model *m) {
    static float out[NS * 3];
    mp_data d = data_xy(sx, 4, NULL, NS);
    return mp_model_predict(m, &d, NS, out, NS * 3);
}
static mp_status call_forward(mp_model *m) { return forward_rows(m, sx, 12, 1); }
static mp_status call_numerics(mp_model *m) {
    mp_numerics_desc nd;
    memset(&nd, 0, sizeof nd);
    nd.every = 2;
    return mp_model_set_numerics(m, &nd);
}

static const scenario scenarios[] = {
    {"add the first layer", make_empty, call_add},
    {"add a ninth layer (the array grows)", make_eight, call_add},
    {"build", make_layers, call_build},
    {"compile float32 (first build)", make_layers, call_compile_f32},
    {"compile with AMP after float32 training", make_trained_f32, call_compile_amp},
    {"compile float32 after AMP training", make_trained_amp, call_compile_f32},
    {"compile AMP again after AMP training", make_trained_amp, call_compile_amp},
    {"compile another optimizer and loss scale (mixed_float16)", make_trained_mixed, call_compile_scale},
    {"set_weights (first build)", make_layers, call_set_weights},
    {"load a checkpoint file", make_trained_f32, call_load},
    {"import float16 weights", make_trained_f32, call_import},
    {"fit with a larger batch and a validation split", make_trained_f32, call_fit_new_batch},
    {"predict with a larger batch", make_trained_mixed, call_predict},
    {"forward with a larger batch", make_trained_amp, call_forward},
    {"set_numerics (first build)", make_layers, call_numerics},
    {"set_numerics on a trained model", make_trained_mixed, call_numerics},
};

static void run_scenario(const scenario *s) {
    mp_model *twin = s->make(), *m = s->make();
    size_t allocs, k, blocks;
    char what[200];
    t_fail_at = 0;
    /* how many allocations the call makes when none fails */
    t_count = 0, t_fail_at = (size_t)-1;
    if (!CHECK(s->call(m) == MP_OK)) fprintf(stderr, "    %s: %s\n", s->name, mp_model_error(m));
    allocs = t_count, t_fail_at = 0;
    mp_model_destroy(m);
    if (!allocs) { /* nothing to fail: the call still works on the twin's copy */
        m = s->make();
        snprintf(what, sizeof what, "%s: without allocations, still the same life after", s->name);
        check_report(s->call(m) == MP_OK, __FILE__, __LINE__, what);
        mp_model_destroy(m);
    }
    for (k = 1; k <= allocs; k++) {
        mp_status st;
        m = s->make();
        blocks = t_live_blocks;
        t_count = 0, t_fail_at = k, t_failed = 0;
        st = s->call(m);
        t_fail_at = 0;
        snprintf(what, sizeof what, "%s: allocation %zu of %zu fails: MP_ERR_ALLOC", s->name, k, allocs);
        if (!check_report(t_failed && st == MP_ERR_ALLOC, __FILE__, __LINE__, what))
            fprintf(stderr, "    got %s: %s\n", mp_status_name(st), mp_model_error(m));
        snprintf(what, sizeof what, "%s: allocation %zu fails: nothing more is held", s->name, k);
        check_report(t_live_blocks <= blocks, __FILE__, __LINE__, what); /* fewer: activations are freed first */
        snprintf(what, sizeof what, "%s: allocation %zu fails: the model looks like its twin", s->name, k);
        check_report(same_visible(m, twin), __FILE__, __LINE__, what);
        snprintf(what, sizeof what, "%s: allocation %zu fails: the same checkpoint and training as its twin", s->name, k);
        {
            mp_model *t2 = s->make(); /* the twin's life once more, for each k */
            check_report(same_after_training(m, t2), __FILE__, __LINE__, what);
            mp_model_destroy(t2);
        }
        mp_model_destroy(m);
    }
    mp_model_destroy(twin);
}

/* stdout to /dev/null and back: compile's AMP lines, hundreds of them */
static void quiet(int on) {
    static int saved = -1;
    fflush(stdout);
    if (on && saved < 0) {
        int null = open("/dev/null", O_WRONLY);
        saved = dup(1);
        if (null >= 0 && saved >= 0) dup2(null, 1);
        if (null >= 0) close(null);
    } else if (!on && saved >= 0) {
        dup2(saved, 1);
        close(saved);
        saved = -1;
    }
}

/* Calls refused for a reason other than memory, on a model not yet built
   (and one compiled): the same comparison with a twin. */
static mp_status refuse_import_other(mp_model *m) { return mp_model_import_weights(m, in_tmp("other.f16")); }
static mp_status refuse_load_other(mp_model *m) { return mp_model_load(m, in_tmp("other.ckpt")); }
static mp_status refuse_load_missing(mp_model *m) { return mp_model_load(m, in_tmp("missing.ckpt")); }
static mp_status refuse_set_weights(mp_model *m) {
    static float w[66];
    return mp_model_set_weights(m, w, 66);
}
static mp_status refuse_get_weights(mp_model *m) {
    static float w[68];
    return mp_model_get_weights(m, w, 68);
}
static mp_status refuse_compile(mp_model *m) {
    mp_compile_desc cd = compile_of(MP_ADAM, 1);
    cd.amp.allow_add = "NoSuchOp";
    return mp_model_compile(m, &cd);
}
static mp_status refuse_compile_lr(mp_model *m) {
    mp_compile_desc cd = compile_of(MP_SGD, 0);
    cd.optimizer.learning_rate = INFINITY;
    return mp_model_compile(m, &cd);
}
static mp_status refuse_numerics(mp_model *m) {
    mp_numerics_desc nd;
    memset(&nd, 0, sizeof nd);
    nd.every = 1;
    nd.csv_path = in_tmp("no/such/dir/numerics.csv");
    return mp_model_set_numerics(m, &nd);
}
static const scenario refusals[] = {
    {"import another model's weights", make_layers, refuse_import_other},
    {"load another model's checkpoint", make_layers, refuse_load_other},
    {"load a missing file", make_layers, refuse_load_missing},
    {"set_weights of the wrong length", make_layers, refuse_set_weights},
    {"get_weights of the wrong length", make_layers, refuse_get_weights},
    {"compile with an unknown AMP op", make_layers, refuse_compile},
    {"compile AMP with an unknown op after training", make_trained_f32, refuse_compile},
    {"compile with an infinite learning rate after AMP training", make_trained_amp, refuse_compile_lr},
    {"set_numerics with a CSV that cannot be created", make_layers, refuse_numerics},
};

static void test_refusals(void) {
    mp_model *other = fresh("float32", 0);
    mp_compile_desc cd = compile_of(MP_ADAM, 0);
    size_t i;
    must(mp_model_add(other, mp_dense(5, MP_RELU)), other, "add");
    must(mp_model_add(other, mp_dense(3, MP_SOFTMAX)), other, "add");
    must(mp_model_export_weights(other, MP_FLOAT16, in_tmp("other.f16")), other, "export");
    must(mp_model_compile(other, &cd), other, "compile");
    must(mp_model_save(other, in_tmp("other.ckpt")), other, "save");
    mp_model_destroy(other);
    quiet(1);
    for (i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        mp_model *m = refusals[i].make(), *twin = refusals[i].make();
        char what[160];
        mp_status st = refusals[i].call(m);
        snprintf(what, sizeof what, "%s: refused (%s), the model is its twin", refusals[i].name, mp_status_name(st));
        check_report(st != MP_OK && st != MP_ERR_ALLOC && same_visible(m, twin) && same_after_training(m, twin),
                     __FILE__, __LINE__, what);
        mp_model_destroy(m);
        mp_model_destroy(twin);
    }
    quiet(0);
    remove(in_tmp("other.f16")), remove(in_tmp("other.ckpt"));
}

static void test_transactional(void) {
    size_t i, before = t_injected, start = t_live_blocks;
    mp_model *later = make_trained_f32();
    mp_fit_desc fd = fit_of(4, 2);
    must(mp_model_fit(later, &fd), later, "fit");
    must(mp_model_save(later, in_tmp("later.ckpt")), later, "save");
    must(mp_model_export_weights(later, MP_FLOAT16, in_tmp("later.f16")), later, "export");
    mp_model_destroy(later);
    quiet(1);
    for (i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) run_scenario(&scenarios[i]);
    quiet(0);
    CHECK(t_live_blocks == start);
    printf("1. %zu allocation failures injected into %zu kinds of call, each model compared with its twin\n",
           t_injected - before, sizeof scenarios / sizeof scenarios[0]);
}

/* ======================================================================== */
/* 2. Sizes from user input */

/* mp__split_count against exact 128-bit arithmetic: within one sample
   below ceil(n s), and only where n s is within the float's own rounding
   of s above a whole number */
__extension__ typedef unsigned __int128 u128;
static void test_split_counts(void) {
    size_t i, bad = 0, snapped = 0;
    static const size_t ns[] = {10, 100, 60000, 16777217, 16777219};
    static const size_t want[] = {1, 10, 6000, 0, 0}; /* 0.1 of each (n >= 2^24: not a round split) */
    for (i = 0; i < 200000; i++) {
        uint64_t bits = rng_next();
        size_t n = (size_t)(rng_next() >> (rng_next() % 64));
        float s;
        uint32_t sb = (uint32_t)(bits % 0x3F800000u); /* every float in [0, 1) */
        uint32_t e = sb >> 23, mant = (sb & 0x7FFFFFu) | (e ? 0x800000u : 0u);
        int k = e ? 150 - (int)e : 149;
        u128 p = (u128)n * mant, whole = k >= 128 ? 0 : p >> k, rest = k >= 128 ? p : p - (whole << k);
        size_t got, ceil_exact;
        memcpy(&s, &sb, 4);
        got = mp__split_count(n, s);
        ceil_exact = (size_t)(whole + (rest != 0));
        if (got == ceil_exact) continue;
        /* one less: only when the excess is below half the float's spacing times n, and below one sample */
        snapped++;
        if (!(got + 1 == ceil_exact && rest != 0 && (k >= 128 || 2 * rest < (u128)n) && (k >= 128 || rest < ((u128)1 << k))))
            bad++;
    }
    if (!CHECK(bad == 0)) fprintf(stderr, "    %zu of 200000 validation counts wrong\n", bad);
    CHECK(snapped > 0);
    for (i = 0; i < 3; i++) CHECK(mp__split_count(ns[i], 0.1f) == want[i]);
    CHECK(mp__split_count(60000, 0.2f) == 12000 && mp__split_count(10, 0.25f) == 3 && mp__split_count(10, 0.33f) == 4);
    CHECK(mp__split_count(16777219, 0.0f) == 0 && mp__split_count(16777217, 0.0f) == 0 && mp__split_count(SIZE_MAX, 0.0f) == 0);
    printf("2. %zu random validation counts checked against 128-bit integers (%zu within the split's rounding)\n",
           (size_t)200000, snapped);
}

/* 2^24 + 3 samples, no validation: every sample trains, none twice and
   none past the buffer (the float count trained on a sample that did not
   exist) */
static void test_split_near_2_24(void) {
    const size_t n = ((size_t)1 << 24) + 3;
    float *x = floats(n), *y = floats(n);
    mp_model_desc md;
    mp_model *m = NULL;
    mp_compile_desc cd;
    mp_fit_desc fd;
    mp_logs hist[1];
    size_t i;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 1;
    md.threads = 1;
    for (i = 0; i < n; i++) x[i] = (float)(i % 7) / 7.0f, y[i] = 2.0f * x[i];
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_MEAN_SQUARED_ERROR;
    cd.optimizer.kind = MP_SGD;
    memset(&fd, 0, sizeof fd);
    fd.data = data_xt(x, 1, y, 1, n);
    fd.batch_size = 1 << 20, fd.verbose = MP_VERBOSE_SILENT, fd.no_shuffle = 1, fd.history = hist;
    if (CHECK(mp_model_create(&m, &md) == MP_OK) && OK(mp_model_add(m, mp_dense(1, MP_LINEAR)), m) &&
        OK(mp_model_compile(m, &cd), m) && OK(mp_model_fit(m, &fd), m))
        CHECK(hist[0].steps == 17 && hist[0].val_loss == 0.0f && isfinite(hist[0].loss));
    mp_model_destroy(m);
    free(x);
    free(y);
}

static void test_windows_and_counts(void) {
    mp_model_desc md;
    mp_model *m = NULL;
    mp_layer_desc conv = mp_conv2d(2, 3, 3, MP_SAME, MP_RELU), pool = mp_max_pooling2d(INT_MAX, 2);
    mp_layer_info info;
    mp_compile_desc cd = compile_of(MP_SGD, 0);
    float out[8], x[28 * 28];
    int32_t lab[1] = {1};
    memset(&md, 0, sizeof md);
    memset(x, 0, sizeof x);
    md.input_shape[0] = 28, md.input_shape[1] = 28, md.input_shape[2] = 1, md.threads = 1;
    /* a stride of INT_MAX under 'same': one output pixel, and it trains */
    if (CHECK(mp_model_create(&m, &md) == MP_OK)) {
        mp_layer_desc huge = mp_conv2d(2, INT_MAX, 1, MP_SAME, MP_RELU);
        huge.strides[0] = 2; /* a kernel of INT_MAX with stride 2 on 28 rows: indices past INT_MAX */
        EXPECT(mp_model_add(m, huge), MP_ERR_SHAPE, m, "INT_MAX");
        EXPECT(mp_model_add(m, pool), MP_ERR_SHAPE, m, "larger");
        conv.strides[0] = conv.strides[1] = INT_MAX;
        OK(mp_model_add(m, conv), m);
        CHECK(mp_model_layer_info(m, 0, &info) == MP_OK && info.output_shape[0] == 1 && info.output_shape[1] == 1);
        OK(mp_model_add(m, mp_flatten()), m);
        OK(mp_model_add(m, mp_dense(3, MP_SOFTMAX)), m);
        OK(mp_model_compile(m, &cd), m);
        {
            mp_fit_desc fd;
            memset(&fd, 0, sizeof fd);
            fd.data = data_xy(x, 28 * 28, lab, 1), fd.batch_size = 1, fd.verbose = MP_VERBOSE_SILENT;
            OK(mp_model_fit(m, &fd), m);
            /* n x features x 4 past SIZE_MAX: refused before a byte of x is read */
            fd.data.x[0].n = fd.data.y.n = SIZE_MAX / 784 + 1;
            EXPECT(mp_model_fit(m, &fd), MP_ERR_SIZE, m, "SIZE_MAX");
            fd.data.x[0].n = SIZE_MAX / 1000;
            EXPECT(mp_model_predict(m, &fd.data, 1, out, 8), MP_ERR_SIZE, m, "SIZE_MAX");
        }
        mp_model_destroy(m);
    }
    /* a sample of more than SIZE_MAX / 4 floats' bytes */
    md.input_shape[0] = INT_MAX, md.input_shape[1] = INT_MAX, md.input_shape[2] = 2;
    {
        size_t blocks = t_live_blocks, current = mp_get_memory_info().current;
        m = (mp_model *)&md; /* must become NULL */
        CHECK(mp_model_create(&m, &md) == MP_ERR_SIZE && m == NULL);
        /* 3. the early failure keeps nothing: not the backend's context, not its pool */
        CHECK(t_live_blocks == blocks && mp_get_memory_info().current == current);
    }
}

/* 3. Constructors that fail early */
static void test_constructor_leaks(void) {
    size_t blocks = t_live_blocks;
    mp_model_desc md;
    mp_model *m = NULL;
    mp_tensor t;
    mp_dataset ds;
    mp_pool *pool = NULL;
    int big[2] = {INT_MAX, INT_MAX};
    unsigned char idx[12] = {0, 0, 8, 1, 0, 0, 0, 4, 1, 2, 3, 4};
    size_t k;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4, md.threads = 2;
    CHECK(mp_tensor_alloc(&t, MP_FLOAT32, 2, big) != MP_OK);
    CHECK(mp_pool_create(&pool, -1) == MP_ERR_ARG);
    CHECK(mp_dataset_from_idx(idx, sizeof idx, idx, sizeof idx, &ds) == MP_ERR_FORMAT);
    for (k = 1; k <= 4; k++) { /* every allocation of a model with a pool of 2 threads */
        t_count = 0, t_fail_at = k;
        if (mp_model_create(&m, &md) == MP_OK) mp_model_destroy(m);
        t_fail_at = 0;
    }
    if (!CHECK(t_live_blocks == blocks)) fprintf(stderr, "    %zu blocks leaked\n", t_live_blocks - blocks);
}

/* ======================================================================== */
/* 4. Non-finite and out-of-range settings, impossible checkpoints */

static void test_nonfinite_targets(void) {
    static const mp_loss losses[] = {MP_MEAN_SQUARED_ERROR, MP_CATEGORICAL_CROSSENTROPY, MP_BINARY_CROSSENTROPY};
    static float y[NS * 3];
    size_t l, i;
    for (l = 0; l < 3; l++)
        for (i = 0; i < 2; i++) {
            mp_model *m = fresh(i ? "mixed_float16" : "float32", 1);
            mp_compile_desc cd = compile_of(MP_ADAM, 0);
            mp_fit_desc fd = fit_of(4, 1);
            mp_logs logs;
            float loss;
            int j;
            for (j = 0; j < NS * 3; j++) y[j] = j % 3 == 0 ? 1.0f : 0.0f;
            y[7 * 3 + 1] = i ? INFINITY : NAN;
            cd.loss = losses[l];
            fd.data.y = mp_rows(y, NS, 3);
            must(mp_model_compile(m, &cd), m, "compile");
            {
                float w0[67], w1[67];
                CHECK(mp_model_param_count(m) == 67 && mp_model_get_weights(m, w0, 67) == MP_OK);
                EXPECT(mp_model_fit(m, &fd), MP_ERR_NONFINITE, m, "y: sample 7, output 1");
                EXPECT(mp_model_evaluate(m, &fd.data, 4, &logs), MP_ERR_NONFINITE, m, "y: sample");
                OK(forward_rows(m, sx, NS, 1), m);
                EXPECT(loss_rows(m, NULL, y, NS, &loss, NULL), MP_ERR_NONFINITE, m, "y: sample 7");
                CHECK(mp_model_get_weights(m, w1, 67) == MP_OK && memcmp(w0, w1, sizeof w0) == 0); /* no weight moved */
            }
            mp_model_destroy(m);
        }
}

/* An input long enough that a pool of 2 threads splits its scan for Inf
   and NaN (2^16 values and more; samples 20000 on are the second
   thread's): a NaN in the second thread's half is named, then an Inf in
   the first's, before it, and nothing changes. */
static void test_nonfinite_wide_x(void) {
    enum { N = 40000 }; /* 160,000 values */
    static float x[N * 4], out[N * 3];
    static int32_t labels[N];
    static const struct { size_t at; float v; const char *says; } bad[] = {
        {39000 * 4 + 2, NAN, "sample 39000, feature 2 is NaN"},
        {12345 * 4 + 3, -INFINITY, "sample 12345, feature 3 is Inf"},
    };
    mp_model_desc md;
    mp_model *m = NULL;
    mp_compile_desc cd = compile_of(MP_ADAM, 0);
    mp_fit_desc fd;
    mp_tensor t;
    float w0[67], w1[67];
    size_t i, b;
    for (i = 0; i < N * 4; i++) x[i] = sx[i % (NS * 4)];
    for (i = 0; i < N; i++) labels[i] = sl[i % NS];
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4, md.seed = 7, md.threads = 2;
    mp_set_global_policy_name("mixed_bfloat16");
    must(mp_model_create(&m, &md), m, "create");
    must(mp_model_add(m, mp_dense(8, MP_RELU)), m, "add");
    must(mp_model_add(m, mp_dense(3, MP_SOFTMAX)), m, "add");
    must(mp_model_compile(m, &cd), m, "compile");
    fd = silent_fit(x, 4, labels, N, 20000, 1);
    OK(forward_rows(m, x, 8, 1), m);
    CHECK(mp_model_get_weights(m, w0, 67) == MP_OK);
    for (b = 0; b < 2; b++) {
        x[bad[b].at] = bad[b].v; /* b = 1: the NaN of b = 0 stays, after it */
        EXPECT(forward_rows(m, x, N, 1), MP_ERR_NONFINITE, m, bad[b].says);
        EXPECT(mp_model_predict(m, &fd.data, 4096, out, N * 3), MP_ERR_NONFINITE, m, bad[b].says);
        EXPECT(mp_model_fit(m, &fd), MP_ERR_NONFINITE, m, bad[b].says);
    }
    CHECK(mp_model_get_weights(m, w1, 67) == MP_OK && memcmp(w0, w1, sizeof w0) == 0);
    CHECK(mp_output(m, &t) == MP_OK && t.shape[0] == 8); /* the last forward is still the one of 8 */
    mp_model_destroy(m);
    mp_set_global_policy_name("float32");
}

static void test_settings(void) {
    static const char *const opt_fields[] = {"learning_rate", "learning_rate", "epsilon", "momentum", "rho", "beta_1", "beta_2"};
    static const char *const ls_fields[] = {"initial_scale", "max_scale", "min_scale", "growth_interval", "hysteresis"};
    mp_model *m = fresh("float32", 1);
    mp_fit_desc fd = fit_of(4, 1);
    size_t i;
    for (i = 0; i < 7; i++) {
        mp_compile_desc cd = compile_of(i >= 5 ? MP_ADAM : i == 4 ? MP_RMSPROP : MP_SGD, 0);
        float bad = i % 2 ? NAN : INFINITY;
        if (i == 0) cd.optimizer.learning_rate = INFINITY;
        if (i == 1) cd.optimizer.learning_rate = NAN;
        if (i == 2) cd.optimizer.epsilon = INFINITY;
        if (i == 3) cd.optimizer.momentum = bad;
        if (i == 4) cd.optimizer.rho = bad;
        if (i == 5) cd.optimizer.beta_1 = bad;
        if (i == 6) cd.optimizer.beta_2 = -bad;
        EXPECT(mp_model_compile(m, &cd), MP_ERR_ARG, m, opt_fields[i]);
    }
    for (i = 0; i < 5; i++) {
        mp_compile_desc cd = compile_of(MP_ADAM, 0);
        mp_loss_scale ls;
        cd.loss_scale = MP_LOSS_SCALE_ON;
        if (i == 0) cd.loss_scale_config.initial_scale = INFINITY;
        if (i == 1) cd.loss_scale_config.max_scale = NAN;
        if (i == 2) cd.loss_scale_config.min_scale = NAN;
        if (i == 3) cd.loss_scale_config.growth_interval = -1;
        if (i == 4) cd.loss_scale_config.hysteresis = -2;
        EXPECT(mp_model_compile(m, &cd), MP_ERR_ARG, m, ls_fields[i]);
        CHECK(mp_loss_scale_init(&ls, &cd.loss_scale_config) == MP_ERR_ARG);
    }
    {
        mp_compile_desc cd = compile_of(MP_ADAM, 0);
        OK(mp_model_compile(m, &cd), m);
    }
    fd.validation_split = NAN;
    EXPECT(mp_model_fit(m, &fd), MP_ERR_ARG, m, "validation_split");
    fd.validation_split = INFINITY;
    EXPECT(mp_model_fit(m, &fd), MP_ERR_ARG, m, "validation_split");
    fd = fit_of(4, -1);
    EXPECT(mp_model_fit(m, &fd), MP_ERR_ARG, m, "epochs");
    fd = fit_of(4, 2);
    fd.initial_epoch = 3;
    EXPECT(mp_model_fit(m, &fd), MP_ERR_ARG, m, "initial_epoch");
    mp_model_destroy(m);
}

/* A trained Adam (and RMSprop) checkpoint whose mean square v is made
   negative or NaN, the checksum fixed: refused, the model untouched. */
static void test_impossible_slots(void) {
    size_t forged = 0, o;
    for (o = 0; o < 2; o++) {
        mp_model *m = o ? make_trained_mixed() : make_trained_f32(), *c = o ? make_trained_mixed() : make_trained_f32();
        size_t len, slots = mp_optimizer_slot_count(m), params = mp_model_param_count(m), clen, i;
        unsigned char *b = ckpt_bytes(m, &len), *c0 = ckpt_bytes(c, &clen);
        float *s = floats(slots);
        CHECK(mp_get_optimizer_slots(m, s, slots) == MP_OK);
        size_t vat = 0; /* where v, the last params slots, is in the file: the whole block matched */
        unsigned char *vb = (unsigned char *)zalloc(params * 4);
        for (i = 0; i < params; i++) {
            uint32_t u;
            memcpy(&u, &s[slots - params + i], 4);
            put_le(vb + 4 * i, u, 4);
        }
        while (b && vat + params * 4 <= len && memcmp(b + vat, vb, params * 4) != 0) vat++;
        CHECK(b && vat + params * 4 <= len);
        free(vb);
        for (i = 0; b && vat + params * 4 <= len && i < params; i += 7) {
            static const float bad[] = {-1.0f, NAN, -1e-30f};
            size_t at = vat + 4 * i, j;
            for (j = 0; j < 3; j++) {
                unsigned char *f = (unsigned char *)zalloc(len);
                uint32_t v;
                memcpy(f, b, len);
                memcpy(&v, &bad[j], 4);
                put_le(f + at, v, 4);
                fix_crc(f, len);
                EXPECT(mp_model_load_from_memory(c, f, len), MP_ERR_FORMAT, c, "mean square");
                forged++;
                free(f);
            }
        }
        {
            size_t l2;
            unsigned char *c1 = ckpt_bytes(c, &l2);
            CHECK(c0 && c1 && l2 == clen && memcmp(c0, c1, clen) == 0);
            free(c1);
        }
        OK(mp_model_load_from_memory(c, b, len), c); /* the genuine file still loads */
        free(b);
        free(c0);
        free(s);
        mp_model_destroy(m);
        mp_model_destroy(c);
    }
    printf("4. %zu forged checkpoints with an impossible mean square, each refused\n", forged);
}

/* ======================================================================== */
/* 5. Bounded reads */

static void write_file(const char *path, const unsigned char *b, size_t n, size_t junk) {
    FILE *f = fopen(path, "wb");
    size_t i;
    if (!f) return;
    fwrite(b, 1, n, f);
    for (i = 0; i < junk; i++) fputc((int)(i & 0xFF), f);
    fclose(f);
}

static void test_bounded_reads(void) {
    mp_model *m = make_trained_f32();
    mp_dataset ds;
    size_t len, before = mp_get_memory_info().current;
    unsigned char *b = ckpt_bytes(m, &len), *big;
    unsigned char idx[12] = {0, 0, 8, 1, 0, 0, 0, 4, 1, 2, 3, 4};
    const char *fifo = in_tmp("fifo");
    memset(&ds, 0x5A, sizeof ds);
    alarm(60); /* a read that waits forever ends the test */
    EXPECT(mp_model_load(m, "/dev/zero"), MP_ERR_IO, m, "regular file");
    CHECK(mp_load_idx("/dev/zero", "/dev/zero", &ds) == MP_ERR_IO);
    CHECK(mkfifo(fifo, 0600) == 0);
    EXPECT(mp_model_load(m, fifo), MP_ERR_IO, m, "regular file");
    CHECK(mp_load_idx(fifo, fifo, &ds) == MP_ERR_IO);
    unlink(fifo);
    /* a file 8 MB longer than its header says: no more than the header is read */
    mp_reset_peak_memory();
    write_file(in_tmp("long.ckpt"), b, len, 8u << 20);
    EXPECT(mp_model_load(m, in_tmp("long.ckpt")), MP_ERR_FORMAT, m, "corrupt");
    write_file(in_tmp("long.idx"), idx, sizeof idx, 8u << 20);
    CHECK(mp_load_idx(in_tmp("long.idx"), in_tmp("long.idx"), &ds) == MP_ERR_FORMAT);
    if (!CHECK(mp_get_memory_info().peak - before < (1u << 20)))
        fprintf(stderr, "    peak %zu bytes over %zu\n", mp_get_memory_info().peak - before, before);
    /* a header that claims 2^62 bytes in a short file: truncated, no 2^62 allocation */
    big = (unsigned char *)zalloc(len);
    memcpy(big, b, len);
    put_le(big + 12, (uint64_t)1 << 62, 8);
    write_file(in_tmp("claims.ckpt"), big, len, 0);
    EXPECT(mp_model_load(m, in_tmp("claims.ckpt")), MP_ERR_FORMAT, m, "truncated");
    put_le(idx + 4, 0xFFFFFFFFu, 4);
    write_file(in_tmp("claims.idx"), idx, sizeof idx, 0);
    CHECK(mp_load_idx(in_tmp("claims.idx"), in_tmp("claims.idx"), &ds) == MP_ERR_FORMAT);
    CHECK(mp_get_memory_info().peak - before < (1u << 20));
    alarm(0);
    { /* untouched (0x5A...) on every error */
        unsigned char pattern[sizeof ds];
        memset(pattern, 0x5A, sizeof pattern);
        CHECK(memcmp(&ds, pattern, sizeof ds) == 0);
    }
    free(b);
    free(big);
    remove(in_tmp("long.ckpt")), remove(in_tmp("long.idx")), remove(in_tmp("claims.ckpt")), remove(in_tmp("claims.idx"));
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 6. Out-parameters on error: each filled with a pattern, which must stay */

#define UNTOUCHED(var, call)                                                            \
    do {                                                                                \
        unsigned char pat_[sizeof(var)];                                                \
        memset(&(var), 0xA5, sizeof(var));                                              \
        memset(pat_, 0xA5, sizeof pat_);                                                \
        if (!check_report((call) != MP_OK && memcmp(&(var), pat_, sizeof pat_) == 0,  \
                          __FILE__, __LINE__, #call ": fails and leaves " #var))        \
            fprintf(stderr, "    (the out-parameter was written, or the call succeeded)\n"); \
        outs++;                                                                         \
    } while (0)

static void test_out_params(void) {
    mp_model *m = make_layers(), *c = make_trained_f32();
    mp_dtype dt;
    mp_policy pol;
    mp_activation act;
    mp_layer_info info;
    mp_model_memory mem;
    mp_tensor t;
    mp_tensor_stats stats;
    mp_loss_scale_advice adv;
    mp_loss_scale ls;
    mp_logs logs;
    mp_dataset ds;
    mp_pool *pool;
    mp_model *none;
    float loss, w[4], big[200];
    size_t correct, len;
    int applied, issues, rank;
    uint32_t dims[3];
    const uint8_t *data;
    char buf[64];
    unsigned char idx[12] = {0, 0, 8, 4, 0, 0, 0, 4, 1, 2, 3, 4};
    mp_data d;
    mp_loss_scale_desc bad_ls;
    size_t outs = 0;
    memset(&d, 0, sizeof d);
    memset(&bad_ls, 0, sizeof bad_ls);
    bad_ls.growth_interval = -1;
    UNTOUCHED(dt, mp_dtype_from_name("float64", &dt));
    UNTOUCHED(pol, mp_policy_from_name("mixed_float64", &pol));
    UNTOUCHED(act, mp_activation_from_name("swish", &act));
    UNTOUCHED(info, mp_model_layer_info(m, 7, &info));
    UNTOUCHED(mem, mp_model_memory_info(NULL, &mem));
    UNTOUCHED(t, mp_output(m, &t));
    UNTOUCHED(t, mp_tensor_alloc(&t, MP_FLOAT32, 0, &rank));
    UNTOUCHED(stats, mp_tensor_stats_compute(w, (mp_dtype)9, 4, MP_FLOAT16, &stats));
    UNTOUCHED(stats, mp_model_numerics(m, 0, MP_NUMERICS_WEIGHTS, &stats));
    UNTOUCHED(adv, mp_model_recommend_loss_scale(m, &adv));
    UNTOUCHED(adv, mp_recommend_loss_scale(NULL, 1, &adv));
    UNTOUCHED(ls, mp_loss_scale_init(&ls, &bad_ls));
    UNTOUCHED(logs, mp_model_evaluate(m, &d, 4, &logs));
    UNTOUCHED(ds, mp_dataset_from_idx(idx, sizeof idx, idx, sizeof idx, &ds));
    UNTOUCHED(ds, mp_load_idx(in_tmp("none.idx"), in_tmp("none.idx"), &ds));
    UNTOUCHED(rank, mp_idx_parse(idx, sizeof idx, &rank, dims, &data));
    UNTOUCHED(dims, mp_idx_parse(idx, sizeof idx, &rank, dims, &data));
    UNTOUCHED(data, mp_idx_parse(idx, sizeof idx, &rank, dims, &data));
    UNTOUCHED(pool, mp_pool_create(&pool, -3));
    UNTOUCHED(loss, loss_rows(m, sl, NULL, NS, &loss, &correct));
    UNTOUCHED(correct, loss_rows(c, NULL, NULL, NS, &loss, &correct));
    UNTOUCHED(applied, mp_apply_gradients(c, &applied));
    UNTOUCHED(issues, mp_model_tensor_core_advice(c, -1, buf, sizeof buf, &issues));
    UNTOUCHED(issues, mp_model_tensor_core_advice(c, 8, NULL, sizeof buf, &issues));
    UNTOUCHED(buf, mp_model_amp_report(c, buf, sizeof buf));
    UNTOUCHED(buf, mp_model_amp_table(c, buf, sizeof buf));
    UNTOUCHED(w, mp_model_get_weights(c, w, 4));
    UNTOUCHED(w, mp_get_gradients(m, w, 4));
    UNTOUCHED(w, mp_get_optimizer_slots(c, w, 4));
    d = data_xy(sx, 4, NULL, 4);
    UNTOUCHED(big, mp_model_predict(c, &d, -1, big, 200));
    UNTOUCHED(len, mp_model_export_weights_to_memory(c, (mp_dtype)7, NULL, 0, &len));
    UNTOUCHED(buf, mp_model_save_to_memory(c, buf, sizeof buf, &len)); /* *len gets the size needed */
    none = (mp_model *)&d;
    {
        mp_model_desc md;
        memset(&md, 0, sizeof md);
        CHECK(mp_model_create(&none, &md) == MP_ERR_ARG && none == NULL); /* the one documented write: NULL */
    }
    mp_model_destroy(m);
    mp_model_destroy(c);
    printf("6. %zu out-parameters checked untouched on error\n", outs);
}

/* ======================================================================== */
/* 7. Concurrent saves, and fsync whatever the feature macros */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int temps_left(const char *name) {
    DIR *dir = opendir(tmp_dir);
    struct dirent *e;
    int n = 0;
    while (dir && (e = readdir(dir)) != NULL) n += strncmp(e->d_name, name, strlen(name)) == 0 && strstr(e->d_name, ".tmp.") != NULL;
    if (dir) closedir(dir);
    return n;
}

/* a writer: saves its model over path until the deadline; exits 0 when
   every save succeeded and it made at least one */
static void writer(mp_model *m, const char *path, double until) {
    int saves = 0, bad = 0;
    do bad += mp_model_save(m, path) != MP_OK, saves++;
    while (now_s() < until);
    _exit(bad || !saves ? 1 : 0);
}

static void test_concurrent_saves(void) {
    mp_model *a = make_trained_f32(), *b = make_trained_f32(), *r = make_trained_f32();
    const char *path = in_tmp("race.ckpt");
    size_t la, lb, reads = 0, torn = 0, loads = 0, bad_loads = 0;
    unsigned char *ba = ckpt_bytes(a, &la), *bb = ckpt_bytes(b, &lb), *got = (unsigned char *)zalloc(la + lb + 1);
    int files = t_fsync_files, dirs = t_fsync_dirs, status, ok_writers = 0, i;
    pid_t w[2];
    double until;
    mp_fit_desc fd = fit_of(4, 1);
    OK(mp_model_fit(b, &fd), b); /* b moves on: other bytes, the same model */
    free(bb);
    bb = ckpt_bytes(b, &lb);
    OK(mp_model_save(a, path), a);
    CHECK(t_fsync_files == files + 1 && t_fsync_dirs == dirs + 1); /* the file, then its directory */
    if (!CHECK(ba && bb)) return;
    fflush(stdout);
    until = now_s() + 1.5;
    w[0] = fork();
    if (w[0] == 0) writer(a, path, until);
    w[1] = fork();
    if (w[1] == 0) writer(b, path, until);
    while (now_s() < until + 0.2 || reads < 50) { /* the reader */
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(got, 1, la + lb + 1, f) : 0;
        if (f) fclose(f);
        reads++;
        torn += !((n == la && memcmp(got, ba, la) == 0) || (n == lb && memcmp(got, bb, lb) == 0));
        if (reads % 4 == 0) {
            loads++;
            bad_loads += mp_model_load(r, path) != MP_OK;
        }
    }
    for (i = 0; i < 2; i++)
        if (w[i] > 0 && waitpid(w[i], &status, 0) == w[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0) ok_writers++;
    CHECK(ok_writers == 2);
    if (!CHECK(torn == 0 && bad_loads == 0))
        fprintf(stderr, "    %zu of %zu reads were not a whole file; %zu of %zu loads failed\n", torn, reads, bad_loads, loads);
    CHECK(temps_left("race.ckpt") == 0);
    printf("7. two writers and a reader for 1.5 s: %zu reads (%zu not a whole file), %zu loads (%zu failed)\n", reads, torn, loads,
           bad_loads);
    remove(path);
    free(ba);
    free(bb);
    free(got);
    mp_model_destroy(a);
    mp_model_destroy(b);
    mp_model_destroy(r);
}

int main(int argc, char **argv) {
    int i;
    check_args(argc, argv);
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/mp_reliability_%ld", (long)getpid());
    if (mkdir(tmp_dir, 0700) != 0) return fprintf(stderr, "cannot make %s\n", tmp_dir), 2;
    for (i = 0; i < NS * 4; i++) sx[i] = (float)((i * 13) % 17) / 16.0f - 0.4f;
    for (i = 0; i < NS; i++) sl[i] = (i * 5) % 3;
    RUN(test_transactional());
    RUN(test_refusals());
    RUN(test_split_counts());
    RUN(test_split_near_2_24());
    RUN(test_windows_and_counts());
    RUN(test_constructor_leaks());
    RUN(test_nonfinite_targets());
    RUN(test_nonfinite_wide_x());
    RUN(test_settings());
    RUN(test_impossible_slots());
    RUN(test_bounded_reads());
    RUN(test_out_params());
    RUN(test_concurrent_saves());
    remove(in_tmp("later.ckpt")), remove(in_tmp("later.f16"));
    rmdir(tmp_dir);
    CHECK(t_live_blocks == 0 && mp_get_memory_info().current == 0);
    return check_done("test_reliability");
}
