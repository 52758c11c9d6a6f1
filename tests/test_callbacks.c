/* test_callbacks.c - fit's callbacks: the order of the hooks and what they
   get, the user pointer, stopping from a hook, a failing hook, History,
   CSVLogger (the same file as csv_path, append), ProgbarLogger's lines,
   EarlyStopping (patience, min_delta, baseline, restore_best_weights,
   start_from_epoch, modes, bad monitors), ModelCheckpoint (every epoch with
   {epoch:02d}, save_best_only, weights only), LearningRateScheduler, and the
   ExponentialDecay and CosineDecay schedules against Keras's formulas and
   in the optimizer's steps. A few seconds; also under ASan/UBSan. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, mkdtemp */
#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N = 400, F = 8, CLASSES = 4, BATCH = 40, STEPS = 8 }; /* 320 training samples with validation_split 0.2 */
static float xs[N * F];
static int32_t ys[N];
static const char *tmp_dir;

/* Four Gaussian blobs, one per class. */
static void make_data(void) {
    size_t i, j;
    for (i = 0; i < N; i++) {
        ys[i] = (int32_t)(i % CLASSES);
        for (j = 0; j < F; j++) xs[i * F + j] = normal() * 0.7f + (j % CLASSES == (size_t)ys[i] ? 2.0f : 0.0f);
    }
}

static mp_model *model_with(const char *policy, mp_optimizer_desc opt) {
    static const int shape[] = {F, 0};
    mp_layer_desc layers[2];
    mp_compile_desc cd;
    mp_model *m;
    layers[0] = mp_dense(16, MP_RELU);
    layers[1] = mp_dense(CLASSES, MP_SOFTMAX);
    layers[1].dtype = "float32";
    if (!(m = new_model(policy, shape, layers, 2))) return NULL;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.optimizer = opt;
    if (!OK(mp_model_compile(m, &cd), m)) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}
static mp_model *model(void) {
    mp_optimizer_desc o;
    memset(&o, 0, sizeof o);
    o.kind = MP_ADAM;
    return model_with("float32", o);
}

static mp_fit_desc fit_desc(int epochs, const mp_callback *cbs, int count) {
    mp_fit_desc fd = silent_fit(xs, F, ys, N, BATCH, epochs);
    fd.validation_split = 0.2f;
    fd.callbacks = cbs;
    fd.callback_count = count;
    return fd;
}

static char *path_in(const char *name) {
    char *p = (char *)zalloc(strlen(tmp_dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", tmp_dir, name);
    return p;
}

/* ======================================================================== */
/* 1. The hooks: order, arguments, logs, the user pointer */

typedef struct recorder {
    char trace[4096];
    size_t len;
    int bad;             /* an argument was not what fit promised */
    mp_logs epoch_logs[8];
    int stop_at_epoch, stop_at_step; /* -1: never */
    mp_status fail_with; /* returned by on_epoch_end at stop_at_epoch */
    mp_status end_status;
} recorder;

static void note(recorder *r, const char *s) {
    size_t n = strlen(s);
    if (r->len + n + 1 < sizeof r->trace) {
        memcpy(r->trace + r->len, s, n + 1);
        r->len += n;
    }
}
static mp_status rec_train_begin(void *user, mp_fit_state *s, const mp_logs *lg) {
    recorder *r = (recorder *)user;
    r->bad |= lg != NULL || s->steps != STEPS || !s->has_validation || !s->has_accuracy || s->epoch != s->initial_epoch;
    note(r, "B");
    return MP_OK;
}
static mp_status rec_epoch_begin(void *user, mp_fit_state *s, const mp_logs *lg) {
    recorder *r = (recorder *)user;
    char buf[16];
    r->bad |= lg != NULL;
    sprintf(buf, "[%d", s->epoch);
    note(r, buf);
    return MP_OK;
}
static mp_status rec_batch_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    recorder *r = (recorder *)user;
    r->bad |= !lg || !(lg->loss > 0.0f) || lg->loss_scale != 1.0f || !(lg->learning_rate > 0.0f) || s->step >= s->steps;
    note(r, ".");
    if (s->epoch == r->stop_at_epoch && (int)s->step == r->stop_at_step) s->stop_training = 1;
    return MP_OK;
}
static mp_status rec_epoch_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    recorder *r = (recorder *)user;
    r->bad |= !lg || lg->steps != STEPS || !(lg->val_loss > 0.0f) || !(lg->accuracy > 0.0f);
    if (lg && s->epoch < 8) r->epoch_logs[s->epoch] = *lg;
    note(r, "]");
    if (s->epoch == r->stop_at_epoch && r->stop_at_step < 0) {
        if (r->fail_with != MP_OK) return r->fail_with;
        s->stop_training = 1;
    }
    return MP_OK;
}
static mp_status rec_train_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    recorder *r = (recorder *)user;
    r->bad |= lg != NULL;
    r->end_status = s->status;
    note(r, "E");
    return MP_OK;
}
static mp_callback recorder_callback(recorder *r) {
    mp_callback c;
    memset(r, 0, sizeof *r);
    r->stop_at_epoch = r->stop_at_step = -1;
    c.on_train_begin = rec_train_begin;
    c.on_train_end = rec_train_end;
    c.on_epoch_begin = rec_epoch_begin;
    c.on_epoch_end = rec_epoch_end;
    c.on_batch_end = rec_batch_end;
    c.user = r;
    return c;
}

