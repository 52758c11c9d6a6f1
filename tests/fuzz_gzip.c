/* fuzz_gzip.c - libFuzzer target for the inflate (mp_gunzip, and the two
   steps in which mp_load_idx inflates a gzip file). An input's first byte
   picks what the rest is:
     0-127    gzip input, inflated with an output limit of 1 MiB: what is
              accepted must inflate again to the same bytes, fit a limit of
              exactly its length and not one byte less;
     128-191  data, made into a member by the tests' own encoder (stored
              blocks, then fixed Huffman codes, from byte 1's bit 0): it
              must inflate back to itself;
     192-255  gzip input read as an IDX file's (mp_load_idx's two steps):
              what is accepted is no longer than its IDX header says.
   Every failure must say why, and every byte allocated must be freed.

       clang -fsanitize=fuzzer,address,undefined -g -O1 tests/fuzz_gzip.c -o fuzz_gzip -lm
       mkdir -p corpus && MP_FUZZ_SEEDS=corpus ./fuzz_gzip corpus -max_total_time=60

   MP_FUZZ_SEEDS=dir writes valid inputs (the seeds: members of stored,
   fixed and dynamic blocks, as gzip -9 and the encoder wrote them) into dir
   at start. */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gzip_encode.h"

#define LIMIT ((size_t)1 << 20)

static void fail(const char *what) {
    fprintf(stderr, "fuzz_gzip: %s\n", what);
    abort();
}

static void write_seed(const char *dir, const char *name, unsigned char mode, const unsigned char *p, size_t n) {
    char path[4096];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!(f = fopen(path, "wb")) || fputc(mode, f) == EOF || fwrite(p, 1, n, f) != n || fclose(f) != 0)
        fail("cannot write a seed");
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    static const unsigned char labels[11] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 0, 2};
    static unsigned char many[8 + 70000] = {0, 0, 8, 1, 0, 1, 0x11, 0x70}; /* 70000 labels: past the first step */
    unsigned char gz[1024];
    const char *dir = getenv("MP_FUZZ_SEEDS");
    size_t len;
    (void)argc;
    (void)argv;
    if (!dir) return 0;
    len = gz_encode(gz, sizeof gz, many, sizeof many, GZ_FIXED, 0);
    if (len > sizeof gz) fail("a seed does not fit");
    write_seed(dir, "seed_many_labels", 194, gz, len);
    write_seed(dir, "seed_hello", 0, gz_hello, sizeof gz_hello);
    write_seed(dir, "seed_seq", 1, gz_seq, sizeof gz_seq);
    write_seed(dir, "seed_images", 192, gz_images, sizeof gz_images);
    len = gz_encode(gz, sizeof gz, labels, sizeof labels, GZ_STORED, GZ_FHCRC | GZ_FEXTRA | GZ_FNAME | GZ_FCOMMENT);
    write_seed(dir, "seed_stored", 2, gz, len);
    len = gz_encode(gz, sizeof gz, labels, sizeof labels, GZ_FIXED, 0);
    write_seed(dir, "seed_labels", 193, gz, len);
    write_seed(dir, "seed_data", 128, gz_hello, sizeof gz_hello);
    return 0;
}

/* Inflated, accepted input must inflate alike under a limit of exactly its
   length, and fail under one byte less. */
static void check_gunzip(const uint8_t *in, size_t n) {
    void *out = NULL, *again = NULL;
    size_t out_len = 0, again_len = 0;
    const char *why = NULL;
    mp_status st = mp_gunzip(in, n, LIMIT, &out, &out_len, &why);
    if (st != MP_OK) {
        if (!why || strncmp(why, "gzip: ", 6) != 0) fail("a failure without a reason");
        if (st != MP_ERR_FORMAT && st != MP_ERR_SIZE) fail("a failure that is neither FORMAT nor SIZE");
        return;
    }
    if (out_len > LIMIT) fail("more output than the limit");
    if (mp_gunzip(in, n, out_len, &again, &again_len, &why) != MP_OK || again_len != out_len ||
        memcmp(again, out, out_len) != 0)
        fail("the output changed under a limit of exactly its length");
    mp_gunzip_free(again);
    if (out_len > 0 && mp_gunzip(in, n, out_len - 1, &again, &again_len, &why) != MP_ERR_SIZE)
        fail("accepted under a limit one byte short");
    mp_gunzip_free(out);
}

/* data -> our encoder -> mp_gunzip: the same data */
static void check_round_trip(const uint8_t *d, size_t n, int mode) {
    size_t cap = 64 + 2 * n + n / 7 * 5, len, out_len = 0;
    unsigned char *gz = (unsigned char *)malloc(cap);
    void *out = NULL;
    const char *why = NULL;
    if (!gz) abort();
    len = gz_encode(gz, cap, d, n, mode, GZ_FNAME);
    if (len > cap) fail("the encoder's bound is wrong");
    if (mp_gunzip(gz, len, n, &out, &out_len, &why) != MP_OK || out_len != n || memcmp(out, d, n) != 0)
        fail("a round trip changed the data");
    mp_gunzip_free(out);
    free(gz);
}

/* mp_load_idx's inflate of a gzip file: what it accepts is at most what its
   IDX header says (mp_dataset_from_idx checks the rest) */
static void check_idx(const uint8_t *in, size_t n) {
    unsigned char *buf = (unsigned char *)mp__alloc(n);
    size_t len = n;
    const char *why = NULL;
    mp_status st;
    if (!buf) abort();
    memcpy(buf, in, n);
    st = mp__idx_gunzip(&buf, &len, &why);
    if (st != MP_OK && (!why || (st != MP_ERR_FORMAT && st != MP_ERR_SIZE))) fail("an IDX inflate failed without a reason");
    if (st == MP_OK && len > MP__IDX_PEEK && len > mp__idx_claimed(buf, len)) fail("more than the IDX header says");
    mp__free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t before = mp_get_memory_info().current;
    unsigned char *in;
    if (size < 1) return 0;
    in = (unsigned char *)malloc(size - 1 ? size - 1 : 1); /* its exact size: ASan sees a read past it */
    if (!in) abort();
    memcpy(in, data + 1, size - 1);
    if (data[0] < 128) check_gunzip(in, size - 1);
    else if (data[0] < 192) check_round_trip(in + (size > 1), size - 1 - (size > 1), size > 1 && (in[0] & 1) ? GZ_FIXED : GZ_STORED);
    else check_idx(in, size - 1);
    free(in);
    if (mp_get_memory_info().current != before) fail("memory not freed");
    return 0;
}
