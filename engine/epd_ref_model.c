/*
 * epd_ref_model.c — config.json and the tensor list of the `ref` model.
 * config.json is parsed with jansson; every field is range-checked here so
 * the engine can size its buffers from it without further checks.
 */
#include "epd_ref_model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "epd_log.h"

#define EPD_REF_LOG "ref"
#define EPD_REF_PER_LAYER 9

epd_layer_kind_t epd_ref_layer_kind(const epd_ref_hparams_t *hp, uint32_t layer)
{
    size_t len = strlen(hp->pattern);

    return hp->pattern[layer % len] == 'L' ? EPD_LAYER_LINEAR : EPD_LAYER_ATTENTION;
}

double epd_ref_linear_decay(uint32_t head)
{
    return 1.0 - ldexp(1.0, -(int)(5 + head));
}

uint32_t epd_ref_vision_grid(const epd_ref_hparams_t *hp)
{
    return hp->vision.image_size / hp->vision.patch_size;
}

uint32_t epd_ref_vision_patches(const epd_ref_hparams_t *hp)
{
    return epd_ref_vision_grid(hp) * epd_ref_vision_grid(hp);
}

uint32_t epd_ref_image_embeddings(const epd_ref_hparams_t *hp)
{
    uint32_t side = epd_ref_vision_grid(hp) / hp->vision.merge;

    return side * side;
}

uint32_t epd_ref_vision_merged_dim(const epd_ref_hparams_t *hp)
{
    return hp->vision.merge * hp->vision.merge * hp->vision.dim;
}

/* NULL when the vision part of `hp` is sound, else why not. */
static const char *epd_ref_vision_problem(const epd_ref_hparams_t *hp)
{
    const epd_ref_vision_hparams_t *v = &hp->vision;

    if (!hp->has_vision) {
        return hp->image_token == -1 ? NULL : "image_token_id needs a vision_config";
    }
    if (hp->image_token < 256 || (uint32_t)hp->image_token >= hp->vocab ||
        hp->image_token == hp->bos || hp->image_token == hp->eos) {
        return "image_token_id must be an id >= 256 inside the vocabulary, distinct from BOS "
               "and EOS";
    }
    if (v->image_size < 2 || v->image_size > 4096) {
        return "vision_config.image_size must be in [2, 4096]";
    }
    if (v->patch_size == 0 || v->patch_size > 64 || v->image_size % v->patch_size != 0) {
        return "vision_config.patch_size must be in [1, 64] and divide image_size";
    }
    if (v->image_size / v->patch_size > 64) {
        return "vision_config: at most 64 x 64 patches (image_size / patch_size <= 64)";
    }
    if (v->merge == 0 || v->merge > 8 || (v->image_size / v->patch_size) % v->merge != 0) {
        return "vision_config.spatial_merge_size must be in [1, 8] and divide the patch grid "
               "(image_size / patch_size; the 2 x 2 merge needs an even grid)";
    }
    if (v->dim == 0 || v->dim > 4096) {
        return "vision_config.hidden_size must be in [1, 4096]";
    }
    if (v->n_heads == 0 || v->n_heads > 64 || v->dim % v->n_heads != 0) {
        return "vision_config.num_attention_heads must be in [1, 64] and divide hidden_size";
    }
    if (v->n_layers == 0 || v->n_layers > 64) {
        return "vision_config.num_hidden_layers must be in [1, 64]";
    }
    if (v->ffn == 0 || v->ffn > 16384) {
        return "vision_config.intermediate_size must be in [1, 16384]";
    }
    if ((uint64_t)v->merge * v->merge * v->dim > 65536) {
        return "vision_config: spatial_merge_size^2 * hidden_size must be at most 65536";
    }
    if (!(v->ln_eps > 0.0) || !(v->ln_eps < 1.0)) {
        return "vision_config.layer_norm_eps must be in (0, 1)";
    }
    return NULL;
}

