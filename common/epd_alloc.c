/*
 * epd_alloc.c — allocation funnel with counters and fault injection.
 *
 * A 16-byte header in front of every block holds its size, which keeps the
 * returned pointer 16-byte aligned (what malloc guarantees on x86-64) and
 * lets epd_free update the live-byte counter without a lookup.
 */
#include "epd_alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EPD_ALLOC_HDR 16

static atomic_uint_fast64_t epd_alloc_live_bytes;
static atomic_uint_fast64_t epd_alloc_live_blocks;
static atomic_uint_fast64_t epd_alloc_total;
static atomic_uint_fast64_t epd_alloc_failed;
static atomic_long epd_alloc_countdown = -1;
static atomic_int epd_alloc_fill_byte = -1;

static int epd_alloc_should_fail(void)
{
    long left = atomic_load_explicit(&epd_alloc_countdown, memory_order_relaxed);

    while (left >= 0) {
        if (left == 0) {
            return 1;
        }
        if (atomic_compare_exchange_weak(&epd_alloc_countdown, &left, left - 1)) {
            return 0;
        }
    }
    return 0;
}

/* Test hook (epd_alloc_fill_with): bytes [from, to) of a new block get the
 * fill byte, so what fresh memory holds is the test's choice. */
static void *epd_alloc_fill(void *p, size_t from, size_t to)
{
    int byte = atomic_load_explicit(&epd_alloc_fill_byte, memory_order_relaxed);

    if (p != NULL && byte >= 0 && to > from) {
        memset((unsigned char *)p + from, byte, to - from);
    }
    return p;
}

static void *epd_alloc_finish(unsigned char *raw, size_t size)
{
    if (raw == NULL) {
        atomic_fetch_add_explicit(&epd_alloc_failed, 1, memory_order_relaxed);
        return NULL;
    }
    memcpy(raw, &size, sizeof(size));
    atomic_fetch_add_explicit(&epd_alloc_live_bytes, size, memory_order_relaxed);
    atomic_fetch_add_explicit(&epd_alloc_live_blocks, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&epd_alloc_total, 1, memory_order_relaxed);
    return raw + EPD_ALLOC_HDR;
}

void *epd_malloc(size_t size)
{
    if (size > SIZE_MAX - EPD_ALLOC_HDR || epd_alloc_should_fail()) {
        atomic_fetch_add_explicit(&epd_alloc_failed, 1, memory_order_relaxed);
        return NULL;
    }
    return epd_alloc_fill(epd_alloc_finish(malloc(size + EPD_ALLOC_HDR), size), 0, size);
}

void *epd_calloc(size_t nmemb, size_t size)
{
    size_t total;

    if (__builtin_mul_overflow(nmemb, size, &total) || total > SIZE_MAX - EPD_ALLOC_HDR ||
        epd_alloc_should_fail()) {
        atomic_fetch_add_explicit(&epd_alloc_failed, 1, memory_order_relaxed);
        return NULL;
    }
    return epd_alloc_finish(calloc(1, total + EPD_ALLOC_HDR), total);
}

void *epd_realloc(void *ptr, size_t size)
{
    unsigned char *raw;
    unsigned char *grown;
    size_t old;

    if (ptr == NULL) {
        return epd_malloc(size);
    }
    if (size > SIZE_MAX - EPD_ALLOC_HDR || epd_alloc_should_fail()) {
        atomic_fetch_add_explicit(&epd_alloc_failed, 1, memory_order_relaxed);
        return NULL;
    }
    raw = (unsigned char *)ptr - EPD_ALLOC_HDR;
    memcpy(&old, raw, sizeof(old));
    grown = realloc(raw, size + EPD_ALLOC_HDR);
    if (grown == NULL) {
        atomic_fetch_add_explicit(&epd_alloc_failed, 1, memory_order_relaxed);
        return NULL;
    }
    memcpy(grown, &size, sizeof(size));
    atomic_fetch_sub_explicit(&epd_alloc_live_bytes, old, memory_order_relaxed);
    atomic_fetch_add_explicit(&epd_alloc_live_bytes, size, memory_order_relaxed);
    return epd_alloc_fill(grown + EPD_ALLOC_HDR, old, size);
}

void epd_free(void *ptr)
{
    unsigned char *raw;
    size_t size;

    if (ptr == NULL) {
        return;
    }
    raw = (unsigned char *)ptr - EPD_ALLOC_HDR;
    memcpy(&size, raw, sizeof(size));
    atomic_fetch_sub_explicit(&epd_alloc_live_bytes, size, memory_order_relaxed);
    atomic_fetch_sub_explicit(&epd_alloc_live_blocks, 1, memory_order_relaxed);
    free(raw);
}

char *epd_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *copy = epd_malloc(len + 1);

    if (copy == NULL) {
        return NULL;
    }
    memcpy(copy, s, len);
    copy[len] = '\0';
    return copy;
}

char *epd_strdup(const char *s)
{
    return epd_strndup(s, strlen(s));
}

void epd_alloc_fail_after(long n)
{
    atomic_store(&epd_alloc_countdown, n < 0 ? -1 : n);
}

void epd_alloc_fill_with(int byte)
{
    atomic_store(&epd_alloc_fill_byte, byte < 0 ? -1 : byte & 0xff);
}

void epd_alloc_stats(epd_alloc_stats_t *stats_p)
{
    stats_p->live_bytes = atomic_load(&epd_alloc_live_bytes);
    stats_p->live_blocks = atomic_load(&epd_alloc_live_blocks);
    stats_p->total_allocs = atomic_load(&epd_alloc_total);
    stats_p->failed = atomic_load(&epd_alloc_failed);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

void epd_mem_prefault(void *addr, size_t len)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t p = (uintptr_t)addr;
    uintptr_t end = p + len;

    if (addr == NULL || len == 0 || page <= 0 || end < p) {
        return;
    }
    {
        /* madvise wants whole pages: the ones inside the range (the partial
         * pages at its ends are rewritten below) */
        uintptr_t lo = (p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
        uintptr_t hi = end & ~((uintptr_t)page - 1);

        if (lo < hi && madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0) {
            if (lo > p) {
                ((volatile unsigned char *)p)[0] = ((volatile unsigned char *)p)[0];
            }
            if (hi < end) {
                ((volatile unsigned char *)hi)[0] = ((volatile unsigned char *)hi)[0];
            }
            return;
        }
    }
    for (uintptr_t q = p; q < end; q = (q & ~((uintptr_t)page - 1)) + (uintptr_t)page) {
        volatile unsigned char *b = (volatile unsigned char *)q;

        *b = *b;
    }
}
