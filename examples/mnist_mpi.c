/* mnist_mpi.c - the TensorFlow mixed precision guide's MLP on Fashion-MNIST,
   trained data-parallel over MPI (mpi/mixprec_mpi.h): every rank holds
   the same model and trains on its slice of each global batch. Rank 0
   prints fit's progress; at the end every rank prints one line,

       rank R/N weights_crc32=XXXXXXXX loss_scale=S skipped_steps=K test_accuracy=A

   the same on every rank but R (the weights are bit-identical). Built by
   `make examples` where mpicc is:

       make examples
       mpirun -np 2 ./build/mnist_mpi --policy mixed_float16 --units 256 --epochs 2 --batch-size 256

   Flags: --policy float32|mixed_float16|mixed_bfloat16 (mixed_float16)
          --units N (256)  --epochs N (2)  --batch-size N: the global batch (256)
          --data DIR (/usr/share/datasets/fashion-mnist)  --seed N (1337; rank r uses
          seed + r, and still starts from rank 0's weights)
          --train-limit N (0 = every training image)  --threads N (1 per rank) */
#define _POSIX_C_SOURCE 199309L /* clock_gettime; dup and fdopen */
#include <unistd.h>
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#define MIXPREC_MPI_IMPLEMENTATION
#include "../mpi/mixprec_mpi.h"
#include "fashion_mnist.h"

typedef struct config {
    const char *policy, *data_dir;
    int units, epochs, batch_size, threads;
    uint64_t seed;
    size_t train_limit;
} config;

static config parse_args(int argc, char **argv) {
    config c;
    mp_policy p;
    int i;
    memset(&c, 0, sizeof c);
    c.policy = "mixed_float16";
    c.data_dir = FM_PACKAGE_DIR;
    c.units = 256;
    c.epochs = 2;
    c.batch_size = 256;
    c.threads = 1;
    c.seed = 1337;
    for (i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) break;
        if (strcmp(argv[i], "--policy") == 0) c.policy = argv[i + 1];
        else if (strcmp(argv[i], "--units") == 0) c.units = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--epochs") == 0) c.epochs = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--batch-size") == 0) c.batch_size = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--data") == 0) c.data_dir = argv[i + 1];
        else if (strcmp(argv[i], "--seed") == 0) c.seed = (uint64_t)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--train-limit") == 0) c.train_limit = (size_t)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--threads") == 0) c.threads = (int)flag_long(argc, argv, i, 1);
        else break;
    }
    if (i < argc || mp_policy_from_name(c.policy, &p) != MP_OK) {
        fprintf(stderr, "usage: %s [--policy float32|mixed_float16|mixed_bfloat16] [--units N] [--epochs N]\n"
                        "       [--batch-size N] [--data DIR] [--seed N] [--train-limit N] [--threads N]\n", argv[0]);
        exit(2);
    }
    return c;
}

static uint32_t crc32_of(const float *w, size_t n) { /* zlib's CRC-32 of the bytes */
    const unsigned char *b = (const unsigned char *)w;
    uint32_t c = 0xFFFFFFFFu;
    size_t i;
    int k;
    for (i = 0; i < n * sizeof *w; i++)
        for (c ^= b[i], k = 0; k < 8; k++) c = c & 1u ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    return ~c;
}

int main(int argc, char **argv) {
    config c;
    mp_mpi comm;
    mp_model_desc md;
    mp_compile_desc cd;
    mp_fit_desc fd;
    mp_logs test;
    mp_model *m = NULL;
    fm_data d;
    FILE *out = stdout;
    float *w;
    size_t n;
    MPI_Init(&argc, &argv);
    c = parse_args(argc, argv);
    if (mp_mpi_init(&comm, MPI_COMM_WORLD) != MP_OK) {
        fprintf(stderr, "%s\n", comm.error);
        mp_mpi_abort(&comm, 1);
    }
    if (comm.rank > 0) { /* rank 0 tells the story; the others only their last line */
        int fd1 = dup(1);
        if (fd1 < 0 || !(out = fdopen(fd1, "w")) || !freopen("/dev/null", "w", stdout)) mp_mpi_abort(&comm, 1);
    }
    fm_load(&d, c.data_dir, c.train_limit, c.seed); /* every rank reads the same files */

    CHECK(mp_set_global_policy_name(c.policy), NULL);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = FM_PIXELS;
    md.seed = c.seed + (uint64_t)comm.rank; /* rank 0's initial weights win */
    md.threads = c.threads;
    md.comm = &comm.table;
    CHECK(mp_model_create(&m, &md), NULL);
    fm_add_guide_layers(m, c.units);
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY; /* RMSprop, loss scaling under mixed_float16 */
    cd.metrics = MP_METRIC_ACCURACY;
    CHECK(mp_model_compile(m, &cd), m);

    memset(&fd, 0, sizeof fd);
    fd.data = d.train;
    fd.batch_size = c.batch_size; /* global: each rank takes its share */
    fd.epochs = c.epochs;
    fd.validation_split = 0.2f;
    CHECK(mp_model_fit(m, &fd), m); /* any error ends this rank, and mpirun the job */
    CHECK(mp_model_evaluate(m, &d.test, c.batch_size, &test), m);

    n = mp_model_param_count(m);
    if (!(w = malloc(n * sizeof *w))) mp_mpi_abort(&comm, 1);
    CHECK(mp_model_get_weights(m, w, n), m);
    fprintf(out, "rank %d/%d weights_crc32=%08X loss_scale=%g skipped_steps=%u test_accuracy=%.4f\n", comm.rank,
            comm.size, (unsigned)crc32_of(w, n), (double)test.loss_scale, (unsigned)test.skipped_steps,
            (double)test.accuracy);
    fflush(out);
    free(w);
    mp_model_destroy(m);
    fm_free(&d);
    MPI_Finalize();
    return 0;
}
