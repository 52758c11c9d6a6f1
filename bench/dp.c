/* bench/dp.c - data-parallel training's speed over MPI (mpi/mixprec_mpi.h):
   the guide's MLP 784-U-U-10 (U = 1024: 1,863,690 float32 gradients, 7.45 MB
   all-reduced a step), RMSprop, mixed_float16, fit on synthetic data. Rank
   0 prints one line per run:
       bench=dp ranks= threads_per_rank= per_rank_batch= global_batch= units= policy=
            steps= images_per_s= ms_per_step= allreduce_ms_per_step= allreduce_share=
            bytes_per_step_per_rank= load1= cpu=
   --steps S times S steps (300: long enough that a
   neighbour's burst on a shared host moves the figure little);
   --allreduce float16|bfloat16 sums the gradients in 16 bits (half the
   bytes). allreduce_ms is the time in the gradients' all-reduce (a rank that waits
   for a slower one counts its wait), allreduce_share its part of the step;
   load1 the 1-minute load average when the run began (a shared machine).
   bench/dp.sh runs 1, 2 and 3 ranks of one thread each against one process
   with as many threads, alternating, and repeats the set.

       mpicc -std=c99 -O2 -march=native -pthread bench/dp.c -o bench_dp -lm
       mpirun -np 2 ./bench_dp --threads 1 --batch 128   (batch: per rank) */
#define _POSIX_C_SOURCE 200809L
#define BENCH_NAME "bench_dp"
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#define MIXPREC_MPI_IMPLEMENTATION
#include "../mpi/mixprec_mpi.h"
#include "bench.h"

/* The MPI communicator with a stopwatch on the gradients' all-reduce. */
static mp_mpi mpi;
static double allreduce_s;
static mp_status timed_sum(void *ctx, float *buf, size_t n) {
    double t0 = now_s();
    mp_status st = mpi.table.all_reduce_sum(ctx, buf, n);
    if (n > 4) allreduce_s += now_s() - t0; /* not the metrics' two floats */
    return st;
}
static mp_status timed_sum16(void *ctx, void *buf, mp_dtype dtype, size_t n) {
    double t0 = now_s();
    mp_status st = mpi.table.all_reduce_sum16(ctx, buf, dtype, n);
    allreduce_s += now_s() - t0;
    return st;
}

static void cpu_model(char *out, size_t cap) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    snprintf(out, cap, "unknown");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *v = strchr(line, ':'), *p;
            if (!v) break;
            for (v++; *v == ' '; v++) {}
            for (p = v; *p; p++) if (*p == ' ') *p = '_'; else if (*p == '\n') *p = '\0';
            snprintf(out, cap, "%s", v);
            break;
        }
    if (f) fclose(f);
}

static float load1(void) {
    FILE *f = fopen("/proc/loadavg", "r");
    float l = -1.0f;
    if (f) {
        if (fscanf(f, "%f", &l) != 1) l = -1.0f;
        fclose(f);
    }
    return l;
}

int main(int argc, char **argv) {
    int threads = 1, batch = 128, units = 1024, steps = 300, i;
    const char *policy = "mixed_float16", *wire = "float32";
    mp_communicator timed;
    mp_model_desc md;
    mp_compile_desc cd;
    mp_fit_desc fd;
    mp_model *m = NULL;
    mp_layer_desc softmax = mp_activation_layer(MP_SOFTMAX);
    float *x, l1 = load1();
    int32_t *y;
    size_t n, global;
    uint64_t s = 42;
    double t0, seconds, slowest;
    char cpu[128];
    MPI_Init(&argc, &argv);
    for (i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batch") == 0) batch = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--units") == 0) units = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--steps") == 0) steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--policy") == 0) policy = argv[i + 1];
        else if (strcmp(argv[i], "--allreduce") == 0) wire = argv[i + 1];
    }
    if (mp_mpi_init(&mpi, MPI_COMM_WORLD) != MP_OK) {
        fprintf(stderr, "%s\n", mpi.error);
        mp_mpi_abort(&mpi, 1);
    }
    timed = mpi.table;
    timed.all_reduce_sum = timed_sum;
    timed.all_reduce_sum16 = timed_sum16;
    global = (size_t)batch * (size_t)mpi.size;
    n = global * (size_t)steps;
    x = (float *)xmalloc(n * 784 * sizeof(float));
    y = (int32_t *)xmalloc(n * sizeof(int32_t));
    for (i = 0; i < (int)(n * 784); i++) x[i] = (float)((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 40) * (1.0f / 16777216.0f);
    for (i = 0; i < (int)n; i++) y[i] = (int32_t)(i % 10);

    check(mp_set_global_policy_name(policy), NULL, "policy");
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 784;
    md.threads = threads;
    md.comm = mpi.size > 1 ? &timed : NULL;
    check(mp_dtype_from_name(wire, &md.allreduce_dtype), NULL, "--allreduce");
    check(mp_model_create(&m, &md), NULL, "create");
    check(mp_model_add(m, mp_dense(units, MP_RELU)), m, "add");
    check(mp_model_add(m, mp_dense(units, MP_RELU)), m, "add");
    check(mp_model_add(m, mp_dense(10, MP_LINEAR)), m, "add");
    softmax.dtype = "float32";
    check(mp_model_add(m, softmax), m, "add");
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    check(mp_model_compile(m, &cd), m, "compile");
    memset(&fd, 0, sizeof fd);
    fd.data.x[0] = mp_rows(x, global * 2, 784); /* warm-up: two steps */
    fd.data.y = mp_labels(y, global * 2);
    fd.batch_size = (int)global;
    fd.verbose = MP_VERBOSE_SILENT;
    check(mp_model_fit(m, &fd), m, "warm-up fit");
    fd.data.x[0].n = fd.data.y.n = n;
    allreduce_s = 0.0;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now_s();
    check(mp_model_fit(m, &fd), m, "fit");
    seconds = now_s() - t0;
    MPI_Reduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    cpu_model(cpu, sizeof cpu);
    if (mpi.rank == 0)
        printf("bench=dp ranks=%d threads_per_rank=%d per_rank_batch=%d global_batch=%zu units=%d policy=%s allreduce=%s steps=%d "
               "images_per_s=%.0f ms_per_step=%.2f allreduce_ms_per_step=%.2f allreduce_share=%.3f "
               "bytes_per_step_per_rank=%zu load1=%.2f cpu=%s\n",
               mpi.size, threads, batch, global, units, policy, wire, steps, (double)n / slowest, 1e3 * slowest / steps,
               1e3 * allreduce_s / steps, allreduce_s / seconds,
               mpi.size > 1 ? mp_model_trainable_param_count(m) * (md.allreduce_dtype == MP_FLOAT32 ? 4 : 2) : 0,
               (double)l1, cpu);
    mp_model_destroy(m);
    free(x);
    free(y);
    MPI_Finalize();
    return 0;
}
