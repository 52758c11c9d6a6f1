/* test_threads.c - two threads at once, each with objects of its own, as
   mixprec.h's GLOBAL STATE allows. Each job runs first on the main thread,
   for its reference, then twice over in two threads together, round after
   round; every result must equal its reference bit for bit, and the memory
   counters must come back to where they started after each round
   (counters updated without atomics lose updates when two threads
   allocate at once, and a debug build's free then asserts on them):
   1. products: mp_matmul on a pool of the job's own (1 or 2 threads) in
      every dtype, and on no pool, which makes and frees one inside each
      call (allocations, many of them);
   2. casts with their statistics (mp_convert), data over float16's edges;
   3. training: a model of the job's own under a policy of its own (named
      on each layer, not the global one), fit, its weights;
   4. checkpoints: mp_model_save to a path of the job's own, loaded into a
      new model.
   The threads check nothing themselves (the harness counts on one
   thread): each fills a result that main compares. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"

#define ROUNDS 4
#define NO_POOL_CALLS 200 /* products on no pool a job: a pool made and freed each */

/* >>the inputs, made once by main and only read after */
#define M 37
#define N 45
#define K 70
#define CASTS 20000
#define SAMPLES 96
#define FEATURES 12
#define CLASSES 3
static const mp_dtype dtypes[3] = {MP_FLOAT32, MP_FLOAT16, MP_BFLOAT16};
static uint32_t in_a[3][M * K], in_b[3][K * N]; /* A and B in each dtype (16-bit ones in the low bytes) */
static float in_wide[CASTS], in_x[SAMPLES * FEATURES];
static int32_t in_labels[SAMPLES];
static const char *tmp_dir;

static void make_inputs(void) {
    float a[M * K], b[K * N];
    size_t i;
    int d;
    for (i = 0; i < M * K; i++) a[i] = uniform(-1.0f, 1.0f);
    for (i = 0; i < K * N; i++) b[i] = uniform(-1.0f, 1.0f);
    for (d = 0; d < 3; d++) {
        CHECK(mp_convert(in_a[d], dtypes[d], a, MP_FLOAT32, M * K, NULL) == MP_OK);
        CHECK(mp_convert(in_b[d], dtypes[d], b, MP_FLOAT32, K * N, NULL) == MP_OK);
    }
    for (i = 0; i < CASTS; i++) /* magnitudes 2^-30 to 2^20: float16 underflows and overflows */
        in_wide[i] = ldexpf(uniform(1.0f, 2.0f), (int)(rng_next() % 50) - 30) * (i % 2 ? -1.0f : 1.0f);
    for (i = 0; i < SAMPLES * FEATURES; i++) in_x[i] = uniform(-1.0f, 1.0f);
    for (i = 0; i < SAMPLES; i++) in_labels[i] = (int32_t)(rng_next() % CLASSES);
}

/* >>a job: what one thread computes, and the first call that failed */
#define MAX_PARAMS 512
typedef struct job {
    int index;          /* 0 or 1: the pool's threads, the policy, the path */
    mp_status status;   /* MP_OK, or the first failure's */
    const char *failed; /* that call */
    float c[4][M * N];  /* the products: each dtype on the job's pool, float32 on no pool */
    uint16_t h[CASTS];  /* the wide data in float16 */
    mp_cast_stats stats;
    size_t params;
    float weights[MAX_PARAMS], loaded[MAX_PARAMS]; /* after fit; read back from the checkpoint */
} job;

static int did(job *j, mp_status st, const char *what) {
    if (st != MP_OK && j->status == MP_OK) j->status = st, j->failed = what;
    return st == MP_OK;
}

static void products(job *j) {
    mp_pool *pool = NULL;
    int d, r;
    if (!did(j, mp_pool_create(&pool, j->index + 1), "mp_pool_create")) return;
    for (d = 0; d < 3; d++)
        did(j, mp_matmul(pool, 0, 0, M, N, K, in_a[d], dtypes[d], in_b[d], dtypes[d], j->c[d], MP_FLOAT32),
            "mp_matmul");
    mp_pool_destroy(pool);
    for (r = 0; r < NO_POOL_CALLS; r++)
        did(j, mp_matmul(NULL, 0, 1, M, N, K, in_a[0], MP_FLOAT32, in_b[0], MP_FLOAT32, j->c[3], MP_FLOAT32),
            "mp_matmul, no pool");
}

static void casts(job *j) {
    memset(&j->stats, 0, sizeof j->stats);
    did(j, mp_convert(j->h, MP_FLOAT16, in_wide, MP_FLOAT32, CASTS, &j->stats), "mp_convert");
}

/* Dense(16, relu), Dense(3), softmax in float32, the first two under the
   job's policy; the model's pool has the job's thread count. */
