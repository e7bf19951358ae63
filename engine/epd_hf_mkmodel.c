/*
 * epd_hf_mkmodel.c — writes a Hugging Face model folder of seeded random
 * weights (epd_hf_model.h).  Tensors are generated in canonical order from
 * one random stream, so a sharded folder holds exactly the bytes of the
 * single-file one; shards are cut at tensor boundaries by cumulative size.
 * Each safetensors header is padded with spaces to 8 bytes (aligned data).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "epd_alloc.h"
#include "epd_hf_model.h"
#include "epd_log.h"
#include "epd_mkmodel.h"
#include "epd_rng.h"
#include "epd_tokenizer.h"

#define EPD_HFMK_LOG "mkmodel"
#define EPD_HFMK_CHUNK 4096

void epd_hf_mkmodel_defaults(epd_hf_arch_t arch, epd_hf_mkmodel_params_t *p)
{
    epd_hf_hparams_t *hp = &p->hp;

    memset(p, 0, sizeof(*p));
    hp->arch = arch;
    hp->vocab = 512;
    hp->dim = 64;
    hp->n_layers = 2;
    hp->n_heads = 4;
    hp->n_kv_heads = 2;
    hp->head_dim = (arch == EPD_HF_QWEN3 || arch == EPD_HF_QWEN3_MOE) ? 32 : 16;
    hp->ffn = 128;
    hp->rms_eps = 1e-6;
    hp->bos = 1;
    hp->n_eos = 1;
    hp->eos[0] = 2;
    hp->dtype = EPD_DTYPE_BF16;
    if (arch == EPD_HF_LLAMA) {
        hp->max_context = 131072;
        hp->rope_theta = 500000.0;
        hp->rms_eps = 1e-5;
        hp->rope_llama3 = 1;
        hp->rs_factor = 32.0;
        hp->rs_low_freq = 1.0;
        hp->rs_high_freq = 4.0;
        hp->rs_orig_max = 8192;
    } else {
        hp->max_context = 40960;
        hp->rope_theta = arch == EPD_HF_QWEN2 ? 1000000.0 : 1000000.0;
    }
    if (arch == EPD_HF_QWEN3_MOE) {
        hp->ffn = 0;
        hp->n_experts = 8;
        hp->top_k = 2;
        hp->moe_ffn = 32;
        hp->norm_topk = 1;
    }
    p->seed = 1;
    p->shards = 1;
}

/* vocab, bos and the family's eos list from the tokenizer in `dir`. */
static epd_status_t epd_hfmk_from_tokenizer(epd_hf_hparams_t *hp, const char *dir)
{
    static const char *const llama_eos[] = {"<|end_of_text|>", "<|eot_id|>"};
    static const char *const qwen_eos[] = {"<|im_end|>", "<|endoftext|>"};
    const char *const *names = hp->arch == EPD_HF_LLAMA ? llama_eos : qwen_eos;
    const char *bos_name = hp->arch == EPD_HF_LLAMA ? "<|begin_of_text|>" : "<|endoftext|>";
    epd_tokenizer_t *tok;
    epd_status_t status;
    int32_t id;

    status = epd_tokenizer_load(dir, &tok);
    if (status != EPD_OK) {
        return status;
    }
    hp->vocab = epd_tokenizer_n_ids(tok);
    hp->n_eos = 0;
    for (int i = 0; i < 2; i++) {
        id = epd_tokenizer_token_id(tok, names[i], strlen(names[i]));
        if (id >= 0) {
            hp->eos[hp->n_eos++] = id;
        }
    }
    if (hp->n_eos == 0) {
        id = epd_tokenizer_eos(tok);
        hp->eos[hp->n_eos++] = id >= 0 ? id : (int32_t)hp->vocab - 1;
    }
    id = epd_tokenizer_token_id(tok, bos_name, strlen(bos_name));
    hp->bos = id >= 0 ? id : epd_tokenizer_bos(tok);
    epd_tokenizer_destroy(tok);
    return EPD_OK;
}

