/* mixprec_mpi.h - an MPI communicator for mixprec's data-parallel training
   (see >>communicator in mixprec.h): one process per rank, started by
   mpirun, all-reducing the CPU backend's float32 gradients over MPI.
   stb-style: in exactly one file, after mixprec.h,

       #define MIXPREC_MPI_IMPLEMENTATION
       #include "mpi/mixprec_mpi.h"

   and build with mpicc (Debian: apt-get install openmpi-bin libopenmpi-dev).

       MPI_Init(&argc, &argv);
       mp_mpi comm;
       mp_mpi_init(&comm, MPI_COMM_WORLD);
       mp_model_desc md = {{784}};
       md.comm = &comm.table;          // every rank: the same model and calls
       ...  mp_model_fit(m, &fd)  ...  // batch_size: the global batch
       if (status != MP_OK) { fprintf(stderr, ...); mp_mpi_abort(&comm, 1); }
       MPI_Finalize();

   Run: mpirun -np 2 ./program (as root Open MPI also wants
   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more ranks
   than cores want --oversubscribe).

   The sum has the same bits on every rank. Where every rank is on one
   machine, the gradients go to memory the ranks share (sum_buffer: an MPI-3
   shared window, freed at MPI_Finalize) and rank r adds up slice r of every
   rank's buffer, in rank order, and writes the sum to every rank's buffer:
   each element is summed once, by one rank, with no copy in or out (Open
   MPI's MPI_Allreduce copies each half across and back). Elsewhere, with
   2 ranks MPI_Allreduce adds two numbers, which IEEE 754 addition does
   alike in either order; with more, MPI_Allreduce may add in a different
   order on different ranks (MPI only recommends that it does not), so the
   sum is MPI_Reduce to rank 0 and MPI_Bcast from it. Errors return
   (MPI_ERRORS_RETURN on the communicator) and become MP_ERR_COMM with
   MPI's message; the other ranks may then wait in a collective forever,
   so a program that gets MP_ERR_COMM, or any error from a collective
   call, ends the job with mp_mpi_abort. A rank that dies makes mpirun end
   the job. */
#ifndef MIXPREC_MPI_H
#define MIXPREC_MPI_H
#include <mpi.h>
#ifndef MIXPREC_H
#error "include mixprec.h before mpi/mixprec_mpi.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

struct mp__mpi_shared;

typedef struct mp_mpi {
    mp_communicator table; /* for mp_model_desc.comm */
    MPI_Comm comm;
    MPI_Op sum_f16, sum_bf16; /* the 16-bit sums (all_reduce_sum16) */
    int rank, size;
    struct mp__mpi_shared *shared; /* the sum buffer; NULL: none (one rank, or several machines) */
    char error[MPI_MAX_ERROR_STRING + 64];
} mp_mpi;

/* Fills c for comm (MPI_COMM_WORLD, or a split of it) after MPI_Init; its
   errors return from now on. MP_ERR_COMM (c->error says why) if MPI fails. */
MIXPREC_API mp_status mp_mpi_init(mp_mpi *c, MPI_Comm comm);
/* Ends every rank of the job (MPI_Abort): after MP_ERR_COMM, or any error
   on one rank while the others go on to a collective. */
MIXPREC_API void mp_mpi_abort(mp_mpi *c, int code);

#ifdef __cplusplus
}
#endif
#endif /* MIXPREC_MPI_H */

#ifdef MIXPREC_MPI_IMPLEMENTATION
#ifndef MIXPREC_MPI_IMPLEMENTED
#define MIXPREC_MPI_IMPLEMENTED
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

/* MPI counts are ints: large buffers go in pieces of this many elements. */
#define MP__MPI_CHUNK ((size_t)1 << 30)

static mp_status mp__mpi_check(mp_mpi *c, int rc, const char *call) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (rc == MPI_SUCCESS) return MP_OK;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
    text[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
    snprintf(c->error, sizeof c->error, "%s: %s", call, len ? text : "an MPI error");
    return MP_ERR_COMM;
}

/* Every rank agrees on ok (the lowest), so that all take the same path. */
static int mp__mpi_agree(MPI_Comm comm, int ok) {
    return MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS && ok;
}

/* >>shared memory: where every rank is on one machine, the sum buffer is
   an MPI-3 shared window of MP__MPI_PIECE bytes per rank (rank r's piece
   at base[r]) on `node`, a communicator of the same ranks in the same
   order: small enough that a piece stays in cache from the model's
   writes through the sum to its reads. Owned by an attribute of
   MPI_COMM_SELF, which MPI_Finalize deletes first (the MPI standard's
   "Allowing User Functions at Process Termination"), so the window is
   freed then whatever became of the mp_mpi. */
