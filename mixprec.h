/* mixprec.h - Keras-style mixed precision for C: exact float16/bfloat16, fast
   bulk casts with overflow/underflow counts, dtype policies, and training
   (layers, losses, optimizers with float32 master weights, dynamic loss
   scaling, Keras-like fit/evaluate and a custom training loop).
   Single-file (stb-style) library; MIT or public domain, see the end of file.
   Version 0.2.0 (MIXPREC_VERSION_STRING); CHANGELOG.md has the history.

QUICK START
    In exactly one C or C++ file:

        #define MIXPREC_IMPLEMENTATION
        #include "mixprec.h"

    and plain `#include "mixprec.h"` everywhere else. Then, in a function
    (every call returns an mp_status: MP_OK, or what went wrong):

        float src32[3] = {256.0f, 1e-8f, 70000.0f};
        mp_f16 dst16[3];
        mp_cast_stats st = {0};                            // casts add to it
        mp_policy p;                                       // float16's range too narrow?
        if (mp_convert(dst16, MP_FLOAT16, src32, MP_FLOAT32, 3, &st) != MP_OK ||  // 1e-8: 0, 70000: Inf
            mp_policy_from_name(st.overflow || st.underflow ? "mixed_bfloat16" : "mixed_float16", &p) != MP_OK ||
            mp_set_global_policy(p) != MP_OK)              // 16-bit compute, float32 variables
            return;

    Training, the TensorFlow mixed precision guide's model, on an MNIST-format
    data set (C99's designated initializers; a zero field means the default;
    each call runs only if every one before it succeeded):

        #include <stdio.h>
        mp_dataset d = {0};
        mp_model *m = NULL;
        mp_model_desc md = {.input_shape = {784}};
        mp_layer_desc out = mp_activation_layer(MP_SOFTMAX);
        mp_compile_desc cd = {.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY,
                              .metrics = MP_METRIC_ACCURACY};  // RMSprop by default,
        mp_status s = mp_load_idx("train-images-idx3-ubyte", // loss scaling by itself
                                  "train-labels-idx1-ubyte", &d);
        out.dtype = "float32";                             // keep the output float32
        if (s == MP_OK) s = mp_set_global_policy_name("mixed_float16");
        if (s == MP_OK) s = mp_model_create(&m, &md);
        if (s == MP_OK) s = mp_model_add(m, mp_dense(4096, MP_RELU));
        if (s == MP_OK) s = mp_model_add(m, mp_dense(10, MP_LINEAR));
        if (s == MP_OK) s = mp_model_add(m, out);
        if (s == MP_OK) s = mp_model_compile(m, &cd);
        if (s == MP_OK) {                                  // x (n, 28, 28), y (n,) labels
            mp_fit_desc fd = {.data = mp_dataset_data(&d), .batch_size = 8192,
                              .epochs = 5, .validation_split = 0.2f};
            s = mp_model_fit(m, &fd);                      // Keras-style progress lines
        }
        if (s != MP_OK)                                    // what to fix, first
            fprintf(stderr, "%s: %s\n", mp_status_name(s), m ? mp_model_error(m) : mp_status_message(s));
        mp_model_destroy(m);
        mp_dataset_free(&d);

    The same descriptor in C++:

        mp_model_desc md = {};                             // zero, then by name
        md.input_shape[0] = 784;
        mp_model *m = NULL;
        if (mp_model_create(&m, &md) != MP_OK) return;
        mp_model_destroy(m);

    Compile with -O2 -march=native (the SIMD paths need the instructions
    enabled; -march=native ties the binary to CPUs like the building one)
    and link with -lm (expf, logf, powf, sqrtf) and, for the thread pool on
    glibc before 2.34, -pthread:
    cc -std=c99 -O2 -march=native app.c -o app -lm
    fit times epochs by the wall clock (POSIX's clock_gettime or
    gettimeofday, C11's timespec_get), whatever feature macros are defined;
    only a platform with none of them gets processor time, and fit's lines
    say so. Every code block above compiles
    with -Wall -Wextra -Wpedantic -Werror (tests/doc_snippets.sh).
    Checkpoint saves fsync the file and its directory on any POSIX system,
    whatever feature macros are defined.

CONFIGURATION (define before the #include that has MIXPREC_IMPLEMENTATION)
    MIXPREC_STATIC          make every function static to the including file
    MIXPREC_API             decoration of public functions (default extern)
    MIXPREC_MALLOC(sz)      allocator; define both MIXPREC_MALLOC and
    MIXPREC_FREE(p)         MIXPREC_FREE or neither (default malloc/free)
    MIXPREC_ASSERT(x)       internal invariants only, never user input (default assert)
    MIXPREC_NO_STDIO        no <stdio.h>: for bare-metal targets
    MIXPREC_NO_SIMD         portable C only, even where the compiler enables
                            F16C/AVX2/AVX-512; casts are bit-identical either
                            way (GEMM sums may round differently: no FMA)
    MIXPREC_NO_THREADS      no thread pool (also where POSIX threads, or GCC's
                            and Clang's __atomic builtins, are missing)
    MIXPREC_NO_HUGE_PAGES   blocks of 4 MiB and more do not ask Linux for
                            transparent huge pages (x86-64 Linux, malloc)
    MIXPREC_USE_CBLAS       float32 GEMMs go to the linked CBLAS's cblas_sgemm
    MIXPREC_BF16_DOT        1: bfloat16 x bfloat16 products by AVX512_BF16's
                            vdpbf16ps; 0: widened to float32 for the FMAs
                            (default 1, but 0 where the build targets
                            AVX512_FP16: Intel, whose vdpbf16ps runs at half
                            the FMAs' rate); AMX's tiles run either way
    MIXPREC_RULES           for a backend's own source (cuda/): compile the
                            shared >>rules (activations, loss rows) without
                            the implementation

NUMERIC RULES (IEEE 754-2008; mixprec follows the x86 hardware where IEEE
leaves a choice, so that the scalar and SIMD paths agree bit for bit)
    - Narrowing (float32 -> float16/bfloat16, float64 -> either) rounds to
      nearest, ties to even, exactly once. Subnormals are produced and read,
      never flushed. Signed zeros and infinities are kept. float16 overflows to
      Inf from 65520 (the midpoint past 65504) up; bfloat16 from 0x7F7F8000.
    - NaN: float32 -> float16 gives sign | 0x7E00 | (fraction >> 13);
      float16 -> float32 quiets signalling NaNs (0x7C01 -> 0x7FC02000), as F16C
      vcvtph2ps does; float32 -> bfloat16 gives sign | 0x7FC0 | (fraction >> 16);
      bfloat16 -> float32 is exact (a shift). float16 <-> bfloat16 goes through
      float32, which is exact, so it too rounds once.
    - Conversions are integer-only: they do not depend on the FPU rounding
      mode, FTZ/DAZ or x87 excess precision.
    - Arithmetic (+ - * / sqrt) computes in float32 and rounds once; this is
      correctly rounded (see >>numbers: arithmetic for why). It uses the FPU, so it needs
      the IEEE default round-to-nearest mode; bfloat16 results below 2^-126 also
      need FTZ/DAZ off (float16 never reaches float32's subnormal range).
    - Comparisons are integer-only: NaN is unordered, -0 == +0.

TRAINING RULES (Keras mixed precision, tf_keras's LossScaleOptimizer)
    - A layer computes in its policy's compute dtype and keeps float32
      variables, read as the compute dtype each step. Floating inputs are cast
      on entry; int32 inputs become float32 first (exact to 2^24, see
      >>data), and stay float32 where an Embedding reads them as token
      ids; integer labels are never cast. The loss is float32; after a
      softmax (sigmoid) output a crossentropy reads the logits, as Keras's.
    - Matrix products (Dense, Conv2D, forward and backward) accumulate in
      float32 and round once to the output dtype, as Tensor Cores do.
    - Activation gradients are stored in the dtype of the activations (in
      float16 they really underflow); weight gradients are rounded to the
      compute dtype, tested for Inf/NaN, and unscaled into float32 as the
      optimizer reads them (with a communicator, in one fused pass with the
      test after the ranks' sum): the same numbers either way.
    - Dynamic loss scaling: 2^15 at start, x2 after 2000 finite steps (only
      to a finite value), /2 (floor 1) and the step skipped on Inf/NaN.
    - A step, in Keras 3's order: the scaled gradients checked (a bad step
      skipped: nothing below runs), unscaled, accumulated
      (gradient_accumulation_steps), clipped (clipnorm, clipvalue or
      global_clipnorm), the weights decayed (weight_decay, decoupled), then
      the update (SGD, RMSprop, Adam, AdamW) on the float32 weights.

MEMORY
    Every allocation goes through MIXPREC_MALLOC and is counted:
    mp_get_memory_info() gives current and peak bytes. A model is one
    allocation for its weights, one for optimizer slots and one for its
    activations (regrown only for a larger batch).

BACKENDS
    A model runs on the backend it is created with (mp_model_desc.backend):
    the CPU by default, or a GPU through cuda/mixprec_cuda.h (built by
    `make cuda`). The backend holds the model's tensors and runs every
    kernel through one table of operations (see >>backends); the rest of the
    API is the same. mp_model_memory_info reports the backend's bytes.

ADDING A LAYER KIND (every place that names the kinds; search each tag)
    >>layers          its mp_layer_kind before MP_LAYER_KIND_COUNT, the
                      mp_layer_desc fields it reads, a constructor (mp_dense
                      style) declared here and defined in >>layers: descriptions
    >>layers (impl.)  its forward/backward pair (backward writes dx[k] for
                      each input k that has one) and its row in mp__kinds:
                      Keras's class name, the base of automatic names, how
                      many inputs, whether its backward pass reads its inputs
                      or its output (the memory plan keeps them), whether it
                      is a view of its input, whether its weights stay float32
    >>model           mp__infer_shape (output shape, kernel, bias and state
                      sizes; a merge checks every input's shape),
                      mp_model_call (per-layer state such as Dropout's seed),
                      mp__init_weights (its initialiser), mp__want_layer
                      (buffers beyond its output: masks, statistics),
                      mp__plan_activations (im2col columns),
                      mp__reserve_products (its GEMMs)
    >>backends        a new op in mp_backend if no kernel does its work, and
                      then every table: >>cpu backend: the operations table,
                      cuda/mixprec_cuda.cu, tests/test_backend.c's remote one
    >>automatic mixed precision   its TensorFlow op in mp__ops (on which
                      list) and its row in mp__amp_layer_ops' `first`
    >>numerics diagnostics        mp_model_tensor_core_advice, if it multiplies
    >>checkpoints     nothing (the fingerprint, mp__ckpt_model, has each
                      layer's kind, inputs, dtypes and counts, and every
                      layer's generator is written); other state: mp__ckpt_body
    >>safetensors     its torch.nn names and shape order, if it has weights
                      (mp__st_torch_name, mp__st_torch_perm)
    tests             test_graph (finite-difference gradients under each
                      policy, forward values against Keras's formula),
                      test_backend, test_cuda, test_amp; docs/layers.md

GLOBAL STATE
    The global dtype policy (mp_set_global_policy), as in Keras, and the
    memory counters (mp_get_memory_info), as TensorFlow's. Nothing else. So
    threads may call mixprec at once, each with objects of its own (models,
    pools, buffers; one object is one thread's at a time): with GCC and
    Clang the policy and the counters are read and updated atomically
    (other compilers: one thread at a time). The policy is read when a
    layer or model is made, and a thread that changes it changes it for
    every thread's next one, as Keras's does: to give each thread its own,
    name a policy on each layer (mp_layer_desc.dtype). tests/test_threads.c
    trains, multiplies, casts and saves in two threads, and sets the policy
    in one while the other reads it.

CONTENTS
    Each section starts with a comment that begins `>>tag`; its declarations
    and its implementation carry the same tag, so one search for `>>tag`
    finds both halves (and `>>tag: part` the parts of a long one). To find a
    public function's code, search for its name followed by `(`, or use a
    tags file (`ctags mixprec.h`); the 28 float16/bfloat16 operations made
    by token pasting are named in a comment where they are made.
    Declarations, in file order:
    >>errors                 status codes and their messages, one X-macro list
    >>numbers                mp_f16, mp_bf16: conversions, arithmetic, comparisons
    >>dtypes                 float32, float16, bfloat16: names and sizes
    >>bulk casts             mp_convert and the overflow/underflow counts
    >>policies               Keras's dtype policies and the global policy
    >>memory                 the counted allocator, current and peak bytes
    >>tensors                mp_tensor: dtype, shape, data
    >>threads                the worker pool
    >>matmul                 mp_matmul: any mix of dtypes, float32 sums
    >>layers                 layer descriptions (mp_dense, mp_conv2d, ...)
    >>losses, metrics and optimizers   their kinds, Keras's settings and
                             learning-rate schedules
    >>loss scaling           Keras's LossScaleOptimizer state machine
    >>automatic mixed precision   TensorFlow's AMP graph rewrite; compile's
                             settings (before >>model: mp_compile_desc holds them)
    >>model                  create, add, build, compile, queries, weights
    >>data: arrays           mp_array, mp_data: what fit, evaluate, predict and
                             the custom loop read, and the checks they pass;
                             mp_to_categorical
    >>fit                    fit, evaluate, predict, mp_logs; >>fit: callbacks
                             (the hooks) and >>fit: built-in callbacks
    >>custom training loop   the guide's train_step, one call per line
    >>numerics diagnostics   per-layer statistics, check-numerics, advice
    >>checkpoints            save/load (atomic), weight export/import
    >>safetensors            weights in PyTorch's and Hugging Face's format, Keras or torch names
    >>data: gzip             mp_gunzip: gzip (RFC 1952) and deflate (RFC 1951), bounded
    >>data                   IDX files (MNIST, Fashion-MNIST), plain or gzip; mp_dataset_data
    >>data: tokens           text and llm.c token files, cut into windows of next-token targets
    >>backends               the table of operations a backend fills (MP_OP),
                             and the inline rules every backend shares
    >>communicator           data-parallel training: the table of collectives
    >>cpu backend            mp_cpu_backend, the default table
    >>rules                  activations and loss rows, compiled by the
                             implementation and by device backends alike
    Implementation (under MIXPREC_IMPLEMENTATION), in file order:
    >>errors                 mp_status_message, mp_status_name
    >>numbers: conversion    float32/float64 <-> float16/bfloat16, integer-only
    >>numbers: arithmetic    + - * / sqrt through float32, comparisons
    >>dtypes                 the dtype table (int32's row past the float dtypes')
    >>bulk casts             which row runs when (the table), mp__first_nonfinite
    >>bulk casts: cast stats the thresholds the counts compare against
    >>bulk casts: scalar     the portable rows and scan (mp_convert_portable)
    >>bulk casts: simd       what the AVX-512 and AVX2 rows share: chunks, counts
    >>bulk casts: avx512     16 float32 lanes, cast and counted in one pass
    >>bulk casts: avx2       8 float32 lanes, two counts packed in each lane
    >>bulk casts: dispatch   the rows' table (mp__rows), mp_convert's checks
    >>policies               policy names, the global policy
    >>memory                 the counted allocator; one block carved into tensors
    >>tensors                mp_tensor_alloc, ...
    >>text                   a formatter without stdio for messages and logs
    >>cpu backend            the CPU's kernels: helpers, then
    >>cpu backend: activations   activations applied by runs, softmax, bias
    >>threads                the pool (the CPU backend's context)
    >>matmul                 the BLIS-style GEMM: which path runs when (a table)
    >>matmul: blocking       the sizes per build, the pool's buffers
    >>matmul: packing        op(A), op(B) into panels: float32, bfloat16 pairs, AMX tiles
    >>matmul: kernels        register tiles: float32 (AVX-512, AVX2, portable),
                             vdpbf16ps, AMX
    >>matmul: paths          epilogues; in place, sums in C, blocked; the plan
    >>matmul: threads        splits along N, M or K, the transpose, CBLAS, mp_matmul
    >>cpu backend: elementwise    casts, elementwise ops, strided copies split across threads
    >>cpu backend: losses    the loss rows over a batch
    >>cpu backend: loss scaling  scale, unscale-and-check, the state machine
    >>cpu backend: optimizers    SGD, RMSprop, Adam(W), vectorised; weight decay,
                             clipping; the sum of squares for clipping by norm
    >>cpu backend: convolution, pooling, dropout   im2col, col2im, a thread's groups of
                             images (conv_gemm), max and average pool, masks
    >>cpu backend: the operations table   memory, copies, sync; mp_cpu_backend
    >>layers                 each layer's forward and backward, side by side
    >>layers: descriptions   mp_dense, mp_conv2d, ... and activation names
    >>losses, metrics and optimizers: learning-rate schedules
    >>loss scaling           mp_loss_scale_init, mp_loss_scale_update
    >>automatic mixed precision   the pass that decides each layer's dtypes
                             (before >>model, whose compile calls it; it
                             needs nothing of the model's code)
    >>communicator           joining a job, collectives on host values, rank 0's weights
    >>model                  create, add, build, compile, the activation plan
    >>data: arrays           mp_array_f32, mp_rows, mp_to_categorical, ...
    >>data: checks           an mp_data checked against the model: its feed
    >>custom training loop   mp_forward ... mp_apply_gradients, learning rate
    >>fit                    the training loop, evaluate, predict
    >>fit: callbacks         calling the hooks, monitors
    >>fit: built-in callbacks    History, EarlyStopping, ProgbarLogger, ...
    >>model: queries         layer info, memory, weights, gradients, slots
    >>model: summary         Keras's model.summary() with a Policy column
    >>numerics diagnostics   statistics, histograms, check-numerics, advice
    >>checkpoints            the container: write, read, check, commit; files
    >>safetensors            JSON header: parse, check; import by name, export
    >>data: gzip             inflate: bits, Huffman codes, blocks, members
    >>data                   IDX parsing and loading (a gzip file in two steps), mp_dataset_data
    >>data: tokens           byte-level text, llm.c's token files, windows
*/
#ifndef MIXPREC_H
#define MIXPREC_H

#define MIXPREC_VERSION_MAJOR 0
#define MIXPREC_VERSION_MINOR 2
#define MIXPREC_VERSION_PATCH 0
#define MIXPREC_VERSION_STRING "0.2.0"

#include <stddef.h>
#include <stdint.h>

#ifndef MIXPREC_API
#if defined(MIXPREC_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define MIXPREC_API static __attribute__((unused))
#elif defined(MIXPREC_STATIC)
#define MIXPREC_API static
#else
#define MIXPREC_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* >>errors: one list makes the codes and their messages */
#define MP_STATUS_LIST(X)                                                          \
    X(MP_OK, "ok")                                                                 \
    X(MP_ERR_NULL, "a required pointer argument is NULL")                          \
    X(MP_ERR_DTYPE, "unsupported dtype: casts, tensors and policies take float32, " \
      "float16, bfloat16; data also int32")                                       \
    X(MP_ERR_UNKNOWN_DTYPE,                                                        \
      "unknown dtype name: valid names are 'float32', 'float16', 'bfloat16' and "  \
      "'int32'")                                                                   \
    X(MP_ERR_UNKNOWN_POLICY,                                                       \
      "cannot convert the name to a mixed precision policy: valid policies are "   \
      "'mixed_float16', 'mixed_bfloat16', and the name of any float dtype "        \
      "('float32', 'float16', 'bfloat16')")                                        \
    X(MP_ERR_INVALID_POLICY,                                                       \
      "invalid policy: the compute/variable dtype pair is not one of the named "   \
      "policies")                                                                  \
    X(MP_ERR_OVERLAP, "source and destination buffers overlap")                    \
    X(MP_ERR_ALIGN, "buffer is not aligned to its element size")                  \
    X(MP_ERR_SIZE, "size overflows size_t or does not fit the buffer")            \
    X(MP_ERR_ALLOC, "memory allocation failed (nothing was changed or leaked)")   \
    X(MP_ERR_ARG, "an argument is out of range (a count, size, rate or option)")  \
    X(MP_ERR_SHAPE, "the model does not fit: a layer cannot take the previous "   \
      "layer's output, or the data, weights or checkpoint differ from the model " \
      "in shape or policy")                                                        \
    X(MP_ERR_UNKNOWN_NAME, "unknown name: see the valid activations, losses "    \
      "and optimizers in mixprec.h")                                              \
    X(MP_ERR_STATE, "call out of order: layers go in before build/compile, "     \
      "and training needs compile()")                                             \
    X(MP_ERR_LABEL, "a label is out of range for the model's output classes")    \
    X(MP_ERR_NONFINITE, "NaN or Inf where finite numbers are needed: in the "     \
      "input data, or (check-numerics) in what a layer computed")                 \
    X(MP_ERR_IO, "the file cannot be opened, read or written")                    \
    X(MP_ERR_FORMAT, "the file is corrupt, truncated or not of the expected kind " \
      "(an IDX file, a mixprec checkpoint)")                                      \
    X(MP_ERR_BACKEND, "the backend (a GPU, its driver or library) reported an "  \
      "error; the model's error message names it")                                 \
    X(MP_ERR_COMM, "a collective operation across the ranks of a data-parallel " \
      "job failed (see >>communicator); end the job")

typedef enum mp_status {
#define MP__STATUS_ENUM(code, msg) code,
    MP_STATUS_LIST(MP__STATUS_ENUM)
#undef MP__STATUS_ENUM
    MP_STATUS_COUNT
} mp_status;

/* A sentence that explains the status; never NULL. */
MIXPREC_API const char *mp_status_message(mp_status status);
/* The code's own name, e.g. "MP_ERR_NULL"; never NULL. */
MIXPREC_API const char *mp_status_name(mp_status status);

/* >>numbers: types, scalar conversions, arithmetic */
typedef struct mp_f16 { uint16_t bits; } mp_f16;   /* IEEE binary16 */
typedef struct mp_bf16 { uint16_t bits; } mp_bf16; /* bfloat16: float32's top half */

/* Wrap raw bits (what the named constants below expand to). */
static inline mp_f16 mp_f16_from_bits(uint16_t bits) { mp_f16 h; h.bits = bits; return h; }
static inline mp_bf16 mp_bf16_from_bits(uint16_t bits) { mp_bf16 h; h.bits = bits; return h; }

#define MP_F16_MAX           mp_f16_from_bits(0x7BFFu) /* 65504 */
#define MP_F16_MIN_NORMAL    mp_f16_from_bits(0x0400u) /* 2^-14 */
#define MP_F16_MIN_SUBNORMAL mp_f16_from_bits(0x0001u) /* 2^-24 */
#define MP_F16_EPSILON       mp_f16_from_bits(0x1400u) /* 2^-10, 1 ulp at 1.0 */
#define MP_F16_INF           mp_f16_from_bits(0x7C00u)
#define MP_F16_NAN           mp_f16_from_bits(0x7E00u) /* the default quiet NaN */
#define MP_BF16_MAX           mp_bf16_from_bits(0x7F7Fu) /* ~3.39e38 */
#define MP_BF16_MIN_NORMAL    mp_bf16_from_bits(0x0080u) /* 2^-126 */
#define MP_BF16_MIN_SUBNORMAL mp_bf16_from_bits(0x0001u) /* 2^-133 */
#define MP_BF16_EPSILON       mp_bf16_from_bits(0x3C00u) /* 2^-7 */
#define MP_BF16_INF           mp_bf16_from_bits(0x7F80u)
#define MP_BF16_NAN           mp_bf16_from_bits(0x7FC0u)

MIXPREC_API mp_f16 mp_f16_from_f32(float x);
MIXPREC_API float mp_f16_to_f32(mp_f16 h);
MIXPREC_API mp_bf16 mp_bf16_from_f32(float x);
MIXPREC_API float mp_bf16_to_f32(mp_bf16 h);
/* From double, rounding once (no double rounding through float32). */
MIXPREC_API mp_f16 mp_f16_from_f64(double x);
MIXPREC_API mp_bf16 mp_bf16_from_f64(double x);

MIXPREC_API mp_f16 mp_f16_add(mp_f16 a, mp_f16 b);
MIXPREC_API mp_f16 mp_f16_sub(mp_f16 a, mp_f16 b);
MIXPREC_API mp_f16 mp_f16_mul(mp_f16 a, mp_f16 b);
MIXPREC_API mp_f16 mp_f16_div(mp_f16 a, mp_f16 b);
MIXPREC_API mp_f16 mp_f16_sqrt(mp_f16 a);
MIXPREC_API mp_f16 mp_f16_neg(mp_f16 a);
MIXPREC_API mp_f16 mp_f16_abs(mp_f16 a);
MIXPREC_API int mp_f16_eq(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_lt(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_le(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_gt(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_ge(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_isnan(mp_f16 a);
MIXPREC_API int mp_f16_isinf(mp_f16 a);
MIXPREC_API int mp_f16_isfinite(mp_f16 a);

MIXPREC_API mp_bf16 mp_bf16_add(mp_bf16 a, mp_bf16 b);
MIXPREC_API mp_bf16 mp_bf16_sub(mp_bf16 a, mp_bf16 b);
MIXPREC_API mp_bf16 mp_bf16_mul(mp_bf16 a, mp_bf16 b);
MIXPREC_API mp_bf16 mp_bf16_div(mp_bf16 a, mp_bf16 b);
MIXPREC_API mp_bf16 mp_bf16_sqrt(mp_bf16 a);
MIXPREC_API mp_bf16 mp_bf16_neg(mp_bf16 a);
MIXPREC_API mp_bf16 mp_bf16_abs(mp_bf16 a);
MIXPREC_API int mp_bf16_eq(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_lt(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_le(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_gt(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_ge(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_isnan(mp_bf16 a);
MIXPREC_API int mp_bf16_isinf(mp_bf16 a);
MIXPREC_API int mp_bf16_isfinite(mp_bf16 a);

/* >>dtypes
   The float dtypes come first and MP_DTYPE_COUNT counts them: casts,
   tensors, policies, weights and backends take those alone. MP_INT32 sits
   past the count, for data only (class labels, integer inputs: see >>data),
   so that every table and check sized by MP_DTYPE_COUNT refuses it (mp_convert,
   mp_tensor_alloc, mp_matmul... give MP_ERR_DTYPE). */
typedef enum mp_dtype {
    MP_FLOAT32 = 0,
    MP_FLOAT16,
    MP_BFLOAT16,
    MP_DTYPE_COUNT, /* the float dtypes; not a dtype */
    MP_INT32        /* data only */
} mp_dtype;

MIXPREC_API const char *mp_dtype_name(mp_dtype dtype);  /* "float16", "int32"; NULL if invalid */
MIXPREC_API size_t mp_dtype_size(mp_dtype dtype);       /* bytes; 0 if invalid */
/* "float32", "float16", "bfloat16" or "int32". */
MIXPREC_API mp_status mp_dtype_from_name(const char *name, mp_dtype *out);

/* >>bulk casts
   mp_convert casts n elements between any two of float32, float16 and
   bfloat16 (same-type is a copy). dst and src must not overlap, except that
   dst == src is allowed when both dtypes have the same size. stats may be
   NULL; otherwise the cast ADDS to it (zero it first), so one mp_cast_stats
   can watch many tensors. On error nothing is written. */
typedef struct mp_cast_stats {
    uint64_t count;     /* elements converted */
    uint64_t nan_in;    /* NaN inputs (they stay NaN) */
    uint64_t inf_in;    /* infinite inputs (they stay infinite) */
    uint64_t overflow;  /* finite inputs that became Inf */
    uint64_t underflow; /* nonzero inputs that became zero */
    uint64_t subnormal; /* nonzero results in the subnormal range */
    float max_abs;      /* largest finite nonzero |input|; 0 if none */
    float min_abs;      /* smallest finite nonzero |input|; 0 if none */
} mp_cast_stats;

MIXPREC_API mp_status mp_convert(void *dst, mp_dtype dst_type, const void *src,
                                 mp_dtype src_type, size_t n, mp_cast_stats *stats);
/* The same with the portable C path only, never SIMD: for tests and benchmarks
   that compare the two in one binary. Results are identical. */
MIXPREC_API mp_status mp_convert_portable(void *dst, mp_dtype dst_type, const void *src,
                                          mp_dtype src_type, size_t n, mp_cast_stats *stats);

/* >>policies (Keras mixed_precision.Policy)
   "float32", "float16", "bfloat16": that dtype for compute and variables.
   "mixed_float16" / "mixed_bfloat16": compute in 16 bits, variables float32. */
typedef struct mp_policy {
    mp_dtype compute_dtype;  /* what layers compute and output in */
    mp_dtype variable_dtype; /* what layers store their weights in */
} mp_policy;

MIXPREC_API mp_status mp_policy_from_name(const char *name, mp_policy *out);
MIXPREC_API const char *mp_policy_name(mp_policy policy); /* NULL if invalid */
MIXPREC_API mp_dtype mp_policy_compute_dtype(mp_policy policy);
MIXPREC_API mp_dtype mp_policy_variable_dtype(mp_policy policy);
/* Writes Keras's repr, `<Policy "mixed_float16">`, NUL-terminated. */
MIXPREC_API mp_status mp_policy_repr(mp_policy policy, char *buf, size_t size);
/* The global policy (default float32) that new layers take: one for the
   process, set and read atomically with GCC and Clang (GLOBAL STATE). */
MIXPREC_API mp_status mp_set_global_policy(mp_policy policy);
MIXPREC_API mp_status mp_set_global_policy_name(const char *name);
MIXPREC_API mp_policy mp_global_policy(void);

/* >>memory
   Every byte mixprec allocates goes through MIXPREC_MALLOC/MIXPREC_FREE and
   is counted, like tf.config.experimental.get_memory_info: current and peak
   bytes in use. The counters are process-wide (GLOBAL STATE), updated
   atomically where the compiler is GCC or Clang. */
typedef struct mp_memory_info {
    size_t current; /* bytes allocated now */
    size_t peak;    /* most bytes allocated at once since the last reset */
} mp_memory_info;

MIXPREC_API mp_memory_info mp_get_memory_info(void);
MIXPREC_API void mp_reset_peak_memory(void); /* peak = current */

/* >>tensors
   A tensor's storage is in its dtype: a float16 tensor of n elements holds
   2n bytes. Shapes are row-major (the last axis is contiguous). */
#define MP_MAX_RANK 4
typedef struct mp_tensor {
    mp_dtype dtype;
    int rank;               /* 1..MP_MAX_RANK */
    int shape[MP_MAX_RANK]; /* shape[0..rank-1] */
    void *data;
} mp_tensor;

/* Allocates zeroed storage through the counted allocator. */
MIXPREC_API mp_status mp_tensor_alloc(mp_tensor *t, mp_dtype dtype, int rank, const int *shape);
MIXPREC_API void mp_tensor_free(mp_tensor *t); /* NULL-safe; data becomes NULL */
MIXPREC_API size_t mp_tensor_count(const mp_tensor *t); /* elements */
MIXPREC_API size_t mp_tensor_bytes(const mp_tensor *t);

/* >>threads
   A small persistent pool of worker threads (pthreads). MIXPREC_NO_THREADS,
   or a platform without POSIX threads or a compiler without GCC's __atomic
   builtins (GCC and Clang have them), compiles it out: everything then runs
   on the calling thread. Results never depend on the thread count. */
typedef struct mp_pool mp_pool;

MIXPREC_API int mp_available_cores(void); /* 1 without threads */
/* threads: 0 = mp_available_cores(). */
MIXPREC_API mp_status mp_pool_create(mp_pool **out, int threads);
MIXPREC_API void mp_pool_destroy(mp_pool *pool); /* NULL-safe */
MIXPREC_API int mp_pool_threads(const mp_pool *pool); /* 1 for NULL */

/* >>matmul
   C[m x n] = op(A)[m x k] op(B)[k x n], rows contiguous; op(A) = A^T when
   trans_a (A stored k x m), likewise B (stored n x k). Any mix of float32,
   float16 and bfloat16: products accumulate in float32 and round once into
   C's dtype. bfloat16 x bfloat16 uses Intel AMX tiles (AMX-BF16, where the
   compiler enables it and Linux grants the process the tile data) or else
   AVX512_BF16 dot products where the compiler enables them (both read
   bfloat16 subnormals as zero); float16 is widened with F16C while packing. With MIXPREC_USE_CBLAS, float32 x float32
   -> float32 goes to the linked CBLAS's cblas_sgemm. pool may be NULL (the
   calling thread alone). C must not overlap A or B (MP_ERR_OVERLAP): the
   kernels write C while they still read them. */
MIXPREC_API mp_status mp_matmul(mp_pool *pool, int trans_a, int trans_b, size_t m, size_t n, size_t k,
                                const void *a, mp_dtype a_type, const void *b, mp_dtype b_type, void *c,
                                mp_dtype c_type);

/* >>layers
   A model is a stack of layers described by mp_layer_desc (zero means the
   Keras default; the mp_dense(...) style helpers fill one in). A layer takes
   the global policy when it is added, unless `dtype` names a policy (the
   guide's Activation('softmax', dtype='float32')) or `policy` points to one. */
typedef enum mp_activation {
    MP_LINEAR = 0, /* Keras's default: no activation */
    MP_RELU,
    MP_SIGMOID,
    MP_SOFTMAX, /* over the last axis */
    MP_TANH,
    MP_GELU, /* exact: 0.5 x (1 + erf(x / sqrt 2)), Keras's approximate=False */
    MP_GELU_APPROXIMATE, /* Keras's gelu(x, approximate=True), GPT-2's tanh form:
                            0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
    MP_ACTIVATION_COUNT
} mp_activation;

typedef enum mp_layer_kind {
    MP_DENSE = 1,
    MP_ACTIVATION,
    MP_CONV2D,
    MP_MAX_POOLING2D,
    MP_FLATTEN,
    MP_DROPOUT,
    MP_BATCH_NORMALIZATION,
    MP_LAYER_NORMALIZATION,
    MP_ADD, /* the merges: two or more inputs (Subtract: two) */
    MP_SUBTRACT,
    MP_MULTIPLY,
    MP_AVERAGE,
    MP_CONCATENATE,
    MP_AVERAGE_POOLING2D,
    MP_GLOBAL_AVERAGE_POOLING2D,
    MP_RESHAPE,
    MP_EMBEDDING,            /* token ids (the model's input) -> rows of a float32 table */
    MP_POSITION_EMBEDDING,   /* a learned row per position (keras_hub's PositionEmbedding) */
    MP_MULTI_HEAD_ATTENTION, /* self-attention over (time, features) */
    MP_LAYER_KIND_COUNT
} mp_layer_kind;

/* The most inputs a layer takes (a merge's), and the id of the model's
   input in mp_model_call's inputs; layer ids count from 1 as added. */
enum { MP_MAX_LAYER_INPUTS = 8, MP_MODEL_INPUT = 0 };

typedef enum mp_padding { MP_VALID = 0, MP_SAME } mp_padding;

typedef struct mp_layer_desc {
    mp_layer_kind kind;
    int units;                /* Dense */
    int filters;              /* Conv2D */
    int kernel_size[2];       /* Conv2D, (h, w) */
    int strides[2];           /* Conv2D: 0 = 1 */
    int pool_size[2];         /* MaxPooling2D, AveragePooling2D: 0 = 2; strides = pool_size,
                                 padding valid */
    mp_padding padding;       /* Conv2D */
    float momentum;           /* BatchNormalization: 0 = 0.99 */
    float epsilon;            /* BatchNormalization, LayerNormalization: 0 = 1e-3 */
    int axis;                 /* Concatenate: 0 = -1, the last; Keras's numbering (1 = the
                                 first axis of a sample) */
    int target_shape[MP_MAX_RANK - 1]; /* Reshape: per sample, zero-terminated; one -1 is
                                          inferred */
    mp_activation activation; /* Dense, Conv2D, Activation */
    int no_bias;              /* Dense, Conv2D: nonzero = use_bias=False */
    float rate;               /* Dropout: fraction dropped, [0, 1) */
    uint64_t seed;            /* Dropout: 0 = derived from the model's seed */
    int input_dim;            /* Embedding: the vocabulary, ids in [0, input_dim) */
    int output_dim;           /* Embedding: the width of a row */
    int sequence_length;      /* PositionEmbedding: the positions it has rows for */
    int num_heads, key_dim;   /* MultiHeadAttention (value_dim = key_dim, as Keras's default) */
    int use_causal_mask;      /* MultiHeadAttention: nonzero = position i attends to 0..i only */
    const char *dtype;        /* policy name override ("float32"), or NULL */
    const mp_policy *policy;  /* policy override, or NULL */
    const char *name;         /* NULL = Keras-style automatic name ("dense_1") */
} mp_layer_desc;

MIXPREC_API mp_layer_desc mp_dense(int units, mp_activation activation);
MIXPREC_API mp_layer_desc mp_activation_layer(mp_activation activation);
MIXPREC_API mp_layer_desc mp_conv2d(int filters, int kernel_h, int kernel_w, mp_padding padding,
                                    mp_activation activation);
MIXPREC_API mp_layer_desc mp_max_pooling2d(int pool_h, int pool_w);
MIXPREC_API mp_layer_desc mp_flatten(void);
MIXPREC_API mp_layer_desc mp_dropout(float rate);
MIXPREC_API mp_layer_desc mp_batch_normalization(void);
MIXPREC_API mp_layer_desc mp_layer_normalization(void);
MIXPREC_API mp_layer_desc mp_add(void);
MIXPREC_API mp_layer_desc mp_subtract(void);
MIXPREC_API mp_layer_desc mp_multiply(void);
MIXPREC_API mp_layer_desc mp_average(void);
MIXPREC_API mp_layer_desc mp_concatenate(int axis);
MIXPREC_API mp_layer_desc mp_average_pooling2d(int pool_h, int pool_w);
MIXPREC_API mp_layer_desc mp_global_average_pooling2d(void);
MIXPREC_API mp_layer_desc mp_reshape(const int *target_shape); /* zero-terminated */
/* Sequences (docs/layers.md). Embedding reads the model's input, token
   ids as numbers (int32 or float32 data, exact integers in [0, input_dim):
   any other is refused, naming the sample and position), a sample of shape
   (time,) giving (time, output_dim): each id's row of the float32 table,
   cast to the compute dtype (Keras 3's Embedding; weight "embeddings",
   (input_dim, output_dim), initialised U(-0.05, 0.05)). */
MIXPREC_API mp_layer_desc mp_embedding(int input_dim, int output_dim);
/* keras_hub's PositionEmbedding: for an input (time, features), time <=
   sequence_length, the output is the table's first `time` rows, the same
   for every sample (weight "embeddings", (sequence_length, features),
   glorot_uniform); its input gives only the shape (no gradient flows to
   it). GPT-2's input is Add()(token embedding, PositionEmbedding of it). */
MIXPREC_API mp_layer_desc mp_position_embedding(int sequence_length);
/* Keras's MultiHeadAttention(num_heads, key_dim) called on one input,
   query = value = key, of shape (time, features): projections to
   num_heads heads of key_dim, softmax(q k^T / sqrt(key_dim)) v per head,
   the heads projected back to features. The logits and softmax in
   float32, the probabilities rounded to the compute dtype (Keras's fused
   path). use_causal_mask: position i attends to positions 0..i. Weights,
   as Keras 3 names them: query/kernel (features, heads, key_dim),
   query/bias (heads, key_dim), key/..., value/..., attention_output/kernel
   (heads, key_dim, features), attention_output/bias (features). */
MIXPREC_API mp_layer_desc mp_multi_head_attention(int num_heads, int key_dim, int use_causal_mask);
/* "relu", "sigmoid", "softmax", "tanh", "gelu", "gelu_approximate", "linear" */
MIXPREC_API mp_status mp_activation_from_name(const char *name, mp_activation *out);
MIXPREC_API const char *mp_activation_name(mp_activation a); /* NULL if invalid */

/* >>losses, metrics and optimizers (float32, Keras's formulas and defaults) */
typedef enum mp_loss {
    MP_LOSS_NONE = 0,
    MP_SPARSE_CATEGORICAL_CROSSENTROPY, /* int32 labels */
    MP_CATEGORICAL_CROSSENTROPY,        /* float targets, one row per sample */
    MP_BINARY_CROSSENTROPY,             /* float targets in [0, 1] */
    MP_MEAN_SQUARED_ERROR,              /* float targets */
    MP_LOSS_COUNT
} mp_loss;

typedef enum mp_optimizer_kind {
    MP_RMSPROP = 0, /* Keras compile()'s default optimizer */
    MP_SGD,
    MP_ADAM,
    MP_ADAMW,       /* Adam with decoupled weight decay (default 0.004) */
    MP_OPTIMIZER_COUNT
} mp_optimizer_kind;

/* Keras's learning-rate schedules (keras.optimizers.schedules), given to
   the optimizer in place of a constant learning rate and read at every
   step from the optimizer's iteration count (0 at the first step):
   ExponentialDecay: initial_learning_rate * decay_rate ^ (step / decay_steps),
       the exponent floored when staircase;
   CosineDecay: initial_learning_rate * ((1 - alpha) * c + alpha) with
       c = 0.5 (1 + cos(pi * min(step, decay_steps) / decay_steps)); alpha
       (Keras's default 0) is the floor, as a fraction of the initial rate.
       With a warmup_target (> 0; Keras 3's warmup_target and warmup_steps
       W, which may be 0) the rate first climbs linearly,
       (warmup_target - initial_learning_rate) * (step / W) +
       initial_learning_rate, for steps below W, and from W on decays from
       warmup_target as above, at step - W; initial_learning_rate may then
       be 0 (a warmup from zero).
   decay_steps is required (> 0); initial_learning_rate too (> 0) but for
   a warmup's start, and decay_rate (> 0) for ExponentialDecay. The
   schedule is part of the optimizer state a checkpoint holds. */
typedef enum mp_lr_schedule_kind {
    MP_LR_CONSTANT = 0, /* the optimizer's learning_rate */
    MP_EXPONENTIAL_DECAY,
    MP_COSINE_DECAY,
    MP_LR_SCHEDULE_COUNT
} mp_lr_schedule_kind;

typedef struct mp_lr_schedule {
    mp_lr_schedule_kind kind;
    float initial_learning_rate;
    uint64_t decay_steps;
    float decay_rate; /* ExponentialDecay */
    int staircase;    /* ExponentialDecay */
    float alpha;      /* CosineDecay: 0 = Keras's 0 */
    float warmup_target;   /* CosineDecay: the rate the warmup climbs to; 0 = Keras's None: no warmup */
    uint64_t warmup_steps; /* CosineDecay with a warmup_target */
} mp_lr_schedule;

/* The schedule's learning rate at an optimizer step; 0 for an invalid schedule. */
MIXPREC_API float mp_lr_schedule_value(const mp_lr_schedule *s, uint64_t step);

/* Zero means Keras's default. SGD: learning_rate 0.01, momentum 0, nesterov
   off. RMSprop: 0.001, rho 0.9, epsilon 1e-7. Adam: 0.001, beta_1 0.9,
   beta_2 0.999, epsilon 1e-7. AdamW: Adam's, and weight_decay 0.004.
   Each step, in Keras 3's order (keras/src/optimizers/base_optimizer.py,
   apply): the gradients unscaled (under loss scaling, once the step's
   Inf/NaN check passed; a skipped step goes no further), clipped, the
   weights decayed, then the update.
   Weight decay (any kind; Keras's base optimizer): decoupled, before the
   update, w -= w * weight_decay * lr, on every trainable variable but
   those whose path "LAYER/NAME" (mp_model_weight_info: "dense_1/bias")
   contains one of the strings of exclude_from_weight_decay, a
   NULL-terminated array (NULL: none excluded), as Keras's var_names
   (which are regular expressions; here plain substrings). compile reads
   the strings; they need not outlive it. no_weight_decay turns the decay
   off where its default is not 0 (AdamW); weight_decay must then be 0.
   Clipping: at most one of clipnorm (each variable's gradient scaled by
   clipnorm / max(|g|, clipnorm), |g| its L2 norm), clipvalue (each value
   into [-clipvalue, clipvalue]) and global_clipnorm (every gradient scaled
   by global_clipnorm * min(1 / |G|, 1 / global_clipnorm), |G| the norm of
   all of them together), as Keras's _clip_gradients; 0 = off. Norms are
   summed in float32 in a fixed order (the same bits at any thread count).
   A global norm that is Inf or NaN makes every gradient NaN, as Keras's
   clip_by_global_norm does; a variable's Inf norm scales its gradient by
   0, a NaN one by NaN, as Keras's _clip_by_norm (under loss scaling such a
   step was already skipped for its Inf/NaN gradient). With a communicator
   the norm is of the gradients summed over the ranks.
   Gradient accumulation (Keras 3's gradient_accumulation_steps N >= 2):
   one float32 accumulator per trainable weight (after the optimizer's
   slots in mp_get_optimizer_slots); each step's unscaled gradients are
   added to them, and the N-th step averages, (g + accumulated) * (1 / N)
   (Keras divides by N: the same bits where N is a power of two), then
   clips, decays and updates as above and zeroes them. Under loss scaling
   each step is checked and unscaled on its own: a step with Inf or NaN is
   dropped from the window (its gradients not added; the loss scale halves
   as ever), so a window holds N finite steps. The iteration count (Adam's
   t) counts updates; a schedule reads Keras's count of steps, iteration *
   N + N - 1 at an update. Each step then reads the found-Inf flag back
   (one small copy, a wait on a device) to know whether it ends a window.
   A checkpoint holds the accumulators and the window's count: a resume
   mid-window continues it. */
typedef struct mp_optimizer_desc {
    mp_optimizer_kind kind;
    float learning_rate;
    float momentum; /* SGD */
    int nesterov;   /* SGD */
    float rho;      /* RMSprop */
    float beta_1, beta_2;
    float epsilon;
    mp_lr_schedule schedule; /* zero: the constant learning_rate; else learning_rate is ignored */
    float weight_decay;      /* >= 0; 0 = the kind's default (AdamW 0.004, others none) */
    int no_weight_decay;     /* nonzero: no decay, whatever the kind's default */
    const char *const *exclude_from_weight_decay; /* substrings of variable paths, NULL-terminated */
    float clipnorm, clipvalue, global_clipnorm;   /* > 0 to clip; at most one */
    int gradient_accumulation_steps;              /* 0 = none, else >= 2 (Keras 3's) */
} mp_optimizer_desc;

/* >>loss scaling (Keras LossScaleOptimizer)
   Dynamic by default: start at 2^15; after growth_interval (2000)
   consecutive steps with finite gradients double the scale (only if the
   result is finite, and not past max_scale); on a step with any Inf/NaN
   gradient skip the step (weights and optimizer slots untouched), halve the
   scale (not below min_scale, tf_keras's floor of 1) and reset the counter.
   hysteresis H > 1 (DeepSpeed's extra) halves only at the H-th overflow since
   the scale last changed; every overflowing step is still skipped. */
typedef struct mp_loss_scale_desc {
    int fixed;            /* nonzero: the scale stays initial_scale; bad steps still skip */
    float initial_scale;  /* 0 = 32768 (2^15) */
    int growth_interval;  /* 0 = 2000 */
    float min_scale;      /* 0 = 1 */
    float max_scale;      /* 0 = no ceiling but finiteness */
    int hysteresis;       /* 0 or 1 = halve at the first overflow (Keras) */
} mp_loss_scale_desc;

typedef struct mp_loss_scale {
    mp_loss_scale_desc config; /* with defaults filled in */
    float scale;
    uint64_t good_steps;    /* consecutive finite steps since the scale last changed */
    uint64_t skipped_steps; /* steps skipped for Inf/NaN gradients, ever */
    uint64_t steps;         /* all steps, skipped ones included */
    int overflows_left;     /* hysteresis: overflows tolerated before halving */
} mp_loss_scale;

/* desc NULL (or zero fields) means Keras's defaults; MP_ERR_ARG if out of range. */
MIXPREC_API mp_status mp_loss_scale_init(mp_loss_scale *ls, const mp_loss_scale_desc *desc);
/* One step of the state machine. Returns 1 when the step's gradients are to
   be applied (they were finite), 0 when the step is skipped. */
MIXPREC_API int mp_loss_scale_update(mp_loss_scale *ls, int grads_finite);

typedef enum mp_loss_scale_mode {
    MP_LOSS_SCALE_AUTO = 0, /* Keras: dynamic under mixed_float16, else none */
    MP_LOSS_SCALE_NONE,
    MP_LOSS_SCALE_ON        /* always wrap, configured by loss_scale_config */
} mp_loss_scale_mode;

typedef enum mp_metric { MP_METRIC_NONE = 0, MP_METRIC_ACCURACY } mp_metric;

/* >>automatic mixed precision (TensorFlow's auto_mixed_precision graph rewrite)
   compile() with amp.enabled (or MIXPREC_AUTO_MIXED_PRECISION=1 in the
   environment, TensorFlow's TF_ENABLE_AUTO_MIXED_PRECISION) rewrites a
   float32 model as TensorFlow's grappler pass rewrites a graph. The model is
   read as a graph of ops with TensorFlow's names, each reading the op
   before it in its layer (a layer's first op: the last op of each layer it
   reads, or the input batch): Dense is MatMul, BiasAdd (unless no_bias) and
   its activation's op; Conv2D is Conv2D, BiasAdd and the activation's op;
   the activations are Relu, Sigmoid, Tanh, Softmax and Gelu (linear adds
   none; an Activation layer of linear is Identity); MaxPooling2D is
   MaxPool, Flatten and Reshape Reshape, Dropout Dropout,
   AveragePooling2D AvgPool, GlobalAveragePooling2D Mean (Keras's mean over
   the rows and columns), BatchNormalization FusedBatchNormV3 (tf_keras's
   fused kernel: float32 statistics, scale and offset beside 16-bit data);
   LayerNormalization is Keras's moments then the normalisation: Mean,
   SquaredDifference (of the input and the mean), Mean, Rsqrt, Mul (the
   input by it), AddV2; Add and Multiply are AddV2 and Mul once per input
   after the first (Keras sums in turn), Subtract Sub, Average AddV2s then
   RealDiv, Concatenate ConcatV2 (reading all its inputs). The loss is
   SparseSoftmaxCrossEntropyWithLogits or SoftmaxCrossEntropyWithLogits from
   logits, Log then Sum from probabilities; binary crossentropy Exp, Log1p,
   Mean from logits, Log, Mean from probabilities; mean squared error
   SquaredDifference, Mean; then every loss a Mean over the batch.
   When the loss is read from the logits (from_logits, or a softmax or
   sigmoid output, see mp_compile_desc) its op is the fused one. Each op is
   on one list (TensorFlow's, auto_mixed_precision_lists.h), per dtype:
       allow   MatMul Conv2D
       infer   BiasAdd Sigmoid Tanh Softmax Gelu Log Log1p FusedBatchNormV3
               AddV2 Sub Mul RealDiv AvgPool
               (bfloat16 also: Sum Mean SquaredDifference Rsqrt)
       clear   Relu MaxPool Reshape Dropout Identity ConcatV2
       deny    Exp SparseSoftmaxCrossEntropyWithLogits
               SoftmaxCrossEntropyWithLogits (float16 also: Sum Mean)
       (none)  float16: SquaredDifference Rsqrt, never converted
   float16 uses the float16 lists (a GPU's, and auto_mixed_precision_cpu's),
   bfloat16 the oneDNN bfloat16 lists (auto_mixed_precision_onednn_bfloat16).
   The ops are painted in TensorFlow's order, each pass along the graph's
   edges (an op's several readers, a merge's several inputs): 1) allow ops
   are low precision; 2) deny spreads forward from deny ops through infer
   and clear ops that lead (via clear ops) to an infer or deny op; 3) infer
   and clear ops on a path from an allow op to an allow op, and not deny,
   become allow; 4) an infer op (not deny) that reads an allow op and no
   deny op becomes allow, in order, so that it chains (the last Dense's
   BiasAdd, then the Softmax after it); 5) allow spreads along edges both
   ways through clear ops that are not deny. A cast goes in wherever a
   float32 op (or the input batch) feeds a low-precision op and back; as
   TensorFlow does, an output read by several low-precision ops is cast
   once. Levels, as TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL:
   TENSOR_CORES_ONLY empties every float16 list but allow (no propagation;
   the bfloat16 lists ignore it, as TensorFlow's oneDNN lists do);
   UNSAFE_FORCE_ALL converts every op (float16 only: TensorFlow refuses it
   when oneDNN is used, and so does compile under bfloat16).
   A layer still runs its ops fused (one float32 accumulation, one rounding):
   it computes (reads its input and weights) in the dtype of its first op and
   writes its output in the dtype of its last op, so a Dense whose BiasAdd
   stays float32 multiplies in float16 and outputs float32, reading its bias
   from the float32 weight; the normalizations read their weights in float32
   and take their statistics in float32 whatever their ops' dtype (so a
   LayerNormalization whose Mean stays float32 reads its input in float32
   and may write float16). Backward ops are not counted: each takes its forward op's dtype (activation gradients
   in the activations' dtype, weight gradients in the compute dtype). The
   loss value stays float32. Under float16 compile wraps the optimizer for
   dynamic loss scaling as under mixed_float16 (loss_scale decides as ever);
   under bfloat16 it does not. compile prints TensorFlow's summary line,
       Converted X/Y nodes to float16 precision using Z cast(s) to float16
       (excluding Const and Variable casts)
   (one line; bfloat16 in bfloat16 mode): Y ops, X of them converted, Z casts
   to low precision, one per float32 output that converted ops read (the
   input batch's counts; the weights, TensorFlow's Variables, do not), and
   with verbose the colouring per op.
   Lists are edited by comma-separated op names, added then removed: first
   the fields here, then the environment's MIXPREC_AMP_ALLOWLIST_ADD,
   MIXPREC_AMP_ALLOWLIST_REMOVE and the same for DENYLIST, INFERLIST and
   CLEARLIST; MIXPREC_AMP_LEVEL (DEFAULT, TENSOR_CORES_ONLY or
   UNSAFE_FORCE_ALL) and MIXPREC_AMP_DTYPE (float16, bfloat16) override the
   fields. Errors (compile fails, the model unchanged): a layer whose policy
   is not float32, or an op on two lists after the edits, or a bad dtype or
   level: MP_ERR_ARG naming it; a name that is no op above:
   MP_ERR_UNKNOWN_NAME. */
typedef enum mp_amp_level {
    MP_AMP_DEFAULT = 0,
    MP_AMP_TENSOR_CORES_ONLY, /* float16: only allow ops convert (the other lists are empty) */
    MP_AMP_UNSAFE_FORCE_ALL   /* every op converts, deny ops included */
} mp_amp_level;

typedef struct mp_amp_desc {
    int enabled;         /* zero: off unless MIXPREC_AUTO_MIXED_PRECISION=1 */
    mp_dtype dtype;      /* MP_FLOAT16 or MP_BFLOAT16; 0 (MP_FLOAT32) = float16 */
    mp_amp_level level;
    const char *allow_add, *allow_remove, *deny_add, *deny_remove; /* "Op,Op", or NULL */
    const char *infer_add, *infer_remove, *clear_add, *clear_remove;
    int verbose;         /* compile also prints the colouring per op */
} mp_amp_desc;

struct mp_model;
/* TensorFlow's summary line (above; no newline), or TensorFlow's "No
   allowlist ops found, nothing to do" when no op is on the allow list.
   MP_ERR_STATE when the last compile ran without AMP; MP_ERR_SIZE when buf
   is too small (the text is cut, NUL-terminated). Needs no stdio. */
MIXPREC_API mp_status mp_model_amp_report(const struct mp_model *m, char *buf, size_t size);
/* The colouring: a header line, then a line per op: op, layer ("(loss)" for
   the loss's ops), list after the edits ("-" for none), dtype. Errors as
   mp_model_amp_report. */
MIXPREC_API mp_status mp_model_amp_table(const struct mp_model *m, char *buf, size_t size);

typedef struct mp_compile_desc {
    mp_loss loss;              /* required */
    /* crossentropy losses: the model outputs logits. Without it, as in
       Keras, a crossentropy whose model ends in a softmax (sigmoid for
       binary crossentropy) over the loss's row is still computed from that
       activation's input, the logits: a stable log-sum-exp in float32, no
       clipping, and the gradient skips the activation; the output (what
       predict and the accuracy see) stays the probabilities. Otherwise the
       probabilities are clipped to [1e-7, 1 - 1e-7]. */
    int from_logits;
    mp_optimizer_desc optimizer;
    mp_metric metrics;         /* accuracy: sparse categorical, categorical or binary by loss */
    mp_loss_scale_mode loss_scale;
    mp_loss_scale_desc loss_scale_config;
    mp_amp_desc amp;           /* automatic mixed precision: zero = off (see above) */
} mp_compile_desc;

/* >>model
   A sequential model: create, add layers, compile, fit (QUICK START above
   builds the TensorFlow guide's model).
   On failure a function returns a status and mp_model_error() says what in
   detail (which layer, which shape). */
typedef struct mp_model mp_model;
typedef struct mp_backend mp_backend;
typedef struct mp_communicator mp_communicator;

typedef struct mp_model_desc {
    int input_shape[MP_MAX_RANK - 1]; /* per sample, zero-terminated: {784} or {28, 28, 1} */
    uint64_t seed;                    /* initialisers, dropout, shuffling; 0 = 1337 */
    const char *name;                 /* NULL: "sequential", or "functional" once a layer
                                         reads another than the one before it (Keras 3's) */
    const mp_backend *backend;        /* NULL = the CPU (see >>backends) */
    const void *backend_config;       /* the backend's own options, or NULL */
    int threads;                      /* 0 = mp_available_cores() */
    const mp_communicator *comm;      /* NULL = one process (see >>communicator) */
    mp_dtype allreduce_dtype;         /* with comm: MP_FLOAT32 (0), or the gradients' sum
                                         in float16/bfloat16: half the bytes */
} mp_model_desc;

MIXPREC_API mp_status mp_model_create(mp_model **out, const mp_model_desc *desc);
MIXPREC_API void mp_model_destroy(mp_model *m); /* NULL-safe */
MIXPREC_API mp_status mp_model_add(mp_model *m, mp_layer_desc layer);
/* The functional API (Keras's y = layer(x), or layer([a, b]) for a merge):
   the layer reads the outputs of `inputs`, n_inputs ids of earlier layers
   (MP_MODEL_INPUT: the model's input); inputs NULL and n_inputs 0 is the
   layer added last, as mp_model_add. *id (may be NULL) gets the new
   layer's id. The model's output is the layer added last; every other
   layer must feed one. */
MIXPREC_API mp_status mp_model_call(mp_model *m, mp_layer_desc layer, const int *inputs, int n_inputs, int *id);
/* Allocates and initialises the weights (glorot_uniform kernels, zero
   biases, from the model's seed). compile, fit, get/set_weights build
   implicitly; no layer can be added after. */
MIXPREC_API mp_status mp_model_build(mp_model *m);
MIXPREC_API mp_status mp_model_compile(mp_model *m, const mp_compile_desc *desc);
MIXPREC_API const char *mp_model_error(const mp_model *m); /* never NULL */

typedef struct mp_layer_info {
    const char *name;    /* "dense_1" */
    const char *type;    /* "Dense" */
    mp_policy policy;
    int rank;            /* of the output per sample */
    int output_shape[MP_MAX_RANK - 1];
    size_t params;           /* all its weights, Keras's layer.count_params() */
    size_t trainable_params; /* less the non-trainable (BatchNormalization's moving statistics) */
    mp_dtype compute_dtype; /* what it reads its input and weights in */
    mp_dtype output_dtype;  /* what its output is stored in: compute_dtype but under AMP */
} mp_layer_info;

MIXPREC_API int mp_model_layer_count(const mp_model *m);
MIXPREC_API mp_status mp_model_layer_info(const mp_model *m, int index, mp_layer_info *out);
MIXPREC_API mp_policy mp_model_policy(const mp_model *m); /* the global policy at creation */
MIXPREC_API int mp_model_threads(const mp_model *m);

/* Where a model's bytes are: float32 weights and gradients with their
   compute-dtype copies; optimizer slots; activations, their gradients and
   the batch buffers (for the largest batch so far); the thread pool's GEMM
   workspaces (packed panels and float32 sums). */
typedef struct mp_model_memory {
    size_t weights, optimizer, activations, workspace;
    /* all the bytes the model's backend holds now and at most since the
       model was created: the host's for the CPU, device memory for a GPU */
    size_t current, peak;
    const char *backend; /* "cpu", "cuda" */
    size_t fallbacks;    /* products the backend ran on a slower path than their dtypes ask
                            (a refused 16-bit plan widened to float32...); 0 on the CPU */
} mp_model_memory;
MIXPREC_API mp_status mp_model_memory_info(const mp_model *m, mp_model_memory *out);
/* Every weight, as Keras's count_params() and get_weights (n of
   mp_model_get_weights): the trainable ones and BatchNormalization's moving
   statistics. */
MIXPREC_API size_t mp_model_param_count(const mp_model *m);
/* The trainable weights alone: what gradients are taken of (n of
   mp_get_gradients). */
MIXPREC_API size_t mp_model_trainable_param_count(const mp_model *m);
MIXPREC_API size_t mp_model_input_size(const mp_model *m);  /* values per sample of x (>>data) */
MIXPREC_API size_t mp_model_output_size(const mp_model *m); /* floats per sample */
/* Keras's model.summary() with a Policy column, into buf (NUL-terminated).
   A functional model (one whose layers do not each read the one before)
   gets Keras's functional columns: an input_layer (InputLayer) row first,
   then "Connected to" after the Policy column ("add (Add) ... dense_1[0][0],
   input_layer[0][0]"). Param # counts every weight of a layer, and the
   totals split them as Keras does: BatchNormalization's moving statistics
   are non-trainable. */
MIXPREC_API mp_status mp_model_summary(const mp_model *m, char *buf, size_t size);
/* All weights as float32, layer by layer (kernel then bias): n = param count. */
MIXPREC_API mp_status mp_model_get_weights(mp_model *m, float *dst, size_t n);
MIXPREC_API mp_status mp_model_set_weights(mp_model *m, const float *src, size_t n);

/* One weight of get_weights, Keras 3's model.weights entry: its variable
   path is "LAYER/NAME" ("dense_1/kernel"), its shape Keras's layout (Dense
   (in, units), Conv2D (kh, kw, in, filters)). Index 0 ... weight_count - 1
   in get_weights' order; offset is where its values start there, and for a
   trainable weight gradient_offset where they start in mp_get_gradients. */
typedef struct mp_weight_info {
    const char *layer;     /* "dense_1": the layer's name */
    const char *name;      /* "kernel", "bias", "gamma", "beta", "moving_mean", "moving_variance" */
    int layer_index;
    int trainable;         /* 0: BatchNormalization's moving statistics */
    int rank;
    int shape[MP_MAX_RANK];
    size_t size;            /* values: the product of the shape */
    size_t offset;          /* in mp_model_get_weights' array */
    size_t gradient_offset; /* in mp_get_gradients' array (trainable weights only, else 0) */
} mp_weight_info;
MIXPREC_API int mp_model_weight_count(const mp_model *m);
MIXPREC_API mp_status mp_model_weight_info(const mp_model *m, int index, mp_weight_info *out);

/* >>data: arrays, what fit, evaluate, predict and the custom loop read
   (docs/data.md). An mp_array is a view of the caller's array: n samples,
   samples first, each sample's values contiguous and row-major (C order,
   NumPy's default), so sample i starts at element i x (its shape's
   product). mixprec reads it during the call only: it never copies it
   (a device backend sends each batch, or fit's data once), keeps it or
   frees it. Every entry point that reads data checks it before anything
   changes, and refuses with the model's error naming both shapes:
   - the inputs given (the x[i] whose data is set) are as many as the
     model takes, from x[0] on (a sequential model takes one: x[0]);
   - x's per-sample count (its shape's product) is the model's input size:
     a sample of another shape with the same count is taken as a C reshape
     is, for free; its dtype is float32 or int32 (MP_ERR_DTYPE);
   - y has as many samples as x, and fits the loss: int32 class indices,
     one per sample ((n,) or (n, 1)), for sparse categorical crossentropy;
     float32 rows of the model's output size for the other losses;
   - ranks are 0 to MP_MAX_RANK, axes positive, sizes overflow-checked.
   int32 x given to a float model is converted to float32 as Keras converts
   an integer array fed to a float Input: exactly up to 2^24 in magnitude,
   beyond that rounded to the nearest float32 (ties to even). */
typedef struct mp_array {
    const void *data;        /* NULL: absent */
    mp_dtype dtype;          /* MP_FLOAT32 (zero) or MP_INT32 */
    size_t n;                /* samples: Keras's batch axis (None) */
    int rank;                /* of ONE sample: 0 a scalar per sample (a class index),
                                1 (features,), 3 (h, w, c) */
    int shape[MP_MAX_RANK];  /* one sample's shape[0..rank-1] */
} mp_array;
/* shape: rank sizes (NULL for rank 0); a rank past MP_MAX_RANK is kept for
   the checks to refuse, with no shape. */
MIXPREC_API mp_array mp_array_f32(const float *data, size_t n, int rank, const int *shape);
MIXPREC_API mp_array mp_array_i32(const int32_t *data, size_t n, int rank, const int *shape);
/* The two everyday ones: (n, width) float32 rows, and (n,) int32 class indices. */
MIXPREC_API mp_array mp_rows(const float *x, size_t n, int width);
MIXPREC_API mp_array mp_labels(const int32_t *labels, size_t n);

#define MP_MAX_INPUTS 8
typedef struct mp_data {
    mp_array x[MP_MAX_INPUTS]; /* the model's inputs in order (one-input models: x[0]);
                                  unused ones: data NULL */
    mp_array y;                /* targets: int32 class indices for sparse crossentropy
                                  ((n,) or (n, 1)); float32 (n, outputs) for the other
                                  losses; not read by predict */
} mp_data;
/* usage: mp_data d = {.x = {mp_rows(x, n, 784)}, .y = mp_labels(labels, n)}; */

/* Keras's to_categorical: out[i][labels[i]] = 1, the rest 0, as n rows of
   num_classes floats (0: 1 + the largest label, as Keras). MP_ERR_LABEL
   for a label below 0 or not below num_classes, MP_ERR_SIZE when out_count
   (the floats out holds) is less than n x num_classes; nothing is written
   then. */
MIXPREC_API mp_status mp_to_categorical(const int32_t *labels, size_t n, int num_classes, float *out,
                                        size_t out_count);

/* >>fit */

typedef struct mp_logs {
    float loss, accuracy;         /* accuracy: 0 without the metric */
    float val_loss, val_accuracy; /* 0 without validation data */
    float seconds;                /* wall time of the epoch, validation included (Keras); processor
                                     time where the platform has no wall clock (its line says so) */
    float ms_per_step;
    size_t steps;
    float loss_scale;             /* at the end of the epoch (1 without scaling) */
    uint64_t skipped_steps;       /* since compile */
    float learning_rate;          /* the optimizer's, at the end of the epoch or step */
} mp_logs;

/* >>fit: callbacks, Keras's keras.callbacks. fit calls each hook of each
   callback (NULL hooks are skipped) in the order given, then its built-in
   ones: the history (mp_fit_desc.history), the CSV log (csv_path) and the
   progress bar (verbose). Logs: on_batch_end gets the epoch's running loss
   and accuracy, the loss scale, skipped steps and learning rate;
   on_epoch_end all of mp_logs; on_train_begin/end and on_epoch_begin get
   NULL. A hook that returns a status other than MP_OK ends fit with it (a
   hook that fails should say why through the model, e.g. by the mixprec
   call that failed). on_train_end runs for every callback whose
   on_train_begin ran, also when fit fails (state->status says so), so that
   a callback can give back what it took. */
typedef struct mp_fit_state {
    mp_model *model;
    int epoch;          /* 0-based (Keras's epoch argument) */
    int epochs;         /* fit's epochs: the last epoch is epochs - 1 */
    int initial_epoch;
    size_t step;        /* on_batch_end: 0-based batch index in the epoch (Keras's batch) */
    size_t steps;       /* per epoch */
    int has_accuracy;   /* the accuracy metric is compiled */
    int has_validation; /* validation_data, or samples validation_split set apart */
    int stop_training;  /* a hook sets it: fit ends after this batch or epoch (Keras's model.stop_training) */
    mp_status status;   /* on_train_end: how fit ended */
    /* data-parallel (>>communicator): batch_size is the global batch, split
       across num_replicas; one process: 1, and both sizes are batch_size */
    int num_replicas;
    int replica;          /* this process's rank */
    size_t global_batch;  /* samples a step, over all replicas */
    size_t replica_batch; /* at most this many on each (ceil(global / replicas)) */
} mp_fit_state;

typedef mp_status (*mp_callback_fn)(void *user, mp_fit_state *state, const mp_logs *logs);

typedef struct mp_callback {
    mp_callback_fn on_train_begin, on_train_end;
    mp_callback_fn on_epoch_begin, on_epoch_end;
    mp_callback_fn on_batch_end;
    void *user; /* passed to every hook */
} mp_callback;

typedef enum mp_verbose {
    MP_VERBOSE_AUTO = 0, /* a live bar on a terminal, one line per epoch otherwise */
    MP_VERBOSE_SILENT,
    MP_VERBOSE_BAR,
    MP_VERBOSE_LINES
} mp_verbose;

typedef struct mp_fit_desc {
    mp_data data;            /* x and y (see >>data) */
    int batch_size;          /* 0 = 32 (Keras's batch_size=None) */
    int epochs;              /* 0 = 1 */
    float validation_split;  /* the last fraction of data, before shuffling (as Keras): ceil(n x split)
                                samples, counted in integers (docs/reliability.md, what a failed call guarantees) */
    mp_data validation_data; /* zero: none. Given (x[0].data set), it is what each epoch
                                validates on and validation_split is not used: Keras's
                                precedence ("validation_data will override
                                validation_split") */
    int no_shuffle;          /* nonzero: keep the order */
    uint64_t shuffle_seed;   /* 0 = the model's seed */
    mp_verbose verbose;
    mp_logs *history;        /* NULL, or an array of `epochs - initial_epoch` entries */
    const char *csv_path;    /* NULL, or a CSV log written as it trains (needs stdio) */
    int csv_per_step;        /* nonzero: a row per step too, not only per epoch */
    int host_data;           /* nonzero: send each batch from the host. 0: a device backend
                                uploads float32 data once when it fits in half its free memory,
                                and shuffles and batches it there (fit's second line says so);
                                int32 x always goes from the host, converted batch by batch */
    int initial_epoch;       /* resume at this epoch index (Keras): epochs is then the
                                final epoch; the skipped epochs' shuffles are replayed,
                                so the order is the uninterrupted run's */
    const mp_callback *callbacks; /* callback_count of them, or NULL */
    int callback_count;
} mp_fit_desc;

MIXPREC_API mp_status mp_model_fit(mp_model *m, const mp_fit_desc *desc);
/* batch_size 0 = 32, as fit's. */
MIXPREC_API mp_status mp_model_evaluate(mp_model *m, const mp_data *data, int batch_size,
                                        mp_logs *out);
/* data->x's predictions into out: [n, outputs] float32, out_count the
   floats out holds (fewer than n x outputs: MP_ERR_SIZE, naming both);
   data->y is not read. batch_size 0 = 32. */
MIXPREC_API mp_status mp_model_predict(mp_model *m, const mp_data *data, int batch_size, float *out,
                                       size_t out_count);

/* >>fit: built-in callbacks. Each keeps its settings and its state in a
   struct the caller owns (zero means Keras's default); mp_..._callback(p)
   returns the callback for mp_fit_desc.callbacks. Monitored values have
   the names of Keras's logs: "loss", "accuracy", "val_loss",
   "val_accuracy", "learning_rate". Mode AUTO maximises a name with "acc" in
   it and minimises the others (Keras). A val_ name without validation data
   (validation_data or validation_split), or another name, is MP_ERR_ARG at
   on_train_begin. */
typedef enum mp_monitor_mode { MP_MODE_AUTO = 0, MP_MODE_MIN, MP_MODE_MAX } mp_monitor_mode;

/* History: each epoch's logs in epochs[epoch - initial_epoch] (as many as
   capacity holds); count: how many were written. */
typedef struct mp_history {
    mp_logs *epochs;
    int capacity;
    int count; /* written by the callback */
} mp_history;
MIXPREC_API mp_callback mp_history_callback(mp_history *h);

/* EarlyStopping: stops fit when the monitored value has not improved (by
   more than |min_delta|) for patience epochs; an epoch improves when it
   beats the best so far, and restarts the patience only if it also beats
   the baseline (when there is one). With restore_best_weights the model
   gets the weights of its best epoch back when training ends (Keras 3).
   verbose prints "Epoch N: early stopping" and the restore. */
typedef struct mp_early_stopping {
    const char *monitor;      /* NULL = "val_loss" */
    float min_delta;
    int patience;             /* 0 (Keras's default): stop at the first epoch without improvement */
    int verbose;
    mp_monitor_mode mode;
    const float *baseline;    /* NULL = none */
    int restore_best_weights;
    int start_from_epoch;     /* epochs to let pass before monitoring */
    /* written by the callback */
    int wait;                 /* epochs since the last improvement */
    int stopped_epoch;        /* 0-based epoch it stopped at; 0 when it did not */
    int best_epoch;           /* -1 until an epoch was monitored */
    float best;
    float *best_weights;      /* allocated during fit when restore_best_weights */
} mp_early_stopping;
MIXPREC_API mp_callback mp_early_stopping_callback(mp_early_stopping *es);

/* LearningRateScheduler: at each epoch's start the optimizer's learning rate
   becomes schedule(user, epoch, learning rate now); it must be finite and
   positive (MP_ERR_ARG). The optimizer must have a constant rate, not a
   mp_lr_schedule (MP_ERR_STATE, as Keras refuses to set a schedule's rate).
   verbose prints Keras's line for each change. */
typedef float (*mp_lr_schedule_fn)(void *user, int epoch, float learning_rate);
typedef struct mp_lr_scheduler {
    mp_lr_schedule_fn schedule; /* required */
    void *user;
    int verbose;
} mp_lr_scheduler;
MIXPREC_API mp_callback mp_lr_scheduler_callback(mp_lr_scheduler *s);

/* The learning rate of the optimizer's next step (0 before compile), and a
   new constant one: MP_ERR_STATE before compile or under a mp_lr_schedule,
   MP_ERR_ARG unless finite and positive. A checkpoint holds it. */
MIXPREC_API float mp_model_learning_rate(const mp_model *m);
MIXPREC_API mp_status mp_model_set_learning_rate(mp_model *m, float learning_rate);

#ifndef MIXPREC_NO_STDIO
/* ProgbarLogger: Keras's progress bar, "Epoch 1/5" then
   `6/6 [====>.....] - ETA: 1s - loss: ...` redrawn in place (verbose BAR,
   or AUTO on a terminal) or one line per epoch (LINES, or AUTO otherwise):
   `6/6 [======] - <epoch time> <time a step>/step - loss: ... -
   val_accuracy: ...`. */
typedef struct mp_progbar_logger {
    mp_verbose verbose;
    /* written by the callback */
    int live;
    size_t last_len;
    long start_sec, start_nsec;
} mp_progbar_logger;
MIXPREC_API mp_callback mp_progbar_logger_callback(mp_progbar_logger *p);

/* CSVLogger: `kind,epoch,step,loss,accuracy,val_loss,val_accuracy,
   loss_scale,skipped_steps`, an `epoch` row after every epoch and, with
   per_step, a `step` row after every step (the epoch's running means); step
   counts from the start of the fit. append (Keras: append=False) adds to
   the file, with the header only when it is empty. MP_ERR_IO when the file
   cannot be opened or written. */
typedef struct mp_csv_logger {
    const char *filename; /* required */
    int append;
    int per_step;
    void *file;           /* written by the callback: the FILE during fit */
} mp_csv_logger;
MIXPREC_API mp_callback mp_csv_logger_callback(mp_csv_logger *c);

/* ModelCheckpoint: after every epoch saves a checkpoint (mp_model_save,
   atomic) or, with save_weights_only, the float32 inference weights
   (mp_model_export_weights) to filepath, in which "{epoch}" or "{epoch:02d}"
   (any width) becomes the 1-based epoch. save_best_only saves only when the
   monitored value beats the best so far. verbose prints Keras's lines. A
   failed save ends fit with its status. */
typedef struct mp_model_checkpoint {
    const char *filepath;  /* required */
    const char *monitor;   /* NULL = "val_loss" */
    int verbose;
    int save_best_only;
    int save_weights_only;
    mp_monitor_mode mode;
    /* written by the callback */
    float best;            /* +-inf until an epoch was monitored */
    int saves;
} mp_model_checkpoint;
MIXPREC_API mp_callback mp_model_checkpoint_callback(mp_model_checkpoint *c);
#endif

/* >>custom training loop: the guide's train_step, one call per line
       mp_data b = {.x = {mp_rows(x, n, 784)}, .y = mp_labels(labels, n)};
       mp_forward(m, &b, 1);                             // predictions = model(x)
       mp_compute_loss(m, &b.y, &loss, NULL);            // loss = loss_object(y, predictions)
       scaled = mp_get_scaled_loss(m, loss);             // optimizer.get_scaled_loss(loss)
       mp_compute_scaled_gradients(m);                   // tape.gradient(scaled_loss, ...)
       mp_get_unscaled_gradients(m);                     // optimizer.get_unscaled_gradients
       mp_apply_gradients(m, &applied);                  // optimizer.apply_gradients
   Without loss scaling the scale is 1 and the calls are the same. Between
   the last two, mp_get_gradients and mp_set_gradients read and replace
   the unscaled gradients. */
/* A batch of batch->x's n samples through the model (training: Keras's
   training argument); batch->y is not read. */
MIXPREC_API mp_status mp_forward(mp_model *m, const mp_data *batch, int training);
/* The last forward's output, in the last layer's compute dtype, where the
   host can read it (from a GPU: a copy, valid until the next call). */
MIXPREC_API mp_status mp_output(const mp_model *m, mp_tensor *out);
/* The compiled loss (float32, mean over the batch) of the last forward's
   output against y (the last forward's n samples, as the loss takes them:
   see >>data). *correct gets the number of samples the accuracy metric
   counts as right (may be NULL). */
MIXPREC_API mp_status mp_compute_loss(mp_model *m, const mp_array *y, float *loss, size_t *correct);
MIXPREC_API float mp_get_scaled_loss(const mp_model *m, float loss);
/* Backpropagates the scaled loss: weight gradients in each layer's compute
   dtype, activation gradients in the dtype of the activations. */
MIXPREC_API mp_status mp_compute_scaled_gradients(mp_model *m);
/* One fused pass: float32 gradients = scaled gradients * (1 / scale), and
   whether any is Inf or NaN (checked on the scaled values, as Keras). */
MIXPREC_API mp_status mp_get_unscaled_gradients(mp_model *m);
/* Applies the float32 gradients to the float32 weights, or skips the step if
   they were not finite, then updates the loss scale. applied may be NULL. */
MIXPREC_API mp_status mp_apply_gradients(mp_model *m, int *applied);
/* The float32 gradients of the last mp_get_unscaled_gradients (or fit's
   last step in one process: data-parallel fit may hand the ranks' sum
   straight to the optimizer, see >>communicator), in get_weights' order
   without the non-trainable weights: n = mp_model_trainable_param_count
   (MP_ERR_STATE before the first, and from mp_compute_scaled_gradients on
   until the next): the trainable weights' in model order, n =
   mp_model_trainable_param_count. Count mismatches here and in get/set
   weights and slots are MP_ERR_SHAPE. */
MIXPREC_API mp_status mp_get_gradients(const mp_model *m, float *dst, size_t n);
/* Between mp_get_unscaled_gradients and mp_apply_gradients: replaces the
   float32 gradients apply reads with src[n] (mp_get_gradients' order and
   n), for what the optimizer's options do not do (Keras's custom
   train_step may change the gradients before apply_gradients). Under
   loss scaling they are checked again, as the LossScaleOptimizer checks
   what apply is given: an Inf or NaN in src skips the step; with
   accumulation, clipping and weight decay they go on as before. With a
   communicator src replaces the ranks' sum: give every rank the same.
   MP_ERR_STATE out of that order, MP_ERR_SHAPE for another n; a failed
   call changes nothing. */
MIXPREC_API mp_status mp_set_gradients(mp_model *m, const float *src, size_t n);
/* The optimizer's slots (momentum, velocity, ...), for tests and checkpoints. */
MIXPREC_API size_t mp_optimizer_slot_count(const mp_model *m); /* floats */
MIXPREC_API mp_status mp_get_optimizer_slots(const mp_model *m, float *dst, size_t n);
/* The loss-scale state, or NULL when the optimizer is not wrapped. */
MIXPREC_API const mp_loss_scale *mp_model_loss_scale(const mp_model *m);
MIXPREC_API float mp_current_loss_scale(const mp_model *m); /* 1 when not wrapped */

/* >>numerics diagnostics
   What the numbers of a model do in float16 (or bfloat16), per layer: the
   statistics of its activations, weights and gradients every N training
   steps, printed as a table and appended to a CSV file; a loss scale
   recommended from the gradients' magnitudes; a check-numerics mode that
   stops at the first layer producing Inf or NaN (as Hugging Face's
   DebugUnderflowOverflow); and a Tensor Core advisor. All of it runs on the
   CPU, in float32 math, from the tensors' bits.

   A log2-magnitude histogram, one bin per power of two, read off float32's
   exponent field: bin 0 holds finite nonzero |x| below 2^MP_HIST_MIN_EXP,
   bin b (1 .. MP_HIST_BINS - 2) holds [2^(MP_HIST_MIN_EXP + b - 1),
   2^(MP_HIST_MIN_EXP + b)), the last bin 2^MP_HIST_MAX_EXP and up. The range
   takes in float16's (2^-24 .. 65504) with room for a loss scale of up to
   2^24 on either side: whatever lands in bin 0 underflows float16 even
   scaled by 2^24. */
#define MP_HIST_MIN_EXP (-50)
#define MP_HIST_MAX_EXP 20
#define MP_HIST_BINS (MP_HIST_MAX_EXP - MP_HIST_MIN_EXP + 2) /* 72 */

/* Counts refer to a target format (float16 unless said otherwise): what a
   cast to it would do, by the thresholds mp_convert's stats use. */
typedef struct mp_tensor_stats {
    uint64_t count;              /* elements */
    uint64_t zeros;              /* +0 and -0 */
    uint64_t nan, inf;           /* NaN and +-Inf elements, apart */
    uint64_t overflow;           /* finite elements the cast would make Inf */
    uint64_t underflow;          /* nonzero elements the cast would make zero */
    uint64_t subnormal;          /* nonzero elements the cast would make subnormal */
    float min_abs, max_abs;      /* smallest and largest finite nonzero |x|; 0 if none */
    uint64_t hist[MP_HIST_BINS]; /* finite nonzero elements by power of two of |x| */
} mp_tensor_stats;

/* The statistics of n elements of x (in `type`) against `target`'s range.
   ADDS to out, as mp_convert adds to its stats: zero it first, and one
   mp_tensor_stats can take many tensors. MP_ERR_DTYPE for a bad dtype. */
MIXPREC_API mp_status mp_tensor_stats_compute(const void *x, mp_dtype type, size_t n, mp_dtype target,
                                              mp_tensor_stats *out);

/* What a layer's statistics are of. Gradients are taken each training step:
   weight gradients as the backward pass produced them (multiplied by the
   loss scale, in the layer's compute dtype) and as the optimizer gets them
   (unscaled, float32); the input gradient is the one the layer passes back
   (scaled, in the dtype of the activations it received; none for the first
   layer): the activation gradients of Micikevicius et al.'s figure. */
typedef enum mp_numerics_kind {
    MP_NUMERICS_ACTIVATIONS = 0, /* the layer's output, in its output dtype */
    MP_NUMERICS_WEIGHTS,         /* the float32 weights (kernel, then bias) */
    MP_NUMERICS_SCALED_GRADIENTS,
    MP_NUMERICS_GRADIENTS,
    MP_NUMERICS_INPUT_GRADIENTS,
    MP_NUMERICS_KIND_COUNT
} mp_numerics_kind;

/* "activations", "weights", "scaled_grads", "grads", "input_grads"; NULL if invalid */
MIXPREC_API const char *mp_numerics_kind_name(mp_numerics_kind kind);

/* A step is counted as the optimizer counts it (Keras's iterations): the
   step in progress is 1 + the steps applied or skipped since compile. */
typedef struct mp_numerics_desc {
    int every;            /* statistics at steps every, 2 every, ...; 0 = none */
    int print;            /* nonzero: print the report then, and at a check-numerics stop */
    const char *csv_path; /* NULL, or a CSV file: created (header) now, a row per layer
                             and tensor appended at those steps (needs stdio) */
    int check;            /* nonzero: check-numerics, see mp_model_set_numerics */
    int history;          /* layers a check-numerics stop shows; 0 = 3 */
    mp_dtype target;      /* the range counted against: 0 = float16, or MP_BFLOAT16 */
} mp_numerics_desc;

/* Turns diagnostics on for fit and the custom loop alike (desc NULL, or
   every and check both 0: off). Builds the model. Statistics are taken in
   training forward and backward passes (fit's, or mp_forward with training
   set), never in evaluate or predict.
   check-numerics takes the statistics at every step and tests each layer's
   output after its forward pass: the first Inf or NaN stops the step (no
   loss, no gradients, weights untouched) with MP_ERR_NONFINITE, and
   mp_model_error says e.g. "check-numerics: layer dense_1 (Dense) produced
   3 Inf and 0 NaN in its forward pass at step 17". It tests the backward
   outputs (weight and input gradients) only without loss scaling: under
   loss scaling, gradients overflowing is how the scale is found (the step
   is skipped and the scale halved), so they are counted, not stopped at.
   MP_ERR_ARG for a negative count or a bad target (or for print or a CSV
   file under MIXPREC_NO_STDIO), MP_ERR_IO when the CSV file cannot be
   created; on error the diagnostics stay as they were. */
MIXPREC_API mp_status mp_model_set_numerics(mp_model *m, const mp_numerics_desc *desc);
/* A layer's statistics of the latest step that took them (all zero for a
   tensor the layer does not have). MP_ERR_STATE before the first such step,
   MP_ERR_ARG for a bad layer or kind. */
MIXPREC_API mp_status mp_model_numerics(const mp_model *m, int layer, mp_numerics_kind what,
                                        mp_tensor_stats *out);
/* The step those statistics are of; 0 before the first. */
MIXPREC_API uint64_t mp_model_numerics_step(const mp_model *m);
/* The report of that step into buf (NUL-terminated; MP_ERR_SIZE if cut):
   a table (layer, tensor, min|x|, max|x|, % zero, % that would overflow,
   underflow or be subnormal, Inf and NaN counts), a histogram line per
   gradient against the target's ranges, and the recommended loss scale.
   After a check-numerics stop: the message and the last `history` layers. */
MIXPREC_API mp_status mp_numerics_report(const mp_model *m, char *buf, size_t size);

/* A loss scale for float16 from the true (unscaled) gradient magnitudes. */
typedef struct mp_loss_scale_advice {
    float scale;              /* a power of two; see mp_recommend_loss_scale */
    float max_abs;            /* the largest finite |gradient| */
    float underflow_unscaled; /* fraction of the finite nonzero gradients float16 makes zero */
    float underflow_scaled;   /* the same, multiplied by scale first */
} mp_loss_scale_advice;

/* Over the statistics of n unscaled gradient tensors: the largest power of
   two S with max|g| S <= 65504 / 2 (a factor 2 of headroom for the next
   steps' gradients), at most 2^24 (Apex's ceiling); below 1 when the
   gradients alone exceed 32752; 1 when there is no finite nonzero gradient.
   The underflow fractions are read off the histograms (to the bin: a value
   exactly 2^-25 after scaling is counted as kept, float16 rounds it to 0).
   Zeros are not counted: a gradient the step already flushed to zero cannot
   be told from a true zero. */
MIXPREC_API mp_status mp_recommend_loss_scale(const mp_tensor_stats *grads, int n, mp_loss_scale_advice *out);
/* The same over every layer's unscaled float32 weight gradients of the
   latest step that took statistics (MP_ERR_STATE before one). */
MIXPREC_API mp_status mp_model_recommend_loss_scale(const mp_model *m, mp_loss_scale_advice *out);

/* Tensor Cores run float16/bfloat16 products at full speed when every
   dimension is a multiple of 8 (NVIDIA's cuBLAS and cuDNN guidance). Lists,
   into buf, each Dense layer's units and input features, each Conv2D
   layer's filters and input channels, and batch_size (0: not checked) that
   are not, with the next multiple of 8 to pad to; float32 layers are
   listed as advice for when they switch. *issues (may be NULL) gets the
   number of findings. MP_ERR_SIZE if buf is too small. */
MIXPREC_API mp_status mp_model_tensor_core_advice(const mp_model *m, int batch_size, char *buf, size_t size,
                                                  int *issues);
/* >>checkpoints
   A checkpoint holds what training needs to go on where it stopped: the
   float32 weights (BatchNormalization's moving statistics included, as
   Keras saves them), the optimizer's config, iteration count and slots, the
   whole loss-scale state (config, scale, counters) and each layer's dropout
   generator. Loaded into the same model, compiled the same way, then fit with
   initial_epoch, it reproduces the uninterrupted run bit for bit. The bytes
   are the same on every host: little-endian, versioned, with a CRC-32 (the
   layout is in docs/checkpoints.md). The model is built if it was not.
   Loading checks the whole buffer before it changes anything: on any error
   the model is left bit for bit as it was. Errors, with the detail in
   mp_model_error(): MP_ERR_FORMAT for an empty, truncated or corrupt buffer
   (checksum), another format version, or not a mixprec file; MP_ERR_SHAPE
   for a checkpoint of another model (it names the layer and what differs:
   kind, inputs (the graph's connections), policy, weight counts, output
   shape, loss, optimizer, loss scaling);
   MP_ERR_STATE for a compiled checkpoint into a model not compiled (compile
   first) or the reverse (load before compile).
   Saving: *len gets the size in bytes; buf NULL asks only for it; a cap
   below it is MP_ERR_SIZE and writes nothing. */
MIXPREC_API mp_status mp_model_save_to_memory(mp_model *m, void *buf, size_t cap, size_t *len);
MIXPREC_API mp_status mp_model_load_from_memory(mp_model *m, const void *buf, size_t len);
/* Inference weights only, in dtype: float16 or bfloat16 (half float32's
   bytes), each rounded once to nearest even as mp_convert rounds, or float32;
   the moving statistics stay float32. The same container. Importing widens them exactly into the float32
   weights and touches no optimizer or loss-scale state; the model may be
   uncompiled and its layers' policies may differ from the exporter's. */
MIXPREC_API mp_status mp_model_export_weights_to_memory(mp_model *m, mp_dtype dtype, void *buf, size_t cap,
                                                        size_t *len);
MIXPREC_API mp_status mp_model_import_weights_from_memory(mp_model *m, const void *buf, size_t len);
#ifndef MIXPREC_NO_STDIO
/* Save writes a temporary file of its own next to path (path.tmp.PID.N,
   created exclusively), syncs it to the disk (fsync, on any POSIX system
   whatever feature macros the program defined), renames it over path and
   syncs the directory: a save that fails or crashes midway leaves the
   previous file as it was, and a reader sees a whole old or a whole new
   file. Saves racing to one path (threads or processes): the last complete
   rename wins, and neither is ever torn. A save killed midway may leave its
   temporary behind. Load reads only a regular file, and never more than
   its header claims plus a byte. MP_ERR_IO when a file cannot be created,
   written, synced, renamed or read.
   With a communicator (>>communicator) the four are collective, called by
   every rank: rank 0 alone writes or reads its path (the others' path is
   not used, so no shared file system is needed); a load sends rank 0's
   bytes to every rank; every rank returns rank 0's outcome. */
MIXPREC_API mp_status mp_model_save(mp_model *m, const char *path);
MIXPREC_API mp_status mp_model_load(mp_model *m, const char *path);
MIXPREC_API mp_status mp_model_export_weights(mp_model *m, mp_dtype dtype, const char *path);
MIXPREC_API mp_status mp_model_import_weights(mp_model *m, const char *path);
#endif

/* >>safetensors
   Weights in the safetensors format (huggingface/safetensors, README
   "Format"), which PyTorch, Hugging Face, JAX and candle read and write: an
   8-byte little-endian header length N, N bytes of UTF-8 JSON (each tensor's
   "dtype", "shape" and "data_offsets" [begin, end) into the buffer that
   follows; an optional "__metadata__" of string to string), then the raw
   little-endian row-major bytes. The names and shapes are
   mp_model_weight_info's:
       MP_LAYOUT_KERAS    "dense_1/kernel", Keras 3's variable paths and
                          shapes: Dense (in, units), Conv2D (kh, kw, in,
                          filters); BatchNormalization's gamma, beta,
                          moving_mean, moving_variance
       MP_LAYOUT_PYTORCH  "dense_1.weight", "dense_1.bias": torch.nn's names
                          and shapes, so that a state dict of the same network
                          loads by name: Linear (out, in), Conv2d (out, in,
                          kh, kw), BatchNorm's weight, bias, running_mean,
                          running_var (its num_batches_tracked, an integer
                          count, is accepted and not used); LayerNorm's
                          weight, bias
   Saving writes as the reference writer (safetensors/src/tensor.rs) does:
   tensors by dtype, wider first, then by name, packed back to back after the
   JSON, which is padded with spaces to a multiple of 8, so the Python
   library writes the same bytes for the same tensors and metadata. dtype
   MP_FLOAT32 (0): the float32 master weights as they are; MP_FLOAT16 or
   MP_BFLOAT16: each rounded once to nearest even as mp_convert rounds
   (BatchNormalization's moving statistics stay F32, as
   mp_model_export_weights keeps them). "__metadata__" holds one entry,
   "mixprec": "layout=keras dtype=float32 policy=mixed_float16
   layers=dense:Dense:mixed_float16,...".
   Loading checks the whole file first, as the reference parser does and
   more (each refusal names the tensor and the rule): MP_ERR_FORMAT for a
   header under 8 bytes or over 100,000,000, a header past the end, invalid
   UTF-8 or JSON, a header that is not one object, a duplicate name or
   field, a missing or unknown field, an unknown dtype, a shape whose element
   count times the element size overflows or differs from end - begin,
   offsets that do not start at 0 or leave a hole or overlap, a buffer that
   does not end where the last tensor does, "__metadata__" values that are
   not strings, a negative or NaN moving variance; MP_ERR_SHAPE for a
   weight of the model missing from the file, a tensor that is no weight of
   the model, a shape other than the model's (both shapes named);
   MP_ERR_DTYPE for a weight stored as anything but F32, F16 or BF16 (F64
   would round: narrowing is left to the user). F16 and BF16 widen exactly
   into the float32 weights. Only then are the weights set: a refused file
   changes nothing in the model. The model is built if it was not; its
   optimizer and loss-scale state are not touched.
   desc may be NULL: every field zero. */
typedef enum mp_weights_layout {
    MP_LAYOUT_KERAS = 0,
    MP_LAYOUT_PYTORCH
} mp_weights_layout;

typedef struct mp_safetensors_desc {
    mp_dtype dtype;           /* saving: MP_FLOAT32 (0), MP_FLOAT16 or MP_BFLOAT16; loading: not used */
    mp_weights_layout layout; /* names and kernel shapes: MP_LAYOUT_KERAS (0) or MP_LAYOUT_PYTORCH */
} mp_safetensors_desc;

/* *len gets the size in bytes; buf NULL asks only for it; a cap below it
   is MP_ERR_SIZE and writes nothing. */
MIXPREC_API mp_status mp_model_save_safetensors_to_memory(mp_model *m, const mp_safetensors_desc *desc, void *buf,
                                                          size_t cap, size_t *len);
MIXPREC_API mp_status mp_model_load_safetensors_from_memory(mp_model *m, const mp_safetensors_desc *desc,
                                                            const void *buf, size_t len);
/* Any safetensors buffer, checked as a load checks it before it looks at
   a model: MP_OK, or MP_ERR_FORMAT with the tensor and the rule in why
   (NUL-terminated, cut to why_size; why may be NULL). */
MIXPREC_API mp_status mp_safetensors_check(const void *buf, size_t len, char *why, size_t why_size);
#ifndef MIXPREC_NO_STDIO
/* As mp_model_save and mp_model_load (>>checkpoints): a temporary file
   renamed over path, synced; a regular file read, never more than its size
   plus a byte; rank 0's file under a communicator. */
MIXPREC_API mp_status mp_model_save_safetensors(mp_model *m, const char *path, const mp_safetensors_desc *desc);
MIXPREC_API mp_status mp_model_load_safetensors(mp_model *m, const char *path, const mp_safetensors_desc *desc);
#endif

/* >>data: gzip (RFC 1952 around deflate, RFC 1951), as data sets ship:
   mp_load_idx reads `.gz` files through it, and it is public for data in
   memory. The rules:
   - Input: one or more gzip members; their outputs are joined, as gunzip
     and Python's gzip module (Keras's fashion_mnist.load_data) do. Zero
     bytes after a member are padding (Python skips them too); anything else
     must be another member. Empty input is not gzip.
   - Each member's header: magic 1f 8b, method 8 (deflate), no reserved flag
     bits; FEXTRA, FNAME and FCOMMENT are skipped, FHCRC (the low 16 bits of
     the header's CRC-32) is checked, FTEXT is a hint and ignored. Its
     trailer's CRC-32 and ISIZE (the length mod 2^32) must match the data.
   - Deflate: stored, fixed and dynamic Huffman blocks. A Huffman code with
     more codes than its lengths allow is refused, and so is an incomplete
     one unless it has a single code (RFC 1951 allows one distance code;
     zlib accepts the same); a distance may reach back to the start of its
     member's data, not before.
   - Bounded: no more than max_out bytes of output are made, in a buffer
     never larger (it starts at ISIZE, a hint held to deflate's 1032:1 ratio,
     and doubles as data arrives; while it grows the old one is held too),
     so a gzip bomb is refused with MP_ERR_SIZE before its bytes are made.
     Every read is bounds-checked; corrupt or truncated input is
     MP_ERR_FORMAT. A failed call changes nothing but *why. */

/* Inflates the gzip data src[len] into a new buffer: *out (free it with
   mp_gunzip_free) and *out_len. why (may be NULL) gets, on failure, a
   sentence that says what is wrong, e.g. "gzip: CRC-32 mismatch: the data is
   corrupt". MP_ERR_SIZE when the output would pass max_out bytes,
   MP_ERR_ALLOC when memory runs out. */
MIXPREC_API mp_status mp_gunzip(const void *src, size_t len, size_t max_out, void **out, size_t *out_len,
                                const char **why);
MIXPREC_API void mp_gunzip_free(void *out); /* NULL-safe */

/* >>data: IDX files (the MNIST format) */
typedef struct mp_dataset {
    float *x;          /* [n, rows, cols], pixels scaled to [0, 1] */
    int32_t *labels;   /* [n] */
    size_t n;
    int rows, cols;
    int classes;       /* 1 + the largest label */
} mp_dataset;

/* Validates an IDX buffer of unsigned bytes: magic 0x0000 08 NN, NN (1..3)
   dims of nonzero size, exactly the bytes they say. rank, dims and data
   (pointing into buf) may each be NULL. */
MIXPREC_API mp_status mp_idx_parse(const void *buf, size_t len, int *rank, uint32_t dims[3],
                                   const uint8_t **data);
/* Images (rank 3) and labels (rank 1) from two IDX buffers; the counts must
   agree. out is owned by the caller: mp_dataset_free. */
MIXPREC_API mp_status mp_dataset_from_idx(const void *images, size_t images_len, const void *labels,
                                          size_t labels_len, mp_dataset *out);
MIXPREC_API void mp_dataset_free(mp_dataset *d);
/* The data set as fit reads it: x (n, rows, cols) float32, y its labels
   (n,) int32; a view of d, valid while d is. */
MIXPREC_API mp_data mp_dataset_data(const mp_dataset *d);
#ifndef MIXPREC_NO_STDIO
/* Images and labels from two IDX files, each plain or gzip-compressed (told
   apart by gzip's magic, 1f 8b), so that Fashion-MNIST's `*-idx?-ubyte.gz`
   files load as they ship (see >>data: gzip). A gzip file inflates to no
   more than its IDX header says. mp_load_idx_why also writes, on failure, a
   sentence to why[why_cap] (cut to fit; why may be NULL) that names the
   file and what is wrong, e.g. "t10k-labels-idx1-ubyte.gz: gzip: CRC-32
   mismatch: the data is corrupt" or "train-images-idx3-ubyte: No such file
   or directory" (the system's reason for MP_ERR_IO). */
MIXPREC_API mp_status mp_load_idx(const char *images_path, const char *labels_path, mp_dataset *out);
MIXPREC_API mp_status mp_load_idx_why(const char *images_path, const char *labels_path, mp_dataset *out,
                                      char *why, size_t why_cap);
MIXPREC_API void mp_model_print_summary(const mp_model *m);
#endif

/* >>data: tokens, for language models (docs/data.md): a text as byte-level
   tokens, or an llm.c token file, cut into (time + 1)-token windows: the
   inputs, and the same shifted by one as the targets. */
typedef struct mp_tokens {
    int32_t *ids;             /* count token ids, each in [0, vocab_size) */
    size_t count;
    int vocab_size;           /* text: the distinct bytes; llm.c: 1 + the largest id */
    int byte_level;           /* 1: from text; id i stands for the byte bytes[i] */
    unsigned char bytes[256]; /* byte-level: the vocabulary, ascending */
    int16_t id_of[256];       /* byte-level: a byte's id, -1 where the text has none */
} mp_tokens;

/* Byte-level tokens of len bytes of text: the vocabulary is the distinct
   bytes, in ascending order. MP_ERR_FORMAT for no bytes. */
MIXPREC_API mp_status mp_tokens_from_text(const void *text, size_t len, mp_tokens *out);
/* An llm.c token file in memory (its dev/data scripts' format): 256
   little-endian int32 (magic 20240520, version 1, the token count, the
   rest unused), then that many uint16 tokens; exactly 1024 + 2 x count
   bytes. Anything else is MP_ERR_FORMAT. */
MIXPREC_API mp_status mp_tokens_from_llmc(const void *buf, size_t len, mp_tokens *out);
MIXPREC_API void mp_tokens_free(mp_tokens *t); /* NULL-safe */
/* Windows of time + 1 tokens that follow each other, sharing their edge
   tokens, as llm.c's DataLoader reads: (count - 1) / time of them. */
MIXPREC_API size_t mp_tokens_window_count(const mp_tokens *t, int time);
/* n windows, window i from token starts[i] (starts NULL: from i x time):
   x[i][j] = ids[start + j] and y[i][j] = ids[start + j + 1], j < time,
   each n x time int32 (mp_array_i32(x, n, 1, &time) is a model's input,
   y its (batch, time) labels). MP_ERR_ARG, nothing written, when a
   window runs past the tokens. */
MIXPREC_API mp_status mp_tokens_windows(const mp_tokens *t, const size_t *starts, size_t n, int time, int32_t *x,
                                        int32_t *y);
#ifndef MIXPREC_NO_STDIO
/* The same from files; on failure a sentence in why[why_cap] (may be
   NULL) names the file and what is wrong, as mp_load_idx_why's. */
MIXPREC_API mp_status mp_load_text_tokens(const char *path, mp_tokens *out, char *why, size_t why_cap);
MIXPREC_API mp_status mp_load_llmc_tokens(const char *path, mp_tokens *out, char *why, size_t why_cap);
#endif

/* >>backends
   A model runs every kernel through one table of operations, the backend,
   chosen when the model is created (mp_model_desc.backend; NULL = the CPU).
   The CPU backend is built in; cuda/mixprec_cuda.h adds one for NVIDIA GPUs.
   A backend owns the memory of the model's tensors: weights, gradients,
   optimizer slots, activations and a small step state (the loss scale, the
   found-Inf flag and the batch's metrics) are allocated by it, and on a GPU
   they stay on the device. The host copies in only the batch and copies out
   only the step state (a few dozen bytes) and what the user asks for.
   Pointers an op receives are the backend's unless named host_. Ops are
   queued in order; `copy` to the host and `sync` wait for what is queued and
   report the first error a device raised (MP_ERR_BACKEND). A copy to the
   backend may return before it ran: from ordinary memory the caller may
   reuse its buffer at once (the driver took the bytes); from memory of
   host_alloc (pinned, for fast asynchronous copies) not before host_wait. */
#if defined(__CUDACC__)
#define MIXPREC_HD __host__ __device__ /* shared by host and device code */
#else
#define MIXPREC_HD
#endif

/* A member of a table of operations by name, for a backend's mp_backend:
       static const mp_backend mine = {MP_OP(name) "mine", ..., MP_OP(gemm) my_gemm, ...};
   It is C99's designator `.gemm =` in C and C++20, where the compiler checks
   the name (C++20 the order too); older C++ takes the members by place, as
   the C or C++20 build of the same table has checked them. Fill the table in
   mp_backend's order, every member named: a new op cannot then land in
   another op's slot unseen. */
#if !defined(__cplusplus) || __cplusplus >= 202002L
#define MP_OP(member) .member =
#else
#define MP_OP(member)
#endif

typedef struct mp_gemm_args {
    int trans_a, trans_b;
    size_t m, n, k;
    const void *a, *b;
    mp_dtype at, bt;
    void *c;
    mp_dtype ct;
    int accumulate;      /* C += op(A) op(B) */
    const void *bias;    /* [n] in biast, or NULL */
    mp_dtype biast;      /* the bias's dtype: ct, or float32 */
    mp_activation act;   /* elementwise only */
    void *z;             /* the pre-activation, in ct, or NULL */
    const void *relu_y;  /* or a ReLU's output, C's shape, in ct: C becomes that ReLU's
                            gradient, C where relu_y > 0 and +0 elsewhere (TensorFlow's
                            ReluGrad), after the activation, before the rounding */
} mp_gemm_args;

/* backend elementwise ops (mp_backend.elementwise) */
typedef enum mp_elementwise { MP_EW_ADD, MP_EW_SUBTRACT, MP_EW_MULTIPLY, MP_EW_SCALE } mp_elementwise;

typedef struct mp_conv_geom {
    int h, w, c;        /* input image */
    int kh, kw, sh, sw; /* kernel, strides */
    int pt, pl;         /* padding before, top and left */
    int oh, ow;         /* output image */
} mp_conv_geom;

/* The runs a weight gradient's groups are summed in (mp_backend.conv_gemm). */
enum { MP_CONV_PARTS = 4 };

typedef struct mp_opt_step {
    mp_optimizer_desc cfg; /* defaults filled in; exclude_from_weight_decay NULL (see weight_decay) */
    uint64_t iteration;    /* 1 for the first step (Adam's bias correction) */
    /* for one optimizer_update call, which covers part of one variable: */
    float weight_decay;    /* this variable's: cfg.weight_decay, or 0 where it is excluded */
    const float *sum_squares; /* with cfg.clipnorm or cfg.global_clipnorm: the backend's sum of the
                                  squares its scaling reads (mp__clip_factor), else NULL */
    uint64_t accumulated;  /* cfg.gradient_accumulation_steps: the steps in the accumulators */
} mp_opt_step;

typedef enum mp_copy_kind { MP_COPY_TO_BACKEND, MP_COPY_TO_HOST, MP_COPY_WITHIN } mp_copy_kind;

typedef struct mp_backend_memory {
    size_t current, peak; /* bytes the backend holds for the model now, and at most */
    size_t workspace;     /* of current: scratch (GEMM panels, cuBLASLt workspace) */
    size_t fallbacks;     /* products run on a slower path than their dtypes ask, so far */
} mp_backend_memory;

struct mp_backend {
    const char *name;
    int device_memory; /* 1: the host cannot read the backend's pointers */
    int tensor_cores;  /* 1: 16-bit products want sizes in multiples of 8 (a warning names the layers) */
    int relu_grad;     /* 1: gemm honours mp_gemm_args.relu_y (0: the model leaves it NULL and
                          runs act_backward, so a table of one's own need not know it) */
    /* The model's context (the CPU's thread pool; a GPU's stream, handles
       and workspace). config: the model's backend_config, may be NULL. */
    mp_status (*create)(void **ctx, int threads, const void *config);
    void (*destroy)(void *ctx);
    int (*threads)(void *ctx);
    void *(*alloc)(void *ctx, size_t bytes); /* NULL on failure; aligned to 64 (CPU) or 256 bytes (GPU) */
    void (*free)(void *ctx, void *p);        /* NULL-safe */
    void (*memory)(void *ctx, mp_backend_memory *out);
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes, mp_copy_kind kind);
    void (*zero)(void *ctx, void *p, size_t bytes);
    mp_status (*sync)(void *ctx);
    const char *(*last_error)(void *ctx); /* what failed first, for the model's error message */
    /* Reserves scratch for products up to these sizes, so no step allocates. */
    mp_status (*gemm_reserve)(void *ctx, size_t m, size_t n, size_t k);
    /* The batch in: n host float32 values cast into dst (dt); nonfinite,
       the backend's memory or NULL, is set to 1 when any of them is Inf or
       NaN (a device checks in its cast, so the host need not scan). int32
       data never reaches a backend: the host converts it first (>>data), so
       every dtype an operation gets is a float one (< MP_DTYPE_COUNT). */
    void (*cast_in)(void *ctx, void *dst, mp_dtype dt, const float *host_src, size_t n, int *nonfinite);
    /* dst = src cast from st to dt (a copy when they agree); stats, a host
       pointer or NULL, get the narrowing counts added as mp_convert's. */
    void (*cast)(void *ctx, void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n, mp_cast_stats *stats);
    /* C (+)= op(A) op(B), float32 accumulation, then bias, activation,
       ReLU's gradient where relu_y is set, and one rounding into C's dtype,
       as mp_matmul. */
    void (*gemm)(void *ctx, const mp_gemm_args *g);
    /* y = act(x + bias) over rows x cols (bias may be NULL); y may be x. */
    void (*bias_act)(void *ctx, void *y, const void *x, const void *bias, size_t rows, size_t cols,
                     mp_activation act, mp_dtype dt);
    /* dx = dy * act'(...) from the output y (or the input x, for gelu);
       dy, y, x in dt, dx in dxt; dx may be dy when the dtypes agree. */
    void (*act_backward)(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *y, const void *x,
                         size_t rows, size_t cols, mp_activation act, mp_dtype dt);
    void (*bias_grad)(void *ctx, void *db, const void *dy, size_t rows, size_t cols, mp_dtype dt);
    /* The loss over rows (softmax and crossentropy fused from logits):
       metrics[0] = the sum of per-sample losses, metrics[1] = the samples
       the accuracy counts right; dpred = the float32 gradient of the mean.
       The accuracy reads out (in ot): pred itself, or the probabilities
       where pred holds the logits of the model's softmax or sigmoid. */
    void (*loss)(void *ctx, mp_loss kind, int from_logits, const void *pred, mp_dtype pt, const void *out,
                 mp_dtype ot, const int32_t *labels, const float *y, size_t rows, size_t cols, float *dpred,
                 float *metrics);
    /* dst = src * *scale (scale NULL: 1), rounded into dt. */
    void (*scale_cast)(void *ctx, void *dst, mp_dtype dt, const float *src, size_t n, const float *scale);
    /* The fused pass: dst = src * (1 / *scale) (scale NULL: 1); *found_inf
       |= 1 if any src is Inf or NaN. dst NULL: the check alone. */
    void (*unscale_check)(void *ctx, float *dst, const void *src, mp_dtype st, size_t n, const float *scale,
                          int *found_inf);
    /* One step of the loss-scale state machine (mp_loss_scale_update). */
    void (*loss_scale_update)(void *ctx, mp_loss_scale *ls, const int *found_inf);
    /* Unless found_inf (may be NULL) is set: updates n float32 weights from
       their gradients and slots and, when wc is not NULL, writes them to wc
       in wt (the copy the layer reads) in the same pass. The gradients g
       are in gt, each taken as unscale_check would give it: widened, times
       1 / *scale (scale NULL: 1), so a step unscales as it reads. */
    void (*optimizer_update)(void *ctx, const mp_opt_step *step, float *w, const void *g, mp_dtype gt,
                             const float *scale, float *s1, float *s2, size_t n, void *wc, mp_dtype wt,
                             const int *found_inf);
    /* n NHWC images <-> their columns, [n*OH*OW, KH*KW*C]: the batch's
       convolution is one product. col2im overwrites img (n images). */
    void (*im2col)(void *ctx, void *col, const void *img, size_t n, const mp_conv_geom *g, mp_dtype dt);
    void (*col2im)(void *ctx, float *img, const float *col, size_t n, const mp_conv_geom *g);
    /* A stride-1 convolution's kernel for its input gradient: dst
       [KH*KW*F, C] from src [KH*KW*C, F] (Keras's layout, F filters, C the
       input's channels), flipped in both spatial axes and transposed per
       tap: dst[((ky KW + kx) F + f) C + c] = src[(((KH-1-ky) KW + KW-1-kx)
       C + c) F + f]; a copy of dt values. */
    void (*conv_flip)(void *ctx, void *dst, const void *src, const mp_conv_geom *g, size_t filters, mp_dtype dt);
    /* Optional (NULL: the model makes a group's columns by im2col and
       multiplies them by gemm, one group after another): the product g
       whose op(A) is the columns of `images` NHWC images (g->a, in g->at,
       geometry geom), made and multiplied `group` images at a time, each
       group by one thread. trans_a 0: C [images OH OW, n] = cols B, with
       gemm's epilogue. trans_a 1 (C float32, no epilogue): C (+)= cols^T
       B, the groups summed in MP_CONV_PARTS runs of consecutive groups
       (fewer where there are fewer groups), each run's sum from +0 but the
       first's, which goes on C, then the runs added to C in order: the bits
       do not depend on the threads. scratch: a block of `group` images'
       columns for each of threads(ctx) threads, each rounded up to 64
       bytes, then MP_CONV_PARTS - 1 float32 C's. */
    void (*conv_gemm)(void *ctx, const mp_gemm_args *g, const mp_conv_geom *geom, size_t images, size_t group,
                      void *scratch);
    void (*max_pool)(void *ctx, void *y, const void *x, size_t n, const mp_conv_geom *g, mp_dtype dt);
    void (*max_pool_backward)(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, size_t n,
                              const mp_conv_geom *g, mp_dtype dt);
    /* mask[i] = 1 with probability 1 - rate, from mp_dropout_keep(seed, i). */
    void (*dropout_mask)(void *ctx, unsigned char *mask, size_t n, float rate, uint64_t seed);
    /* y = mask ? x * scale : 0, x in xt, y in yt. */
    void (*dropout)(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype xt, const unsigned char *mask,
                    size_t n, float scale);
    /* The merges' and the gradients' sums: y = a op b over n values, in
       float32, rounded once into yt (MP_EW_SCALE: y = a * s, b unused). y
       may be a or b where their dtypes agree. */
    void (*elementwise)(void *ctx, mp_elementwise op, void *y, mp_dtype yt, const void *a, mp_dtype at,
                        const void *b, mp_dtype bt, float s, size_t n);
    /* dst[r][0, cols) = src[r][0, cols) cast from st to dt, for each of rows
       rows, dst's rows dst_stride values apart and src's src_stride
       (Concatenate's blocks, in and out). */
    void (*copy_cols)(void *ctx, void *dst, mp_dtype dt, size_t dst_stride, const void *src, mp_dtype st,
                      size_t src_stride, size_t rows, size_t cols);
    /* AveragePooling2D and GlobalAveragePooling2D (padding valid): y = the
       window's mean, summed in float32 and rounded once; its gradient,
       dy / window summed where windows overlap, rounded once into dxt. */
    void (*avg_pool)(void *ctx, void *y, const void *x, size_t n, const mp_conv_geom *g, mp_dtype dt);
    void (*avg_pool_backward)(void *ctx, void *dx, mp_dtype dxt, const void *dy, size_t n, const mp_conv_geom *g,
                              mp_dtype dt);
    /* BatchNormalization over rows x cols, cols the channels (the last
       axis); x in dt, y in yt; gamma_beta = gamma[cols] then beta[cols],
       float32, as are the statistics. training: stats = the batch's mean
       [cols] then biased variance [cols] (two passes), moving (mean then
       variance) = moving * momentum + stats * (1 - momentum), y from the
       batch's statistics; else y from moving, stats untouched.
       y = (x - mean) / sqrt(var + epsilon) * gamma + beta. These four ops
       do nothing where rows or cols is 0; each step's rounding and the
       order of every sum are >>rules' (mp__norm_*), which the CPU and
       CUDA backends share bit for bit. */
    void (*batch_norm)(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t rows, size_t cols,
                       const float *gamma_beta, float *stats, float *moving, float momentum, float epsilon,
                       int training);
    /* Its gradient from the batch's statistics (dy and x in dt):
       dgamma_beta = sum dy xhat [cols] then sum dy [cols], float32,
       overwritten; dx (NULL: none) = gamma / sqrt(var + epsilon)
       (dy - mean(dy) - xhat mean(dy xhat)) in dxt. */
    void (*batch_norm_backward)(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt,
                                size_t rows, size_t cols, const float *gamma_beta, const float *stats, float epsilon,
                                float *dgamma_beta);
    /* LayerNormalization over the last axis: each of rows rows by its own
       float32 mean and biased variance; y = (x - mean) rstd gamma + beta in
       yt, rstd = 1 / sqrt(var + epsilon); stats[2 r] = the row's mean,
       stats[2 r + 1] its rstd, kept for the backward pass. */
    void (*layer_norm)(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t rows, size_t cols,
                       const float *gamma_beta, float epsilon, float *stats);
    /* Its gradient: dx (NULL: none) in dxt; dgamma_beta = sum dy xhat
       [cols] then sum dy [cols], float32, overwritten. */
    void (*layer_norm_backward)(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt,
                                size_t rows, size_t cols, const float *gamma_beta, const float *stats,
                                float *dgamma_beta);
    /* Embedding: row r of y (rows x cols, in yt) = row ids[r] of the float32
       table (vocab rows), rounded into yt; ids are float32 token ids (ids
       NULL: row r takes row r % period, PositionEmbedding's). An id that is
       not in [0, vocab) gives a row of zeros, never a read outside the
       table (the host refuses such ids first). */
    void (*embedding)(void *ctx, void *y, mp_dtype yt, const float *table, size_t vocab, const float *ids,
                      size_t period, size_t rows, size_t cols);
    /* Its gradient, a scatter-add in a fixed order: dtable (vocab x cols,
       float32) = 0, then dtable[id of r] += dy[r] for r = 0, 1, ... (dy in
       dt): every column's sums run in row order, whatever the threads. */
    void (*embedding_backward)(void *ctx, float *dtable, size_t vocab, const void *dy, mp_dtype dt, const float *ids,
                               size_t period, size_t rows, size_t cols);
    /* Scaled dot-product attention of n sequences (batch x heads) of t
       positions (>>rules' mp__attention_*): q, k, v and att are rows of
       `stride` values, head h's d columns from h d; p (dt) and s (float32)
       are t x t per sequence, in the sequence order (b heads + h). att =
       softmax(scale q k^T (causal: masked above the diagonal)) v, the
       probabilities in p (rounded to dt), s scratch. */
    void (*attention)(void *ctx, void *att, void *p, float *s, const void *q, const void *k, const void *v,
                      mp_dtype dt, size_t batch, size_t t, size_t heads, size_t d, float scale, int causal);
    /* Its gradient from datt: dq, dk, dv (dt); s is scratch. */
    void (*attention_backward)(void *ctx, void *dq, void *dk, void *dv, float *s, const void *datt, const void *q,
                               const void *k, const void *v, const void *p, mp_dtype dt, size_t batch, size_t t,
                               size_t heads, size_t d, float scale, int causal);
    /* A device backend's staging memory (NULL where the host's memory is the
       backend's): host memory whose copies to the backend run without the
       host waiting (pinned). host_wait(p) returns once no queued copy still
       reads the host_alloc block holding p, so the host may write it. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    void (*host_wait)(void *ctx, const void *p);
    /* Data on a device (NULL on the CPU): its free memory in bytes, and
       rows of a table gathered: dst row i = src row idx[i], row_bytes each
       (a multiple of 4), all three the backend's memory. */
    size_t (*free_memory)(void *ctx);
    void (*gather)(void *ctx, void *dst, const void *src, const uint32_t *idx, size_t rows, size_t row_bytes);
    /* Clipping by norm (mp_optimizer_desc.clipnorm, global_clipnorm):
       *sum += the sum of the squares of n gradients in gt, each taken as
       optimizer_update takes it (widened, times 1 / *scale), each square
       and the sum in float32, summed in >>rules' order (mp__sum_squares_lanes) so
       that every backend gives the same bits. sum is the backend's memory.
       NULL where the backend cannot: compile then refuses those options. */
    void (*sum_squares)(void *ctx, float *sum, const void *g, mp_dtype gt, size_t n, const float *scale);
};

/* >>communicator
   Data-parallel training across processes and machines: every rank (one
   process each) creates the same model with the same communicator in
   mp_model_desc.comm (NULL = one process) and makes the same calls; the
   library keeps the ranks in step. mpi/mixprec_mpi.h fills the table with
   MPI (host memory: the CPU backend); cuda/mixprec_nccl.h with NCCL (the
   CUDA backend's device memory, on its stream). What it does:
   - Initial weights: rank 0's, broadcast when the model is built (by build
     or compile), whatever each rank's seed. fit's shuffle seed is rank 0's.
   - fit's batch_size is the GLOBAL batch, as Keras's distribution
     strategies: every rank shuffles alike and takes its slice of each
     global batch of b samples (rank r of N: [b r / N, b (r + 1) / N)), at
     most ceil(batch_size / N) samples (mp_fit_state has both sizes; rank
     0's progress lines show them). 2 ranks at batch_size 256 train as one
     process at 256, 128 samples each.
   - Gradients: each rank's, in float32 and weighted by its share of the
     global batch, are summed over the ranks BEFORE the fused
     unscale-and-check, so an Inf or NaN on any rank reaches every rank:
     all skip the same steps and keep the same loss scale (Keras's
     LossScaleOptimizer under a distribution strategy). The sum has the
     same bits on every rank, so the weights and slots stay bit-identical.
     fit's step with a host communicator (MPI) and no diagnostics gives
     each piece of the sum straight to the optimizer, with no float32 copy
     written and read back (mp_get_gradients has none after it). The skip
     must then be known first: each rank checks its own gradients and the
     found-Inf flags are summed before any update (the rule wherever
     something is reduced after the check). That is exactly the check of
     the sum where every layer with weights computes in 16 bits and the
     scale is at least 1 (a sum of finite 16-bit shares stays finite in
     float32); otherwise, or where any rank has the diagnostics on (the
     ranks agree at fit's start), fit sums into the float32 gradients
     first. The same bits either way.
   - Metrics: fit's loss and accuracy, validation and evaluate are the
     global figures on every rank (sums reduced).
   - Only rank 0 prints (ProgbarLogger, EarlyStopping, LearningRateScheduler)
     and writes (CSVLogger, ModelCheckpoint, the numerics CSV); the state
     is the same on every rank, so a checkpoint from N ranks resumes on any
     number of ranks. mp_model_save and the other file calls of >>checkpoint
     are collective: rank 0 writes or reads, load sends its bytes to every
     rank, and all return rank 0's outcome (one checkpoint, agreed).
   - The custom loop: mp_get_unscaled_gradients reduces first; each rank's
     batch weighs the same (call it with equal batches on every rank).
   - mp_model_desc.allreduce_dtype float16 or bfloat16 sums the gradients in
     that dtype (the communicator's all_reduce_sum16; NULL there refuses it
     at create): each rank's float32 share, already divided by the number of
     ranks, is rounded to 16 bits, so the sum cannot overflow where each
     part fits (PyTorch's fp16/bf16 compression hooks); then the same
     unscale-and-check. Half the bytes, 16-bit rounding of the sum.
   A collective that fails gives MP_ERR_COMM and the communicator's
   last_error in the model's error. The other ranks may be waiting in a
   collective that never completes: end the job (mp_mpi_abort). */
struct mp_communicator {
    const char *name;  /* "mpi", "nccl" */
    int device_memory; /* 1: buffers are device memory (must match the backend's) */
    void *ctx;         /* the implementation's, passed to each op */
    int (*rank)(void *ctx); /* 0 ... size - 1 */
    int (*size)(void *ctx); /* the number of ranks */
    /* buf[0, n) = the sum over the ranks of their buf, with the same bits
       on every rank (the backend's memory; its queued work is done first) */
    mp_status (*all_reduce_sum)(void *ctx, float *buf, size_t n);
    mp_status (*broadcast)(void *ctx, void *buf, size_t bytes, int root); /* root's bytes to every rank */
    mp_status (*barrier)(void *ctx);
    const char *(*last_error)(void *ctx); /* what failed first; never NULL */
    /* The same for n float16 or bfloat16 values (dtype), or NULL where the
       communicator has no 16-bit sum. */
    mp_status (*all_reduce_sum16)(void *ctx, void *buf, mp_dtype dtype, size_t n);
    /* Optional (NULL: none): a buffer of the communicator's own that the
       two sums above sum fastest, its size in *bytes (MPI: memory the
       ranks of one machine share, summed where it lies with no copy in or
       out), or NULL where it has none. The model then sums its gradients
       a buffer at a time: writes a piece there, sums it, reads it back, so
       the pieces stay in cache. Valid while the communicator is. */
    void *(*sum_buffer)(void *ctx, size_t *bytes);
};

/* The model's backend context (what create gave it; NULL for NULL), for a
   companion that queues work beside the backend's, such as a device
   communicator on the backend's stream (cuda/mixprec_nccl.h). */
MIXPREC_API void *mp_model_backend_context(const mp_model *m);

/* >>cpu backend: the table of the CPU's kernels, the default. */
MIXPREC_API const mp_backend *mp_cpu_backend(void);

/* The rules every backend shares, defined here so that device code
   compiles the same lines. The loss-scale state machine (see >>loss
   scaling): returns 1 when the step's gradients are applied. */
static MIXPREC_HD inline int mp_loss_scale_step(mp_loss_scale *ls, int grads_finite) {
    ls->steps++;
    if (!grads_finite) ls->skipped_steps++;
    if (ls->config.fixed) return grads_finite != 0;
    if (grads_finite) {
        if (++ls->good_steps >= (uint64_t)ls->config.growth_interval) {
            float grown = ls->scale * 2.0f; /* only to a finite value, not past the ceiling */
            if (grown <= ls->config.max_scale) ls->scale = grown;
            ls->good_steps = 0;
            ls->overflows_left = ls->config.hysteresis;
        }
        return 1;
    }
    ls->good_steps = 0;
    if (--ls->overflows_left <= 0) {
        float halved = ls->scale * 0.5f;
        ls->scale = halved < ls->config.min_scale ? ls->config.min_scale : halved;
        ls->overflows_left = ls->config.hysteresis;
    }
    return 0;
}

/* The factor unscale_check and optimizer_update multiply the scaled
   gradients by: 1 / *scale (scale NULL: 1), rounded once. */
static MIXPREC_HD inline float mp__unscale_factor(const float *scale) { return scale ? 1.0f / *scale : 1.0f; }

/* Dropout keeps element i when this uniform [0, 1) draw is >= rate: a
   counter-based hash (splitmix64's finaliser of seed + i), so that any
   backend and any thread count draw the same mask. */
static MIXPREC_HD inline float mp_dropout_draw(uint64_t seed, size_t i) {
    uint64_t z = seed + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15u;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

#ifdef __cplusplus
}
#endif
#endif /* MIXPREC_H */

/* IDEs parse the header alone: with the implementation defined they index
   and colour it instead of greying it out (as cgltf.h does). Compilers
   define neither macro. */
#if defined(__INTELLISENSE__) || defined(__JETBRAINS_IDE__)
#define MIXPREC_IMPLEMENTATION
#endif

/* ======================================================================== */
/* >>rules: the math every backend does alike, compiled from these lines by
   the implementation and by a device backend's source (which defines
   MIXPREC_RULES before the include, as cuda/mixprec_cuda.cu does): Keras's
   activations and their derivatives, the losses of one row with their
   gradients, and the accuracy of a row, all in float32. */
#if (defined(MIXPREC_IMPLEMENTATION) || defined(MIXPREC_RULES)) && !defined(MIXPREC_RULES_DONE)
#define MIXPREC_RULES_DONE
#include <math.h>

/* mp_backend.sum_squares's order: the n values in blocks of
   MP__SUM_SQUARES_BLOCK; in a block, lane l (0 ... 7) sums the values whose
   index in the block is l mod 8, in order; a block's sum is
   ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); the blocks' sums are
   added in order to 0, and that total to *sum. */
enum { MP__SUM_SQUARES_BLOCK = 4096 };
static MIXPREC_HD inline float mp__sum_squares_lanes(const float l[8]) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* Adam's (and AdamW's) step size with both bias corrections, Keras 3's
   alpha = lr sqrt(1 - beta_2^t) / (1 - beta_1^t) at t = the iteration; 0
   for the other kinds. */
static MIXPREC_HD inline float mp__adam_alpha(const mp_opt_step *step) {
    const mp_optimizer_desc *o = &step->cfg;
    float t = (float)step->iteration;
    if (o->kind != MP_ADAM && o->kind != MP_ADAMW) return 0.0f;
    return o->learning_rate * sqrtf(1.0f - powf(o->beta_2, t)) / (1.0f - powf(o->beta_1, t));
}

/* The factor clipping by norm multiplies the unscaled gradients by, from
   the sum of their squares (Keras 3, keras/src/optimizers/base_optimizer.py:
   _clip_by_norm and clip_by_global_norm, taken as one factor each):
   global_clipnorm c: c * min(1 / norm, 1 / c) + (norm - norm), NaN for a
   norm of Inf or NaN; clipnorm c: c / max(norm, c), 1 where norm <= c, 0
   for an Inf norm, NaN for a NaN one. norm is the float32 square root. */
static MIXPREC_HD inline float mp__clip_factor(const mp_optimizer_desc *o, float sum_squares) {
    float norm = sqrtf(sum_squares), c, a, b;
    if (o->global_clipnorm > 0.0f) {
        c = o->global_clipnorm;
        a = 1.0f / norm;
        b = 1.0f / c;
        return c * (a < b ? a : b) + (norm - norm);
    }
    c = o->clipnorm;
    return norm > c ? c / norm : norm <= c ? 1.0f : norm; /* NaN: NaN */
}

/* The casts' rounding, integer code (>>conversion builds on it), so that a
   device's casts give the library's bits, NaN sign and payload included. */
/* float32 -> float16, round to nearest even (IEEE 754 4.3.1). */
static MIXPREC_HD inline uint16_t mp__f16_from_f32_bits(uint32_t x) {
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7FFFFFFFu;
    /* NaN: quiet bit forced, top 9 payload bits kept (as vcvtps2ph does). */
    uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
    /* Normal result (|x| >= 2^-14): rebias 127 -> 15 (subtract 112 << 23), then
       add half an ulp minus one plus the kept lsb: ties go to even. A carry
       out of the fraction correctly bumps the exponent. */
    uint32_t normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    /* Subnormal result: |x| / 2^-24 = m >> (126 - e), rounded the same way.
       Clamp the shift to [14, 31] so it stays defined for lanes not selected
       (shifts past 24 give 0: inputs below 2^-25 round to zero). */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = e > 112u ? 14u : e < 95u ? 31u : 126u - e;
    uint32_t sub = (m + (1u << (shift - 1u)) - 1u + ((m >> shift) & 1u)) >> shift;
    /* Select with masks rather than ?: so that compilers if-convert the loop. */
    uint32_t is_nan = 0u - (uint32_t)(a > 0x7F800000u);
    uint32_t is_inf = 0u - (uint32_t)(a >= 0x477FF000u);  /* 65520 and up, Inf, NaN */
    uint32_t is_normal = 0u - (uint32_t)(a >= 0x38800000u);
    uint32_t r = (sub & ~is_normal) | (normal & is_normal & ~is_inf) | (0x7C00u & is_inf & ~is_nan) | (nan & is_nan);
    return (uint16_t)(sign | r);
}

/* float16 -> float32, exact; signalling NaNs are quieted (as vcvtph2ps). */
static MIXPREC_HD inline uint32_t mp__f32_bits_from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t a = h & 0x7FFFu;
    uint32_t special = 0x7F800000u | (a & 0x3FFu) << 13 | (a > 0x7C00u ? 0x400000u : 0u);
    uint32_t normal = (a << 13) + 0x38000000u; /* rebias 15 -> 127 */
    /* Subnormal a * 2^-24: shift the top set bit up to bit 10 (k steps, a
       binary search with selects), which makes it the implicit bit. */
    uint32_t m = a, k = 0, s;
    s = m < 0x8u ? 8u : 0u;   m <<= s; k += s;
    s = m < 0x80u ? 4u : 0u;  m <<= s; k += s;
    s = m < 0x200u ? 2u : 0u; m <<= s; k += s;
    s = m < 0x400u ? 1u : 0u; m <<= s; k += s;
    uint32_t sub = (113u - k) << 23 | (m & 0x3FFu) << 13; /* 2^(10-k-24), biased */
    return sign | (a >= 0x7C00u ? special : a >= 0x400u ? normal : a ? sub : 0u);
}

/* float32 -> bfloat16, round to nearest even; NaN: sign|0x7FC0|(fraction>>16). */
static MIXPREC_HD inline uint16_t mp__bf16_from_f32_bits(uint32_t x) {
    uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x0040u;
    return (uint16_t)((x & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

static MIXPREC_HD inline uint32_t mp__f32_bits_from_bf16(uint16_t h) { return (uint32_t)h << 16; }

/* Every float operation rounds on its own, as written: C++ and GNU modes
   let compilers fuse a*b+c into one FMA, which would make the kernels' bits
   depend on the build (the GEMM asks for FMA through intrinsics). nvcc
   builds device code with --fmad=false instead. GCC's -O2 vectorises only
   loops it needs no scalar epilogue for (-fvect-cost-model=very-cheap),
   which leaves scalar the kernels' loops over a tile's run or a row's
   columns, whose lengths are known only at run time: the implementation
   asks for the cheap model, which adds the epilogue (vectorising keeps
   every rounding: no sum is reordered without -ffast-math). Each use ends in a
   declaration of an empty struct and a semicolon, so that tools that do not
   expand macros (Universal Ctags, editors) read it as a statement and still
   see the functions after it. */
#if defined(__CUDACC__)
#define MP__ROUND_EACH_BEGIN struct mp__round_each
#define MP__ROUND_EACH_END struct mp__round_each
#elif defined(__clang__)
#define MP__ROUND_EACH_BEGIN _Pragma("float_control(push)") _Pragma("clang fp contract(off)") struct mp__round_each
#define MP__ROUND_EACH_END _Pragma("float_control(pop)") struct mp__round_each
#elif defined(__GNUC__)
#define MP__ROUND_EACH_BEGIN \
    _Pragma("GCC push_options") _Pragma("GCC optimize(\"fp-contract=off\", \"vect-cost-model=cheap\")") \
        struct mp__round_each
#define MP__ROUND_EACH_END _Pragma("GCC pop_options") struct mp__round_each
#else
#define MP__ROUND_EACH_BEGIN struct mp__round_each
#define MP__ROUND_EACH_END struct mp__round_each
#endif
MP__ROUND_EACH_BEGIN;

typedef union mp__f32_word { uint32_t u; float f; } mp__f32_word;

/* e^x for -87 <= x <= 88 (2^k normal), the same bits on every backend and
   SIMD width, where libm's expf and CUDA's differ in the last bits: e^x =
   2^k e^r with k = x / ln 2 rounded to nearest (by adding and subtracting
   1.5 2^23) and r = x - k ln 2 (Cody and Waite's two-part ln 2), e^r by its
   Taylor polynomial of degree 7 (|r| <= ln(2) / 2: remainder below
   2^-27), 2^k written into the exponent's bits. Only IEEE 754's correctly
   rounded +, - and *, so the vector rows (mp__exp_taylor_avx512, _avx2)
   compute it lane by lane alike. Within 2 ulp of e^x (test_backend sweeps
   it). */
static MIXPREC_HD inline float mp__exp_taylor(float x) {
    float k = x * 1.44269504f + 12582912.0f, r, p;
    mp__f32_word two_k;
    k = k - 12582912.0f;
    r = x - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    p = 1.98412698e-4f;
    p = p * r + 1.38888889e-3f;
    p = p * r + 8.33333333e-3f;
    p = p * r + 4.16666667e-2f;
    p = p * r + 1.66666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    two_k.u = (uint32_t)((int)k + 127) << 23;
    return p * two_k.f;
}

/* tanh for GELU's tanh form: tanh|u| = 1 - 2 / (e^(2|u|) + 1), 2|u|
   clamped at 20, where the result is 1 in float32 (as is tanh from 9.1
   on). Within 2^-22 of tanh in float64 (an absolute bound: GELU adds it to
   1; test_backend sweeps it); tanh(-0) is +0, tanh(NaN) +-1 (GELU's own
   factors of x carry a NaN). */
static MIXPREC_HD inline float mp__tanh_gelu(float u) {
    float a = u < 0.0f ? -u : u, x = a * 2.0f, m;
    x = x < 20.0f ? x : 20.0f;
    m = 1.0f - 2.0f / (mp__exp_taylor(x) + 1.0f);
    return u < 0.0f ? -m : m;
}

/* The softmax's exponential of x = a logit minus the row's largest (x <=
   0, or NaN where the row holds an Inf or a NaN): 0 below -87 (e^x under
   float32's least normal, next to the largest term's 1), NaN kept. */
static MIXPREC_HD inline float mp__softmax_exp(float x) {
    return x != x ? x : x < -87.0f ? 0.0f : mp__exp_taylor(x);
}

/* GELU's tanh form (GPT-2's, Keras's approximate=True): gelu(x) = 0.5 x
   (1 + t), t = tanh(u), u = sqrt(2 / pi) (x + 0.044715 x^3); its
   derivative as llm.c's gelu_backward: 0.5 (1 + t) + 0.5 x (1 - t^2) u'. */
static MIXPREC_HD inline float mp__gelu_tanh_arg(float x) { return 0.7978845608f * (x + 0.044715f * x * x * x); }
static MIXPREC_HD inline float mp__gelu_tanh_of(float x, float t) { return 0.5f * x * (1.0f + t); }
static MIXPREC_HD inline float mp__gelu_tanh_grad(float x, float t) {
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f * (1.0f + 0.134145f * x * x);
}

static MIXPREC_HD inline float mp__act(mp_activation a, float v) {
    switch (a) {
    case MP_RELU: return v < 0.0f ? 0.0f : v; /* NaN stays NaN */
    case MP_SIGMOID: return 1.0f / (1.0f + expf(-v));
    case MP_TANH: return tanhf(v);
    case MP_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678f));
    case MP_GELU_APPROXIMATE: return mp__gelu_tanh_of(v, mp__tanh_gelu(mp__gelu_tanh_arg(v)));
    default: return v;
    }
}

/* The gelus' derivatives are functions of their input, the others' of
   their output: the input is kept for these (a Dense layer's z). */
static MIXPREC_HD inline int mp__act_reads_input(mp_activation a) { return a == MP_GELU || a == MP_GELU_APPROXIMATE; }

/* d act / d x, from the output y (or the input x for the gelus). */
static MIXPREC_HD inline float mp__act_grad(mp_activation a, float y, float x) {
    switch (a) {
    case MP_RELU: return y > 0.0f ? 1.0f : 0.0f;
    case MP_SIGMOID: return y * (1.0f - y);
    case MP_TANH: return 1.0f - y * y;
    case MP_GELU: return 0.5f * (1.0f + erff(x * 0.70710678f)) + x * 0.39894228f * expf(-0.5f * x * x);
    case MP_GELU_APPROXIMATE: return mp__gelu_tanh_grad(x, mp__tanh_gelu(mp__gelu_tanh_arg(x)));
    default: return 1.0f;
    }
}

/* Crossentropy from probabilities renormalises each row to sum 1 and clips
   to [epsilon, 1 - epsilon] (epsilon 1e-7, keras.backend.epsilon()); a
   clipped value passes no gradient. */
#define MP__EPSILON 1e-7f

/* A row's columns may be split among MP__ROW_LANES cooperating threads
   (a GPU warp a row, cuda/mixprec_cuda.cu; one on the CPU): lane
   MP__ROW_LANE takes columns lane, lane + lanes, ... in order, and
   MP__ROW_SUM and MP__ROW_BEST combine the lanes' results (on the CPU the
   identity, so its sums run left to right). */
#ifndef MP__ROW_LANES
#define MP__ROW_LANE 0u
#define MP__ROW_LANES 1u
#define MP__ROW_SUM(v) (v)
#define MP__ROW_BEST(value, at, n) (void)0
#endif
#define MP__ROW_FOR(j, n) for (j = MP__ROW_LANE; j < (n); j += MP__ROW_LANES)

/* Whether (value a at index i) comes before (b at j) in argmax's order: a
   scan left to right taking v[i] > v[best], so the first of equal maxima,
   NaN at index 0 before all (nothing is greater), any other NaN never;
   j == n: none yet. */
static MIXPREC_HD inline int mp__better(float a, size_t i, float b, size_t j, size_t n) {
    if (j == n || (i == 0 && a != a)) return 1;
    if (a != a || (j == 0 && b != b)) return 0;
    return a > b || (a == b && i < j);
}

/* The argmax's index (0 for an empty row), *max its value. */
static MIXPREC_HD inline size_t mp__argmax_value(const float *v, size_t n, float *max) {
    size_t i, best = n;
    float value = 0.0f;
    MP__ROW_FOR(i, n) if (mp__better(v[i], i, value, best, n)) best = i, value = v[i];
    MP__ROW_BEST(value, best, n);
    *max = value;
    return best == n ? 0 : best;
}

static MIXPREC_HD inline size_t mp__argmax(const float *v, size_t n) {
    float max;
    return mp__argmax_value(v, n, &max);
}

/* The target weight of class j: one-hot from a label, or the target row. */
static MIXPREC_HD inline float mp__target(const float *t, int32_t label, size_t j) {
    return t ? t[j] : (float)((size_t)label == j);
}

/* Loss of one row; p becomes d loss / d p. */
static MIXPREC_HD inline float mp__crossentropy_row(float *p, const float *t, int32_t label, size_t n, int from_logits) {
    float loss = 0.0f, total = 0.0f, s = 0.0f;
    size_t j;
    if (from_logits) { /* log-sum-exp, then softmax - target */
        float mx, lse;
        (void)mp__argmax_value(p, n, &mx);
        MP__ROW_FOR(j, n) s += expf(p[j] - mx);
        lse = mx + logf(MP__ROW_SUM(s));
        MP__ROW_FOR(j, n) { total += mp__target(t, label, j); loss += mp__target(t, label, j) * (lse - p[j]); }
        total = MP__ROW_SUM(total);
        MP__ROW_FOR(j, n) p[j] = expf(p[j] - lse) * total - mp__target(t, label, j);
        return MP__ROW_SUM(loss);
    }
    MP__ROW_FOR(j, n) s += p[j];
    s = MP__ROW_SUM(s);
    MP__ROW_FOR(j, n) { /* q = p / s; L = -sum t log clip(q) */
        float q = p[j] / s, tw = mp__target(t, label, j);
        int inside = q >= MP__EPSILON && q <= 1.0f - MP__EPSILON;
        loss -= tw * logf(q < MP__EPSILON ? MP__EPSILON : q > 1.0f - MP__EPSILON ? 1.0f - MP__EPSILON : q);
        if (inside) total += tw;
    }
    total = MP__ROW_SUM(total);
    MP__ROW_FOR(j, n) { /* dL/dp_j = (sum_i t_i m_i - t_j m_j / q_j) / s */
        float q = p[j] / s, tw = mp__target(t, label, j);
        int inside = q >= MP__EPSILON && q <= 1.0f - MP__EPSILON;
        p[j] = (total - (inside && tw != 0.0f ? tw / q : 0.0f)) / s;
    }
    return MP__ROW_SUM(loss);
}

static MIXPREC_HD inline float mp__binary_crossentropy_row(float *p, const float *t, size_t n, int from_logits) {
    float loss = 0.0f, inv_n = 1.0f / (float)n;
    size_t j;
    MP__ROW_FOR(j, n) {
        float v = p[j], y = t[j];
        if (from_logits) { /* max(z, 0) - z y + log(1 + exp(-|z|)) */
            loss += (v > 0.0f ? v : 0.0f) - v * y + log1pf(expf(-fabsf(v)));
            p[j] = (1.0f / (1.0f + expf(-v)) - y) * inv_n;
        } else {
            float c = v < MP__EPSILON ? MP__EPSILON : v > 1.0f - MP__EPSILON ? 1.0f - MP__EPSILON : v;
            int inside = v >= MP__EPSILON && v <= 1.0f - MP__EPSILON;
            loss -= y * logf(c) + (1.0f - y) * logf(1.0f - c);
            p[j] = inside ? (-y / c + (1.0f - y) / (1.0f - c)) * inv_n : 0.0f;
        }
    }
    return MP__ROW_SUM(loss) * inv_n;
}

static MIXPREC_HD inline float mp__mean_squared_error_row(float *p, const float *t, size_t n) {
    float loss = 0.0f, inv_n = 1.0f / (float)n;
    size_t j;
    MP__ROW_FOR(j, n) {
        float d = p[j] - t[j];
        loss += d * d;
        p[j] = 2.0f * d * inv_n;
    }
    return MP__ROW_SUM(loss) * inv_n;
}

/* Keras's "accuracy" for the loss: argmax for crossentropy; for binary,
   every output on the right side of 0.5. */
static MIXPREC_HD inline int mp__row_correct(mp_loss kind, const float *p, const float *t, int32_t label, size_t n) {
    size_t j;
    float wrong = 0.0f;
    if (kind == MP_SPARSE_CATEGORICAL_CROSSENTROPY) return mp__argmax(p, n) == (size_t)label;
    if (kind == MP_CATEGORICAL_CROSSENTROPY) return mp__argmax(p, n) == mp__argmax(t, n);
    if (kind != MP_BINARY_CROSSENTROPY) return 0;
    MP__ROW_FOR(j, n) wrong += (float)((p[j] > 0.5f) != (t[j] > 0.5f)); /* a count: exact below 2^24 */
    return MP__ROW_SUM(wrong) == 0.0f;
}

/* Batch and layer normalisation (Keras 3's BatchNormalization and
   LayerNormalization, keras/src/layers/normalization/): the statistics in
   float32 whatever the input's dtype, the variance biased. Sums go in an
   order fixed by the shape alone, so that every thread count and the
   GPU's kernels give the same bits:
   - over a column (BatchNormalization's statistics, both layers' dgamma
     and dbeta): parts of MP__NORM_ROWS rows, each summed in row order
     from 0, then the parts' sums in order from 0;
   - over a row (LayerNormalization): as a warp of MP__NORM_LANES lanes
     sums it, lane l taking columns l, l + 32, ... in order from 0, then
     the lanes combined by a xor butterfly (lane l adds lane l ^ m for m =
     16, 8, 4, 2, 1). */
enum { MP__NORM_ROWS = 256, MP__NORM_LANES = 32 };
/* What a column sum adds for element (r, c): x; (x - mean)^2; dy xhat and dy. */
enum { MP__NORM_SUM_X, MP__NORM_SUM_DEV2, MP__NORM_SUM_GRAD };

/* A mean (or a biased variance) from the sum of n values. */
static MIXPREC_HD inline float mp__norm_mean(float sum, size_t n) { return sum / (float)n; }
/* 1 / sqrt(var + epsilon), each step rounded (IEEE sqrt and division). */
static MIXPREC_HD inline float mp__norm_rstd(float var, float epsilon) { return 1.0f / sqrtf(var + epsilon); }
static MIXPREC_HD inline float mp__norm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }
static MIXPREC_HD inline float mp__norm_y(float xhat, float gamma, float beta) { return xhat * gamma + beta; }
/* Keras's update: moving * momentum + batch * (1 - momentum). */
static MIXPREC_HD inline float mp__norm_moving(float moving, float batch, float momentum) {
    return moving * momentum + batch * (1.0f - momentum);
}
/* The gradient through a normalisation, k (g - mean(g) - xhat mean(g xhat)):
   BatchNormalization's k = gamma rstd, g = dy, the means over the column;
   LayerNormalization's k = rstd, g = dy gamma, the means over the row. */
static MIXPREC_HD inline float mp__norm_dx(float k, float g, float xhat, float mean_g, float mean_gx) {
    return k * (g - mean_g - xhat * mean_gx);
}

/* Element i of a buffer of dtype t, as float32 (exact), and v stored
   rounded once: the casts' own integer rounding, on any backend. */
static MIXPREC_HD inline float mp__elem(const void *p, mp_dtype t, size_t i) {
    mp__f32_word w;
    if (t == MP_FLOAT32) return ((const float *)p)[i];
    w.u = t == MP_FLOAT16 ? mp__f32_bits_from_f16(((const uint16_t *)p)[i])
                          : mp__f32_bits_from_bf16(((const uint16_t *)p)[i]);
    return w.f;
}
static MIXPREC_HD inline void mp__elem_set(void *p, mp_dtype t, size_t i, float v) {
    mp__f32_word w;
    w.f = v;
    if (t == MP_FLOAT32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = t == MP_FLOAT16 ? mp__f16_from_f32_bits(w.u) : mp__bf16_from_f32_bits(w.u);
}

/* Embedding: the table row of output row r, or vocab where the id is not
   one of the table's (a NaN, a fraction is truncated only after the host's
   check refused it). ids NULL: position r % period. */
static MIXPREC_HD inline size_t mp__embedding_index(const float *ids, size_t period, size_t r, size_t vocab) {
    float id;
    if (!ids) return r % period < vocab ? r % period : vocab;
    id = ids[r];
    return id >= 0.0f && id < (float)vocab ? (size_t)id : vocab;
}

/* Scaled dot-product attention (Keras's MultiHeadAttention), one sequence
   (of n = batch x heads) and one row at a time: row i of sequence n reads
   rows (n / heads) t + j of q, k and v, head (n % heads)'s d columns;
   p and s hold t x t values a sequence. Every sum is in float32, in index
   order, the exponentials mp__softmax_exp's; causal keeps j <= i (the
   masked probabilities are 0, as Keras's -1e9 or -3e4 bias gives after the
   float32 softmax). */
typedef struct mp__attention_geom {
    size_t t, heads, d, stride; /* positions; heads; a head's width; a row's values (heads d) */
    float scale;                /* 1 / sqrt(key_dim) */
    int causal;
    mp_dtype dt;
} mp__attention_geom;

static MIXPREC_HD inline mp__attention_geom mp__attention_geom_of(mp_dtype dt, size_t t, size_t heads, size_t d,
                                                                   float scale, int causal) {
    mp__attention_geom g;
    g.t = t, g.heads = heads, g.d = d, g.stride = heads * d, g.scale = scale, g.causal = causal, g.dt = dt;
    return g;
}
static MIXPREC_HD inline size_t mp__attention_at(const mp__attention_geom *g, size_t n, size_t row, size_t c) {
    return ((n / g->heads) * g->t + row) * g->stride + (n % g->heads) * g->d + c;
}
static MIXPREC_HD inline size_t mp__attention_keys(const mp__attention_geom *g, size_t i) {
    return g->causal ? i + 1 : g->t;
}

/* Forward, row i: s = scale q_i k_j^T (float32), p = softmax(s) rounded to
   dt (0 where masked), att_i = sum_j p_ij v_j rounded once. */
static MIXPREC_HD inline void mp__attention_row(const mp__attention_geom *g, void *att, void *p, float *s, const void *q,
                                                const void *k, const void *v, size_t n, size_t i) {
    size_t keys = mp__attention_keys(g, i), j, c, pr = (n * g->t + i) * g->t, qi = mp__attention_at(g, n, i, 0);
    size_t k0 = mp__attention_at(g, n, 0, 0);
    float mx = -INFINITY, sum = 0.0f;
    for (j = 0; j < keys; j++) {
        float dot = 0.0f;
        for (c = 0; c < g->d; c++) dot += mp__elem(q, g->dt, qi + c) * mp__elem(k, g->dt, k0 + j * g->stride + c);
        s[pr + j] = dot * g->scale;
        mx = s[pr + j] > mx ? s[pr + j] : mx;
    }
    for (j = 0; j < keys; j++) sum += mp__softmax_exp(s[pr + j] - mx);
    for (j = 0; j < g->t; j++) mp__elem_set(p, g->dt, pr + j, j < keys ? mp__softmax_exp(s[pr + j] - mx) / sum : 0.0f);
    for (c = 0; c < g->d; c++) {
        float acc = 0.0f;
        for (j = 0; j < keys; j++) acc += mp__elem(p, g->dt, pr + j) * mp__elem(v, g->dt, k0 + j * g->stride + c);
        mp__elem_set(att, g->dt, qi + c, acc);
    }
}

/* Backward, first pass, row i: dp_ij = datt_i v_j, the softmax's gradient
   ds_ij = p_ij (dp_ij - sum_j p_ij dp_ij) scale into s (float32), and
   dq_i = sum_j ds_ij k_j. */
static MIXPREC_HD inline void mp__attention_dq_row(const mp__attention_geom *g, void *dq, float *s, const void *datt,
                                                   const void *k, const void *v, const void *p, size_t n, size_t i) {
    size_t keys = mp__attention_keys(g, i), j, c, pr = (n * g->t + i) * g->t, qi = mp__attention_at(g, n, i, 0);
    size_t k0 = mp__attention_at(g, n, 0, 0);
    float dot = 0.0f;
    for (j = 0; j < keys; j++) {
        float dp = 0.0f;
        for (c = 0; c < g->d; c++) dp += mp__elem(datt, g->dt, qi + c) * mp__elem(v, g->dt, k0 + j * g->stride + c);
        s[pr + j] = dp;
        dot += mp__elem(p, g->dt, pr + j) * dp;
    }
    for (j = 0; j < keys; j++) s[pr + j] = mp__elem(p, g->dt, pr + j) * (s[pr + j] - dot) * g->scale;
    for (j = keys; j < g->t; j++) s[pr + j] = 0.0f;
    for (c = 0; c < g->d; c++) {
        float acc = 0.0f;
        for (j = 0; j < keys; j++) acc += s[pr + j] * mp__elem(k, g->dt, k0 + j * g->stride + c);
        mp__elem_set(dq, g->dt, qi + c, acc);
    }
}

/* Backward, second pass (after every row's first), key row j: dk_j = sum_i
   ds_ij q_i and dv_j = sum_i p_ij datt_i, over the rows i that see j. */
static MIXPREC_HD inline void mp__attention_dkv_row(const mp__attention_geom *g, void *dk, void *dv, const float *s,
                                                    const void *datt, const void *q, const void *p, size_t n, size_t j) {
    size_t i, c, first = g->causal ? j : 0, ps = n * g->t * g->t, q0 = mp__attention_at(g, n, 0, 0);
    for (c = 0; c < g->d; c++) {
        float ak = 0.0f, av = 0.0f;
        for (i = first; i < g->t; i++) {
            ak += s[ps + i * g->t + j] * mp__elem(q, g->dt, q0 + i * g->stride + c);
            av += mp__elem(p, g->dt, ps + i * g->t + j) * mp__elem(datt, g->dt, q0 + i * g->stride + c);
        }
        mp__elem_set(dk, g->dt, q0 + j * g->stride + c, ak);
        mp__elem_set(dv, g->dt, q0 + j * g->stride + c, av);
    }
}

MP__ROUND_EACH_END;
#endif /* MIXPREC_RULES */

/* ======================================================================== */
#ifdef MIXPREC_IMPLEMENTATION
#ifndef MIXPREC_IMPLEMENTATION_DONE
#define MIXPREC_IMPLEMENTATION_DONE

#if defined(MIXPREC_MALLOC) != defined(MIXPREC_FREE)
#error "mixprec: define both MIXPREC_MALLOC and MIXPREC_FREE, or neither"
#endif
#ifndef MIXPREC_MALLOC
#include <stdlib.h>
#define MIXPREC_MALLOC(sz) malloc(sz)
#define MIXPREC_FREE(p) free(p)
#if defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(MIXPREC_NO_HUGE_PAGES)
#define MP__HUGE_PAGES 1 /* large blocks of malloc's ask for huge pages (>>memory) */
#endif
#endif
#ifndef MIXPREC_ASSERT
#include <assert.h>
#define MIXPREC_ASSERT(x) assert(x)
#endif
#include <string.h>
#include <stdlib.h> /* getenv: automatic mixed precision's settings */
#include <math.h>
#include <float.h>
#include <limits.h>
#include <stdarg.h>
#include <time.h>
#ifndef MIXPREC_NO_STDIO
#include <stdio.h>
#include <errno.h> /* MP_ERR_IO's messages give the system's reason */
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h> /* isatty, sysconf, _POSIX_THREADS, _POSIX_VERSION */
#endif
#if defined(_POSIX_VERSION) && !defined(CLOCK_MONOTONIC) && !defined(TIME_UTC)
/* gettimeofday: the wall clock where <time.h> shows neither POSIX's
   clock_gettime nor C11's timespec_get (a strict -std=c99 build without
   feature macros); <sys/time.h> declares it whatever they are (>>fit). */
#include <sys/time.h>
#define MP__GETTIMEOFDAY 1
#endif
#if !defined(MIXPREC_NO_STDIO) && defined(_POSIX_VERSION)
/* Files through POSIX descriptors (open with O_EXCL, fsync, stat): every
   POSIX libc declares them whatever feature macro the program defined. */
#define MP__POSIX_FILES 1
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#endif
#if !defined(MIXPREC_NO_THREADS) && defined(_POSIX_THREADS) && _POSIX_THREADS > 0 && (defined(__GNUC__) || defined(__clang__))
#define MP__THREADS 1 /* the pool's polls need GCC's and Clang's __atomic builtins */
#include <pthread.h>
#include <sched.h> /* sched_yield, in the pool's spin */
#endif
#ifdef MIXPREC_USE_CBLAS
#include <cblas.h>
#endif

#if !defined(MIXPREC_NO_SIMD) && defined(__F16C__) && defined(__AVX2__)
#define MP__SIMD_X86 1
#include <immintrin.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MP__SIMD_AVX512 1 /* the bulk casts' 16-lane path (>>bulk casts) */
#endif
#endif
#if defined(__GNUC__) || defined(__clang__)
#define MP__HOT static inline __attribute__((always_inline)) /* inner-loop helpers */
/* A loop over an array of vectors unrolled whole, so that the array can
   live in registers (gcc at -O2 unrolls none of mp__transpose16's). */
#define MP__PRAGMA(x) _Pragma(#x)
#define MP__UNROLL(n) MP__PRAGMA(GCC unroll n)
#define mp__prefetch(p) __builtin_prefetch(p) /* into L1, as _MM_HINT_T0 */
#define mp__prefetch_l2(p) __builtin_prefetch(p, 0, 2) /* into L2, as _MM_HINT_T1 */
#else
#define MP__HOT static inline
#define MP__UNROLL(n)
#define mp__prefetch(p) ((void)(p))
#define mp__prefetch_l2(p) ((void)(p))
#endif

/* The process-wide values that threads using objects of their own may
   touch at once (GLOBAL STATE: the memory counters, the global policy, the
   checkpoints' temporary names): with GCC and Clang each read and update is
   one atomic operation, relaxed, as none of them orders anything else.
   Two threads allocating through plain `+=` lost updates in
   tests/test_threads.c (3.7 MB counted after every block was freed), and
   a debug build's mp__free asserted. Other compilers: plain accesses, and
   mixprec from one thread at a time. */
#if defined(__GNUC__) || defined(__clang__)
static size_t mp__relaxed_get(const size_t *x) { return __atomic_load_n(x, __ATOMIC_RELAXED); }
static void mp__relaxed_set(size_t *x, size_t v) { __atomic_store_n(x, v, __ATOMIC_RELAXED); }
/* x += v; the new value */
static size_t mp__relaxed_add(size_t *x, size_t v) { return __atomic_add_fetch(x, v, __ATOMIC_RELAXED); }
/* x -= v; the old value */
static size_t mp__relaxed_take(size_t *x, size_t v) { return __atomic_fetch_sub(x, v, __ATOMIC_RELAXED); }
/* x = v where x is still *old (else *old = x): whether it was */
static int mp__relaxed_swap(size_t *x, size_t *old, size_t v) {
    return __atomic_compare_exchange_n(x, old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}
#else
static size_t mp__relaxed_get(const size_t *x) { return *x; }
static void mp__relaxed_set(size_t *x, size_t v) { *x = v; }
static size_t mp__relaxed_add(size_t *x, size_t v) { return *x += v; }
static size_t mp__relaxed_take(size_t *x, size_t v) { return (*x -= v) + v; }
static int mp__relaxed_swap(size_t *x, size_t *old, size_t v) {
    (void)old;
    *x = v;
    return 1;
}
#endif

MP__ROUND_EACH_BEGIN; /* to the end of the implementation (see >>rules) */

#ifdef __cplusplus
extern "C" {
#endif

/* >>errors */
MIXPREC_API const char *mp_status_message(mp_status status) {
    static const char *const messages[] = {
#define MP__STATUS_MESSAGE(code, msg) msg,
        MP_STATUS_LIST(MP__STATUS_MESSAGE)
#undef MP__STATUS_MESSAGE
    };
    if ((unsigned)status >= (unsigned)MP_STATUS_COUNT) return "unknown status code";
    return messages[status];
}

MIXPREC_API const char *mp_status_name(mp_status status) {
    static const char *const names[] = {
#define MP__STATUS_NAME(code, msg) #code,
        MP_STATUS_LIST(MP__STATUS_NAME)
#undef MP__STATUS_NAME
    };
    if ((unsigned)status >= (unsigned)MP_STATUS_COUNT) return "MP_STATUS_UNKNOWN";
    return names[status];
}

/* >>numbers: conversion
   Every conversion is "widen exactly to float32 bits, then round once". All of
   it is integer code written branch-free (selects, not jumps) so that compilers
   vectorise the portable bulk loops. */

static uint32_t mp__f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float mp__f32_from_bits(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* float64 -> float32 rounded to odd: truncate, then set the lsb if anything
   nonzero was dropped. Rounding to odd with at least two spare bits and then
   to nearest even gives the once-rounded result (Boldo & Melquiond, 2008);
   float32 keeps 13 spare bits over float16 and 16 over bfloat16, in the
   subnormal range too. Values past float32's range overflow both targets. */
static uint32_t mp__f32_bits_from_f64_round_to_odd(uint64_t x) {
    uint32_t sign = (uint32_t)(x >> 32) & 0x80000000u;
    uint64_t a = x & 0x7FFFFFFFFFFFFFFFull;
    uint64_t frac = a & 0xFFFFFFFFFFFFFull;
    uint32_t e = (uint32_t)(a >> 52);
    if (e == 0x7FFu) return sign | 0x7F800000u | (frac ? 0x400000u | (uint32_t)(frac >> 29) : 0u);
    if (e >= 1023u + 128u) return sign | 0x7F800000u;
    if (e > 1023u - 127u) { /* float32 normal: rebias 1023 -> 127 */
        uint32_t kept = (e - 896u) << 23 | (uint32_t)(frac >> 29);
        return sign | kept | ((frac & 0x1FFFFFFFu) != 0);
    }
    {   /* float32 subnormal: a / 2^-149 = m >> (926 - e) */
        uint64_t m = frac | (e ? 1ull << 52 : 0u);
        uint32_t shift = 926u - (e ? e : 1u);
        if (shift > 63u) return sign | (a != 0);
        return sign | (uint32_t)(m >> shift) | ((m & ((1ull << shift) - 1u)) != 0);
    }
}

static uint64_t mp__f64_bits(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }

MIXPREC_API mp_f16 mp_f16_from_f32(float x) { return mp_f16_from_bits(mp__f16_from_f32_bits(mp__f32_bits(x))); }
MIXPREC_API float mp_f16_to_f32(mp_f16 h) { return mp__f32_from_bits(mp__f32_bits_from_f16(h.bits)); }
MIXPREC_API mp_bf16 mp_bf16_from_f32(float x) { return mp_bf16_from_bits(mp__bf16_from_f32_bits(mp__f32_bits(x))); }
MIXPREC_API float mp_bf16_to_f32(mp_bf16 h) { return mp__f32_from_bits(mp__f32_bits_from_bf16(h.bits)); }
MIXPREC_API mp_f16 mp_f16_from_f64(double x) {
    return mp_f16_from_bits(mp__f16_from_f32_bits(mp__f32_bits_from_f64_round_to_odd(mp__f64_bits(x))));
}
MIXPREC_API mp_bf16 mp_bf16_from_f64(double x) {
    return mp_bf16_from_bits(mp__bf16_from_f32_bits(mp__f32_bits_from_f64_round_to_odd(mp__f64_bits(x))));
}

/* >>numbers: arithmetic
   Why float32-then-round-once is exact: for +, -, *, / and sqrt, if the
   intermediate format has p' >= 2p + 2 significand bits, rounding the exact
   result to p' bits and then to p bits equals rounding it to p bits directly
   (Figueroa, "When is double rounding innocuous?", 1995). float32 has p' = 24;
   float16 has p = 11 (2p+2 = 24) and bfloat16 p = 8 (18). Exponent ranges: no
   float16 operation reaches float32's subnormal range, and below 2^-126 a
   bfloat16 result sits on a grid 2^16 times coarser than float32's, which
   sums round exactly onto and products and quotients cannot approach a
   bfloat16 midpoint within float32's rounding error. tests/test_numerics.c checks
   add and mul on all 2^32 float16 pairs. Fused multiply-add is NOT covered
   by the theorem, which is why there is none here. */
/* The lines below define mp_f16_add mp_f16_sub mp_f16_mul mp_f16_div
   mp_bf16_add mp_bf16_sub mp_bf16_mul mp_bf16_div (token pasting). */
#define MP__ARITH(T, OP, EXPR)                                                    \
    MIXPREC_API T T##_##OP(T a, T b) {                                            \
        float x = T##_to_f32(a), y = T##_to_f32(b);                               \
        return T##_from_f32(EXPR);                                                \
    }                                                                             \
    struct mp__semicolon /* the use ends in ';', a statement to tools like ctags */
MP__ARITH(mp_f16, add, x + y);
MP__ARITH(mp_f16, sub, x - y);
MP__ARITH(mp_f16, mul, x * y);
MP__ARITH(mp_f16, div, x / y);
MP__ARITH(mp_bf16, add, x + y);
MP__ARITH(mp_bf16, sub, x - y);
MP__ARITH(mp_bf16, mul, x * y);
MP__ARITH(mp_bf16, div, x / y);
#undef MP__ARITH
MIXPREC_API mp_f16 mp_f16_sqrt(mp_f16 a) { return mp_f16_from_f32(sqrtf(mp_f16_to_f32(a))); }
MIXPREC_API mp_bf16 mp_bf16_sqrt(mp_bf16 a) { return mp_bf16_from_f32(sqrtf(mp_bf16_to_f32(a))); }

/* Sign, magnitude and ordering are bit operations (IEEE 754 5.5.1, 5.11), the
   same for both formats but for where Inf sits. */
static int mp__h_isnan(uint16_t h, uint16_t inf) { return (h & 0x7FFFu) > inf; }
static int mp__h_key(uint16_t h) { return (h & 0x8000u) ? -(int)(h & 0x7FFFu) : (int)(h & 0x7FFFu); }
static int mp__h_unordered(uint16_t a, uint16_t b, uint16_t inf) { return mp__h_isnan(a, inf) || mp__h_isnan(b, inf); }
static int mp__h_eq(uint16_t a, uint16_t b, uint16_t inf) { return !mp__h_unordered(a, b, inf) && mp__h_key(a) == mp__h_key(b); }
static int mp__h_lt(uint16_t a, uint16_t b, uint16_t inf) { return !mp__h_unordered(a, b, inf) && mp__h_key(a) < mp__h_key(b); }
static int mp__h_le(uint16_t a, uint16_t b, uint16_t inf) { return !mp__h_unordered(a, b, inf) && mp__h_key(a) <= mp__h_key(b); }

/* The lines below define mp_f16_neg mp_f16_abs mp_f16_eq mp_f16_lt mp_f16_le
   mp_f16_gt mp_f16_ge mp_f16_isnan mp_f16_isinf mp_f16_isfinite and
   mp_bf16_neg mp_bf16_abs mp_bf16_eq mp_bf16_lt mp_bf16_le mp_bf16_gt
   mp_bf16_ge mp_bf16_isnan mp_bf16_isinf mp_bf16_isfinite (token pasting). */
#define MP__BITOPS(T, INF)                                                                    \
    MIXPREC_API T T##_neg(T a) { return T##_from_bits((uint16_t)(a.bits ^ 0x8000u)); }         \
    MIXPREC_API T T##_abs(T a) { return T##_from_bits((uint16_t)(a.bits & 0x7FFFu)); }         \
    MIXPREC_API int T##_eq(T a, T b) { return mp__h_eq(a.bits, b.bits, INF); }                 \
    MIXPREC_API int T##_lt(T a, T b) { return mp__h_lt(a.bits, b.bits, INF); }                 \
    MIXPREC_API int T##_le(T a, T b) { return mp__h_le(a.bits, b.bits, INF); }                 \
    MIXPREC_API int T##_gt(T a, T b) { return mp__h_lt(b.bits, a.bits, INF); }                 \
    MIXPREC_API int T##_ge(T a, T b) { return mp__h_le(b.bits, a.bits, INF); }                 \
    MIXPREC_API int T##_isnan(T a) { return mp__h_isnan(a.bits, INF); }                        \
    MIXPREC_API int T##_isinf(T a) { return (a.bits & 0x7FFFu) == INF; }                       \
    MIXPREC_API int T##_isfinite(T a) { return (a.bits & 0x7FFFu) < INF; }                     \
    struct mp__semicolon
MP__BITOPS(mp_f16, 0x7C00u);
MP__BITOPS(mp_bf16, 0x7F80u);
#undef MP__BITOPS

/* >>dtypes */
/* Indexed by mp_dtype: the float dtypes, then MP_DTYPE_COUNT's empty row,
   then int32 (names and sizes only). */
static const struct { const char *name; size_t size; } mp__dtypes[MP_INT32 + 1] = {
    {"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {NULL, 0}, {"int32", 4}};

/* A float dtype: what casts, tensors and policies take. */
static int mp__dtype_valid(mp_dtype t) { return (unsigned)t < (unsigned)MP_DTYPE_COUNT; }
static int mp__dtype_named(mp_dtype t) { return mp__dtype_valid(t) || t == MP_INT32; }

MIXPREC_API const char *mp_dtype_name(mp_dtype t) { return mp__dtype_named(t) ? mp__dtypes[t].name : NULL; }
MIXPREC_API size_t mp_dtype_size(mp_dtype t) { return mp__dtype_named(t) ? mp__dtypes[t].size : 0; }

MIXPREC_API mp_status mp_dtype_from_name(const char *name, mp_dtype *out) {
    int t;
    if (!name || !out) return MP_ERR_NULL;
    for (t = 0; t <= MP_INT32; t++)
        if (mp__dtypes[t].name && strcmp(name, mp__dtypes[t].name) == 0) { *out = (mp_dtype)t; return MP_OK; }
    return MP_ERR_UNKNOWN_DTYPE;
}

/* >>bulk casts
   Every row goes through float32 lanes: widen the source exactly, narrow
   once. A row casts n elements from one dtype to another and, given a
   mp__scan, counts what the cast does (>>bulk casts: cast stats). Which
   row runs when, as the table mp__rows and mp__rows_block (at the end of
   the section) pick them for mp_convert, by the instruction sets the build
   enables (MP__SIMD_AVX512 and MP__SIMD_X86, where the header includes
   <immintrin.h>):

       build                       a cast between two dtypes       a row of
       --------------------------  ------------------------------  -------------
       AVX-512 F, BW, VL; F16C     mp__row_X_to_Y_avx512           MP__Z_BLOCK
       AVX2 and F16C               mp__row_X_to_Y_avx2 (its head   MP__X86_BLOCK
                                   and tail by the scalar row)
       neither; MIXPREC_NO_SIMD    mp__row_X_to_Y_scalar           MP__BLOCK
       mp_convert_portable, any    mp__row_X_to_Y_scalar           MP__BLOCK

   A cast to the same dtype is the scalar row's copy in every build. The
   SIMD rows take half a block per call in a cast shorter than
   MP__CAST_FAR elements (>>bulk casts: simd). The counts alone (the
   numerics diagnostics' mp__scans) follow the same rule: mp__scan_*_avx512,
   mp__scan_*_avx2, mp__scan_*_scalar. The scalar path works in blocks that stay
   in L1 (MP__BLOCK), so that the optional stats and the cast read the
   source from memory once; the SIMD rows count in the cast's own pass and
   take larger ones. Each variant's functions are static inline, named
   `..._scalar`, `..._avx2` (mp__x86_*) and `..._avx512` (mp__z_*), and
   take the dtypes as arguments that are constants wherever they are
   inlined, so that each row compiles to its own loops. bench/convert.c
   times every direction through each path. */
enum { MP__BLOCK = 2048 };
#define MP__F32_INF 0x7F800000u

/* The index of the first Inf or NaN of x[0 .. n), or n: blocks of 64 tested
   without a branch (a loop compilers vectorise: an exponent of all ones
   is the one that carries into bit 31 when its lowest bit is added), then
   the block that has one. With a compare per element and a test per 16,
   gcc kept each 16 on the stack, and a batch from memory went at half the
   memory's read rate. */
static size_t mp__first_nonfinite(const float *x, size_t n) {
    size_t i = 0, k;
    for (; i + 64 <= n; i += 64) {
        uint32_t bad = 0, b;
        for (k = 0; k < 64; k++) {
            memcpy(&b, x + i + k, sizeof b);
            bad |= (b & MP__F32_INF) + 0x00800000u;
        }
        if (bad >> 31) break;
    }
    for (; i < n; i++)
        if ((mp__f32_bits(x[i]) & MP__F32_INF) == MP__F32_INF) return i;
    return n;
}

/* >>bulk casts: cast stats
   Round to nearest is monotone, so what narrowing does to x depends only on
   where |x| falls among three thresholds of the target format. As float32
   bit patterns (which order like magnitudes), with lo inclusive:
       [1, sub_lo)               underflow: nonzero rounds to zero
       [sub_lo, normal_lo)       a subnormal result
       [inf_lo, Inf)             overflow: finite rounds to Inf
   So the stats need only the source, widened exactly to float32; the
   results are never re-read. tests/test_numerics.c checks the counts against
   the actual results of all 2^32 float32 inputs. */
typedef struct mp__ranges { uint32_t sub_lo, normal_lo, inf_lo; } mp__ranges;
static const mp__ranges mp__ranges_of[MP_DTYPE_COUNT] = {
    /* sub_lo: just above half the smallest subnormal (the tie goes to 0);
       normal_lo: the smallest normal less half an ulp (the tie goes up);
       inf_lo: the largest finite plus half an ulp (the tie goes to Inf) */
    {0x00000001u, 0x00800000u, 0x7F800000u},  /* float32: nothing narrows */
    {0x33000001u, 0x387FE000u, 0x477FF000u},  /* float16: 2^-25, 2^-14 - 2^-25, 65520 */
    {0x00008001u, 0x007F8000u, 0x7F7F8000u}}; /* bfloat16: 2^-134, 2^-126 - 2^-134, ~3.39e38 */

typedef struct mp__scan {
    uint32_t nan, inf, underflow, subnormal, overflow, max_abs, min_abs; /* magnitudes: float32 bits */
} mp__scan;

/* A row casts n elements and, if scan is not NULL, classifies the source. */
typedef void (*mp__row_fn)(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r);

static uint32_t mp__load_f32(const void *p, size_t i) { return mp__f32_bits(((const float *)p)[i]); }
static uint32_t mp__load_f16(const void *p, size_t i) { return mp__f32_bits_from_f16(((const mp_f16 *)p)[i].bits); }
static uint32_t mp__load_bf16(const void *p, size_t i) { return mp__f32_bits_from_bf16(((const mp_bf16 *)p)[i].bits); }
static void mp__store_f32(void *p, size_t i, uint32_t u) { ((float *)p)[i] = mp__f32_from_bits(u); }
static void mp__store_f16(void *p, size_t i, uint32_t u) { ((mp_f16 *)p)[i].bits = mp__f16_from_f32_bits(u); }
static void mp__store_bf16(void *p, size_t i, uint32_t u) { ((mp_bf16 *)p)[i].bits = mp__bf16_from_f32_bits(u); }

/* >>bulk casts: scalar
   The float32 bits of element i of a dtype, and back. */
MP__HOT uint32_t mp__load_bits(const void *p, mp_dtype t, size_t i) {
    return t == MP_FLOAT32 ? mp__load_f32(p, i) : t == MP_FLOAT16 ? mp__load_f16(p, i) : mp__load_bf16(p, i);
}
MP__HOT void mp__store_bits(void *p, mp_dtype t, size_t i, uint32_t u) {
    if (t == MP_FLOAT32) mp__store_f32(p, i, u);
    else if (t == MP_FLOAT16) mp__store_f16(p, i, u);
    else mp__store_bf16(p, i, u);
}
MP__HOT size_t mp__elem_size(mp_dtype t) { return t == MP_FLOAT32 ? 4u : 2u; }

static uint32_t mp__in(uint32_t a, uint32_t lo, uint32_t hi) { return a - lo < hi - lo; } /* lo <= a < hi */

/* The scalar scan: local accumulators and mask selects, which compilers
   vectorise. */
MP__HOT mp__scan mp__scan_scalar(const void *src, mp_dtype from, size_t n, mp__ranges r) {
    uint32_t nan = 0, inf = 0, under = 0, sub = 0, over = 0, hi = 0, lo = 0xFFFFFFFFu;
    size_t i;
    mp__scan s;
    for (i = 0; i < n; i++) {
        uint32_t a = mp__load_bits(src, from, i) & 0x7FFFFFFFu;
        uint32_t finite_nonzero = 0u - mp__in(a, 1u, MP__F32_INF); /* all ones */
        nan += a > MP__F32_INF;
        inf += a == MP__F32_INF;
        under += mp__in(a, 1u, r.sub_lo);
        sub += mp__in(a, r.sub_lo, r.normal_lo);
        over += mp__in(a, r.inf_lo, MP__F32_INF);
        hi = (a & finite_nonzero) > hi ? a & finite_nonzero : hi;
        lo = (a | ~finite_nonzero) < lo ? a | ~finite_nonzero : lo;
    }
    s.nan = nan, s.inf = inf, s.underflow = under, s.subnormal = sub, s.overflow = over;
    s.max_abs = hi, s.min_abs = lo;
    return s;
}
static mp__scan mp__scan_f32_scalar(const void *src, size_t n, mp__ranges r) { return mp__scan_scalar(src, MP_FLOAT32, n, r); }
static mp__scan mp__scan_f16_scalar(const void *src, size_t n, mp__ranges r) { return mp__scan_scalar(src, MP_FLOAT16, n, r); }
static mp__scan mp__scan_bf16_scalar(const void *src, size_t n, mp__ranges r) { return mp__scan_scalar(src, MP_BFLOAT16, n, r); }
MP__HOT mp__scan mp__scan_by(mp_dtype from, const void *src, size_t n, mp__ranges r) {
    return from == MP_FLOAT32 ? mp__scan_f32_scalar(src, n, r) : from == MP_FLOAT16 ? mp__scan_f16_scalar(src, n, r) : mp__scan_bf16_scalar(src, n, r);
}

/* The scalar rows: classify first (dst may be src), then cast. A cast to
   the same dtype is a copy, as in Keras: signalling NaNs pass unchanged. */
MP__HOT void mp__row_scalar(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t n, mp__scan *scan,
                            mp__ranges r) {
    size_t i;
    if (scan) *scan = mp__scan_by(from, src, n, r);
    if (to == from) memmove(dst, src, n * mp__elem_size(to));
    else for (i = 0; i < n; i++) mp__store_bits(dst, to, i, mp__load_bits(src, from, i));
}
static void mp__row_f32_to_f32_scalar(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_scalar(dst, MP_FLOAT32, src, MP_FLOAT32, n, scan, r);
}
static void mp__row_f16_to_f16_scalar(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_scalar(dst, MP_FLOAT16, src, MP_FLOAT16, n, scan, r);
}
static void mp__row_bf16_to_bf16_scalar(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_scalar(dst, MP_BFLOAT16, src, MP_BFLOAT16, n, scan, r);
}
static void mp__row_f32_to_f16_scalar(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_scalar(dst, MP_FLOAT16, src, MP_FLOAT32, n, scan, r);
}
static void mp__row_f32_to_bf16_scalar(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_scalar(dst, MP_BFLOAT16, src, MP_FLOAT32, n, scan, r);
}
static void mp__row_f16_to_f32_scalar(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_scalar(dst, MP_FLOAT32, src, MP_FLOAT16, n, scan, r);
}
static void mp__row_f16_to_bf16_scalar(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_scalar(dst, MP_BFLOAT16, src, MP_FLOAT16, n, scan, r);
}
static void mp__row_bf16_to_f32_scalar(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_scalar(dst, MP_FLOAT32, src, MP_BFLOAT16, n, scan, r);
}
static void mp__row_bf16_to_f16_scalar(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_scalar(dst, MP_FLOAT16, src, MP_BFLOAT16, n, scan, r);
}
/* [dst][src], in mp_dtype order: float32, float16, bfloat16 */
static const mp__row_fn mp__rows_scalar[MP_DTYPE_COUNT][MP_DTYPE_COUNT] = {
    {mp__row_f32_to_f32_scalar, mp__row_f16_to_f32_scalar, mp__row_bf16_to_f32_scalar},
    {mp__row_f32_to_f16_scalar, mp__row_f16_to_f16_scalar, mp__row_bf16_to_f16_scalar},
    {mp__row_f32_to_bf16_scalar, mp__row_f16_to_bf16_scalar, mp__row_bf16_to_bf16_scalar}};

#ifdef MP__SIMD_X86
/* >>bulk casts: simd
   What the AVX-512 and AVX2 rows share. Both count in the cast's own
   pass, with the same counts and thresholds, in vectors of their width. */

/* A cast of MP__CAST_FAR elements or more (64 MiB of float32) goes in
   rows of its path's whole block, a shorter one in half blocks
   (mp__rows_block), so that a row of a whole block knows it is part of a
   long cast, whose source comes from memory: such a row fetches its
   source MP__CAST_AHEAD bytes ahead of its loads (and the AVX-512 rows
   stream their stores). The hardware prefetchers alone left those casts
   short of the memory's rate, the counted ones most (bench/convert,
   16M elements). In a shorter cast the
   source is in cache and the prefetches would only cost their
   instructions (bench/convert in L1). The address is formed as an
   integer: near the end it lies past the source, where a prefetch does
   nothing. */
enum { MP__CAST_FAR = 1 << 24, MP__CAST_AHEAD = 4096 };
MP__HOT void mp__cast_ahead(const void *p) { mp__prefetch((const void *)((uintptr_t)p + MP__CAST_AHEAD)); }

/* How many of n elements of elem_size bytes come before dst's first
   `align`-byte boundary (a power of two): the rows' aligned stores start
   there. */
MP__HOT size_t mp__head(const void *dst, size_t elem_size, size_t n, size_t align) {
    size_t m = (size_t)(0u - (uintptr_t)dst) % align / elem_size;
    return m < n ? m : n;
}

/* The bits set in a mask: POPCNT, which every AVX2 and AVX-512 CPU has
   (a build without -mpopcnt gets a slower sequence, the same count). The
   empty asm keeps each count in a general register: where the CPU has
   AVX512_VPOPCNTDQ, clang's SLP vectorizer gathered four masks' bits into
   a vector (vmovd, three vpinsrd) for one vpopcntd, and its counted cast
   ran slower than gcc's from memory (bfloat16 to float16, wide data, every
   mask counted); with it, clang's counts cost what gcc's do
   (bench/convert). */
#if defined(__GNUC__) || defined(__clang__)
MP__HOT uint32_t mp__ones(uint32_t mask) {
    uint32_t ones = (uint32_t)__builtin_popcount(mask);
    __asm__("" : "+r"(ones));
    return ones;
}
#else
MP__HOT uint32_t mp__ones(uint32_t mask) { return (uint32_t)_mm_popcnt_u32(mask); }
#endif

/* The ranges from the counts of lanes with a >= 1, t1, t2, t3, Inf and
   > Inf; those of the ranges not counted are zero. */
static void mp__range_counts(mp__scan *s, int under, int sub, int over, uint32_t n0, uint32_t n1, uint32_t n2,
                             uint32_t n3, uint32_t n4, uint32_t n5) {
    s->underflow = under ? n0 - n1 : 0u, s->subnormal = sub ? n1 - n2 : 0u, s->overflow = over ? n3 - n4 : 0u;
    s->inf = n4 - n5, s->nan = n5;
}

/* zero results = zero inputs + underflows; Inf results = Inf inputs +
   overflows; NaN inputs are the NaN results, the other nonfinite ones Inf. */
static void mp__narrow_counts(mp__scan *s, uint32_t zero_in, uint32_t nonfinite_in, uint32_t zero_out,
                              uint32_t below_normal, uint32_t inf_or_nan_out, uint32_t nan_out) {
    uint32_t inf_in = nonfinite_in - nan_out;
    s->underflow = zero_out - zero_in, s->subnormal = below_normal - zero_out;
    s->overflow = inf_or_nan_out - nan_out - inf_in, s->inf = inf_in, s->nan = nan_out;
}

/* The elements a cast's stats name: every count but zero inputs. */
static uint32_t mp__specials(const mp__scan *s) { return s->underflow + s->subnormal + s->overflow + s->inf + s->nan; }

/* The rows with counts take a chunk at a time, its bounds alone after a
   chunk with nothing to count (the rows below), and start that way. The
   first chunk is short (MP__STATS_PROBE): where the data is full of values
   to count, it is cast twice, bounds and then counts, and a first chunk as
   long as the rest would add a whole bounds pass to a short cast, which
   bench/convert shows for 4096 elements of wide data. */
enum { MP__STATS_PROBE = 256 };

/* The extremes as float32 bits from a row's lanes: top = max(a + bias) as
   signed (bias = 2^(W-1) - Inf puts every finite magnitude a in the
   positive half and Inf and NaN in the negative one), low_minus_1 =
   min(a - 1) as unsigned (zero wraps to the top; Inf and NaN lie above
   every finite value). None: 0 and all ones, as the portable scan leaves
   them. */
static void mp__extremes32(mp__scan *s, uint32_t top, uint32_t low_minus_1) {
    s->max_abs = top - (0x80000000u - MP__F32_INF);
    s->min_abs = low_minus_1 < MP__F32_INF - 1u ? low_minus_1 + 1u : 0xFFFFFFFFu;
}

/* 16-bit sources are counted on their own bits, a vector's 16-bit lanes a
   compare: widening is exact and monotone, so |x| >= t in float32 exactly
   when the 16-bit magnitude is at least the least one that widens to t or
   more. Those, for each target's sub_lo, normal_lo and inf_lo
   (mp__ranges_of); tests/test_numerics.c compares every 16-bit value's
   counts and extremes with the portable scan's. Inf is 0x7C00 in float16,
   0x7F80 in bfloat16; the least normal 0x0400 and 0x0080. */
static const uint16_t mp__ranges16[2][MP_DTYPE_COUNT][3] = {
    {{0x0001, 0x0001, 0x7C00}, {0x0001, 0x0400, 0x7C00}, {0x0001, 0x0001, 0x7C00}},  /* float16 */
    {{0x0001, 0x0080, 0x7F80}, {0x3301, 0x3880, 0x4780}, {0x0001, 0x0080, 0x7F80}}}; /* bfloat16 */

/* A 16-bit dtype's Inf and least normal magnitude, its thresholds for a
   target (mp__ranges16) and its bits widened to float32's. */
MP__HOT uint32_t mp__inf16(mp_dtype t) { return t == MP_FLOAT16 ? 0x7C00u : 0x7F80u; }
MP__HOT uint32_t mp__normal16(mp_dtype t) { return t == MP_FLOAT16 ? 0x0400u : 0x0080u; }
MP__HOT const uint16_t *mp__ranges16_of(mp_dtype from, mp_dtype to) { return mp__ranges16[from == MP_FLOAT16 ? 0 : 1][to]; }
MP__HOT uint32_t mp__widen16(mp_dtype t, uint16_t h) {
    return t == MP_FLOAT16 ? mp__f32_bits_from_f16(h) : mp__f32_bits_from_bf16(h);
}

/* What a pass over a row's whole vectors does besides the cast: nothing
   (PLAIN), take their bounds (BOUNDS), count them (COUNT), or count a
   chunk already cast and stored again without storing (RECOUNT). The pass,
   the dtypes and `far` are constants wherever the SIMD rows' functions are
   inlined (MP__HOT), so each row compiles to loops that carry no test. */
enum { MP__PASS_PLAIN, MP__PASS_BOUNDS, MP__PASS_COUNT, MP__PASS_RECOUNT };

/* Where a counted row stands in the chunk loop (the rows below): the chunk
   [start, end), the length of the next, whether this one is counted as it
   is cast (in place, dst == src, every chunk is) and the specials counted
   so far. */
typedef struct mp__chunks {
    size_t start, end, len;
    uint32_t specials;
    int count, in_place;
} mp__chunks;
MP__HOT void mp__chunks_begin(mp__chunks *k, const void *dst, const void *src) {
    k->start = k->end = 0, k->len = MP__STATS_PROBE, k->specials = 0;
    k->in_place = k->count = dst == src;
}
/* The next chunk of whole steps from i, if one remains; those after the
   first are len long. */
MP__HOT int mp__chunks_next(mp__chunks *k, size_t i, size_t n, size_t step, size_t len) {
    if (i + step > n) return 0;
    k->start = i, k->end = n - i > k->len ? i + k->len : n;
    k->len = len;
    return 1;
}
/* After a counted chunk, whose counts are now in *s: the next one is
   counted too if this one added to the specials. */
MP__HOT void mp__chunks_counted(mp__chunks *k, const mp__scan *s) {
    uint32_t now = mp__specials(s);
    k->count = k->in_place || now != k->specials;
    k->specials = now;
}
/* The extremes from 16-bit lanes of a dtype `from`, widened to float32 bits. */
static void mp__extremes16(mp__scan *s, uint32_t top, uint32_t low_minus_1, mp_dtype from) {
    uint32_t inf = mp__inf16(from);
    s->max_abs = mp__widen16(from, (uint16_t)(top - (0x8000u - inf)));
    s->min_abs = low_minus_1 < inf - 1u ? mp__widen16(from, (uint16_t)(low_minus_1 + 1u)) : 0xFFFFFFFFu;
}
#endif

#ifdef MP__SIMD_AVX512
/* >>bulk casts: avx512
   Sixteen float32 lanes at a time, in one pass that casts and counts. The
   conversions are those of the AVX2 rows below, widened: vcvtph2ps, and
   vcvtps2ph with an explicit rounding immediate, which ignores MXCSR; the
   bfloat16 narrowing is the scalar integer formula, or with AVX512_BF16
   vcvtne2ps2bf16 wherever no input is subnormal (it flushes those to
   zero; see mp__z_narrow2_bf16). tests/test_numerics.c checks all
   2^32 inputs against the scalar code. Whole pairs of vectors go first:
   their 16-bit results leave in one 64-byte store where they stream, as
   the register form of vcvtps2ph and a store can outrun vcvtps2ph to
   memory. The pairs before the destination's first 64-byte boundary,
   and the last pair, are loaded and stored under a mask; their missing
   lanes load as zeros, which no count and no extreme sees. g++
   takes the `_mm512_undefined_*` inside these intrinsics for uses of
   uninitialised values (a false positive, in C++ only), as in the GEMM's
   transposes. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
MP__HOT __m512 mp__z_load_f32(const void *p, size_t i, __mmask16 k) {
    return _mm512_maskz_loadu_ps(k, (const float *)p + i);
}
MP__HOT __m512 mp__z_widen_f16(__m256i h) { return _mm512_cvtph_ps(h); }
MP__HOT __m512 mp__z_widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
MP__HOT __m512 mp__z_widen(__m256i h, mp_dtype from) { return from == MP_FLOAT16 ? mp__z_widen_f16(h) : mp__z_widen_bf16(h); }
MP__HOT __m512 mp__z_load_f16(const void *p, size_t i, __mmask16 k) {
    return mp__z_widen_f16(_mm256_maskz_loadu_epi16(k, (const mp_f16 *)p + i));
}
MP__HOT __m512 mp__z_load_bf16(const void *p, size_t i, __mmask16 k) {
    return mp__z_widen_bf16(_mm256_maskz_loadu_epi16(k, (const mp_bf16 *)p + i));
}
MP__HOT __m512 mp__z_load(const void *p, mp_dtype from, size_t i, __mmask16 k) {
    return from == MP_FLOAT32 ? mp__z_load_f32(p, i, k) : from == MP_FLOAT16 ? mp__z_load_f16(p, i, k) : mp__z_load_bf16(p, i, k);
}

/* The 16-bit results of a vector, and of a pair (a in the low half). */
MP__HOT __m256i mp__z_narrow_f16(__m512 v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT); }
MP__HOT __m256i mp__z_narrow_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v), high = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32((int)MP__F32_INF));
    return _mm512_cvtepi32_epi16(_mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40)));
}
MP__HOT __m512i mp__z_join(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }
MP__HOT __m512i mp__z_narrow2_f16(__m512 a, __m512 b) { return mp__z_join(mp__z_narrow_f16(a), mp__z_narrow_f16(b)); }
MP__HOT __m512i mp__z_narrow2_bf16(__m512 a, __m512 b) {
#ifdef __AVX512BF16__
    /* vcvtne2ps2bf16 rounds to nearest even whatever MXCSR says, and its
       NaN is the scalar one (sign | 0x7FC0 | fraction >> 16), but it reads
       subnormal inputs as zero: a pair with a nonzero lane whose exponent
       field is zero takes the integer formula. */
    const __m512i exponent = _mm512_set1_epi32(0x7F800000), fraction = _mm512_set1_epi32(0x007FFFFF);
    __m512i ua = _mm512_castps_si512(a), ub = _mm512_castps_si512(b);
    __mmask16 sub_a = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(ua, exponent), ua, fraction);
    __mmask16 sub_b = _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(ub, exponent), ub, fraction);
    if (!(sub_a | sub_b)) return (__m512i)_mm512_cvtne2ps_pbh(b, a); /* a in the low half */
#endif
    return mp__z_join(mp__z_narrow_bf16(a), mp__z_narrow_bf16(b));
}
MP__HOT __m512i mp__z_narrow2(__m512 a, __m512 b, mp_dtype to) {
    return to == MP_FLOAT16 ? mp__z_narrow2_f16(a, b) : mp__z_narrow2_bf16(a, b);
}

/* The AVX-512 rows count in the cast's own pass, so their blocks need not stay
   in L1: mp_convert calls a row per MP__Z_BLOCK elements (its 32-bit counts
   hold any block) in a cast of MP__CAST_FAR elements or more, and per half
   that in a shorter one. A row of a whole MP__Z_BLOCK fetches its source ahead
   (MP__CAST_AHEAD) and stores its whole pairs around the caches (vmovntdq /
   vmovntps, 64-byte aligned): a store that misses the cache otherwise reads
   its line from memory first, a third of a widening cast's traffic, and a
   destination of 32 MiB or more does not stay in this machine class's L3
   anyway; a shorter cast's result stays in cache for whatever reads it next
   (the layers' casts, split over the threads). The row ends with sfence, which
   orders the streaming stores before any later store, as other threads expect.
   `stream` is a constant wherever these are inlined. */
enum { MP__Z_BLOCK = 1 << 20 };
MP__HOT void mp__z_store(void *p, __m512i v, int stream) {
    if (stream) _mm512_stream_si512((__m512i *)p, v);
    else _mm512_storeu_si512(p, v);
}

/* A pair of vectors (32 elements) at i, whole or the lanes k. */
MP__HOT void mp__z_put2_f32(void *p, size_t i, __m512 a, __m512 b, int stream) {
    mp__z_store((float *)p + i, _mm512_castps_si512(a), stream);
    mp__z_store((float *)p + i + 16, _mm512_castps_si512(b), stream);
}
/* float16 results that stay in cache go out as each vcvtps2ph's own
   32-byte store, not joined into one 64-byte store first, as the AVX2
   rows' do (mp__x86_put2): the join is a shuffle on the port the
   conversions use, and the plain cast from float32 ran faster without it
   in L1 and in L2 (bench/convert). A streamed line keeps its one store
   (write-combining). */
MP__HOT void mp__z_put2_f16(void *p, size_t i, __m512 a, __m512 b, int stream) {
    mp_f16 *d = (mp_f16 *)p + i;
    if (stream) {
        mp__z_store(d, mp__z_narrow2_f16(a, b), 1);
        return;
    }
    _mm256_storeu_si256((__m256i *)d, mp__z_narrow_f16(a));
    _mm256_storeu_si256((__m256i *)(d + 16), mp__z_narrow_f16(b));
}
MP__HOT void mp__z_put2_bf16(void *p, size_t i, __m512 a, __m512 b, int stream) {
    mp__z_store((mp_bf16 *)p + i, mp__z_narrow2_bf16(a, b), stream);
}
MP__HOT void mp__z_put2(void *p, mp_dtype to, size_t i, __m512 a, __m512 b, int stream) {
    if (to == MP_FLOAT32) mp__z_put2_f32(p, i, a, b, stream);
    else if (to == MP_FLOAT16) mp__z_put2_f16(p, i, a, b, stream);
    else mp__z_put2_bf16(p, i, a, b, stream);
}
MP__HOT void mp__z_put2_masked_f32(void *p, size_t i, __mmask32 k, __m512 a, __m512 b) {
    _mm512_mask_storeu_ps((float *)p + i, (__mmask16)k, a);
    _mm512_mask_storeu_ps((float *)p + i + 16, (__mmask16)(k >> 16), b);
}
MP__HOT void mp__z_put2_masked_f16(void *p, size_t i, __mmask32 k, __m512 a, __m512 b) {
    _mm512_mask_storeu_epi16((mp_f16 *)p + i, k, mp__z_narrow2_f16(a, b));
}
MP__HOT void mp__z_put2_masked_bf16(void *p, size_t i, __mmask32 k, __m512 a, __m512 b) {
    _mm512_mask_storeu_epi16((mp_bf16 *)p + i, k, mp__z_narrow2_bf16(a, b));
}
MP__HOT void mp__z_put2_masked(void *p, mp_dtype to, size_t i, __mmask32 k, __m512 a, __m512 b) {
    if (to == MP_FLOAT32) mp__z_put2_masked_f32(p, i, k, a, b);
    else if (to == MP_FLOAT16) mp__z_put2_masked_f16(p, i, k, a, b);
    else mp__z_put2_masked_bf16(p, i, k, a, b);
}

/* The lanes of the 32 float32 or bfloat16 values at p + i (those in k)
   that are > 0, on their bits: 0 < bits <= +Inf's (a NaN is not > 0). */
MP__HOT __mmask32 mp__z_positive2(const void *p, mp_dtype t, size_t i, __mmask32 k) {
    if (t == MP_FLOAT32) {
        const float *f = (const float *)p + i;
        __m512i inf = _mm512_set1_epi32(0x7F800000), zero = _mm512_setzero_si512();
        __m512i lo = _mm512_castps_si512(_mm512_maskz_loadu_ps((__mmask16)k, f));
        __m512i hi = _mm512_castps_si512(_mm512_maskz_loadu_ps((__mmask16)(k >> 16), f + 16));
        __mmask16 pos_lo = _mm512_mask_cmple_epi32_mask(_mm512_cmpgt_epi32_mask(lo, zero), lo, inf);
        __mmask16 pos_hi = _mm512_mask_cmple_epi32_mask(_mm512_cmpgt_epi32_mask(hi, zero), hi, inf);
        return (__mmask32)pos_lo | (__mmask32)pos_hi << 16;
    } else {
        __m512i v = _mm512_maskz_loadu_epi16(k, (const mp_bf16 *)p + i);
        return _mm512_mask_cmple_epi16_mask(_mm512_cmpgt_epi16_mask(v, _mm512_setzero_si512()), v,
                                            _mm512_set1_epi16(0x7F80));
    }
}

/* The mask of the lanes [i, min(i + 16, n)); of the first m < 32 lanes. */
MP__HOT __mmask16 mp__z_lanes(size_t i, size_t n) {
    return n - i >= 16 ? (__mmask16)0xFFFFu : (__mmask16)((1u << (n - i)) - 1u);
}
MP__HOT __mmask32 mp__z_tail(size_t m) { return (__mmask32)((1u << m) - 1u); }
/* A short run of float16 or bfloat16 widened in line (mp__load): whole
   vectors, then the tail under a mask. The 2x2 convolution's weight
   gradient in float16 packs runs of 64 a row, and ran faster this way than
   with a call to the row function per run or with a mask on every store
   (bench/train). */
MP__HOT void mp__z_widen_run(float *dst, const void *src, mp_dtype t, size_t n) {
    const __m256i *v = (const __m256i *)src; /* 16 elements a vector */
    size_t i = 0;
    __mmask16 k;
    if (t == MP_FLOAT16)
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, mp__z_widen_f16(_mm256_loadu_si256(v + i / 16)));
    else
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, mp__z_widen_bf16(_mm256_loadu_si256(v + i / 16)));
    if (i == n) return;
    k = mp__z_lanes(i, n);
    _mm512_mask_storeu_ps(dst + i, k, t == MP_FLOAT16 ? mp__z_load_f16(src, i, k) : mp__z_load_bf16(src, i, k));
}

/* Lane-width-generic operations on W-bit lanes (w = 32: float32 bits; 16:
   float16 or bfloat16 bits); the masks' lanes as bits of a uint32_t. */
MP__HOT __m512i mp__z_set(uint32_t x, int w) { return w == 32 ? _mm512_set1_epi32((int)x) : _mm512_set1_epi16((short)x); }
MP__HOT __m512i mp__z_add(__m512i a, __m512i b, int w) { return w == 32 ? _mm512_add_epi32(a, b) : _mm512_add_epi16(a, b); }
MP__HOT __m512i mp__z_sub(__m512i a, __m512i b, int w) { return w == 32 ? _mm512_sub_epi32(a, b) : _mm512_sub_epi16(a, b); }
MP__HOT __m512i mp__z_max(__m512i a, __m512i b, int w) { return w == 32 ? _mm512_max_epi32(a, b) : _mm512_max_epi16(a, b); }
MP__HOT __m512i mp__z_maxu(__m512i a, __m512i b, int w) { return w == 32 ? _mm512_max_epu32(a, b) : _mm512_max_epu16(a, b); }
MP__HOT __m512i mp__z_minu(__m512i a, __m512i b, int w) { return w == 32 ? _mm512_min_epu32(a, b) : _mm512_min_epu16(a, b); }
MP__HOT uint32_t mp__z_nonzero(__m512i a, int w) {
    return w == 32 ? (uint32_t)_mm512_test_epi32_mask(a, a) : (uint32_t)_mm512_test_epi16_mask(a, a);
}
MP__HOT uint32_t mp__z_ge(__m512i a, __m512i b, int w) { /* unsigned */
    return w == 32 ? (uint32_t)_mm512_cmpge_epu32_mask(a, b) : (uint32_t)_mm512_cmpge_epu16_mask(a, b);
}
MP__HOT uint32_t mp__z_gt(__m512i a, __m512i b, int w) { /* unsigned */
    return w == 32 ? (uint32_t)_mm512_cmpgt_epu32_mask(a, b) : (uint32_t)_mm512_cmpgt_epu16_mask(a, b);
}
MP__HOT uint32_t mp__z_negative(__m512i a, int w) {
    return w == 32 ? (uint32_t)_mm512_cmplt_epi32_mask(a, _mm512_setzero_si512())
                   : (uint32_t)_mm512_cmplt_epi16_mask(a, _mm512_setzero_si512());
}

/* What an AVX-512 row or scan counts as it goes. Its fields are locals
   of the row once the functions that take it are inlined (MP__HOT): a
   tally whose address escaped would keep its vectors in memory.

   The lanes set in a compare's mask are added to a count in a general
   register (mp__ones). Counting there rather than by a masked add of one
   into a vector of counts leaves the vector units the cast and the
   compares, which costs less where 512-bit operations take two passes of
   256-bit units (bench/convert, the counts' cost over the cast); for
   float32 sources the source's zero and Inf lanes are counted by their
   sign bits instead (below), which cost less than masks there.

   The range counts of a source's W-bit magnitudes a (the scans: W = 32;
   the rows from float16 or bfloat16: W = 16, on the source's own bits): one
   compare into a mask register per threshold t (n0 ... n5: lanes with
   a >= 1, t1, t2, t3, Inf, and a > Inf), its lanes added to a count
   (mp__ones), every vector, so that data full of underflows, overflows
   and Inf costs what data without them does; differences of adjacent
   counts give the ranges. Nonzero lanes are a & a != 0, and the lanes with
   a >= Inf those where the extremes' a + bias has its sign bit set. A
   range the cast cannot reach (under, sub, over are 0: float16 to
   float32 or to bfloat16, bfloat16 to float32) costs nothing. The
   extremes take no mask: hi = max(a + bias), signed, where bias moves
   every finite magnitude to the positive half and Inf and NaN to the
   negative one; lo = min(a - 1), unsigned, where zero wraps to the top and
   Inf and NaN lie above every finite value, to be dropped at the end.

   A float32 source's counts come mostly from the cast's results, 32 lanes
   a compare (mp__z_count_narrow): round to nearest is monotone and sub_lo,
   normal_lo and inf_lo (mp__ranges_of) are exactly where the result
   becomes nonzero, normal and Inf, so zero, subnormal, Inf and NaN
   results (n2 ... n5: zero, below normal, Inf or NaN, NaN) count the
   ranges once zero and nonfinite inputs are told apart, on the source.
   Those two take no compare: a + bias has its sign bit set exactly for Inf
   and NaN, and a - 1 for zero, so a shift by 31 gives each count, in vector
   lanes (zero_in), which cost less than comparing them into masks. The
   results' four classes are counted by mp__ones. The extremes are the
   source's, as above, but for the largest: the loop keeps max a alone (hi)
   and counts no Inf or NaN input (which leaves mp__specials' sum as it
   is), five operations a source vector rather than nine. Where max a shows
   Inf or NaN in the row, a source that overflowed before this cast, the
   row's counts and extremes come from the counting scan (mp__scan_f32_avx512),
   which reads it again.

   top and low: a chunk's bounds alone, max a and min(a - 1), for the rows'
   uncounted chunks (mp__z_chunks); normal_lo and inf_lo, in the lanes'
   bits, tell whether they show something to count. */
typedef struct mp__z_tally {
    __m512i one, abs, bias, t1, t2, t3, inf; /* W-bit lanes' constants */
    __m512i abs16, normal16, inf16;          /* a float32 source's 16-bit results' */
    __m512i hi, lo, top, low, zero_in;
    uint32_t n0, n1, n2, n3, n4, n5, normal_lo, inf_lo;
    int under, sub, over;
} mp__z_tally;

/* The range counts against thresholds t1, t2, t3 in W-bit lanes whose Inf is inf. */
MP__HOT void mp__z_tally_ranges(mp__z_tally *c, int w, uint32_t t1, uint32_t t2, uint32_t t3, uint32_t inf) {
    uint32_t sign = 1u << (w - 1);
    c->under = t1 != 1u, c->sub = t2 != t1, c->over = t3 != inf;
    c->one = mp__z_set(1, w), c->abs = mp__z_set(sign - 1u, w), c->bias = mp__z_set(sign - inf, w);
    c->t1 = mp__z_set(t1, w), c->t2 = mp__z_set(t2, w), c->t3 = mp__z_set(t3, w), c->inf = mp__z_set(inf, w);
    c->hi = c->bias, c->lo = _mm512_set1_epi32(-1);
    c->n0 = c->n1 = c->n2 = c->n3 = c->n4 = c->n5 = 0;
    c->normal_lo = t2, c->inf_lo = t3;
}
/* A row's tally: a float32 source narrowed to `to`, or a 16-bit one. */
MP__HOT void mp__z_tally_begin(mp__z_tally *c, mp_dtype from, mp_dtype to, mp__ranges r) {
    const uint16_t *u = mp__ranges16_of(from, to);
    if (from != MP_FLOAT32) {
        mp__z_tally_ranges(c, 16, u[0], u[1], u[2], mp__inf16(from));
        return;
    }
    c->one = _mm512_set1_epi32(1), c->abs = _mm512_set1_epi32(0x7FFFFFFF);
    c->bias = _mm512_set1_epi32((int)(0x80000000u - MP__F32_INF));
    c->abs16 = _mm512_set1_epi16(0x7FFF), c->normal16 = mp__z_set(mp__normal16(to), 16);
    c->inf16 = mp__z_set(mp__inf16(to), 16);
    c->zero_in = _mm512_setzero_si512(), c->hi = c->zero_in, c->lo = _mm512_set1_epi32(-1);
    c->n2 = c->n3 = c->n4 = c->n5 = 0;
    c->normal_lo = r.normal_lo, c->inf_lo = r.inf_lo;
}

/* The range counts and extremes of W-bit lanes. */
MP__HOT void mp__z_count_lanes(mp__z_tally *c, __m512i bits, int w) {
    __m512i a = _mm512_and_si512(bits, c->abs), b;
    c->n0 += c->under ? mp__ones(mp__z_nonzero(a, w)) : 0u;
    c->n1 += c->under || c->sub ? mp__ones(mp__z_ge(a, c->t1, w)) : 0u;
    c->n2 += c->sub ? mp__ones(mp__z_ge(a, c->t2, w)) : 0u;
    c->n3 += c->over ? mp__ones(mp__z_ge(a, c->t3, w)) : 0u;
    c->n5 += mp__ones(mp__z_gt(a, c->inf, w));
    b = mp__z_add(a, c->bias, w), c->hi = mp__z_max(c->hi, b, w);
    c->n4 += mp__ones(mp__z_negative(b, w));
    c->lo = mp__z_minu(c->lo, mp__z_sub(a, c->one, w), w);
}
/* A float32 source vector's extremes and zero lanes, and a pair's results. */
MP__HOT void mp__z_narrow_source(mp__z_tally *c, __m512 x) {
    __m512i a = _mm512_and_si512(_mm512_castps_si512(x), c->abs), b;
    c->hi = _mm512_max_epu32(c->hi, a);
    b = _mm512_sub_epi32(a, c->one), c->lo = _mm512_min_epu32(c->lo, b);
    c->zero_in = _mm512_add_epi32(c->zero_in, _mm512_srli_epi32(b, 31));
}
MP__HOT void mp__z_count_narrow(mp__z_tally *c, __m512 x0, __m512 x1, __m512i h) {
    __m512i a;
    mp__z_narrow_source(c, x0), mp__z_narrow_source(c, x1);
    a = _mm512_and_si512(h, c->abs16);
    c->n2 += mp__ones(_mm512_testn_epi16_mask(a, a));
    c->n3 += mp__ones(_mm512_cmplt_epu16_mask(a, c->normal16));
    c->n4 += mp__ones(_mm512_cmpge_epu16_mask(a, c->inf16));
    c->n5 += mp__ones(_mm512_cmpgt_epu16_mask(a, c->inf16));
}
MP__HOT void mp__z_bounds(mp__z_tally *c, __m512i bits, int w) {
    __m512i a = _mm512_and_si512(bits, c->abs);
    c->top = mp__z_maxu(c->top, a, w), c->low = mp__z_minu(c->low, mp__z_sub(a, c->one, w), w);
}

MP__HOT uint32_t mp__z_sum32(__m512i v) { return (uint32_t)_mm512_reduce_add_epi32(v); }
/* The largest of 32 signed 16-bit lanes (sign-extended), and the least
   of 32 unsigned ones. */
static uint32_t mp__z_hmax16(__m512i v) {
    return (uint32_t)_mm512_reduce_max_epi32(_mm512_max_epi32(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(v)),
                                                              _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(v, 1))));
}
static uint32_t mp__z_hmin16(__m512i v) {
    return (uint32_t)_mm512_reduce_min_epu32(_mm512_min_epu32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)),
                                                              _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1))));
}
/* Whether a chunk's bounds show nothing to count; then they join the
   row's extremes (the top is finite). */
MP__HOT int mp__z_clean(const mp__z_tally *c, mp_dtype from) {
    if (from == MP_FLOAT32)
        return (uint32_t)_mm512_reduce_max_epu32(c->top) < c->inf_lo &&
               (uint32_t)_mm512_reduce_min_epu32(c->low) >= c->normal_lo - 1u;
    return mp__z_hmax16(c->top) < c->inf_lo && mp__z_hmin16(c->low) >= c->normal_lo - 1u;
}
MP__HOT void mp__z_merge(mp__z_tally *c, mp_dtype from) {
    if (from == MP_FLOAT32) {
        c->lo = _mm512_min_epu32(c->lo, c->low), c->hi = _mm512_max_epu32(c->hi, c->top);
    } else {
        c->lo = _mm512_min_epu16(c->lo, c->low), c->hi = _mm512_max_epi16(c->hi, _mm512_add_epi16(c->top, c->bias));
    }
}

/* The extremes from max(a + bias) and min(a - 1) in 32-bit lanes, and in
   16-bit ones widened to float32 bits. */
static void mp__z_extremes32(mp__scan *s, __m512i hi, __m512i lo_minus_1) {
    mp__extremes32(s, (uint32_t)_mm512_reduce_max_epi32(hi), (uint32_t)_mm512_reduce_min_epu32(lo_minus_1));
}
static void mp__z_extremes16(mp__scan *s, __m512i hi, __m512i lo_minus_1, mp_dtype from) {
    mp__extremes16(s, mp__z_hmax16(hi), mp__z_hmin16(lo_minus_1), from);
}

/* Counts alone: for the numerics diagnostics (mp__scans). Every range is
   counted (r is not a constant); one the target cannot reach counts 0. */
MP__HOT mp__scan mp__scan_avx512(const void *src, mp_dtype from, size_t n, mp__ranges r) {
    size_t i;
    mp__scan s;
    mp__z_tally c;
    mp__z_tally_ranges(&c, 32, r.sub_lo, r.normal_lo, r.inf_lo, MP__F32_INF);
    c.under = c.sub = c.over = 1;
    for (i = 0; i < n; i += 16) mp__z_count_lanes(&c, _mm512_castps_si512(mp__z_load(src, from, i, mp__z_lanes(i, n))), 32);
    mp__range_counts(&s, c.under, c.sub, c.over, c.n0, c.n1, c.n2, c.n3, c.n4, c.n5);
    mp__z_extremes32(&s, c.hi, c.lo);
    return s;
}
static mp__scan mp__scan_f32_avx512(const void *src, size_t n, mp__ranges r) { return mp__scan_avx512(src, MP_FLOAT32, n, r); }
static mp__scan mp__scan_f16_avx512(const void *src, size_t n, mp__ranges r) { return mp__scan_avx512(src, MP_FLOAT16, n, r); }
static mp__scan mp__scan_bf16_avx512(const void *src, size_t n, mp__ranges r) { return mp__scan_avx512(src, MP_BFLOAT16, n, r); }

/* A row's counts so far into *s, and at its end its counts and extremes. */
MP__HOT void mp__z_counts(const mp__z_tally *c, mp_dtype from, mp__scan *s) {
    if (from == MP_FLOAT32) mp__narrow_counts(s, mp__z_sum32(c->zero_in), 0, c->n2, c->n3, c->n4, c->n5);
    else mp__range_counts(s, c->under, c->sub, c->over, c->n0, c->n1, c->n2, c->n3, c->n4, c->n5);
}
MP__HOT void mp__z_tally_end(const mp__z_tally *c, mp_dtype from, const void *src, size_t n, mp__ranges r,
                             mp__scan *s) {
    if (from != MP_FLOAT32) {
        mp__z_counts(c, from, s);
        mp__z_extremes16(s, c->hi, c->lo, from);
    } else if ((uint32_t)_mm512_reduce_max_epu32(c->hi) >= MP__F32_INF) {
        *s = mp__scan_f32_avx512(src, n, r);
    } else {
        mp__z_counts(c, from, s);
        mp__z_extremes32(s, _mm512_add_epi32(c->hi, c->bias), c->lo);
    }
}

/* The rows: a pair under a mask up to the destination's first 64-byte
   boundary (mp__head; so that a whole pair's stores fill whole cache
   lines, where misaligned ones touch one more), whole pairs of vectors (32
   elements), then one pair under a mask. Every pair is loaded and counted
   before it is stored, so dst may be src (the same element size). With
   counts, the whole pairs go a chunk of MP__Z_CHUNK elements at a time
   (16 KiB of float32 source, in L1), as the AVX2 rows do: bounds alone
   (four operations a vector) after a chunk with nothing to count, the
   counts again from L1 where they show something. */
enum { MP__Z_CHUNK = 4096 };

/* The m < 32 elements at i, under a mask. */
MP__HOT void mp__z_part(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t i, size_t m, int pass,
                        mp__z_tally *c) {
    __mmask32 k = mp__z_tail(m);
    if (from == MP_FLOAT32) {
        const float *s = (const float *)src;
        __m512 x0 = _mm512_maskz_loadu_ps((__mmask16)k, s + i);
        __m512 x1 = _mm512_maskz_loadu_ps((__mmask16)(k >> 16), s + i + 16);
        __m512i h = mp__z_narrow2(x0, x1, to);
        if (pass == MP__PASS_COUNT) mp__z_count_narrow(c, x0, x1, h);
        _mm512_mask_storeu_epi16((uint16_t *)dst + i, k, h);
    } else {
        __m512i h = _mm512_maskz_loadu_epi16(k, (const uint16_t *)src + i);
        if (pass == MP__PASS_COUNT) mp__z_count_lanes(c, h, 16);
        mp__z_put2_masked(dst, to, i, k, mp__z_widen(_mm512_castsi512_si256(h), from),
                          mp__z_widen(_mm512_extracti64x4_epi64(h, 1), from));
    }
}
/* The whole pairs from i to end; returns where they stop. Without the
   counts, each pair is stored as mp__z_put2 does, and a 16-bit source
   comes in two 32-byte loads: gcc kept a 64-byte one and its vextracti64x4,
   which ran slower in L2; the counted loop, which compares the 64 bytes at
   once, ran slower with the halves (bench/convert). */
MP__HOT size_t mp__z_pairs(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t i, size_t end, int pass,
                           int far, mp__z_tally *c) {
    const float *s32 = (const float *)src;
    const uint16_t *s16 = (const uint16_t *)src;
    for (; i + 32 <= end; i += 32) {
        if (from == MP_FLOAT32 && pass == MP__PASS_PLAIN) {
            if (far) mp__cast_ahead(s32 + i), mp__cast_ahead(s32 + i + 16);
            mp__z_put2(dst, to, i, _mm512_loadu_ps(s32 + i), _mm512_loadu_ps(s32 + i + 16), far);
        } else if (from == MP_FLOAT32) {
            __m512 x0 = _mm512_loadu_ps(s32 + i), x1 = _mm512_loadu_ps(s32 + i + 16);
            __m512i h = mp__z_narrow2(x0, x1, to);
            if (far) mp__cast_ahead(s32 + i), mp__cast_ahead(s32 + i + 16);
            if (pass == MP__PASS_BOUNDS)
                mp__z_bounds(c, _mm512_castps_si512(x0), 32), mp__z_bounds(c, _mm512_castps_si512(x1), 32);
            else
                mp__z_count_narrow(c, x0, x1, h);
            if (pass != MP__PASS_RECOUNT) mp__z_store((uint16_t *)dst + i, h, far);
        } else if (pass == MP__PASS_PLAIN) {
            if (far) mp__cast_ahead(s16 + i);
            mp__z_put2(dst, to, i, mp__z_widen(_mm256_loadu_si256((const __m256i *)(s16 + i)), from),
                       mp__z_widen(_mm256_loadu_si256((const __m256i *)(s16 + i + 16)), from), far);
        } else {
            __m512i h = _mm512_loadu_si512(s16 + i);
            if (far) mp__cast_ahead(s16 + i);
            if (pass == MP__PASS_BOUNDS) mp__z_bounds(c, h, 16);
            else mp__z_count_lanes(c, h, 16);
            if (pass != MP__PASS_RECOUNT)
                mp__z_put2(dst, to, i, mp__z_widen(_mm512_castsi512_si256(h), from),
                           mp__z_widen(_mm512_extracti64x4_epi64(h, 1), from), far);
        }
    }
    return i;
}
/* The whole pairs with counts, a chunk at a time (mp__chunks). */
MP__HOT size_t mp__z_chunks(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t i, size_t n, int far,
                            mp__z_tally *c, mp__scan *scan) {
    mp__chunks k;
    mp__chunks_begin(&k, dst, src);
    while (mp__chunks_next(&k, i, n, 32, MP__Z_CHUNK)) {
        if (!k.count) {
            c->top = _mm512_setzero_si512(), c->low = _mm512_set1_epi32(-1);
            i = mp__z_pairs(dst, to, src, from, i, k.end, MP__PASS_BOUNDS, far, c);
            if (mp__z_clean(c, from)) {
                mp__z_merge(c, from);
                continue; /* nothing to count: the next chunk likewise */
            }
            i = k.start; /* counted again, from L1 */
        }
        if (k.count) i = mp__z_pairs(dst, to, src, from, i, k.end, MP__PASS_COUNT, far, c);
        else i = mp__z_pairs(dst, to, src, from, i, k.end, MP__PASS_RECOUNT, far, c);
        mp__z_counts(c, from, scan);
        mp__chunks_counted(&k, scan);
    }
    return i;
}
MP__HOT size_t mp__z_whole(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t i, size_t n, int pass,
                           int far, mp__z_tally *c, mp__scan *scan) {
    if (pass == MP__PASS_PLAIN) return mp__z_pairs(dst, to, src, from, i, n, MP__PASS_PLAIN, far, c);
    return mp__z_chunks(dst, to, src, from, i, n, far, c, scan);
}
/* A row, plain (pass PLAIN) or counted (COUNT). */
MP__HOT void mp__z_cast(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t n, mp__scan *scan,
                        mp__ranges r, int pass) {
    size_t i = 0, head = mp__head(dst, mp__elem_size(to), n, 64);
    mp__z_tally c;
    if (pass == MP__PASS_COUNT) mp__z_tally_begin(&c, from, to, r);
    if (head) {
        mp__z_part(dst, to, src, from, 0, head, pass, &c);
        i = head;
    }
    if (n >= MP__Z_BLOCK) {
        i = mp__z_whole(dst, to, src, from, i, n, pass, 1, &c, scan);
        _mm_sfence();
    } else {
        i = mp__z_whole(dst, to, src, from, i, n, pass, 0, &c, scan);
    }
    if (i < n) mp__z_part(dst, to, src, from, i, n - i, pass, &c);
    if (pass == MP__PASS_COUNT) mp__z_tally_end(&c, from, src, n, r, scan);
}
MP__HOT void mp__row_avx512(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t n, mp__scan *scan,
                            mp__ranges r) {
    if (scan) mp__z_cast(dst, to, src, from, n, scan, r, MP__PASS_COUNT);
    else mp__z_cast(dst, to, src, from, n, scan, r, MP__PASS_PLAIN);
}
static void mp__row_f32_to_f16_avx512(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx512(dst, MP_FLOAT16, src, MP_FLOAT32, n, scan, r);
}
static void mp__row_f32_to_bf16_avx512(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx512(dst, MP_BFLOAT16, src, MP_FLOAT32, n, scan, r);
}
static void mp__row_f16_to_f32_avx512(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx512(dst, MP_FLOAT32, src, MP_FLOAT16, n, scan, r);
}
static void mp__row_f16_to_bf16_avx512(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx512(dst, MP_BFLOAT16, src, MP_FLOAT16, n, scan, r);
}
static void mp__row_bf16_to_f32_avx512(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx512(dst, MP_FLOAT32, src, MP_BFLOAT16, n, scan, r);
}
static void mp__row_bf16_to_f16_avx512(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx512(dst, MP_FLOAT16, src, MP_BFLOAT16, n, scan, r);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#elif defined(MP__SIMD_X86)
/* >>bulk casts: avx2
   Eight float32 lanes a vector, or sixteen 16-bit ones, in one pass that
   casts and counts, as the AVX-512 rows above do. vcvtps2ph with an
   explicit rounding immediate ignores MXCSR; its NaN and subnormal results
   are exactly the scalar ones (tests/test_numerics.c checks all 2^32
   inputs). bfloat16 narrowing is the scalar integer formula in AVX2:
   vcvtneps2bf16 is never used, because it flushes subnormal inputs to
   zero. */
MP__HOT __m256 mp__x86_widen_f16(__m128i h) { return _mm256_cvtph_ps(h); }
MP__HOT __m256 mp__x86_widen_bf16(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
MP__HOT __m256 mp__x86_load_f32(const void *p, size_t i) { return _mm256_loadu_ps((const float *)p + i); }
MP__HOT __m256 mp__x86_load_f16(const void *p, size_t i) {
    return mp__x86_widen_f16(_mm_loadu_si128((const __m128i *)((const mp_f16 *)p + i)));
}
MP__HOT __m256 mp__x86_load_bf16(const void *p, size_t i) {
    return mp__x86_widen_bf16(_mm_loadu_si128((const __m128i *)((const mp_bf16 *)p + i)));
}
MP__HOT __m256 mp__x86_load(const void *p, mp_dtype from, size_t i) {
    return from == MP_FLOAT32 ? mp__x86_load_f32(p, i) : from == MP_FLOAT16 ? mp__x86_load_f16(p, i) : mp__x86_load_bf16(p, i);
}

/* bfloat16's rounding in 32-bit lanes, each at most 0xFFFF */
MP__HOT __m256i mp__x86_round_bf16(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                        _mm256_set1_epi32((int)MP__F32_INF));
    return _mm256_blendv_epi8(rounded, nan, is_nan);
}
MP__HOT __m128i mp__x86_narrow_f16(__m256 v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT); }
MP__HOT __m128i mp__x86_narrow_bf16(__m256 v) {
    __m256i r = mp__x86_round_bf16(v);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
/* A pair of vectors' 16-bit results in one, a's in the low half. */
MP__HOT __m256i mp__x86_narrow2(__m256 a, __m256 b, mp_dtype to) {
    if (to == MP_FLOAT16)
        return _mm256_inserti128_si256(_mm256_castsi128_si256(mp__x86_narrow_f16(a)), mp__x86_narrow_f16(b), 1);
    /* packus leaves a0 b0 a1 b1 (halves) */
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(mp__x86_round_bf16(a), mp__x86_round_bf16(b)), 0xD8);
}
MP__HOT void mp__x86_store_f32(void *p, size_t i, __m256 v) { _mm256_storeu_ps((float *)p + i, v); }
MP__HOT void mp__x86_store_f16(void *p, size_t i, __m256 v) {
    _mm_storeu_si128((__m128i *)((mp_f16 *)p + i), mp__x86_narrow_f16(v));
}
MP__HOT void mp__x86_store_bf16(void *p, size_t i, __m256 v) {
    _mm_storeu_si128((__m128i *)((mp_bf16 *)p + i), mp__x86_narrow_bf16(v));
}
/* 32 bytes at p, around the caches where stream says so (vmovntdq; p
   32-byte aligned), as the AVX-512 rows' mp__z_store. */
MP__HOT void mp__x86_store(void *p, __m256i v, int stream) {
    if (stream) _mm256_stream_si256((__m256i *)p, v);
    else _mm256_storeu_si256((__m256i *)p, v);
}
/* A pair of vectors (16 elements) at i, stored in address order: the
   second vector stored first ran slower. float16 results leave in two
   16-byte stores (joined by vinserti128 they ran slower), but streamed in
   one; bfloat16 ones in one, packed together, which ran faster than apart
   (bench/convert, in L1). */
MP__HOT void mp__x86_put2(void *p, mp_dtype to, size_t i, __m256 a, __m256 b, int stream) {
    if (to == MP_FLOAT32) {
        mp__x86_store((float *)p + i, _mm256_castps_si256(a), stream);
        mp__x86_store((float *)p + i + 8, _mm256_castps_si256(b), stream);
    } else if (to == MP_FLOAT16 && !stream) {
        mp__x86_store_f16(p, i, a);
        mp__x86_store_f16(p, i + 8, b);
    } else {
        mp__x86_store((uint16_t *)p + i, mp__x86_narrow2(a, b, to), stream);
    }
}

/* Horizontal sum, signed max and unsigned min of eight 32-bit lanes: fold
   256 -> 128 -> 64 -> 32 bits. */
enum { MP__FOLD_SUM, MP__FOLD_MAX, MP__FOLD_MINU };
MP__HOT __m128i mp__x86_fold_op(__m128i a, __m128i b, int op) {
    return op == MP__FOLD_SUM ? _mm_add_epi32(a, b) : op == MP__FOLD_MAX ? _mm_max_epi32(a, b) : _mm_min_epu32(a, b);
}
MP__HOT uint32_t mp__x86_fold(__m256i v, int op) {
    __m128i x = mp__x86_fold_op(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1), op);
    x = mp__x86_fold_op(x, _mm_shuffle_epi32(x, 0x4E), op);
    return (uint32_t)_mm_cvtsi128_si32(mp__x86_fold_op(x, _mm_shuffle_epi32(x, 0xB1), op));
}
static uint32_t mp__x86_hsum(__m256i v) { return mp__x86_fold(v, MP__FOLD_SUM); }
static uint32_t mp__x86_hmax(__m256i v) { return mp__x86_fold(v, MP__FOLD_MAX); }
static uint32_t mp__x86_hmin(__m256i v) { return mp__x86_fold(v, MP__FOLD_MINU); }
/* The same over sixteen 16-bit lanes: the sum of counts below 2^15 (vpmaddwd
   adds pairs as signed), and the extremes by phminposuw, the unsigned min
   of eight lanes; x ^ 0x7FFF turns the signed order into the unsigned one
   reversed. */
static uint32_t mp__x86_hsum16(__m256i v) { return mp__x86_hsum(_mm256_madd_epi16(v, _mm256_set1_epi16(1))); }
static uint32_t mp__x86_hmin16(__m256i v) {
    __m128i x = _mm_min_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return (uint32_t)_mm_cvtsi128_si32(_mm_minpos_epu16(x)) & 0xFFFFu;
}
static uint32_t mp__x86_hmax16(__m256i v) {
    __m128i flip = _mm_set1_epi16(0x7FFF);
    __m128i x = _mm_xor_si128(_mm_max_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)), flip);
    return ((uint32_t)_mm_cvtsi128_si32(_mm_minpos_epu16(x)) ^ 0x7FFFu) & 0xFFFFu;
}

/* The sign bits set in a pair of vectors' 32-bit lanes. */
MP__HOT uint32_t mp__x86_signs(__m256i a, __m256i b) {
    return mp__ones((uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(a)) |
                    (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(b)) << 8);
}

/* A row's counts and extremes with those of its last few elements. */
static void mp__scan_merge(mp__scan *s, const mp__scan *t) {
    s->nan += t->nan, s->inf += t->inf, s->underflow += t->underflow;
    s->subnormal += t->subnormal, s->overflow += t->overflow;
    if (t->max_abs > s->max_abs) s->max_abs = t->max_abs;
    if (t->min_abs < s->min_abs) s->min_abs = t->min_abs;
}

/* Lane-width-generic operations on W-bit lanes (w = 32 or 16), as the
   AVX-512 rows' mp__z_add and the rest. */
MP__HOT __m256i mp__x86_set(uint32_t x, int w) { return w == 32 ? _mm256_set1_epi32((int)x) : _mm256_set1_epi16((short)x); }
MP__HOT __m256i mp__x86_add(__m256i a, __m256i b, int w) { return w == 32 ? _mm256_add_epi32(a, b) : _mm256_add_epi16(a, b); }
MP__HOT __m256i mp__x86_gt(__m256i a, __m256i b, int w) { return w == 32 ? _mm256_cmpgt_epi32(a, b) : _mm256_cmpgt_epi16(a, b); }
MP__HOT __m256i mp__x86_max(__m256i a, __m256i b, int w) { return w == 32 ? _mm256_max_epi32(a, b) : _mm256_max_epi16(a, b); }
MP__HOT __m256i mp__x86_minu(__m256i a, __m256i b, int w) { return w == 32 ? _mm256_min_epu32(a, b) : _mm256_min_epu16(a, b); }
MP__HOT __m256i mp__x86_sign(__m256i a, int w) { return w == 32 ? _mm256_srai_epi32(a, 31) : _mm256_srai_epi16(a, 15); }
/* Two counts in each W-bit lane, the second shifted up by W/2: a compare's
   lanes are -1 where it holds, so subtracting adds 1, or 1 << W/2. */
MP__HOT __m256i mp__x86_count2(__m256i p, __m256i low, __m256i high, int w) {
    return w == 32 ? _mm256_sub_epi32(_mm256_sub_epi32(p, low), _mm256_slli_epi32(high, 16))
                   : _mm256_sub_epi16(_mm256_sub_epi16(p, low), _mm256_slli_epi16(high, 8));
}

/* What an AVX2 row or scan counts as it goes: the counts of the AVX-512
   rows (mp__z_tally), in vector lanes. AVX2 has 16 vector registers where
   AVX-512 has 32: with a count a register, gcc kept the extremes and a
   count on the stack, a chain through memory every pair, and the counted
   cast ran at a fraction of the plain one's speed (bench/convert). So each
   W-bit lane of p0, p1, p2 holds two counts of W/2 bits (mp__x86_count2),
   and a chunk of at most MP__X86_CHUNK pairs is added to the totals n[]
   in general registers (mp__x86_chunk_end) before any field can carry.
   W-bit magnitudes (W = 32: float32 bits; 16: float16 or bfloat16 bits) lie
   below 2^(W-1), so AVX2's signed compares order them: a >= t is
   a > t - 1 (t1, t2, t3 hold t - 1). n[0] ... n[5]: the lanes with a >= 1,
   t1 | t2, t3 | Inf, > Inf.

   A float32 source narrowed: the source's zero and nonfinite lanes are the
   sign bits of a - 1 and a + bias, counted by vmovmskps and POPCNT in
   general registers (zero_in, nonfinite_in), which leaves p0 to the
   compiler to drop and ran faster than packing them into p0
   (bench/convert); n[2] ... n[5] are zero and below-normal results, Inf or
   NaN results and NaN results. The extremes are hi = max(a + bias) and
   lo = min(a - 1), as the AVX-512 range counts keep them; top and low a
   chunk's bounds alone. As there, the fields are the row's locals once
   the functions that take the tally are inlined (MP__HOT). */
typedef struct mp__x86_tally {
    __m256i zero, minus_one, abs, bias, t1, t2, t3, inf; /* W-bit lanes' constants */
    __m256i abs16, normal16, inf16, below_inf16;         /* a float32 source's 16-bit results' */
    __m256i p0, p1, p2, hi, lo, top, low;
    uint32_t n[6];
    uint32_t zero_in, nonfinite_in, normal_lo, inf_lo;
    int under, sub, over;
} mp__x86_tally;
enum { MP__X86_CHUNK = 255 };

MP__HOT void mp__x86_tally_ranges(mp__x86_tally *c, int w, uint32_t t1, uint32_t t2, uint32_t t3, uint32_t inf) {
    uint32_t sign = 1u << (w - 1);
    c->under = t1 != 1u, c->sub = t2 != t1, c->over = t3 != inf;
    c->zero = _mm256_setzero_si256(), c->minus_one = _mm256_set1_epi32(-1);
    c->t1 = mp__x86_set(t1 - 1u, w), c->t2 = mp__x86_set(t2 - 1u, w), c->t3 = mp__x86_set(t3 - 1u, w);
    c->inf = mp__x86_set(inf, w), c->abs = mp__x86_set(sign - 1u, w), c->bias = mp__x86_set(sign - inf, w);
    c->hi = c->bias, c->lo = c->minus_one;
    c->n[0] = c->n[1] = c->n[2] = c->n[3] = c->n[4] = c->n[5] = 0;
    c->normal_lo = t2, c->inf_lo = t3;
}
MP__HOT void mp__x86_tally_begin(mp__x86_tally *c, mp_dtype from, mp_dtype to, mp__ranges r) {
    const uint16_t *u = mp__ranges16_of(from, to);
    if (from != MP_FLOAT32) {
        mp__x86_tally_ranges(c, 16, u[0], u[1], u[2], mp__inf16(from));
        return;
    }
    c->zero = _mm256_setzero_si256(), c->minus_one = _mm256_set1_epi32(-1);
    c->abs = _mm256_set1_epi32(0x7FFFFFFF), c->bias = _mm256_set1_epi32((int)(0x80000000u - MP__F32_INF));
    c->abs16 = _mm256_set1_epi16(0x7FFF), c->normal16 = mp__x86_set(mp__normal16(to), 16);
    c->inf16 = mp__x86_set(mp__inf16(to), 16), c->below_inf16 = mp__x86_set(mp__inf16(to) - 1u, 16);
    c->hi = c->bias, c->lo = c->minus_one;
    c->zero_in = c->nonfinite_in = 0;
    c->n[0] = c->n[1] = c->n[2] = c->n[3] = c->n[4] = c->n[5] = 0;
    c->normal_lo = r.normal_lo, c->inf_lo = r.inf_lo;
}

/* A chunk's packed counts: zeroed before it, added to n[] after it. */
MP__HOT void mp__x86_chunk_begin(mp__x86_tally *c) { c->p0 = c->p1 = c->p2 = _mm256_setzero_si256(); }
MP__HOT void mp__x86_fields(__m256i p, uint32_t *n, int w) {
    if (w == 16) {
        n[0] += mp__x86_hsum16(_mm256_and_si256(p, _mm256_set1_epi16(0xFF)));
        n[1] += mp__x86_hsum16(_mm256_srli_epi16(p, 8));
    } else {
        n[0] += mp__x86_hsum(_mm256_and_si256(p, _mm256_set1_epi32(0xFFFF)));
        n[1] += mp__x86_hsum(_mm256_srli_epi32(p, 16));
    }
}
MP__HOT void mp__x86_chunk_end(mp__x86_tally *c, int w) {
    mp__x86_fields(c->p0, c->n, w), mp__x86_fields(c->p1, c->n + 2, w), mp__x86_fields(c->p2, c->n + 4, w);
}

/* The range counts and extremes of W-bit lanes. */
MP__HOT void mp__x86_count_lanes(mp__x86_tally *c, __m256i bits, int w) {
    __m256i a = _mm256_and_si256(bits, c->abs), b;
    if (c->under || c->sub)
        c->p0 = mp__x86_count2(c->p0, c->under ? mp__x86_gt(a, c->zero, w) : c->zero, mp__x86_gt(a, c->t1, w), w);
    b = mp__x86_add(a, c->bias, w), c->hi = mp__x86_max(c->hi, b, w);
    if (c->sub || c->over)
        c->p1 = mp__x86_count2(c->p1, c->sub ? mp__x86_gt(a, c->t2, w) : c->zero,
                               c->over ? mp__x86_gt(a, c->t3, w) : c->zero, w);
    c->p2 = mp__x86_count2(c->p2, mp__x86_sign(b, w), mp__x86_gt(a, c->inf, w), w); /* a >= Inf: a + bias < 0 */
    c->lo = mp__x86_minu(c->lo, mp__x86_add(a, c->minus_one, w), w);
}
/* A float32 source vector into the extremes: returns a + bias, and a - 1 in *below. */
MP__HOT __m256i mp__x86_narrow_source(mp__x86_tally *c, __m256 x, __m256i *below) {
    __m256i a = _mm256_and_si256(_mm256_castps_si256(x), c->abs);
    __m256i b = _mm256_add_epi32(a, c->bias);
    c->hi = _mm256_max_epi32(c->hi, b);
    *below = _mm256_add_epi32(a, c->minus_one), c->lo = _mm256_min_epu32(c->lo, *below);
    return b;
}
MP__HOT void mp__x86_count_narrow(mp__x86_tally *c, __m256 x0, __m256 x1, __m256i h) {
    __m256i z0, z1, b0 = mp__x86_narrow_source(c, x0, &z0), b1 = mp__x86_narrow_source(c, x1, &z1), a;
    c->zero_in += mp__x86_signs(z0, z1), c->nonfinite_in += mp__x86_signs(b0, b1);
    a = _mm256_and_si256(h, c->abs16);
    c->p1 = mp__x86_count2(c->p1, _mm256_cmpeq_epi16(a, c->zero), _mm256_cmpgt_epi16(c->normal16, a), 16);
    c->p2 = mp__x86_count2(c->p2, _mm256_cmpgt_epi16(a, c->below_inf16), _mm256_cmpgt_epi16(a, c->inf16), 16);
}
MP__HOT void mp__x86_bounds(mp__x86_tally *c, __m256i bits, int w) {
    __m256i a = _mm256_and_si256(bits, c->abs);
    c->top = mp__x86_max(c->top, a, w), c->low = mp__x86_minu(c->low, mp__x86_add(a, c->minus_one, w), w);
}
/* Whether a chunk's bounds show nothing to count; then they join the
   row's extremes (the top is finite). W = 32 for a float32 source. */
MP__HOT int mp__x86_clean(const mp__x86_tally *c, int w) {
    if (w == 32) return mp__x86_hmax(c->top) < c->inf_lo && mp__x86_hmin(c->low) >= c->normal_lo - 1u;
    return mp__x86_hmax16(c->top) < c->inf_lo && mp__x86_hmin16(c->low) >= c->normal_lo - 1u;
}
MP__HOT void mp__x86_merge(mp__x86_tally *c, int w) {
    c->lo = mp__x86_minu(c->lo, c->low, w), c->hi = mp__x86_max(c->hi, mp__x86_add(c->top, c->bias, w), w);
}

/* Counts alone: for the numerics diagnostics (mp__scans); the last few
   elements by the scalar scan. Every range is counted (r is not a
   constant); one the target cannot reach counts 0. */
MP__HOT mp__scan mp__scan_avx2(const void *src, mp_dtype from, size_t n, mp__ranges r) {
    size_t i = 0;
    mp__scan s, tail;
    mp__x86_tally c;
    mp__x86_tally_ranges(&c, 32, r.sub_lo, r.normal_lo, r.inf_lo, MP__F32_INF);
    c.under = c.sub = c.over = 1;
    while (i + 8 <= n) {
        size_t end = n - i > 8 * MP__X86_CHUNK ? i + 8 * MP__X86_CHUNK : n;
        mp__x86_chunk_begin(&c);
        for (; i + 8 <= end; i += 8) mp__x86_count_lanes(&c, _mm256_castps_si256(mp__x86_load(src, from, i)), 32);
        mp__x86_chunk_end(&c, 32);
    }
    mp__range_counts(&s, c.under, c.sub, c.over, c.n[0], c.n[1], c.n[2], c.n[3], c.n[4], c.n[5]);
    mp__extremes32(&s, mp__x86_hmax(c.hi), mp__x86_hmin(c.lo));
    tail = mp__scan_by(from, (const char *)src + i * mp__elem_size(from), n - i, r);
    mp__scan_merge(&s, &tail);
    return s;
}
static mp__scan mp__scan_f32_avx2(const void *src, size_t n, mp__ranges r) { return mp__scan_avx2(src, MP_FLOAT32, n, r); }
static mp__scan mp__scan_f16_avx2(const void *src, size_t n, mp__ranges r) { return mp__scan_avx2(src, MP_FLOAT16, n, r); }
static mp__scan mp__scan_bf16_avx2(const void *src, size_t n, mp__ranges r) { return mp__scan_avx2(src, MP_BFLOAT16, n, r); }

/* A row's counts so far into *s, and at its end its counts and extremes. */
MP__HOT void mp__x86_counts(const mp__x86_tally *c, mp_dtype from, mp__scan *s) {
    if (from == MP_FLOAT32) mp__narrow_counts(s, c->zero_in, c->nonfinite_in, c->n[2], c->n[3], c->n[4], c->n[5]);
    else mp__range_counts(s, c->under, c->sub, c->over, c->n[0], c->n[1], c->n[2], c->n[3], c->n[4], c->n[5]);
}
MP__HOT void mp__x86_tally_end(const mp__x86_tally *c, mp_dtype from, mp__scan *s) {
    mp__x86_counts(c, from, s);
    if (from == MP_FLOAT32) mp__extremes32(s, mp__x86_hmax(c->hi), mp__x86_hmin(c->lo));
    else mp__extremes16(s, mp__x86_hmax16(c->hi), mp__x86_hmin16(c->lo), from);
}

/* The rows: whole pairs of vectors (16 elements), then the rest one at a
   time by the scalar row (which counts them too). With counts, a chunk at
   a time (MP__X86_CHUNK pairs, 16 to 64 KiB of source, in L1 or L2): a
   chunk after one with nothing to count is cast with its bounds alone
   (four operations a vector); if they show a value the counts would name,
   the chunk is counted again from cache, and the next ones as they are
   cast, until a chunk has nothing to count (mp__chunks). Most tensors have
   nothing to count and pay for the bounds; data full of underflows and
   overflows pays for the counts once. Every pair is loaded and counted
   before it is stored, so dst may be src (the same element size), where
   every chunk is counted as it is cast. The plain loop carries no test. A
   row of a long cast (far: MP__CAST_FAR) fetches its source ahead and,
   from the destination's first 32-byte boundary on, stores around the
   caches (vmovntdq), as the AVX-512 rows do, then sfence; the elements
   before that boundary go one at a time, as the tail does. From memory
   this ran well ahead of a plain F16C loop (bench/convert, 16M
   elements). */
enum { MP__X86_BLOCK = 1 << 18 }; /* a row: few calls, and 32-bit counts hold it */

/* The whole pairs from i to end; returns where they stop. A 16-bit source
   is counted on its 32 bytes at once and widened from two 16-byte loads. */
MP__HOT size_t mp__x86_pairs(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t i, size_t end, int pass,
                             int far, mp__x86_tally *c) {
    for (; i + 16 <= end; i += 16) {
        const void *ahead = (const char *)src + i * mp__elem_size(from);
        if (pass == MP__PASS_PLAIN) {
            __m256 x0 = mp__x86_load(src, from, i), x1 = mp__x86_load(src, from, i + 8);
            if (far) mp__cast_ahead(ahead);
            mp__x86_put2(dst, to, i, x0, x1, far);
        } else if (from == MP_FLOAT32) {
            __m256 x0 = mp__x86_load_f32(src, i), x1 = mp__x86_load_f32(src, i + 8);
            __m256i h = mp__x86_narrow2(x0, x1, to);
            if (far) mp__cast_ahead(ahead);
            if (pass == MP__PASS_BOUNDS)
                mp__x86_bounds(c, _mm256_castps_si256(x0), 32), mp__x86_bounds(c, _mm256_castps_si256(x1), 32);
            else
                mp__x86_count_narrow(c, x0, x1, h);
            if (pass != MP__PASS_RECOUNT) mp__x86_store((uint16_t *)dst + i, h, far);
        } else {
            __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)src + i));
            if (far) mp__cast_ahead(ahead);
            if (pass == MP__PASS_BOUNDS) mp__x86_bounds(c, h, 16);
            else mp__x86_count_lanes(c, h, 16);
            if (pass != MP__PASS_RECOUNT)
                mp__x86_put2(dst, to, i, mp__x86_load(src, from, i), mp__x86_load(src, from, i + 8), far);
        }
    }
    return i;
}
/* The whole pairs with counts, a chunk at a time (mp__chunks). */
MP__HOT size_t mp__x86_chunks(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t i, size_t n, int far,
                              mp__x86_tally *c, mp__scan *scan) {
    int w = from == MP_FLOAT32 ? 32 : 16; /* the source's lanes */
    mp__chunks k;
    mp__chunks_begin(&k, dst, src);
    while (mp__chunks_next(&k, i, n, 16, 16 * MP__X86_CHUNK)) {
        if (!k.count) {
            c->top = c->zero, c->low = c->minus_one;
            i = mp__x86_pairs(dst, to, src, from, i, k.end, MP__PASS_BOUNDS, far, c);
            if (mp__x86_clean(c, w)) {
                mp__x86_merge(c, w);
                continue; /* nothing to count: the next chunk likewise */
            }
            i = k.start; /* counted again, from cache */
        }
        mp__x86_chunk_begin(c);
        if (k.count) i = mp__x86_pairs(dst, to, src, from, i, k.end, MP__PASS_COUNT, far, c);
        else i = mp__x86_pairs(dst, to, src, from, i, k.end, MP__PASS_RECOUNT, far, c);
        mp__x86_chunk_end(c, 16); /* the counts are in 16-bit lanes either way */
        mp__x86_counts(c, from, scan);
        mp__chunks_counted(&k, scan);
    }
    return i;
}
MP__HOT size_t mp__x86_whole(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t i, size_t n, int pass,
                             int far, mp__x86_tally *c, mp__scan *scan) {
    if (pass == MP__PASS_PLAIN) return mp__x86_pairs(dst, to, src, from, i, n, MP__PASS_PLAIN, far, c);
    return mp__x86_chunks(dst, to, src, from, i, n, far, c, scan);
}
/* A row, plain (pass PLAIN) or counted (COUNT): its head and tail by the
   scalar row. */
MP__HOT void mp__x86_cast(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t n, mp__scan *scan,
                          mp__ranges r, int pass) {
    int far = n >= MP__X86_BLOCK;
    size_t i = far ? mp__head(dst, mp__elem_size(to), n, 32) : 0;
    mp__scan part;
    mp__x86_tally c;
    mp__rows_scalar[to][from](dst, src, i, scan ? &part : NULL, r); /* the head */
    if (pass == MP__PASS_COUNT) mp__x86_tally_begin(&c, from, to, r);
    if (far) i = mp__x86_whole(dst, to, src, from, i, n, pass, 1, &c, scan);
    else i = mp__x86_whole(dst, to, src, from, i, n, pass, 0, &c, scan);
    if (pass == MP__PASS_COUNT) {
        mp__x86_tally_end(&c, from, scan);
        mp__scan_merge(scan, &part);
    }
    if (far) _mm_sfence(); /* the streamed stores before any later one */
    mp__rows_scalar[to][from]((char *)dst + i * mp__elem_size(to), (const char *)src + i * mp__elem_size(from), n - i,
                              scan ? &part : NULL, r); /* the tail */
    if (scan) mp__scan_merge(scan, &part);
}
MP__HOT void mp__row_avx2(void *dst, mp_dtype to, const void *src, mp_dtype from, size_t n, mp__scan *scan,
                          mp__ranges r) {
    if (scan) mp__x86_cast(dst, to, src, from, n, scan, r, MP__PASS_COUNT);
    else mp__x86_cast(dst, to, src, from, n, scan, r, MP__PASS_PLAIN);
}
static void mp__row_f32_to_f16_avx2(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx2(dst, MP_FLOAT16, src, MP_FLOAT32, n, scan, r);
}
static void mp__row_f32_to_bf16_avx2(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx2(dst, MP_BFLOAT16, src, MP_FLOAT32, n, scan, r);
}
static void mp__row_f16_to_f32_avx2(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx2(dst, MP_FLOAT32, src, MP_FLOAT16, n, scan, r);
}
static void mp__row_f16_to_bf16_avx2(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx2(dst, MP_BFLOAT16, src, MP_FLOAT16, n, scan, r);
}
static void mp__row_bf16_to_f32_avx2(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx2(dst, MP_FLOAT32, src, MP_BFLOAT16, n, scan, r);
}
static void mp__row_bf16_to_f16_avx2(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r) {
    mp__row_avx2(dst, MP_FLOAT16, src, MP_BFLOAT16, n, scan, r);
}
#endif

/* >>bulk casts: dispatch (the table at the head of the section). [dst][src]. */
static const mp__row_fn mp__rows[MP_DTYPE_COUNT][MP_DTYPE_COUNT] = {
#if defined(MP__SIMD_AVX512)
    {mp__row_f32_to_f32_scalar, mp__row_f16_to_f32_avx512, mp__row_bf16_to_f32_avx512},
    {mp__row_f32_to_f16_avx512, mp__row_f16_to_f16_scalar, mp__row_bf16_to_f16_avx512},
    {mp__row_f32_to_bf16_avx512, mp__row_f16_to_bf16_avx512, mp__row_bf16_to_bf16_scalar}};
#elif defined(MP__SIMD_X86)
    {mp__row_f32_to_f32_scalar, mp__row_f16_to_f32_avx2, mp__row_bf16_to_f32_avx2},
    {mp__row_f32_to_f16_avx2, mp__row_f16_to_f16_scalar, mp__row_bf16_to_f16_avx2},
    {mp__row_f32_to_bf16_avx2, mp__row_f16_to_bf16_avx2, mp__row_bf16_to_bf16_scalar}};
#else
    {mp__row_f32_to_f32_scalar, mp__row_f16_to_f32_scalar, mp__row_bf16_to_f32_scalar},
    {mp__row_f32_to_f16_scalar, mp__row_f16_to_f16_scalar, mp__row_bf16_to_f16_scalar},
    {mp__row_f32_to_bf16_scalar, mp__row_f16_to_bf16_scalar, mp__row_bf16_to_bf16_scalar}};
#endif
/* How many elements mp_convert hands a row at a time. */
static size_t mp__rows_block(size_t n) {
#if defined(MP__SIMD_AVX512)
    return n >= MP__CAST_FAR ? MP__Z_BLOCK : MP__Z_BLOCK / 2;
#elif defined(MP__SIMD_X86)
    return n >= MP__CAST_FAR ? MP__X86_BLOCK : MP__X86_BLOCK / 2;
#else
    (void)n;
    return MP__BLOCK;
#endif
}

static void mp__stats_add(mp_cast_stats *st, const mp__scan *s, size_t n) {
    st->count += n;
    st->nan_in += s->nan;
    st->inf_in += s->inf;
    st->underflow += s->underflow;
    st->subnormal += s->subnormal;
    st->overflow += s->overflow;
    if (s->max_abs) { /* some finite nonzero input in this block */
        float hi = mp__f32_from_bits(s->max_abs), lo = mp__f32_from_bits(s->min_abs);
        if (hi > st->max_abs) st->max_abs = hi;
        if (st->min_abs == 0.0f || lo < st->min_abs) st->min_abs = lo;
    }
}

static int mp__overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + b_bytes && y < x + a_bytes;
}

static mp_status mp__convert_with(const mp__row_fn rows[MP_DTYPE_COUNT][MP_DTYPE_COUNT], size_t block,
                                  void *dst, mp_dtype dst_type, const void *src, mp_dtype src_type, size_t n,
                                  mp_cast_stats *stats) {
    size_t dsz, ssz, i;
    if (!dst || !src) return MP_ERR_NULL;
    if (!mp__dtype_valid(dst_type) || !mp__dtype_valid(src_type)) return MP_ERR_DTYPE;
    dsz = mp__dtypes[dst_type].size;
    ssz = mp__dtypes[src_type].size;
    if (n > SIZE_MAX / 4) return MP_ERR_SIZE;
    if ((uintptr_t)dst & (dsz - 1) || (uintptr_t)src & (ssz - 1)) return MP_ERR_ALIGN; /* sizes 2 and 4: no division */
    if (!(dst == src && dsz == ssz) && mp__overlap(dst, n * dsz, src, n * ssz)) return MP_ERR_OVERLAP;
    for (i = 0; i < n; i += block) {
        size_t len = n - i < block ? n - i : block;
        mp__scan scan;
        rows[dst_type][src_type]((char *)dst + i * dsz, (const char *)src + i * ssz, len,
                                 stats ? &scan : NULL, mp__ranges_of[dst_type]);
        if (stats) mp__stats_add(stats, &scan, len);
    }
    return MP_OK;
}

MIXPREC_API mp_status mp_convert(void *dst, mp_dtype dst_type, const void *src, mp_dtype src_type,
                                 size_t n, mp_cast_stats *stats) {
    return mp__convert_with(mp__rows, mp__rows_block(n), dst, dst_type, src, src_type, n, stats);
}

MIXPREC_API mp_status mp_convert_portable(void *dst, mp_dtype dst_type, const void *src,
                                          mp_dtype src_type, size_t n, mp_cast_stats *stats) {
    return mp__convert_with(mp__rows_scalar, MP__BLOCK, dst, dst_type, src, src_type, n, stats);
}

/* >>policies */
static const struct { const char *name; mp_policy policy; } mp__policies[] = {
    {"float32", {MP_FLOAT32, MP_FLOAT32}},
    {"float16", {MP_FLOAT16, MP_FLOAT16}},
    {"bfloat16", {MP_BFLOAT16, MP_BFLOAT16}},
    {"mixed_float16", {MP_FLOAT16, MP_FLOAT32}},
    {"mixed_bfloat16", {MP_BFLOAT16, MP_FLOAT32}},
};
enum { MP__NPOLICIES = sizeof mp__policies / sizeof mp__policies[0] };

/* The global policy as its row of mp__policies, so that a thread that sets
   it while another adds a layer hands over a whole policy (GLOBAL STATE). */
static size_t mp__global_policy = 0; /* "float32", Keras's default */

/* p's row of mp__policies, or MP__NPOLICIES for a pair of dtypes no policy has. */
static size_t mp__policy_row(mp_policy p) {
    size_t i;
    for (i = 0; i < MP__NPOLICIES; i++)
        if (p.compute_dtype == mp__policies[i].policy.compute_dtype &&
            p.variable_dtype == mp__policies[i].policy.variable_dtype)
            break;
    return i;
}

MIXPREC_API mp_status mp_policy_from_name(const char *name, mp_policy *out) {
    size_t i;
    if (!name || !out) return MP_ERR_NULL;
    for (i = 0; i < MP__NPOLICIES; i++)
        if (strcmp(name, mp__policies[i].name) == 0) { *out = mp__policies[i].policy; return MP_OK; }
    return MP_ERR_UNKNOWN_POLICY;
}

MIXPREC_API const char *mp_policy_name(mp_policy p) {
    size_t row = mp__policy_row(p);
    return row < MP__NPOLICIES ? mp__policies[row].name : NULL;
}

MIXPREC_API mp_dtype mp_policy_compute_dtype(mp_policy p) { return p.compute_dtype; }
MIXPREC_API mp_dtype mp_policy_variable_dtype(mp_policy p) { return p.variable_dtype; }

MIXPREC_API mp_status mp_policy_repr(mp_policy p, char *buf, size_t size) {
    static const char head[] = "<Policy \"", tail[] = "\">";
    const char *name = mp_policy_name(p);
    size_t hn = sizeof head - 1, nn, tn = sizeof tail - 1;
    if (!buf) return MP_ERR_NULL;
    if (!name) return MP_ERR_INVALID_POLICY;
    nn = strlen(name);
    if (size < hn + nn + tn + 1) return MP_ERR_SIZE;
    memcpy(buf, head, hn);
    memcpy(buf + hn, name, nn);
    memcpy(buf + hn + nn, tail, tn + 1);
    return MP_OK;
}

MIXPREC_API mp_status mp_set_global_policy(mp_policy p) {
    size_t row = mp__policy_row(p);
    if (row == MP__NPOLICIES) return MP_ERR_INVALID_POLICY;
    mp__relaxed_set(&mp__global_policy, row);
    return MP_OK;
}

MIXPREC_API mp_status mp_set_global_policy_name(const char *name) {
    mp_policy p;
    mp_status st = mp_policy_from_name(name, &p);
    return st ? st : mp_set_global_policy(p);
}

MIXPREC_API mp_policy mp_global_policy(void) { return mp__policies[mp__relaxed_get(&mp__global_policy)].policy; }

/* >>memory
   Blocks are aligned to 64 bytes (a cache line, an AVX-512 vector) and
   carry their size in front, so the counters know what each free returns. */
enum {
    MP__ALIGN = 64,
    MP__HEADER = 2 * sizeof(size_t) /* size, then offset back to the raw block */
};

static mp_memory_info mp__memory;

/* peak = max(peak, bytes), whatever another thread raises it to meanwhile
   (a failed swap reloads old). */
static void mp__raise_peak(size_t bytes) {
    size_t old = mp__relaxed_get(&mp__memory.peak);
    while (bytes > old && !mp__relaxed_swap(&mp__memory.peak, &old, bytes)) continue;
}

static int mp__mul_ok(size_t a, size_t b, size_t *out) {
    if (b != 0 && a > SIZE_MAX / b) return 0;
    *out = a * b;
    return 1;
}

#if defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* A Linux system call by the syscall instruction (x86-64: its number in
   rax, arguments in rdi, rsi and rdx, the result back in rax; rcx and r11
   clobbered), which needs no libc feature macro: madvise for huge pages,
   arch_prctl for AMX. */
static inline long mp__syscall3(long number, long a, long b, long c) {
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "0"(number), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return ret;
}
#endif

#ifdef MP__HUGE_PAGES
/* A block of MP__HUGE bytes or more from malloc asks Linux to back its
   whole pages with transparent huge pages (madvise MADV_HUGEPAGE: Debian
   enables them for the regions that ask), before the memset below first
   touches them. Activations and gradients at batch 8192 are 16 MiB each,
   and a product walks them down rows 2-4 KiB apart: with 4 KiB pages each
   row is a new TLB entry. Most of the guide's MLP steps at batch 8192,
   and float32's at 4096 units and batch 128 (whose weights stream), gain
   a few percent by it; the rest are the same either way (bench/train.c,
   built with and without MIXPREC_NO_HUGE_PAGES). Advice only: where the
   kernel has no huge pages the call fails and changes nothing, so its
   result is not looked at. By the raw system call: madvise needs a libc
   feature macro. */
enum { MP__HUGE = 4 << 20 };
static void mp__advise_huge(void *block, size_t bytes) {
    uintptr_t first = ((uintptr_t)block + 4095u) & ~(uintptr_t)4095u;
    uintptr_t end = ((uintptr_t)block + bytes) & ~(uintptr_t)4095u;
    (void)mp__syscall3(28 /* SYS_madvise */, (long)first, (long)(end - first), 14 /* MADV_HUGEPAGE */);
}
#endif

static void *mp__alloc(size_t bytes) {
    size_t pad = MP__ALIGN + MP__HEADER, skew;
    unsigned char *raw, *p;
    if (bytes > SIZE_MAX - pad) return NULL;
    raw = (unsigned char *)MIXPREC_MALLOC(bytes + pad);
    if (!raw) return NULL;
#ifdef MP__HUGE_PAGES
    if (bytes >= MP__HUGE) mp__advise_huge(raw, bytes + pad);
#endif
    p = raw + MP__HEADER;
    skew = (size_t)((uintptr_t)p % MP__ALIGN);
    if (skew) p += MP__ALIGN - skew;
    memset(p, 0, bytes);
    memcpy(p - MP__HEADER, &bytes, sizeof bytes);
    skew = (size_t)(p - raw);
    memcpy(p - sizeof(size_t), &skew, sizeof skew);
    mp__raise_peak(mp__relaxed_add(&mp__memory.current, bytes));
    return p;
}

static void mp__free(void *ptr) {
    unsigned char *p = (unsigned char *)ptr;
    size_t bytes, offset, before;
    if (!p) return;
    memcpy(&bytes, p - MP__HEADER, sizeof bytes);
    memcpy(&offset, p - sizeof(size_t), sizeof offset);
    before = mp__relaxed_take(&mp__memory.current, bytes);
    MIXPREC_ASSERT(before >= bytes);
    (void)before; /* NDEBUG */
    MIXPREC_FREE(p - offset);
}

MIXPREC_API mp_memory_info mp_get_memory_info(void) {
    mp_memory_info info;
    info.current = mp__relaxed_get(&mp__memory.current);
    info.peak = mp__relaxed_get(&mp__memory.peak);
    return info;
}

static size_t mp__block_bytes(const void *p) {
    size_t bytes = 0;
    if (p) memcpy(&bytes, (const unsigned char *)p - MP__HEADER, sizeof bytes);
    return bytes;
}
MIXPREC_API void mp_reset_peak_memory(void) { mp__relaxed_set(&mp__memory.peak, mp__relaxed_get(&mp__memory.current)); }

/* A carving plan, as llm.c carves one allocation into tensors: the same
   function runs twice, first with base NULL to add up the sizes (overflow
   checked), then to hand out the pointers. */
typedef struct mp__arena {
    unsigned char *base;
    size_t used;
    int overflow;
} mp__arena;

enum { MP__CARVE_ALIGN = 256 }; /* what cuBLASLt assumes of a device tensor */
static void *mp__carve(mp__arena *a, size_t count, size_t elem) {
    size_t bytes, start = (a->used + MP__CARVE_ALIGN - 1) / MP__CARVE_ALIGN * MP__CARVE_ALIGN;
    if (!mp__mul_ok(count, elem, &bytes) || start < a->used || bytes > SIZE_MAX - start) {
        a->overflow = 1;
        return NULL;
    }
    a->used = start + bytes;
    return a->base && count ? a->base + start : NULL;
}

/* >>tensors */
MIXPREC_API size_t mp_tensor_count(const mp_tensor *t) {
    size_t n = 1;
    int i;
    if (!t || t->rank < 1 || t->rank > MP_MAX_RANK) return 0;
    for (i = 0; i < t->rank; i++)
        if (t->shape[i] < 0 || !mp__mul_ok(n, (size_t)t->shape[i], &n)) return 0;
    return n;
}

MIXPREC_API size_t mp_tensor_bytes(const mp_tensor *t) {
    size_t bytes;
    if (!t || !mp__dtype_valid(t->dtype) || !mp__mul_ok(mp_tensor_count(t), mp_dtype_size(t->dtype), &bytes)) return 0;
    return bytes;
}

MIXPREC_API mp_status mp_tensor_alloc(mp_tensor *t, mp_dtype dtype, int rank, const int *shape) {
    mp_tensor r;
    size_t n = 1, bytes;
    int i;
    if (!t || !shape) return MP_ERR_NULL;
    if (!mp__dtype_valid(dtype)) return MP_ERR_DTYPE;
    if (rank < 1 || rank > MP_MAX_RANK) return MP_ERR_ARG;
    memset(&r, 0, sizeof r);
    r.dtype = dtype;
    r.rank = rank;
    for (i = 0; i < rank; i++) {
        if (shape[i] <= 0) return MP_ERR_ARG;
        r.shape[i] = shape[i];
        if (!mp__mul_ok(n, (size_t)shape[i], &n)) return MP_ERR_SIZE;
    }
    if (!mp__mul_ok(n, mp_dtype_size(dtype), &bytes)) return MP_ERR_SIZE;
    r.data = mp__alloc(bytes);
    if (!r.data) return MP_ERR_ALLOC;
    *t = r;
    return MP_OK;
}

MIXPREC_API void mp_tensor_free(mp_tensor *t) {
    if (!t) return;
    mp__free(t->data);
    t->data = NULL;
}

/* >>text: a tiny formatter for summaries, logs and error messages. It needs
   no stdio and no float64 (printf would promote floats to double). */
typedef struct mp__text {
    char *buf;
    size_t cap, len; /* len may pass cap: the text was cut */
} mp__text;

static void mp__put(mp__text *t, const char *s) {
    for (; *s; s++, t->len++)
        if (t->len + 1 < t->cap) t->buf[t->len] = *s;
    if (t->cap) t->buf[t->len < t->cap ? t->len : t->cap - 1] = '\0';
}

static void mp__put_uint(mp__text *t, uint64_t v, int commas) {
    char d[32];
    int n = 0, i;
    do {
        if (commas && n % 4 == 3) d[n++] = ',';
        d[n++] = (char)('0' + (int)(v % 10u));
        v /= 10u;
    } while (v);
    for (i = n - 1; i >= 0; i--) {
        char s[2] = {d[i], 0};
        mp__put(t, s);
    }
}

static void mp__put_int(mp__text *t, long long v) {
    if (v < 0) mp__put(t, "-");
    mp__put_uint(t, v < 0 ? (uint64_t)(-(v + 1)) + 1u : (uint64_t)v, 0);
}

static void mp__pad_to(mp__text *t, size_t column) {
    while (t->len < column) mp__put(t, " ");
}

/* printf-like with %s, %d (int) and %z (size_t) only. */
static void mp__putv(mp__text *t, const char *fmt, va_list ap) {
    char s[2] = {0, 0};
    for (; *fmt; fmt++) {
        if (*fmt != '%' || !fmt[1]) { s[0] = *fmt; mp__put(t, s); continue; }
        fmt++;
        if (*fmt == 's') mp__put(t, va_arg(ap, const char *));
        else if (*fmt == 'd') mp__put_int(t, va_arg(ap, int));
        else if (*fmt == 'z') mp__put_uint(t, va_arg(ap, size_t), 0);
        else { s[0] = *fmt; mp__put(t, s); }
    }
}

/* "(None, 28, 28, 1)": a batch's shape, as Keras prints it. */
static void mp__put_shape(mp__text *t, int rank, const int *shape) {
    int i;
    mp__put(t, "(None");
    for (i = 0; i < rank; i++) { mp__put(t, ", "); mp__put_int(t, shape[i]); }
    mp__put(t, ")");
}

/* "(6,)", "(28, 28, 1)": a Python tuple, as Keras's input_shape. */
static void mp__put_tuple(mp__text *t, int rank, const int *shape) {
    int i;
    mp__put(t, "(");
    for (i = 0; i < rank; i++) {
        if (i) mp__put(t, ", ");
        mp__put_int(t, shape[i]);
    }
    mp__put(t, rank == 1 ? ",)" : ")");
}

/* A shape into buf, tuple or batch-shaped: for the messages. */
static const char *mp__shape_text(char *buf, size_t cap, int rank, const int *shape, int tuple) {
    mp__text t;
    t.buf = buf;
    t.cap = cap;
    t.len = 0;
    if (tuple) mp__put_tuple(&t, rank, shape);
    else mp__put_shape(&t, rank, shape);
    return buf;
}

/* >>cpu backend
   The CPU backend (the operations table is declared under >>backends):
   every kernel a layer, loss or optimizer runs is one of its ops. Kernels work
   on any mix of float dtypes by widening tiles to float32 (exactly), doing
   the math in float32 and rounding once on the way out. */
enum { MP__TILE = 256 }; /* floats per tile: a few KiB of stack */
/* Floats a pass over a long array (the unscale, the optimizer, the bias
   gradient's columns) takes at a time: its costs per call (a widening
   row, a copy) paid 4 times less often than per tile: unscaling float16
   values in runs widened in place takes about half the time of tiles
   through a copy (bench/train.c's step). */
enum { MP__RUN = 4 * MP__TILE, MP__MAX_THREADS = 256 };

static const void *mp__at(const void *p, mp_dtype t, size_t i) {
    return (const char *)p + i * mp__dtypes[t].size;
}
static void *mp__at_mut(void *p, mp_dtype t, size_t i) { return (char *)p + i * mp__dtypes[t].size; }
/* Widen n elements to float32 (exact) / narrow from float32 (rounding
   once): mp_convert's row functions without its argument checks, for the
   short runs kernels convert (a GEMM panel row is 32 values). With
   AVX-512 a run of up to MP__SHORT_RUN widens in line, without the row's
   call and its head to a 64-byte boundary (mp__z_widen_run). */
enum { MP__SHORT_RUN = 256 };
static void mp__load(float *dst, const void *src, mp_dtype t, size_t n) {
    if (t == MP_FLOAT32) memcpy(dst, src, n * sizeof(float));
#ifdef MP__SIMD_AVX512
    else if (n <= MP__SHORT_RUN) mp__z_widen_run(dst, src, t, n);
#endif
    else mp__rows[MP_FLOAT32][t](dst, src, n, NULL, mp__ranges_of[MP_FLOAT32]);
}
static void mp__store(void *dst, mp_dtype t, const float *src, size_t n) {
    if (t == MP_FLOAT32) memmove(dst, src, n * sizeof(float));
    else mp__rows[t][MP_FLOAT32](dst, src, n, NULL, mp__ranges_of[t]);
}
/* n values at src as float32 to read: src itself where it is float32 (a
   copy would cost as much as a pass's math), else widened into tile. */
static const float *mp__read_f32(float *tile, const void *src, mp_dtype t, size_t n) {
    if (t == MP_FLOAT32) return (const float *)src;
    mp__load(tile, src, t, n);
    return tile;
}
static size_t mp__min(size_t a, size_t b) { return a < b ? a : b; }
static size_t mp__max(size_t a, size_t b) { return a > b ? a : b; }

/* A walk that reads a run from each of many rows, a row's stride apart,
   crosses a 4 KiB page every row or two, where the hardware prefetchers
   stop. Where the rows it reads span MP__FAR bytes or more (more than L2
   holds: they come from memory) it fetches the rows ahead itself; nearer,
   the rows are in cache and the prefetches only cost (a bfloat16 weight
   gradient at batch 128, bench/gemm.c). */
enum { MP__FAR = 512 << 10 };

/* The cache lines of [p, p + bytes), bytes > 0, into L1. */
static void mp__prefetch_bytes(const void *p, size_t bytes) {
    const char *at = (const char *)p;
    size_t o;
    for (o = 0; o < bytes; o += 64) mp__prefetch(at + o);
    mp__prefetch(at + bytes - 1); /* the last line, where p does not start one */
}

/* How far ahead such a walk fetches, in rows: 4 or 8 rows ahead take
   the bias gradient's column sums over 8192 x 1024 from memory to about
   half their time without; a float32 weight gradient's op(A) pack (784 x
   1024 x 8192, A transposed) gains more with 8 than with 4 (bench/train.c's
   batch-8192 step, bench/gemm.c). */
enum { MP__ROWS_AHEAD = 8 };

/* >>cpu backend: activations (float32 math; Keras's definitions are in >>rules) */
/* t[i] = mp__tanh_gelu(u[i]) for i < n, a vector of lanes at a time: the
   scalar's operations in its order, lane by lane (the tail by the scalar),
   so every row gives its bits. bench/attention.c times GELU through them. */
static void mp__tanh_gelu_run_scalar(float *t, const float *u, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) t[i] = mp__tanh_gelu(u[i]);
}

static void mp__softmax_exp_run_scalar(float *e, const float *x, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) e[i] = mp__softmax_exp(x[i]);
}

#if defined(MP__SIMD_X86)
/* mp__exp_taylor's Horner coefficients, highest degree first. */
static const float mp__exp_taylor_poly[8] = {1.98412698e-4f, 1.38888889e-3f, 8.33333333e-3f, 4.16666667e-2f,
                                             1.66666667e-1f, 0.5f,           1.0f,           1.0f};
#endif
#ifdef MP__SIMD_AVX512
/* g++ takes the `_mm512_undefined_*` inside these intrinsics for uses of
   uninitialised values (a false positive, in C++ only), as in the casts. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
/* mp__exp_taylor in 16 lanes, its operations in its order. */
static __m512 mp__exp_taylor_avx512(__m512 x) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    __m512 k = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), magic), magic), r, p;
    int j;
    r = _mm512_sub_ps(x, _mm512_mul_ps(k, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(k, _mm512_set1_ps(-2.12194440e-4f)));
    p = _mm512_set1_ps(mp__exp_taylor_poly[0]);
    for (j = 1; j < 8; j++) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(mp__exp_taylor_poly[j]));
    return _mm512_mul_ps(
        p, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(k), _mm512_set1_epi32(127)), 23)));
}
static void mp__tanh_gelu_run_avx512(float *t, const float *u, size_t n) {
    const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(u + i), x, m;
        __mmask16 neg = _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ);
        x = _mm512_mul_ps(_mm512_mask_sub_ps(v, neg, zero, v), _mm512_set1_ps(2.0f));
        x = _mm512_min_ps(x, _mm512_set1_ps(20.0f)); /* x < 20 ? x : 20, NaN -> 20 */
        m = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(mp__exp_taylor_avx512(x), one)));
        _mm512_storeu_ps(t + i, _mm512_mask_sub_ps(m, neg, zero, m));
    }
    mp__tanh_gelu_run_scalar(t + i, u + i, n - i);
}
static void mp__softmax_exp_run_avx512(float *e, const float *x, size_t n) {
    const __m512 low = _mm512_set1_ps(-87.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i), r;
        __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), tiny = _mm512_cmp_ps_mask(v, low, _CMP_LT_OQ);
        r = mp__exp_taylor_avx512(_mm512_max_ps(v, low)); /* the lanes that take 0 or NaN below computed at -87 */
        r = _mm512_mask_mov_ps(_mm512_mask_mov_ps(r, tiny, _mm512_setzero_ps()), nan, v);
        _mm512_storeu_ps(e + i, r);
    }
    mp__softmax_exp_run_scalar(e + i, x + i, n - i);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#elif defined(MP__SIMD_X86)
static __m256 mp__exp_taylor_avx2(__m256 x) {
    const __m256 magic = _mm256_set1_ps(12582912.0f);
    __m256 k = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), magic), magic), r, p;
    int j;
    r = _mm256_sub_ps(x, _mm256_mul_ps(k, _mm256_set1_ps(0.693359375f)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(k, _mm256_set1_ps(-2.12194440e-4f)));
    p = _mm256_set1_ps(mp__exp_taylor_poly[0]);
    for (j = 1; j < 8; j++) p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(mp__exp_taylor_poly[j]));
    return _mm256_mul_ps(
        p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(k), _mm256_set1_epi32(127)), 23)));
}
static void mp__tanh_gelu_run_avx2(float *t, const float *u, size_t n) {
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(u + i), neg = _mm256_cmp_ps(v, zero, _CMP_LT_OQ), x, m;
        x = _mm256_mul_ps(_mm256_blendv_ps(v, _mm256_sub_ps(zero, v), neg), _mm256_set1_ps(2.0f));
        x = _mm256_min_ps(x, _mm256_set1_ps(20.0f)); /* x < 20 ? x : 20, NaN -> 20 */
        m = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(mp__exp_taylor_avx2(x), one)));
        _mm256_storeu_ps(t + i, _mm256_blendv_ps(m, _mm256_sub_ps(zero, m), neg));
    }
    mp__tanh_gelu_run_scalar(t + i, u + i, n - i);
}
static void mp__softmax_exp_run_avx2(float *e, const float *x, size_t n) {
    const __m256 low = _mm256_set1_ps(-87.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), r;
        __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q), tiny = _mm256_cmp_ps(v, low, _CMP_LT_OQ);
        r = mp__exp_taylor_avx2(_mm256_max_ps(v, low)); /* the lanes that take 0 or NaN below computed at -87 */
        r = _mm256_blendv_ps(_mm256_blendv_ps(r, _mm256_setzero_ps(), tiny), v, nan);
        _mm256_storeu_ps(e + i, r);
    }
    mp__softmax_exp_run_scalar(e + i, x + i, n - i);
}
#endif

/* Which rows run (as >>bulk casts: dispatch): the widest the build has. */
#if defined(MP__SIMD_AVX512)
static void (*const mp__tanh_gelu_run)(float *, const float *, size_t) = mp__tanh_gelu_run_avx512;
static void (*const mp__softmax_exp_run)(float *, const float *, size_t) = mp__softmax_exp_run_avx512;
#elif defined(MP__SIMD_X86)
static void (*const mp__tanh_gelu_run)(float *, const float *, size_t) = mp__tanh_gelu_run_avx2;
static void (*const mp__softmax_exp_run)(float *, const float *, size_t) = mp__softmax_exp_run_avx2;
#else
static void (*const mp__tanh_gelu_run)(float *, const float *, size_t) = mp__tanh_gelu_run_scalar;
static void (*const mp__softmax_exp_run)(float *, const float *, size_t) = mp__softmax_exp_run_scalar;
#endif

/* GELU's tanh form over a run of x, forward (out = gelu(x); out may be
   x) or backward (out *= gelu'(x)): >>rules' arithmetic with the tanh in
   vector rows, MP__VEC_RUN values at a time. Each block is copied in
   (a last part block padded with zeros) and out again, so every loop has
   a constant trip count and no overlap check: compilers vectorise them. */
enum { MP__VEC_RUN = 64 };
static void mp__gelu_tanh_run(float *out, const float *x, int backward, size_t n) {
    float xs[MP__VEC_RUN], u[MP__VEC_RUN], t[MP__VEC_RUN], o[MP__VEC_RUN];
    size_t i, k, len;
    for (i = 0; i < n; i += len) {
        len = mp__min(MP__VEC_RUN, n - i);
        memcpy(xs, x + i, len * sizeof(float));
        if (len < MP__VEC_RUN) memset(xs + len, 0, (MP__VEC_RUN - len) * sizeof(float));
        for (k = 0; k < MP__VEC_RUN; k++) u[k] = mp__gelu_tanh_arg(xs[k]);
        mp__tanh_gelu_run(t, u, MP__VEC_RUN);
        if (backward) {
            memcpy(o, out + i, len * sizeof(float));
            for (k = 0; k < MP__VEC_RUN; k++) o[k] *= mp__gelu_tanh_grad(xs[k], t[k]);
        } else {
            for (k = 0; k < MP__VEC_RUN; k++) o[k] = mp__gelu_tanh_of(xs[k], t[k]);
        }
        memcpy(out + i, o, len * sizeof(float));
    }
}

/* v = act(v), and g *= act'(y, x), over runs (y NULL for the gelus, which
   read x alone; x NULL for the rest). ReLU, the common case, goes
   in blocks of 16 with a constant trip count, which compilers vectorise;
   GELU's tanh form in vector rows (mp__gelu_tanh_run); the rest are
   dominated by exp, erf and tanh. */
static void mp__act_run(mp_activation a, float *v, size_t n) {
    size_t j = 0, k;
    if (a == MP_LINEAR) return;
    if (a == MP_GELU_APPROXIMATE) { mp__gelu_tanh_run(v, v, 0, n); return; }
    if (a == MP_RELU)
        for (; j + 16 <= n; j += 16)
            for (k = 0; k < 16; k++) v[j + k] = v[j + k] < 0.0f ? 0.0f : v[j + k];
    for (; j < n; j++) v[j] = mp__act(a, v[j]);
}

/* acc += x over a run, in blocks of 16 that compilers vectorise (the
   bias in the GEMM's epilogue and the bias kernels, the bias gradient):
   each block of x is copied first, so no check that acc and x overlap
   stops the vectoriser. */
static void mp__add_run(float *acc, const float *x, size_t n) {
    size_t j = 0, k;
    for (; j + 16 <= n; j += 16) {
        float b[16];
        memcpy(b, x + j, sizeof b);
        for (k = 0; k < 16; k++) acc[j + k] += b[k];
    }
    for (; j < n; j++) acc[j] += x[j];
}

static void mp__act_grad_run(mp_activation a, float *g, const float *y, const float *x, size_t n) {
    size_t j = 0, k;
    if (a == MP_LINEAR) return;
    if (a == MP_RELU) { /* a select, not a product: an Inf gradient stays Inf, a zero keeps its sign */
        for (; j + 16 <= n; j += 16) /* vectorised, as in mp__act_run: branches on signs mispredict */
            for (k = 0; k < 16; k++) g[j + k] = y[j + k] > 0.0f ? g[j + k] : 0.0f;
        for (; j < n; j++) g[j] = y[j] > 0.0f ? g[j] : 0.0f;
    } else if (a == MP_GELU_APPROXIMATE && x)
        mp__gelu_tanh_run(g, x, 1, n);
    else
        for (; j < n; j++) g[j] *= mp__act_grad(a, y ? y[j] : 0.0f, x ? x[j] : 0.0f);
}

/* ReLU's gradient on acc[0 .. n), the gradient at y[at ..] (in t) of a
   ReLU whose output is y (mp_gemm_args's relu_y): mp__act_grad_run's. */
static void mp__relu_grad_run(float *acc, const void *y, mp_dtype t, size_t at, size_t n) {
    float o[MP__TILE];
    size_t i, len;
    for (i = 0; i < n; i += len) {
        len = mp__min(MP__TILE, n - i);
        mp__load(o, mp__at(y, t, at + i), t, len);
        mp__act_grad_run(MP_RELU, acc + i, o, NULL, len);
    }
}

/* t = x[i .. i+len) (+ bias[i ..]) as float32; b is a tile of scratch. */
static void mp__load_biased(float *t, float *b, const void *x, const void *bias, size_t i, size_t len, mp_dtype dt) {
    mp__load(t, mp__at(x, dt, i), dt, len);
    if (!bias) return;
    mp__load(b, mp__at(bias, dt, i), dt, len);
    mp__add_run(t, b, len);
}

/* Softmax over one row of n, in float32 tiles: max, sum of exp, then write. */
static void mp__softmax_row(void *y, const void *x, const void *bias, size_t n, mp_dtype dt) {
    float t[MP__TILE], b[MP__TILE], mx = -INFINITY, sum = 0.0f;
    size_t i, j, len;
    int pass;
    for (pass = 0; pass < 3; pass++) {
        for (i = 0; i < n; i += len) {
            len = mp__min(MP__TILE, n - i);
            mp__load_biased(t, b, x, bias, i, len, dt);
            if (pass == 0) {
                for (j = 0; j < len; j++) mx = t[j] > mx ? t[j] : mx;
            } else if (pass == 1) {
                for (j = 0; j < len; j++) sum += expf(t[j] - mx);
            } else {
                for (j = 0; j < len; j++) t[j] = expf(t[j] - mx) / sum;
                mp__store(mp__at_mut(y, dt, i), dt, t, len);
            }
        }
    }
}

/* The row kernels' operands: each call does rows (or, for the bias
   gradient, columns) [r0, r1), a range of the pool's split (>>elementwise);
   a row's or a column's result never depends on the split. */
typedef struct mp__rows_op {
    void *out;                /* y, dx or db */
    mp_dtype outt, dt;        /* out's dtype (dx may differ), the operands' */
    const void *a, *b, *c;    /* x and bias; dy, y and x; dy */
    size_t rows, cols;
    mp_activation act;
} mp__rows_op;

/* The runs a row kernel goes over for rows [r0, r1) of cols: each row
   (per = cols), or, where every element's result is its own (no bias, no
   softmax), the rows as one run (per = their elements): a tile then
   holds many narrow rows (a narrow convolution's channels), where a
   conversion call per row cost more than the row's math. */
static void mp__row_runs(size_t r0, size_t r1, size_t cols, int elementwise, size_t *per, size_t *runs) {
    *per = elementwise ? (r1 - r0) * cols : cols;
    *runs = elementwise ? 1 : r1 - r0;
}

static void mp__bias_act_rows(void *args, size_t r0, size_t r1, int thread) {
    const mp__rows_op *op = (const mp__rows_op *)args;
    const void *x = op->a, *bias = op->b;
    void *y = op->out;
    size_t cols = op->cols;
    mp_activation act = op->act;
    mp_dtype dt = op->dt;
    float t[MP__TILE], b[MP__TILE];
    size_t r, i, len, per, runs;
    (void)thread;
    mp__row_runs(r0, r1, cols, !bias && act != MP_SOFTMAX, &per, &runs);
    for (r = 0; r < runs; r++) {
        const void *xr = mp__at(x, dt, r0 * cols + r * per);
        void *yr = mp__at_mut(y, dt, r0 * cols + r * per);
        if (act == MP_SOFTMAX) { mp__softmax_row(yr, xr, bias, cols, dt); continue; }
        for (i = 0; i < per; i += len) {
            len = mp__min(MP__TILE, per - i);
            mp__load_biased(t, b, xr, bias, i, len, dt);
            mp__act_run(act, t, len);
            mp__store(mp__at_mut(yr, dt, i), dt, t, len);
        }
    }
}

static void mp__act_backward_rows(void *args, size_t r0, size_t r1, int thread) {
    const mp__rows_op *op = (const mp__rows_op *)args;
    const void *dy = op->a, *y = op->b, *x = op->c;
    void *dx = op->out;
    size_t cols = op->cols;
    mp_activation act = op->act;
    mp_dtype dxt = op->outt, dt = op->dt;
    float g[MP__TILE], o[MP__TILE], in[MP__TILE];
    size_t r, i, j, len, per, runs;
    int reads_x = mp__act_reads_input(act); /* the gelus: their gradient reads x alone, not y */
    (void)thread;
    mp__row_runs(r0, r1, cols, act != MP_SOFTMAX, &per, &runs);
    for (r = 0; r < runs; r++) {
        size_t base = r0 * cols + r * per;
        float dot = 0.0f; /* softmax: sum(dy * y) over the row */
        if (act == MP_SOFTMAX)
            for (i = 0; i < per; i += len) {
                len = mp__min(MP__TILE, per - i);
                mp__load(g, mp__at(dy, dt, base + i), dt, len);
                mp__load(o, mp__at(y, dt, base + i), dt, len);
                for (j = 0; j < len; j++) dot += g[j] * o[j];
            }
        for (i = 0; i < per; i += len) {
            len = mp__min(MP__TILE, per - i);
            mp__load(g, mp__at(dy, dt, base + i), dt, len);
            if (act != MP_LINEAR && !reads_x) mp__load(o, mp__at(y, dt, base + i), dt, len);
            if (reads_x) mp__load(in, mp__at(x, dt, base + i), dt, len);
            if (act == MP_SOFTMAX)
                for (j = 0; j < len; j++) g[j] = o[j] * (g[j] - dot);
            else
                mp__act_grad_run(act, g, reads_x ? NULL : o, reads_x ? in : NULL, len);
            mp__store(mp__at_mut(dx, dxt, base + i), dxt, g, len);
        }
    }
}

static void mp__bias_grad_cols(void *args, size_t c0, size_t c1, int thread) {
    const mp__rows_op *op = (const mp__rows_op *)args;
    const void *dy = op->a;
    void *db = op->out;
    size_t rows = op->rows, cols = op->cols;
    mp_dtype dt = op->dt;
    float acc[MP__RUN], t[MP__RUN]; /* a run of columns; each sums its rows in order */
    size_t r, i, len, es = mp__dtypes[dt].size;
    int ahead = rows * cols * es >= MP__FAR; /* fetch the rows MP__ROWS_AHEAD ahead as it goes */
    (void)thread;
    for (i = c0; i < c1; i += len) {
        len = mp__min(MP__RUN, c1 - i);
        memset(acc, 0, sizeof acc);
        for (r = 0; r < rows; r++) {
            if (ahead && r + MP__ROWS_AHEAD < rows) mp__prefetch_bytes(mp__at(dy, dt, (r + MP__ROWS_AHEAD) * cols + i), len * es);
            mp__load(t, mp__at(dy, dt, r * cols + i), dt, len);
            mp__add_run(acc, t, len);
        }
        mp__store(mp__at_mut(db, dt, i), dt, acc, len);
    }
}

/* >>threads
   Workers sleep on a condition variable until the pool's generation moves,
   run the task with their index, and the last to finish wakes the caller,
   which runs index 0 itself. Before sleeping, a worker (and the caller
   waiting for the workers) spins a while on the generation (on pending):
   a training step's products come back to back, and a worker woken by the
   caller for each of them was often put by Linux on the caller's own core,
   behind it (the two halves of a short product then ran one after the
   other, on an idle 2-core machine). The spin keeps the core
   for its first polls and yields it between the later ones (mp__pause).
   The polls take no lock (GCC's and Clang's __atomic builtins; without
   them there is no pool). */
typedef void (*mp__task)(void *ctx, int thread, int threads);

/* What one thread packs into and sums in: an A block, a B panel (grown to
   what the largest product needs), a float32 C block, one widened run. */
typedef struct mp__gemm_ws {
    float *a, *b, *c, *tmp;
    size_t b_cap;            /* floats */
    float *part;             /* partial sums of a product split along K (mp__split_k) */
    size_t part_cap;         /* floats */
} mp__gemm_ws;

#ifdef MP__THREADS
typedef struct mp__worker {
    struct mp_pool *pool;
    int index;
} mp__worker;
#endif

struct mp_pool {
    int threads;
    mp__gemm_ws *ws; /* one per thread */
#ifdef MP__THREADS
    pthread_t *handles;
    mp__worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    unsigned long generation;
    int pending, quit, started, sleepers;
    mp__task task;
    void *ctx;
#endif
};

MIXPREC_API int mp_available_cores(void) {
#if defined(MP__THREADS) && defined(_SC_NPROCESSORS_ONLN)
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
#else
    return 1;
#endif
}

MIXPREC_API int mp_pool_threads(const mp_pool *pool) { return pool ? pool->threads : 1; }

#ifdef MP__THREADS
enum {
    MP__SPINS = 100,     /* x MP__PAUSES pauses: tens of microseconds (mp__pause) */
    MP__SPINS_KEEP = 70, /* of them without yielding */
    MP__PAUSES = 32
};
/* Every access the pool's threads share is sequentially consistent: a
   sleeper counts itself in `sleepers` before it looks at what it waits
   for, and a waker stores what ends the wait before it looks at
   `sleepers`, so one of the two sees the other's write (mp__pool_wake). */
#define MP__LOAD(x) __atomic_load_n(&(x), __ATOMIC_SEQ_CST)
#define MP__STORE(x, v) __atomic_store_n(&(x), v, __ATOMIC_SEQ_CST)
#define MP__ATOMIC_ADD(x, v) __atomic_add_fetch(&(x), v, __ATOMIC_SEQ_CST)

/* A poll every pause instruction (a pause lasts from tens of cycles to
   about a hundred, by the core): a wait ends within a few polls of the
   store that ends it, where a poll every 32 pauses left a visible gap at
   each end of a product. After the first MP__SPINS_KEEP x MP__PAUSES
   pauses the core also goes to any other thread that wants it, every
   MP__PAUSES pauses. Yielding from the first poll handed the core to any
   low-priority job for its whole time slice (a batch-128 bfloat16 step on
   2 threads beside three nice-19 jobs took more than twice as long); never
   yielding starved a caller and a worker that share a core (beside one
   equal-priority job). Keeping the first 70 x 32 pauses is close to never
   yielding in the first case and between the two in the second
   (bench/train.c's 2-thread rows, run beside other jobs). */
static void mp__pause(int spin) {
#ifdef MP__SIMD_X86
    _mm_pause();
#endif
    if (spin >= MP__SPINS_KEEP * MP__PAUSES && spin % MP__PAUSES == MP__PAUSES - 1) sched_yield();
}

/* Waits while cond holds: polls it up to MP__SPINS x MP__PAUSES times,
   then sleeps on cv, counted in p->sleepers. A thread that polls takes no
   lock: woken through the mutex, a worker often found the caller still
   holding it and slept in the kernel until the caller let go. */
#define MP__WAIT_WHILE(cond, cv)                                                                   \
    do {                                                                                           \
        int spin_;                                                                                 \
        for (spin_ = 0; spin_ < MP__SPINS * MP__PAUSES && (cond); spin_++) mp__pause(spin_);       \
        if (cond) {                                                                                \
            pthread_mutex_lock(&p->mu);                                                            \
            MP__ATOMIC_ADD(p->sleepers, 1);                                                        \
            while (cond) pthread_cond_wait(cv, &p->mu);                                            \
            MP__ATOMIC_ADD(p->sleepers, -1);                                                       \
            pthread_mutex_unlock(&p->mu);                                                          \
        }                                                                                          \
    } while (0)

/* After a store that ends a wait: wakes the sleepers on cv, if any. */
static void mp__pool_wake(mp_pool *p, pthread_cond_t *cv) {
    if (!MP__LOAD(p->sleepers)) return;
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(&p->mu);
}

static void *mp__worker_main(void *arg) {
    mp__worker *w = (mp__worker *)arg;
    mp_pool *p = w->pool;
    unsigned long seen = 0;
    for (;;) {
        MP__WAIT_WHILE(MP__LOAD(p->generation) == seen && !MP__LOAD(p->quit), &p->wake);
        if (MP__LOAD(p->quit)) return NULL;
        seen = MP__LOAD(p->generation);
        p->task(p->ctx, w->index, p->threads);
        if (MP__ATOMIC_ADD(p->pending, -1) == 0) mp__pool_wake(p, &p->done);
    }
}
#endif

/* Runs task(ctx, t, threads) for every t, the caller taking t = 0. */
static void mp__pool_run(mp_pool *p, mp__task task, void *ctx, int threads) {
#ifdef MP__THREADS
    if (threads > 1) {
        p->task = task; /* published by the generation's store */
        p->ctx = ctx;
        MP__STORE(p->pending, p->threads - 1);
        MP__STORE(p->generation, p->generation + 1);
        mp__pool_wake(p, &p->wake);
        task(ctx, 0, p->threads);
        MP__WAIT_WHILE(MP__LOAD(p->pending) != 0, &p->done);
        return;
    }
#endif
    (void)p;
    (void)threads;
    task(ctx, 0, 1);
}

MIXPREC_API void mp_pool_destroy(mp_pool *p) {
    int i;
    if (!p) return;
#ifdef MP__THREADS
    if (p->started) {
        MP__STORE(p->quit, 1);
        mp__pool_wake(p, &p->wake);
        for (i = 0; i < p->started; i++) pthread_join(p->handles[i], NULL);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
#endif
    for (i = 0; i < p->threads; i++) {
        mp__free(p->ws[i].a);
        mp__free(p->ws[i].b);
        mp__free(p->ws[i].part);
    }
    mp__free(p);
}

/* The CPU backend's context: the model's thread pool and the bytes the
   model holds through the backend (the global counters see them too). */
typedef struct mp__cpu {
    mp_pool *pool;
    size_t current, peak;
    const char *error; /* the first op that failed, or NULL (sync reports it) */
} mp__cpu;
static mp_pool *mp__pool_of(void *ctx) { return ((mp__cpu *)ctx)->pool; }

/* >>matmul: BLIS's loops. For each panel of NC columns, op(B) is packed once
   (K x NC, widened to float32, or kept as bfloat16 pairs for the dot-product
   kernel); for each block of MC rows and each KC slice of K, op(A) is
   packed and an MR x NR register tile sweeps the pair, adding into a
   float32 MC x NC block. Once the block holds the whole K sum, the epilogue
   adds bias, applies the activation and rounds once into C's dtype. Threads
   split N (or M when it has more tiles) into disjoint ranges: each element
   is summed in the same order whatever the thread count.

   Which path runs when. mp__gemm_run chooses for the whole product (the
   first three rows, in this order) and mp__gemm_plan_of for each thread's
   part of C (the rest, in this order). Only the kernel changes a sum (AMX
   and vdpbf16ps read bfloat16 subnormals as 0): whichever path runs it,
   each element is summed in the same order, CBLAS's aside. The tests are
   tests/test_gemm.c's.
   path             chosen when                          kernel                  test
   CBLAS            MIXPREC_USE_CBLAS, float32 A, B, C   cblas_sgemm             tests/matrix.sh's
                                                                                 MIXPREC_USE_CBLAS build
   split along K    >= 2 threads, op(A) = A^T, op(B) =   any below, a slice at   test_split_k
                    B, C small, K long (mp__split_k)     a time, then merged
   as its transpose n <= MR and C^T's tiles pad less;   any below, on C^T       test_products (n = 1,
                    not in place, no C += or pre-                                2), test_relu_grad
                    activation (mp__swap_dims)
   in place         AVX-512 FMA build, A B, n <= 16:     mp__kernel_in_place,    test_narrow_in_place
                    bfloat16 on AMX; n <= 64: float32,   mp__kernel_in_place_amx,
                    bfloat16 on vdpbf16ps (mp__in_place) mp__kernel_in_place_bf16,
                                                         mp__kernel_in_place_wide
   sums in C        float32 C, K > KC, the epilogue in   mp__kernel (float32)    test_sums_in_c_threads
                    the kernels, C <= IN_C_FLOATS
                    (mp__sums_in_c)
   blocked, AMX     bfloat16 x bfloat16, AMX built and   mp__kernel_amx          test_products,
                    granted (mp__amx_usable)                                     test_threads (AMX CPUs)
   blocked, pairs   bfloat16 x bfloat16, AVX512_BF16     mp__kernel_bf16         test_products,
                    built, MIXPREC_BF16_DOT                                      test_pack_pairs_layout
   blocked, float32 everything else: float16 and         mp__kernel (AVX-512,    test_products,
                    bfloat16 widened as they are packed  AVX2 or portable)       test_long_k, test_all_mixes
   Threads split a part along N or M (mp__split_n): test_threads and
   test_sums_in_c_threads compare 1 to 4 threads' bits.

   Its parts, in file order: >>matmul: blocking (the sizes and the pool's
   buffers), >>matmul: packing, >>matmul: kernels, >>matmul: paths (the
   plan and the parts of C it runs) and >>matmul: threads (how threads
   share a product, mp_matmul). bench/gemm.c measures the training steps'
   products that the comments below speak of. */

/* >>matmul: blocking */
#if defined(MP__SIMD_AVX512) && defined(__AVX512BF16__)
#define MP__BF16_DOT 1
#endif
/* vdpbf16ps adds two products to a float32 lane, but Intel's cores issue it
   at half the rate of their FMAs (bench/gemm's peak rows show it), where
   AMD's issue it at the FMAs' rate. So where the build targets an Intel
   core, bfloat16 x bfloat16 products widen their operands to float32 in the
   packs and run the FMA tiles, as a build without AVX512_BF16 does, unless
   AMX's tiles run: on an Intel core without AMX, mixed_bfloat16's training
   step by vdpbf16ps took longer than float32's, and as long widened
   (bench/train.c's mixed_bfloat16 rows against float32's). No
   compiler macro names the vendor: AVX512_FP16 is Intel's alone, and
   MIXPREC_BF16_DOT (1 or 0) overrides the guess. */
#ifndef MIXPREC_BF16_DOT
#ifdef __AVX512FP16__
#define MIXPREC_BF16_DOT 0
#else
#define MIXPREC_BF16_DOT 1
#endif
#endif
/* Intel AMX (AMX-TILE and AMX-BF16): bfloat16 x bfloat16 products by
   tdpbf16ps, a 16 x 16 float32 tile += 16 x 32 times 32 x 16 bfloat16 in
   one instruction, where the build targets it (chosen at compile time, as
   every SIMD path) and Linux lets the process use the tiles
   (mp__amx_usable; else the vdpbf16ps tiles run). Its reading of bfloat16
   is vdpbf16ps's: subnormal inputs read as 0, subnormal sums flushed,
   round to nearest even (Intel SDM, TDPBF16PS). GCC spells the targets'
   macros __AMX_TILE__ and __AMX_BF16__, older Clang __AMXTILE__ and
   __AMXBF16__. */
#if defined(MP__BF16_DOT) && defined(__FMA__) && defined(__AVX512BW__) &&                       \
    (defined(__AMX_TILE__) || defined(__AMXTILE__)) && (defined(__AMX_BF16__) || defined(__AMXBF16__)) && \
    defined(__linux__) && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MP__AMX 1
#endif

/* The sizes, in one enumeration (its constants combine in C++ without
   mixing enumeration types). Each is a rule with its reason; bench/gemm.c
   has the shapes that chose the values. */
enum {
#if defined(MP__SIMD_AVX512) && defined(__FMA__)
    MP__MR = 12, /* a register tile's rows: 24 zmm accumulators */
    MP__NR = 32, /* and columns */
#elif defined(MP__SIMD_X86) && defined(__FMA__)
    MP__MR = 6, /* 12 ymm accumulators */
    MP__NR = 16,
#else
    MP__MR = 4,
    MP__NR = 16,
#endif
    MP__MC = 96,            /* A block in L2: a multiple of every MR */
    MP__KC = 256,           /* B sliver (KC x NR) in L1; bfloat16 slices take 2 KC */
    MP__NC = 2048,          /* float32 C block MC x NC in L2 */
    MP__B_BUDGET = 4 << 20, /* floats of B panel per thread before NC narrows */
    /* An A block: MC rows of 4 KC float32 (mp__a_span), or AMX_MC rows of KC
       bfloat16 pairs (AMX_MC = 4 MC). */
    MP__A_FLOATS = MP__MC * 4 * MP__KC,
    MP__TMP = MP__NR * MP__KC > MP__NC ? MP__NR * MP__KC : MP__NC, /* widened runs */
    /* A product or sliver this shallow (k, or a sliver's depth, at most
       this) is mostly its C stores: it splits its rows between the threads
       (mp__split_n), and its float32 slivers run a block's tiles a row of
       tiles at a time, not a column at a time (mp__next_tile). A column of
       tiles writes MC rows at C's stride, which for a row of 4 KiB (1024
       float32 columns) lands every row in the same L1 sets and hops
       between DRAM pages for a large C: the 10-class output layer's input
       gradient (k = 10) and k = 32 run faster by rows, k = 64 and deeper
       the same either way (bench/gemm.c's batch-8192 step). bfloat16
       pairs gained nothing and lost on some batch-128 products: they keep
       the column order. The re-read B panel (depth x NC floats) stays in
       L2.
       The last K slice of a product whose epilogue runs in the kernels
       (mp__tile_dest) goes a row of tiles at a time too, at any depth, in
       the float32 and vdpbf16ps tiles alike (AMX's epilogue runs a row at
       a time after its block): those tiles write C itself, a row of tiles
       MR whole rows of it; their B slivers then come from L2 once a tile,
       not from L1: C is written once, while it is in cache, which the deep
       products of a float32 training step gain by (bench/gemm.c). */
    MP__SHALLOW = 64,
    /* The widest float32 product, and bfloat16 one on vdpbf16ps, that runs
       in place (mp__in_place): two tiles of columns, each value of A
       broadcast twice from its row, cost less than packing A once
       (bench/convnet.c --model resnet's 64-filter convolutions). */
    MP__IN_PLACE_N = 2 * MP__NR,
    MP__AMX_PAIRS = 16, /* an AMX tile's depth in bfloat16 pairs: 32 values of K */
    /* The rows of an AMX block, at most, where its B panel is more than half
       of L2 (AMX_FAR bytes, of 2 MiB; the block's A and its float32 sums
       share the rest): as many as keep those sums in the MC x NC block
       (mp__amx_rows). Taller blocks read such a panel from L3 fewer times
       (a weight gradient of 1024 x 1024 x 8192, the 8192 x 4096 x K
       products), while a panel of 1 MiB stays in L2 with blocks of MC
       rows, and taller ones only slowed it (bench/gemm.c on AMX). */
    MP__AMX_MC = 384,
    MP__AMX_FAR = 1 << 20,
    /* The columns of an AMX panel, at most: K x 512 pairs (1 MiB for K of
       1024) stay in L2 while the blocks of rows pass, where 1024 columns
       came from L3 for each; op(A) is then packed once per 512 columns.
       bench/train.c's mixed_bfloat16 step at 1024 units: 256, 384 and 768
       columns were slower than 512, 1024 slower still. */
    MP__AMX_NC = 512,
    /* A product splits along K (mp__k_split_of) only where C is at most
       SPLIT_C floats, K is at least SPLIT_SLICES slices a thread and each
       thread's buffers take at most SPLIT_PART floats (bounding what a
       pool keeps for them). */
    MP__SPLIT_C = 1 << 16,
    MP__SPLIT_SLICES = 2,
    MP__SPLIT_PART = 1 << 20,
    /* Where a panel's rows are runs of the source, the pairs of rows this
       many pairs ahead are fetched as it is packed (MP__FAR): op(A) of a
       bfloat16 weight gradient (1024 x 1024 x 8192, A transposed, from
       memory) then waits on memory far less. */
    MP__PACK_AHEAD = 8,
    /* Runs are packed PACK_PANELS panels at a time, a pair of rows across
       all of them, so that each visit to a source row reads 4 cache lines
       in a row (of op(B): 32 columns a panel) rather than 1, in a row 8 KiB
       or more from the last one read: the forward products at batch 128
       and 4096 units, whose op(B) comes from memory, gain by it, the step's
       other products neither gain nor lose (bench/gemm.c). All of a
       block's 64 panels a pair at a time gained nothing, or lost. */
    MP__PACK_PANELS = 4,
    MP__IN_C_FLOATS = 1 << 20, /* 4 MiB: 1024 x 1024 float32 (mp__sums_in_c) */
    MP__SHALLOW_N_ROWS = 256,  /* a shallow product this short splits along N (mp__split_n) */
    /* Products below this many multiply-adds stay on one thread: waking the
       others costs more than they save. */
    MP__GEMM_PARALLEL = 1 << 17
};

#ifdef MP__AMX
/* Linux gives a process AMX's tile data (8 KiB of state a thread) only when
   asked: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), Linux 5.16 on
   (the kernel's Documentation/arch/x86/xstate.rst); a tile instruction
   before that faults. Asked once a process, by the raw system call
   (mp__syscall3). */
static int mp__amx_usable(void) {
    static int state; /* 0: not asked yet, 1: granted, -1: refused */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (!s) {
        long ret = mp__syscall3(158 /* SYS_arch_prctl */, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */, 0);
        s = ret == 0 ? 1 : -1;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}
#else
static int mp__amx_usable(void) { return 0; }
#endif

static size_t mp__round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

static int mp__gemm_bf16(const mp_gemm_args *g) {
#ifdef MP__BF16_DOT
    return g->at == MP_BFLOAT16 && g->bt == MP_BFLOAT16 && (MIXPREC_BF16_DOT || mp__amx_usable());
#else
    (void)g;
    return 0;
#endif
}

/* The rows of op(B) a panel holds: all of K, or one KC slice when the
   rows of C fit one MC block (each slice is then used once, right after
   it is packed). A bfloat16 slice of 2 KC values takes KC floats; AMX pads
   a slice's pairs to whole tiles of 16, so a panel is at least 16 deep, in
   every build: a model then grows its panels, and allocates, alike on
   every machine (tests/test_reliability.c fails each allocation in turn). */
static size_t mp__panel_depth(size_t rows, size_t k) {
    size_t depth = rows <= MP__MC ? mp__min(k, MP__KC) : k;
    return depth < 16 ? 16 : depth;
}

/* Columns per B panel: all of N up to NC, fewer when it is deep. */
static size_t mp__panel_cols(size_t depth, size_t n, size_t b_cap) {
    size_t cols = mp__min(mp__round_up(n, MP__NR), MP__NC);
    size_t fit = depth ? b_cap / depth / MP__NR * MP__NR : cols;
    return mp__min(cols, fit);
}

/* Whether a product of few columns (a layer of 10 classes) runs as its
   transpose, C^T = op(B)^T op(A)^T: n in MR-row tiles rather than NR-column
   ones, for less than half the padded work (10 columns take a 32-wide
   tile). Each element is the same sum in the same order: a product a b is
   b a, in fused multiply-adds and in vdpbf16ps's pairs alike. */
static int mp__swap_dims(size_t m, size_t n) {
    return n <= MP__MR && 2 * MP__MR * mp__round_up(m, MP__NR) < mp__round_up(m, MP__MR) * MP__NR;
}

static size_t mp__panel_floats_as(size_t m, size_t k, size_t n) {
    size_t depth = mp__panel_depth(m, k), cols = mp__panel_cols(depth, n, MP__B_BUDGET);
    return depth * (cols < MP__NR ? (size_t)MP__NR : cols);
}

/* What a product needs of a B panel, as many columns as the budget allows:
   as itself, or as its transpose. */
static size_t mp__panel_floats(size_t m, size_t k, size_t n) {
    size_t f = mp__panel_floats_as(m, k, n), t = mp__swap_dims(m, n) ? mp__panel_floats_as(n, k, m) : 0;
    return f > t ? f : t;
}

/* A product split along K (mp__split_k) cuts K into the slices its
   kernels sum one at a time (KC values, bfloat16 pairs 2 KC): thread 0
   sums the first `first` slices as one product would, each other thread
   `per` of the rest, each slice into a buffer of its own. */
typedef struct mp__k_split {
    size_t kc, slices, first, per;
    size_t stride, floats; /* floats: a buffer of C's sums, and what each thread's buffers take */
    int fits;              /* the product is worth splitting so, in the memory allowed */
} mp__k_split;

/* A product splits along K where it does not run as its transpose (10
   classes: the transpose's tiles are 3 times fewer), C is at most
   MP__SPLIT_C floats, K is at least MP__SPLIT_SLICES slices a thread, the
   busiest thread has at most 1/16 more than an even share, and each
   thread's buffers take at most MP__SPLIT_PART floats (bounding what a
   pool keeps for them). A convolution's weight gradients (12 x 128 x
   21142, 128 x 128 x 3969) gain by it on 2 threads; an uneven share (9
   slices, 5 on thread 0) loses, hence the 1/16. Two slices a thread
   already gain, in float32 and on AMX alike (bench/gemm.c's conv rows). */

static mp__k_split mp__k_split_of(size_t m, size_t n, size_t k, size_t kc, int threads) {
    mp__k_split s;
    size_t t = threads < 2 ? 2 : (size_t)threads;
    s.kc = kc;
    s.slices = (k + kc - 1) / kc;
    s.first = (s.slices + t - 1) / t;
    s.per = (s.slices - s.first + t - 2) / (t - 1);
    s.stride = mp__round_up(m * n, 16); /* each buffer on a 64-byte line */
    s.floats = (s.per > 1 ? s.per : 1) * s.stride;
    s.fits = threads >= 2 && !mp__swap_dims(m, n) && m * n <= MP__SPLIT_C && s.slices >= MP__SPLIT_SLICES * t &&
             16 * t * s.first <= 17 * s.slices && s.floats <= MP__SPLIT_PART;
    return s;
}

/* Floats of partial sums each thread keeps for a product of this shape:
   0 where it does not split along K in slices of either depth. */
static size_t mp__part_floats(size_t m, size_t k, size_t n, int threads) {
    mp__k_split f = mp__k_split_of(m, n, k, MP__KC, threads), p = mp__k_split_of(m, n, k, 2 * MP__KC, threads);
    size_t a = f.fits ? f.floats : 0, b = p.fits ? p.floats : 0;
    return a > b ? a : b;
}

/* Grows *buf to `floats`: it holds nothing between products, so it is
   freed first, for the peak. */
static mp_status mp__grow(float **buf, size_t *cap, size_t floats) {
    if (*cap >= floats) return MP_OK;
    mp__free(*buf);
    *buf = NULL;
    *cap = 0;
    if (floats > SIZE_MAX / sizeof(float) || !(*buf = (float *)mp__alloc(floats * sizeof(float)))) return MP_ERR_ALLOC;
    *cap = floats;
    return MP_OK;
}

/* Grows every thread's B panel, and its partial sums, to what a product
   of this shape needs. */
static mp_status mp__pool_reserve(mp_pool *p, size_t m, size_t k, size_t n) {
    size_t floats = mp__panel_floats(m, k, n), part = mp__part_floats(m, k, n, p->threads);
    int i;
    for (i = 0; i < p->threads; i++) {
        mp__gemm_ws *w = &p->ws[i];
        mp_status st = mp__grow(&w->b, &w->b_cap, floats);
        if (st == MP_OK) st = mp__grow(&w->part, &w->part_cap, part);
        if (st != MP_OK) return st;
    }
    return MP_OK;
}

MIXPREC_API mp_status mp_pool_create(mp_pool **out, int threads) {
    size_t fixed = (size_t)MP__A_FLOATS + (size_t)MP__MC * MP__NC + MP__TMP, head;
    mp_pool *p;
    int i;
    if (!out) return MP_ERR_NULL;
    if (threads < 0) return MP_ERR_ARG;
    if (threads == 0) threads = mp_available_cores();
    if (threads > MP__MAX_THREADS) threads = MP__MAX_THREADS;
#ifndef MP__THREADS
    threads = 1;
#endif
    head = sizeof *p + (size_t)threads * sizeof(mp__gemm_ws);
#ifdef MP__THREADS
    head += (size_t)threads * (sizeof(pthread_t) + sizeof(mp__worker));
#endif
    if (!(p = (mp_pool *)mp__alloc(head))) return MP_ERR_ALLOC;
    p->threads = threads;
    p->ws = (mp__gemm_ws *)(p + 1);
#ifdef MP__THREADS
    p->handles = (pthread_t *)(p->ws + threads);
    p->workers = (mp__worker *)(p->handles + threads);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
#endif
    for (i = 0; i < threads; i++) {
        mp__gemm_ws *w = &p->ws[i];
        if (!(w->a = (float *)mp__alloc(fixed * sizeof(float)))) { mp_pool_destroy(p); return MP_ERR_ALLOC; }
        w->c = w->a + (size_t)MP__A_FLOATS;
        w->tmp = w->c + (size_t)MP__MC * MP__NC;
    }
#ifdef MP__THREADS
    for (i = 1; i < threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].index = i;
        if (pthread_create(&p->handles[p->started], NULL, mp__worker_main, &p->workers[i]) != 0) {
            mp_pool_destroy(p);
            return MP_ERR_ALLOC;
        }
        p->started++;
    }
#endif
    *out = p;
    return MP_OK;
}

/* >>matmul: packing. op(A) into panels of MR rows, op(B) into panels of NR
   columns, each [depth][width]: widened to float32 (mp__pack), bfloat16
   pairs (mp__pack_pairs) or AMX's tiles (mp__pack_amx_a). */
#if defined(MP__SIMD_AVX512)
/* g++ sees the `_mm512_undefined` inside these intrinsics as a use of
   an uninitialised value (a false positive, in C++ only; a definite one
   where a caller's constant arguments inline them, as AMX's pack does). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
/* v[c] = column c of the 16 x 16 matrix whose row r is v[r] (32-bit
   elements): pairs within 128-bit lanes, then quads, then the lanes;
   inlined and unrolled, so that v and t can be registers. */
MP__HOT void mp__transpose16(__m512i v[16]) {
    __m512i t[16];
    int i, j;
    MP__UNROLL(8)
    for (i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    MP__UNROLL(4)
    for (i = 0; i < 16; i += 4) { /* v[i + j], lane k: column 4k + j of rows i .. i+3 */
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    MP__UNROLL(4)
    for (j = 0; j < 4; j++) {
        __m512i a = _mm512_shuffle_i32x4(v[j], v[4 + j], 0x88), b = _mm512_shuffle_i32x4(v[j], v[4 + j], 0xdd);
        __m512i c = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0x88), d = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0xdd);
        t[j] = _mm512_shuffle_i32x4(a, c, 0x88);
        t[8 + j] = _mm512_shuffle_i32x4(a, c, 0xdd);
        t[4 + j] = _mm512_shuffle_i32x4(b, d, 0x88);
        t[12 + j] = _mm512_shuffle_i32x4(b, d, 0xdd);
    }
    MP__UNROLL(16)
    for (i = 0; i < 16; i++) v[i] = t[i];
}

/* The first `bytes` of `valid` rows (a multiple of 4: floats, or
   bfloat16 pairs), row i at rows + i * row_bytes, as 32-bit columns into
   out[column * width + row] for rows [0, lanes), the rows past `valid` as 0
   (lanes <= 16): one 64-byte load a row and block of 16 columns, 16 x 16
   transposes, masked stores. A last block of fewer columns loads under a
   mask and stores only its columns: the 10-class input gradient's op(B)
   (k = 10) is one such block a panel, cheaper so than copied element by
   element. Rows past `valid` and columns past the block's go under empty
   masks, which touch no memory, so that the loops unroll whole and the 16
   rows stay in registers (MP__UNROLL): kept in memory, the transposes
   were a large part of an input gradient whose op(B) is transposed
   (bench/gemm.c's 128 x 4096 x 4096, float32 and bfloat16). */
static void mp__transpose_rows16(uint32_t *out, size_t width, const void *rows, size_t row_bytes, size_t bytes,
                                 size_t valid, size_t lanes) {
    __mmask16 keep = (__mmask16)((1u << lanes) - 1);
    __m512i v[16];
    size_t b, i;
    for (b = 0; b * 64 < bytes; b++) {
        size_t cols = mp__min(16, (bytes - b * 64) / 4);
        __mmask16 take = (__mmask16)((1u << cols) - 1);
        MP__UNROLL(16)
        for (i = 0; i < 16; i++)
            v[i] = _mm512_maskz_loadu_epi32(i < valid ? take : 0,
                                            (const char *)rows + (i < valid ? i : 0) * row_bytes + 64 * b);
        mp__transpose16(v);
        MP__UNROLL(16)
        for (i = 0; i < 16; i++)
            _mm512_mask_storeu_epi32(out + (16 * b + (i < cols ? i : 0)) * width, i < cols ? keep : 0, v[i]);
    }
}

/* A panel of `width` rows, w of them from the source (the rest 0), by the
   transposes above, where its rows fall in whole blocks of 16 (the NR
   panels) or in one block (the MR = 12 panels of op(A)). */
static int mp__transposes_fit(size_t width) { return width % 16 == 0 || width < 16; }
static void mp__transpose_panel(void *out, size_t width, size_t w, const void *rows, size_t row_bytes, size_t bytes) {
    size_t r;
    for (r = 0; r < width; r += 16)
        mp__transpose_rows16((uint32_t *)out + r, width, r < w ? (const char *)rows + r * row_bytes : rows, row_bytes,
                             bytes, r < w ? mp__min(16, w - r) : 0, mp__min(16, width - r));
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

/* Packs X[r0 .. r0+rc, q0 .. q0+qc] into panels of `width` rows, each
   [qc][width], widened to float32; rows past rc are 0. X(r, q) lies at
   src[r * ld + q] when its rows are contiguous, else at src[q * ld + r].
   op(A) packs by rows (width MR) and op(B) by columns (width NR). tmp
   holds width x qc floats, and rc. */
/* A panel row of width floats from w <= width of a run, zeros after. A
   whole row copies a constant size, which the compiler inlines: a library
   call per row of 32 floats is a visible part of a product whose K is long
   and M or N narrow (a convolution's weight gradient, 12 x 128 x 21142).
   Part of a row goes under masks where AVX-512 is: a call to memcpy and
   one to memset for each row of 10 in a panel of 12 (the 10 classes'
   weights, k rows of op(A) in the 10-class forward) were a tenth of that
   product, and both threads pack them on 2. */
static void mp__panel_row(float *dst, const float *run, size_t w, size_t width) {
#ifdef MP__SIMD_AVX512
    size_t o;
    if (w < width) {
        for (o = 0; o < width; o += 16) {
            size_t lanes = mp__min(16, width - o), valid = w > o ? mp__min(16, w - o) : 0;
            __m512 v = valid ? _mm512_maskz_loadu_ps((__mmask16)((1u << valid) - 1), run + o) : _mm512_setzero_ps();
            _mm512_mask_storeu_ps(dst + o, (__mmask16)((1u << lanes) - 1), v);
        }
        return;
    }
#endif
    if (w == width && width == MP__NR) memcpy(dst, run, MP__NR * sizeof(float));
    else if (w == width && width == MP__MR) memcpy(dst, run, MP__MR * sizeof(float));
    else {
        memcpy(dst, run, w * sizeof(float));
        memset(dst + w, 0, (width - w) * sizeof(float));
    }
}

static void mp__pack(float *out, float *tmp, size_t width, int rows_contiguous, const void *src, mp_dtype t,
                     size_t ld, size_t r0, size_t rc, size_t q0, size_t qc) {
    size_t g, q, r;
    if (!rows_contiguous && rc == width && ld == width) { /* one panel, laid out as the source is: a copy
                                                             (the 2x2 convolution's 12 x K im2col operand) */
        mp__load(out, mp__at(src, t, q0 * ld), t, qc * width);
        return;
    }
    if (!rows_contiguous) { /* a panel row is a run of the source: each run read once (widened unless
                                float32) and cut into every panel, not re-read at ld strides a panel at a time */
        /* adjacent runs (a narrow matrix: the 10 classes' weights) widened together: one call a run
           of 10 was most of a 10-class product */
        size_t group = t != MP_FLOAT32 && ld == rc ? MP__TMP / rc : 1; /* tmp holds one run at least */
        int ahead = qc * ld * mp__dtypes[t].size >= MP__FAR;
        for (q = 0; q < qc; q++) {
            const float *run = (const float *)mp__at(src, t, (q0 + q) * ld + r0);
            if (ahead && q + MP__ROWS_AHEAD < qc)
                mp__prefetch_bytes(mp__at(src, t, (q0 + q + MP__ROWS_AHEAD) * ld + r0), rc * mp__dtypes[t].size);
            if (t != MP_FLOAT32) {
                if (q % group == 0) mp__load(tmp, run, t, mp__min(group, qc - q) * rc);
                run = tmp + q % group * rc;
            }
            for (g = 0; g < rc; g += width) mp__panel_row(out + g * qc + q * width, run + g, mp__min(width, rc - g), width);
        }
        return;
    }
    for (g = 0; g < rc; g += width, out += width * qc) { /* a transpose: widen the rows first unless float32 */
        size_t w = mp__min(width, rc - g), stride = ld;
        const float *rows = (const float *)mp__at(src, t, (r0 + g) * ld + q0);
        if (t != MP_FLOAT32) {
            if (ld == qc) /* whole rows, one after the other: one run (the 10 classes' weights) */
                mp__load(tmp, mp__at(src, t, (r0 + g) * ld), t, w * qc);
            else
                for (r = 0; r < w; r++) mp__load(tmp + r * qc, mp__at(src, t, (r0 + g + r) * ld + q0), t, qc);
            rows = tmp;
            stride = qc;
        }
        q = 0;
#ifdef MP__SIMD_AVX512
        if (mp__transposes_fit(width)) { /* 16 x 16 blocks by vector transposes */
            mp__transpose_panel(out, width, w, rows, stride * sizeof(float), qc * sizeof(float));
            q = qc;
        }
#endif
        for (; q < qc; q++) {
            for (r = 0; r < w; r++) out[q * width + r] = rows[r * stride + q];
            for (; r < width; r++) out[q * width + r] = 0.0f;
        }
    }
}

#ifdef MP__BF16_DOT
/* Two runs of bfloat16 as pairs, lo in the low half. Inlined with a
   constant n for full panels, so the loop vectorises. */
MP__HOT void mp__interleave(uint32_t *dst, const uint16_t *lo, const uint16_t *hi, size_t n) {
    size_t r;
    for (r = 0; r < n; r++) dst[r] = (uint32_t)lo[r] | (uint32_t)hi[r] << 16;
}


/* The same for the bfloat16 dot-product kernels: bfloat16 values kept as
   they are, in pairs along q (even q in the low half), [depth][width]
   pairs a panel, depth >= ceil(qc/2) (AMX's tiles take whole 16-pair
   steps); a missing q or row is 0. */
enum { MP__PACK_SPAN = MP__PACK_PANELS * MP__MR }; /* the values of a pair of rows in a step of A's panels */
/* the row after the last */
static const uint16_t mp__zero_run[(int)MP__NR > (int)MP__PACK_SPAN ? (int)MP__NR : (int)MP__PACK_SPAN] = {0};

/* One pair of rows, lo and hi, of one panel: w values, zeros up to width. */
MP__HOT void mp__pack_pair_row(uint32_t *dst, size_t width, const uint16_t *lo, const uint16_t *hi, size_t w) {
    size_t r;
    if (w == MP__NR) mp__interleave(dst, lo, hi, MP__NR);
    else mp__interleave(dst, lo, hi, w);
    for (r = w; r < width; r++) dst[r] = 0;
}

/* A step of A's panels (MR = 12 values each), the pair of rows lo and hi
   across all of them: each panel's values widened to 32 bits, hi shifted
   over lo, under masks (0 past span), one store a panel. A panel at a
   time through the generic interleave went 4 values a vector, and packing
   the transposed column matrix of a convolution's weight gradient
   (k-major, MR panels over its patch) was a large part of the narrow
   ResNet's mixed_bfloat16 step (bench/convnet --model resnet). (g++'s
   false positive on `_mm512_undefined`: mp__transpose16.) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
static void mp__pack_pair_step(uint32_t *panels, size_t depth, const uint16_t *lo, const uint16_t *hi, size_t span) {
    size_t g;
    for (g = 0; g < span; g += MP__MR) {
        __mmask16 k = (__mmask16)mp__z_tail(mp__min(MP__MR, span - g));
        __m512i l = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, lo + g));
        __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, hi + g));
        _mm512_mask_storeu_epi32(panels + g * depth, (__mmask16)mp__z_tail(MP__MR),
                                 _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* Rows q and q + 1 of the source are runs (X(q, r) at x[q * ld + r]). */
static void mp__pack_pair_runs(uint32_t *out, size_t width, const uint16_t *x, size_t ld, size_t r0, size_t rc,
                               size_t q0, size_t qc, size_t depth) {
    size_t g0, g, p, pairs = (qc + 1) / 2;
    int ahead = qc * ld * sizeof(uint16_t) >= MP__FAR;
    for (g0 = 0; g0 < rc; g0 += MP__PACK_PANELS * width) {
        size_t span = mp__min(MP__PACK_PANELS * width, rc - g0);
        uint32_t *panels = out + g0 * depth; /* panel g (a multiple of width) at panels + g * depth */
        for (p = 0; p < pairs; p++) {
            const uint16_t *lo = x + (q0 + 2 * p) * ld + r0 + g0;
            int second = 2 * p + 1 < qc;
            if (ahead && 2 * (p + MP__PACK_AHEAD) + 1 < qc) {
                mp__prefetch_bytes(lo + 2 * MP__PACK_AHEAD * ld, span * sizeof(uint16_t));
                mp__prefetch_bytes(lo + (2 * MP__PACK_AHEAD + 1) * ld, span * sizeof(uint16_t));
            }
            if (width == MP__MR) {
                mp__pack_pair_step(panels + p * width, depth, lo, second ? lo + ld : mp__zero_run, span);
                continue;
            }
            for (g = 0; g < span; g += width)
                mp__pack_pair_row(panels + g * depth + p * width, width, lo + g, second ? lo + ld + g : mp__zero_run,
                                  mp__min(width, span - g));
        }
        for (g = 0; g < span; g += width)
            memset(panels + g * depth + width * pairs, 0, width * (depth - pairs) * sizeof(uint32_t));
    }
}

static void mp__pack_pairs(uint32_t *out, size_t width, int rows_contiguous, const void *src, size_t ld, size_t r0,
                           size_t rc, size_t q0, size_t qc, size_t depth) {
    const uint16_t *x = (const uint16_t *)src;
    size_t g, p, r, pairs = (qc + 1) / 2;
    if (!rows_contiguous) {
        mp__pack_pair_runs(out, width, x, ld, r0, rc, q0, qc, depth);
        return;
    }
    for (g = 0; g < rc; g += width, out += width * depth) { /* each row of the source holds its pairs */
        size_t w = mp__min(width, rc - g), first = 0;
        if (mp__transposes_fit(width)) { /* 16 x 16 blocks by vector transposes */
            mp__transpose_panel(out, width, w, x + (r0 + g) * ld + q0, ld * sizeof(uint16_t), qc / 2 * 4);
            first = qc / 2;
        }
        for (p = first; p < pairs; p++) {
            uint32_t *dst = out + p * width;
            size_t q = q0 + 2 * p;
            if (2 * p + 1 < qc) { /* the pair is adjacent in each row: one load (x86 is little-endian) */
                for (r = 0; r < w; r++) memcpy(&dst[r], x + (r0 + g + r) * ld + q, 4);
            } else {
                for (r = 0; r < w; r++) dst[r] = x[(r0 + g + r) * ld + q];
            }
            for (r = w; r < width; r++) dst[r] = 0;
        }
        memset(out + width * pairs, 0, width * (depth - pairs) * sizeof(uint32_t));
    }
}

#ifdef MP__AMX
/* The tile registers a thread's products use, all 16 rows of 64 bytes:
   C in 0-3 (2 x 2 tiles of 16 x 16 floats), op(A) in 4-5 (16 rows x 16
   pairs), op(B) in 6-7 (16 pairs x 16 columns). Loaded when a thread's part
   of a product starts and released when it ends, so that no thread keeps
   tile state (8 KiB more to save at each context switch) between products.
   The configuration is static data: GCC's _tile_loadconfig tells the
   compiler it reads 8 of its 64 bytes, and stores to the rest of a local
   one can be dropped (ldtilecfg then faults on the garbage). */
typedef struct mp__tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} mp__tile_config;
static const mp__tile_config mp__amx_config = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0}, {16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0}};
static void mp__amx_begin(void) { _tile_loadconfig(&mp__amx_config); }

/* One step (32 values of K, `valid` of them in the source) of 32 columns
   of a k-major source (X(q, i) at x[q * ld + i], `cols` of them) as the
   tiles' rows of two 16-row groups, lo (columns 0-15) and hi (16-31; NULL
   where the block has no such group). Rows 2p and 2p + 1 interleave into
   pairs within each 128-bit lane (unpacklo: columns 8l + 0..3, unpackhi:
   8l + 4..7), and a 16 x 16 transpose of each half turns the 16 pairs of
   each column into its tile row. */
static void mp__amx_transpose32(uint32_t *lo, uint32_t *hi, const uint16_t *x, size_t ld, size_t valid, size_t cols) {
    __mmask32 k = cols >= 32 ? (__mmask32)0xFFFFFFFFu : mp__z_tail(cols);
    __m512i v[16], w[16];
    size_t p, j;
    for (p = 0; p < 16; p++) {
        __m512i r0 = 2 * p < valid ? _mm512_maskz_loadu_epi16(k, x + 2 * p * ld) : _mm512_setzero_si512();
        __m512i r1 = 2 * p + 1 < valid ? _mm512_maskz_loadu_epi16(k, x + (2 * p + 1) * ld) : _mm512_setzero_si512();
        v[p] = _mm512_unpacklo_epi16(r0, r1);
        w[p] = _mm512_unpackhi_epi16(r0, r1);
    }
    mp__transpose16(v);
    mp__transpose16(w);
    for (j = 0; j < 16; j++) {
        size_t c = 8 * (j / 4) + j % 4; /* v[j]'s column; w[j]'s is c + 4 */
        uint32_t *tile = c < 16 ? lo : hi;
        if (tile) {
            _mm512_storeu_si512(tile + (c % 16) * 16, v[j]);
            _mm512_storeu_si512(tile + (c % 16 + 4) * 16, w[j]);
        }
    }
}

/* op(A)[r0 .. r0+rc, q0 .. q0+qc] as AMX A tiles: for each 16 rows, `steps`
   tiles of 16 rows x 16 pairs, a row's 32 values of K in its 64 bytes; rows
   and pairs past the source are 0. Rows that lie along K in the source are
   copied, 64 bytes a tile; otherwise (a weight gradient's op(A) = X^T) each
   step of 32 columns is interleaved and transposed in registers
   (mp__amx_transpose32), a step of K (32 source rows) at a time across the
   block's columns: each row's run is read in order and a step's 32 rows
   lie in 32 pages, where a column group at a time down all of K walked a
   page a row, and was slower (bench/gemm.c's weight gradients on AMX);
   fetching the next rows ahead then saved nothing. */
static void mp__pack_amx_a(uint32_t *out, int rows_contiguous, const uint16_t *x, size_t ld, size_t r0, size_t rc,
                           size_t q0, size_t qc, size_t steps) {
    size_t g, s, r, groups = (rc + 15) / 16;
    if (!rows_contiguous) {
        for (s = 0; s < steps; s++)
            for (g = 0; g < groups; g += 2) {
                const uint16_t *src = x + (q0 + 32 * s) * ld + r0 + 16 * g;
                uint32_t *lo = out + (g * steps + s) * 256, *hi = g + 1 < groups ? lo + steps * 256 : NULL;
                mp__amx_transpose32(lo, hi, src, ld, mp__min(32, qc - 32 * s), mp__min(32, rc - 16 * g));
            }
        return;
    }
    for (g = 0; g < groups; g++, out += steps * 256) {
        size_t w = mp__min(16, rc - 16 * g);
        for (r = 0; r < 16; r++) /* a row's run of K, 64 bytes a tile (the last under a mask) */
            for (s = 0; s < steps; s++) {
                size_t have = r < w && 32 * s < qc ? mp__min(32, qc - 32 * s) : 0;
                __mmask32 k = have == 32 ? (__mmask32)0xFFFFFFFFu : mp__z_tail(have);
                _mm512_storeu_si512(out + s * 256 + r * 16,
                                    _mm512_maskz_loadu_epi16(k, have ? x + (r0 + 16 * g + r) * ld + q0 + 32 * s : x));
            }
    }
}
#endif

#endif

/* >>matmul: kernels. An MR x NR register tile over one K slice (mp__kernel,
   mp__kernel_bf16), AMX's 32 x 32 (mp__kernel_amx), and where their sums
   go. */

/* Where a tile's sums over one K slice go: into the float32 C block, c
   (row stride ldc), added to it, or, for the first slice, added to 0 (as
   into a zeroed block: the same sum, -0 included, without zeroing it); and
   after the last slice, where the AVX-512 kernels can (mp__tile_fusable),
   on through the epilogue into C itself: + bias, ReLU, one rounding, with
   the operations and their order of mp__epilogue, so that no float32 block
   is written and read again. */
typedef struct mp__tile_dest {
    int first;             /* the first K slice */
    const mp_gemm_args *g; /* NULL: into the block; else the last slice, into C */
    const float *bias;     /* the tile's bias in float32 (NR values), or NULL */
    size_t row, col;       /* C's row and column of the tile's corner */
    size_t rows, cols;     /* the tile's rows and columns inside C */
    int in_c;              /* the sums live in C itself, not in a block (mp__sums_in_c) */
    const char *next;      /* the next column of tiles' B sliver, or NULL (mp__fetch_next) */
} mp__tile_dest;

#if defined(MP__SIMD_AVX512) && defined(__FMA__)
#define MP__TILE_FUSED 1
#endif

/* Whether C's epilogue can run in the kernels (mp__tile_dest). */
static int mp__tile_fusable(const mp_gemm_args *g) {
#ifdef MP__TILE_FUSED
    return !g->accumulate && !g->z && (g->act == MP_LINEAR || g->act == MP_RELU) &&
           (g->ct == MP_FLOAT32 || g->ct == MP_BFLOAT16);
#else
    (void)g;
    return 0;
#endif
}

#ifdef MP__TILE_FUSED
/* Row r of a tile, its sums lo and hi, through the epilogue into C. */
static void mp__tile_epilogue(const mp__tile_dest *d, size_t r, __m512 lo, __m512 hi) {
    const mp_gemm_args *g = d->g;
    const __m512 zero = _mm512_setzero_ps();
    size_t at = (d->row + r) * g->n + d->col;
    __mmask32 k = d->cols >= 32 ? (__mmask32)0xFFFFFFFFu : mp__z_tail(d->cols);
    if (d->bias) {
        lo = _mm512_add_ps(lo, _mm512_loadu_ps(d->bias));
        hi = _mm512_add_ps(hi, _mm512_loadu_ps(d->bias + 16));
    }
    if (g->act == MP_RELU) { /* v < 0 ? 0 : v, as mp__act_run: -0 and NaN stay */
        lo = _mm512_mask_mov_ps(lo, _mm512_cmp_ps_mask(lo, zero, _CMP_LT_OQ), zero);
        hi = _mm512_mask_mov_ps(hi, _mm512_cmp_ps_mask(hi, zero, _CMP_LT_OQ), zero);
    }
    if (g->relu_y) { /* y > 0 ? v : +0, as mp__act_grad_run */
        __mmask32 pos = mp__z_positive2(g->relu_y, g->ct, at, k);
        lo = _mm512_maskz_mov_ps((__mmask16)pos, lo);
        hi = _mm512_maskz_mov_ps((__mmask16)(pos >> 16), hi);
    }
    if (g->ct == MP_FLOAT32) mp__z_put2_masked_f32(g->c, at, k, lo, hi);
    else mp__z_put2_masked_bf16(g->c, at, k, lo, hi);
}
#endif

#if defined(MP__SIMD_AVX512)
/* The end of an AVX-512 tile other than a middle slice's, its 2 MR sums in
   t. Into C (the epilogue's, or the sums kept in C) only the tile's rows
   inside C go, and in C itself only its columns inside C are read and
   written; a block's padding takes the whole tile. */
static void mp__tile_finish(const __m512 *t, float *c, size_t ldc, const mp__tile_dest *d) {
    __mmask32 k = d->in_c && d->cols < MP__NR ? mp__z_tail(d->cols) : (__mmask32)0xFFFFFFFFu;
    size_t r, rows = d->in_c || d->g ? d->rows : (size_t)MP__MR;
    for (r = 0; r < rows; r++) {
        __m512 c_lo = d->first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps((__mmask16)k, c + r * ldc);
        __m512 c_hi = d->first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps((__mmask16)(k >> 16), c + r * ldc + 16);
        __m512 lo = _mm512_add_ps(t[2 * r], c_lo), hi = _mm512_add_ps(t[2 * r + 1], c_hi);
#ifdef MP__TILE_FUSED
        if (d->g) {
            mp__tile_epilogue(d, r, lo, hi);
            continue;
        }
#endif
        _mm512_mask_storeu_ps(c + r * ldc, (__mmask16)k, lo);
        _mm512_mask_storeu_ps(c + r * ldc + 16, (__mmask16)(k >> 16), hi);
    }
}

/* A tile at the top of a column of tiles fetches the next column's B
   sliver into L2 as it goes, as much of it a step as a step reads of its
   own (NR floats, or NR bfloat16 pairs: two cache lines). A B panel
   larger than L2 comes from L3 a sliver at a time, each sliver read by
   the MC / MR tiles of its column, the first of them waiting on L3
   otherwise: 8192 x 4096 x 4096 (a B panel of 16 MiB a thread) gains on
   2 threads, where the two share L3; on 1 thread, and where the panel
   fits (8192 x 1024 x 1024), it is the same either way (bench/gemm.c). */
static void mp__fetch_next(const mp__tile_dest *d, size_t q) {
    if (d->next) {
        mp__prefetch_l2(d->next + q * MP__NR * sizeof(float));
        mp__prefetch_l2(d->next + q * MP__NR * sizeof(float) + 64);
    }
}

/* Whether a middle slice's tile adds its sums into c as they lie: all but
   a tile in C itself that hangs over C's edge. */
static int mp__tile_adds(const mp__tile_dest *d) {
    return !d->first && !d->g && (!d->in_c || (d->rows == MP__MR && d->cols == MP__NR));
}
#endif

/* c[MR x NR] (row stride ldc) += a[kc][MR] * b[kc][NR], on to d. The SIMD
   kernels name every accumulator: compilers keep an array of vectors in
   memory. */
#if defined(MP__SIMD_AVX512)
/* The AVX-512 tiles, float32 and bfloat16: 12 rows of two zmm accumulators
   (cR0 for columns 0-15, cR1 for 16-31), added into c at the end (a middle
   slice's) or finished by mp__tile_finish. */
#define MP__TILE_ZERO                                                                         \
    __m512 z_ = _mm512_setzero_ps();                                                         \
    __m512 c00 = z_, c01 = z_, c10 = z_, c11 = z_, c20 = z_, c21 = z_, c30 = z_, c31 = z_;   \
    __m512 c40 = z_, c41 = z_, c50 = z_, c51 = z_, c60 = z_, c61 = z_, c70 = z_, c71 = z_;   \
    __m512 c80 = z_, c81 = z_, c90 = z_, c91 = z_, cA0 = z_, cA1 = z_, cB0 = z_, cB1 = z_
#define MP__TILE_EACH(OP)                                                                     \
    OP(0, c00, c01); OP(1, c10, c11); OP(2, c20, c21); OP(3, c30, c31); OP(4, c40, c41);     \
    OP(5, c50, c51); OP(6, c60, c61); OP(7, c70, c71); OP(8, c80, c81); OP(9, c90, c91);     \
    OP(10, cA0, cA1); OP(11, cB0, cB1)
#define MP__TILE_ADD(r, lo, hi)                                                               \
    _mm512_storeu_ps(c + r * ldc, _mm512_add_ps(_mm512_loadu_ps(c + r * ldc), lo));          \
    _mm512_storeu_ps(c + r * ldc + 16, _mm512_add_ps(_mm512_loadu_ps(c + r * ldc + 16), hi))
#define MP__TILE_SAVE(r, lo, hi) t[2 * r] = lo, t[2 * r + 1] = hi
#define MP__TILE_END                                      \
    if (mp__tile_adds(d)) {                               \
        MP__TILE_EACH(MP__TILE_ADD);                      \
    } else {                                              \
        __m512 t[2 * MP__MR];                             \
        MP__TILE_EACH(MP__TILE_SAVE);                     \
        mp__tile_finish(t, c, ldc, d);                    \
    }
#endif

#if !defined(MP__SIMD_AVX512) && defined(MP__SIMD_X86) && defined(__FMA__)
/* Row r of an AVX2 tile, its sums lo and hi, added into c (to +0 for the
   first slice: the same sum, -0 included). */
MP__HOT void mp__tile_add_avx2(float *c, size_t ldc, int first, size_t r, __m256 lo, __m256 hi) {
    __m256 z = _mm256_setzero_ps();
    _mm256_storeu_ps(c + r * ldc, _mm256_add_ps(first ? z : _mm256_loadu_ps(c + r * ldc), lo));
    _mm256_storeu_ps(c + r * ldc + 8, _mm256_add_ps(first ? z : _mm256_loadu_ps(c + r * ldc + 8), hi));
}
#endif

static void mp__kernel(size_t kc, const float *a, const float *b, float *c, size_t ldc, const mp__tile_dest *d) {
#if defined(MP__SIMD_AVX512) && defined(__FMA__)
    size_t q;
    MP__TILE_ZERO;
    /* A tile whose columns inside C are 16 or fewer (a product 16 wide: a
       narrow convolution's filters or channels) sums its first 16 alone,
       the same sums, and leaves the others +0: half the products and B
       loads of the whole tile. */
    if (d->cols <= 16) {
        for (q = 0; q < kc; q++, a += MP__MR, b += MP__NR) {
            __m512 b0 = _mm512_loadu_ps(b);
            mp__fetch_next(d, q);
#define MP__FMA(r, lo, hi) lo = _mm512_fmadd_ps(_mm512_set1_ps(a[r]), b0, lo)
            MP__TILE_EACH(MP__FMA);
#undef MP__FMA
        }
    }
    for (q = 0; d->cols > 16 && q < kc; q++, a += MP__MR, b += MP__NR) {
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), av;
        mp__fetch_next(d, q);
#define MP__FMA(r, lo, hi) \
    av = _mm512_set1_ps(a[r]); lo = _mm512_fmadd_ps(av, b0, lo); hi = _mm512_fmadd_ps(av, b1, hi)
        MP__TILE_EACH(MP__FMA);
#undef MP__FMA
    }
    MP__TILE_END;
#elif defined(MP__SIMD_X86) && defined(__FMA__)
    __m256 l0 = _mm256_setzero_ps(), l1 = l0, l2 = l0, l3 = l0, l4 = l0, l5 = l0; /* row r: lr, hr */
    __m256 h0 = l0, h1 = l0, h2 = l0, h3 = l0, h4 = l0, h5 = l0, av;
    size_t q;
    for (q = 0; q < kc; q++, a += MP__MR, b += MP__NR) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        av = _mm256_broadcast_ss(a + 0), l0 = _mm256_fmadd_ps(av, b0, l0), h0 = _mm256_fmadd_ps(av, b1, h0);
        av = _mm256_broadcast_ss(a + 1), l1 = _mm256_fmadd_ps(av, b0, l1), h1 = _mm256_fmadd_ps(av, b1, h1);
        av = _mm256_broadcast_ss(a + 2), l2 = _mm256_fmadd_ps(av, b0, l2), h2 = _mm256_fmadd_ps(av, b1, h2);
        av = _mm256_broadcast_ss(a + 3), l3 = _mm256_fmadd_ps(av, b0, l3), h3 = _mm256_fmadd_ps(av, b1, h3);
        av = _mm256_broadcast_ss(a + 4), l4 = _mm256_fmadd_ps(av, b0, l4), h4 = _mm256_fmadd_ps(av, b1, h4);
        av = _mm256_broadcast_ss(a + 5), l5 = _mm256_fmadd_ps(av, b0, l5), h5 = _mm256_fmadd_ps(av, b1, h5);
    }
    mp__tile_add_avx2(c, ldc, d->first, 0, l0, h0);
    mp__tile_add_avx2(c, ldc, d->first, 1, l1, h1);
    mp__tile_add_avx2(c, ldc, d->first, 2, l2, h2);
    mp__tile_add_avx2(c, ldc, d->first, 3, l3, h3);
    mp__tile_add_avx2(c, ldc, d->first, 4, l4, h4);
    mp__tile_add_avx2(c, ldc, d->first, 5, l5, h5);
#else
    float acc[MP__MR][MP__NR];
    size_t q, r, j;
    memset(acc, 0, sizeof acc);
    for (q = 0; q < kc; q++, a += MP__MR, b += MP__NR)
        for (r = 0; r < MP__MR; r++)
            for (j = 0; j < MP__NR; j++) acc[r][j] += a[r] * b[j];
    for (r = 0; r < MP__MR; r++)
        for (j = 0; j < MP__NR; j++) c[r * ldc + j] = (d->first ? 0.0f : c[r * ldc + j]) + acc[r][j];
#endif
}

#ifdef MP__BF16_DOT
/* The bfloat16 tile: vdpbf16ps adds two products per float32 lane, so a and
   b hold pairs along k: a[pairs][MR] (32 bits each), b[pairs][NR][2]. */
static void mp__kernel_bf16(size_t pairs, const uint32_t *a, const uint16_t *b, float *c, size_t ldc,
                            const mp__tile_dest *d) {
    size_t q;
    MP__TILE_ZERO;
    if (d->cols <= 16) { /* a narrow tile (mp__kernel) */
        for (q = 0; q < pairs; q++, a += MP__MR, b += 2 * MP__NR) {
            __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
            mp__fetch_next(d, q);
#define MP__DOT(r, lo, hi) lo = _mm512_dpbf16_ps(lo, (__m512bh)_mm512_set1_epi32((int)a[r]), b0)
            MP__TILE_EACH(MP__DOT);
#undef MP__DOT
        }
    }
    for (q = 0; d->cols > 16 && q < pairs; q++, a += MP__MR, b += 2 * MP__NR) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32), av;
        mp__fetch_next(d, q);
#define MP__DOT(r, lo, hi)                                   \
    av = (__m512bh)_mm512_set1_epi32((int)a[r]);            \
    lo = _mm512_dpbf16_ps(lo, av, b0); hi = _mm512_dpbf16_ps(hi, av, b1)
        MP__TILE_EACH(MP__DOT);
#undef MP__DOT
    }
    MP__TILE_END;
}
#endif

#ifdef MP__AMX
/* c[32 x 32] (row stride ldc floats; 16 x 32 when !two) = (first ? 0 : c) +
   a b over `steps` tiles of K: a as mp__pack_amx_a lays it out (the second
   16 rows a_next further on), b a panel of 32 columns of pairs
   (mp__pack_pairs, [steps 16][32]). The tiles carry c's sums through the
   slice's products, or, `apart`, sum the slice from +0 and add it to c
   after, as the other kernels do (mp__amx_apart). The tile numbers are the
   instructions' immediates. */
static void mp__kernel_amx(size_t steps, const uint32_t *a, size_t a_next, const uint32_t *b, float *c, size_t ldc,
                           int first, int two, int apart) {
    const size_t row_bytes = ldc * sizeof(float);
    float *c2 = c + 16 * ldc, sums[32 * 32];
    size_t s, r;
    /* GCC's tile loads do not tell the compiler that they read memory:
       the packs' stores stay before them (its tile stores say they write). */
    __asm__ volatile("" ::: "memory");
    if (first || apart) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c, row_bytes);
        _tile_loadd(1, c + 16, row_bytes);
        if (two) {
            _tile_loadd(2, c2, row_bytes);
            _tile_loadd(3, c2 + 16, row_bytes);
        }
    }
    for (s = 0; s < steps; s++, a += 256, b += 2 * 256) {
        _tile_loadd(6, b, 2 * 64);
        _tile_loadd(7, b + 16, 2 * 64);
        _tile_loadd(4, a, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
            _tile_loadd(5, a + a_next, 64);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    if (first || !apart) {
        _tile_stored(0, c, row_bytes);
        _tile_stored(1, c + 16, row_bytes);
        if (two) {
            _tile_stored(2, c2, row_bytes);
            _tile_stored(3, c2 + 16, row_bytes);
        }
        return;
    }
    _tile_stored(0, sums, 32 * sizeof(float));
    _tile_stored(1, sums + 16, 32 * sizeof(float));
    if (two) {
        _tile_stored(2, sums + 16 * 32, 32 * sizeof(float));
        _tile_stored(3, sums + 16 * 32 + 16, 32 * sizeof(float));
    }
    __asm__ volatile("" ::: "memory"); /* the vector loads after the tile stores */
    for (r = 0; r < (two ? 32u : 16u); r++) {
        _mm512_storeu_ps(c + r * ldc, _mm512_add_ps(_mm512_loadu_ps(c + r * ldc), _mm512_loadu_ps(sums + r * 32)));
        _mm512_storeu_ps(c + r * ldc + 16,
                         _mm512_add_ps(_mm512_loadu_ps(c + r * ldc + 16), _mm512_loadu_ps(sums + r * 32 + 16)));
    }
}

/* One K slice of the block: mc rows of A tiles times ncp columns of B's
   panels, into the float32 block c (row stride ncp), a B panel's 32
   columns at a time (it stays in L1 while the A tiles pass). */
static void mp__block_amx(const uint32_t *a, const uint32_t *b, float *c, size_t mc, size_t ncp, size_t steps,
                          int first, int apart) {
    size_t ir, jr, group = steps * 256; /* a 16-row group of A tiles, in pairs */
    for (jr = 0; jr < ncp; jr += MP__NR)
        for (ir = 0; ir < mc; ir += 32)
            mp__kernel_amx(steps, a + ir / 16 * group, group, b + jr * steps * MP__AMX_PAIRS, c + ir * ncp + jr, ncp,
                           first, ir + 16 < mc, apart);
}

/* The rows of an AMX block of ncp columns K deep: MC, or where the B panel
   is larger than MP__AMX_FAR as many whole 32-row tiles as keep the
   float32 sums in the MC x NC block, up to MP__AMX_MC. */
static size_t mp__amx_rows(size_t ncp, size_t k) {
    size_t rows = (size_t)MP__MC * MP__NC / ncp / 32 * 32;
    return (k + 1) / 2 * ncp * sizeof(uint32_t) <= MP__AMX_FAR || rows < MP__MC ? (size_t)MP__MC : mp__min(rows, MP__AMX_MC);
}

/* The block's mc rows of sums through the epilogue into C, where it can
   run in the kernels (mp__tile_fusable), with the panel's bias in float32
   (d: the block's corner, the bias, the columns in C), a row at a time.
   The generic epilogue widened a bfloat16 bias again for every row (a
   quarter of a batch-8192 mixed_bfloat16 step's products); running each
   32 x 32 of tiles through it from an L1 buffer as the last slice left it
   cost a product of 8192 x 1024 x 1024 a third more time (the vector
   loads wait for the tile stores). */
static void mp__block_epilogue(const mp__tile_dest *d, const float *c, size_t mc, size_t ncp) {
    mp__tile_dest t = *d; /* d's 32 columns at jr */
    size_t r, jr;
    for (r = 0; r < mc; r++)
        for (jr = 0; jr < ncp; jr += MP__NR) {
            t.col = d->col + jr, t.cols = mp__min(MP__NR, d->cols - jr), t.bias = d->bias ? d->bias + jr : NULL;
            mp__tile_epilogue(&t, r, _mm512_loadu_ps(c + r * ncp + jr), _mm512_loadu_ps(c + r * ncp + jr + 16));
        }
}
#endif

/* >>matmul: paths. The epilogues, a K slice's tiles, and the three ways a
   thread runs its part of C (in place, sums in C, blocked), chosen by
   mp__gemm_plan_of. */

/* Row r of the C block (nc sums) into C: + C, + bias, the pre-activation,
   the activation, one rounding. */
static void mp__epilogue(const mp_gemm_args *g, float *acc, float *tmp, size_t row, size_t j0, size_t nc) {
    size_t at = row * g->n + j0;
    if (g->accumulate) {
        mp__load(tmp, mp__at(g->c, g->ct, at), g->ct, nc);
        mp__add_run(acc, tmp, nc);
    }
    if (g->bias) {
        mp__load(tmp, mp__at(g->bias, g->biast, j0), g->biast, nc);
        mp__add_run(acc, tmp, nc);
    }
    if (g->z) mp__store(mp__at_mut(g->z, g->ct, at), g->ct, acc, nc);
    mp__act_run(g->act, acc, nc);
    if (g->relu_y) mp__relu_grad_run(acc, g->relu_y, g->ct, at, nc);
    mp__store(mp__at_mut(g->c, g->ct, at), g->ct, acc, nc);
}

/* op(B)[p0 .. p0+kc, j0 .. j0+nc] into panels of NR columns at out, each
   `depth` rows deep (pairs of rows for the bfloat16 kernels). */
static void mp__pack_b_slice(const mp_gemm_args *g, mp__gemm_ws *ws, float *out, size_t ldb, size_t j0, size_t nc,
                             size_t p0, size_t kc, size_t depth) {
#ifdef MP__BF16_DOT
    if (mp__gemm_bf16(g)) {
        mp__pack_pairs((uint32_t *)out, MP__NR, g->trans_b, g->b, ldb, j0, nc, p0, kc, depth);
        return;
    }
#else
    (void)depth;
#endif
    mp__pack(out, ws->tmp, MP__NR, g->trans_b, g->b, g->bt, ldb, j0, nc, p0, kc);
}

/* The depth of a K slice of kc values as its panels hold it: kc floats,
   or its pairs, padded to whole tiles for AMX. */
static size_t mp__slice_depth(size_t kc, int pairs, int amx) {
    size_t depth = pairs ? (kc + 1) / 2 : kc;
#ifdef MP__AMX
    if (amx) depth = mp__round_up(depth, MP__AMX_PAIRS);
#else
    (void)amx;
#endif
    return depth;
}

/* The epilogue of a block computed as the transpose (mp__swap_dims): its
   mc rows are all of C's columns (mc = n <= MR, one block), its nc columns
   C's rows j0 ..: those rows are one contiguous run of C, put back in tmp a
   few rows at a time, + bias, the activation, one rounding (mp__epilogue's
   order; the transpose is taken only without accumulate or z). */
static void mp__epilogue_transposed(const mp_gemm_args *g, const float *block, size_t ncp, float *tmp, size_t mc,
                                    size_t j0, size_t nc) {
    float bias[MP__MR];
    size_t c, r, rr, per = MP__TMP / mc, len;
    if (g->bias) mp__load(bias, g->bias, g->biast, mc);
    for (c = 0; c < nc; c += len) {
        len = mp__min(per, nc - c);
        for (rr = 0; rr < len; rr++) {
            for (r = 0; r < mc; r++) tmp[rr * mc + r] = block[r * ncp + c + rr];
            if (g->bias) mp__add_run(tmp + rr * mc, bias, mc);
        }
        mp__act_run(g->act, tmp, len * mc);
        if (g->relu_y) mp__relu_grad_run(tmp, g->relu_y, g->ct, (j0 + c) * mc, len * mc);
        mp__store(mp__at_mut(g->c, g->ct, (j0 + c) * mc), g->ct, tmp, len * mc);
    }
}

/* The tile after (ir, jr) in a block of mc rows and ncp columns: down a
   column of tiles, which keeps one B sliver in L1, or along a row of tiles
   (rows_first: shallow slivers and the slice that finishes into C, at
   MP__SHALLOW). Past the block, ir >= mc or jr >= ncp. */
static void mp__next_tile(size_t *ir, size_t *jr, size_t mc, size_t ncp, int rows_first) {
    size_t *inner = rows_first ? jr : ir, *outer = rows_first ? ir : jr;
    *inner += rows_first ? MP__NR : MP__MR;
    if (*inner < (rows_first ? ncp : mc)) return;
    *inner = 0;
    *outer += rows_first ? MP__MR : MP__NR;
}

/* The panel's bias (nc values at column j0) in float32, 0 up to whole
   tiles, for the kernels' epilogue. */
static void mp__panel_bias(const mp_gemm_args *g, float *bias, size_t j0, size_t nc) {
    mp__load(bias, mp__at(g->bias, g->biast, j0), g->biast, nc);
    memset(bias + nc, 0, (mp__round_up(nc, MP__NR) - nc) * sizeof(float));
}

/* One K slice of mc rows (op(A)'s tiles packed at a, a tile's rows
   a_stride floats after the tile above's) by nc columns (op(B)'s panels
   at `slice`), `depth` deep, through the kernels into c (row stride ldc)
   at C's row i0 and column j0: d says first, g, bias (the panel's, or
   NULL) and in_c; the tiles' places are set here. */
static void mp__slice_tiles(const float *a, size_t a_stride, const float *slice, float *c, size_t ldc, size_t depth,
                            int pairs, int rows_first, const float *bias, size_t i0, size_t mc, size_t j0, size_t nc,
                            mp__tile_dest *d) {
    size_t ir, jr, ncp = mp__round_up(nc, MP__NR);
    for (ir = jr = 0; ir < mc && jr < ncp; mp__next_tile(&ir, &jr, mc, ncp, rows_first)) {
        float *tile = c + ir * ldc + jr;
        d->bias = bias ? bias + jr : NULL;
        d->row = i0 + ir, d->col = j0 + jr;
        d->rows = mp__min(MP__MR, mc - ir), d->cols = mp__min(MP__NR, nc - jr);
        d->next = !rows_first && ir == 0 && jr + MP__NR < ncp ? (const char *)(slice + (jr + MP__NR) * depth) : NULL;
#ifdef MP__BF16_DOT
        if (pairs) {
            mp__kernel_bf16(depth, (const uint32_t *)a + ir * a_stride, (const uint16_t *)(slice + jr * depth), tile,
                            ldc, d);
            continue;
        }
#else
        (void)pairs;
#endif
        mp__kernel(depth, a + ir * a_stride, slice + jr * depth, tile, ldc, d);
    }
}

#ifdef MP__TILE_FUSED
/* The pairs of a narrow B (n <= 16) packed whole for AMX's in-place
   product (mp__pack_amx_narrow_b): 16 columns of ceil(k / 2) pairs, whole
   16-pair steps. That product runs only where these fit the panel the
   product reserves anyway (mp__in_place), so that no B panel grows for
   it, on any machine: reserved for every n <= 16, they grew with K, and
   the conv net's last layer (Dense(1) over 123,008 inputs at
   examples/conv_memory's image size 32) raised its peak by megabytes, on
   machines without AMX too, past the ratio of mixed_float16's peak to
   float32's that examples/conv_memory reports. */
static size_t mp__narrow_pairs_floats(size_t k) { return mp__round_up((k + 1) / 2, 16) * 16; }
#endif

/* A narrow product with float32 operands, or bfloat16 ones on AMX, as
   they lie, op(A) = A and op(B) = B, n <= 16 (a 10-class layer's
   forward; float32 up to MP__IN_PLACE_N, mp__kernel_in_place_wide): every
   element of A feeds one tile, so packing A (a transpose, about three
   copies, of an A that comes from memory at a batch of 8192) cost more
   than its sums. Here each float32 tile of MR rows broadcasts
   its values straight from A's rows, MR runs the hardware prefetchers
   follow, against B's rows under a mask, and AMX loads its A tiles from
   A's rows (16 at a time) against B's pairs, packed once; vdpbf16ps's
   tiles broadcast A's pairs from its rows likewise, for n up to
   MP__IN_PLACE_N (mp__kernel_in_place_bf16); the sums are the
   packed kernels' (and their transpose's, mp__swap_dims). Against the
   transpose, the 10-class forward (8192 x 10 x 1024 and 128 x 10 x 1024)
   takes about half the time in float32 and less still in bfloat16 on AMX,
   on 1 and 2 threads (bench/gemm.c's MLP step rows). */
static int mp__in_place(const mp_gemm_args *g) {
#ifdef MP__TILE_FUSED
    int f32 = g->at == MP_FLOAT32 && g->bt == MP_FLOAT32 && g->m >= MP__MR && g->n <= MP__IN_PLACE_N;
    int amx = mp__gemm_bf16(g) && g->n <= 16 && g->m >= 16 && mp__amx_usable() &&
              mp__narrow_pairs_floats(g->k) <= mp__panel_floats(g->m, g->k, g->n);
    int pairs = mp__gemm_bf16(g) && !mp__amx_usable() && g->m >= MP__MR && g->n <= MP__IN_PLACE_N &&
                (g->k + 1) / 2 * mp__round_up(g->n, MP__NR) <= mp__panel_floats(g->m, g->k, g->n);
    return !g->trans_a && !g->trans_b && g->k > 0 && (f32 || amx || pairs);
#else
    (void)g;
    return 0;
#endif
}

#ifdef MP__TILE_FUSED
/* The sums of rows i0 .. i0+MR of A by B into t (MR rows of two halves,
   the second 0), over all of K a KC slice at a time as the blocked kernels
   sum it: each slice from +0 in cR0, added to the sums before it in cR1 (t
   + c; mp__tile_finish's first slice adds +0), so that every sum is
   theirs. Four row pointers step along K and reach the rows between them
   at lda and 2 lda: the compiler keeps them all in registers. */
static void mp__kernel_in_place(const mp_gemm_args *g, size_t i0, __m512 *t) {
    size_t lda = g->k, ldb = g->n, p0, q;
    const float *a0 = (const float *)g->a + i0 * lda, *a3 = a0 + 3 * lda, *a6 = a3 + 3 * lda, *a9 = a6 + 3 * lda;
    const float *b = (const float *)g->b;
    __mmask16 cols = (__mmask16)mp__z_tail(g->n);
    MP__TILE_ZERO;
    for (p0 = 0; p0 < g->k; p0 += MP__KC) {
        size_t kc = mp__min(MP__KC, g->k - p0);
        for (q = 0; q < kc; q++, a0++, a3++, a6++, a9++, b += ldb) {
            __m512 b0 = _mm512_maskz_loadu_ps(cols, b);
#define MP__FMA(r, s, sums) \
    s = _mm512_fmadd_ps(_mm512_set1_ps(((r) < 3 ? a0 : (r) < 6 ? a3 : (r) < 9 ? a6 : a9)[(r) % 3 * lda]), b0, s)
            MP__TILE_EACH(MP__FMA);
#undef MP__FMA
        }
#define MP__ADD_SLICE(r, s, sums) sums = _mm512_add_ps(s, sums), s = z_
        MP__TILE_EACH(MP__ADD_SLICE);
#undef MP__ADD_SLICE
    }
#define MP__SAVE(r, s, sums) t[2 * r] = sums, t[2 * r + 1] = z_
    MP__TILE_EACH(MP__SAVE);
#undef MP__SAVE
}

/* The end of an in-place tile's K slice whose sums are both halves of each
   row: into t (the first slice's) or added to t, the accumulators back to
   +0. */
#define MP__T_SAVE(r, lo, hi) t[2 * r] = lo, t[2 * r + 1] = hi, lo = hi = z_
#define MP__T_ADD(r, lo, hi) \
    t[2 * r] = _mm512_add_ps(lo, t[2 * r]), t[2 * r + 1] = _mm512_add_ps(hi, t[2 * r + 1]), lo = hi = z_
#define MP__SLICE_INTO_T(first)         \
    do {                                \
        if (first) {                    \
            MP__TILE_EACH(MP__T_SAVE);  \
        } else {                        \
            MP__TILE_EACH(MP__T_ADD);   \
        }                               \
    } while (0)

/* The same for the tile of `cols` <= NR columns from column j0 of a product
   up to MP__IN_PLACE_N wide: both halves of each row, B's rows under two
   masks, each slice from +0, the first into t and each after it added to
   t (mp__tile_finish adds the +0 the packed tiles' first slice adds, so a
   zero's sign comes out as theirs): mp__kernel's wide tile's operations in
   its order, without the transposing pack of A that the convolutions' columns
   of 32 and 64 filters (and their input gradients' columns of dy) paid for
   one or two uses of each value (bench/convnet.c --model resnet). */
static void mp__kernel_in_place_wide(const mp_gemm_args *g, size_t i0, size_t j0, size_t cols, __m512 *t) {
    size_t lda = g->k, ldb = g->n, p0, q;
    const float *a0 = (const float *)g->a + i0 * lda, *a3 = a0 + 3 * lda, *a6 = a3 + 3 * lda, *a9 = a6 + 3 * lda;
    const float *b = (const float *)g->b + j0;
    __mmask16 k0 = (__mmask16)mp__z_tail(mp__min(cols, 16)), k1 = (__mmask16)(cols > 16 ? mp__z_tail(cols - 16) : 0);
    __m512 b0, b1, av;
    MP__TILE_ZERO;
    for (p0 = 0; p0 < g->k; p0 += MP__KC) {
        size_t kc = mp__min(MP__KC, g->k - p0);
        for (q = 0; q < kc; q++, a0++, a3++, a6++, a9++, b += ldb) {
            b0 = _mm512_maskz_loadu_ps(k0, b), b1 = _mm512_maskz_loadu_ps(k1, b + 16);
#define MP__FMA(r, lo, hi)                                                          \
    av = _mm512_set1_ps(((r) < 3 ? a0 : (r) < 6 ? a3 : (r) < 9 ? a6 : a9)[(r) % 3 * lda]); \
    lo = _mm512_fmadd_ps(av, b0, lo), hi = _mm512_fmadd_ps(av, b1, hi)
            MP__TILE_EACH(MP__FMA);
#undef MP__FMA
        }
        MP__SLICE_INTO_T(p0 == 0);
    }
}

#ifdef MP__BF16_DOT
/* mp__kernel_in_place for bfloat16 A and B on vdpbf16ps (where AMX does
   not run), a tile of `cols` <= NR columns: each step broadcasts a pair of
   K's values, q and q + 1 (q in the low half: x86 is little-endian),
   straight from each of A's MR rows against a row of the tile's B panel
   (b: `width` pairs a row, packed once for all of K), over all of K a slice
   of 2 KC values at a time, each from +0, the first into t and each after
   it added to t (mp__tile_finish adds the +0 the packed tiles' first slice
   adds, so a zero's sign comes out as theirs); an odd K's last value goes
   alone, the other half 0, as the packs pad it.
   These are mp__kernel_bf16's operations on the same pairs in the same
   order (its narrow tile's up to 16 columns), without the transposing pack
   of A that the convolutions' columns of 16, 32 and 64 filters (and their
   input gradients' columns of dy) paid for one or two uses of each value
   (bench/convnet.c --model resnet). */
MP__HOT int mp__pair_at(const uint16_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return (int)v;
}
static void mp__kernel_in_place_bf16(const mp_gemm_args *g, const uint32_t *b, size_t width, size_t i0, size_t cols,
                                     __m512 *t) {
    size_t lda = g->k, p0, q, kc;
    const uint16_t *a0 = (const uint16_t *)g->a + i0 * lda, *a3 = a0 + 3 * lda, *a6 = a3 + 3 * lda, *a9 = a6 + 3 * lda;
    __m512bh b0, b1, av;
    MP__TILE_ZERO;
#define MP__ROW(r) (((r) < 3 ? a0 : (r) < 6 ? a3 : (r) < 9 ? a6 : a9) + (r) % 3 * lda)
#define MP__PAIR(r) mp__pair_at(MP__ROW(r))
#define MP__LAST(r) ((int)*MP__ROW(r))
#define MP__DOT_NARROW(r, lo, hi) lo = _mm512_dpbf16_ps(lo, (__m512bh)_mm512_set1_epi32(MP__VALUE(r)), b0)
#define MP__DOT_WIDE(r, lo, hi)                                \
    av = (__m512bh)_mm512_set1_epi32(MP__VALUE(r));            \
    lo = _mm512_dpbf16_ps(lo, av, b0), hi = _mm512_dpbf16_ps(hi, av, b1)
    for (p0 = 0; p0 < g->k; p0 += kc) {
        kc = mp__min(2 * MP__KC, g->k - p0);
#define MP__VALUE MP__PAIR
        if (cols <= 16)
            for (q = 0; q + 1 < kc; q += 2, a0 += 2, a3 += 2, a6 += 2, a9 += 2, b += width) {
                b0 = (__m512bh)_mm512_loadu_si512(b);
                MP__TILE_EACH(MP__DOT_NARROW);
            }
        else
            for (q = 0; q + 1 < kc; q += 2, a0 += 2, a3 += 2, a6 += 2, a9 += 2, b += width) {
                b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
                MP__TILE_EACH(MP__DOT_WIDE);
            }
#undef MP__VALUE
#define MP__VALUE MP__LAST
        if (q < kc) { /* the last slice's (2 KC is even) */
            b0 = (__m512bh)_mm512_loadu_si512(b);
            if (cols <= 16) {
                MP__TILE_EACH(MP__DOT_NARROW);
            } else {
                b1 = (__m512bh)_mm512_loadu_si512(b + 16);
                MP__TILE_EACH(MP__DOT_WIDE);
            }
        }
#undef MP__VALUE
        MP__SLICE_INTO_T(p0 == 0);
    }
#undef MP__ROW
#undef MP__PAIR
#undef MP__LAST
#undef MP__DOT_NARROW
#undef MP__DOT_WIDE
}
#endif

#ifdef MP__AMX
/* One step of 32 values of K for up to four groups of 16 rows of A (the
   group's tile at a[j], its rows `stride` bytes apart) by B's tile at b,
   each into its own C tile: four chains of tdpbf16ps in flight, where one
   chain waits on each tdpbf16ps before (128 x 10 x 1024, 1 thread: 6.2
   us with one group at a time, 5.6 with four). */
static void mp__in_place_step(const uint16_t *const *a, size_t stride, const uint32_t *b, size_t groups) {
    _tile_loadd(6, b, 64);
    _tile_loadd(4, a[0], stride);
    _tile_dpbf16ps(0, 4, 6);
    if (groups > 1) {
        _tile_loadd(5, a[1], stride);
        _tile_dpbf16ps(1, 5, 6);
    }
    if (groups > 2) {
        _tile_loadd(7, a[2], stride);
        _tile_dpbf16ps(2, 7, 6);
    }
    if (groups > 3) {
        _tile_loadd(4, a[3], stride);
        _tile_dpbf16ps(3, 4, 6);
    }
}

/* Groups of 16 rows of A (bfloat16), group j from row tops[j], by B, its
   pairs at b (mp__pack_amx_narrow_b), into sums (16 x 16 floats a group),
   each over all of K in one tile as the packed tiles carry it from slice
   to slice through the float32 block: A's tiles loaded from its rows (each
   is used once), the last step's values past K read as +0 from a copy, as
   the packed tiles pad K. */
static void mp__kernel_in_place_amx(const mp_gemm_args *g, const uint32_t *b, const size_t *tops, size_t groups,
                                    float *sums) {
    const uint16_t *a[4], *tail_tiles[4];
    size_t steps = g->k / 32, rest = g->k % 32, s, r, j;
    uint16_t tail[4][16 * 32];
    for (j = 0; j < 4; j++) {
        a[j] = (const uint16_t *)g->a + tops[j < groups ? j : 0] * g->k;
        tail_tiles[j] = tail[j];
    }
    __asm__ volatile("" ::: "memory"); /* the pack's stores before the tile loads (mp__kernel_amx) */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (s = 0; s < steps; s++) {
        mp__in_place_step(a, g->k * sizeof(uint16_t), b + 256 * s, groups);
        for (j = 0; j < 4; j++) a[j] += 32;
    }
    if (rest) {
        for (j = 0; j < groups; j++)
            for (r = 0; r < 16; r++)
                _mm512_storeu_si512(tail[j] + 32 * r, _mm512_maskz_loadu_epi16(mp__z_tail(rest), a[j] + r * g->k));
        __asm__ volatile("" ::: "memory");
        mp__in_place_step(tail_tiles, 64, b + 256 * steps, groups);
    }
    _tile_stored(0, sums, 64);
    _tile_stored(1, sums + 256, 64);
    _tile_stored(2, sums + 512, 64);
    _tile_stored(3, sums + 768, 64);
}
#endif

#ifdef MP__BF16_DOT
/* B (k x n bfloat16, n <= 16) as AMX B tiles (and as vdpbf16ps's in-place
   tile reads it), `depth` pairs of rows:
   pair p is B[2p][j] | B[2p + 1][j] << 16 in word j, 0 past n and K: the
   layout mp__pack_pairs gives at width 16, a row of pairs a vector where
   its part rows took half of 128 x 10 x 1024's time on 1 thread. (g++'s
   false positive on `_mm512_undefined`: mp__transpose16.) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
static void mp__pack_amx_narrow_b(uint32_t *out, const uint16_t *b, size_t k, size_t n, size_t depth) {
    __mmask16 cols = (__mmask16)mp__z_tail(n);
    size_t p;
    for (p = 0; p < depth; p++) {
        __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(2 * p < k ? cols : 0, b + 2 * p * n));
        __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(2 * p + 1 < k ? cols : 0, b + (2 * p + 1) * n));
        _mm512_storeu_si512(out + 16 * p, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#ifdef MP__AMX
/* Rows m0 .. m1 of a bfloat16 in-place product on AMX, on to d (set up
   by mp__gemm_in_place; d->g NULL where the epilogue cannot run in the
   kernels): B's pairs packed once (each thread its own), then up to 64
   rows of A at a time; a group that would pass C's last row sums C's last
   16 rows instead (as mp__gemm_in_place's tiles), and only its rows inside
   [m0, m1) go on. */
static void mp__gemm_in_place_amx(const mp_gemm_args *g, mp__gemm_ws *ws, size_t m0, size_t m1, mp__tile_dest *d) {
    float sums[4 * 256];
    size_t i0, j, r, groups, tops[4];
    mp__pack_amx_narrow_b((uint32_t *)ws->b, (const uint16_t *)g->b, g->k, g->n, mp__narrow_pairs_floats(g->k) / 16);
    mp__amx_begin();
    for (i0 = m0; i0 < m1; i0 += 4 * 16) {
        groups = mp__min(4, (m1 - i0 + 15) / 16); /* fewer only in the last pass */
        for (j = 0; j < groups; j++) tops[j] = mp__min(i0 + 16 * j, g->m - 16);
        mp__kernel_in_place_amx(g, (const uint32_t *)ws->b, tops, groups, sums);
        for (j = 0; j < groups; j++) {
            size_t first = i0 + 16 * j - tops[j], rows = mp__min(16, m1 - i0 - 16 * j);
            d->row = tops[j];
            for (r = first; r < first + rows; r++) {
                float *sum = sums + 256 * j + 16 * r;
                if (d->g) mp__tile_epilogue(d, r, _mm512_loadu_ps(sum), _mm512_setzero_ps());
                else mp__epilogue(g, sum, ws->tmp, tops[j] + r, 0, g->n);
            }
        }
    }
    _tile_release();
}
#endif

/* Rows m0 .. m1 of an in-place product (mp__in_place; bfloat16 on AMX:
   mp__gemm_in_place_amx), a tile at a time through mp__tile_finish: the
   epilogue in the kernels where it can run there, else from a float32
   block through mp__epilogue. A tile that would pass C's last row sums
   C's last MR rows instead (reading A is free to cross into another
   thread's rows), and only the tile's rows inside [m0, m1) go on. */
static void mp__gemm_in_place(const mp_gemm_args *g, mp__gemm_ws *ws, size_t m0, size_t m1) {
    __m512 t[2 * MP__MR];
    float bias[MP__IN_PLACE_N];
    int fused = mp__tile_fusable(g);
    size_t i0, r, top, jr, pairs = (g->k + 1) / 2, width = g->n <= 16 ? 16 : MP__NR;
    mp__tile_dest d;
    if (fused && g->bias) mp__panel_bias(g, bias, 0, g->n);
    d.first = 1, d.g = fused ? g : NULL, d.bias = fused && g->bias ? bias : NULL;
    d.col = 0, d.cols = g->n, d.in_c = 0, d.next = NULL;
#ifdef MP__AMX
    if (g->at == MP_BFLOAT16 && mp__amx_usable()) {
        mp__gemm_in_place_amx(g, ws, m0, m1, &d);
        return;
    }
#endif
#ifdef MP__BF16_DOT
    /* B's pairs packed once (each thread its own): 16 columns, or panels of NR */
    if (g->at == MP_BFLOAT16 && width == 16)
        mp__pack_amx_narrow_b((uint32_t *)ws->b, (const uint16_t *)g->b, g->k, g->n, pairs);
    else if (g->at == MP_BFLOAT16)
        mp__pack_pairs((uint32_t *)ws->b, MP__NR, 0, g->b, g->n, 0, g->n, 0, g->k, pairs);
#else
    (void)pairs, (void)width;
#endif
    for (i0 = m0; i0 < m1; i0 += MP__MR)
        for (jr = 0; jr < g->n; jr += MP__NR) {
            top = mp__min(i0, g->m - MP__MR);
            d.row = i0, d.rows = mp__min(MP__MR, m1 - i0);
            d.col = jr, d.cols = mp__min(MP__NR, g->n - jr), d.bias = fused && g->bias ? bias + jr : NULL;
#ifdef MP__BF16_DOT
            if (g->at == MP_BFLOAT16)
                mp__kernel_in_place_bf16(g, (const uint32_t *)ws->b + jr * pairs, width, top, d.cols, t);
            else
#endif
            if (g->n > 16)
                mp__kernel_in_place_wide(g, top, jr, d.cols, t);
            else
                mp__kernel_in_place(g, top, t);
            if (fused) {
                mp__tile_finish(t + 2 * (i0 - top), ws->c, MP__NR, &d);
                continue;
            }
            mp__tile_finish(t, ws->c, MP__NR, &d); /* all MR rows into the block */
            for (r = i0 - top; r < i0 - top + d.rows; r++)
                mp__epilogue(g, ws->c + r * MP__NR, ws->tmp, top + r, jr, d.cols);
        }
}
#endif

/* Whether a product keeps its float32 sums in C itself, for its part
   C[m0..m1, n0..n1), a K slice at a time across all of it
   (mp__gemm_in_c), where the blocked order keeps a block of MC rows in L2
   over all of K and reads the whole K x NC panel of op(B) again for every
   block. That takes more than one slice, float32 C with its epilogue in
   the kernels, and a C small enough to stay in L3 (MP__IN_C_FLOATS) while
   the slices pass: a weight gradient, whose K is the batch. Every sum is the same, in the same order:
   C is the block. Where the threads split C, each must keep to whole cache
   lines of it (C on a line, its rows whole lines): their sums are written
   every slice, and a line that two threads write would pass between their
   caches every slice (12 x 128 x 21142 on 2 threads with C from malloc
   was slower so than in the blocked order). */
/* Whether C, and so each of its rows, starts on a 64-byte line: threads
   that split C at whole tiles then never write one line between them. */
static int mp__rows_on_lines(const mp_gemm_args *g) {
    return (uintptr_t)g->c % 64 == 0 && g->n * mp__dtypes[g->ct].size % 64 == 0;
}
static int mp__sums_in_c(const mp_gemm_args *g, size_t m0, size_t m1, size_t n0, size_t n1) {
#ifdef MP__TILE_FUSED
    int all_of_c = m0 == 0 && m1 == g->m && n0 == 0 && n1 == g->n;
    int own_lines = all_of_c || mp__rows_on_lines(g);
    return g->ct == MP_FLOAT32 && !mp__gemm_bf16(g) && g->k > MP__KC && mp__tile_fusable(g) && own_lines &&
           (m1 - m0) * (n1 - n0) <= MP__IN_C_FLOATS;
#else
    (void)g, (void)m0, (void)m1, (void)n0, (void)n1;
    return 0;
#endif
}

/* C[m0..m1, n0..n1) of g where C holds the sums (mp__sums_in_c): for each
   K slice, each panel of op(B)'s slice packed once, each block of op(A)'s
   packed once a panel, the tiles added into C; the last slice's tiles run
   the epilogue as they leave. */
static void mp__gemm_in_c(const mp_gemm_args *g, mp__gemm_ws *ws, size_t m0, size_t m1, size_t n0, size_t n1) {
    size_t panel = mp__panel_cols(MP__KC, n1 - n0, ws->b_cap);
    size_t lda = g->trans_a ? g->m : g->k, ldb = g->trans_b ? g->k : g->n;
    size_t p0, i0, j0;
    float bias[MP__NC];
    mp__tile_dest d;
    d.in_c = 1;
    for (p0 = 0; p0 < g->k; p0 += MP__KC) {
        size_t kc = mp__min(MP__KC, g->k - p0);
        int last = p0 + kc >= g->k;
        d.first = p0 == 0, d.g = last ? g : NULL;
        for (j0 = n0; j0 < n1; j0 += panel) {
            size_t nc = mp__min(panel, n1 - j0);
            mp__pack_b_slice(g, ws, ws->b, ldb, j0, nc, p0, kc, kc);
            if (last && g->bias) mp__panel_bias(g, bias, j0, nc);
            for (i0 = m0; i0 < m1; i0 += MP__MC) {
                size_t mc = mp__min(MP__MC, m1 - i0);
                mp__pack(ws->a, ws->tmp, MP__MR, !g->trans_a, g->a, g->at, lda, i0, mc, p0, kc);
                mp__slice_tiles(ws->a, kc, ws->b, (float *)g->c + i0 * g->n + j0, g->n, kc, 0, last,
                                g->bias ? bias : NULL, i0, mc, j0, nc, &d);
            }
        }
    }
}

/* The columns of op(A) a block of mc rows packs at once, from a multiple
   of them: one K slice, or where the pack transposes float32 rows (op(A)
   not transposed) as many whole slices as the A block holds, so that it
   reads a run of 4 KiB a row, long enough for the hardware prefetchers,
   which barely start on a slice's 1 KiB: packing 8192 x 1024 from L3, a
   block of 96 rows at a time, is several times faster 1024 columns at a
   time than 256 (bench/gemm.c's batch-8192 step). */
static size_t mp__a_span(const mp_gemm_args *g, size_t mc) {
    if (g->trans_a || g->at != MP_FLOAT32) return MP__KC;
    return MP__A_FLOATS / mp__round_up(mc, MP__MR) / MP__KC * MP__KC;
}

/* What runs a part of C, as the decision table at the head of >>matmul
   says: the path, and for the blocked path its kernel (and so its packers:
   mp__pack for the float32 tiles, mp__pack_pairs for vdpbf16ps's,
   mp__pack_amx_a and mp__pack_pairs for AMX's) and its sizes. */
typedef enum mp__gemm_path {
    MP__PATH_IN_PLACE,  /* mp__gemm_in_place: A and B read where they lie */
    MP__PATH_SUMS_IN_C, /* mp__gemm_in_c: C holds the float32 sums */
    MP__PATH_BLOCKED    /* mp__gemm_blocked: BLIS's loops */
} mp__gemm_path;
typedef enum mp__gemm_kernel {
    MP__KERNEL_FLOAT32, /* mp__kernel: operands widened to float32 */
    MP__KERNEL_PAIRS,   /* mp__kernel_bf16: vdpbf16ps on bfloat16 pairs */
    MP__KERNEL_AMX      /* mp__kernel_amx: tdpbf16ps on AMX tiles */
} mp__gemm_kernel;
typedef struct mp__gemm_plan {
    mp__gemm_path path;
    mp__gemm_kernel kernel;
    int one_block; /* the rows fit one MC block: op(B) is packed a slice at a time */
    int fused;     /* the epilogue runs in the kernels (mp__tile_fusable) */
    size_t kc_max; /* values of K a slice: KC, or 2 KC as bfloat16 pairs */
    size_t panel;  /* columns of op(B) a panel */
} mp__gemm_plan;

/* The plan for C[m0..m1, n0..n1) of g; orig as for mp__gemm_region. */
static mp__gemm_plan mp__gemm_plan_of(const mp_gemm_args *g, const mp_gemm_args *orig, const mp__gemm_ws *ws,
                                      size_t m0, size_t m1, size_t n0, size_t n1) {
    mp__gemm_plan p;
    p.kernel = !mp__gemm_bf16(g) ? MP__KERNEL_FLOAT32 : mp__amx_usable() ? MP__KERNEL_AMX : MP__KERNEL_PAIRS;
    p.one_block = m1 - m0 <= MP__MC;
    p.fused = !orig && g->k && mp__tile_fusable(g); /* k = 0 leaves the kernels nothing to finish */
    p.kc_max = p.kernel != MP__KERNEL_FLOAT32 ? 2 * MP__KC : MP__KC;
    p.panel = mp__panel_cols(mp__panel_depth(m1 - m0, g->k), n1 - n0, ws->b_cap);
    if (p.kernel == MP__KERNEL_AMX) p.panel = mp__min(p.panel, MP__AMX_NC);
    if (!orig && n0 == 0 && n1 == g->n && mp__in_place(g)) p.path = MP__PATH_IN_PLACE;
    else if (!orig && mp__sums_in_c(g, m0, m1, n0, n1)) p.path = MP__PATH_SUMS_IN_C;
    else p.path = MP__PATH_BLOCKED;
    return p;
}

/* C[m0..m1, n0..n1) of g by BLIS's loops, as plan p says (see
   mp__gemm_region for orig and apart). */
static void mp__gemm_blocked(const mp_gemm_args *g, const mp_gemm_args *orig, mp__gemm_ws *ws,
                             const mp__gemm_plan *p, size_t m0, size_t m1, size_t n0, size_t n1, int apart) {
    int pairs = p->kernel != MP__KERNEL_FLOAT32, amx = p->kernel == MP__KERNEL_AMX;
    size_t kc_max = p->kc_max, panel = p->panel;
    size_t lda = g->trans_a ? g->m : g->k, ldb = g->trans_b ? g->k : g->n;
    size_t i0, j0, p0, r;
    float bias[MP__NC]; /* the panel's bias in float32, for the kernels' epilogue */
    mp__tile_dest d;
#ifndef MP__AMX
    (void)apart;
#endif
    d.in_c = 0;
#ifdef MP__AMX
    if (amx) mp__amx_begin();
#endif
    for (j0 = n0; j0 < n1; j0 += panel) {
        size_t nc = mp__min(panel, n1 - j0), ncp = mp__round_up(nc, MP__NR), block_rows = MP__MC;
#ifdef MP__AMX
        if (amx) block_rows = mp__amx_rows(ncp, g->k);
#endif
        for (p0 = 0; !p->one_block && p0 < g->k; p0 += kc_max) { /* the whole K x nc panel of op(B) */
            size_t kc = mp__min(kc_max, g->k - p0);
            mp__pack_b_slice(g, ws, ws->b + p0 / kc_max * MP__KC * ncp, ldb, j0, nc, p0, kc,
                             mp__slice_depth(kc, pairs, amx));
        }
        if (p->fused && g->bias) mp__panel_bias(g, bias, j0, nc);
        for (i0 = m0; i0 < m1; i0 += block_rows) {
            size_t mc = mp__min(block_rows, m1 - i0), span = mp__a_span(g, mc);
            if (!g->k) memset(ws->c, 0, mc * ncp * sizeof(float)); /* the empty sum */
            for (p0 = 0; p0 < g->k; p0 += kc_max) {
                size_t kc = mp__min(kc_max, g->k - p0), depth = mp__slice_depth(kc, pairs, amx);
                size_t g0 = p0 / span * span, cols = mp__min(span, g->k - g0); /* op(A)'s columns packed with p0's */
                int into_c = p->fused && p0 + kc >= g->k; /* the last slice: its tiles finish into C */
                int rows_first = into_c || (!pairs && depth <= MP__SHALLOW);
                const float *slice = p->one_block ? ws->b : ws->b + p0 / kc_max * MP__KC * ncp;
                if (p->one_block) mp__pack_b_slice(g, ws, ws->b, ldb, j0, nc, p0, kc, depth);
#ifdef MP__AMX
                if (amx) {
                    mp__pack_amx_a((uint32_t *)ws->a, !g->trans_a, (const uint16_t *)g->a, lda, i0, mc, p0, kc,
                                   depth / MP__AMX_PAIRS);
                    mp__block_amx((const uint32_t *)ws->a, (const uint32_t *)slice, ws->c, mc, ncp,
                                  depth / MP__AMX_PAIRS, p0 == 0, apart);
                    if (into_c) {
                        d.g = g, d.bias = g->bias ? bias : NULL;
                        d.row = i0, d.col = j0, d.cols = nc;
                        mp__block_epilogue(&d, ws->c, mc, ncp);
                    }
                    continue;
                }
#endif
#ifdef MP__BF16_DOT
                if (pairs) mp__pack_pairs((uint32_t *)ws->a, MP__MR, !g->trans_a, g->a, lda, i0, mc, p0, kc, depth);
                else
#endif
                    if (p0 == g0) mp__pack(ws->a, ws->tmp, MP__MR, !g->trans_a, g->a, g->at, lda, i0, mc, g0, cols);
                d.first = p0 == 0;
                d.g = into_c ? g : NULL;
                mp__slice_tiles(ws->a + (p0 - g0) * MP__MR, pairs ? depth : cols, slice, ws->c, ncp, depth, pairs,
                                rows_first, g->bias ? bias : NULL, i0, mc, j0, nc, &d);
            }
            if (orig) mp__epilogue_transposed(orig, ws->c, ncp, ws->tmp, mc, j0, nc);
            for (r = 0; !p->fused && !orig && r < mc; r++) mp__epilogue(g, ws->c + r * ncp, ws->tmp, i0 + r, j0, nc);
        }
    }
#ifdef MP__AMX
    if (amx) _tile_release();
#endif
}

/* C[m0..m1, n0..n1) of g on one thread; orig, when not NULL, is the
   product whose C^T g is (written back through mp__epilogue_transposed);
   apart: AMX sums each K slice apart (mp__amx_apart). Chooses the plan,
   then runs it. */
static void mp__gemm_region(const mp_gemm_args *g, const mp_gemm_args *orig, mp__gemm_ws *ws, size_t m0, size_t m1,
                            size_t n0, size_t n1, int apart) {
    mp__gemm_plan p = mp__gemm_plan_of(g, orig, ws, m0, m1, n0, n1);
    switch (p.path) {
    case MP__PATH_IN_PLACE:
#ifdef MP__TILE_FUSED
        mp__gemm_in_place(g, ws, m0, m1);
#endif
        break;
    case MP__PATH_SUMS_IN_C: mp__gemm_in_c(g, ws, m0, m1, n0, n1); break;
    case MP__PATH_BLOCKED: mp__gemm_blocked(g, orig, ws, &p, m0, m1, n0, n1, apart); break;
    }
}

/* >>matmul: threads. How the threads share a product (along N, M or K),
   the transpose, CBLAS, and mp_matmul. */

/* Whether AMX sums each K slice of g from +0 and adds it to the sums so
   far, as the other kernels do, rather than carrying the sums in its tiles:
   in the products that split along K on 2 threads (mp__split_k), whatever
   the pool, so that their bits do not depend on it. One thread is no
   slower for it (12 x 128 x 21142, bench/gemm.c's conv rows). */
static int mp__amx_apart(const mp_gemm_args *g) {
    return g->trans_a && !g->trans_b && mp__k_split_of(g->m, g->n, g->k, 2 * MP__KC, 2).fits;
}

typedef struct mp__gemm_job {
    const mp_gemm_args *g, *orig; /* orig: the product whose C^T g is, or NULL */
    mp_pool *pool;
    int apart; /* AMX sums each K slice apart */
} mp__gemm_job;

/* Whether a product on AMX whose op(A) AMX's pack transposes (a weight
   gradient's X^T, its dearest pack) has an op(B) of at most 128K values:
   then each thread packing all of op(B) costs less than each transposing
   all of X^T, and the product splits along M: the batch-128 weight
   gradients (1024 x 1024 x 128, 784 x 1024 x 128) gain on 2 threads,
   while with op(B) of 512K values (4096 x 4096 x 128) or a batch of 8192
   a split along M was slower (bench/gemm.c's bfloat16 rows on AMX). */
static int mp__amx_small_b(const mp_gemm_args *g) {
    return mp__gemm_bf16(g) && mp__amx_usable() && g->trans_a && g->k * g->n <= ((size_t)1 << 17);
}

/* Each thread takes a disjoint range of whole tiles along N (then every
   thread packs all of op(A)) or an even share of the rows along M (then
   every thread packs all of op(B)): the split that repeats the cheaper
   packing, a transposing pack
   costing about three copies. A shallow product (k <= MP__SHALLOW)
   is its C stores, and both packs are small: it splits along M, since in
   an N split the two threads write both ends of every row of C, which
   share a cache line wherever C's rows do not start on one (a C from
   malloc, 16 bytes past a line: 128 x 1024 x 10 on 2 threads takes
   several times longer split along N than along M; on a line, the same).
   Where C's rows are whole lines (mp__rows_on_lines) and it has at most
   MP__SHALLOW_N_ROWS rows, it splits along N all the same: each thread
   then transposes half of op(B) (the 10 classes' weights, in their input
   gradient) rather than all of it, which gains up to 256 rows in every
   dtype and loses from 512 rows on (bench/gemm.c's batch-128 step). Rows,
   not whole tiles: no thread gets more tiles for it (ceil(ceil(m / T) /
   MR) <= ceil(ceil(m / MR) / T)), the rows' stores split evenly (128
   rows: 64 and 64, where whole tiles gave 72 and 56), and AMX's 32-row
   blocks fall better (1024 rows: 16 blocks a thread, 17 and 16 by 12-row
   tiles). Which rows a thread sums changes no sum. */
static int mp__split_n(const mp_gemm_args *g, size_t threads) {
    size_t tn = (g->n + MP__NR - 1) / MP__NR, tm = (g->m + MP__MR - 1) / MP__MR;
    float cost_a = (float)g->m * (float)g->k * (g->trans_a ? 1.0f : 3.0f);
    float cost_b = (float)g->k * (float)g->n * (g->trans_b ? 3.0f : 1.0f);
    if (tm < threads) return 1;
    if (tn < threads || mp__amx_small_b(g)) return 0;
    if (g->k <= MP__SHALLOW) return g->m <= MP__SHALLOW_N_ROWS && mp__rows_on_lines(g);
    return cost_a <= cost_b;
}

static void mp__gemm_task(void *ctx, int t, int threads) {
    const mp__gemm_job *job = (const mp__gemm_job *)ctx;
    const mp_gemm_args *g = job->g;
    size_t T = (size_t)threads, tn = (g->n + MP__NR - 1) / MP__NR;
    if (mp__split_n(g, T)) {
        size_t per = (tn + T - 1) / T * MP__NR, n0 = (size_t)t * per;
        if (n0 < g->n)
            mp__gemm_region(g, job->orig, &job->pool->ws[t], 0, g->m, n0, mp__min(g->n, n0 + per), job->apart);
    } else {
        size_t per = (g->m + T - 1) / T, m0 = (size_t)t * per;
        if (m0 < g->m)
            mp__gemm_region(g, job->orig, &job->pool->ws[t], m0, mp__min(g->m, m0 + per), 0, g->n, job->apart);
    }
}

/* A weight gradient with a small C and a long K (a convolution's: 12 x
   128 x 21142) splits along K: split along M or N, each thread would pack
   all of one batch-long operand for a few tiles of the other. Every sum
   stays the same, in the same order: the kernels sum each KC slice of K
   from +0 (so never to -0, and 0 + the sum is the sum) and add it to the
   sums so far, so thread 0 sums
   the first slices as one product would, every other thread sums each of
   its slices apart, and mp__merge_task adds those to thread 0's in order
   before the epilogue. It takes op(A) = A^T and op(B) = B, where a slice
   of K is a run of whole rows of both (a weight gradient's X^T dY). AMX's
   tiles would carry the sums from one slice into the next: in the products
   that split on 2 threads they sum each slice apart instead, on any
   number of threads (mp__amx_apart), and the others do not split. */
typedef struct mp__split_job {
    const mp_gemm_args *g;
    mp_pool *pool;
    mp__k_split s;
} mp__split_job;

static int mp__split_k(const mp_gemm_args *g, const mp_pool *pool, mp__k_split *s) {
    int pairs = mp__gemm_bf16(g);
    if (pool->threads < 2 || !g->trans_a || g->trans_b || (pairs && mp__amx_usable() && !mp__amx_apart(g))) return 0;
    *s = mp__k_split_of(g->m, g->n, g->k, pairs ? 2 * MP__KC : MP__KC, pool->threads);
    return s->fits && pool->ws[0].part_cap >= s->floats;
}

/* k values of K from p0 on into c, float32 sums of g's operands alone. */
static void mp__split_sum(const mp_gemm_args *g, mp__gemm_ws *ws, size_t p0, size_t k, float *c) {
    mp_gemm_args p = *g;
    p.k = k;
    p.a = mp__at(g->a, g->at, p0 * g->m); /* A^T and B: whole rows */
    p.b = mp__at(g->b, g->bt, p0 * g->n);
    p.c = c, p.ct = MP_FLOAT32;
    p.accumulate = 0, p.bias = NULL, p.act = MP_LINEAR, p.z = NULL, p.relu_y = NULL;
    mp__gemm_region(&p, NULL, ws, 0, g->m, 0, g->n, 1); /* AMX splits only where it sums slices apart */
}

/* The slices [*j0, *j1) of K that thread t >= 1 sums apart. */
static void mp__split_range(const mp__k_split *s, int t, size_t *j0, size_t *j1) {
    *j0 = mp__min(s->slices, s->first + (size_t)(t - 1) * s->per);
    *j1 = mp__min(s->slices, *j0 + s->per);
}

/* Thread 0's slices as one product, another thread's one at a time. */
static void mp__split_task(void *ctx, int t, int threads) {
    const mp__split_job *job = (const mp__split_job *)ctx;
    const mp_gemm_args *g = job->g;
    const mp__k_split *s = &job->s;
    mp__gemm_ws *ws = &job->pool->ws[t];
    size_t j, j0, j1;
    (void)threads;
    if (t == 0) {
        mp__split_sum(g, ws, 0, mp__min(s->first * s->kc, g->k), ws->part);
        return;
    }
    mp__split_range(s, t, &j0, &j1);
    for (j = j0; j < j1; j++)
        mp__split_sum(g, ws, j * s->kc, mp__min(s->kc, g->k - j * s->kc), ws->part + (j - j0) * s->stride);
}

/* Rows of C: thread 0's sums + every other slice's, in K's order, then the
   epilogue. */
static void mp__merge_task(void *ctx, int t, int threads) {
    const mp__split_job *job = (const mp__split_job *)ctx;
    const mp_gemm_args *g = job->g;
    const mp__k_split *s = &job->s;
    const mp__gemm_ws *ws = job->pool->ws;
    size_t per = (g->m + (size_t)threads - 1) / (size_t)threads, r, j, j0, j1;
    int u;
    for (r = (size_t)t * per; r < mp__min(g->m, (size_t)(t + 1) * per); r++) {
        float *acc = ws[0].part + r * g->n;
        for (u = 1; u < threads; u++) { /* the threads' slices follow one another along K */
            mp__split_range(s, u, &j0, &j1);
            for (j = j0; j < j1; j++) mp__add_run(acc, ws[u].part + (j - j0) * s->stride + r * g->n, g->n);
        }
        for (j0 = 0; j0 < g->n; j0 += MP__NC)
            mp__epilogue(g, acc + j0, ws[t].tmp, r, j0, mp__min(MP__NC, g->n - j0));
    }
}

/* With MIXPREC_USE_CBLAS, a float32 x float32 -> float32 product by
   cblas_sgemm, then its epilogue in place: 1 where it ran so, 0 where the
   kernels must. */
static int mp__gemm_cblas(const mp_gemm_args *g, float *tmp) {
#ifdef MIXPREC_USE_CBLAS
    size_t r, j0;
    if (g->at != MP_FLOAT32 || g->bt != MP_FLOAT32 || g->ct != MP_FLOAT32) return 0;
    cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans,
                (int)g->m, (int)g->n, (int)g->k, 1.0f, (const float *)g->a, (int)(g->trans_a ? g->m : g->k),
                (const float *)g->b, (int)(g->trans_b ? g->k : g->n), g->accumulate ? 1.0f : 0.0f, (float *)g->c,
                (int)g->n);
    if (!g->bias && !g->z && g->act == MP_LINEAR && !g->relu_y) return 1;
    for (r = 0; r < g->m; r++) /* the epilogue in place, the accumulation done */
        for (j0 = 0; j0 < g->n; j0 += MP__NC) {
            mp_gemm_args e = *g;
            e.accumulate = 0;
            mp__epilogue(&e, (float *)g->c + r * g->n + j0, tmp, r, j0, mp__min(MP__NC, g->n - j0));
        }
    return 1;
#else
    (void)g, (void)tmp;
    return 0;
#endif
}

/* g's job: g itself, or its transpose C^T = op(B)^T op(A)^T (built in *t)
   where that pads less, orig's epilogue writing C. */
static void mp__gemm_job_of(mp__gemm_job *job, mp_gemm_args *t, mp_pool *pool, const mp_gemm_args *g) {
    job->g = g;
    job->orig = NULL;
    job->pool = pool;
    job->apart = mp__amx_apart(g); /* not where the product runs as its transpose */
    if (!g->accumulate && !g->z && !mp__in_place(g) && mp__swap_dims(g->m, g->n)) {
        *t = *g;
        t->trans_a = !g->trans_b, t->trans_b = !g->trans_a;
        t->m = g->n, t->n = g->m;
        t->a = g->b, t->at = g->bt;
        t->b = g->a, t->bt = g->at;
        t->bias = NULL, t->act = MP_LINEAR, t->relu_y = NULL; /* orig's epilogue does them */
        job->g = t;
        job->orig = g;
    }
}

/* g on thread t alone, in its workspace, from inside a pool task (a
   convolution's group, mp__cpu_conv_gemm): mp__gemm_run's bits, which are
   the same on any number of threads. */
static void mp__gemm_alone(mp_pool *pool, int t, const mp_gemm_args *g) {
    mp__gemm_job job;
    mp_gemm_args swapped;
    if (g->m == 0 || g->n == 0 || mp__gemm_cblas(g, pool->ws[t].tmp)) return;
    mp__gemm_job_of(&job, &swapped, pool, g);
    mp__gemm_region(job.g, job.orig, &pool->ws[t], 0, job.g->m, 0, job.g->n, job.apart);
}

static void mp__gemm_run(mp_pool *pool, const mp_gemm_args *g) {
    mp__gemm_job job;
    mp__split_job split;
    mp_gemm_args swapped;
    int threads = g->m * g->n * g->k < MP__GEMM_PARALLEL ? 1 : pool->threads;
    if (g->m == 0 || g->n == 0 || mp__gemm_cblas(g, pool->ws[0].tmp)) return;
    if (threads > 1 && mp__split_k(g, pool, &split.s)) {
        split.g = g;
        split.pool = pool;
        mp__pool_run(pool, mp__split_task, &split, pool->threads);
        mp__pool_run(pool, mp__merge_task, &split, pool->threads);
        return;
    }
    mp__gemm_job_of(&job, &swapped, pool, g);
    mp__pool_run(pool, mp__gemm_task, &job, threads);
}

MIXPREC_API mp_status mp_matmul(mp_pool *pool, int trans_a, int trans_b, size_t m, size_t n, size_t k,
                                const void *a, mp_dtype a_type, const void *b, mp_dtype b_type, void *c,
                                mp_dtype c_type) {
    mp_gemm_args g;
    mp_pool *own = NULL;
    size_t ignored;
    mp_status st;
    if (!a || !b || !c) return MP_ERR_NULL;
    if (!mp__dtype_valid(a_type) || !mp__dtype_valid(b_type) || !mp__dtype_valid(c_type)) return MP_ERR_DTYPE;
    /* every operand's bytes, and the float32 sums, must be addressable */
    if (!mp__mul_ok(m, k, &ignored) || !mp__mul_ok(m * k, sizeof(float), &ignored) || !mp__mul_ok(k, n, &ignored) ||
        !mp__mul_ok(k * n, sizeof(float), &ignored) || !mp__mul_ok(m, n, &ignored) ||
        !mp__mul_ok(m * n, sizeof(float), &ignored) || !mp__mul_ok(k, MP__NC, &ignored))
        return MP_ERR_SIZE;
    if (m == 0 || n == 0) return MP_OK;
    if (mp__overlap(c, m * n * mp__dtypes[c_type].size, a, m * k * mp__dtypes[a_type].size) ||
        mp__overlap(c, m * n * mp__dtypes[c_type].size, b, k * n * mp__dtypes[b_type].size))
        return MP_ERR_OVERLAP;
    if (!pool && (st = mp_pool_create(&own, 1)) != MP_OK) return st;
    if ((st = mp__pool_reserve(own ? own : pool, m, k, n)) == MP_OK) {
        memset(&g, 0, sizeof g);
        g.trans_a = trans_a != 0;
        g.trans_b = trans_b != 0;
        g.m = m; g.n = n; g.k = k;
        g.a = a; g.at = a_type;
        g.b = b; g.bt = b_type;
        g.c = c; g.ct = c_type;
        mp__gemm_run(own ? own : pool, &g);
    }
    mp_pool_destroy(own);
    return st;
}

/* >>cpu backend: elementwise. Long vectors are cut into one contiguous range per thread
   (elementwise work: the result does not depend on the cut). */
typedef struct mp__range_job {
    void (*fn)(void *args, size_t begin, size_t end, int thread);
    void *args;
    size_t n, grain; /* ranges are whole multiples of grain items */
} mp__range_job;

static void mp__range_task(void *ctx, int t, int threads) {
    const mp__range_job *job = (const mp__range_job *)ctx;
    size_t per = mp__round_up((job->n + (size_t)threads - 1) / (size_t)threads, job->grain), begin = (size_t)t * per;
    if (begin < job->n) job->fn(job->args, begin, mp__min(job->n, begin + per), t);
}

/* Below this many elements one thread does it all. */
enum { MP__RANGE_PARALLEL = 1 << 16 };

/* n items cut at multiples of grain, over `elements` elements in all: one
   thread for fewer than MP__RANGE_PARALLEL or a single grain. */
static void mp__parallel_grains(mp_pool *pool, size_t n, size_t grain, size_t elements,
                                void (*fn)(void *, size_t, size_t, int), void *args) {
    mp__range_job job;
    job.fn = fn;
    job.args = args;
    job.n = n;
    job.grain = grain;
    mp__pool_run(pool, mp__range_task, &job, elements < MP__RANGE_PARALLEL || n <= grain ? 1 : mp_pool_threads(pool));
}

/* n items of `per_item` elements each (rows), cut at multiples of 64
   elements or of one item. */
static void mp__parallel_items(mp_pool *pool, size_t n, size_t per_item, void (*fn)(void *, size_t, size_t, int),
                               void *args) {
    mp__parallel_grains(pool, n, per_item >= 64 ? 1 : 64 / per_item, n * per_item, fn, args);
}

static void mp__parallel_range(mp_pool *pool, size_t n, void (*fn)(void *, size_t, size_t, int), void *args) {
    mp__parallel_items(pool, n, 1, fn, args);
}

/* The row kernels (>>activations) on the pool: rows split for the bias and
   activation and their gradient, columns for the bias gradient. */
static void mp__cpu_bias_act(void *ctx, void *y, const void *x, const void *bias, size_t rows, size_t cols,
                             mp_activation act, mp_dtype dt) {
    mp__rows_op op;
    memset(&op, 0, sizeof op);
    op.out = y, op.outt = op.dt = dt, op.a = x, op.b = bias, op.rows = rows, op.cols = cols, op.act = act;
    mp__parallel_items(mp__pool_of(ctx), rows, cols, mp__bias_act_rows, &op);
}

static void mp__cpu_act_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *y, const void *x,
                                 size_t rows, size_t cols, mp_activation act, mp_dtype dt) {
    mp__rows_op op;
    op.out = dx, op.outt = dxt, op.dt = dt, op.a = dy, op.b = y, op.c = x, op.rows = rows, op.cols = cols;
    op.act = act;
    mp__parallel_items(mp__pool_of(ctx), rows, cols, mp__act_backward_rows, &op);
}

/* The columns split in whole cache lines of a row: split finer, both
   threads read every line (8192 x 10 in bfloat16 took longer on 2 threads
   with 5 columns each than on 1; bench/train.c's 10-class layer). */
static void mp__cpu_bias_grad(void *ctx, void *db, const void *dy, size_t rows, size_t cols, mp_dtype dt) {
    mp__rows_op op;
    memset(&op, 0, sizeof op);
    op.out = db, op.outt = op.dt = dt, op.a = dy, op.rows = rows, op.cols = cols;
    mp__parallel_grains(mp__pool_of(ctx), cols, 64 / mp__dtypes[dt].size, cols * rows, mp__bias_grad_cols, &op);
}

typedef struct mp__cast_args {
    void *dst;
    const void *src;
    mp_dtype dt, st;
} mp__cast_args;

static void mp__cast_range(void *args, size_t begin, size_t end, int thread) {
    const mp__cast_args *c = (const mp__cast_args *)args;
    (void)thread;
    (void)mp_convert(mp__at_mut(c->dst, c->dt, begin), c->dt, mp__at(c->src, c->st, begin), c->st, end - begin, NULL);
}

static void mp__cpu_cast(void *ctx, void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n,
                         mp_cast_stats *stats) {
    mp__cast_args c;
    if (stats) { /* the counting path: one thread */
        (void)mp_convert(dst, dt, src, st, n, stats);
        return;
    }
    if (dst == src && dt == st) return;
    c.dst = dst;
    c.src = src;
    c.dt = dt;
    c.st = st;
    mp__parallel_range(mp__pool_of(ctx), n, mp__cast_range, &c);
}

/* The merges' sums and products and the gradients' sums (mp_backend.elementwise):
   a tile of a and one of b widened, combined in float32 and rounded once into
   y. Each tile is read whole before it is written, so y may be a or b. */
typedef struct mp__ew_args {
    mp_elementwise op;
    void *y;
    const void *a, *b;
    mp_dtype yt, at, bt;
    float s;
} mp__ew_args;

static void mp__ew_range(void *args, size_t begin, size_t end, int thread) {
    const mp__ew_args *e = (const mp__ew_args *)args;
    float ta[MP__TILE], tb[MP__TILE];
    size_t i, j, len;
    (void)thread;
    for (i = begin; i < end; i += len) {
        len = mp__min(MP__TILE, end - i);
        mp__load(ta, mp__at(e->a, e->at, i), e->at, len);
        if (e->op != MP_EW_SCALE) mp__load(tb, mp__at(e->b, e->bt, i), e->bt, len);
        switch (e->op) { /* plain loops over local tiles: vectorised */
        case MP_EW_ADD: mp__add_run(ta, tb, len); break;
        case MP_EW_SUBTRACT: for (j = 0; j < len; j++) ta[j] -= tb[j]; break;
        case MP_EW_MULTIPLY: for (j = 0; j < len; j++) ta[j] *= tb[j]; break;
        case MP_EW_SCALE: for (j = 0; j < len; j++) ta[j] *= e->s; break;
        }
        mp__store(mp__at_mut(e->y, e->yt, i), e->yt, ta, len);
    }
}

static void mp__cpu_elementwise(void *ctx, mp_elementwise op, void *y, mp_dtype yt, const void *a, mp_dtype at,
                                const void *b, mp_dtype bt, float s, size_t n) {
    mp__ew_args e;
    e.op = op, e.y = y, e.a = a, e.b = b, e.yt = yt, e.at = at, e.bt = bt, e.s = s;
    mp__parallel_range(mp__pool_of(ctx), n, mp__ew_range, &e);
}

/* Concatenate's blocks (mp_backend.copy_cols): rows split among the
   threads, each row a memcpy, or one bulk cast where the dtypes differ. */
typedef struct mp__cols_args {
    void *dst;
    const void *src;
    mp_dtype dt, st;
    size_t dst_stride, src_stride, cols;
} mp__cols_args;

static void mp__copy_cols_range(void *args, size_t r0, size_t r1, int thread) {
    const mp__cols_args *c = (const mp__cols_args *)args;
    size_t r;
    (void)thread;
    for (r = r0; r < r1; r++) {
        void *d = mp__at_mut(c->dst, c->dt, r * c->dst_stride);
        const void *s = mp__at(c->src, c->st, r * c->src_stride);
        if (c->dt == c->st) memcpy(d, s, c->cols * mp__dtypes[c->dt].size);
        else (void)mp_convert(d, c->dt, s, c->st, c->cols, NULL);
    }
}

static void mp__cpu_copy_cols(void *ctx, void *dst, mp_dtype dt, size_t dst_stride, const void *src, mp_dtype st,
                              size_t src_stride, size_t rows, size_t cols) {
    mp__cols_args c;
    if (cols == 0) return;
    c.dst = dst, c.src = src, c.dt = dt, c.st = st, c.dst_stride = dst_stride, c.src_stride = src_stride, c.cols = cols;
    mp__parallel_items(mp__pool_of(ctx), rows, cols, mp__copy_cols_range, &c);
}

/* >>cpu backend: losses. Keras 3's formulas in float32, a row at a time (the rows
   are in >>rules), split across the pool MP__LOSS_ROWS rows at a time:
   each row's loss goes to the chunk's buffer, and the chunk's are added
   in row order here, so the sum is one thread's at any count. A loss
   element (two expf and a logf from logits) costs about 25 of a cast's
   (8192 x 10 from logits against the cast of 8192 x 784 into bfloat16, in
   bench/train.c's step), hence the weight of a row in the split's
   threshold. */
enum { MP__LOSS_ROWS = 2048, MP__LOSS_WEIGHT = 25 };

typedef struct mp__loss_args {
    mp_loss kind;
    int from_logits;
    const void *pred, *out;
    mp_dtype pt, ot;
    const int32_t *labels;
    const float *y;
    size_t cols, first; /* the chunk's first row */
    float inv_rows, *dpred;
    float row_loss[MP__LOSS_ROWS];
    size_t correct[MP__MAX_THREADS];
} mp__loss_args;

static void mp__loss_range(void *args, size_t begin, size_t end, int thread) {
    mp__loss_args *a = (mp__loss_args *)args;
    size_t i, j, cols = a->cols, correct = 0; /* a local: the threads' counts share a cache line */
    for (i = begin; i < end; i++) { /* the row's output, then its predictions, in dpred's row */
        size_t r = a->first + i;
        float *p = a->dpred + r * cols, l;
        const float *t = a->y ? a->y + r * cols : NULL;
        int32_t label = a->labels ? a->labels[r] : 0;
        mp__load(p, mp__at(a->out, a->ot, r * cols), a->ot, cols);
        correct += (size_t)mp__row_correct(a->kind, p, t, label, cols);
        if (a->pred != a->out) mp__load(p, mp__at(a->pred, a->pt, r * cols), a->pt, cols);
        if (a->kind == MP_BINARY_CROSSENTROPY) l = mp__binary_crossentropy_row(p, t, cols, a->from_logits);
        else if (a->kind == MP_MEAN_SQUARED_ERROR) l = mp__mean_squared_error_row(p, t, cols);
        else l = mp__crossentropy_row(p, t, label, cols, a->from_logits);
        for (j = 0; j < cols; j++) p[j] *= a->inv_rows;
        a->row_loss[i] = l;
    }
    a->correct[thread] += correct;
}

static void mp__cpu_loss(void *ctx, mp_loss kind, int from_logits, const void *pred, mp_dtype pt, const void *out,
                         mp_dtype ot, const int32_t *labels, const float *y, size_t rows, size_t cols, float *dpred,
                         float *metrics) {
    mp__loss_args a;
    float loss_sum = 0.0f;
    size_t r, i, len, correct = 0;
    memset(a.correct, 0, sizeof a.correct);
    a.kind = kind, a.from_logits = from_logits, a.pred = pred, a.pt = pt, a.out = out, a.ot = ot;
    a.labels = labels, a.y = y, a.cols = cols, a.inv_rows = 1.0f / (float)rows, a.dpred = dpred;
    for (r = 0; r < rows; r += len) {
        len = mp__min(MP__LOSS_ROWS, rows - r);
        a.first = r;
        mp__parallel_items(mp__pool_of(ctx), len, cols * MP__LOSS_WEIGHT, mp__loss_range, &a);
        for (i = 0; i < len; i++) loss_sum += a.row_loss[i];
    }
    for (i = 0; i < MP__MAX_THREADS; i++) correct += a.correct[i];
    metrics[0] = loss_sum;
    metrics[1] = (float)correct;
}

/* >>cpu backend: loss scaling */
/* The multiply runs over whole tiles, the tail padded with 0: gcc's -O2
   leaves a loop to a variable length scalar, which made this many times
   slower than a plain cast (a 16-bit all-reduce narrows every gradient
   through it; bench/dp.c). */
static void mp__cpu_scale_cast(void *ctx, void *dst, mp_dtype dt, const float *src, size_t n,
                               const float *scale_ptr) {
    float t[MP__TILE], scale = scale_ptr ? *scale_ptr : 1.0f;
    size_t i, j, len;
    (void)ctx;
    for (i = 0; i < n; i += len) {
        len = mp__min(MP__TILE, n - i);
        memcpy(t, src + i, len * sizeof(float));
        if (len < MP__TILE) memset(t + len, 0, (MP__TILE - len) * sizeof(float));
        for (j = 0; j < MP__TILE; j++) t[j] *= scale;
        mp__store(mp__at_mut(dst, dt, i), dt, t, len);
    }
}

/* One pass over the scaled gradients: widen, test the exponent bits (no
   branch, no early exit), multiply by 1/scale. dst may be src (float32). */
typedef struct mp__unscale_args {
    float *dst;
    const void *src;
    mp_dtype st;
    float inv_scale;
    uint32_t bad[MP__MAX_THREADS];
} mp__unscale_args;

/* unscale_check's test alone: nonzero if any of n values of st at src is
   Inf or NaN, from the bits with no widening (the same answer: widening
   keeps Inf and NaN). 16-bit values: a magnitude's bits order as its value
   (IEEE 754 3.4), so the largest magnitude says it, a max per lane over
   whole vectors (a loop compilers vectorise, where a test per element fed
   to one flag stays scalar). */
static void mp__max_lanes16(uint16_t *top, const uint16_t *h) {
    int j;
    for (j = 0; j < 32; j++) top[j] = (uint16_t)(h[j] & 0x7FFFu) > top[j] ? (uint16_t)(h[j] & 0x7FFFu) : top[j];
}
static uint32_t mp__max_magnitude16(const uint16_t *h, size_t n) {
    uint16_t top[32] = {0}, tail[32] = {0}, most = 0;
    size_t i = 0;
    int j;
    for (; i + 32 <= n; i += 32) mp__max_lanes16(top, h + i);
    memcpy(tail, h + i, (n - i) * sizeof *h); /* padded with 0 */
    mp__max_lanes16(top, tail);
    for (j = 0; j < 32; j++) most = top[j] > most ? top[j] : most;
    return most;
}
static uint32_t mp__any_nonfinite(const void *src, mp_dtype st, size_t n) {
    if (st == MP_FLOAT32) return mp__first_nonfinite((const float *)src, n) < n;
    return mp__max_magnitude16((const uint16_t *)src, n) >= (st == MP_FLOAT16 ? 0x7C00u : 0x7F80u);
}

/* Whole runs (the loop vectorises), widened straight into dst and
   unscaled there; the tail through pad, padded with 0. */
static void mp__unscale_range(void *args, size_t begin, size_t end, int thread) {
    mp__unscale_args *u = (mp__unscale_args *)args;
    float pad[MP__RUN], inv_scale = u->inv_scale; /* a local: dst could alias *u for all the compiler knows */
    uint32_t bad = 0;
    size_t i, j, len;
    if (!u->dst) {
        u->bad[thread] |= mp__any_nonfinite(mp__at(u->src, u->st, begin), u->st, end - begin);
        return;
    }
    for (i = begin; i < end; i += len) {
        const void *from = mp__at(u->src, u->st, i);
        float *t;
        len = mp__min(MP__RUN, end - i);
        t = len == MP__RUN ? u->dst + i : pad;
        if ((const void *)t != from) mp__load(t, from, u->st, len); /* (unscaled in place: already there) */
        if (len < MP__RUN) memset(t + len, 0, (MP__RUN - len) * sizeof(float));
        for (j = 0; j < MP__RUN; j++) {
            uint32_t bits;
            memcpy(&bits, &t[j], 4);
            bad |= (uint32_t)((bits & MP__F32_INF) == MP__F32_INF);
            t[j] *= inv_scale;
        }
        if (t == pad) memcpy(u->dst + i, pad, len * sizeof(float));
    }
    u->bad[thread] |= bad;
}

static void mp__cpu_unscale_check(void *ctx, float *dst, const void *src, mp_dtype st, size_t n, const float *scale,
                                  int *found_inf) {
    mp__unscale_args u;
    uint32_t bad = 0;
    int t;
    memset(&u, 0, sizeof u);
    u.dst = dst;
    u.src = src;
    u.st = st;
    u.inv_scale = mp__unscale_factor(scale);
    mp__parallel_range(mp__pool_of(ctx), n, mp__unscale_range, &u);
    for (t = 0; t < MP__MAX_THREADS; t++) bad |= u.bad[t];
    *found_inf |= bad != 0;
}

static void mp__cpu_loss_scale_update(void *ctx, mp_loss_scale *ls, const int *found_inf) {
    (void)ctx;
    (void)mp_loss_scale_step(ls, !*found_inf);
}

/* >>cpu backend: optimizers. Keras 3's update rules on float32 master weights, written
   once over vectors of MP__VW floats (a scalar when there is no SIMD; the
   same operations in the same order either way, no fused multiply-add). */
#if defined(MP__SIMD_AVX512)
#define MP__VW 16
typedef __m512 mp__vf;
#define mp__vld _mm512_loadu_ps
#define mp__vst _mm512_storeu_ps
#define mp__vset _mm512_set1_ps
#define mp__vadd _mm512_add_ps
#define mp__vsub _mm512_sub_ps
#define mp__vmul _mm512_mul_ps
#define mp__vdiv _mm512_div_ps
#define mp__vmin _mm512_min_ps
#define mp__vmax _mm512_max_ps
/* the masked form: g++'s _mm512_sqrt_ps trips -Wmaybe-uninitialized in C++ */
#define mp__vsqrt(v) _mm512_maskz_sqrt_ps((__mmask16)0xFFFF, v)
#elif defined(MP__SIMD_X86)
#define MP__VW 8
typedef __m256 mp__vf;
#define mp__vld _mm256_loadu_ps
#define mp__vst _mm256_storeu_ps
#define mp__vset _mm256_set1_ps
#define mp__vadd _mm256_add_ps
#define mp__vsub _mm256_sub_ps
#define mp__vmul _mm256_mul_ps
#define mp__vdiv _mm256_div_ps
#define mp__vmin _mm256_min_ps
#define mp__vmax _mm256_max_ps
#define mp__vsqrt _mm256_sqrt_ps
#else
#define MP__VW 1
typedef float mp__vf;
static float mp__vld(const float *p) { return *p; }
static void mp__vst(float *p, float v) { *p = v; }
static float mp__vset(float v) { return v; }
static float mp__vadd(float a, float b) { return a + b; }
static float mp__vsub(float a, float b) { return a - b; }
static float mp__vmul(float a, float b) { return a * b; }
static float mp__vdiv(float a, float b) { return a / b; }
/* min and max as x86's minps and maxps: b where either is NaN */
static float mp__vmin(float a, float b) { return a < b ? a : b; }
static float mp__vmax(float a, float b) { return a > b ? a : b; }
static float mp__vsqrt(float a) { return sqrtf(a); }
#endif

/* MP__VW elements of a run of dtype t from element i, widened to float32
   (exactly), and two vectors rounded once to dtype t into 2 MP__VW
   elements from i (the bulk casts' rounding; with AVX-512, a pair as the
   casts narrow it, a whole cache line, around the caches where `stream`
   says so and p + i is 64-byte aligned): the 16-bit gradients and the
   compute-dtype copy, read and written in the update's own pass. */
#if MP__VW == 16
MP__HOT __m512 mp__vld_as(const void *p, mp_dtype t, size_t i) {
    if (t == MP_FLOAT32) return _mm512_loadu_ps((const float *)p + i);
    if (t == MP_FLOAT16) return mp__z_widen_f16(_mm256_loadu_si256((const __m256i *)((const mp_f16 *)p + i)));
    return mp__z_widen_bf16(_mm256_loadu_si256((const __m256i *)((const mp_bf16 *)p + i)));
}
/* mp_convert's rule for its results (MP__CAST_FAR), where p is on a line */
MP__HOT int mp__streams(const void *p, size_t n) { return n >= MP__CAST_FAR && (uintptr_t)p % 64 == 0; }
MP__HOT void mp__vst2_as(void *p, mp_dtype t, size_t i, __m512 a, __m512 b, int stream) {
    if (t == MP_FLOAT32) {
        _mm512_storeu_ps((float *)p + i, a);
        _mm512_storeu_ps((float *)p + i + 16, b);
    } else if (t == MP_FLOAT16) {
        mp__z_put2_f16(p, i, a, b, stream);
    } else {
        mp__z_put2_bf16(p, i, a, b, stream);
    }
}
#elif MP__VW == 8
MP__HOT __m256 mp__vld_as(const void *p, mp_dtype t, size_t i) {
    return t == MP_FLOAT32 ? mp__x86_load_f32(p, i) : t == MP_FLOAT16 ? mp__x86_load_f16(p, i) : mp__x86_load_bf16(p, i);
}
MP__HOT void mp__vst_as(void *p, mp_dtype t, size_t i, __m256 v) {
    if (t == MP_FLOAT32) mp__x86_store_f32(p, i, v);
    else if (t == MP_FLOAT16) mp__x86_store_f16(p, i, v);
    else mp__x86_store_bf16(p, i, v);
}
#else
static float mp__vld_as(const void *p, mp_dtype t, size_t i) {
    return mp__f32_from_bits(t == MP_FLOAT32 ? mp__load_f32(p, i) : t == MP_FLOAT16 ? mp__load_f16(p, i) : mp__load_bf16(p, i));
}
static void mp__vst_as(void *p, mp_dtype t, size_t i, float v) {
    if (t == MP_FLOAT32) mp__store_f32(p, i, mp__f32_bits(v));
    else if (t == MP_FLOAT16) mp__store_f16(p, i, mp__f32_bits(v));
    else mp__store_bf16(p, i, mp__f32_bits(v));
}
#endif
#if MP__VW != 16
static int mp__streams(const void *p, size_t n) { return (void)p, (void)n, 0; }
static void mp__vst2_as(void *p, mp_dtype t, size_t i, mp__vf a, mp__vf b, int stream) {
    (void)stream;
    mp__vst_as(p, t, i, a);
    mp__vst_as(p, t, i + MP__VW, b);
}
#endif

typedef struct mp__opt_args {
    const mp_optimizer_desc *o;
    float alpha;     /* Adam's step size with both bias corrections */
    float inv_scale; /* the unscale's factor */
    float clip;      /* clipping by norm's factor (mp__clip_factor), where clips */
    int clips;
    float decay;     /* this variable's weight decay, or 0 */
    float *w, *s1, *s2;
    const void *g;
    mp_dtype gt;
    void *wc;
    mp_dtype wt;
    size_t n;        /* the variable's weights */
} mp__opt_args;

/* MP__VW weights at w, s1, s2 and their gradients g, each unscaled first
   (unscale_check's one multiply, so its bits: by 1 where there is no
   scale, which changes no number), then clipped and the weights decayed
   (Keras 3's order: the clip a multiply or a min and max in registers, the
   decay w - (w * wd) * lr); the new weights, also returned. Written once
   over the vector operations P##f, P##ld, P##add, ...: mp__v's, and
   mp__x's below. The clamp's operands are in the order that keeps a NaN
   gradient NaN. */
#define MP__OPT_BLOCK(name, P)                                                                              \
    static mp__vf name(const mp__opt_args *a, mp__vf g, float *w, float *s1, float *s2) {                   \
        const mp_optimizer_desc *o = a->o;                                                                  \
        P##f gv = P##mul(g, P##set(a->inv_scale)), lr_g, wv = P##ld(w);                                     \
        if (a->clips) gv = P##mul(gv, P##set(a->clip));                                                     \
        if (o->clipvalue > 0.0f) gv = P##min(P##set(o->clipvalue), P##max(P##set(-o->clipvalue), gv));     \
        if (a->decay != 0.0f) wv = P##sub(wv, P##mul(P##mul(wv, P##set(a->decay)), P##set(o->learning_rate))); \
        lr_g = P##mul(P##set(o->learning_rate), gv);                                                        \
        if (o->kind == MP_SGD && o->momentum == 0.0f) {                                                     \
            wv = P##sub(wv, lr_g);                                                                          \
        } else if (o->kind == MP_SGD) { /* m = momentum m - lr g; w += m, or nesterov: w += momentum m - lr g */ \
            P##f m = P##sub(P##mul(P##set(o->momentum), P##ld(s1)), lr_g);                                  \
            P##st(s1, m);                                                                                   \
            wv = P##add(wv, o->nesterov ? P##sub(P##mul(P##set(o->momentum), m), lr_g) : m);                \
        } else if (o->kind == MP_RMSPROP) { /* v = rho v + (1 - rho) g^2; w -= lr g / sqrt(v + eps) */      \
            P##f v = P##add(P##mul(P##set(o->rho), P##ld(s1)), P##mul(P##set(1.0f - o->rho), P##mul(gv, gv))); \
            P##st(s1, v);                                                                                   \
            wv = P##sub(wv, P##div(lr_g, P##sqrt(P##add(v, P##set(o->epsilon)))));                          \
        } else { /* Adam: m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2); w -= alpha m / (sqrt(v) + eps) */   \
            P##f m = P##ld(s1), v = P##ld(s2);                                                              \
            m = P##add(m, P##mul(P##sub(gv, m), P##set(1.0f - o->beta_1)));                                 \
            v = P##add(v, P##mul(P##sub(P##mul(gv, gv), v), P##set(1.0f - o->beta_2)));                    \
            P##st(s1, m);                                                                                   \
            P##st(s2, v);                                                                                   \
            wv = P##sub(wv, P##div(P##mul(P##set(a->alpha), m), P##add(P##sqrt(v), P##set(o->epsilon)))); \
        }                                                                                                   \
        P##st(w, wv);                                                                                       \
        return wv;                                                                                          \
    }
MP__OPT_BLOCK(mp__opt_block_v, mp__v)

#if MP__VW == 16
/* g++ takes the `_mm512_undefined_*` inside the conversions below for
   uses of uninitialised values (a false positive, in C++ only), as in the
   GEMM's transposes. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
/* Subnormal results without their microcode assists. On Intel's cores a
   multiply or divide whose result is subnormal, or a square root of a
   subnormal, takes a microcode assist, many times slower than with a
   normal result, while adds and subtracts, and conversions between
   float32 and float64, take none. RMSprop's v decays through the
   subnormals wherever the gradients are tiny, and a model that trained a
   few hundred steps on one batch then stepped several times slower,
   nearly all of it in RMSprop (bench/train.c times the step). In a block
   with a gradient below 2^-60 or a state below 2^-100 in magnitude (where
   the float path's products can leave the normal range), each multiply
   with an operand below 2^-60, each divide with a dividend below 2^-60 and
   each square root of a subnormal runs in float64 and is rounded to
   float32 once: a float32 value is normal in float64, and rounding the
   float64 result of + - x / or sqrt to float32 gives the float32 result
   (53 >= 2 x 24 + 2 bits; a product of two float32 values is even exact),
   so the bits are the float path's. */
enum {
    MP__BELOW_2_60 = 0x21800000,  /* 2^-60's bits */
    MP__BELOW_2_100 = 0x0D800000, /* 2^-100's */
    MP__BELOW_2_126 = 0x00800000  /* the least normal float32 */
};
/* The lanes of x with a nonzero magnitude below the float32 whose bits are
   `bits`: |x| - 1 wraps for 0 and lies above for Inf and NaN. */
static __mmask16 mp__below(__m512 x, uint32_t bits) {
    __m512i a = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF));
    return _mm512_cmplt_epu32_mask(_mm512_sub_epi32(a, _mm512_set1_epi32(1)), _mm512_set1_epi32((int)(bits - 1u)));
}
/* a * b, a / b or sqrt(a) (op 0, 1, 2) in float64, rounded to float32. */
static __m512d mp__f64_half(__m512d a, __m512d b, int op) {
    return op == 0 ? _mm512_mul_pd(a, b) : op == 1 ? _mm512_div_pd(a, b) : _mm512_maskz_sqrt_pd((__mmask8)0xFF, a);
}
static __m512 mp__in_f64(__m512 a, __m512 b, int op) {
    __m256 a_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    __m256 b_hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(b), 1));
    __m256 lo = _mm512_cvtpd_ps(mp__f64_half(_mm512_cvtps_pd(_mm512_castps512_ps256(a)),
                                             _mm512_cvtps_pd(_mm512_castps512_ps256(b)), op));
    __m256 hi = _mm512_cvtpd_ps(mp__f64_half(_mm512_cvtps_pd(a_hi), _mm512_cvtps_pd(b_hi), op));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}
typedef __m512 mp__xf;
#define mp__xld mp__vld
#define mp__xst mp__vst
#define mp__xset mp__vset
#define mp__xadd mp__vadd
#define mp__xsub mp__vsub
#define mp__xmin mp__vmin
#define mp__xmax mp__vmax
static __m512 mp__xmul(__m512 a, __m512 b) {
    return mp__below(a, MP__BELOW_2_60) | mp__below(b, MP__BELOW_2_60) ? mp__in_f64(a, b, 0) : _mm512_mul_ps(a, b);
}
static __m512 mp__xdiv(__m512 a, __m512 b) {
    return mp__below(a, MP__BELOW_2_60) ? mp__in_f64(a, b, 1) : _mm512_div_ps(a, b);
}
static __m512 mp__xsqrt(__m512 a) { return mp__below(a, MP__BELOW_2_126) ? mp__in_f64(a, a, 2) : mp__vsqrt(a); }
MP__OPT_BLOCK(mp__opt_block_x, mp__x)
#undef mp__xld
#undef mp__xst
#undef mp__xset
#undef mp__xadd
#undef mp__xsub
#undef mp__xmin
#undef mp__xmax
#endif

static mp__vf mp__opt_block(const mp__opt_args *a, mp__vf g, float *w, float *s1, float *s2) {
#if MP__VW == 16
    if (mp__below(g, MP__BELOW_2_60) | mp__below(mp__vld(s1), MP__BELOW_2_100) | mp__below(mp__vld(s2), MP__BELOW_2_100))
        return mp__opt_block_x(a, g, w, s1, s2);
#endif
    return mp__opt_block_v(a, g, w, s1, s2);
}
#if MP__VW == 16 && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#undef MP__OPT_BLOCK

/* Two blocks from element i of the gradients g (dtype gt) and the weights
   and slots w, s1, s2 (offset i already), the copy's elements i.. of wc. */
static void mp__opt_pair(const mp__opt_args *a, const void *g, mp_dtype gt, size_t i, float *w, float *s1, float *s2,
                         void *wc, int stream) {
    mp__vf w0 = mp__opt_block(a, mp__vld_as(g, gt, i), w, s1, s2);
    mp__vf w1 = mp__opt_block(a, mp__vld_as(g, gt, i + MP__VW), w + MP__VW, s1 + MP__VW, s2 + MP__VW);
    if (wc) mp__vst2_as(wc, a->wt, i, w0, w1, stream);
}

/* Updates [begin, end) two blocks at a time: each block's gradients
   widened as they are read and the copy in the compute dtype (the
   AutoCastVariable read, once a step) rounded from the new weights in
   registers, in the update's one pass over memory; the copy of a variable
   of MP__CAST_FAR weights or more goes around the caches, as mp_convert's
   results of that size do (mp__streams, >>bulk casts), so that its stores
   do not read each line first. A pass over chunks in L1 instead (widen a
   chunk of 16-bit gradients, update it, cast its weights with mp_convert)
   made mixed_bfloat16's update at 4096 units and batch 128, from memory,
   slower; at 1024 units, in cache, it was the same either way
   (bench/train.c's step). The tail goes through one padded pair. */
static void mp__opt_range(void *args, size_t begin, size_t end, int thread) {
    enum { PAIR = 2 * MP__VW };
    const mp__opt_args *a = (const mp__opt_args *)args;
    size_t i, full = begin + (end - begin) / PAIR * PAIR, rest = end - full;
    float w[PAIR], g[PAIR], s1[PAIR] = {0}, s2[PAIR] = {0}; /* the state an optimizer lacks: 0s */
    int stream = a->wc && mp__streams(mp__at(a->wc, a->wt, begin), a->n);
    (void)thread;
    for (i = begin; i < full; i += PAIR)
        mp__opt_pair(a, a->g, a->gt, i, a->w + i, a->s1 ? a->s1 + i : s1, a->s2 ? a->s2 + i : s2, a->wc, stream);
#if MP__VW == 16
    if (stream) _mm_sfence(); /* the streamed lines before any later store (>>bulk casts) */
#endif
    if (!rest) return;
    memset(w, 0, sizeof w); memset(g, 0, sizeof g); memset(s1, 0, sizeof s1); memset(s2, 0, sizeof s2);
    memcpy(w, a->w + full, rest * sizeof(float));
    mp__load(g, mp__at(a->g, a->gt, full), a->gt, rest);
    if (a->s1) memcpy(s1, a->s1 + full, rest * sizeof(float));
    if (a->s2) memcpy(s2, a->s2 + full, rest * sizeof(float));
    mp__opt_pair(a, g, MP_FLOAT32, 0, w, s1, s2, NULL, 0);
    memcpy(a->w + full, w, rest * sizeof(float));
    if (a->s1) memcpy(a->s1 + full, s1, rest * sizeof(float));
    if (a->s2) memcpy(a->s2 + full, s2, rest * sizeof(float));
    if (a->wc) mp__store(mp__at_mut(a->wc, a->wt, full), a->wt, w, rest);
}

static void mp__cpu_optimizer_update(void *ctx, const mp_opt_step *step, float *w, const void *g, mp_dtype gt,
                                     const float *scale, float *s1, float *s2, size_t n, void *wc, mp_dtype wt,
                                     const int *found_inf) {
    const mp_optimizer_desc *o = &step->cfg;
    mp__opt_args a;
    if (found_inf && *found_inf) return; /* the skipped step (LossScaleOptimizer) */
    a.o = o;
    a.alpha = mp__adam_alpha(step);
    a.inv_scale = mp__unscale_factor(scale);
    a.clips = step->sum_squares != NULL;
    a.clip = a.clips ? mp__clip_factor(o, *step->sum_squares) : 1.0f;
    a.decay = step->weight_decay;
    a.w = w;
    a.g = g;
    a.gt = gt;
    a.s1 = s1;
    a.s2 = s2;
    a.wc = wc;
    a.wt = wt;
    a.n = n;
    mp__parallel_range(mp__pool_of(ctx), n, mp__opt_range, &a);
}

/* Clipping by norm's sum of squares (mp_backend.sum_squares) in >>rules'
   order: the blocks of a round split across the threads, each block's sum
   kept apart, then the round's added in order, so the bits are the same at
   any thread count. */
enum { MP__SUM_ROUND = 256 }; /* blocks */
typedef struct mp__squares_args {
    const void *g;
    mp_dtype gt;
    float inv_scale;
    size_t n;                   /* the round's values */
    float part[MP__SUM_ROUND]; /* each block's sum */
} mp__squares_args;

static void mp__squares_range(void *args, size_t begin, size_t end, int thread) {
    mp__squares_args *a = (mp__squares_args *)args;
    float t[MP__RUN + 8];
    size_t b, i, j, len;
    (void)thread;
    for (b = begin; b < end; b++) {
        float lane[8] = {0};
        size_t at = b * MP__SUM_SQUARES_BLOCK, stop = mp__min(at + MP__SUM_SQUARES_BLOCK, a->n);
        for (i = at; i < stop; i += len) { /* MP__RUN is a multiple of 8: j's lane is the block's */
            len = mp__min(MP__RUN, stop - i);
            mp__load(t, mp__at(a->g, a->gt, i), a->gt, len);
            if (len % 8) memset(t + len, 0, (8 - len % 8) * sizeof(float)); /* + 0 changes no lane */
            for (j = 0; j < len; j += 8) { /* eight lanes at once: one vector where there are some */
                int l;
                for (l = 0; l < 8; l++) {
                    float u = t[j + (size_t)l] * a->inv_scale;
                    lane[l] += u * u;
                }
            }
        }
        a->part[b] = mp__sum_squares_lanes(lane);
    }
}

static void mp__cpu_sum_squares(void *ctx, float *sum, const void *g, mp_dtype gt, size_t n, const float *scale) {
    mp__squares_args a;
    float total = 0.0f;
    size_t at, b, blocks, round = (size_t)MP__SUM_ROUND * MP__SUM_SQUARES_BLOCK;
    a.gt = gt;
    a.inv_scale = mp__unscale_factor(scale);
    for (at = 0; at < n; at += round) {
        a.g = mp__at(g, gt, at);
        a.n = mp__min(round, n - at);
        blocks = (a.n + MP__SUM_SQUARES_BLOCK - 1) / MP__SUM_SQUARES_BLOCK;
        mp__parallel_items(mp__pool_of(ctx), blocks, MP__SUM_SQUARES_BLOCK, mp__squares_range, &a);
        for (b = 0; b < blocks; b++) total += a.part[b];
    }
    *sum += total;
}

/* >>cpu backend: convolution, pooling, dropout (NHWC; Keras's channels_last), images in groups */
typedef struct mp__conv_args {
    void *col;
    const void *img;
    float *fimg;
    const float *fcol;
    const mp_conv_geom *g;
    mp_dtype dt;
} mp__conv_args;

static size_t mp__col_elems(const mp_conv_geom *g) {
    return (size_t)g->oh * (size_t)g->ow * (size_t)g->kh * (size_t)g->kw * (size_t)g->c;
}
static size_t mp__img_elems(const mp_conv_geom *g) { return (size_t)g->h * (size_t)g->w * (size_t)g->c; }

/* The kernel's columns [*kx0, *kx1) of row ky at output pixel (oy, ox)
   that fall inside the image (the others read padding), and the input
   pixel (y * w + x) the first one reads where there is one (kx0 < kx1);
   none where the row itself is padding. Consecutive kernel columns read
   consecutive pixels, C values each: one run. */
static size_t mp__kernel_run(const mp_conv_geom *g, int oy, int ox, int ky, int *kx0, int *kx1) {
    int iy = oy * g->sh - g->pt + ky, ix = ox * g->sw - g->pl;
    *kx0 = ix < 0 ? -ix : 0;
    *kx1 = ix + g->kw > g->w ? g->w - ix : g->kw;
    if (iy < 0 || iy >= g->h || *kx1 <= *kx0) {
        *kx0 = *kx1 = 0;
        return 0;
    }
    return (size_t)iy * (size_t)g->w + (size_t)(ix + *kx0);
}

static void mp__im2col_range(void *args, size_t begin, size_t end, int thread) {
    const mp__conv_args *a = (const mp__conv_args *)args;
    const mp_conv_geom *g = a->g;
    size_t es = mp__dtypes[a->dt].size, px = (size_t)g->c * es, i, at;
    int oy, ox, ky, kx0, kx1;
    (void)thread;
    for (i = begin; i < end; i++) {
        unsigned char *out = (unsigned char *)a->col + i * mp__col_elems(g) * es;
        const unsigned char *img = (const unsigned char *)mp__at(a->img, a->dt, i * mp__img_elems(g));
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++) {
                int iy = oy * g->sh - g->pt, ix = ox * g->sw - g->pl;
                /* the window inside the image: KH whole runs, no bounds or padding a row */
                if (iy >= 0 && ix >= 0 && iy + g->kh <= g->h && ix + g->kw <= g->w) {
                    const unsigned char *from = img + ((size_t)iy * (size_t)g->w + (size_t)ix) * px;
                    for (ky = 0; ky < g->kh; ky++, out += (size_t)g->kw * px)
                        memcpy(out, from + (size_t)ky * (size_t)g->w * px, (size_t)g->kw * px);
                    continue;
                }
                for (ky = 0; ky < g->kh; ky++, out += (size_t)g->kw * px) {
                    at = mp__kernel_run(g, oy, ox, ky, &kx0, &kx1); /* padding only where there is some */
                    if (kx0 > 0) memset(out, 0, (size_t)kx0 * px);
                    if (kx1 > kx0) memcpy(out + (size_t)kx0 * px, img + at * px, (size_t)(kx1 - kx0) * px);
                    if (kx1 < g->kw) memset(out + (size_t)kx1 * px, 0, (size_t)(g->kw - kx1) * px);
                }
            }
    }
}

/* Each image pixel sums what the columns give it in the columns' order
   (output pixel, then kernel row, then column): one contribution per
   output pixel and kernel row, so a run over the kernel's columns adds in
   the same order as one column at a time. */
static void mp__col2im_range(void *args, size_t begin, size_t end, int thread) {
    const mp__conv_args *a = (const mp__conv_args *)args;
    const mp_conv_geom *g = a->g;
    size_t i, j, at, c = (size_t)g->c;
    int oy, ox, ky, kx0, kx1;
    (void)thread;
    for (i = begin; i < end; i++) {
        float *img = a->fimg + i * mp__img_elems(g);
        const float *col = a->fcol + i * mp__col_elems(g);
        memset(img, 0, mp__img_elems(g) * sizeof(float));
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++)
                for (ky = 0; ky < g->kh; ky++, col += (size_t)g->kw * c) {
                    at = mp__kernel_run(g, oy, ox, ky, &kx0, &kx1);
                    for (j = 0; j < (size_t)(kx1 - kx0) * c; j++) img[at * c + j] += col[(size_t)kx0 * c + j];
                }
    }
}

/* The images split among the threads (mp__parallel_items: whole images,
   once there are enough values): each image's bytes are the same
   whichever thread makes them. A group's im2col splits even where it is
   short (7 images of 13 x 13 x 32, long runs): the product that follows
   splits its rows, the same images, the same way, and each thread then
   reads its columns from its own cache; im2col on one thread made the
   convnet's second layer slower on 2 threads (bench/convnet.c's model,
   timed layer by layer). */
static void mp__cpu_im2col(void *ctx, void *col, const void *img, size_t n, const mp_conv_geom *g, mp_dtype dt) {
    mp__conv_args a;
    memset(&a, 0, sizeof a);
    a.col = col, a.img = img, a.g = g, a.dt = dt;
    mp__parallel_items(mp__pool_of(ctx), n, mp__col_elems(g), mp__im2col_range, &a);
}

static void mp__cpu_conv_flip(void *ctx, void *dst, const void *src, const mp_conv_geom *g, size_t filters,
                              mp_dtype dt) {
    size_t es = mp__dtypes[dt].size, c = (size_t)g->c, taps = (size_t)g->kh * (size_t)g->kw, t, ci, f;
    (void)ctx;
    for (t = 0; t < taps; t++)
        for (f = 0; f < filters; f++)
            for (ci = 0; ci < c; ci++)
                memcpy((unsigned char *)dst + ((t * filters + f) * c + ci) * es,
                       (const unsigned char *)src + (((taps - 1 - t) * c + ci) * filters + f) * es, es);
}

static void mp__cpu_col2im(void *ctx, float *img, const float *col, size_t n, const mp_conv_geom *g) {
    mp__conv_args a;
    memset(&a, 0, sizeof a);
    a.fimg = img, a.fcol = col, a.g = g;
    mp__parallel_items(mp__pool_of(ctx), n, mp__col_elems(g), mp__col2im_range, &a);
}

/* Conv2D's products a group of images at a time (mp_backend.conv_gemm):
   each thread makes its groups' columns in its own block and multiplies
   them at once, while they are in its cache, by its own product
   (mp__gemm_alone): one pass of the pool per product rather than two per
   group (im2col's and gemm's), whose barriers took a third of a 2-thread
   ResNet step at batch 128 (bench/convnet.c --model resnet). A group's
   rows are the same whichever thread makes them; a weight gradient's
   runs of groups (MP_CONV_PARTS) are summed apart and added in order. */
typedef struct mp__conv_job {
    const mp_gemm_args *g;
    const mp_conv_geom *geom;
    mp_pool *pool;
    size_t images, group, groups, parts;
    unsigned char *cols; /* thread t's columns at cols + t * col_bytes */
    size_t col_bytes;
    float *sums;         /* runs 1, 2, ... of a weight gradient, m n floats each */
} mp__conv_job;

static size_t mp__conv_col_bytes(const mp_conv_geom *geom, size_t group, mp_dtype dt) {
    return mp__round_up(group * mp__col_elems(geom) * mp__dtypes[dt].size, 64);
}

/* The part of g (mp_backend.conv_gemm's) that the `rows` column rows from
   row0 on make, cols those columns: C's rows (trans_a 0), or their
   cols^T B (trans_a 1, C as g's). */
static mp_gemm_args mp__group_product(const mp_gemm_args *g, const void *cols, size_t row0, size_t rows) {
    mp_gemm_args p = *g;
    p.a = cols;
    if (g->trans_a) {
        p.k = rows;
        p.b = mp__at(g->b, g->bt, row0 * g->n);
        return p;
    }
    p.m = rows;
    p.c = mp__at_mut(g->c, g->ct, row0 * g->n);
    p.z = g->z ? mp__at_mut(g->z, g->ct, row0 * g->n) : NULL;
    p.relu_y = g->relu_y ? mp__at(g->relu_y, g->ct, row0 * g->n) : NULL;
    return p;
}

/* Group i's columns made by thread t, then its product: C's rows of the
   group (trans_a 0), or its cols^T B onto c (trans_a 1). */
static void mp__conv_group_product(const mp__conv_job *job, int t, size_t i, float *c, int accumulate) {
    const mp_gemm_args *g = job->g;
    size_t first = i * job->group, n = mp__min(job->group, job->images - first);
    size_t pixels = (size_t)job->geom->oh * (size_t)job->geom->ow;
    mp__conv_args a;
    mp_gemm_args p;
    memset(&a, 0, sizeof a);
    a.col = job->cols + (size_t)t * job->col_bytes, a.img = mp__at(g->a, g->at, first * mp__img_elems(job->geom));
    a.g = job->geom, a.dt = g->at;
    mp__im2col_range(&a, 0, n, t);
    p = mp__group_product(g, a.col, first * pixels, n * pixels);
    if (g->trans_a) p.c = c, p.accumulate = accumulate;
    mp__gemm_alone(job->pool, t, &p);
}

/* [*i0, *i1): share k of `shares` even shares of `count` items, in order. */
static void mp__share(size_t count, size_t k, size_t shares, size_t *i0, size_t *i1) {
    *i0 = count * k / shares;
    *i1 = count * (k + 1) / shares;
}

static void mp__conv_task(void *ctx, int t, int threads) {
    const mp__conv_job *job = (const mp__conv_job *)ctx;
    const mp_gemm_args *g = job->g;
    size_t i, i0, i1, p, p0, p1;
    if (!g->trans_a) {
        mp__share(job->groups, (size_t)t, (size_t)threads, &i0, &i1);
        for (i = i0; i < i1; i++) mp__conv_group_product(job, t, i, NULL, 0);
        return;
    }
    mp__share(job->parts, (size_t)t, (size_t)threads, &p0, &p1);
    for (p = p0; p < p1; p++) {
        float *c = p ? job->sums + (p - 1) * g->m * g->n : (float *)g->c;
        mp__share(job->groups, p, job->parts, &i0, &i1);
        for (i = i0; i < i1; i++) mp__conv_group_product(job, t, i, c, i > i0 || (p == 0 && g->accumulate));
    }
}

/* C += runs 1, 2, ... in order, a range of C's values a thread. */
static void mp__conv_sum_range(void *args, size_t begin, size_t end, int thread) {
    const mp__conv_job *job = (const mp__conv_job *)args;
    size_t p, mn = job->g->m * job->g->n;
    (void)thread;
    for (p = 1; p < job->parts; p++) mp__add_run((float *)job->g->c + begin, job->sums + (p - 1) * mn + begin, end - begin);
}

static void mp__cpu_conv_gemm(void *ctx, const mp_gemm_args *g, const mp_conv_geom *geom, size_t images, size_t group,
                              void *scratch) {
    mp_pool *pool = mp__pool_of(ctx);
    mp__conv_job job;
    job.g = g, job.geom = geom, job.pool = pool;
    job.images = images, job.group = group, job.groups = (images + group - 1) / group;
    job.parts = g->trans_a ? mp__min(job.groups, (size_t)MP_CONV_PARTS) : 1;
    job.cols = (unsigned char *)scratch;
    job.col_bytes = mp__conv_col_bytes(geom, group, g->at);
    job.sums = (float *)(job.cols + (size_t)mp_pool_threads(pool) * job.col_bytes);
    mp__pool_run(pool, mp__conv_task, &job, mp_pool_threads(pool));
    if (job.parts > 1) mp__parallel_range(pool, g->m * g->n, mp__conv_sum_range, &job);
}

/* Max pooling with strides equal to the pool (Keras's default), valid
   padding; the first maximum of a window wins, NaN propagates (the first
   NaN). Each image is a task of its own (mp__parallel_items), whichever
   thread runs it: the same bits on any thread count. A window's channels
   go MP__VW at a time, the position that won each kept beside it as a
   float (mp__vmax_first), without a branch on the data: a branch per
   value, taken as often as not on real activations, cost more than all
   the rest of the pass (bench/train.c's convnet). */
#if MP__VW == 16
/* t where it beats best (greater, or NaN over a number), best elsewhere;
   *arg = pos where t won. */
static __m512 mp__vmax_first(__m512 best, __m512 t, __m512 *arg, __m512 pos) {
    __mmask16 take = _mm512_cmp_ps_mask(t, best, _CMP_GT_OQ) |
                     (_mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q));
    *arg = _mm512_mask_blend_ps(take, *arg, pos);
    return _mm512_mask_blend_ps(take, best, t);
}
/* v where arg == pos, +0 elsewhere */
static __m512 mp__vkeep_at(__m512 v, __m512 arg, __m512 pos) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(arg, pos, _CMP_EQ_OQ), v);
}
#elif MP__VW == 8
static __m256 mp__vmax_first(__m256 best, __m256 t, __m256 *arg, __m256 pos) {
    __m256 take = _mm256_or_ps(_mm256_cmp_ps(t, best, _CMP_GT_OQ),
                               _mm256_and_ps(_mm256_cmp_ps(t, t, _CMP_UNORD_Q), _mm256_cmp_ps(best, best, _CMP_ORD_Q)));
    *arg = _mm256_blendv_ps(*arg, pos, take);
    return _mm256_blendv_ps(best, t, take);
}
static __m256 mp__vkeep_at(__m256 v, __m256 arg, __m256 pos) { return _mm256_and_ps(_mm256_cmp_ps(arg, pos, _CMP_EQ_OQ), v); }
#else
static float mp__vmax_first(float best, float t, float *arg, float pos) {
    int take = t > best || (t != t && best == best);
    *arg = take ? pos : *arg;
    return take ? t : best;
}
static float mp__vkeep_at(float v, float arg, float pos) { return arg == pos ? v : 0.0f; }
#endif

typedef struct mp__pool_args {
    void *y, *dx;
    const void *x, *dy;
    const mp_conv_geom *g;
    mp_dtype dt, dxt;
} mp__pool_args;

/* Element index of (img, y, x, channel 0) in an NHWC batch of h x w x c images. */
static size_t mp__nhwc(size_t img, size_t y, size_t x, int h, int w, int c) {
    return ((img * (size_t)h + y) * (size_t)w + x) * (size_t)c;
}

/* The window at (oy, ox) over channels [c0, c0 + len): its maxima in
   best and their positions in arg (ky * kw + kx), both padded with zeros
   to whole vectors (len <= MP__TILE, a multiple of MP__VW). */
static void mp__pool_window(float *best, float *arg, const mp__pool_args *a, size_t img, int oy, int ox, size_t c0,
                            size_t len) {
    const mp_conv_geom *g = a->g;
    float t[MP__TILE];
    size_t j, pad = mp__round_up(len, MP__VW);
    int ky, kx, pos = 0;
    for (ky = 0; ky < g->kh; ky++)
        for (kx = 0; kx < g->kw; kx++, pos++) {
            size_t iy = (size_t)(oy * g->sh + ky), ix = (size_t)(ox * g->sw + kx);
            float *into = pos ? t : best;
            mp__load(into, mp__at(a->x, a->dt, mp__nhwc(img, iy, ix, g->h, g->w, g->c) + c0), a->dt, len);
            memset(into + len, 0, (pad - len) * sizeof(float));
            if (!pos) {
                memset(arg, 0, pad * sizeof(float));
                continue;
            }
            for (j = 0; j < pad; j += MP__VW) {
                mp__vf v = mp__vld(arg + j);
                mp__vst(best + j, mp__vmax_first(mp__vld(best + j), mp__vld(t + j), &v, mp__vset((float)pos)));
                mp__vst(arg + j, v);
            }
        }
}

static void mp__max_pool_range(void *args, size_t begin, size_t end, int thread) {
    const mp__pool_args *a = (const mp__pool_args *)args;
    const mp_conv_geom *g = a->g;
    float best[MP__TILE], arg[MP__TILE];
    size_t img, c0, len, c = (size_t)g->c;
    int oy, ox;
    (void)thread;
    for (img = begin; img < end; img++)
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++)
                for (c0 = 0; c0 < c; c0 += len) {
                    len = mp__min(MP__TILE, c - c0);
                    mp__pool_window(best, arg, a, img, oy, ox, c0, len);
                    mp__store(mp__at_mut(a->y, a->dt, mp__nhwc(img, (size_t)oy, (size_t)ox, g->oh, g->ow, g->c) + c0),
                              a->dt, best, len);
                }
}

/* Each window's gradient to the position that won, +0 to the others; +0
   where no window reaches. */
static void mp__max_pool_backward_range(void *args, size_t begin, size_t end, int thread) {
    const mp__pool_args *a = (const mp__pool_args *)args;
    const mp_conv_geom *g = a->g;
    float best[MP__TILE], arg[MP__TILE], grad[MP__TILE], out[MP__TILE];
    size_t img, c0, len, j, pos, c = (size_t)g->c, size = mp__img_elems(g) * mp__dtypes[a->dxt].size;
    int oy, ox;
    (void)thread;
    memset(mp__at_mut(a->dx, a->dxt, begin * mp__img_elems(g)), 0, (end - begin) * size);
    for (img = begin; img < end; img++)
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++)
                for (c0 = 0; c0 < c; c0 += len) {
                    len = mp__min(MP__TILE, c - c0);
                    mp__pool_window(best, arg, a, img, oy, ox, c0, len);
                    mp__load(grad, mp__at(a->dy, a->dt, mp__nhwc(img, (size_t)oy, (size_t)ox, g->oh, g->ow, g->c) + c0),
                             a->dt, len);
                    memset(grad + len, 0, (mp__round_up(len, MP__VW) - len) * sizeof(float));
                    for (pos = 0; pos < (size_t)(g->kh * g->kw); pos++) {
                        size_t iy = (size_t)oy * (size_t)g->sh + pos / (size_t)g->kw;
                        size_t ix = (size_t)ox * (size_t)g->sw + pos % (size_t)g->kw;
                        for (j = 0; j < len; j += MP__VW)
                            mp__vst(out + j, mp__vkeep_at(mp__vld(grad + j), mp__vld(arg + j), mp__vset((float)pos)));
                        mp__store(mp__at_mut(a->dx, a->dxt, mp__nhwc(img, iy, ix, g->h, g->w, g->c) + c0), a->dxt, out,
                                  len);
                    }
                }
}

/* Average pooling, valid padding (AveragePooling2D, and
   GlobalAveragePooling2D as one window over the whole image): an output is
   its window's float32 sum in (ky, kx) order divided once by the window's
   size, TensorFlow's AvgPool (the mean). Its gradient at an input cell is
   the float32 sum, in (oy, ox) order, of dy / size over the windows that
   hold the cell (TensorFlow's AvgPoolGrad spreads dy / size over each
   window), rounded once; 0 where none does. Rows of the output (of dx for
   the gradient) are split among the threads, and every element's sum runs
   in this fixed order whichever thread does it (the CUDA backend's too). */
typedef struct mp__avg_args {
    void *out;
    const void *in;
    mp_dtype outt, dt;
    const mp_conv_geom *g;
} mp__avg_args;

/* A row of y (image r / oh, oy = r % oh) goes out a tile at a time, each
   tile holding the channels of one or more cells: one rounding call per
   tile, not per cell (a 2x2 pool of a few channels). */
static void mp__avg_pool_rows(void *args, size_t r0, size_t r1, int thread) {
    const mp__avg_args *a = (const mp__avg_args *)args;
    const mp_conv_geom *g = a->g;
    float acc[MP__TILE], t[MP__TILE], size = (float)(g->kh * g->kw);
    size_t r, e0, k, j, len, run, c = (size_t)g->c, row = (size_t)g->ow * c;
    int ky, kx;
    (void)thread;
    for (r = r0; r < r1; r++) {
        size_t img = r / (size_t)g->oh, oy = r % (size_t)g->oh;
        for (e0 = 0; e0 < row; e0 += len) {
            len = mp__min(MP__TILE, row - e0);
            for (k = 0; k < len; k += run) { /* the piece of the tile that is cell ox's channels [c0, c0 + run) */
                size_t ox = (e0 + k) / c, c0 = (e0 + k) % c;
                run = mp__min(c - c0, len - k);
                memset(acc + k, 0, run * sizeof(float));
                for (ky = 0; ky < g->kh; ky++)
                    for (kx = 0; kx < g->kw; kx++) {
                        size_t iy = oy * (size_t)g->sh + (size_t)ky, ix = ox * (size_t)g->sw + (size_t)kx;
                        mp__load(t, mp__at(a->in, a->dt, mp__nhwc(img, iy, ix, g->h, g->w, g->c) + c0), a->dt, run);
                        mp__add_run(acc + k, t, run);
                    }
                for (j = 0; j < run; j++) acc[k + j] /= size;
            }
            mp__store(mp__at_mut(a->out, a->outt, r * row + e0), a->outt, acc, len);
        }
    }
}

/* The windows along one axis that hold input position i: [*lo, *hi], empty
   when *lo > *hi (a border no window reaches). */
static void mp__windows_holding(int i, int k, int s, int outs, int *lo, int *hi) {
    *lo = i < k ? 0 : (i - k) / s + 1;
    *hi = i / s < outs - 1 ? i / s : outs - 1;
}

/* A row of dx (image r / h, iy = r % h) goes out a tile at a time, each tile
   holding the channels of one or more cells: one rounding call per tile,
   not per cell (a global pool's gradient has a few channels per cell). */
static void mp__avg_pool_backward_rows(void *args, size_t r0, size_t r1, int thread) {
    const mp__avg_args *a = (const mp__avg_args *)args;
    const mp_conv_geom *g = a->g;
    float acc[MP__TILE], t[MP__TILE], size = (float)(g->kh * g->kw);
    size_t r, e0, k, j, len, run, c = (size_t)g->c, row = (size_t)g->w * c;
    int oy, ox, oy_lo, oy_hi, ox_lo, ox_hi;
    (void)thread;
    for (r = r0; r < r1; r++) {
        size_t img = r / (size_t)g->h, iy = r % (size_t)g->h;
        mp__windows_holding((int)iy, g->kh, g->sh, g->oh, &oy_lo, &oy_hi);
        for (e0 = 0; e0 < row; e0 += len) {
            len = mp__min(MP__TILE, row - e0);
            for (k = 0; k < len; k += run) { /* the piece of the tile that is cell ix's channels [c0, c0 + run) */
                size_t ix = (e0 + k) / c, c0 = (e0 + k) % c;
                run = mp__min(c - c0, len - k);
                mp__windows_holding((int)ix, g->kw, g->sw, g->ow, &ox_lo, &ox_hi);
                memset(acc + k, 0, run * sizeof(float));
                for (oy = oy_lo; oy <= oy_hi; oy++)
                    for (ox = ox_lo; ox <= ox_hi; ox++) {
                        mp__load(t, mp__at(a->in, a->dt, mp__nhwc(img, (size_t)oy, (size_t)ox, g->oh, g->ow, g->c) + c0),
                                 a->dt, run);
                        for (j = 0; j < run; j++) acc[k + j] += t[j] / size;
                    }
            }
            mp__store(mp__at_mut(a->out, a->outt, r * row + e0), a->outt, acc, len);
        }
    }
}

static void mp__cpu_avg_pool(void *ctx, void *y, const void *x, size_t n, const mp_conv_geom *g, mp_dtype dt) {
    mp__avg_args a;
    a.out = y, a.in = x, a.outt = a.dt = dt, a.g = g;
    mp__parallel_items(mp__pool_of(ctx), n * (size_t)g->oh, (size_t)g->ow * (size_t)g->kh * (size_t)g->kw * (size_t)g->c,
                       mp__avg_pool_rows, &a);
}

static void mp__cpu_avg_pool_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, size_t n, const mp_conv_geom *g,
                                      mp_dtype dt) {
    mp__avg_args a;
    a.out = dx, a.in = dy, a.outt = dxt, a.dt = dt, a.g = g;
    mp__parallel_items(mp__pool_of(ctx), n * (size_t)g->h, (size_t)g->w * (size_t)g->c, mp__avg_pool_backward_rows, &a);
}

static void mp__cpu_max_pool(void *ctx, void *y, const void *x, size_t n, const mp_conv_geom *g, mp_dtype dt) {
    mp__pool_args a;
    memset(&a, 0, sizeof a);
    a.y = y, a.x = x, a.g = g, a.dt = dt;
    mp__parallel_items(mp__pool_of(ctx), n, mp__img_elems(g), mp__max_pool_range, &a);
}

static void mp__cpu_max_pool_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, size_t n,
                                      const mp_conv_geom *g, mp_dtype dt) {
    mp__pool_args a;
    memset(&a, 0, sizeof a);
    a.dx = dx, a.dxt = dxt, a.dy = dy, a.x = x, a.g = g, a.dt = dt;
    mp__parallel_items(mp__pool_of(ctx), n, mp__img_elems(g), mp__max_pool_backward_range, &a);
}

/* Dropout's mask and its product split the values among the threads: each
   value's draw depends on its index alone (mp_dropout_draw). */
typedef struct mp__dropout_args {
    unsigned char *mask;
    const unsigned char *keep;
    void *y;
    const void *x;
    mp_dtype yt, xt;
    float rate, scale;
    uint64_t seed;
} mp__dropout_args;

static void mp__dropout_mask_range(void *args, size_t begin, size_t end, int thread) {
    const mp__dropout_args *a = (const mp__dropout_args *)args;
    size_t i;
    (void)thread;
    for (i = begin; i < end; i++) a->mask[i] = (unsigned char)(mp_dropout_draw(a->seed, i) >= a->rate);
}

static void mp__dropout_range(void *args, size_t begin, size_t end, int thread) {
    const mp__dropout_args *a = (const mp__dropout_args *)args;
    float t[MP__TILE];
    size_t i, j, len;
    (void)thread;
    for (i = begin; i < end; i += len) {
        len = mp__min(MP__TILE, end - i);
        mp__load(t, mp__at(a->x, a->xt, i), a->xt, len);
        for (j = 0; j < len; j++) t[j] = a->keep[i + j] ? t[j] * a->scale : 0.0f;
        mp__store(mp__at_mut(a->y, a->yt, i), a->yt, t, len);
    }
}

static void mp__cpu_dropout_mask(void *ctx, unsigned char *mask, size_t n, float rate, uint64_t seed) {
    mp__dropout_args a;
    memset(&a, 0, sizeof a);
    a.mask = mask, a.rate = rate, a.seed = seed;
    mp__parallel_range(mp__pool_of(ctx), n, mp__dropout_mask_range, &a);
}

static void mp__cpu_dropout(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype xt, const unsigned char *mask,
                            size_t n, float scale) {
    mp__dropout_args a;
    memset(&a, 0, sizeof a);
    a.keep = mask, a.y = y, a.yt = yt, a.x = x, a.xt = xt, a.scale = scale;
    mp__parallel_range(mp__pool_of(ctx), n, mp__dropout_range, &a);
}

/* >>cpu backend: normalization. BatchNormalization and LayerNormalization
   (Keras 3, keras/src/layers/normalization/batch_normalization.py and
   layer_normalization.py); the per-element math and the order of every
   sum are >>rules' (mp__norm_*). Column sums split the columns among the
   threads, whole cache lines of a row each, and each thread sums its
   columns in the shape's order; the per-row work splits the rows. Either
   way no value depends on the thread count. */
typedef struct mp__norm_args {
    void *out;                     /* y or dx */
    mp_dtype outt, dt;             /* out's dtype; x's and dy's */
    const void *x, *dy;
    size_t rows, cols;
    const float *gamma_beta;       /* gamma[cols] then beta[cols] */
    const float *stats;            /* BatchNormalization: mean[cols] then var[cols];
                                      LayerNormalization: (mean, rstd) per row */
    float *stats_out;              /* where they are written, or NULL */
    float *moving, *sums;          /* BatchNormalization's moving statistics; the column sums out */
    float momentum, epsilon;
} mp__norm_args;

static void mp__norm_begin(mp__norm_args *a, void *out, mp_dtype outt, const void *x, const void *dy, mp_dtype dt,
                           size_t rows, size_t cols, const float *gamma_beta, float epsilon) {
    memset(a, 0, sizeof *a);
    a->out = out, a->outt = outt, a->x = x, a->dy = dy, a->dt = dt, a->rows = rows, a->cols = cols;
    a->gamma_beta = gamma_beta, a->epsilon = epsilon;
}

/* A column walk's tiles: where a row fits in a tile (cols <= MP__TILE) a
   tile holds mp__norm_tile_rows whole rows, which lie contiguous in x, so
   one load widens them all (a conversion call per row costs more than the
   math of a narrow row) and the hardware prefetchers follow the walk; a
   wider row goes a run of MP__TILE columns of one row at a time. The
   per-column values an element loop reads are laid out as its tile is
   (mp__norm_spread), so that loop runs over the whole tile. The run
   functions go in blocks of 16 with a constant trip count, which
   compilers vectorise, each element's math as >>rules writes it (the
   result goes through a local block, so no check that the arrays overlap
   stops the vectoriser). */
static size_t mp__norm_tile_rows(size_t len, size_t cols) { return len == cols ? MP__TILE / cols : 1; }

/* dst[i] = v[i % len] for i < nr * len: one tile's per-column values. */
static void mp__norm_spread(float *dst, const float *v, size_t len, size_t nr) {
    size_t q;
    for (q = 0; q < nr; q++) memcpy(dst + q * len, v, len * sizeof(float));
}

/* acc += (x - mean)^2 over a run. */
static void mp__norm_dev2_run(float *acc, const float *x, const float *mean, size_t n) {
    size_t j = 0, k;
    for (; j + 16 <= n; j += 16) {
        float d[16];
        for (k = 0; k < 16; k++) d[k] = x[j + k] - mean[j + k];
        for (k = 0; k < 16; k++) acc[j + k] += d[k] * d[k];
    }
    for (; j < n; j++) acc[j] += (x[j] - mean[j]) * (x[j] - mean[j]);
}

/* sgx += g xhat and sg += g over a run, xhat from per-column mean and rstd. */
static void mp__norm_grad_run(float *sgx, float *sg, const float *g, const float *x, const float *mean,
                              const float *rstd, size_t n) {
    size_t j = 0, k;
    for (; j + 16 <= n; j += 16) {
        float d[16];
        for (k = 0; k < 16; k++) d[k] = g[j + k] * mp__norm_xhat(x[j + k], mean[j + k], rstd[j + k]);
        for (k = 0; k < 16; k++) sgx[j + k] += d[k];
        memcpy(d, g + j, sizeof d);
        for (k = 0; k < 16; k++) sg[j + k] += d[k];
    }
    for (; j < n; j++) sgx[j] += g[j] * mp__norm_xhat(x[j], mean[j], rstd[j]), sg[j] += g[j];
}

/* One part's column sums, rows [r0, end) of columns [c0, c0 + len), from
   +0 in row order (>>rules): p1 (and, for MP__NORM_SUM_GRAD, p2) get what
   each element adds. mean and rstd: the columns' (BatchNormalization), or
   NULL for each row's own from a->stats (LayerNormalization). */
static void mp__norm_part_sums(const mp__norm_args *a, int what, size_t c0, size_t len, size_t r0, size_t end,
                               const float *mean, const float *rstd, float *p1, float *p2) {
    float xt[MP__TILE], gt[MP__TILE];
    const float *x, *g = gt;
    size_t r, q, n, j, es = mp__dtypes[a->dt].size, nr = mp__norm_tile_rows(len, a->cols);
    /* a walk of runs a row apart fetches rows ahead, as the bias gradient */
    int ahead = nr == 1 && a->rows * a->cols * es >= MP__FAR;
    for (j = 0; j < len; j++) p1[j] = p2[j] = 0.0f;
    for (r = r0; r < end; r += n) {
        n = mp__min(nr, end - r);
        if (ahead && r + MP__ROWS_AHEAD < a->rows) {
            mp__prefetch_bytes(mp__at(a->x, a->dt, (r + MP__ROWS_AHEAD) * a->cols + c0), len * es);
            if (what == MP__NORM_SUM_GRAD)
                mp__prefetch_bytes(mp__at(a->dy, a->dt, (r + MP__ROWS_AHEAD) * a->cols + c0), len * es);
        }
        x = mp__read_f32(xt, mp__at(a->x, a->dt, r * a->cols + c0), a->dt, n * len);
        if (what == MP__NORM_SUM_GRAD) g = mp__read_f32(gt, mp__at(a->dy, a->dt, r * a->cols + c0), a->dt, n * len);
        for (q = 0; q < n; q++) {
            const float *xq = x + q * len, *gq = g + q * len;
            if (what == MP__NORM_SUM_X) {
                mp__add_run(p1, xq, len);
            } else if (what == MP__NORM_SUM_DEV2) {
                mp__norm_dev2_run(p1, xq, mean, len);
            } else if (mean) {
                mp__norm_grad_run(p1, p2, gq, xq, mean, rstd, len);
            } else {
                float m = a->stats[2 * (r + q)], rs = a->stats[2 * (r + q) + 1];
                for (j = 0; j < len; j++) p1[j] += gq[j] * mp__norm_xhat(xq[j], m, rs), p2[j] += gq[j];
            }
        }
    }
}

/* The column sums of columns [c0, c0 + len) by >>rules' order, the parts'
   sums added in part order into s1 and s2 (mp__norm_part_sums says what
   they sum). */
static void mp__norm_col_sums(const mp__norm_args *a, int what, size_t c0, size_t len, const float *mean,
                              const float *rstd, float *s1, float *s2) {
    float p1[MP__TILE], p2[MP__TILE];
    size_t r0, j, end;
    for (j = 0; j < len; j++) s1[j] = s2[j] = 0.0f;
    for (r0 = 0; r0 < a->rows; r0 = end) {
        end = mp__min(a->rows, r0 + MP__NORM_ROWS);
        mp__norm_part_sums(a, what, c0, len, r0, end, mean, rstd, p1, p2);
        for (j = 0; j < len; j++) s1[j] += p1[j], s2[j] += p2[j];
    }
}

/* Column sums split by parts among the threads, for rows that fit a tile
   (cols <= MP__TILE), where the columns give too few cache lines to split
   (a narrow convolution's channels): each part's sums go to their own
   place in `parts` (2 cols floats a part) and are then added in part
   order, the same bits as one thread's walk; each thread reads whole
   rows, contiguous. */
typedef struct mp__norm_part_job {
    const mp__norm_args *a;
    int what;
    const float *mean, *rstd; /* as mp__norm_part_sums takes them */
    float *parts;
} mp__norm_part_job;

static void mp__norm_parts_range(void *args, size_t p0, size_t p1, int thread) {
    const mp__norm_part_job *j = (const mp__norm_part_job *)args;
    size_t p, cols = j->a->cols;
    (void)thread;
    for (p = p0; p < p1; p++)
        mp__norm_part_sums(j->a, j->what, 0, cols, p * MP__NORM_ROWS, mp__min(j->a->rows, (p + 1) * MP__NORM_ROWS),
                           j->mean, j->rstd, j->parts + 2 * p * cols, j->parts + (2 * p + 1) * cols);
}

static size_t mp__norm_part_count(size_t rows) { return (rows + MP__NORM_ROWS - 1) / MP__NORM_ROWS; }

static void mp__norm_sums_by_parts(void *ctx, const mp__norm_args *a, int what, const float *mean, const float *rstd,
                                   float *parts, float *s1, float *s2) {
    mp__norm_part_job job;
    size_t p, j, n = mp__norm_part_count(a->rows), cols = a->cols;
    job.a = a, job.what = what, job.mean = mean, job.rstd = rstd, job.parts = parts;
    mp__parallel_items(mp__pool_of(ctx), n, MP__NORM_ROWS * cols, mp__norm_parts_range, &job);
    for (j = 0; j < cols; j++) s1[j] = s2[j] = 0.0f;
    for (p = 0; p < n; p++)
        for (j = 0; j < cols; j++) s1[j] += parts[2 * p * cols + j], s2[j] += parts[(2 * p + 1) * cols + j];
}

/* The parts' place for mp__norm_sums_by_parts, or NULL where the columns
   split as they are (one thread, rows wider than a tile, rows enough
   cache lines for every thread) or there is no memory for it: either way
   the same bits. */
static float *mp__norm_parts_alloc(void *ctx, const mp__norm_args *a) {
    int threads = mp_pool_threads(mp__pool_of(ctx));
    size_t lines = a->cols * mp__dtypes[a->dt].size / 64;
    if (threads < 2 || a->cols > MP__TILE || lines >= (size_t)threads || a->rows <= MP__NORM_ROWS) return NULL;
    return (float *)mp__alloc(mp__norm_part_count(a->rows) * 2 * a->cols * sizeof(float));
}

/* Columns [c0, c1) of a->sums = sum dy xhat [cols] then sum dy [cols];
   mean and rstd as mp__norm_col_sums takes them. */
static void mp__norm_grad_sums(const mp__norm_args *a, size_t c0, size_t len, const float *mean, const float *rstd) {
    mp__norm_col_sums(a, MP__NORM_SUM_GRAD, c0, len, mean, rstd, a->sums + c0, a->sums + a->cols + c0);
}

/* A row's sum as a warp sums it (>>rules): acc[MP__NORM_LANES] gets the
   lanes' sums of v[0, n), which starts at a multiple of MP__NORM_LANES of
   the row; mp__norm_lanes_total combines them as the butterfly gives lane
   0 (acc is used up): at distance m, lane l < m adds lane l + m = l ^ m,
   and the lanes past m, which hold the same sums, are not needed. */
static void mp__norm_lanes_add(float *acc, const float *v, size_t n) {
    size_t j, l;
    for (j = 0; j + MP__NORM_LANES <= n; j += MP__NORM_LANES)
        for (l = 0; l < MP__NORM_LANES; l++) acc[l] += v[j + l];
    for (l = 0; j + l < n; l++) acc[l] += v[j + l];
}
static float mp__norm_lanes_total(float *acc) {
    size_t m, l;
    for (m = MP__NORM_LANES / 2; m > 0; m /= 2)
        for (l = 0; l < m; l++) acc[l] += acc[l + m];
    return acc[0];
}

/* BatchNormalization's statistics of columns [c, c + len) from their means
   and sums of squared deviations, and the moving update. */
static void mp__bn_stats_put(const mp__norm_args *a, size_t c, size_t len, const float *mean, const float *dev2) {
    float *stats = a->stats_out;
    size_t j, cols = a->cols;
    for (j = 0; j < len; j++) {
        float var = mp__norm_mean(dev2[j], a->rows);
        stats[c + j] = mean[j], stats[cols + c + j] = var;
        a->moving[c + j] = mp__norm_moving(a->moving[c + j], mean[j], a->momentum);
        a->moving[cols + c + j] = mp__norm_moving(a->moving[cols + c + j], var, a->momentum);
    }
}

/* BatchNormalization's batch statistics and moving update, columns [c0, c1). */
static void mp__bn_stats_cols(void *args, size_t c0, size_t c1, int thread) {
    const mp__norm_args *a = (const mp__norm_args *)args;
    float mean[MP__TILE], s1[MP__TILE], s2[MP__TILE];
    size_t c, j, len;
    (void)thread;
    for (c = c0; c < c1; c += len) {
        len = mp__min(MP__TILE, c1 - c);
        mp__norm_col_sums(a, MP__NORM_SUM_X, c, len, NULL, NULL, s1, s2);
        for (j = 0; j < len; j++) mean[j] = mp__norm_mean(s1[j], a->rows);
        mp__norm_col_sums(a, MP__NORM_SUM_DEV2, c, len, mean, NULL, s1, s2);
        mp__bn_stats_put(a, c, len, mean, s1);
    }
}

/* The same, all columns, their sums by parts (mp__norm_sums_by_parts). */
static void mp__bn_stats_parts(void *ctx, const mp__norm_args *a, float *parts) {
    float mean[MP__TILE], s1[MP__TILE], s2[MP__TILE];
    size_t j;
    mp__norm_sums_by_parts(ctx, a, MP__NORM_SUM_X, NULL, NULL, parts, s1, s2);
    for (j = 0; j < a->cols; j++) mean[j] = mp__norm_mean(s1[j], a->rows);
    mp__norm_sums_by_parts(ctx, a, MP__NORM_SUM_DEV2, mean, NULL, parts, s1, s2);
    mp__bn_stats_put(a, 0, a->cols, mean, s1);
}

/* rstd[0, len) of columns [c, c + len) from the variances in a->stats. */
static void mp__bn_rstd(const mp__norm_args *a, size_t c, size_t len, float *rstd) {
    size_t j;
    for (j = 0; j < len; j++) rstd[j] = mp__norm_rstd(a->stats[a->cols + c + j], a->epsilon);
}

/* out = y(xhat(x)) over a run (out may be x), the per-column values spread as x. */
static void mp__bn_y_run(float *out, const float *x, const float *mean, const float *rstd, const float *gamma,
                         const float *beta, size_t n) {
    size_t j = 0, k;
    for (; j + 16 <= n; j += 16) {
        float y[16];
        for (k = 0; k < 16; k++)
            y[k] = mp__norm_y(mp__norm_xhat(x[j + k], mean[j + k], rstd[j + k]), gamma[j + k], beta[j + k]);
        memcpy(out + j, y, sizeof y);
    }
    for (; j < n; j++) out[j] = mp__norm_y(mp__norm_xhat(x[j], mean[j], rstd[j]), gamma[j], beta[j]);
}

/* Where a row pass writes a tile: out itself where it is float32, else t
   (then narrowed into out by mp__norm_write). */
static float *mp__norm_dest(float *t, void *out, mp_dtype outt) { return outt == MP_FLOAT32 ? (float *)out : t; }
static void mp__norm_write(void *out, mp_dtype outt, const float *t, size_t n) {
    if (outt != MP_FLOAT32) mp__store(out, outt, t, n);
}

/* y over rows [r0, r1) from the columns' statistics in a->stats. */
static void mp__bn_y_rows(void *args, size_t r0, size_t r1, int thread) {
    const mp__norm_args *a = (const mp__norm_args *)args;
    float rstd[MP__TILE], t[MP__TILE], m[MP__TILE], rs[MP__TILE], ga[MP__TILE], be[MP__TILE];
    size_t c, r, n, nr, len, cols = a->cols;
    (void)thread;
    for (c = 0; c < cols; c += len) {
        len = mp__min(MP__TILE, cols - c);
        nr = mp__norm_tile_rows(len, cols);
        mp__bn_rstd(a, c, len, rstd);
        mp__norm_spread(m, a->stats + c, len, nr), mp__norm_spread(rs, rstd, len, nr);
        mp__norm_spread(ga, a->gamma_beta + c, len, nr), mp__norm_spread(be, a->gamma_beta + cols + c, len, nr);
        for (r = r0; r < r1; r += n) {
            void *out = mp__at_mut(a->out, a->outt, r * cols + c);
            n = mp__min(nr, r1 - r);
            mp__bn_y_run(mp__norm_dest(t, out, a->outt),
                         mp__read_f32(t, mp__at(a->x, a->dt, r * cols + c), a->dt, n * len), m, rs, ga, be, n * len);
            mp__norm_write(out, a->outt, t, n * len);
        }
    }
}

static void mp__bn_grad_cols(void *args, size_t c0, size_t c1, int thread) {
    const mp__norm_args *a = (const mp__norm_args *)args;
    float rstd[MP__TILE];
    size_t c, len;
    (void)thread;
    for (c = c0; c < c1; c += len) {
        len = mp__min(MP__TILE, c1 - c);
        mp__bn_rstd(a, c, len, rstd);
        mp__norm_grad_sums(a, c, len, a->stats + c, rstd);
    }
}

/* out = dx(g, xhat(x)) over a run (out may be x or g), the per-column
   values spread as x. */
static void mp__bn_dx_run(float *out, const float *x, const float *g, const float *k, const float *mean, const float *rstd,
                          const float *mg, const float *mgx, size_t n) {
    size_t j = 0, l;
    for (; j + 16 <= n; j += 16) {
        float d[16];
        for (l = 0; l < 16; l++)
            d[l] = mp__norm_dx(k[j + l], g[j + l], mp__norm_xhat(x[j + l], mean[j + l], rstd[j + l]), mg[j + l], mgx[j + l]);
        memcpy(out + j, d, sizeof d);
    }
    for (; j < n; j++) out[j] = mp__norm_dx(k[j], g[j], mp__norm_xhat(x[j], mean[j], rstd[j]), mg[j], mgx[j]);
}

/* dx over rows [r0, r1), from the column sums in a->sums. */
static void mp__bn_dx_rows(void *args, size_t r0, size_t r1, int thread) {
    const mp__norm_args *a = (const mp__norm_args *)args;
    float rstd[MP__TILE], k[MP__TILE], mg[MP__TILE], mgx[MP__TILE], x[MP__TILE], g[MP__TILE];
    float ks[MP__TILE], ms[MP__TILE], rs[MP__TILE], mgs[MP__TILE], mgxs[MP__TILE];
    size_t c, r, j, n, nr, len, cols = a->cols;
    (void)thread;
    for (c = 0; c < cols; c += len) {
        len = mp__min(MP__TILE, cols - c);
        nr = mp__norm_tile_rows(len, cols);
        mp__bn_rstd(a, c, len, rstd);
        for (j = 0; j < len; j++) {
            k[j] = a->gamma_beta[c + j] * rstd[j];
            mgx[j] = mp__norm_mean(a->sums[c + j], a->rows), mg[j] = mp__norm_mean(a->sums[cols + c + j], a->rows);
        }
        mp__norm_spread(ks, k, len, nr), mp__norm_spread(ms, a->stats + c, len, nr), mp__norm_spread(rs, rstd, len, nr);
        mp__norm_spread(mgs, mg, len, nr), mp__norm_spread(mgxs, mgx, len, nr);
        for (r = r0; r < r1; r += n) {
            void *out = mp__at_mut(a->out, a->outt, r * cols + c);
            const float *xr, *gr;
            n = mp__min(nr, r1 - r);
            xr = mp__read_f32(x, mp__at(a->x, a->dt, r * cols + c), a->dt, n * len);
            gr = mp__read_f32(g, mp__at(a->dy, a->dt, r * cols + c), a->dt, n * len);
            mp__bn_dx_run(mp__norm_dest(x, out, a->outt), xr, gr, ks, ms, rs, mgs, mgxs, n * len);
            mp__norm_write(out, a->outt, x, n * len);
        }
    }
}

/* Column work on the pool: whole cache lines of a row per thread. */
static void mp__norm_cols(void *ctx, const mp__norm_args *a, void (*fn)(void *, size_t, size_t, int)) {
    mp__parallel_grains(mp__pool_of(ctx), a->cols, 64 / mp__dtypes[a->dt].size, a->rows * a->cols, fn, (void *)a);
}

/* training: the batch's statistics into stats and the moving ones
   updated first; y then from stats, else from moving. Nothing for an
   empty batch. */
static void mp__cpu_batch_norm(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t rows, size_t cols,
                               const float *gamma_beta, float *stats, float *moving, float momentum, float epsilon,
                               int training) {
    mp__norm_args a;
    if (!rows || !cols) return;
    mp__norm_begin(&a, y, yt, x, NULL, dt, rows, cols, gamma_beta, epsilon);
    a.stats = training ? stats : moving;
    if (training) {
        float *parts = mp__norm_parts_alloc(ctx, &a);
        a.stats_out = stats, a.moving = moving, a.momentum = momentum;
        if (parts) mp__bn_stats_parts(ctx, &a, parts);
        else mp__norm_cols(ctx, &a, mp__bn_stats_cols);
        mp__free(parts);
    }
    mp__parallel_items(mp__pool_of(ctx), rows, cols, mp__bn_y_rows, &a);
}

static void mp__cpu_batch_norm_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt,
                                        size_t rows, size_t cols, const float *gamma_beta, const float *stats,
                                        float epsilon, float *dgamma_beta) {
    mp__norm_args a;
    float rstd[MP__TILE], *parts;
    if (!rows || !cols) return;
    mp__norm_begin(&a, dx, dxt, x, dy, dt, rows, cols, gamma_beta, epsilon);
    a.stats = stats, a.sums = dgamma_beta;
    parts = mp__norm_parts_alloc(ctx, &a);
    if (parts) {
        mp__bn_rstd(&a, 0, cols, rstd);
        mp__norm_sums_by_parts(ctx, &a, MP__NORM_SUM_GRAD, stats, rstd, parts, dgamma_beta, dgamma_beta + cols);
    } else {
        mp__norm_cols(ctx, &a, mp__bn_grad_cols);
    }
    mp__free(parts);
    if (dx) mp__parallel_items(mp__pool_of(ctx), rows, cols, mp__bn_dx_rows, &a);
}

/* LayerNormalization, rows [r0, r1): each row's mean and rstd, then y. */
static void mp__ln_rows(void *args, size_t r0, size_t r1, int thread) {
    const mp__norm_args *a = (const mp__norm_args *)args;
    const float *gamma = a->gamma_beta, *beta = a->gamma_beta + a->cols;
    float t[MP__TILE], acc[MP__NORM_LANES];
    float *stats = a->stats_out;
    size_t c, r, j, len, cols = a->cols;
    (void)thread;
    for (r = r0; r < r1; r++) {
        const void *xr = mp__at(a->x, a->dt, r * cols);
        float mean, rstd;
        memset(acc, 0, sizeof acc);
        for (c = 0; c < cols; c += len) {
            len = mp__min(MP__TILE, cols - c);
            mp__load(t, mp__at(xr, a->dt, c), a->dt, len);
            mp__norm_lanes_add(acc, t, len);
        }
        mean = mp__norm_mean(mp__norm_lanes_total(acc), cols);
        memset(acc, 0, sizeof acc);
        for (c = 0; c < cols; c += len) {
            len = mp__min(MP__TILE, cols - c);
            mp__load(t, mp__at(xr, a->dt, c), a->dt, len);
            for (j = 0; j < len; j++) t[j] = (t[j] - mean) * (t[j] - mean);
            mp__norm_lanes_add(acc, t, len);
        }
        rstd = mp__norm_rstd(mp__norm_mean(mp__norm_lanes_total(acc), cols), a->epsilon);
        stats[2 * r] = mean, stats[2 * r + 1] = rstd;
        for (c = 0; c < cols; c += len) {
            len = mp__min(MP__TILE, cols - c);
            mp__load(t, mp__at(xr, a->dt, c), a->dt, len);
            for (j = 0; j < len; j++) t[j] = mp__norm_y(mp__norm_xhat(t[j], mean, rstd), gamma[c + j], beta[c + j]);
            mp__store(mp__at_mut(a->out, a->outt, r * cols + c), a->outt, t, len);
        }
    }
}

static void mp__ln_grad_cols(void *args, size_t c0, size_t c1, int thread) {
    const mp__norm_args *a = (const mp__norm_args *)args;
    size_t c, len;
    (void)thread;
    for (c = c0; c < c1; c += len) {
        len = mp__min(MP__TILE, c1 - c);
        mp__norm_grad_sums(a, c, len, NULL, NULL);
    }
}

/* The loads of tile [c, c + len) of row r: x, and g = dy gamma. */
static void mp__ln_load(const mp__norm_args *a, size_t r, size_t c, size_t len, float *x, float *g) {
    size_t j;
    mp__load(x, mp__at(a->x, a->dt, r * a->cols + c), a->dt, len);
    mp__load(g, mp__at(a->dy, a->dt, r * a->cols + c), a->dt, len);
    for (j = 0; j < len; j++) g[j] *= a->gamma_beta[c + j];
}

/* dx over rows [r0, r1): each row's means of g and g xhat, then dx. */
static void mp__ln_dx_rows(void *args, size_t r0, size_t r1, int thread) {
    const mp__norm_args *a = (const mp__norm_args *)args;
    float x[MP__TILE], g[MP__TILE], acc_g[MP__NORM_LANES], acc_gx[MP__NORM_LANES];
    size_t c, r, j, len, cols = a->cols;
    (void)thread;
    for (r = r0; r < r1; r++) {
        float mean = a->stats[2 * r], rstd = a->stats[2 * r + 1], mg, mgx;
        memset(acc_g, 0, sizeof acc_g);
        memset(acc_gx, 0, sizeof acc_gx);
        for (c = 0; c < cols; c += len) {
            len = mp__min(MP__TILE, cols - c);
            mp__ln_load(a, r, c, len, x, g);
            mp__norm_lanes_add(acc_g, g, len);
            for (j = 0; j < len; j++) x[j] = g[j] * mp__norm_xhat(x[j], mean, rstd);
            mp__norm_lanes_add(acc_gx, x, len);
        }
        mg = mp__norm_mean(mp__norm_lanes_total(acc_g), cols);
        mgx = mp__norm_mean(mp__norm_lanes_total(acc_gx), cols);
        for (c = 0; c < cols; c += len) {
            len = mp__min(MP__TILE, cols - c);
            mp__ln_load(a, r, c, len, x, g);
            for (j = 0; j < len; j++) x[j] = mp__norm_dx(rstd, g[j], mp__norm_xhat(x[j], mean, rstd), mg, mgx);
            mp__store(mp__at_mut(a->out, a->outt, r * cols + c), a->outt, x, len);
        }
    }
}

static void mp__cpu_layer_norm(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t rows, size_t cols,
                               const float *gamma_beta, float epsilon, float *stats) {
    mp__norm_args a;
    if (!rows || !cols) return;
    mp__norm_begin(&a, y, yt, x, NULL, dt, rows, cols, gamma_beta, epsilon);
    a.stats_out = stats;
    mp__parallel_items(mp__pool_of(ctx), rows, cols, mp__ln_rows, &a);
}

static void mp__cpu_layer_norm_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt,
                                        size_t rows, size_t cols, const float *gamma_beta, const float *stats,
                                        float *dgamma_beta) {
    mp__norm_args a;
    if (!rows || !cols) return;
    mp__norm_begin(&a, dx, dxt, x, dy, dt, rows, cols, gamma_beta, 0.0f);
    a.stats = stats, a.sums = dgamma_beta;
    mp__norm_cols(ctx, &a, mp__ln_grad_cols);
    if (dx) mp__parallel_items(mp__pool_of(ctx), rows, cols, mp__ln_dx_rows, &a);
}

/* >>cpu backend: embeddings and attention. The embedding's rows gather
   in parallel; its gradient splits the columns among the threads, each
   adding every row in order: the same sums at any thread count. */
typedef struct mp__embedding_args {
    void *y;
    float *dtable;
    const void *dy;
    const float *table, *ids;
    mp_dtype dt;
    size_t vocab, period, rows, cols;
} mp__embedding_args;

static void mp__embedding_rows(void *args, size_t r0, size_t r1, int thread) {
    const mp__embedding_args *a = (const mp__embedding_args *)args;
    size_t r, c;
    (void)thread;
    for (r = r0; r < r1; r++) {
        size_t id = mp__embedding_index(a->ids, a->period, r, a->vocab);
        for (c = 0; c < a->cols; c++) mp__elem_set(a->y, a->dt, r * a->cols + c, id < a->vocab ? a->table[id * a->cols + c] : 0.0f);
    }
}

static void mp__embedding_grad_cols(void *args, size_t c0, size_t c1, int thread) {
    const mp__embedding_args *a = (const mp__embedding_args *)args;
    size_t r, c;
    (void)thread;
    for (r = 0; r < a->vocab; r++) memset(a->dtable + r * a->cols + c0, 0, (c1 - c0) * sizeof(float));
    for (r = 0; r < a->rows; r++) {
        size_t id = mp__embedding_index(a->ids, a->period, r, a->vocab);
        if (id < a->vocab)
            for (c = c0; c < c1; c++) a->dtable[id * a->cols + c] += mp__elem(a->dy, a->dt, r * a->cols + c);
    }
}

static void mp__cpu_embedding(void *ctx, void *y, mp_dtype yt, const float *table, size_t vocab, const float *ids,
                              size_t period, size_t rows, size_t cols) {
    mp__embedding_args a;
    memset(&a, 0, sizeof a);
    a.y = y, a.dt = yt, a.table = table, a.vocab = vocab, a.ids = ids, a.period = period, a.rows = rows, a.cols = cols;
    mp__parallel_items(mp__pool_of(ctx), rows, cols, mp__embedding_rows, &a);
}

static void mp__cpu_embedding_backward(void *ctx, float *dtable, size_t vocab, const void *dy, mp_dtype dt,
                                       const float *ids, size_t period, size_t rows, size_t cols) {
    mp__embedding_args a;
    memset(&a, 0, sizeof a);
    a.dtable = dtable, a.vocab = vocab, a.dy = dy, a.dt = dt, a.ids = ids, a.period = period, a.rows = rows, a.cols = cols;
    mp__parallel_grains(mp__pool_of(ctx), cols, 16, rows * cols, mp__embedding_grad_cols, &a);
}

/* Attention by sequences (batch x heads): each thread takes whole
   sequences. A sequence whose operands fit the thread's GEMM workspace
   runs on float32 copies of them, widened and rounded in bulk
   (mp__load, mp__store), its products in blocks of MP__AROWS rows
   (mp__rows_product: each row of the right operand is read once for four
   rows of the result); every sum has >>rules' terms in >>rules' order,
   so the bits are those of mp__attention_row and the device backends. A
   longer one runs >>rules' rows as they are. bench/attention.c times both
   directions. */
typedef struct mp__attention_args {
    mp__attention_geom g;
    mp_pool *pool;
    void *att, *p, *dq, *dk, *dv;
    float *s;
    const void *q, *k, *v, *datt, *pin;
} mp__attention_args;

enum {
    MP__VEC = 16,  /* the columns' blocks: a constant trip count that compilers vectorise */
    MP__AROWS = 4, /* the rows' blocks: four sums share each load of the right operand */
};

/* One operand of a block product: element (r, k) at a[r ar + k ak], and
   row r's terms k in [lo[r], hi[r]) (the causal rows' keys). */
typedef struct mp__rows_operand {
    const float *a;
    size_t ar, ak, lo[MP__AROWS], hi[MP__AROWS];
} mp__rows_operand;

/* acc[r][0, MP__VEC) += a(r, k) b[k ldb, + MP__VEC) for the rows r < rows
   whose terms include k: one term more of each sum (product rounded, then
   added: >>rules' arithmetic, no fused multiply-add). */
static void mp__rows_term(float acc[MP__AROWS][MP__VEC], const mp__rows_operand *x, size_t rows, size_t k,
                          const float *bk) {
    size_t r, c;
    for (r = 0; r < rows; r++)
        if (k >= x->lo[r] && k < x->hi[r]) {
            float ar = x->a[r * x->ar + k * x->ak];
            for (c = 0; c < MP__VEC; c++) acc[r][c] += ar * bk[c];
        }
}

/* c[r ldc + j] = sum over k of a(r, k) b[k ldb + j] for r < rows (at most
   MP__AROWS) and j < n, each row's terms in ascending k from a float32 0
   (>>rules' order). Columns run in blocks of MP__VEC (a last part block
   within ldb is summed whole and only its first columns kept); past ldb,
   column by column. The terms every row has run four rows at a time
   without a test; the rest (the causal rows' ragged ends) one by one. */
static void mp__rows_product(float *c, size_t ldc, const mp__rows_operand *x, size_t rows, const float *b,
                             size_t ldb, size_t n) {
    size_t first = x->lo[0], last = x->hi[0], all0 = x->lo[0], all1 = x->hi[0], j = 0, k, r, i;
    for (r = 1; r < rows; r++) {
        first = mp__min(first, x->lo[r]), last = mp__max(last, x->hi[r]);
        all0 = mp__max(all0, x->lo[r]), all1 = mp__min(all1, x->hi[r]);
    }
    if (rows < MP__AROWS || all1 < all0) all0 = all1 = first; /* no run of terms every row has */
    for (; j < n && j + MP__VEC <= ldb; j += MP__VEC) {
        float acc[MP__AROWS][MP__VEC] = {{0.0f}};
        for (k = first; k < all0; k++) mp__rows_term(acc, x, rows, k, b + k * ldb + j);
        for (; k < all1; k++) {
            const float *bk = b + k * ldb + j, *ak = x->a + k * x->ak;
            float a0 = ak[0], a1 = ak[x->ar], a2 = ak[2 * x->ar], a3 = ak[3 * x->ar];
            for (i = 0; i < MP__VEC; i++) {
                acc[0][i] += a0 * bk[i];
                acc[1][i] += a1 * bk[i];
                acc[2][i] += a2 * bk[i];
                acc[3][i] += a3 * bk[i];
            }
        }
        for (; k < last; k++) mp__rows_term(acc, x, rows, k, b + k * ldb + j);
        for (r = 0; r < rows; r++) /* a whole block's copy a constant size: a vector store, not rep movs */
            if (n - j >= MP__VEC) memcpy(c + r * ldc + j, acc[r], sizeof acc[r]);
            else memcpy(c + r * ldc + j, acc[r], (n - j) * sizeof(float));
    }
    for (; j < n; j++)
        for (r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (k = x->lo[r]; k < x->hi[r]; k++) acc += x->a[r * x->ar + k * x->ak] * b[k * ldb + j];
            c[r * ldc + j] = acc;
        }
}

/* Which terms each row of an operand's block has: all `terms`; a query
   row's keys (causal: those up to the row); a key row's queries (causal:
   those from the row on). */
typedef enum mp__rows_mask { MP__TERMS_ALL, MP__TERMS_KEYS, MP__TERMS_QUERIES } mp__rows_mask;

/* The block of rows [r0, r0 + rows) of an operand whose block starts at a
   (element (r, k) at a[r ar + k ak]). */
static mp__rows_operand mp__rows_of(const mp__attention_geom *g, const float *a, size_t ar, size_t ak, size_t r0,
                                   size_t rows, size_t terms, mp__rows_mask mask) {
    mp__rows_operand x;
    size_t r;
    x.a = a, x.ar = ar, x.ak = ak;
    for (r = 0; r < rows; r++) {
        x.lo[r] = mask == MP__TERMS_QUERIES && g->causal ? r0 + r : 0;
        x.hi[r] = mask == MP__TERMS_KEYS ? mp__attention_keys(g, r0 + r) : terms;
    }
    return x;
}

/* Rows [0, t) of sequence n's head in `from` (dt) as float32: to[j d + c]
   (as they are) or, transposed, to[c t + j]; row is d floats of scratch. */
static void mp__attention_widen(float *to, float *row, const mp__attention_geom *g, const void *from, size_t n,
                                int transposed) {
    size_t j, c;
    for (j = 0; j < g->t; j++) {
        const void *src = mp__at(from, g->dt, mp__attention_at(g, n, j, 0));
        if (!transposed) { mp__load(to + j * g->d, src, g->dt, g->d); continue; }
        mp__load(row, src, g->dt, g->d);
        for (c = 0; c < g->d; c++) to[c * g->t + j] = row[c];
    }
}

/* Rows of a block (rows x d floats in `from`) rounded into sequence n's
   head rows [r0, r0 + rows) of `to` (dt). */
static void mp__attention_put(void *to, const mp__attention_geom *g, const float *from, size_t n, size_t r0,
                              size_t rows) {
    size_t r;
    for (r = 0; r < rows; r++)
        mp__store(mp__at_mut(to, g->dt, mp__attention_at(g, n, r0 + r, 0)), g->dt, from + r * g->d, g->d);
}

/* The workspace floats a thread needs for one sequence: four t x d
   operands and a block's rows of t and of d. */
static size_t mp__attention_ws_floats(const mp__attention_geom *g) {
    return 4 * g->t * g->d + MP__AROWS * (g->t + g->d);
}
static int mp__attention_fits(const mp__attention_geom *g) {
    size_t fixed = (size_t)MP__A_FLOATS + (size_t)MP__MC * MP__NC + MP__TMP;
    return g->d <= fixed / 8 && g->t <= fixed / 8 / (g->d + 1) && mp__attention_ws_floats(g) <= fixed;
}

/* Sequence n, forward: mp__attention_row's arithmetic on widened rows, a
   block of MP__AROWS query rows at a time. */
static void mp__attention_seq(const mp__attention_args *a, size_t n, float *ws) {
    const mp__attention_geom *g = &a->g;
    size_t t = g->t, d = g->d, i0, i, j, rows;
    float *q = ws, *kt = q + t * d, *v = kt + t * d, *pb = v + t * d, *out = pb + MP__AROWS * t;
    mp__attention_widen(q, out, g, a->q, n, 0);
    mp__attention_widen(kt, out, g, a->k, n, 1);
    mp__attention_widen(v, out, g, a->v, n, 0);
    for (i0 = 0; i0 < t; i0 += rows) {
        float *s0 = a->s + (n * t + i0) * t;
        mp__rows_operand x;
        rows = mp__min(MP__AROWS, t - i0);
        x = mp__rows_of(g, q + i0 * d, d, 1, i0, rows, d, MP__TERMS_ALL);
        mp__rows_product(s0, t, &x, rows, kt, t, mp__attention_keys(g, i0 + rows - 1));
        for (i = 0; i < rows; i++) {
            size_t keys = mp__attention_keys(g, i0 + i);
            float *si = s0 + i * t, *pi = pb + i * t, mx = -INFINITY, sum = 0.0f;
            void *prow = mp__at_mut(a->p, g->dt, (n * t + i0 + i) * t);
            for (j = 0; j < keys; j++) {
                si[j] = si[j] * g->scale;
                mx = si[j] > mx ? si[j] : mx;
            }
            for (j = 0; j < keys; j++) si[j] = si[j] - mx;
            mp__softmax_exp_run(pi, si, keys); /* each exponential once, in vector rows */
            for (j = 0; j < keys; j++) sum += pi[j];
            for (j = 0; j < t; j++) pi[j] = j < keys ? pi[j] / sum : 0.0f;
            mp__store(prow, g->dt, pi, t);
            mp__load(pi, prow, g->dt, keys); /* as rounded */
        }
        x = mp__rows_of(g, pb, t, 1, i0, rows, t, MP__TERMS_KEYS);
        mp__rows_product(out, d, &x, rows, v, d, d);
        mp__attention_put(a->att, g, out, n, i0, rows);
    }
}

/* Sequence n, backward, >>rules' sums in blocks of MP__AROWS rows: the
   probabilities widened into s first (float32's read where they are),
   dv = p^T datt from them; then per query row dp = datt v^T and ds =
   p (dp - p . dp) scale into s, dq = ds k; last dk = ds^T q. */
static void mp__attention_grad_seq(const mp__attention_args *a, size_t n, float *ws) {
    const mp__attention_geom *g = &a->g;
    size_t t = g->t, d = g->d, r0, i, j, rows;
    float *k = ws, *vt = k + t * d, *q = vt + t * d, *datt = q + t * d, *dp = datt + t * d, *out = dp + MP__AROWS * t;
    float *s = a->s + n * t * t;
    const float *p;
    mp__rows_operand x;
    mp__attention_widen(k, out, g, a->k, n, 0);
    mp__attention_widen(vt, out, g, a->v, n, 1);
    mp__attention_widen(q, out, g, a->q, n, 0);
    mp__attention_widen(datt, out, g, a->datt, n, 0);
    p = mp__read_f32(s, mp__at(a->pin, g->dt, n * t * t), g->dt, t * t); /* ds goes into s, beside float32's p */
    for (r0 = 0; r0 < t; r0 += rows) { /* dv_j = sum_i p_ij datt_i */
        rows = mp__min(MP__AROWS, t - r0);
        x = mp__rows_of(g, p + r0, 1, t, r0, rows, t, MP__TERMS_QUERIES);
        mp__rows_product(out, d, &x, rows, datt, d, d);
        mp__attention_put(a->dv, g, out, n, r0, rows);
    }
    for (r0 = 0; r0 < t; r0 += rows) { /* ds and dq, a block of query rows */
        rows = mp__min(MP__AROWS, t - r0);
        x = mp__rows_of(g, datt + r0 * d, d, 1, r0, rows, d, MP__TERMS_ALL);
        mp__rows_product(dp, t, &x, rows, vt, t, mp__attention_keys(g, r0 + rows - 1));
        for (i = 0; i < rows; i++) {
            size_t keys = mp__attention_keys(g, r0 + i);
            const float *pi = p + (r0 + i) * t;
            float *si = s + (r0 + i) * t, *dpi = dp + i * t, dot = 0.0f;
            for (j = 0; j < keys; j++) dot += pi[j] * dpi[j];
            for (j = 0; j < keys; j++) si[j] = pi[j] * (dpi[j] - dot) * g->scale;
        }
        x = mp__rows_of(g, s + r0 * t, t, 1, r0, rows, t, MP__TERMS_KEYS);
        mp__rows_product(out, d, &x, rows, k, d, d);
        mp__attention_put(a->dq, g, out, n, r0, rows);
    }
    for (r0 = 0; r0 < t; r0 += rows) { /* dk_j = sum_i ds_ij q_i */
        rows = mp__min(MP__AROWS, t - r0);
        x = mp__rows_of(g, s + r0, 1, t, r0, rows, t, MP__TERMS_QUERIES);
        mp__rows_product(out, d, &x, rows, q, d, d);
        mp__attention_put(a->dk, g, out, n, r0, rows);
    }
}

static void mp__attention_seqs(void *args, size_t n0, size_t n1, int thread) {
    const mp__attention_args *a = (const mp__attention_args *)args;
    size_t n, i;
    for (n = n0; n < n1; n++)
        if (mp__attention_fits(&a->g))
            mp__attention_seq(a, n, a->pool->ws[thread].a);
        else
            for (i = 0; i < a->g.t; i++) mp__attention_row(&a->g, a->att, a->p, a->s, a->q, a->k, a->v, n, i);
}

static void mp__attention_grad_seqs(void *args, size_t n0, size_t n1, int thread) {
    const mp__attention_args *a = (const mp__attention_args *)args;
    size_t n, i;
    for (n = n0; n < n1; n++) {
        if (mp__attention_fits(&a->g)) { mp__attention_grad_seq(a, n, a->pool->ws[thread].a); continue; }
        for (i = 0; i < a->g.t; i++) mp__attention_dq_row(&a->g, a->dq, a->s, a->datt, a->k, a->v, a->pin, n, i);
        for (i = 0; i < a->g.t; i++) mp__attention_dkv_row(&a->g, a->dk, a->dv, a->s, a->datt, a->q, a->pin, n, i);
    }
}

static void mp__cpu_attention(void *ctx, void *att, void *p, float *s, const void *q, const void *k, const void *v,
                              mp_dtype dt, size_t batch, size_t t, size_t heads, size_t d, float scale, int causal) {
    mp__attention_args a;
    memset(&a, 0, sizeof a);
    a.g = mp__attention_geom_of(dt, t, heads, d, scale, causal);
    a.pool = mp__pool_of(ctx);
    a.att = att, a.p = p, a.s = s, a.q = q, a.k = k, a.v = v;
    mp__parallel_items(mp__pool_of(ctx), batch * heads, t * t * d, mp__attention_seqs, &a);
}

static void mp__cpu_attention_backward(void *ctx, void *dq, void *dk, void *dv, float *s, const void *datt, const void *q,
                                       const void *k, const void *v, const void *p, mp_dtype dt, size_t batch, size_t t,
                                       size_t heads, size_t d, float scale, int causal) {
    mp__attention_args a;
    memset(&a, 0, sizeof a);
    a.g = mp__attention_geom_of(dt, t, heads, d, scale, causal);
    a.pool = mp__pool_of(ctx);
    a.dq = dq, a.dk = dk, a.dv = dv, a.s = s, a.datt = datt, a.q = q, a.k = k, a.v = v, a.pin = p;
    mp__parallel_items(mp__pool_of(ctx), batch * heads, t * t * d, mp__attention_grad_seqs, &a);
}

/* >>cpu backend: the operations table. The rest of the CPU backend: memory
   is the host's (64-byte aligned, zeroed, counted), copies are memcpy, the
   context is the thread pool. */
static mp_status mp__cpu_create(void **ctx, int threads, const void *config) {
    mp__cpu *c = (mp__cpu *)mp__alloc(sizeof *c);
    (void)config;
    if (!c) return MP_ERR_ALLOC;
    if (mp_pool_create(&c->pool, threads) != MP_OK) {
        mp__free(c);
        return MP_ERR_ALLOC;
    }
    *ctx = c;
    return MP_OK;
}

static void mp__cpu_destroy(void *ctx) {
    if (!ctx) return;
    mp_pool_destroy(mp__pool_of(ctx));
    mp__free(ctx);
}

static int mp__cpu_threads(void *ctx) { return mp_pool_threads(mp__pool_of(ctx)); }

static void *mp__cpu_alloc(void *ctx, size_t bytes) {
    mp__cpu *c = (mp__cpu *)ctx;
    void *p = mp__alloc(bytes);
    if (p) c->current += bytes;
    if (c->current > c->peak) c->peak = c->current;
    return p;
}

static void mp__cpu_free(void *ctx, void *p) {
    ((mp__cpu *)ctx)->current -= mp__block_bytes(p);
    mp__free(p);
}

static size_t mp__pool_bytes(const mp_pool *p) {
    size_t bytes = mp__block_bytes(p);
    int i;
    for (i = 0; p && i < p->threads; i++)
        bytes += mp__block_bytes(p->ws[i].a) + mp__block_bytes(p->ws[i].b) + mp__block_bytes(p->ws[i].part);
    return bytes;
}

static void mp__cpu_memory(void *ctx, mp_backend_memory *out) {
    const mp__cpu *c = (const mp__cpu *)ctx;
    out->workspace = mp__pool_bytes(c->pool);
    out->fallbacks = 0;
    out->current = c->current + out->workspace;
    out->peak = c->peak + out->workspace; /* panels are reserved once and kept */
}

static void mp__cpu_copy(void *ctx, void *dst, const void *src, size_t bytes, mp_copy_kind kind) {
    (void)ctx;
    (void)kind;
    if (bytes) memmove(dst, src, bytes);
}

static void mp__cpu_zero(void *ctx, void *p, size_t bytes) {
    (void)ctx;
    if (bytes) memset(p, 0, bytes);
}

static mp_status mp__cpu_sync(void *ctx) { return ((mp__cpu *)ctx)->error ? MP_ERR_BACKEND : MP_OK; }

static const char *mp__cpu_last_error(void *ctx) {
    const mp__cpu *c = (const mp__cpu *)ctx;
    return c->error ? c->error : "no error";
}

static mp_status mp__cpu_gemm_reserve(void *ctx, size_t m, size_t n, size_t k) {
    return mp__pool_reserve(mp__pool_of(ctx), m, k, n);
}

static void mp__cpu_cast_in(void *ctx, void *dst, mp_dtype dt, const float *host_src, size_t n, int *nonfinite) {
    mp__cpu_cast(ctx, dst, dt, host_src, MP_FLOAT32, n, NULL);
    if (nonfinite && mp__first_nonfinite(host_src, n) < n) *nonfinite = 1;
}

/* A product gemm_reserve did not size gets its panels here (a caller of
   the table that skipped it); a model has reserved them all. */
static void mp__cpu_gemm(void *ctx, const mp_gemm_args *g) {
    mp__cpu *c = (mp__cpu *)ctx;
    if (c->error) return;
    if (mp__pool_reserve(c->pool, g->m, g->k, g->n) != MP_OK) {
        c->error = "no memory for a GEMM panel";
        return;
    }
    mp__gemm_run(c->pool, g);
}

static const mp_backend mp__cpu_backend = {
    MP_OP(name) "cpu", MP_OP(device_memory) 0, MP_OP(tensor_cores) 0, MP_OP(relu_grad) 1,
    MP_OP(create) mp__cpu_create,
    MP_OP(destroy) mp__cpu_destroy,
    MP_OP(threads) mp__cpu_threads,
    MP_OP(alloc) mp__cpu_alloc,
    MP_OP(free) mp__cpu_free,
    MP_OP(memory) mp__cpu_memory,
    MP_OP(copy) mp__cpu_copy,
    MP_OP(zero) mp__cpu_zero,
    MP_OP(sync) mp__cpu_sync,
    MP_OP(last_error) mp__cpu_last_error,
    MP_OP(gemm_reserve) mp__cpu_gemm_reserve,
    MP_OP(cast_in) mp__cpu_cast_in,
    MP_OP(cast) mp__cpu_cast,
    MP_OP(gemm) mp__cpu_gemm,
    MP_OP(bias_act) mp__cpu_bias_act,
    MP_OP(act_backward) mp__cpu_act_backward,
    MP_OP(bias_grad) mp__cpu_bias_grad,
    MP_OP(loss) mp__cpu_loss,
    MP_OP(scale_cast) mp__cpu_scale_cast,
    MP_OP(unscale_check) mp__cpu_unscale_check,
    MP_OP(loss_scale_update) mp__cpu_loss_scale_update,
    MP_OP(optimizer_update) mp__cpu_optimizer_update,
    MP_OP(im2col) mp__cpu_im2col,
    MP_OP(col2im) mp__cpu_col2im,
    MP_OP(conv_flip) mp__cpu_conv_flip,
    MP_OP(conv_gemm) mp__cpu_conv_gemm,
    MP_OP(max_pool) mp__cpu_max_pool,
    MP_OP(max_pool_backward) mp__cpu_max_pool_backward,
    MP_OP(dropout_mask) mp__cpu_dropout_mask,
    MP_OP(dropout) mp__cpu_dropout,
    MP_OP(elementwise) mp__cpu_elementwise,
    MP_OP(copy_cols) mp__cpu_copy_cols,
    MP_OP(avg_pool) mp__cpu_avg_pool,
    MP_OP(avg_pool_backward) mp__cpu_avg_pool_backward,
    MP_OP(batch_norm) mp__cpu_batch_norm,
    MP_OP(batch_norm_backward) mp__cpu_batch_norm_backward,
    MP_OP(layer_norm) mp__cpu_layer_norm,
    MP_OP(layer_norm_backward) mp__cpu_layer_norm_backward,
    MP_OP(embedding) mp__cpu_embedding,
    MP_OP(embedding_backward) mp__cpu_embedding_backward,
    MP_OP(attention) mp__cpu_attention,
    MP_OP(attention_backward) mp__cpu_attention_backward,
    MP_OP(host_alloc) NULL, /* no staging: the host's memory is the CPU's */
    MP_OP(host_free) NULL,
    MP_OP(host_wait) NULL,
    MP_OP(free_memory) NULL, /* no data on a device */
    MP_OP(gather) NULL,
    MP_OP(sum_squares) mp__cpu_sum_squares,
};

MIXPREC_API const mp_backend *mp_cpu_backend(void) { return &mp__cpu_backend; }

/* >>layers
   Each layer kind has a forward and a backward pass side by side. A layer
   reads its input in its compute dtype (cast on entry when the incoming
   activations differ, as Keras autocasts floating inputs), reads its
   float32 weights as the compute dtype (wc), writes outputs in its output
   dtype (yt: the compute dtype, except where automatic mixed precision ends
   a layer's ops in another), writes weight gradients in the compute dtype
   (gc) and activation gradients (dx) in the dtype of its input activations.
   Under float32, wc and gc are the float32 weights and gradients themselves. */
typedef struct mp__layer {
    mp_layer_desc desc;
    char name[32];
    mp_policy policy;
    /* the graph: the layers whose outputs it reads (MP__FROM_INPUT: the
       model's input), in the order given; how many layers read its output,
       and the one that does where there is exactly one (else -1) */
    int in[MP_MAX_LAYER_INPUTS], n_in;
    int consumers, consumer;
    mp_dtype dt, yt;          /* compute dtype; output dtype */
    mp_dtype wt;              /* the dtype its weights are read in: dt, or float32 where the
                                 kind reads them uncast (the normalizations) */
    int in_rank, out_rank;    /* of the first input; of the output */
    int in_shape[MP_MAX_RANK - 1], out_shape[MP_MAX_RANK - 1];
    size_t in_size, out_size; /* elements per sample */
    size_t in_sizes[MP_MAX_LAYER_INPUTS]; /* each input's (a merge's) */
    size_t n_kernel, n_bias;  /* trainable: kernel (gamma), then bias (beta) */
    size_t n_state;           /* non-trainable float32 state: BatchNormalization's moving mean
                                 and variance */
    mp_conv_geom geom;        /* Conv2D, the poolings */
    float *w, *g;             /* float32 weights and gradients: kernel, then bias */
    void *wc, *gc;            /* the same in wt (alias w and g where wt is float32) */
    size_t bias_at;           /* the bias's element in wc: n_kernel, or in an own copy the next 256 bytes */
    float *state;             /* n_state values, after the model's trainable weights */
    const void *x[MP_MAX_LAYER_INPUTS]; /* incoming activations, in xt */
    mp_dtype xt[MP_MAX_LAYER_INPUTS];
    void *xin[MP_MAX_LAYER_INPUTS];     /* x cast to dt, or NULL when x already is dt */
    void *dx[MP_MAX_LAYER_INPUTS];      /* where its backward pass writes each input's gradient:
                                           the input's dy, or where it is added to that after */
    int add_dx[MP_MAX_LAYER_INPUTS];    /* dx[k] is then added to the input's dy */
    void *y, *z;              /* output; pre-activation (gelu only); both yt */
    void *dy;                 /* the output's gradient, yt, summed over the layers that read it */
    void *dyc;                /* the output gradient in dt, where yt differs */
    float *stats;             /* the normalizations' batch statistics, float32 */
    unsigned char *mask;      /* Dropout */
    uint64_t rng;             /* Dropout */
    void *work;               /* MultiHeadAttention, dt: q, k, v, the heads' output, the probabilities
                                 (forward to backward); stats holds its float32 logits */
    void *scratch;            /* MultiHeadAttention, dt: their gradients (backward only) */
    unsigned no_decay;        /* bit k: weight decay skips its k-th trainable variable (mp__mark_no_decay) */
} mp__layer;
enum { MP__FROM_INPUT = -1 };

/* What a step leaves in the backend's memory for the host to read (one
   small copy): the loss scale, which stays with the backend, the found-Inf
   flag of the fused unscale, and the batch's metrics. */
typedef struct mp__step_state {
    mp_loss_scale ls;
    float metrics[2]; /* sum of the batch's losses, samples counted right */
    int found_inf;
    int bad_input;    /* the last batch sent held Inf or NaN (a device's cast_in saw it) */
    /* data-parallel (>>communicator): the global batch over this rank's,
       which divides its gradients; host values on their way through a
       collective (the communicator reads the backend's memory) */
    float share;
    float collective[4];
    float step_scale; /* the loss scale the step's deferred gradients are unscaled by (mp__deferred) */
    float sum_squares; /* clipping by norm's (mp_backend.sum_squares) */
} mp__step_state;

/* fit on a device backend logs each step's metrics on the device and
   reads them when the host needs them (a progress-bar refresh, the end of
   an epoch, a CSV row, a full log), so that a step never waits for one. */
enum { MP__METRIC_LOG = 64 };

/* A device backend's batch passes through host memory: the gathered
   inputs and targets on the way in, the output on the way out. Two sets,
   in the backend's pinned memory where it has some: the host gathers batch
   k+1 into one while batch k's copy may still read the other. */
typedef struct mp__stage {
    float *x, *y, *out;
    int32_t *labels;
} mp__stage;

/* Where the custom loop stands, in the order of the guide's train_step.
   mp__loop_rules is the one place that says which call may follow which. */
typedef enum mp__loop {
    MP__LOOP_NONE = 0,   /* nothing to differentiate: no forward since compile or new weights */
    MP__LOOP_FORWARD,    /* mp_forward ran (its mode in m->training) */
    MP__LOOP_LOSS,       /* mp_compute_loss: dpred holds the loss's gradient */
    MP__LOOP_GRADIENTS,  /* mp_compute_scaled_gradients: scaled, in the compute dtype */
    MP__LOOP_UNSCALED    /* mp_get_unscaled_gradients: float32, ready to apply */
} mp__loop;
typedef enum mp__loop_call {
    MP__CALL_FORWARD, MP__CALL_LOSS, MP__CALL_GRADIENTS, MP__CALL_UNSCALE, MP__CALL_APPLY, MP__CALL_RESET
} mp__loop_call;

struct mp_model {
    /* created: the description, where it runs, its input */
    mp_model_desc desc;
    const mp_backend *be;
    void *ctx;        /* the backend's context for this model */
    int rank, ranks;  /* in desc.comm's job; 0 and 1 without one */
    mp_policy policy; /* the global policy at creation */
    int in_rank, in_shape[MP_MAX_RANK - 1];
    size_t in_size;
    /* the layers, as added */
    mp__layer *layers;
    int n_layers, cap_layers, kind_count[MP_LAYER_KIND_COUNT];
    /* built: weights, gradients, their dt copies, the step state; every
       block is the backend's memory */
    void *params_block;
    float *w, *g;             /* w: the trainable weights, then the layers' state */
    size_t n_params, n_state; /* trainable; non-trainable (BatchNormalization's moving statistics) */
    mp__step_state *state;
    mp__step_state seen; /* the host's copy of *state, as of the last read */
    size_t params_bytes, slots_bytes, act_bytes;
    int casts_fresh; /* every layer's wc holds its w (else the next forward casts) */
    /* compiled: loss, optimizer and its slots, loss scale, the AMP pass */
    int compiled;
    mp_compile_desc compile;
    mp_opt_step opt;
    void *slots_block;        /* the slots, then the accumulators */
    float *s1, *s2, *acc;     /* each NULL where the optimizer has none */
    size_t slot_count;
    int has_loss_scale;
    struct mp__amp *amp; /* the automatic mixed precision pass's result, or NULL */
    /* activations and gradients for up to batch_cap samples */
    void *act_block;
    size_t batch_cap, batch;
    void *input; /* the batch, already in the first layer's compute dtype */
    float *dpred, *batch_y;
    int32_t *batch_labels;
    void *grad16; /* the gradients' 16-bit sum (>>communicator), or NULL */
    void *col;        /* im2col's columns (of x, or of dy for a flipped convolution) */
    float *dcol, *img;
    void *wflip;      /* a stride-1 convolution's flipped kernel (mp__conv_by_flip) */
    /* a batch on its way to a device backend */
    void *stage_block[2]; /* host memory for it, two sets in turn */
    int stage_pinned;     /* stage_block came from the backend's host_alloc */
    mp__stage stages[2];
    int stage_turn;       /* the set the next batch fills */
    /* fit: its data and its steps' metrics */
    float *metric_log;    /* [MP__METRIC_LOG][2]: each unread fit step's metrics, on the backend */
    void *data_block;     /* fit's data on a device backend, or NULL (see mp__upload_data) */
    const float *data_x, *data_y;
    const int32_t *data_labels;
    uint32_t *data_idx;   /* this epoch's order */
    float *data_batch;    /* a batch's inputs gathered, float32, before the cast */
    size_t metric_batch[MP__METRIC_LOG], metric_count; /* their batch sizes; how many */
    /* the custom training loop's state (and fit's, which runs the same steps) */
    mp__loop loop;        /* where the custom loop stands (mp__loop_move) */
    int training;         /* the last forward's mode, Keras's `training` argument */
    int grads_ready;      /* mp_get_gradients has something to give */
    int grads_deferred;   /* 16-bit layers' float32 gradients not written yet (mp__deferred) */
    int as_summed;        /* fit's steps update as the ranks' sum lands (mp__agree_as_summed) */
    int applied;          /* the last apply updated (not only accumulated) */
    /* diagnostics and errors */
    int tensor_core_warned;
    struct mp__numerics *num; /* diagnostics (>>numerics diagnostics); NULL when off */
    char error[512];          /* the last error's message (mp_model_error) */
};

/* The diagnostics' hooks (>>numerics diagnostics): after each layer's
   forward and backward pass, and after unscaling. */
static mp_status mp__numerics_forward(mp_model *m, int layer);
static mp_status mp__numerics_backward(mp_model *m, int layer, const void *dx);
static int mp__numerics_active(const mp_model *m);
static mp_status mp__numerics_unscaled(mp_model *m);
static void mp__numerics_free(struct mp__numerics *nu);

static mp_status mp__fail(mp_model *m, mp_status st, const char *fmt, ...);
enum { MP__LAYER_WEIGHTS = 8 }; /* the most weights a layer kind has: MultiHeadAttention's */
static int mp__layer_weights(const mp__layer *l, mp_weight_info out[MP__LAYER_WEIGHTS]); /* >>model: queries */
static size_t mp__weight_size(const mp_weight_info *w);

/* The custom loop's transitions, in one place: a call needs the model in
   stage `need` (or a later one, where or_later) and moves it to `next`.
   After apply the loss stays: gradients may be taken again, as before the
   stages were named. A forward starts over from any stage; compile, a
   regrown batch and loaded weights reset. mp__loop_check says whether a
   call may run; mp__loop_move records that it did. */
static const struct mp__loop_rule {
    mp__loop need;
    int or_later, training; /* training: the forward must have been training=1 */
    mp__loop next;
    const char *why;
} mp__loop_rules[] = {
    /* FORWARD   */ {MP__LOOP_NONE, 1, 0, MP__LOOP_FORWARD, NULL},
    /* LOSS      */ {MP__LOOP_NONE, 1, 0, MP__LOOP_LOSS, NULL}, /* its caller checks that a forward ran */
    /* GRADIENTS */ {MP__LOOP_LOSS, 1, 1, MP__LOOP_GRADIENTS,
                     "gradients need mp_forward(training=1), then mp_compute_loss"},
    /* UNSCALE   */ {MP__LOOP_GRADIENTS, 0, 0, MP__LOOP_UNSCALED, "run mp_compute_scaled_gradients first"},
    /* APPLY     */ {MP__LOOP_UNSCALED, 0, 0, MP__LOOP_LOSS, "run mp_get_unscaled_gradients first"},
    /* RESET     */ {MP__LOOP_NONE, 1, 0, MP__LOOP_NONE, NULL},
};

static mp_status mp__loop_check(mp_model *m, mp__loop_call call) {
    const struct mp__loop_rule *r = &mp__loop_rules[call];
    if ((r->or_later ? m->loop < r->need : m->loop != r->need) || (r->training && !m->training))
        return mp__fail(m, MP_ERR_STATE, "%s", r->why);
    return MP_OK;
}
static void mp__loop_move(mp_model *m, mp__loop_call call) { m->loop = mp__loop_rules[call].next; }

static mp_status mp__fail(mp_model *m, mp_status st, const char *fmt, ...) {
    mp__text t;
    va_list ap;
    t.buf = m->error;
    t.cap = sizeof m->error;
    t.len = 0;
    va_start(ap, fmt); /* what to fix first, then the status's general sentence */
    mp__putv(&t, fmt, ap);
    va_end(ap);
    mp__put(&t, " (");
    mp__put(&t, mp_status_message(st));
    mp__put(&t, ")");
    return st;
}

#ifndef MIXPREC_NO_STDIO
/* The system's reason for a failed file call, from the errno it left (set
   to 0 before the call): POSIX's calls set it; C's fopen and fclose need
   not, and then there is none to give. */
static const char *mp__io_reason(int err) { return err ? strerror(err) : "the system gave no reason"; }
#endif

static uint64_t mp__splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* uniform in [0, 1) with 24 random bits */
static float mp__uniform(uint64_t *s) { return (float)(mp__splitmix(s) >> 40) * (1.0f / 16777216.0f); }

static size_t mp__params(const mp__layer *l) { return l->n_kernel + l->n_bias; }
static const mp__layer *mp__last(const mp_model *m) { return &m->layers[m->n_layers - 1]; }

/* The rows of a sample's output a loss reduces one by one: Keras's losses
   reduce the last axis and average the rest (sum_over_batch_size), so a
   (time, vocabulary) output is time rows, each with its own class index
   under sparse crossentropy; a flat output is one row. */
static size_t mp__loss_rows(const mp_model *m) {
    const mp__layer *l = mp__last(m);
    return l->out_size / (size_t)l->out_shape[l->out_rank - 1];
}

/* Activation: y = act(x) over the last axis */
static size_t mp__last_axis(const mp__layer *l) { return (size_t)l->in_shape[l->in_rank - 1]; }

/* The values the layer's softmax normalises together: the last axis. */
static size_t mp__act_row(const mp__layer *l) {
    if (l->desc.kind == MP_ACTIVATION) return mp__last_axis(l);
    return (size_t)(l->desc.kind == MP_CONV2D ? l->desc.filters : l->desc.units);
}

/* Keras takes a crossentropy from the logits when the model's output is a
   softmax (a sigmoid for binary crossentropy): the activation keeps its
   input on the output tensor (_keras_logits in Keras 3, also the op's
   input in tf_keras) and the loss reads it with from_logits=True, a stable
   log-sum-exp with no clipping. So here, when the last layer ends in that
   activation (over the whole row the loss sees), the loss reads the
   layer's pre-activation and its gradient is the logits' gradient: the
   layer's backward pass skips the activation's derivative. */
static int mp__logits_loss(const mp_compile_desc *c, const mp__layer *last) {
    mp_layer_kind kind = last->desc.kind;
    if (c->from_logits || (kind != MP_DENSE && kind != MP_CONV2D && kind != MP_ACTIVATION)) return 0;
    if (c->loss == MP_BINARY_CROSSENTROPY) return last->desc.activation == MP_SIGMOID;
    return (c->loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY || c->loss == MP_CATEGORICAL_CROSSENTROPY) &&
           last->desc.activation == MP_SOFTMAX && mp__act_row(last) == (size_t)last->out_shape[last->out_rank - 1];
}

/* Whether layer l's output gradient is its logits' (l is the last layer). */
static int mp__loss_from_logits(const mp_model *m, const mp__layer *l) {
    return m->compiled && l == mp__last(m) && mp__logits_loss(&m->compile, l);
}

/* The bias the epilogue adds, and its dtype: the compute-dtype copy, or,
   where the output dtype differs (AMP painted the product and the ops after
   it apart), the float32 weight itself: the epilogue sums in float32. */
static const void *mp__bias(const mp__layer *l, mp_dtype *type) {
    *type = l->yt == l->dt ? l->dt : MP_FLOAT32;
    if (!l->n_bias) return NULL;
    return *type == l->dt ? mp__at(l->wc, l->dt, l->bias_at) : l->w + l->n_kernel;
}

/* The layer's input in its compute dtype, casting on entry if needed. */
static const void *mp__layer_input(const mp_model *m, mp__layer *l, int k, size_t batch) {
    if (!l->xin[k]) return l->x[k];
    m->be->cast(m->ctx, l->xin[k], l->dt, l->x[k], l->xt[k], batch * l->in_sizes[k], NULL);
    return l->xin[k];
}
static const void *mp__saved_input(const mp__layer *l, int k) { return l->xin[k] ? l->xin[k] : l->x[k]; }

/* One product C[m x n] = op(A) op(B), A and B in dt. */
static mp_gemm_args mp__product(int trans_a, int trans_b, size_t m, size_t n, size_t k, const void *a, const void *b,
                                 mp_dtype dt, void *c, mp_dtype ct) {
    mp_gemm_args g;
    memset(&g, 0, sizeof g);
    g.trans_a = trans_a;
    g.trans_b = trans_b;
    g.m = m; g.n = n; g.k = k;
    g.a = a; g.b = b;
    g.at = g.bt = dt;
    g.c = c;
    g.ct = ct;
    return g;
}

/* The forward product of Dense or Conv2D, y = x W, with its epilogue: +
   bias, the activation (softmax, which needs whole rows, runs after), and
   gelu's pre-activation kept in z. */
static mp_gemm_args mp__linear_product(const mp__layer *l, size_t rows, size_t n, size_t k, const void *x) {
    mp_gemm_args g = mp__product(0, 0, rows, n, k, x, l->wc, l->dt, l->y, l->yt);
    g.z = l->z;
    g.bias = mp__bias(l, &g.biast);
    g.act = l->desc.activation == MP_SOFTMAX ? MP_LINEAR : l->desc.activation;
    return g;
}

static void mp__softmax_after(mp_model *m, const mp__layer *l, size_t rows, size_t cols) {
    if (l->desc.activation == MP_SOFTMAX) m->be->bias_act(m->ctx, l->y, l->y, NULL, rows, cols, MP_SOFTMAX, l->yt);
}

/* Dense: y = act(x W + b) over the last axis, as Keras's Dense on an input
   of rank > 2: a (time, features) sample is time rows of one product.
   x [B*T, in], W [in, units] (Keras's kernel layout), y [B*T, units] */
static size_t mp__dense_rows(const mp__layer *l, size_t batch) { return batch * (l->in_size / mp__last_axis(l)); }

static void mp__dense_forward(mp_model *m, mp__layer *l, size_t batch) {
    const void *x = mp__layer_input(m, l, 0, batch);
    size_t rows = mp__dense_rows(l, batch), units = (size_t)l->desc.units;
    mp_gemm_args g = mp__linear_product(l, rows, units, mp__last_axis(l), x);
    m->be->gemm(m->ctx, &g);
    mp__softmax_after(m, l, rows, units);
}

/* The layer whose ReLU's gradient the Dense layer `above` makes in its
   input gradient's product (mp_gemm_args's relu_y), or NULL: the layer
   below a Dense one, a Dense or Conv2D layer with ReLU whose output
   gradient needs no cast. Its dz is then written once, not written as dy
   and read back (a batch-8192 step's two 16 MiB bfloat16 passes). Not
   while the numerics diagnostics run: they read each layer's input
   gradient as it was before. */
static const mp__layer *mp__relu_below(const mp_model *m, const mp__layer *above) {
    const mp__layer *below;
    if (!m->be->relu_grad || above->in[0] == MP__FROM_INPUT || above->desc.kind != MP_DENSE || mp__numerics_active(m))
        return NULL;
    below = &m->layers[above->in[0]]; /* (not formed before: above may read the model's input) */
    if ((below->desc.kind != MP_DENSE && below->desc.kind != MP_CONV2D) || below->consumers != 1) return NULL;
    return below->desc.activation == MP_RELU && !below->dyc && below->yt == above->xt[0] ? below : NULL;
}

/* dz = dy * act'(z) in the compute dtype: in place, or into dyc where the
   output dtype differs (the backward's cast on entry); dy already where
   the layer reading it made it (mp__relu_below). */
static void *mp__dz(mp_model *m, const mp__layer *l, void *dy, size_t rows, size_t cols) {
    void *dz = l->dyc ? l->dyc : dy;
    if (l->consumer >= 0 && mp__relu_below(m, &m->layers[l->consumer]) == l) return dz;
    if (l->desc.activation != MP_LINEAR && !mp__loss_from_logits(m, l))
        m->be->act_backward(m->ctx, dz, l->dt, dy, l->y, l->z, rows, cols, l->desc.activation, l->yt);
    else if (dz != dy)
        m->be->cast(m->ctx, dz, l->dt, dy, l->yt, rows * cols, NULL);
    return dz;
}

static void mp__dense_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    size_t in = mp__last_axis(l), units = (size_t)l->desc.units, rows = mp__dense_rows(l, batch);
    dy = mp__dz(m, l, dy, rows, units);
    if (l->n_bias) m->be->bias_grad(m->ctx, mp__at_mut(l->gc, l->dt, l->n_kernel), dy, rows, units, l->dt);
    /* dW [in, units] = x^T dz;  dx [B*T, in] = dz W^T */
    mp_gemm_args dw = mp__product(1, 0, in, units, rows, mp__saved_input(l, 0), dy, l->dt, l->gc, l->dt);
    m->be->gemm(m->ctx, &dw);
    if (dx[0]) {
        const mp__layer *below = mp__relu_below(m, l);
        mp_gemm_args dxg = mp__product(0, 1, rows, in, units, dy, l->wc, l->dt, dx[0], l->xt[0]);
        dxg.relu_y = below ? below->y : NULL;
        m->be->gemm(m->ctx, &dxg);
    }
}

static void mp__activation_forward(mp_model *m, mp__layer *l, size_t batch) {
    const void *x = mp__layer_input(m, l, 0, batch);
    size_t cols = mp__last_axis(l);
    m->be->bias_act(m->ctx, l->y, x, NULL, batch * l->in_size / cols, cols, l->desc.activation, l->dt);
}

static void mp__activation_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    size_t cols = mp__last_axis(l);
    if (dx[0] && mp__loss_from_logits(m, l)) /* dy is already the logits' gradient */
        m->be->cast(m->ctx, dx[0], l->xt[0], dy, l->dt, batch * l->in_size, NULL);
    else if (dx[0])
        m->be->act_backward(m->ctx, dx[0], l->xt[0], dy, l->y, mp__saved_input(l, 0), batch * l->in_size / cols, cols,
                            l->desc.activation, l->dt);
}

/* Conv2D by im2col + GEMM over groups of images: on a device the whole
   batch, one im2col and one product per layer and direction (a handful of
   launches whatever the batch); on the host as many images as keep their
   columns in cache (MP__CONV_CACHE bytes; the same groups at any thread
   count), each thread making and multiplying whole groups (conv_gemm). A
   1x1 stride-1 kernel reads the NHWC batch as its own columns.
   y [G*OH*OW, F] = col [G*OH*OW, KH*KW*C] W [KH*KW*C, F] */
enum { MP__CONV_CACHE = 1 << 20 };
static int mp__pointwise(const mp__layer *l) {
    const mp_conv_geom *g = &l->geom;
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1;
}

/* A stride-1 convolution's input gradient is a convolution of dy with the
   kernel flipped (conv_flip): dx = im2col(dy) W', one product rounded once
   into dx's dtype. The other way, dy W^T folded back onto the image
   (col2im), writes and reads a float32 column matrix KH*KW times the
   image, then casts it (bench/convnet --model resnet). Strided ones fold. */
static int mp__conv_by_flip(const mp__layer *l) { return l->geom.sh == 1 && l->geom.sw == 1 && !mp__pointwise(l); }

/* Whether the layer's backward pass makes dy's columns: a flipped
   convolution whose input is another layer's (the model's input has no
   gradient). */
static int mp__flips_dy(const mp__layer *l) { return mp__conv_by_flip(l) && l->in[0] != MP__FROM_INPUT; }

/* The images a group holds: as many as keep their widest columns (x's, or
   dy's where mp__flips_dy) within MP__CONV_CACHE bytes in float32. */
static size_t mp__conv_group(const mp_model *m, const mp__layer *l, size_t batch) {
    size_t patches = 0, per = 0, dy_patches = 0; /* the planner refuses what overflows */
    if (m->be->device_memory) return batch;
    if (!mp__mul_ok((size_t)l->geom.oh * (size_t)l->geom.ow, l->n_kernel / (size_t)l->desc.filters, &patches) ||
        (mp__flips_dy(l) && !mp__mul_ok(l->in_size / (size_t)l->geom.c, l->n_kernel / (size_t)l->geom.c, &dy_patches)) ||
        !mp__mul_ok(mp__max(patches, dy_patches), sizeof(float), &per))
        return 1;
    return MP__CONV_CACHE / per > 1 ? mp__min(batch, MP__CONV_CACHE / per) : 1;
}

/* dy's geometry as the flipped convolution reads it: dy's image, the same
   kernel, the padding that gives back the input's size. */
static mp_conv_geom mp__flipped_geom(const mp__layer *l) {
    mp_conv_geom t = l->geom;
    t.h = l->geom.oh, t.w = l->geom.ow, t.c = l->desc.filters;
    t.pt = l->geom.kh - 1 - l->geom.pt, t.pl = l->geom.kw - 1 - l->geom.pl;
    t.oh = l->geom.h, t.ow = l->geom.w;
    return t;
}

/* mp_backend.conv_gemm's scratch for a layer whose group's columns take
   *bytes: a block of them for each thread, then the runs' C's; 0 where
   the size overflows. */
static int mp__conv_scratch(mp_model *m, const mp__layer *l, size_t *bytes) {
    size_t cols = 0, sums = 0;
    if (*bytes > SIZE_MAX - 63 || !mp__mul_ok((size_t)m->be->threads(m->ctx), mp__round_up(*bytes, 64), &cols) ||
        !mp__mul_ok((size_t)MP_CONV_PARTS - 1, l->n_kernel * sizeof(float), &sums) || cols > SIZE_MAX - sums)
        return 0;
    *bytes = cols + sums;
    return 1;
}

/* The product g whose op(A) is the columns of `images` images of
   geometry geom (g->a the images), a group of images at a time: by the
   backend's conv_gemm where it has one, else each group's im2col and then
   its product (a device's group is the whole batch). A 1x1 stride-1
   kernel's columns are its input, each group's product read there. */
static void mp__conv_product(mp_model *m, const mp__layer *l, const mp_gemm_args *g, const mp_conv_geom *geom,
                             size_t images) {
    size_t group = mp__conv_group(m, l, images), pixels = (size_t)geom->oh * (size_t)geom->ow, i;
    if (m->be->conv_gemm && !mp__pointwise(l)) {
        m->be->conv_gemm(m->ctx, g, geom, images, group, m->col);
        return;
    }
    for (i = 0; i < images; i += group) {
        size_t n = mp__min(group, images - i);
        const void *cols = mp__at(g->a, g->at, i * mp__img_elems(geom));
        mp_gemm_args p;
        if (!mp__pointwise(l)) {
            m->be->im2col(m->ctx, m->col, cols, n, geom, g->at);
            cols = m->col;
        }
        p = mp__group_product(g, cols, i * pixels, n * pixels);
        p.accumulate = g->accumulate || (g->trans_a && i > 0);
        m->be->gemm(m->ctx, &p);
    }
}

static void mp__conv_forward(mp_model *m, mp__layer *l, size_t batch) {
    size_t pixels = (size_t)l->geom.oh * (size_t)l->geom.ow, f = (size_t)l->desc.filters, patch = l->n_kernel / f;
    mp_gemm_args g = mp__linear_product(l, batch * pixels, f, patch, mp__layer_input(m, l, 0, batch));
    mp__conv_product(m, l, &g, &l->geom, batch);
    mp__softmax_after(m, l, batch * pixels, f);
}

static void mp__conv_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    size_t pixels = (size_t)l->geom.oh * (size_t)l->geom.ow, f = (size_t)l->desc.filters, patch = l->n_kernel / f;
    size_t group = mp__conv_group(m, l, batch), i;
    mp_gemm_args dw;
    dy = mp__dz(m, l, dy, batch * pixels, f);
    if (l->n_bias) m->be->bias_grad(m->ctx, mp__at_mut(l->gc, l->dt, l->n_kernel), dy, batch * pixels, f, l->dt);
    /* dW [patch, F] = cols^T dy over the batch, in float32 (in g), rounded once into gc */
    dw = mp__product(1, 0, patch, f, batch * pixels, mp__saved_input(l, 0), dy, l->dt, l->g, MP_FLOAT32);
    mp__conv_product(m, l, &dw, &l->geom, batch);
    m->be->cast(m->ctx, l->gc, l->dt, l->g, MP_FLOAT32, l->n_kernel, NULL);
    if (dx[0] && mp__conv_by_flip(l)) { /* dx [B*H*W, C] = im2col(dy) [B*H*W, KH*KW*F] W' [KH*KW*F, C] */
        mp_conv_geom t = mp__flipped_geom(l);
        size_t c = (size_t)l->geom.c;
        mp_gemm_args g = mp__product(0, 0, batch * l->in_size / c, c, patch / c * f, dy, m->wflip, l->dt, dx[0], l->xt[0]);
        m->be->conv_flip(m->ctx, m->wflip, l->wc, &l->geom, f, l->dt);
        mp__conv_product(m, l, &g, &t, batch);
        return;
    }
    for (i = 0; dx[0] && i < batch; i += group) { /* dcol = dy W^T, folded back onto the images */
        size_t n = mp__min(group, batch - i);
        void *dxi = mp__at_mut(dx[0], l->xt[0], i * l->in_size);
        mp_gemm_args dcol =
            mp__product(0, 1, n * pixels, patch, f, mp__at(dy, l->dt, i * l->out_size), l->wc, l->dt, dxi, l->xt[0]);
        if (mp__pointwise(l)) { /* a 1x1 kernel's dcol is dx itself */
            m->be->gemm(m->ctx, &dcol);
            continue;
        }
        dcol.c = m->dcol;
        dcol.ct = MP_FLOAT32;
        m->be->gemm(m->ctx, &dcol);
        m->be->col2im(m->ctx, m->img, m->dcol, n, &l->geom);
        m->be->cast(m->ctx, dxi, l->xt[0], m->img, MP_FLOAT32, n * l->in_size, NULL);
    }
}

/* MaxPooling2D */
static void mp__pool_forward(mp_model *m, mp__layer *l, size_t batch) {
    m->be->max_pool(m->ctx, l->y, mp__layer_input(m, l, 0, batch), batch, &l->geom, l->dt);
}

static void mp__pool_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    if (dx[0]) m->be->max_pool_backward(m->ctx, dx[0], l->xt[0], dy, mp__saved_input(l, 0), batch, &l->geom, l->dt);
}

/* Flatten and Reshape: the output is the (cast) input itself, a new view
   of the same values (the planner lets it share the input's memory) */
static void mp__view_forward(mp_model *m, mp__layer *l, size_t batch) { (void)mp__layer_input(m, l, 0, batch); }

static void mp__view_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    if (dx[0]) m->be->cast(m->ctx, dx[0], l->xt[0], dy, l->dt, batch * l->in_size, NULL);
}

/* Dropout: in training keep each value with probability 1 - rate and scale
   it by 1 / (1 - rate), as Keras; at inference the identity. */
static float mp__dropout_scale(const mp__layer *l) { return 1.0f / (1.0f - l->desc.rate); }

static void mp__dropout_forward(mp_model *m, mp__layer *l, size_t batch) {
    const void *x = mp__layer_input(m, l, 0, batch);
    size_t n = batch * l->in_size;
    if (!m->training) { m->be->cast(m->ctx, l->y, l->dt, x, l->dt, n, NULL); return; }
    m->be->dropout_mask(m->ctx, l->mask, n, l->desc.rate, mp__splitmix(&l->rng)); /* a fresh mask each step */
    m->be->dropout(m->ctx, l->y, l->dt, x, l->dt, l->mask, n, mp__dropout_scale(l));
}

static void mp__dropout_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    if (dx[0]) m->be->dropout(m->ctx, dx[0], l->xt[0], dy, l->dt, l->mask, batch * l->in_size, mp__dropout_scale(l));
}

/* BatchNormalization (Keras 3): each channel (the last axis) normalised by
   the batch's float32 mean and variance in training, which also move the
   moving statistics (l->state: mean, then variance), and by the moving
   ones at inference; gamma and beta (the kernel and bias slots) read as
   float32, uncast. x [B*H*W, C] */
static void mp__batch_norm_forward(mp_model *m, mp__layer *l, size_t batch) {
    size_t c = mp__last_axis(l);
    m->be->batch_norm(m->ctx, l->y, l->yt, mp__layer_input(m, l, 0, batch), l->dt, batch * l->in_size / c, c, l->w,
                      l->stats, l->state, l->desc.momentum, l->desc.epsilon, m->training);
}

static void mp__batch_norm_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    size_t c = mp__last_axis(l), rows = batch * l->in_size / c;
    m->be->batch_norm_backward(m->ctx, dx[0], l->xt[0], mp__dz(m, l, dy, rows, c), mp__saved_input(l, 0), l->dt,
                               rows, c, l->w, l->stats, l->desc.epsilon, l->g);
}

/* LayerNormalization (Keras): each row of the last axis by its own float32
   mean and variance (kept in l->stats for the backward pass); gamma and
   beta float32, uncast. x [B*..., C] */
static void mp__layer_norm_forward(mp_model *m, mp__layer *l, size_t batch) {
    size_t c = mp__last_axis(l);
    m->be->layer_norm(m->ctx, l->y, l->yt, mp__layer_input(m, l, 0, batch), l->dt, batch * l->in_size / c, c, l->w,
                      l->desc.epsilon, l->stats);
}

static void mp__layer_norm_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    size_t c = mp__last_axis(l), rows = batch * l->in_size / c;
    m->be->layer_norm_backward(m->ctx, dx[0], l->xt[0], mp__dz(m, l, dy, rows, c), mp__saved_input(l, 0), l->dt,
                               rows, c, l->w, l->stats, l->g);
}

/* Add, Subtract, Multiply, Average: Keras's merge layers, y = x0 op x1 op
   x2 ..., a pair at a time in the layer's dtype (each step rounded, as
   Keras's loop of ops.add); Average divides the sum once. The inputs are
   cast on entry to the compute dtype. */
static mp_elementwise mp__merge_op(const mp__layer *l) {
    return l->desc.kind == MP_SUBTRACT ? MP_EW_SUBTRACT : l->desc.kind == MP_MULTIPLY ? MP_EW_MULTIPLY : MP_EW_ADD;
}

static void mp__merge_forward(mp_model *m, mp__layer *l, size_t batch) {
    size_t n = batch * l->out_size;
    int k;
    m->be->elementwise(m->ctx, mp__merge_op(l), l->y, l->yt, mp__layer_input(m, l, 0, batch), l->dt,
                       mp__layer_input(m, l, 1, batch), l->dt, 0.0f, n);
    for (k = 2; k < l->n_in; k++)
        m->be->elementwise(m->ctx, mp__merge_op(l), l->y, l->yt, l->y, l->yt, mp__layer_input(m, l, k, batch), l->dt,
                           0.0f, n);
    if (l->desc.kind == MP_AVERAGE)
        m->be->elementwise(m->ctx, MP_EW_SCALE, l->y, l->yt, l->y, l->yt, NULL, l->yt, 1.0f / (float)l->n_in, n);
}

/* dx_k = dy (Add), dy and -dy (Subtract), dy / n (Average), dy times the
   other inputs (Multiply, a factor at a time), each into its input's dtype */
static void mp__merge_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    size_t n = batch * l->out_size;
    const void *dz = mp__dz(m, l, dy, batch, l->out_size);
    int k, j;
    for (k = 0; k < l->n_in; k++) {
        const void *from = dz;
        mp_dtype ft = l->dt;
        if (!dx[k]) continue;
        if (l->desc.kind == MP_MULTIPLY) {
            for (j = 0; j < l->n_in; j++) {
                if (j == k) continue;
                m->be->elementwise(m->ctx, MP_EW_MULTIPLY, dx[k], l->xt[k], from, ft, mp__saved_input(l, j), l->dt,
                                   0.0f, n);
                from = dx[k];
                ft = l->xt[k];
            }
        } else if (l->desc.kind == MP_ADD) {
            m->be->cast(m->ctx, dx[k], l->xt[k], dz, l->dt, n, NULL);
        } else {
            float s = l->desc.kind == MP_AVERAGE ? 1.0f / (float)l->n_in : k ? -1.0f : 1.0f;
            m->be->elementwise(m->ctx, MP_EW_SCALE, dx[k], l->xt[k], dz, l->dt, NULL, l->dt, s, n);
        }
    }
}

/* Concatenate along desc.axis (Keras's numbering, a sample's axes from 1):
   each sample is `outer` rows of its inputs' blocks side by side, input
   k's block in_sizes[k] / outer values wide. */
static size_t mp__concat_outer(const mp__layer *l) {
    size_t outer = 1;
    int a;
    for (a = 0; a + 1 < l->desc.axis; a++) outer *= (size_t)l->out_shape[a];
    return outer;
}

static void mp__concat_forward(mp_model *m, mp__layer *l, size_t batch) {
    size_t outer = mp__concat_outer(l), rows = batch * outer, width = l->out_size / outer, at = 0, cols;
    int k;
    for (k = 0; k < l->n_in; k++, at += cols) {
        cols = l->in_sizes[k] / outer;
        m->be->copy_cols(m->ctx, mp__at_mut(l->y, l->yt, at), l->yt, width, mp__layer_input(m, l, k, batch), l->dt,
                         cols, rows, cols);
    }
}

static void mp__concat_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    size_t outer = mp__concat_outer(l), rows = batch * outer, width = l->out_size / outer, at = 0, cols;
    const void *dz = mp__dz(m, l, dy, rows, width);
    int k;
    for (k = 0; k < l->n_in; k++, at += cols) {
        cols = l->in_sizes[k] / outer;
        if (dx[k]) m->be->copy_cols(m->ctx, dx[k], l->xt[k], cols, mp__at(dz, l->dt, at), l->dt, width, rows, cols);
    }
}

/* AveragePooling2D and GlobalAveragePooling2D (one window over the whole
   image, the output (C,)): each window's mean */
static void mp__avg_pool_forward(mp_model *m, mp__layer *l, size_t batch) {
    m->be->avg_pool(m->ctx, l->y, mp__layer_input(m, l, 0, batch), batch, &l->geom, l->dt);
}

static void mp__avg_pool_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    if (dx[0]) m->be->avg_pool_backward(m->ctx, dx[0], l->xt[0], dy, batch, &l->geom, l->dt);
}

/* Embedding (Keras 3): each id's row of the float32 table, cast to the
   compute dtype; its gradient a scatter-add into float32 rows in a fixed
   order (the backend's embedding_backward). The ids are the model's input,
   float32 (mp__input_dtype), checked by the host (mp__check_ids).
   PositionEmbedding (keras_hub): row t of the table for position t of
   every sample; its input gives only the shape. y [B*T, C] */
static size_t mp__embedding_width(const mp__layer *l) { return (size_t)l->out_shape[l->out_rank - 1]; }

static void mp__embedding_forward(mp_model *m, mp__layer *l, size_t batch) {
    size_t cols = mp__embedding_width(l), rows = batch * l->out_size / cols;
    if (l->desc.kind == MP_EMBEDDING)
        m->be->embedding(m->ctx, l->y, l->yt, l->w, (size_t)l->desc.input_dim, (const float *)l->x[0], 0, rows, cols);
    else
        m->be->embedding(m->ctx, l->y, l->yt, l->w, (size_t)l->desc.sequence_length, NULL, (size_t)l->in_shape[0], rows,
                         cols);
}

static void mp__embedding_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    size_t cols = mp__embedding_width(l), rows = batch * l->out_size / cols;
    const void *dz = mp__dz(m, l, dy, rows, cols);
    if (l->desc.kind == MP_EMBEDDING)
        m->be->embedding_backward(m->ctx, l->g, (size_t)l->desc.input_dim, dz, l->dt, (const float *)l->x[0], 0, rows,
                                  cols);
    else
        m->be->embedding_backward(m->ctx, l->g, (size_t)l->desc.sequence_length, dz, l->dt, NULL,
                                  (size_t)l->in_shape[0], rows, cols);
    if (dx[0]) m->be->zero(m->ctx, dx[0], batch * l->in_size * mp__dtypes[l->xt[0]].size); /* y does not depend on x */
}

/* MultiHeadAttention (Keras 3), self-attention on x [B*T, C]: q, k, v =
   x W + b [B*T, H*D] (Keras's query/key/value EinsumDense layers), the
   heads' attention (the backend's attention op, >>rules), y = att W_o +
   b_o [B*T, C]. Its weights, Keras's order: query kernel and bias, key's,
   value's, attention_output's (all in the kernel slot: n_bias is 0). */
typedef struct mp__mha {
    size_t rows, t, c, heads, d, hd; /* B*T; T; features; heads; key_dim; heads * key_dim */
    size_t kernel[4], bias[4];       /* offsets in the weights: query, key, value, attention_output */
    void *qkv[3], *att, *p;          /* in work */
    void *dqkv[3], *datt;            /* in scratch */
    float *s;                        /* the backward's float32 t x t a sequence, in scratch */
    float scale;
} mp__mha;

static void mp__mha_offsets(const mp__layer *l, size_t *kernel, size_t *bias) {
    size_t c = mp__last_axis(l), hd = (size_t)l->desc.num_heads * (size_t)l->desc.key_dim, at = 0;
    int j;
    for (j = 0; j < 4; j++) {
        kernel[j] = at;
        at += c * hd;
        bias[j] = at;
        if (!l->desc.no_bias) at += j < 3 ? hd : c;
    }
}

static mp__mha mp__mha_of(const mp__layer *l, size_t batch) {
    mp__mha h;
    size_t n, es = mp__dtypes[l->dt].size;
    int j;
    h.t = (size_t)l->in_shape[0], h.c = mp__last_axis(l), h.rows = batch * h.t;
    h.heads = (size_t)l->desc.num_heads, h.d = (size_t)l->desc.key_dim, h.hd = h.heads * h.d;
    h.scale = 1.0f / sqrtf((float)l->desc.key_dim);
    mp__mha_offsets(l, h.kernel, h.bias);
    n = h.rows * h.hd;
    for (j = 0; j < 3; j++) {
        h.qkv[j] = l->work ? (unsigned char *)l->work + (size_t)j * n * es : NULL;
        h.dqkv[j] = l->scratch ? (unsigned char *)l->scratch + (size_t)j * n * es : NULL;
    }
    h.att = l->work ? (unsigned char *)l->work + 3 * n * es : NULL;
    h.p = l->work ? (unsigned char *)l->work + 4 * n * es : NULL;
    h.datt = l->scratch ? (unsigned char *)l->scratch + 3 * n * es : NULL;
    h.s = l->scratch ? (float *)(void *)((unsigned char *)l->scratch + 4 * n * es) : NULL;
    return h;
}

/* The bytes of work and scratch, and the float32 logits (stats), for batch.
   The logits are the forward's alone (the backward recomputes from the
   probabilities in work): the backward's float32 t x t go in its scratch,
   so neither outlives its pass. */
static void mp__mha_sizes(const mp__layer *l, size_t batch, size_t *work, size_t *scratch, size_t *logits, int *overflow) {
    size_t t = (size_t)l->in_shape[0], hd = (size_t)l->desc.num_heads * (size_t)l->desc.key_dim, es = mp__dtypes[l->dt].size;
    size_t act = 0, probs = 0;
    *logits = 0;
    if (!mp__mul_ok(batch * t, hd * es, &act) || !mp__mul_ok(batch * (size_t)l->desc.num_heads, t * t, &probs) ||
        !mp__mul_ok(probs, sizeof(float), logits) || act > SIZE_MAX / 5 - probs * es || *logits > SIZE_MAX - 4 * act)
        *overflow = 1;
    *work = 4 * act + probs * es;
    *scratch = 4 * act + *logits;
}

/* The bias of part j as the product's epilogue reads it (see mp__bias). */
static const void *mp__mha_bias(const mp__layer *l, size_t at, mp_dtype ct, mp_dtype *type) {
    *type = ct == l->dt ? l->dt : MP_FLOAT32;
    if (l->desc.no_bias) return NULL;
    return *type == l->dt ? mp__at(l->wc, l->dt, at) : l->w + at;
}

static void mp__mha_forward(mp_model *m, mp__layer *l, size_t batch) {
    mp__mha h = mp__mha_of(l, batch);
    const void *x = mp__layer_input(m, l, 0, batch);
    mp_gemm_args g;
    int j;
    for (j = 0; j < 3; j++) { /* q, k, v [B*T, H*D] = x W + b */
        g = mp__product(0, 0, h.rows, h.hd, h.c, x, mp__at(l->wc, l->dt, h.kernel[j]), l->dt, h.qkv[j], l->dt);
        g.bias = mp__mha_bias(l, h.bias[j], l->dt, &g.biast);
        m->be->gemm(m->ctx, &g);
    }
    m->be->attention(m->ctx, h.att, h.p, l->stats, h.qkv[0], h.qkv[1], h.qkv[2], l->dt, batch, h.t, h.heads, h.d,
                     h.scale, l->desc.use_causal_mask != 0);
    g = mp__product(0, 0, h.rows, h.c, h.hd, h.att, mp__at(l->wc, l->dt, h.kernel[3]), l->dt, l->y, l->yt);
    g.bias = mp__mha_bias(l, h.bias[3], l->yt, &g.biast);
    m->be->gemm(m->ctx, &g);
}

/* A projection's weight gradients: dW = in^T dz [k, n], db = sum dz. */
static void mp__mha_grads(mp_model *m, mp__layer *l, const mp__mha *h, int j, const void *in, const void *dz, size_t k,
                          size_t n) {
    mp_gemm_args dw = mp__product(1, 0, k, n, h->rows, in, dz, l->dt, mp__at_mut(l->gc, l->dt, h->kernel[j]), l->dt);
    m->be->gemm(m->ctx, &dw);
    if (!l->desc.no_bias) m->be->bias_grad(m->ctx, mp__at_mut(l->gc, l->dt, h->bias[j]), dz, h->rows, n, l->dt);
}

static void mp__mha_backward(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx) {
    mp__mha h = mp__mha_of(l, batch);
    const void *dz = mp__dz(m, l, dy, h.rows, h.c), *x = mp__saved_input(l, 0);
    mp_gemm_args g;
    int j;
    mp__mha_grads(m, l, &h, 3, h.att, dz, h.hd, h.c);
    g = mp__product(0, 1, h.rows, h.hd, h.c, dz, mp__at(l->wc, l->dt, h.kernel[3]), l->dt, h.datt, l->dt);
    m->be->gemm(m->ctx, &g); /* datt = dz W_o^T */
    m->be->attention_backward(m->ctx, h.dqkv[0], h.dqkv[1], h.dqkv[2], h.s, h.datt, h.qkv[0], h.qkv[1], h.qkv[2],
                              h.p, l->dt, batch, h.t, h.heads, h.d, h.scale, l->desc.use_causal_mask != 0);
    for (j = 0; j < 3; j++) {
        mp__mha_grads(m, l, &h, j, x, h.dqkv[j], h.c, h.hd);
        if (!dx[0]) continue; /* dx = dq W_q^T + dk W_k^T + dv W_v^T */
        g = mp__product(0, 1, h.rows, h.c, h.hd, h.dqkv[j], mp__at(l->wc, l->dt, h.kernel[j]), l->dt, dx[0], l->xt[0]);
        g.accumulate = j > 0;
        m->be->gemm(m->ctx, &g);
    }
}

/* A kind's passes and what the planner needs to know of them: how many
   inputs it takes; whether its backward pass reads its inputs (kept until
   then) or its own output; whether its output is its input (a view);
   whether it reads its weights as float32 whatever its compute dtype. */
typedef struct mp__layer_kind {
    const char *type, *base_name;
    void (*forward)(mp_model *m, mp__layer *l, size_t batch);
    void (*backward)(mp_model *m, mp__layer *l, size_t batch, void *dy, void *const *dx);
    int min_inputs, max_inputs;
    int reads_input, reads_output, view, float32_weights;
} mp__layer_kind;

/* Indexed by mp_layer_kind (see ADDING A LAYER KIND in the doc block). */
static const mp__layer_kind mp__kinds[MP_LAYER_KIND_COUNT] = {
    /* type, base name; forward, backward; inputs (min, max); reads_input, reads_output, view, float32_weights */
    /* 0 */
    {MP_OP(type) NULL, MP_OP(base_name) NULL,
     MP_OP(forward) NULL, MP_OP(backward) NULL,
     MP_OP(min_inputs) 0, MP_OP(max_inputs) 0,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_DENSE */
    {MP_OP(type) "Dense", MP_OP(base_name) "dense",
     MP_OP(forward) mp__dense_forward, MP_OP(backward) mp__dense_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 1, MP_OP(reads_output) 1, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_ACTIVATION */
    {MP_OP(type) "Activation", MP_OP(base_name) "activation",
     MP_OP(forward) mp__activation_forward, MP_OP(backward) mp__activation_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 1, MP_OP(reads_output) 1, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_CONV2D */
    {MP_OP(type) "Conv2D", MP_OP(base_name) "conv2d",
     MP_OP(forward) mp__conv_forward, MP_OP(backward) mp__conv_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 1, MP_OP(reads_output) 1, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_MAX_POOLING2D */
    {MP_OP(type) "MaxPooling2D", MP_OP(base_name) "max_pooling2d",
     MP_OP(forward) mp__pool_forward, MP_OP(backward) mp__pool_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 1, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_FLATTEN */
    {MP_OP(type) "Flatten", MP_OP(base_name) "flatten",
     MP_OP(forward) mp__view_forward, MP_OP(backward) mp__view_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 1, MP_OP(float32_weights) 0},
    /* MP_DROPOUT */
    {MP_OP(type) "Dropout", MP_OP(base_name) "dropout",
     MP_OP(forward) mp__dropout_forward, MP_OP(backward) mp__dropout_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_BATCH_NORMALIZATION */
    {MP_OP(type) "BatchNormalization", MP_OP(base_name) "batch_normalization",
     MP_OP(forward) mp__batch_norm_forward, MP_OP(backward) mp__batch_norm_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 1, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 1},
    /* MP_LAYER_NORMALIZATION */
    {MP_OP(type) "LayerNormalization", MP_OP(base_name) "layer_normalization",
     MP_OP(forward) mp__layer_norm_forward, MP_OP(backward) mp__layer_norm_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 1, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 1},
    /* MP_ADD */
    {MP_OP(type) "Add", MP_OP(base_name) "add",
     MP_OP(forward) mp__merge_forward, MP_OP(backward) mp__merge_backward,
     MP_OP(min_inputs) 2, MP_OP(max_inputs) MP_MAX_LAYER_INPUTS,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_SUBTRACT */
    {MP_OP(type) "Subtract", MP_OP(base_name) "subtract",
     MP_OP(forward) mp__merge_forward, MP_OP(backward) mp__merge_backward,
     MP_OP(min_inputs) 2, MP_OP(max_inputs) 2,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_MULTIPLY */
    {MP_OP(type) "Multiply", MP_OP(base_name) "multiply",
     MP_OP(forward) mp__merge_forward, MP_OP(backward) mp__merge_backward,
     MP_OP(min_inputs) 2, MP_OP(max_inputs) MP_MAX_LAYER_INPUTS,
     MP_OP(reads_input) 1, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_AVERAGE */
    {MP_OP(type) "Average", MP_OP(base_name) "average",
     MP_OP(forward) mp__merge_forward, MP_OP(backward) mp__merge_backward,
     MP_OP(min_inputs) 2, MP_OP(max_inputs) MP_MAX_LAYER_INPUTS,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_CONCATENATE */
    {MP_OP(type) "Concatenate", MP_OP(base_name) "concatenate",
     MP_OP(forward) mp__concat_forward, MP_OP(backward) mp__concat_backward,
     MP_OP(min_inputs) 2, MP_OP(max_inputs) MP_MAX_LAYER_INPUTS,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_AVERAGE_POOLING2D */
    {MP_OP(type) "AveragePooling2D", MP_OP(base_name) "average_pooling2d",
     MP_OP(forward) mp__avg_pool_forward, MP_OP(backward) mp__avg_pool_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_GLOBAL_AVERAGE_POOLING2D */
    {MP_OP(type) "GlobalAveragePooling2D", MP_OP(base_name) "global_average_pooling2d",
     MP_OP(forward) mp__avg_pool_forward, MP_OP(backward) mp__avg_pool_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
    /* MP_RESHAPE */
    {MP_OP(type) "Reshape", MP_OP(base_name) "reshape",
     MP_OP(forward) mp__view_forward, MP_OP(backward) mp__view_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 1, MP_OP(float32_weights) 0},
    /* MP_EMBEDDING: its backward pass reads the ids (the model's input, kept by the batch) */
    {MP_OP(type) "Embedding", MP_OP(base_name) "embedding",
     MP_OP(forward) mp__embedding_forward, MP_OP(backward) mp__embedding_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 1},
    /* MP_POSITION_EMBEDDING */
    {MP_OP(type) "PositionEmbedding", MP_OP(base_name) "position_embedding",
     MP_OP(forward) mp__embedding_forward, MP_OP(backward) mp__embedding_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 0, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 1},
    /* MP_MULTI_HEAD_ATTENTION */
    {MP_OP(type) "MultiHeadAttention", MP_OP(base_name) "multi_head_attention",
     MP_OP(forward) mp__mha_forward, MP_OP(backward) mp__mha_backward,
     MP_OP(min_inputs) 1, MP_OP(max_inputs) 1,
     MP_OP(reads_input) 1, MP_OP(reads_output) 0, MP_OP(view) 0, MP_OP(float32_weights) 0},
};

/* The dtype a layer computing in dt reads its weights in: dt, or float32
   for a kind that reads them uncast (the normalizations' gamma and beta). */
static mp_dtype mp__weight_dtype(mp_layer_kind kind, mp_dtype dt) {
    return mp__kinds[kind].float32_weights ? MP_FLOAT32 : dt;
}

/* >>layers: descriptions */
static const char *const mp__activation_names[MP_ACTIVATION_COUNT] = {"linear", "relu", "sigmoid",
                                                                      "softmax", "tanh", "gelu",
                                                                      "gelu_approximate"};

MIXPREC_API const char *mp_activation_name(mp_activation a) {
    return (unsigned)a < (unsigned)MP_ACTIVATION_COUNT ? mp__activation_names[a] : NULL;
}

MIXPREC_API mp_status mp_activation_from_name(const char *name, mp_activation *out) {
    int a;
    if (!name || !out) return MP_ERR_NULL;
    for (a = 0; a < MP_ACTIVATION_COUNT; a++)
        if (strcmp(name, mp__activation_names[a]) == 0) { *out = (mp_activation)a; return MP_OK; }
    return MP_ERR_UNKNOWN_NAME;
}

static mp_layer_desc mp__desc(mp_layer_kind kind) {
    mp_layer_desc d;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    return d;
}

MIXPREC_API mp_layer_desc mp_dense(int units, mp_activation activation) {
    mp_layer_desc d = mp__desc(MP_DENSE);
    d.units = units;
    d.activation = activation;
    return d;
}

MIXPREC_API mp_layer_desc mp_activation_layer(mp_activation activation) {
    mp_layer_desc d = mp__desc(MP_ACTIVATION);
    d.activation = activation;
    return d;
}

MIXPREC_API mp_layer_desc mp_conv2d(int filters, int kernel_h, int kernel_w, mp_padding padding,
                                    mp_activation activation) {
    mp_layer_desc d = mp__desc(MP_CONV2D);
    d.filters = filters;
    d.kernel_size[0] = kernel_h;
    d.kernel_size[1] = kernel_w;
    d.padding = padding;
    d.activation = activation;
    return d;
}

static mp_layer_desc mp__pooling(mp_layer_kind kind, int pool_h, int pool_w) {
    mp_layer_desc d = mp__desc(kind);
    d.pool_size[0] = pool_h;
    d.pool_size[1] = pool_w;
    return d;
}

MIXPREC_API mp_layer_desc mp_max_pooling2d(int pool_h, int pool_w) {
    return mp__pooling(MP_MAX_POOLING2D, pool_h, pool_w);
}

MIXPREC_API mp_layer_desc mp_flatten(void) { return mp__desc(MP_FLATTEN); }

MIXPREC_API mp_layer_desc mp_dropout(float rate) {
    mp_layer_desc d = mp__desc(MP_DROPOUT);
    d.rate = rate;
    return d;
}

MIXPREC_API mp_layer_desc mp_embedding(int input_dim, int output_dim) {
    mp_layer_desc d = mp__desc(MP_EMBEDDING);
    d.input_dim = input_dim;
    d.output_dim = output_dim;
    return d;
}

MIXPREC_API mp_layer_desc mp_position_embedding(int sequence_length) {
    mp_layer_desc d = mp__desc(MP_POSITION_EMBEDDING);
    d.sequence_length = sequence_length;
    return d;
}

MIXPREC_API mp_layer_desc mp_multi_head_attention(int num_heads, int key_dim, int use_causal_mask) {
    mp_layer_desc d = mp__desc(MP_MULTI_HEAD_ATTENTION);
    d.num_heads = num_heads;
    d.key_dim = key_dim;
    d.use_causal_mask = use_causal_mask;
    return d;
}

MIXPREC_API mp_layer_desc mp_batch_normalization(void) { return mp__desc(MP_BATCH_NORMALIZATION); }
MIXPREC_API mp_layer_desc mp_layer_normalization(void) { return mp__desc(MP_LAYER_NORMALIZATION); }
MIXPREC_API mp_layer_desc mp_add(void) { return mp__desc(MP_ADD); }
MIXPREC_API mp_layer_desc mp_subtract(void) { return mp__desc(MP_SUBTRACT); }
MIXPREC_API mp_layer_desc mp_multiply(void) { return mp__desc(MP_MULTIPLY); }
MIXPREC_API mp_layer_desc mp_average(void) { return mp__desc(MP_AVERAGE); }

MIXPREC_API mp_layer_desc mp_concatenate(int axis) {
    mp_layer_desc d = mp__desc(MP_CONCATENATE);
    d.axis = axis;
    return d;
}

MIXPREC_API mp_layer_desc mp_average_pooling2d(int pool_h, int pool_w) {
    return mp__pooling(MP_AVERAGE_POOLING2D, pool_h, pool_w);
}

MIXPREC_API mp_layer_desc mp_global_average_pooling2d(void) { return mp__desc(MP_GLOBAL_AVERAGE_POOLING2D); }

MIXPREC_API mp_layer_desc mp_reshape(const int *target_shape) {
    mp_layer_desc d = mp__desc(MP_RESHAPE);
    int i;
    for (i = 0; target_shape && i < MP_MAX_RANK - 1 && target_shape[i]; i++) d.target_shape[i] = target_shape[i];
    return d;
}

/* >>losses, metrics and optimizers: learning-rate schedules (see the
   declaration; Keras's formulas, in float32 as Keras computes them) */
static int mp__schedule_valid(const mp_lr_schedule *s) {
    if ((unsigned)s->kind >= (unsigned)MP_LR_SCHEDULE_COUNT) return 0;
    if (s->kind == MP_LR_CONSTANT) return 1;
    if (s->kind == MP_COSINE_DECAY && s->warmup_target != 0.0f) /* a warmup may start from 0 */
        return s->warmup_target > 0.0f && s->warmup_target <= FLT_MAX && s->initial_learning_rate >= 0.0f &&
               s->initial_learning_rate <= FLT_MAX && s->decay_steps > 0 && s->alpha >= 0.0f && s->alpha <= 1.0f;
    return s->initial_learning_rate > 0.0f && s->initial_learning_rate <= FLT_MAX && s->decay_steps > 0 &&
           s->warmup_steps == 0 && s->warmup_target == 0.0f &&
           (s->kind != MP_EXPONENTIAL_DECAY || (s->decay_rate > 0.0f && s->decay_rate <= FLT_MAX)) &&
           (s->kind != MP_COSINE_DECAY || (s->alpha >= 0.0f && s->alpha <= 1.0f));
}

MIXPREC_API float mp_lr_schedule_value(const mp_lr_schedule *s, uint64_t step) {
    float p, from;
    if (!s || !mp__schedule_valid(s)) return 0.0f;
    if (s->kind == MP_LR_CONSTANT) return s->initial_learning_rate;
    from = s->initial_learning_rate;
    if (s->kind == MP_COSINE_DECAY && s->warmup_target > 0.0f) { /* Keras 3's _warmup_function, then decay */
        if (step < s->warmup_steps)
            return (s->warmup_target - s->initial_learning_rate) * ((float)step / (float)s->warmup_steps) +
                   s->initial_learning_rate;
        step -= s->warmup_steps;
        from = s->warmup_target;
    }
    p = (float)step / (float)s->decay_steps;
    if (s->kind == MP_EXPONENTIAL_DECAY) return from * powf(s->decay_rate, s->staircase ? floorf(p) : p);
    p = p < 1.0f ? p : 1.0f; /* CosineDecay: flat at alpha past decay_steps */
    return from * ((1.0f - s->alpha) * (0.5f * (1.0f + cosf(3.14159265f * p))) + s->alpha);
}

/* >>loss scaling (Keras LossScaleOptimizer; see the declaration) */
/* The defaults filled in; the first field out of range, or NULL (and *ls
   the fresh state). */
static const char *mp__loss_scale_resolve(mp_loss_scale *ls, const mp_loss_scale_desc *desc) {
    mp_loss_scale r;
    mp_loss_scale_desc *c = &r.config;
    const char *bad;
    memset(&r, 0, sizeof r);
    if (desc) r.config = *desc;
    if (c->initial_scale == 0.0f) c->initial_scale = 32768.0f;
    if (c->growth_interval == 0) c->growth_interval = 2000;
    if (c->min_scale == 0.0f) c->min_scale = 1.0f;
    if (c->max_scale == 0.0f) c->max_scale = FLT_MAX;
    if (c->hysteresis == 0) c->hysteresis = 1;
    bad = !(c->initial_scale > 0.0f && c->initial_scale <= FLT_MAX) ? "initial_scale"
          : c->growth_interval < 0                                  ? "growth_interval"
          : !(c->max_scale > 0.0f && c->max_scale <= FLT_MAX)       ? "max_scale"
          : !(c->min_scale > 0.0f && c->min_scale <= c->max_scale)  ? "min_scale"
          : c->hysteresis < 0                                       ? "hysteresis"
                                                                    : NULL;
    if (bad) return bad;
    r.scale = c->initial_scale;
    r.overflows_left = c->hysteresis;
    *ls = r;
    return NULL;
}

MIXPREC_API mp_status mp_loss_scale_init(mp_loss_scale *ls, const mp_loss_scale_desc *desc) {
    if (!ls) return MP_ERR_NULL;
    return mp__loss_scale_resolve(ls, desc) ? MP_ERR_ARG : MP_OK;
}

MIXPREC_API int mp_loss_scale_update(mp_loss_scale *ls, int grads_finite) {
    return ls ? mp_loss_scale_step(ls, grads_finite) : 0;
}

/* >>automatic mixed precision (see the declaration). The model is a graph
   of ops, each knowing the ops it reads; they are listed in the layers'
   order, a topological order (a layer reads earlier layers), so
   TensorFlow's traversals along inputs or outputs become one scan forward
   or backward over the ops' edges. */
enum { MP__ALLOW = 1, MP__DENY = 2, MP__INFER = 4, MP__CLEAR = 8 }; /* list bits, in mp__amp_lists' order */
static const char *const mp__amp_lists[4] = {"allow", "deny", "infer", "clear"};

typedef enum mp__op {
    MP__OP_MATMUL, MP__OP_CONV2D, MP__OP_BIAS_ADD, MP__OP_SIGMOID, MP__OP_TANH, MP__OP_SOFTMAX, MP__OP_GELU,
    MP__OP_LOG, MP__OP_LOG1P, MP__OP_RELU, MP__OP_MAX_POOL, MP__OP_RESHAPE, MP__OP_DROPOUT, MP__OP_IDENTITY,
    MP__OP_EXP, MP__OP_SUM, MP__OP_MEAN, MP__OP_SPARSE_XENT, MP__OP_XENT, MP__OP_SQUARED_DIFFERENCE,
    MP__OP_FUSED_BATCH_NORM, MP__OP_ADD, MP__OP_SUB, MP__OP_MUL, MP__OP_REAL_DIV, MP__OP_RSQRT,
    MP__OP_AVG_POOL, MP__OP_CONCAT, MP__OP_GATHER, MP__OP_BATCH_MATMUL,
    MP__OP_COUNT /* also "no op" */
} mp__op;

/* Every op the pass can see, with its list in TensorFlow's
   auto_mixed_precision_lists.h: float16's (AutoMixedPrecisionListsFp16, as
   on a GPU and auto_mixed_precision_cpu), then bfloat16's (the oneDNN
   lists, AutoMixedPrecisionListsMkl: Sum, Mean, SquaredDifference and Rsqrt
   are infer there). */
static const struct { const char *name; unsigned char list, bf16_list; } mp__ops[MP__OP_COUNT] = {
    {"MatMul", MP__ALLOW, MP__ALLOW}, {"Conv2D", MP__ALLOW, MP__ALLOW},
    {"BiasAdd", MP__INFER, MP__INFER}, {"Sigmoid", MP__INFER, MP__INFER}, {"Tanh", MP__INFER, MP__INFER},
    {"Softmax", MP__INFER, MP__INFER},
    {"Gelu", MP__INFER, MP__INFER}, /* Keras's gelus are Erf (or Tanh, Pow), Mul and Add: all on the infer list */
    {"Log", MP__INFER, MP__INFER}, {"Log1p", MP__INFER, MP__INFER},
    {"Relu", MP__CLEAR, MP__CLEAR}, {"MaxPool", MP__CLEAR, MP__CLEAR}, {"Reshape", MP__CLEAR, MP__CLEAR},
    {"Dropout", MP__CLEAR, MP__CLEAR}, /* TensorFlow's dropout is a Mul (infer) by a mask; clear here */
    {"Identity", MP__CLEAR, MP__CLEAR},
    {"Exp", MP__DENY, MP__DENY}, {"Sum", MP__DENY, MP__INFER}, {"Mean", MP__DENY, MP__INFER},
    {"SparseSoftmaxCrossEntropyWithLogits", MP__DENY, MP__DENY},
    {"SoftmaxCrossEntropyWithLogits", MP__DENY, MP__DENY},
    {"SquaredDifference", 0, MP__INFER}, /* on none of the float16 lists: never converted there */
    {"FusedBatchNormV3", MP__INFER, MP__INFER}, /* its statistics, scale and offset stay float32 */
    {"AddV2", MP__INFER, MP__INFER}, {"Sub", MP__INFER, MP__INFER}, {"Mul", MP__INFER, MP__INFER},
    {"RealDiv", MP__INFER, MP__INFER}, {"Rsqrt", 0, MP__INFER}, {"AvgPool", MP__INFER, MP__INFER},
    {"ConcatV2", MP__CLEAR, MP__CLEAR},
    {"GatherV2", MP__CLEAR, MP__CLEAR}, /* Embedding's lookup (PositionEmbedding's slice: Identity here) */
    {"BatchMatMulV2", MP__ALLOW, MP__ALLOW}, /* MultiHeadAttention's products */
};

typedef struct mp__amp_op {
    mp__op op;
    int layer;                      /* index, or -1 for the loss's ops */
    int in[MP_MAX_LAYER_INPUTS], n_in; /* the ops it reads; MP__FROM_INPUT: the model's input */
    unsigned char list;             /* its list after the edits and the level: one bit or none */
    unsigned char deny, allow;      /* the painting; allow = converted */
    unsigned char mark, reach;      /* a pass's sets (TensorFlow's upstream/downstream sets) */
} mp__amp_op;

struct mp__amp {
    mp_dtype dtype; /* float16 or bfloat16 */
    int verbose, any_allow;
    unsigned char input_cast; /* an allow op reads the input batch: it is cast */
    int n_ops, converted, casts;
    mp__amp_op *ops; /* right after the struct, in the same block */
};

static void mp__amp_putf(mp__text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mp__putv(t, fmt, ap);
    va_end(ap);
}

static int mp__amp_list_index(unsigned bits) { /* the lowest list in bits; 4 for none */
    int i = 0;
    while (i < 4 && !(bits & (1u << i))) i++;
    return i;
}

/* The level and dtype, the environment's over the code's. */
static mp_status mp__amp_settings(mp_model *m, mp_amp_desc *d) {
    static const char *const levels[3] = {"DEFAULT", "TENSOR_CORES_ONLY", "UNSAFE_FORCE_ALL"};
    const char *level = getenv("MIXPREC_AMP_LEVEL"), *dtype = getenv("MIXPREC_AMP_DTYPE");
    int i = 0;
    if (level && *level) {
        while (i < 3 && strcmp(level, levels[i]) != 0) i++;
        if (i == 3)
            return mp__fail(m, MP_ERR_ARG, "MIXPREC_AMP_LEVEL=%s: the levels are DEFAULT, TENSOR_CORES_ONLY and "
                            "UNSAFE_FORCE_ALL", level);
        d->level = (mp_amp_level)i;
    }
    if (dtype && *dtype && (mp_dtype_from_name(dtype, &d->dtype) != MP_OK || d->dtype == MP_FLOAT32))
        return mp__fail(m, MP_ERR_ARG, "MIXPREC_AMP_DTYPE=%s: automatic mixed precision converts to float16 or bfloat16",
                        dtype);
    if (d->dtype == MP_FLOAT32) d->dtype = MP_FLOAT16;
    if ((unsigned)d->level > (unsigned)MP_AMP_UNSAFE_FORCE_ALL || (d->dtype != MP_FLOAT16 && d->dtype != MP_BFLOAT16))
        return mp__fail(m, MP_ERR_ARG, "amp.level (%d) or amp.dtype (%d) out of range: float16 or bfloat16",
                        (int)d->level, (int)d->dtype);
    if (d->level == MP_AMP_UNSAFE_FORCE_ALL && d->dtype == MP_BFLOAT16) /* TensorFlow's words */
        return mp__fail(m, MP_ERR_ARG, "the level cannot be set to UNSAFE_FORCE_ALL when oneDNN is used (bfloat16: "
                        "many ops have no bfloat16 kernel on the CPU)");
    return MP_OK;
}

/* Adds list bit `bit` to (or removes it from) each op named in the
   comma-separated `names`; `from` says where they came from. */
static mp_status mp__amp_edit(mp_model *m, unsigned char *lists, const char *names, unsigned bit, int add,
                              const char *from) {
    while (names && *names) {
        const char *end = strchr(names, ','), *s = names;
        int op = 0;
        if (!end) end = names + strlen(names);
        names = *end ? end + 1 : end;
        while (s < end && *s == ' ') s++;
        while (end > s && end[-1] == ' ') end--;
        if (s == end) continue;
        while (op < MP__OP_COUNT && !(strlen(mp__ops[op].name) == (size_t)(end - s) &&
                                      memcmp(mp__ops[op].name, s, (size_t)(end - s)) == 0))
            op++;
        if (op == MP__OP_COUNT) {
            char name[40];
            size_t n = mp__min((size_t)(end - s), sizeof name - 1);
            memcpy(name, s, n);
            name[n] = '\0';
            return mp__fail(m, MP_ERR_UNKNOWN_NAME, "%s: '%s' is none of the ops automatic mixed precision knows "
                            "(see mp_amp_desc in mixprec.h)", from, name);
        }
        lists[op] = (unsigned char)(add ? lists[op] | bit : lists[op] & ~bit);
    }
    return MP_OK;
}

/* TensorFlow's lists, edited by the code's fields and then the
   environment's variables (each list: add, then remove), emptied but for
   allow at TENSOR_CORES_ONLY; an op left on two lists is an error. */
static mp_status mp__amp_resolve_lists(mp_model *m, const mp_amp_desc *d, unsigned char *lists) {
    static const char *const env[4][2] = {
        {"MIXPREC_AMP_ALLOWLIST_ADD", "MIXPREC_AMP_ALLOWLIST_REMOVE"},
        {"MIXPREC_AMP_DENYLIST_ADD", "MIXPREC_AMP_DENYLIST_REMOVE"},
        {"MIXPREC_AMP_INFERLIST_ADD", "MIXPREC_AMP_INFERLIST_REMOVE"},
        {"MIXPREC_AMP_CLEARLIST_ADD", "MIXPREC_AMP_CLEARLIST_REMOVE"}};
    static const char *const fields[4][2] = {{"amp.allow_add", "amp.allow_remove"},
                                             {"amp.deny_add", "amp.deny_remove"},
                                             {"amp.infer_add", "amp.infer_remove"},
                                             {"amp.clear_add", "amp.clear_remove"}};
    const char *const code[4][2] = {{d->allow_add, d->allow_remove},
                                    {d->deny_add, d->deny_remove},
                                    {d->infer_add, d->infer_remove},
                                    {d->clear_add, d->clear_remove}};
    int op, from_env, i, rm;
    mp_status st;
    for (op = 0; op < MP__OP_COUNT; op++)
        lists[op] = d->dtype == MP_BFLOAT16 ? mp__ops[op].bf16_list : mp__ops[op].list;
    for (from_env = 0; from_env < 2; from_env++)
        for (i = 0; i < 4; i++)
            for (rm = 0; rm < 2; rm++) {
                const char *names = from_env ? getenv(env[i][rm]) : code[i][rm];
                st = mp__amp_edit(m, lists, names, 1u << i, !rm, from_env ? env[i][rm] : fields[i][rm]);
                if (st != MP_OK) return st;
            }
    for (op = 0; op < MP__OP_COUNT; op++) {
        /* only the float16 lists know the level (IsPseudoFastMath) */
        int allow_only = d->level == MP_AMP_TENSOR_CORES_ONLY && d->dtype == MP_FLOAT16;
        unsigned bits = allow_only ? lists[op] & MP__ALLOW : lists[op];
        lists[op] = (unsigned char)bits;
        if (bits & (bits - 1)) /* TensorFlow: "Op present in multiple lists" */
            return mp__fail(m, MP_ERR_ARG, "op %s is on both the %s and %s lists", mp__ops[op].name,
                            mp__amp_lists[mp__amp_list_index(bits)], mp__amp_lists[mp__amp_list_index(bits & (bits - 1))]);
    }
    return MP_OK;
}

/* Appends op `op` of layer `layer` reading ops in[0..n) (MP__FROM_INPUT:
   the model's input); -1 for `prev` in in[] means the op pushed last. */
static void mp__amp_push(struct mp__amp *a, mp__op op, int layer, const int *in, int n) {
    mp__amp_op *o = &a->ops[a->n_ops];
    int k;
    if (op == MP__OP_COUNT) return;
    memset(o, 0, sizeof *o);
    o->op = op;
    o->layer = layer;
    for (k = 0; k < n; k++) o->in[k] = in[k];
    o->n_in = n;
    a->n_ops++;
}

/* Pushes op `op` reading the op pushed last and, when x is not NULL,
   also *x (a layer's input). */
static void mp__amp_then(struct mp__amp *a, mp__op op, int layer, const int *x) {
    int in[2];
    in[0] = a->n_ops - 1;
    if (x) in[1] = *x;
    mp__amp_push(a, op, layer, in, x ? 2 : 1);
}

/* Layer li's ops, as Keras writes its call in TensorFlow; x[k] is the op
   that writes its input k. The merges combine their inputs in turn (one op
   per input after the first: Keras's `output += inputs[i]`), Average then
   divides; LayerNormalization is tf.nn.moments and the normalisation (Mean,
   SquaredDifference against the input, Mean; Rsqrt, the input times it,
   AddV2 of the offset); the other kinds are one op, then their BiasAdd and
   activation. */
static void mp__amp_layer_ops(const mp_model *m, struct mp__amp *a, int li, const int *x) {
    static const mp__op first[MP_LAYER_KIND_COUNT] = {
        MP__OP_COUNT, MP__OP_MATMUL, MP__OP_IDENTITY, MP__OP_CONV2D, MP__OP_MAX_POOL, MP__OP_RESHAPE,
        MP__OP_DROPOUT, MP__OP_FUSED_BATCH_NORM, MP__OP_MEAN, MP__OP_ADD, MP__OP_SUB, MP__OP_MUL, MP__OP_ADD,
        MP__OP_CONCAT, MP__OP_AVG_POOL, MP__OP_MEAN, MP__OP_RESHAPE, MP__OP_GATHER, MP__OP_IDENTITY,
        MP__OP_BATCH_MATMUL};
    static const mp__op acts[MP_ACTIVATION_COUNT] = {MP__OP_COUNT, MP__OP_RELU, MP__OP_SIGMOID,
                                                     MP__OP_SOFTMAX, MP__OP_TANH, MP__OP_GELU, MP__OP_GELU};
    const mp__layer *l = &m->layers[li];
    mp_layer_kind k = l->desc.kind;
    mp__op act = k == MP_DENSE || k == MP_CONV2D || k == MP_ACTIVATION ? acts[l->desc.activation] : MP__OP_COUNT;
    int i, merge = mp__kinds[k].min_inputs > 1 && k != MP_CONCATENATE;
    if (k == MP_ACTIVATION && act != MP__OP_COUNT) {
        mp__amp_push(a, act, li, x, 1);
        return;
    }
    mp__amp_push(a, first[k], li, x, merge ? 2 : l->n_in);
    for (i = 2; merge && i < l->n_in; i++) mp__amp_then(a, first[k], li, &x[i]);
    if (k == MP_AVERAGE) mp__amp_then(a, MP__OP_REAL_DIV, li, NULL);
    if (k == MP_MULTI_HEAD_ATTENTION) { /* the projections, softmax, p v, the output projection */
        mp__amp_then(a, MP__OP_SOFTMAX, li, NULL);
        mp__amp_then(a, MP__OP_BATCH_MATMUL, li, NULL);
    }
    if (k == MP_LAYER_NORMALIZATION) {
        mp__amp_then(a, MP__OP_SQUARED_DIFFERENCE, li, x);
        mp__amp_then(a, MP__OP_MEAN, li, NULL);
        mp__amp_then(a, MP__OP_RSQRT, li, NULL);
        mp__amp_then(a, MP__OP_MUL, li, x);
        mp__amp_then(a, MP__OP_ADD, li, NULL);
    }
    if (l->n_bias && (k == MP_DENSE || k == MP_CONV2D)) mp__amp_then(a, MP__OP_BIAS_ADD, li, NULL);
    if (act != MP__OP_COUNT) mp__amp_then(a, act, li, NULL);
}

/* The most ops a layer has (a merge of MP_MAX_LAYER_INPUTS inputs, or
   LayerNormalization's six), and the loss's. */
enum { MP__AMP_LAYER_OPS = MP_MAX_LAYER_INPUTS > 6 ? MP_MAX_LAYER_INPUTS : 6, MP__AMP_LOSS_OPS = 4 };

/* The model's forward ops in the layers' order, then the loss's, each
   reading the one before it (the first reads the model's output). */
static void mp__amp_graph(const mp_model *m, const mp_compile_desc *c, struct mp__amp *a, int *last) {
    /* [loss][from_logits]: the ops before the Mean over the batch */
    static const mp__op loss_ops[MP_LOSS_COUNT][2][3] = {
        {{MP__OP_COUNT, MP__OP_COUNT, MP__OP_COUNT}, {MP__OP_COUNT, MP__OP_COUNT, MP__OP_COUNT}},
        {{MP__OP_LOG, MP__OP_SUM, MP__OP_COUNT}, {MP__OP_SPARSE_XENT, MP__OP_COUNT, MP__OP_COUNT}},
        {{MP__OP_LOG, MP__OP_SUM, MP__OP_COUNT}, {MP__OP_XENT, MP__OP_COUNT, MP__OP_COUNT}},
        {{MP__OP_LOG, MP__OP_MEAN, MP__OP_COUNT}, {MP__OP_EXP, MP__OP_LOG1P, MP__OP_MEAN}},
        {{MP__OP_SQUARED_DIFFERENCE, MP__OP_MEAN, MP__OP_COUNT}, {MP__OP_SQUARED_DIFFERENCE, MP__OP_MEAN, MP__OP_COUNT}}};
    /* the loss from logits as compiled, or as Keras reads a softmax output */
    int i, k, logits = c->from_logits || (m->n_layers && mp__logits_loss(c, mp__last(m)));
    for (i = 0; i < m->n_layers; i++) {
        const mp__layer *l = &m->layers[i];
        int x[MP_MAX_LAYER_INPUTS];
        for (k = 0; k < l->n_in; k++) x[k] = l->in[k] == MP__FROM_INPUT ? MP__FROM_INPUT : last[l->in[k]];
        mp__amp_layer_ops(m, a, i, x);
        last[i] = a->n_ops - 1;
    }
    for (i = 0; i < 3; i++) mp__amp_then(a, loss_ops[c->loss][logits][i], -1, NULL);
    mp__amp_then(a, MP__OP_MEAN, -1, NULL);
}

static int mp__amp_clear(const mp__amp_op *o) { return o->list == MP__CLEAR && !o->deny; }

/* Whether any op op[i] reads has flag `set` (at `field`'s offset). */
static int mp__amp_any_in(const mp__amp_op *o, int i, size_t field) {
    int k;
    for (k = 0; k < o[i].n_in; k++)
        if (o[i].in[k] >= 0 && ((const unsigned char *)&o[o[i].in[k]])[field]) return 1;
    return 0;
}

/* Sets `field` on the ops that op j reads where `to` allows it, for every
   op j (backward, so that a flag set on j's inputs spreads further up). */
static void mp__amp_spread_up(mp__amp_op *o, int n, size_t field, int (*to)(const mp__amp_op *)) {
    int j, k;
    for (j = n - 1; j >= 0; j--)
        for (k = 0; ((unsigned char *)&o[j])[field] && k < o[j].n_in; k++) {
            mp__amp_op *p = o[j].in[k] >= 0 ? &o[o[j].in[k]] : NULL;
            if (p && to(p)) ((unsigned char *)p)[field] = 1;
        }
}
static int mp__amp_is_clear_list(const mp__amp_op *o) { return o->list == MP__CLEAR; }
static int mp__amp_marked(const mp__amp_op *o) { return o->mark; }

/* TensorFlow's passes (auto_mixed_precision.cc, Optimize) on the graph:
   a pass that follows inputs is a backward scan, one that follows outputs
   a forward scan; each reads every edge of an op (fan-in and fan-out). */
static void mp__amp_paint(struct mp__amp *a, mp_amp_level level) {
    mp__amp_op *o = a->ops;
    int n = a->n_ops, i, k, more = 1;
    for (i = 0; i < n; i++) { /* 1) allow ops (every op, when forced) */
        o[i].allow = (unsigned char)(level == MP_AMP_UNSAFE_FORCE_ALL || o[i].list == MP__ALLOW);
        a->any_allow |= o[i].allow;
    }
    if (level == MP_AMP_UNSAFE_FORCE_ALL) return;
    /* 2) mark infer and deny ops and the clear ops upstream of them
       through clear ops; deny spreads forward from deny ops through
       marked ops */
    for (i = 0; i < n; i++) o[i].mark = (unsigned char)((o[i].list & (MP__DENY | MP__INFER)) != 0);
    mp__amp_spread_up(o, n, offsetof(mp__amp_op, mark), mp__amp_is_clear_list);
    for (i = 0; i < n; i++)
        o[i].deny = (unsigned char)(o[i].list == MP__DENY ||
                                    (o[i].mark && mp__amp_any_in(o, i, offsetof(mp__amp_op, deny))));
    /* 3) mark allow ops and the infer and clear ops downstream of them (not
       deny); marked ops upstream of an allow op through marked ops become
       allow */
    for (i = 0; i < n; i++)
        o[i].mark = (unsigned char)(o[i].list == MP__ALLOW ||
                                    (!o[i].deny && (o[i].list & (MP__INFER | MP__CLEAR)) &&
                                     mp__amp_any_in(o, i, offsetof(mp__amp_op, mark))));
    for (i = 0; i < n; i++) o[i].reach = (unsigned char)(o[i].list == MP__ALLOW);
    mp__amp_spread_up(o, n, offsetof(mp__amp_op, reach), mp__amp_marked);
    for (i = 0; i < n; i++) o[i].allow |= o[i].reach;
    /* 4) an infer op that reads an allow op (and no deny op) becomes allow,
       in graph order, so it chains: the last Dense's BiasAdd after its
       MatMul, then a Softmax after that */
    for (i = 0; i < n; i++) {
        int deny_in = mp__amp_any_in(o, i, offsetof(mp__amp_op, deny));
        if (o[i].list == MP__INFER && !o[i].deny && !deny_in && mp__amp_any_in(o, i, offsetof(mp__amp_op, allow)))
            o[i].allow = 1;
    }
    /* 5) allow spreads along edges, both ways, through clear ops that are
       not deny (TensorFlow's depth-first search: its connected parts) */
    for (i = 0; i < n; i++) o[i].mark = (unsigned char)(mp__amp_clear(&o[i]) && !o[i].allow);
    while (more)
        for (more = 0, i = 0; i < n; i++)
            for (k = 0; k < o[i].n_in; k++) {
                mp__amp_op *p = o[i].in[k] >= 0 ? &o[o[i].in[k]] : NULL;
                if (!p || p->allow == o[i].allow) continue;
                if (p->allow && o[i].mark) more = o[i].allow = 1;
                else if (o[i].allow && p->mark) more = p->allow = 1;
            }
}

/* The pass when the code or the environment turns it on (else *out is
   NULL): settings, lists, the chain, the painting and TensorFlow's counts. */
static mp_status mp__amp_pass(mp_model *m, const mp_compile_desc *c, struct mp__amp **out) {
    const char *on = getenv("MIXPREC_AUTO_MIXED_PRECISION");
    mp_amp_desc d = c->amp;
    unsigned char lists[MP__OP_COUNT];
    struct mp__amp *a;
    mp_status st;
    int i, k, *last;
    *out = NULL;
    if (!c->amp.enabled && !(on && strcmp(on, "1") == 0)) return MP_OK; /* off: no pass */
    if ((st = mp__amp_settings(m, &d)) != MP_OK) return st;
    for (i = 0; i < m->n_layers; i++) {
        const mp__layer *l = &m->layers[i];
        if (l->policy.compute_dtype != MP_FLOAT32 || l->policy.variable_dtype != MP_FLOAT32)
            return mp__fail(m, MP_ERR_ARG, "automatic mixed precision rewrites a float32 model, and layer %s has "
                            "policy %s (TensorFlow refuses the rewrite under a mixed policy too)", l->name,
                            mp_policy_name(l->policy));
    }
    if ((st = mp__amp_resolve_lists(m, &d, lists)) != MP_OK) return st;
    /* the ops fit: the layers' array, far larger per layer, was allocated */
    a = (struct mp__amp *)mp__alloc(sizeof *a + (MP__AMP_LAYER_OPS * (size_t)m->n_layers + MP__AMP_LOSS_OPS) *
                                                    sizeof(mp__amp_op));
    last = (int *)mp__alloc(((size_t)m->n_layers + 1) * sizeof(int));
    if (!a || !last) {
        mp__free(a);
        mp__free(last);
        return mp__fail(m, MP_ERR_ALLOC, "the automatic mixed precision pass");
    }
    a->ops = (mp__amp_op *)(void *)(a + 1);
    a->dtype = d.dtype;
    a->verbose = d.verbose;
    mp__amp_graph(m, c, a, last);
    mp__free(last);
    for (i = 0; i < a->n_ops; i++) a->ops[i].list = lists[a->ops[i].op];
    mp__amp_paint(a, d.level);
    /* TensorFlow's casts: one at each output of a float32 op (or of the
       input batch) that an allow op reads, however many allow ops read it;
       `mark` flags the outputs that have one */
    for (i = 0; i < a->n_ops; i++) a->ops[i].mark = 0;
    for (i = 0; i < a->n_ops; i++) {
        mp__amp_op *o = &a->ops[i];
        a->converted += o->allow;
        for (k = 0; o->allow && k < o->n_in; k++) {
            unsigned char *cast = o->in[k] < 0 ? &a->input_cast : &a->ops[o->in[k]].mark;
            if (o->in[k] >= 0 && a->ops[o->in[k]].allow) continue;
            a->casts += !*cast;
            *cast = 1;
        }
    }
    *out = a;
    return MP_OK;
}

/* A layer computes in its first op's dtype and outputs in its last op's;
   without the pass, both are its policy's compute dtype. */
static void mp__amp_layer_dtypes(const mp_model *m, const struct mp__amp *a, int li, mp_dtype *dt, mp_dtype *yt) {
    int i, seen = 0;
    *dt = *yt = m->layers[li].policy.compute_dtype;
    for (i = 0; a && i < a->n_ops; i++)
        if (a->ops[i].layer == li) {
            mp_dtype t = a->ops[i].allow ? a->dtype : MP_FLOAT32;
            if (!seen++) *dt = t;
            *yt = t;
        }
}

static void mp__amp_retype(mp_model *m, const struct mp__amp *a) {
    int i;
    for (i = 0; i < m->n_layers; i++) {
        mp__layer *l = &m->layers[i];
        mp__amp_layer_dtypes(m, a, i, &l->dt, &l->yt);
        l->wt = mp__weight_dtype(l->desc.kind, l->dt);
    }
}

static void mp__amp_summary(const struct mp__amp *a, mp__text *t) {
    const char *type = mp_dtype_name(a->dtype);
    if (!a->any_allow) mp__put(t, "No allowlist ops found, nothing to do");
    else mp__amp_putf(t, "Converted %d/%d nodes to %s precision using %d cast(s) to %s (excluding Const and Variable "
                      "casts)", a->converted, a->n_ops, type, a->casts, type);
}

/* Row i of the colouring table; -1: the header. */
static void mp__amp_row(const mp_model *m, int i, mp__text *t) {
    const mp__amp_op *o = &m->amp->ops[i < 0 ? 0 : i];
    size_t line = t->len;
    int list = mp__amp_list_index(o->list);
    mp__put(t, " ");
    mp__put(t, i < 0 ? "Op" : mp__ops[o->op].name);
    mp__put(t, " ");
    mp__pad_to(t, line + 38);
    mp__put(t, i < 0 ? "Layer" : o->layer < 0 ? "(loss)" : m->layers[o->layer].name);
    mp__put(t, " ");
    mp__pad_to(t, line + 60);
    mp__put(t, i < 0 ? "List" : list < 4 ? mp__amp_lists[list] : "-");
    mp__pad_to(t, line + 68);
    mp__put(t, i < 0 ? "Dtype" : mp_dtype_name(o->allow ? m->amp->dtype : MP_FLOAT32));
    mp__put(t, "\n");
}

static mp_status mp__amp_text(const mp_model *m, char *buf, size_t size, int table) {
    mp__text t;
    int i;
    if (!m || !buf) return MP_ERR_NULL;
    if (size == 0) return MP_ERR_SIZE;
    if (!m->amp) return MP_ERR_STATE;
    t.buf = buf;
    t.cap = size;
    t.len = 0;
    if (!table) mp__amp_summary(m->amp, &t);
    for (i = -1; table && i < m->amp->n_ops; i++) mp__amp_row(m, i, &t);
    return t.len < size ? MP_OK : MP_ERR_SIZE;
}

MIXPREC_API mp_status mp_model_amp_report(const mp_model *m, char *buf, size_t size) {
    return mp__amp_text(m, buf, size, 0);
}

MIXPREC_API mp_status mp_model_amp_table(const mp_model *m, char *buf, size_t size) {
    return mp__amp_text(m, buf, size, 1);
}

/* What compile prints (as TensorFlow logs it): the summary line, and the
   colouring when verbose. */
static void mp__amp_print(const mp_model *m) {
#ifndef MIXPREC_NO_STDIO
    char buf[160];
    mp__text t;
    int i;
    if (!m->amp || m->rank) return; /* rank 0 prints (>>communicator) */
    t.buf = buf;
    t.cap = sizeof buf;
    t.len = 0;
    mp__amp_summary(m->amp, &t);
    puts(buf);
    for (i = -1; m->amp->verbose && i < m->amp->n_ops; i++) {
        t.len = 0;
        mp__amp_row(m, i, &t);
        fputs(buf, stdout);
    }
#else
    (void)m;
#endif
}

/* The summary's Policy column for a layer the pass typed. */
static void mp__amp_put_dtypes(mp__text *t, const mp__layer *l) {
    mp__put(t, "amp_");
    mp__put(t, mp_dtype_name(l->dt));
    if (l->yt != l->dt) {
        mp__put(t, "->");
        mp__put(t, mp_dtype_name(l->yt));
    }
}

/* >>communicator (see the declaration): the model's side of data-parallel
   training. Without a communicator (ranks == 1) nothing here runs a
   collective, and every figure is the one process's as before. */
static mp_status mp__sync(mp_model *m);

/* The communicator's table checked, and where this process stands in it. */
static mp_status mp__comm_join(mp_model *m) {
    const mp_communicator *c = m->desc.comm;
    m->rank = 0;
    m->ranks = 1;
    if (!c) return MP_OK;
    if (!c->rank || !c->size || !c->all_reduce_sum || !c->broadcast || !c->barrier || !c->last_error)
        return MP_ERR_NULL;
    m->rank = c->rank(c->ctx);
    m->ranks = c->size(c->ctx);
    if (m->ranks < 1 || m->rank < 0 || m->rank >= m->ranks) return MP_ERR_ARG;
    if ((unsigned)m->desc.allreduce_dtype >= (unsigned)MP_DTYPE_COUNT ||
        (m->desc.allreduce_dtype != MP_FLOAT32 && !c->all_reduce_sum16))
        return MP_ERR_ARG;
    return c->device_memory == m->be->device_memory ? MP_OK : MP_ERR_ARG; /* it reads the backend's memory */
}

/* Rank r's part of n things split over the ranks: [start(r), start(r + 1)),
   floor(n r / ranks) without the product's overflow. */
static size_t mp__slice_start(size_t n, int rank, int ranks) {
    return n / (size_t)ranks * (size_t)rank + n % (size_t)ranks * (size_t)rank / (size_t)ranks;
}

static mp_status mp__comm_failed(mp_model *m, const char *what) {
    const mp_communicator *c = m->desc.comm;
    return mp__fail(m, MP_ERR_COMM, "%s: the %s communicator failed on rank %d of %d: %s", what,
                    c->name ? c->name : "", m->rank, m->ranks, c->last_error(c->ctx));
}

/* A host communicator reads memory the backend has finished writing. */
static mp_status mp__comm_ready(mp_model *m) { return m->desc.comm->device_memory ? MP_OK : mp__sync(m); }

/* buf[0, n) (the backend's memory, in dtype) summed over the ranks. */
static mp_status mp__comm_sum(mp_model *m, void *buf, mp_dtype dtype, size_t n, const char *what) {
    const mp_communicator *c = m->desc.comm;
    mp_status st;
    if ((st = mp__comm_ready(m)) != MP_OK) return st;
    st = dtype == MP_FLOAT32 ? c->all_reduce_sum(c->ctx, (float *)buf, n) : c->all_reduce_sum16(c->ctx, buf, dtype, n);
    return st == MP_OK ? MP_OK : mp__comm_failed(m, what);
}

/* Host values summed over the ranks (floats), or rank 0's bytes on every
   rank. A host communicator reads them where they are; a device one
   through the step state's few bytes, or through a buffer of their own
   where they are more or there is no step state yet (a load may come
   before build). */
static mp_status mp__comm_host(mp_model *m, void *v, size_t bytes, int sum, const char *what) {
    const mp_communicator *c = m->desc.comm;
    int staged = c->device_memory, own = staged && (!m->state || bytes > sizeof m->state->collective);
    void *buf = !staged ? v : own ? m->be->alloc(m->ctx, bytes) : m->state->collective;
    mp_status st;
    if (!buf) return mp__fail(m, MP_ERR_ALLOC, "%s: %z bytes of the backend's memory", what, bytes);
    if (staged) m->be->copy(m->ctx, buf, v, bytes, MP_COPY_TO_BACKEND);
    if (sum) st = mp__comm_sum(m, buf, MP_FLOAT32, bytes / sizeof(float), what);
    else if ((st = mp__comm_ready(m)) == MP_OK && c->broadcast(c->ctx, buf, bytes, 0) != MP_OK)
        st = mp__comm_failed(m, what);
    if (st == MP_OK && staged) m->be->copy(m->ctx, v, buf, bytes, MP_COPY_TO_HOST);
    if (st == MP_OK) st = mp__sync(m);
    if (own) m->be->free(m->ctx, buf);
    return st;
}

/* Rank 0's initial weights on every rank, whatever each rank's seed. */
static mp_status mp__comm_share_weights(mp_model *m) {
    const mp_communicator *c = m->desc.comm;
    mp_status st;
    if (m->ranks == 1) return MP_OK;
    if ((st = mp__comm_ready(m)) != MP_OK) return st;
    if (c->broadcast(c->ctx, m->w, (m->n_params + m->n_state) * sizeof(float), 0) != MP_OK)
        return mp__comm_failed(m, "broadcasting rank 0's initial weights");
    m->casts_fresh = 0; /* the next forward casts the new weights */
    return MP_OK;
}

/* >>model */
static mp_status mp__resolve_policy(mp_model *m, const mp_layer_desc *d, mp_policy *out) {
    if (d->policy) {
        if (!mp_policy_name(*d->policy)) return mp__fail(m, MP_ERR_INVALID_POLICY, "layer policy override");
        *out = *d->policy;
    } else if (d->dtype) {
        if (mp_policy_from_name(d->dtype, out) != MP_OK)
            return mp__fail(m, MP_ERR_UNKNOWN_POLICY, "Cannot convert '%s' to a mixed precision Policy", d->dtype);
    } else {
        *out = mp_global_policy();
    }
    return MP_OK;
}

static void mp__name_layer(mp_model *m, mp__layer *l) {
    mp__text t;
    int k = m->kind_count[l->desc.kind]++;
    t.buf = l->name;
    t.cap = sizeof l->name;
    t.len = 0;
    if (l->desc.name) { mp__put(&t, l->desc.name); return; }
    mp__put(&t, mp__kinds[l->desc.kind].base_name);
    if (k) { mp__put(&t, "_"); mp__put_int(&t, k); }
}

static mp_status mp__size_of(mp_model *m, const mp__layer *l, const int *shape, int rank, size_t *out) {
    size_t n = 1;
    int i;
    for (i = 0; i < rank; i++)
        if (!mp__mul_ok(n, (size_t)shape[i], &n) || n > SIZE_MAX / sizeof(float))
            return mp__fail(m, MP_ERR_SIZE, "layer %s: an output of more than SIZE_MAX bytes a sample", l->name);
    *out = n;
    return MP_OK;
}

/* One axis of a window: the output size and the padding before it; 0 when
   the padded extent, (out - 1) stride + kernel, and so some index the
   kernels compute, would not fit an int. In 64 bits: no step overflows. */
static int mp__window_axis(int in, int k, int stride, int same, int *out, int *pad) {
    long long o = same ? ((long long)in + stride - 1) / stride : (long long)(in - k) / stride + 1;
    long long extent = (o - 1) * stride + k;
    if (extent > INT_MAX) return 0;
    *out = (int)o;
    *pad = same && extent > in ? (int)((extent - in) / 2) : 0;
    return 1;
}

/* Conv2D and MaxPooling2D output sizes; 'same' pads as TensorFlow does
   (total max((out - 1) stride + kernel - in, 0), the smaller half first). */
static mp_status mp__conv_shape(mp_model *m, mp__layer *l, int kh, int kw, int sh, int sw, mp_padding pad) {
    mp_conv_geom *g = &l->geom;
    if (l->in_rank != 3)
        return mp__fail(m, MP_ERR_SHAPE, "layer %s (%s) needs an image input (height, width, channels), got rank %d",
                        l->name, mp__kinds[l->desc.kind].type, l->in_rank);
    if (kh <= 0 || kw <= 0 || sh <= 0 || sw <= 0)
        return mp__fail(m, MP_ERR_ARG, "layer %s: kernel, pool and strides must be positive", l->name);
    g->h = l->in_shape[0]; g->w = l->in_shape[1]; g->c = l->in_shape[2];
    g->kh = kh; g->kw = kw; g->sh = sh; g->sw = sw;
    if (pad != MP_SAME && (g->h < kh || g->w < kw))
        return mp__fail(m, MP_ERR_SHAPE, "layer %s: window %dx%d is larger than its %dx%d input", l->name, kh, kw,
                        g->h, g->w);
    if (!mp__window_axis(g->h, kh, sh, pad == MP_SAME, &g->oh, &g->pt) ||
        !mp__window_axis(g->w, kw, sw, pad == MP_SAME, &g->ow, &g->pl))
        return mp__fail(m, MP_ERR_SHAPE, "layer %s: window %dx%d with strides %dx%d on a %dx%d input: indices past "
                        "INT_MAX", l->name, kh, kw, sh, sw, g->h, g->w);
    l->out_rank = 3;
    l->out_shape[0] = g->oh; l->out_shape[1] = g->ow;
    l->out_shape[2] = l->desc.kind == MP_CONV2D ? l->desc.filters : g->c;
    return MP_OK;
}

/* Keras 3 names a functional model's input "input_layer" */
static const char *mp__input_name(const mp_model *m, int from) {
    return from == MP__FROM_INPUT ? "input_layer" : m->layers[from].name;
}

/* The normalizations: gamma and beta per channel (the last axis), and
   BatchNormalization's moving mean and variance; Keras's defaults. */
static mp_status mp__norm_shape(mp_model *m, mp__layer *l) {
    mp_layer_desc *d = &l->desc;
    size_t c = (size_t)l->in_shape[l->in_rank - 1];
    if (d->momentum == 0.0f) d->momentum = 0.99f;
    if (d->epsilon == 0.0f) d->epsilon = 1e-3f;
    if (!(d->momentum >= 0.0f && d->momentum <= 1.0f) || !(d->epsilon > 0.0f && d->epsilon <= FLT_MAX))
        return mp__fail(m, MP_ERR_ARG, "layer %s (%s): momentum must be in [0, 1] and epsilon finite and positive", l->name,
                        mp__kinds[d->kind].type);
    l->n_kernel = l->n_bias = c;
    l->n_state = d->kind == MP_BATCH_NORMALIZATION ? 2 * c : 0;
    return MP_OK;
}

/* The merges: every input of the first's shape (Add, Subtract, Multiply,
   Average), or of its rank and the same sizes but along the axis
   (Concatenate, whose output sums them there). */
static mp_status mp__merge_shape(mp_model *m, mp__layer *l) {
    const char *type = mp__kinds[l->desc.kind].type;
    int k, a, axis = l->desc.axis ? l->desc.axis : -1;
    if (l->desc.kind == MP_CONCATENATE) {
        if (axis < 0) axis += l->in_rank + 1; /* -1: the last of a sample's axes */
        if (axis < 1 || axis > l->in_rank)
            return mp__fail(m, MP_ERR_ARG, "layer %s (Concatenate): axis %d out of range for inputs of rank %d (the "
                            "batch axis is 0)", l->name, l->desc.axis, l->in_rank);
        l->desc.axis = axis;
        l->out_shape[axis - 1] = 0;
    }
    for (k = 0; k < l->n_in; k++) {
        const int *shape = l->in[k] == MP__FROM_INPUT ? m->in_shape : m->layers[l->in[k]].out_shape;
        int rank = l->in[k] == MP__FROM_INPUT ? m->in_rank : m->layers[l->in[k]].out_rank, same = rank == l->in_rank;
        for (a = 0; same && a < rank; a++)
            same = shape[a] == l->in_shape[a] || (l->desc.kind == MP_CONCATENATE && a == axis - 1);
        if (!same) {
            char want[64], got[64];
            return mp__fail(m, MP_ERR_SHAPE, "layer %s (%s): input %d (%s) has shape %s, input 0 (%s) has %s%s",
                            l->name, type, k, mp__input_name(m, l->in[k]),
                            mp__shape_text(got, sizeof got, rank, shape, 0), mp__input_name(m, l->in[0]),
                            mp__shape_text(want, sizeof want, l->in_rank, l->in_shape, 0),
                            l->desc.kind == MP_CONCATENATE ? ": all sizes must match but along the axis" : "");
        }
        if (l->desc.kind == MP_CONCATENATE) {
            if (l->out_shape[axis - 1] > INT32_MAX - shape[axis - 1])
                return mp__fail(m, MP_ERR_SIZE, "layer %s: the concatenated axis overflows", l->name);
            l->out_shape[axis - 1] += shape[axis - 1];
        }
    }
    return MP_OK;
}

/* Reshape: target_shape's sizes, one -1 inferred; as many values. */
static mp_status mp__reshape_shape(mp_model *m, mp__layer *l) {
    const int *t = l->desc.target_shape;
    size_t known = 1;
    int r, unknown = -1;
    char want[64], got[64];
    for (r = 0; r < MP_MAX_RANK - 1 && t[r]; r++) {
        if (t[r] == -1 && unknown < 0) unknown = r;
        else if (t[r] < 0 || !mp__mul_ok(known, (size_t)t[r], &known))
            return mp__fail(m, MP_ERR_ARG, "layer %s (Reshape): target_shape sizes must be positive, with at most one "
                            "-1", l->name);
    }
    if (r == 0) return mp__fail(m, MP_ERR_ARG, "layer %s (Reshape): an empty target_shape", l->name);
    l->out_rank = r;
    memcpy(l->out_shape, t, sizeof l->out_shape);
    if (unknown >= 0 && known && l->in_size % known == 0 && l->in_size / known <= (size_t)INT32_MAX) {
        l->out_shape[unknown] = (int)(l->in_size / known);
        known = l->in_size;
    }
    if (known != l->in_size)
        return mp__fail(m, MP_ERR_SHAPE, "layer %s (Reshape): the input %s has %z values, target_shape %s has a "
                        "different count", l->name, mp__shape_text(got, sizeof got, l->in_rank, l->in_shape, 0),
                        l->in_size, mp__shape_text(want, sizeof want, r, t, 0));
    return MP_OK;
}

/* The sequence layers. Embedding: ids (time,) from the model's input to
   (time, output_dim); PositionEmbedding and MultiHeadAttention: (time,
   features) to the same shape. Their weights' count in n_kernel. */
static mp_status mp__sequence_shape(mp_model *m, mp__layer *l) {
    const mp_layer_desc *d = &l->desc;
    const char *type = mp__kinds[d->kind].type;
    char got[64];
    size_t rows = 0, c = mp__last_axis(l), hd = 0, n = 0;
    mp__shape_text(got, sizeof got, l->in_rank, l->in_shape, 0);
    if (d->kind == MP_EMBEDDING) {
        if (l->in[0] != MP__FROM_INPUT)
            return mp__fail(m, MP_ERR_ARG, "layer %s (Embedding) reads token ids: its input must be the model's input "
                            "(MP_MODEL_INPUT), not layer %s", l->name, m->layers[l->in[0]].name);
        if (d->input_dim <= 0 || d->output_dim <= 0)
            return mp__fail(m, MP_ERR_ARG, "layer %s (Embedding): input_dim and output_dim must be positive, got %d and "
                            "%d", l->name, d->input_dim, d->output_dim);
        if (l->in_rank > MP_MAX_RANK - 2)
            return mp__fail(m, MP_ERR_SHAPE, "layer %s (Embedding): ids of shape %s give a sample of rank %d; at most "
                            "%d", l->name, got, l->in_rank + 1, MP_MAX_RANK - 1);
        l->out_rank = l->in_rank + 1;
        l->out_shape[l->in_rank] = d->output_dim;
        rows = (size_t)d->input_dim, c = (size_t)d->output_dim;
    } else if (l->in_rank != 2) {
        return mp__fail(m, MP_ERR_SHAPE, "layer %s (%s) needs a sequence input (time, features), got shape %s", l->name,
                        type, got);
    } else if (d->kind == MP_POSITION_EMBEDDING) {
        if (d->sequence_length < l->in_shape[0])
            return mp__fail(m, MP_ERR_SHAPE, "layer %s (PositionEmbedding): sequence_length %d is less than the "
                            "input's %d positions (shape %s)", l->name, d->sequence_length, l->in_shape[0], got);
        rows = (size_t)d->sequence_length;
    } else {
        if (d->num_heads <= 0 || d->key_dim <= 0)
            return mp__fail(m, MP_ERR_ARG, "layer %s (MultiHeadAttention): num_heads and key_dim must be positive, got "
                            "%d and %d", l->name, d->num_heads, d->key_dim);
        if (!mp__mul_ok((size_t)d->num_heads, (size_t)d->key_dim, &hd) || !mp__mul_ok(hd, c, &rows) ||
            rows > SIZE_MAX / 8)
            return mp__fail(m, MP_ERR_SIZE, "layer %s: too many weights", l->name);
        rows *= 4, c = 1; /* four kernels, then the biases */
        if (!d->no_bias) rows += 3 * hd + mp__last_axis(l);
    }
    if (!mp__mul_ok(rows, c, &n) || n > SIZE_MAX / sizeof(float))
        return mp__fail(m, MP_ERR_SIZE, "layer %s: too many weights", l->name);
    l->n_kernel = n;
    return MP_OK;
}

static mp_status mp__infer_shape(mp_model *m, mp__layer *l) {
    const mp_layer_desc *d = &l->desc;
    mp_status st = MP_OK;
    size_t fan;
    l->out_rank = l->in_rank;
    memcpy(l->out_shape, l->in_shape, sizeof l->out_shape);
    if ((unsigned)d->activation >= (unsigned)MP_ACTIVATION_COUNT || (unsigned)d->padding > (unsigned)MP_SAME)
        return mp__fail(m, MP_ERR_ARG, "layer %s: invalid activation or padding value", l->name);
    switch (d->kind) {
    case MP_DENSE: /* over the last axis, any rank (Keras) */
        if (d->units <= 0) return mp__fail(m, MP_ERR_ARG, "layer %s: units must be positive, got %d", l->name, d->units);
        l->out_shape[l->in_rank - 1] = d->units;
        break;
    case MP_CONV2D:
        if (d->filters <= 0) return mp__fail(m, MP_ERR_ARG, "layer %s: filters must be positive", l->name);
        st = mp__conv_shape(m, l, d->kernel_size[0], d->kernel_size[1], d->strides[0] ? d->strides[0] : 1,
                            d->strides[1] ? d->strides[1] : 1, d->padding);
        break;
    case MP_MAX_POOLING2D:
    case MP_AVERAGE_POOLING2D: {
        int ph = d->pool_size[0] ? d->pool_size[0] : 2, pw = d->pool_size[1] ? d->pool_size[1] : 2;
        st = mp__conv_shape(m, l, ph, pw, ph, pw, MP_VALID);
        break;
    }
    case MP_ACTIVATION: break;
    case MP_FLATTEN:
        l->out_rank = 1;
        l->out_shape[0] = 0;
        break;
    case MP_DROPOUT:
        if (!(d->rate >= 0.0f && d->rate < 1.0f))
            return mp__fail(m, MP_ERR_ARG, "layer %s: dropout rate must be in [0, 1)", l->name);
        break;
    case MP_BATCH_NORMALIZATION:
    case MP_LAYER_NORMALIZATION: st = mp__norm_shape(m, l); break;
    case MP_ADD:
    case MP_SUBTRACT:
    case MP_MULTIPLY:
    case MP_AVERAGE:
    case MP_CONCATENATE: st = mp__merge_shape(m, l); break;
    case MP_GLOBAL_AVERAGE_POOLING2D:
        if (l->in_rank != 3) return mp__conv_shape(m, l, 1, 1, 1, 1, MP_VALID); /* (says what it needs) */
        st = mp__conv_shape(m, l, l->in_shape[0], l->in_shape[1], l->in_shape[0], l->in_shape[1], MP_VALID);
        l->out_rank = 1; /* (C,): Keras's keepdims=False */
        l->out_shape[0] = l->in_shape[2];
        l->out_shape[1] = l->out_shape[2] = 0;
        break;
    case MP_RESHAPE: st = mp__reshape_shape(m, l); break;
    case MP_EMBEDDING:
    case MP_POSITION_EMBEDDING:
    case MP_MULTI_HEAD_ATTENTION: st = mp__sequence_shape(m, l); break;
    default: return mp__fail(m, MP_ERR_ARG, "unknown layer kind %d", (int)d->kind);
    }
    if (st) return st;
    if ((st = mp__size_of(m, l, l->out_shape, l->out_rank, &l->out_size)) != MP_OK) return st;
    if (d->kind == MP_FLATTEN) {
        if (l->in_size > (size_t)INT32_MAX) return mp__fail(m, MP_ERR_SIZE, "layer %s: too many features", l->name);
        l->out_shape[0] = (int)l->in_size;
        l->out_size = l->in_size;
    }
    if (d->kind == MP_DENSE || d->kind == MP_CONV2D) {
        fan = d->kind == MP_DENSE ? mp__last_axis(l) : (size_t)l->geom.kh * (size_t)l->geom.kw * (size_t)l->geom.c;
        l->n_bias = d->no_bias ? 0 : (size_t)(d->kind == MP_DENSE ? d->units : d->filters);
        if (!mp__mul_ok(fan, (size_t)(d->kind == MP_DENSE ? d->units : d->filters), &l->n_kernel) ||
            l->n_kernel > SIZE_MAX / sizeof(float) - l->n_bias)
            return mp__fail(m, MP_ERR_SIZE, "layer %s: too many weights", l->name);
    }
    return MP_OK;
}

MIXPREC_API mp_status mp_model_create(mp_model **out, const mp_model_desc *desc) {
    mp_model *m;
    mp_status st;
    size_t in_size = 1;
    int r = 0;
    if (!out || !desc) return MP_ERR_NULL;
    *out = NULL;
    while (r < MP_MAX_RANK - 1 && desc->input_shape[r] > 0) r++;
    if (r == 0 || desc->threads < 0) return MP_ERR_ARG; /* no input shape, a negative dimension */
    for (; r < MP_MAX_RANK - 1; r++)
        if (desc->input_shape[r] != 0) return MP_ERR_ARG;
    for (r = 0; r < MP_MAX_RANK - 1 && desc->input_shape[r] > 0; r++) /* a sample's bytes fit size_t */
        if (!mp__mul_ok(in_size, (size_t)desc->input_shape[r], &in_size) || in_size > SIZE_MAX / sizeof(float))
            return MP_ERR_SIZE;
    m = (mp_model *)mp__alloc(sizeof *m);
    if (!m) return MP_ERR_ALLOC;
    m->desc = *desc;
    if (!m->desc.seed) m->desc.seed = 1337;
    m->be = desc->backend ? desc->backend : &mp__cpu_backend;
    m->policy = mp_global_policy();
    if ((st = mp__comm_join(m)) != MP_OK || (st = m->be->create(&m->ctx, desc->threads, desc->backend_config)) != MP_OK) {
        mp__free(m);
        return st;
    }
    for (r = 0; r < MP_MAX_RANK - 1 && desc->input_shape[r] > 0; r++) m->in_shape[r] = desc->input_shape[r];
    m->in_rank = r;
    m->in_size = in_size;
    *out = m;
    return MP_OK;
}

static void mp__free_stage(mp_model *m);

MIXPREC_API void mp_model_destroy(mp_model *m) {
    if (!m) return;
    m->be->free(m->ctx, m->act_block);
    m->be->free(m->ctx, m->slots_block);
    m->be->free(m->ctx, m->params_block);
    mp__free_stage(m);
    m->be->destroy(m->ctx);
    mp__free(m->layers);
    mp__numerics_free(m->num);
    mp__free(m->amp);
    mp__free(m);
}

MIXPREC_API const char *mp_model_error(const mp_model *m) {
    if (!m) return "no model (NULL)";
    return m->error[0] ? m->error : "ok";
}

static int mp__built(const mp_model *m) { return m->params_block != NULL; }

/* The new layer's inputs from mp_model_call's ids (MP_MODEL_INPUT, or 1 +
   an earlier layer's index), checked: none may name a layer not added yet,
   so the graph has no cycle and the order added is an order to run it. */
static mp_status mp__connect(mp_model *m, mp__layer *l, const int *inputs, int n_inputs) {
    const mp__layer_kind *kind = &mp__kinds[l->desc.kind];
    int k;
    if (n_inputs == 0 && !inputs) { /* sequential: the layer added last */
        l->n_in = 1;
        l->in[0] = m->n_layers - 1; /* MP__FROM_INPUT for the first */
    } else {
        if (!inputs) return mp__fail(m, MP_ERR_NULL, "layer %s: inputs is NULL with n_inputs %d", l->name, n_inputs);
        if (n_inputs < kind->min_inputs || n_inputs > kind->max_inputs)
            return mp__fail(m, MP_ERR_ARG, "layer %s (%s) takes %d to %d inputs, got %d", l->name, kind->type,
                            kind->min_inputs, kind->max_inputs, n_inputs);
        for (k = 0; k < n_inputs; k++) {
            if (inputs[k] < 0 || inputs[k] > m->n_layers)
                return mp__fail(m, MP_ERR_ARG, "layer %s: input %d is id %d, but the model has %d layers so far (ids "
                                "1..%d; MP_MODEL_INPUT, 0, is the model's input): a layer reads only layers added "
                                "before it", l->name, k, inputs[k], m->n_layers, m->n_layers);
            l->in[k] = inputs[k] - 1;
        }
        l->n_in = n_inputs;
    }
    if (l->n_in < kind->min_inputs)
        return mp__fail(m, MP_ERR_ARG, "layer %s (%s) takes %d inputs or more: give them to mp_model_call", l->name,
                        kind->type, kind->min_inputs);
    for (k = 0; k < l->n_in; k++) {
        const mp__layer *from = l->in[k] == MP__FROM_INPUT ? NULL : &m->layers[l->in[k]];
        l->in_sizes[k] = from ? from->out_size : m->in_size;
    }
    l->in_rank = l->in[0] == MP__FROM_INPUT ? m->in_rank : m->layers[l->in[0]].out_rank;
    memcpy(l->in_shape, l->in[0] == MP__FROM_INPUT ? m->in_shape : m->layers[l->in[0]].out_shape, sizeof l->in_shape);
    l->in_size = l->in_sizes[0];
    return MP_OK;
}

/* The layer made from desc and its inputs, named, typed and shaped; the
   model unchanged (a failure leaves the kind's name counter as it was). */
static mp_status mp__make_layer(mp_model *m, const mp_layer_desc *desc, const int *inputs, int n_inputs, mp__layer *l) {
    mp_status st;
    memset(l, 0, sizeof *l);
    l->desc = *desc;
    mp__name_layer(m, l);
    l->desc.name = NULL; /* copied: the caller's string need not outlive the model */
    l->desc.dtype = NULL;
    l->desc.policy = NULL;
    l->consumer = -1;
    if ((st = mp__resolve_policy(m, desc, &l->policy)) == MP_OK) {
        l->dt = l->yt = l->policy.compute_dtype;
        l->wt = mp__weight_dtype(desc->kind, l->dt);
        if ((st = mp__connect(m, l, inputs, n_inputs)) == MP_OK) st = mp__infer_shape(m, l);
    }
    if (st == MP_OK && (m->n_params > SIZE_MAX - mp__params(l) || m->n_state > SIZE_MAX - l->n_state))
        st = mp__fail(m, MP_ERR_SIZE, "layer %s: the model's weights overflow size_t", l->name);
    if (st != MP_OK) m->kind_count[desc->kind]--;
    return st;
}

static mp_status mp__grow_layers(mp_model *m, const char *name) {
    int cap = m->cap_layers ? 2 * m->cap_layers : 8;
    mp__layer *grown;
    if (m->n_layers < m->cap_layers) return MP_OK;
    if (!(grown = (mp__layer *)mp__alloc((size_t)cap * sizeof *grown)))
        return mp__fail(m, MP_ERR_ALLOC, "adding layer %s", name);
    if (m->n_layers) memcpy(grown, m->layers, (size_t)m->n_layers * sizeof *grown);
    mp__free(m->layers);
    m->layers = grown;
    m->cap_layers = cap;
    return MP_OK;
}

MIXPREC_API mp_status mp_model_call(mp_model *m, mp_layer_desc desc, const int *inputs, int n_inputs, int *id) {
    mp__layer l;
    mp_status st;
    int k;
    if (!m) return MP_ERR_NULL;
    if (mp__built(m)) return mp__fail(m, MP_ERR_STATE, "the model is built; add every layer before build/compile");
    if ((unsigned)desc.kind >= (unsigned)MP_LAYER_KIND_COUNT || desc.kind == 0)
        return mp__fail(m, MP_ERR_ARG, "unknown layer kind %d", (int)desc.kind);
    if ((st = mp__make_layer(m, &desc, inputs, n_inputs, &l)) != MP_OK) return st;
    if ((st = mp__grow_layers(m, l.name)) != MP_OK) { m->kind_count[desc.kind]--; return st; }
    l.rng = m->desc.seed ^ ((uint64_t)0xD1B54A32D192ED03u * (uint64_t)(m->n_layers + 1));
    if (desc.kind == MP_DROPOUT && desc.seed) l.rng = desc.seed;
    for (k = 0; k < l.n_in; k++) {
        mp__layer *from = l.in[k] == MP__FROM_INPUT ? NULL : &m->layers[l.in[k]];
        if (from) from->consumer = from->consumers++ ? -1 : m->n_layers;
    }
    m->layers[m->n_layers++] = l;
    m->n_params += mp__params(&l);
    m->n_state += l.n_state;
    if (id) *id = m->n_layers;
    return MP_OK;
}

MIXPREC_API mp_status mp_model_add(mp_model *m, mp_layer_desc desc) { return mp_model_call(m, desc, NULL, 0, NULL); }

/* Whether every layer reads the layer before it (the first: the input), as
   in a Sequential model. */
static int mp__is_chain(const mp_model *m) {
    int i;
    for (i = 0; i < m->n_layers; i++)
        if (m->layers[i].n_in != 1 || m->layers[i].in[0] != i - 1) return 0;
    return 1;
}

/* The model's name: the one given, or Keras 3's default for its kind. */
static const char *mp__model_name(const mp_model *m) {
    return m->desc.name ? m->desc.name : mp__is_chain(m) ? "sequential" : "functional";
}

/* Every layer but the last (the model's output) feeds another: a branch
   that leads nowhere is a mistake Keras would make a second output of. */
static mp_status mp__check_graph(mp_model *m) {
    int i;
    if (m->n_layers == 0) return mp__fail(m, MP_ERR_STATE, "the model has no layers");
    for (i = 0; i + 1 < m->n_layers; i++)
        if (!m->layers[i].consumers)
            return mp__fail(m, MP_ERR_ARG, "layer %s (%s): its output feeds no layer; the model's one output is the "
                            "last layer added (%s), so every other layer must feed one", m->layers[i].name,
                            mp__kinds[m->layers[i].desc.kind].type, mp__last(m)->name);
    return MP_OK;
}

/* The build-time block: float32 weights and gradients, the step state,
   their copies in each layer's compute dtype as the AMP pass `amp` types
   them (NULL: the policies'). Measuring (base NULL) changes nothing. */
static void mp__plan_params(mp_model *m, mp__arena *a, const struct mp__amp *amp) {
    float *w = (float *)mp__carve(a, m->n_params + m->n_state, sizeof(float));
    float *g = (float *)mp__carve(a, m->n_params, sizeof(float));
    mp__step_state *state = (mp__step_state *)mp__carve(a, 1, sizeof(mp__step_state));
    int i;
    float *log = (float *)mp__carve(a, MP__METRIC_LOG * 2, sizeof(float));
    if (a->base) m->w = w, m->g = g, m->state = state, m->metric_log = log;
    for (i = 0; i < m->n_layers; i++) {
        mp__layer *l = &m->layers[i];
        mp_dtype dt, yt;
        void *wc, *gc;
        size_t bias_at;
        int own;
        mp__amp_layer_dtypes(m, amp, i, &dt, &yt);
        dt = mp__weight_dtype(l->desc.kind, dt); /* the copy's dtype: the weights', wt */
        own = dt != MP_FLOAT32 && mp__params(l);
        /* an own copy's bias on a 256-byte boundary too, where the BIAS
           epilogue reads it: cuBLASLt's kernels may assume a 16-byte aligned
           bias (cuBLAS documentation, cublasLtMatmul's epilogue bias pointer)
           and fault with a sticky misaligned-address error; the float32 weights
           stay packed, as get_weights and checkpoints see them */
        bias_at = own ? (l->n_kernel * mp__dtypes[dt].size + MP__CARVE_ALIGN - 1) / MP__CARVE_ALIGN * MP__CARVE_ALIGN /
                            mp__dtypes[dt].size
                      : l->n_kernel;
        wc = own ? mp__carve(a, bias_at + l->n_bias, mp__dtypes[dt].size) : NULL;
        gc = own ? mp__carve(a, mp__params(l), mp__dtypes[dt].size) : NULL;
        if (a->base) l->wc = wc, l->gc = gc, l->bias_at = bias_at;
    }
}

/* Each layer's slice of the float32 weights and gradients, and of the
   state after them; under float32 its compute-dtype copies are those very
   slices. */
static void mp__point_weights(mp_model *m) {
    size_t off = 0, state = m->n_params;
    int li;
    for (li = 0; li < m->n_layers; li++) {
        mp__layer *l = &m->layers[li];
        if (l->n_state) l->state = m->w + state;
        state += l->n_state;
        if (!mp__params(l)) continue;
        l->w = m->w + off;
        l->g = m->g + off;
        if (!l->wc) { l->wc = l->w; l->gc = l->g; }
        off += mp__params(l);
    }
}

/* The normalizations' initial values, Keras's: gamma (the kernel slot)
   ones, beta zeros; BatchNormalization's moving mean zeros, moving
   variance ones. */
static void mp__init_norm(mp_model *m, const mp__layer *l) {
    float chunk[MP__TILE];
    size_t i, len, c = l->n_kernel;
    for (i = 0; i < MP__TILE; i++) chunk[i] = 1.0f;
    for (i = 0; i < c; i += len) {
        len = mp__min(MP__TILE, c - i);
        m->be->copy(m->ctx, l->w + i, chunk, len * sizeof(float), MP_COPY_TO_BACKEND);
        if (l->n_state) m->be->copy(m->ctx, l->state + c + i, chunk, len * sizeof(float), MP_COPY_TO_BACKEND);
    }
}

/* w[0, n) = U(-limit, limit), made on the host a tile at a time. */
static void mp__init_uniform(mp_model *m, float *w, size_t n, float limit, uint64_t *rng) {
    float chunk[MP__TILE];
    size_t i, j, len;
    for (i = 0; i < n; i += len) {
        len = mp__min(MP__TILE, n - i);
        for (j = 0; j < len; j++) chunk[j] = (2.0f * mp__uniform(rng) - 1.0f) * limit;
        m->be->copy(m->ctx, w + i, chunk, len * sizeof(float), MP_COPY_TO_BACKEND);
    }
}

/* glorot_uniform: U(-limit, limit), limit = sqrt(6 / (fan_in + fan_out)),
   with a conv kernel's fans counted over its receptive field; Keras's
   compute_fans for MultiHeadAttention's rank-3 kernels too (fan_in =
   shape[-2] x the product of the axes before it, fan_out = shape[-1] x
   that), their biases zero. Embedding: Keras's "uniform", U(-0.05, 0.05). */
static float mp__glorot(float fan_in, float fan_out) { return sqrtf(6.0f / (fan_in + fan_out)); }

static void mp__init_weights(mp_model *m) {
    uint64_t rng = m->desc.seed;
    int li, j;
    mp__point_weights(m);
    for (li = 0; li < m->n_layers; li++) {
        const mp__layer *l = &m->layers[li];
        if (l->desc.kind == MP_EMBEDDING) {
            mp__init_uniform(m, l->w, l->n_kernel, 0.05f, &rng);
        } else if (l->desc.kind == MP_POSITION_EMBEDDING) {
            float c = (float)mp__last_axis(l);
            mp__init_uniform(m, l->w, l->n_kernel, mp__glorot((float)l->desc.sequence_length, c), &rng);
        } else if (l->desc.kind == MP_MULTI_HEAD_ATTENTION) {
            size_t kernel[4], bias[4];
            float c = (float)mp__last_axis(l), h = (float)l->desc.num_heads, d = (float)l->desc.key_dim;
            mp__mha_offsets(l, kernel, bias);
            for (j = 0; j < 4; j++) /* (C, H, D) for query, key, value; (H, D, C) for the output */
                mp__init_uniform(m, l->w + kernel[j], bias[j] - kernel[j],
                                 j < 3 ? mp__glorot(h * c, d * c) : mp__glorot(d * h, c * h), &rng);
        } else if (mp__kinds[l->desc.kind].float32_weights) {
            mp__init_norm(m, l);
        } else if (l->n_kernel) {
            size_t units = (size_t)(l->desc.kind == MP_DENSE ? l->desc.units : l->desc.filters);
            float receptive = l->desc.kind == MP_CONV2D ? (float)l->geom.kh * (float)l->geom.kw : 1.0f;
            mp__init_uniform(m, l->w, l->n_kernel, mp__glorot((float)(l->n_kernel / units), receptive * (float)units),
                             &rng);
        }
    }
}

/* A weight block for the layers as `amp` types them, not yet the model's. */
static mp_status mp__alloc_params(mp_model *m, const struct mp__amp *amp, void **block, size_t *bytes) {
    mp__arena a = {NULL, 0, 0};
    mp_status st = mp__check_graph(m);
    if (st != MP_OK) return st;
    mp__plan_params(m, &a, amp);
    if (a.overflow) return mp__fail(m, MP_ERR_SIZE, "the weights do not fit in memory");
    if (!(*block = m->be->alloc(m->ctx, a.used)))
        return mp__fail(m, MP_ERR_ALLOC, "weights (%z bytes on %s)", a.used, m->be->name);
    *bytes = a.used;
    return MP_OK;
}

/* The block becomes the model's (the layers already typed as it was
   planned for): the float32 weights carried over from the old block, or
   initialised on the first build. Cannot fail. */
static void mp__adopt_params(mp_model *m, void *block, size_t bytes) {
    mp__arena a = {NULL, 0, 0};
    void *old = m->params_block;
    float *w = m->w;
    a.base = (unsigned char *)block;
    mp__plan_params(m, &a, m->amp);
    m->params_block = block;
    m->params_bytes = bytes;
    if (!old) {
        mp__init_weights(m);
        return;
    }
    mp__point_weights(m);
    m->be->copy(m->ctx, m->w, w, (m->n_params + m->n_state) * sizeof(float), MP_COPY_WITHIN);
    m->be->free(m->ctx, old);
    m->casts_fresh = m->grads_ready = 0;
}

MIXPREC_API mp_status mp_model_build(mp_model *m) {
    void *block = NULL;
    size_t bytes = 0;
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if (mp__built(m)) return MP_OK;
    if ((st = mp__alloc_params(m, m->amp, &block, &bytes)) != MP_OK) return st;
    mp__adopt_params(m, block, bytes);
    return mp__comm_share_weights(m);
}

static int mp__slots_per_weight(const mp_optimizer_desc *o) {
    if (o->kind == MP_ADAM || o->kind == MP_ADAMW) return 2;
    if (o->kind == MP_RMSPROP) return 1;
    return o->momentum != 0.0f;
}

/* Keras's defaults for every zero field; the message names the first
   field out of range. */
static mp_status mp__resolve_optimizer(mp_model *m, const mp_optimizer_desc *in, mp_optimizer_desc *o) {
    const char *bad;
    *o = *in;
    if ((unsigned)o->kind >= (unsigned)MP_OPTIMIZER_COUNT)
        return mp__fail(m, MP_ERR_ARG, "unknown optimizer kind %d", (int)o->kind);
    if (o->learning_rate == 0.0f) o->learning_rate = o->kind == MP_SGD ? 0.01f : 0.001f;
    if (o->rho == 0.0f) o->rho = 0.9f;
    if (o->beta_1 == 0.0f) o->beta_1 = 0.9f;
    if (o->beta_2 == 0.0f) o->beta_2 = 0.999f;
    if (o->epsilon == 0.0f) o->epsilon = 1e-7f;
    if (o->weight_decay == 0.0f && !o->no_weight_decay && o->kind == MP_ADAMW) o->weight_decay = 0.004f;
    bad = !(o->learning_rate > 0.0f && o->learning_rate <= FLT_MAX) ? "learning_rate (finite, > 0)"
          : !(o->momentum >= 0.0f && o->momentum < 1.0f)              ? "momentum (in [0, 1))"
          : !(o->rho > 0.0f && o->rho < 1.0f)                         ? "rho (in (0, 1))"
          : !(o->beta_1 > 0.0f && o->beta_1 < 1.0f)                   ? "beta_1 (in (0, 1))"
          : !(o->beta_2 > 0.0f && o->beta_2 < 1.0f)                   ? "beta_2 (in (0, 1))"
          : !(o->epsilon > 0.0f && o->epsilon <= FLT_MAX)             ? "epsilon (finite, > 0)"
          : !(o->weight_decay >= 0.0f && o->weight_decay <= FLT_MAX)  ? "weight_decay (finite, >= 0)"
          : o->no_weight_decay && o->weight_decay != 0.0f             ? "weight_decay (0 with no_weight_decay)"
          : !(o->clipnorm >= 0.0f && o->clipnorm <= FLT_MAX)          ? "clipnorm (finite, >= 0)"
          : !(o->clipvalue >= 0.0f && o->clipvalue <= FLT_MAX)        ? "clipvalue (finite, >= 0)"
          : !(o->global_clipnorm >= 0.0f && o->global_clipnorm <= FLT_MAX) ? "global_clipnorm (finite, >= 0)"
                                                                      : NULL;
    if (!bad && (o->gradient_accumulation_steps < 0 || o->gradient_accumulation_steps == 1))
        bad = "gradient_accumulation_steps (0, or >= 2)";
    if (bad) return mp__fail(m, MP_ERR_ARG, "optimizer.%s out of range", bad);
    if ((o->clipnorm > 0.0f) + (o->clipvalue > 0.0f) + (o->global_clipnorm > 0.0f) > 1)
        return mp__fail(m, MP_ERR_ARG, "only one of optimizer.clipnorm, clipvalue and global_clipnorm can be set, "
                        "as in Keras");
    o->no_weight_decay = o->weight_decay == 0.0f; /* resolved: resolving again keeps it */
    if (!mp__schedule_valid(&o->schedule))
        return mp__fail(m, MP_ERR_ARG, "learning-rate schedule: kind %d, initial_learning_rate, decay_steps, "
                        "decay_rate must be positive, alpha in [0, 1]", (int)o->schedule.kind);
    if (o->schedule.kind != MP_LR_CONSTANT) o->learning_rate = mp_lr_schedule_value(&o->schedule, 0);
    if ((o->clipnorm > 0.0f || o->global_clipnorm > 0.0f) && !m->be->sum_squares)
        return mp__fail(m, MP_ERR_ARG, "optimizer.clipnorm, global_clipnorm: the %s backend cannot take norms "
                        "(no sum_squares)", m->be->name);
    return MP_OK;
}

/* What compile makes before it changes anything (so that a failure leaves
   the model exactly as it was): the optimizer and the loss scale resolved,
   the AMP pass's typing, a new weight block on the first build or when a
   layer's compute dtype changes, the optimizer's slots. */
typedef struct mp__compiled {
    mp_optimizer_desc opt;
    mp_loss_scale ls;
    struct mp__amp *amp; /* NULL: no pass */
    void *params, *slots;
    size_t params_bytes, slot_count;
    int retype; /* an output dtype changes: the activations are planned again */
} mp__compiled;

static mp_status mp__compile_prepare(mp_model *m, const mp_compile_desc *desc, mp__compiled *c) {
    const char *bad;
    mp_status st;
    int i, recarve = !mp__built(m);
    if ((st = mp__resolve_optimizer(m, &desc->optimizer, &c->opt)) != MP_OK) return st;
    if ((bad = mp__loss_scale_resolve(&c->ls, &desc->loss_scale_config)) != NULL)
        return mp__fail(m, MP_ERR_ARG, "loss_scale_config.%s out of range", bad);
    if ((st = mp__amp_pass(m, desc, &c->amp)) != MP_OK) return st; /* decides the layers' dtypes */
    for (i = 0; i < m->n_layers; i++) {
        mp_dtype dt, yt;
        mp__amp_layer_dtypes(m, c->amp, i, &dt, &yt);
        recarve |= dt != m->layers[i].dt;
        c->retype |= dt != m->layers[i].dt || yt != m->layers[i].yt;
    }
    if (recarve && (st = mp__alloc_params(m, c->amp, &c->params, &c->params_bytes)) != MP_OK) return st;
    if (!mp__mul_ok(m->n_params, (size_t)mp__slots_per_weight(&c->opt) + (c->opt.gradient_accumulation_steps > 0),
                    &c->slot_count) ||
        c->slot_count > SIZE_MAX / sizeof(float))
        return mp__fail(m, MP_ERR_SIZE, "optimizer slots");
    if (c->slot_count && !(c->slots = m->be->alloc(m->ctx, c->slot_count * sizeof(float))))
        return mp__fail(m, MP_ERR_ALLOC, "optimizer slots (%z bytes on %s)", c->slot_count * sizeof(float),
                        m->be->name);
    return MP_OK;
}

static void mp__compile_discard(mp_model *m, mp__compiled *c) {
    m->be->free(m->ctx, c->params);
    m->be->free(m->ctx, c->slots);
    mp__free(c->amp);
}

/* Which trainable variables weight decay skips: bit k of a layer's
   no_decay for its k-th (mp__layer_var: kernel or gamma, then bias or
   beta; MultiHeadAttention's eight), where its
   path "LAYER/NAME" contains one of the strings of `exclude`
   (mp_optimizer_desc.exclude_from_weight_decay). */
static void mp__mark_no_decay(mp_model *m, const char *const *exclude) {
    mp_weight_info w[MP__LAYER_WEIGHTS];
    char path[64]; /* a layer's name (32) and a weight's */
    int i, k, n;
    size_t e;
    for (i = 0; i < m->n_layers; i++) {
        mp__layer *l = &m->layers[i];
        l->no_decay = 0;
        n = mp__layer_weights(l, w);
        for (k = 0; k < n && exclude; k++) {
            mp__text t;
            t.buf = path, t.cap = sizeof path, t.len = 0;
            mp__put(&t, l->name);
            mp__put(&t, "/");
            mp__put(&t, w[k].name);
            for (e = 0; exclude[e]; e++)
                if (w[k].trainable && strstr(path, exclude[e])) l->no_decay |= 1u << k;
        }
    }
}

/* The prepared state becomes the model's; nothing here can fail. */
static void mp__compile_commit(mp_model *m, const mp_compile_desc *desc, const mp__compiled *c) {
    const char *policy_name = mp_policy_name(m->policy);
    int per;
    mp__amp_retype(m, c->amp);
    mp__free(m->amp);
    m->amp = c->amp;
    if (c->params) mp__adopt_params(m, c->params, c->params_bytes);
    if (c->retype) {
        m->be->free(m->ctx, m->act_block);
        m->act_block = NULL;
        m->act_bytes = m->batch_cap = m->batch = 0;
    }
    m->be->free(m->ctx, m->slots_block);
    m->slots_block = c->slots;
    m->slots_bytes = c->slot_count * sizeof(float);
    m->slot_count = c->slot_count;
    per = mp__slots_per_weight(&c->opt);
    m->s1 = per >= 1 ? (float *)c->slots : NULL;
    m->s2 = per == 2 ? (float *)c->slots + m->n_params : NULL;
    m->acc = c->opt.gradient_accumulation_steps ? (float *)c->slots + (size_t)per * m->n_params : NULL;
    m->compile = *desc;
    m->opt.cfg = c->opt;
    m->opt.iteration = 0;
    m->opt.accumulated = 0;
    mp__mark_no_decay(m, c->opt.exclude_from_weight_decay);
    m->opt.cfg.exclude_from_weight_decay = NULL; /* read; the caller's strings need not outlive compile */
    /* Keras wraps the optimizer by itself only under mixed_float16, and
       TensorFlow's graph rewrite under float16 */
    m->has_loss_scale = desc->loss_scale == MP_LOSS_SCALE_ON ||
                        (desc->loss_scale == MP_LOSS_SCALE_AUTO &&
                         ((policy_name && strcmp(policy_name, "mixed_float16") == 0) ||
                          (m->amp && m->amp->dtype == MP_FLOAT16)));
    memset(&m->seen, 0, sizeof m->seen);
    m->seen.ls = c->ls;
    m->be->copy(m->ctx, m->state, &m->seen, sizeof m->seen, MP_COPY_TO_BACKEND);
    m->compiled = 1;
    mp__loop_move(m, MP__CALL_RESET);
}

MIXPREC_API mp_status mp_model_compile(mp_model *m, const mp_compile_desc *desc) {
    mp__compiled c;
    mp_status st;
    int fresh;
    if (!m) return MP_ERR_NULL;
    if (!desc) return mp__fail(m, MP_ERR_NULL, "compile() needs a mp_compile_desc");
    if (desc->loss <= MP_LOSS_NONE || desc->loss >= MP_LOSS_COUNT)
        return mp__fail(m, MP_ERR_ARG, "compile() needs a loss, got %d", (int)desc->loss);
    if ((unsigned)desc->metrics > (unsigned)MP_METRIC_ACCURACY || (unsigned)desc->loss_scale > (unsigned)MP_LOSS_SCALE_ON)
        return mp__fail(m, MP_ERR_ARG, "invalid metrics or loss_scale value");
    memset(&c, 0, sizeof c);
    fresh = !mp__built(m);
    if ((st = mp__compile_prepare(m, desc, &c)) != MP_OK) {
        mp__compile_discard(m, &c);
        return st;
    }
    mp__compile_commit(m, desc, &c);
    mp__amp_print(m);
    return fresh ? mp__comm_share_weights(m) : MP_OK; /* weights initialised here: rank 0's */
}

/* The activations' memory. Each buffer a batch needs lives from the step
   that writes it to the last that reads it, on a timeline of the forward
   pass (layer i at step i) and then the backward pass (layer i at step
   2n - 1 - i); buffers whose lives do not overlap share bytes. An output
   lives until the last layer reading it has run forward, unless a
   backward pass reads it (mp__layer_kind.reads_input of a layer reading
   it, reads_output of its own): then, like the model's output, logits,
   masks and statistics, it is kept to the end (step 2n), since gradients
   may be taken again after an apply without a new forward pass (the
   custom loop's rules). A gradient lives from the backward pass of the
   last layer reading the output to the layer's own. */
typedef struct mp__buffer {
    void **at;       /* where the address goes, when the block is carved */
    size_t bytes;    /* a multiple of MP__CARVE_ALIGN */
    int first, last; /* steps */
    size_t offset;   /* in the shared region */
} mp__buffer;

/* The most buffers a layer asks for: its output, z, dy, dyc, stats and
   mask, and a cast copy and a gradient share per input. */
enum { MP__LAYER_BUFFERS = 6 + 2 * MP_MAX_LAYER_INPUTS };

static void mp__want(mp__buffer *b, int *n, void **at, size_t count, size_t elem, int first, int last, int *overflow) {
    size_t bytes;
    if (!mp__mul_ok(count, elem, &bytes) || bytes > SIZE_MAX - MP__CARVE_ALIGN) { *overflow = 1; return; }
    if (!bytes) { *at = NULL; return; }
    b[*n].at = at;
    b[*n].bytes = (bytes + MP__CARVE_ALIGN - 1) / MP__CARVE_ALIGN * MP__CARVE_ALIGN;
    b[*n].first = first;
    b[*n].last = last;
    (*n)++;
}

/* The step after which nothing reads layer i's output any more. A view
   (Flatten, Reshape) is its input: what reads the view reads the input. */
static int mp__last_read(const mp_model *m, int i) {
    int n = m->n_layers, last = i, c, k;
    if (i == n - 1 || mp__kinds[m->layers[i].desc.kind].reads_output) return 2 * n;
    for (c = i + 1; c < n; c++) {
        const mp__layer *l = &m->layers[c];
        for (k = 0; k < l->n_in; k++) {
            int until = c;
            if (l->in[k] != i) continue;
            if (l->xt[k] != l->dt) { /* it reads its cast copy after its forward pass */
                if (c > last) last = c;
                continue;
            }
            if (mp__kinds[l->desc.kind].view) until = mp__last_read(m, c);
            else if (mp__kinds[l->desc.kind].reads_input) until = 2 * n;
            if (until > last) last = until;
        }
    }
    return last;
}

/* Where each gradient share goes: the first layer (in the backward pass)
   to reach an output writes its dy; the others write their own buffer and
   add it to that dy after their backward pass (the sum in the output's
   dtype, the dtype every activation gradient has). */
static int mp__adds_share(const mp_model *m, int i, int k) {
    int p = m->layers[i].in[k], c, j;
    for (c = m->n_layers - 1; c > i; c--)
        for (j = 0; j < m->layers[c].n_in; j++)
            if (m->layers[c].in[j] == p) return 1;
    for (j = 0; j < k; j++)
        if (m->layers[i].in[j] == p) return 1;
    return 0;
}

/* The dtype of the batch as the layers find it: the first layer's compute
   dtype, or float32 where an Embedding reads it (token ids stay exact, up
   to 2^24, whatever the policy). */
static mp_dtype mp__input_dtype(const mp_model *m) {
    int i;
    for (i = 0; i < m->n_layers; i++)
        if (m->layers[i].desc.kind == MP_EMBEDDING) return MP_FLOAT32; /* it reads the model's input (mp__sequence_shape) */
    return m->layers[0].dt;
}

/* The dtypes of each layer's inputs, and which gradient shares are added. */
static void mp__link_types(mp_model *m) {
    int i, k;
    for (i = 0; i < m->n_layers; i++) {
        mp__layer *l = &m->layers[i];
        for (k = 0; k < l->n_in; k++) {
            int from = l->in[k];
            /* the batch comes in as the first layer reads it */
            l->xt[k] = from == MP__FROM_INPUT ? mp__input_dtype(m) : m->layers[from].yt;
            l->add_dx[k] = from != MP__FROM_INPUT && mp__adds_share(m, i, k);
        }
    }
}

/* Each layer's inputs, and the gradient buffers of its inputs where it
   writes them directly, once every layer's own buffers have addresses; a
   view's output is its input (or the cast copy of it). */
static void mp__link_pointers(mp_model *m) {
    int i, k;
    for (i = 0; i < m->n_layers; i++) {
        mp__layer *l = &m->layers[i];
        for (k = 0; k < l->n_in; k++) {
            const mp__layer *from = l->in[k] == MP__FROM_INPUT ? NULL : &m->layers[l->in[k]];
            l->x[k] = from ? from->y : m->input;
            if (!l->add_dx[k]) l->dx[k] = from ? from->dy : NULL;
        }
        if (mp__kinds[l->desc.kind].view) l->y = l->xin[0] ? l->xin[0] : (void *)(uintptr_t)l->x[0];
    }
}

/* Layer i's own buffers (mp__link_types has run). */
static void mp__want_layer(mp_model *m, mp__buffer *b, int *count, size_t batch, int i, int *overflow) {
    mp__layer *l = &m->layers[i];
    const mp__layer_kind *kind = &mp__kinds[l->desc.kind];
    int n = m->n_layers, fwd = i, bwd = 2 * n - 1 - i, k, last_reader = fwd, c;
    size_t es = mp__dtypes[l->dt].size, ys = mp__dtypes[l->yt].size;
    int linear = l->desc.kind == MP_DENSE || l->desc.kind == MP_CONV2D, out_last = mp__last_read(m, i);
    /* z: gelu's input, and the logits a loss may read from the last layer */
    int keep_z = linear && (mp__act_reads_input(l->desc.activation) ||
                            (i == n - 1 && (l->desc.activation == MP_SOFTMAX || l->desc.activation == MP_SIGMOID)));
    for (c = i + 1; c < n; c++)
        for (k = 0; k < m->layers[c].n_in; k++)
            if (m->layers[c].in[k] == i) last_reader = c;
    for (k = 0; k < l->n_in; k++) {
        int xin_last = kind->view ? out_last : kind->reads_input ? 2 * n : fwd;
        mp__want(b, count, &l->xin[k], l->xt[k] != l->dt ? batch : 0, l->in_sizes[k] * es, fwd, xin_last, overflow);
        if (l->add_dx[k])
            mp__want(b, count, &l->dx[k], batch, l->in_sizes[k] * mp__dtypes[l->xt[k]].size, bwd, bwd, overflow);
    }
    if (!kind->view) mp__want(b, count, &l->y, batch, l->out_size * ys, fwd, out_last, overflow);
    mp__want(b, count, &l->z, keep_z ? batch : 0, l->out_size * ys, fwd, 2 * n, overflow);
    mp__want(b, count, &l->dy, batch, l->out_size * ys, 2 * n - 1 - last_reader, bwd, overflow);
    mp__want(b, count, &l->dyc, l->yt != l->dt ? batch : 0, l->out_size * es, bwd, bwd, overflow);
    mp__want(b, count, (void **)&l->mask, l->desc.kind == MP_DROPOUT ? batch : 0, l->in_size, fwd, 2 * n, overflow);
    if (l->desc.kind == MP_MULTI_HEAD_ATTENTION) {
        size_t work, scratch, logits;
        mp__mha_sizes(l, batch, &work, &scratch, &logits, overflow);
        mp__want(b, count, &l->work, 1, work, fwd, 2 * n, overflow);
        mp__want(b, count, &l->scratch, 1, scratch, bwd, bwd, overflow);
        mp__want(b, count, (void **)&l->stats, 1, logits, fwd, fwd, overflow);
        return;
    }
    mp__want(b, count, (void **)&l->stats,
             l->desc.kind == MP_BATCH_NORMALIZATION ? 2 : l->desc.kind == MP_LAYER_NORMALIZATION ? 2 * batch : 0,
             (l->desc.kind == MP_LAYER_NORMALIZATION ? l->in_size / mp__last_axis(l) : mp__last_axis(l)) * sizeof(float),
             fwd, 2 * n, overflow);
}

static int mp__by_size(const void *pa, const void *pb) {
    const mp__buffer *a = *(const mp__buffer *const *)pa, *b = *(const mp__buffer *const *)pb;
    if (a->bytes != b->bytes) return a->bytes < b->bytes ? 1 : -1;
    return a < b ? -1 : a > b; /* in the order asked: the same plan each time */
}

static int mp__by_offset(const void *pa, const void *pb) {
    const mp__buffer *a = *(const mp__buffer *const *)pa, *b = *(const mp__buffer *const *)pb;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Offsets, the largest buffer first, each at the lowest offset free of
   the buffers placed before it that it lives beside (greedy by size, as
   TensorFlow Lite's arena planner); returns the region's bytes. order and
   near are scratch for n pointers each. */
static size_t mp__place(mp__buffer *b, int n, mp__buffer **order, mp__buffer **near) {
    size_t end = 0, at;
    int i, j, count;
    for (i = 0; i < n; i++) order[i] = &b[i];
    qsort(order, (size_t)n, sizeof *order, mp__by_size);
    for (i = 0; i < n; i++) {
        mp__buffer *x = order[i];
        for (j = count = 0; j < i; j++)
            if (order[j]->first <= x->last && x->first <= order[j]->last) near[count++] = order[j];
        qsort(near, (size_t)count, sizeof *near, mp__by_offset);
        for (at = 0, j = 0; j < count; j++) {
            if (near[j]->offset >= at + x->bytes) break; /* a gap before it fits */
            if (near[j]->offset + near[j]->bytes > at) at = near[j]->offset + near[j]->bytes;
        }
        x->offset = at;
        if (at + x->bytes > end) end = at + x->bytes;
    }
    return end;
}

/* The activation block for `batch` samples: the batch (the input in the
   first layer's compute dtype, labels, targets), the loss's gradient, the
   layers' buffers in one shared region (mp__place), conv scratch. b holds
   MP__LAYER_BUFFERS a layer, order and near as many pointers. */
static void mp__plan_activations(mp_model *m, mp__arena *a, size_t batch, mp__buffer *b, mp__buffer **order,
                                 mp__buffer **near) {
    size_t col = 0, dcol = 0, img = 0, wflip = 0, outs = mp__last(m)->out_size, region;
    unsigned char *shared;
    int i, count = 0;
    m->input = mp__carve(a, batch, m->in_size * mp__dtypes[mp__input_dtype(m)].size);
    m->batch_labels = (int32_t *)mp__carve(a, batch, mp__loss_rows(m) * sizeof(int32_t));
    m->batch_y = (float *)mp__carve(a, batch, outs * sizeof(float));
    m->dpred = (float *)mp__carve(a, batch, outs * sizeof(float));
    mp__link_types(m);
    for (i = 0; i < m->n_layers; i++) {
        const mp__layer *l = &m->layers[i];
        mp__want_layer(m, b, &count, batch, i, &a->overflow);
        if (l->desc.kind == MP_CONV2D && !mp__pointwise(l)) { /* per group of images */
            size_t es = mp__dtypes[l->dt].size, patches = 0, fbytes = 0, group = mp__conv_group(m, l, batch),
                   col_bytes = 0, dcol_bytes = 0, img_bytes = 0; /* the im2col matrix: one row per output pixel */
            if (!mp__mul_ok((size_t)l->geom.oh * (size_t)l->geom.ow, l->n_kernel / (size_t)l->desc.filters, &patches) ||
                !mp__mul_ok(patches, sizeof(float), &fbytes) || !mp__mul_ok(group, fbytes, &dcol_bytes) ||
                !mp__mul_ok(group, patches * es, &col_bytes) || !mp__mul_ok(group, l->in_size * sizeof(float), &img_bytes))
                a->overflow = 1;
            if (mp__flips_dy(l)) { /* dy's columns too: H*W rows of KH*KW*F a sample, and the flipped kernel */
                size_t rows = l->in_size / (size_t)l->geom.c, per = 0, dy_bytes = 0;
                if (!mp__mul_ok(rows, l->n_kernel / (size_t)l->geom.c * es, &per) || !mp__mul_ok(group, per, &dy_bytes))
                    a->overflow = 1;
                if (dy_bytes > col_bytes) col_bytes = dy_bytes;
                if (l->n_kernel * es > wflip) wflip = l->n_kernel * es;
            } else if (!mp__conv_by_flip(l) && l->in[0] != MP__FROM_INPUT) { /* dx folded back by col2im */
                if (dcol_bytes > dcol) dcol = dcol_bytes;
                if (img_bytes > img) img = img_bytes;
            }
            if (m->be->conv_gemm && !mp__conv_scratch(m, l, &col_bytes)) a->overflow = 1;
            if (col_bytes > col) col = col_bytes;
        }
    }
    region = mp__place(b, count, order, near);
    shared = (unsigned char *)mp__carve(a, region, 1);
    for (i = 0; i < count; i++) *b[i].at = shared ? shared + b[i].offset : NULL;
    mp__link_pointers(m);
    m->grad16 = m->ranks > 1 && m->desc.allreduce_dtype != MP_FLOAT32 ? mp__carve(a, m->n_params, 2) : NULL;
    m->col = mp__carve(a, col, 1);
    m->wflip = mp__carve(a, wflip, 1);
    m->dcol = (float *)mp__carve(a, dcol, 1);
    m->img = (float *)mp__carve(a, img, 1);
}

/* Every product the model runs, (m, n, k) of each forward, weight-gradient
   and input-gradient product, so that the backend sizes its scratch once
   and no step allocates. */
static mp_status mp__reserve_products(mp_model *m, size_t batch) {
    mp_status st = MP_OK;
    int li;
    for (li = 0; li < m->n_layers && st == MP_OK; li++) {
        const mp__layer *l = &m->layers[li];
        size_t f, patch, rows;
        size_t per; /* a sample's rows: output pixels, or a Dense input's rows of its last axis */
        if (l->desc.kind == MP_MULTI_HEAD_ATTENTION) { /* the projections: x W [B*T, C] x [C, H*D], att W_o */
            size_t c = mp__last_axis(l), hd = (size_t)l->desc.num_heads * (size_t)l->desc.key_dim;
            if (!mp__mul_ok(batch, (size_t)l->in_shape[0], &rows)) return MP_ERR_SIZE;
            if ((st = m->be->gemm_reserve(m->ctx, rows, hd, c)) == MP_OK &&
                (st = m->be->gemm_reserve(m->ctx, c, hd, rows)) == MP_OK &&
                (st = m->be->gemm_reserve(m->ctx, rows, c, hd)) == MP_OK &&
                (st = m->be->gemm_reserve(m->ctx, hd, c, rows)) == MP_OK)
                st = m->be->gemm_reserve(m->ctx, rows, hd, c);
            continue;
        }
        if (l->desc.kind != MP_DENSE && l->desc.kind != MP_CONV2D) continue;
        per = l->desc.kind == MP_CONV2D ? (size_t)l->geom.oh * (size_t)l->geom.ow : l->in_size / mp__last_axis(l);
        f = l->out_size / per;
        patch = l->n_kernel / f;
        if (!mp__mul_ok(l->desc.kind == MP_CONV2D ? mp__conv_group(m, l, batch) : batch, per, &rows))
            return MP_ERR_SIZE;
        if ((st = m->be->gemm_reserve(m->ctx, rows, f, patch)) == MP_OK &&      /* y = x W */
            (st = m->be->gemm_reserve(m->ctx, patch, f, rows)) == MP_OK)        /* dW = x^T dy */
            st = m->be->gemm_reserve(m->ctx, rows, patch, f);                   /* dx = dy W^T */
        if (st == MP_OK && l->desc.kind == MP_CONV2D && mp__flips_dy(l)) { /* dx = im2col(dy) W' */
            size_t c = (size_t)l->geom.c, in_rows = 0;
            if (!mp__mul_ok(mp__conv_group(m, l, batch), l->in_size / c, &in_rows)) return MP_ERR_SIZE;
            st = m->be->gemm_reserve(m->ctx, in_rows, c, patch / c * f);
        }
    }
    return st;
}

static void mp__plan_stage(const mp_model *m, mp__arena *a, size_t batch, mp__stage *st) {
    size_t outs = mp__last(m)->out_size;
    st->x = (float *)mp__carve(a, batch, m->in_size * sizeof(float));
    st->y = (float *)mp__carve(a, batch, outs * sizeof(float));
    st->out = (float *)mp__carve(a, batch, outs * sizeof(float));
    st->labels = (int32_t *)mp__carve(a, batch, mp__loss_rows(m) * sizeof(int32_t));
}

static void mp__free_stage(mp_model *m) {
    int i;
    for (i = 0; i < 2; i++) {
        if (m->stage_pinned) m->be->host_free(m->ctx, m->stage_block[i]);
        else mp__free(m->stage_block[i]);
        m->stage_block[i] = NULL;
    }
}

/* Two staging sets of `bytes`, a block each (so that waiting for one set's
   copies never waits for the other's), pinned (the backend's host_alloc)
   or the host's; 0 (and none) when an allocation fails. */
static int mp__alloc_stage(mp_model *m, size_t bytes, int pinned, size_t batch) {
    mp__arena a = {NULL, 0, 0};
    int i;
    m->stage_pinned = pinned;
    for (i = 0; i < 2; i++) {
        a.base = pinned ? (unsigned char *)m->be->host_alloc(m->ctx, bytes) : (unsigned char *)mp__alloc(bytes);
        if (!(m->stage_block[i] = a.base)) {
            mp__free_stage(m);
            return 0;
        }
        a.used = 0;
        mp__plan_stage(m, &a, batch, &m->stages[i]);
    }
    return 1;
}

/* Pinned if the backend has such memory, else (or when that fails) the host's. */
static mp_status mp__ensure_stage(mp_model *m, size_t batch) {
    mp__arena a = {NULL, 0, 0};
    if (!m->be->device_memory) return MP_OK;
    mp__free_stage(m);
    mp__plan_stage(m, &a, batch, &m->stages[0]);
    if (a.overflow || (!(m->be->host_alloc && mp__alloc_stage(m, a.used, 1, batch)) && !mp__alloc_stage(m, a.used, 0, batch)))
        return mp__fail(m, MP_ERR_ALLOC, "the host staging buffers for batch %z", batch);
    return MP_OK;
}

/* A backend with Tensor Cores: once per model, the sizes that keep its
   16-bit products off them, with the padding that fixes each (the mixed
   precision guide's advice: multiples of 8). */
static void mp__warn_tensor_cores(mp_model *m, size_t batch) {
#ifndef MIXPREC_NO_STDIO
    char text[2048];
    int issues = 0, i, low = 0;
    for (i = 0; i < m->n_layers; i++) low |= m->layers[i].dt != MP_FLOAT32 && mp__params(&m->layers[i]);
    if (low && batch <= 65536 && mp_model_tensor_core_advice(m, (int)batch, text, sizeof text, &issues) != MP_ERR_NULL &&
        issues)
        fprintf(stderr, "WARNING: mixprec: the %s backend: %s", m->be->name, text);
#endif
    (void)batch;
    m->tensor_core_warned = 1;
}

/* The activation block for batch samples, planned (mp__place) in the
   host's scratch, measured, then carved. */
static mp_status mp__alloc_activations(mp_model *m, size_t batch) {
    mp__arena a = {NULL, 0, 0};
    size_t n = (size_t)m->n_layers * MP__LAYER_BUFFERS;
    mp__buffer *b = (mp__buffer *)mp__alloc(n * (sizeof(mp__buffer) + 2 * sizeof(mp__buffer *))), **order;
    if (!b) return mp__fail(m, MP_ERR_ALLOC, "planning the activations of batch %z", batch);
    order = (mp__buffer **)(void *)(b + n);
    mp__plan_activations(m, &a, batch, b, order, order + n);
    if (!a.overflow && (a.base = (unsigned char *)m->be->alloc(m->ctx, a.used)) != NULL) {
        m->act_bytes = a.used;
        a.used = 0;
        m->act_block = a.base;
        mp__plan_activations(m, &a, batch, b, order, order + n);
    }
    mp__free(b);
    if (a.overflow) return mp__fail(m, MP_ERR_SIZE, "activations for batch %z do not fit in memory", batch);
    if (!m->act_block)
        return mp__fail(m, MP_ERR_ALLOC, "activations for batch %z (%z bytes on %s)", batch, a.used, m->be->name);
    return MP_OK;
}

static mp_status mp__ensure_batch(mp_model *m, size_t batch) {
    mp_status st;
    if (batch <= m->batch_cap) return MP_OK;
    /* Activations hold nothing worth keeping between calls: free first, so
       the peak does not count two blocks. */
    m->be->free(m->ctx, m->act_block);
    m->act_block = NULL;
    m->act_bytes = m->batch_cap = m->batch = 0;
    mp__loop_move(m, MP__CALL_RESET);
    if ((st = mp__alloc_activations(m, batch)) != MP_OK) return st;
    if ((st = mp__reserve_products(m, batch)) == MP_OK) st = mp__ensure_stage(m, batch);
    if (st != MP_OK) {
        m->be->free(m->ctx, m->act_block);
        m->act_block = NULL;
        m->act_bytes = 0;
        return st == MP_ERR_ALLOC ? mp__fail(m, st, "GEMM scratch or staging for batch %z", batch) : st;
    }
    m->batch_cap = batch;
    if (m->be->tensor_cores && !m->tensor_core_warned) mp__warn_tensor_cores(m, batch);
    return MP_OK;
}

/* x holds no Inf or NaN, else the first one's sample and feature (int32
   x has none). A host backend scans x with unscale_check's test alone,
   split across its pool; a device's cannot read host memory, and the
   index comes from a scan here. */
static mp_status mp__check_finite(mp_model *m, const char *who, const void *xv, mp_dtype xt, size_t count) {
    const float *x = (const float *)xv;
    size_t i, n = count * m->in_size;
    int found = 1; /* a device's: the scan here looks */
    if (xt != MP_FLOAT32) return MP_OK;
    if (!m->be->device_memory) {
        found = 0;
        m->be->unscale_check(m->ctx, NULL, x, MP_FLOAT32, n, NULL, &found);
    }
    if (found && (i = mp__first_nonfinite(x, n)) < n)
        return mp__fail(m, MP_ERR_NONFINITE, "%s: x: sample %z, feature %z is %s", who, i / m->in_size,
                        i % m->in_size, x[i] != x[i] ? "NaN" : "Inf");
    return MP_OK;
}

/* The values of the targets, once their shapes are checked: labels in
   range for sparse crossentropy, finite float targets for the rest. */
static mp_status mp__check_targets(mp_model *m, const char *who, const int32_t *labels, const float *y, size_t count) {
    size_t i, rows = mp__loss_rows(m), classes = mp__last(m)->out_size / rows;
    if (labels && rows > 1) {
        for (i = 0; i < count * rows; i++)
            if (labels[i] < 0 || (size_t)labels[i] >= classes)
                return mp__fail(m, MP_ERR_LABEL, "%s: y: sample %z, position %z has label %d; the model has %z classes",
                                who, i / rows, i % rows, (int)labels[i], classes);
    } else if (labels) {
        for (i = 0; i < count; i++)
            if (labels[i] < 0 || (size_t)labels[i] >= classes)
                return mp__fail(m, MP_ERR_LABEL, "%s: y: sample %z has label %d; the model has %z classes", who, i,
                                (int)labels[i], classes);
    } else {
        classes = mp__last(m)->out_size;
        for (i = 0; i < count * classes; i++) /* a NaN target would turn every weight NaN */
            if ((mp__f32_bits(y[i]) & MP__F32_INF) == MP__F32_INF)
                return mp__fail(m, MP_ERR_NONFINITE, "%s: y: sample %z, output %z is %s", who, i / classes,
                                i % classes, y[i] != y[i] ? "NaN" : "Inf");
    }
    return MP_OK;
}

/* >>data: arrays (see the declaration) */
static mp_array mp__array(const void *data, mp_dtype dtype, size_t n, int rank, const int *shape) {
    mp_array a;
    int i;
    memset(&a, 0, sizeof a);
    a.data = data;
    a.dtype = dtype;
    a.n = n;
    a.rank = rank;
    for (i = 0; shape && i < rank && i < MP_MAX_RANK; i++) a.shape[i] = shape[i];
    return a;
}
MIXPREC_API mp_array mp_array_f32(const float *data, size_t n, int rank, const int *shape) {
    return mp__array(data, MP_FLOAT32, n, rank, shape);
}
MIXPREC_API mp_array mp_array_i32(const int32_t *data, size_t n, int rank, const int *shape) {
    return mp__array(data, MP_INT32, n, rank, shape);
}
MIXPREC_API mp_array mp_rows(const float *x, size_t n, int width) { return mp__array(x, MP_FLOAT32, n, 1, &width); }
MIXPREC_API mp_array mp_labels(const int32_t *labels, size_t n) { return mp__array(labels, MP_INT32, n, 0, NULL); }

MIXPREC_API mp_status mp_to_categorical(const int32_t *labels, size_t n, int num_classes, float *out,
                                        size_t out_count) {
    size_t i, k, need;
    int32_t top = -1;
    if ((!labels || !out) && n) return MP_ERR_NULL;
    if (num_classes < 0) return MP_ERR_ARG;
    for (i = 0; i < n; i++) {
        if (labels[i] < 0 || (num_classes && labels[i] >= num_classes)) return MP_ERR_LABEL;
        if (labels[i] > top) top = labels[i];
    }
    k = num_classes ? (size_t)num_classes : (size_t)top + 1u; /* Keras: 1 + the largest label */
    if (!mp__mul_ok(n, k, &need) || need > out_count) return MP_ERR_SIZE;
    if (need) memset(out, 0, need * sizeof(float)); /* out may be NULL when there is nothing to write */
    for (i = 0; i < n; i++) out[i * k + (size_t)labels[i]] = 1.0f;
    return MP_OK;
}

/* >>data: checks (see the declaration). A checked mp_data as batches
   are taken from it: the input's rows and the targets, typed, n samples
   each. */
typedef struct mp__feed {
    const void *x;         /* n x in_size values of xt */
    mp_dtype xt;           /* MP_FLOAT32 or MP_INT32 */
    const int32_t *labels; /* sparse crossentropy's class indices, or NULL */
    const float *y;        /* the other losses' targets, or NULL */
    size_t n;
} mp__feed;

static const char *mp__loss_name(mp_loss loss) {
    static const char *const names[MP_LOSS_COUNT] = {"no loss", "sparse_categorical_crossentropy",
                                                     "categorical_crossentropy", "binary_crossentropy",
                                                     "mean_squared_error"};
    return names[loss];
}

/* An array's own fields: a data dtype, a rank of 0 to MP_MAX_RANK,
   positive axes, and a per-sample count (*per) and n x *per values whose
   bytes fit in size_t. */
static mp_status mp__check_array(mp_model *m, const char *who, const char *what, const mp_array *a, size_t *per) {
    size_t total;
    int i;
    if (a->dtype != MP_FLOAT32 && a->dtype != MP_INT32)
        return mp__fail(m, MP_ERR_DTYPE, "%s: %s has dtype %s; data is float32 or int32 (mp_array_f32, mp_array_i32)",
                        who, what, mp_dtype_name(a->dtype) ? mp_dtype_name(a->dtype) : "(not a dtype)");
    if (a->rank < 0 || a->rank > MP_MAX_RANK)
        return mp__fail(m, MP_ERR_SHAPE, "%s: %s's samples have rank %d; a sample has 0 to %d axes", who, what, a->rank,
                        MP_MAX_RANK);
    *per = 1;
    for (i = 0; i < a->rank; i++) {
        if (a->shape[i] <= 0)
            return mp__fail(m, MP_ERR_SHAPE, "%s: %s's sample shape has size %d on axis %d; sizes are positive", who,
                            what, a->shape[i], i);
        if (!mp__mul_ok(*per, (size_t)a->shape[i], per)) break;
    }
    if (i < a->rank || !mp__mul_ok(a->n, *per, &total) || total > SIZE_MAX / sizeof(float))
        return mp__fail(m, MP_ERR_SIZE, "%s: %s's %z samples exceed SIZE_MAX bytes", who, what, a->n);
    return MP_OK;
}

/* Token ids for each Embedding: integers in [0, input_dim), else the
   error names the sample, the position and the layer (no kernel ever
   reads outside a table: it gives zeros for such an id). */
static mp_status mp__check_ids(mp_model *m, const char *who, const mp__feed *f) {
    size_t i, n = f->n * m->in_size;
    int li;
    for (li = 0; li < m->n_layers; li++) {
        const mp__layer *l = &m->layers[li];
        if (l->desc.kind != MP_EMBEDDING) continue;
        for (i = 0; i < n; i++) { /* in float32 and int32 alone (no double: single-precision FPUs) */
            float v = f->xt == MP_INT32 ? 0.0f : ((const float *)f->x)[i];
            int whole = f->xt == MP_INT32 || (v >= -2147483648.0f && v < 2147483648.0f && v == (float)(int32_t)v);
            int32_t id = f->xt == MP_INT32 ? ((const int32_t *)f->x)[i] : whole ? (int32_t)v : -1; /* NaN: not whole */
            if (whole && id >= 0 && id < l->desc.input_dim) continue;
            if (whole)
                return mp__fail(m, MP_ERR_ARG, "%s: x: sample %z, position %z has token id %d; layer %s (Embedding) "
                                "takes ids in [0, %d)", who, i / m->in_size, i % m->in_size, (int)id, l->name,
                                l->desc.input_dim);
            return mp__fail(m, MP_ERR_ARG, "%s: x: sample %z, position %z is not an integer (NaN, Inf or a fraction); "
                            "layer %s (Embedding) takes integer token ids in [0, %d)", who, i / m->in_size,
                            i % m->in_size, l->name, l->desc.input_dim);
        }
    }
    return MP_OK;
}

/* The inputs: as many as the model takes (one), x[0]'s dtype and
   per-sample count the model's; into f. */
static mp_status mp__check_x(mp_model *m, const char *who, const mp_data *d, mp__feed *f) {
    const mp_array *x = &d->x[0];
    char want[96], got[96], tuple[96];
    size_t per;
    int given = 0, i;
    mp_status st;
    for (i = 0; i < MP_MAX_INPUTS; i++) given += d->x[i].data != NULL;
    if (!x->data) return mp__fail(m, MP_ERR_NULL, "%s: x[0].data is NULL: the first input is x[0]", who);
    if (given != 1)
        return mp__fail(m, MP_ERR_SHAPE, "%s: %d inputs given (x[0] and %d more); Layer \"%s\" expects 1 input(s), but "
                        "it received %d input tensors", who, given, given - 1, mp__model_name(m), given);
    if ((st = mp__check_array(m, who, "x", x, &per)) != MP_OK) return st;
    if (x->n == 0) return mp__fail(m, MP_ERR_ARG, "%s: x has no samples (n = 0)", who);
    if (per != m->in_size)
        return mp__fail(m, MP_ERR_SHAPE, "%s: x has %z values per sample, the model's input takes %z (input_shape %s); "
                        "expected shape=%s, found shape=%s", who, per, m->in_size,
                        mp__shape_text(tuple, sizeof tuple, m->in_rank, m->in_shape, 1),
                        mp__shape_text(want, sizeof want, m->in_rank, m->in_shape, 0),
                        mp__shape_text(got, sizeof got, x->rank, x->shape, 0));
    f->x = x->data;
    f->xt = x->dtype;
    f->n = x->n;
    return mp__check_ids(m, who, f);
}

/* The targets of n samples, as the compiled loss takes them; into f. */
static mp_status mp__check_y(mp_model *m, const char *who, const mp_array *y, size_t n, mp__feed *f) {
    const mp__layer *last = mp__last(m);
    int sparse = m->compile.loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    const char *loss = mp__loss_name(m->compile.loss);
    char want[96], got[96];
    size_t per;
    mp_status st;
    if (!y->data)
        return mp__fail(m, MP_ERR_NULL, "%s: y is absent; %s needs %s", who, loss,
                        sparse ? "int32 class indices (mp_labels)" : "float32 targets");
    if ((st = mp__check_array(m, who, "y", y, &per)) != MP_OK) return st;
    if (y->n != n)
        return mp__fail(m, MP_ERR_SHAPE, "%s: x has %z samples and y %z; Data cardinality is ambiguous: make sure all "
                        "arrays contain the same number of samples", who, n, y->n);
    mp__shape_text(got, sizeof got, y->rank, y->shape, 0);
    if (sparse && y->dtype != MP_INT32)
        return mp__fail(m, MP_ERR_DTYPE, "%s: y is float32; %s takes int32 class indices (mp_labels)", who, loss);
    if (sparse && per != mp__loss_rows(m) && mp__loss_rows(m) > 1)
        return mp__fail(m, MP_ERR_SHAPE, "%s: y has %z values per sample; %s takes a class index per row of the "
                        "model's output %s (layer %s): %z a sample, found shape=%s", who, per, loss,
                        mp__shape_text(want, sizeof want, last->out_rank, last->out_shape, 0), last->name,
                        mp__loss_rows(m), got);
    if (sparse && per != 1 && mp__loss_rows(m) == 1)
        return mp__fail(m, MP_ERR_SHAPE, "%s: y has %z values per sample; %s takes one class index per sample: expected "
                        "shape=(None,) or (None, 1), found shape=%s", who, per, loss, got);
    if (!sparse && y->dtype != MP_FLOAT32)
        return mp__fail(m, MP_ERR_DTYPE, "%s: y is int32; %s takes float32 targets, %z per sample (mp_to_categorical "
                        "makes one-hot rows of class indices)", who, loss, last->out_size);
    if (!sparse && per != last->out_size)
        return mp__fail(m, MP_ERR_SHAPE, "%s: y has %z values per sample, the model's output has %z (layer %s); "
                        "expected shape=%s, found shape=%s", who, per, last->out_size, last->name,
                        mp__shape_text(want, sizeof want, last->out_rank, last->out_shape, 0), got);
    f->labels = sparse ? (const int32_t *)y->data : NULL;
    f->y = sparse ? NULL : (const float *)y->data;
    return mp__check_targets(m, who, f->labels, f->y, n);
}

/* Keras's batch_size: 0 (None) is 32. */
static mp_status mp__batch_size(mp_model *m, const char *who, int batch_size, size_t *out) {
    if (batch_size < 0) return mp__fail(m, MP_ERR_ARG, "%s: batch_size must be positive (0: 32), got %d", who, batch_size);
    *out = batch_size ? (size_t)batch_size : 32u;
    return MP_OK;
}

/* How many of a layer's parameters lie in its compute-dtype copy as in
   w: all of them, or the kernel alone where the copy's bias sits past a
   pad (bias_at); the bias then goes on its own, to bias_at. */
static size_t mp__copy_run(const mp__layer *l) { return l->bias_at == l->n_kernel ? mp__params(l) : l->n_kernel; }

static mp_status mp__run_forward(mp_model *m, size_t batch, int training) {
    mp_status st = MP_OK;
    int i;
    m->training = training;
    m->batch = batch;
    mp__loop_move(m, MP__CALL_FORWARD);
    for (i = 0; i < m->n_layers; i++) {
        mp__layer *l = &m->layers[i];
        if (l->wc != l->w && !m->casts_fresh) { /* the AutoCastVariable read */
            size_t run = mp__copy_run(l);
            m->be->cast(m->ctx, l->wc, l->wt, l->w, MP_FLOAT32, run, NULL);
            if (run < mp__params(l))
                m->be->cast(m->ctx, mp__at_mut(l->wc, l->wt, l->bias_at), l->wt, l->w + run, MP_FLOAT32, l->n_bias,
                            NULL);
        }
        mp__kinds[l->desc.kind].forward(m, l, batch);
        /* diagnostics; after a check-numerics stop the loop still ends: weight casts are due */
        if (m->num && st == MP_OK) st = mp__numerics_forward(m, i);
    }
    m->casts_fresh = 1;
    return st;
}

static mp_status mp__prepare(mp_model *m, size_t batch) {
    mp_status st = mp_model_build(m);
    return st ? st : mp__ensure_batch(m, batch);
}

/* int32 inputs as float32, each value rounded once (exact to 2^24), as
   Keras casts an int array fed to a float Input. */
static void mp__i32_to_f32(float *dst, const int32_t *src, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dst[i] = (float)src[i];
}

/* The batch in: count samples' inputs (x, of xt), labels and targets to
   the batch's row `at`. A device backend checks the inputs for Inf and
   NaN in its cast (the host scanned the CPU's; mp__read_state reports the
   device's finding). int32 inputs reach float32 a block at a time
   (mp__i32_to_f32); a device's come converted through the staging buffer
   (mp__gather), so only the CPU's take the blocks. */
static void mp__send(mp_model *m, size_t at, const void *x, mp_dtype xt, const int32_t *labels, const float *y,
                     size_t count) {
    size_t outs = mp__last(m)->out_size, n = count * m->in_size, rows = mp__loss_rows(m), i, k;
    mp_dtype dt = mp__input_dtype(m);
    int *bad = m->be->device_memory ? &m->state->bad_input : NULL;
    if (bad && at == 0) m->be->zero(m->ctx, bad, sizeof(int)); /* a new batch */
    if (xt == MP_FLOAT32) m->be->cast_in(m->ctx, mp__at_mut(m->input, dt, at * m->in_size), dt, (const float *)x, n, bad);
    for (i = 0; xt == MP_INT32 && i < n; i += k) {
        float block[256];
        k = mp__min(n - i, sizeof block / sizeof block[0]);
        mp__i32_to_f32(block, (const int32_t *)x + i, k);
        m->be->cast_in(m->ctx, mp__at_mut(m->input, dt, at * m->in_size + i), dt, block, k, bad);
    }
    if (labels)
        m->be->copy(m->ctx, m->batch_labels + at * rows, labels, count * rows * sizeof(int32_t), MP_COPY_TO_BACKEND);
    if (y) m->be->copy(m->ctx, m->batch_y + at * outs, y, count * outs * sizeof(float), MP_COPY_TO_BACKEND);
}

/* Samples [first, first + count) of fit's data on the device, as
   the device path below takes a shuffled batch, without the gather: the
   range is contiguous (fit's validation, the data's last part). */
static void mp__take_uploaded(mp_model *m, size_t first, size_t count) {
    size_t outs = mp__last(m)->out_size, in = m->in_size, rows = mp__loss_rows(m);
    m->be->cast(m->ctx, m->input, mp__input_dtype(m), m->data_x + first * in, MP_FLOAT32, count * in, NULL);
    if (m->data_labels)
        m->be->copy(m->ctx, m->batch_labels, m->data_labels + first * rows, count * rows * sizeof(int32_t),
                    MP_COPY_WITHIN);
    if (m->data_y) m->be->copy(m->ctx, m->batch_y, m->data_y + first * outs, count * outs * sizeof(float), MP_COPY_WITHIN);
}

/* Sample s's inputs in f. */
static const void *mp__feed_x(const mp_model *m, const mp__feed *f, size_t s) { return mp__at(f->x, f->xt, s * m->in_size); }

/* The batch in: count samples of f from `first` (through idx when
   shuffled; f NULL: of fit's data on the device) into the input, labels
   and targets. A device backend gets them gathered on the host (int32
   inputs converted on the way) and sent in one copy each. */
static void mp__gather(mp_model *m, const mp__feed *f, const size_t *idx, size_t first, size_t count) {
    size_t i, outs = mp__last(m)->out_size, in = m->in_size, rows = mp__loss_rows(m);
    if (!f) {
        mp__take_uploaded(m, first, count);
    } else if (idx && m->data_block) { /* the data on the device: nothing crosses */
        m->be->gather(m->ctx, m->data_batch, m->data_x, m->data_idx + first, count, in * sizeof(float));
        m->be->cast(m->ctx, m->input, mp__input_dtype(m), m->data_batch, MP_FLOAT32, count * in, NULL);
        if (m->data_labels)
            m->be->gather(m->ctx, m->batch_labels, m->data_labels, m->data_idx + first, count, rows * sizeof(int32_t));
        if (m->data_y) m->be->gather(m->ctx, m->batch_y, m->data_y, m->data_idx + first, count, outs * sizeof(float));
    } else if (!idx && (!m->be->device_memory || f->xt == MP_FLOAT32)) {
        mp__send(m, 0, mp__feed_x(m, f, first), f->xt, f->labels ? f->labels + first * rows : NULL,
                 f->y ? f->y + first * outs : NULL, count);
    } else if (!m->be->device_memory) {
        for (i = 0; i < count; i++) {
            size_t s = idx[first + i];
            mp__send(m, i, mp__feed_x(m, f, s), f->xt, f->labels ? f->labels + s * rows : NULL,
                     f->y ? f->y + s * outs : NULL, 1);
        }
    } else {
        const mp__stage *st = &m->stages[m->stage_turn ^= 1];
        if (m->stage_pinned) m->be->host_wait(m->ctx, st->x); /* its last batch has gone */
        for (i = 0; i < count; i++) {
            size_t s = idx ? idx[first + i] : first + i;
            if (f->xt == MP_FLOAT32) memcpy(st->x + i * in, mp__feed_x(m, f, s), in * sizeof(float));
            if (f->xt == MP_INT32) mp__i32_to_f32(st->x + i * in, (const int32_t *)f->x + s * in, in);
            if (f->labels) memcpy(st->labels + i * rows, f->labels + s * rows, rows * sizeof(int32_t));
            if (f->y) memcpy(st->y + i * outs, f->y + s * outs, outs * sizeof(float));
        }
        mp__send(m, 0, st->x, MP_FLOAT32, f->labels ? st->labels : NULL, f->y ? st->y : NULL, count);
    }
}

/* >>custom training loop (see the declaration): the six calls of the guide's
   train_step, with the helpers they share with fit. */
MIXPREC_API mp_status mp_forward(mp_model *m, const mp_data *batch, int training) {
    mp__feed f;
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if (!batch) return mp__fail(m, MP_ERR_NULL, "mp_forward: the batch is NULL");
    memset(&f, 0, sizeof f);
    if ((st = mp__check_x(m, "mp_forward", batch, &f)) != MP_OK) return st;
    if (!m->be->device_memory && (st = mp__check_finite(m, "mp_forward", f.x, f.xt, f.n)) != MP_OK) return st;
    if ((st = mp__prepare(m, f.n)) != MP_OK) return st;
    mp__gather(m, &f, NULL, 0, f.n);
    return mp__run_forward(m, f.n, training != 0);
}

/* The last output where the host can read it: the activations themselves
   on the CPU, a copy in the staging buffer from a device. */
static const void *mp__host_output(const mp_model *m) {
    const mp__layer *l = mp__last(m);
    float *out;
    if (!m->be->device_memory) return l->y;
    out = m->stages[0].out;
    m->be->copy(m->ctx, out, l->y, m->batch * l->out_size * mp__dtypes[l->yt].size, MP_COPY_TO_HOST);
    return out;
}

MIXPREC_API mp_status mp_output(const mp_model *m, mp_tensor *out) {
    const mp__layer *l;
    mp_tensor t;
    if (!m || !out) return MP_ERR_NULL;
    if (!m->batch) return MP_ERR_STATE;
    l = mp__last(m);
    memset(&t, 0, sizeof t);
    t.dtype = l->yt;
    t.rank = l->out_rank + 1;
    t.shape[0] = (int)m->batch;
    memcpy(t.shape + 1, l->out_shape, (size_t)l->out_rank * sizeof(int));
    t.data = (void *)(uintptr_t)mp__host_output(m);
    if (m->be->sync(m->ctx) != MP_OK) return MP_ERR_BACKEND;
    *out = t;
    return MP_OK;
}

/* Waits for the backend; its first error becomes the model's. */
static mp_status mp__sync(mp_model *m) {
    if (m->be->sync(m->ctx) == MP_OK) return MP_OK;
    return mp__fail(m, MP_ERR_BACKEND, "the %s backend failed: %s", m->be->name, m->be->last_error(m->ctx));
}

/* The host's copy of the step state: the metrics out, and the loss scale.
   A device's cast_in found Inf or NaN in the last batch: the model's
   NONFINITE error (no update used that batch: fit checks its data before
   any step, and the custom loop's mp_compute_loss reads the state before
   gradients can be taken). */
static mp_status mp__read_state(mp_model *m) {
    mp_status st;
    m->be->copy(m->ctx, &m->seen, m->state, sizeof m->seen, MP_COPY_TO_HOST);
    if ((st = mp__sync(m)) != MP_OK || !m->seen.bad_input) return st;
    return mp__fail(m, MP_ERR_NONFINITE, "the input of the last mp_forward holds Inf or NaN (found by the %s backend)",
                    m->be->name);
}

/* The compiled loss over the batch in place: labels for sparse
   crossentropy, float targets for the rest. */
static void mp__loss_into(mp_model *m, float *metrics) {
    const mp__layer *l = mp__last(m);
    int sparse = m->compile.loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY, logits = mp__loss_from_logits(m, l);
    const void *pred = l->y;
    mp_dtype pt = l->yt;
    if (logits) { /* the softmax's or sigmoid's input (see mp__loss_from_logits) */
        pred = l->desc.kind == MP_ACTIVATION ? mp__saved_input(l, 0) : l->z;
        pt = l->desc.kind == MP_ACTIVATION ? l->dt : l->yt;
    }
    m->be->loss(m->ctx, m->compile.loss, m->compile.from_logits || logits, pred, pt, l->y, l->yt,
                sparse ? m->batch_labels : NULL, sparse ? NULL : m->batch_y, m->batch * mp__loss_rows(m),
                l->out_size / mp__loss_rows(m), m->dpred, metrics);
}

static mp_status mp__loss(mp_model *m, float *sum, size_t *right) {
    mp_status st;
    mp__loss_into(m, m->state->metrics);
    if ((st = mp__read_state(m)) != MP_OK) return st;
    *sum += m->seen.metrics[0];
    *right += (size_t)m->seen.metrics[1];
    mp__loop_move(m, MP__CALL_LOSS);
    return MP_OK;
}

MIXPREC_API mp_status mp_compute_loss(mp_model *m, const mp_array *y, float *loss, size_t *correct) {
    float sum = 0.0f;
    size_t right = 0;
    mp__feed f;
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if (!y || !loss) return mp__fail(m, MP_ERR_NULL, "mp_compute_loss: %s is NULL", y ? "the loss output" : "y");
    if (!m->compiled) return mp__fail(m, MP_ERR_STATE, "mp_compute_loss: compile() the model before computing a loss");
    if (!m->batch) return mp__fail(m, MP_ERR_STATE, "mp_compute_loss: run mp_forward first");
    memset(&f, 0, sizeof f);
    if ((st = mp__check_y(m, "mp_compute_loss", y, m->batch, &f)) != MP_OK) return st;
    if (f.labels)
        m->be->copy(m->ctx, m->batch_labels, f.labels, m->batch * mp__loss_rows(m) * sizeof(int32_t), MP_COPY_TO_BACKEND);
    else m->be->copy(m->ctx, m->batch_y, f.y, m->batch * mp__last(m)->out_size * sizeof(float), MP_COPY_TO_BACKEND);
    if ((st = mp__loss(m, &sum, &right)) != MP_OK) return st;
    *loss = sum / (float)(m->batch * mp__loss_rows(m));
    if (correct) *correct = right;
    return MP_OK;
}

MIXPREC_API float mp_current_loss_scale(const mp_model *m) {
    return m && m->compiled && m->has_loss_scale ? m->seen.ls.scale : 1.0f;
}

MIXPREC_API const mp_loss_scale *mp_model_loss_scale(const mp_model *m) {
    return m && m->compiled && m->has_loss_scale ? &m->seen.ls : NULL;
}

MIXPREC_API float mp_get_scaled_loss(const mp_model *m, float loss) { return loss * mp_current_loss_scale(m); }

/* The loss scale where the backend reads it; NULL without scaling (1). */
static const float *mp__scale(const mp_model *m) { return m->has_loss_scale ? &m->state->ls.scale : NULL; }

/* The backward pass, the layers in reverse order: each writes its inputs'
   gradients, and the share of an output read by several layers is added
   to what the others wrote (mp__adds_share). */
MIXPREC_API mp_status mp_compute_scaled_gradients(mp_model *m) {
    int i, k;
    const mp__layer *last;
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if ((st = mp__loop_check(m, MP__CALL_GRADIENTS)) != MP_OK) return st;
    m->grads_ready = 0; /* float32 layers' g is their gc: overwritten now */
    last = mp__last(m);
    m->be->scale_cast(m->ctx, last->dy, last->yt, m->dpred, m->batch * last->out_size, mp__scale(m));
    for (i = m->n_layers - 1; i >= 0; i--) {
        mp__layer *l = &m->layers[i];
        mp__kinds[l->desc.kind].backward(m, l, m->batch, l->dy, l->dx);
        for (k = 0; k < l->n_in; k++)
            if (l->add_dx[k]) {
                const mp__layer *from = &m->layers[l->in[k]];
                m->be->elementwise(m->ctx, MP_EW_ADD, from->dy, from->yt, from->dy, from->yt, l->dx[k], l->xt[k], 0.0f,
                                   m->batch * l->in_sizes[k]);
            }
        if (m->num && (st = mp__numerics_backward(m, i, l->dx[0])) != MP_OK) return st;
    }
    mp__loop_move(m, MP__CALL_GRADIENTS);
    return MP_OK;
}

/* Whether layer l has weights within [lo, hi) of the model's layout (w's
   and g's): those are its [*first, *end), and it starts at *at. */
static int mp__layer_span(const mp_model *m, const mp__layer *l, size_t lo, size_t hi, size_t *at, size_t *first,
                          size_t *end) {
    if (!mp__params(l)) return 0; /* (no w to offset) */
    *at = (size_t)(l->w - m->w);
    if (*at >= hi || *at + mp__params(l) <= lo) return 0;
    *first = *at > lo ? 0 : lo - *at;
    *end = mp__min(*at + mp__params(l), hi) - *at;
    return 1;
}

/* The fused unscale-and-check of the model's gradients [lo, hi) (g's
   layout) into to[0, hi - lo), OR-ing into the found-Inf flag: from each
   layer's gc in its compute dtype (from NULL), or from `from` laid out as
   to, in ft (to itself, in place; the sum). */
static void mp__unscale_span(mp_model *m, float *to, const void *from, mp_dtype ft, size_t lo, size_t hi,
                             const float *scale) {
    size_t a, i0, i1, at;
    int i;
    for (i = 0; i < m->n_layers; i++) {
        mp__layer *l = &m->layers[i];
        if (!mp__layer_span(m, l, lo, hi, &a, &i0, &i1)) continue;
        at = a + i0 - lo; /* where the layer's part lies in to (and from) */
        m->be->unscale_check(m->ctx, to + at, from ? mp__at(from, ft, at) : mp__at(l->gc, l->wt, i0),
                             from ? ft : l->wt, i1 - i0, scale, &m->state->found_inf);
    }
}

/* In one process (no sum over ranks) and without the diagnostics (which
   read them), a 16-bit layer's float32 gradients are deferred: unscaling
   only checks them, the optimizer widens and unscales them as it reads
   them (one pass where writing the float32 copy takes three: read, write,
   read again), and mp_get_gradients writes the copy when asked, by the
   step's scale (kept in step_scale: apply may change the scale). A
   float32 layer's gradients are unscaled in place as before (nothing to
   do without a loss scale). */
static int mp__deferred(const mp_model *m, const mp__layer *l) { return m->grads_deferred && l->gc != l->g; }

/* The one-process unscale-and-check: in place, or the check alone where deferred. */
static void mp__unscale_local(mp_model *m) {
    int i;
    m->grads_deferred = !m->num && !m->acc; /* accumulation adds the float32 gradients */
    m->be->zero(m->ctx, &m->state->found_inf, sizeof(int));
    if (m->grads_deferred && m->has_loss_scale)
        m->be->copy(m->ctx, &m->state->step_scale, mp__scale(m), sizeof(float), MP_COPY_WITHIN);
    for (i = 0; i < m->n_layers; i++) {
        mp__layer *l = &m->layers[i];
        float *to = mp__deferred(m, l) ? NULL : l->g;
        int widen = to && l->gc != l->g; /* a 16-bit layer whose copy is written now (the diagnostics') */
        if (mp__params(l) && (m->has_loss_scale || widen)) /* else nothing to unscale or check */
            m->be->unscale_check(m->ctx, to, l->gc, l->wt, mp__params(l), mp__scale(m), &m->state->found_inf);
    }
}

/* The deferred float32 gradients written (mp_get_gradients); again each
   time, from gradients that stay as they were. Their Inf/NaN test ORs the
   flag with what the check already put there. */
static void mp__write_deferred(const mp_model *m) {
    int i;
    for (i = 0; i < m->n_layers; i++) {
        const mp__layer *l = &m->layers[i];
        if (mp__deferred(m, l) && mp__params(l))
            m->be->unscale_check(m->ctx, l->g, l->gc, l->wt, mp__params(l),
                                 m->has_loss_scale ? &m->state->step_scale : NULL, &m->state->found_inf);
    }
}

/* Where the update of layer l's weights from `from` reads their
   gradients (*g, in *gt, unscaled by *scale): `sum` (theirs, summed over
   the ranks and scaled, in st), or where sum is NULL the layer's own
   float32 gradients, or its scaled ones in the compute dtype where those
   are deferred (mp__deferred). */
static void mp__grad_source(mp_model *m, const mp__layer *l, size_t from, const void *sum, mp_dtype st,
                            const void **g, mp_dtype *gt, const float **scale) {
    int deferred = !sum && mp__deferred(m, l);
    *g = sum ? sum : deferred ? mp__at(l->gc, l->wt, from) : (const void *)(l->g + from);
    *gt = sum ? st : deferred ? l->wt : MP_FLOAT32;
    *scale = sum || deferred ? mp__scale(m) : NULL;
}

/* The gradients' sum of squares for clipping by norm: layer l's [from,
   to) added to the backend's sum. */
static void mp__sum_squares(mp_model *m, const mp__layer *l, size_t from, size_t to) {
    const void *g;
    mp_dtype gt;
    const float *scale;
    mp__grad_source(m, l, from, NULL, MP_FLOAT32, &g, &gt, &scale);
    m->be->sum_squares(m->ctx, &m->state->sum_squares, g, gt, to - from, scale);
}

/* A layer's trainable variables, Keras's (what clipnorm clips and weight
   decay excludes one by one): the k-th weight of mp__layer_weights is its
   weights [*first, *end), starting at *copy in its copy wc (the bias or
   beta after a kernel or gamma may lie apart there, mp__copy_run); 0 past
   the last. */
static int mp__layer_var(const mp__layer *l, int k, size_t *first, size_t *end, size_t *copy) {
    mp_weight_info w[MP__LAYER_WEIGHTS];
    int i, n = mp__layer_weights(l, w);
    if (k >= n || !w[k].trainable) return 0;
    for (*first = 0, i = 0; i < k; i++) *first += mp__weight_size(&w[i]);
    *end = *first + mp__weight_size(&w[k]);
    *copy = l->n_bias && *first == l->n_kernel ? l->bias_at : *first;
    return 1;
}

static int mp__layer_var_count(const mp__layer *l) {
    size_t first, end, copy;
    int k = 0;
    while (mp__layer_var(l, k, &first, &end, &copy)) k++;
    return k;
}

/* The update of layer l's weights [from, to), part of its k-th variable,
   writing their copy at wc (NULL: none), from the gradients
   mp__grad_source names. Without loss scaling the step is applied
   whatever it holds, as Keras; with it, the backend decides from its
   found-Inf flag (nothing is read back). The variable's weight decay and
   the clipping's sum of squares go with the step. */
static void mp__update_part(mp_model *m, const mp__layer *l, int k, size_t from, size_t to, void *wc,
                            const void *sum, mp_dtype st) {
    size_t off = (size_t)(l->w - m->w) + from;
    mp_opt_step step = m->opt;
    const void *g;
    mp_dtype gt;
    const float *scale;
    mp__grad_source(m, l, from, sum, st, &g, &gt, &scale);
    step.weight_decay = l->no_decay >> k & 1u ? 0.0f : m->opt.cfg.weight_decay;
    step.sum_squares = m->opt.cfg.clipnorm > 0.0f || m->opt.cfg.global_clipnorm > 0.0f ? &m->state->sum_squares : NULL;
    m->be->optimizer_update(m->ctx, &step, l->w + from, g, gt, scale, m->s1 ? m->s1 + off : NULL,
                            m->s2 ? m->s2 + off : NULL, to - from, wc, l->wt,
                            m->has_loss_scale ? &m->state->found_inf : NULL);
}

/* The update of the weights [lo, hi) (g's layout), a variable at a time
   (each writes its own part of its layer's copy in its dtype); sum NULL
   or [lo, hi)'s summed gradients (mp__grad_source). With clipnorm each
   whole variable's sum of squares is taken first (sum is then NULL: norms
   are not taken piece by piece, mp__can_update_as_summed). */
static void mp__update_span(mp_model *m, const void *sum, mp_dtype st, size_t lo, size_t hi) {
    int i, k;
    for (i = 0; i < m->n_layers; i++) {
        mp__layer *l = &m->layers[i];
        void *wc = l->wc != l->w && m->casts_fresh ? l->wc : NULL;
        size_t a, from, to, v0, v1, at, f, t;
        if (!mp__layer_span(m, l, lo, hi, &a, &from, &to)) continue;
        for (k = 0; mp__layer_var(l, k, &v0, &v1, &at); k++) {
            f = from > v0 ? from : v0;
            t = to < v1 ? to : v1;
            if (f >= t) continue;
            if (m->opt.cfg.clipnorm > 0.0f) {
                m->be->zero(m->ctx, &m->state->sum_squares, sizeof(float));
                mp__sum_squares(m, l, v0, v1);
            }
            mp__update_part(m, l, k, f, t, wc ? mp__at_mut(wc, l->wt, at + f - v0) : NULL,
                            sum ? mp__at(sum, st, a + f - lo) : NULL, st);
        }
    }
}

/* The step's learning rate (a schedule's, at this step) and iteration (a
   skipped step still counts one, as tf_keras), before its updates. */
static void mp__begin_update(mp_model *m) {
    m->opt.cfg.learning_rate = mp_model_learning_rate(m);
    m->opt.iteration++;
}

/* After the step's updates, which unscale by this step's scale: the loss
   scale's next state. */
static void mp__end_update(mp_model *m) {
    if (m->has_loss_scale) m->be->loss_scale_update(m->ctx, &m->state->ls, &m->state->found_inf);
    mp__loop_move(m, MP__CALL_APPLY);
}

/* Gradient accumulation (mp_optimizer_desc.gradient_accumulation_steps
   N): whether this step updates. A step with Inf or NaN under loss
   scaling is dropped (the flag read back); a finite one adds its float32
   gradients g to the accumulators, or, as the N-th, leaves g = (g + acc)
   * (1 / N) for the update and zeroes them. */
static mp_status mp__accumulate(mp_model *m, int *update) {
    float inv_n = 1.0f / (float)m->opt.cfg.gradient_accumulation_steps;
    int flag = 0, last = m->opt.accumulated + 1 >= (uint64_t)m->opt.cfg.gradient_accumulation_steps, i;
    mp_status st;
    *update = 0;
    if (m->has_loss_scale) {
        m->be->copy(m->ctx, &flag, &m->state->found_inf, sizeof flag, MP_COPY_TO_HOST);
        if ((st = mp__sync(m)) != MP_OK) return st;
        if (flag) return MP_OK;
    }
    for (i = 0; i < m->n_layers; i++) {
        const mp__layer *l = &m->layers[i];
        float *acc, *to;
        if (!mp__params(l)) continue; /* (no w to offset) */
        acc = m->acc + (l->w - m->w), to = last ? l->g : acc;
        m->be->elementwise(m->ctx, MP_EW_ADD, to, MP_FLOAT32, l->g, MP_FLOAT32, acc, MP_FLOAT32, 0.0f, mp__params(l));
        if (last) m->be->elementwise(m->ctx, MP_EW_SCALE, l->g, MP_FLOAT32, l->g, MP_FLOAT32, NULL, MP_FLOAT32, inv_n,
                                     mp__params(l));
    }
    if (last) m->be->zero(m->ctx, m->acc, m->n_params * sizeof(float));
    m->opt.accumulated = last ? 0 : m->opt.accumulated + 1;
    *update = last;
    return MP_OK;
}

/* Queues the step's update: with global_clipnorm, first the sum of the
   squares of every gradient. With accumulation, a step that only
   accumulates moves the loss scale alone. */
static mp_status mp__apply(mp_model *m) {
    int i, update = 1;
    mp_status st;
    if (m->acc && (st = mp__accumulate(m, &update)) != MP_OK) return st;
    if (update) {
        mp__begin_update(m);
        if (m->opt.cfg.global_clipnorm > 0.0f) {
            m->be->zero(m->ctx, &m->state->sum_squares, sizeof(float));
            for (i = 0; i < m->n_layers; i++)
                if (mp__params(&m->layers[i])) mp__sum_squares(m, &m->layers[i], 0, mp__params(&m->layers[i]));
        }
        mp__update_span(m, NULL, MP_FLOAT32, 0, m->n_params);
    }
    m->applied = update;
    mp__end_update(m);
    return MP_OK;
}

/* Whether any rank's gradients hold Inf or NaN, as the check of their
   sum would find (mp__update_as_summed), into every rank's found-Inf
   flag: each rank tests its own (none where the batch's tail left it no
   sample), then the flags are summed over the ranks. Without a loss
   scale nothing reads it: the step is applied whatever it holds. */
static mp_status mp__found_inf_anywhere(mp_model *m, size_t batch) {
    int i, flag = 0;
    float any;
    mp_status st;
    m->be->zero(m->ctx, &m->state->found_inf, sizeof(int));
    if (!m->has_loss_scale) return MP_OK;
    for (i = 0; i < m->n_layers && batch; i++) {
        const mp__layer *l = &m->layers[i];
        if (mp__params(l)) m->be->unscale_check(m->ctx, NULL, l->gc, l->wt, mp__params(l), NULL, &m->state->found_inf);
    }
    m->be->copy(m->ctx, &flag, &m->state->found_inf, sizeof flag, MP_COPY_TO_HOST);
    if ((st = mp__sync(m)) != MP_OK) return st;
    any = (float)flag;
    if ((st = mp__comm_host(m, &any, sizeof any, 1, "the found-Inf flags' all-reduce")) != MP_OK) return st;
    flag = any > 0.0f;
    m->be->copy(m->ctx, &m->state->found_inf, &flag, sizeof flag, MP_COPY_TO_BACKEND);
    return MP_OK;
}

/* Whether fit's step over ranks can update from each piece of the sum as
   it lands (mp__sum_into_update): where a host communicator
   sums (a piece in cache, no float32 copy of the gradients written and
   read back; mp_get_gradients then has none), nothing reads g (the
   diagnostics do), and the found-Inf flag can be known before the first
   piece: without a loss scale there is none; with one, the ranks' own
   checks agree with the check of the sum where every layer's gradients
   are 16-bit and the scale is at least 1. A 16-bit value's share of the
   batch, a float32 sum of such shares over fewer than 2^14 ranks (each
   rounding adds at most 2^-24 of it) and that sum divided by a scale of
   at least 1 (the 16-bit wire rounding it as well) stay below FLT_MAX
   when every part is finite: bfloat16's largest finite value is 2^-8
   below it, float16's far below. A float32 layer's sum can overflow
   where its parts do not. The scale never falls below the lesser of the
   last one read and min_scale. This rank's answer, which fit's ranks
   agree on at its start (mp__agree_as_summed: the diagnostics are each
   rank's own); the scale, read alike on every rank, is checked each step
   (mp__update_as_summed). */
static int mp__can_update_as_summed(const mp_model *m) {
    int i;
    if (m->desc.comm->device_memory || m->num || m->acc) return 0; /* accumulation adds the sum */
    if (m->opt.cfg.clipnorm > 0.0f || m->opt.cfg.global_clipnorm > 0.0f) return 0; /* a norm needs the whole sum */
    if (!m->has_loss_scale) return 1;
    if (m->ranks >= 1 << 14 || m->seen.ls.config.min_scale < 1.0f) return 0;
    for (i = 0; i < m->n_layers; i++)
        if (mp__params(&m->layers[i]) && m->layers[i].dt == MP_FLOAT32) return 0;
    return 1;
}

/* m->as_summed: whether every rank can (a rank that went its own way
   would wait in a collective the others never make). */
static mp_status mp__agree_as_summed(mp_model *m) {
    float cannot = (float)!mp__can_update_as_summed(m);
    mp_status st = mp__comm_host(m, &cannot, sizeof cannot, 1, "agreeing on fit's step");
    m->as_summed = st == MP_OK && cannot == 0.0f;
    return st;
}

/* This step's choice (see mp__can_update_as_summed). */
static int mp__update_as_summed(const mp_model *m) {
    return m->as_summed && (!m->has_loss_scale || m->seen.ls.scale >= 1.0f);
}

/* Data-parallel (>>communicator): this rank's gradients in float32 over
   its share of the global batch (zeros when the batch's tail left it no
   sample), summed over the ranks, then unscaled and checked into g: an
   Inf on any rank is in every rank's sum, so every rank skips alike (a
   rank's own Inf, flagged on the way in, is in the sum too). Where the
   communicator has a sum buffer, a piece at a time through it (no copy
   in or out, the piece in cache); else the whole model in g (or the
   16-bit grad16). With `update` (mp__sum_into_update) each piece's sum
   goes into the optimizer instead of g, the found-Inf flag already agreed
   (the way in then flags only what that check found). */
static mp_status mp__reduce_gradients(mp_model *m, size_t batch, size_t global, int update) {
    const mp_communicator *c = m->desc.comm;
    mp_dtype wire = m->desc.allreduce_dtype;
    size_t bytes = 0, piece = m->n_params, at;
    void *shared = NULL;
    float share = batch ? (float)global / (float)batch : 1.0f; /* exact for equal shares of a power-of-two batch */
    mp_status st;
    if (c->sum_buffer) {
        if ((st = mp__comm_ready(m)) != MP_OK) return st; /* nothing queued reads it still */
        shared = c->sum_buffer(c->ctx, &bytes);
        if (shared && bytes / mp_dtype_size(wire)) piece = bytes / mp_dtype_size(wire);
        else shared = NULL;
    }
    m->be->copy(m->ctx, &m->state->share, &share, sizeof share, MP_COPY_TO_BACKEND);
    if (!update) m->be->zero(m->ctx, &m->state->found_inf, sizeof(int));
    for (at = 0; at < m->n_params; at += piece) {
        size_t len = mp__min(piece, m->n_params - at);
        float *part = shared && wire == MP_FLOAT32 ? (float *)shared : m->g + at; /* this rank's share */
        void *sum = wire == MP_FLOAT32 ? (void *)part : shared ? shared : m->grad16;
        if (batch) mp__unscale_span(m, part, NULL, MP_FLOAT32, at, at + len, &m->state->share);
        else m->be->zero(m->ctx, part, len * sizeof(float));
        if (wire != MP_FLOAT32) m->be->scale_cast(m->ctx, sum, wire, part, len, NULL); /* divided, then rounded */
        if ((st = mp__comm_sum(m, sum, wire, len, "the gradients' all-reduce")) != MP_OK) return st;
        if (update) mp__update_span(m, sum, wire, at, at + len);
        else mp__unscale_span(m, m->g + at, sum, wire, at, at + len, mp__scale(m));
    }
    return MP_OK;
}

/* fit's step over ranks from its gradients on (mp__update_as_summed): the
   found-Inf flag agreed, then the update as mp__apply's, from each piece
   of the sum as it lands. */
static mp_status mp__sum_into_update(mp_model *m, size_t batch, size_t global) {
    mp_status st;
    if ((st = mp__found_inf_anywhere(m, batch)) != MP_OK) return st;
    mp__begin_update(m);
    if ((st = mp__reduce_gradients(m, batch, global, 1)) != MP_OK) return st;
    mp__loop_move(m, MP__CALL_UNSCALE);
    mp__end_update(m);
    return MP_OK;
}

/* batch of the global batch's samples were this rank's (all of them in one process). */
static mp_status mp__unscale_gradients(mp_model *m, size_t batch, size_t global) {
    mp_status st;
    if (m->ranks == 1) mp__unscale_local(m);
    else if ((st = mp__reduce_gradients(m, batch, global, 0)) != MP_OK) return st;
    m->grads_ready = 1;
    mp__loop_move(m, MP__CALL_UNSCALE);
    return m->num ? mp__numerics_unscaled(m) : MP_OK;
}

MIXPREC_API mp_status mp_get_unscaled_gradients(mp_model *m) {
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if ((st = mp__loop_check(m, MP__CALL_UNSCALE)) != MP_OK) return st;
    return mp__unscale_gradients(m, m->batch, m->batch * (size_t)m->ranks);
}

MIXPREC_API mp_status mp_apply_gradients(mp_model *m, int *applied) {
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if ((st = mp__loop_check(m, MP__CALL_APPLY)) != MP_OK) return st;
    if ((st = mp__apply(m)) != MP_OK) return st;
    if ((st = mp__read_state(m)) != MP_OK) return st;
    if (applied) *applied = m->applied && (!m->has_loss_scale || !m->seen.found_inf);
    return MP_OK;
}

MIXPREC_API mp_status mp_set_gradients(mp_model *m, const float *src, size_t n) {
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if (!src) return mp__fail(m, MP_ERR_NULL, "mp_set_gradients needs gradients");
    if ((st = mp__loop_check(m, MP__CALL_APPLY)) != MP_OK) return st;
    if (n != m->n_params)
        return mp__fail(m, MP_ERR_SHAPE, "mp_set_gradients: %z gradients, the model has %z trainable weights", n,
                        m->n_params);
    m->be->copy(m->ctx, m->g, src, n * sizeof(float), MP_COPY_TO_BACKEND);
    m->grads_deferred = 0; /* apply reads these float32 ones */
    m->be->zero(m->ctx, &m->state->found_inf, sizeof(int));
    if (m->has_loss_scale) m->be->unscale_check(m->ctx, NULL, m->g, MP_FLOAT32, n, NULL, &m->state->found_inf);
    return MP_OK;
}

MIXPREC_API float mp_model_learning_rate(const mp_model *m) {
    if (!m || !m->compiled) return 0.0f;
    if (m->opt.cfg.schedule.kind == MP_LR_CONSTANT) return m->opt.cfg.learning_rate;
    if (m->acc) { /* Keras's count of steps at the next update: N per update, this one the N-th */
        uint64_t n = (uint64_t)m->opt.cfg.gradient_accumulation_steps;
        return mp_lr_schedule_value(&m->opt.cfg.schedule, m->opt.iteration * n + n - 1);
    }
    return mp_lr_schedule_value(&m->opt.cfg.schedule, m->opt.iteration);
}

MIXPREC_API mp_status mp_model_set_learning_rate(mp_model *m, float learning_rate) {
    if (!m) return MP_ERR_NULL;
    if (!m->compiled) return mp__fail(m, MP_ERR_STATE, "compile() the model before setting its learning rate");
    if (m->opt.cfg.schedule.kind != MP_LR_CONSTANT)
        return mp__fail(m, MP_ERR_STATE, "the optimizer's learning rate follows a schedule: it cannot be set");
    if (!(learning_rate > 0.0f && learning_rate <= FLT_MAX))
        return mp__fail(m, MP_ERR_ARG, "the learning rate must be finite and positive");
    m->opt.cfg.learning_rate = learning_rate;
    return MP_OK;
}

/* >>fit */
typedef struct mp__clock { long sec, nsec; } mp__clock;

/* Epochs are timed by the wall clock, as Keras's: POSIX's monotonic
   clock where <time.h> declares it, else C11's timespec_get, else POSIX's
   gettimeofday. Only a platform with none of them falls back on clock(),
   processor time (all the threads' together), and the progress line says
   so (MP__WALL_CLOCK 0). */
#if defined(CLOCK_MONOTONIC) || defined(TIME_UTC) || defined(MP__GETTIMEOFDAY)
#define MP__WALL_CLOCK 1
#else
#define MP__WALL_CLOCK 0
#endif

static mp__clock mp__now(void) {
    mp__clock c;
#if defined(CLOCK_MONOTONIC)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    c.sec = (long)ts.tv_sec;
    c.nsec = (long)ts.tv_nsec;
#elif defined(TIME_UTC)
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    c.sec = (long)ts.tv_sec;
    c.nsec = (long)ts.tv_nsec;
#elif defined(MP__GETTIMEOFDAY)
    struct timeval tv;
    gettimeofday(&tv, NULL);
    c.sec = (long)tv.tv_sec;
    c.nsec = (long)tv.tv_usec * 1000L;
#else
    clock_t t = clock();
    c.sec = (long)(t / CLOCKS_PER_SEC);
    c.nsec = (long)((t % CLOCKS_PER_SEC) * (1000000000L / CLOCKS_PER_SEC));
#endif
    return c;
}

static float mp__seconds_since(mp__clock start) {
    mp__clock now = mp__now();
    return (float)(now.sec - start.sec) + (float)(now.nsec - start.nsec) * 1e-9f;
}

/* ceil(n s) for a fraction s in [0, 1), as Keras's split_at = floor(n (1 -
   s)) leaves it, in integers: s is M 2^-k exactly (M < 2^24), n M an 88-bit
   product in two halves. The float s stands for a decimal up to half its
   spacing 2^-k away, so a product less than n 2^-(k+1) (and less than one
   sample) above a whole number counts as that number: 0.1f of 60000
   samples is 6000, as Keras's 0.1 is, not 6001. */
static size_t mp__split_count(size_t n, float s) {
    uint32_t bits = mp__f32_bits(s), e = bits >> 23 & 0xFFu;
    uint64_t mant = (bits & 0x7FFFFFu) | (e ? 0x800000u : 0u), lo, hi, tol = ((uint64_t)n - 1u) >> 1, q;
    int k = e ? 150 - (int)e : 149, rest;
    uint64_t p0 = ((uint64_t)n & 0xFFFFFFFFu) * mant, p1 = ((uint64_t)n >> 32) * mant;
    if (!mant || !n) return 0;
    lo = p0 + (p1 << 32);
    hi = (p1 >> 32) + (lo < p0);
    if (k < 64 && tol > ((uint64_t)1 << k) - 1u) tol = ((uint64_t)1 << k) - 1u; /* k >= 24 */
    hi -= lo < tol;
    lo -= tol;
    if (k >= 128) q = 0, rest = lo || hi;
    else if (k >= 64) q = hi >> (k - 64), rest = lo || (hi & (((uint64_t)1 << (k - 64)) - 1u));
    else q = lo >> k | hi << (64 - k), rest = (lo & (((uint64_t)1 << k) - 1u)) != 0;
    return (size_t)(q + (uint64_t)rest);
}

/* fit's, evaluate's and validation_data's data, checked (>>data): into f. */
static mp_status mp__check_data(mp_model *m, const char *who, const mp_data *d, mp__feed *f) {
    mp_status st;
    memset(f, 0, sizeof *f);
    if (!m->compiled) return mp__fail(m, MP_ERR_STATE, "%s: compile() the model first", who);
    if ((st = mp__check_x(m, who, d, f)) != MP_OK) return st; /* before the targets are read */
    if ((st = mp__check_y(m, who, &d->y, f->n, f)) != MP_OK) return st;
    return mp__check_finite(m, who, f->x, f->xt, f->n);
}

/* Whether any array of d is given (validation_data: zero is none). */
static int mp__data_given(const mp_data *d) {
    int i, any = d->y.data != NULL;
    for (i = 0; i < MP_MAX_INPUTS; i++) any |= d->x[i].data != NULL;
    return any;
}

/* Mean loss and accuracy over samples [first, end) of f in inference mode;
   f NULL: of fit's data on the device (validation), taken there. */
static mp_status mp__evaluate_range(mp_model *m, const mp__feed *f, size_t first, size_t end, size_t batch,
                                    float *loss, float *accuracy) {
    float sum = 0.0f;
    size_t right = 0, s;
    mp_status st = MP_OK;
    for (s = first; s < end && st == MP_OK; s += batch) {
        size_t b = mp__min(batch, end - s);
        mp__gather(m, f, NULL, s, b);
        mp__run_forward(m, b, 0);
        st = mp__loss(m, &sum, &right);
    }
    *loss = sum / (float)((end - first) * mp__loss_rows(m));
    *accuracy = m->compile.metrics ? (float)right / (float)((end - first) * mp__loss_rows(m)) : 0.0f;
    return st;
}

/* Fixed-point with `decimals` digits (at most 6), like printf's %.Nf. */
static void mp__put_float(mp__text *t, float x, int decimals) {
    uint32_t scale = 1, frac;
    float ip;
    int i;
    if (x != x) { mp__put(t, "nan"); return; }
    if (x < 0) { mp__put(t, "-"); x = -x; }
    if (x > 1e18f) { mp__put(t, "inf"); return; }
    for (i = 0; i < decimals; i++) scale *= 10u;
    ip = floorf(x);
    frac = (uint32_t)((x - ip) * (float)scale + 0.5f);
    if (frac >= scale) { frac -= scale; ip += 1.0f; }
    mp__put_uint(t, (uint64_t)ip, 0);
    if (decimals > 0) {
        char d[8];
        mp__put(t, ".");
        for (i = decimals - 1; i >= 0; i--) { d[i] = (char)('0' + (int)(frac % 10u)); frac /= 10u; }
        d[decimals] = 0;
        mp__put(t, d);
    }
}

#ifndef MIXPREC_NO_STDIO
/* Keras's number format: %.4f, or %.4e for magnitudes up to 1e-3. */
static void mp__put_number(mp__text *t, float v, int decimals) {
    if (fabsf(v) > 1e-3f || v == 0.0f || v != v) {
        mp__put_float(t, v, decimals);
    } else {
        int e = 0;
        float a = fabsf(v);
        while (a < 1.0f) { a *= 10.0f; e--; }
        mp__put_float(t, v < 0 ? -a : a, decimals);
        mp__put(t, e < -9 ? "e-" : "e-0");
        mp__put_int(t, -e);
    }
}

static void mp__put_metric(mp__text *t, const char *name, float v) {
    mp__put(t, " - ");
    mp__put(t, name);
    mp__put(t, ": ");
    mp__put_number(t, v, 4);
}

/* A CSV log row (the columns are under mp_csv_logger). */
static void mp__csv_row(FILE *f, const char *kind, int epoch, size_t step, const mp_logs *lg, int has_val) {
    char buf[256];
    mp__text t;
    t.buf = buf;
    t.cap = sizeof buf;
    t.len = 0;
    mp__put(&t, kind);
    mp__put(&t, ",");
    mp__put_int(&t, epoch);
    mp__put(&t, ",");
    mp__put_uint(&t, step, 0);
    mp__put(&t, ",");
    mp__put_number(&t, lg->loss, 6);
    mp__put(&t, ",");
    mp__put_number(&t, lg->accuracy, 6);
    mp__put(&t, ",");
    if (has_val) { mp__put_number(&t, lg->val_loss, 6); mp__put(&t, ","); mp__put_number(&t, lg->val_accuracy, 6); }
    else mp__put(&t, ",");
    mp__put(&t, ",");
    mp__put_number(&t, lg->loss_scale, 1);
    mp__put(&t, ",");
    mp__put_uint(&t, lg->skipped_steps, 0);
    mp__put(&t, "\n");
    fputs(buf, f);
}

/* Keras's progress bar after `step` of `total` steps (see mp_progbar_logger). */
static void mp__progress_show(mp_progbar_logger *p, size_t step, size_t total, const mp_logs *lg, int has_acc,
                              int has_val) {
    char buf[320];
    mp__text t;
    size_t width = 30, filled = step * width / total, i, digits = 1, d;
    mp__clock start;
    float elapsed;
    int done = step == total;
    start.sec = p->start_sec;
    start.nsec = p->start_nsec;
    elapsed = mp__seconds_since(start);
    t.buf = buf;
    t.cap = sizeof buf;
    t.len = 0;
    if (p->live) mp__put(&t, "\r");
    for (d = total; d >= 10; d /= 10) digits++;
    for (d = step, i = 1; d >= 10; d /= 10) i++;
    for (; i < digits; i++) mp__put(&t, " ");
    mp__put_uint(&t, step, 0);
    mp__put(&t, "/");
    mp__put_uint(&t, total, 0);
    mp__put(&t, " [");
    for (i = 0; i < width; i++) mp__put(&t, i + 1 < filled || (done && i < filled) ? "=" : i + 1 == filled ? ">" : ".");
    mp__put(&t, "]");
    if (done) {
        float per_step = elapsed / (float)total;
        mp__put(&t, " - ");
        mp__put_float(&t, elapsed, 0);
        mp__put(&t, MP__WALL_CLOCK ? "s " : "s of processor time, ");
        if (per_step >= 1.0f) { mp__put_float(&t, per_step, 0); mp__put(&t, "s/step"); }
        else if (per_step >= 1e-3f) { mp__put_float(&t, per_step * 1e3f, 0); mp__put(&t, "ms/step"); }
        else { mp__put_float(&t, per_step * 1e6f, 0); mp__put(&t, "us/step"); }
    } else {
        mp__put(&t, " - ETA: ");
        mp__put_float(&t, elapsed / (float)step * (float)(total - step), 0);
        mp__put(&t, "s");
    }
    mp__put_metric(&t, "loss", lg->loss);
    if (has_acc) mp__put_metric(&t, "accuracy", lg->accuracy);
    if (done && has_val) {
        mp__put_metric(&t, "val_loss", lg->val_loss);
        if (has_acc) mp__put_metric(&t, "val_accuracy", lg->val_accuracy);
    }
    d = t.len;
    while (p->live && t.len < p->last_len) mp__put(&t, " ");
    p->last_len = d;
    if (done) mp__put(&t, "\n");
    fputs(buf, stdout);
    fflush(stdout);
}

static int mp__live_bar(mp_verbose v) {
    if (v == MP_VERBOSE_BAR) return 1;
#if defined(__unix__) || defined(__APPLE__)
    if (v == MP_VERBOSE_AUTO) return isatty(1);
#endif
    return 0;
}
#endif

static void mp__shuffle(size_t *idx, size_t n, uint64_t *rng) {
    size_t i;
    for (i = n; i > 1; i--) { /* Fisher-Yates */
        size_t j = (size_t)(mp__splitmix(rng) % (uint64_t)i), t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

/* fit's data, checked: the training samples are train's first n_train;
   validation reads [val_first, val_end) of val (validation_data's, or
   train's last part that validation_split set apart). */
typedef struct mp__fit_data {
    mp__feed train, val;
    size_t n_train, val_first, val_end;
    int split;    /* val is train's part past n_train (uploaded with it where fit's data is on the device) */
    size_t batch; /* the global batch: batch_size (0: 32), at most n_train */
} mp__fit_data;

/* fit's data on a device backend that can hold it in half its free memory
   (and host_data unset, and float32 x: int32 x is converted on the host
   as it goes, mp__gather): uploaded once, then each epoch's order, so
   that a step gathers its batch there and copies nothing in. Else (or
   when the allocation fails) nothing: batches go from the host. */
static void mp__upload_data(mp_model *m, const mp_fit_desc *d, const mp__fit_data *fd) {
    const mp__feed *f = &fd->train;
    size_t n = f->n, in = m->in_size, outs = mp__last(m)->out_size, need;
    mp__arena a = {NULL, 0, 0};
    int i;
    if (d->host_data || !m->be->device_memory || !m->be->gather || !m->be->free_memory || n > UINT32_MAX ||
        f->xt != MP_FLOAT32)
        return;
    for (i = 0; i < 2; i++) {
        m->data_x = (const float *)mp__carve(&a, n, in * sizeof(float));
        m->data_labels = f->labels ? (const int32_t *)mp__carve(&a, n, mp__loss_rows(m) * sizeof(int32_t)) : NULL;
        m->data_y = f->y ? (const float *)mp__carve(&a, n, outs * sizeof(float)) : NULL;
        m->data_idx = (uint32_t *)mp__carve(&a, fd->n_train, sizeof(uint32_t));
        m->data_batch = (float *)mp__carve(&a, fd->batch, in * sizeof(float));
        need = a.used;
        if (i == 1) break;
        if (a.overflow || need > m->be->free_memory(m->ctx) / 2 || !(a.base = (unsigned char *)m->be->alloc(m->ctx, need)))
            return;
        m->data_block = a.base;
        a.used = 0;
    }
    m->be->copy(m->ctx, (void *)(uintptr_t)m->data_x, f->x, n * in * sizeof(float), MP_COPY_TO_BACKEND);
    /* fit's batches come from here now, scanned on the host: a bad batch an
       earlier mp_forward sent must not fail them (mp__read_state) */
    m->be->zero(m->ctx, &m->state->bad_input, sizeof(int));
    if (m->data_labels)
        m->be->copy(m->ctx, (void *)(uintptr_t)m->data_labels, f->labels, n * mp__loss_rows(m) * sizeof(int32_t),
                    MP_COPY_TO_BACKEND);
    if (m->data_y)
        m->be->copy(m->ctx, (void *)(uintptr_t)m->data_y, f->y, n * outs * sizeof(float), MP_COPY_TO_BACKEND);
#ifndef MIXPREC_NO_STDIO
    if (d->verbose != MP_VERBOSE_SILENT)
        printf("fit: the data (%.1f MB) stays on the %s backend: batches are gathered there (host_data = 1: from the host)\n",
               (double)need / 1e6, m->be->name);
#endif
}

/* This epoch's order, to the device (as 32-bit indices, through u32). */
static void mp__send_order(mp_model *m, const size_t *idx, uint32_t *u32, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) u32[i] = (uint32_t)idx[i];
    m->be->copy(m->ctx, m->data_idx, u32, n * sizeof(uint32_t), MP_COPY_TO_BACKEND);
}

static void mp__free_data(mp_model *m) {
    m->be->free(m->ctx, m->data_block);
    m->data_block = NULL;
}

/* One training step on the gathered batch: the custom loop's six lines,
   with nothing read back (a GPU runs on while the host gathers the next
   batch): the batch's metrics go to the metric log. batch of the global
   batch's samples are this rank's; a rank the batch's tail left none logs
   nothing and adds zero gradients to the sum (>>communicator). */
static mp_status mp__train_step(mp_model *m, size_t batch, size_t global) {
    mp_status st;
    if (batch) {
        if ((st = mp__run_forward(m, batch, 1)) != MP_OK) return st;
        m->metric_batch[m->metric_count] = batch * mp__loss_rows(m); /* the rows the loss averaged */
        mp__loss_into(m, m->metric_log + 2 * m->metric_count++);
        mp__loop_move(m, MP__CALL_LOSS);
        if ((st = mp_compute_scaled_gradients(m)) != MP_OK) return st;
    } else {
        m->loop = MP__LOOP_GRADIENTS;
    }
    if (mp__update_as_summed(m)) return mp__sum_into_update(m, batch, global);
    if ((st = mp__unscale_gradients(m, batch, global)) != MP_OK) return st;
    return mp__apply(m);
}

/* The logged steps' metrics and the step state, read; added in step order
   as the steps were (a batch's mean loss weighed by its size, as Keras). */
static mp_status mp__read_log(mp_model *m, float *sum, size_t *right, size_t *seen) {
    float logged[MP__METRIC_LOG * 2];
    size_t i, n = m->metric_count;
    mp_status st;
    m->metric_count = 0;
    m->be->copy(m->ctx, logged, m->metric_log, n * 2 * sizeof(float), MP_COPY_TO_HOST);
    if ((st = mp__read_state(m)) != MP_OK) return st;
    for (i = 0; i < n; i++) {
        float b = (float)m->metric_batch[i];
        *sum += logged[2 * i] / b * b; /* the batch's mean loss weighed by its size */
        *right += (size_t)logged[2 * i + 1];
        *seen += m->metric_batch[i];
    }
    return MP_OK;
}

/* mp__evaluate_range over this rank's part of [first, end), each rank
   batch / ranks samples at a time, summed over the ranks (d NULL: fit's
   data on the device, as there). */
static mp_status mp__evaluate_shared(mp_model *m, const mp__feed *d, size_t first, size_t end, size_t batch,
                                     float *loss, float *accuracy) {
    size_t n = end - first, lo = first + mp__slice_start(n, m->rank, m->ranks), rows = mp__loss_rows(m);
    size_t hi = first + mp__slice_start(n, m->rank + 1, m->ranks);
    float got[2] = {0.0f, 0.0f};
    mp_status st;
    if (m->ranks == 1) return mp__evaluate_range(m, d, first, end, batch, loss, accuracy);
    if (hi > lo) {
        size_t each = (batch + (size_t)m->ranks - 1) / (size_t)m->ranks;
        if ((st = mp__evaluate_range(m, d, lo, hi, each, loss, accuracy)) != MP_OK) return st;
        got[0] = *loss * (float)((hi - lo) * rows);
        got[1] = roundf(*accuracy * (float)((hi - lo) * rows)); /* the rows counted right, exactly */
    }
    if ((st = mp__comm_host(m, got, sizeof got, 1, "the metrics' all-reduce")) != MP_OK) return st;
    *loss = got[0] / (float)(n * rows);
    *accuracy = m->compile.metrics ? got[1] / (float)(n * rows) : 0.0f;
    return MP_OK;
}

/* >>fit: callbacks. Which hook of a callback, by mp__hook's index. */
enum { MP__TRAIN_BEGIN, MP__TRAIN_END, MP__EPOCH_BEGIN, MP__EPOCH_END, MP__BATCH_END };

static mp_callback_fn mp__hook(const mp_callback *c, int which) {
    switch (which) {
    case MP__TRAIN_BEGIN: return c->on_train_begin;
    case MP__TRAIN_END: return c->on_train_end;
    case MP__EPOCH_BEGIN: return c->on_epoch_begin;
    case MP__EPOCH_END: return c->on_epoch_end;
    default: return c->on_batch_end;
    }
}

/* Calls hook `which` of callbacks [0, n) in order; the first failure ends
   the round. A hook that fails without a message of its own gets one. */
static mp_status mp__call_hooks(const mp_callback *cbs, int n, int which, mp_fit_state *s, const mp_logs *lg) {
    static const char *const names[] = {"on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
                                        "on_batch_end"};
    int i;
    for (i = 0; i < n; i++) {
        mp_callback_fn f = mp__hook(&cbs[i], which);
        mp_status st;
        if (!f) continue;
        if (s->status == MP_OK) s->model->error[0] = '\0'; /* after a failure its message stays */
        if ((st = f(cbs[i].user, s, lg)) == MP_OK) continue;
        if (!s->model->error[0]) mp__fail(s->model, st, "callback %d's %s failed", i, names[which]);
        return st;
    }
    return MP_OK;
}

/* The logged value a callback monitors; 0 if there is no such value. */
static int mp__monitored(const char *name, const mp_logs *lg, float *out) {
    static const char *const names[] = {"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"};
    const float v[] = {lg->loss, lg->accuracy, lg->val_loss, lg->val_accuracy, lg->learning_rate};
    int i;
    for (i = 0; i < 5; i++)
        if (strcmp(name, names[i]) == 0) { *out = v[i]; return 1; }
    return 0;
}

/* The monitor's name (NULL: "val_loss"), checked against what fit logs,
   and whether larger is better. */
static mp_status mp__monitor(mp_fit_state *s, const char **name, mp_monitor_mode mode, int *maximise) {
    mp_logs probe;
    float v;
    memset(&probe, 0, sizeof probe);
    if (!*name) *name = "val_loss";
    if (!mp__monitored(*name, &probe, &v) || (strstr(*name, "accuracy") && !s->has_accuracy))
        return mp__fail(s->model, MP_ERR_ARG, "cannot monitor '%s': fit logs loss, val_loss, learning_rate%s", *name,
                        s->has_accuracy ? ", accuracy and val_accuracy" : " (accuracy: compile with the metric)");
    if (strncmp(*name, "val_", 4) == 0 && !s->has_validation)
        return mp__fail(s->model, MP_ERR_ARG, "cannot monitor '%s': fit has no validation data (validation_split)",
                        *name);
    if ((unsigned)mode > (unsigned)MP_MODE_MAX) return mp__fail(s->model, MP_ERR_ARG, "unknown monitor mode %d", (int)mode);
    *maximise = mode == MP_MODE_MAX || (mode == MP_MODE_AUTO && strstr(*name, "acc") != NULL);
    return MP_OK;
}

/* A callback from its hooks, in mp_callback's order. */
static mp_callback mp__callback(mp_callback_fn train_begin, mp_callback_fn train_end, mp_callback_fn epoch_begin,
                                mp_callback_fn epoch_end, mp_callback_fn batch_end, void *user) {
    mp_callback c;
    c.on_train_begin = train_begin;
    c.on_train_end = train_end;
    c.on_epoch_begin = epoch_begin;
    c.on_epoch_end = epoch_end;
    c.on_batch_end = batch_end;
    c.user = user;
    return c;
}

/* Keras's test: `value` improves on `best` by more than |min_delta|. */
static int mp__improves(float value, float best, float min_delta, int maximise) {
    float d = fabsf(min_delta);
    return maximise ? value - d > best : value + d < best;
}

/* >>fit: built-in callbacks (see the declarations): History, EarlyStopping,
   LearningRateScheduler, then those that need stdio: ProgbarLogger,
   CSVLogger, ModelCheckpoint. */
static mp_status mp__history_begin(void *user, mp_fit_state *s, const mp_logs *lg) {
    (void)s;
    (void)lg;
    ((mp_history *)user)->count = 0;
    return MP_OK;
}
static mp_status mp__history_epoch_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_history *h = (mp_history *)user;
    int i = s->epoch - s->initial_epoch;
    if (h->epochs && i < h->capacity) {
        h->epochs[i] = *lg;
        h->count = i + 1;
    }
    return MP_OK;
}
MIXPREC_API mp_callback mp_history_callback(mp_history *h) {
    return mp__callback(mp__history_begin, NULL, NULL, mp__history_epoch_end, NULL, h);
}

static mp_status mp__early_begin(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_early_stopping *es = (mp_early_stopping *)user;
    size_t n = mp_model_param_count(s->model);
    int maximise = 0;
    mp_status st;
    (void)lg;
    if ((st = mp__monitor(s, &es->monitor, es->mode, &maximise)) != MP_OK) return st;
    if (es->patience < 0 || es->start_from_epoch < 0)
        return mp__fail(s->model, MP_ERR_ARG, "EarlyStopping: patience and start_from_epoch must be >= 0");
    es->wait = es->stopped_epoch = 0;
    es->best_epoch = -1;
    es->best = maximise ? -INFINITY : INFINITY;
    es->best_weights = NULL;
    if (es->restore_best_weights && !(es->best_weights = (float *)mp__alloc(n * sizeof(float))))
        return mp__fail(s->model, MP_ERR_ALLOC, "EarlyStopping's copy of the best weights");
    return MP_OK;
}

static mp_status mp__early_epoch_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_early_stopping *es = (mp_early_stopping *)user;
    size_t n = mp_model_param_count(s->model);
    int maximise = es->mode == MP_MODE_MAX || (es->mode == MP_MODE_AUTO && strstr(es->monitor, "acc") != NULL);
    float v = 0.0f;
    mp_status st = MP_OK;
    (void)mp__monitored(es->monitor, lg, &v);
    if (s->epoch < es->start_from_epoch) return MP_OK;
    if (es->best_weights && es->best_epoch < 0) { /* the first weights are the best until one improves */
        es->best_epoch = s->epoch;
        st = mp_model_get_weights(s->model, es->best_weights, n);
    }
    es->wait++;
    if (mp__improves(v, es->best, es->min_delta, maximise)) {
        es->best = v;
        es->best_epoch = s->epoch;
        if (es->best_weights && st == MP_OK) st = mp_model_get_weights(s->model, es->best_weights, n);
        /* the patience restarts only past the baseline too */
        if (!es->baseline || mp__improves(v, *es->baseline, es->min_delta, maximise)) es->wait = 0;
        return st;
    }
    if (es->wait >= es->patience && s->epoch > 0) {
        es->stopped_epoch = s->epoch;
        s->stop_training = 1;
    }
    return st;
}

static mp_status mp__early_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_early_stopping *es = (mp_early_stopping *)user;
    mp_status st = MP_OK;
    (void)lg;
#ifndef MIXPREC_NO_STDIO
    if (es->stopped_epoch > 0 && es->verbose && !s->replica) printf("Epoch %d: early stopping\n", es->stopped_epoch + 1);
#endif
    if (es->best_weights && es->best_epoch >= 0 && s->status == MP_OK) {
#ifndef MIXPREC_NO_STDIO
        if (es->verbose && !s->replica) printf("Restoring model weights from the end of the best epoch: %d.\n", es->best_epoch + 1);
#endif
        st = mp_model_set_weights(s->model, es->best_weights, mp_model_param_count(s->model));
    }
    mp__free(es->best_weights);
    es->best_weights = NULL;
    return st;
}

MIXPREC_API mp_callback mp_early_stopping_callback(mp_early_stopping *es) {
    return mp__callback(mp__early_begin, mp__early_end, NULL, mp__early_epoch_end, NULL, es);
}

static mp_status mp__scheduler_epoch_begin(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_lr_scheduler *ls = (mp_lr_scheduler *)user;
    float lr;
    mp_status st;
    (void)lg;
    if (!ls->schedule) return mp__fail(s->model, MP_ERR_NULL, "LearningRateScheduler: no schedule function");
    lr = ls->schedule(ls->user, s->epoch, mp_model_learning_rate(s->model));
    if ((st = mp_model_set_learning_rate(s->model, lr)) != MP_OK) return st;
#ifndef MIXPREC_NO_STDIO
    if (ls->verbose && !s->replica) {
        char buf[64];
        mp__text t;
        t.buf = buf;
        t.cap = sizeof buf;
        t.len = 0;
        mp__put_number(&t, lr, 6);
        printf("\nEpoch %d: LearningRateScheduler setting learning rate to %s.\n", s->epoch + 1, buf);
    }
#endif
    return MP_OK;
}
MIXPREC_API mp_callback mp_lr_scheduler_callback(mp_lr_scheduler *s) {
    return mp__callback(NULL, NULL, mp__scheduler_epoch_begin, NULL, NULL, s);
}

#ifndef MIXPREC_NO_STDIO
/* Rank 0 prints (>>communicator). */
static int mp__progbar_on(const mp_progbar_logger *p, const mp_fit_state *s) {
    return p->verbose != MP_VERBOSE_SILENT && !s->replica;
}
static mp_status mp__progbar_epoch_begin(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_progbar_logger *p = (mp_progbar_logger *)user;
    mp__clock now = mp__now();
    (void)lg;
    p->live = mp__live_bar(p->verbose);
    p->last_len = 0;
    p->start_sec = now.sec;
    p->start_nsec = now.nsec;
    if (mp__progbar_on(p, s) && s->num_replicas > 1 && s->epoch == s->initial_epoch)
        printf("Data parallel: %d replicas, global batch size %d (%d per replica at most)\n", s->num_replicas,
               (int)s->global_batch, (int)s->replica_batch);
    if (mp__progbar_on(p, s)) printf("Epoch %d/%d\n", s->epoch + 1, s->epochs);
    return MP_OK;
}
static mp_status mp__progbar_batch_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_progbar_logger *p = (mp_progbar_logger *)user;
    if (p->live && s->step + 1 < s->steps && mp__progbar_on(p, s))
        mp__progress_show(p, s->step + 1, s->steps, lg, s->has_accuracy, 0);
    return MP_OK;
}
static mp_status mp__progbar_epoch_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_progbar_logger *p = (mp_progbar_logger *)user;
    if (mp__progbar_on(p, s)) mp__progress_show(p, s->steps, s->steps, lg, s->has_accuracy, s->has_validation);
    return MP_OK;
}
/* A silent bar draws nothing during an epoch, so it takes no batch hook:
   a batch hook makes fit read a device's metrics mid-epoch. */
MIXPREC_API mp_callback mp_progbar_logger_callback(mp_progbar_logger *p) {
    return mp__callback(NULL, NULL, mp__progbar_epoch_begin, mp__progbar_epoch_end,
                        p && p->verbose == MP_VERBOSE_SILENT ? NULL : mp__progbar_batch_end, p);
}

static mp_status mp__csv_begin(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_csv_logger *c = (mp_csv_logger *)user;
    FILE *f;
    (void)lg;
    c->file = NULL;
    if (s->replica) return MP_OK; /* rank 0 writes (>>communicator) */
    if (!c->filename) return mp__fail(s->model, MP_ERR_NULL, "CSVLogger: no filename");
    errno = 0;
    if (!(f = fopen(c->filename, c->append ? "a" : "w")))
        return mp__fail(s->model, MP_ERR_IO, "cannot write the CSV log %s: %s", c->filename, mp__io_reason(errno));
    if (!c->append || ftell(f) == 0)
        fputs("kind,epoch,step,loss,accuracy,val_loss,val_accuracy,loss_scale,skipped_steps\n", f);
    c->file = f;
    return MP_OK;
}
static mp_status mp__csv_batch_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_csv_logger *c = (mp_csv_logger *)user;
    if (c->per_step && c->file) mp__csv_row((FILE *)c->file, "step", s->epoch + 1, (size_t)s->epoch * s->steps + s->step + 1, lg, 0);
    return MP_OK;
}
static mp_status mp__csv_epoch_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    if (((mp_csv_logger *)user)->file) mp__csv_row((FILE *)((mp_csv_logger *)user)->file, "epoch", s->epoch + 1, (size_t)(s->epoch + 1) * s->steps, lg,
                s->has_validation);
    return MP_OK;
}
static mp_status mp__csv_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_csv_logger *c = (mp_csv_logger *)user;
    FILE *f = (FILE *)c->file;
    int bad;
    (void)lg;
    c->file = NULL;
    errno = 0;
    bad = f && (ferror(f) | fclose(f));
    if (bad && s->status == MP_OK) /* the log is short: say so, the weights stand */
        return mp__fail(s->model, MP_ERR_IO, "writing the CSV log %s failed: %s", c->filename, mp__io_reason(errno));
    return MP_OK;
}
MIXPREC_API mp_callback mp_csv_logger_callback(mp_csv_logger *c) {
    return mp__callback(mp__csv_begin, mp__csv_end, NULL, mp__csv_epoch_end, mp__csv_batch_end, c);
}

/* filepath with "{epoch}" or "{epoch:0Nd}" replaced by the epoch, as
   Python's str.format; into a new allocation. */
static char *mp__epoch_path(const char *fmt, int epoch) {
    size_t n = strlen(fmt), i, width = 0, skip = 0;
    const char *at = strstr(fmt, "{epoch");
    char *out;
    mp__text t;
    if (at && at[6] == '}') skip = 7;
    else if (at && at[6] == ':' && at[7] == '0' && at[8] >= '1' && at[8] <= '9' && at[9] == 'd' && at[10] == '}')
        skip = 11, width = (size_t)(at[8] - '0');
    if (n > SIZE_MAX - 32 || !(out = (char *)mp__alloc(n + 32))) return NULL;
    t.buf = out;
    t.cap = n + 32;
    t.len = 0;
    out[0] = '\0';
    for (i = 0; i < n; i++) {
        char ch[2] = {fmt[i], 0};
        if (skip && fmt + i == at) {
            size_t digits = 1, e;
            for (e = (size_t)epoch; e >= 10; e /= 10) digits++;
            for (; digits < width; digits++) mp__put(&t, "0");
            mp__put_int(&t, epoch);
            i += skip - 1;
        } else {
            mp__put(&t, ch);
        }
    }
    return out;
}

static mp_status mp__checkpoint_begin(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_model_checkpoint *c = (mp_model_checkpoint *)user;
    int maximise = 0;
    mp_status st;
    (void)lg;
    if (!c->filepath) return mp__fail(s->model, MP_ERR_NULL, "ModelCheckpoint: no filepath");
    if (c->save_best_only && (st = mp__monitor(s, &c->monitor, c->mode, &maximise)) != MP_OK) return st;
    c->best = maximise ? -INFINITY : INFINITY;
    c->saves = 0;
    return MP_OK;
}

static mp_status mp__checkpoint_epoch_end(void *user, mp_fit_state *s, const mp_logs *lg) {
    mp_model_checkpoint *c = (mp_model_checkpoint *)user;
    char *path = mp__epoch_path(c->filepath, s->epoch + 1), line[160];
    mp__text t;
    mp_status st = MP_OK;
    float v = 0.0f;
    int save = 1;
    if (!path) return mp__fail(s->model, MP_ERR_ALLOC, "ModelCheckpoint's file name");
    t.buf = line;
    t.cap = sizeof line;
    t.len = 0;
    mp__put(&t, "\nEpoch ");
    mp__put_int(&t, s->epoch + 1);
    mp__put(&t, ": ");
    if (c->save_best_only) {
        int maximise = c->mode == MP_MODE_MAX || (c->mode == MP_MODE_AUTO && strstr(c->monitor, "acc") != NULL);
        (void)mp__monitored(c->monitor, lg, &v);
        save = maximise ? v > c->best : v < c->best;
        mp__put(&t, c->monitor);
        mp__put(&t, save ? " improved from " : " did not improve from ");
        mp__put_float(&t, c->best, 5);
        if (save) { mp__put(&t, " to "); mp__put_float(&t, v, 5); mp__put(&t, ", "); }
        if (save) c->best = v;
    }
    if (c->verbose && !s->replica) printf("%s%s%s\n", line, save ? "saving model to " : "", save ? path : "");
    if (save) st = c->save_weights_only ? mp_model_export_weights(s->model, MP_FLOAT32, path) : mp_model_save(s->model, path);
    if (save && st == MP_OK) c->saves++;
    mp__free(path);
    return st;
}

MIXPREC_API mp_callback mp_model_checkpoint_callback(mp_model_checkpoint *c) {
    return mp__callback(mp__checkpoint_begin, NULL, NULL, mp__checkpoint_epoch_end, NULL, c);
}
#endif

/* The user's callbacks, then the built-in ones fit_desc asks for, and their
   state. */
typedef struct mp__fit_callbacks {
    mp_callback *list;
    int n;
    mp_history history;
#ifndef MIXPREC_NO_STDIO
    mp_progbar_logger bar;
    mp_csv_logger csv;
#endif
} mp__fit_callbacks;

static void mp__fit_callbacks_init(const mp_fit_desc *d, int epochs, mp_callback *list, mp__fit_callbacks *c) {
    memset(c, 0, sizeof *c);
    c->list = list;
    if (d->callback_count) memcpy(list, d->callbacks, (size_t)d->callback_count * sizeof(mp_callback));
    c->n = d->callback_count;
    if (d->history) {
        c->history.epochs = d->history;
        c->history.capacity = epochs - d->initial_epoch;
        c->list[c->n++] = mp_history_callback(&c->history);
    }
#ifndef MIXPREC_NO_STDIO
    if (d->csv_path) {
        c->csv.filename = d->csv_path;
        c->csv.per_step = d->csv_per_step;
        c->list[c->n++] = mp_csv_logger_callback(&c->csv);
    }
    c->bar.verbose = d->verbose;
    c->list[c->n++] = mp_progbar_logger_callback(&c->bar);
#endif
}

/* The logs every hook sees, from the model's state now. */
static void mp__fit_logs(mp_model *m, mp_logs *lg) {
    lg->loss_scale = mp_current_loss_scale(m);
    lg->skipped_steps = m->has_loss_scale ? m->seen.ls.skipped_steps : 0;
    lg->learning_rate = mp_model_learning_rate(m);
}

/* The metrics of the steps since the last read, into the epoch's running
   loss and accuracy (lg). */
static mp_status mp__fit_read(mp_model *m, float *sum, size_t *right, size_t *seen, mp_logs *lg) {
    float got[3] = {0.0f, 0.0f, 0.0f}; /* this rank's loss sum, samples right and samples since the last read */
    size_t r = 0, n = 0;
    mp_status st;
    if (m->ranks == 1) {
        st = mp__read_log(m, sum, right, seen);
    } else { /* every rank reports the global figures (>>communicator) */
        st = mp__read_log(m, &got[0], &r, &n);
        got[1] = (float)r; /* exact: a read covers at most MP__METRIC_LOG batches */
        got[2] = (float)n;
        if (st == MP_OK) st = mp__comm_host(m, got, sizeof got, 1, "the metrics' all-reduce");
        *sum += got[0];
        *right += (size_t)got[1];
        *seen += (size_t)got[2];
    }
    lg->loss = *sum / (float)*seen;
    lg->accuracy = m->compile.metrics ? (float)*right / (float)*seen : 0.0f;
    mp__fit_logs(m, lg);
    return st;
}

/* A device's metrics stay there until the host needs them: at the epoch's
   end, when the log is full, and for batch hooks a few times a second (each
   read waits for the device). So on a device backend on_batch_end comes
   after the step of a read, as Keras calls batch hooks once per
   steps_per_execution; on the CPU, after every step. */
static int mp__fit_read_now(const mp_model *m, const mp__fit_callbacks *cb, int last, mp__clock read) {
    int i, hooks = 0;
    if (!m->be->device_memory || last || m->metric_count == MP__METRIC_LOG) return 1;
    if (m->ranks > 1) return 0; /* every rank reads at the same steps: a clock would not agree */
    for (i = 0; i < cb->n; i++) hooks |= cb->list[i].on_batch_end != NULL;
    return hooks && mp__seconds_since(read) >= 0.25f;
}

/* One epoch: its shuffled batches, each a training step and the batch
   hooks, then validation. */
static mp_status mp__fit_epoch(mp_model *m, const mp__fit_data *fd, const mp__fit_callbacks *cb, mp_fit_state *s,
                               const size_t *idx, uint32_t *order, mp_logs *lg) {
    float sum = 0.0f;
    size_t right = 0, seen = 0, batch = fd->batch;
    mp__clock start = mp__now(), read = start;
    mp_status st = MP_OK;
    memset(lg, 0, sizeof *lg);
    if (m->data_block) mp__send_order(m, idx, order, fd->n_train);
    m->metric_count = 0;
    for (s->step = 0; s->step < s->steps && st == MP_OK && !s->stop_training; s->step++) {
        size_t b = mp__min(batch, fd->n_train - s->step * batch); /* the global batch */
        size_t lo = mp__slice_start(b, m->rank, m->ranks), mine = mp__slice_start(b, m->rank + 1, m->ranks) - lo;
        if (mine) mp__gather(m, &fd->train, idx, s->step * batch + lo, mine);
        if ((st = mp__train_step(m, mine, b)) != MP_OK) break;
        if (!mp__fit_read_now(m, cb, s->step + 1 == s->steps, read)) continue;
        if ((st = mp__fit_read(m, &sum, &right, &seen, lg)) != MP_OK) break;
        read = mp__now();
        st = mp__call_hooks(cb->list, cb->n, MP__BATCH_END, s, lg);
    }
    if (st == MP_OK && m->metric_count) st = mp__fit_read(m, &sum, &right, &seen, lg); /* stopped early */
    if (st == MP_OK && s->has_validation) /* the split's samples on the device: validated there */
        st = mp__evaluate_shared(m, m->data_block && fd->split ? NULL : &fd->val, fd->val_first,
                                 fd->val_end, batch, &lg->val_loss, &lg->val_accuracy);
    lg->seconds = mp__seconds_since(start); /* with validation, as Keras's epoch time */
    lg->steps = s->steps;
    lg->ms_per_step = lg->seconds * 1000.0f / (float)s->steps;
    mp__fit_logs(m, lg);
    return st;
}

/* fit's arguments checked, and the run's shape: epochs, steps, the training
   samples and what validates: validation_data when given, else the last
   validation_split of the data, as Keras's. */
static mp_status mp__fit_plan(mp_model *m, const mp_fit_desc *d, mp_fit_state *s, mp__fit_data *fd) {
    int has_val_data = mp__data_given(&d->validation_data);
    size_t want = 0, n;
    mp_status st;
    memset(s, 0, sizeof *s);
    memset(fd, 0, sizeof *fd);
    s->model = m;
    s->epochs = d->epochs ? d->epochs : 1;
    s->initial_epoch = d->initial_epoch;
    if ((st = mp__check_data(m, "fit", &d->data, &fd->train)) != MP_OK) return st;
    if (has_val_data && (st = mp__check_data(m, "validation_data", &d->validation_data, &fd->val)) != MP_OK) return st;
    if ((st = mp__batch_size(m, "fit", d->batch_size, &want)) != MP_OK) return st;
    if (s->epochs < 0) return mp__fail(m, MP_ERR_ARG, "fit: epochs must be positive, got %d", s->epochs);
    if (d->initial_epoch < 0 || d->initial_epoch > s->epochs)
        return mp__fail(m, MP_ERR_ARG, "fit: initial_epoch must be in [0, epochs = %d], got %d", s->epochs,
                        d->initial_epoch);
    if (!(d->validation_split >= 0.0f && d->validation_split < 1.0f))
        return mp__fail(m, MP_ERR_ARG, "fit: validation_split must be in [0, 1)");
    if (d->callback_count < 0 || (d->callback_count > 0 && !d->callbacks))
        return mp__fail(m, MP_ERR_ARG, "fit: callback_count is %d and callbacks %s", d->callback_count,
                        d->callbacks ? "set" : "NULL");
    n = fd->train.n;
    /* Keras: the last part validates, unless validation_data overrides it */
    fd->n_train = n - (has_val_data ? 0 : mp__split_count(n, d->validation_split));
    if (fd->n_train == 0) return mp__fail(m, MP_ERR_ARG, "fit: validation_split leaves no training samples");
    if (!has_val_data) {
        fd->val = fd->train;
        fd->val_first = fd->n_train;
        fd->split = 1;
    }
    fd->val_end = fd->val.n;
    fd->batch = mp__min(want, fd->n_train);
    s->steps = (fd->n_train + fd->batch - 1) / fd->batch;
    s->num_replicas = m->ranks;
    s->replica = m->rank;
    s->global_batch = fd->batch;
    s->replica_batch = (fd->batch + (size_t)m->ranks - 1) / (size_t)m->ranks;
    s->has_accuracy = m->compile.metrics != 0;
    s->has_validation = fd->val_end > fd->val_first;
#ifdef MIXPREC_NO_STDIO
    if (d->csv_path) return mp__fail(m, MP_ERR_ARG, "fit: a CSV log needs stdio (MIXPREC_NO_STDIO is defined)");
#endif
    return mp__prepare(m, (mp__min(want, n) + (size_t)m->ranks - 1) / (size_t)m->ranks);
}

#ifndef MIXPREC_NO_STDIO
/* fit's first line: the policy the model computes in, and its loss scaling. */
static void mp__fit_banner(const mp_model *m, const mp_fit_desc *d) {
    mp_policy p = m->policy;
    const char *name = mp_policy_name(p);
    int i, own = 0;
    if (d->verbose == MP_VERBOSE_SILENT || m->rank) return;
    for (i = 0; i < m->n_layers; i++) own += mp__policy_row(m->layers[i].policy) != mp__policy_row(p);
    printf("fit: policy %s (compute %s, variables %s)", name ? name : "?", mp_dtype_name(p.compute_dtype),
           mp_dtype_name(p.variable_dtype));
    if (own) printf(", %d layer%s with a policy of %s own", own, own > 1 ? "s" : "", own > 1 ? "their" : "its");
    if (m->amp) printf(", automatic mixed precision to %s", mp_dtype_name(m->amp->dtype));
    if (m->has_loss_scale) printf(", dynamic loss scale %g", (double)m->seen.ls.scale);
    printf("\n");
}
#endif

MIXPREC_API mp_status mp_model_fit(mp_model *m, const mp_fit_desc *desc) {
    mp_fit_desc d;
    mp__fit_data fd;
    mp__fit_callbacks cb;
    mp_fit_state s;
    mp_callback *list;
    size_t i, *idx, list_bytes;
    uint32_t *order = NULL; /* the order as the device takes it */
    uint64_t rng;
    mp_status st;
    int begun = 0;
    if (!m) return MP_ERR_NULL;
    if (!desc) return mp__fail(m, MP_ERR_NULL, "fit() needs a mp_fit_desc");
    d = *desc;
    if ((st = mp__fit_plan(m, &d, &s, &fd)) != MP_OK) return st;
    /* one block: the callback list (the user's and three built-in ones), then the shuffle order */
    if ((size_t)d.callback_count > SIZE_MAX / sizeof(mp_callback) - 3)
        return mp__fail(m, MP_ERR_SIZE, "fit: %d callbacks", d.callback_count);
    list_bytes = ((size_t)d.callback_count + 3) * sizeof(mp_callback);
    if (fd.n_train > (SIZE_MAX - list_bytes) / sizeof(size_t) ||
        !(list = (mp_callback *)mp__alloc(list_bytes + fd.n_train * sizeof(size_t))))
        return mp__fail(m, MP_ERR_ALLOC, "fit: shuffle indices");
    idx = (size_t *)(void *)((char *)list + list_bytes);
    mp__fit_callbacks_init(&d, s.epochs, list, &cb);
    for (i = 0; i < fd.n_train; i++) idx[i] = i;
#ifndef MIXPREC_NO_STDIO
    mp__fit_banner(m, &d);
#endif
    mp__upload_data(m, &d, &fd);
    if (m->data_block && !(order = (uint32_t *)mp__alloc(fd.n_train * sizeof(uint32_t)))) mp__free_data(m);
    rng = d.shuffle_seed ? d.shuffle_seed : m->desc.seed;
    if (m->ranks > 1 && ((st = mp__comm_host(m, &rng, sizeof rng, 0, "sharing rank 0's shuffle seed")) != MP_OK ||
                         (st = mp__agree_as_summed(m)) != MP_OK)) {
        mp__free(list);
        return st;
    }
    for (s.epoch = 0; s.epoch < d.initial_epoch && !d.no_shuffle; s.epoch++) mp__shuffle(idx, fd.n_train, &rng);
    /* on_train_begin one callback at a time: on_train_end goes to those it reached */
    s.epoch = d.initial_epoch;
    for (begun = 0; begun < cb.n && st == MP_OK; begun++) st = mp__call_hooks(cb.list + begun, 1, MP__TRAIN_BEGIN, &s, NULL);
    if (st != MP_OK) begun--;
    for (s.epoch = d.initial_epoch; s.epoch < s.epochs && st == MP_OK && !s.stop_training; s.epoch++) {
        mp_logs lg;
        if ((st = mp__call_hooks(cb.list, cb.n, MP__EPOCH_BEGIN, &s, NULL)) != MP_OK) break;
        if (!d.no_shuffle) mp__shuffle(idx, fd.n_train, &rng);
        if ((st = mp__fit_epoch(m, &fd, &cb, &s, idx, order, &lg)) != MP_OK) break;
        st = mp__call_hooks(cb.list, cb.n, MP__EPOCH_END, &s, &lg);
    }
    s.status = st;
    for (i = 0; i < (size_t)begun; i++) { /* every one, even after a failure */
        mp_status end = mp__call_hooks(cb.list + i, 1, MP__TRAIN_END, &s, NULL);
        if (st == MP_OK) st = end;
    }
    mp__free(list);
    mp__free(order);
    mp__free_data(m);
    return st;
}

MIXPREC_API mp_status mp_model_evaluate(mp_model *m, const mp_data *data, int batch_size, mp_logs *out) {
    mp__feed f;
    size_t batch = 0;
    mp_status st;
    mp_logs lg;
    if (!m) return MP_ERR_NULL;
    if (!data || !out) return mp__fail(m, MP_ERR_NULL, "evaluate() needs data and an output mp_logs");
    if ((st = mp__check_data(m, "evaluate", data, &f)) != MP_OK) return st;
    if ((st = mp__batch_size(m, "evaluate", batch_size, &batch)) != MP_OK) return st;
    batch = mp__min(batch, f.n);
    if ((st = mp__prepare(m, batch)) != MP_OK) return st;
    memset(&lg, 0, sizeof lg);
    st = mp__evaluate_shared(m, &f, 0, f.n, batch, &lg.loss, &lg.accuracy);
    lg.loss_scale = mp_current_loss_scale(m);
    lg.skipped_steps = m->has_loss_scale ? m->seen.ls.skipped_steps : 0;
    if (st == MP_OK) *out = lg;
    return st;
}

MIXPREC_API mp_status mp_model_predict(mp_model *m, const mp_data *data, int batch_size, float *out,
                                       size_t out_count) {
    const mp__layer *l;
    mp__feed f;
    mp_status st;
    size_t s, batch = 0, need;
    if (!m) return MP_ERR_NULL;
    if (!data || !out) return mp__fail(m, MP_ERR_NULL, "predict() needs data and an output buffer");
    memset(&f, 0, sizeof f);
    if ((st = mp__check_x(m, "predict", data, &f)) != MP_OK) return st;
    if ((st = mp__batch_size(m, "predict", batch_size, &batch)) != MP_OK) return st;
    if ((st = mp__check_finite(m, "predict", f.x, f.xt, f.n)) != MP_OK) return st;
    if (m->n_layers && (!mp__mul_ok(f.n, mp__last(m)->out_size, &need) || need > out_count))
        return mp__fail(m, MP_ERR_SIZE, "predict: out holds %z floats, the predictions of %z samples take %z x %z",
                        out_count, f.n, f.n, mp__last(m)->out_size);
    batch = mp__min(batch, f.n);
    if ((st = mp__prepare(m, batch)) != MP_OK) return st;
    l = mp__last(m);
    for (s = 0; s < f.n; s += batch) {
        size_t b = mp__min(batch, f.n - s);
        mp__gather(m, &f, NULL, s, b);
        mp__run_forward(m, b, 0);
        (void)mp_convert(out + s * l->out_size, MP_FLOAT32, mp__host_output(m), l->yt, b * l->out_size, NULL);
    }
    return mp__sync(m);
}

/* >>model: queries */
MIXPREC_API void *mp_model_backend_context(const mp_model *m) { return m ? m->ctx : NULL; }

MIXPREC_API int mp_model_layer_count(const mp_model *m) { return m ? m->n_layers : 0; }
MIXPREC_API mp_policy mp_model_policy(const mp_model *m) { return m ? m->policy : mp_global_policy(); }
MIXPREC_API mp_status mp_model_memory_info(const mp_model *m, mp_model_memory *out) {
    mp_backend_memory bm;
    if (!m || !out) return MP_ERR_NULL;
    m->be->memory(m->ctx, &bm);
    out->weights = m->params_bytes;
    out->optimizer = m->slots_bytes;
    out->activations = m->act_bytes;
    out->workspace = bm.workspace;
    out->current = bm.current;
    out->peak = bm.peak;
    out->backend = m->be->name;
    out->fallbacks = bm.fallbacks;
    return MP_OK;
}

MIXPREC_API int mp_model_threads(const mp_model *m) { return m ? m->be->threads(m->ctx) : 1; }
MIXPREC_API size_t mp_model_input_size(const mp_model *m) { return m ? m->in_size : 0; }
MIXPREC_API size_t mp_model_output_size(const mp_model *m) { return m && m->n_layers ? mp__last(m)->out_size : 0; }

MIXPREC_API size_t mp_model_param_count(const mp_model *m) { return m ? m->n_params + m->n_state : 0; }
MIXPREC_API size_t mp_model_trainable_param_count(const mp_model *m) { return m ? m->n_params : 0; }


MIXPREC_API mp_status mp_model_layer_info(const mp_model *m, int index, mp_layer_info *out) {
    const mp__layer *l;
    if (!m || !out) return MP_ERR_NULL;
    if (index < 0 || index >= m->n_layers) return MP_ERR_ARG;
    l = &m->layers[index];
    memset(out, 0, sizeof *out);
    out->name = l->name;
    out->type = mp__kinds[l->desc.kind].type;
    out->policy = l->policy;
    out->rank = l->out_rank;
    memcpy(out->output_shape, l->out_shape, sizeof out->output_shape);
    out->params = mp__params(l) + l->n_state;
    out->trainable_params = mp__params(l);
    out->compute_dtype = l->dt;
    out->output_dtype = l->yt;
    return MP_OK;
}

/* The weights in get_weights order, Keras's model.weights: layer by
   layer, its trainable weights (kernel, bias) then its state (w holds
   every layer's trainable weights first, then every layer's state),
   copied to the host's dst or from its src (the other NULL). */
static mp_status mp__copy_weights(mp_model *m, float *dst, const float *src, size_t n) {
    size_t at = 0;
    int i, part;
    if (n != m->n_params + m->n_state)
        return mp__fail(m, MP_ERR_SHAPE, "the model has %z weights, the buffer %z", m->n_params + m->n_state, n);
    for (i = 0; i < m->n_layers; i++)
        for (part = 0; part < 2; part++) {
            const mp__layer *l = &m->layers[i];
            float *w = part ? l->state : l->w;
            size_t count = part ? l->n_state : mp__params(l);
            if (!count) continue;
            if (dst) m->be->copy(m->ctx, dst + at, w, count * sizeof(float), MP_COPY_TO_HOST);
            else m->be->copy(m->ctx, w, src + at, count * sizeof(float), MP_COPY_TO_BACKEND);
            at += count;
        }
    return mp__sync(m);
}

MIXPREC_API mp_status mp_model_get_weights(mp_model *m, float *dst, size_t n) {
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if (!dst) return mp__fail(m, MP_ERR_NULL, "get_weights() needs a buffer");
    if (n != m->n_params + m->n_state) return mp__copy_weights(m, dst, NULL, n); /* SHAPE, still unbuilt */
    if ((st = mp_model_build(m)) != MP_OK) return st;
    return mp__copy_weights(m, dst, NULL, n);
}

MIXPREC_API mp_status mp_model_set_weights(mp_model *m, const float *src, size_t n) {
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if (!src) return mp__fail(m, MP_ERR_NULL, "set_weights() needs weights");
    if (n != m->n_params + m->n_state) return mp__copy_weights(m, NULL, src, n); /* SHAPE, still unbuilt */
    if ((st = mp_model_build(m)) != MP_OK) return st;
    m->casts_fresh = 0;
    return mp__copy_weights(m, NULL, src, n);
}

/* A layer's weights in get_weights' order, their names and Keras shapes
   (sizes and offsets not yet filled); returns how many (at most
   MP__LAYER_WEIGHTS). */
static int mp__layer_weights(const mp__layer *l, mp_weight_info out[MP__LAYER_WEIGHTS]) {
    static const char *const norm[4] = {"gamma", "beta", "moving_mean", "moving_variance"};
    static const char *const mha[MP__LAYER_WEIGHTS] = {"query/kernel", "query/bias", "key/kernel", "key/bias",
                                                       "value/kernel", "value/bias", "attention_output/kernel",
                                                       "attention_output/bias"};
    const mp_layer_desc *d = &l->desc;
    int n, k, c = l->in_rank ? l->in_shape[l->in_rank - 1] : 0;
    switch (d->kind) {
    case MP_EMBEDDING:
    case MP_POSITION_EMBEDDING:
        out[0].name = "embeddings", out[0].rank = 2, out[0].trainable = 1;
        out[0].shape[0] = d->kind == MP_EMBEDDING ? d->input_dim : d->sequence_length;
        out[0].shape[1] = (int)mp__embedding_width(l);
        return 1;
    case MP_MULTI_HEAD_ATTENTION:
        for (k = n = 0; k < MP__LAYER_WEIGHTS; k++) {
            int in_out[3] = {c, d->num_heads, d->key_dim}, bias = k % 2;
            if (bias && d->no_bias) continue;
            out[n].name = mha[k], out[n].trainable = 1;
            if (k == 6) in_out[0] = d->num_heads, in_out[1] = d->key_dim, in_out[2] = c;
            out[n].rank = bias ? (k == 7 ? 1 : 2) : 3;
            memcpy(out[n].shape, bias ? (k == 7 ? &c : in_out + 1) : in_out, (size_t)out[n].rank * sizeof(int));
            n++;
        }
        return n;
    case MP_DENSE:
    case MP_CONV2D:
        out[0].name = "kernel";
        if (d->kind == MP_DENSE) {
            out[0].rank = 2, out[0].shape[0] = c, out[0].shape[1] = d->units;
        } else {
            out[0].rank = 4, out[0].shape[0] = l->geom.kh, out[0].shape[1] = l->geom.kw;
            out[0].shape[2] = l->geom.c, out[0].shape[3] = d->filters;
        }
        out[0].trainable = out[1].trainable = 1;
        out[1].name = "bias", out[1].rank = 1, out[1].shape[0] = (int)l->n_bias;
        return l->n_bias ? 2 : 1;
    case MP_BATCH_NORMALIZATION:
    case MP_LAYER_NORMALIZATION:
        n = d->kind == MP_BATCH_NORMALIZATION ? 4 : 2;
        for (k = 0; k < n; k++) out[k].name = norm[k], out[k].rank = 1, out[k].shape[0] = c, out[k].trainable = k < 2;
        return n;
    default: return 0;
    }
}

static size_t mp__weight_size(const mp_weight_info *w) {
    size_t size = 1;
    int r;
    for (r = 0; r < w->rank; r++) size *= (size_t)w->shape[r];
    return size;
}

MIXPREC_API int mp_model_weight_count(const mp_model *m) {
    mp_weight_info w[MP__LAYER_WEIGHTS];
    int i, n = 0;
    for (i = 0; m && i < m->n_layers; i++) n += mp__layer_weights(&m->layers[i], w);
    return n;
}

MIXPREC_API mp_status mp_model_weight_info(const mp_model *m, int index, mp_weight_info *out) {
    mp_weight_info w[MP__LAYER_WEIGHTS];
    size_t at = 0, grad_at = 0;
    int i, k, n;
    if (!m || !out) return MP_ERR_NULL;
    for (i = 0; i < m->n_layers && index >= 0; i++) {
        memset(w, 0, sizeof w);
        n = mp__layer_weights(&m->layers[i], w);
        for (k = 0; k < n; k++) {
            w[k].layer = m->layers[i].name;
            w[k].layer_index = i;
            w[k].size = mp__weight_size(&w[k]);
            w[k].offset = at;
            w[k].gradient_offset = w[k].trainable ? grad_at : 0;
            at += w[k].size;
            if (w[k].trainable) grad_at += w[k].size;
            if (index-- == 0) {
                *out = w[k];
                return MP_OK;
            }
        }
    }
    return MP_ERR_ARG;
}

MIXPREC_API mp_status mp_get_gradients(const mp_model *m, float *dst, size_t n) {
    if (!m || !dst) return MP_ERR_NULL;
    if (!m->grads_ready) return MP_ERR_STATE;
    if (n != m->n_params) return MP_ERR_SHAPE;
    mp__write_deferred(m);
    m->be->copy(m->ctx, dst, m->g, n * sizeof(float), MP_COPY_TO_HOST);
    return m->be->sync(m->ctx) == MP_OK ? MP_OK : MP_ERR_BACKEND;
}

MIXPREC_API size_t mp_optimizer_slot_count(const mp_model *m) { return m ? m->slot_count : 0; }

MIXPREC_API mp_status mp_get_optimizer_slots(const mp_model *m, float *dst, size_t n) {
    if (!m || (!dst && n)) return MP_ERR_NULL;
    if (n != m->slot_count) return MP_ERR_SHAPE;
    m->be->copy(m->ctx, dst, m->slots_block, n * sizeof(float), MP_COPY_TO_HOST);
    return m->be->sync(m->ctx) == MP_OK ? MP_OK : MP_ERR_BACKEND;
}

/* >>model: summary. Keras's model.summary() with a Policy column; a
   functional model (not a chain) gets Keras's "Connected to" column and
   its input_layer row. */

static void mp__rule(mp__text *t, const char *c, size_t width) {
    size_t i;
    for (i = 0; i < width; i++) mp__put(t, c);
    mp__put(t, "\n");
}

/* The first column's width: Keras's 29, or more where a row's " name
   (Type)" and a space need it (a MaxPooling2D or GlobalAveragePooling2D
   row with its automatic name does), so that no row runs into the
   shape's column. */
static size_t mp__summary_width(const mp_model *m) {
    size_t width = 29, row;
    int i;
    for (i = 0; i < m->n_layers; i++) {
        row = 1 + strlen(m->layers[i].name) + 2 + strlen(mp__kinds[m->layers[i].desc.kind].type) + 1 + 1;
        if (row > width) width = row;
    }
    return width;
}

/* Keras 3's "Connected to": each input's "name[0][0]". */
static void mp__put_connected(mp__text *t, const mp_model *m, const mp__layer *l) {
    int k;
    for (k = 0; k < l->n_in; k++) {
        if (k) mp__put(t, ", ");
        mp__put(t, mp__input_name(m, l->in[k]));
        mp__put(t, "[0][0]");
    }
}

/* The widest "Connected to" cell, its header's at least. */
static size_t mp__connected_width(const mp_model *m) {
    size_t width = strlen("Connected to");
    int i;
    for (i = 0; i < m->n_layers; i++) {
        mp__text count = {NULL, 0, 0};
        mp__put_connected(&count, m, &m->layers[i]);
        if (count.len > width) width = count.len;
    }
    return width;
}

/* A row's name, shape and Param # columns; returns where the row starts. */
static size_t mp__summary_row(mp__text *t, size_t w, const char *name, const char *type, int rank, const int *shape,
                              size_t params) {
    size_t line = t->len;
    mp__put(t, " ");
    mp__put(t, name);
    mp__put(t, " (");
    mp__put(t, type);
    mp__put(t, ")");
    mp__pad_to(t, line + w);
    mp__put_shape(t, rank, shape);
    mp__pad_to(t, line + w + 26);
    mp__put_uint(t, params, 0);
    mp__pad_to(t, line + w + 37);
    return line;
}

enum { MP__SUMMARY_POLICY = 23 }; /* the Policy column's width before Connected to ("amp_bfloat16->float32") */

static void mp__summary(const mp_model *m, mp__text *t) {
    int i, graph = !mp__is_chain(m);
    size_t line, w = mp__summary_width(m), rule = graph ? w + 37 + MP__SUMMARY_POLICY + mp__connected_width(m)
                                                        : 80 + w - 29;
    mp__put(t, "Model: \"");
    mp__put(t, mp__model_name(m));
    mp__put(t, "\"\n");
    mp__rule(t, "_", rule);
    line = t->len;
    mp__put(t, " Layer (type)");
    mp__pad_to(t, line + w);
    mp__put(t, "Output Shape              Param #    Policy");
    if (graph) {
        mp__pad_to(t, line + w + 37 + MP__SUMMARY_POLICY);
        mp__put(t, "Connected to");
    }
    mp__put(t, "\n");
    mp__rule(t, "=", rule);
    if (graph) { /* Keras's first row: the Input */
        line = mp__summary_row(t, w, mp__input_name(m, MP__FROM_INPUT), "InputLayer", m->in_rank, m->in_shape, 0);
        mp__put(t, "-");
        mp__pad_to(t, line + w + 37 + MP__SUMMARY_POLICY);
        mp__put(t, "-\n");
    }
    for (i = 0; i < m->n_layers; i++) {
        const mp__layer *l = &m->layers[i];
        const char *policy = mp_policy_name(l->policy);
        line = mp__summary_row(t, w, l->name, mp__kinds[l->desc.kind].type, l->out_rank, l->out_shape,
                               mp__params(l) + l->n_state);
        if (m->amp) mp__amp_put_dtypes(t, l);
        else mp__put(t, policy ? policy : "?");
        if (graph) {
            mp__pad_to(t, line + w + 37 + MP__SUMMARY_POLICY);
            mp__put_connected(t, m, l);
        }
        mp__put(t, "\n");
    }
    mp__rule(t, "=", rule);
    mp__put(t, "Total params: ");
    mp__put_uint(t, m->n_params + m->n_state, 1);
    mp__put(t, "\nTrainable params: ");
    mp__put_uint(t, m->n_params, 1);
    mp__put(t, "\nNon-trainable params: ");
    mp__put_uint(t, m->n_state, 1);
    mp__put(t, "\n");
    mp__rule(t, "_", rule);
}

MIXPREC_API mp_status mp_model_summary(const mp_model *m, char *buf, size_t size) {
    mp__text t;
    if (!m || !buf) return MP_ERR_NULL;
    if (size == 0) return MP_ERR_SIZE;
    t.buf = buf;
    t.cap = size;
    t.len = 0;
    buf[0] = '\0';
    mp__summary(m, &t);
    return t.len < size ? MP_OK : MP_ERR_SIZE;
}

#ifndef MIXPREC_NO_STDIO
/* Prints what `write` writes: measured first, then written in one buffer. */
static void mp__print_text(const mp_model *m, void (*write)(const mp_model *m, mp__text *t)) {
    mp__text count = {NULL, 0, 0}, t;
    char *buf;
    write(m, &count);
    buf = (char *)MIXPREC_MALLOC(count.len + 1); /* not counted: printing is no model memory */
    if (!buf) { fputs("mixprec: no memory for the text\n", stdout); return; }
    t.buf = buf;
    t.cap = count.len + 1;
    t.len = 0;
    write(m, &t);
    fputs(buf, stdout);
    MIXPREC_FREE(buf);
}

MIXPREC_API void mp_model_print_summary(const mp_model *m) {
    if (m) mp__print_text(m, mp__summary);
}
#endif

/* >>numerics diagnostics (see the declaration). Statistics are taken by the
   cast-stats scan (>>bulk casts: cast stats) with no output written, plus a histogram
   read off float32's exponent bits; the hooks in mp__run_forward,
   mp_compute_scaled_gradients and mp_get_unscaled_gradients call in here
   only when diagnostics are on (m->num). */
typedef mp__scan (*mp__scan_fn)(const void *src, size_t n, mp__ranges r);
#if defined(MP__SIMD_AVX512)
static const mp__scan_fn mp__scans[MP_DTYPE_COUNT] = {mp__scan_f32_avx512, mp__scan_f16_avx512, mp__scan_bf16_avx512};
#elif defined(MP__SIMD_X86)
static const mp__scan_fn mp__scans[MP_DTYPE_COUNT] = {mp__scan_f32_avx2, mp__scan_f16_avx2, mp__scan_bf16_avx2};
#else
static const mp__scan_fn mp__scans[MP_DTYPE_COUNT] = {mp__scan_f32_scalar, mp__scan_f16_scalar, mp__scan_bf16_scalar};
#endif

static int mp__exponent(uint32_t magnitude) { return (int)(magnitude >> 23) - 127; } /* float32 bits */
static uint32_t mp__pow2_bits(int e) { return (uint32_t)(e + 127) << 23; }            /* -126 <= e <= 127 */

/* Adds the finite nonzero magnitudes of n elements to hist; returns how many. */
static uint64_t mp__hist_add(uint64_t *hist, const void *x, mp_dtype t, size_t n) {
    float tile[MP__TILE];
    uint64_t nonzero = 0;
    size_t i, j, len;
    for (i = 0; i < n; i += len) {
        len = mp__min(MP__TILE, n - i);
        mp__load(tile, mp__at(x, t, i), t, len);
        for (j = 0; j < len; j++) {
            uint32_t a = mp__f32_bits(tile[j]) & 0x7FFFFFFFu;
            int b = mp__exponent(a) - MP_HIST_MIN_EXP + 1; /* float32 subnormals go below bin 0 */
            if (a - 1u >= MP__F32_INF - 1u) continue;       /* zero, Inf, NaN */
            hist[b < 0 ? 0 : b >= MP_HIST_BINS ? MP_HIST_BINS - 1 : b]++;
            nonzero++;
        }
    }
    return nonzero;
}

static void mp__stats_merge(mp_tensor_stats *into, const mp_tensor_stats *s) {
    int b;
    into->count += s->count;
    into->zeros += s->zeros;
    into->nan += s->nan;
    into->inf += s->inf;
    into->overflow += s->overflow;
    into->underflow += s->underflow;
    into->subnormal += s->subnormal;
    if (s->max_abs > into->max_abs) into->max_abs = s->max_abs;
    if (s->min_abs != 0.0f && (into->min_abs == 0.0f || s->min_abs < into->min_abs)) into->min_abs = s->min_abs;
    for (b = 0; b < MP_HIST_BINS; b++) into->hist[b] += s->hist[b];
}

MIXPREC_API mp_status mp_tensor_stats_compute(const void *x, mp_dtype type, size_t n, mp_dtype target,
                                              mp_tensor_stats *out) {
    mp_cast_stats c;
    mp_tensor_stats s;
    uint64_t nonzero = 0;
    size_t i;
    if (!out || (!x && n)) return MP_ERR_NULL;
    if (!mp__dtype_valid(type) || !mp__dtype_valid(target)) return MP_ERR_DTYPE;
    if ((uintptr_t)x % mp__dtypes[type].size) return MP_ERR_ALIGN;
    memset(&c, 0, sizeof c);
    memset(&s, 0, sizeof s);
    for (i = 0; i < n; i += MP__BLOCK) { /* block by block: the histogram reads it from L1 */
        size_t len = mp__min(MP__BLOCK, n - i);
        const void *p = mp__at(x, type, i);
        mp__scan scan = mp__scans[type](p, len, mp__ranges_of[target]);
        mp__stats_add(&c, &scan, len);
        nonzero += mp__hist_add(s.hist, p, type, len);
    }
    s.count = c.count;
    s.nan = c.nan_in;
    s.inf = c.inf_in;
    s.overflow = c.overflow;
    s.underflow = c.underflow;
    s.subnormal = c.subnormal;
    s.min_abs = c.min_abs;
    s.max_abs = c.max_abs;
    s.zeros = c.count - c.nan_in - c.inf_in - nonzero;
    mp__stats_merge(out, &s);
    return MP_OK;
}

static const char *const mp__numerics_kind_names[MP_NUMERICS_KIND_COUNT] = {
    "activations", "weights", "scaled_grads", "grads", "input_grads"};

MIXPREC_API const char *mp_numerics_kind_name(mp_numerics_kind kind) {
    return (unsigned)kind < (unsigned)MP_NUMERICS_KIND_COUNT ? mp__numerics_kind_names[kind] : NULL;
}

/* The recommended loss scale. Micikevicius et al. (ICLR 2018, section 3.2):
   scaling the loss by S shifts every gradient's exponent by log2 S, moving
   the small ones out of float16's flush-to-zero range, and "there is no
   downside to choosing a large scaling factor as long as it does not cause
   overflow during back-propagation": so the largest power of two (exact to
   apply and to undo) with max|g| S inside float16's 65504, with a factor 2
   of headroom because the next steps' gradients are not these. A value
   below 2^-25 (float16's half-smallest subnormal, >>bulk casts: cast stats' sub_lo)
   becomes zero; bin b's values lie below 2^(MP_HIST_MIN_EXP + b). */
static uint64_t mp__flushed_at(const mp_tensor_stats *s, int log2_scale) {
    int flush = mp__exponent(mp__ranges_of[MP_FLOAT16].sub_lo), b; /* -25 */
    uint64_t n = 0;
    for (b = 0; b < MP_HIST_BINS - 1; b++)
        if (MP_HIST_MIN_EXP + b + log2_scale <= flush) n += s->hist[b];
    return n;
}

MIXPREC_API mp_status mp_recommend_loss_scale(const mp_tensor_stats *grads, int n, mp_loss_scale_advice *out) {
    const float limit = 0.5f * mp_f16_to_f32(MP_F16_MAX), ceiling = 16777216.0f; /* 2^24 */
    mp_tensor_stats all;
    uint64_t nonzero = 0;
    float s = 1.0f;
    int k = 0, i;
    if (!out || (!grads && n)) return MP_ERR_NULL;
    if (n < 0) return MP_ERR_ARG;
    memset(&all, 0, sizeof all);
    for (i = 0; i < n; i++) mp__stats_merge(&all, &grads[i]);
    for (i = 0; i < MP_HIST_BINS; i++) nonzero += all.hist[i];
    if (all.max_abs > 0.0f) {
        for (; all.max_abs * s > limit; k--) s *= 0.5f;
        for (; s < ceiling && all.max_abs * s * 2.0f <= limit; k++) s *= 2.0f;
    }
    out->scale = s;
    out->max_abs = all.max_abs;
    out->underflow_unscaled = nonzero ? (float)mp__flushed_at(&all, 0) / (float)nonzero : 0.0f;
    out->underflow_scaled = nonzero ? (float)mp__flushed_at(&all, k) / (float)nonzero : 0.0f;
    return MP_OK;
}

typedef struct mp__numerics {
    mp_numerics_desc desc;          /* defaults filled in; csv_path is the model's copy */
    uint64_t step;                  /* the step the statistics are of; 0: none yet */
    int active, output;             /* this step takes statistics / prints and logs them */
    int stop_layer, stop_backward;  /* where check-numerics stopped that step; -1: it did not */
    float scale;                    /* the loss scale that step ran with */
    mp_tensor_stats *stats;         /* [layer][kind] */
    void *copy;                     /* a device backend's tensor, copied out for the statistics */
    size_t copy_bytes;
} mp__numerics;

static void mp__numerics_free(struct mp__numerics *nu) {
    if (nu) mp__free(nu->copy);
    mp__free(nu);
}

/* One block: the state, the statistics, the CSV path (as >>memory carves). */
static mp__numerics *mp__plan_numerics(mp__arena *a, size_t stats, size_t path_bytes, char **path) {
    mp__numerics *nu = (mp__numerics *)mp__carve(a, 1, sizeof *nu);
    mp_tensor_stats *st = (mp_tensor_stats *)mp__carve(a, stats, sizeof *st);
    *path = (char *)mp__carve(a, path_bytes, 1);
    if (nu) nu->stats = st;
    return nu;
}

static mp_tensor_stats *mp__numerics_at(const mp__numerics *nu, int layer, int kind) {
    return &nu->stats[(size_t)layer * MP_NUMERICS_KIND_COUNT + (size_t)kind];
}

/* Puts |x| as printf's %.Ne would (decimals at most 6): 1.234e-05. */
static void mp__put_sci(mp__text *t, float x, int decimals) {
    float a = fabsf(x), unit = 1.0f;
    int e = 0, i;
    if (a != a || a > FLT_MAX) { mp__put(t, a != a ? "nan" : "inf"); return; }
    if (a != 0.0f) {
        while (a >= 10.0f) { a /= 10.0f; e++; }
        while (a < 1.0f) { a *= 10.0f; e--; }
    }
    for (i = 0; i < decimals; i++) unit *= 10.0f;
    if (floorf(a * unit + 0.5f) >= 10.0f * unit) { a /= 10.0f; e++; } /* 9.9996 rounds to 1.000e+01 */
    mp__put_float(t, a, decimals);
    mp__put(t, e < 0 ? "e-" : "e+");
    if (e > -10 && e < 10) mp__put(t, "0");
    mp__put_int(t, e < 0 ? -e : e);
}

static void mp__put_percent(mp__text *t, uint64_t part, uint64_t whole) {
    float p = whole ? 100.0f * (float)part / (float)whole : 0.0f;
    if (part && p < 0.005f) mp__put(t, "<0.01"); /* never 0.00 for something */
    else mp__put_float(t, p, 2);
}

/* The next column of a table row started at `line`: at least one space. */
static void mp__column(mp__text *t, size_t line, size_t col) {
    mp__pad_to(t, line + col - 1);
    mp__put(t, " ");
}

static const size_t mp__numerics_cols[] = {17, 31, 42, 53, 61, 69, 77, 85, 93};

static void mp__stats_row(mp__text *t, const char *layer, const char *tensor, const mp_tensor_stats *s) {
    size_t line = t->len;
    const size_t *c = mp__numerics_cols;
    mp__put(t, layer);
    mp__column(t, line, c[0]); mp__put(t, tensor);
    mp__column(t, line, c[1]); mp__put_sci(t, s->min_abs, 3);
    mp__column(t, line, c[2]); mp__put_sci(t, s->max_abs, 3);
    mp__column(t, line, c[3]); mp__put_percent(t, s->zeros, s->count);
    mp__column(t, line, c[4]); mp__put_percent(t, s->overflow, s->count);
    mp__column(t, line, c[5]); mp__put_percent(t, s->underflow, s->count);
    mp__column(t, line, c[6]); mp__put_percent(t, s->subnormal, s->count);
    mp__column(t, line, c[7]); mp__put_uint(t, s->inf, 0);
    mp__column(t, line, c[8]); mp__put_uint(t, s->nan, 0);
    mp__put(t, "\n");
}

static void mp__stats_header(mp__text *t) {
    static const char *const names[] = {"tensor", "min|x|", "max|x|", "zero%", "over%", "under%", "sub%", "inf", "nan"};
    size_t line = t->len, i;
    mp__put(t, "layer");
    for (i = 0; i < sizeof names / sizeof names[0]; i++) {
        mp__column(t, line, mp__numerics_cols[i]);
        mp__put(t, names[i]);
    }
    mp__put(t, "\n");
}

/* The rows of layers first..last (in that order, either way round). */
static void mp__stats_rows(const mp_model *m, mp__text *t, int first, int last) {
    int step = first <= last ? 1 : -1, i, k;
    for (i = first; i != last + step; i += step)
        for (k = 0; k < MP_NUMERICS_KIND_COUNT; k++) {
            const mp_tensor_stats *s = mp__numerics_at(m->num, i, k);
            if (s->count) mp__stats_row(t, m->layers[i].name, mp__numerics_kind_names[k], s);
        }
}

/* Histogram lines start at the min|x| column: one character per bin. A
   ruler of exponents, then what the target makes of each bin (0: zero,
   s: subnormal, -: normal, I: Inf), then each gradient's counts on ten
   levels (' ' none, '.' a few .. '@' the most). */
static void mp__hist_ruler(mp__text *t, mp__ranges r, const char *target) {
    size_t line = t->len, at = mp__numerics_cols[1];
    int b;
    mp__column(t, line, at);
    for (b = 1; b < MP_HIST_BINS - 1; b++) {
        int e = MP_HIST_MIN_EXP + b - 1;
        if (e % 10 == 0) { mp__pad_to(t, line + at + (size_t)b); mp__put_int(t, e); }
    }
    mp__put(t, "\n");
    line = t->len;
    mp__put(t, target);
    mp__column(t, line, at);
    for (b = 0; b < MP_HIST_BINS; b++) { /* a value inside the bin, by its float32 bits */
        uint32_t a = b ? mp__pow2_bits(MP_HIST_MIN_EXP + b - 1) + 1u : mp__pow2_bits(MP_HIST_MIN_EXP) - 1u;
        mp__put(t, a < r.sub_lo ? "0" : a < r.normal_lo ? "s" : a < r.inf_lo ? "-" : "I");
    }
    mp__put(t, "\n");
}

static void mp__hist_row(mp__text *t, const char *layer, const char *tensor, const mp_tensor_stats *s) {
    static const char levels[] = " .:-=+*#%@";
    size_t line = t->len;
    uint64_t most = 0;
    int b, end = 0; /* up to the last nonempty bin: no trailing blanks */
    for (b = 0; b < MP_HIST_BINS; b++) {
        most = s->hist[b] > most ? s->hist[b] : most;
        end = s->hist[b] ? b + 1 : end;
    }
    mp__put(t, layer);
    mp__column(t, line, mp__numerics_cols[0]);
    mp__put(t, tensor);
    mp__column(t, line, mp__numerics_cols[1]);
    for (b = 0; b < end; b++) {
        char c[2] = {levels[s->hist[b] ? 1 + (int)(s->hist[b] * 8u / most) : 0], 0};
        mp__put(t, c);
    }
    mp__put(t, "\n");
}

static void mp__put_scale(mp__text *t, float s) {
    int k = mp__exponent(mp__f32_bits(s));
    mp__put(t, "2^");
    mp__put_int(t, k);
    if (k >= 0) { mp__put(t, " = "); mp__put_float(t, s, 0); }
}

static void mp__advice_text(const mp_model *m, mp__text *t) {
    mp_loss_scale_advice adv;
    if (m->num->desc.target != MP_FLOAT16) {
        mp__put(t, "bfloat16 keeps float32's exponent range: it needs no loss scale.\n");
        return;
    }
    if (mp_model_recommend_loss_scale(m, &adv) != MP_OK) return;
    mp__put(t, "Recommended loss scale: ");
    mp__put_scale(t, adv.scale);
    mp__put(t, " (max|grad| ");
    mp__put_sci(t, adv.max_abs, 3);
    mp__put(t, " times it stays below 65504 / 2); nonzero gradients float16 makes zero: ");
    mp__put_float(t, 100.0f * adv.underflow_unscaled, 2);
    mp__put(t, "% unscaled, ");
    mp__put_float(t, 100.0f * adv.underflow_scaled, 2);
    mp__put(t, "% at that scale. This step ran at ");
    mp__put_scale(t, m->num->scale);
    mp__put(t, ".\n");
}

/* Inf and NaN in what a layer's forward pass (its output) or backward pass
   (its weight and input gradients) produced. */
static void mp__pass_nonfinite(const mp__numerics *nu, int layer, int backward, uint64_t *inf, uint64_t *nan) {
    int k;
    *inf = *nan = 0;
    for (k = 0; k < MP_NUMERICS_KIND_COUNT; k++) {
        const mp_tensor_stats *s = mp__numerics_at(nu, layer, k);
        if (backward ? k == MP_NUMERICS_SCALED_GRADIENTS || k == MP_NUMERICS_INPUT_GRADIENTS
                     : k == MP_NUMERICS_ACTIVATIONS) {
            *inf += s->inf;
            *nan += s->nan;
        }
    }
}

/* The stop sentence of check-numerics (the detail of mp_model_error). */
static void mp__stop_text(const mp_model *m, mp__text *t) {
    const mp__numerics *nu = m->num;
    const mp__layer *l = &m->layers[nu->stop_layer];
    uint64_t inf, nan;
    mp__pass_nonfinite(nu, nu->stop_layer, nu->stop_backward, &inf, &nan);
    mp__put(t, "check-numerics: layer ");
    mp__put(t, l->name);
    mp__put(t, " (");
    mp__put(t, mp__kinds[l->desc.kind].type);
    mp__put(t, ") produced ");
    mp__put_uint(t, inf, 0);
    mp__put(t, " Inf and ");
    mp__put_uint(t, nan, 0);
    mp__put(t, nu->stop_backward ? " NaN in its backward pass at step " : " NaN in its forward pass at step ");
    mp__put_uint(t, nu->step, 0);
}

/* The report: after a check-numerics stop, the stop and the last `history`
   layers that ran; otherwise every layer, the gradients' histograms and
   the loss-scale advice. */
static void mp__numerics_text(const mp_model *m, mp__text *t) {
    const mp__numerics *nu = m->num;
    const char *target = mp_dtype_name(nu->desc.target);
    int i, h = nu->desc.history;
    if (nu->stop_layer >= 0) {
        int first = nu->stop_backward ? nu->stop_layer + h - 1 : nu->stop_layer - h + 1;
        first = first < 0 ? 0 : first >= m->n_layers ? m->n_layers - 1 : first;
        mp__stop_text(m, t);
        mp__put(t, ". The last layers that ran, ranges of ");
        mp__put(t, target);
        mp__put(t, ":\n");
        mp__stats_header(t);
        mp__stats_rows(m, t, first, nu->stop_layer);
        return;
    }
    mp__put(t, "Numerics at step ");
    mp__put_uint(t, nu->step, 0);
    mp__put(t, " (over%, under%, sub%: what a cast to ");
    mp__put(t, target);
    mp__put(t, " would do):\n");
    mp__stats_header(t);
    mp__stats_rows(m, t, 0, m->n_layers - 1);
    mp__put(t, "log2|x| of the gradients, a column per power of two (< 2^");
    mp__put_int(t, MP_HIST_MIN_EXP);
    mp__put(t, " first, >= 2^");
    mp__put_int(t, MP_HIST_MAX_EXP);
    mp__put(t, " last); ");
    mp__put(t, target);
    mp__put(t, " makes them 0 zero, s subnormal, - normal, I Inf:\n");
    mp__hist_ruler(t, mp__ranges_of[nu->desc.target], target);
    for (i = 0; i < m->n_layers; i++) {
        int k;
        for (k = MP_NUMERICS_SCALED_GRADIENTS; k <= MP_NUMERICS_INPUT_GRADIENTS; k++) {
            const mp_tensor_stats *s = mp__numerics_at(nu, i, k);
            if (s->count) mp__hist_row(t, m->layers[i].name, mp__numerics_kind_names[k], s);
        }
    }
    mp__advice_text(m, t);
}

#ifndef MIXPREC_NO_STDIO
/* CSV: step,layer,tensor,count,zeros,nan,inf,overflow,underflow,subnormal,
   min_abs,max_abs, then the histogram's bins: lt-50 (below 2^-50), e-50
   ([2^-50, 2^-49)) .. e19, ge20. */
static void mp__csv_header(FILE *f) {
    char buf[1024];
    mp__text t;
    int b;
    t.buf = buf;
    t.cap = sizeof buf;
    t.len = 0;
    mp__put(&t, "step,layer,tensor,count,zeros,nan,inf,overflow,underflow,subnormal,min_abs,max_abs,lt");
    mp__put_int(&t, MP_HIST_MIN_EXP);
    for (b = 1; b < MP_HIST_BINS - 1; b++) { mp__put(&t, ",e"); mp__put_int(&t, MP_HIST_MIN_EXP + b - 1); }
    mp__put(&t, ",ge");
    mp__put_int(&t, MP_HIST_MAX_EXP);
    mp__put(&t, "\n");
    fputs(buf, f);
}

static void mp__csv_stats(FILE *f, uint64_t step, const char *layer, const char *tensor, const mp_tensor_stats *s) {
    const uint64_t counts[] = {s->count, s->zeros, s->nan, s->inf, s->overflow, s->underflow, s->subnormal};
    char buf[2048]; /* 72 bins of at most 20 digits, and the rest */
    mp__text t;
    size_t i;
    int b;
    t.buf = buf;
    t.cap = sizeof buf;
    t.len = 0;
    mp__put_uint(&t, step, 0);
    mp__put(&t, ",");
    mp__put(&t, layer);
    mp__put(&t, ",");
    mp__put(&t, tensor);
    for (i = 0; i < sizeof counts / sizeof counts[0]; i++) { mp__put(&t, ","); mp__put_uint(&t, counts[i], 0); }
    mp__put(&t, ",");
    mp__put_sci(&t, s->min_abs, 6);
    mp__put(&t, ",");
    mp__put_sci(&t, s->max_abs, 6);
    for (b = 0; b < MP_HIST_BINS; b++) { mp__put(&t, ","); mp__put_uint(&t, s->hist[b], 0); }
    mp__put(&t, "\n");
    fputs(buf, f);
}

/* Creates the file with its header, or appends the step's rows. */
static mp_status mp__numerics_csv(mp_model *m, const mp__numerics *nu, int create) {
    FILE *f;
    int i, k;
    if (m->rank) return MP_OK; /* rank 0 writes (>>communicator) */
    errno = 0;
    if (!(f = fopen(nu->desc.csv_path, create ? "w" : "a")))
        return mp__fail(m, MP_ERR_IO, "cannot write the numerics CSV %s: %s", nu->desc.csv_path, mp__io_reason(errno));
    if (create) mp__csv_header(f);
    for (i = 0; !create && i < m->n_layers; i++)
        for (k = 0; k < MP_NUMERICS_KIND_COUNT; k++)
            if (mp__numerics_at(nu, i, k)->count)
                mp__csv_stats(f, nu->step, m->layers[i].name, mp__numerics_kind_names[k], mp__numerics_at(nu, i, k));
    errno = 0;
    if (ferror(f) | fclose(f))
        return mp__fail(m, MP_ERR_IO, "writing the numerics CSV %s failed: %s", nu->desc.csv_path, mp__io_reason(errno));
    return MP_OK;
}
#endif

MIXPREC_API mp_status mp_model_set_numerics(mp_model *m, const mp_numerics_desc *desc) {
    mp_numerics_desc d;
    mp__arena a = {NULL, 0, 0};
    mp__numerics *nu;
    size_t stats, path_bytes;
    char *path;
    mp_status st;
    if (!m) return MP_ERR_NULL;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (d.every < 0 || d.history < 0 || !mp__dtype_valid(d.target))
        return mp__fail(m, MP_ERR_ARG, "numerics: every and history must be >= 0, target a dtype");
#ifdef MIXPREC_NO_STDIO
    if (d.print || d.csv_path)
        return mp__fail(m, MP_ERR_ARG, "numerics: printing and a CSV file need stdio (MIXPREC_NO_STDIO is defined)");
#endif
    if (!d.every && !d.check) {
        mp__numerics_free(m->num);
        m->num = NULL;
        return MP_OK;
    }
    if (d.target == MP_FLOAT32) d.target = MP_FLOAT16;
    if (!d.history) d.history = 3;
    stats = (size_t)m->n_layers * MP_NUMERICS_KIND_COUNT;
    path_bytes = d.csv_path ? strlen(d.csv_path) + 1 : 0;
    mp__plan_numerics(&a, stats, path_bytes, &path);
    if (a.overflow) return mp__fail(m, MP_ERR_SIZE, "numerics: the CSV path is too long");
    a.base = (unsigned char *)mp__alloc(a.used);
    if (!a.base) return mp__fail(m, MP_ERR_ALLOC, "numerics statistics (%z bytes)", a.used);
    a.used = 0;
    nu = mp__plan_numerics(&a, stats, path_bytes, &path);
    if (path) memcpy(path, d.csv_path, path_bytes); /* the caller's string need not outlive the model */
    d.csv_path = path;
    nu->desc = d;
    nu->stop_layer = -1;
#ifndef MIXPREC_NO_STDIO
    if (path && (st = mp__numerics_csv(m, nu, 1)) != MP_OK) { mp__numerics_free(nu); return st; }
#endif
    if ((st = mp_model_build(m)) != MP_OK) { mp__numerics_free(nu); return st; } /* last: a failure leaves it unbuilt */
    mp__numerics_free(m->num);
    m->num = nu;
    return MP_OK;
}

/* The hooks. A training step that takes statistics starts at the first
   layer's forward pass: everything of the previous one is cleared. */
static mp_status mp__numerics_take(mp_model *m, int layer, mp_numerics_kind k, const void *x, mp_dtype t, size_t n) {
    mp__numerics *nu = m->num;
    mp_tensor_stats *s = mp__numerics_at(nu, layer, (int)k);
    size_t bytes = n * mp__dtypes[t].size;
    memset(s, 0, sizeof *s);
    if (!n) return MP_OK;
    if (m->be->device_memory) { /* diagnostics are for debugging runs: the tensor comes to the host */
        if (bytes > nu->copy_bytes) {
            mp__free(nu->copy);
            nu->copy_bytes = 0;
            if (!(nu->copy = mp__alloc(bytes))) return mp__fail(m, MP_ERR_ALLOC, "numerics: a host copy of %z bytes", bytes);
            nu->copy_bytes = bytes;
        }
        m->be->copy(m->ctx, nu->copy, x, bytes, MP_COPY_TO_HOST);
        x = nu->copy;
    }
    (void)mp_tensor_stats_compute(x, t, n, nu->desc.target, s);
    return MP_OK;
}

static void mp__numerics_begin(mp_model *m) {
    mp__numerics *nu = m->num;
    uint64_t step = m->opt.iteration + 1;
    nu->output = nu->desc.every && step % (uint64_t)nu->desc.every == 0;
    nu->active = nu->output || nu->desc.check;
    if (!nu->active) return;
    nu->step = step;
    nu->scale = mp_current_loss_scale(m);
    nu->stop_layer = -1;
    memset(nu->stats, 0, (size_t)m->n_layers * MP_NUMERICS_KIND_COUNT * sizeof *nu->stats);
}

/* check-numerics: Inf or NaN in what the layer's pass produced stops the step. */
static mp_status mp__numerics_check(mp_model *m, int layer, int backward) {
    mp__numerics *nu = m->num;
    char detail[192];
    mp__text t;
    uint64_t inf, nan;
    if (!nu->desc.check) return MP_OK;
    mp__pass_nonfinite(nu, layer, backward, &inf, &nan);
    if (!inf && !nan) return MP_OK;
    nu->stop_layer = layer;
    nu->stop_backward = backward;
    t.buf = detail;
    t.cap = sizeof detail;
    t.len = 0;
    mp__stop_text(m, &t);
    mp__fail(m, MP_ERR_NONFINITE, "%s", detail);
#ifndef MIXPREC_NO_STDIO
    if (nu->desc.print) mp__print_text(m, mp__numerics_text);
#endif
    return MP_ERR_NONFINITE;
}

static mp_status mp__numerics_forward(mp_model *m, int layer) {
    const mp__layer *l = &m->layers[layer];
    if (!m->training) return MP_OK;
    if (layer == 0) mp__numerics_begin(m);
    if (!m->num->active) return MP_OK;
    mp_status st;
    if ((st = mp__numerics_take(m, layer, MP_NUMERICS_ACTIVATIONS, l->y, l->yt, m->batch * l->out_size)) != MP_OK ||
        (st = mp__numerics_take(m, layer, MP_NUMERICS_WEIGHTS, l->w, MP_FLOAT32, mp__params(l))) != MP_OK)
        return st;
    return mp__numerics_check(m, layer, 0);
}

static int mp__numerics_active(const mp_model *m) { return m->num && m->num->active; }

/* Under loss scaling Inf/NaN gradients skip the step by design: counted, not stopped at. */
static mp_status mp__numerics_backward(mp_model *m, int layer, const void *dx) {
    const mp__layer *l = &m->layers[layer];
    if (!m->num->active) return MP_OK;
    mp_status st;
    if ((st = mp__numerics_take(m, layer, MP_NUMERICS_SCALED_GRADIENTS, l->gc, l->wt, mp__params(l))) != MP_OK ||
        (st = mp__numerics_take(m, layer, MP_NUMERICS_INPUT_GRADIENTS, dx, l->xt[0], dx ? m->batch * l->in_size : 0)) !=
            MP_OK)
        return st;
    return m->has_loss_scale ? MP_OK : mp__numerics_check(m, layer, 1);
}

static mp_status mp__numerics_unscaled(mp_model *m) {
    mp__numerics *nu = m->num;
    mp_status st = MP_OK;
    int i;
    if (!nu->active) return MP_OK;
    for (i = 0; i < m->n_layers && st == MP_OK; i++)
        st = mp__numerics_take(m, i, MP_NUMERICS_GRADIENTS, m->layers[i].g, MP_FLOAT32, mp__params(&m->layers[i]));
    if (st != MP_OK) return st;
    if (!nu->output) return MP_OK;
#ifndef MIXPREC_NO_STDIO
    if (nu->desc.print) mp__print_text(m, mp__numerics_text);
    if (nu->desc.csv_path) return mp__numerics_csv(m, nu, 0);
#endif
    return MP_OK;
}

/* The queries */
static int mp__numerics_taken(const mp_model *m) { return m && m->num && m->num->step; }

MIXPREC_API uint64_t mp_model_numerics_step(const mp_model *m) { return mp__numerics_taken(m) ? m->num->step : 0; }

MIXPREC_API mp_status mp_model_numerics(const mp_model *m, int layer, mp_numerics_kind what, mp_tensor_stats *out) {
    if (!m || !out) return MP_ERR_NULL;
    if (layer < 0 || layer >= m->n_layers || (unsigned)what >= (unsigned)MP_NUMERICS_KIND_COUNT) return MP_ERR_ARG;
    if (!mp__numerics_taken(m)) return MP_ERR_STATE;
    *out = *mp__numerics_at(m->num, layer, (int)what);
    return MP_OK;
}

MIXPREC_API mp_status mp_model_recommend_loss_scale(const mp_model *m, mp_loss_scale_advice *out) {
    mp_tensor_stats all;
    int i;
    if (!m || !out) return MP_ERR_NULL;
    if (!mp__numerics_taken(m)) return MP_ERR_STATE;
    memset(&all, 0, sizeof all);
    for (i = 0; i < m->n_layers; i++) mp__stats_merge(&all, mp__numerics_at(m->num, i, MP_NUMERICS_GRADIENTS));
    return mp_recommend_loss_scale(&all, 1, out);
}

MIXPREC_API mp_status mp_numerics_report(const mp_model *m, char *buf, size_t size) {
    mp__text t;
    if (!m || !buf) return MP_ERR_NULL;
    if (size == 0) return MP_ERR_SIZE;
    buf[0] = '\0';
    if (!mp__numerics_taken(m)) return MP_ERR_STATE;
    t.buf = buf;
    t.cap = size;
    t.len = 0;
    mp__numerics_text(m, &t);
    return t.len < size ? MP_OK : MP_ERR_SIZE;
}

/* The Tensor Core advisor: one line per dimension that is not a multiple of 8. */
static void mp__pad8(mp__text *t, int *found, const mp__layer *l, const char *what, size_t size) {
    if (size % 8 == 0) return;
    (*found)++;
    mp__put(t, "  ");
    if (l) {
        mp__put(t, l->name);
        mp__put(t, " (");
        mp__put(t, mp__kinds[l->desc.kind].type);
        mp__put(t, l->dt == MP_FLOAT32 ? ", float32: for when it computes in 16 bits): " : ", 16-bit compute): ");
    }
    mp__put(t, what);
    mp__put(t, " ");
    mp__put_uint(t, size, 0);
    mp__put(t, " -> pad to ");
    mp__put_uint(t, (size + 7) / 8 * 8, 0);
    mp__put(t, "\n");
}

MIXPREC_API mp_status mp_model_tensor_core_advice(const mp_model *m, int batch_size, char *buf, size_t size,
                                                  int *issues) {
    mp__text t;
    int found = 0, i;
    if (!m || !buf) return MP_ERR_NULL;
    if (size == 0) return MP_ERR_SIZE;
    if (batch_size < 0) return MP_ERR_ARG;
    t.buf = buf;
    t.cap = size;
    t.len = 0;
    buf[0] = '\0';
    mp__put(&t, "Tensor Cores: float16/bfloat16 products need every dimension a multiple of 8 "
                "(NVIDIA's cuBLAS and cuDNN guidance).\n");
    for (i = 0; i < m->n_layers; i++) {
        const mp__layer *l = &m->layers[i];
        if (l->desc.kind == MP_DENSE) {
            mp__pad8(&t, &found, l, "input features", mp__last_axis(l));
            mp__pad8(&t, &found, l, "units", (size_t)l->desc.units);
        } else if (l->desc.kind == MP_CONV2D) {
            mp__pad8(&t, &found, l, "input channels", (size_t)l->geom.c);
            mp__pad8(&t, &found, l, "filters", (size_t)l->desc.filters);
        } else if (l->desc.kind == MP_MULTI_HEAD_ATTENTION) {
            mp__pad8(&t, &found, l, "features", mp__last_axis(l));
            mp__pad8(&t, &found, l, "num_heads x key_dim", (size_t)l->desc.num_heads * (size_t)l->desc.key_dim);
        }
    }
    if (batch_size) mp__pad8(&t, &found, NULL, "batch size", (size_t)batch_size);
    if (!found) mp__put(&t, "  every dimension is a multiple of 8: nothing to pad.\n");
    else { mp__put(&t, "  "); mp__put_int(&t, found); mp__put(&t, found == 1 ? " finding.\n" : " findings.\n"); }
    if (issues) *issues = found;
    return t.len < size ? MP_OK : MP_ERR_SIZE;
}

/* >>checkpoints: one container for checkpoints ('C') and inference weights
   ('W'), written and read through one description of the layout
   (mp__ckpt_body), so that writer and reader cannot drift apart. Every
   number goes out little-endian byte by byte, floats as their bit
   patterns: the bytes are the same on every host.
       0    8  "MIXPREC" and the kind byte
       8    4  format version
       12   8  length of the whole file in bytes
       20   .  the body (mp__ckpt_body)
       n-4  4  CRC-32 (IEEE 802.3, as zlib's crc32) of bytes [0, n-4)
   Every version keeps this frame, so that a file of another version is
   told from a corrupt one. Reading checks magic, length, checksum, kind and
   version; walks the body comparing the model's fingerprint and reading the
   state aside (of the arrays, only where they start); checks the state's
   ranges; and only then copies it into the model. */
enum {
    MP__CKPT_VERSION = 4,        /* 4: weight decay, clipping, a warmup, after the schedule; each layer's
                                    variables weight decay skips. Written only for a model that uses
                                    them (mp__ckpt_version) */
    MP__CKPT_GRAPH_VERSION = 3,  /* 3: each layer's inputs and state count; the state after the weights */
    MP__CKPT_CHAIN_VERSION = 2,  /* 2: the learning-rate schedule after epsilon; still written for a
                                    chain of layers without state, whose bytes it keeps as they were */
    MP__CKPT_OLDEST_VERSION = 1, /* still read: a constant learning rate */
    MP__CKPT_HEAD = 20
};

static void mp__le_put(unsigned char *p, uint64_t v, size_t bytes) {
    size_t i;
    for (i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8u * i));
}

static uint64_t mp__le_get(const unsigned char *p, size_t bytes) {
    uint64_t v = 0;
    while (bytes--) v = v << 8 | p[bytes];
    return v;
}

/* A table built on the stack each call (1 KB, 2048 steps): no global state. */
static uint32_t mp__crc32(const unsigned char *p, size_t n) {
    uint32_t t[256], c;
    size_t i;
    int k;
    for (i = 0; i < 256; i++) {
        for (c = (uint32_t)i, k = 0; k < 8; k++) c = c & 1u ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[i] = c;
    }
    for (c = 0xFFFFFFFFu, i = 0; i < n; i++) c = t[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* A byte cursor: writing (out, or out NULL to measure) or reading (in). */
typedef struct mp__io {
    unsigned char *out;
    const unsigned char *in;
    size_t pos, end;  /* reading: where the body ends */
    int past_end;     /* reading: the layout ran past the body; writing: the size overflows */
} mp__io;

/* Steps over count items of size bytes; returns where they start. */
static size_t mp__io_skip(mp__io *io, size_t count, size_t size) {
    size_t at = io->pos, room = io->in ? io->end - io->pos : SIZE_MAX - io->pos;
    if (io->past_end || (size && count > room / size)) io->past_end = 1;
    else io->pos += count * size;
    return at;
}

/* One unsigned field: writes v and returns it, or returns the value read
   (0 past the end). */
static uint64_t mp__io_uint(mp__io *io, uint64_t v, size_t bytes) {
    size_t at = mp__io_skip(io, 1, bytes);
    if (io->past_end) return 0;
    if (io->out) mp__le_put(io->out + at, v, bytes);
    return io->in ? mp__le_get(io->in + at, bytes) : v;
}

static float mp__io_f32(mp__io *io, float x) { return mp__f32_from_bits((uint32_t)mp__io_uint(io, mp__f32_bits(x), 4)); }
static int mp__io_int(mp__io *io, int v) { return (int)(int32_t)(uint32_t)mp__io_uint(io, (uint32_t)v, 4); }

static uint32_t mp__narrow_bits(uint32_t b, mp_dtype dt) {
    return dt == MP_FLOAT16 ? mp__f16_from_f32_bits(b) : dt == MP_BFLOAT16 ? mp__bf16_from_f32_bits(b) : b;
}
static uint32_t mp__widen_bits(uint32_t b, mp_dtype dt) {
    return dt == MP_FLOAT16    ? mp__f32_bits_from_f16((uint16_t)b)
           : dt == MP_BFLOAT16 ? mp__f32_bits_from_bf16((uint16_t)b)
                               : b;
}

/* n float32 values stored as dt, each rounded once; reading only steps
   over them (mp__io_decode copies them once everything is checked). */
static size_t mp__io_floats(mp__io *io, const float *src, size_t n, mp_dtype dt) {
    size_t es = mp__dtypes[dt].size, at = mp__io_skip(io, n, es), i;
    for (i = 0; io->out && !io->past_end && i < n; i++)
        mp__le_put(io->out + at + i * es, mp__narrow_bits(mp__f32_bits(src[i]), dt), es);
    return at;
}

static void mp__io_decode(float *dst, const unsigned char *p, size_t n, mp_dtype dt) {
    size_t es = mp__dtypes[dt].size, i;
    for (i = 0; i < n; i++) dst[i] = mp__f32_from_bits(mp__widen_bits((uint32_t)mp__le_get(p + i * es, es), dt));
}

typedef struct mp__ckpt {
    mp__io io;
    int kind;             /* 'C' checkpoint, 'W' inference weights */
    uint32_t version;     /* of the format: MP__CKPT_VERSION when writing */
    mp_dtype dt;          /* of the weights */
    uint64_t got;         /* the last value mp__differs read */
    mp_opt_step opt;      /* the state read aside */
    mp_loss_scale ls;
    size_t weights, state, slots, rngs, no_decay; /* where the arrays start */
    float *w, *s;         /* the weights and slots where the host reads and writes them */
    float *copy;          /* their host copy, for a device backend */
} mp__ckpt;

/* The weights and slots where the host can reach them: the backend's own
   memory on the CPU; a host copy for a device backend (fetched for a save,
   sent back by mp__ckpt_commit after a load). */
static mp_status mp__ckpt_view(mp_model *m, mp__ckpt *c, int fetch) {
    size_t nw = m->n_params + m->n_state, n = nw + m->slot_count; /* built: no overflow */
    if (!m->be->device_memory) {
        c->w = m->w;
        c->s = (float *)m->slots_block;
        return MP_OK;
    }
    if (n > SIZE_MAX / sizeof(float) || !(c->copy = (float *)mp__alloc(n * sizeof(float))))
        return mp__fail(m, MP_ERR_ALLOC, "a host copy of the weights and slots (%z floats)", n);
    c->w = c->copy;
    c->s = c->copy + nw;
    if (!fetch) return MP_OK;
    m->be->copy(m->ctx, c->w, m->w, nw * sizeof(float), MP_COPY_TO_HOST);
    if (m->slot_count) m->be->copy(m->ctx, c->s, m->slots_block, m->slot_count * sizeof(float), MP_COPY_TO_HOST);
    return mp__sync(m);
}

/* Reading: whether the file's field differs from the model's value. */
static int mp__differs(mp__ckpt *c, uint64_t v, size_t bytes) {
    c->got = mp__io_uint(&c->io, v, bytes);
    return c->got != v;
}

static const char *mp__kind_type(uint64_t k) {
    return k && k < MP_LAYER_KIND_COUNT ? mp__kinds[k].type : "layer of an unknown kind";
}

static const char *mp__ckpt_policy_name(uint64_t compute, uint64_t variable) {
    mp_policy p;
    if (compute >= MP_DTYPE_COUNT || variable >= MP_DTYPE_COUNT) return "(unknown)";
    p.compute_dtype = (mp_dtype)compute;
    p.variable_dtype = (mp_dtype)variable;
    return mp_policy_name(p) ? mp_policy_name(p) : "(unknown)";
}

/* The version a model is written in: the oldest that holds it. */
static uint32_t mp__ckpt_version(const mp_model *m) {
    const mp_optimizer_desc *o = &m->opt.cfg;
    if (m->compiled && (o->weight_decay != 0.0f || o->clipnorm != 0.0f || o->clipvalue != 0.0f ||
                        o->global_clipnorm != 0.0f || o->schedule.warmup_target != 0.0f ||
                        o->gradient_accumulation_steps != 0))
        return MP__CKPT_VERSION;
    return mp__is_chain(m) && !m->n_state ? MP__CKPT_CHAIN_VERSION : MP__CKPT_GRAPH_VERSION;
}

/* Reading or writing a field that version 3 added: before it, the file
   holds a chain without state, and the field is `chain` there. */
static int mp__ckpt_graph_differs(mp__ckpt *c, uint64_t v, size_t bytes, uint64_t chain) {
    if (c->version >= 3) return mp__differs(c, v, bytes);
    c->got = chain;
    return chain != v;
}

/* A layer's connections: how many inputs, and each one's id as
   mp_model_call numbers them (0: the model's input, else 1 + the index);
   in a chain layer i reads id i. */
static mp_status mp__ckpt_inputs(mp_model *m, mp__ckpt *c, int i) {
    const mp__layer *l = &m->layers[i];
    int k;
    if (mp__ckpt_graph_differs(c, (uint64_t)l->n_in, 4, 1))
        return mp__fail(m, MP_ERR_SHAPE, "layer %d (%s) reads %z inputs in the file, %d in the model", i, l->name,
                        (size_t)c->got, l->n_in);
    for (k = 0; k < l->n_in; k++)
        if (mp__ckpt_graph_differs(c, (uint64_t)(l->in[k] + 1), 4, (uint64_t)i))
            return mp__fail(m, MP_ERR_SHAPE, "layer %d (%s): its input %d is layer id %z in the file, %d in the model "
                            "(0: the model's input): the file's model is connected otherwise", i, l->name, k,
                            (size_t)c->got, l->in[k] + 1);
    return MP_OK;
}

/* What identifies the model: the input shape; per layer its kind, its
   inputs (version 3), policy (a checkpoint's must match; weights may go to
   another policy), kernel and bias sizes, state size (version 3) and output
   shape. */
static mp_status mp__ckpt_model(mp_model *m, mp__ckpt *c) {
    int i, r;
    if (mp__differs(c, (uint64_t)m->in_rank, 4))
        return mp__fail(m, MP_ERR_SHAPE, "input rank %z in the file, %d in the model", (size_t)c->got, m->in_rank);
    for (r = 0; r < m->in_rank; r++)
        if (mp__differs(c, (uint64_t)m->in_shape[r], 4))
            return mp__fail(m, MP_ERR_SHAPE, "input dimension %d is %z in the file, %d in the model", r,
                            (size_t)c->got, m->in_shape[r]);
    if (mp__differs(c, (uint64_t)m->n_layers, 4))
        return mp__fail(m, MP_ERR_SHAPE, "%z layers in the file, %d in the model", (size_t)c->got, m->n_layers);
    for (i = 0; i < m->n_layers; i++) {
        const mp__layer *l = &m->layers[i];
        uint64_t ct, vt;
        mp_status st;
        if (mp__differs(c, (uint64_t)l->desc.kind, 4))
            return mp__fail(m, MP_ERR_SHAPE, "layer %d (%s) is a %s in the model, a %s in the file", i, l->name,
                            mp__kinds[l->desc.kind].type, mp__kind_type(c->got));
        if ((st = mp__ckpt_inputs(m, c, i)) != MP_OK) return st;
        ct = mp__io_uint(&c->io, (uint64_t)l->policy.compute_dtype, 4);
        vt = mp__io_uint(&c->io, (uint64_t)l->policy.variable_dtype, 4);
        if (c->kind == 'C' && (ct != (uint64_t)l->policy.compute_dtype || vt != (uint64_t)l->policy.variable_dtype))
            return mp__fail(m, MP_ERR_SHAPE, "layer %d (%s): policy %s in the file, %s in the model; a checkpoint "
                            "resumes the same model: give the layer the file's policy", i, l->name,
                            mp__ckpt_policy_name(ct, vt), mp_policy_name(l->policy));
        if (mp__differs(c, (uint64_t)l->n_kernel, 8))
            return mp__fail(m, MP_ERR_SHAPE, "layer %d (%s): %z kernel weights in the file, %z in the model", i, l->name,
                            (size_t)c->got, l->n_kernel);
        if (mp__differs(c, (uint64_t)l->n_bias, 8))
            return mp__fail(m, MP_ERR_SHAPE, "layer %d (%s): %z biases in the file, %z in the model", i, l->name,
                            (size_t)c->got, l->n_bias);
        if (mp__ckpt_graph_differs(c, (uint64_t)l->n_state, 8, 0))
            return mp__fail(m, MP_ERR_SHAPE, "layer %d (%s): %z non-trainable weights (moving statistics) in the file, "
                            "%z in the model", i, l->name, (size_t)c->got, l->n_state);
        if (mp__differs(c, (uint64_t)l->out_rank, 4))
            return mp__fail(m, MP_ERR_SHAPE, "layer %d (%s): output rank %z in the file, %d in the model", i, l->name,
                            (size_t)c->got, l->out_rank);
        for (r = 0; r < l->out_rank; r++)
            if (mp__differs(c, (uint64_t)l->out_shape[r], 4))
                return mp__fail(m, MP_ERR_SHAPE, "layer %d (%s): output dimension %d is %z in the file, %d in the model",
                                i, l->name, r, (size_t)c->got, l->out_shape[r]);
    }
    return MP_OK;
}

static void mp__io_loss_scale(mp__io *io, mp_loss_scale *to, const mp_loss_scale *from) {
    to->config.fixed = mp__io_int(io, from->config.fixed);
    to->config.initial_scale = mp__io_f32(io, from->config.initial_scale);
    to->config.growth_interval = mp__io_int(io, from->config.growth_interval);
    to->config.min_scale = mp__io_f32(io, from->config.min_scale);
    to->config.max_scale = mp__io_f32(io, from->config.max_scale);
    to->config.hysteresis = mp__io_int(io, from->config.hysteresis);
    to->scale = mp__io_f32(io, from->scale);
    to->good_steps = mp__io_uint(io, from->good_steps, 8);
    to->skipped_steps = mp__io_uint(io, from->skipped_steps, 8);
    to->steps = mp__io_uint(io, from->steps, 8);
    to->overflows_left = mp__io_int(io, from->overflows_left);
}

static void mp__io_optimizer(mp__io *io, uint32_t version, mp_opt_step *to, const mp_opt_step *from) {
    const mp_lr_schedule *fs = &from->cfg.schedule;
    mp_lr_schedule *ts = &to->cfg.schedule;
    to->cfg.kind = from->cfg.kind;
    to->cfg.learning_rate = mp__io_f32(io, from->cfg.learning_rate);
    to->cfg.momentum = mp__io_f32(io, from->cfg.momentum);
    to->cfg.nesterov = mp__io_int(io, from->cfg.nesterov);
    to->cfg.rho = mp__io_f32(io, from->cfg.rho);
    to->cfg.beta_1 = mp__io_f32(io, from->cfg.beta_1);
    to->cfg.beta_2 = mp__io_f32(io, from->cfg.beta_2);
    to->cfg.epsilon = mp__io_f32(io, from->cfg.epsilon);
    memset(ts, 0, sizeof *ts); /* version 1: a constant rate */
    if (version >= 2) {
        uint64_t kind = mp__io_uint(io, (uint64_t)fs->kind, 4);
        ts->kind = kind < MP_LR_SCHEDULE_COUNT ? (mp_lr_schedule_kind)kind : MP_LR_SCHEDULE_COUNT; /* checked later */
        ts->initial_learning_rate = mp__io_f32(io, fs->initial_learning_rate);
        ts->decay_steps = mp__io_uint(io, fs->decay_steps, 8);
        ts->decay_rate = mp__io_f32(io, fs->decay_rate);
        ts->staircase = mp__io_int(io, fs->staircase);
        ts->alpha = mp__io_f32(io, fs->alpha);
    }
    if (version >= 4) { /* before it: none of these, all 0 */
        ts->warmup_target = mp__io_f32(io, fs->warmup_target);
        ts->warmup_steps = mp__io_uint(io, fs->warmup_steps, 8);
        to->cfg.weight_decay = mp__io_f32(io, from->cfg.weight_decay);
        to->cfg.clipnorm = mp__io_f32(io, from->cfg.clipnorm);
        to->cfg.clipvalue = mp__io_f32(io, from->cfg.clipvalue);
        to->cfg.global_clipnorm = mp__io_f32(io, from->cfg.global_clipnorm);
        to->cfg.gradient_accumulation_steps = mp__io_int(io, from->cfg.gradient_accumulation_steps);
        to->accumulated = mp__io_uint(io, from->accumulated, 8);
    }
    to->cfg.no_weight_decay = to->cfg.weight_decay == 0.0f; /* as resolved */
    to->iteration = mp__io_uint(io, from->iteration, 8);
}

static const char *mp__optimizer_type(uint64_t k) {
    static const char *const names[MP_OPTIMIZER_COUNT] = {"RMSprop", "SGD", "Adam", "AdamW"};
    return k < MP_OPTIMIZER_COUNT ? names[k] : "an unknown optimizer";
}

/* The body after the header. A checkpoint: the fingerprint; whether it was
   compiled, then loss, optimizer, loss scaling on or off and the slot count;
   the weights; each layer's generator; the optimizer's config, iteration and
   slots; the loss-scale state. Inference weights: the fingerprint and the
   weights. */
static mp_status mp__ckpt_body(mp_model *m, mp__ckpt *c) {
    mp__io *io = &c->io;
    mp_status st = mp__ckpt_model(m, c);
    uint64_t dt;
    int i, ckpt = c->kind == 'C';
    if (st != MP_OK) return st;
    if (ckpt && mp__differs(c, (uint64_t)m->compiled, 4))
        return mp__fail(m, MP_ERR_STATE, "%s",
                        m->compiled ? "the checkpoint was saved before compile(): load it before compiling"
                                    : "the checkpoint holds optimizer and loss-scale state: compile() the model first");
    if (ckpt && m->compiled) {
        if (mp__differs(c, (uint64_t)m->compile.loss, 4))
            return mp__fail(m, MP_ERR_SHAPE, "loss %z in the file, %d in the model", (size_t)c->got, (int)m->compile.loss);
        if (mp__differs(c, (uint64_t)m->opt.cfg.kind, 4))
            return mp__fail(m, MP_ERR_SHAPE, "optimizer %s in the file, %s in the model", mp__optimizer_type(c->got),
                            mp__optimizer_type((uint64_t)m->opt.cfg.kind));
        if (mp__differs(c, (uint64_t)m->has_loss_scale, 4))
            return mp__fail(m, MP_ERR_SHAPE, m->has_loss_scale ? "the model scales the loss, the file's did not"
                                                               : "the file's model scaled the loss, this one does not");
        if (mp__differs(c, (uint64_t)m->slot_count, 8))
            return mp__fail(m, MP_ERR_SHAPE, "%z optimizer slot values in the file, %z in the model (SGD momentum?)",
                            (size_t)c->got, m->slot_count);
    }
    dt = mp__io_uint(io, (uint64_t)c->dt, 4);
    if (dt >= MP_DTYPE_COUNT || (ckpt && dt != MP_FLOAT32))
        return mp__fail(m, MP_ERR_FORMAT, "corrupt: weights of dtype %z", (size_t)dt);
    c->dt = (mp_dtype)dt;
    c->weights = mp__io_floats(io, c->w, m->n_params, c->dt);
    c->state = mp__io_floats(io, c->w ? c->w + m->n_params : NULL, m->n_state, MP_FLOAT32); /* none before 3 */
    if (!ckpt) return MP_OK;
    c->rngs = io->pos;
    for (i = 0; i < m->n_layers; i++) (void)mp__io_uint(io, m->layers[i].rng, 8);
    if (!m->compiled) return MP_OK;
    mp__io_optimizer(io, c->version, &c->opt, &m->opt);
    c->no_decay = io->pos;
    for (i = 0; i < m->n_layers && c->version >= 4; i++) (void)mp__io_uint(io, m->layers[i].no_decay, 1);
    c->slots = mp__io_floats(io, c->s, m->slot_count, MP_FLOAT32);
    if (m->has_loss_scale) mp__io_loss_scale(io, &c->ls, &m->seen.ls);
    return MP_OK;
}

/* The state read aside must be one training could have reached: moving
   variances >= 0 (each BatchNormalization's state: means, then variances),
   an optimizer config compile accepts, mean squares >= 0, a loss-scale
   state within its config. */
static mp_status mp__ckpt_check(mp_model *m, mp__ckpt *c) {
    mp_optimizer_desc o;
    mp_loss_scale ls;
    size_t slots, i, at = c->state;
    int li;
    for (li = 0; li < m->n_layers; at += 4u * m->layers[li].n_state, li++)
        for (i = m->layers[li].n_state / 2; i < m->layers[li].n_state; i++)
            if (!(mp__f32_from_bits((uint32_t)mp__le_get(c->io.in + at + 4u * i, 4)) >= 0.0f))
                return mp__fail(m, MP_ERR_FORMAT, "corrupt: layer %d (%s): moving variance %z is negative or NaN", li,
                                m->layers[li].name, i - m->layers[li].n_state / 2);
    if (c->kind != 'C' || !m->compiled) return MP_OK;
    if (mp__resolve_optimizer(m, &c->opt.cfg, &o) != MP_OK ||
        !mp__mul_ok(m->n_params, (size_t)mp__slots_per_weight(&o) + (o.gradient_accumulation_steps > 0), &slots) ||
        slots != m->slot_count || c->opt.accumulated >= (uint64_t)(o.gradient_accumulation_steps + !o.gradient_accumulation_steps))
        return mp__fail(m, MP_ERR_FORMAT, "corrupt: optimizer config out of range");
    for (li = 0; li < m->n_layers && c->version >= 4; li++)
        if (c->io.in[c->no_decay + (size_t)li] >> mp__layer_var_count(&m->layers[li]))
            return mp__fail(m, MP_ERR_FORMAT, "corrupt: layer %d (%s): weight-decay exclusions out of range", li,
                            m->layers[li].name);
    c->opt.cfg = o;
    if (o.kind != MP_SGD) { /* Adam's and RMSprop's mean squares v (the last n_params slots): >= 0, not NaN */
        const unsigned char *v = c->io.in + c->slots + ((size_t)mp__slots_per_weight(&o) - 1u) * m->n_params * 4u;
        for (i = 0; i < m->n_params; i++)
            if (!(mp__f32_from_bits((uint32_t)mp__le_get(v + 4u * i, 4)) >= 0.0f))
                return mp__fail(m, MP_ERR_FORMAT, "corrupt: the optimizer's mean square v of weight %z is negative or "
                                "NaN", i);
    }
    if (!m->has_loss_scale) return MP_OK;
    if (mp_loss_scale_init(&ls, &c->ls.config) != MP_OK || !(c->ls.scale > 0.0f && c->ls.scale <= FLT_MAX) ||
        c->ls.overflows_left < 1 || c->ls.overflows_left > ls.config.hysteresis ||
        c->ls.good_steps >= (uint64_t)ls.config.growth_interval || c->ls.skipped_steps > c->ls.steps)
        return mp__fail(m, MP_ERR_FORMAT, "corrupt: loss-scale state out of range");
    c->ls.config = ls.config;
    return MP_OK;
}

static mp_status mp__ckpt_commit(mp_model *m, const mp__ckpt *c) {
    const unsigned char *in = c->io.in;
    int i, state = c->kind == 'C' && m->compiled;
    mp__io_decode(c->w, in + c->weights, m->n_params, c->dt);
    mp__io_decode(c->w + m->n_params, in + c->state, m->n_state, MP_FLOAT32);
    if (state) mp__io_decode(c->s, in + c->slots, m->slot_count, MP_FLOAT32);
    if (c->copy) { /* a device backend: send them back */
        m->be->copy(m->ctx, m->w, c->w, (m->n_params + m->n_state) * sizeof(float), MP_COPY_TO_BACKEND);
        if (state && m->slot_count) m->be->copy(m->ctx, m->slots_block, c->s, m->slot_count * sizeof(float), MP_COPY_TO_BACKEND);
    }
    m->casts_fresh = 0; /* the next forward casts the new weights */
    mp__loop_move(m, MP__CALL_RESET);
    if (c->kind == 'C')
        for (i = 0; i < m->n_layers; i++) m->layers[i].rng = mp__le_get(in + c->rngs + 8u * (size_t)i, 8);
    if (state) {
        m->opt = c->opt;
        for (i = 0; i < m->n_layers; i++) m->layers[i].no_decay = c->version >= 4 ? in[c->no_decay + (size_t)i] : 0u;
        if (m->has_loss_scale) m->seen.ls = c->ls;
        m->be->copy(m->ctx, m->state, &m->seen, sizeof m->seen, MP_COPY_TO_BACKEND);
    }
    return mp__sync(m);
}

/* Writing: the header, the body (a model always matches itself), room for
   the checksum. */
static void mp__ckpt_pass(mp_model *m, mp__ckpt *c, uint64_t total) {
    static const char magic[] = "MIXPREC";
    size_t i;
    for (i = 0; i < 7; i++) (void)mp__io_uint(&c->io, (unsigned char)magic[i], 1);
    (void)mp__io_uint(&c->io, (uint64_t)c->kind, 1);
    (void)mp__io_uint(&c->io, c->version, 4);
    (void)mp__io_uint(&c->io, total, 8);
    (void)mp__ckpt_body(m, c);
    (void)mp__io_skip(&c->io, 1, 4);
}

static mp_status mp__ckpt_write(mp_model *m, int kind, mp_dtype dt, void *buf, size_t cap, size_t *len) {
    mp__ckpt c;
    mp_status st;
    size_t total;
    if (!m) return MP_ERR_NULL;
    if (!len) return mp__fail(m, MP_ERR_NULL, "len is NULL");
    if (!mp__dtype_valid(dt)) return mp__fail(m, MP_ERR_DTYPE, "export dtype %d", (int)dt);
    if ((st = mp_model_build(m)) != MP_OK) return st;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.version = mp__ckpt_version(m);
    c.dt = dt;
    mp__ckpt_pass(m, &c, 0); /* measures */
    if (c.io.past_end) return mp__fail(m, MP_ERR_SIZE, "the file's size overflows size_t");
    *len = total = c.io.pos;
    if (!buf) return MP_OK;
    if (cap < total) return mp__fail(m, MP_ERR_SIZE, "it takes %z bytes, the buffer has %z", total, cap);
    if ((st = mp__ckpt_view(m, &c, 1)) != MP_OK) {
        mp__free(c.copy);
        return st;
    }
    memset(&c.io, 0, sizeof c.io);
    c.io.out = (unsigned char *)buf;
    mp__ckpt_pass(m, &c, total);
    mp__le_put(c.io.out + total - 4, mp__crc32(c.io.out, total - 4), 4);
    mp__free(c.copy);
    return MP_OK;
}

static mp_status mp__ckpt_read(mp_model *m, int kind, const void *buf, size_t len) {
    const unsigned char *b = (const unsigned char *)buf;
    const char *what = kind == 'C' ? "checkpoint" : "weights file";
    uint64_t version, total;
    mp__ckpt c;
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if (!buf) return mp__fail(m, MP_ERR_NULL, "no buffer to load from");
    if (len == 0 || memcmp(b, "MIXPREC", len < 7 ? len : 7) != 0)
        return mp__fail(m, MP_ERR_FORMAT, "not a mixprec %s (%s)", what, len ? "no MIXPREC magic" : "empty");
    if (len < MP__CKPT_HEAD + 4) return mp__fail(m, MP_ERR_FORMAT, "truncated: %z bytes, less than a header", len);
    total = mp__le_get(b + 12, 8);
    if (total > len) return mp__fail(m, MP_ERR_FORMAT, "truncated: %z of %z bytes", len, (size_t)total);
    if (total < len) return mp__fail(m, MP_ERR_FORMAT, "corrupt: %z bytes, the header says %z", len, (size_t)total);
    if (mp__crc32(b, len - 4) != mp__le_get(b + len - 4, 4))
        return mp__fail(m, MP_ERR_FORMAT, "checksum mismatch: the %s is corrupt", what);
    /* the checksum holds: what follows is what was written */
    if (b[7] != kind && (b[7] == 'C' || b[7] == 'W'))
        return mp__fail(m, MP_ERR_FORMAT, "%s",
                        b[7] == 'C' ? "a checkpoint, not inference weights: read it with mp_model_load"
                                    : "inference weights, not a checkpoint: read them with mp_model_import_weights");
    if (b[7] != kind) return mp__fail(m, MP_ERR_FORMAT, "not a mixprec %s (unknown kind byte)", what);
    version = mp__le_get(b + 8, 4);
    if (version < MP__CKPT_OLDEST_VERSION || version > MP__CKPT_VERSION)
        return mp__fail(m, MP_ERR_FORMAT, "version %z not supported: this mixprec reads versions %d to %d",
                        (size_t)version, (int)MP__CKPT_OLDEST_VERSION, (int)MP__CKPT_VERSION);
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.version = (uint32_t)version;
    c.io.in = b;
    c.io.pos = MP__CKPT_HEAD;
    c.io.end = len - 4;
    st = mp__ckpt_body(m, &c);
    /* a mismatch found after reading past the end is an artefact of the short body */
    if (c.io.past_end || (st == MP_OK && c.io.pos != c.io.end))
        return mp__fail(m, MP_ERR_FORMAT, "corrupt: the %s's contents do not fill its length", what);
    if (st == MP_OK) st = mp__ckpt_check(m, &c);
    if (st == MP_OK) st = mp_model_build(m); /* only now: a file refused leaves the model unbuilt */
    if (st == MP_OK) st = mp__ckpt_view(m, &c, 0);
    if (st == MP_OK) st = mp__ckpt_commit(m, &c);
    mp__free(c.copy);
    return st;
}

MIXPREC_API mp_status mp_model_save_to_memory(mp_model *m, void *buf, size_t cap, size_t *len) {
    return mp__ckpt_write(m, 'C', MP_FLOAT32, buf, cap, len);
}
MIXPREC_API mp_status mp_model_load_from_memory(mp_model *m, const void *buf, size_t len) {
    return mp__ckpt_read(m, 'C', buf, len);
}
MIXPREC_API mp_status mp_model_export_weights_to_memory(mp_model *m, mp_dtype dtype, void *buf, size_t cap,
                                                        size_t *len) {
    return mp__ckpt_write(m, 'W', dtype, buf, cap, len);
}
MIXPREC_API mp_status mp_model_import_weights_from_memory(mp_model *m, const void *buf, size_t len) {
    return mp__ckpt_read(m, 'W', buf, len);
}

#ifndef MIXPREC_NO_STDIO
/* The length a file's first bytes say the whole file has (got, when they
   are too few or not the format's): what bounds a read. */
typedef size_t (*mp__claimed_len)(const unsigned char *head, size_t got);
static mp_status mp__read_file(const char *path, mp__claimed_len claimed, unsigned char **out,
                               size_t *len); /* >>data */

static size_t mp__ckpt_claimed(const unsigned char *head, size_t got) {
    uint64_t total;
    if (got < MP__CKPT_HEAD || memcmp(head, "MIXPREC", 7) != 0) return got;
    total = mp__le_get(head + 12, 8);
    return total < (uint64_t)(SIZE_MAX - 1) ? (size_t)total : SIZE_MAX - 1;
}

/* path.tmp.<process>.<n>: a name in path's directory (a rename never
   crosses file systems) that no other save is using, n counting this
   process's attempts. */
static void mp__temp_name(char *tmp, size_t cap, const char *path) {
    static size_t attempts; /* process-wide: two saves at once take different numbers */
    mp__text t;
    t.buf = tmp;
    t.cap = cap;
    t.len = 0;
    mp__put(&t, path);
    mp__put(&t, ".tmp.");
#ifdef MP__POSIX_FILES
    mp__put_uint(&t, (uint64_t)getpid(), 0);
#else
    mp__put_uint(&t, (uint64_t)time(NULL), 0);
#endif
    mp__put(&t, ".");
    mp__put_uint(&t, (uint64_t)mp__relaxed_add(&attempts, 1), 0);
}

#ifdef MP__POSIX_FILES
/* buf into a file that did not exist (O_EXCL: never another save's
   temporary), on the disk (fsync) before it is closed. NULL, or why not;
   *created says whether the file is ours to remove. */
static const char *mp__write_new(const char *name, const unsigned char *buf, size_t len, int *created) {
    int fd = open(name, O_WRONLY | O_CREAT | O_EXCL, 0666);
    const char *why = NULL;
    *created = fd >= 0;
    if (fd < 0) return errno == EEXIST ? "exists:" : "cannot create";
    while (len && !why) {
        ssize_t w = write(fd, buf, mp__min(len, (size_t)1 << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) why = "cannot write";
        else buf += w, len -= (size_t)w;
    }
    if (!why && fsync(fd) != 0) why = "cannot sync";
    if (close(fd) != 0 && !why) why = "cannot write";
    return why;
}

/* The rename's directory entry on the disk too: until then a power cut
   may lose it (POSIX, fsync). dir: room for path. */
static const char *mp__sync_dir(const char *path, char *dir) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) + (slash == path) : 0; /* "/name": the root */
    int fd, bad;
    if (n) memcpy(dir, path, n);
    else dir[n++] = '.';
    dir[n] = '\0';
    if ((fd = open(dir, O_RDONLY)) < 0) return NULL; /* a directory we may not open: nothing more to do */
    bad = fsync(fd) != 0 && errno != EINVAL;         /* EINVAL: a file system that cannot sync directories */
    close(fd);
    return bad ? "the new file is in place, but cannot sync its directory" : NULL;
}
#else
static const char *mp__write_new(const char *name, const unsigned char *buf, size_t len, int *created) {
    FILE *f = fopen(name, "rb");
    const char *why = NULL;
    *created = 0;
    if (f) { /* C99 has no exclusive creation: look first */
        fclose(f);
        return "exists:";
    }
    if (!(f = fopen(name, "wb"))) return "cannot create";
    *created = 1;
    if (fwrite(buf, 1, len, f) != len || fflush(f) != 0) why = "cannot write";
    if (fclose(f) != 0 && !why) why = "cannot write";
    return why;
}
#endif

/* A temporary of its own in path's directory, written, synced and closed,
   then renamed over path (atomic on POSIX), then the directory synced; on
   any failure the temporary goes and path stays as it was. */
static mp_status mp__save_bytes(mp_model *m, const unsigned char *buf, size_t len, const char *path) {
    char *tmp;
    const char *why = "exists:";
    size_t n = strlen(path), cap = n + 48; /* ".tmp.", two numbers of at most 20 digits, ".", NUL */
    int created = 0, tries, err = 0;
    mp_status st;
    if (!(tmp = n < SIZE_MAX - 48 ? (char *)mp__alloc(cap) : NULL))
        return mp__fail(m, MP_ERR_ALLOC, "saving %s (its temporary's name)", path);
    for (tries = 0; why && strcmp(why, "exists:") == 0 && tries < 100; tries++) {
        mp__temp_name(tmp, cap, path);
        errno = 0;
        why = mp__write_new(tmp, buf, len, &created);
    }
#ifdef _WIN32
    if (!why) remove(path); /* rename does not replace there; the new file is whole in tmp */
#endif
    if (!why && rename(tmp, path) != 0) why = "cannot rename";
    err = errno; /* the failed call's reason, before remove */
    if (why && created) remove(tmp);
#ifdef MP__POSIX_FILES
    if (!why && (why = mp__sync_dir(path, tmp)) != NULL) err = errno;
#endif
    st = why ? mp__fail(m, MP_ERR_IO, "saving %s: %s %s: %s", path, why, tmp, mp__io_reason(err)) : MP_OK;
    mp__free(tmp);
    return st;
}

static mp_status mp__save_file(mp_model *m, int kind, mp_dtype dt, const char *path) {
    unsigned char *buf;
    size_t len = 0;
    mp_status st;
    if ((st = mp__ckpt_write(m, kind, dt, NULL, 0, &len)) != MP_OK) return st;
    if (!(buf = (unsigned char *)mp__alloc(len))) return mp__fail(m, MP_ERR_ALLOC, "saving %s (%z bytes)", path, len);
    (void)mp__ckpt_write(m, kind, dt, buf, len, &len);
    st = mp__save_bytes(m, buf, len, path);
    mp__free(buf);
    return st;
}

/* The file calls under a communicator (>>communicator): rank 0's outcome,
   st there, on every rank. */
static mp_status mp__rank0_outcome(mp_model *m, mp_status st, const char *what, const char *path) {
    int32_t code = (int32_t)st;
    mp_status cs;
    if (m->ranks == 1) return st;
    if ((cs = mp__comm_host(m, &code, sizeof code, 0, "agreeing on rank 0's file")) != MP_OK) return cs;
    if (m->rank && code != MP_OK)
        return mp__fail(m, (mp_status)code, "rank 0 could not %s %s: %s (its error says why)", what, path,
                        mp_status_message((mp_status)code));
    return st;
}

static mp_status mp__ckpt_save(mp_model *m, int kind, mp_dtype dt, const char *path) {
    if (!m) return MP_ERR_NULL;
    if (!path) return mp__fail(m, MP_ERR_NULL, "no path to save to");
    return mp__rank0_outcome(m, m->rank ? MP_OK : mp__save_file(m, kind, dt, path), "save", path);
}

/* Rank 0's file (*buf, *len there) on every rank: its length, then whether
   every rank can hold it, then its bytes. */
static mp_status mp__ckpt_share(mp_model *m, unsigned char **buf, size_t *len, const char *path) {
    uint64_t bytes = *len;
    float short_of_memory;
    mp_status st;
    if ((st = mp__comm_host(m, &bytes, sizeof bytes, 0, "sending rank 0's file length")) != MP_OK) return st;
    if (m->rank) {
        *len = (size_t)bytes;
        *buf = bytes <= SIZE_MAX ? (unsigned char *)mp__alloc(*len) : NULL;
    }
    short_of_memory = *buf ? 0.0f : 1.0f;
    if ((st = mp__comm_host(m, &short_of_memory, sizeof(float), 1, "agreeing on the file's memory")) != MP_OK)
        return st;
    if (short_of_memory > 0.0f)
        return mp__fail(m, MP_ERR_ALLOC, "%d rank(s) cannot hold the %z bytes of %s", (int)short_of_memory, *len, path);
    return mp__comm_host(m, *buf, *len, 0, "sending rank 0's file");
}

/* Every rank read the same bytes into the same model, so all agree but
   where one ran out of memory: then it is said on every rank. */
static mp_status mp__ranks_agree(mp_model *m, mp_status st, const char *path) {
    float failed = st != MP_OK ? 1.0f : 0.0f;
    mp_status cs;
    if (m->ranks == 1) return st;
    if ((cs = mp__comm_host(m, &failed, sizeof failed, 1, "agreeing on the load")) != MP_OK) return cs;
    if (st == MP_OK && failed > 0.0f)
        return mp__fail(m, MP_ERR_COMM, "loading %s failed on %d other rank(s) and succeeded here: end the job", path,
                        (int)failed);
    return st;
}

/* Rank 0's file, read as claimed says, given to parse (with arg) on every
   rank. */
typedef mp_status (*mp__parse_fn)(mp_model *m, const void *arg, const void *buf, size_t len);
static mp_status mp__load_file(mp_model *m, const char *path, mp__claimed_len claimed, mp__parse_fn parse,
                               const void *arg) {
    unsigned char *buf = NULL;
    size_t len = 0;
    mp_status st = MP_OK;
    if (!m) return MP_ERR_NULL;
    if (!path) return mp__fail(m, MP_ERR_NULL, "no path to load from");
    errno = 0;
    if (!m->rank && (st = mp__read_file(path, claimed, &buf, &len)) != MP_OK)
        st = mp__fail(m, st, "cannot read %s: %s (it must be a readable regular file)", path,
                      st == MP_ERR_IO && errno ? strerror(errno) : st == MP_ERR_IO ? "not a regular file" : "no memory for it");
    st = mp__rank0_outcome(m, st, "read", path);
    if (st == MP_OK && m->ranks > 1) st = mp__ckpt_share(m, &buf, &len, path);
    if (st == MP_OK) st = mp__ranks_agree(m, parse(m, arg, buf, len), path);
    mp__free(buf);
    return st;
}

static mp_status mp__ckpt_parse(mp_model *m, const void *kind, const void *buf, size_t len) {
    return mp__ckpt_read(m, *(const int *)kind, buf, len);
}

static mp_status mp__ckpt_load(mp_model *m, int kind, const char *path) {
    return mp__load_file(m, path, mp__ckpt_claimed, mp__ckpt_parse, &kind);
}

MIXPREC_API mp_status mp_model_save(mp_model *m, const char *path) { return mp__ckpt_save(m, 'C', MP_FLOAT32, path); }
MIXPREC_API mp_status mp_model_load(mp_model *m, const char *path) { return mp__ckpt_load(m, 'C', path); }
MIXPREC_API mp_status mp_model_export_weights(mp_model *m, mp_dtype dtype, const char *path) {
    return mp__ckpt_save(m, 'W', dtype, path);
}
MIXPREC_API mp_status mp_model_import_weights(mp_model *m, const char *path) { return mp__ckpt_load(m, 'W', path); }
#endif

/* >>safetensors: the reference parser's rules (safetensors/src/tensor.rs,
   Metadata::validate and SafeTensors::read_metadata), then the model's.
   The JSON is read by a small recursive descent over the only shapes the
   format has: an object of objects, arrays of integers and strings. */
enum { MP__ST_MAX_HEADER = 100000000, MP__ST_RANK = 8 };

/* The format's dtypes in its enum's order (the writer sorts by it) and
   their sizes in bytes. */
static const struct { const char *name; unsigned char size; } mp__st_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
    {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
enum { MP__ST_F16 = 7, MP__ST_BF16 = 8, MP__ST_I32 = 9, MP__ST_F32 = 11, MP__ST_I64 = 13, MP__ST_DTYPES = 15 };

typedef struct mp__st_tensor {
    const char *name; /* decoded (JSON escapes undone), not NUL-terminated */
    size_t name_len;
    int dtype;        /* index in mp__st_dtypes */
    int rank;         /* may pass MP__ST_RANK: shape holds the first ones */
    uint64_t shape[MP__ST_RANK];
    uint64_t begin, end;
    int used;         /* loading: the weight it became */
} mp__st_tensor;

typedef struct mp__st_file {
    mp__st_tensor *t; /* by name once checked */
    size_t n, cap;
    char *names;      /* the decoded strings; the header's length bounds them */
    size_t names_len;
    const unsigned char *data; /* the buffer after the header */
    size_t data_len;
    const unsigned char *p, *end, *json; /* the parser's place in the header */
    mp__text *why;
} mp__st_file;

/* Up to 64 bytes of a name, anything but printable ASCII as '?', quoted. */
static void mp__st_put_name(mp__text *t, const char *name, size_t len) {
    char c[2] = {0, 0};
    size_t i;
    mp__put(t, "\"");
    for (i = 0; i < len && i < 64; i++) {
        c[0] = name[i] >= 0x20 && name[i] < 0x7F ? name[i] : '?';
        mp__put(t, c);
    }
    mp__put(t, i < len ? "...\"" : "\"");
}

static int mp__st_fail(mp__st_file *f, const char *what) {
    mp__put(f->why, what);
    mp__put(f->why, " at byte ");
    mp__put_uint(f->why, (uint64_t)(f->p - f->json) + 8u, 0);
    mp__put(f->why, " of the header");
    return 0;
}

/* The first byte that is not well-formed UTF-8 (RFC 3629: no overlong
   forms, no surrogates, nothing past U+10FFFF), or n. */
static size_t mp__utf8_bad(const unsigned char *s, size_t n) {
    size_t i = 0, k, len;
    while (i < n) {
        unsigned c = s[i];
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || n - i < len) return i;
        cp = c & (0x7Fu >> len);
        for (k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3Fu);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return i;
        i += len;
    }
    return n;
}

static void mp__st_space(mp__st_file *f) {
    while (f->p < f->end && (*f->p == ' ' || *f->p == '\t' || *f->p == '\n' || *f->p == '\r')) f->p++;
}

/* Skips white space, then the byte c if it is next. */
static int mp__st_eat(mp__st_file *f, char c) {
    mp__st_space(f);
    if (f->p < f->end && *f->p == (unsigned char)c) return f->p++, 1;
    return 0;
}

static int mp__st_hex4(mp__st_file *f, uint32_t *v) {
    int i;
    *v = 0;
    for (i = 0; i < 4; i++, f->p++) {
        int c = f->p < f->end ? *f->p : 0;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return mp__st_fail(f, "invalid JSON: \\u needs 4 hex digits");
        *v = *v << 4 | (uint32_t)d;
    }
    return 1;
}

static void mp__st_keep(mp__st_file *f, uint32_t c) {
    f->names[f->names_len++] = (char)c;
}

/* A JSON string (RFC 8259 section 7), decoded into f->names: *s and *len. */
static int mp__st_string(mp__st_file *f, const char **s, size_t *len) {
    static const char esc[] = "\"\"\\\\//b\bf\fn\nr\rt\t";
    size_t at = f->names_len;
    if (!mp__st_eat(f, '"')) return mp__st_fail(f, "invalid JSON: a string was expected");
    for (;;) {
        uint32_t c, lo;
        const char *e;
        if (f->p >= f->end) return mp__st_fail(f, "invalid JSON: a string runs past the header");
        c = *f->p++;
        if (c == '"') break;
        if (c < 0x20) return f->p--, mp__st_fail(f, "invalid JSON: a control character in a string");
        if (c != '\\') { mp__st_keep(f, c); continue; }
        if (f->p >= f->end) return mp__st_fail(f, "invalid JSON: a string runs past the header");
        for (e = esc; *e && *e != (char)*f->p; e += 2) {}
        if (*e) { mp__st_keep(f, (unsigned char)e[1]); f->p++; continue; }
        if (*f->p++ != 'u') return f->p--, mp__st_fail(f, "invalid JSON: an unknown escape");
        if (!mp__st_hex4(f, &c)) return 0;
        if (c >= 0xDC00 && c <= 0xDFFF) return mp__st_fail(f, "invalid JSON: a lone low surrogate escape");
        if (c >= 0xD800 && c <= 0xDBFF) { /* a pair makes one code point past U+FFFF */
            if (f->end - f->p < 2 || f->p[0] != '\\' || f->p[1] != 'u')
                return mp__st_fail(f, "invalid JSON: a high surrogate escape without its low one");
            f->p += 2;
            if (!mp__st_hex4(f, &lo)) return 0;
            if (lo < 0xDC00 || lo > 0xDFFF) return mp__st_fail(f, "invalid JSON: a high surrogate escape without its low one");
            c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (c < 0x80) mp__st_keep(f, c); /* UTF-8, RFC 3629 */
        else if (c < 0x800) mp__st_keep(f, 0xC0 | c >> 6), mp__st_keep(f, 0x80 | (c & 0x3F));
        else if (c < 0x10000) mp__st_keep(f, 0xE0 | c >> 12), mp__st_keep(f, 0x80 | (c >> 6 & 0x3F)), mp__st_keep(f, 0x80 | (c & 0x3F));
        else mp__st_keep(f, 0xF0 | c >> 18), mp__st_keep(f, 0x80 | (c >> 12 & 0x3F)), mp__st_keep(f, 0x80 | (c >> 6 & 0x3F)),
             mp__st_keep(f, 0x80 | (c & 0x3F));
    }
    *s = f->names + at;
    *len = f->names_len - at;
    return 1;
}

static int mp__st_is(const char *s, size_t len, const char *word) { return strlen(word) == len && memcmp(s, word, len) == 0; }

/* A non-negative integer as the reference reads one into a usize: digits,
   no sign, fraction or exponent, at most 2^64 - 1. */
static int mp__st_uint(mp__st_file *f, uint64_t *v) {
    const unsigned char *start;
    mp__st_space(f);
    start = f->p;
    for (*v = 0; f->p < f->end && *f->p >= '0' && *f->p <= '9'; f->p++) {
        if (*v > (UINT64_MAX - (uint64_t)(*f->p - '0')) / 10u) return mp__st_fail(f, "an integer past 2^64 - 1");
        *v = *v * 10u + (uint64_t)(*f->p - '0');
    }
    if (f->p == start) return mp__st_fail(f, "a non-negative integer was expected");
    if (*start == '0' && f->p - start > 1) return f->p = start, mp__st_fail(f, "invalid JSON: a number with a leading zero");
    if (f->p < f->end && (*f->p == '.' || *f->p == 'e' || *f->p == 'E'))
        return mp__st_fail(f, "an integer was expected, not a fraction or exponent");
    return 1;
}

/* [n, n, ...] into shape (its first MP__ST_RANK), *count of them. */
static int mp__st_uints(mp__st_file *f, uint64_t *shape, int max, int *count) {
    uint64_t v;
    if (!mp__st_eat(f, '[')) return mp__st_fail(f, "an array was expected");
    for (*count = 0; !mp__st_eat(f, ']'); ++*count) {
        if (*count && !mp__st_eat(f, ',')) return mp__st_fail(f, "invalid JSON: ',' or ']' was expected");
        if (*count == INT_MAX || !mp__st_uint(f, &v)) return *count == INT_MAX ? mp__st_fail(f, "too many dimensions") : 0;
        if (*count < max) shape[*count] = v;
    }
    return 1;
}

/* One tensor's object: "dtype", "shape", "data_offsets", each once, no
   other field. */
static int mp__st_entry(mp__st_file *f, mp__st_tensor *t) {
    int seen = 0, n, k;
    uint64_t offsets[2];
    if (!mp__st_eat(f, '{')) return mp__st_fail(f, "a tensor's entry must be an object");
    while (!mp__st_eat(f, '}')) {
        const char *key;
        size_t len, mark = f->names_len;
        int field;
        if (seen && !mp__st_eat(f, ',')) return mp__st_fail(f, "invalid JSON: ',' or '}' was expected");
        if (!mp__st_string(f, &key, &len)) return 0;
        field = mp__st_is(key, len, "dtype") ? 1 : mp__st_is(key, len, "shape") ? 2 : mp__st_is(key, len, "data_offsets") ? 4 : 0;
        f->names_len = mark; /* a field's name is not kept */
        if (!field) return mp__st_fail(f, "an unknown field in a tensor's entry (its fields: dtype, shape, data_offsets)");
        if (seen & field) return mp__st_fail(f, "a field given twice in a tensor's entry");
        seen |= field;
        if (!mp__st_eat(f, ':')) return mp__st_fail(f, "invalid JSON: ':' was expected");
        if (field == 1) {
            const char *name;
            if (!mp__st_string(f, &name, &len)) return 0;
            f->names_len = mark;
            for (k = 0; k < MP__ST_DTYPES && !mp__st_is(name, len, mp__st_dtypes[k].name); k++) {}
            if (k == MP__ST_DTYPES) return mp__st_fail(f, "an unknown dtype (the format's: BOOL, U8, I8, F8_E5M2, "
                                                          "F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64)");
            t->dtype = k;
        } else if (field == 2) {
            if (!mp__st_uints(f, t->shape, MP__ST_RANK, &t->rank)) return 0;
        } else {
            if (!mp__st_uints(f, offsets, 2, &n)) return 0;
            if (n != 2) return mp__st_fail(f, "data_offsets must be two integers, [begin, end]");
            t->begin = offsets[0];
            t->end = offsets[1];
        }
    }
    if (seen != 7) return mp__st_fail(f, "a tensor's entry lacks dtype, shape or data_offsets");
    return 1;
}

/* "__metadata__": an object of strings. */
static int mp__st_metadata(mp__st_file *f) {
    int first = 1;
    const char *s;
    size_t len, mark = f->names_len;
    if (!mp__st_eat(f, '{')) return mp__st_fail(f, "__metadata__ must be an object of strings");
    for (; !mp__st_eat(f, '}'); first = 0) {
        if (!first && !mp__st_eat(f, ',')) return mp__st_fail(f, "invalid JSON: ',' or '}' was expected");
        if (!mp__st_string(f, &s, &len)) return 0;
        if (!mp__st_eat(f, ':')) return mp__st_fail(f, "invalid JSON: ':' was expected");
        mp__st_space(f);
        if (f->p >= f->end || *f->p != '"') return mp__st_fail(f, "a value in __metadata__ that is not a string");
        if (!mp__st_string(f, &s, &len)) return 0;
        f->names_len = mark;
    }
    return 1;
}

static int mp__st_grow(mp__st_file *f) {
    size_t cap = f->cap ? 2 * f->cap : 16;
    mp__st_tensor *t = cap <= SIZE_MAX / sizeof *t ? (mp__st_tensor *)mp__alloc(cap * sizeof *t) : NULL;
    if (!t) return 0;
    if (f->n) memcpy(t, f->t, f->n * sizeof *t);
    mp__free(f->t);
    f->t = t;
    f->cap = cap;
    return 1;
}

/* The header's object: each key a tensor's name, or "__metadata__" once. */
static mp_status mp__st_header(mp__st_file *f) {
    int metadata = 0;
    if (!mp__st_eat(f, '{')) return mp__st_fail(f, "the header must be one JSON object"), MP_ERR_FORMAT;
    while (!mp__st_eat(f, '}')) {
        mp__st_tensor *t;
        const char *name;
        size_t len;
        if ((f->n || metadata) && !mp__st_eat(f, ',')) return mp__st_fail(f, "invalid JSON: ',' or '}' was expected"), MP_ERR_FORMAT;
        if (!mp__st_string(f, &name, &len)) return MP_ERR_FORMAT;
        if (!mp__st_eat(f, ':')) return mp__st_fail(f, "invalid JSON: ':' was expected"), MP_ERR_FORMAT;
        if (mp__st_is(name, len, "__metadata__")) {
            f->names_len -= len;
            if (metadata++) return mp__st_fail(f, "__metadata__ given twice"), MP_ERR_FORMAT;
            if (!mp__st_metadata(f)) return MP_ERR_FORMAT;
            continue;
        }
        if (f->n == f->cap && !mp__st_grow(f)) return MP_ERR_ALLOC;
        t = &f->t[f->n++];
        memset(t, 0, sizeof *t);
        t->name = name;
        t->name_len = len;
        if (!mp__st_entry(f, t)) {
            mp__put(f->why, " (tensor ");
            mp__st_put_name(f->why, name, len);
            mp__put(f->why, ")");
            return MP_ERR_FORMAT;
        }
    }
    mp__st_space(f);
    if (f->p != f->end) return mp__st_fail(f, "invalid JSON: more after the header's object"), MP_ERR_FORMAT;
    return MP_OK;
}

static int mp__st_by_offsets(const void *a, const void *b) {
    const mp__st_tensor *x = (const mp__st_tensor *)a, *y = (const mp__st_tensor *)b;
    return x->begin != y->begin ? (x->begin < y->begin ? -1 : 1) : x->end != y->end ? (x->end < y->end ? -1 : 1) : 0;
}

static int mp__st_name_cmp(const char *a, size_t na, const char *b, size_t nb) {
    int c = memcmp(a, b, na < nb ? na : nb);
    return c ? c : na < nb ? -1 : na > nb;
}

static int mp__st_by_name(const void *a, const void *b) {
    const mp__st_tensor *x = (const mp__st_tensor *)a, *y = (const mp__st_tensor *)b;
    return mp__st_name_cmp(x->name, x->name_len, y->name, y->name_len);
}

static mp_status mp__st_refuse(mp__st_file *f, const mp__st_tensor *t, const char *rule) {
    mp__put(f->why, "tensor ");
    mp__st_put_name(f->why, t->name, t->name_len);
    mp__put(f->why, ": ");
    mp__put(f->why, rule);
    return MP_ERR_FORMAT;
}

/* Metadata::validate: in the order of their offsets the tensors run back to
   back from 0, each exactly its element count times its dtype's size; the
   buffer ends where the last one does. Then no name twice. */
static mp_status mp__st_layout(mp__st_file *f) {
    uint64_t at = 0;
    size_t i;
    int r;
    if (f->n > 1) qsort(f->t, f->n, sizeof *f->t, mp__st_by_offsets); /* (C leaves qsort(NULL, 0) undefined) */
    for (i = 0; i < f->n; i++) {
        const mp__st_tensor *t = &f->t[i];
        uint64_t count = 1, size = mp__st_dtypes[t->dtype].size;
        if (t->end < t->begin) return mp__st_refuse(f, t, "data_offsets end before they begin");
        if (t->begin != at)
            return mp__st_refuse(f, t, !i ? "the first tensor's data_offsets do not begin at 0"
                                       : t->begin > at ? "a hole in the buffer before its data_offsets"
                                                       : "its data_offsets overlap another tensor's");
        for (r = 0; r < t->rank && r < MP__ST_RANK; r++) {
            if (t->shape[r] && count > UINT64_MAX / t->shape[r])
                return mp__st_refuse(f, t, "its element count overflows");
            count *= t->shape[r];
        }
        if (t->rank > MP__ST_RANK && count) return mp__st_refuse(f, t, "more than 8 dimensions");
        if (count > UINT64_MAX / size) return mp__st_refuse(f, t, "its element count times its dtype's size overflows");
        if (t->end - t->begin != count * size)
            return mp__st_refuse(f, t, "its data_offsets' byte range differs from its shape times its dtype's size");
        at = t->end;
    }
    if (at != (uint64_t)f->data_len) {
        mp__put(f->why, "the tensors end at byte ");
        mp__put_uint(f->why, at, 0);
        mp__put(f->why, " of the buffer after the header, which has ");
        mp__put_uint(f->why, (uint64_t)f->data_len, 0);
        mp__put(f->why, at < (uint64_t)f->data_len ? ": bytes no tensor owns" : ": the file is truncated");
        return MP_ERR_FORMAT;
    }
    if (f->n > 1) qsort(f->t, f->n, sizeof *f->t, mp__st_by_name);
    for (i = 1; i < f->n; i++)
        if (mp__st_by_name(&f->t[i - 1], &f->t[i]) == 0) return mp__st_refuse(f, &f->t[i], "the name is given twice");
    return MP_OK;
}

/* SafeTensors::read_metadata's checks in its order, then mp__st_layout's;
   f->t (by name) and f->names to be freed by the caller. */
static mp_status mp__st_read(mp__st_file *f, const unsigned char *b, size_t len) {
    uint64_t n;
    size_t bad;
    if (len < 8) return mp__put(f->why, "a header under 8 bytes: not a safetensors file"), MP_ERR_FORMAT;
    n = mp__le_get(b, 8);
    if (n > MP__ST_MAX_HEADER) {
        mp__put(f->why, "a header of ");
        mp__put_uint(f->why, n, 0);
        mp__put(f->why, " bytes, over the format's 100,000,000");
        return MP_ERR_FORMAT;
    }
    if (n > (uint64_t)(len - 8)) {
        mp__put(f->why, "the header's length (");
        mp__put_uint(f->why, n, 0);
        mp__put(f->why, " bytes) runs past the end of the file");
        return MP_ERR_FORMAT;
    }
    f->json = f->p = b + 8;
    f->end = f->p + n;
    f->data = f->end;
    f->data_len = len - 8 - (size_t)n;
    if ((bad = mp__utf8_bad(f->json, (size_t)n)) != (size_t)n) {
        f->p = f->json + bad;
        return mp__st_fail(f, "invalid UTF-8"), MP_ERR_FORMAT;
    }
    if (!(f->names = (char *)mp__alloc((size_t)n + 1))) return MP_ERR_ALLOC;
    {
        mp_status st = mp__st_header(f);
        return st != MP_OK ? st : mp__st_layout(f);
    }
}

static void mp__st_free(mp__st_file *f) {
    mp__free(f->t);
    mp__free(f->names);
}

MIXPREC_API mp_status mp_safetensors_check(const void *buf, size_t len, char *why, size_t why_size) {
    mp__st_file f;
    mp__text t;
    char none[1];
    mp_status st;
    t.buf = why ? why : none;
    t.cap = why ? why_size : sizeof none;
    t.len = 0;
    mp__put(&t, "");
    if (!buf) return mp__put(&t, "no buffer"), MP_ERR_NULL;
    memset(&f, 0, sizeof f);
    f.why = &t;
    st = mp__st_read(&f, (const unsigned char *)buf, len);
    if (st == MP_ERR_ALLOC) mp__put(&t, "no memory for the header's names");
    mp__st_free(&f);
    return st;
}

/* >>safetensors: the model's weights by name. In the PyTorch layout a
   weight is torch.nn's: Linear's and Conv2d's weight and bias,
   BatchNorm's weight, bias, running_mean, running_var, LayerNorm's weight
   and bias, Embedding's weight; MultiHeadAttention's projections are named
   as Linear layers ("query.weight"). mp__st_torch_perm gives the axis
   order: the file's axis j is Keras's axis perm[j]: a kernel's output axes
   first, then its input axes (Linear (out, in); Conv2d (out, in, kh, kw);
   the query, key and value kernels (heads, key_dim, in), the output
   projection's (out, heads, key_dim): nn.Linear's weight once its first
   two or last two axes are flattened). */
static const char *mp__st_torch_name(const char *keras) {
    static const char *const map[][2] = {{"kernel", "weight"},          {"gamma", "weight"},
                                         {"beta", "bias"},              {"moving_mean", "running_mean"},
                                         {"moving_variance", "running_var"}, {"embeddings", "weight"}};
    size_t i;
    for (i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(keras, map[i][0]) == 0) return map[i][1];
    return keras;
}

static void mp__st_torch_perm(const mp_weight_info *w, int *perm) {
    static const int dense[2] = {1, 0}, conv[4] = {3, 2, 0, 1}, heads_in[3] = {1, 2, 0}, heads_out[3] = {2, 0, 1};
    const char *slash = strrchr(w->name, '/'), *last = slash ? slash + 1 : w->name;
    int r, kernel = strcmp(last, "kernel") == 0, out = strncmp(w->name, "attention_output/", 17) == 0;
    for (r = 0; r < w->rank; r++)
        perm[r] = !kernel           ? r
                  : w->rank == 2    ? dense[r]
                  : w->rank == 4    ? conv[r]
                  : out             ? heads_out[r]
                                    : heads_in[r];
}

/* "query/kernel" as "query.weight": the path's separators as torch's */
static void mp__st_put_torch_name(mp__text *t, const char *keras) {
    const char *slash = strrchr(keras, '/'), *p;
    char c[2] = {0, 0};
    for (p = keras; slash && p <= slash; p++) c[0] = *p == '/' ? '.' : *p, mp__put(t, c);
    mp__put(t, mp__st_torch_name(slash ? slash + 1 : keras));
}

/* One weight as the file names and shapes it: name (NUL-terminated), the
   file's shape, and for each of Keras's axes its stride in the file. */
typedef struct mp__st_weight {
    mp_weight_info w;
    char name[64]; /* a layer's name (31) and a weight's (15) */
    int shape[MP_MAX_RANK];
    size_t stride[MP_MAX_RANK];
    int dtype;     /* saving: its mp__st_dtypes index */
} mp__st_weight;

static void mp__st_describe(const mp_model *m, int index, int torch, mp__st_weight *s) {
    mp__text t;
    int perm[MP_MAX_RANK], r;
    size_t stride = 1;
    (void)mp_model_weight_info(m, index, &s->w);
    t.buf = s->name;
    t.cap = sizeof s->name;
    t.len = 0;
    mp__put(&t, s->w.layer);
    mp__put(&t, torch ? "." : "/");
    if (torch) mp__st_put_torch_name(&t, s->w.name);
    else mp__put(&t, s->w.name);
    for (r = 0; r < s->w.rank; r++) perm[r] = r;
    if (torch) mp__st_torch_perm(&s->w, perm);
    for (r = 0; r < s->w.rank; r++) s->shape[r] = s->w.shape[perm[r]];
    for (r = s->w.rank - 1; r >= 0; r--) {
        s->stride[perm[r]] = stride;
        stride *= (size_t)s->shape[r];
    }
}

/* For each value of the weight in Keras's row-major order, where it is in
   the file's: the next position after the one at idx. */
static size_t mp__st_next(const mp__st_weight *s, int *idx) {
    size_t pos = 0;
    int r;
    for (r = s->w.rank - 1; r >= 0 && ++idx[r] == s->w.shape[r]; r--) idx[r] = 0;
    for (r = 0; r < s->w.rank; r++) pos += (size_t)idx[r] * s->stride[r];
    return pos;
}

static mp_status mp__st_desc(mp_model *m, const mp_safetensors_desc *desc, mp_safetensors_desc *out) {
    memset(out, 0, sizeof *out);
    if (desc) *out = *desc;
    if (!mp__dtype_valid(out->dtype)) return mp__fail(m, MP_ERR_DTYPE, "safetensors dtype %d", (int)out->dtype);
    if (out->layout != MP_LAYOUT_KERAS && out->layout != MP_LAYOUT_PYTORCH)
        return mp__fail(m, MP_ERR_ARG, "safetensors layout %d: MP_LAYOUT_KERAS or MP_LAYOUT_PYTORCH", (int)out->layout);
    return MP_OK;
}

static void mp__st_put_shape(mp__text *t, int rank, const uint64_t *shape) {
    int r;
    mp__put(t, "[");
    for (r = 0; r < rank && r < MP__ST_RANK; r++) {
        if (r) mp__put(t, ", ");
        mp__put_uint(t, shape[r], 0);
    }
    mp__put(t, rank > MP__ST_RANK ? ", ...]" : "]");
}

/* The file's tensor for weight s (the model's index-th), checked against
   it; NULL with the reason in why. */
static mp__st_tensor *mp__st_match(const mp_model *m, int index, mp__st_file *f, const mp__st_weight *s, int torch,
                                    mp_status *st) {
    mp__st_tensor key, *t;
    uint64_t want[MP_MAX_RANK];
    int r, same;
    key.name = s->name;
    key.name_len = strlen(s->name);
    t = f->n ? (mp__st_tensor *)bsearch(&key, f->t, f->n, sizeof *f->t, mp__st_by_name) : NULL;
    for (r = 0; r < s->w.rank; r++) want[r] = (uint64_t)s->shape[r];
    *st = MP_ERR_SHAPE;
    mp__put(f->why, "tensor ");
    mp__st_put_name(f->why, s->name, key.name_len);
    if (!t) {
        mp__st_weight other;
        mp__put(f->why, " of shape ");
        mp__st_put_shape(f->why, s->w.rank, want);
        mp__put(f->why, torch ? ", a weight of the model in the PyTorch layout, is not in the file"
                              : ", a weight of the model in the Keras layout, is not in the file");
        mp__st_describe(m, index, !torch, &other); /* the file in the other layout? say so */
        key.name = other.name;
        key.name_len = strlen(other.name);
        if (f->n && bsearch(&key, f->t, f->n, sizeof *f->t, mp__st_by_name))
            mp__put(f->why, torch ? "; it has the Keras layout's names: load it with MP_LAYOUT_KERAS"
                                  : "; it has the PyTorch layout's names: load it with MP_LAYOUT_PYTORCH");
        return NULL;
    }
    for (same = t->rank == s->w.rank, r = 0; same && r < t->rank; r++) same = t->shape[r] == want[r];
    if (!same) {
        mp__put(f->why, ": shape ");
        mp__st_put_shape(f->why, t->rank, t->shape);
        mp__put(f->why, " in the file, ");
        mp__st_put_shape(f->why, s->w.rank, want);
        mp__put(f->why, torch ? " in the model (PyTorch layout)" : " in the model (Keras layout)");
        return NULL;
    }
    if (t->dtype != MP__ST_F32 && t->dtype != MP__ST_F16 && t->dtype != MP__ST_BF16) {
        *st = MP_ERR_DTYPE;
        mp__put(f->why, ": dtype ");
        mp__put(f->why, mp__st_dtypes[t->dtype].name);
        mp__put(f->why, "; weights load from F32, F16 or BF16 (widened exactly to float32): convert it to one of "
                        "them first");
        return NULL;
    }
    f->why->len = 0;
    mp__put(f->why, "");
    *st = MP_OK;
    return t;
}

/* The file's tensors into w (get_weights' order), each weight's from its
   tensor; a tensor left over must be a BatchNorm's num_batches_tracked
   (PyTorch layout). */
static mp_status mp__st_gather(mp_model *m, mp__st_file *f, int torch, float *w) {
    mp__st_weight s;
    size_t i, k, pos;
    int idx[MP_MAX_RANK], n = mp_model_weight_count(m), j, r;
    mp_dtype dt;
    mp_status st;
    for (j = 0; j < n; j++) {
        mp__st_tensor *t;
        mp__st_describe(m, j, torch, &s);
        if (!(t = mp__st_match(m, j, f, &s, torch, &st))) return st;
        t->used = 1;
        dt = t->dtype == MP__ST_F16 ? MP_FLOAT16 : t->dtype == MP__ST_BF16 ? MP_BFLOAT16 : MP_FLOAT32;
        for (r = 0; r < s.w.rank; r++) idx[r] = 0;
        idx[s.w.rank - 1] = -1;
        for (k = 0; k < s.w.size; k++) {
            pos = mp__st_next(&s, idx);
            mp__io_decode(w + s.w.offset + k, f->data + t->begin + pos * mp__st_dtypes[t->dtype].size, 1, dt);
        }
        if (strcmp(s.w.name, "moving_variance") == 0)
            for (k = 0; k < s.w.size; k++)
                if (!(w[s.w.offset + k] >= 0.0f)) {
                    mp__put(f->why, "tensor ");
                    mp__st_put_name(f->why, s.name, strlen(s.name));
                    mp__put(f->why, ": a moving variance is negative or NaN");
                    return MP_ERR_FORMAT;
                }
    }
    for (i = 0; i < f->n; i++) {
        const mp__st_tensor *t = &f->t[i];
        const char *dot = torch ? (const char *)memchr(t->name, '.', t->name_len) : NULL;
        int l;
        if (t->used) continue;
        for (l = 0; dot && l < m->n_layers; l++)
            if (m->layers[l].desc.kind == MP_BATCH_NORMALIZATION && mp__st_is(t->name, (size_t)(dot - t->name), m->layers[l].name) &&
                mp__st_is(dot + 1, t->name_len - (size_t)(dot + 1 - t->name), "num_batches_tracked") && t->rank == 0 &&
                (t->dtype == MP__ST_I32 || t->dtype == MP__ST_I64))
                break;
        if (dot && l < m->n_layers) continue;
        mp__put(f->why, "tensor ");
        mp__st_put_name(f->why, t->name, t->name_len);
        mp__put(f->why, torch ? " in the file is not a weight of the model (PyTorch layout: \"LAYER.weight\")"
                              : " in the file is not a weight of the model (Keras layout: \"LAYER/kernel\")");
        return MP_ERR_SHAPE;
    }
    return MP_OK;
}

MIXPREC_API mp_status mp_model_load_safetensors_from_memory(mp_model *m, const mp_safetensors_desc *desc,
                                                            const void *buf, size_t len) {
    mp_safetensors_desc d;
    mp__st_file f;
    mp__text why;
    char reason[sizeof m->error];
    float *w = NULL;
    size_t n;
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if (!buf) return mp__fail(m, MP_ERR_NULL, "no buffer to load from");
    if ((st = mp__st_desc(m, desc, &d)) != MP_OK) return st;
    memset(&f, 0, sizeof f);
    why.buf = reason;
    why.cap = sizeof reason;
    why.len = 0;
    mp__put(&why, "");
    f.why = &why;
    n = m->n_params + m->n_state; /* before build too: the layers know their sizes once added */
    st = mp__st_read(&f, (const unsigned char *)buf, len);
    if (st == MP_OK && !(w = (float *)mp__alloc((n ? n : 1) * sizeof(float)))) st = MP_ERR_ALLOC;
    if (st == MP_OK) st = mp__st_gather(m, &f, d.layout == MP_LAYOUT_PYTORCH, w);
    if (st == MP_ERR_ALLOC) st = mp__fail(m, st, "loading safetensors (%z weights)", n);
    else if (st != MP_OK) st = mp__fail(m, st, "safetensors: %s", reason);
    else st = mp_model_set_weights(m, w, n);
    mp__free(w);
    mp__st_free(&f);
    if (st == MP_OK) mp__loop_move(m, MP__CALL_RESET);
    return st;
}

/* The writer's order (safetensors/src/tensor.rs, prepare): dtype
   descending in the format's enum, then name, bytewise. */
static int mp__st_write_order(const void *a, const void *b) {
    const mp__st_weight *x = (const mp__st_weight *)a, *y = (const mp__st_weight *)b;
    return x->dtype != y->dtype ? (x->dtype > y->dtype ? -1 : 1) : strcmp(x->name, y->name);
}

/* A byte sink: out NULL measures. */
typedef struct mp__st_out {
    unsigned char *out;
    size_t len;
} mp__st_out;

static void mp__st_emit(mp__st_out *o, const char *s, size_t n) {
    if (o->out) memcpy(o->out + o->len, s, n);
    o->len += n;
}
static void mp__st_emits(mp__st_out *o, const char *s) { mp__st_emit(o, s, strlen(s)); }

static void mp__st_emit_uint(mp__st_out *o, uint64_t v) {
    char d[24];
    size_t n = 0;
    do d[sizeof d - 1 - n++] = (char)('0' + (int)(v % 10u)); while (v /= 10u);
    mp__st_emit(o, d + sizeof d - n, n);
}

/* A JSON string's contents as serde_json writes them: '"', '\\' and
   control characters escaped (\b \f \n \r \t, else \u00XX in lower case),
   the rest as it is. */
static void mp__st_emit_escaped(mp__st_out *o, const char *s) {
    static const char hex[] = "0123456789abcdef";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b" : c == '\f' ? "\\f"
                        : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
        char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        if (e) mp__st_emits(o, e);
        else if (c < 0x20) mp__st_emit(o, u, 6);
        else mp__st_emit(o, s, 1);
    }
}

/* The header's JSON, unpadded: "__metadata__" ("mixprec": "layout=keras
   dtype=float32 policy=mixed_float16 layers=dense:Dense:mixed_float16,...")
   and the weights in s's order, packed from offset 0; returns the buffer's
   length. */
static uint64_t mp__st_emit_header(mp_model *m, mp__st_out *o, const mp_safetensors_desc *d, const mp__st_weight *s,
                                   int n) {
    uint64_t at = 0, bytes;
    int i, r;
    mp__st_emits(o, d->layout == MP_LAYOUT_PYTORCH ? "{\"__metadata__\":{\"mixprec\":\"layout=pytorch dtype="
                                                   : "{\"__metadata__\":{\"mixprec\":\"layout=keras dtype=");
    mp__st_emits(o, mp_dtype_name(d->dtype));
    mp__st_emits(o, " policy=");
    mp__st_emit_escaped(o, mp_policy_name(m->policy) ? mp_policy_name(m->policy) : "(unknown)");
    mp__st_emits(o, " layers=");
    for (i = 0; i < m->n_layers; i++) {
        const char *p = mp_policy_name(m->layers[i].policy);
        if (i) mp__st_emits(o, ",");
        mp__st_emit_escaped(o, m->layers[i].name);
        mp__st_emits(o, ":");
        mp__st_emits(o, mp__kinds[m->layers[i].desc.kind].type);
        mp__st_emits(o, ":");
        mp__st_emits(o, p ? p : "(unknown)");
    }
    mp__st_emits(o, "\"}");
    for (i = 0; i < n; i++) {
        mp__st_emits(o, ",\"");
        mp__st_emit_escaped(o, s[i].name);
        mp__st_emits(o, "\":{\"dtype\":\"");
        mp__st_emits(o, mp__st_dtypes[s[i].dtype].name);
        mp__st_emits(o, "\",\"shape\":[");
        for (r = 0; r < s[i].w.rank; r++) {
            if (r) mp__st_emits(o, ",");
            mp__st_emit_uint(o, (uint64_t)s[i].shape[r]);
        }
        bytes = (uint64_t)s[i].w.size * mp__st_dtypes[s[i].dtype].size;
        mp__st_emits(o, "],\"data_offsets\":[");
        mp__st_emit_uint(o, at);
        mp__st_emits(o, ",");
        mp__st_emit_uint(o, at + bytes);
        mp__st_emits(o, "]}");
        at += bytes;
    }
    mp__st_emits(o, "}");
    return at;
}

/* Each weight's values after the header, in the file's dtype and axis
   order, from w (get_weights' order). */
static void mp__st_emit_data(unsigned char *out, const mp__st_weight *s, int n, const float *w) {
    static const mp_dtype as[3] = {MP_FLOAT16, MP_BFLOAT16, MP_FLOAT32};
    int i, r, idx[MP_MAX_RANK];
    size_t k, pos;
    for (i = 0; i < n; i++) {
        mp_dtype dt = as[s[i].dtype == MP__ST_F16 ? 0 : s[i].dtype == MP__ST_BF16 ? 1 : 2];
        size_t es = mp__st_dtypes[s[i].dtype].size;
        for (r = 0; r < s[i].w.rank; r++) idx[r] = 0;
        idx[s[i].w.rank - 1] = -1;
        for (k = 0; k < s[i].w.size; k++) {
            pos = mp__st_next(&s[i], idx);
            mp__le_put(out + pos * es, mp__narrow_bits(mp__f32_bits(w[s[i].w.offset + k]), dt), es);
        }
        out += s[i].w.size * es;
    }
}

MIXPREC_API mp_status mp_model_save_safetensors_to_memory(mp_model *m, const mp_safetensors_desc *desc, void *buf,
                                                          size_t cap, size_t *len) {
    static const int st_dtype[MP_DTYPE_COUNT] = {MP__ST_F32, MP__ST_F16, MP__ST_BF16};
    mp_safetensors_desc d;
    mp__st_weight *s;
    mp__st_out o = {NULL, 0};
    float *w = NULL;
    uint64_t data, total;
    size_t head, nw;
    int n, i;
    mp_status st;
    if (!m) return MP_ERR_NULL;
    if (!len) return mp__fail(m, MP_ERR_NULL, "len is NULL");
    if ((st = mp__st_desc(m, desc, &d)) != MP_OK || (st = mp_model_build(m)) != MP_OK) return st;
    n = mp_model_weight_count(m);
    nw = m->n_params + m->n_state;
    if (!(s = (mp__st_weight *)mp__alloc((size_t)(n ? n : 1) * sizeof *s)))
        return mp__fail(m, MP_ERR_ALLOC, "saving safetensors (%d weights)", n);
    for (i = 0; i < n; i++) {
        mp__st_describe(m, i, d.layout == MP_LAYOUT_PYTORCH, &s[i]);
        s[i].dtype = s[i].w.trainable ? st_dtype[d.dtype] : MP__ST_F32; /* moving statistics stay F32 */
    }
    if (n > 1) qsort(s, (size_t)n, sizeof *s, mp__st_write_order);
    data = mp__st_emit_header(m, &o, &d, s, n);
    head = (o.len + 7u) / 8u * 8u; /* padded with spaces to a multiple of 8 */
    total = 8u + (uint64_t)head + data;
    if (total > SIZE_MAX) st = mp__fail(m, MP_ERR_SIZE, "the file's size overflows size_t");
    else if ((*len = (size_t)total, buf && cap < total))
        st = mp__fail(m, MP_ERR_SIZE, "it takes %z bytes, the buffer has %z", (size_t)total, cap);
    else if (buf && !(w = (float *)mp__alloc((nw ? nw : 1) * sizeof(float))))
        st = mp__fail(m, MP_ERR_ALLOC, "saving safetensors (%z weights)", nw);
    else if (buf && (st = mp_model_get_weights(m, w, nw)) == MP_OK) {
        o.out = (unsigned char *)buf;
        mp__le_put(o.out, (uint64_t)head, 8);
        o.len = 8;
        (void)mp__st_emit_header(m, &o, &d, s, n);
        memset(o.out + o.len, ' ', 8 + head - o.len);
        mp__st_emit_data(o.out + 8 + head, s, n, w);
    }
    mp__free(w);
    mp__free(s);
    return st;
}

#ifndef MIXPREC_NO_STDIO
/* A safetensors file claims nothing about its length but the header's: one
   over the format's bound is read no further (and refused). */
static size_t mp__st_claimed(const unsigned char *head, size_t got) {
    return got >= 8 && mp__le_get(head, 8) > MP__ST_MAX_HEADER ? got : SIZE_MAX - 1;
}

static mp_status mp__st_save_file(mp_model *m, const char *path, const mp_safetensors_desc *desc) {
    unsigned char *buf;
    size_t len = 0;
    mp_status st;
    if ((st = mp_model_save_safetensors_to_memory(m, desc, NULL, 0, &len)) != MP_OK) return st;
    if (!(buf = (unsigned char *)mp__alloc(len))) return mp__fail(m, MP_ERR_ALLOC, "saving %s (%z bytes)", path, len);
    st = mp_model_save_safetensors_to_memory(m, desc, buf, len, &len);
    if (st == MP_OK) st = mp__save_bytes(m, buf, len, path);
    mp__free(buf);
    return st;
}

MIXPREC_API mp_status mp_model_save_safetensors(mp_model *m, const char *path, const mp_safetensors_desc *desc) {
    if (!m) return MP_ERR_NULL;
    if (!path) return mp__fail(m, MP_ERR_NULL, "no path to save to");
    return mp__rank0_outcome(m, m->rank ? MP_OK : mp__st_save_file(m, path, desc), "save", path);
}

static mp_status mp__st_parse(mp_model *m, const void *desc, const void *buf, size_t len) {
    return mp_model_load_safetensors_from_memory(m, (const mp_safetensors_desc *)desc, buf, len);
}

MIXPREC_API mp_status mp_model_load_safetensors(mp_model *m, const char *path, const mp_safetensors_desc *desc) {
    return mp__load_file(m, path, mp__st_claimed, mp__st_parse, desc);
}
#endif

/* >>data: gzip (see the declaration for the rules). Deflate packs its bits
   from each byte's lowest up (RFC 1951 3.1.1): they come out of a 64-bit
   buffer that bytes are loaded into from the top of what it holds.
   Huffman codes are read by a 9-bit table (every code of a fixed block,
   and the shortest, most frequent ones of a dynamic block) and longer ones
   bit by bit, as stb_image and zlib's puff.c do. */
#define MP__GZ_TRUNCATED "gzip: truncated: the input ends before the data does"
#define MP__HUFF_FAST 9

typedef struct mp__inflate {
    const uint8_t *in;
    size_t in_len, pos; /* pos: the next byte to load */
    uint64_t bits;      /* loaded, not used yet; the next bit is bit 0 */
    int nbits;
    uint8_t *out;       /* the output, grown by doubling up to max */
    size_t out_len, cap, max;
    size_t member;      /* where this member's output starts: no distance reaches before it */
    const char *why;
} mp__inflate;

/* A code: for each bit count, how many codes have it, and the symbols in
   code order (by length, then by symbol: RFC 1951 3.2.2). fast: the next 9
   bits -> length << 9 | symbol, or 0 where the code is longer (or unused). */
typedef struct mp__huff {
    uint16_t fast[1 << MP__HUFF_FAST];
    uint16_t count[16];
    uint16_t symbol[288];
} mp__huff;

static mp_status mp__gz_fail(mp__inflate *z, mp_status st, const char *why) {
    z->why = why;
    return st;
}

static void mp__gz_load(mp__inflate *z) {
    while (z->nbits <= 56 && z->pos < z->in_len) {
        z->bits |= (uint64_t)z->in[z->pos++] << z->nbits;
        z->nbits += 8;
    }
}

static mp_status mp__gz_bits(mp__inflate *z, int n, unsigned *v) {
    if (z->nbits < n) mp__gz_load(z);
    if (z->nbits < n) return mp__gz_fail(z, MP_ERR_FORMAT, MP__GZ_TRUNCATED);
    *v = (unsigned)(z->bits & (((uint64_t)1 << n) - 1));
    z->bits >>= n;
    z->nbits -= n;
    return MP_OK;
}

/* Room for n more output bytes: the buffer doubles (from at least 4 KiB),
   never past max. */
static mp_status mp__gz_room(mp__inflate *z, size_t n) {
    size_t need, cap;
    uint8_t *grown;
    if (n <= z->cap - z->out_len) return MP_OK;
    if (n > z->max - z->out_len)
        return mp__gz_fail(z, MP_ERR_SIZE, "gzip: the data inflates past the output limit (max_out): "
                                           "refused there, as a gzip bomb is");
    need = z->out_len + n;
    cap = z->cap <= z->max / 2 ? z->cap * 2 : z->max;
    if (cap < 4096) cap = z->max < 4096 ? z->max : 4096;
    if (cap < need) cap = need;
    if (!(grown = (uint8_t *)mp__alloc(cap))) return mp__gz_fail(z, MP_ERR_ALLOC, "gzip: out of memory for the output");
    if (z->out_len) memcpy(grown, z->out, z->out_len);
    mp__free(z->out);
    z->out = grown;
    z->cap = cap;
    return MP_OK;
}

/* The canonical code from each symbol's bit length (0: not used). */
static mp_status mp__huff_build(mp__inflate *z, mp__huff *h, const uint8_t *lengths, int n) {
    unsigned next[16], code = 0;
    int len, sym, max = 0, index = 0;
    long left = 1;
    memset(h, 0, sizeof *h);
    for (sym = 0; sym < n; sym++) h->count[lengths[sym]]++;
    h->count[0] = 0;
    for (len = 1; len < 16; len++) {
        left = 2 * left - h->count[len]; /* codes of this length still free */
        if (left < 0) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad Huffman code: more codes than their lengths allow");
        if (h->count[len]) max = len;
    }
    if (left > 0 && max > 1) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad Huffman code: incomplete");
    for (len = 1; len < 16; len++) next[len] = code = (code + h->count[len - 1]) << 1; /* count[0] is 0 */
    for (len = 1; len < 16; len++)
        for (sym = 0; sym < n; sym++)
            if (lengths[sym] == len) h->symbol[index++] = (uint16_t)sym;
    for (sym = 0; sym < n; sym++) {
        unsigned c, r = 0, k;
        len = lengths[sym];
        if (len == 0 || len > MP__HUFF_FAST) continue;
        c = next[len]++;
        for (k = 0; k < (unsigned)len; k++) r |= ((c >> k) & 1u) << ((unsigned)len - 1u - k); /* first bit lowest */
        for (k = r; k < (1u << MP__HUFF_FAST); k += 1u << len) h->fast[k] = (uint16_t)(len << 9 | sym);
    }
    return MP_OK;
}

static mp_status mp__huff_decode(mp__inflate *z, const mp__huff *h, int *sym) {
    int len, code = 0, first = 0, index = 0;
    unsigned e;
    if (z->nbits < 15) mp__gz_load(z);
    e = h->fast[z->bits & ((1u << MP__HUFF_FAST) - 1)];
    if (e && (int)(e >> 9) <= z->nbits) {
        z->bits >>= e >> 9;
        z->nbits -= (int)(e >> 9);
        *sym = (int)(e & 511u);
        return MP_OK;
    }
    for (len = 1; len < 16; len++) { /* codes of each length follow those one bit shorter */
        if (len > z->nbits) return mp__gz_fail(z, MP_ERR_FORMAT, MP__GZ_TRUNCATED);
        code |= (int)(z->bits >> (len - 1)) & 1;
        if (code - first < h->count[len]) {
            z->bits >>= len;
            z->nbits -= len;
            *sym = h->symbol[index + code - first];
            return MP_OK;
        }
        index += h->count[len];
        first = (first + h->count[len]) << 1;
        code <<= 1;
    }
    return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad Huffman code: bits that no code of the block has");
}

/* One Huffman block's symbols (RFC 1951 3.2.5): literals, or a length and
   a distance back into the output, until the end-of-block symbol 256. */
static mp_status mp__inflate_codes(mp__inflate *z, const mp__huff *lit, const mp__huff *dist) {
    static const uint16_t len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                          31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const uint8_t len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                          2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    static const uint16_t dist_base[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,
                                           33,  49,  65,  97,  129, 193,  257,  385,  513,  769,
                                           1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
    static const uint8_t dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                           6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
    mp_status st;
    int sym;
    unsigned extra;
    size_t length, distance, i;
    for (;;) {
        if ((st = mp__huff_decode(z, lit, &sym)) != MP_OK) return st;
        if (sym < 256) {
            if ((st = mp__gz_room(z, 1)) != MP_OK) return st;
            z->out[z->out_len++] = (uint8_t)sym;
            continue;
        }
        if (sym == 256) return MP_OK;
        if ((sym -= 257) >= 29) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad Huffman code: length symbol 286 or 287");
        if ((st = mp__gz_bits(z, len_extra[sym], &extra)) != MP_OK) return st;
        length = len_base[sym] + extra;
        if ((st = mp__huff_decode(z, dist, &sym)) != MP_OK) return st;
        if (sym >= 30) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad Huffman code: distance symbol 30 or 31");
        if ((st = mp__gz_bits(z, dist_extra[sym], &extra)) != MP_OK) return st;
        distance = dist_base[sym] + extra;
        if (distance > z->out_len - z->member)
            return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: distance too far back: before the start of the data");
        if ((st = mp__gz_room(z, length)) != MP_OK) return st;
        for (i = 0; i < length; i++, z->out_len++) z->out[z->out_len] = z->out[z->out_len - distance]; /* may overlap */
    }
}

/* A dynamic block's two codes, sent as code lengths in a code of their own
   (RFC 1951 3.2.7). */
static mp_status mp__inflate_tables(mp__inflate *z, mp__huff *lit, mp__huff *dist) {
    static const uint8_t order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
    uint8_t lengths[286 + 30];
    unsigned nlit, ndist, ncode, v, i, n, repeat, value;
    int sym;
    mp_status st;
    mp__huff lengths_code;
    if ((st = mp__gz_bits(z, 5, &nlit)) != MP_OK || (st = mp__gz_bits(z, 5, &ndist)) != MP_OK ||
        (st = mp__gz_bits(z, 4, &ncode)) != MP_OK)
        return st;
    nlit += 257, ndist += 1, ncode += 4;
    if (nlit > 286 || ndist > 30)
        return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad header of a dynamic block: over 286 length or 30 distance codes");
    memset(lengths, 0, sizeof lengths);
    for (i = 0; i < ncode; i++) {
        if ((st = mp__gz_bits(z, 3, &v)) != MP_OK) return st;
        lengths[order[i]] = (uint8_t)v;
    }
    if ((st = mp__huff_build(z, &lengths_code, lengths, 19)) != MP_OK) return st;
    for (n = 0; n < nlit + ndist; n += repeat) {
        if ((st = mp__huff_decode(z, &lengths_code, &sym)) != MP_OK) return st;
        if (sym < 16) { lengths[n] = (uint8_t)sym, repeat = 1; continue; }
        if (sym == 16 && n == 0) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad Huffman code: a repeat with nothing before it");
        value = sym == 16 ? lengths[n - 1] : 0;
        if ((st = mp__gz_bits(z, sym == 16 ? 2 : sym == 17 ? 3 : 7, &v)) != MP_OK) return st;
        repeat = (sym == 18 ? 11 : 3) + v;
        if (repeat > nlit + ndist - n) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad Huffman code: lengths run past their count");
        for (i = 0; i < repeat; i++) lengths[n + i] = (uint8_t)value;
    }
    if (lengths[256] == 0) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad Huffman code: no end-of-block symbol");
    if ((st = mp__huff_build(z, lit, lengths, (int)nlit)) != MP_OK) return st;
    return mp__huff_build(z, dist, lengths + nlit, (int)ndist);
}

/* The fixed codes of RFC 1951 3.2.6 (distance symbols 30 and 31 are in the
   code, but invalid). */
static void mp__inflate_fixed(mp__inflate *z, mp__huff *lit, mp__huff *dist) {
    uint8_t lengths[288];
    memset(lengths, 8, 144);
    memset(lengths + 144, 9, 112);
    memset(lengths + 256, 7, 24);
    memset(lengths + 280, 8, 8);
    (void)mp__huff_build(z, lit, lengths, 288); /* complete codes: cannot fail */
    memset(lengths, 5, 32);
    (void)mp__huff_build(z, dist, lengths, 32);
}

/* A stored block: to the next byte, LEN and its complement NLEN, LEN bytes. */
static mp_status mp__inflate_stored(mp__inflate *z) {
    unsigned len, nlen;
    mp_status st;
    z->bits >>= z->nbits & 7;
    z->nbits -= z->nbits & 7;
    if ((st = mp__gz_bits(z, 16, &len)) != MP_OK || (st = mp__gz_bits(z, 16, &nlen)) != MP_OK) return st;
    if (len != (~nlen & 0xFFFFu)) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: a stored block's length and its complement disagree");
    if ((st = mp__gz_room(z, len)) != MP_OK) return st;
    for (; len && z->nbits >= 8; len--, z->nbits -= 8, z->bits >>= 8) z->out[z->out_len++] = (uint8_t)z->bits;
    if (len > z->in_len - z->pos) return mp__gz_fail(z, MP_ERR_FORMAT, MP__GZ_TRUNCATED);
    memcpy(z->out + z->out_len, z->in + z->pos, len);
    z->out_len += len;
    z->pos += len;
    return MP_OK;
}

/* A deflate stream: blocks until the one marked last. */
static mp_status mp__inflate_stream(mp__inflate *z) {
    unsigned last = 0, type;
    mp_status st;
    mp__huff lit, dist;
    while (!last) {
        if ((st = mp__gz_bits(z, 1, &last)) != MP_OK || (st = mp__gz_bits(z, 2, &type)) != MP_OK) return st;
        if (type == 3) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: a block of the reserved type 3");
        if (type == 0) st = mp__inflate_stored(z);
        else if (type == 1) mp__inflate_fixed(z, &lit, &dist);
        else st = mp__inflate_tables(z, &lit, &dist);
        if (st == MP_OK && type != 0) st = mp__inflate_codes(z, &lit, &dist);
        if (st != MP_OK) return st;
    }
    return MP_OK;
}

/* One member (RFC 1952 2.3): header, deflate stream, CRC-32 and ISIZE. */
static mp_status mp__gz_member(mp__inflate *z) {
    const uint8_t *p = z->in + z->pos;
    size_t left = z->in_len - z->pos, h = 10, k;
    unsigned flags, field;
    mp_status st;
    if (left >= 2 && (p[0] != 0x1F || p[1] != 0x8B)) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad header: no gzip magic (1f 8b)");
    if (left < h) return mp__gz_fail(z, MP_ERR_FORMAT, MP__GZ_TRUNCATED);
    if (p[2] != 8) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad header: the method is not deflate (8)");
    if ((flags = p[3]) & 0xE0u) return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad header: reserved flag bits set");
    if (flags & 4u) { /* FEXTRA: XLEN, then XLEN bytes */
        if (left - h < 2 || mp__le_get(p + h, 2) > left - h - 2) return mp__gz_fail(z, MP_ERR_FORMAT, MP__GZ_TRUNCATED);
        h += 2 + (size_t)mp__le_get(p + h, 2);
    }
    for (field = 8u; field <= 16u; field *= 2) /* FNAME, FCOMMENT: zero-terminated */
        if (flags & field) {
            for (k = h; k < left && p[k]; k++) continue;
            if (k == left) return mp__gz_fail(z, MP_ERR_FORMAT, MP__GZ_TRUNCATED);
            h = k + 1;
        }
    if (flags & 2u) { /* FHCRC */
        if (left - h < 2) return mp__gz_fail(z, MP_ERR_FORMAT, MP__GZ_TRUNCATED);
        if ((mp__crc32(p, h) & 0xFFFFu) != mp__le_get(p + h, 2))
            return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: bad header: its CRC-16 does not match");
        h += 2;
    }
    z->pos += h;
    z->bits = 0, z->nbits = 0;
    z->member = z->out_len;
    if ((st = mp__inflate_stream(z)) != MP_OK) return st;
    z->pos -= (size_t)z->nbits / 8; /* whole bytes loaded but not used; the rest of the last byte is padding */
    z->bits = 0, z->nbits = 0;
    if (z->in_len - z->pos < 8) return mp__gz_fail(z, MP_ERR_FORMAT, MP__GZ_TRUNCATED);
    p = z->in + z->pos;
    if (mp__crc32(z->out + z->member, z->out_len - z->member) != (uint32_t)mp__le_get(p, 4))
        return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: CRC-32 mismatch: the data is corrupt");
    if ((uint32_t)mp__le_get(p + 4, 4) != (uint32_t)(z->out_len - z->member))
        return mp__gz_fail(z, MP_ERR_FORMAT, "gzip: ISIZE mismatch: the trailer gives another length");
    z->pos += 8;
    return MP_OK;
}

/* Every member of src into z->out, which the caller frees whatever the
   status (on MP_ERR_SIZE it holds the first max bytes: mp_load_idx reads an
   IDX header that way). */
static mp_status mp__gunzip(mp__inflate *z, const uint8_t *src, size_t len, size_t max) {
    size_t hint = len >= 4 ? (uint32_t)mp__le_get(src + len - 4, 4) : 0;
    mp_status st;
    memset(z, 0, sizeof *z);
    z->in = src, z->in_len = len, z->max = max;
    if (hint > max) hint = max;
    if (len <= SIZE_MAX / 1032 && hint > len * 1032) hint = len * 1032; /* deflate's ratio at most */
    if (!(z->out = (uint8_t *)mp__alloc(hint))) return mp__gz_fail(z, MP_ERR_ALLOC, "gzip: out of memory for the output");
    z->cap = hint;
    if (len == 0) return mp__gz_fail(z, MP_ERR_FORMAT, MP__GZ_TRUNCATED);
    do {
        if ((st = mp__gz_member(z)) != MP_OK) return st;
        while (z->pos < len && src[z->pos] == 0) z->pos++; /* padding */
    } while (z->pos < len);
    return MP_OK;
}

MIXPREC_API mp_status mp_gunzip(const void *src, size_t len, size_t max_out, void **out, size_t *out_len,
                                const char **why) {
    mp__inflate z;
    mp_status st;
    if (!src || !out || !out_len) {
        if (why) *why = mp_status_message(MP_ERR_NULL);
        return MP_ERR_NULL;
    }
    if ((st = mp__gunzip(&z, (const uint8_t *)src, len, max_out)) != MP_OK) {
        mp__free(z.out);
        if (why) *why = z.why;
        return st;
    }
    *out = z.out;
    *out_len = z.out_len;
    return MP_OK;
}

MIXPREC_API void mp_gunzip_free(void *out) { mp__free(out); }

/* >>data: IDX files. Header: two zero bytes, a type byte (0x08: unsigned
   byte), the number of dimensions, then each dimension as a big-endian
   uint32; then exactly the bytes those dimensions say. */
static uint32_t mp__be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

MIXPREC_API mp_status mp_idx_parse(const void *buf, size_t len, int *rank, uint32_t dims[3],
                                   const uint8_t **data) {
    const uint8_t *b = (const uint8_t *)buf;
    uint32_t d[3] = {0, 0, 0};
    size_t count = 1, header;
    int r, i;
    if (!buf) return MP_ERR_NULL;
    if (len < 4 || b[0] != 0 || b[1] != 0 || b[2] != 0x08) return MP_ERR_FORMAT;
    r = b[3];
    if (r < 1 || r > 3) return MP_ERR_FORMAT;
    header = 4 + 4 * (size_t)r;
    if (len < header) return MP_ERR_FORMAT;
    for (i = 0; i < r; i++) {
        d[i] = mp__be32(b + 4 + 4 * i);
        if (d[i] == 0 || !mp__mul_ok(count, d[i], &count)) return MP_ERR_FORMAT;
    }
    if (len - header != count) return MP_ERR_FORMAT; /* truncated, or trailing bytes */
    if (rank) *rank = r;
    if (dims) memcpy(dims, d, sizeof d);
    if (data) *data = b + header;
    return MP_OK;
}

MIXPREC_API mp_status mp_dataset_from_idx(const void *images, size_t images_len, const void *labels,
                                          size_t labels_len, mp_dataset *out) {
    const uint8_t *px, *lb;
    uint32_t di[3], dl[3];
    int ri, rl;
    size_t n, pixels, i, floats;
    mp_dataset d;
    mp_status st;
    if (!images || !labels || !out) return MP_ERR_NULL;
    if ((st = mp_idx_parse(images, images_len, &ri, di, &px)) != MP_OK) return st;
    if ((st = mp_idx_parse(labels, labels_len, &rl, dl, &lb)) != MP_OK) return st;
    if (ri != 3 || rl != 1 || di[0] != dl[0] || di[1] > INT32_MAX || di[2] > INT32_MAX) return MP_ERR_FORMAT;
    memset(&d, 0, sizeof d);
    n = di[0];
    pixels = (size_t)di[1] * di[2];
    if (!mp__mul_ok(n, pixels, &floats) || floats > SIZE_MAX / sizeof(float) || n > SIZE_MAX / sizeof(int32_t))
        return MP_ERR_SIZE;
    d.x = (float *)mp__alloc(floats * sizeof(float));
    d.labels = (int32_t *)mp__alloc(n * sizeof(int32_t));
    if (!d.x || !d.labels) { mp_dataset_free(&d); return MP_ERR_ALLOC; }
    for (i = 0; i < floats; i++) d.x[i] = (float)px[i] / 255.0f; /* 255 -> 1.0 exactly */
    for (i = 0; i < n; i++) {
        d.labels[i] = lb[i];
        if (lb[i] + 1 > d.classes) d.classes = lb[i] + 1;
    }
    d.n = n;
    d.rows = (int)di[1];
    d.cols = (int)di[2];
    *out = d;
    return MP_OK;
}

MIXPREC_API void mp_dataset_free(mp_dataset *d) {
    if (!d) return;
    mp__free(d->x);
    mp__free(d->labels);
    memset(d, 0, sizeof *d);
}

MIXPREC_API mp_data mp_dataset_data(const mp_dataset *d) {
    mp_data v;
    int shape[2] = {0, 0};
    memset(&v, 0, sizeof v);
    if (!d) return v;
    shape[0] = d->rows;
    shape[1] = d->cols;
    v.x[0] = mp_array_f32(d->x, d->n, 2, shape);
    v.y = mp_labels(d->labels, d->n);
    return v;
}

#ifndef MIXPREC_NO_STDIO
/* A regular file through the counted allocator (*len gets the bytes read),
   never more than its header claims (and the file's size) plus one byte,
   so that trailing bytes are still seen: /dev/zero, a FIFO or a file that
   grows cannot make a read go on without end. */
enum { MP__HEAD_MAX = 32 }; /* the longest header a claim is read from */
static mp_status mp__read_file(const char *path, mp__claimed_len claimed, unsigned char **out, size_t *len) {
    unsigned char head[MP__HEAD_MAX], *buf;
    size_t got, want;
    FILE *f;
#ifdef MP__POSIX_FILES
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return MP_ERR_IO; /* before opening: a FIFO's open waits */
#endif
    if (!(f = fopen(path, "rb"))) return MP_ERR_IO;
    got = fread(head, 1, sizeof head, f);
    want = claimed(head, got);
#ifdef MP__POSIX_FILES
    if (sb.st_size >= 0 && (uint64_t)sb.st_size < (uint64_t)want) want = (size_t)sb.st_size;
#else
    { /* no stat: the size by a seek to the end, which binary streams support
         on Windows and the common C libraries (a gzip file claims no size) */
        long end;
        if (fseek(f, 0, SEEK_END) == 0 && (end = ftell(f)) >= 0 && (unsigned long)end < want) want = (size_t)end;
        if (fseek(f, (long)got, SEEK_SET) != 0) {
            fclose(f);
            return MP_ERR_IO;
        }
    }
#endif
    if (want < got) want = got;
    if (want == SIZE_MAX || !(buf = (unsigned char *)mp__alloc(want + 1))) {
        fclose(f);
        return MP_ERR_ALLOC;
    }
    memcpy(buf, head, got);
    if (got == sizeof head) got += fread(buf + got, 1, want + 1 - got, f);
    if (ferror(f)) {
        mp__free(buf);
        fclose(f);
        return MP_ERR_IO;
    }
    fclose(f);
    *out = buf;
    *len = got;
    return MP_OK;
}

/* An IDX file's claim: the header, then the product of its dimensions. */
static size_t mp__idx_claimed(const unsigned char *head, size_t got) {
    size_t count = 1, header;
    int i, r = got >= 4 ? head[3] : 0;
    if (r < 1 || r > 3 || head[0] != 0 || head[1] != 0 || head[2] != 0x08 || got < 4 + 4 * (size_t)r) return got;
    header = 4 + 4 * (size_t)r;
    for (i = 0; i < r; i++)
        if (!mp__mul_ok(count, (size_t)mp__be32(head + 4 + 4 * i), &count)) return SIZE_MAX - 1;
    return count < SIZE_MAX - 1 - header ? header + count : SIZE_MAX - 1;
}

/* A file's claim: a gzip file is read whole (its size bounds it), an IDX
   file as far as its header says. */
static size_t mp__idx_file_claimed(const unsigned char *head, size_t got) {
    return got >= 2 && head[0] == 0x1F && head[1] == 0x8B ? SIZE_MAX - 1 : mp__idx_claimed(head, got);
}

/* What is wrong with an IDX buffer, or NULL when nothing is. */
static const char *mp__idx_why(const uint8_t *b, size_t len) {
    size_t claim = mp__idx_claimed(b, len);
    int i, r = len >= 4 ? b[3] : 0;
    if (len < 4 || b[0] || b[1] || b[2] != 0x08 || r < 1 || r > 3)
        return "not an IDX file of unsigned bytes (those start 00 00 08, then 1 to 3 dimensions)";
    if (len < 4 + 4 * (size_t)r) return "IDX: truncated in the header";
    for (i = 0; i < r; i++)
        if (mp__be32(b + 4 + 4 * i) == 0) return "IDX: a dimension is 0";
    if (claim == SIZE_MAX - 1) return "IDX: the dimensions multiply past size_t";
    if (len < claim) return "IDX: truncated: fewer bytes than the dimensions say";
    return len > claim ? "IDX: more bytes than the dimensions say" : NULL;
}

/* A gzip file's IDX data, inflated in up to two steps: first no more than
   16 + 65535 bytes, which holds a small file whole and otherwise at least
   the longest IDX header (16 bytes: the last step before a stop makes at
   most 65535, a stored block), then no more than that header says. So a
   gzip bomb, whose data is no IDX header, or a header that lies is refused
   before its bytes are made. *buf (the file) becomes the inflated data. */
#define MP__IDX_PEEK (16u + 65535u)
static mp_status mp__idx_gunzip(unsigned char **buf, size_t *len, const char **why) {
    mp__inflate z;
    size_t claim;
    mp_status st = mp__gunzip(&z, *buf, *len, MP__IDX_PEEK);
    if (st == MP_ERR_SIZE) {
        claim = mp__idx_claimed(z.out, z.out_len);
        if (claim <= z.out_len) { /* no IDX header, or one that says fewer bytes */
            *why = mp__idx_why(z.out, z.out_len);
            if (!*why) *why = "IDX: more bytes than the dimensions say";
            return mp__free(z.out), MP_ERR_FORMAT;
        }
        mp__free(z.out);
        if ((st = mp__gunzip(&z, *buf, *len, claim)) == MP_ERR_SIZE)
            z.why = "IDX: more bytes than the dimensions say", st = MP_ERR_FORMAT;
    }
    if (st != MP_OK) return *why = z.why, mp__free(z.out), st;
    mp__free(*buf);
    *buf = z.out;
    *len = z.out_len;
    return MP_OK;
}

/* Why a file cannot be read: the system's reason where it gives one. */
static const char *mp__io_why(const char *path) {
#ifdef MP__POSIX_FILES
    struct stat sb;
    if (stat(path, &sb) != 0) return strerror(errno);
    if (!S_ISREG(sb.st_mode)) return "not a regular file";
#else
    (void)path;
#endif
    return "cannot be opened or read";
}

/* One IDX file, plain or gzip; on failure "path: reason" into why. */
static mp_status mp__idx_file(const char *path, unsigned char **buf, size_t *len, mp__text *why) {
    const char *reason = NULL;
    mp_status st = mp__read_file(path, mp__idx_file_claimed, buf, len);
    if (st == MP_ERR_IO) reason = mp__io_why(path);
    if (st == MP_OK && *len >= 2 && (*buf)[0] == 0x1F && (*buf)[1] == 0x8B) st = mp__idx_gunzip(buf, len, &reason);
    if (st == MP_OK && (reason = mp__idx_why(*buf, *len)) != NULL) st = MP_ERR_FORMAT;
    if (st != MP_OK) mp__put(why, path), mp__put(why, ": "), mp__put(why, reason ? reason : mp_status_message(st));
    return st;
}

MIXPREC_API mp_status mp_load_idx_why(const char *images_path, const char *labels_path, mp_dataset *out, char *why,
                                      size_t why_cap) {
    unsigned char *img = NULL, *lab = NULL;
    size_t img_len = 0, lab_len = 0;
    mp__text t;
    mp_status st;
    t.buf = why, t.cap = why ? why_cap : 0, t.len = 0;
    if (t.cap) why[0] = '\0';
    if (!images_path || !labels_path || !out) return mp__put(&t, mp_status_message(MP_ERR_NULL)), MP_ERR_NULL;
    st = mp__idx_file(images_path, &img, &img_len, &t);
    if (st == MP_OK) st = mp__idx_file(labels_path, &lab, &lab_len, &t);
    if (st == MP_OK && (st = mp_dataset_from_idx(img, img_len, lab, lab_len, out)) == MP_ERR_FORMAT)
        mp__put(&t, images_path), mp__put(&t, ", "), mp__put(&t, labels_path),
            mp__put(&t, ": IDX: the images must have 3 dimensions and the labels 1, the same count first");
    else if (st != MP_OK && t.len == 0)
        mp__put(&t, mp_status_message(st));
    mp__free(img);
    mp__free(lab);
    return st;
}

MIXPREC_API mp_status mp_load_idx(const char *images_path, const char *labels_path, mp_dataset *out) {
    return mp_load_idx_why(images_path, labels_path, out, NULL, 0);
}
#endif

/* >>data: tokens (see the declaration) */
enum { MP__LLMC_MAGIC = 20240520, MP__LLMC_HEAD = 1024 };

static mp_status mp__tokens_alloc(mp_tokens *out, size_t count) {
    memset(out, 0, sizeof *out);
    if (count > SIZE_MAX / sizeof(int32_t) || !(out->ids = (int32_t *)mp__alloc(count * sizeof(int32_t))))
        return MP_ERR_ALLOC;
    out->count = count;
    return MP_OK;
}

MIXPREC_API mp_status mp_tokens_from_text(const void *text, size_t len, mp_tokens *out) {
    const unsigned char *b = (const unsigned char *)text;
    unsigned char seen[256];
    size_t i;
    int c, n = 0;
    mp_status st;
    if (!out || (!text && len)) return MP_ERR_NULL;
    if (!len) return MP_ERR_FORMAT;
    memset(seen, 0, sizeof seen);
    for (i = 0; i < len; i++) seen[b[i]] = 1;
    if ((st = mp__tokens_alloc(out, len)) != MP_OK) return st;
    out->byte_level = 1;
    for (c = 0; c < 256; c++) {
        out->id_of[c] = (int16_t)(seen[c] ? n : -1);
        if (seen[c]) out->bytes[n++] = (unsigned char)c;
    }
    out->vocab_size = n;
    for (i = 0; i < len; i++) out->ids[i] = out->id_of[b[i]];
    return MP_OK;
}

/* What is wrong with an llm.c token buffer, or NULL when nothing is. */
static const char *mp__llmc_why(const unsigned char *b, size_t len) {
    uint32_t count;
    if (len < 12 || (uint32_t)mp__le_get(b, 4) != MP__LLMC_MAGIC)
        return "not an llm.c token file: those start with the int32 magic number 20240520";
    if ((uint32_t)mp__le_get(b + 4, 4) != 1) return "llm.c tokens: version is not 1 (the uint16 token files)";
    count = (uint32_t)mp__le_get(b + 8, 4);
    if (count == 0 || count > INT32_MAX) return "llm.c tokens: the header's token count is not positive";
    if (len < MP__LLMC_HEAD || (len - MP__LLMC_HEAD) / 2 < count)
        return "llm.c tokens: truncated: fewer bytes than the 1024-byte header and 2 per token it counts";
    if (len - MP__LLMC_HEAD != 2 * (size_t)count)
        return "llm.c tokens: more bytes than the 1024-byte header and 2 per token it counts";
    return NULL;
}

MIXPREC_API mp_status mp_tokens_from_llmc(const void *buf, size_t len, mp_tokens *out) {
    const unsigned char *b = (const unsigned char *)buf;
    size_t i;
    int top = 0;
    mp_status st;
    if (!out || !buf) return MP_ERR_NULL;
    if (mp__llmc_why(b, len)) return MP_ERR_FORMAT;
    if ((st = mp__tokens_alloc(out, (uint32_t)mp__le_get(b + 8, 4))) != MP_OK) return st;
    for (i = 0; i < out->count; i++) {
        int id = b[MP__LLMC_HEAD + 2 * i] | b[MP__LLMC_HEAD + 2 * i + 1] << 8;
        out->ids[i] = id;
        if (id > top) top = id;
    }
    out->vocab_size = top + 1;
    return MP_OK;
}

MIXPREC_API void mp_tokens_free(mp_tokens *t) {
    if (!t) return;
    mp__free(t->ids);
    t->ids = NULL;
    t->count = 0;
}

MIXPREC_API size_t mp_tokens_window_count(const mp_tokens *t, int time) {
    return t && time > 0 && t->count > 0 ? (t->count - 1) / (size_t)time : 0;
}

MIXPREC_API mp_status mp_tokens_windows(const mp_tokens *t, const size_t *starts, size_t n, int time, int32_t *x,
                                        int32_t *y) {
    size_t i, s, w = (size_t)time;
    if (!t || ((!x || !y) && n)) return MP_ERR_NULL;
    if (time <= 0) return MP_ERR_ARG;
    for (i = 0; i < n; i++) { /* every window first: a failure writes nothing */
        if (!starts && i > (SIZE_MAX - 1) / w) return MP_ERR_ARG;
        s = starts ? starts[i] : i * w;
        if (s >= t->count || t->count - s <= w) return MP_ERR_ARG;
    }
    for (i = 0; i < n; i++) {
        s = starts ? starts[i] : i * w;
        memcpy(x + i * w, t->ids + s, w * sizeof(int32_t));
        memcpy(y + i * w, t->ids + s + 1, w * sizeof(int32_t));
    }
    return MP_OK;
}

#ifndef MIXPREC_NO_STDIO
static size_t mp__text_claimed(const unsigned char *head, size_t got) {
    (void)head, (void)got;
    return SIZE_MAX - 1; /* the whole file: its size bounds the read */
}

static size_t mp__llmc_claimed(const unsigned char *head, size_t got) {
    if (got < 12 || (uint32_t)mp__le_get(head, 4) != MP__LLMC_MAGIC) return got;
    return MP__LLMC_HEAD + 2 * (size_t)(uint32_t)mp__le_get(head + 8, 4);
}

/* A token file (llmc: llm.c's format, else text); "path: reason" into why. */
static mp_status mp__load_tokens(const char *path, int llmc, mp_tokens *out, char *why, size_t why_cap) {
    unsigned char *buf = NULL;
    size_t len = 0;
    const char *reason = NULL;
    mp__text t;
    mp_status st;
    t.buf = why, t.cap = why ? why_cap : 0, t.len = 0;
    if (t.cap) why[0] = '\0';
    if (!path || !out) return mp__put(&t, mp_status_message(MP_ERR_NULL)), MP_ERR_NULL;
    st = mp__read_file(path, llmc ? mp__llmc_claimed : mp__text_claimed, &buf, &len);
    if (st == MP_ERR_IO) reason = mp__io_why(path);
    if (st == MP_OK && llmc && (reason = mp__llmc_why(buf, len)) != NULL) st = MP_ERR_FORMAT;
    if (st == MP_OK) st = llmc ? mp_tokens_from_llmc(buf, len, out) : mp_tokens_from_text(buf, len, out);
    if (st == MP_ERR_FORMAT && !reason) reason = "the file is empty";
    if (st != MP_OK) mp__put(&t, path), mp__put(&t, ": "), mp__put(&t, reason ? reason : mp_status_message(st));
    mp__free(buf);
    return st;
}

MIXPREC_API mp_status mp_load_text_tokens(const char *path, mp_tokens *out, char *why, size_t why_cap) {
    return mp__load_tokens(path, 0, out, why, why_cap);
}
MIXPREC_API mp_status mp_load_llmc_tokens(const char *path, mp_tokens *out, char *why, size_t why_cap) {
    return mp__load_tokens(path, 1, out, why, why_cap);
}
#endif

#ifdef __cplusplus
}
#endif
MP__ROUND_EACH_END;
#endif /* MIXPREC_IMPLEMENTATION_DONE */
#endif /* MIXPREC_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
This software is available under 2 licenses -- choose whichever you prefer.
------------------------------------------------------------------------------
ALTERNATIVE A - MIT License
Copyright (c) 2026 the mixprec authors
Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:
The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
ALTERNATIVE B - Public Domain (www.unlicense.org)
This is free and unencumbered software released into the public domain.
Anyone is free to copy, modify, publish, use, compile, sell, or distribute this
software, either in source code form or as a compiled binary, for any purpose,
commercial or non-commercial, and by any means.
In jurisdictions that recognize copyright laws, the author or authors of this
software dedicate any and all copyright interest in the software to the public
domain worldwide. This dedication is in the overt act of relinquishing all
present and future copyright interest in the software to the public domain. We
make this dedication in perpetuation of the public domain, and in furtherance
of the progress of society in accordance with that law.
------------------------------------------------------------------------------
*/