static epd_status_t epd_hfmk_copy(const char *from_dir, const char *to_dir, const char *file,
                                  int required)
{
    char src[4096];
    char dst[4096];
    char buf[65536];
    FILE *in;
    FILE *out;
    size_t n;
    epd_status_t status = EPD_OK;

    if (snprintf(src, sizeof(src), "%s/%s", from_dir, file) >= (int)sizeof(src) ||
        snprintf(dst, sizeof(dst), "%s/%s", to_dir, file) >= (int)sizeof(dst)) {
        return EPD_ERR_INVALID_PARAM;
    }
    in = fopen(src, "rb");
    if (in == NULL) {
        if (!required) {
            return EPD_OK;
        }
        epd_log_error(EPD_HFMK_LOG, 0, "%s: %s", src, strerror(errno));
        return EPD_ERR_IO;
    }
    out = fopen(dst, "wb");
    if (out == NULL) {
        epd_log_error(EPD_HFMK_LOG, 0, "%s: %s", dst, strerror(errno));
        fclose(in);
        return EPD_ERR_IO;
    }
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) {
        if (fwrite(buf, 1, n, out) != n) {
            status = EPD_ERR_IO;
            break;
        }
    }
    if (fclose(out) != 0) {
        status = EPD_ERR_IO;
    }
    fclose(in);
    if (status != EPD_OK) {
        epd_log_error(EPD_HFMK_LOG, 0, "%s: write failed", dst);
    }
    return status;
}