epd_status_t epd_ref_hparams_check(const epd_ref_hparams_t *hp)
{
    const char *why = NULL;
    size_t plen = strnlen(hp->pattern, sizeof(hp->pattern));

    if (hp->vocab < EPD_REF_MIN_VOCAB || hp->vocab > (1u << 20)) {
        why = "vocab_size must be in [258, 2^20] (256 bytes + BOS + EOS)";
    } else if (hp->dim == 0 || hp->dim > 16384) {
        why = "hidden_size must be in [1, 16384]";
    } else if (hp->n_layers == 0 || hp->n_layers > EPD_KV_MAX_LAYERS) {
        why = "num_hidden_layers must be in [1, 256]";
    } else if (hp->n_heads == 0 || hp->n_heads > 256 || hp->n_kv_heads == 0 ||
               hp->n_heads % hp->n_kv_heads != 0) {
        why = "num_attention_heads must be a multiple of num_key_value_heads (1..256)";
    } else if (hp->head_dim == 0 || hp->head_dim % 2 != 0 || hp->head_dim > 1024) {
        why = "head_dim must be even, in [2, 1024]";
    } else if (hp->ffn == 0 || hp->ffn > 65536) {
        why = "intermediate_size must be in [1, 65536]";
    } else if (hp->max_context == 0 || hp->max_context > (1u << 24)) {
        why = "max_position_embeddings must be in [1, 2^24]";
    } else if (!(hp->rope_theta > 1.0) || !(hp->rope_theta < 1e12)) {
        why = "rope_theta must be in (1, 1e12)";
    } else if (!(hp->rms_eps > 0.0) || !(hp->rms_eps < 1.0)) {
        why = "rms_norm_eps must be in (0, 1)";
    } else if (hp->bos < 0 || (uint32_t)hp->bos >= hp->vocab || hp->eos < 0 ||
               (uint32_t)hp->eos >= hp->vocab || hp->bos == hp->eos || hp->bos < 256 ||
               hp->eos < 256) {
        why = "bos_token_id and eos_token_id must be distinct ids >= 256 inside the vocabulary";
    } else if (plen == 0 || plen > EPD_REF_MAX_PATTERN || strspn(hp->pattern, "LA") != plen) {
        why = "layer_pattern must be 1..64 letters L (linear) or A (attention)";
    } else {
        why = epd_ref_vision_problem(hp);
    }
    if (why != NULL) {
        epd_log_error(EPD_REF_LOG, 0, "model config: %s", why);
        return EPD_ERR_MALFORMED;
    }
    return EPD_OK;
}

static int epd_ref_get_u32(json_t *root, const char *key, int required, uint32_t dflt,
                           uint32_t *out)
{
    json_t *v = json_object_get(root, key);

    if (v == NULL && !required) {
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX) {
        epd_log_error(EPD_REF_LOG, 0, "config.json: '%s' must be a non-negative integer", key);
        return -1;
    }
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static int epd_ref_get_f64(json_t *root, const char *key, double dflt, double *out)
{
    json_t *v = json_object_get(root, key);

    if (v == NULL) {
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v)) {
        epd_log_error(EPD_REF_LOG, 0, "config.json: '%s' must be a number", key);
        return -1;
    }
    *out = json_number_value(v);
    return 0;
}

/* Reads "vision_config" and "image_token_id" of `root` into hp (absent:
 * text only).  0, or -1 after logging. */