#define MP__MPI_PIECE ((size_t)256 << 10)

struct mp__mpi_shared {
    MPI_Comm node;
    MPI_Win win;
    char **base; /* [size] */
};

/* Frees what mp__mpi_shared_init made: the window (locked where it was
   had: an unlock where it was not returns an error, which is ignored), the
   node communicator, the pieces' addresses. */
static void mp__mpi_shared_free(struct mp__mpi_shared *sh) {
    if (sh->win != MPI_WIN_NULL) {
        MPI_Win_unlock_all(sh->win);
        MPI_Win_free(&sh->win);
    }
    MPI_Comm_free(&sh->node);
    free(sh->base);
    free(sh);
}

static int mp__mpi_shared_delete(MPI_Comm comm, int key, void *value, void *extra) {
    (void)comm, (void)key, (void)extra;
    mp__mpi_shared_free((struct mp__mpi_shared *)value);
    return MPI_SUCCESS;
}

/* The window, each rank's piece found and locked (for MPI_Win_sync);
   ok: this rank got so far. */
static int mp__mpi_window(mp_mpi *c, struct mp__mpi_shared *sh) {
    char *mine;
    int r, ok = MPI_Win_allocate_shared((MPI_Aint)MP__MPI_PIECE, 1, MPI_INFO_NULL, sh->node, &mine, &sh->win) ==
                MPI_SUCCESS;
    if (!ok) sh->win = MPI_WIN_NULL;
    else ok = MPI_Win_set_errhandler(sh->win, MPI_ERRORS_RETURN) == MPI_SUCCESS;
    for (r = 0; ok && r < c->size; r++) {
        MPI_Aint bytes;
        int unit;
        ok = MPI_Win_shared_query(sh->win, r, &bytes, &unit, &sh->base[r]) == MPI_SUCCESS;
    }
    return ok && MPI_Win_lock_all(MPI_MODE_NOCHECK, sh->win) == MPI_SUCCESS;
}

/* c->shared where every rank of c is on one machine and the window could
   be had on every rank (NULL elsewhere: MPI's own sums). */
static mp_status mp__mpi_shared_init(mp_mpi *c) {
    struct mp__mpi_shared *sh;
    int node_size = 0, key, ok;
    mp_status st;
    if (c->size < 2) return MP_OK;
    if (!(sh = (struct mp__mpi_shared *)calloc(1, sizeof *sh))) return MP_ERR_ALLOC;
    st = mp__mpi_check(c, MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &sh->node),
                       "MPI_Comm_split_type");
    if (st != MP_OK) {
        free(sh);
        return st;
    }
    sh->win = MPI_WIN_NULL;
    ok = MPI_Comm_size(sh->node, &node_size) == MPI_SUCCESS && node_size == c->size &&
         (sh->base = (char **)calloc((size_t)c->size, sizeof(char *))) != NULL;
    ok = mp__mpi_agree(c->comm, ok) && mp__mpi_agree(c->comm, mp__mpi_window(c, sh)); /* in step: all or none */
    if (ok && MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, mp__mpi_shared_delete, &key, NULL) == MPI_SUCCESS) {
        MPI_Comm_set_attr(MPI_COMM_SELF, key, sh); /* MPI_COMM_SELF's errors are fatal */
        MPI_Comm_free_keyval(&key);                /* the attribute keeps it until MPI_Finalize */
        c->shared = sh;
        return MP_OK;
    }
    mp__mpi_shared_free(sh);
    return MP_OK;
}

/* sum_buffer: this rank's piece of the window, or NULL where there is none. */
static void *mp__mpi_sum_buffer(void *ctx, size_t *bytes) {
    mp_mpi *c = (mp_mpi *)ctx;
    *bytes = c->shared ? MP__MPI_PIECE : 0;
    return c->shared ? c->shared->base[c->rank] : NULL;
}

/* The ranks' writes to the window before it, visible to all after it. */
static mp_status mp__mpi_fence(mp_mpi *c) {
    struct mp__mpi_shared *sh = c->shared;
    mp_status st = mp__mpi_check(c, MPI_Win_sync(sh->win), "MPI_Win_sync");
    if (st == MP_OK) st = mp__mpi_check(c, MPI_Barrier(sh->node), "MPI_Barrier");
    return st == MP_OK ? mp__mpi_check(c, MPI_Win_sync(sh->win), "MPI_Win_sync") : st;
}

