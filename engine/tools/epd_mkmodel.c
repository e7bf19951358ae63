/*
 * epd_mkmodel.c — `epd-mkmodel --out DIR [...]`: writes a `ref` model of
 * seeded random weights (config.json + model.safetensors), with a vision
 * encoder unless --vision 0.  With --arch it writes a Hugging Face folder
 * instead (epd_hf_model.h), with its own flags (a separate table, so the
 * ref mode's flags and defaults stay exactly as they were).  The work is
 * epd_mkmodel_write() / epd_hf_mkmodel_write(); this file only maps flags
 * onto their parameters.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "epd_config.h"
#include "epd_hf_model.h"
#include "epd_log.h"
#include "epd_mkmodel.h"

static int epd_mk_has_arch(int argc, char **argv)
{
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--arch") == 0 || strncmp(argv[i], "--arch=", 7) == 0) {
            return 1;
        }
    }
    return 0;
}

/* epd-mkmodel --arch ...: a Hugging Face folder.  Flags left at -1 take
 * the architecture's default (epd_hf_mkmodel_defaults). */
static int epd_mk_hf_main(int argc, char **argv)
{
    epd_hf_mkmodel_params_t p;
    const char *arch = NULL;
    const char *out = NULL;
    const char *tokenizer = NULL;
    const char *dtype = "bf16";
    int tied = 0;
    int64_t shards = 1, layers = -1, hidden = -1, heads = -1, kv_heads = -1;
    int64_t head_dim = -1, inter = -1, experts = -1, topk = -1, moe_inter = -1, norm_topk = -1;
    int64_t seed = 1, vocab = -1, max_pos = -1;
    int argi;
    int rc = 1;
    int a;
    epd_status_t status;
    const epd_opt_t opts[] = {
        {"arch", EPD_OPT_STRING, &arch, 0, 0, "llama | qwen2 | qwen3 | qwen3_moe"},
        {"out", EPD_OPT_STRING, &out, 0, 0, "output folder (created)"},
        {"tokenizer", EPD_OPT_STRING, &tokenizer, 0, 0,
         "folder with tokenizer.json (+ tokenizer_config.json), copied; sets vocab_size, bos, eos"},
        {"dtype", EPD_OPT_STRING, &dtype, 0, 0, "stored weight type: bf16, f16, f32"},
        {"shards", EPD_OPT_INT, &shards, 1, EPD_HF_MAX_SHARDS,
         "weight files (N > 1: model-0000i-of-0000N.safetensors + index)"},
        {"tied", EPD_OPT_BOOL, &tied, 0, 0, "tie_word_embeddings: no lm_head.weight"},
        {"layers", EPD_OPT_INT, &layers, -1, EPD_KV_MAX_LAYERS, "layers (-1: 2)"},
        {"hidden", EPD_OPT_INT, &hidden, -1, 65536, "hidden size (-1: 64)"},
        {"heads", EPD_OPT_INT, &heads, -1, 1024, "attention heads (-1: 4)"},
        {"kv-heads", EPD_OPT_INT, &kv_heads, -1, 1024, "key/value heads (-1: 2)"},
        {"head-dim", EPD_OPT_INT, &head_dim, -1, 1024,
         "head size (-1: 16; qwen3 and qwen3_moe 32)"},
        {"intermediate", EPD_OPT_INT, &inter, -1, 1 << 20, "dense MLP size (-1: 128)"},
        {"experts", EPD_OPT_INT, &experts, -1, EPD_HF_MAX_EXPERTS, "qwen3_moe: experts (-1: 8)"},
        {"experts-per-tok", EPD_OPT_INT, &topk, -1, EPD_HF_MAX_EXPERTS,
         "qwen3_moe: experts per token (-1: 2)"},
        {"moe-intermediate", EPD_OPT_INT, &moe_inter, -1, 1 << 20,
         "qwen3_moe: expert MLP size (-1: 32)"},
        {"norm-topk-prob", EPD_OPT_INT, &norm_topk, -1, 1,
         "qwen3_moe: 1 renormalises the top-k weights (-1: 1)"},
        {"vocab", EPD_OPT_INT, &vocab, -1, 1 << 24, "vocabulary without --tokenizer (-1: 512)"},
        {"max-position", EPD_OPT_INT, &max_pos, -1, 1 << 24,
         "max_position_embeddings (-1: llama 131072, qwen 40960)"},
        {"seed", EPD_OPT_INT, &seed, 0, 0, "weight seed"},
    };
    epd_opts_t o = {.prog = "epd-mkmodel",
                    .summary = "write a Hugging Face model folder of seeded random weights",
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
    a = arch != NULL ? epd_hf_arch_parse(arch) : -1;
    if (a < 0) {
        fprintf(stderr, "epd-mkmodel: --arch must be llama, qwen2, qwen3 or qwen3_moe\n");
        goto out;
    }
    if (out == NULL || out[0] == '\0') {
        fprintf(stderr, "epd-mkmodel: --out DIR is required\n");
        goto out;
    }
    epd_hf_mkmodel_defaults((epd_hf_arch_t)a, &p);
    if (strcasecmp(dtype, "bf16") == 0) {
        p.hp.dtype = EPD_DTYPE_BF16;
    } else if (strcasecmp(dtype, "f16") == 0) {
        p.hp.dtype = EPD_DTYPE_F16;
    } else if (strcasecmp(dtype, "f32") == 0) {
        p.hp.dtype = EPD_DTYPE_F32;
    } else {
        fprintf(stderr, "epd-mkmodel: --dtype must be bf16, f16 or f32\n");
        goto out;
    }
#define EPD_MK_SET(field, v)                                                                       \
    do {                                                                                           \
        if ((v) >= 0) {                                                                            \
            p.hp.field = (uint32_t)(v);                                                            \
        }                                                                                          \
    } while (0)
    EPD_MK_SET(n_layers, layers);
    EPD_MK_SET(dim, hidden);
    EPD_MK_SET(n_heads, heads);
    EPD_MK_SET(n_kv_heads, kv_heads);
    EPD_MK_SET(head_dim, head_dim);
    EPD_MK_SET(vocab, vocab);
    EPD_MK_SET(max_context, max_pos);
    if (p.hp.arch == EPD_HF_QWEN3_MOE) {
        EPD_MK_SET(n_experts, experts);
        EPD_MK_SET(top_k, topk);
        EPD_MK_SET(moe_ffn, moe_inter);
        if (norm_topk >= 0) {
            p.hp.norm_topk = (int)norm_topk;
        }
        if (inter >= 0) {
            p.hp.ffn = (uint32_t)inter; /* written as intermediate_size, unused by the MoE layers */
        }
    } else {
        EPD_MK_SET(ffn, inter);
    }
#undef EPD_MK_SET
    p.hp.tied = tied;
    p.shards = (uint32_t)shards;
    p.seed = (uint64_t)seed;
    status = epd_hf_mkmodel_write(&p, tokenizer, out);
    if (status != EPD_OK) {
        fprintf(stderr, "epd-mkmodel: cannot write the model: %s\n", epd_status_string(status));
        goto out;
    }
    rc = 0;
out:
    epd_opts_cleanup(&o);
    return rc;
}

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

    if (epd_mk_has_arch(argc, argv)) {
        return epd_mk_hf_main(argc, argv);
    }
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
                        .summary = "write a ref model of seeded random weights (--arch llama|qwen2|qwen3|qwen3_moe: a Hugging Face folder instead; see epd-mkmodel --arch llama --help)",
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
