/* test_checkpoint.c - checkpoints and inference-weight exports: a round
   trip restores every piece of state; resuming fit (initial_epoch) or a
   custom loop from a checkpoint reproduces the uninterrupted run bit for bit
   under mixed_float16 with dynamic loss scaling that skips steps, Adam or
   RMSprop, and Dropout; every truncation and every single-byte corruption of
   a checkpoint is refused with MP_ERR_FORMAT and leaves the model bit for bit
   as it was; foreign files, other versions and other models give clear
   errors; float16/bfloat16 exports are half the size and round-trip to
   mp_convert's rounding; files are replaced by temp + rename, so a failed
   save (no directory, no memory, a path that cannot be replaced) keeps the
   old file and leaves no temporary, and another file's stale temporary is
   not touched. The bytes are the same on every host: the checksums of a fixed
   model's files are constants here, checked on x86 and on s390x. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, rmdir, opendir */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* malloc that fails at its t_fail_at-th call from when it is set (0: never) */
static size_t t_fail_at;
static void *t_malloc(size_t n) {
    if (t_fail_at && --t_fail_at == 0) return NULL;
    return malloc(n);
}
#define MIXPREC_MALLOC(sz) t_malloc(sz)
#define MIXPREC_FREE(p) free(p)
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"
#include "forge.h"
#include "../examples/gpt_model.h"

/* ======================================================================== */
/* Helpers */


/* a status and an mp_model_error() that mentions word */
static void status_report(mp_status got, mp_status want, const mp_model *m, const char *word, const char *file,
                          int line, const char *what) {
    const char *err = mp_model_error(m);
    if (!check_report(got == want && strstr(err, word) != NULL, file, line, what))
        fprintf(stderr, "    got %s, want %s mentioning \"%s\": %s\n", mp_status_name(got), mp_status_name(want), word, err);
}
#define CHECK_ERR(call, want, m, word) status_report((call), (want), (m), (word), __FILE__, __LINE__, #call)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "test_checkpoint: out of memory\n"); exit(2); }
    return p;
}


#define NS 64 /* samples: NF features, 3 classes */
#define NF 6
static float xs[NS * NF];
static int32_t ys[NS];

static void init_data(void) {
    int i, j;
    for (i = 0; i < NS; i++) {
        ys[i] = i % 3;
        for (j = 0; j < NF; j++) xs[i * NF + j] = (float)((i * 7 + j * 13) % 10) / 10.0f + (j == ys[i] ? 1.0f : 0.0f);
    }
}

/* A model: NF -> Dense(units, relu) -> Dropout(0.25) -> Dense(3) ->
   softmax in float32, under policy, compiled with opt and a loss scale that
   starts at 2^20 and doubles every 3 good steps, so that steps keep
   skipping under mixed_float16. */
typedef struct spec {
    const char *policy;
    int units, inputs, compiled, dropout;
    mp_optimizer_kind opt;
    float momentum;
    int nesterov;
    mp_loss_scale_mode loss_scale;
    mp_lr_schedule schedule;
    mp_optimizer_desc options; /* the rest of the optimizer's description: weight decay, clipping, accumulation */
} spec;

static spec base(void) {
    spec s;
    memset(&s, 0, sizeof s);
    s.policy = "mixed_float16";
    s.units = 8;
    s.inputs = NF;
    s.compiled = 1;
    s.dropout = 1;
    s.opt = MP_ADAM;
    s.loss_scale = MP_LOSS_SCALE_ON;
    return s;
}

static mp_model *make(spec s) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc out = mp_activation_layer(MP_SOFTMAX);
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    md.input_shape[0] = s.inputs;
    md.seed = 42;
    md.threads = 1;
    out.dtype = "float32";
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.optimizer = s.options;
    cd.optimizer.kind = s.opt;
    cd.optimizer.momentum = s.momentum;
    cd.optimizer.nesterov = s.nesterov;
    cd.optimizer.schedule = s.schedule;
    cd.loss_scale = s.loss_scale;
    cd.loss_scale_config.initial_scale = 1048576.0f;
    cd.loss_scale_config.growth_interval = 3;
    if (mp_set_global_policy_name(s.policy) != MP_OK || mp_model_create(&m, &md) != MP_OK ||
        mp_model_add(m, mp_dense(s.units, MP_RELU)) != MP_OK ||
        (s.dropout && mp_model_add(m, mp_dropout(0.25f)) != MP_OK) || mp_model_add(m, mp_dense(3, MP_LINEAR)) != MP_OK ||
        mp_model_add(m, out) != MP_OK || (s.compiled ? mp_model_compile(m, &cd) : mp_model_build(m)) != MP_OK) {
        fprintf(stderr, "test_checkpoint: cannot make the model: %s\n", mp_model_error(m));
        exit(2);
    }
    mp_set_global_policy_name("float32");
    return m;
}

static mp_fit_desc fit_desc(int epochs, int initial_epoch, mp_logs *history) {
    mp_fit_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(xs, NF, ys, NS);
    fd.batch_size = 8;
    fd.epochs = epochs;
    fd.initial_epoch = initial_epoch;
    fd.verbose = MP_VERBOSE_SILENT;
    fd.history = history;
    return fd;
}

/* The checkpoint's bytes (malloc'd, for the test to free); a failure
   counts (success does not: the callers check what the bytes say). */
static unsigned char *save(mp_model *m, size_t *len) {
    unsigned char *b = NULL;
    mp_status st = mp_model_save_to_memory(m, NULL, 0, len);
    if (st == MP_OK) st = mp_model_save_to_memory(m, b = (unsigned char *)xmalloc(*len), *len, len);
    if (st == MP_OK) return b;
    ok_report(st, m, __FILE__, __LINE__, "mp_model_save_to_memory");
    free(b);
    return NULL;
}

/* Everything a checkpoint holds (its bytes), and the predictions, which
   also see the compute-dtype copies of the weights. */
typedef struct snap {
    unsigned char *bytes;
    size_t len;
    float pred[4 * 3];
} snap;

static snap take(mp_model *m) {
    snap s;
    mp_data d = data_xy(xs, NF, NULL, 4);
    s.bytes = save(m, &s.len);
    if (mp_model_predict(m, &d, 4, s.pred, sizeof s.pred / sizeof s.pred[0]) != MP_OK) memset(s.pred, 0xFF, sizeof s.pred);
    return s;
}
static int same(mp_model *m, const snap *s) {
    snap now = take(m);
    int ok = now.bytes && s->bytes && now.len == s->len && memcmp(now.bytes, s->bytes, s->len) == 0 &&
             memcmp(now.pred, s->pred, sizeof s->pred) == 0;
    free(now.bytes);
    return ok;
}

/* ======================================================================== */
/* 1. Round trip and the layout */

