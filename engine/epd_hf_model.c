/*
 * epd_hf_model.c — config.json / generation_config.json of Hugging Face
 * folders and the tensor list of each architecture (epd_hf_model.h).
 * Every refusal is one log line that names the key, so a user knows which
 * line of their config to look at.
 */
#include "epd_hf_model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "epd_log.h"

#define EPD_HF_LOG "hf"

static const char *const epd_hf_classes[4] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                              "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"};
static const char *const epd_hf_types[4] = {"llama", "qwen2", "qwen3", "qwen3_moe"};

const char *epd_hf_arch_class(epd_hf_arch_t arch)
{
    return (unsigned)arch < 4 ? epd_hf_classes[arch] : "?";
}

const char *epd_hf_arch_type(epd_hf_arch_t arch)
{
    return (unsigned)arch < 4 ? epd_hf_types[arch] : "?";
}

int epd_hf_arch_parse(const char *name)
{
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, epd_hf_classes[i]) == 0 || strcmp(name, epd_hf_types[i]) == 0) {
            return i;
        }
    }
    return -1;
}

static json_t *epd_hf_read_json(const char *dir, const char *file, int quiet)
{
    char path[4096];
    json_error_t jerr;
    json_t *root;

    if (snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path)) {
        return NULL;
    }
    root = json_load_file(path, 0, &jerr);
    if (root == NULL && !quiet) {
        epd_log_error(EPD_HF_LOG, 0, "%s: %s", path, jerr.text);
    }
    if (root != NULL && !json_is_object(root)) {
        if (!quiet) {
            epd_log_error(EPD_HF_LOG, 0, "%s: not a JSON object", path);
        }
        json_decref(root);
        return NULL;
    }
    return root;
}

int epd_hf_is_hf_folder(const char *dir)
{
    json_t *root = epd_hf_read_json(dir, "config.json", 1);
    int yes;

    if (root == NULL) {
        return 0;
    }
    yes = json_object_get(root, "architectures") != NULL;
    json_decref(root);
    return yes;
}

/* An unsigned integer key: *v_p untouched when absent and not required.
 * Returns -1 (logged) when required and absent or not an integer in range. */
static int epd_hf_get_u32(json_t *root, const char *path, const char *key, int required,
                          uint32_t *v_p)
{
    json_t *j = json_object_get(root, key);

    if (j == NULL || json_is_null(j)) {
        if (required) {
            epd_log_error(EPD_HF_LOG, 0, "%s: key '%s' is missing", path, key);
            return -1;
        }
        return 0;
    }
    if (!json_is_integer(j) || json_integer_value(j) < 0 ||
        json_integer_value(j) > (json_int_t)UINT32_MAX) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key '%s' must be a non-negative integer", path, key);
        return -1;
    }
    *v_p = (uint32_t)json_integer_value(j);
    return 0;
}

static int epd_hf_get_num(json_t *root, const char *path, const char *key, double *v_p)
{
    json_t *j = json_object_get(root, key);

    if (j == NULL || json_is_null(j)) {
        return 0;
    }
    if (!json_is_number(j)) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key '%s' must be a number", path, key);
        return -1;
    }
    *v_p = json_number_value(j);
    return 0;
}

static int epd_hf_get_bool(json_t *root, const char *path, const char *key, int *v_p)
{
    json_t *j = json_object_get(root, key);

    if (j == NULL || json_is_null(j)) {
        return 0;
    }
    if (!json_is_boolean(j)) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key '%s' must be true or false", path, key);
        return -1;
    }
    *v_p = json_is_true(j);
    return 0;
}

/* eos_token_id: one id or a list of ids. */
static int epd_hf_get_eos(json_t *root, const char *path, epd_hf_hparams_t *hp)
{
    json_t *j = json_object_get(root, "eos_token_id");
    size_t i;
    json_t *v;

    if (j == NULL || json_is_null(j)) {
        return 0;
    }
    if (json_is_integer(j)) {
        hp->n_eos = 1;
        hp->eos[0] = (int32_t)json_integer_value(j);
        return json_integer_value(j) < 0 ? -1 : 0;
    }
    if (!json_is_array(j) || json_array_size(j) == 0 || json_array_size(j) > EPD_ENGINE_MAX_EOS) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key 'eos_token_id' must be an id or a list of 1..%d ids",
                      path, EPD_ENGINE_MAX_EOS);
        return -1;
    }
    hp->n_eos = 0;
    json_array_foreach(j, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            epd_log_error(EPD_HF_LOG, 0, "%s: key 'eos_token_id' holds a bad id", path);
            return -1;
        }
        hp->eos[hp->n_eos++] = (int32_t)json_integer_value(v);
    }
    return 0;
}

