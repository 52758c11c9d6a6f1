/* mixprec_nccl.h - an NCCL communicator for mixprec's data-parallel training
   on the CUDA backend (see >>communicator in mixprec.h): each rank's model
   lives on its own GPU, and the gradients are all-reduced in device memory
   on the model's CUDA stream, in order with its kernels, without a trip
   through the host. As llm.c does, MPI starts the ranks and bootstraps
   NCCL: rank 0 makes the unique id (ncclGetUniqueId), MPI_Bcast gives it to
   every rank, and each calls ncclCommInitRank.

       MPI_Init(&argc, &argv);
       mp_nccl nc;
       mp_cuda_config cfg = {0};
       cfg.device = local_rank;                   // one GPU per rank
       mp_nccl_init(&nc, MPI_COMM_WORLD, cfg.device);
       mp_model_desc md = {{784}};
       md.backend = mp_cuda_backend();
       md.backend_config = &cfg;
       md.comm = &nc.table;
       mp_model_create(&m, &md);
       mp_nccl_attach(&nc, m);                    // before build or compile
       ... add layers, compile, fit ...
       mp_model_destroy(m);
       mp_nccl_destroy(&nc);
       MPI_Finalize();

   Build: `make nccl` (nvcc, nccl.h and mpicc) gives build/libmixprec_nccl.a;
   link it with build/libmixprec_cuda.a and -lnccl and MPI (mpicc). NCCL
   cannot put two ranks on one GPU ("duplicate GPU"): a machine with one GPU
   runs it with one rank. NCCL's all-reduce gives every rank the same bits
   (each element is reduced once, then copied), so the weights stay
   bit-identical. A failed call is MP_ERR_COMM with NCCL's message; end the
   job with MPI_Abort. */
#ifndef MIXPREC_NCCL_H
#define MIXPREC_NCCL_H
#include <mpi.h>
#include "../mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_nccl {
    mp_communicator table; /* for mp_model_desc.comm (device memory) */
    void *comm;            /* ncclComm_t */
    void *stream;          /* the model's cudaStream_t, once attached */
    int rank, size;
    MPI_Comm mpi;
    char error[256];
} mp_nccl;

/* After MPI_Init: NCCL over the ranks of mpi on CUDA device `device`.
   MP_ERR_COMM (c->error says why: no GPU, NCCL's or MPI's error). */
mp_status mp_nccl_init(mp_nccl *c, MPI_Comm mpi, int device);
/* Queue the collectives on m's stream (its backend is the CUDA one); call
   after mp_model_create and before the model is built or compiled. */
mp_status mp_nccl_attach(mp_nccl *c, const mp_model *m);
void mp_nccl_destroy(mp_nccl *c); /* NULL-safe */

#ifdef __cplusplus
}
#endif
#endif /* MIXPREC_NCCL_H */
