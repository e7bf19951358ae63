/*
 * epd_mkmodel.c — `epd-mkmodel --out DIR [...]`: writes a `ref` model of
 * seeded random weights (config.json + model.safetensors), with a vision
 * encoder unless --vision 0.  The work is epd_mkmodel_write(); this file
 * only maps flags onto its parameters.
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
    int64_t layers, dim, heads, kv_heads, head_dim = 0, vocab = 0, ffn, max_context, seed;
    int64_t vision = 1, image_size, patch, vdim, vlayers, vheads, vffn, merge;
    int argi;
    int rc = 1;
    epd_status_t status;

    epd_mkmodel_defaults(&p);
    layers = p.hp.n_layers;
    dim = p.hp.dim;
    heads = p.hp.n_heads;
    kv_heads = p.hp.n_kv_heads;
    ffn = p.hp.ffn;
    image_size = p.hp.vision.image_size;
    patch = p.hp.vision.patch_size;
    vdim = p.hp.vision.dim;
    vlayers = p.hp.vision.n_layers;
    vheads = p.hp.vision.n_heads;
    vffn = p.hp.vision.ffn;
    merge = p.hp.vision.merge;
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
            {"vocab", EPD_OPT_INT, &vocab, 0, 1 << 20,
             "vocabulary (0 = 259 with vision: 256 bytes, BOS, EOS, image; 258 without)"},
            {"ffn", EPD_OPT_INT, &ffn, 1, 65536, "MLP hidden size"},
            {"max-context", EPD_OPT_INT, &max_context, 1, 1 << 24, "context limit in tokens"},
            {"seed", EPD_OPT_INT, &seed, 0, 0, "weight seed"},
            {"dtype", EPD_OPT_STRING, &dtype, 0, 0, "stored weight type: F32, F16, BF16"},
            {"vision", EPD_OPT_INT, &vision, 0, 1, "1: with a vision encoder, 0: text only"},
            {"image-size", EPD_OPT_INT, &image_size, 2, 4096, "vision: square input side, pixels"},
            {"patch-size", EPD_OPT_INT, &patch, 1, 64, "vision: patch side (divides image size)"},
            {"vision-dim", EPD_OPT_INT, &vdim, 1, 4096, "vision: hidden size"},
            {"vision-layers", EPD_OPT_INT, &vlayers, 1, 64, "vision: transformer blocks"},
            {"vision-heads", EPD_OPT_INT, &vheads, 1, 64, "vision: heads (divide vision-dim)"},
            {"vision-ffn", EPD_OPT_INT, &vffn, 1, 16384, "vision: MLP hidden size"},
            {"merge", EPD_OPT_INT, &merge, 1, 8,
             "vision: m x m patches merged into one embedding (divides the patch grid)"},
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
        p.hp.ffn = (uint32_t)ffn;
        if (vision) {
            p.hp.vision.image_size = (uint32_t)image_size;
            p.hp.vision.patch_size = (uint32_t)patch;
            p.hp.vision.dim = (uint32_t)vdim;
            p.hp.vision.n_layers = (uint32_t)vlayers;
            p.hp.vision.n_heads = (uint32_t)vheads;
            p.hp.vision.ffn = (uint32_t)vffn;
            p.hp.vision.merge = (uint32_t)merge;
        } else {
            epd_mkmodel_text_only(&p);
        }
        if (vocab != 0) {
            p.hp.vocab = (uint32_t)vocab;
        }
        if (vision && p.hp.vocab <= (uint32_t)p.hp.image_token) {
            fprintf(stderr,
                    "epd-mkmodel: with a vision encoder the vocabulary needs at least %d ids "
                    "(token %d is the image placeholder): --vocab %d or more, or --vision 0\n",
                    p.hp.image_token + 1, p.hp.image_token, p.hp.image_token + 1);
            goto out;
        }
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