static int epd_hf_load_rope_scaling(json_t *root, const char *path, epd_hf_hparams_t *hp)
{
    json_t *rs = json_object_get(root, "rope_scaling");
    json_t *jt;
    const char *type;

    if (rs == NULL || json_is_null(rs)) {
        return 0;
    }
    if (!json_is_object(rs)) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key 'rope_scaling' must be null or an object", path);
        return -1;
    }
    jt = json_object_get(rs, "rope_type");
    if (jt == NULL) {
        jt = json_object_get(rs, "type");
    }
    type = json_is_string(jt) ? json_string_value(jt) : NULL;
    if (type == NULL) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key 'rope_scaling.rope_type' is missing", path);
        return -1;
    }
    if (strcmp(type, "default") == 0) {
        return 0;
    }
    if (strcmp(type, "llama3") != 0 || hp->arch != EPD_HF_LLAMA) {
        epd_log_error(EPD_HF_LOG, 0,
                      "%s: key 'rope_scaling.rope_type' is '%s': not supported for %s "
                      "(supported: default; llama3 for LlamaForCausalLM)",
                      path, type, epd_hf_arch_class(hp->arch));
        return -2;
    }
    hp->rope_llama3 = 1;
    hp->rs_factor = 0.0;
    hp->rs_low_freq = 0.0;
    hp->rs_high_freq = 0.0;
    hp->rs_orig_max = 0;
    if (epd_hf_get_num(rs, path, "factor", &hp->rs_factor) != 0 ||
        epd_hf_get_num(rs, path, "low_freq_factor", &hp->rs_low_freq) != 0 ||
        epd_hf_get_num(rs, path, "high_freq_factor", &hp->rs_high_freq) != 0 ||
        epd_hf_get_u32(rs, path, "original_max_position_embeddings", 1, &hp->rs_orig_max) != 0) {
        return -1;
    }
    if (!(hp->rs_factor >= 1.0) || !(hp->rs_low_freq > 0.0) ||
        !(hp->rs_high_freq > hp->rs_low_freq) || hp->rs_orig_max == 0) {
        epd_log_error(EPD_HF_LOG, 0,
                      "%s: key 'rope_scaling': llama3 needs factor >= 1, 0 < low_freq_factor < "
                      "high_freq_factor, original_max_position_embeddings > 0",
                      path);
        return -1;
    }
    return 0;
}

/* The keys this loader does not implement, each refused by name when on. */
static int epd_hf_refuse_unbuilt(json_t *root, const char *path, const epd_hf_hparams_t *hp)
{
    int on = 0;
    json_t *sw;
    json_t *jl;
    uint32_t step = 1;

    if (epd_hf_get_bool(root, path, "use_sliding_window", &on) != 0) {
        return -1;
    }
    sw = json_object_get(root, "sliding_window");
    if (on ||
        (json_object_get(root, "use_sliding_window") == NULL && sw != NULL && !json_is_null(sw))) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key '%s': sliding-window attention is not supported",
                      path, on ? "use_sliding_window" : "sliding_window");
        return -2;
    }
    on = 0;
    if (epd_hf_get_bool(root, path, "attention_bias", &on) != 0) {
        return -1;
    }
    if (on && hp->arch != EPD_HF_QWEN2) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key 'attention_bias': biases are not supported for %s",
                      path, epd_hf_arch_class(hp->arch));
        return -2;
    }
    on = 0;
    if (epd_hf_get_bool(root, path, "mlp_bias", &on) != 0) {
        return -1;
    }
    if (on) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key 'mlp_bias': MLP biases are not supported", path);
        return -2;
    }
    if (hp->arch == EPD_HF_QWEN3_MOE) {
        if (epd_hf_get_u32(root, path, "decoder_sparse_step", 0, &step) != 0) {
            return -1;
        }
        jl = json_object_get(root, "mlp_only_layers");
        if (step != 1 ||
            (jl != NULL && !json_is_null(jl) && (!json_is_array(jl) || json_array_size(jl) != 0))) {
            epd_log_error(EPD_HF_LOG, 0,
                          "%s: key '%s': only every layer sparse is supported "
                          "(decoder_sparse_step 1, mlp_only_layers [])",
                          path, step != 1 ? "decoder_sparse_step" : "mlp_only_layers");
            return -2;
        }
    }
    return 0;
}

