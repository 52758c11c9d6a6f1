/* test_mpi.c - data-parallel training over Open MPI (mpi/mixprec_mpi.h);
   tests/mpi.sh runs it under mpirun. Built with mpicc. Modes:
     train        (2 or 3 ranks) rank 0's initial weights on every rank;
                  weights bit-identical on every rank after every epoch
                  under each policy, and the same logs; N ranks at per-rank
                  batch B against one process at N B (float32 sums' tolerance,
                  the same accuracy); an Inf on one rank: every rank skips
                  the step with the same weights, slots and halved scale;
                  the gradients summed in float16 and bfloat16 (the same
                  bits on every rank, near the one process); the sums in
                  the ranks' shared memory, a piece at a time, against
                  MPI's own (the same bits on 2 ranks); fit, which
                  updates from each piece of the sum, against the custom
                  loop, which sums into g first (the same bits); the
                  GPT of examples/gpt_model.h: the same bits on every rank
     save DIR     (2 ranks) fit 2 epochs, rank 0's ModelCheckpoint writes
                  DIR/dp.mpc (only rank 0 writes its CSV log), then to 4
                  epochs: DIR/whole.bin has the final weights and scale;
                  the file calls are collective: rank 0's path alone is
                  written and read, and every rank gets rank 0's outcome
     resume DIR   (any number) from DIR/dp.mpc to 4 epochs: the same on
                  every rank, and as DIR/whole.bin within tolerance (only
                  rank 0 names the file: no shared file system needed)
     die          rank 1 exits in the middle of an epoch (mpirun ends the job)
     fail         rank 1's all-reduce fails: it prints the model's error
                  and ends the job with mp_mpi_abort
   The tally (`test_mpi: N passed, N failed`) is the sum over the ranks,
   printed by rank 0. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#define MIXPREC_MPI_IMPLEMENTATION
#include "../mpi/mixprec_mpi.h"
#include "check.h"
#include "helpers.h"
#include "data_parallel.h"

static mp_mpi C;

/* This rank's model (rank 0's seed without a communicator: the reference);
   a failure ends the job. */
static mp_model *my_model(const mp_communicator *comm, const char *policy) {
    mp_model *m = rank_model(comm, rank_seed(comm ? C.rank : 0), policy);
    if (!m) {
        fprintf(stderr, "test_mpi: rank %d cannot make its model\n", C.rank);
        mp_mpi_abort(&C, 2);
    }
    return m;
}