static int epd_ref_load_vision(json_t *root, const char *path, epd_ref_hparams_t *hp)
{
    json_t *jv = json_object_get(root, "vision_config");
    json_t *jtok = json_object_get(root, "image_token_id");
    epd_ref_vision_hparams_t *v = &hp->vision;
    uint32_t out_dim;
    uint32_t tok;

    hp->image_token = -1;
    if (jv == NULL || json_is_null(jv)) {
        if (jtok != NULL && !json_is_null(jtok)) {
            epd_log_error(EPD_REF_LOG, 0, "%s: image_token_id without a vision_config", path);
            return -1;
        }
        return 0;
    }
    if (!json_is_object(jv)) {
        epd_log_error(EPD_REF_LOG, 0, "%s: vision_config must be an object", path);
        return -1;
    }
    hp->has_vision = 1;
    if (epd_ref_get_u32(root, "image_token_id", 1, 0, &tok) ||
        epd_ref_get_u32(jv, "image_size", 1, 0, &v->image_size) ||
        epd_ref_get_u32(jv, "patch_size", 1, 0, &v->patch_size) ||
        epd_ref_get_u32(jv, "hidden_size", 1, 0, &v->dim) ||
        epd_ref_get_u32(jv, "num_hidden_layers", 1, 0, &v->n_layers) ||
        epd_ref_get_u32(jv, "num_attention_heads", 1, 0, &v->n_heads) ||
        epd_ref_get_u32(jv, "intermediate_size", 1, 0, &v->ffn) ||
        epd_ref_get_u32(jv, "spatial_merge_size", 0, 2, &v->merge) ||
        epd_ref_get_u32(jv, "out_hidden_size", 0, hp->dim, &out_dim) ||
        epd_ref_get_f64(jv, "layer_norm_eps", 1e-6, &v->ln_eps)) {
        return -1;
    }
    if (out_dim != hp->dim) {
        epd_log_error(EPD_REF_LOG, 0,
                      "%s: vision_config.out_hidden_size %u differs from hidden_size %u", path,
                      out_dim, hp->dim);
        return -1;
    }
    if (tok > INT32_MAX) {
        epd_log_error(EPD_REF_LOG, 0, "%s: image_token_id out of range", path);
        return -1;
    }
    hp->image_token = (int32_t)tok;
    return 0;
}

epd_status_t epd_ref_hparams_load(const char *dir, epd_ref_hparams_t *hp_p)
{
    epd_ref_hparams_t hp;
    char path[4096];
    json_error_t jerr;
    json_t *root;
    json_t *jpat;
    json_t *jtype;
    uint32_t bos;
    uint32_t eos;
    epd_status_t status = EPD_ERR_MALFORMED;
    FILE *f;

    memset(&hp, 0, sizeof(hp));
    if (snprintf(path, sizeof(path), "%s/config.json", dir) >= (int)sizeof(path)) {
        epd_log_error(EPD_REF_LOG, 0, "model path too long");
        return EPD_ERR_INVALID_PARAM;
    }
    f = fopen(path, "r");
    if (f == NULL) {
        epd_log_error(EPD_REF_LOG, 0, "%s: cannot open (is --model a model folder?)", path);
        return EPD_ERR_NOT_FOUND;
    }
    root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
    fclose(f);
    if (root == NULL) {
        epd_log_error(EPD_REF_LOG, 0, "%s: %s (line %d column %d)", path, jerr.text, jerr.line,
                      jerr.column);
        return EPD_ERR_MALFORMED;
    }
    if (!json_is_object(root)) {
        epd_log_error(EPD_REF_LOG, 0, "%s: not a JSON object", path);
        goto out;
    }
    jtype = json_object_get(root, "model_type");
    if (!json_is_string(jtype) || strcmp(json_string_value(jtype), "epd-ref") != 0) {
        epd_log_error(EPD_REF_LOG, 0, "%s: model_type must be \"epd-ref\"", path);
        goto out;
    }
    if (epd_ref_get_u32(root, "vocab_size", 1, 0, &hp.vocab) ||
        epd_ref_get_u32(root, "hidden_size", 1, 0, &hp.dim) ||
        epd_ref_get_u32(root, "num_hidden_layers", 1, 0, &hp.n_layers) ||
        epd_ref_get_u32(root, "num_attention_heads", 1, 0, &hp.n_heads) ||
        epd_ref_get_u32(root, "num_key_value_heads", 0, hp.n_heads, &hp.n_kv_heads) ||
        epd_ref_get_u32(root, "head_dim", 0, hp.n_heads ? hp.dim / hp.n_heads : 0, &hp.head_dim) ||
        epd_ref_get_u32(root, "intermediate_size", 1, 0, &hp.ffn) ||
        epd_ref_get_u32(root, "max_position_embeddings", 1, 0, &hp.max_context) ||
        epd_ref_get_u32(root, "bos_token_id", 0, EPD_REF_BOS, &bos) ||
        epd_ref_get_u32(root, "eos_token_id", 0, EPD_REF_EOS, &eos) ||
        epd_ref_get_f64(root, "rope_theta", 10000.0, &hp.rope_theta) ||
        epd_ref_get_f64(root, "rms_norm_eps", 1e-5, &hp.rms_eps)) {
        goto out;
    }
    if (bos > INT32_MAX || eos > INT32_MAX) {
        epd_log_error(EPD_REF_LOG, 0, "%s: token ids out of range", path);
        goto out;
    }
    hp.bos = (int32_t)bos;
    hp.eos = (int32_t)eos;
    if (epd_ref_load_vision(root, path, &hp) != 0) {
        goto out;
    }
    jpat = json_object_get(root, "layer_pattern");
    if (jpat == NULL) {
        strcpy(hp.pattern, "A");
    } else if (!json_is_string(jpat) || json_string_length(jpat) > EPD_REF_MAX_PATTERN) {
        epd_log_error(EPD_REF_LOG, 0, "%s: layer_pattern must be a string of at most %d letters",
                      path, EPD_REF_MAX_PATTERN);
        goto out;
    } else {
        memcpy(hp.pattern, json_string_value(jpat), json_string_length(jpat));
        hp.pattern[json_string_length(jpat)] = '\0';
    }
    status = epd_ref_hparams_check(&hp);
    if (status == EPD_OK) {
        *hp_p = hp;
    }
out:
    json_decref(root);
    return status;
}

