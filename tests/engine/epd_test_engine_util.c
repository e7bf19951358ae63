/* epd_test_engine_util.c — see the header. */
#include "epd_test_engine_util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "epd_alloc.h"

static char epd_test_dir[512];

const char *epd_test_tmpdir(void)
{
    const char *base = getenv("TMPDIR");

    snprintf(epd_test_dir, sizeof(epd_test_dir), "%s/epd-engine-test-XXXXXX",
             base != NULL && base[0] != '\0' ? base : "/tmp");
    assert_non_null(mkdtemp(epd_test_dir));
    return epd_test_dir;
}

static int epd_test_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void epd_test_rmtree(const char *dir)
{
    nftw(dir, epd_test_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *epd_test_path(const char *dir, const char *name)
{
    static char bufs[4][1024];
    static int next;
    char *b = bufs[next++ % 4];

    snprintf(b, sizeof(bufs[0]), "%s/%s", dir, name);
    return b;
}

void epd_test_tiny_params(epd_mkmodel_params_t *p)
{
    epd_mkmodel_defaults(p);
    p->hp.dim = 32;
    p->hp.n_layers = 4;
    p->hp.n_heads = 4;
    p->hp.n_kv_heads = 2;
    p->hp.head_dim = 8;
    p->hp.ffn = 48;
    p->hp.max_context = 256;
    strcpy(p->hp.pattern, "LA");
    epd_mkmodel_text_only(p);
    p->seed = 7;
}

void epd_test_tiny_vision_params(epd_mkmodel_params_t *p)
{
    epd_test_tiny_params(p);
    epd_mkmodel_vision_defaults(p);
    p->hp.vision.image_size = 32;
    p->hp.vision.patch_size = 8;
    p->hp.vision.dim = 16;
    p->hp.vision.n_layers = 2;
    p->hp.vision.n_heads = 2;
    p->hp.vision.ffn = 24;
}

const char *epd_test_write_model(const char *dir, const char *name, const epd_mkmodel_params_t *p)
{
    static char paths[32][1024];
    static int next;
    char *path = paths[next++ % 32];

    snprintf(path, sizeof(paths[0]), "%s/%s", dir, name);
    assert_int_equal(epd_mkmodel_write(p, path), EPD_OK);
    return path;
}

void epd_test_pool(const epd_engine_t *engine, uint32_t n_blocks, uint32_t n_slots,
                   epd_kv_pool_t *pool)
{
    const epd_engine_info_t *info = epd_engine_info(engine);

    pool->n_blocks = n_blocks;
    pool->n_state_slots = n_slots;
    pool->bytes = epd_kv_pool_bytes(&info->kv, n_blocks, n_slots);
    pool->base = epd_calloc(1, pool->bytes);
    assert_non_null(pool->base);
}

double epd_test_rel_err(const float *a, const double *b, size_t n)
{
    double num = 0.0;
    double den = 0.0;

    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs(b[i]));
    }
    return den > 0.0 ? num / den : num;
}

double epd_test_rel_err_f(const float *a, const float *b, size_t n)
{
    double num = 0.0;
    double den = 0.0;

    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return den > 0.0 ? num / den : num;
}

unsigned char *epd_test_read_file(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long len;

    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = epd_malloc((size_t)len + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *len_p = (size_t)len;
    return buf;
}

void epd_test_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");

    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}
