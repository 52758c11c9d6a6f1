/* test_nccl.c - the NCCL communicator (cuda/mixprec_nccl.h) on one rank and
   one GPU: its all-reduce and broadcast on device buffers, then the guide's
   MLP trained on the CUDA backend with the communicator attached, against
   the same model without it. One GPU cannot hold two NCCL ranks ("duplicate
   GPU"), so more ranks need more GPUs; without a GPU it says it skipped.
   Built by `make nccl` (mpicc, nvcc, nccl.h); run with mpirun -np 1. */
#define OMPI_SKIP_MPICXX 1
#include <cuda_runtime.h>
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "../cuda/mixprec_cuda.h"
#include "../cuda/mixprec_nccl.h"
#include "check.h"

static void test_collectives(mp_nccl *nc) {
    float host[4] = {1.0f, -2.5f, 3.0f, 65504.0f}, back[4] = {0};
    float *dev = NULL;
    CHECK(cudaMalloc((void **)&dev, sizeof host) == cudaSuccess);
    CHECK(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(nc->table.all_reduce_sum(nc->table.ctx, dev, 4) == MP_OK); /* one rank: the sum is itself */
    CHECK(nc->table.broadcast(nc->table.ctx, dev, sizeof host, 0) == MP_OK);
    CHECK(nc->table.barrier(nc->table.ctx) == MP_OK);
    CHECK(cudaMemcpy(back, dev, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(back, host, sizeof host) == 0);
    cudaFree(dev);
}

/* The CUDA backend's step with the communicator attached, as without it. */
static void test_fit_attached(mp_nccl *nc) {
    enum { N = 512 };
    static float x[N * 784];
    static int32_t y[N];
    float w[2][64];
    int k, i;
    for (i = 0; i < N * 784; i++) x[i] = (float)(i % 251) / 251.0f;
    for (i = 0; i < N; i++) y[i] = i % 10;
    for (k = 0; k < 2; k++) {
        mp_model_desc md;
        mp_compile_desc cd;
        mp_fit_desc fd;
        mp_model *m = NULL;
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 784;
        md.backend = mp_cuda_backend();
        md.comm = k ? &nc->table : NULL;
        mp_set_global_policy_name("mixed_float16");
        CHECK(mp_model_create(&m, &md) == MP_OK);
        if (!m) return;
        if (k) CHECK(mp_nccl_attach(nc, m) == MP_OK);
        mp_model_add(m, mp_dense(256, MP_RELU));
        mp_model_add(m, mp_dense(10, MP_SOFTMAX));
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
        CHECK(mp_model_compile(m, &cd) == MP_OK);
        memset(&fd, 0, sizeof fd);
        fd.data.x[0] = mp_rows(x, N, 784);
        fd.data.y = mp_labels(y, N);
        fd.batch_size = 128;
        fd.verbose = MP_VERBOSE_SILENT;
        if (!CHECK(mp_model_fit(m, &fd) == MP_OK)) fprintf(stderr, "    %s\n", mp_model_error(m));
        CHECK(mp_model_get_weights(m, w[k], 64) == MP_OK || mp_model_param_count(m) < 64);
        mp_model_destroy(m);
    }
    CHECK(memcmp(w[0], w[1], sizeof w[0]) == 0); /* one rank: the same steps */
}

int main(int argc, char **argv) {
    mp_nccl nc;
    int size = 1;
    MPI_Init(&argc, &argv);
    check_args(argc, argv);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (mp_cuda_device_count() == 0) {
        printf("test_nccl: skipped (no CUDA device: %s; NCCL needs one GPU per rank)\n", mp_cuda_last_error());
        MPI_Finalize();
        return 0;
    }
    if (size != 1) {
        printf("test_nccl: skipped (run it with mpirun -np 1: one GPU holds one NCCL rank)\n");
        MPI_Finalize();
        return 0;
    }
    if (!CHECK(mp_nccl_init(&nc, MPI_COMM_WORLD, 0) == MP_OK)) {
        fprintf(stderr, "    %s\n", nc.error);
    } else {
        RUN(test_collectives(&nc));
        RUN(test_fit_attached(&nc));
        mp_nccl_destroy(&nc);
    }
    MPI_Finalize();
    return check_done("test_nccl");
}