static void test_hook_order(void) {
    mp_model *m = model();
    recorder r;
    mp_callback cb = recorder_callback(&r);
    mp_logs hist[3];
    mp_fit_desc fd = fit_desc(3, &cb, 1);
    int i;
    if (!m) return;
    fd.history = hist;
    OK(mp_model_fit(m, &fd), m);
    CHECK(strcmp(r.trace, "B[0........][1........][2........]E") == 0);
    CHECK(!r.bad && r.end_status == MP_OK);
    for (i = 0; i < 3; i++) CHECK(memcmp(&hist[i], &r.epoch_logs[i], sizeof hist[i]) == 0);
    CHECK(hist[2].learning_rate == 0.001f); /* Adam's default */
    /* resuming: epochs 2 and 3 of 4 */
    r.len = 0;
    r.trace[0] = '\0';
    fd.initial_epoch = 2;
    fd.epochs = 4;
    OK(mp_model_fit(m, &fd), m);
    CHECK(strcmp(r.trace, "B[2........][3........]E") == 0 && !r.bad);
    /* bad lists */
    fd.callbacks = NULL;
    CHECK(mp_model_fit(m, &fd) == MP_ERR_ARG);
    fd.callbacks = &cb;
    fd.callback_count = -1;
    CHECK(mp_model_fit(m, &fd) == MP_ERR_ARG);
    mp_model_destroy(m);
}

/* stop_training from on_batch_end ends the epoch there (its on_epoch_end
   still runs, as Keras's); from on_epoch_end, after that epoch */
static void test_stop_training(void) {
    mp_model *m = model();
    recorder r;
    mp_callback cb = recorder_callback(&r);
    mp_logs hist[5];
    mp_fit_desc fd = fit_desc(5, &cb, 1);
    if (!m) return;
    fd.history = hist;
    r.stop_at_epoch = 1;
    r.stop_at_step = 2;
    OK(mp_model_fit(m, &fd), m);
    CHECK(strcmp(r.trace, "B[0........][1...]E") == 0);
    cb = recorder_callback(&r);
    r.stop_at_epoch = 0;
    OK(mp_model_fit(m, &fd), m);
    CHECK(strcmp(r.trace, "B[0........]E") == 0);
    mp_model_destroy(m);
}

/* A hook that fails ends fit with its status; on_train_end still runs,
   told so; the model's message names the hook. */
