/* gzip_encode.h - gzip members to test the inflate with (test_errors.c,
   fuzz_gzip.c): an encoder of our own, written from RFC 1951 and RFC 1952
   apart from the library's decoder (stored blocks of 7 bytes, or the fixed
   Huffman code with runs sent as distance-1 matches; CRC-32 bit by bit),
   and a few members as gzip -9 wrote them. Include after <stdint.h>,
   <stddef.h> and <string.h>. */
#ifndef MIXPREC_TEST_GZIP_ENCODE_H
#define MIXPREC_TEST_GZIP_ENCODE_H

typedef struct bitw {
    unsigned char *p;
    size_t len, cap; /* len may pass cap: the caller checks */
    uint32_t acc;
    int n;
} bitw;

static void put_bits(bitw *w, uint32_t v, int n) { /* deflate's order: lowest bit first */
    w->acc |= v << w->n;
    w->n += n;
    for (; w->n >= 8; w->n -= 8, w->acc >>= 8, w->len++)
        if (w->len < w->cap) w->p[w->len] = (unsigned char)w->acc;
}
static void put_code(bitw *w, uint32_t code, int n) { /* a Huffman code: its top bit first */
    while (n-- > 0) put_bits(w, (code >> n) & 1u, 1);
}
static void put_le32(bitw *w, uint32_t v) { put_bits(w, v & 0xFFFFu, 16), put_bits(w, v >> 16, 16); }
static void put_str(bitw *w, const char *s) { do put_bits(w, (unsigned char)*s, 8); while (*s++); }

/* CRC-32 bit by bit (RFC 1952 8): the library's runs by a table */
static uint32_t crc32_bits(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    int k;
    while (n--)
        for (c ^= *p++, k = 0; k < 8; k++) c = c & 1u ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    return ~c;
}

static void fixed_symbol(bitw *w, int sym) { /* RFC 1951 3.2.6 */
    if (sym < 144) put_code(w, 0x30u + (uint32_t)sym, 8);
    else if (sym < 256) put_code(w, 0x190u + (uint32_t)(sym - 144), 9);
    else if (sym < 280) put_code(w, (uint32_t)(sym - 256), 7);
    else put_code(w, 0xC0u + (uint32_t)(sym - 280), 8);
}

static void fixed_match(bitw *w, int len, int dist_code) { /* dist_code 0: distance 1 */
    static const int base[29] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27,
                                 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const int extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    int i = 28;
    while (base[i] > len) i--;
    fixed_symbol(w, 257 + i);
    put_bits(w, (uint32_t)(len - base[i]), extra[i]);
    put_code(w, (uint32_t)dist_code, 5);
}

enum { GZ_STORED, GZ_FIXED };
#define GZ_FTEXT 1
#define GZ_FHCRC 2
#define GZ_FEXTRA 4
#define GZ_FNAME 8
#define GZ_FCOMMENT 16

/* One gzip member of d[n] into out[cap]; returns its length (more than cap:
   it did not fit). Stored blocks hold 7 bytes each, so that a few bytes make
   several blocks. */
static size_t gz_encode(unsigned char *out, size_t cap, const unsigned char *d, size_t n, int mode, int flags) {
    bitw w = {out, 0, cap, 0, 0};
    size_t i = 0, r, k;
    put_bits(&w, 0x1F, 8), put_bits(&w, 0x8B, 8), put_bits(&w, 8, 8), put_bits(&w, (uint32_t)flags, 8);
    put_le32(&w, 0), put_bits(&w, 2, 8), put_bits(&w, 255, 8); /* mtime 0, XFL 2, OS unknown */
    if (flags & GZ_FEXTRA) put_bits(&w, 3, 16), put_bits(&w, 'a', 8), put_bits(&w, 'b', 8), put_bits(&w, 'c', 8);
    if (flags & GZ_FNAME) put_str(&w, "images.idx");
    if (flags & GZ_FCOMMENT) put_str(&w, "made by test_errors");
    if ((flags & GZ_FHCRC) && w.len <= cap) put_bits(&w, crc32_bits(out, w.len) & 0xFFFFu, 16);
    if (mode == GZ_STORED) {
        do {
            k = n - i < 7 ? n - i : 7;
            put_bits(&w, i + k == n, 1), put_bits(&w, 0, 2);
            if (w.n) put_bits(&w, 0, 8 - w.n);
            put_bits(&w, (uint32_t)k, 16), put_bits(&w, (uint32_t)k ^ 0xFFFFu, 16);
            for (; k > 0; k--) put_bits(&w, d[i++], 8);
        } while (i < n);
    } else {
        put_bits(&w, 1, 1), put_bits(&w, 1, 2);
        while (i < n) {
            fixed_symbol(&w, d[i]);
            for (r = 0; r < 258 && i + 1 + r < n && d[i + 1 + r] == d[i]; r++) continue;
            if (r >= 3) fixed_match(&w, (int)r, 0);
            i += r >= 3 ? 1 + r : 1;
        }
        fixed_symbol(&w, 256);
        if (w.n) put_bits(&w, 0, 8 - w.n);
    }
    put_le32(&w, crc32_bits(d, n)), put_le32(&w, (uint32_t)n);
    return w.len;
}

