/*
 * epd_bytes.h — fixed byte spellings of numbers and bytes: little-endian
 * integers (wire and file formats, hash inputs) and lowercase hex (auth
 * headers, file names).  Pure, any thread.
 */
#ifndef EPD_BYTES_H
#define EPD_BYTES_H

#include <stddef.h>
#include <stdint.h>

/* v into p[0..n) little-endian (n <= 8: its low n bytes). */
static inline void epd_le_put(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

/* The little-endian number in p[0..n) (n <= 8). */
static inline uint64_t epd_le_get(const unsigned char *p, int n)
{
    uint64_t v = 0;

    for (int i = 0; i < n; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

/* in[0..n) as 2n lowercase hex digits into out (no NUL added). */
static inline void epd_hex_encode(char *out, const void *in, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = in;

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
}

/* 2n lowercase hex digits of in into out[0..n): 0, or -1 at anything else
 * (one spelling per value: upper case is refused). */
static inline int epd_hex_decode(void *out, const char *in, size_t n)
{
    unsigned char *b = out;

    for (size_t i = 0; i < 2 * n; i++) {
        char c = in[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;

        if (v < 0) {
            return -1;
        }
        b[i / 2] = (unsigned char)(i % 2 == 0 ? v << 4 : b[i / 2] | v);
    }
    return 0;
}

#endif
