/*
 * epd_hf_load.c — opening a Hugging Face folder: config (epd_hf_model.c),
 * the weights (model.safetensors, or the shards model.safetensors.index.json
 * names), the digest, the description.
 *
 * Every tensor the architecture consumes must be present once with the
 * config's shape, and every tensor present must be consumed: a tensor the
 * code would not read (Qwen2's biases under a Llama config, a vision tower,
 * an lm_head under tie_word_embeddings) means the model would answer
 * wrong, so it is refused by name instead of ignored.  Matrices stay in the
 * mapping (see epd_hf_int.h); norms and biases are widened into one small
 * buffer.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "epd_alloc.h"
#include "epd_hash.h"
#include "epd_hf_int.h"
#include "epd_kvq.h"
#include "epd_log.h"

/* Which file holds each tensor: the index's weight_map, or every tensor in
 * the one model.safetensors (map NULL). */
typedef struct {
    json_t *wmap;   /* name -> file name (borrowed from index) */
    json_t *index;  /* owned */
    json_t *fileno; /* file name -> index into e->files (owned) */
} epd_hf_where_t;

static epd_status_t epd_hf_open_files(epd_engine_impl_t *e, const char *dir, epd_hf_where_t *w)
{
    char path[4096];
    json_error_t jerr;
    struct stat st;
    const char *key;
    json_t *val;
    epd_status_t status;

    memset(w, 0, sizeof(*w));
    if (snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir) >= (int)sizeof(path)) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (stat(path, &st) != 0) {
        /* one file */
        if (snprintf(path, sizeof(path), "%s/model.safetensors", dir) >= (int)sizeof(path)) {
            return EPD_ERR_INVALID_PARAM;
        }
        e->files = epd_calloc(1, sizeof(*e->files));
        if (e->files == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        status = epd_st_open(path, &e->files[0]); /* logs its cause, naming the file */
        if (status != EPD_OK) {
            return status == EPD_ERR_NOT_FOUND || status == EPD_ERR_NO_MEMORY ? status
                                                                              : EPD_ERR_MALFORMED;
        }
        e->n_files = 1;
        return EPD_OK;
    }
    w->index = json_load_file(path, 0, &jerr);
    w->wmap = w->index != NULL ? json_object_get(w->index, "weight_map") : NULL;
    if (!json_is_object(w->wmap)) {
        epd_log_error(EPD_HF_LOG, 0, "%s: key 'weight_map' is missing or not an object%s%s", path,
                      w->index == NULL ? ": " : "", w->index == NULL ? jerr.text : "");
        return EPD_ERR_MALFORMED;
    }
    w->fileno = json_object();
    e->files = epd_calloc(EPD_HF_MAX_SHARDS, sizeof(*e->files));
    if (w->fileno == NULL || e->files == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    json_object_foreach(w->wmap, key, val)
    {
        const char *fname = json_string_value(val);
        char fpath[4096];

        if (fname == NULL || fname[0] == '\0' || strchr(fname, '/') != NULL ||
            strcmp(fname, "..") == 0) {
            epd_log_error(EPD_HF_LOG, 0, "%s: weight_map entry '%s' must name a file in the folder",
                          path, key);
            return EPD_ERR_MALFORMED;
        }
        if (json_object_get(w->fileno, fname) != NULL) {
            continue;
        }
        if (e->n_files == EPD_HF_MAX_SHARDS) {
            epd_log_error(EPD_HF_LOG, 0, "%s: more than %d shards", path, EPD_HF_MAX_SHARDS);
            return EPD_ERR_UNSUPPORTED;
        }
        if (snprintf(fpath, sizeof(fpath), "%s/%s", dir, fname) >= (int)sizeof(fpath)) {
            return EPD_ERR_INVALID_PARAM;
        }
        if (stat(fpath, &st) != 0) {
            epd_log_error(EPD_HF_LOG, 0, "%s: weight_map names shard '%s' (for tensor '%s'): %s",
                          path, fname, key, strerror(errno));
            return EPD_ERR_MALFORMED;
        }
        status = epd_st_open(fpath, &e->files[e->n_files]); /* logs its cause */
        if (status != EPD_OK) {
            return status == EPD_ERR_NO_MEMORY ? status : EPD_ERR_MALFORMED;
        }
        json_object_set_new(w->fileno, fname, json_integer(e->n_files));
        e->n_files++;
    }
    return EPD_OK;
}

static void epd_hf_where_free(epd_hf_where_t *w)
{
    json_decref(w->fileno);
    json_decref(w->index);
}

/* The tensor `name` in the file that should hold it, or NULL (logged). */
static const epd_st_tensor_t *epd_hf_find(const epd_engine_impl_t *e, const epd_hf_where_t *w,
                                          const char *name)
{
    const epd_st_tensor_t *t;
    const char *fname = NULL;
    size_t f = 0;

    if (w->wmap != NULL) {
        json_t *jf = json_object_get(w->wmap, name);

        if (jf == NULL) {
            epd_log_error(EPD_HF_LOG, 0,
                          "tensor '%s' is missing (not in model.safetensors.index.json)", name);
            return NULL;
        }
        fname = json_string_value(jf);
        f = (size_t)json_integer_value(json_object_get(w->fileno, fname));
    }
    t = epd_st_find(e->files[f], name);
    if (t == NULL) {
        epd_log_error(EPD_HF_LOG, 0, "tensor '%s' is missing%s%s", name,
                      fname != NULL ? " from shard " : "", fname != NULL ? fname : "");
    }
    return t;
}

static epd_status_t epd_hf_check_tensor(const epd_st_tensor_t *t, const epd_hf_tensor_spec_t *s)
{
    size_t esize = epd_dtype_size(t->dtype);

    if (t->ndim != s->ndim || t->shape[0] != s->shape[0] ||
        (s->ndim == 2 && t->shape[1] != s->shape[1])) {
        char have[96] = "";
        size_t o = 0;

        for (uint32_t d = 0; d < t->ndim && o < sizeof(have) - 24; d++) {
            o += (size_t)snprintf(have + o, sizeof(have) - o, "%s%llu", d ? ", " : "",
                                  (unsigned long long)t->shape[d]);
        }
        if (s->ndim == 1) {
            epd_log_error(EPD_HF_LOG, 0, "tensor '%s': shape [%s], config.json wants [%llu]",
                          s->name, have, (unsigned long long)s->shape[0]);
        } else {
            epd_log_error(EPD_HF_LOG, 0, "tensor '%s': shape [%s], config.json wants [%llu, %llu]",
                          s->name, have, (unsigned long long)s->shape[0],
                          (unsigned long long)s->shape[1]);
        }
        return EPD_ERR_MALFORMED;
    }
    if (esize == 0 || (uintptr_t)t->data % esize != 0) {
        /* the kernels read elements in place: safetensors writers align
         * every tensor (headers are padded to 8 bytes) */
        epd_log_error(EPD_HF_LOG, 0, "tensor '%s': data is not aligned to its %s elements", s->name,
                      epd_dtype_name(t->dtype));
        return EPD_ERR_MALFORMED;
    }
    return EPD_OK;
}

static float epd_hf_elem(const epd_st_tensor_t *t, uint64_t i)
{
    if (t->dtype == EPD_DTYPE_F32) {
        return ((const float *)t->data)[i];
    }
    if (t->dtype == EPD_DTYPE_BF16) {
        return epd_bf16_to_f32(((const uint16_t *)t->data)[i]);
    }
    return epd_f16_to_f32(((const uint16_t *)t->data)[i]);
}

/* Points the layer slots at the tensors, widening the vectors into e->vecs.
 * `set` collects the consumed names. */
static epd_status_t epd_hf_bind(epd_engine_impl_t *e, const epd_hf_where_t *w, json_t *set)
{
    const epd_hf_hparams_t *hp = &e->hp;
    size_t n = epd_hf_tensor_count(hp);
    uint64_t nvec = 0;
    float *v;
    epd_status_t status;

    for (size_t i = 0; i < n; i++) {
        epd_hf_tensor_spec_t s;

        epd_hf_tensor_spec(hp, i, &s);
        if (s.ndim == 1) {
            nvec += s.n_elems;
        }
    }
    e->vecs = epd_calloc(nvec ? nvec : 1, sizeof(float));
    e->layers = epd_calloc(hp->n_layers, sizeof(*e->layers));
    if (hp->arch == EPD_HF_QWEN3_MOE) {
        e->experts = epd_calloc((size_t)hp->n_layers * hp->n_experts, sizeof(*e->experts));
    }
    if (e->vecs == NULL || e->layers == NULL ||
        (hp->arch == EPD_HF_QWEN3_MOE && e->experts == NULL)) {
        return EPD_ERR_NO_MEMORY;
    }
    v = e->vecs;
    for (size_t i = 0; i < n; i++) {
        epd_hf_tensor_spec_t s;
        const epd_st_tensor_t *t;
        epd_hf_layer_t *L;
        epd_hf_mat_t m;

        epd_hf_tensor_spec(hp, i, &s);
        t = epd_hf_find(e, w, s.name);
        if (t == NULL) {
            return EPD_ERR_MALFORMED;
        }
        status = epd_hf_check_tensor(t, &s);
        if (status != EPD_OK) {
            return status;
        }
        json_object_set_new(set, s.name, json_true());
        L = &e->layers[s.layer];
        if (s.ndim == 1) {
            const float **slot = NULL;

            for (uint64_t j = 0; j < s.n_elems; j++) {
                v[j] = epd_hf_elem(t, j);
            }
            switch (s.role) {
            case EPD_HF_T_IN_NORM:
                slot = &L->in_norm;
                break;
            case EPD_HF_T_POST_NORM:
                slot = &L->post_norm;
                break;
            case EPD_HF_T_Q_BIAS:
                slot = &L->bq;
                break;
            case EPD_HF_T_K_BIAS:
                slot = &L->bk;
                break;
            case EPD_HF_T_V_BIAS:
                slot = &L->bv;
                break;
            case EPD_HF_T_Q_NORM:
                slot = &L->q_norm;
                break;
            case EPD_HF_T_K_NORM:
                slot = &L->k_norm;
                break;
            case EPD_HF_T_FINAL_NORM:
                slot = &e->final_norm;
                break;
            default:
                break;
            }
            if (slot != NULL) {
                *slot = v;
            }
            v += s.n_elems;
            continue;
        }
        m.data = t->data;
        m.dtype = t->dtype;
        m.rows = (uint32_t)s.shape[0];
        m.cols = (uint32_t)s.shape[1];
        switch (s.role) {
        case EPD_HF_T_EMBED:
            e->embed = m;
            break;
        case EPD_HF_T_LM_HEAD:
            e->lm_head = m;
            break;
        case EPD_HF_T_Q:
            L->q = m;
            break;
        case EPD_HF_T_K:
            L->k = m;
            break;
        case EPD_HF_T_V:
            L->v = m;
            break;
        case EPD_HF_T_O:
            L->o = m;
            break;
        case EPD_HF_T_GATE:
            L->gate = m;
            break;
        case EPD_HF_T_UP:
            L->up = m;
            break;
        case EPD_HF_T_DOWN:
            L->down = m;
            break;
        case EPD_HF_T_ROUTER:
            L->router = m;
            L->experts = e->experts + (size_t)s.layer * hp->n_experts;
            break;
        case EPD_HF_T_X_GATE:
            e->experts[(size_t)s.layer * hp->n_experts + s.expert].gate = m;
            break;
        case EPD_HF_T_X_UP:
            e->experts[(size_t)s.layer * hp->n_experts + s.expert].up = m;
            break;
        case EPD_HF_T_X_DOWN:
            e->experts[(size_t)s.layer * hp->n_experts + s.expert].down = m;
            break;
        default:
            break;
        }
    }
    if (hp->tied) {
        e->lm_head = e->embed;
    }
    return EPD_OK;
}

/* Every tensor in every file (and every weight_map entry) is consumed. */
static epd_status_t epd_hf_check_consumed(const epd_engine_impl_t *e, const epd_hf_where_t *w,
                                          json_t *set)
{
    const char *key;
    json_t *val;

    for (uint32_t f = 0; f < e->n_files; f++) {
        for (size_t i = 0; i < epd_st_count(e->files[f]); i++) {
            const char *name = epd_st_at(e->files[f], i)->name;

            if (json_object_get(set, name) == NULL) {
                epd_log_error(EPD_HF_LOG, 0,
                              "tensor '%s' is not used by %s with this config.json%s: refused "
                              "rather than ignored",
                              name, epd_hf_arch_class(e->hp.arch),
                              e->hp.tied && strcmp(name, "lm_head.weight") == 0
                                  ? " (tie_word_embeddings is true)"
                                  : "");
                return EPD_ERR_MALFORMED;
            }
        }
    }
    if (w->wmap != NULL) {
        json_object_foreach(w->wmap, key, val)
        {
            if (json_object_get(set, key) == NULL) {
                epd_log_error(EPD_HF_LOG, 0,
                              "tensor '%s' (model.safetensors.index.json) is not used by %s", key,
                              epd_hf_arch_class(e->hp.arch));
                return EPD_ERR_MALFORMED;
            }
        }
    }
    return EPD_OK;
}

/*
 * info.model_digest.  Not every weight byte: a 60 GB checkpoint would be
 * read whole at every daemon start.  Instead XXH3 of config.json,
 * generation_config.json (when present), then per weight file in load
 * order its size, its whole safetensors header (names, dtypes, shapes,
 * offsets) and a sample of its data, 64 KiB at every 64 MiB.  A checkpoint
 * edited in place elsewhere than the samples, keeping its size, would keep
 * its digest: the prefix cache keys on it, so replace files, don't patch
 * them.
 */
static epd_status_t epd_hf_digest(epd_engine_impl_t *e, const char *dir)
{
    static const char *const cfgs[2] = {"config.json", "generation_config.json"};
    epd_hash_state_t *h;
    uint64_t d;
    epd_status_t status;

    status = epd_hash_state_create(0x6866u, &h);
    if (status != EPD_OK) {
        return status;
    }
    for (int c = 0; c < 2; c++) {
        char path[4096];
        char buf[4096];
        size_t n;
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", dir, cfgs[c]);
        f = fopen(path, "rb");
        if (f == NULL) {
            continue;
        }
        epd_hash_state_update(h, cfgs[c], strlen(cfgs[c]) + 1);
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
            epd_hash_state_update(h, buf, n);
        }
        fclose(f);
    }
    for (uint32_t f = 0; f < e->n_files; f++) {
        size_t len;
        const unsigned char *b = epd_st_bytes(e->files[f], &len);
        uint64_t hlen = 0;
        uint64_t len64 = len;
        const size_t step = (size_t)64 << 20;
        const size_t sample = (size_t)64 << 10;

        for (int i = 0; i < 8; i++) {
            hlen |= (uint64_t)b[i] << (8 * i);
        }
        epd_hash_state_update(h, &len64, sizeof(len64));
        epd_hash_state_update(h, b, 8 + (size_t)hlen); /* checked by epd_st_open */
        for (size_t off = 8 + (size_t)hlen; off < len; off += step) {
            epd_hash_state_update(h, b + off, len - off < sample ? len - off : sample);
        }
    }
    d = epd_hash_state_digest(h);
    epd_hash_state_destroy(h);
    epd_hash128(&d, sizeof(d), 0x6866u, e->info.model_digest);
    return EPD_OK;
}