epd_status_t epd_ref_hparams_save(const epd_ref_hparams_t *hp, const char *dir)
{
    char path[4096];
    json_t *root;
    int rc;

    if (snprintf(path, sizeof(path), "%s/config.json", dir) >= (int)sizeof(path)) {
        return EPD_ERR_INVALID_PARAM;
    }
    root = json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:I, s:f, s:f, s:I, s:I, s:s}", "model_type",
        "epd-ref", "vocab_size", (json_int_t)hp->vocab, "hidden_size", (json_int_t)hp->dim,
        "num_hidden_layers", (json_int_t)hp->n_layers, "num_attention_heads",
        (json_int_t)hp->n_heads, "num_key_value_heads", (json_int_t)hp->n_kv_heads, "head_dim",
        (json_int_t)hp->head_dim, "intermediate_size", (json_int_t)hp->ffn, "layer_pattern",
        hp->pattern, "max_position_embeddings", (json_int_t)hp->max_context, "rope_theta",
        hp->rope_theta, "rms_norm_eps", hp->rms_eps, "bos_token_id", (json_int_t)hp->bos,
        "eos_token_id", (json_int_t)hp->eos, "torch_dtype", "float32");
    if (root == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    if (hp->has_vision) {
        const epd_ref_vision_hparams_t *v = &hp->vision;
        json_t *jv = json_pack(
            "{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "model_type", "epd-ref-vision",
            "image_size", (json_int_t)v->image_size, "patch_size", (json_int_t)v->patch_size,
            "hidden_size", (json_int_t)v->dim, "num_hidden_layers", (json_int_t)v->n_layers,
            "num_attention_heads", (json_int_t)v->n_heads, "intermediate_size",
            (json_int_t)v->ffn, "spatial_merge_size", (json_int_t)v->merge, "out_hidden_size",
            (json_int_t)hp->dim, "layer_norm_eps", v->ln_eps);

        if (jv == NULL || json_object_set_new(root, "vision_config", jv) != 0 ||
            json_object_set_new(root, "image_token_id", json_integer(hp->image_token)) != 0) {
            json_decref(root);
            return EPD_ERR_NO_MEMORY;
        }
    }
    rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc != 0) {
        epd_log_error(EPD_REF_LOG, 0, "%s: cannot write", path);
        return EPD_ERR_IO;
    }
    return EPD_OK;
}

size_t epd_ref_lm_tensor_count(const epd_ref_hparams_t *hp)
{
    return 3 + (size_t)hp->n_layers * EPD_REF_PER_LAYER;
}