static void test_failing_hook(void) {
    mp_model *m = model();
    recorder r, second;
    mp_callback cbs[2];
    mp_fit_desc fd = fit_desc(5, cbs, 2);
    if (!m) return;
    cbs[0] = recorder_callback(&r);
    cbs[1] = recorder_callback(&second);
    r.stop_at_epoch = 1;
    r.fail_with = MP_ERR_IO;
    CHECK(mp_model_fit(m, &fd) == MP_ERR_IO);
    CHECK(strstr(mp_model_error(m), "callback 0's on_epoch_end") != NULL);
    CHECK(strcmp(r.trace, "B[0........][1........]E") == 0 && r.end_status == MP_ERR_IO);
    CHECK(strcmp(second.trace, "B[0........][1........E") == 0); /* no on_epoch_end after the failure */
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 2. CSVLogger and ProgbarLogger */

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    char *b = (char *)zalloc(1 << 16);
    if (f) {
        size_t n = fread(b, 1, (1 << 16) - 1, f);
        b[n] = '\0';
        fclose(f);
    }
    return b;
}

static void test_csv_logger(void) {
    char *p1 = path_in("fit.csv"), *p2 = path_in("cb.csv"), *a, *b;
    mp_model *m1 = model(), *m2 = model();
    mp_csv_logger csv;
    mp_callback cb;
    mp_fit_desc fd = fit_desc(2, NULL, 0);
    const char *header = "kind,epoch,step,loss,accuracy,val_loss,val_accuracy,loss_scale,skipped_steps\n";
    if (!m1 || !m2) return;
    fd.csv_path = p1;
    fd.csv_per_step = 1;
    OK(mp_model_fit(m1, &fd), m1);
    memset(&csv, 0, sizeof csv);
    csv.filename = p2;
    csv.per_step = 1;
    cb = mp_csv_logger_callback(&csv);
    fd = fit_desc(2, &cb, 1);
    OK(mp_model_fit(m2, &fd), m2);
    a = read_all(p1);
    b = read_all(p2);
    CHECK(strncmp(a, header, strlen(header)) == 0 && strlen(a) > 500);
    CHECK(strcmp(a, b) == 0); /* the same model and data: the same log */
    CHECK(csv.file == NULL);
    /* append: the rows follow, no second header */
    csv.append = 1;
    OK(mp_model_fit(m2, &fd), m2);
    free(b);
    b = read_all(p2);
    CHECK(strlen(b) > 2 * strlen(a) - strlen(header) - 4 && strstr(b + 1, "kind,") == NULL);
    /* a file that cannot be written: MP_ERR_IO before any step */
    csv.filename = "/nonexistent-directory/x.csv";
    CHECK(mp_model_fit(m2, &fd) == MP_ERR_IO && strstr(mp_model_error(m2), "x.csv") != NULL);
    csv.filename = NULL;
    CHECK(mp_model_fit(m2, &fd) == MP_ERR_NULL);
    remove(p1);
    remove(p2);
    free(a), free(b), free(p1), free(p2);
    mp_model_destroy(m1);
    mp_model_destroy(m2);
}

/* The progress lines, as fit's verbose LINES printed them: "Epoch 1/2",
   then "8/8 [==============================] - ... - loss: ... -
   val_accuracy: ...", through the public ProgbarLogger. */
