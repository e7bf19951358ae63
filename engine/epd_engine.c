/*
 * epd_engine.c — engine registry (built-ins and dlopen) and the argument
 * checks every engine relies on (the KV layout arithmetic: epd_kv_layout.c).
 *
 * All validation of caller input happens here, once, before an op is
 * called: an engine (built-in or from a shared object) may assume block ids,
 * slots, token ids and positions are in range and the pool large enough.
 */
#include "epd_engine.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "epd_alloc.h"
#include "epd_engine_int.h"
#include "epd_hf_model.h"
#include "epd_log.h"
#include "epd_tokenizer.h"

#define EPD_ENGINE_LOG "engine"

struct epd_engine {
    const epd_engine_ops_t *ops;
    epd_engine_impl_t *impl;
    void *dl; /* dlopen handle or NULL for a built-in */
    epd_engine_info_t info;
    /* The folder's tokenizer.json (owned), or NULL: then the engine's own
     * tokenize / detokenize ops.  Encoding uses the tokenizer's scratch
     * buffers, so tok_lock serializes it: epd_engine_tokenize is callable
     * from any thread (a router's loop, a tool), while decoding reads only. */
    epd_tokenizer_t *tok;
    pthread_mutex_t tok_lock;
    /* opened with tokenizer_only on a Hugging Face folder: no impl (NULL),
     * info from the config files; only the tokenizer works */
    int tok_only;
};

static const epd_engine_ops_t *const epd_engine_builtins[] = {
    &epd__ref_ops,
    &epd__sim_ops,
};

const epd_engine_ops_t *epd_engine_builtin(const char *name)
{
    for (size_t i = 0; i < sizeof(epd_engine_builtins) / sizeof(epd_engine_builtins[0]); i++) {
        if (strcmp(epd_engine_builtins[i]->name, name) == 0) {
            return epd_engine_builtins[i];
        }
    }
    return NULL;
}

/* NULL when the table is usable, else why not. */
static const char *epd_engine_ops_problem(const epd_engine_ops_t *ops)
{
    if (ops == NULL) {
        return "the entry returned no table";
    }
    if (ops->size < sizeof(epd_engine_ops_t)) {
        return "the table is smaller than this build's (older ABI)";
    }
    if (ops->abi_version != EPD_ENGINE_ABI_VERSION) {
        return "the table's ABI version differs from this build's";
    }
    if (ops->name == NULL || ops->open == NULL || ops->close == NULL || ops->describe == NULL ||
        ops->tokenize == NULL || ops->detokenize == NULL || ops->prefill == NULL ||
        ops->decode == NULL || ops->release == NULL || ops->encode_image == NULL) {
        return "the table has a NULL slot";
    }
    return NULL;
}

static epd_status_t epd_engine_load_so(const char *path, void **dl_p,
                                       const epd_engine_ops_t **ops_p)
{
    epd_engine_entry_fn_t entry;
    const epd_engine_ops_t *ops;
    const char *why;
    void *dl;

    dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        epd_log_error(EPD_ENGINE_LOG, 0, "cannot load engine %s: %s", path, dlerror());
        return EPD_ERR_NOT_FOUND;
    }
    /* POSIX blesses this object-to-function pointer conversion for dlsym. */
    *(void **)&entry = dlsym(dl, EPD_ENGINE_ENTRY_SYMBOL);
    if (entry == NULL) {
        epd_log_error(EPD_ENGINE_LOG, 0, "%s exports no %s()", path, EPD_ENGINE_ENTRY_SYMBOL);
        dlclose(dl);
        return EPD_ERR_UNSUPPORTED;
    }
    ops = entry();
    why = epd_engine_ops_problem(ops);
    if (why != NULL) {
        epd_log_error(EPD_ENGINE_LOG, 0, "%s: unusable engine: %s", path, why);
        dlclose(dl);
        return EPD_ERR_UNSUPPORTED;
    }
    *dl_p = dl;
    *ops_p = ops;
    return EPD_OK;
}

