/*
 * epd_alloc.h — the one allocation funnel.
 *
 * Every heap allocation in epd goes through these functions (protobuf-c's and
 * zstd's allocators are hooked into them too), so that:
 *   - tests can make the Nth allocation fail (epd_alloc_fail_after) and prove
 *     that every error path cleans up (SQLite's test_malloc habit);
 *   - live bytes and allocation counts are observable (leak checks, metrics).
 *
 * Each block carries a 16-byte header holding its size; counters are atomics,
 * so every function here may be called from any thread.  The hot path of the
 * daemons does not allocate at all (pools), so the header costs nothing there.
 */
#ifndef EPD_ALLOC_H
#define EPD_ALLOC_H

#include <stddef.h>
#include <stdint.h>

/* Returns a new block of `size` bytes owned by the caller (free with
 * epd_free), or NULL when out of memory or when fault injection fires.
 * size 0 returns a valid unique pointer. */
void *epd_malloc(size_t size);

/* As epd_malloc, zero-filled; NULL also when nmemb*size overflows. */
void *epd_calloc(size_t nmemb, size_t size);

/* Resizes a block from this funnel (ptr may be NULL).  On failure returns
 * NULL and leaves `ptr` valid and still owned by the caller. */
void *epd_realloc(void *ptr, size_t size);

/* Frees a block from this funnel; NULL is a no-op. */
void epd_free(void *ptr);

/* Returns a copy of `s` owned by the caller, or NULL. */
char *epd_strdup(const char *s);

/* Returns a NUL-terminated copy of the first `n` bytes of `s`, or NULL. */
char *epd_strndup(const char *s, size_t n);

/* Fault injection for tests: the next `n` allocations succeed and every one
 * after fails, until epd_alloc_fail_after(-1) turns it off.  Process-wide. */
void epd_alloc_fail_after(long n);

/* For tests of code that must not read memory it never wrote: from now on
 * every byte of a block epd_malloc returns, and of the part epd_realloc
 * adds, is `byte` (0..255; -1, the default, leaves what malloc left).  A
 * decoder whose result changes with it read uninitialized memory.
 * epd_calloc still zeroes.  Process-wide. */
void epd_alloc_fill_with(int byte);

typedef struct {
    uint64_t live_bytes;   /* bytes currently allocated through the funnel */
    uint64_t live_blocks;  /* blocks currently allocated */
    uint64_t total_allocs; /* successful allocations since start */
    uint64_t failed;       /* allocations refused (OOM or injected) */
} epd_alloc_stats_t;

/* Snapshot of the counters; any thread. */
void epd_alloc_stats(epd_alloc_stats_t *stats_p);

/* Commits the pages of [addr, addr + len) now: the kernel's fault and the
 * clearing of each fresh page happen here instead of at a later first
 * write (a KV pool's: on the compute thread, inside a request's time).
 * What the range holds is unchanged: MADV_POPULATE_WRITE, or where the
 * kernel refuses it (before Linux 5.14) one byte per page rewritten with
 * its own value — so call it before any other thread writes the range.
 * A NULL or empty range is a no-op. */
void epd_mem_prefault(void *addr, size_t len);

#endif
