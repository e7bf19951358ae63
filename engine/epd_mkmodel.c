/*
 * epd_mkmodel.c — the safetensors header is built with jansson (tensors in
 * canonical order, contiguous), padded with spaces to a multiple of 8 bytes
 * so the data that follows is aligned, then each tensor is generated and
 * written in chunks through one bounded buffer.
 */
#include "epd_mkmodel.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_rng.h"

#define EPD_MK_LOG "mkmodel"
#define EPD_MK_CHUNK 4096

void epd_mkmodel_vision_defaults(epd_mkmodel_params_t *p)
{
    epd_ref_vision_hparams_t *v = &p->hp.vision;

    p->hp.has_vision = 1;
    p->hp.vocab = EPD_REF_MIN_VOCAB + 1;
    p->hp.image_token = EPD_REF_IMAGE_TOKEN;
    v->image_size = 224;
    v->patch_size = 16;
    v->dim = 192;
    v->n_layers = 4;
    v->n_heads = 3;
    v->ffn = 768;
    v->merge = 2;
    v->ln_eps = 1e-6;
}

void epd_mkmodel_text_only(epd_mkmodel_params_t *p)
{
    p->hp.has_vision = 0;
    p->hp.vocab = EPD_REF_MIN_VOCAB;
    p->hp.image_token = -1;
    memset(&p->hp.vision, 0, sizeof(p->hp.vision));
}

void epd_mkmodel_defaults(epd_mkmodel_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->hp.dim = 256;
    p->hp.n_layers = 8;
    p->hp.n_heads = 8;
    p->hp.n_kv_heads = 2;
    p->hp.head_dim = 32;
    p->hp.ffn = 768;
    p->hp.max_context = 8192;
    p->hp.rope_theta = 10000.0;
    p->hp.rms_eps = 1e-5;
    p->hp.bos = EPD_REF_BOS;
    p->hp.eos = EPD_REF_EOS;
    strcpy(p->hp.pattern, "LLA");
    epd_mkmodel_vision_defaults(p);
    p->seed = 1;
    p->dtype = EPD_DTYPE_F32;
}

uint16_t epd_mk_to_bf16(float f)
{
    uint32_t b;

    memcpy(&b, &f, 4);
    b += 0x7fffu + ((b >> 16) & 1u); /* round to nearest even; values are finite */
    return (uint16_t)(b >> 16);
}

uint16_t epd_mk_to_f16(float f)
{
    uint32_t b;
    uint32_t sign;
    int32_t exp;
    uint32_t man;

    memcpy(&b, &f, 4);
    sign = (b >> 16) & 0x8000u;
    exp = (int32_t)((b >> 23) & 0xff) - 127 + 15;
    man = b & 0x7fffffu;
    if (exp >= 31) {
        return (uint16_t)(sign | 0x7bffu); /* clamp to the largest finite half */
    }
    if (exp <= 0) {
        if (exp < -10) {
            return (uint16_t)sign;
        }
        man |= 0x800000u;
        return (uint16_t)(sign | ((man >> (14 - exp)) + ((man >> (13 - exp)) & 1u)));
    }
    /* + not |: a rounding carry out of the mantissa must bump the exponent */
    return (uint16_t)(sign | (((uint32_t)exp << 10) + (man >> 13) + ((man >> 12) & 1u)));
}

static char *epd_mk_header(const epd_mkmodel_params_t *p, size_t *len_p)
{
    size_t n = epd_ref_tensor_count(&p->hp);
    size_t esize = epd_dtype_size(p->dtype);
    uint64_t off = 0;
    json_t *root = json_object();
    char *text;
    char *padded;
    size_t len;
    size_t plen;

    if (root == NULL) {
        return NULL;
    }
    json_object_set_new(root, "__metadata__", json_pack("{s:s}", "format", "pt"));
    for (size_t i = 0; i < n; i++) {
        epd_ref_tensor_spec_t s;
        json_t *shape;

        epd_ref_tensor_spec(&p->hp, i, &s);
        shape = s.ndim == 1 ? json_pack("[I]", (json_int_t)s.shape[0])
                            : json_pack("[I,I]", (json_int_t)s.shape[0], (json_int_t)s.shape[1]);
        if (json_object_set_new(root, s.name,
                                json_pack("{s:s, s:o, s:[I,I]}", "dtype", epd_dtype_name(p->dtype),
                                          "shape", shape, "data_offsets", (json_int_t)off,
                                          (json_int_t)(off + s.n_elems * esize))) != 0) {
            json_decref(root);
            return NULL;
        }
        off += s.n_elems * esize;
    }
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (text == NULL) {
        return NULL;
    }
    len = strlen(text);
    plen = (len + 7) & ~(size_t)7;
    padded = epd_malloc(plen + 1);
    if (padded != NULL) {
        memcpy(padded, text, len);
        memset(padded + len, ' ', plen - len);
        padded[plen] = '\0';
        *len_p = plen;
    }
    free(text); /* jansson's own allocation */
    return padded;
}