/* inv_freq_i = theta^(-2i/hd); llama3: transformers'
 * _compute_llama3_parameters (wavelengths above original/low_freq_factor
 * divided by factor, below original/high_freq_factor kept, in between
 * smoothly interpolated). */
static void epd_hf_inv_freq(epd_engine_impl_t *e)
{
    const epd_hf_hparams_t *hp = &e->hp;
    uint32_t half = hp->head_dim / 2;

    for (uint32_t i = 0; i < half; i++) {
        double f = 1.0 / pow(hp->rope_theta, (double)(2 * i) / hp->head_dim);

        if (hp->rope_llama3) {
            double low_wl = hp->rs_orig_max / hp->rs_low_freq;
            double high_wl = hp->rs_orig_max / hp->rs_high_freq;
            double wl = 2.0 * 3.14159265358979323846 / f;

            if (wl > low_wl) {
                f = f / hp->rs_factor;
            } else if (!(wl < high_wl)) {
                double smooth =
                    (hp->rs_orig_max / wl - hp->rs_low_freq) / (hp->rs_high_freq - hp->rs_low_freq);

                f = (1.0 - smooth) * f / hp->rs_factor + smooth * f;
            }
        }
        e->inv_freq[i] = f;
    }
}

static void epd_hf_fill_info(epd_engine_impl_t *e, uint32_t block_tokens, uint32_t max_batch,
                             uint32_t max_context)
{
    const epd_hf_hparams_t *hp = &e->hp;
    epd_engine_info_t *info = &e->info;
    epd_kv_layout_t *kv = &info->kv;

    info->vocab_size = hp->vocab;
    info->bos_token = hp->bos;
    info->eos_token = hp->eos[0];
    info->n_eos = hp->n_eos;
    memcpy(info->eos_tokens, hp->eos, sizeof(int32_t) * hp->n_eos);
    info->max_context = max_context;
    info->max_batch = max_batch;
    info->image_token = -1;
    kv->n_layers = hp->n_layers;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        kv->kind[l] = EPD_LAYER_ATTENTION;
        kv->kind_index[l] = kv->n_attn_layers++;
    }
    kv->dtype = EPD_DTYPE_F32;
    kv->block_tokens = block_tokens;
    kv->n_kv_heads = hp->n_kv_heads;
    kv->head_dim = hp->head_dim;
    kv->block_bytes = 2ull * hp->n_kv_heads * block_tokens * hp->head_dim * sizeof(float);
}