/* The padded header of tensors [lo, hi) (epd_malloc'd, caller frees). */
static char *epd_hfmk_header(const epd_hf_mkmodel_params_t *p, size_t lo, size_t hi, size_t *len_p)
{
    size_t esize = epd_dtype_size(p->hp.dtype);
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
    for (size_t i = lo; i < hi; i++) {
        epd_hf_tensor_spec_t s;
        json_t *shape;

        epd_hf_tensor_spec(&p->hp, i, &s);
        shape = s.ndim == 1 ? json_pack("[I]", (json_int_t)s.shape[0])
                            : json_pack("[I,I]", (json_int_t)s.shape[0], (json_int_t)s.shape[1]);
        if (json_object_set_new(root, s.name,
                                json_pack("{s:s, s:o, s:[I,I]}", "dtype",
                                          epd_dtype_name(p->hp.dtype), "shape", shape,
                                          "data_offsets", (json_int_t)off,
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

static int epd_hfmk_tensor(FILE *f, const epd_hf_mkmodel_params_t *p, const epd_hf_tensor_spec_t *s,
                           epd_rng_t *rng, void *buf)
{
    size_t esize = epd_dtype_size(p->hp.dtype);
    double scale = 1.0 / sqrt((double)s->fan_in);

    for (uint64_t done = 0; done < s->n_elems;) {
        size_t k =
            s->n_elems - done < EPD_HFMK_CHUNK ? (size_t)(s->n_elems - done) : EPD_HFMK_CHUNK;

        for (size_t i = 0; i < k; i++) {
            double z = epd_rng_normal(rng);
            float v;

            switch (s->init) {
            case EPD_HF_INIT_NORM:
                v = (float)(1.0 + 0.1 * z);
                break;
            case EPD_HF_INIT_EMBED:
                v = (float)z;
                break;
            case EPD_HF_INIT_BIAS:
                v = (float)(0.1 * z);
                break;
            default:
                v = (float)(z * scale);
                break;
            }
            if (p->hp.dtype == EPD_DTYPE_F32) {
                ((float *)buf)[i] = v;
            } else if (p->hp.dtype == EPD_DTYPE_BF16) {
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

/* One safetensors file of tensors [lo, hi), continuing the random stream. */
static epd_status_t epd_hfmk_file(const epd_hf_mkmodel_params_t *p, const char *path, size_t lo,
                                  size_t hi, epd_rng_t *rng, void *buf)
{
    unsigned char lenbuf[8];
    size_t hlen = 0;
    char *header;
    FILE *f;
    epd_status_t status = EPD_ERR_IO;

    header = epd_hfmk_header(p, lo, hi, &hlen);
    if (header == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    f = fopen(path, "wb");
    if (f == NULL) {
        epd_log_error(EPD_HFMK_LOG, 0, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    for (int i = 0; i < 8; i++) {
        lenbuf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    }
    if (fwrite(lenbuf, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen) {
        fclose(f);
        goto werr;
    }
    for (size_t i = lo; i < hi; i++) {
        epd_hf_tensor_spec_t s;

        epd_hf_tensor_spec(&p->hp, i, &s);
        if (epd_hfmk_tensor(f, p, &s, rng, buf) != 0) {
            fclose(f);
            goto werr;
        }
    }
    if (fclose(f) != 0) {
        goto werr;
    }
    status = EPD_OK;
    goto out;
werr:
    epd_log_error(EPD_HFMK_LOG, 0, "%s: write failed: %s", path, strerror(errno));
out:
    epd_free(header);
    return status;
}

epd_status_t epd_hf_mkmodel_write(const epd_hf_mkmodel_params_t *params, const char *tokenizer_dir,
                                  const char *out)
{
    epd_hf_mkmodel_params_t p = *params;
    size_t n;
    size_t esize;
    uint32_t shards;
    uint64_t total = 0;
    uint64_t acc = 0;
    size_t lo = 0;
    char path[4096];
    json_t *wmap = NULL;
    epd_status_t status;
    epd_rng_t rng;
    void *buf;

    if (epd_dtype_size(p.hp.dtype) == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (tokenizer_dir != NULL) {
        status = epd_hfmk_from_tokenizer(&p.hp, tokenizer_dir);
        if (status != EPD_OK) {
            return status;
        }
    }
    status = epd_hf_hparams_check(&p.hp);
    if (status != EPD_OK) {
        return status;
    }
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        epd_log_error(EPD_HFMK_LOG, 0, "%s: cannot create: %s", out, strerror(errno));
        return EPD_ERR_IO;
    }
    status = epd_hf_hparams_save(&p.hp, out);
    if (status == EPD_OK && tokenizer_dir != NULL) {
        status = epd_hfmk_copy(tokenizer_dir, out, "tokenizer.json", 1);
        if (status == EPD_OK) {
            status = epd_hfmk_copy(tokenizer_dir, out, "tokenizer_config.json", 0);
        }
    }
    if (status != EPD_OK) {
        return status;
    }
    n = epd_hf_tensor_count(&p.hp);
    esize = epd_dtype_size(p.hp.dtype);
    for (size_t i = 0; i < n; i++) {
        epd_hf_tensor_spec_t s;

        epd_hf_tensor_spec(&p.hp, i, &s);
        total += s.n_elems * esize;
    }
    shards = p.shards == 0 ? 1 : p.shards;
    if (shards > n) {
        shards = (uint32_t)n;
    }
    buf = epd_malloc(EPD_HFMK_CHUNK * sizeof(float));
    if (buf == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    epd_rng_seed(&rng, p.seed);
    if (shards == 1) {
        snprintf(path, sizeof(path), "%s/model.safetensors", out);
        status = epd_hfmk_file(&p, path, 0, n, &rng, buf);
        goto out;
    }
    wmap = json_object();
    if (wmap == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    for (uint32_t k = 0; k < shards; k++) {
        char fname[64];
        size_t hi = lo;

        /* shard k ends at the first tensor boundary past (k+1)/shards of the
         * bytes, leaving at least one tensor for each later shard */
        while (hi < n - (shards - 1 - k)) {
            epd_hf_tensor_spec_t s;

            epd_hf_tensor_spec(&p.hp, hi, &s);
            acc += s.n_elems * esize;
            hi++;
            if (k + 1 < shards && acc * shards >= total * (k + 1)) {
                break;
            }
        }
        snprintf(fname, sizeof(fname), "model-%05u-of-%05u.safetensors", k + 1, shards);
        snprintf(path, sizeof(path), "%s/%s", out, fname);
        status = epd_hfmk_file(&p, path, lo, hi, &rng, buf);
        if (status != EPD_OK) {
            goto out;
        }
        for (size_t i = lo; i < hi; i++) {
            epd_hf_tensor_spec_t s;

            epd_hf_tensor_spec(&p.hp, i, &s);
            json_object_set_new(wmap, s.name, json_string(fname));
        }
        lo = hi;
    }
    {
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total,
                                  "weight_map", wmap);

        snprintf(path, sizeof(path), "%s/model.safetensors.index.json", out);
        if (index == NULL || json_dump_file(index, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0) {
            epd_log_error(EPD_HFMK_LOG, 0, "%s: cannot write", path);
            status = EPD_ERR_IO;
        }
        json_decref(index);
    }
out:
    json_decref(wmap);
    epd_free(buf);
    return status;
}