epd_status_t epd_hf_hparams_check(const epd_hf_hparams_t *hp)
{
    const char *bad = NULL;

    if (hp->vocab == 0 || hp->vocab > (1u << 24)) {
        bad = "vocab_size";
    } else if (hp->dim == 0 || hp->dim > 65536) {
        bad = "hidden_size";
    } else if (hp->n_layers == 0 || hp->n_layers > EPD_KV_MAX_LAYERS) {
        bad = "num_hidden_layers";
    } else if (hp->n_heads == 0 || hp->n_heads > 1024) {
        bad = "num_attention_heads";
    } else if (hp->n_kv_heads == 0 || hp->n_heads % hp->n_kv_heads != 0) {
        bad = "num_key_value_heads";
    } else if (hp->head_dim == 0 || hp->head_dim % 2 != 0 || hp->head_dim > 1024) {
        bad = "head_dim";
    } else if (hp->max_context == 0 || hp->max_context > (1u << 24)) {
        bad = "max_position_embeddings";
    } else if (!(hp->rope_theta > 0.0)) {
        bad = "rope_theta";
    } else if (!(hp->rms_eps > 0.0) || hp->rms_eps > 1.0) {
        bad = "rms_norm_eps";
    } else if (hp->bos < -1 || hp->bos >= (int32_t)hp->vocab) {
        bad = "bos_token_id";
    } else if (hp->arch != EPD_HF_QWEN3_MOE && (hp->ffn == 0 || hp->ffn > (1u << 20))) {
        bad = "intermediate_size";
    } else if (hp->arch == EPD_HF_QWEN3_MOE &&
               (hp->n_experts == 0 || hp->n_experts > EPD_HF_MAX_EXPERTS)) {
        bad = "num_experts";
    } else if (hp->arch == EPD_HF_QWEN3_MOE && (hp->top_k == 0 || hp->top_k > hp->n_experts)) {
        bad = "num_experts_per_tok";
    } else if (hp->arch == EPD_HF_QWEN3_MOE && (hp->moe_ffn == 0 || hp->moe_ffn > (1u << 20))) {
        bad = "moe_intermediate_size";
    }
    for (uint32_t i = 0; bad == NULL && i < hp->n_eos; i++) {
        if (hp->eos[i] < 0 || hp->eos[i] >= (int32_t)hp->vocab) {
            bad = "eos_token_id";
        }
    }
    if (bad == NULL && hp->n_eos == 0) {
        bad = "eos_token_id";
    }
    if (bad != NULL) {
        epd_log_error(EPD_HF_LOG, 0, "config.json: key '%s' is out of range or inconsistent", bad);
        return EPD_ERR_MALFORMED;
    }
    return EPD_OK;
}