static int epd_engine_layout_sane(const epd_engine_info_t *info)
{
    const epd_kv_layout_t *kv = &info->kv;
    uint32_t n_attn = 0;
    uint32_t n_lin = 0;

    if (info->vocab_size == 0 || info->max_context == 0 || info->max_batch == 0 ||
        kv->n_layers == 0 || kv->n_layers > EPD_KV_MAX_LAYERS || kv->block_tokens == 0) {
        return 0;
    }
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        if (kv->kind[l] == EPD_LAYER_ATTENTION) {
            if (kv->kind_index[l] != n_attn++) {
                return 0;
            }
        } else if (kv->kind[l] == EPD_LAYER_LINEAR) {
            if (kv->kind_index[l] != n_lin++) {
                return 0;
            }
        } else {
            return 0;
        }
    }
    if (n_attn != kv->n_attn_layers || n_lin != kv->n_linear_layers) {
        return 0;
    }
    if (info->image_embeddings == 0) {
        return info->image_token == -1 && info->embed_dim == 0;
    }
    return info->embed_dim > 0 && info->image_size > 0 && info->image_token >= 0 &&
           (uint32_t)info->image_token < info->vocab_size &&
           info->image_token != info->bos_token && info->image_token != info->eos_token;
}

/* Nonzero when DIR/tokenizer.json exists. */
static int epd_engine_has_tokenizer(const char *dir)
{
    char path[4096];
    struct stat sb;
    int n;

    if (dir == NULL) {
        return 0;
    }
    n = snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    return n > 0 && (size_t)n < sizeof(path) && stat(path, &sb) == 0;
}

/* Frees the engine's tokenizer, if any. */
static void epd_engine_drop_tokenizer(epd_engine_t *engine)
{
    if (engine->tok != NULL) {
        epd_tokenizer_destroy(engine->tok);
        pthread_mutex_destroy(&engine->tok_lock);
        engine->tok = NULL;
    }
}

/* Loads DIR/tokenizer.json when the folder has one (a Hugging Face
 * folder): from then on it, not the engine's byte tokenizer, turns text
 * into ids and back, whatever the engine.  A folder without it keeps the
 * engine's own ops.  A tokenizer whose ids reach past the model's
 * vocabulary is refused: it would feed the model ids it has no row for. */
static epd_status_t epd_engine_load_tokenizer(epd_engine_t *engine, const char *dir)
{
    char path[4096];
    struct stat sb;
    epd_status_t status;
    int n;

    if (dir == NULL) {
        return EPD_OK;
    }
    n = snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        epd_log_error(EPD_ENGINE_LOG, 0, "model folder path too long: %s", dir);
        return EPD_ERR_INVALID_PARAM;
    }
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT) {
            return EPD_OK;
        }
        epd_log_error(EPD_ENGINE_LOG, 0, "%s: %s", path, strerror(errno));
        return EPD_ERR_IO;
    }
    status = epd_tokenizer_load(dir, &engine->tok);
    if (status != EPD_OK) {
        return status; /* logged by the loader */
    }
    if (epd_tokenizer_n_ids(engine->tok) > engine->info.vocab_size) {
        epd_log_error(EPD_ENGINE_LOG, 0,
                      "%s: the tokenizer has %u ids, the model's vocabulary only %u", path,
                      epd_tokenizer_n_ids(engine->tok), engine->info.vocab_size);
        epd_tokenizer_destroy(engine->tok);
        engine->tok = NULL;
        return EPD_ERR_MALFORMED;
    }
    if (pthread_mutex_init(&engine->tok_lock, NULL) != 0) {
        epd_tokenizer_destroy(engine->tok);
        engine->tok = NULL;
        return EPD_ERR_NO_MEMORY;
    }
    return EPD_OK;
}

