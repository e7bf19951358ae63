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
    rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc != 0) {
        epd_log_error(EPD_REF_LOG, 0, "%s: cannot write", path);
        return EPD_ERR_IO;
    }
    return EPD_OK;
}

size_t epd_ref_tensor_count(const epd_ref_hparams_t *hp)
{
    return 3 + (size_t)hp->n_layers * EPD_REF_PER_LAYER;
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

void epd_ref_tensor_spec(const epd_ref_hparams_t *hp, size_t i, epd_ref_tensor_spec_t *s)
{
    size_t n = epd_ref_tensor_count(hp);
    uint64_t qd = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t kvd = (uint64_t)hp->n_kv_heads * hp->head_dim;

    memset(s, 0, sizeof(*s));
    if (i == 0) {
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