/* Whether buf is this rank's piece of the window, n elements of `size` bytes. */
static int mp__mpi_in_window(const mp_mpi *c, const void *buf, size_t size, size_t n) {
    return c->shared && buf == c->shared->base[c->rank] && n <= MP__MPI_PIECE / size;
}

/* n values of dt at src in float32: src itself, or widened (exactly) into tmp. */
static const float *mp__mpi_wide(float *tmp, const char *src, mp_dtype dt, size_t n) {
    if (dt == MP_FLOAT32) return (const float *)(const void *)src;
    mp_convert(tmp, MP_FLOAT32, src, dt, n, NULL);
    return tmp;
}

/* [0, n) of every rank's piece (dt) = their sum: rank r adds up its slice
   [n r / size, n (r + 1) / size) of every piece in rank order, in float32
   (16-bit values widened exactly, the sum rounded once), and writes it to
   every piece. One rank sums each element, so all hold the same bits.
   float32 is summed in rank 0's piece where it lies (a copy through the
   stack first cost as much as the additions). */
static mp_status mp__mpi_window_sum(mp_mpi *c, size_t n, mp_dtype dt) {
    struct mp__mpi_shared *sh = c->shared;
    size_t es = mp_dtype_size(dt), at, size = (size_t)c->size, rank = (size_t)c->rank;
    size_t lo = n / size * rank + n % size * rank / size, hi = n / size * (rank + 1) + n % size * (rank + 1) / size;
    float wide[512], tmp[512];
    mp_status st;
    if ((st = mp__mpi_fence(c)) != MP_OK) return st;
    for (at = lo; at < hi; at += 512) {
        size_t count = hi - at < 512 ? hi - at : 512;
        float *sum = dt == MP_FLOAT32 ? (float *)(void *)(sh->base[0] + at * es) : wide;
        int r;
        if (dt != MP_FLOAT32) mp_convert(sum, MP_FLOAT32, sh->base[0] + at * es, dt, count, NULL);
        for (r = 1; r < c->size; r++) { /* sum = part + sum: MPI's own vectorised loop, the same bits (IEEE 754 addition commutes) */
            const float *part = mp__mpi_wide(tmp, sh->base[r] + at * es, dt, count);
            st = mp__mpi_check(c, MPI_Reduce_local(part, sum, (int)count, MPI_FLOAT, MPI_SUM), "MPI_Reduce_local");
            if (st != MP_OK) return st;
        }
        for (r = dt == MP_FLOAT32; r < c->size; r++) { /* (float32: rank 0's piece holds it already) */
            if (dt == MP_FLOAT32) memcpy(sh->base[r] + at * es, sum, count * sizeof(float));
            else mp_convert(sh->base[r] + at * es, dt, sum, MP_FLOAT32, count, NULL);
        }
    }
    return mp__mpi_fence(c);
}

static int mp__mpi_rank(void *ctx) { return ((mp_mpi *)ctx)->rank; }
static int mp__mpi_size(void *ctx) { return ((mp_mpi *)ctx)->size; }

/* n elements of `size` bytes (type) summed by op over the ranks. */
static mp_status mp__mpi_sum(mp_mpi *c, void *buf, size_t size, size_t n, MPI_Datatype type, MPI_Op op) {
    size_t at;
    for (at = 0; at < n; at += MP__MPI_CHUNK) {
        int count = (int)(n - at < MP__MPI_CHUNK ? n - at : MP__MPI_CHUNK);
        char *p = (char *)buf + at * size;
        mp_status st;
        if (c->size == 2) { /* one addition each: the same bits on both ranks */
            st = mp__mpi_check(c, MPI_Allreduce(MPI_IN_PLACE, p, count, type, op, c->comm), "MPI_Allreduce");
        } else {
            void *send = c->rank == 0 ? MPI_IN_PLACE : (void *)p;
            st = mp__mpi_check(c, MPI_Reduce(send, p, count, type, op, 0, c->comm), "MPI_Reduce");
            if (st == MP_OK) st = mp__mpi_check(c, MPI_Bcast(p, count, type, 0, c->comm), "MPI_Bcast");
        }
        if (st != MP_OK) return st;
    }
    return MP_OK;
}

static mp_status mp__mpi_all_reduce_sum(void *ctx, float *buf, size_t n) {
    mp_mpi *c = (mp_mpi *)ctx;
    if (mp__mpi_in_window(c, buf, sizeof(float), n)) return mp__mpi_window_sum(c, n, MP_FLOAT32);
    return mp__mpi_sum(c, buf, sizeof(float), n, MPI_FLOAT, MPI_SUM);
}