epd_status_t epd_engine_open(const char *name, const epd_engine_config_t *config,
                             epd_engine_t **engine_p)
{
    epd_engine_t *engine;
    epd_status_t status;

    if (name == NULL || config == NULL || engine_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    engine = epd_calloc(1, sizeof(*engine));
    if (engine == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    if (strchr(name, '/') != NULL ||
        (strlen(name) > 3 && strcmp(name + strlen(name) - 3, ".so") == 0)) {
        status = epd_engine_load_so(name, &engine->dl, &engine->ops);
        if (status != EPD_OK) {
            goto err_free_engine;
        }
    } else {
        engine->ops = epd_engine_builtin(name);
        if (engine->ops == NULL) {
            epd_log_error(EPD_ENGINE_LOG, 0, "no engine called '%s' (built-in: ref, sim)", name);
            status = EPD_ERR_NOT_FOUND;
            goto err_free_engine;
        }
        /* `ref` on a Hugging Face folder (config.json with "architectures")
         * is the HF engine; epd-ref folders keep ref's own code */
        if (engine->ops == &epd__ref_ops && config->model_dir != NULL &&
            epd_hf_is_hf_folder(config->model_dir)) {
            engine->ops = &epd__hf_ops;
        }
    }
    status = EPD_ERR_UNSUPPORTED;
    if (config->tokenizer_only && epd_engine_has_tokenizer(config->model_dir)) {
        status = epd__engine_tok_only_info(config, &engine->info);
        if (status != EPD_OK && status != EPD_ERR_UNSUPPORTED) {
            goto err_unload;
        }
        engine->tok_only = status == EPD_OK;
        if (engine->tok_only) {
            epd_log_info(EPD_ENGINE_LOG, 0,
                         "%s: opened for its tokenizer only (config files read, no weights)",
                         config->model_dir);
        }
    }
    if (!engine->tok_only) {
        status = engine->ops->open(config, &engine->impl);
        if (status != EPD_OK) {
            goto err_unload;
        }
        engine->ops->describe(engine->impl, &engine->info);
    }
    status = epd_engine_load_tokenizer(engine, config->model_dir);
    if (status != EPD_OK) {
        goto err_close_impl;
    }
    if (engine->info.n_eos == 0 || engine->info.n_eos > EPD_ENGINE_MAX_EOS) {
        engine->info.n_eos = 1;
        engine->info.eos_tokens[0] = engine->info.eos_token;
    }
    if (!epd_engine_layout_sane(&engine->info)) {
        epd_log_error(EPD_ENGINE_LOG, 0, "engine '%s' describes an inconsistent KV layout",
                      engine->ops->name);
        status = EPD_ERR_UNSUPPORTED;
        goto err_close_impl;
    }
    *engine_p = engine;
    return EPD_OK;

err_close_impl:
    epd_engine_drop_tokenizer(engine);
    if (!engine->tok_only) {
        engine->ops->close(engine->impl);
    }
err_unload:
    if (engine->dl != NULL) {
        dlclose(engine->dl);
    }
err_free_engine:
    epd_free(engine);
    return status;
}

int epd_engine_is_eos(const epd_engine_info_t *info, int32_t token)
{
    for (uint32_t i = 0; i < info->n_eos; i++) {
        if (info->eos_tokens[i] == token) {
            return 1;
        }
    }
    return 0;
}

void epd_engine_close(epd_engine_t *engine)
{
    if (engine == NULL) {
        return;
    }
    epd_engine_drop_tokenizer(engine);
    if (!engine->tok_only) {
        engine->ops->close(engine->impl);
    }
    if (engine->dl != NULL) {
        dlclose(engine->dl);
    }
    epd_free(engine);
}

const epd_tokenizer_t *epd_engine_tokenizer(const epd_engine_t *engine)
{
    return engine != NULL ? engine->tok : NULL;
}

const epd_engine_info_t *epd_engine_info(const epd_engine_t *engine)
{
    return &engine->info;
}

const char *epd_engine_name(const epd_engine_t *engine)
{
    return engine->ops->name;
}

epd_status_t epd_engine_check_pool(const epd_engine_t *engine, const epd_kv_pool_t *pool)
{
    uint64_t need;

    if (pool == NULL || pool->base == NULL) {
        epd_log_error(EPD_ENGINE_LOG, 0, "no KV pool");
        return EPD_ERR_INVALID_PARAM;
    }
    need = epd_kv_pool_bytes(&engine->info.kv, pool->n_blocks, pool->n_state_slots);
    if (need == 0 && (engine->info.kv.n_attn_layers > 0 || engine->info.kv.n_linear_layers > 0)) {
        epd_log_error(EPD_ENGINE_LOG, 0, "KV pool of %u blocks and %u slots is empty or overflows",
                      pool->n_blocks, pool->n_state_slots);
        return EPD_ERR_INVALID_PARAM;
    }
    if (pool->bytes < need) {
        epd_log_error(EPD_ENGINE_LOG, 0, "KV pool of %llu bytes, layout needs %llu",
                      (unsigned long long)pool->bytes, (unsigned long long)need);
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

/* Text to ids through the folder's tokenizer when it has one (add_bos
 * applies its post-processor, as vLLM does for /v1/completions), else the
 * engine's op.  Arguments already checked. */
static epd_status_t epd_engine_text_ids(const epd_engine_t *engine, const char *text, size_t len,
                                        int add_bos, int32_t *tokens, size_t cap, size_t *n_p)
{
    /* the lock is the object's own, never const in fact (the engine is
     * always heap-allocated by epd_engine_open) */
    pthread_mutex_t *lock = (pthread_mutex_t *)&engine->tok_lock;
    epd_status_t status;

    if (engine->tok == NULL) {
        return engine->ops->tokenize(engine->impl, text, len, add_bos, tokens, cap, n_p);
    }
    pthread_mutex_lock(lock);
    status = epd_tokenizer_encode(engine->tok, text, len, add_bos ? EPD_TOKENIZE_ADD_SPECIAL : 0,
                                  tokens, cap, n_p);
    pthread_mutex_unlock(lock);
    return status;
}

epd_status_t epd_engine_tokenize(const epd_engine_t *engine, const char *text, size_t len,
                                 int add_bos, int32_t *tokens, size_t cap, size_t *n_p)
{
    size_t n = 0;
    epd_status_t status;

    if ((text == NULL && len > 0) || (tokens == NULL && cap > 0) || n_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    status = epd_engine_text_ids(engine, text, len, add_bos, tokens, cap, &n);
    /* the tokenizer reports the count needed with EPD_ERR_TOO_LONG; the
     * contract here is *n_p on success only */
    if (status == EPD_OK) {
        *n_p = n;
    }
    return status;
}

/* The bytes of ids[0..n) by the folder's tokenizer: special tokens and
 * ids the tokenizer does not name (the padding rows of a model's
 * vocabulary past the tokenizer's ids, which a model may still sample)
 * give nothing, as Hugging Face's decode with skip_special_tokens. */
static epd_status_t epd_engine_tok_detokenize(const epd_tokenizer_t *tok, const int32_t *tokens,
                                              size_t n, char *buf, size_t cap, size_t *len_p)
{
    size_t len = 0;

    for (size_t i = 0; i < n; i++) {
        size_t l = 0;
        int special = 0;
        const char *b = epd_tokenizer_id_bytes(tok, tokens[i], &l, &special);

        if (b == NULL || special) {
            continue;
        }
        if (l > cap - len) {
            return EPD_ERR_TOO_LONG;
        }
        memcpy(buf + len, b, l);
        len += l;
    }
    *len_p = len;
    return EPD_OK;
}

epd_status_t epd_engine_detokenize(const epd_engine_t *engine, const int32_t *tokens, size_t n,
                                   char *buf, size_t cap, size_t *len_p)
{
    if ((tokens == NULL && n > 0) || (buf == NULL && cap > 0) || len_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= engine->info.vocab_size) {
            epd_log_error(EPD_ENGINE_LOG, 0, "token id %d outside the vocabulary of %u", tokens[i],
                          engine->info.vocab_size);
            return EPD_ERR_OUT_OF_RANGE;
        }
    }
    if (engine->tok != NULL) {
        return epd_engine_tok_detokenize(engine->tok, tokens, n, buf, cap, len_p);
    }
    return engine->ops->detokenize(engine->impl, tokens, n, buf, cap, len_p);
}

/* Appends the tokens of text[0..len) (no BOS) at tokens[*n_p..cap). */
static epd_status_t epd_engine_put_text(const epd_engine_t *engine, const char *text, size_t len,
                                        int32_t *tokens, size_t cap, size_t *n_p)
{
    size_t got = 0;
    epd_status_t status;

    if (len == 0) {
        return EPD_OK;
    }
    status = epd_engine_text_ids(engine, text, len, 0, tokens + *n_p, cap - *n_p, &got);
    if (status == EPD_OK) {
        *n_p += got;
    }
    return status;
}

/* Appends one image's placeholders at tokens[*n_p..cap); *pos_p = where. */
static epd_status_t epd_engine_put_image(const epd_engine_info_t *info, int32_t *tokens,
                                         size_t cap, size_t *n_p, uint32_t *pos_p)
{
    if (cap - *n_p < info->image_embeddings) {
        return EPD_ERR_TOO_LONG;
    }
    *pos_p = (uint32_t)*n_p;
    for (uint32_t t = 0; t < info->image_embeddings; t++) {
        tokens[(*n_p)++] = info->image_token;
    }
    return EPD_OK;
}

epd_status_t epd_engine_tokenize_images(const epd_engine_t *engine, const char *text, size_t len,
                                        uint32_t n_images, int32_t *tokens, size_t cap,
                                        size_t *n_p, uint32_t *image_pos)
{
    const size_t mlen = sizeof(EPD_IMAGE_MARKER) - 1;
    const epd_engine_info_t *info = &engine->info;
    uint32_t n_markers = 0;
    size_t n = 0;
    size_t seg = 0; /* start of the text not yet tokenized */
    epd_status_t status;

    if ((text == NULL && len > 0) || (tokens == NULL && cap > 0) || n_p == NULL ||
        (image_pos == NULL && n_images > 0)) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (n_images > 0 && info->image_embeddings == 0) {
        epd_log_error(EPD_ENGINE_LOG, 0, "a prompt with %u images for engine '%s', which has no "
                      "vision encoder", n_images, engine->ops->name);
        return EPD_ERR_UNSUPPORTED;
    }
    for (size_t i = 0; i + mlen <= len; i++) {
        if (memcmp(text + i, EPD_IMAGE_MARKER, mlen) == 0) {
            n_markers++;
            i += mlen - 1;
        }
    }
    if (n_markers > 0 && n_markers != n_images) {
        epd_log_error(EPD_ENGINE_LOG, 0, "the prompt has %u %s markers for %u images", n_markers,
                      EPD_IMAGE_MARKER, n_images);
        return EPD_ERR_INVALID_PARAM;
    }
    /* BOS (with no text: the engine's tokenizer decides what BOS is) */
    status = epd_engine_text_ids(engine, text, 0, 1, tokens, cap, &n);
    if (status != EPD_OK) {
        return status;
    }
    if (n_markers == 0) {
        for (uint32_t k = 0; k < n_images; k++) {
            status = epd_engine_put_image(info, tokens, cap, &n, &image_pos[k]);
            if (status != EPD_OK) {
                return status;
            }
        }
    } else {
        uint32_t k = 0;

        for (size_t i = 0; i + mlen <= len;) {
            if (memcmp(text + i, EPD_IMAGE_MARKER, mlen) != 0) {
                i++;
                continue;
            }
            status = epd_engine_put_text(engine, text + seg, i - seg, tokens, cap, &n);
            if (status == EPD_OK) {
                status = epd_engine_put_image(info, tokens, cap, &n, &image_pos[k++]);
            }
            if (status != EPD_OK) {
                return status;
            }
            i += mlen;
            seg = i;
        }
    }
    status = epd_engine_put_text(engine, text + seg, len - seg, tokens, cap, &n);
    if (status != EPD_OK) {
        return status;
    }
    *n_p = n;
    return EPD_OK;
}

epd_status_t epd_engine_encode_image(epd_engine_t *engine, const epd_image_view_t *image,
                                     float *out)
{
    size_t bytes;

    if (engine->info.image_embeddings == 0 || engine->tok_only) {
        epd_log_error(EPD_ENGINE_LOG, 0, "engine '%s' has no vision encoder%s", engine->ops->name,
                      engine->tok_only ? " (opened for its tokenizer only)" : "");
        return EPD_ERR_UNSUPPORTED;
    }
    if (image == NULL || out == NULL || image->rgb == NULL || image->width == 0 ||
        image->height == 0 ||
        __builtin_mul_overflow((size_t)image->width * image->height, (size_t)3, &bytes)) {
        epd_log_error(EPD_ENGINE_LOG, 0, "encode of an empty image (%u x %u pixels)",
                      image != NULL ? image->width : 0, image != NULL ? image->height : 0);
        return EPD_ERR_INVALID_PARAM;
    }
    return engine->ops->encode_image(engine->impl, image, out);
}

/* Checks a prefill's replay range and state checkpoints (see
 * epd_prefill_args_t). */
static epd_status_t epd_engine_check_replay(const epd_engine_t *engine,
                                            const epd_prefill_args_t *args)
{
    uint64_t req = args->seq.req_id;
    uint64_t end = (uint64_t)args->start + args->n_tokens;

    if (args->replay_end != 0 && (args->replay_end <= args->start || args->replay_end > end)) {
        epd_log_error(EPD_ENGINE_LOG, req, "replay up to %u outside the chunk (%u, %llu]",
                      args->replay_end, args->start, (unsigned long long)end);
        return EPD_ERR_INVALID_PARAM;
    }
    if (args->n_ckpts == 0) {
        return EPD_OK;
    }
    if (args->ckpts == NULL || engine->info.kv.n_linear_layers == 0) {
        epd_log_error(EPD_ENGINE_LOG, req, "%u state checkpoints %s", args->n_ckpts,
                      args->ckpts == NULL ? "without an array" : "on a model without linear layers");
        return EPD_ERR_INVALID_PARAM;
    }
    for (uint32_t i = 0; i < args->n_ckpts; i++) {
        const epd_state_ckpt_t *c = &args->ckpts[i];

        if (c->dst == NULL || c->pos <= args->start || c->pos > end ||
            (i > 0 && c->pos <= args->ckpts[i - 1].pos)) {
            epd_log_error(EPD_ENGINE_LOG, req,
                          "state checkpoint %u at %u: no buffer, outside (%u, %llu] or not after "
                          "the one before", i, c->pos, args->start, (unsigned long long)end);
            return EPD_ERR_INVALID_PARAM;
        }
    }
    return EPD_OK;
}

/* Checks the embedding spans of a prefill (see epd_prefill_args_t). */
static epd_status_t epd_engine_check_spans(const epd_engine_t *engine,
                                           const epd_prefill_args_t *args)
{
    const epd_engine_info_t *info = &engine->info;
    uint64_t req = args->seq.req_id;
    uint64_t end = (uint64_t)args->start + args->n_tokens;
    uint32_t next = 0; /* index of the first span that may cover the position below */

    if (args->n_embeds > 0 && args->embeds == NULL) {
        epd_log_error(EPD_ENGINE_LOG, req, "prefill with %u embedding spans and no span array",
                      args->n_embeds);
        return EPD_ERR_INVALID_PARAM;
    }
    if (args->n_embeds > 0 && info->image_embeddings == 0) {
        epd_log_error(EPD_ENGINE_LOG, req, "embedding spans for engine '%s', which has no vision "
                      "encoder", engine->ops->name);
        return EPD_ERR_UNSUPPORTED;
    }
    for (uint32_t i = 0; i < args->n_embeds; i++) {
        const epd_embed_span_t *sp = &args->embeds[i];

        if (sp->n == 0 || sp->data == NULL) {
            epd_log_error(EPD_ENGINE_LOG, req, "embedding span %u is empty or has no data", i);
            return EPD_ERR_INVALID_PARAM;
        }
        if ((uint64_t)sp->pos + sp->n > end) {
            epd_log_error(EPD_ENGINE_LOG, req,
                          "embedding span %u covers [%u, %llu), past the prompt's %llu tokens", i,
                          sp->pos, (unsigned long long)sp->pos + sp->n, (unsigned long long)end);
            return EPD_ERR_INVALID_PARAM;
        }
        if (i > 0 && sp->pos < (uint64_t)args->embeds[i - 1].pos + args->embeds[i - 1].n) {
            epd_log_error(EPD_ENGINE_LOG, req,
                          "embedding span %u at %u overlaps or precedes span %u (spans must be "
                          "sorted by position, without overlap)", i, sp->pos, i - 1);
            return EPD_ERR_INVALID_PARAM;
        }
    }
    /* Inside the chunk: a position is covered exactly when it holds the
     * placeholder.  The spans are sorted, so one pass suffices. */
    for (uint32_t t = 0; t < args->n_tokens; t++) {
        uint64_t p = (uint64_t)args->start + t;
        int covered;

        while (next < args->n_embeds &&
               (uint64_t)args->embeds[next].pos + args->embeds[next].n <= p) {
            next++;
        }
        covered = next < args->n_embeds && args->embeds[next].pos <= p;
        if (covered && args->tokens[t] != info->image_token) {
            epd_log_error(EPD_ENGINE_LOG, req,
                          "embedding span %u covers position %llu, which holds token %d, not the "
                          "image placeholder %d", next, (unsigned long long)p, args->tokens[t],
                          info->image_token);
            return EPD_ERR_INVALID_PARAM;
        }
        if (!covered && info->image_embeddings > 0 && args->tokens[t] == info->image_token) {
            epd_log_error(EPD_ENGINE_LOG, req,
                          "position %llu holds the image placeholder %d but no embedding span "
                          "covers it", (unsigned long long)p, info->image_token);
            return EPD_ERR_INVALID_PARAM;
        }
    }
    return EPD_OK;
}

/* Checks that `seq` may hold `n_tok` tokens in `pool`. */
static epd_status_t epd_engine_check_seq(const epd_engine_t *engine, const epd_kv_pool_t *pool,
                                         const epd_kv_seq_t *seq, uint64_t n_tok)
{
    const epd_kv_layout_t *kv = &engine->info.kv;

    if (kv->n_attn_layers > 0) {
        uint64_t need = (n_tok + kv->block_tokens - 1) / kv->block_tokens;

        if (seq->block_table == NULL || seq->n_blocks < need) {
            epd_log_error(EPD_ENGINE_LOG, seq->req_id,
                          "block table of %u blocks cannot hold %llu tokens (%llu blocks of %u)",
                          seq->n_blocks, (unsigned long long)n_tok, (unsigned long long)need,
                          kv->block_tokens);
            return EPD_ERR_INVALID_PARAM;
        }
        for (uint64_t i = 0; i < need; i++) {
            if (seq->block_table[i] >= pool->n_blocks) {
                epd_log_error(EPD_ENGINE_LOG, seq->req_id,
                              "block table entry %llu names block %u of a %u-block pool",
                              (unsigned long long)i, seq->block_table[i], pool->n_blocks);
                return EPD_ERR_INVALID_PARAM;
            }
        }
    }
    if (kv->n_linear_layers > 0 && seq->state_slot >= pool->n_state_slots) {
        epd_log_error(EPD_ENGINE_LOG, seq->req_id, "state slot %u of a %u-slot pool",
                      seq->state_slot, pool->n_state_slots);
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

static epd_status_t epd_engine_check_token(const epd_engine_t *engine, uint64_t req_id,
                                           int32_t token)
{
    if (token < 0 || (uint32_t)token >= engine->info.vocab_size) {
        epd_log_error(EPD_ENGINE_LOG, req_id, "token id %d outside the vocabulary of %u", token,
                      engine->info.vocab_size);
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}

epd_status_t epd_engine_prefill(epd_engine_t *engine, const epd_kv_pool_t *pool,
                                const epd_prefill_args_t *args, const epd_engine_sink_t *sink,
                                float *logits)
{
    uint64_t end;
    epd_status_t status;

    if (args == NULL || logits == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (engine->tok_only) {
        epd_log_error(EPD_ENGINE_LOG, args->seq.req_id, "prefill on an engine opened for its "
                      "tokenizer only");
        return EPD_ERR_UNSUPPORTED;
    }
    if (args->n_tokens == 0 || args->tokens == NULL) {
        epd_log_error(EPD_ENGINE_LOG, args->seq.req_id, "prefill of an empty prompt");
        return EPD_ERR_INVALID_PARAM;
    }
    end = (uint64_t)args->start + args->n_tokens;
    if (end > engine->info.max_context) {
        epd_log_error(EPD_ENGINE_LOG, args->seq.req_id,
                      "prompt of %llu tokens is longer than the context limit of %u tokens",
                      (unsigned long long)end, engine->info.max_context);
        return EPD_ERR_TOO_LONG;
    }
    status = epd_engine_check_pool(engine, pool);
    if (status != EPD_OK) {
        return status;
    }
    status = epd_engine_check_seq(engine, pool, &args->seq, end);
    if (status != EPD_OK) {
        return status;
    }
    for (uint32_t i = 0; i < args->n_tokens; i++) {
        status = epd_engine_check_token(engine, args->seq.req_id, args->tokens[i]);
        if (status != EPD_OK) {
            return status;
        }
    }
    status = epd_engine_check_spans(engine, args);
    if (status != EPD_OK) {
        return status;
    }
    status = epd_engine_check_replay(engine, args);
    if (status != EPD_OK) {
        return status;
    }
    return engine->ops->prefill(engine->impl, pool, args, sink, logits);
}

epd_status_t epd_engine_decode(epd_engine_t *engine, const epd_kv_pool_t *pool,
                               const epd_decode_req_t *reqs, uint32_t n_reqs, float *logits)
{
    const epd_kv_layout_t *kv = &engine->info.kv;
    epd_status_t status;

    if (engine->tok_only) {
        epd_log_error(EPD_ENGINE_LOG, 0, "decode on an engine opened for its tokenizer only");
        return EPD_ERR_UNSUPPORTED;
    }
    if (reqs == NULL || logits == NULL || n_reqs == 0 || n_reqs > engine->info.max_batch) {
        epd_log_error(EPD_ENGINE_LOG, 0, "decode batch of %u requests (1..%u)", n_reqs,
                      engine->info.max_batch);
        return EPD_ERR_INVALID_PARAM;
    }
    status = epd_engine_check_pool(engine, pool);
    if (status != EPD_OK) {
        return status;
    }
    for (uint32_t i = 0; i < n_reqs; i++) {
        const epd_decode_req_t *r = &reqs[i];

        if (r->pos >= engine->info.max_context) {
            epd_log_error(EPD_ENGINE_LOG, r->seq.req_id,
                          "decode at position %u reaches the context limit of %u tokens", r->pos,
                          engine->info.max_context);
            return EPD_ERR_TOO_LONG;
        }
        status = epd_engine_check_seq(engine, pool, &r->seq, (uint64_t)r->pos + 1);
        if (status == EPD_OK) {
            status = epd_engine_check_token(engine, r->seq.req_id, r->token);
        }
        if (status != EPD_OK) {
            return status;
        }
        /* Two requests of one batch writing the same block or slot would race. */
        for (uint32_t j = 0; j < i; j++) {
            const epd_decode_req_t *o = &reqs[j];

            if ((kv->n_attn_layers > 0 && r->seq.block_table[r->pos / kv->block_tokens] ==
                                              o->seq.block_table[o->pos / kv->block_tokens]) ||
                (kv->n_linear_layers > 0 && r->seq.state_slot == o->seq.state_slot)) {
                epd_log_error(EPD_ENGINE_LOG, r->seq.req_id,
                              "decode batch entries %u and %u write the same block or state slot",
                              j, i);
                return EPD_ERR_INVALID_PARAM;
            }
        }
    }
    return engine->ops->decode(engine->impl, pool, reqs, n_reqs, logits);
}

void epd_engine_release(epd_engine_t *engine, const epd_kv_pool_t *pool, const epd_kv_seq_t *seq)
{
    if (engine->tok_only || seq == NULL || epd_engine_check_pool(engine, pool) != EPD_OK) {
        return;
    }
    if (engine->info.kv.n_linear_layers > 0 && seq->state_slot >= pool->n_state_slots) {
        return;
    }
    engine->ops->release(engine->impl, pool, seq);
}
