/*
 * epd_engine_tokonly.c — the description of a Hugging Face model folder
 * read from its config.json (and generation_config.json) alone, for an
 * engine opened with epd_engine_config_t.tokenizer_only: the router and the
 * tools that only tokenize get vocab_size, BOS, the EOS list, max_context
 * and the KV layout a worker will register with, without reading a weight.
 *
 * The layout is the HF engine's (epd_hf_fill_info: every layer attention,
 * F32 KV, n_kv_heads x head_dim).  model_digest stays zero: the HF engine
 * digests the weight files' headers and samples, which this path does not
 * open, so a router opened this way keeps a prefix-affinity policy off
 * (its block hashes would never match the workers').
 */
#include <string.h>

#include "epd_engine_int.h"
#include "epd_hf_model.h"
#include "epd_kvq.h"

epd_status_t epd__engine_tok_only_info(const epd_engine_config_t *config, epd_engine_info_t *info_p)
{
    epd_engine_info_t info;
    epd_kv_layout_t *kv = &info.kv;
    epd_hf_hparams_t hp;
    uint32_t block_tokens = config->block_tokens != 0 ? config->block_tokens : 16;
    epd_status_t status;

    if (config->model_dir == NULL || !epd_hf_is_hf_folder(config->model_dir)) {
        return EPD_ERR_UNSUPPORTED; /* the caller opens the engine in full */
    }
    status = epd_hf_hparams_load(config->model_dir, &hp);
    if (status != EPD_OK) {
        return status; /* logged, naming the key */
    }
    if (hp.n_layers > EPD_KV_MAX_LAYERS || hp.n_eos == 0 || hp.n_eos > EPD_ENGINE_MAX_EOS) {
        return EPD_ERR_MALFORMED;
    }
    memset(&info, 0, sizeof(info));
    info.vocab_size = hp.vocab;
    info.bos_token = hp.bos;
    info.eos_token = hp.eos[0];
    info.n_eos = hp.n_eos;
    memcpy(info.eos_tokens, hp.eos, sizeof(int32_t) * hp.n_eos);
    info.max_context = hp.max_context;
    if (config->max_context != 0 && config->max_context < info.max_context) {
        info.max_context = config->max_context;
    }
    info.max_batch = config->max_batch != 0 ? config->max_batch : 64;
    info.image_token = -1;
    kv->n_layers = hp.n_layers;
    for (uint32_t l = 0; l < hp.n_layers; l++) {
        kv->kind[l] = EPD_LAYER_ATTENTION;
        kv->kind_index[l] = kv->n_attn_layers++;
    }
    kv->dtype = EPD_DTYPE_F32;
    kv->block_tokens = block_tokens;
    kv->n_kv_heads = hp.n_kv_heads;
    kv->head_dim = hp.head_dim;
    kv->block_bytes = 2ull * hp.n_kv_heads * block_tokens * hp.head_dim * sizeof(float);
    /* the router compares workers' KV dtype maps with this layout's */
    status = epd_kvq_layout_set(kv, config->kv_dtype, "engine");
    if (status != EPD_OK) {
        return status;
    }
    *info_p = info;
    return EPD_OK;
}