static mp_model *new_job_model(job *j) {
    const char *policy = j->index ? "mixed_bfloat16" : "mixed_float16";
    mp_layer_desc layers[3];
    mp_model_desc md;
    mp_compile_desc cd;
    mp_model *m = NULL;
    int i;
    layers[0] = mp_dense(16, MP_RELU), layers[1] = mp_dense(CLASSES, MP_LINEAR);
    layers[2] = mp_activation_layer(MP_SOFTMAX);
    layers[0].dtype = layers[1].dtype = policy, layers[2].dtype = "float32";
    memset(&md, 0, sizeof md), memset(&cd, 0, sizeof cd);
    md.input_shape[0] = FEATURES, md.seed = 7, md.threads = j->index + 1;
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    if (!did(j, mp_model_create(&m, &md), "mp_model_create")) return NULL;
    for (i = 0; i < 3; i++)
        if (!did(j, mp_model_add(m, layers[i]), "mp_model_add")) break;
    if (i < 3 || !did(j, mp_model_compile(m, &cd), "mp_model_compile")) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

static void training(job *j) {
    char path[256];
    mp_fit_desc fd = silent_fit(in_x, FEATURES, in_labels, SAMPLES, 32, 2);
    mp_model *m = new_job_model(j), *back = NULL;
    if (!m) return;
    j->params = mp_model_param_count(m);
    snprintf(path, sizeof path, "%s/job%d.mpc", tmp_dir, j->index);
    if (j->params > MAX_PARAMS) did(j, MP_ERR_SIZE, "MAX_PARAMS");
    else if (did(j, mp_model_fit(m, &fd), "mp_model_fit") &&
             did(j, mp_model_get_weights(m, j->weights, j->params), "mp_model_get_weights") &&
             did(j, mp_model_save(m, path), "mp_model_save") && (back = new_job_model(j)) != NULL &&
             did(j, mp_model_load(back, path), "mp_model_load"))
        did(j, mp_model_get_weights(back, j->loaded, j->params), "mp_model_get_weights, loaded");
    unlink(path);
    mp_model_destroy(back);
    mp_model_destroy(m);
}

static void *run_job(void *arg) {
    job *j = (job *)arg;
    products(j);
    casts(j);
    training(j);
    return NULL;
}

static void fresh(job *j, int index) {
    memset(j, 0, sizeof *j);
    j->index = index;
}

/* >>the checks, on main's thread */
static void check_ran(const job *j) {
    if (!CHECK(j->status == MP_OK)) fprintf(stderr, "    job %d: %s: %s\n", j->index, j->failed, mp_status_name(j->status));
}

static void check_same(const job *got, const job *want) {
    CHECK(memcmp(got->c, want->c, sizeof got->c) == 0);
    CHECK(memcmp(got->h, want->h, sizeof got->h) == 0);
    CHECK(memcmp(&got->stats, &want->stats, sizeof got->stats) == 0);
    CHECK(got->params == want->params);
    CHECK(memcmp(got->weights, want->weights, sizeof got->weights) == 0);
    CHECK(memcmp(got->loaded, want->weights, sizeof got->loaded) == 0);
}

/* The reference jobs one after the other, then the same two at once. */
static void test_two_at_once(void) {
    static job want[2], got[2];
    size_t base = mp_get_memory_info().current, most = 0; /* the larger job's peak over base */
    int round, i;
    for (i = 0; i < 2; i++) {
        fresh(&want[i], i);
        mp_reset_peak_memory();
        run_job(&want[i]);
        check_ran(&want[i]);
        if (mp_get_memory_info().peak - base > most) most = mp_get_memory_info().peak - base;
    }
    CHECK(want[0].stats.overflow > 0 && want[0].stats.underflow > 0); /* the data reaches float16's edges */
    CHECK(want[0].params > 0 && want[0].params == want[1].params);
    CHECK(mp_get_memory_info().current == base);
    for (round = 0; round < ROUNDS; round++) {
        pthread_t thread[2];
        int started[2];
        mp_reset_peak_memory();
        for (i = 0; i < 2; i++) {
            fresh(&got[i], i);
            started[i] = pthread_create(&thread[i], NULL, run_job, &got[i]) == 0;
        }
        for (i = 0; i < 2; i++) {
            if (!CHECK(started[i])) continue;
            pthread_join(thread[i], NULL);
            check_ran(&got[i]);
            check_same(&got[i], &want[i]);
        }
        if (!CHECK(mp_get_memory_info().current == base))
            fprintf(stderr, "    round %d: %zu bytes counted, %zu before\n", round, mp_get_memory_info().current, base);
        CHECK(mp_get_memory_info().peak >= base + most); /* both jobs' blocks were live at once, at times */
    }
}

/* >>the global policy: one thread sets it, back and forth between
   bfloat16 and float16 (whose halves would mix into a pair of dtypes no
   policy has), while main reads it: every read is one of the two whole. */
#define POLICY_FLIPS 200000

static void *flip_policy(void *arg) {
    int i, *failures = (int *)arg;
    for (i = 0; i < POLICY_FLIPS; i++) *failures += mp_set_global_policy_name(i % 2 ? "float16" : "bfloat16") != MP_OK;
    return NULL;
}

static int same_policy(mp_policy a, mp_policy b) {
    return a.compute_dtype == b.compute_dtype && a.variable_dtype == b.variable_dtype;
}

static void test_policy_set_while_read(void) {
    mp_policy b16, f16, p;
    pthread_t setter;
    int i, torn = 0, failures = 0;
    CHECK(mp_policy_from_name("bfloat16", &b16) == MP_OK && mp_policy_from_name("float16", &f16) == MP_OK);
    CHECK(mp_set_global_policy(b16) == MP_OK);
    if (!CHECK(pthread_create(&setter, NULL, flip_policy, &failures) == 0)) return;
    for (i = 0; i < POLICY_FLIPS; i++) {
        p = mp_global_policy();
        torn += !same_policy(p, b16) && !same_policy(p, f16);
    }
    pthread_join(setter, NULL);
    CHECK(failures == 0);
    CHECK(torn == 0);
    CHECK(mp_set_global_policy_name("float32") == MP_OK); /* Keras's default, for what follows */
}

int main(int argc, char **argv) {
    char dir[] = "/tmp/mp_threads_XXXXXX";
    check_args(argc, argv);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 2;
    }
    tmp_dir = dir;
    make_inputs();
    RUN(test_two_at_once());
    RUN(test_policy_set_while_read());
    rmdir(dir);
    return check_done("test_threads");
}