size_t epd_ref_tensor_count(const epd_ref_hparams_t *hp)
{
    size_t n = epd_ref_lm_tensor_count(hp);

    if (hp->has_vision) {
        /* patch embedding (2), positions, blocks, post norm (2), merger (4) */
        n += 3 + (size_t)hp->vision.n_layers * EPD_REF_VISION_PER_BLOCK + 2 + 4;
    }
    return n;
}

static void epd_ref_spec_set(epd_ref_tensor_spec_t *s, uint32_t ndim, uint64_t d0, uint64_t d1,
                             epd_ref_init_t init)
{
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = ndim > 1 ? d1 : 0;
    s->n_elems = ndim > 1 ? d0 * d1 : d0;
    s->init = init;
    s->fan_in = ndim > 1 ? (uint32_t)d1 : 1;
}

/* A bias (or layer norm bias) of `n` elements for a map of fan-in `fan_in`. */
static void epd_ref_spec_bias(epd_ref_tensor_spec_t *s, uint64_t n, uint32_t fan_in)
{
    epd_ref_spec_set(s, 1, n, 0, EPD_REF_INIT_NORMAL);
    s->fan_in = fan_in;
}

/* The i-th vision tensor (0-based among the vision tensors). */
static void epd_ref_vision_spec(const epd_ref_hparams_t *hp, size_t i, epd_ref_tensor_spec_t *s)
{
    const epd_ref_vision_hparams_t *v = &hp->vision;
    size_t blocks = (size_t)v->n_layers * EPD_REF_VISION_PER_BLOCK;
    uint32_t pdim = v->patch_size * v->patch_size * 3;
    uint32_t mdim = epd_ref_vision_merged_dim(hp);

    if (i < 3) {
        static const char *const names[3] = {"visual.patch_embed.weight",
                                             "visual.patch_embed.bias", "visual.pos_embed.weight"};

        snprintf(s->name, sizeof(s->name), "%s", names[i]);
        if (i == 0) {
            epd_ref_spec_set(s, 2, v->dim, pdim, EPD_REF_INIT_NORMAL);
        } else if (i == 1) {
            epd_ref_spec_bias(s, v->dim, pdim);
        } else {
            epd_ref_spec_set(s, 2, epd_ref_vision_patches(hp), v->dim, EPD_REF_INIT_NORMAL);
        }
    } else if (i < 3 + blocks) {
        static const char *const names[EPD_REF_VISION_PER_BLOCK] = {
            "norm1.weight",       "norm1.bias",       "attn.q_proj.weight", "attn.q_proj.bias",
            "attn.k_proj.weight", "attn.k_proj.bias", "attn.v_proj.weight", "attn.v_proj.bias",
            "attn.o_proj.weight", "attn.o_proj.bias", "norm2.weight",       "norm2.bias",
            "mlp.fc1.weight",     "mlp.fc1.bias",     "mlp.fc2.weight",     "mlp.fc2.bias",
        };
        uint32_t block = (uint32_t)((i - 3) / EPD_REF_VISION_PER_BLOCK);
        uint32_t j = (uint32_t)((i - 3) % EPD_REF_VISION_PER_BLOCK);

        snprintf(s->name, sizeof(s->name), "visual.blocks.%u.%s", block, names[j]);
        if (j == 0 || j == 10) {
            epd_ref_spec_set(s, 1, v->dim, 0, EPD_REF_INIT_ONES);
        } else if (j < 10 && j % 2 == 0) {
            epd_ref_spec_set(s, 2, v->dim, v->dim, EPD_REF_INIT_NORMAL);
        } else if (j < 12) {
            epd_ref_spec_bias(s, v->dim, v->dim); /* q k v o and the norms' biases */
        } else if (j == 12) {
            epd_ref_spec_set(s, 2, v->ffn, v->dim, EPD_REF_INIT_NORMAL);
        } else if (j == 13) {
            epd_ref_spec_bias(s, v->ffn, v->dim);
        } else if (j == 14) {
            epd_ref_spec_set(s, 2, v->dim, v->ffn, EPD_REF_INIT_NORMAL);
        } else {
            epd_ref_spec_bias(s, v->dim, v->ffn);
        }
    } else {
        static const char *const names[6] = {
            "visual.post_layernorm.weight", "visual.post_layernorm.bias",
            "visual.merger.mlp.0.weight",   "visual.merger.mlp.0.bias",
            "visual.merger.mlp.2.weight",   "visual.merger.mlp.2.bias",
        };
        size_t j = i - 3 - blocks;

        snprintf(s->name, sizeof(s->name), "%s", names[j]);
        switch (j) {
        case 0:
            epd_ref_spec_set(s, 1, v->dim, 0, EPD_REF_INIT_ONES);
            break;
        case 1:
            epd_ref_spec_bias(s, v->dim, v->dim);
            break;
        case 2:
            epd_ref_spec_set(s, 2, mdim, mdim, EPD_REF_INIT_NORMAL);
            break;
        case 3:
            epd_ref_spec_bias(s, mdim, mdim);
            break;
        case 4:
            epd_ref_spec_set(s, 2, hp->dim, mdim, EPD_REF_INIT_NORMAL);
            break;
        default:
            epd_ref_spec_bias(s, hp->dim, mdim);
            break;
        }
    }
}