/* inout += in in 16-bit dt: widened to float32 (exact), added, rounded once
   (mp_convert's vector casts, a tile at a time). */
static void mp__mpi_add16(const void *in, void *inout, int len, mp_dtype dt) {
    float a[512], b[512];
    size_t at, n = (size_t)len;
    for (at = 0; at < n; at += 512) {
        size_t k, count = n - at < 512 ? n - at : 512;
        mp_convert(a, MP_FLOAT32, (const uint16_t *)in + at, dt, count, NULL);
        mp_convert(b, MP_FLOAT32, (uint16_t *)inout + at, dt, count, NULL);
        for (k = 0; k < count; k++) a[k] += b[k];
        mp_convert((uint16_t *)inout + at, dt, a, MP_FLOAT32, count, NULL);
    }
}
static void mp__mpi_op_f16(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    mp__mpi_add16(in, inout, *len, MP_FLOAT16);
}
static void mp__mpi_op_bf16(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    mp__mpi_add16(in, inout, *len, MP_BFLOAT16);
}

static mp_status mp__mpi_all_reduce_sum16(void *ctx, void *buf, mp_dtype dtype, size_t n) {
    mp_mpi *c = (mp_mpi *)ctx;
    if (mp__mpi_in_window(c, buf, 2, n)) return mp__mpi_window_sum(c, n, dtype);
    return mp__mpi_sum(c, buf, 2, n, MPI_UINT16_T, dtype == MP_FLOAT16 ? c->sum_f16 : c->sum_bf16);
}

static mp_status mp__mpi_broadcast(void *ctx, void *buf, size_t bytes, int root) {
    mp_mpi *c = (mp_mpi *)ctx;
    size_t at;
    for (at = 0; at < bytes; at += MP__MPI_CHUNK) {
        int count = (int)(bytes - at < MP__MPI_CHUNK ? bytes - at : MP__MPI_CHUNK);
        mp_status st = mp__mpi_check(c, MPI_Bcast((char *)buf + at, count, MPI_BYTE, root, c->comm), "MPI_Bcast");
        if (st != MP_OK) return st;
    }
    return MP_OK;
}

static mp_status mp__mpi_barrier(void *ctx) {
    mp_mpi *c = (mp_mpi *)ctx;
    return mp__mpi_check(c, MPI_Barrier(c->comm), "MPI_Barrier");
}

static const char *mp__mpi_last_error(void *ctx) {
    mp_mpi *c = (mp_mpi *)ctx;
    return c->error[0] ? c->error : "no error";
}

MIXPREC_API mp_status mp_mpi_init(mp_mpi *c, MPI_Comm comm) {
    static const mp_communicator table = {
        MP_OP(name) "mpi",
        MP_OP(device_memory) 0,
        MP_OP(ctx) NULL,
        MP_OP(rank) mp__mpi_rank,
        MP_OP(size) mp__mpi_size,
        MP_OP(all_reduce_sum) mp__mpi_all_reduce_sum,
        MP_OP(broadcast) mp__mpi_broadcast,
        MP_OP(barrier) mp__mpi_barrier,
        MP_OP(last_error) mp__mpi_last_error,
        MP_OP(all_reduce_sum16) mp__mpi_all_reduce_sum16,
        MP_OP(sum_buffer) mp__mpi_sum_buffer,
    };
    mp_status st;
    if (!c) return MP_ERR_NULL;
    memset(c, 0, sizeof *c);
    c->table = table;
    c->table.ctx = c;
    c->comm = comm;
    if ((st = mp__mpi_check(c, MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler")) != MP_OK ||
        (st = mp__mpi_check(c, MPI_Comm_rank(comm, &c->rank), "MPI_Comm_rank")) != MP_OK ||
        (st = mp__mpi_check(c, MPI_Comm_size(comm, &c->size), "MPI_Comm_size")) != MP_OK ||
        (st = mp__mpi_check(c, MPI_Op_create(mp__mpi_op_f16, 1, &c->sum_f16), "MPI_Op_create")) != MP_OK ||
        (st = mp__mpi_check(c, MPI_Op_create(mp__mpi_op_bf16, 1, &c->sum_bf16), "MPI_Op_create")) != MP_OK)
        return st;
    return mp__mpi_shared_init(c);
}

MIXPREC_API void mp_mpi_abort(mp_mpi *c, int code) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(c ? c->comm : MPI_COMM_WORLD, code);
}
#endif /* MIXPREC_MPI_IMPLEMENTED */
#endif /* MIXPREC_MPI_IMPLEMENTATION */