static int epd_mk_write_tensor(FILE *f, const epd_mkmodel_params_t *p,
                               const epd_ref_tensor_spec_t *s, epd_rng_t *rng, void *buf)
{
    double scale = s->init == EPD_REF_INIT_EMBED ? 1.0 : 1.0 / sqrt((double)s->fan_in);
    size_t esize = epd_dtype_size(p->dtype);

    for (uint64_t done = 0; done < s->n_elems;) {
        size_t k = s->n_elems - done < EPD_MK_CHUNK ? (size_t)(s->n_elems - done) : EPD_MK_CHUNK;

        for (size_t i = 0; i < k; i++) {
            float v = s->init == EPD_REF_INIT_ONES ? 1.0f : (float)(epd_rng_normal(rng) * scale);

            if (p->dtype == EPD_DTYPE_F32) {
                ((float *)buf)[i] = v;
            } else if (p->dtype == EPD_DTYPE_BF16) {
                ((uint16_t *)buf)[i] = epd_mk_to_bf16(v);
            } else {
                ((uint16_t *)buf)[i] = epd_mk_to_f16(v);
            }
        }
        if (fwrite(buf, esize, k, f) != k) {
            return -1;
        }
        done += k;
    }
    return 0;
}

epd_status_t epd_mkmodel_write(const epd_mkmodel_params_t *p, const char *dir)
{
    char path[4096];
    size_t hlen = 0;
    unsigned char lenbuf[8];
    epd_status_t status;
    epd_rng_t rng;
    char *header;
    void *buf;
    FILE *f;

    status = epd_ref_hparams_check(&p->hp);
    if (status != EPD_OK) {
        return status;
    }
    if (epd_dtype_size(p->dtype) == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (snprintf(path, sizeof(path), "%s/model.safetensors", dir) >= (int)sizeof(path)) {
        epd_log_error(EPD_MK_LOG, 0, "output path too long");
        return EPD_ERR_INVALID_PARAM;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        epd_log_error(EPD_MK_LOG, 0, "%s: cannot create: %s", dir, strerror(errno));
        return EPD_ERR_IO;
    }
    status = epd_ref_hparams_save(&p->hp, dir);
    if (status != EPD_OK) {
        return status;
    }
    header = epd_mk_header(p, &hlen);
    if (header == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    buf = epd_malloc(EPD_MK_CHUNK * sizeof(float));
    if (buf == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err_free_header;
    }
    f = fopen(path, "wb");
    if (f == NULL) {
        epd_log_error(EPD_MK_LOG, 0, "%s: cannot create: %s", path, strerror(errno));
        status = EPD_ERR_IO;
        goto err_free_buf;
    }
    for (int i = 0; i < 8; i++) {
        lenbuf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    }
    status = EPD_ERR_IO;
    if (fwrite(lenbuf, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen) {
        goto err_close;
    }
    epd_rng_seed(&rng, p->seed);
    for (size_t i = 0; i < epd_ref_tensor_count(&p->hp); i++) {
        epd_ref_tensor_spec_t s;

        epd_ref_tensor_spec(&p->hp, i, &s);
        if (epd_mk_write_tensor(f, p, &s, &rng, buf) != 0) {
            goto err_close;
        }
    }
    if (fclose(f) != 0) {
        epd_log_error(EPD_MK_LOG, 0, "%s: write failed", path);
        status = EPD_ERR_IO;
        goto err_free_buf;
    }
    epd_free(buf);
    epd_free(header);
    return EPD_OK;

err_close:
    epd_log_error(EPD_MK_LOG, 0, "%s: write failed: %s", path, strerror(errno));
    fclose(f);
err_free_buf:
    epd_free(buf);
err_free_header:
    epd_free(header);
    return status;
}