/* 1 on every rank when every rank holds the same bytes. */
static int same_on_all(const void *p, size_t bytes) {
    unsigned crc = crc_of(p, bytes), lo = crc, hi = crc;
    MPI_Allreduce(&crc, &lo, 1, MPI_UNSIGNED, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&crc, &hi, 1, MPI_UNSIGNED, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

/* on_epoch_end: the weights and the epoch's logs are the same everywhere */
static mp_status epoch_check(void *user, mp_fit_state *s, const mp_logs *lg) {
    model_state st;
    float logs[4];
    (void)user;
    get_state(s->model, &st);
    logs[0] = lg->loss, logs[1] = lg->accuracy, logs[2] = lg->val_loss, logs[3] = lg->val_accuracy;
    CHECK(same_on_all(st.w, st.nw * sizeof(float)));
    CHECK(same_on_all(st.s, st.ns * sizeof(float)));
    CHECK(same_on_all(logs, sizeof logs));
    return MP_OK;
}

/* on_batch_end of the die mode: rank 1 leaves in the middle of epoch 2 */
static mp_status batch_die(void *user, mp_fit_state *s, const mp_logs *lg) {
    (void)user;
    (void)lg;
    if (C.rank == 1 && s->epoch == 1 && s->step == 1) {
        fprintf(stderr, "test_mpi: rank 1 exits on purpose\n");
        _exit(3);
    }
    return MP_OK;
}

static mp_status fit(mp_model *m, int batch, int initial_epoch, int epochs, mp_callback *extra, int n_extra,
                     const char *csv) {
    mp_fit_desc fd = silent_fit(xs, NF, ys, NS, batch, epochs);
    mp_callback cbs[4];
    memset(cbs, 0, sizeof cbs);
    cbs[0].on_epoch_end = epoch_check;
    if (n_extra) memcpy(cbs + 1, extra, (size_t)n_extra * sizeof *extra);
    fd.initial_epoch = initial_epoch;
    fd.validation_split = 0.25f;
    fd.callbacks = cbs;
    fd.callback_count = 1 + n_extra;
    fd.csv_path = csv;
    return mp_model_fit(m, &fd);
}

/* ======================================================================== */

static void test_initial_weights(void) {
    mp_model *m = my_model(&C.table, "mixed_float16");
    mp_model *zero = my_model(NULL, "mixed_float16");
    model_state a, b;
    get_state(m, &a);
    get_state(zero, &b);
    CHECK(same_on_all(a.w, a.nw * sizeof(float)));
    CHECK(a.nw == b.nw && memcmp(a.w, b.w, a.nw * sizeof(float)) == 0); /* rank 0's seed's */
    mp_model_destroy(m);
    mp_model_destroy(zero);
}

/* Per-rank batch 16 on N ranks against one process at 16 N; the gradients
   summed in `wire` (a 16-bit sum rounds: a looser tolerance). */
static void test_ranks_match_one_process(const char *policy, mp_dtype wire) {
    mp_model *m, *one = my_model(NULL, policy);
    mp_data d = data_xy(xs, NF, ys, NS);
    mp_logs a, b;
    model_state sa, sb;
    float tol = wire != MP_FLOAT32 ? 5e-2f : strcmp(policy, "float32") == 0 ? 1e-4f : 2e-2f;
    rank_allreduce_dtype = wire;
    m = my_model(&C.table, policy);
    rank_allreduce_dtype = MP_FLOAT32;
    OK(fit(m, 16 * C.size, 0, 3, NULL, 0, NULL), m);
    OK(fit(one, 16 * C.size, 0, 3, NULL, 0, NULL), one);
    OK(mp_model_evaluate(m, &d, 32, &a), m);
    OK(mp_model_evaluate(one, &d, 32, &b), one);
    get_state(m, &sa);
    get_state(one, &sb);
    if (!CHECK(rel_diff(sa.w, sb.w, sa.nw) < tol))
        fprintf(stderr, "    %s: %g\n", policy, (double)rel_diff(sa.w, sb.w, sa.nw));
    CHECK(wire != MP_FLOAT32 ? fabsf(a.accuracy - b.accuracy) <= 0.05f : a.accuracy == b.accuracy);
    CHECK(fabsf(a.loss - b.loss) < 10.0f * tol);
    CHECK(sa.scale == sb.scale);
    mp_model_destroy(m);
    mp_model_destroy(one);
}

/* The custom loop: rank 1's input overflows float16 at the second step. */
static void test_inf_on_one_rank(void) {
    mp_model *m = my_model(&C.table, "mixed_float16");
    float x[8 * NF], loss = 0.0f;
    int step, applied = -1;
    model_state before, after;
    for (step = 0; step < 2; step++) {
        memcpy(x, xs + (size_t)(C.rank * 8) * NF, sizeof x);
        if (step == 1 && C.rank == 1) x[3] = 1e30f; /* finite in float32, Inf in float16 */
        OK(forward_rows(m, x, 8, 1), m);
        OK(loss_rows(m, ys + C.rank * 8, NULL, 8, &loss, NULL), m);
        OK(mp_compute_scaled_gradients(m), m);
        OK(mp_get_unscaled_gradients(m), m);
        if (step == 1) get_state(m, &before);
        OK(mp_apply_gradients(m, &applied), m);
    }
    get_state(m, &after);
    CHECK(applied == 0);
    CHECK(memcmp(before.w, after.w, after.nw * sizeof(float)) == 0);
    CHECK(memcmp(before.s, after.s, after.ns * sizeof(float)) == 0);
    CHECK(after.scale == 16384.0f && after.skipped == 1);
    CHECK(same_on_all(after.w, after.nw * sizeof(float)));
    CHECK(same_on_all(after.s, after.ns * sizeof(float)));
    mp_model_destroy(m);
}

/* The sums in the shared window (mp_mpi's sum buffer: 200,003 weights go
   through it in several pieces) against MPI's own (the table without
   sum_buffer): the same bits on 2 ranks, where both add two numbers once;
   on 3 within the sums' rounding (MPI_Reduce adds in its own order, and
   rounds a 16-bit sum at each addition where the window rounds once). */
static void test_window_matches_mpi(const char *policy, mp_dtype wire) {
    mp_communicator plain = C.table;
    mp_fit_desc fd = silent_fit(xs, NF, ys, NS, 16 * C.size, 2);
    mp_model *a, *b;
    float *wa, *wb, tol = wire != MP_FLOAT32 ? 5e-2f : 1e-4f;
    size_t n;
    plain.sum_buffer = NULL;
    CHECK(C.shared != NULL); /* one machine: the window is there */
    rank_units = 20000;
    rank_allreduce_dtype = wire;
    a = my_model(&C.table, policy);
    b = my_model(&plain, policy);
    rank_units = 16;
    rank_allreduce_dtype = MP_FLOAT32;
    OK(mp_model_fit(a, &fd), a); /* not fit(): its check's snapshot holds MAXW weights */
    OK(mp_model_fit(b, &fd), b);
    n = mp_model_param_count(a);
    wa = floats(n);
    wb = floats(n);
    OK(mp_model_get_weights(a, wa, n), a);
    OK(mp_model_get_weights(b, wb, n), b);
    CHECK(same_on_all(wa, n * sizeof(float)) && same_on_all(wb, n * sizeof(float)));
    if (C.size == 2) CHECK(memcmp(wa, wb, n * sizeof(float)) == 0);
    else if (!CHECK(rel_diff(wa, wb, n) < tol)) fprintf(stderr, "    %s: %g\n", policy, (double)rel_diff(wa, wb, n));
    CHECK(mp_current_loss_scale(a) == mp_current_loss_scale(b));
    free(wa);
    free(wb);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

static int same_state(const model_state *a, const model_state *b) {
    return a->nw == b->nw && a->ns == b->ns && memcmp(a->w, b->w, a->nw * sizeof(float)) == 0 &&
           memcmp(a->s, b->s, a->ns * sizeof(float)) == 0 && a->scale == b->scale && a->skipped == b->skipped;
}

/* fit's step updates from each piece of the ranks' sum as it lands where
   the found-Inf flag can be agreed first (mp_get_gradients has nothing
   after it); the custom loop sums into the float32 gradients, then
   applies: the same bits, on every rank, with the scale growing every
   step and an Inf on the last rank at the second step (skipped alike
   under mixed_float16). A min_scale below 1 keeps fit on the custom
   loop's path (`as_summed` 0). */
static void test_fit_is_the_custom_loop(const char *policy, mp_dtype wire, float min_scale, int as_summed) {
    enum { EACH = 16, EPOCHS = 2 };
    size_t global = (size_t)EACH * (size_t)C.size, planted = global + global - EACH + 2, s, n;
    mp_fit_desc fd;
    mp_model *a, *b;
    model_state sa, sb;
    float x[NS * NF], loss, *g;
    int epoch;
    memcpy(x, xs, sizeof x);
    x[planted * NF + 3] = 1e30f; /* finite in float32, Inf in float16 */
    fd = silent_fit(x, NF, ys, NS, (int)global, EPOCHS);
    fd.no_shuffle = 1;
    rank_allreduce_dtype = wire;
    rank_loss_scale.growth_interval = 1;
    rank_loss_scale.min_scale = min_scale;
    a = my_model(&C.table, policy);
    b = my_model(&C.table, policy);
    rank_allreduce_dtype = MP_FLOAT32;
    memset(&rank_loss_scale, 0, sizeof rank_loss_scale);
    OK(mp_model_fit(a, &fd), a);
    for (epoch = 0; epoch < EPOCHS; epoch++)
        for (s = 0; s < NS; s += global) { /* NS is a whole number of global batches */
            size_t lo = s + (size_t)C.rank * EACH;
            OK(forward_rows(b, x + lo * NF, EACH, 1), b);
            OK(loss_rows(b, ys + lo, NULL, EACH, &loss, NULL), b);
            OK(mp_compute_scaled_gradients(b), b);
            OK(mp_get_unscaled_gradients(b), b);
            OK(mp_apply_gradients(b, NULL), b);
        }
    get_state(a, &sa);
    get_state(b, &sb);
    if (!CHECK(same_state(&sa, &sb))) fprintf(stderr, "    %s: fit and the custom loop differ\n", policy);
    CHECK(same_on_all(sa.w, sa.nw * sizeof(float)) && same_on_all(sa.s, sa.ns * sizeof(float)));
    CHECK(!mp_model_loss_scale(a) || strcmp(policy, "mixed_float16") != 0 || sa.skipped >= 1);
    n = mp_model_param_count(a);
    g = floats(n);
    CHECK((mp_get_gradients(a, g, n) == MP_ERR_STATE) == as_summed);
    free(g);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* The diagnostics on rank 0 alone (each rank's own): fit's ranks agree to
   sum into the float32 gradients first, and nothing waits for a
   collective the others skip (tests/mpi.sh bounds the run). */
static void test_diagnostics_on_rank_0(void) {
    mp_model *m = my_model(&C.table, "mixed_float16");
    mp_numerics_desc nd;
    model_state st;
    float *g;
    size_t n = mp_model_param_count(m);
    memset(&nd, 0, sizeof nd);
    nd.every = 2;
    if (C.rank == 0) OK(mp_model_set_numerics(m, &nd), m);
    OK(fit(m, 16 * C.size, 0, 2, NULL, 0, NULL), m);
    get_state(m, &st);
    CHECK(same_on_all(st.w, st.nw * sizeof(float)) && same_on_all(st.s, st.ns * sizeof(float)));
    g = floats(n);
    CHECK(mp_get_gradients(m, g, n) == MP_OK); /* summed into g on every rank */
    CHECK(C.rank != 0 || mp_model_numerics_step(m) > 0);
    free(g);
    mp_model_destroy(m);
}

/* The GPT (data_parallel.h) under mixed_float16, fit by gpt_fit: the
   same weights, slots and logs on every rank after every epoch, the same
   loss scale and skipped steps. */
static void test_gpt(void) {
    mp_model *m = gpt_model(&C.table, rank_seed(C.rank));
    mp_callback cb;
    mp_fit_desc fd = gpt_fit(&cb);
    model_state st;
    if (!m) {
        fprintf(stderr, "test_mpi: rank %d cannot make its GPT\n", C.rank);
        mp_mpi_abort(&C, 2);
    }
    memset(&cb, 0, sizeof cb);
    cb.on_epoch_end = epoch_check;
    OK(mp_model_fit(m, &fd), m);
    get_state(m, &st);
    CHECK(same_on_all(&st.scale, sizeof st.scale) && same_on_all(&st.skipped, sizeof st.skipped));
    mp_model_destroy(m);
}

static void train(void) {
    RUN(test_initial_weights());
    RUN(test_ranks_match_one_process("float32", MP_FLOAT32));
    RUN(test_ranks_match_one_process("mixed_float16", MP_FLOAT32));
    RUN(test_ranks_match_one_process("mixed_bfloat16", MP_FLOAT32));
    RUN(test_ranks_match_one_process("mixed_float16", MP_FLOAT16));
    RUN(test_ranks_match_one_process("mixed_bfloat16", MP_BFLOAT16));
    RUN(test_inf_on_one_rank());
    RUN(test_window_matches_mpi("mixed_float16", MP_FLOAT32));
    RUN(test_window_matches_mpi("mixed_bfloat16", MP_BFLOAT16));
    RUN(test_fit_is_the_custom_loop("mixed_float16", MP_FLOAT32, 0.0f, 1));
    RUN(test_fit_is_the_custom_loop("mixed_float16", MP_FLOAT16, 0.0f, 1));
    RUN(test_fit_is_the_custom_loop("mixed_bfloat16", MP_BFLOAT16, 0.0f, 1));
    RUN(test_fit_is_the_custom_loop("float32", MP_FLOAT32, 0.0f, 1));
    RUN(test_fit_is_the_custom_loop("mixed_float16", MP_FLOAT32, 0.5f, 0));
    RUN(test_diagnostics_on_rank_0());
    RUN(test_gpt());
}

static void path_in(char *out, size_t cap, const char *dir, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

/* Each rank names a file of its own: rank 0's is written and read, and a
   failure there is every rank's, the model unchanged. */
static void test_file_calls_are_rank_0s(mp_model *m, const char *dir) {
    char mine[512], nowhere[512];
    model_state before, after;
    snprintf(mine, sizeof mine, "%s/own_rank%d.mpc", dir, C.rank);
    snprintf(nowhere, sizeof nowhere, "%s/no/such/dir/rank%d.mpc", dir, C.rank);
    get_state(m, &before);
    OK(mp_model_save(m, mine), m);
    CHECK((access(mine, F_OK) == 0) == (C.rank == 0));
    OK(mp_model_export_weights(m, MP_FLOAT32, mine), m); /* float32: importing them changes nothing */
    CHECK(mp_model_load(m, C.rank ? nowhere : mine) == MP_ERR_FORMAT); /* weights, not a checkpoint: on every rank */
    OK(mp_model_import_weights(m, C.rank ? nowhere : mine), m);
    OK(mp_model_save(m, mine), m);
    OK(mp_model_load(m, C.rank ? nowhere : mine), m);
    get_state(m, &after);
    CHECK(same_on_all(after.w, after.nw * sizeof(float)));
    CHECK(mp_model_save(m, C.rank ? mine : nowhere) == MP_ERR_IO);
    CHECK(C.rank == 0 || strstr(mp_model_error(m), "rank 0 could not save") != NULL);
    CHECK(mp_model_load(m, C.rank ? mine : nowhere) == MP_ERR_IO);
    CHECK(C.rank == 0 || strstr(mp_model_error(m), "rank 0 could not read") != NULL);
    get_state(m, &before);
    CHECK(same_state(&before, &after));
    remove(mine);
}

static void save(const char *dir) {
    mp_model *m = my_model(&C.table, "mixed_float16");
    mp_model_checkpoint ck;
    mp_callback cb;
    char path[512], csv[512], whole[512];
    model_state st;
    FILE *f;
    memset(&ck, 0, sizeof ck);
    path_in(path, sizeof path, dir, "dp.mpc");
    path_in(whole, sizeof whole, dir, "whole.bin");
    snprintf(csv, sizeof csv, "%s/log_rank%d.csv", dir, C.rank);
    ck.filepath = path;
    cb = mp_model_checkpoint_callback(&ck);
    OK(fit(m, 24, 0, 2, &cb, 1, csv), m);
    CHECK((access(csv, F_OK) == 0) == (C.rank == 0)); /* rank 0 alone writes */
    RUN(test_file_calls_are_rank_0s(m, dir));
    OK(fit(m, 24, 2, 4, NULL, 0, NULL), m);
    get_state(m, &st);
    if (C.rank == 0 && CHECK((f = fopen(whole, "wb")) != NULL)) {
        CHECK(fwrite(&st, sizeof st, 1, f) == 1);
        CHECK(fclose(f) == 0);
    }
    mp_model_destroy(m);
}

static void resume(const char *dir) {
    mp_model *m = my_model(&C.table, "mixed_float16");
    char path[512], whole[512];
    model_state st, ref;
    FILE *f;
    path_in(path, sizeof path, dir, C.rank ? "absent.mpc" : "dp.mpc"); /* rank 0's file, sent to the others */
    path_in(whole, sizeof whole, dir, "whole.bin");
    OK(mp_model_load(m, path), m);
    OK(fit(m, 24, 2, 4, NULL, 0, NULL), m);
    get_state(m, &st);
    memset(&ref, 0, sizeof ref);
    if (CHECK((f = fopen(whole, "rb")) != NULL)) {
        CHECK(fread(&ref, sizeof ref, 1, f) == 1);
        fclose(f);
    }
    CHECK(st.nw == ref.nw && st.scale == ref.scale);
    if (!CHECK(rel_diff(st.w, ref.w, st.nw) < 2e-2f)) fprintf(stderr, "    %g\n", (double)rel_diff(st.w, ref.w, st.nw));
    mp_model_destroy(m);
}

static void die(void) {
    mp_model *m = my_model(&C.table, "mixed_float16");
    mp_callback cb;
    memset(&cb, 0, sizeof cb);
    cb.on_batch_end = batch_die;
    OK(fit(m, 16, 0, 3, &cb, 1, NULL), m);
    mp_model_destroy(m);
}

/* rank 1's all-reduce fails at its 5th call */
static int calls;
static mp_status failing_sum(void *ctx, float *buf, size_t n) {
    (void)ctx, (void)buf, (void)n;
    if (++calls == 5) {
        snprintf(C.error, sizeof C.error, "planted failure");
        return MP_ERR_COMM;
    }
    return C.table.all_reduce_sum(&C, buf, n);
}

static void fail(void) {
    mp_communicator mine = C.table;
    mp_model *m;
    mp_status st;
    if (C.rank == 1) mine.all_reduce_sum = failing_sum;
    m = my_model(&mine, "mixed_float16");
    if ((st = fit(m, 16, 0, 3, NULL, 0, NULL)) != MP_OK) {
        fprintf(stderr, "test_mpi: rank %d: %s: %s\n", C.rank, mp_status_name(st), mp_model_error(m));
        mp_mpi_abort(&C, 3);
    }
    mp_model_destroy(m);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "train", *dir = argc > 2 ? argv[2] : ".";
    unsigned long mine[2], sum[2];
    MPI_Init(&argc, &argv);
    if (mp_mpi_init(&C, MPI_COMM_WORLD) != MP_OK) {
        fprintf(stderr, "test_mpi: %s\n", C.error);
        mp_mpi_abort(&C, 2);
    }
    (void)check_args, (void)check_done; /* the mode is no test name; the tally is the ranks' sum */
    make_data();
    make_gpt_data();
    if (strcmp(mode, "train") == 0) train();
    else if (strcmp(mode, "save") == 0) save(dir);
    else if (strcmp(mode, "resume") == 0) resume(dir);
    else if (strcmp(mode, "die") == 0) die();
    else if (strcmp(mode, "fail") == 0) fail();
    else { fprintf(stderr, "test_mpi: unknown mode %s\n", mode); mp_mpi_abort(&C, 2); }
    mine[0] = check_passed, mine[1] = check_failed;
    MPI_Reduce(mine, sum, 2, MPI_UNSIGNED_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    if (C.rank == 0) printf("test_mpi: %s on %d ranks\ntest_mpi: %lu passed, %lu failed\n", mode, C.size, sum[0], sum[1]);
    return C.rank == 0 ? sum[1] != 0 : 0;
}
