/* mixprec_nccl.cu - the NCCL communicator (see mixprec_nccl.h). */
#define OMPI_SKIP_MPICXX 1 /* MPI's C API only: the C++ bindings do not build warning-free */
#define MPICH_SKIP_MPICXX 1
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include "mixprec_cuda.h"
#include "mixprec_nccl.h"

static mp_nccl *mp__nc_of(void *ctx) { return (mp_nccl *)ctx; }

static mp_status mp__nc_fail(mp_nccl *c, const char *call, const char *why) {
    snprintf(c->error, sizeof c->error, "%s: %s", call, why);
    return MP_ERR_COMM;
}

static mp_status mp__nc_check(mp_nccl *c, ncclResult_t r, const char *call) {
    return r == ncclSuccess ? MP_OK : mp__nc_fail(c, call, ncclGetErrorString(r));
}

/* The collectives go on the model's stream: no attach, no collective. */
static mp_status mp__nc_ready(mp_nccl *c) {
    return c->stream ? MP_OK : mp__nc_fail(c, "mp_nccl", "mp_nccl_attach the model before building it");
}

static int mp__nc_rank(void *ctx) { return mp__nc_of(ctx)->rank; }
static int mp__nc_size(void *ctx) { return mp__nc_of(ctx)->size; }

static mp_status mp__nc_all_reduce_sum(void *ctx, float *buf, size_t n) {
    mp_nccl *c = mp__nc_of(ctx);
    mp_status st = mp__nc_ready(c);
    if (st != MP_OK) return st;
    return mp__nc_check(c, ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, (ncclComm_t)c->comm,
                                         (cudaStream_t)c->stream), "ncclAllReduce");
}

static mp_status mp__nc_all_reduce_sum16(void *ctx, void *buf, mp_dtype dtype, size_t n) {
    mp_nccl *c = mp__nc_of(ctx);
    mp_status st = mp__nc_ready(c);
    if (st != MP_OK) return st;
    return mp__nc_check(c, ncclAllReduce(buf, buf, n, dtype == MP_FLOAT16 ? ncclFloat16 : ncclBfloat16, ncclSum,
                                         (ncclComm_t)c->comm, (cudaStream_t)c->stream), "ncclAllReduce");
}

static mp_status mp__nc_broadcast(void *ctx, void *buf, size_t bytes, int root) {
    mp_nccl *c = mp__nc_of(ctx);
    mp_status st = mp__nc_ready(c);
    if (st != MP_OK) return st;
    return mp__nc_check(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, (ncclComm_t)c->comm,
                                         (cudaStream_t)c->stream), "ncclBroadcast");
}

/* Every rank's queued work done, then MPI's barrier. */
static mp_status mp__nc_barrier(void *ctx) {
    mp_nccl *c = mp__nc_of(ctx);
    cudaError_t e = c->stream ? cudaStreamSynchronize((cudaStream_t)c->stream) : cudaSuccess;
    if (e != cudaSuccess) return mp__nc_fail(c, "cudaStreamSynchronize", cudaGetErrorString(e));
    return MPI_Barrier(c->mpi) == MPI_SUCCESS ? MP_OK : mp__nc_fail(c, "MPI_Barrier", "failed");
}

static const char *mp__nc_last_error(void *ctx) {
    mp_nccl *c = mp__nc_of(ctx);
    return c->error[0] ? c->error : "no error";
}

extern "C" mp_status mp_nccl_init(mp_nccl *c, MPI_Comm mpi, int device) {
    static const mp_communicator table = {
        MP_OP(name) "nccl",
        MP_OP(device_memory) 1,
        MP_OP(ctx) NULL,
        MP_OP(rank) mp__nc_rank,
        MP_OP(size) mp__nc_size,
        MP_OP(all_reduce_sum) mp__nc_all_reduce_sum,
        MP_OP(broadcast) mp__nc_broadcast,
        MP_OP(barrier) mp__nc_barrier,
        MP_OP(last_error) mp__nc_last_error,
        MP_OP(all_reduce_sum16) mp__nc_all_reduce_sum16,
        MP_OP(sum_buffer) NULL, /* NCCL sums the device's buffers where they are */
    };
    ncclUniqueId id;
    ncclComm_t comm;
    cudaError_t e;
    if (!c) return MP_ERR_NULL;
    memset(c, 0, sizeof *c);
    c->table = table;
    c->table.ctx = c;
    c->mpi = mpi;
    if (MPI_Comm_rank(mpi, &c->rank) != MPI_SUCCESS || MPI_Comm_size(mpi, &c->size) != MPI_SUCCESS)
        return mp__nc_fail(c, "MPI_Comm_rank", "failed");
    if ((e = cudaSetDevice(device)) != cudaSuccess) return mp__nc_fail(c, "cudaSetDevice", cudaGetErrorString(e));
    /* llm.c's bootstrap: rank 0's unique id to every rank over MPI */
    if (c->rank == 0 && mp__nc_check(c, ncclGetUniqueId(&id), "ncclGetUniqueId") != MP_OK) {
        memset(&id, 0, sizeof id); /* the others still take part in the broadcast, then fail in init */
    }
    if (MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, mpi) != MPI_SUCCESS) return mp__nc_fail(c, "MPI_Bcast", "the NCCL id");
    if (mp__nc_check(c, ncclCommInitRank(&comm, c->size, id, c->rank), "ncclCommInitRank") != MP_OK) return MP_ERR_COMM;
    c->comm = (void *)comm;
    return MP_OK;
}

extern "C" mp_status mp_nccl_attach(mp_nccl *c, const mp_model *m) {
    if (!c || !m) return MP_ERR_NULL;
    if (!(c->stream = mp_cuda_stream(mp_model_backend_context(m)))) return mp__nc_fail(c, "mp_nccl_attach", "no stream");
    return MP_OK;
}

extern "C" void mp_nccl_destroy(mp_nccl *c) {
    if (!c || !c->comm) return;
    ncclCommDestroy((ncclComm_t)c->comm);
    c->comm = NULL;
}