void epd_ref_tensor_spec(const epd_ref_hparams_t *hp, size_t i, epd_ref_tensor_spec_t *s)
{
    size_t n = epd_ref_lm_tensor_count(hp);
    uint64_t qd = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t kvd = (uint64_t)hp->n_kv_heads * hp->head_dim;

    memset(s, 0, sizeof(*s));
    if (i >= n) {
        epd_ref_vision_spec(hp, i - n, s);
    } else if (i == 0) {
        snprintf(s->name, sizeof(s->name), "model.embed_tokens.weight");
        epd_ref_spec_set(s, 2, hp->vocab, hp->dim, EPD_REF_INIT_EMBED);
    } else if (i == n - 2) {
        snprintf(s->name, sizeof(s->name), "model.norm.weight");
        epd_ref_spec_set(s, 1, hp->dim, 0, EPD_REF_INIT_ONES);
    } else if (i == n - 1) {
        snprintf(s->name, sizeof(s->name), "lm_head.weight");
        epd_ref_spec_set(s, 2, hp->vocab, hp->dim, EPD_REF_INIT_NORMAL);
    } else {
        uint32_t layer = (uint32_t)((i - 1) / EPD_REF_PER_LAYER);
        uint32_t j = (uint32_t)((i - 1) % EPD_REF_PER_LAYER);
        int lin = epd_ref_layer_kind(hp, layer) == EPD_LAYER_LINEAR;
        const char *mix = lin ? "linear_attn" : "self_attn";
        uint64_t kv = lin ? qd : kvd;
        static const char *const names[EPD_REF_PER_LAYER] = {
            "input_layernorm", "%s.q_proj",   "%s.k_proj",
            "%s.v_proj",       "%s.o_proj",   "post_attention_layernorm",
            "mlp.gate_proj",   "mlp.up_proj", "mlp.down_proj",
        };
        char part[48];

        snprintf(part, sizeof(part), names[j], mix);
        snprintf(s->name, sizeof(s->name), "model.layers.%u.%s.weight", layer, part);
        switch (j) {
        case 0:
        case 5:
            epd_ref_spec_set(s, 1, hp->dim, 0, EPD_REF_INIT_ONES);
            break;
        case 1:
            epd_ref_spec_set(s, 2, qd, hp->dim, EPD_REF_INIT_NORMAL);
            break;
        case 2:
        case 3:
            epd_ref_spec_set(s, 2, kv, hp->dim, EPD_REF_INIT_NORMAL);
            break;
        case 4:
            epd_ref_spec_set(s, 2, hp->dim, qd, EPD_REF_INIT_NORMAL);
            break;
        case 6:
        case 7:
            epd_ref_spec_set(s, 2, hp->ffn, hp->dim, EPD_REF_INIT_NORMAL);
            break;
        default:
            epd_ref_spec_set(s, 2, hp->dim, hp->ffn, EPD_REF_INIT_NORMAL);
            break;
        }
    }
}