static void test_round_trip(void) {
    mp_model *a = make(base()), *b = make(base());
    mp_fit_desc fd = fit_desc(2, 0, NULL);
    const mp_loss_scale *la, *lb;
    unsigned char small[16];
    size_t len = 0, n = mp_model_param_count(a), ns = mp_optimizer_slot_count(a), i;
    snap sa;
    float *wa = (float *)xmalloc(n * 4), *wb = (float *)xmalloc(n * 4), *sla = (float *)xmalloc(ns * 4),
          *slb = (float *)xmalloc(ns * 4);
    OK(mp_model_fit(a, &fd), a);
    sa = take(a);
    /* the layout: magic, kind, version 1 and length little-endian, the CRC last */
    CHECK(sa.bytes && memcmp(sa.bytes, "MIXPRECC", 8) == 0);
    CHECK(sa.bytes && get_le(sa.bytes + 8, 4) == 2 && sa.bytes[8] == 2);
    CHECK(sa.bytes && get_le(sa.bytes + 12, 8) == sa.len);
    CHECK(sa.bytes && get_le(sa.bytes + sa.len - 4, 4) == crc32_of(sa.bytes, sa.len - 4));
    /* a buffer too small: MP_ERR_SIZE, nothing written, the size reported */
    memset(small, 0xAB, sizeof small);
    CHECK_ERR(mp_model_save_to_memory(a, small, sizeof small, &len), MP_ERR_SIZE, a, "bytes");
    CHECK(len == sa.len && small[0] == 0xAB && small[15] == 0xAB);
    CHECK(mp_model_save_to_memory(a, NULL, 0, NULL) == MP_ERR_NULL);
    CHECK(mp_model_save_to_memory(NULL, NULL, 0, &len) == MP_ERR_NULL);
    CHECK(mp_model_load_from_memory(a, NULL, 10) == MP_ERR_NULL);

    OK(mp_model_load_from_memory(b, sa.bytes, sa.len), b);
    CHECK(same(b, &sa));
    OK(mp_model_get_weights(a, wa, n), a);
    OK(mp_model_get_weights(b, wb, n), b);
    CHECK(memcmp(wa, wb, n * 4) == 0);
    OK(mp_get_optimizer_slots(a, sla, ns), a);
    OK(mp_get_optimizer_slots(b, slb, ns), b);
    CHECK(memcmp(sla, slb, ns * 4) == 0);
    for (i = 0; i < ns && sla[i] == 0.0f; i++) {}
    CHECK(i < ns); /* the slots hold something */
    la = mp_model_loss_scale(a);
    lb = mp_model_loss_scale(b);
    CHECK(la && lb && la->scale == lb->scale && la->good_steps == lb->good_steps &&
          la->skipped_steps == lb->skipped_steps && la->steps == lb->steps && la->overflows_left == lb->overflows_left &&
          la->config.initial_scale == lb->config.initial_scale && la->config.growth_interval == 3 &&
          lb->config.growth_interval == 3);
    CHECK(la && la->skipped_steps > 0 && la->skipped_steps < 8 && la->steps == 16);
    free(sa.bytes);
    free(wa); free(wb); free(sla); free(slb);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* ======================================================================== */
/* 2. Resuming reproduces the uninterrupted run bit for bit */

static const char *tmp_dir;
static char *path_in(const char *name) {
    char *p = (char *)xmalloc(strlen(tmp_dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", tmp_dir, name);
    return p;
}

static void test_resume_fit(mp_optimizer_kind opt) {
    spec s = base();
    mp_model *a, *b, *c, *d;
    mp_logs ha[4], hc[2];
    mp_fit_desc fd;
    char *path = path_in("resume.ckpt");
    snap sa, sb;
    int e;
    s.opt = opt;
    a = make(s); b = make(s); c = make(s); d = make(s);
    fd = fit_desc(4, 0, ha);
    OK(mp_model_fit(a, &fd), a);
    fd = fit_desc(2, 0, NULL);
    OK(mp_model_fit(b, &fd), b);
    OK(mp_model_save(b, path), b);
    OK(mp_model_load(c, path), c);
    fd = fit_desc(4, 2, hc);
    OK(mp_model_fit(c, &fd), c);
    sa = take(a);
    sb = take(b);
    CHECK(same(c, &sa));
    CHECK(!same(b, &sa)); /* the second half did train */
    for (e = 0; e < 2; e++)
        CHECK(memcmp(&ha[2 + e].loss, &hc[e].loss, 4) == 0 && memcmp(&ha[2 + e].accuracy, &hc[e].accuracy, 4) == 0 &&
              ha[2 + e].loss_scale == hc[e].loss_scale && ha[2 + e].skipped_steps == hc[e].skipped_steps);
    CHECK(ha[3].skipped_steps > ha[1].skipped_steps); /* the loss scale kept skipping after the save */
    /* without the replayed shuffles the order, and so the run, differs */
    OK(mp_model_load(d, path), d);
    fd = fit_desc(2, 0, NULL);
    OK(mp_model_fit(d, &fd), d);
    CHECK(!same(d, &sa));
    free(sa.bytes); free(sb.bytes);
    remove(path);
    free(path);
    mp_model_destroy(a); mp_model_destroy(b); mp_model_destroy(c); mp_model_destroy(d);
}

static void custom_steps(mp_model *m, int first, int count) {
    int i;
    for (i = first; i < first + count; i++) {
        int k = i % (NS / 8), applied;
        float loss;
        if (forward_rows(m, xs + k * 8 * NF, 8, 1) || loss_rows(m, ys + k * 8, NULL, 8, &loss, NULL) ||
            mp_compute_scaled_gradients(m) || mp_get_unscaled_gradients(m) || mp_apply_gradients(m, &applied)) {
            CHECK(!"a custom-loop step failed");
            return;
        }
    }
}

/* Three models of spec s: a takes 13 custom-loop steps; b 6, saved; c
   loads b's file and takes the 7 after: c must end as a, to the byte.
   version: the file's format version the save must write (0: any). */
static void resume_custom_loop(spec s, uint32_t version) {
    mp_model *a = make(s), *b = make(s), *c = make(s);
    unsigned char *bytes;
    size_t len;
    snap sa;
    custom_steps(a, 0, 13);
    custom_steps(b, 0, 6);
    bytes = save(b, &len);
    if (bytes && CHECK(len > 12 && (!version || bytes[8] == version)) && OK(mp_model_load_from_memory(c, bytes, len), c)) {
        custom_steps(c, 6, 7);
        sa = take(a);
        CHECK(same(c, &sa));
        free(sa.bytes);
    }
    CHECK(mp_model_loss_scale(a) && mp_model_loss_scale(a)->skipped_steps > 0);
    free(bytes);
    mp_model_destroy(a); mp_model_destroy(b); mp_model_destroy(c);
}

static void test_resume_custom_loop(void) {
    spec s = base();
    s.opt = MP_RMSPROP;
    resume_custom_loop(s, 0);
}

/* The optimizer's options resume as they were: AdamW with the biases
   excluded from its decay, clipping by the global norm, a warmup then
   cosine decay, and accumulation over 4 steps saved mid-window (6 steps:
   the accumulators and the window's count in the file, version 4), under
   a loss scale that skips steps. */
static spec options_spec(void) {
    static const char *const biases[] = {"bias", NULL};
    spec s = base();
    s.opt = MP_ADAMW;
    s.options.exclude_from_weight_decay = biases;
    s.options.weight_decay = 0.1f;
    s.options.global_clipnorm = 0.5f;
    s.options.gradient_accumulation_steps = 4;
    s.schedule.kind = MP_COSINE_DECAY;
    s.schedule.warmup_target = 0.01f;
    s.schedule.warmup_steps = 5;
    s.schedule.decay_steps = 20;
    return s;
}

static void test_resume_options(void) { resume_custom_loop(options_spec(), 4); }

/* The tiny GPT (examples/gpt_model.h) resumes mid-run bit for bit, as
   llm.c's CUDA test checks: mixed_float16 from a loss scale of 2^19 (its
   first steps overflow and skip), gpt_model.h's recipe (AdamW with the
   matrices alone decayed, global_clipnorm 1), warmup then cosine decay,
   and accumulation over 2 batches saved mid-window (5 of 12 batches).
   The checkpoint's bytes hold the weights, slots, accumulators, schedule
   and loss scale; the predictions also see the float16 copies of the
   weights. */
enum { RG_V = 11, RG_T = 6, RG_B = 4 };
static mp_model *resume_gpt(void) {
    mp_model_desc md;
    mp_compile_desc cd = gpt_recipe();
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = RG_T;
    md.seed = 5;
    cd.optimizer.gradient_accumulation_steps = 2;
    cd.optimizer.schedule.kind = MP_COSINE_DECAY;
    cd.optimizer.schedule.warmup_target = 0.01f;
    cd.optimizer.schedule.warmup_steps = 3;
    cd.optimizer.schedule.decay_steps = 20;
    cd.loss_scale_config.initial_scale = 524288.0f; /* 2^19 */
    if (!OK(mp_set_global_policy_name("mixed_float16"), NULL) || !OK(mp_model_create(&m, &md), m) ||
        !OK(gpt_layers(m, RG_V, RG_T, 1, 2, 8), m) || !OK(mp_model_compile(m, &cd), m)) {
        mp_set_global_policy_name("float32");
        mp_model_destroy(m);
        return NULL;
    }
    mp_set_global_policy_name("float32");
    return m;
}

/* Batches [first, first + count) of a fixed token stream, custom-loop steps. */
static void gpt_steps(mp_model *m, int first, int count) {
    int32_t x[RG_B * RG_T], y[RG_B * RG_T];
    int i, j, shape = RG_T, applied;
    float loss;
    for (i = first; i < first + count; i++) {
        mp_data d;
        mp_array labels = mp_array_i32(y, RG_B, 1, &shape);
        memset(&d, 0, sizeof d);
        for (j = 0; j < RG_B * RG_T; j++) {
            x[j] = (int32_t)((i * 7 + j * 3 + j / RG_T) % RG_V);
            y[j] = (x[j] * 2 + 1) % RG_V;
        }
        d.x[0] = mp_array_i32(x, RG_B, 1, &shape);
        if (!OK(mp_forward(m, &d, 1), m) || !OK(mp_compute_loss(m, &labels, &loss, NULL), m) ||
            !OK(mp_compute_scaled_gradients(m), m) || !OK(mp_get_unscaled_gradients(m), m) ||
            !OK(mp_apply_gradients(m, &applied), m))
            return;
    }
}

static void gpt_predictions(mp_model *m, float *pred, size_t n) {
    int32_t x[RG_T];
    int j, shape = RG_T;
    mp_data d;
    memset(&d, 0, sizeof d);
    for (j = 0; j < RG_T; j++) x[j] = (int32_t)(j * 5 % RG_V);
    d.x[0] = mp_array_i32(x, 1, 1, &shape);
    if (!OK(mp_model_predict(m, &d, 1, pred, n), m)) memset(pred, 0xFF, n * sizeof(float));
}

static void test_resume_gpt(void) {
    mp_model *a = resume_gpt(), *b = resume_gpt(), *c = resume_gpt();
    unsigned char *ba = NULL, *bb = NULL, *bc = NULL;
    size_t la = 0, lb = 0, lc = 0;
    static float pa[RG_T * RG_V], pc[RG_T * RG_V];
    if (!a || !b || !c) goto done;
    gpt_steps(a, 0, 12);
    gpt_steps(b, 0, 5);
    if (!(bb = save(b, &lb)) || !OK(mp_model_load_from_memory(c, bb, lb), c)) goto done;
    gpt_steps(c, 5, 7);
    ba = save(a, &la);
    bc = save(c, &lc);
    gpt_predictions(a, pa, RG_T * RG_V);
    gpt_predictions(c, pc, RG_T * RG_V);
    CHECK(ba && bc && la == lc && memcmp(ba, bc, la) == 0);
    CHECK(memcmp(pa, pc, sizeof pa) == 0);
    CHECK(!(la == lb && memcmp(ba, bb, la) == 0)); /* the second half did train */
    CHECK(mp_model_loss_scale(a) && mp_model_loss_scale(a)->skipped_steps > 0 &&
          mp_model_loss_scale(a)->skipped_steps < 4); /* a few skipped, the rest trained */
done:
    free(ba); free(bb); free(bc);
    mp_model_destroy(a); mp_model_destroy(b); mp_model_destroy(c);
}

/* A version-4 file whose weight-decay exclusions name a variable a layer
   does not have (bit 2) is corrupt. The exclusion bytes, one a layer,
   come before the slots and the loss-scale state (56 bytes). */
static void test_corrupt_exclusions(void) {
    mp_model *a = make(options_spec()), *b = make(options_spec());
    size_t len, at;
    unsigned char *bytes;
    snap before = take(b);
    custom_steps(a, 0, 2);
    if ((bytes = save(a, &len)) != NULL) {
        at = len - 4 - 56 - mp_optimizer_slot_count(a) * 4 - (size_t)mp_model_layer_count(a);
        CHECK(bytes[at] == 2 && bytes[at + 1] == 0 && bytes[at + 2] == 2); /* the Dense layers' biases; dropout none */
        bytes[at] = 4;
        fix_crc(bytes, len);
        CHECK_ERR(mp_model_load_from_memory(b, bytes, len), MP_ERR_FORMAT, b, "weight-decay exclusions");
        CHECK(same(b, &before));
    }
    free(bytes);
    free(before.bytes);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

static void test_initial_epoch_args(void) {
    mp_model *m = make(base());
    mp_fit_desc fd = fit_desc(2, -1, NULL);
    snap s = take(m);
    CHECK_ERR(mp_model_fit(m, &fd), MP_ERR_ARG, m, "initial_epoch");
    fd = fit_desc(2, 3, NULL);
    CHECK_ERR(mp_model_fit(m, &fd), MP_ERR_ARG, m, "initial_epoch");
    fd = fit_desc(2, 2, NULL); /* Keras: nothing left to train */
    OK(mp_model_fit(m, &fd), m);
    CHECK(same(m, &s));
    free(s.bytes);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 3. Bad files are refused and change nothing */

static void test_truncations(void) {
    mp_model *src = make(base()), *m = make(base());
    mp_fit_desc fd = fit_desc(1, 0, NULL);
    size_t len, cut, bad = 0;
    unsigned char *b;
    snap before;
    OK(mp_model_fit(src, &fd), src);
    OK(mp_model_fit(m, &fd), m); /* different state: a load would show */
    custom_steps(m, 0, 3);
    b = save(src, &len);
    before = take(m);
    for (cut = 0; b && cut < len; cut++) {
        unsigned char *copy = (unsigned char *)xmalloc(cut); /* exactly cut bytes: ASan sees any over-read */
        mp_status st;
        memcpy(copy, b, cut);
        st = mp_model_load_from_memory(m, copy, cut);
        if (st != MP_ERR_FORMAT || !strstr(mp_model_error(m), cut ? "truncated" : "empty") || !same(m, &before)) {
            if (!bad) fprintf(stderr, "    cut at %zu: %s: %s\n", cut, mp_status_name(st), mp_model_error(m));
            bad++;
        }
        free(copy);
    }
    CHECK(bad == 0);
    CHECK(len > 1000); /* every length of a real checkpoint was tried */
    free(b); free(before.bytes);
    mp_model_destroy(src); mp_model_destroy(m);
}

static void test_corruptions(void) {
    static const unsigned char masks[] = {0x01, 0x80, 0xFF};
    mp_model *src = make(base()), *m = make(base());
    size_t len, i, bad = 0, crc_msgs = 0;
    unsigned char *b;
    snap before;
    unsigned k;
    custom_steps(src, 0, 5);
    b = save(src, &len);
    before = take(m);
    for (i = 0; b && i < len; i++)
        for (k = 0; k < sizeof masks; k++) {
            mp_status st;
            b[i] ^= masks[k];
            st = mp_model_load_from_memory(m, b, len);
            crc_msgs += strstr(mp_model_error(m), "checksum mismatch") != NULL;
            if (st != MP_ERR_FORMAT || !same(m, &before)) {
                if (!bad) fprintf(stderr, "    byte %zu ^ 0x%02x: %s: %s\n", i, masks[k], mp_status_name(st), mp_model_error(m));
                bad++;
            }
            b[i] ^= masks[k];
        }
    CHECK(bad == 0);
    CHECK(crc_msgs == 3 * (len - 15)); /* all but the magic (7) and length (8) bytes: the checksum sees them */
    OK(mp_model_load_from_memory(m, b, len), m); /* and the restored bytes load */
    free(b); free(before.bytes);
    mp_model_destroy(src); mp_model_destroy(m);
}

/* Files that pass the checksum but whose contents are wrong (forged with the
   test's own CRC): the checks behind the checksum. */
static void test_forged(void) {
    mp_model *src = make(base()), *m = make(base());
    size_t len;
    unsigned char *b, *c;
    snap before;
    custom_steps(src, 0, 4);
    b = save(src, &len);
    c = (unsigned char *)xmalloc(len + 1);
    before = take(m);
    if (!b) return;
    /* another version, and a version field corrupted (the CRC says which) */
    memcpy(c, b, len);
    put_le(c + 8, 5, 4);
    CHECK_ERR(mp_model_load_from_memory(m, c, len), MP_ERR_FORMAT, m, "checksum mismatch");
    fix_crc(c, len);
    CHECK_ERR(mp_model_load_from_memory(m, c, len), MP_ERR_FORMAT, m, "version 5 not supported");
    put_le(c + 8, 0, 4);
    fix_crc(c, len);
    CHECK_ERR(mp_model_load_from_memory(m, c, len), MP_ERR_FORMAT, m, "version 0 not supported");
    /* an unknown kind */
    memcpy(c, b, len);
    c[7] = 'Z';
    fix_crc(c, len);
    CHECK_ERR(mp_model_load_from_memory(m, c, len), MP_ERR_FORMAT, m, "unknown kind");
    /* the loss scale (the last 56 bytes before the CRC; scale at 24): NaN, 0 */
    memcpy(c, b, len);
    put_le(c + len - 4 - 56 + 24, 0x7FC00000u, 4);
    fix_crc(c, len);
    CHECK_ERR(mp_model_load_from_memory(m, c, len), MP_ERR_FORMAT, m, "loss-scale state");
    memcpy(c, b, len);
    put_le(c + len - 4 - 56 + 24, 0, 4);
    fix_crc(c, len);
    CHECK_ERR(mp_model_load_from_memory(m, c, len), MP_ERR_FORMAT, m, "loss-scale state");
    /* skipped steps above all steps */
    memcpy(c, b, len);
    put_le(c + len - 4 - 56 + 36, 1000000, 8);
    fix_crc(c, len);
    CHECK_ERR(mp_model_load_from_memory(m, c, len), MP_ERR_FORMAT, m, "loss-scale state");
    {   /* every other field out of its range (mp__io_loss_scale's layout: max_scale at 16, scale at 24,
           good_steps at 28, overflows_left at 52): a scale of Inf, max_scale below min_scale, as many
           good steps as the growth interval (the scale would have grown), no overflows left, and more
           than the hysteresis (1) allows */
        static const struct { size_t at, bytes; uint64_t value; } bad[] = {
            {24, 4, 0x7F800000u}, {16, 4, 0x3F000000u}, {28, 8, 2000}, {52, 4, 0}, {52, 4, 2}};
        size_t k;
        for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            memcpy(c, b, len);
            put_le(c + len - 4 - 56 + bad[k].at, bad[k].value, bad[k].bytes);
            fix_crc(c, len);
            CHECK_ERR(mp_model_load_from_memory(m, c, len), MP_ERR_FORMAT, m, "loss-scale state");
        }
    }
    /* one byte more (the length field is for one less) */
    memcpy(c, b, len);
    c[len] = 0;
    CHECK_ERR(mp_model_load_from_memory(m, c, len + 1), MP_ERR_FORMAT, m, "the header says");
    /* one byte more, length and CRC agreeing */
    memcpy(c, b, len - 4);
    c[len - 4] = 0;
    put_le(c + 12, len + 1, 8);
    fix_crc(c, len + 1);
    CHECK_ERR(mp_model_load_from_memory(m, c, len + 1), MP_ERR_FORMAT, m, "do not fill");
    /* the last 4 body bytes gone, length and CRC agreeing */
    memcpy(c, b, len - 8);
    put_le(c + 12, len - 4, 8);
    fix_crc(c, len - 4);
    CHECK_ERR(mp_model_load_from_memory(m, c, len - 4), MP_ERR_FORMAT, m, "do not fill");
    /* a header too short for its fields (the length says 8) */
    memcpy(c, b, len);
    put_le(c + 12, 24, 8);
    fix_crc(c, 24);
    CHECK_ERR(mp_model_load_from_memory(m, c, 24), MP_ERR_FORMAT, m, "do not fill");
    CHECK(same(m, &before));
    free(b); free(c); free(before.bytes);
    mp_model_destroy(src); mp_model_destroy(m);
}

static void test_foreign(void) {
    static const unsigned char idx[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 0}; /* IDX labels: 1, 2, 0 */
    unsigned char noise[256], *w = NULL;
    mp_model *m = make(base());
    snap before = take(m);
    size_t wlen = 0, i;
    uint32_t r = 12345;
    for (i = 0; i < sizeof noise; i++) noise[i] = (unsigned char)((r = r * 1103515245u + 12345u) >> 24);
    CHECK_ERR(mp_model_load_from_memory(m, idx, sizeof idx), MP_ERR_FORMAT, m, "not a mixprec checkpoint");
    CHECK_ERR(mp_model_load_from_memory(m, noise, sizeof noise), MP_ERR_FORMAT, m, "not a mixprec checkpoint");
    CHECK_ERR(mp_model_load_from_memory(m, noise, 0), MP_ERR_FORMAT, m, "empty");
    CHECK_ERR(mp_model_load_from_memory(m, "MIXPREC", 7), MP_ERR_FORMAT, m, "truncated");
    memcpy(noise, "MIXPRECC", 8);
    CHECK_ERR(mp_model_load_from_memory(m, noise, sizeof noise), MP_ERR_FORMAT, m, "truncated"); /* its length field */
    /* an inference-weights file is not a checkpoint, and the reverse */
    OK(mp_model_export_weights_to_memory(m, MP_FLOAT16, NULL, 0, &wlen), m);
    w = (unsigned char *)xmalloc(wlen);
    OK(mp_model_export_weights_to_memory(m, MP_FLOAT16, w, wlen, &wlen), m);
    CHECK_ERR(mp_model_load_from_memory(m, w, wlen), MP_ERR_FORMAT, m, "mp_model_import_weights");
    CHECK_ERR(mp_model_import_weights_from_memory(m, before.bytes, before.len), MP_ERR_FORMAT, m, "mp_model_load");
    CHECK_ERR(mp_model_import_weights_from_memory(m, idx, sizeof idx), MP_ERR_FORMAT, m, "not a mixprec weights file");
    CHECK(same(m, &before));
    free(w); free(before.bytes);
    mp_model_destroy(m);
}

/* A checkpoint of one model into another: which difference is named. */
static void check_mismatch(const unsigned char *b, size_t len, spec s, mp_status want, const char *word, int line) {
    mp_model *m = make(s);
    snap before = take(m);
    char what[64];
    sprintf(what, "mismatch (line %d)", line);
    status_report(mp_model_load_from_memory(m, b, len), want, m, word, __FILE__, line, what);
    check_report(same(m, &before), __FILE__, line, "the model is untouched");
    free(before.bytes);
    mp_model_destroy(m);
}

static void test_wrong_model(void) {
    mp_model *src = make(base()), *plain;
    spec s;
    size_t len, plen;
    unsigned char *b, *pb;
    custom_steps(src, 0, 2);
    b = save(src, &len);
    s = base(); s.units = 10;
    check_mismatch(b, len, s, MP_ERR_SHAPE, "layer 0 (dense): 48 kernel weights in the file, 60 in the model", __LINE__);
    s = base(); s.inputs = 5;
    check_mismatch(b, len, s, MP_ERR_SHAPE, "input dimension 0 is 6 in the file, 5 in the model", __LINE__);
    s = base(); s.dropout = 0;
    check_mismatch(b, len, s, MP_ERR_SHAPE, "4 layers in the file, 3 in the model", __LINE__);
    s = base(); s.policy = "float32";
    check_mismatch(b, len, s, MP_ERR_SHAPE, "policy mixed_float16 in the file, float32 in the model", __LINE__);
    s = base(); s.opt = MP_RMSPROP;
    check_mismatch(b, len, s, MP_ERR_SHAPE, "optimizer Adam in the file, RMSprop in the model", __LINE__);
    s = base(); s.loss_scale = MP_LOSS_SCALE_NONE;
    check_mismatch(b, len, s, MP_ERR_SHAPE, "scaled the loss", __LINE__);
    s = base(); s.compiled = 0;
    check_mismatch(b, len, s, MP_ERR_STATE, "compile() the model first", __LINE__);
    /* an uncompiled checkpoint: into a compiled model no, into a built one yes */
    s = base(); s.compiled = 0;
    plain = make(s);
    pb = save(plain, &plen);
    check_mismatch(pb, plen, base(), MP_ERR_STATE, "load it before compiling", __LINE__);
    s = base(); s.opt = MP_SGD; s.momentum = 0.9f;
    {
        mp_model *sgd = make(s);
        size_t slen;
        unsigned char *sb = save(sgd, &slen);
        s.momentum = 0.0f;
        check_mismatch(sb, slen, s, MP_ERR_SHAPE, "optimizer slot values", __LINE__);
        free(sb);
        mp_model_destroy(sgd);
    }
    {
        mp_model *m;
        snap sp = take(plain);
        s = base(); s.compiled = 0;
        m = make(s);
        OK(mp_model_load_from_memory(m, pb, plen), m);
        CHECK(same(m, &sp));
        free(sp.bytes);
        mp_model_destroy(m);
    }
    free(b); free(pb);
    mp_model_destroy(src); mp_model_destroy(plain);
}

/* ======================================================================== */
/* 4. Inference weights in float16 and bfloat16 */

static void test_export(void) {
    static const mp_dtype dts[] = {MP_FLOAT16, MP_BFLOAT16};
    spec s = base();
    mp_model *src, *m;
    size_t n, ns, len32 = 0, len, i;
    float *w, *back, *want, *slots0, *slots1;
    unsigned char *b;
    mp_loss_scale ls0;
    int k;
    s.units = 64;
    src = make(s);
    n = mp_model_param_count(src);
    w = (float *)xmalloc(n * 4); back = (float *)xmalloc(n * 4); want = (float *)xmalloc(n * 4);
    /* values where the rounding shows: a tie, subnormals, overflow, NaN, -0 */
    OK(mp_model_get_weights(src, w, n), src);
    w[0] = 1.0f + 1.0f / 2048.0f; w[1] = 1e-7f; w[2] = 70000.0f; w[3] = -0.0f; w[4] = 1e-40f; w[5] = 3.0e38f;
    {
        uint32_t nan = 0x7FC00001u; /* a NaN with a payload bit */
        memcpy(&w[6], &nan, 4);
    }
    OK(mp_model_set_weights(src, w, n), src);
    OK(mp_model_export_weights_to_memory(src, MP_FLOAT32, NULL, 0, &len32), src);
    CHECK(mp_model_export_weights_to_memory(src, (mp_dtype)7, NULL, 0, &len) == MP_ERR_DTYPE);
    for (k = 0; k < 2; k++) {
        mp_dtype dt = dts[k];
        OK(mp_model_export_weights_to_memory(src, dt, NULL, 0, &len), src);
        CHECK(len32 - len == 2 * n); /* 2 bytes a weight instead of 4 */
        CHECK(len * 100 < len32 * 55); /* about half, with the header and fingerprint */
        b = (unsigned char *)xmalloc(len);
        OK(mp_model_export_weights_to_memory(src, dt, b, len, &len), src);
        CHECK(memcmp(b, "MIXPRECW", 8) == 0);
        /* into a float32 model that is not compiled: the policy may differ */
        s.policy = "float32"; s.compiled = 0;
        m = make(s);
        OK(mp_model_import_weights_from_memory(m, b, len), m);
        OK(mp_model_get_weights(m, back, n), m);
        {   /* mp_convert's rounding, widened back exactly */
            mp_f16 *h = (mp_f16 *)xmalloc(n * 2);
            mp_convert(h, dt, w, MP_FLOAT32, n, NULL);
            mp_convert(want, MP_FLOAT32, h, dt, n, NULL);
            free(h);
        }
        CHECK(memcmp(back, want, n * 4) == 0);
        CHECK(memcmp(back, w, n * 4) != 0); /* the rounding was real */
        CHECK(dt != MP_FLOAT16 || back[2] > 1e38f); /* 70000 overflows float16 */
        CHECK(back[6] != back[6]);
        mp_model_destroy(m);
        free(b);
    }
    /* importing touches the weights only, not the optimizer or the loss scale */
    s = base(); s.units = 64;
    m = make(s);
    custom_steps(m, 0, 4);
    ns = mp_optimizer_slot_count(m);
    slots0 = (float *)xmalloc(ns * 4); slots1 = (float *)xmalloc(ns * 4);
    OK(mp_get_optimizer_slots(m, slots0, ns), m);
    ls0 = *mp_model_loss_scale(m);
    {
        char *path = path_in("w.bf16");
        OK(mp_model_export_weights(src, MP_BFLOAT16, path), src);
        OK(mp_model_import_weights(m, path), m);
        remove(path);
        free(path);
    }
    OK(mp_get_optimizer_slots(m, slots1, ns), m);
    CHECK(memcmp(slots0, slots1, ns * 4) == 0);
    CHECK(mp_model_loss_scale(m)->steps == ls0.steps && mp_model_loss_scale(m)->scale == ls0.scale);
    OK(mp_model_get_weights(m, back, n), m);
    for (i = 0; i < n; i++) want[i] = mp_bf16_to_f32(mp_bf16_from_f32(w[i]));
    CHECK(memcmp(back, want, 6 * 4) == 0 && memcmp(back + 7, want + 7, (n - 7) * 4) == 0);
    /* an export of another model */
    s.units = 32;
    {
        mp_model *other = make(s);
        unsigned char *ob;
        size_t olen;
        snap before = take(m);
        OK(mp_model_export_weights_to_memory(other, MP_FLOAT16, NULL, 0, &olen), other);
        ob = (unsigned char *)xmalloc(olen);
        OK(mp_model_export_weights_to_memory(other, MP_FLOAT16, ob, olen, &olen), other);
        CHECK_ERR(mp_model_import_weights_from_memory(m, ob, olen), MP_ERR_SHAPE, m, "kernel weights");
        ob[olen - 10] ^= 4;
        CHECK_ERR(mp_model_import_weights_from_memory(m, ob, olen), MP_ERR_FORMAT, m, "checksum mismatch");
        CHECK(same(m, &before));
        free(ob); free(before.bytes);
        mp_model_destroy(other);
    }
    free(w); free(back); free(want); free(slots0); free(slots1);
    mp_model_destroy(src);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 5. Files: temp + rename, failures that keep the old file */

static unsigned char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    unsigned char *b;
    long n;
    *len = 0;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = (unsigned char *)xmalloc((size_t)n);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}
static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
/* the temporary files of saves of `name` (name.tmp.*) left in tmp_dir */
static int temps_of(const char *name) {
    DIR *d = opendir(tmp_dir);
    struct dirent *e;
    size_t n = strlen(name);
    int count = 0;
    while (d && (e = readdir(d)) != NULL)
        count += strncmp(e->d_name, name, n) == 0 && strncmp(e->d_name + n, ".tmp.", 5) == 0;
    if (d) closedir(d);
    return count;
}

static void test_files(void) {
    mp_model *m = make(base()), *c = make(base());
    char *path = path_in("model.ckpt"), *tmp = path_in("model.ckpt.tmp"), *nodir = path_in("no/such/dir/x.ckpt");
    unsigned char *old, *now;
    size_t old_len, now_len, fail_at;
    mp_memory_info mem;
    snap sc;
    OK(mp_model_save(m, path), m);
    CHECK(temps_of("model.ckpt") == 0); /* renamed away */
    old = read_all(path, &old_len);
    custom_steps(m, 0, 8); /* the model moves on; the file must not */

    CHECK_ERR(mp_model_save(m, nodir), MP_ERR_IO, m, "cannot create");
    CHECK_ERR(mp_model_load(m, nodir), MP_ERR_IO, m, "cannot read");
    CHECK(mp_model_save(m, NULL) == MP_ERR_NULL && mp_model_load(NULL, path) == MP_ERR_NULL);
    /* a stale path.tmp (a directory, as an older mixprec's leftover could
       be a file) is neither used nor removed */
    CHECK(mkdir(tmp, 0700) == 0);
    OK(mp_model_save(c, path), c);
    CHECK(exists(tmp) && temps_of("model.ckpt") == 0);
    CHECK(rmdir(tmp) == 0);
    {
        FILE *f = fopen(path, "wb"); /* the old bytes back */
        CHECK(f && fwrite(old, 1, old_len, f) == old_len && fclose(f) == 0);
    }
    /* path is a directory that is not empty: the rename fails, the temp goes */
    {
        char *dir = path_in("dir.ckpt"), *inside = path_in("dir.ckpt/x");
        CHECK(mkdir(dir, 0700) == 0);
        OK(mp_model_save(m, inside), m);
        CHECK_ERR(mp_model_save(m, dir), MP_ERR_IO, m, "cannot rename");
        CHECK(temps_of("dir.ckpt") == 0 && exists(inside));
        remove(inside);
        rmdir(dir);
        free(dir); free(inside);
    }
    /* no memory at each allocation of a save, then of a load */
    sc = take(c);
    mem = mp_get_memory_info();
    for (fail_at = 1; fail_at <= 2; fail_at++) {
        t_fail_at = fail_at;
        CHECK_ERR(mp_model_save(m, path), MP_ERR_ALLOC, m, "saving");
        t_fail_at = 0;
        now = read_all(path, &now_len);
        CHECK(now && now_len == old_len && memcmp(now, old, old_len) == 0 && temps_of("model.ckpt") == 0);
        free(now);
    }
    t_fail_at = 1;
    CHECK_ERR(mp_model_load(c, path), MP_ERR_ALLOC, c, "cannot read");
    t_fail_at = 0;
    CHECK(same(c, &sc));
    CHECK(mp_get_memory_info().current == mem.current); /* nothing leaked */
    /* a good save replaces the file, which then loads */
    OK(mp_model_save(m, path), m);
    now = read_all(path, &now_len);
    CHECK(now && (now_len != old_len || memcmp(now, old, old_len) != 0) && temps_of("model.ckpt") == 0);
    OK(mp_model_load(c, path), c);
    {
        snap sm = take(m);
        CHECK(same(c, &sm));
        free(sm.bytes);
    }
    remove(path);
    free(now); free(old); free(sc.bytes);
    free(path); free(tmp); free(nodir);
    mp_model_destroy(m); mp_model_destroy(c);
}

/* ======================================================================== */
/* 6. The same bytes on every host: a fixed model (weights set exactly, no
   training, whose arithmetic could differ between builds), compiled; the
   CRCs are constants recorded on x86-64 and checked again on s390x. */

static void test_portable_bytes(void) {
    spec s = base();
    mp_model *m, *back;
    size_t n, len, i;
    float *w;
    unsigned char *b;
    s.opt = MP_RMSPROP;
    m = make(s);
    n = mp_model_param_count(m);
    w = (float *)xmalloc(n * 4);
    for (i = 0; i < n; i++) w[i] = (float)((int)(i % 37) - 18) / 64.0f + (float)i / 1048576.0f;
    OK(mp_model_set_weights(m, w, n), m);
    b = save(m, &len);
    CHECK_EQ(len, 1024);
    CHECK_EQ(b ? get_le(b + len - 4, 4) : 0, 0x8CEA5D9Au);
    back = make(s);
    OK(mp_model_load_from_memory(back, b, len), back);
    free(b);
    OK(mp_model_export_weights_to_memory(m, MP_FLOAT16, NULL, 0, &len), m);
    b = (unsigned char *)xmalloc(len);
    OK(mp_model_export_weights_to_memory(m, MP_FLOAT16, b, len, &len), m);
    CHECK_EQ(get_le(b + len - 4, 4), 0x0D5121C2u);
    free(b);
    OK(mp_model_export_weights_to_memory(m, MP_BFLOAT16, NULL, 0, &len), m);
    b = (unsigned char *)xmalloc(len);
    OK(mp_model_export_weights_to_memory(m, MP_BFLOAT16, b, len, &len), m);
    CHECK_EQ(get_le(b + len - 4, 4), 0xD256B422u);
    free(b);
    free(w);
    mp_model_destroy(m);
    mp_model_destroy(back);
}

/* ======================================================================== */

/* 7. The learning rate is optimizer state: a schedule, and a rate set
   during training, come back with the checkpoint; a version-1 file (no
   schedule field: a constant rate) still loads. */

static void test_learning_rate_state(void) {
    spec s = base();
    mp_model *a, *b, *c, *d;
    mp_fit_desc fd = fit_desc(4, 0, NULL);
    size_t len, off, i, tail;
    unsigned char *bytes, *v1;
    snap sa;
    const float rate = 0.0123f;
    int zeros = 1;
    s.schedule.kind = MP_EXPONENTIAL_DECAY;
    s.schedule.initial_learning_rate = 0.01f;
    s.schedule.decay_steps = 3;
    s.schedule.decay_rate = 0.5f;
    a = make(s);
    b = make(s);
    c = make(base()); /* no schedule: it comes with the checkpoint */
    OK(mp_model_fit(a, &fd), a);
    sa = take(a);
    fd.epochs = 2;
    OK(mp_model_fit(b, &fd), b);
    bytes = save(b, &len);
    if (bytes) OK(mp_model_load_from_memory(c, bytes, len), c);
    CHECK(mp_model_learning_rate(c) == mp_model_learning_rate(b) && mp_model_learning_rate(c) < 0.01f);
    CHECK(mp_model_set_learning_rate(c, 0.1f) == MP_ERR_STATE);
    fd.epochs = 4;
    fd.initial_epoch = 2;
    OK(mp_model_fit(c, &fd), c);
    CHECK(same(c, &sa)); /* the decayed rates of the uninterrupted run */
    free(bytes);
    free(sa.bytes);
    /* a constant rate set by hand (a float variable: where FLT_EVAL_METHOD
       is 1, as on s390x, the literal 0.0123f compares as a double) */
    d = make(base());
    OK(mp_model_set_learning_rate(d, rate), d);
    bytes = save(d, &len);
    mp_model_destroy(d);
    d = make(base());
    if (bytes) OK(mp_model_load_from_memory(d, bytes, len), d);
    CHECK(mp_model_learning_rate(d) == rate);
    /* version 1: the same bytes without the schedule's 28 (kind,
       initial_learning_rate, decay_steps (8), decay_rate, staircase, alpha),
       which sit before the iteration count (8), the slots and the
       loss-scale state (56 bytes) */
    tail = 56 + mp_optimizer_slot_count(d) * 4 + 8 + 4;
    v1 = (unsigned char *)xmalloc(len);
    if (bytes && len > tail + 28 + 20) {
        off = len - tail - 28;
        for (i = 0; i < 28; i++) zeros &= bytes[off + i] == 0;
        CHECK(zeros); /* a constant rate's schedule is all zeros */
        memcpy(v1, bytes, off);
        memcpy(v1 + off, bytes + off + 28, len - off - 28);
        put_le(v1 + 8, 1, 4);
        put_le(v1 + 12, len - 28, 8);
        fix_crc(v1, len - 28);
        mp_model_destroy(d);
        d = make(base());
        OK(mp_model_load_from_memory(d, v1, len - 28), d);
        CHECK(mp_model_learning_rate(d) == rate);
        free(v1);
        v1 = save(d, &off);
        CHECK(v1 && off == len && memcmp(v1, bytes, len) == 0); /* saved again as version 2: the same bytes */
    }
    free(v1);
    free(bytes);
    mp_model_destroy(a);
    mp_model_destroy(b);
    mp_model_destroy(c);
    mp_model_destroy(d);
}

/* A checkpoint restores the optimizer's settings, as Keras's optimizer
   variables and config: a model compiled with plain momentum that loads a
   Nesterov model's file saves the same bytes and then takes the same
   steps (Nesterov's). */
static void test_optimizer_config_restored(void) {
    spec s = base();
    mp_model *src, *dst;
    unsigned char *b;
    size_t len;
    snap want;
    s.opt = MP_SGD, s.momentum = 0.9f, s.nesterov = 1;
    src = make(s);
    s.nesterov = 0;
    dst = make(s);
    custom_steps(src, 0, 2);
    b = save(src, &len);
    if (b && OK(mp_model_load_from_memory(dst, b, len), dst)) {
        want = take(src);
        CHECK(same(dst, &want));
        free(want.bytes);
        custom_steps(src, 2, 3);
        custom_steps(dst, 2, 3);
        want = take(src);
        CHECK(same(dst, &want));
        free(want.bytes);
    }
    free(b);
    mp_model_destroy(src);
    mp_model_destroy(dst);
}

/* ======================================================================== */
/* 8. A functional model: a residual Add, a Concatenate with the input and
   BatchNormalization's moving statistics (non-trainable weights, after the
   trainable ones in the file, float32 in any export) */

/* input(6) -> dense(8, relu) -> batch_normalization -> dense_1(8);
   add([dense_1, dense]); concatenate([add, input]) -> dense_2(3). The
   weights in get_weights order: dense 56, batch_normalization gamma 8,
   beta 8, moving mean 8 (72..79), moving variance 8 (80..87), dense_1 72,
   dense_2 45: 205, 16 of them not trainable. `other` wires add to
   batch_normalization instead of dense: the same layers and shapes,
   connected otherwise. */
enum { GRAPH_WEIGHTS = 205, GRAPH_VARIANCE = 80 };
static mp_model *graph_model(int other, int compiled) {
    static const int shape[] = {6, 0};
    const int wiring[6][MP_MAX_LAYER_INPUTS + 1] = {{1, 0}, {1, 1}, {1, 2}, {2, 3, other ? 2 : 1}, {2, 4, 0}, {1, 5}};
    mp_layer_desc layers[6];
    mp_compile_desc cd;
    mp_model *m;
    layers[0] = mp_dense(8, MP_RELU);
    layers[1] = mp_batch_normalization();
    layers[2] = mp_dense(8, MP_LINEAR);
    layers[3] = mp_add();
    layers[4] = mp_concatenate(0);
    layers[5] = mp_dense(3, MP_LINEAR);
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_MEAN_SQUARED_ERROR;
    cd.optimizer.kind = MP_ADAM;
    m = new_graph_model("float32", shape, layers, wiring, 6);
    if (m && !OK(compiled ? mp_model_compile(m, &cd) : mp_model_build(m), m)) {
        mp_model_destroy(m);
        m = NULL;
    }
    return m;
}

/* Weights none of the initialisers gives: moving means in [-1, 1),
   variances in [0.5, 2). */
static void graph_weights(float *w) {
    int i;
    for (i = 0; i < GRAPH_WEIGHTS; i++)
        w[i] = i >= GRAPH_VARIANCE && i < GRAPH_VARIANCE + 8 ? uniform(0.5f, 2.0f) : uniform(-1.0f, 1.0f);
}

static void test_graph(void) {
    float w[GRAPH_WEIGHTS], back[GRAPH_WEIGHTS], before[GRAPH_WEIGHTS];
    mp_model *a = graph_model(0, 1), *b = graph_model(0, 1), *c = graph_model(1, 1), *u = graph_model(0, 0);
    unsigned char *bytes = NULL, *again = NULL, *forged = NULL, *f16 = NULL;
    size_t len = 0, len2 = 0, flen = 0, i, bad = 0;
    if (!a || !b || !c || !u) goto done;
    graph_weights(w);
    OK(mp_model_set_weights(a, w, GRAPH_WEIGHTS), a);
    bytes = save(a, &len);
    if (!bytes) goto done;
    CHECK_EQ(get_le(bytes + 8, 4), 3); /* a graph with state: version 3 */
    /* round trip, bit for bit: the weights and the moving statistics, and
       the bytes saved again */
    OK(mp_model_load_from_memory(b, bytes, len), b);
    OK(mp_model_get_weights(b, back, GRAPH_WEIGHTS), b);
    CHECK(memcmp(back, w, sizeof w) == 0);
    again = save(b, &len2);
    CHECK(again && len2 == len && memcmp(again, bytes, len) == 0);
    /* connected otherwise: refused, naming the layer and the input; the
       model untouched */
    OK(mp_model_get_weights(c, before, GRAPH_WEIGHTS), c);
    CHECK_ERR(mp_model_load_from_memory(c, bytes, len), MP_ERR_SHAPE, c,
              "layer 3 (add): its input 1 is layer id 1 in the file, 2 in the model");
    OK(mp_model_get_weights(c, back, GRAPH_WEIGHTS), c);
    CHECK(memcmp(back, before, sizeof back) == 0);
    /* a moving variance below zero (set_weights takes it; a file cannot
       hold it): corrupt, and nothing changes */
    w[GRAPH_VARIANCE + 3] = -1.0f;
    OK(mp_model_set_weights(a, w, GRAPH_WEIGHTS), a);
    forged = save(a, &len2);
    OK(mp_model_get_weights(b, before, GRAPH_WEIGHTS), b);
    if (forged) CHECK_ERR(mp_model_load_from_memory(b, forged, len2), MP_ERR_FORMAT, b,
              "layer 1 (batch_normalization): moving variance 3 is negative or NaN");
    OK(mp_model_get_weights(b, back, GRAPH_WEIGHTS), b);
    CHECK(memcmp(back, before, sizeof back) == 0);
    /* an uncompiled model into the compiled one's file: compile first */
    CHECK_ERR(mp_model_load_from_memory(u, bytes, len), MP_ERR_STATE, u, "compile() the model first");
    /* inference weights in float16: the trainable ones rounded, the moving
       statistics exact */
    OK(mp_model_export_weights_to_memory(b, MP_FLOAT16, NULL, 0, &flen), b);
    f16 = (unsigned char *)xmalloc(flen);
    OK(mp_model_export_weights_to_memory(b, MP_FLOAT16, f16, flen, &flen), b);
    OK(mp_model_import_weights_from_memory(u, f16, flen), u);
    OK(mp_model_get_weights(u, back, GRAPH_WEIGHTS), u);
    for (i = 0; i < GRAPH_WEIGHTS; i++) {
        int state = i >= GRAPH_VARIANCE - 8 && i < GRAPH_VARIANCE + 8;
        float want = state ? before[i] : mp_f16_to_f32(mp_f16_from_f32(before[i]));
        bad += memcmp(&back[i], &want, sizeof want) != 0;
    }
    CHECK_EQ(bad, 0);
    CHECK_ERR(mp_model_import_weights_from_memory(c, f16, flen), MP_ERR_SHAPE, c, "layer 3 (add)");
done:
    free(bytes); free(again); free(forged); free(f16);
    mp_model_destroy(a); mp_model_destroy(b); mp_model_destroy(c); mp_model_destroy(u);
}

/* ======================================================================== */
/* 8. safetensors: the reference writer's bytes, round trips in each dtype
   and layout, every rule of the reference parser (and the stricter ones),
   names and shapes of another model, and a refusal changes nothing */

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* A safetensors buffer: the header json (padded with spaces to a multiple
   of 8, as the writer does, unless raw), then `data` bytes 0, 1, 2, ... */
static unsigned char *st_forge(const char *json, size_t data, int raw, size_t *len) {
    size_t n = strlen(json), head = raw ? n : (n + 7) / 8 * 8, i;
    unsigned char *b = (unsigned char *)xmalloc(8 + head + data);
    put_le(b, head, 8);
    memcpy(b + 8, json, n);
    memset(b + 8 + n, ' ', head - n);
    for (i = 0; i < data; i++) b[8 + head + i] = (unsigned char)i;
    *len = 8 + head + data;
    return b;
}

static unsigned char *st_save(mp_model *m, mp_dtype dt, mp_weights_layout layout, size_t *len) {
    mp_safetensors_desc d;
    unsigned char *b = NULL;
    mp_status st;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.layout = layout;
    st = mp_model_save_safetensors_to_memory(m, &d, NULL, 0, len);
    if (st == MP_OK) st = mp_model_save_safetensors_to_memory(m, &d, b = (unsigned char *)xmalloc(*len), *len, len);
    if (OK(st, m)) return b;
    free(b);
    return NULL;
}

static mp_status st_load(mp_model *m, mp_weights_layout layout, const unsigned char *b, size_t len) {
    mp_safetensors_desc d;
    memset(&d, 0, sizeof d);
    d.layout = layout;
    return mp_model_load_safetensors_from_memory(m, &d, b, len);
}

/* dense: 3 -> 2, kernel ((0.5, 1), (1.5, 2), (2.5, 3)), bias (0.25, -0.5):
   the file as the reference writer lays it out (bias before kernel by name,
   the JSON padded to a multiple of 8), the kernel transposed in the
   PyTorch layout; in bfloat16, half the data bytes. */
static void test_safetensors_bytes(void) {
    static const int shape[] = {3, 0};
    static const float w[8] = {0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f, 0.25f, -0.5f};
    static const char *const json[2] = {
        "{\"__metadata__\":{\"mixprec\":\"layout=keras dtype=float32 policy=float32 layers=dense:Dense:float32\"},"
        "\"dense/bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"dense/kernel\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[8,32]}}",
        "{\"__metadata__\":{\"mixprec\":\"layout=pytorch dtype=bfloat16 policy=float32 layers=dense:Dense:float32\"},"
        "\"dense.bias\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
        "\"dense.weight\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[4,16]}}"};
    static const float torch_order[6] = {0.5f, 1.5f, 2.5f, 1.0f, 2.0f, 3.0f};
    mp_layer_desc dense = mp_dense(2, MP_LINEAR);
    mp_model *m = new_model("float32", shape, &dense, 1);
    unsigned char *b[2] = {NULL, NULL};
    size_t len[2], head, i;
    int k;
    if (!m || !OK(mp_model_set_weights(m, w, 8), m)) goto done;
    b[0] = st_save(m, MP_FLOAT32, MP_LAYOUT_KERAS, &len[0]);
    b[1] = st_save(m, MP_BFLOAT16, MP_LAYOUT_PYTORCH, &len[1]);
    for (k = 0; k < 2; k++) {
        if (!b[k]) continue;
        head = (strlen(json[k]) + 7) / 8 * 8;
        CHECK_EQ(get_le(b[k], 8), head);
        CHECK_EQ(len[k], 8 + head + (k ? 16 : 32));
        CHECK(memcmp(b[k] + 8, json[k], strlen(json[k])) == 0);
        for (i = strlen(json[k]); i < head; i++) CHECK_EQ(b[k][8 + i], ' ');
    }
    if (b[0]) { /* bias, then the kernel row-major (in, units), float32's bits */
        for (i = 0; i < 2; i++) CHECK_EQ(get_le(b[0] + 8 + get_le(b[0], 8) + 4 * i, 4), f32_bits(w[6 + i]));
        for (i = 0; i < 6; i++) CHECK_EQ(get_le(b[0] + 16 + get_le(b[0], 8) + 4 * i, 4), f32_bits(w[i]));
    }
    if (b[1]) /* the kernel as (units, in), bfloat16 */
        for (i = 0; i < 6; i++)
            CHECK_EQ(get_le(b[1] + 12 + get_le(b[1], 8) + 2 * i, 2), mp_bf16_from_f32(torch_order[i]).bits);
    /* the buffer cap: one byte short writes nothing */
    {
        unsigned char small[64];
        size_t n;
        memset(small, 0xAB, sizeof small);
        CHECK(mp_model_save_safetensors_to_memory(m, NULL, small, sizeof small, &n) == MP_ERR_SIZE && n == len[0] &&
              small[0] == 0xAB);
    }
done:
    free(b[0]); free(b[1]);
    mp_model_destroy(m);
}

/* The graph model (BatchNormalization's four weights) and a convnet
   (Conv2D's rank-4 kernel) in each dtype and layout: loaded into another
   model they give the exported weights (float16/bfloat16: mp_convert's
   rounding; the moving statistics exact), and saved again the same bytes. */
/* whether b[len] holds the text s */
static int has_text(const unsigned char *b, size_t len, const char *s) {
    size_t i, n = strlen(s);
    for (i = 0; i + n <= len; i++)
        if (memcmp(b + i, s, n) == 0) return 1;
    return 0;
}

static void test_safetensors_round_trip(void) {
    static const int image[] = {5, 4, 2, 0}, tokens[] = {4, 0};
    mp_layer_desc conv[3], seq[4];
    mp_model *src[3], *dst[3];
    float *w = NULL, *back = NULL;
    int k, dt, layout;
    conv[0] = mp_conv2d(3, 2, 3, MP_SAME, MP_RELU);
    conv[1] = mp_flatten();
    conv[2] = mp_dense(2, MP_LINEAR);
    seq[0] = mp_embedding(7, 6);
    seq[1] = mp_multi_head_attention(2, 3, 1);
    seq[2] = mp_layer_normalization();
    seq[3] = mp_dense(7, MP_LINEAR);
    src[0] = graph_model(0, 0);
    dst[0] = graph_model(0, 1); /* compiled: its optimizer state is not touched */
    src[1] = new_model("mixed_float16", image, conv, 3);
    dst[1] = new_model("mixed_float16", image, conv, 3);
    src[2] = new_model("mixed_bfloat16", tokens, seq, 4);
    dst[2] = new_model("mixed_bfloat16", tokens, seq, 4);
    for (k = 0; k < 3; k++) {
        size_t n, i, bad = 0;
        if (!src[k] || !dst[k]) continue;
        n = mp_model_param_count(src[k]);
        w = floats(n);
        back = floats(n);
        if (k == 0) graph_weights(w);
        else for (i = 0; i < n; i++) w[i] = uniform(-1.0f, 1.0f);
        OK(mp_model_set_weights(src[k], w, n), src[k]);
        for (dt = 0; dt < MP_DTYPE_COUNT; dt++)
            for (layout = 0; layout < 2; layout++) {
                size_t len, len2;
                unsigned char *b = st_save(src[k], (mp_dtype)dt, (mp_weights_layout)layout, &len), *again;
                if (!b) continue;
                OK(mp_safetensors_check(b, len, NULL, 0), NULL);
                if (k == 2 && layout == MP_LAYOUT_PYTORCH) /* nn.Embedding's and nn.Linear's names, (out, in) axes */
                    CHECK(has_text(b, len, "\"embedding.weight\"") && has_text(b, len, "\"shape\":[7,6]") &&
                          has_text(b, len, "\"multi_head_attention.query.weight\"") &&
                          has_text(b, len, "\"shape\":[2,3,6]") && has_text(b, len, "\"shape\":[6,2,3]"));
                OK(st_load(dst[k], (mp_weights_layout)layout, b, len), dst[k]);
                OK(mp_model_get_weights(dst[k], back, n), dst[k]);
                for (bad = 0, i = 0; i < n; i++) {
                    int state = k == 0 && i >= GRAPH_VARIANCE - 8 && i < GRAPH_VARIANCE + 8;
                    float want = w[i];
                    if (!state && dt == MP_FLOAT16) want = mp_f16_to_f32(mp_f16_from_f32(w[i]));
                    if (!state && dt == MP_BFLOAT16) want = mp_bf16_to_f32(mp_bf16_from_f32(w[i]));
                    bad += memcmp(&back[i], &want, sizeof want) != 0;
                }
                CHECK_EQ(bad, 0);
                again = st_save(dst[k], (mp_dtype)dt, (mp_weights_layout)layout, &len2);
                CHECK(again && len2 == len && memcmp(again, b, len) == 0);
                free(b); free(again);
            }
        free(w); free(back);
        w = back = NULL;
    }
    for (k = 0; k < 3; k++) { mp_model_destroy(src[k]); mp_model_destroy(dst[k]); }
}

/* Each rule, refused by the checker and by a load (MP_ERR_FORMAT, the model
   untouched), with the words of its message. What the format allows loads
   or checks. */
static void test_safetensors_rules(void) {
    static const struct { const char *json; size_t data; const char *word; } bad[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "differs from its shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "do not begin at 0"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "a hole"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, "end before they begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,4]}}", 4, "overflows"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}", 8, "size overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 5, "bytes no tensor owns"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "truncated"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "given twice"},
        {"{\"a\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype"},
        {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "field given twice"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, "unknown field"},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "lacks"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "two integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "not a fraction"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,4]}}", 4, "past 2^64"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "more than 8"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "not a string"},
        {"{\"__metadata__\":[]}", 0, "object of strings"},
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ given twice"},
        {"[]", 0, "one JSON object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "invalid JSON"},
        {"{\"a\" {\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "':' was expected"},
        {"{} x", 0, "more after the header's object"},
        {"{\"\\ud800\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, "surrogate"},
        {"{\"\\q\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, "unknown escape"},
        {"{\"a\tb\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, "control character"},
        {"{\"\xC0\x80\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, "invalid UTF-8"},
        {"{\"\xED\xA0\x80\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, "invalid UTF-8"},
    };
    static const struct { const char *json; size_t data; } good[] = {
        {"{}", 0},
        {"{\"__metadata__\":{}}", 0},
        {" { \"s\" : { \"shape\" : [ ] , \"data_offsets\" : [ 0 , 2 ] , \"dtype\" : \"BF16\" } }\n", 2},
        {"{\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
         "\"\\u00e9\\ud83d\\ude00\\\"\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8},
    };
    static const int shape[] = {3, 0};
    mp_layer_desc dense = mp_dense(2, MP_LINEAR);
    mp_model *m = new_model("float32", shape, &dense, 1);
    float *before = m ? weights_of(m) : NULL;
    unsigned char *b;
    size_t len, i;
    char why[256];
    if (!m) return;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b = st_forge(bad[i].json, bad[i].data, 0, &len);
        if (!check_report(mp_safetensors_check(b, len, why, sizeof why) == MP_ERR_FORMAT && strstr(why, bad[i].word),
                          __FILE__, __LINE__, bad[i].word))
            fprintf(stderr, "    %s: %s\n", bad[i].json, why);
        CHECK_ERR(st_load(m, MP_LAYOUT_KERAS, b, len), MP_ERR_FORMAT, m, bad[i].word);
        CHECK(weights_equal(m, before));
        free(b);
    }
    for (i = 0; i < sizeof good / sizeof good[0]; i++) {
        b = st_forge(good[i].json, good[i].data, 1, &len);
        if (!check_report(mp_safetensors_check(b, len, why, sizeof why) == MP_OK && !why[0], __FILE__, __LINE__,
                          good[i].json))
            fprintf(stderr, "    %s\n", why);
        free(b);
    }
    /* the frame: under 8 bytes, a header over 100,000,000 bytes or past the file */
    b = st_forge("{}", 0, 0, &len);
    CHECK(mp_safetensors_check(b, 7, why, sizeof why) == MP_ERR_FORMAT && strstr(why, "under 8 bytes"));
    put_le(b, 100000001, 8);
    CHECK(mp_safetensors_check(b, len, why, sizeof why) == MP_ERR_FORMAT && strstr(why, "over the format's 100,000,000"));
    put_le(b, 9, 8);
    CHECK(mp_safetensors_check(b, len, why, sizeof why) == MP_ERR_FORMAT && strstr(why, "runs past the end"));
    put_le(b, UINT64_MAX, 8);
    CHECK_ERR(st_load(m, MP_LAYOUT_KERAS, b, len), MP_ERR_FORMAT, m, "over the format's");
    CHECK(mp_safetensors_check(NULL, 0, why, sizeof why) == MP_ERR_NULL);
    CHECK(weights_equal(m, before));
    free(b);
    free(before);
    mp_model_destroy(m);
}

/* A valid file of another model: names, shapes and dtypes named in the
   error; the model untouched even when every tensor but the last fits;
   a torch state dict's num_batches_tracked taken in the PyTorch layout. */
static void test_safetensors_model(void) {
    static const int shape[] = {3, 0};
    static const char *const files[][3] = {
        {"{\"dense/kernel\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]}}", "24",
         "tensor \"dense/bias\" of shape [2], a weight of the model in the Keras layout, is not in the file"},
        {"{\"dense/bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"dense/kernel\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]}}", "32",
         "tensor \"dense/kernel\": shape [2, 3] in the file, [3, 2] in the model (Keras layout)"},
        {"{\"dense/bias\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
         "\"dense/kernel\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[16,40]}}", "40",
         "tensor \"dense/bias\": dtype F64; weights load from F32, F16 or BF16"},
        {"{\"dense/bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"dense/kernel\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[8,32]},"
         "\"extra\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[32,36]}}", "36",
         "tensor \"extra\" in the file is not a weight of the model"},
        {"{\"dense/bias\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"dense/kernel\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[8,32]}}", "32", ""},
    };
    mp_layer_desc dense = mp_dense(2, MP_LINEAR);
    mp_layer_desc bn_layers[2];
    mp_model *m = new_model("float32", shape, &dense, 1), *bn;
    float *before = m ? weights_of(m) : NULL;
    unsigned char *b;
    size_t len, i;
    if (!m) return;
    for (i = 0; i < sizeof files / sizeof files[0]; i++) {
        b = st_forge(files[i][0], (size_t)atoi(files[i][1]), 0, &len);
        if (files[i][2][0]) {
            CHECK(mp_safetensors_check(b, len, NULL, 0) == MP_OK);
            CHECK_ERR(st_load(m, MP_LAYOUT_KERAS, b, len), strstr(files[i][2], "F64") ? MP_ERR_DTYPE : MP_ERR_SHAPE, m,
                      files[i][2]);
            CHECK(weights_equal(m, before));
        } else { /* the right names and shapes: it loads; in the PyTorch layout it does not */
            CHECK_ERR(st_load(m, MP_LAYOUT_PYTORCH, b, len), MP_ERR_SHAPE, m,
                      "\"dense.weight\" of shape [2, 3], a weight of the model in the PyTorch layout, is not in the "
                      "file; it has the Keras layout's names: load it with MP_LAYOUT_KERAS");
            CHECK(weights_equal(m, before));
            OK(st_load(m, MP_LAYOUT_KERAS, b, len), m);
            CHECK(!weights_equal(m, before));
        }
        free(b);
    }
    /* BatchNorm1d's state dict: num_batches_tracked (I64, rank 0) is taken
       and not used in the PyTorch layout, refused in the Keras one */
    bn_layers[0] = mp_dense(2, MP_LINEAR);
    bn_layers[1] = mp_batch_normalization();
    bn = new_model("float32", shape, bn_layers, 2);
    if (bn) {
        static const char *const names[] = {"batch_normalization.bias", "batch_normalization.num_batches_tracked",
                                            "batch_normalization.running_mean", "batch_normalization.running_var",
                                            "batch_normalization.weight", "dense.bias", "dense.weight"};
        char json[1024];
        size_t at = 0, n = 0;
        int k;
        for (k = 0, json[0] = '{'; k < 7; k++) {
            size_t bytes = k == 1 ? 8 : k == 6 ? 24 : 8;
            n += (size_t)sprintf(json + 1 + n, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                                 k ? "," : "", names[k], k == 1 ? "I64" : "F32", k == 1 ? "[]" : k == 6 ? "[2,3]" : "[2]",
                                 at, at + bytes);
            at += bytes;
        }
        strcpy(json + 1 + n, "}");
        b = st_forge(json, at, 0, &len);
        /* the forged bytes 0, 1, 2 ... as a variance are positive floats */
        OK(st_load(bn, MP_LAYOUT_PYTORCH, b, len), bn);
        CHECK_ERR(st_load(bn, MP_LAYOUT_KERAS, b, len), MP_ERR_SHAPE, bn, "\"dense/kernel\"");
        free(b);
        mp_model_destroy(bn);
    }
    free(before);
    mp_model_destroy(m);
}