static epd_status_t epd_hf_parse(json_t *root, const char *path, epd_hf_hparams_t *hp)
{
    json_t *ja = json_object_get(root, "architectures");
    json_t *jb;
    const char *cls;
    int arch;
    int rc;

    if (!json_is_array(ja) || json_array_size(ja) != 1 || !json_is_string(json_array_get(ja, 0))) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key 'architectures' must be a list of one name", path);
        return EPD_ERR_MALFORMED;
    }
    cls = json_string_value(json_array_get(ja, 0));
    arch = epd_hf_arch_parse(cls);
    if (arch < 0 || strstr(cls, "ForCausalLM") == NULL) {
        epd_log_error(EPD_HF_LOG, 0,
                      "%s: key 'architectures': '%s' is not supported (LlamaForCausalLM, "
                      "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM)",
                      path, cls);
        return EPD_ERR_UNSUPPORTED;
    }
    memset(hp, 0, sizeof(*hp));
    hp->arch = (epd_hf_arch_t)arch;
    hp->rope_theta = 10000.0;
    hp->rms_eps = 1e-6;
    hp->bos = -1;
    hp->dtype = EPD_DTYPE_BF16;
    if (epd_hf_get_u32(root, path, "vocab_size", 1, &hp->vocab) != 0 ||
        epd_hf_get_u32(root, path, "hidden_size", 1, &hp->dim) != 0 ||
        epd_hf_get_u32(root, path, "num_hidden_layers", 1, &hp->n_layers) != 0 ||
        epd_hf_get_u32(root, path, "num_attention_heads", 1, &hp->n_heads) != 0 ||
        epd_hf_get_u32(root, path, "max_position_embeddings", 1, &hp->max_context) != 0 ||
        epd_hf_get_u32(root, path, "intermediate_size", hp->arch != EPD_HF_QWEN3_MOE, &hp->ffn) !=
            0 ||
        epd_hf_get_num(root, path, "rope_theta", &hp->rope_theta) != 0 ||
        epd_hf_get_num(root, path, "rms_norm_eps", &hp->rms_eps) != 0 ||
        epd_hf_get_bool(root, path, "tie_word_embeddings", &hp->tied) != 0 ||
        epd_hf_get_eos(root, path, hp) != 0) {
        return EPD_ERR_MALFORMED;
    }
    hp->n_kv_heads = hp->n_heads;
    if (epd_hf_get_u32(root, path, "num_key_value_heads", 0, &hp->n_kv_heads) != 0) {
        return EPD_ERR_MALFORMED;
    }
    hp->head_dim = hp->n_heads ? hp->dim / hp->n_heads : 0;
    if (epd_hf_get_u32(root, path, "head_dim", 0, &hp->head_dim) != 0) {
        return EPD_ERR_MALFORMED;
    }
    jb = json_object_get(root, "bos_token_id");
    if (jb != NULL && !json_is_null(jb)) {
        if (!json_is_integer(jb)) {
            epd_log_error(EPD_HF_LOG, 0, "%s: key 'bos_token_id' must be an id", path);
            return EPD_ERR_MALFORMED;
        }
        hp->bos = (int32_t)json_integer_value(jb);
    }
    if (hp->arch == EPD_HF_QWEN3_MOE) {
        if (epd_hf_get_u32(root, path, "num_experts", 1, &hp->n_experts) != 0 ||
            epd_hf_get_u32(root, path, "num_experts_per_tok", 1, &hp->top_k) != 0 ||
            epd_hf_get_u32(root, path, "moe_intermediate_size", 1, &hp->moe_ffn) != 0 ||
            epd_hf_get_bool(root, path, "norm_topk_prob", &hp->norm_topk) != 0) {
            return EPD_ERR_MALFORMED;
        }
    }
    rc = epd_hf_load_rope_scaling(root, path, hp);
    if (rc == 0) {
        rc = epd_hf_refuse_unbuilt(root, path, hp);
    }
    if (rc != 0) {
        return rc == -2 ? EPD_ERR_UNSUPPORTED : EPD_ERR_MALFORMED;
    }
    return EPD_OK;
}

epd_status_t epd_hf_hparams_load(const char *dir, epd_hf_hparams_t *hp_p)
{
    char path[4096];
    epd_hf_hparams_t hp;
    json_t *root;
    json_t *gen;
    epd_status_t status;

    if (snprintf(path, sizeof(path), "%s/config.json", dir) >= (int)sizeof(path)) {
        return EPD_ERR_INVALID_PARAM;
    }
    root = epd_hf_read_json(dir, "config.json", 0);
    if (root == NULL) {
        return EPD_ERR_MALFORMED;
    }
    status = epd_hf_parse(root, path, &hp);
    json_decref(root);
    if (status != EPD_OK) {
        return status;
    }
    /* generation_config.json's eos ids are what generate() stops at (the
     * chat models list the turn end there, not in config.json) */
    gen = epd_hf_read_json(dir, "generation_config.json", 1);
    if (gen != NULL) {
        int bad;

        snprintf(path, sizeof(path), "%s/generation_config.json", dir);
        bad = epd_hf_get_eos(gen, path, &hp);
        json_decref(gen);
        if (bad) {
            return EPD_ERR_MALFORMED;
        }
    }
    status = epd_hf_hparams_check(&hp);
    if (status == EPD_OK) {
        *hp_p = hp;
    }
    return status;
}

