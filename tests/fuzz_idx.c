/* fuzz_idx.c - libFuzzer target for the IDX readers (mp_idx_parse,
   mp_dataset_from_idx). An input is a 2-byte little-endian split point,
   then an images buffer and a labels buffer (each copied to a block of its
   own exact size, so that AddressSanitizer sees any read past it); the
   whole input is also parsed as one IDX buffer. What the readers accept
   must be what the format says, and a data set must hold what its buffers
   did; every byte they allocate must be freed.

       clang -fsanitize=fuzzer,address,undefined -g -O1 tests/fuzz_idx.c -o fuzz_idx -lm
       mkdir -p corpus && MP_FUZZ_SEEDS=corpus ./fuzz_idx corpus -max_total_time=60

   MP_FUZZ_SEEDS=dir writes a valid input (the seed) into dir at start. */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char *what) {
    fprintf(stderr, "fuzz_idx: %s\n", what);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    /* split 28: 2 images of 2x3, then their 2 labels */
    static const unsigned char seed[] = {28, 0, 0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3, 0, 255, 7, 8, 9, 10,
                                         11, 12, 13, 14, 15, 128, 0, 0, 8, 1, 0, 0, 0, 2, 4, 1};
    const char *dir = getenv("MP_FUZZ_SEEDS");
    (void)argc;
    (void)argv;
    if (dir) {
        char path[4096];
        FILE *f;
        snprintf(path, sizeof path, "%s/seed_idx", dir);
        if (!(f = fopen(path, "wb")) || fwrite(seed, 1, sizeof seed, f) != sizeof seed || fclose(f) != 0)
            fail("cannot write the seed");
    }
    return 0;
}

static unsigned char *copy(const uint8_t *p, size_t n) {
    unsigned char *b = (unsigned char *)malloc(n ? n : 1);
    if (!b) abort();
    memcpy(b, p, n);
    return b;
}

/* An accepted buffer is magic 0 0 8 r, r dims of nonzero size, then their product in bytes. */
static void check_parse(const uint8_t *buf, size_t len) {
    int rank = 0, i;
    uint32_t dims[3];
    const uint8_t *px = NULL;
    uint64_t count = 1;
    if (mp_idx_parse(buf, len, &rank, dims, &px) != MP_OK) return;
    if (len < 4 || buf[0] || buf[1] || buf[2] != 8 || buf[3] != rank || rank < 1 || rank > 3) fail("bad header accepted");
    for (i = 0; i < rank; i++) count *= dims[i];
    if (px != buf + 4 + 4 * rank || count != len - 4 - 4 * (size_t)rank) fail("wrong data accepted");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t split, n_img, n_lab, i;
    unsigned char *img, *lab;
    mp_dataset d;
    size_t before = mp_get_memory_info().current;
    check_parse(data, size);
    if (size < 2) return 0;
    split = (size_t)(data[0] | data[1] << 8);
    n_img = split < size - 2 ? split : size - 2;
    n_lab = size - 2 - n_img;
    img = copy(data + 2, n_img);
    lab = copy(data + 2 + n_img, n_lab);
    check_parse(img, n_img);
    check_parse(lab, n_lab);
    if (mp_dataset_from_idx(img, n_img, lab, n_lab, &d) == MP_OK) {
        size_t pixels = (size_t)d.rows * (size_t)d.cols;
        if (d.n == 0 || d.n != n_lab - 8 || pixels * d.n != n_img - 16) fail("a data set of the wrong size");
        for (i = 0; i < d.n; i++)
            if (d.labels[i] != lab[8 + i] || d.labels[i] >= d.classes) fail("a label changed");
        for (i = 0; i < pixels * d.n; i++)
            if (d.x[i] != (float)img[16 + i] / 255.0f) fail("a pixel changed");
        mp_dataset_free(&d);
    }
    if (mp_get_memory_info().current != before) fail("memory not freed");
    free(img);
    free(lab);
    return 0;
}