static void test_progbar(void) {
    char *path = path_in("bar.txt"), *text;
    mp_model *m = model();
    mp_progbar_logger bar;
    mp_callback cb;
    mp_fit_desc fd;
    int saved = dup(1);
    FILE *f = NULL;
    if (!m) return;
    memset(&bar, 0, sizeof bar);
    bar.verbose = MP_VERBOSE_LINES;
    cb = mp_progbar_logger_callback(&bar);
    fd = fit_desc(2, &cb, 1);
    fflush(stdout);
    if ((f = fopen(path, "w")) != NULL && saved >= 0) {
        dup2(fileno(f), 1);
        OK(mp_model_fit(m, &fd), m);
        fflush(stdout);
        dup2(saved, 1);
        fclose(f);
    }
    if (saved >= 0) close(saved);
    text = read_all(path);
    {
        const char *head = "Epoch 1/2\n8/8 [==============================] - ";
        CHECK(strncmp(text, head, strlen(head)) == 0);
    }
    CHECK(strstr(text, "\nEpoch 2/2\n8/8 [") != NULL);
    CHECK(strstr(text, "/step - loss: ") && strstr(text, " - accuracy: ") && strstr(text, " - val_loss: ") &&
          strstr(text, " - val_accuracy: "));
    CHECK(strchr(text, '\r') == NULL); /* lines, not a live bar */
    remove(path);
    free(text), free(path);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 3. EarlyStopping */

static float falling(void *user, int epoch, float lr) {
    static const float r[] = {0.01f, 0.008f, 0.006f, 0.004f, 0.005f, 0.007f};
    (void)user, (void)lr;
    return r[epoch % 6];
}

static mp_early_stopping early(const char *monitor, int patience) {
    mp_early_stopping es;
    memset(&es, 0, sizeof es);
    es.monitor = monitor;
    es.patience = patience;
    return es;
}

static void test_early_stopping(void) {
    mp_model *m = model(), *ref = model();
    mp_early_stopping es = early("loss", 2);
    mp_callback cb = mp_early_stopping_callback(&es);
    mp_logs hist[10];
    mp_fit_desc fd = fit_desc(10, &cb, 1);
    float *w1, baseline = 0.0f;
    if (!m || !ref) return;
    fd.history = hist;
    /* min_delta larger than any gain: epoch 0 is the best (from none),
       epochs 1 and 2 do not improve, and with patience 2 fit stops there */
    es.min_delta = 100.0f;
    OK(mp_model_fit(m, &fd), m);
    CHECK(es.stopped_epoch == 2 && es.best_epoch == 0 && es.wait == 2 && hist[2].steps == STEPS);
    CHECK(es.best == hist[0].loss);
    /* restore_best_weights: the weights at the end of epoch 0 */
    mp_model_destroy(m);
    m = model();
    fd.epochs = 1;
    fd.callbacks = NULL;
    fd.callback_count = 0;
    OK(mp_model_fit(ref, &fd), ref);
    w1 = weights_of(ref);
    es = early("val_loss", 1);
    es.min_delta = 100.0f;
    es.restore_best_weights = 1;
    cb = mp_early_stopping_callback(&es);
    fd = fit_desc(10, &cb, 1);
    OK(mp_model_fit(m, &fd), m);
    CHECK(es.stopped_epoch == 1 && es.best_epoch == 0 && es.best_weights == NULL);
    CHECK(weights_equal(m, w1));
    /* a real improvement restarts the patience: val_accuracy (max, auto)
       on separable blobs climbs, with min_delta 0 stopping only at a plateau */
    es = early("val_accuracy", 0);
    cb = mp_early_stopping_callback(&es);
    fd = fit_desc(3, &cb, 1);
    fd.history = hist;
    OK(mp_model_fit(m, &fd), m);
    CHECK(es.best >= hist[0].val_accuracy && es.best_epoch >= 0);
    /* a baseline never beaten: improvements do not restart the patience.
       The monitored rate falls for four epochs, then rises */
    {
        mp_lr_scheduler sched;
        mp_callback two[2];
        int calls = 0;
        memset(&sched, 0, sizeof sched);
        sched.schedule = falling;
        sched.user = &calls;
        two[0] = mp_lr_scheduler_callback(&sched);
        es = early("learning_rate", 3);
        two[1] = mp_early_stopping_callback(&es);
        fd = fit_desc(6, two, 2);
        OK(mp_model_fit(m, &fd), m);
        CHECK(es.stopped_epoch == 0 && es.best_epoch == 3 && es.wait == 2); /* without a baseline: no stop */
        baseline = 0.0f; /* a rate never reaches 0 */
        es = early("learning_rate", 3);
        es.baseline = &baseline;
        two[1] = mp_early_stopping_callback(&es);
        OK(mp_model_fit(m, &fd), m);
        CHECK(es.stopped_epoch == 4 && es.best_epoch == 3 && es.wait == 5);
    }
    /* start_from_epoch: epochs before it are not monitored */
    es = early("loss", 0);
    es.min_delta = 100.0f;
    es.start_from_epoch = 2;
    cb = mp_early_stopping_callback(&es);
    fd = fit_desc(10, &cb, 1);
    OK(mp_model_fit(m, &fd), m);
    CHECK(es.best_epoch == 2 && es.stopped_epoch == 3);
    /* monitors fit does not log */
    es = early("val_loss", 0);
    cb = mp_early_stopping_callback(&es);
    fd = fit_desc(2, &cb, 1);
    fd.validation_split = 0.0f;
    CHECK(mp_model_fit(m, &fd) == MP_ERR_ARG && strstr(mp_model_error(m), "validation") != NULL);
    es = early("val_los", 0);
    cb = mp_early_stopping_callback(&es);
    fd = fit_desc(2, &cb, 1);
    CHECK(mp_model_fit(m, &fd) == MP_ERR_ARG && strstr(mp_model_error(m), "val_los'") != NULL);
    es = early(NULL, -1);
    cb = mp_early_stopping_callback(&es);
    CHECK(mp_model_fit(m, &fd) == MP_ERR_ARG);
    free(w1);
    mp_model_destroy(m);
    mp_model_destroy(ref);
}

/* ======================================================================== */
/* 4. ModelCheckpoint and LearningRateScheduler */

/* learning rates whose minimum improves at epochs 0, 1 and 3 */
static float rates(void *user, int epoch, float lr) {
    static const float r[] = {0.01f, 0.005f, 0.02f, 0.001f, 0.002f};
    (void)lr;
    ++*(int *)user;
    return r[epoch % 5];
}

static void test_model_checkpoint(void) {
    char *every = path_in("ck_{epoch:02d}.mpc"), *first = path_in("ck_01.mpc"), *third = path_in("ck_03.mpc");
    char *best = path_in("best.mpc"), *weights = path_in("w{epoch}.mpw"), *w2 = path_in("w2.mpw");
    mp_model *m = model(), *back = model();
    mp_model_checkpoint ck;
    mp_lr_scheduler sched;
    mp_callback cbs[2];
    mp_fit_desc fd = fit_desc(3, cbs, 1);
    unsigned char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    int calls = 0;
    FILE *f = NULL;
    if (!m || !back) return;
    memset(&ck, 0, sizeof ck);
    ck.filepath = every;
    cbs[0] = mp_model_checkpoint_callback(&ck);
    OK(mp_model_fit(m, &fd), m);
    CHECK(ck.saves == 3 && (f = fopen(first, "rb")) != NULL);
    if (f) fclose(f);
    /* the last one is the model as fit left it */
    OK(mp_model_load(back, third), back);
    if (OK(mp_model_save_to_memory(m, NULL, 0, &la), m) && OK(mp_model_save_to_memory(back, NULL, 0, &lb), back) &&
        la == lb) {
        a = (unsigned char *)zalloc(la), b = (unsigned char *)zalloc(lb);
        OK(mp_model_save_to_memory(m, a, la, &la), m);
        OK(mp_model_save_to_memory(back, b, lb, &lb), back);
        CHECK(memcmp(a, b, la) == 0);
    } else {
        CHECK(la == lb);
    }
    /* save_best_only on the learning rate (min): epochs 1, 2 and 4 improve */
    memset(&ck, 0, sizeof ck);
    ck.filepath = best;
    ck.monitor = "learning_rate";
    ck.save_best_only = 1;
    memset(&sched, 0, sizeof sched);
    sched.schedule = rates;
    sched.user = &calls;
    cbs[0] = mp_lr_scheduler_callback(&sched);
    cbs[1] = mp_model_checkpoint_callback(&ck);
    fd = fit_desc(5, cbs, 2);
    OK(mp_model_fit(m, &fd), m);
    CHECK(calls == 5 && ck.saves == 3 && ck.best == 0.001f);
    CHECK(mp_model_learning_rate(m) == 0.002f);
    OK(mp_model_load(back, best), back);
    CHECK(mp_model_learning_rate(back) == 0.001f); /* the rate of the epoch it was saved at */
    /* weights only: an inference-weights file, {epoch} without a width */
    memset(&ck, 0, sizeof ck);
    ck.filepath = weights;
    ck.save_weights_only = 1;
    cbs[0] = mp_model_checkpoint_callback(&ck);
    fd = fit_desc(2, cbs, 1);
    OK(mp_model_fit(m, &fd), m);
    OK(mp_model_import_weights(back, w2), back);
    {
        float *w = weights_of(m);
        CHECK(weights_equal(back, w));
        free(w);
    }
    CHECK(mp_model_load(back, w2) == MP_ERR_FORMAT);
    /* a save that fails ends fit with its status */
    ck.filepath = "/nonexistent-directory/x.mpc";
    CHECK(mp_model_fit(m, &fd) == MP_ERR_IO);
    ck.filepath = NULL;
    CHECK(mp_model_fit(m, &fd) == MP_ERR_NULL);
    remove(first), remove(third), remove(best), remove(w2);
    {
        char *second = path_in("ck_02.mpc"), *w1 = path_in("w1.mpw");
        remove(second), remove(w1);
        free(second), free(w1);
    }
    free(a), free(b);
    free(every), free(first), free(third), free(best), free(weights), free(w2);
    mp_model_destroy(m);
    mp_model_destroy(back);
}

static float nan_rate(void *user, int epoch, float lr) {
    (void)user, (void)epoch, (void)lr;
    return NAN;
}

static void test_lr_scheduler(void) {
    mp_model *m = model(), *scheduled;
    mp_lr_scheduler sched;
    mp_callback cb;
    mp_logs hist[5];
    mp_fit_desc fd;
    mp_optimizer_desc o;
    int calls = 0, i;
    if (!m) return;
    memset(&sched, 0, sizeof sched);
    sched.schedule = rates;
    sched.user = &calls;
    cb = mp_lr_scheduler_callback(&sched);
    fd = fit_desc(5, &cb, 1);
    fd.history = hist;
    OK(mp_model_fit(m, &fd), m);
    for (i = 0; i < 5; i++) CHECK(hist[i].learning_rate == rates(&calls, i, 0.0f));
    sched.schedule = nan_rate;
    CHECK(mp_model_fit(m, &fd) == MP_ERR_ARG);
    sched.schedule = NULL;
    CHECK(mp_model_fit(m, &fd) == MP_ERR_NULL);
    /* a schedule's rate cannot be set */
    memset(&o, 0, sizeof o);
    o.kind = MP_SGD;
    o.schedule.kind = MP_COSINE_DECAY;
    o.schedule.initial_learning_rate = 0.1f;
    o.schedule.decay_steps = 100;
    if ((scheduled = model_with("float32", o)) != NULL) {
        sched.schedule = rates;
        CHECK(mp_model_fit(scheduled, &fd) == MP_ERR_STATE);
        CHECK(mp_model_set_learning_rate(scheduled, 0.5f) == MP_ERR_STATE);
        mp_model_destroy(scheduled);
    }
    CHECK(mp_model_set_learning_rate(m, 0.0f) == MP_ERR_ARG);
    CHECK(mp_model_set_learning_rate(m, INFINITY) == MP_ERR_ARG);
    CHECK(mp_model_set_learning_rate(NULL, 0.1f) == MP_ERR_NULL);
    CHECK(mp_model_learning_rate(NULL) == 0.0f);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 5. The schedules: Keras's formulas, and the rate each step applies */

static void test_schedule_values(void) {
    mp_lr_schedule e, c;
    memset(&e, 0, sizeof e);
    e.kind = MP_EXPONENTIAL_DECAY;
    e.initial_learning_rate = 0.1f;
    e.decay_steps = 10;
    e.decay_rate = 0.96f;
    CHECK(mp_lr_schedule_value(&e, 0) == 0.1f);
    CHECK(fabs(mp_lr_schedule_value(&e, 25) - 0.1 * pow(0.96, 2.5)) < 1e-7);
    e.staircase = 1;
    CHECK(fabs(mp_lr_schedule_value(&e, 25) - 0.1 * 0.96 * 0.96) < 1e-7);
    CHECK(mp_lr_schedule_value(&e, 29) == mp_lr_schedule_value(&e, 20));
    memset(&c, 0, sizeof c);
    c.kind = MP_COSINE_DECAY;
    c.initial_learning_rate = 0.2f;
    c.decay_steps = 100;
    CHECK(mp_lr_schedule_value(&c, 0) == 0.2f);
    CHECK(fabs(mp_lr_schedule_value(&c, 50) - 0.1) < 1e-7);
    CHECK(fabs(mp_lr_schedule_value(&c, 25) - 0.2 * 0.5 * (1 + cos(3.141592653589793 / 4))) < 1e-7);
    CHECK(fabs(mp_lr_schedule_value(&c, 100)) < 1e-8 && mp_lr_schedule_value(&c, 1000) == mp_lr_schedule_value(&c, 100));
    c.alpha = 0.1f; /* the floor: a tenth of the initial rate */
    CHECK(fabs(mp_lr_schedule_value(&c, 100) - 0.02) < 1e-8 && fabs(mp_lr_schedule_value(&c, 50) - 0.2 * 0.55) < 1e-7);
    /* invalid schedules: 0, and compile refuses them */
    c.alpha = 2.0f;
    CHECK(mp_lr_schedule_value(&c, 1) == 0.0f);
    e.decay_steps = 0;
    CHECK(mp_lr_schedule_value(&e, 1) == 0.0f && mp_lr_schedule_value(NULL, 1) == 0.0f);
    {
        static const int shape[] = {F, 0};
        mp_layer_desc l = mp_dense(CLASSES, MP_SOFTMAX);
        mp_model *m = new_model("float32", shape, &l, 1);
        mp_compile_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
        cd.optimizer.schedule = e;
        CHECK(m && mp_model_compile(m, &cd) == MP_ERR_ARG && strstr(mp_model_error(m), "schedule") != NULL);
        mp_model_destroy(m);
    }
}

/* SGD without momentum under ExponentialDecay halving each step: each
   step moves the weights by the rate of its own step, lr(iteration). */
static void test_schedule_steps(void) {
    mp_optimizer_desc o;
    mp_model *m;
    size_t n, i, step;
    float *w0, *w1, *g;
    int worst_ok = 1;
    memset(&o, 0, sizeof o);
    o.kind = MP_SGD;
    o.schedule.kind = MP_EXPONENTIAL_DECAY;
    o.schedule.initial_learning_rate = 0.5f;
    o.schedule.decay_steps = 1;
    o.schedule.decay_rate = 0.5f;
    if (!(m = model_with("float32", o))) return;
    n = mp_model_param_count(m);
    w0 = floats(n), w1 = floats(n), g = floats(n);
    for (step = 0; step < 4; step++) {
        float lr = 0.5f / (float)(1u << step), loss;
        CHECK(mp_model_learning_rate(m) == lr);
        OK(mp_model_get_weights(m, w0, n), m);
        OK(forward_rows(m, xs, BATCH, 1), m);
        OK(loss_rows(m, ys, NULL, BATCH, &loss, NULL), m);
        OK(mp_compute_scaled_gradients(m), m);
        OK(mp_get_unscaled_gradients(m), m);
        OK(mp_get_gradients(m, g, n), m);
        OK(mp_apply_gradients(m, NULL), m);
        OK(mp_model_get_weights(m, w1, n), m);
        for (i = 0; i < n; i++) {
            float want = w0[i] - lr * g[i];
            worst_ok &= fabsf(w1[i] - want) <= 1e-6f * (fabsf(want) + 1e-3f);
        }
    }
    CHECK(worst_ok);
    CHECK(mp_model_learning_rate(m) == 0.5f / 16.0f);
    free(w0), free(w1), free(g);
    mp_model_destroy(m);
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/mp_callbacks_XXXXXX";
    size_t start = mp_get_memory_info().current;
    check_args(argc, argv);
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 2; }
    tmp_dir = dir;
    make_data();
    RUN(test_hook_order());
    RUN(test_stop_training());
    RUN(test_failing_hook());
    RUN(test_csv_logger());
    RUN(test_progbar());
    RUN(test_early_stopping());
    RUN(test_model_checkpoint());
    RUN(test_lr_scheduler());
    RUN(test_schedule_values());
    RUN(test_schedule_steps());
    rmdir(dir);
    CHECK(mp_get_memory_info().current == start); /* nothing leaked, best_weights included */
    return check_done("test_callbacks");
}