static json_t *epd_hf_eos_json(const epd_hf_hparams_t *hp, uint32_t n)
{
    json_t *a;

    if (n == 1) {
        return json_integer(hp->eos[0]);
    }
    a = json_array();
    for (uint32_t i = 0; a != NULL && i < n; i++) {
        json_array_append_new(a, json_integer(hp->eos[i]));
    }
    return a;
}

static epd_status_t epd_hf_dump(json_t *root, const char *dir, const char *file)
{
    char path[4096];
    int rc;

    if (root == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    if (snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path)) {
        json_decref(root);
        return EPD_ERR_INVALID_PARAM;
    }
    rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc != 0) {
        epd_log_error(EPD_HF_LOG, 0, "%s: cannot write", path);
        return EPD_ERR_IO;
    }
    return EPD_OK;
}

epd_status_t epd_hf_hparams_save(const epd_hf_hparams_t *hp, const char *dir)
{
    static const char *const dtypes[3] = {"float32", "float16", "bfloat16"};
    json_t *root;
    json_t *gen;
    epd_status_t status;

    root = json_pack("{s:[s], s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:b, s:s, s:o, "
                     "s:f, s:f, s:s}",
                     "architectures", epd_hf_arch_class(hp->arch), "model_type",
                     epd_hf_arch_type(hp->arch), "vocab_size", (json_int_t)hp->vocab, "hidden_size",
                     (json_int_t)hp->dim, "num_hidden_layers", (json_int_t)hp->n_layers,
                     "num_attention_heads", (json_int_t)hp->n_heads, "num_key_value_heads",
                     (json_int_t)hp->n_kv_heads, "head_dim", (json_int_t)hp->head_dim,
                     "max_position_embeddings", (json_int_t)hp->max_context, "rope_theta",
                     hp->rope_theta, "rms_norm_eps", hp->rms_eps, "tie_word_embeddings", hp->tied,
                     "torch_dtype", (unsigned)hp->dtype < 3 ? dtypes[hp->dtype] : "bfloat16",
                     "eos_token_id", epd_hf_eos_json(hp, 1), "attention_dropout", 0.0,
                     "initializer_range", 0.02, "hidden_act", "silu");
    if (root == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    json_object_set_new(root, "bos_token_id", hp->bos >= 0 ? json_integer(hp->bos) : json_null());
    if (hp->arch != EPD_HF_QWEN3_MOE || hp->ffn != 0) {
        json_object_set_new(root, "intermediate_size", json_integer(hp->ffn));
    }
    if (hp->arch == EPD_HF_LLAMA) {
        json_object_set_new(root, "attention_bias", json_false());
        json_object_set_new(root, "mlp_bias", json_false());
        json_object_set_new(root, "rope_scaling",
                            hp->rope_llama3
                                ? json_pack("{s:s, s:f, s:f, s:f, s:I}", "rope_type", "llama3",
                                            "factor", hp->rs_factor, "low_freq_factor",
                                            hp->rs_low_freq, "high_freq_factor", hp->rs_high_freq,
                                            "original_max_position_embeddings",
                                            (json_int_t)hp->rs_orig_max)
                                : json_null());
    } else {
        json_object_set_new(root, "use_sliding_window", json_false());
        json_object_set_new(root, "sliding_window", json_null());
        json_object_set_new(root, "max_window_layers", json_integer(hp->n_layers));
        json_object_set_new(root, "rope_scaling", json_null());
    }
    if (hp->arch == EPD_HF_QWEN3 || hp->arch == EPD_HF_QWEN3_MOE) {
        json_object_set_new(root, "attention_bias", json_false());
    }
    if (hp->arch == EPD_HF_QWEN3_MOE) {
        json_object_set_new(root, "num_experts", json_integer(hp->n_experts));
        json_object_set_new(root, "num_experts_per_tok", json_integer(hp->top_k));
        json_object_set_new(root, "moe_intermediate_size", json_integer(hp->moe_ffn));
        json_object_set_new(root, "norm_topk_prob", json_boolean(hp->norm_topk));
        json_object_set_new(root, "decoder_sparse_step", json_integer(1));
        json_object_set_new(root, "mlp_only_layers", json_array());
        json_object_set_new(root, "output_router_logits", json_false());
        json_object_set_new(root, "router_aux_loss_coef", json_real(0.001));
    }
    status = epd_hf_dump(root, dir, "config.json");
    if (status != EPD_OK) {
        return status;
    }
    gen = json_pack("{s:o, s:b}", "eos_token_id", epd_hf_eos_json(hp, hp->n_eos), "do_sample", 0);
    if (gen != NULL && hp->bos >= 0) {
        json_object_set_new(gen, "bos_token_id", json_integer(hp->bos));
    }
    return epd_hf_dump(gen, dir, "generation_config.json");
}

/* ---- tensors ------------------------------------------------------------- */

/* The fixed (non-expert) roles of one layer, in canonical order. */
static size_t epd_hf_layer_roles(const epd_hf_hparams_t *hp, epd_hf_role_t *roles)
{
    size_t n = 0;

    roles[n++] = EPD_HF_T_IN_NORM;
    roles[n++] = EPD_HF_T_Q;
    if (hp->arch == EPD_HF_QWEN2) {
        roles[n++] = EPD_HF_T_Q_BIAS;
    }
    roles[n++] = EPD_HF_T_K;
    if (hp->arch == EPD_HF_QWEN2) {
        roles[n++] = EPD_HF_T_K_BIAS;
    }
    roles[n++] = EPD_HF_T_V;
    if (hp->arch == EPD_HF_QWEN2) {
        roles[n++] = EPD_HF_T_V_BIAS;
    }
    roles[n++] = EPD_HF_T_O;
    if (hp->arch == EPD_HF_QWEN3 || hp->arch == EPD_HF_QWEN3_MOE) {
        roles[n++] = EPD_HF_T_Q_NORM;
        roles[n++] = EPD_HF_T_K_NORM;
    }
    roles[n++] = EPD_HF_T_POST_NORM;
    if (hp->arch == EPD_HF_QWEN3_MOE) {
        roles[n++] = EPD_HF_T_ROUTER;
    } else {
        roles[n++] = EPD_HF_T_GATE;
        roles[n++] = EPD_HF_T_UP;
        roles[n++] = EPD_HF_T_DOWN;
    }
    return n;
}

static size_t epd_hf_per_layer(const epd_hf_hparams_t *hp)
{
    epd_hf_role_t roles[32];
    size_t n = epd_hf_layer_roles(hp, roles);

    return n + (hp->arch == EPD_HF_QWEN3_MOE ? 3 * (size_t)hp->n_experts : 0);
}

size_t epd_hf_tensor_count(const epd_hf_hparams_t *hp)
{
    return 2 + (size_t)hp->n_layers * epd_hf_per_layer(hp) + (hp->tied ? 0 : 1);
}

static void epd_hf_set(epd_hf_tensor_spec_t *s, epd_hf_role_t role, uint32_t ndim, uint64_t d0,
                       uint64_t d1, epd_hf_init_t init)
{
    s->role = role;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = ndim > 1 ? d1 : 0;
    s->n_elems = ndim > 1 ? d0 * d1 : d0;
    s->init = init;
    s->fan_in = ndim > 1 ? (uint32_t)d1 : 1;
}

void epd_hf_tensor_spec(const epd_hf_hparams_t *hp, size_t i, epd_hf_tensor_spec_t *s)
{
    static const char *const names[] = {
        [EPD_HF_T_IN_NORM] = "input_layernorm.weight",
        [EPD_HF_T_Q] = "self_attn.q_proj.weight",
        [EPD_HF_T_Q_BIAS] = "self_attn.q_proj.bias",
        [EPD_HF_T_K] = "self_attn.k_proj.weight",
        [EPD_HF_T_K_BIAS] = "self_attn.k_proj.bias",
        [EPD_HF_T_V] = "self_attn.v_proj.weight",
        [EPD_HF_T_V_BIAS] = "self_attn.v_proj.bias",
        [EPD_HF_T_O] = "self_attn.o_proj.weight",
        [EPD_HF_T_Q_NORM] = "self_attn.q_norm.weight",
        [EPD_HF_T_K_NORM] = "self_attn.k_norm.weight",
        [EPD_HF_T_POST_NORM] = "post_attention_layernorm.weight",
        [EPD_HF_T_GATE] = "mlp.gate_proj.weight",
        [EPD_HF_T_UP] = "mlp.up_proj.weight",
        [EPD_HF_T_DOWN] = "mlp.down_proj.weight",
        [EPD_HF_T_ROUTER] = "mlp.gate.weight",
    };
    uint64_t dim = hp->dim;
    uint64_t qd = (uint64_t)hp->n_heads * hp->head_dim;
    uint64_t kvd = (uint64_t)hp->n_kv_heads * hp->head_dim;
    size_t per = epd_hf_per_layer(hp);
    epd_hf_role_t roles[32];
    size_t nfixed = epd_hf_layer_roles(hp, roles);
    size_t j;

    memset(s, 0, sizeof(*s));
    if (i == 0) {
        snprintf(s->name, sizeof(s->name), "model.embed_tokens.weight");
        epd_hf_set(s, EPD_HF_T_EMBED, 2, hp->vocab, dim, EPD_HF_INIT_EMBED);
        return;
    }
    if (i >= 1 + (size_t)hp->n_layers * per) {
        if (i == 1 + (size_t)hp->n_layers * per) {
            snprintf(s->name, sizeof(s->name), "model.norm.weight");
            epd_hf_set(s, EPD_HF_T_FINAL_NORM, 1, dim, 0, EPD_HF_INIT_NORM);
        } else {
            snprintf(s->name, sizeof(s->name), "lm_head.weight");
            epd_hf_set(s, EPD_HF_T_LM_HEAD, 2, hp->vocab, dim, EPD_HF_INIT_NORMAL);
        }
        return;
    }
    s->layer = (uint32_t)((i - 1) / per);
    j = (i - 1) % per;
    if (j >= nfixed) {
        static const char *const xn[3] = {"gate_proj", "up_proj", "down_proj"};
        uint32_t x = (uint32_t)((j - nfixed) % 3);

        s->expert = (uint32_t)((j - nfixed) / 3);
        snprintf(s->name, sizeof(s->name), "model.layers.%u.mlp.experts.%u.%s.weight", s->layer,
                 s->expert, xn[x]);
        if (x == 2) {
            epd_hf_set(s, EPD_HF_T_X_DOWN, 2, dim, hp->moe_ffn, EPD_HF_INIT_NORMAL);
        } else {
            epd_hf_set(s, x == 0 ? EPD_HF_T_X_GATE : EPD_HF_T_X_UP, 2, hp->moe_ffn, dim,
                       EPD_HF_INIT_NORMAL);
        }
        return;
    }
    snprintf(s->name, sizeof(s->name), "model.layers.%u.%s", s->layer, names[roles[j]]);
    switch (roles[j]) {
    case EPD_HF_T_IN_NORM:
    case EPD_HF_T_POST_NORM:
        epd_hf_set(s, roles[j], 1, dim, 0, EPD_HF_INIT_NORM);
        break;
    case EPD_HF_T_Q_NORM:
    case EPD_HF_T_K_NORM:
        epd_hf_set(s, roles[j], 1, hp->head_dim, 0, EPD_HF_INIT_NORM);
        break;
    case EPD_HF_T_Q:
        epd_hf_set(s, roles[j], 2, qd, dim, EPD_HF_INIT_NORMAL);
        break;
    case EPD_HF_T_K:
    case EPD_HF_T_V:
        epd_hf_set(s, roles[j], 2, kvd, dim, EPD_HF_INIT_NORMAL);
        break;
    case EPD_HF_T_Q_BIAS:
        epd_hf_set(s, roles[j], 1, qd, 0, EPD_HF_INIT_BIAS);
        break;
    case EPD_HF_T_K_BIAS:
    case EPD_HF_T_V_BIAS:
        epd_hf_set(s, roles[j], 1, kvd, 0, EPD_HF_INIT_BIAS);
        break;
    case EPD_HF_T_O:
        epd_hf_set(s, roles[j], 2, dim, qd, EPD_HF_INIT_NORMAL);
        break;
    case EPD_HF_T_GATE:
    case EPD_HF_T_UP:
        epd_hf_set(s, roles[j], 2, hp->ffn, dim, EPD_HF_INIT_NORMAL);
        break;
    case EPD_HF_T_DOWN:
        epd_hf_set(s, roles[j], 2, dim, hp->ffn, EPD_HF_INIT_NORMAL);
        break;
    case EPD_HF_T_ROUTER:
        epd_hf_set(s, roles[j], 2, hp->n_experts, dim, EPD_HF_INIT_NORMAL);
        break;
    default:
        break;
    }
}
