/*
 * epd_mkmodel.c — `epd-mkmodel --out DIR [...]`: writes a `ref` model of
 * seeded random weights (config.json + model.safetensors).  The work is
 * epd_mkmodel_write(); this file only maps flags onto its parameters.
 */
#include <stdio.h>
#include <string.h>

#include "epd_config.h"
#include "epd_log.h"
#include "epd_mkmodel.h"

int main(int argc, char **argv)
{
    epd_mkmodel_params_t p;
    const char *out = NULL;
    const char *pattern;
    const char *dtype = "F32";
    int64_t layers, dim, heads, kv_heads, head_dim = 0, vocab, ffn, max_context, seed;
    int argi;
    int rc = 1;
    epd_status_t status;

    epd_mkmodel_defaults(&p);
    layers = p.hp.n_layers;
    dim = p.hp.dim;
    heads = p.hp.n_heads;
    kv_heads = p.hp.n_kv_heads;
    vocab = p.hp.vocab;
    ffn = p.hp.ffn;
    max_context = p.hp.max_context;
    seed = (int64_t)p.seed;
    pattern = p.hp.pattern;
    {
        const epd_opt_t opts[] = {
            {"out", EPD_OPT_STRING, &out, 0, 0, "output folder (created)"},
            {"layers", EPD_OPT_INT, &layers, 1, EPD_KV_MAX_LAYERS, "number of layers"},
            {"dim", EPD_OPT_INT, &dim, 2, 16384, "hidden size"},
            {"heads", EPD_OPT_INT, &heads, 1, 256, "attention heads"},
            {"kv-heads", EPD_OPT_INT, &kv_heads, 1, 256, "key/value heads (divides heads)"},
            {"head-dim", EPD_OPT_INT, &head_dim, 0, 1024, "head size (0 = dim / heads)"},
            {"layer-pattern", EPD_OPT_STRING, &pattern, 0, 0,
             "L (linear) / A (attention) letters, repeated over the layers"},
            {"vocab", EPD_OPT_INT, &vocab, 258, 1 << 20, "vocabulary (>= 256 bytes + BOS + EOS)"},
            {"ffn", EPD_OPT_INT, &ffn, 1, 65536, "MLP hidden size"},
            {"max-context", EPD_OPT_INT, &max_context, 1, 1 << 24, "context limit in tokens"},
            {"seed", EPD_OPT_INT, &seed, 0, 0, "weight seed"},
            {"dtype", EPD_OPT_STRING, &dtype, 0, 0, "stored weight type: F32, F16, BF16"},
        };
        epd_opts_t o = {.prog = "epd-mkmodel",
                        .summary = "write a ref model of seeded random weights",
                        .opts = opts,
                        .n_opts = sizeof(opts) / sizeof(opts[0])};

        status = epd_opts_parse(&o, argc, argv, &argi);
        if (status == EPD_ERR_CANCELED) {
            epd_opts_cleanup(&o);
            return 0;
        }
        if (status != EPD_OK) {
            goto out;
        }
        if (argi != argc) {
            fprintf(stderr, "epd-mkmodel: unexpected argument '%s'\n", argv[argi]);
            goto out;
        }
        if (out == NULL || out[0] == '\0') {
            fprintf(stderr, "epd-mkmodel: --out DIR is required\n");
            goto out;
        }
        if (strlen(pattern) == 0 || strlen(pattern) > EPD_REF_MAX_PATTERN) {
            fprintf(stderr, "epd-mkmodel: --layer-pattern must have 1..%d letters\n",
                    EPD_REF_MAX_PATTERN);
            goto out;
        }
        p.hp.n_layers = (uint32_t)layers;
        p.hp.dim = (uint32_t)dim;
        p.hp.n_heads = (uint32_t)heads;
        p.hp.n_kv_heads = (uint32_t)kv_heads;
        p.hp.head_dim = head_dim ? (uint32_t)head_dim : (uint32_t)(dim / heads);
        p.hp.vocab = (uint32_t)vocab;
        p.hp.ffn = (uint32_t)ffn;
        p.hp.max_context = (uint32_t)max_context;
        p.seed = (uint64_t)seed;
        memmove(p.hp.pattern, pattern, strlen(pattern) + 1);
        if (strcmp(dtype, "F32") == 0) {
            p.dtype = EPD_DTYPE_F32;
        } else if (strcmp(dtype, "F16") == 0) {
            p.dtype = EPD_DTYPE_F16;
        } else if (strcmp(dtype, "BF16") == 0) {
            p.dtype = EPD_DTYPE_BF16;
        } else {
            fprintf(stderr, "epd-mkmodel: --dtype must be F32, F16 or BF16\n");
            goto out;
        }
        status = epd_mkmodel_write(&p, out);
        if (status != EPD_OK) {
            fprintf(stderr, "epd-mkmodel: cannot write the model: %s\n", epd_status_string(status));
            goto out;
        }
        rc = 0;
    out:
        epd_opts_cleanup(&o);
    }
    return rc;
}
