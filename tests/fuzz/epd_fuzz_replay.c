/*
 * epd_fuzz_replay.c — the regression replay of every libFuzzer target: a
 * plain program (no -fsanitize=fuzzer) that runs each target's
 * LLVMFuzzerTestOneInput over the seed corpus committed for it in
 * tests/fuzz/corpus/<target>/, so that `make check` (and its ASan + UBSan
 * build) exercises every decoder of untrusted bytes on every run, quickly.
 *
 * The Makefile compiles each tests/fuzz/fuzz_*.c a second time with its
 * entry points renamed (LLVMFuzzerTestOneInput -> <target>_one,
 * LLVMFuzzerInitialize -> <target>_init) and passes the list of targets as
 * EPD_FUZZ_LIST (X(fuzz_epd_msg) X(...) ...) and the corpus folder as
 * EPD_FUZZ_CORPUS.  A target without a corpus, or with an empty one, fails
 * the run: every target must carry seeds.  Arguments, if any, name targets
 * to run (default: all).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef EPD_FUZZ_LIST
#error "EPD_FUZZ_LIST must name the fuzz targets (set by tests/fuzz/module.mk)"
#endif
#ifndef EPD_FUZZ_CORPUS
#error "EPD_FUZZ_CORPUS must name the seed corpus folder (set by tests/fuzz/module.mk)"
#endif

/* UCX and libfabric keep process-wide allocations until exit (a worker
 * made by a target's initializer lives as long as the program). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\nleak:libucp.so\nleak:libuct.so\nleak:libucm.so\n"
           "leak:libfabric.so\nleak:librdmacm.so\nleak:libibverbs.so\n";
}

typedef int (*epd_fuzz_one_t)(const uint8_t *data, size_t size);
typedef int (*epd_fuzz_init_t)(int *argc, char ***argv);

#define X(name)                                                                                    \
    int name##_one(const uint8_t *data, size_t size);                                              \
    __attribute__((weak)) int name##_init(int *argc, char ***argv);
EPD_FUZZ_LIST
#undef X

static const struct {
    const char *name;
    epd_fuzz_one_t one;
    epd_fuzz_init_t init;
} epd_fuzz_targets[] = {
#define X(name) {#name, name##_one, name##_init},
    EPD_FUZZ_LIST
#undef X
};

#define N_TARGETS (sizeof(epd_fuzz_targets) / sizeof(epd_fuzz_targets[0]))

static int epd_fuzz_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs one target over its corpus; returns the number of inputs, -1 when
 * the corpus is missing or empty. */
static int epd_fuzz_replay(size_t t)
{
    char dir[4096];
    char *names[4096];
    int n = 0;
    DIR *d;
    struct dirent *e;

    snprintf(dir, sizeof(dir), "%s/%s", EPD_FUZZ_CORPUS, epd_fuzz_targets[t].name);
    d = opendir(dir);
    if (d == NULL) {
        fprintf(stderr, "%s: no corpus at %s\n", epd_fuzz_targets[t].name, dir);
        return -1;
    }
    while ((e = readdir(d)) != NULL && n < 4096) {
        if (e->d_name[0] != '.') {
            names[n++] = strdup(e->d_name);
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof(names[0]), epd_fuzz_cmp); /* the same order every run */
    for (int i = 0; i < n; i++) {
        char path[8192];
        FILE *f;
        long len;
        uint8_t *buf;

        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        f = fopen(path, "rb");
        if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 ||
            fseek(f, 0, SEEK_SET) != 0) {
            fprintf(stderr, "%s: cannot read %s\n", epd_fuzz_targets[t].name, path);
            exit(1);
        }
        buf = malloc((size_t)len + 1);
        if (buf == NULL || fread(buf, 1, (size_t)len, f) != (size_t)len) {
            fprintf(stderr, "%s: cannot read %s\n", epd_fuzz_targets[t].name, path);
            exit(1);
        }
        fclose(f);
        /* like libFuzzer: a buffer of exactly the input's size */
        epd_fuzz_targets[t].one(buf, (size_t)len);
        free(buf);
        free(names[i]);
    }
    return n > 0 ? n : -1;
}

int main(int argc, char **argv)
{
    int failed = 0;

    for (size_t t = 0; t < N_TARGETS; t++) {
        int wanted = argc < 2;

        for (int a = 1; a < argc; a++) {
            wanted |= strcmp(argv[a], epd_fuzz_targets[t].name) == 0;
        }
        if (wanted && epd_fuzz_targets[t].init != NULL) {
            epd_fuzz_targets[t].init(&argc, &argv);
        }
    }
    for (size_t t = 0; t < N_TARGETS; t++) {
        int wanted = argc < 2;
        int n;

        for (int a = 1; a < argc; a++) {
            wanted |= strcmp(argv[a], epd_fuzz_targets[t].name) == 0;
        }
        if (!wanted) {
            continue;
        }
        n = epd_fuzz_replay(t);
        if (n < 0) {
            failed++;
            printf("FAIL  %s: no seeds\n", epd_fuzz_targets[t].name);
        } else {
            printf("ok    %s: %d seeds replayed\n", epd_fuzz_targets[t].name, n);
        }
        fflush(stdout);
    }
    return failed == 0 ? 0 : 1;
}