/* Files: replaced by temp + rename, read back; a directory, a missing file
   and a bad file refused, the model untouched. */
static void test_safetensors_files(void) {
    mp_model *a = graph_model(0, 0), *b = graph_model(0, 0);
    char *path = path_in("w.safetensors"), *nodir = path_in("no/such/w.safetensors");
    float w[GRAPH_WEIGHTS];
    mp_safetensors_desc d;
    unsigned char *bytes;
    size_t len;
    FILE *f;
    if (!a || !b) goto done;
    memset(&d, 0, sizeof d);
    d.layout = MP_LAYOUT_PYTORCH;
    graph_weights(w);
    OK(mp_model_set_weights(a, w, GRAPH_WEIGHTS), a);
    OK(mp_model_save_safetensors(a, path, &d), a);
    CHECK(temps_of("w.safetensors") == 0);
    OK(mp_model_load_safetensors(b, path, &d), b);
    CHECK(weights_equal(b, w));
    CHECK_ERR(mp_model_load_safetensors(b, path, NULL), MP_ERR_SHAPE, b, "Keras layout");
    CHECK_ERR(mp_model_save_safetensors(a, nodir, NULL), MP_ERR_IO, a, "cannot create");
    CHECK_ERR(mp_model_load_safetensors(b, nodir, NULL), MP_ERR_IO, b, "cannot read");
    CHECK_ERR(mp_model_load_safetensors(b, tmp_dir, NULL), MP_ERR_IO, b, "regular file");
    bytes = read_all(path, &len);
    if (bytes && (f = fopen(path, "wb")) != NULL) { /* one byte more than the tensors */
        CHECK(fwrite(bytes, 1, len, f) == len && fputc(0, f) == 0 && fclose(f) == 0);
        CHECK_ERR(mp_model_load_safetensors(b, path, &d), MP_ERR_FORMAT, b, "bytes no tensor owns");
    }
    CHECK(weights_equal(b, w));
    CHECK(mp_model_save_safetensors(NULL, path, NULL) == MP_ERR_NULL && mp_model_load_safetensors(NULL, path, NULL) == MP_ERR_NULL);
    remove(path);
    free(bytes);
done:
    free(path); free(nodir);
    mp_model_destroy(a); mp_model_destroy(b);
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/mp_ckpt_XXXXXX";
    check_args(argc, argv);
    init_data();
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
    tmp_dir = dir;
    RUN(test_round_trip());
    RUN(test_resume_fit(MP_ADAM));
    RUN(test_resume_fit(MP_RMSPROP));
    RUN(test_resume_custom_loop());
    RUN(test_resume_gpt());
    RUN(test_resume_options());
    RUN(test_corrupt_exclusions());
    RUN(test_initial_epoch_args());
    RUN(test_truncations());
    RUN(test_corruptions());
    RUN(test_forged());
    RUN(test_foreign());
    RUN(test_wrong_model());
    RUN(test_export());
    RUN(test_files());
    RUN(test_portable_bytes());
    RUN(test_learning_rate_state());
    RUN(test_optimizer_config_restored());
    RUN(test_graph());
    RUN(test_safetensors_bytes());
    RUN(test_safetensors_round_trip());
    RUN(test_safetensors_rules());
    RUN(test_safetensors_model());
    RUN(test_safetensors_files());
    rmdir(dir);
    return check_done("test_checkpoint");
}