void epd_hf_close(epd_engine_impl_t *e)
{
    if (e == NULL) {
        return;
    }
    epd_free(e->m_y);
    epd_free(e->m_logit);
    epd_free(e->d_sin);
    epd_free(e->d_cos);
    epd_free(e->d_scores);
    epd_free(e->d_u);
    epd_free(e->d_g);
    epd_free(e->d_o);
    epd_free(e->d_v);
    epd_free(e->d_k);
    epd_free(e->d_q);
    epd_free(e->d_h);
    epd_free(e->d_x);
    epd_free(e->inv_freq);
    epd_free(e->experts);
    epd_free(e->layers);
    epd_free(e->vecs);
    for (uint32_t f = 0; f < e->n_files; f++) {
        epd_st_close(e->files[f]);
    }
    epd_free(e->files);
    epd_free(e);
}

epd_status_t epd_hf_open(const epd_engine_config_t *config, epd_engine_impl_t **impl_p)
{
    uint32_t block_tokens = config->block_tokens ? config->block_tokens : 16;
    uint32_t max_batch = config->max_batch ? config->max_batch : 64;
    uint32_t max_context;
    epd_hf_where_t where;
    json_t *set = NULL;
    epd_engine_impl_t *e;
    epd_status_t status;
    size_t qd, kvd, ffn;

    if (config->model_dir == NULL) {
        epd_log_error(EPD_HF_LOG, 0, "no model folder given");
        return EPD_ERR_INVALID_PARAM;
    }
    if (block_tokens > 4096 || max_batch > 4096) {
        epd_log_error(EPD_HF_LOG, 0, "block_tokens %u / max_batch %u out of range (1..4096)",
                      block_tokens, max_batch);
        return EPD_ERR_INVALID_PARAM;
    }
    e = epd_calloc(1, sizeof(*e));
    if (e == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    memset(&where, 0, sizeof(where));
    status = epd_hf_hparams_load(config->model_dir, &e->hp);
    if (status != EPD_OK) {
        goto err;
    }
    max_context = e->hp.max_context;
    if (config->max_context != 0 && config->max_context < max_context) {
        max_context = config->max_context;
    }
    status = epd_hf_open_files(e, config->model_dir, &where);
    if (status != EPD_OK) {
        goto err;
    }
    set = json_object();
    if (set == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err;
    }
    status = epd_hf_bind(e, &where, set);
    if (status == EPD_OK) {
        status = epd_hf_check_consumed(e, &where, set);
    }
    if (status == EPD_OK) {
        status = epd_hf_digest(e, config->model_dir);
    }
    if (status != EPD_OK) {
        goto err;
    }
    qd = (size_t)e->hp.n_heads * e->hp.head_dim;
    kvd = (size_t)e->hp.n_kv_heads * e->hp.head_dim;
    ffn = e->hp.ffn > e->hp.moe_ffn ? e->hp.ffn : e->hp.moe_ffn;
    e->inv_freq = epd_calloc(e->hp.head_dim / 2, sizeof(double));
    e->d_x = epd_calloc((size_t)max_batch * e->hp.dim, sizeof(float));
    e->d_h = epd_calloc((size_t)max_batch * e->hp.dim, sizeof(float));
    e->d_q = epd_calloc((size_t)max_batch * qd, sizeof(float));
    e->d_k = epd_calloc((size_t)max_batch * kvd, sizeof(float));
    e->d_v = epd_calloc((size_t)max_batch * kvd, sizeof(float));
    e->d_o = epd_calloc((size_t)max_batch * qd, sizeof(float));
    e->d_g = epd_calloc((size_t)max_batch * ffn, sizeof(float));
    e->d_u = epd_calloc((size_t)max_batch * ffn, sizeof(float));
    e->d_scores = epd_calloc(max_context, sizeof(float));
    e->d_cos = epd_calloc((size_t)max_batch * e->hp.head_dim / 2, sizeof(float));
    e->d_sin = epd_calloc((size_t)max_batch * e->hp.head_dim / 2, sizeof(float));
    e->m_logit = epd_calloc(e->hp.n_experts ? e->hp.n_experts : 1, sizeof(float));
    e->m_y = epd_calloc(2 * (size_t)e->hp.dim, sizeof(float));
    if (e->inv_freq == NULL || e->d_x == NULL || e->d_h == NULL || e->d_q == NULL ||
        e->d_k == NULL || e->d_v == NULL || e->d_o == NULL || e->d_g == NULL || e->d_u == NULL ||
        e->d_scores == NULL || e->d_cos == NULL || e->d_sin == NULL || e->m_logit == NULL ||
        e->m_y == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto err;
    }
    epd_hf_inv_freq(e);
    epd_hf_fill_info(e, block_tokens, max_batch, max_context);
    status = epd_kvq_layout_set(&e->info.kv, config->kv_dtype, EPD_HF_LOG);
    if (status != EPD_OK) {
        goto err;
    }
    epd_log_debug(EPD_HF_LOG, 0,
                  "%s: %s, %u layers, dim %u, %u heads / %u kv heads of %u, ffn %u, experts %u "
                  "(top %u of %u), vocab %u, context %u, %u weight file(s)",
                  config->model_dir, epd_hf_arch_class(e->hp.arch), e->hp.n_layers, e->hp.dim,
                  e->hp.n_heads, e->hp.n_kv_heads, e->hp.head_dim, e->hp.ffn, e->hp.n_experts,
                  e->hp.top_k, e->hp.moe_ffn, e->hp.vocab, max_context, e->n_files);
    json_decref(set);
    epd_hf_where_free(&where);
    *impl_p = e;
    return EPD_OK;

err:
    json_decref(set);
    epd_hf_where_free(&where);
    epd_hf_close(e);
    return status;
}
