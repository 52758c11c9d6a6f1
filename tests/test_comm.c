/* test_comm.c - data-parallel training's semantics (>>communicator) without
   MPI: 2 and 3 "ranks" are forked processes, each with its own model, joined
   by a communicator over shared memory (a process-shared barrier; each sum
   adds the ranks' buffers in rank order, so every rank gets the same bits).
   It runs in every build. Checked: rank 0's initial weights on every rank
   whatever its seed; weights bit-identical on every rank after every epoch,
   and the global figures on every rank; 2 ranks at global batch 2B equal 1
   process at 2B within float32 summation tolerance, with the same accuracy,
   also when the global batch's tail leaves a rank no sample; an Inf on one
   rank makes every rank skip that step with the same weights, slots and
   halved scale; the 16-bit all-reduce keeps every rank's bits the same and
   stays near the float32 one; a checkpoint saved by 2 ranks resumes on 1 and on 3
   (rank 0's file sent to the others); only
   rank 0 writes CSV logs and checkpoints; a failing all-reduce is
   MP_ERR_COMM with the communicator's message; a bad table is refused;
   the gradients summed a piece at a time through the communicator's sum
   buffer give the bits of the whole-model sum; a residual graph with
   BatchNormalization keeps its trainable weights bit-identical on every
   rank and each rank's own moving statistics. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#define _DEFAULT_SOURCE         /* MAP_ANONYMOUS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"
#include "data_parallel.h"

/* ======================================================================== */
/* The communicator: forked ranks over one shared mapping */

#define MAXR 3
#define SLOT 65536 /* floats a rank can put through one collective */
#define MAXE 8     /* epochs a rank reports */

typedef struct rank_report {
    mp_status status;
    char error[256];
    model_state state;
    uint32_t epoch_crc[MAXE];
    float epoch_loss[MAXE], epoch_acc[MAXE], epoch_val[MAXE];
    int epochs_seen, applied, file_written, unchanged;
    mp_logs eval;
} rank_report;

typedef struct world {
    pthread_barrier_t barrier;
    int size;
    int fail_call; /* every rank's all-reduce number fail_call fails (0: none) */
    size_t piece;  /* bytes of the sum buffer (a rank's slot) it offers (0: none) */
    float slot[MAXR][SLOT];
    rank_report report[MAXR];
} world;

static world *W;

typedef struct tc_rank {
    int rank, calls;
} tc_rank;

static int tc_rank_of(void *ctx) { return ((tc_rank *)ctx)->rank; }
static int tc_size(void *ctx) { (void)ctx; return W->size; }
static mp_status tc_barrier(void *ctx) {
    (void)ctx;
    pthread_barrier_wait(&W->barrier);
    return MP_OK;
}
static mp_status tc_all_reduce_sum(void *ctx, float *buf, size_t n) {
    tc_rank *r = (tc_rank *)ctx;
    float *sum;
    size_t i;
    int k;
    if (++r->calls == W->fail_call) return MP_ERR_COMM; /* on every rank alike: nobody waits */
    if (n > SLOT) return MP_ERR_SIZE;
    if (buf != W->slot[r->rank]) memcpy(W->slot[r->rank], buf, n * sizeof(float)); /* else the sum buffer */
    sum = floats(n);
    tc_barrier(ctx);
    for (i = 0; i < n; i++)
        for (k = 0; k < W->size; k++) sum[i] += W->slot[k][i];
    tc_barrier(ctx);
    memcpy(buf, sum, n * sizeof(float));
    free(sum);
    return MP_OK;
}
/* The same in float16 or bfloat16: summed in float32 in rank order, rounded once. */
static mp_status tc_all_reduce_sum16(void *ctx, void *buf, mp_dtype dtype, size_t n) {
    float *wide;
    mp_status st;
    if (n > SLOT) return MP_ERR_SIZE;
    wide = floats(n);
    mp_convert(wide, MP_FLOAT32, buf, dtype, n, NULL);
    if ((st = tc_all_reduce_sum(ctx, wide, n)) == MP_OK) mp_convert(buf, dtype, wide, MP_FLOAT32, n, NULL);
    free(wide);
    return st;
}
static mp_status tc_broadcast(void *ctx, void *buf, size_t bytes, int root) {
    tc_rank *r = (tc_rank *)ctx;
    if (bytes > sizeof W->slot[0]) return MP_ERR_SIZE;
    if (r->rank == root) memcpy(W->slot[0], buf, bytes);
    tc_barrier(ctx);
    if (r->rank != root) memcpy(buf, W->slot[0], bytes);
    tc_barrier(ctx);
    return MP_OK;
}
static void *tc_sum_buffer(void *ctx, size_t *bytes) {
    *bytes = W->piece;
    return W->piece ? W->slot[((tc_rank *)ctx)->rank] : NULL;
}
static const char *tc_last_error(void *ctx) {
    return ((tc_rank *)ctx)->calls == W->fail_call ? "planted failure of the all-reduce" : "no error";
}

