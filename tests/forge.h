/* forge.h - what the checkpoint tests need to write files by hand: the
   format's little-endian fields and its CRC-32, computed bit by bit here
   (independently of mixprec.h's table), so that a file changed on purpose
   can carry a valid checksum; and the fuzz targets' seed files. */
#ifndef MIXPREC_TEST_FORGE_H
#define MIXPREC_TEST_FORGE_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline uint32_t crc32_of(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    size_t i;
    int k;
    for (i = 0; i < n; i++)
        for (c ^= p[i], k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    return ~c;
}
static inline uint64_t get_le(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    while (bytes--) v = v << 8 | p[bytes];
    return v;
}
static inline void put_le(unsigned char *p, uint64_t v, int bytes) {
    int i;
    for (i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}
/* The last 4 bytes: the CRC-32 of all before them. */
static inline void fix_crc(unsigned char *b, size_t len) { put_le(b + len - 4, crc32_of(b, len - 4), 4); }
/* A fuzz target's seed: b into dir/name, or the program stops. */
static inline void write_seed(const char *dir, const char *name, const unsigned char *b, size_t len) {
    char path[4096];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (!(f = fopen(path, "wb")) || fwrite(b, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "cannot write the seed %s\n", path);
        exit(1);
    }
}
#endif