/* gzip -9 -n of "hello, hello, hello, hello!\n": fixed codes and matches */
static const unsigned char gz_hello[] = {
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0xd7,
    0x51, 0xc8, 0xc0, 0xa4, 0x14, 0xb9, 0x00, 0xc3, 0xc2, 0x80, 0xa5, 0x1c, 0x00, 0x00, 0x00};
/* gzip -9 of a file img.idx (FNAME): 3 IDX images of 2x2, test_errors.c's make_images(b, 3, 2, 2) */
static const unsigned char gz_images[] = {
    0x1f, 0x8b, 0x08, 0x08, 0x11, 0x3f, 0x0f, 0x6b, 0x02, 0x03, 0x69, 0x6d, 0x67, 0x2e, 0x69, 0x64, 0x78,
    0x00, 0x63, 0x60, 0xe0, 0x60, 0x66, 0x60, 0x60, 0x00, 0x61, 0x26, 0x30, 0xfe, 0x1f, 0x5a, 0x35, 0xff,
    0xc8, 0x4b, 0x3e, 0xe3, 0x88, 0xda, 0x45, 0x00, 0x52, 0xd8, 0xb0, 0x6d, 0x1c, 0x00, 0x00, 0x00};
/* gzip -9 -n of `seq 1 120`: a dynamic Huffman block */
static const unsigned char gz_seq[] = {
    0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x03, 0x1d, 0xd0, 0xb7, 0x11, 0xc0, 0x40,
    0x0c, 0x03, 0xc1, 0xfc, 0xaa, 0xa1, 0x37, 0xfd, 0x37, 0x26, 0xbe, 0x72, 0x0c, 0x09, 0xac, 0x62,
    0x38, 0x41, 0x52, 0x34, 0xc3, 0xa2, 0x82, 0x2a, 0x6a, 0xa8, 0xa3, 0x81, 0x26, 0x5a, 0x68, 0xa3,
    0x83, 0x2e, 0x26, 0x98, 0x62, 0x86, 0x39, 0x16, 0x58, 0x62, 0x85, 0x35, 0x36, 0xd8, 0xe2, 0x82,
    0x2b, 0x7e, 0x27, 0x1d, 0x0f, 0x3c, 0xf1, 0xc2, 0x1b, 0x1f, 0x7c, 0x09, 0x21, 0x94, 0x30, 0xe2,
    0x3e, 0x06, 0x91, 0x44, 0x11, 0x4d, 0x0c, 0xb1, 0xa4, 0x90, 0x4a, 0x1a, 0xe9, 0xe4, 0x15, 0x4a,
    0xb2, 0xc8, 0x26, 0x87, 0x5c, 0x4a, 0x28, 0xa5, 0x8c, 0x72, 0x2a, 0xa8, 0xeb, 0x5b, 0x54, 0x53,
    0x43, 0x2d, 0x2d, 0xb4, 0xd2, 0x46, 0x3b, 0x1d, 0x74, 0xd2, 0x37, 0xa7, 0xe9, 0xa1, 0x97, 0x11,
    0x46, 0x19, 0x63, 0x9c, 0x09, 0x26, 0x99, 0x62, 0x6e, 0xed, 0x30, 0xcb, 0x0a, 0xab, 0xac, 0xb1,
    0xce, 0x06, 0x9b, 0x6c, 0xb1, 0xcd, 0x1e, 0xc6, 0xd3, 0x38, 0x0e, 0x39, 0x0f, 0x39, 0x10, 0x39,
    0x11, 0x39, 0x12, 0x39, 0x13, 0x39, 0x14, 0x39, 0x15, 0x39, 0x16, 0xb9, 0xdc, 0xcf, 0x76, 0xb9,
    0x07, 0xf7, 0xe4, 0x1e, 0xdd, 0xb3, 0x7b, 0x78, 0x4f, 0xef, 0xf1, 0x9d, 0x9f, 0x1e, 0xe0, 0x07,
    0x9e, 0x33, 0xd6, 0x4b, 0x74, 0x01, 0x00, 0x00,
};

#endif /* MIXPREC_TEST_GZIP_ENCODE_H */