typedef void (*rank_fn)(const mp_communicator *comm, int rank, rank_report *out, const void *arg);

/* Runs fn on `size` forked ranks; each reports in W->report[rank]. */
static void run_ranks(int size, rank_fn fn, const void *arg) {
    pthread_barrierattr_t attr;
    pid_t pid[MAXR];
    int r, ok = 1;
    memset(W->report, 0, sizeof W->report);
    W->size = size;
    pthread_barrierattr_init(&attr);
    pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(&W->barrier, &attr, (unsigned)size);
    fflush(stdout);
    for (r = 0; r < size; r++) {
        if ((pid[r] = fork()) == 0) {
            tc_rank me = {0, 0};
            mp_communicator c;
            memset(&c, 0, sizeof c);
            me.rank = r;
            c.name = "shared-memory";
            c.ctx = &me;
            c.rank = tc_rank_of;
            c.size = tc_size;
            c.all_reduce_sum = tc_all_reduce_sum;
            c.broadcast = tc_broadcast;
            c.barrier = tc_barrier;
            c.last_error = tc_last_error;
            c.all_reduce_sum16 = tc_all_reduce_sum16;
            c.sum_buffer = tc_sum_buffer;
            fn(&c, r, &W->report[r], arg);
            fflush(stdout);
            _exit(0);
        }
    }
    for (r = 0; r < size; r++) {
        int status = 0;
        waitpid(pid[r], &status, 0);
        ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    CHECK(ok);
    pthread_barrier_destroy(&W->barrier);
    W->fail_call = 0;
}

/* ======================================================================== */
/* The fit every rank runs (the model and data: data_parallel.h) */

typedef struct setup {
    const char *policy;
    int batch, epochs, n, initial_epoch;
    float validation_split;
    const char *load, *save, *csv; /* paths, or NULL; csv gets the rank's number appended */
    mp_dtype allreduce_dtype;
    const mp_optimizer_desc *optimizer; /* rank_optimizer's options, or NULL: none */
} setup;

/* on_epoch_end: the rank's weights' CRC and the epoch's logs */
static mp_status epoch_report(void *user, mp_fit_state *s, const mp_logs *lg) {
    rank_report *out = (rank_report *)user;
    float w[MAXW];
    size_t n = mp_model_param_count(s->model);
    int e = out->epochs_seen++;
    if (e >= MAXE || n > MAXW) return MP_OK;
    mp_model_get_weights(s->model, w, n);
    out->epoch_crc[e] = crc_of(w, n * sizeof(float));
    out->epoch_loss[e] = lg->loss;
    out->epoch_acc[e] = lg->accuracy;
    out->epoch_val[e] = lg->val_loss;
    return MP_OK;
}

/* One rank: a model (loaded from st->load if set), fit, the report. */
static void fit_rank(const mp_communicator *comm, int rank, rank_report *out, const void *arg) {
    const setup *st = (const setup *)arg;
    mp_model *m;
    rank_allreduce_dtype = st->allreduce_dtype;
    if (st->optimizer) rank_optimizer = *st->optimizer;
    else memset(&rank_optimizer, 0, sizeof rank_optimizer);
    m = rank_model(comm, rank_seed(rank), st->policy);
    mp_fit_desc fd;
    mp_callback cb;
    mp_model_checkpoint ck;
    mp_callback cbs[2];
    char csv[256];
    if (!m) { out->status = MP_ERR_STATE; return; }
    /* only rank 0 names the file: load is collective and sends its bytes */
    if (st->load && (out->status = mp_model_load(m, rank ? "/nonexistent/absent.mpc" : st->load)) != MP_OK) goto done;
    memset(&fd, 0, sizeof fd);
    memset(&cb, 0, sizeof cb);
    memset(&ck, 0, sizeof ck);
    fd.data = data_xy(xs, NF, ys, (size_t)(st->n ? st->n : NS));
    fd.batch_size = st->batch;
    fd.epochs = st->epochs;
    fd.initial_epoch = st->initial_epoch;
    fd.validation_split = st->validation_split;
    fd.verbose = MP_VERBOSE_SILENT;
    cb.on_epoch_end = epoch_report;
    cb.user = out;
    cbs[0] = cb;
    fd.callbacks = cbs;
    fd.callback_count = 1;
    if (st->save) {
        ck.filepath = st->save;
        cbs[fd.callback_count++] = mp_model_checkpoint_callback(&ck);
    }
    if (st->csv) {
        snprintf(csv, sizeof csv, "%s%d.csv", st->csv, rank);
        fd.csv_path = csv;
    }
    out->status = mp_model_fit(m, &fd);
    if (out->status == MP_OK) out->status = mp_model_evaluate(m, &fd.data, 32, &out->eval);
    if (st->csv) {
        FILE *f = fopen(csv, "r");
        out->file_written = f != NULL;
        if (f) fclose(f);
    }
done:
    snprintf(out->error, sizeof out->error, "%s", mp_model_error(m));
    get_state(m, &out->state);
    mp_model_destroy(m);
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* Every rank ran, and holds rank 0's state bit for bit. */
static void check_ranks_agree(int size, int epochs) {
    const rank_report *r0 = &W->report[0];
    int r, e;
    for (r = 0; r < size; r++) {
        const rank_report *r1 = &W->report[r];
        if (!CHECK(r1->status == MP_OK)) fprintf(stderr, "    rank %d: %s\n", r, r1->error);
        CHECK(r1->epochs_seen == epochs);
        CHECK(r1->state.nw == r0->state.nw && same_bits(r1->state.w, r0->state.w, r0->state.nw));
        CHECK(r1->state.ns == r0->state.ns && same_bits(r1->state.s, r0->state.s, r0->state.ns));
        CHECK(r1->state.scale == r0->state.scale && r1->state.skipped == r0->state.skipped);
        for (e = 0; e < epochs && e < MAXE; e++) {
            CHECK_EQ(r1->epoch_crc[e], r0->epoch_crc[e]);
            CHECK(r1->epoch_loss[e] == r0->epoch_loss[e] && r1->epoch_acc[e] == r0->epoch_acc[e]);
            CHECK(r1->epoch_val[e] == r0->epoch_val[e]);
        }
        CHECK(r1->eval.loss == r0->eval.loss && r1->eval.accuracy == r0->eval.accuracy);
    }
}

/* ======================================================================== */
/* Tests */

static void init_rank(const mp_communicator *comm, int rank, rank_report *out, const void *arg) {
    mp_model *m = rank_model(comm, rank_seed(rank), (const char *)arg);
    out->status = m ? MP_OK : MP_ERR_STATE;
    if (m) get_state(m, &out->state);
    mp_model_destroy(m);
}

/* Every rank starts from rank 0's weights, whatever its seed. */
static void test_initial_weights(int size) {
    mp_model *alone = rank_model(NULL, rank_seed(0), "mixed_float16"), *other = rank_model(NULL, rank_seed(1), "mixed_float16");
    float w[MAXW], w1[MAXW];
    size_t n = mp_model_param_count(alone);
    int r;
    mp_model_get_weights(alone, w, n);
    mp_model_get_weights(other, w1, n);
    CHECK(!same_bits(w, w1, n)); /* the seeds do differ */
    run_ranks(size, init_rank, "mixed_float16");
    for (r = 0; r < size; r++) {
        CHECK(W->report[r].status == MP_OK);
        CHECK(W->report[r].state.nw == n && same_bits(W->report[r].state.w, w, n));
    }
    mp_model_destroy(alone);
    mp_model_destroy(other);
}

/* 3 epochs of n samples (0: NS) at global batch 32, a quarter to validate. */
static setup three_epochs(const char *policy, int n) {
    setup st;
    memset(&st, 0, sizeof st);
    st.policy = policy;
    st.batch = 32;
    st.epochs = 3;
    st.n = n;
    st.validation_split = 0.25f;
    return st;
}

/* Bit-identical weights after every epoch, global figures on every rank;
   against one process at the same global batch, within float32 sums. */
static void test_fit_matches_one_process(int size, const char *policy, int n) {
    setup st = three_epochs(policy, n);
    rank_report one;
    float tol = strcmp(policy, "float32") == 0 ? 1e-4f : 2e-2f;
    run_ranks(1, fit_rank, &st);
    one = W->report[0];
    CHECK(one.status == MP_OK && one.epochs_seen == 3);
    run_ranks(size, fit_rank, &st);
    check_ranks_agree(size, 3);
    if (!CHECK(rel_diff(W->report[0].state.w, one.state.w, one.state.nw) < tol))
        fprintf(stderr, "    %s: weights differ by %g\n", policy, (double)rel_diff(W->report[0].state.w, one.state.w, one.state.nw));
    CHECK(fabsf(W->report[0].eval.loss - one.eval.loss) < 10.0f * tol);
    CHECK(W->report[0].eval.accuracy == one.eval.accuracy);
    CHECK(fabsf(W->report[0].epoch_val[2] - one.epoch_val[2]) < 10.0f * tol);
    CHECK(W->report[0].state.scale == one.state.scale);
}

/* The optimizer's options over ranks: AdamW with the biases excluded
   from its decay, then either clipping by the global norm (of the ranks'
   sum: every rank clips alike) and accumulation over 2 steps, or
   clipvalue (which fit's step over ranks applies as each piece of the
   sum lands, mp__sum_into_update): bit-identical ranks, and one process
   at the same global batch within the summation's tolerance. */
static void test_options_match_one_process(int size, const char *policy, int by_value) {
    static const char *const biases[] = {"bias", NULL};
    mp_optimizer_desc o;
    setup st = three_epochs(policy, NS);
    rank_report one;
    memset(&o, 0, sizeof o);
    o.kind = MP_ADAMW;
    o.exclude_from_weight_decay = biases;
    if (by_value) o.clipvalue = 0.01f;
    else o.global_clipnorm = 0.05f, o.gradient_accumulation_steps = 2;
    st.optimizer = &o;
    run_ranks(1, fit_rank, &st);
    one = W->report[0];
    if (!CHECK(one.status == MP_OK && one.epochs_seen == 3)) fprintf(stderr, "    %s\n", one.error);
    run_ranks(size, fit_rank, &st);
    check_ranks_agree(size, 3);
    if (!CHECK(rel_diff(W->report[0].state.w, one.state.w, one.state.nw) < 2e-2f))
        fprintf(stderr, "    %s: weights differ by %g\n", policy, (double)rel_diff(W->report[0].state.w, one.state.w, one.state.nw));
}

/* The custom loop: rank 1's batch overflows float16 (a finite float32
   input, Inf once cast), so every rank skips the step alike. */
static void inf_rank(const mp_communicator *comm, int rank, rank_report *out, const void *arg) {
    mp_model *m = rank_model(comm, rank_seed(rank), "mixed_float16");
    float x[8 * NF], loss = 0.0f;
    int step;
    (void)arg;
    if (!m) { out->status = MP_ERR_STATE; return; }
    for (step = 0; step < 2; step++) { /* a good step, then the planted Inf */
        memcpy(x, xs + (size_t)(rank * 8) * NF, sizeof x);
        if (step == 1 && rank == 1) x[3] = 1e30f;
        if ((out->status = forward_rows(m, x, 8, 1)) != MP_OK ||
            (out->status = loss_rows(m, ys + rank * 8, NULL, 8, &loss, NULL)) != MP_OK ||
            (out->status = mp_compute_scaled_gradients(m)) != MP_OK ||
            (out->status = mp_get_unscaled_gradients(m)) != MP_OK)
            break;
        if (step == 1) get_state(m, &out->state); /* before the step */
        if ((out->status = mp_apply_gradients(m, &out->applied)) != MP_OK) break;
    }
    if (out->status == MP_OK) {
        float w[MAXW], s[MAXW];
        memcpy(w, out->state.w, sizeof w);
        memcpy(s, out->state.s, sizeof s);
        get_state(m, &out->state);
        out->unchanged = same_bits(w, out->state.w, out->state.nw) && same_bits(s, out->state.s, out->state.ns);
    }
    snprintf(out->error, sizeof out->error, "%s", mp_model_error(m));
    mp_model_destroy(m);
}

static void test_inf_on_one_rank(int size) {
    int r;
    run_ranks(size, inf_rank, NULL);
    for (r = 0; r < size; r++) {
        const rank_report *o = &W->report[r];
        if (!CHECK(o->status == MP_OK)) fprintf(stderr, "    rank %d: %s\n", r, o->error);
        CHECK(o->applied == 0);        /* skipped on every rank */
        CHECK(o->unchanged == 1);      /* weights and slots as before the step */
        CHECK(o->state.scale == 16384.0f);   /* 2^15 halved */
        CHECK(o->state.skipped == 1);
        CHECK(same_bits(o->state.w, W->report[0].state.w, o->state.nw));
        CHECK(same_bits(o->state.s, W->report[0].state.s, o->state.ns));
    }
}

/* Saved by 2 ranks (rank 0 writes), resumed on 1 and on 3: the resumed
   runs agree with the uninterrupted 2-rank run within float32 sums. */
static void test_resume_on_other_sizes(const char *dir) {
    char path[256];
    setup st;
    rank_report whole;
    int size;
    snprintf(path, sizeof path, "%s/dp.mpc", dir);
    memset(&st, 0, sizeof st);
    st.policy = "mixed_float16";
    st.batch = 24;
    st.epochs = 4;
    run_ranks(2, fit_rank, &st);
    whole = W->report[0];
    CHECK(whole.status == MP_OK);
    st.epochs = 2;
    st.save = path;
    run_ranks(2, fit_rank, &st);
    CHECK(W->report[0].status == MP_OK && W->report[1].status == MP_OK);
    st.save = NULL;
    st.load = path;
    st.epochs = 4;
    st.initial_epoch = 2;
    for (size = 1; size <= 3; size += 2) {
        run_ranks(size, fit_rank, &st);
        check_ranks_agree(size, 2);
        if (!CHECK(rel_diff(W->report[0].state.w, whole.state.w, whole.state.nw) < 2e-2f))
            fprintf(stderr, "    resumed on %d: %g\n", size, (double)rel_diff(W->report[0].state.w, whole.state.w, whole.state.nw));
        CHECK(W->report[0].state.scale == whole.state.scale);
    }
    remove(path);
}

/* The 16-bit all-reduce: every rank the same bits, near the float32 sum's
   run, the same loss scale. */
static void test_allreduce_16bit(int size, const char *policy, mp_dtype wire) {
    setup st = three_epochs(policy, 0);
    rank_report wide;
    run_ranks(size, fit_rank, &st);
    wide = W->report[0];
    st.allreduce_dtype = wire;
    run_ranks(size, fit_rank, &st);
    check_ranks_agree(size, 3);
    if (!CHECK(rel_diff(W->report[0].state.w, wide.state.w, wide.state.nw) < 5e-2f))
        fprintf(stderr, "    %g\n", (double)rel_diff(W->report[0].state.w, wide.state.w, wide.state.nw));
    CHECK(memcmp(W->report[0].state.w, wide.state.w, wide.state.nw * sizeof(float)) != 0); /* it did round */
    CHECK(W->report[0].state.scale == wide.state.scale);
    CHECK(fabsf(W->report[0].eval.accuracy - wide.eval.accuracy) <= 0.05f);
}

/* The communicator's sum buffer of 40 bytes (10 float32 or 20 16-bit
   values: pieces across the layers' bounds): the same bits as the
   whole-model sum on every rank, also where the batch's tail leaves a
   rank no sample (n 87), and an Inf on one rank skips alike. */
static void test_sum_buffer(int size, const char *policy, mp_dtype wire, int n) {
    setup st = three_epochs(policy, n);
    rank_report whole;
    st.allreduce_dtype = wire;
    run_ranks(size, fit_rank, &st);
    whole = W->report[0];
    W->piece = 40;
    run_ranks(size, fit_rank, &st);
    check_ranks_agree(size, 3);
    CHECK(whole.status == MP_OK && W->report[0].state.nw == whole.state.nw && W->report[0].state.nw > 40);
    CHECK(same_bits(W->report[0].state.w, whole.state.w, whole.state.nw));
    CHECK(same_bits(W->report[0].state.s, whole.state.s, whole.state.ns));
    CHECK(W->report[0].state.scale == whole.state.scale && W->report[0].eval.loss == whole.eval.loss);
    CHECK(memcmp(W->report[0].epoch_crc, whole.epoch_crc, sizeof whole.epoch_crc) == 0);
    if (size == 2) test_inf_on_one_rank(2);
    W->piece = 0;
}

/* Only rank 0 writes its CSV log. */
static void test_rank0_writes(const char *dir) {
    char base[256], path[300];
    setup st;
    snprintf(base, sizeof base, "%s/log", dir);
    memset(&st, 0, sizeof st);
    st.policy = "float32";
    st.batch = 32;
    st.epochs = 1;
    st.csv = base;
    run_ranks(2, fit_rank, &st);
    CHECK(W->report[0].status == MP_OK && W->report[0].file_written == 1);
    CHECK(W->report[1].status == MP_OK && W->report[1].file_written == 0);
    snprintf(path, sizeof path, "%s0.csv", base);
    remove(path);
}

/* A residual graph with BatchNormalization on each rank: the gradients
   (gamma's and beta's too) are summed, so the trainable weights stay
   bit-identical; each rank's moving statistics are its own batches'
   (Keras's default, synchronized=False), so they differ between ranks. */
static void bn_rank(const mp_communicator *comm, int rank, rank_report *out, const void *arg) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_fit_desc fd;
    mp_model *m = NULL;
    int h = 0, both[2];
    size_t nt;
    (void)arg;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = NF;
    md.seed = rank_seed(rank);
    md.threads = 1;
    md.comm = comm;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.optimizer.kind = MP_ADAM;
    mp_set_global_policy_name("mixed_bfloat16");
    out->status = mp_model_create(&m, &md);
    if (out->status == MP_OK) out->status = mp_model_call(m, mp_dense(NF, MP_RELU), NULL, 0, &h);
    if (out->status == MP_OK) out->status = mp_model_add(m, mp_batch_normalization());
    both[0] = h + 1, both[1] = h;
    if (out->status == MP_OK) out->status = mp_model_call(m, mp_add(), both, 2, NULL);
    if (out->status == MP_OK) out->status = mp_model_add(m, mp_dense(3, MP_SOFTMAX));
    if (out->status == MP_OK) out->status = mp_model_compile(m, &cd);
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(xs, NF, ys, NS);
    fd.batch_size = 32;
    fd.epochs = 2;
    fd.verbose = MP_VERBOSE_SILENT;
    if (out->status == MP_OK) out->status = mp_model_fit(m, &fd);
    get_state(m, &out->state);
    nt = mp_model_trainable_param_count(m);
    out->applied = (int)nt; /* where the moving statistics begin in get_weights' order: after the last Dense */
    snprintf(out->error, sizeof out->error, "%s", m ? mp_model_error(m) : "no model");
    mp_model_destroy(m);
}

static void test_batch_norm_per_replica(int size) {
    const rank_report *r0 = &W->report[0];
    int r;
    run_ranks(size, bn_rank, NULL);
    for (r = 0; r < size; r++) {
        const rank_report *r1 = &W->report[r];
        size_t stats = 2 * (size_t)NF, at = (size_t)NF * NF + NF + 2 * (size_t)NF; /* dense, then gamma and beta */
        if (!CHECK(r1->status == MP_OK)) {
            fprintf(stderr, "    rank %d: %s\n", r, r1->error);
            continue;
        }
        CHECK(r1->state.nw == r0->state.nw && r1->state.nw == (size_t)r1->applied + stats);
        /* every trainable weight the same bits; the moving statistics each rank's own */
        CHECK(same_bits(r1->state.w, r0->state.w, at));
        CHECK(same_bits(r1->state.w + at + stats, r0->state.w + at + stats, r0->state.nw - at - stats));
        if (r && !CHECK(!same_bits(r1->state.w + at, r0->state.w + at, stats)))
            fprintf(stderr, "    rank %d moving mean[0] %.9g, rank 0 %.9g\n", r, (double)r1->state.w[at], (double)r0->state.w[at]);
    }
}

/* ======================================================================== */
/* The GPT over ranks: Embedding, PositionEmbedding, LayerNormalization,
   causal MultiHeadAttention, the tanh GELU and a loss over (batch, time) */

/* A custom-loop step on the first global batch of 8, each rank its slice,
   where the last rank's token table is 1e30 (finite in float32, Inf once
   cast to float16): that rank's gradients are NaN, the others' finite, and
   every rank must skip the step alike (out->applied 0, out->unchanged 1:
   weights and slots as set). One process poisons its own table, so it
   skips the same step. Then the table as before. */
static void poisoned_step(mp_model *m, int rank, int size, rank_report *out) {
    float w[MAXW], set[MAXW], s[MAXW];
    size_t n = mp_model_param_count(m), ns = mp_optimizer_slot_count(m), i, at = (size_t)rank * (8 / (size_t)size) * GT;
    int shape = GT;
    float loss = 0.0f;
    mp_weight_info table;
    mp_data d;
    mp_array y = mp_array_i32(gpt_next + at, 8 / (size_t)size, 1, &shape);
    memset(&d, 0, sizeof d);
    d.x[0] = mp_array_i32(gpt_ids + at, 8 / (size_t)size, 1, &shape);
    if (n > MAXW || ns > MAXW || (out->status = mp_model_weight_info(m, 0, &table)) != MP_OK) return;
    mp_model_get_weights(m, w, n);
    mp_get_optimizer_slots(m, s, ns);
    memcpy(set, w, n * sizeof(float));
    if (rank == size - 1)
        for (i = 0; i < table.size; i++) set[table.offset + i] = 1e30f;
    if ((out->status = mp_model_set_weights(m, set, n)) != MP_OK || (out->status = mp_forward(m, &d, 1)) != MP_OK ||
        (out->status = mp_compute_loss(m, &y, &loss, NULL)) != MP_OK ||
        (out->status = mp_compute_scaled_gradients(m)) != MP_OK ||
        (out->status = mp_get_unscaled_gradients(m)) != MP_OK ||
        (out->status = mp_apply_gradients(m, &out->applied)) != MP_OK)
        return;
    get_state(m, &out->state);
    out->unchanged = strcmp(table.name, "embeddings") == 0 && same_bits(out->state.w, set, n) && same_bits(out->state.s, s, ns);
    out->status = mp_model_set_weights(m, w, n);
}

/* One rank: the poisoned step, then fit (gpt_fit) and evaluate, the report. */
static void gpt_rank(const mp_communicator *comm, int rank, rank_report *out, const void *arg) {
    mp_model *m = gpt_model(comm, rank_seed(rank));
    mp_callback cb;
    mp_fit_desc fd = gpt_fit(&cb);
    (void)arg;
    memset(&cb, 0, sizeof cb);
    cb.on_epoch_end = epoch_report;
    cb.user = out;
    if (!m) { out->status = MP_ERR_STATE; return; }
    poisoned_step(m, rank, W->size, out);
    if (out->status == MP_OK) out->status = mp_model_fit(m, &fd);
    if (out->status == MP_OK) out->status = mp_model_evaluate(m, &fd.data, 8, &out->eval);
    snprintf(out->error, sizeof out->error, "%s", mp_model_error(m));
    get_state(m, &out->state);
    mp_model_destroy(m);
}

/* rel_diff of two GPTs' weights but the attention's key bias: its
   gradient is zero but for rounding (softmax gives the same for every key
   shifted alike), and Adam scales that rounding up to steps of the
   learning rate, in one process or on ranks alike. */
static float gpt_diff(const float *a, const float *b, size_t n) {
    static float x[MAXW], y[MAXW];
    mp_model *m = gpt_model(NULL, rank_seed(0));
    mp_weight_info wi;
    int k, found = 0;
    memcpy(x, a, n * sizeof(float));
    memcpy(y, b, n * sizeof(float));
    for (k = 0; m && k < mp_model_weight_count(m); k++)
        if (mp_model_weight_info(m, k, &wi) == MP_OK && strcmp(wi.name, "key/bias") == 0 && wi.offset + wi.size <= n) {
            memset(x + wi.offset, 0, wi.size * sizeof(float));
            memset(y + wi.offset, 0, wi.size * sizeof(float));
            found = 1;
        }
    mp_model_destroy(m);
    return found ? rel_diff(x, y, n) : 1.0f;
}

/* The GPT on 2 ranks, each its slice of every batch: weights, slots,
   loss scale and skipped steps the same bits on both after every epoch,
   the step where one rank's gradients overflow skipped by both. Against
   one process at the same global batch: the same scale and skips, and
   the weights within float16 rounding (the summed gradients round in
   other places). */
static void test_gpt(void) {
    rank_report one;
    float d;
    int r;
    run_ranks(1, gpt_rank, NULL);
    one = W->report[0];
    if (!CHECK(one.status == MP_OK && one.epochs_seen == 3)) fprintf(stderr, "    %s\n", one.error);
    CHECK(one.applied == 0 && one.unchanged == 1);
    run_ranks(2, gpt_rank, NULL);
    check_ranks_agree(2, 3);
    for (r = 0; r < 2; r++) CHECK(W->report[r].applied == 0 && W->report[r].unchanged == 1);
    CHECK(one.state.skipped >= 1 && W->report[0].state.skipped == one.state.skipped);
    CHECK(W->report[0].state.scale == one.state.scale);
    if (!CHECK((d = gpt_diff(W->report[0].state.w, one.state.w, one.state.nw)) < 1e-3f))
        fprintf(stderr, "    weights differ by %g\n", (double)d);
    CHECK(fabsf(W->report[0].eval.loss - one.eval.loss) < 1e-2f);
}

/* A failing all-reduce: MP_ERR_COMM naming the collective and the
   communicator's own message. */
static void test_failing_all_reduce(void) {
    setup st;
    int r;
    memset(&st, 0, sizeof st);
    st.policy = "mixed_float16";
    st.batch = 32;
    st.epochs = 2;
    W->fail_call = 4;
    run_ranks(2, fit_rank, &st);
    for (r = 0; r < 2; r++) {
        CHECK(W->report[r].status == MP_ERR_COMM);
        if (!CHECK(strstr(W->report[r].error, "all-reduce") && strstr(W->report[r].error, "planted failure")))
            fprintf(stderr, "    %s\n", W->report[r].error);
    }
}

static int fake_rank(void *ctx) { return *(int *)ctx; }
static int fake_size(void *ctx) { (void)ctx; return 2; }

/* A table with a NULL member, a rank out of range, or device memory the
   CPU backend does not have: refused at create. */
static void test_bad_table(void) {
    mp_model_desc md;
    mp_communicator c;
    mp_model *m = NULL;
    int rank = 0;
    memset(&md, 0, sizeof md);
    memset(&c, 0, sizeof c);
    md.input_shape[0] = 4;
    md.comm = &c;
    c.ctx = &rank;
    c.rank = fake_rank;
    c.size = fake_size;
    CHECK(mp_model_create(&m, &md) == MP_ERR_NULL && m == NULL);
    c.all_reduce_sum = tc_all_reduce_sum;
    c.broadcast = tc_broadcast;
    c.barrier = tc_barrier;
    c.last_error = tc_last_error;
    rank = 2;
    CHECK(mp_model_create(&m, &md) == MP_ERR_ARG && m == NULL);
    rank = 0;
    c.device_memory = 1;
    CHECK(mp_model_create(&m, &md) == MP_ERR_ARG && m == NULL);
    c.device_memory = 0;
    md.allreduce_dtype = MP_FLOAT16; /* no 16-bit sum in the table */
    CHECK(mp_model_create(&m, &md) == MP_ERR_ARG && m == NULL);
    c.all_reduce_sum16 = tc_all_reduce_sum16;
    md.allreduce_dtype = (mp_dtype)7;
    CHECK(mp_model_create(&m, &md) == MP_ERR_ARG && m == NULL);
    md.allreduce_dtype = MP_BFLOAT16;
    CHECK(mp_model_create(&m, &md) == MP_OK && m != NULL);
    mp_model_destroy(m);
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/mixprec_comm_XXXXXX";
    check_args(argc, argv);
    W = (world *)mmap(NULL, sizeof(world), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (W == MAP_FAILED || !mkdtemp(dir)) {
        fprintf(stderr, "test_comm: no shared memory or temporary directory\n");
        return 2;
    }
    make_data();
    make_gpt_data();
    RUN(test_bad_table());
    RUN(test_initial_weights(2));
    RUN(test_initial_weights(3));
    RUN(test_fit_matches_one_process(2, "float32", NS));
    RUN(test_fit_matches_one_process(2, "mixed_float16", NS));
    RUN(test_fit_matches_one_process(3, "mixed_bfloat16", NS));
    RUN(test_fit_matches_one_process(3, "float32", 87)); /* 65 to train: the last global batch, 1 sample for 3 ranks */
    RUN(test_options_match_one_process(2, "mixed_float16", 0));
    RUN(test_options_match_one_process(3, "float32", 0));
    RUN(test_options_match_one_process(2, "mixed_bfloat16", 1));
    RUN(test_inf_on_one_rank(2));
    RUN(test_inf_on_one_rank(3));
    RUN(test_allreduce_16bit(2, "mixed_float16", MP_FLOAT16));
    RUN(test_allreduce_16bit(3, "mixed_bfloat16", MP_BFLOAT16));
    RUN(test_resume_on_other_sizes(dir));
    RUN(test_rank0_writes(dir));
    RUN(test_batch_norm_per_replica(2));
    RUN(test_gpt());
    RUN(test_failing_all_reduce());
    RUN(test_sum_buffer(2, "mixed_float16", MP_FLOAT32, NS));
    RUN(test_sum_buffer(3, "float32", MP_FLOAT32, 87));
    RUN(test_sum_buffer(2, "mixed_bfloat16", MP_BFLOAT16, NS));
    RUN(test_sum_buffer(3, "mixed_float16", MP_FLOAT16, NS));
    rmdir(dir);
    munmap(W, sizeof(world));
    return check_done("test_comm");
}
