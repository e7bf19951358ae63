/*
 * epd_tokenizer_json.c — the pipeline parts of a tokenizer.json: the model's
 * options, normalizer, pre-tokenizer, post-processor and decoder, each
 * checked against what epd_tokenizer.h supports and turned into the
 * tokenizer's step lists (the vocabulary, merges and added tokens are
 * epd_tokenizer.c's).  Anything else is refused by name.
 */
#include <string.h>

#include "epd_log.h"
#include "epd_tokenizer_int.h"

#define EPD_TOK_LOG "tokenizer"

static int epd_tok_is(const json_t *obj, const char *key, const char *want)
{
    const char *v = json_string_value(json_object_get(obj, key));

    return v != NULL && strcmp(v, want) == 0;
}

int epd__tok_flag(const json_t *obj, const char *key)
{
    return json_is_true(json_object_get(obj, key));
}

epd_status_t epd__tok_unsupported(const char *what, const char *name)
{
    epd_log_error(EPD_TOK_LOG, 0, "tokenizer.json: unsupported %s '%s'", what,
                  name != NULL ? name : "(none)");
    return EPD_ERR_UNSUPPORTED;
}

epd_status_t epd__tok_malformed(const char *what)
{
    epd_log_error(EPD_TOK_LOG, 0, "tokenizer.json: %s", what);
    return EPD_ERR_MALFORMED;
}

static epd_status_t epd_tok_parse_normalizer(epd_tokenizer_t *tok, const json_t *n)
{
    const char *type;

    if (n == NULL || json_is_null(n)) {
        return EPD_OK;
    }
    type = json_string_value(json_object_get(n, "type"));
    if (type == NULL) {
        return epd__tok_malformed("normalizer without a type");
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(n, "normalizers");
        size_t i;
        const json_t *item;

        if (!json_is_array(list)) {
            return epd__tok_malformed("normalizer Sequence without 'normalizers'");
        }
        json_array_foreach(list, i, item)
        {
            epd_status_t status = epd_tok_parse_normalizer(tok, item);

            if (status != EPD_OK) {
                return status;
            }
        }
        return EPD_OK;
    }
    if (tok->n_norm == EPD_TOK_MAX_NORM) {
        return epd__tok_unsupported("normalizer count", ">8");
    }
    if (strcmp(type, "NFC") == 0) {
        tok->norm[tok->n_norm++] = EPD_TOK_NORM_NFC;
    } else if (strcmp(type, "NFD") == 0) {
        tok->norm[tok->n_norm++] = EPD_TOK_NORM_NFD;
    } else if (strcmp(type, "NFKC") == 0) {
        tok->norm[tok->n_norm++] = EPD_TOK_NORM_NFKC;
    } else if (strcmp(type, "NFKD") == 0) {
        tok->norm[tok->n_norm++] = EPD_TOK_NORM_NFKD;
    } else {
        return epd__tok_unsupported("normalizer", type);
    }
    return EPD_OK;
}

static epd_status_t epd_tok_compile(const char *pattern, size_t len, OnigRegex *re_p)
{
    OnigErrorInfo einfo;
    int r;

    /* ONIG_SYNTAX_DEFAULT (Ruby) and no options: what the Rust crate's
     * onig::Regex::new compiles with */
    r = onig_new(re_p, (const OnigUChar *)pattern, (const OnigUChar *)pattern + len,
                 ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &einfo);
    if (r != ONIG_NORMAL) {
        OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];

        onig_error_code_to_str(msg, r, &einfo);
        epd_log_error(EPD_TOK_LOG, 0, "tokenizer.json: pattern does not compile: %s", msg);
        *re_p = NULL;
        return EPD_ERR_MALFORMED;
    }
    return EPD_OK;
}

static epd_status_t epd_tok_parse_behavior(const json_t *pre, epd_tok_behavior_t *b_p)
{
    static const struct {
        const char *name;
        epd_tok_behavior_t b;
    } names[] = {
        {"Removed", EPD_TOK_SPLIT_REMOVED},
        {"Isolated", EPD_TOK_SPLIT_ISOLATED},
        {"MergedWithPrevious", EPD_TOK_SPLIT_MERGED_WITH_PREVIOUS},
        {"MergedWithNext", EPD_TOK_SPLIT_MERGED_WITH_NEXT},
        {"Contiguous", EPD_TOK_SPLIT_CONTIGUOUS},
    };
    const char *v = json_string_value(json_object_get(pre, "behavior"));

    for (size_t i = 0; v != NULL && i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(v, names[i].name) == 0) {
            *b_p = names[i].b;
            return EPD_OK;
        }
    }
    return epd__tok_unsupported("Split behavior", v);
}

static epd_status_t epd_tok_parse_pre(epd_tokenizer_t *tok, const json_t *p)
{
    const char *type;
    epd_tok_pre_t *pre;
    epd_status_t status;

    if (p == NULL || json_is_null(p)) {
        return EPD_OK;
    }
    type = json_string_value(json_object_get(p, "type"));
    if (type == NULL) {
        return epd__tok_malformed("pre_tokenizer without a type");
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(p, "pretokenizers");
        size_t i;
        const json_t *item;

        if (!json_is_array(list)) {
            return epd__tok_malformed("pre_tokenizer Sequence without 'pretokenizers'");
        }
        json_array_foreach(list, i, item)
        {
            status = epd_tok_parse_pre(tok, item);
            if (status != EPD_OK) {
                return status;
            }
        }
        return EPD_OK;
    }
    if (tok->n_pre == EPD_TOK_MAX_PRE) {
        return epd__tok_unsupported("pre_tokenizer count", ">8");
    }
    /* ByteLevel turns the text into its byte-level characters: a step after
     * it would see those, which this tokenizer (working on bytes) does not
     * model */
    if (tok->n_pre > 0 && tok->pre[tok->n_pre - 1].kind == EPD_TOK_PRE_BYTELEVEL) {
        return epd__tok_unsupported("pre_tokenizer after ByteLevel", type);
    }
    pre = &tok->pre[tok->n_pre];
    memset(pre, 0, sizeof(*pre));
    if (strcmp(type, "Split") == 0) {
        const json_t *pat = json_object_get(p, "pattern");
        const json_t *rx = json_object_get(pat, "Regex");
        const json_t *lit = json_object_get(pat, "String");

        pre->kind = EPD_TOK_PRE_SPLIT;
        status = epd_tok_parse_behavior(p, &pre->behavior);
        if (status != EPD_OK) {
            return status;
        }
        pre->invert = (uint8_t)epd__tok_flag(p, "invert");
        if (json_is_string(rx)) {
            status = epd_tok_compile(json_string_value(rx), json_string_length(rx), &pre->re);
        } else if (json_is_string(lit)) {
            status = epd__tok_pool_add(tok, json_string_value(lit), json_string_length(lit),
                                       &pre->literal);
        } else {
            status = epd__tok_malformed("Split without a Regex or String pattern");
        }
        if (status != EPD_OK) {
            return status;
        }
    } else if (strcmp(type, "ByteLevel") == 0) {
        pre->kind = EPD_TOK_PRE_BYTELEVEL;
        pre->add_prefix_space = (uint8_t)epd__tok_flag(p, "add_prefix_space");
        /* use_regex defaults to true in the Rust crate */
        if (!json_is_false(json_object_get(p, "use_regex"))) {
            status =
                epd_tok_compile(epd__tok_gpt2_pattern, strlen(epd__tok_gpt2_pattern), &pre->re);
            if (status != EPD_OK) {
                return status;
            }
        }
    } else {
        return epd__tok_unsupported("pre_tokenizer", type);
    }
    tok->n_pre++;
    return EPD_OK;
}

static epd_status_t epd_tok_post_add(int32_t *ids, size_t *n, const json_t *list)
{
    size_t i;
    const json_t *v;

    json_array_foreach(list, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= EPD_TOK_MAX_IDS) {
            return epd__tok_malformed("TemplateProcessing: a special token's id is not an id");
        }
        if (*n == EPD_TOK_MAX_POST_IDS) {
            return epd__tok_unsupported("TemplateProcessing length", ">16 ids");
        }
        ids[(*n)++] = (int32_t)json_integer_value(v);
    }
    return EPD_OK;
}

/* TemplateProcessing's `single`: ids before $A go first, those after it
 * last.  A template inside a Sequence wraps what the earlier ones made. */
static epd_status_t epd_tok_parse_template(epd_tokenizer_t *tok, const json_t *p)
{
    const json_t *single = json_object_get(p, "single");
    const json_t *specials = json_object_get(p, "special_tokens");
    int32_t pre[EPD_TOK_MAX_POST_IDS], post[EPD_TOK_MAX_POST_IDS];
    size_t n_pre = 0, n_post = 0;
    int seen_a = 0;
    size_t i;
    const json_t *item;
    epd_status_t status;

    if (!json_is_array(single)) {
        return epd__tok_malformed("TemplateProcessing without 'single'");
    }
    json_array_foreach(single, i, item)
    {
        const json_t *sp = json_object_get(item, "SpecialToken");
        const json_t *seq = json_object_get(item, "Sequence");

        if (json_is_object(seq)) {
            if (!epd_tok_is(seq, "id", "A") || seen_a) {
                return epd__tok_unsupported("TemplateProcessing single sequence",
                                            json_string_value(json_object_get(seq, "id")));
            }
            seen_a = 1;
        } else if (json_is_object(sp)) {
            const char *name = json_string_value(json_object_get(sp, "id"));
            const json_t *def = name != NULL ? json_object_get(specials, name) : NULL;
            const json_t *ids = json_object_get(def, "ids");

            if (!json_is_array(ids)) {
                return epd__tok_malformed("TemplateProcessing: a special token is not defined");
            }
            status =
                seen_a ? epd_tok_post_add(post, &n_post, ids) : epd_tok_post_add(pre, &n_pre, ids);
            if (status != EPD_OK) {
                return status;
            }
        } else {
            return epd__tok_malformed("TemplateProcessing: an item is neither a token nor $A");
        }
    }
    if (!seen_a) {
        return epd__tok_malformed("TemplateProcessing single without $A");
    }
    if (n_pre + tok->n_post_prefix > EPD_TOK_MAX_POST_IDS ||
        n_post + tok->n_post_suffix > EPD_TOK_MAX_POST_IDS) {
        return epd__tok_unsupported("TemplateProcessing length", ">16 ids");
    }
    memmove(tok->post_prefix + n_pre, tok->post_prefix, tok->n_post_prefix * sizeof(int32_t));
    memcpy(tok->post_prefix, pre, n_pre * sizeof(int32_t));
    tok->n_post_prefix += n_pre;
    memcpy(tok->post_suffix + tok->n_post_suffix, post, n_post * sizeof(int32_t));
    tok->n_post_suffix += n_post;
    return EPD_OK;
}

static epd_status_t epd_tok_parse_post(epd_tokenizer_t *tok, const json_t *p)
{
    const char *type;

    if (p == NULL || json_is_null(p)) {
        return EPD_OK;
    }
    type = json_string_value(json_object_get(p, "type"));
    if (type == NULL) {
        return epd__tok_malformed("post_processor without a type");
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(p, "processors");
        size_t i;
        const json_t *item;

        if (!json_is_array(list)) {
            return epd__tok_malformed("post_processor Sequence without 'processors'");
        }
        json_array_foreach(list, i, item)
        {
            epd_status_t status = epd_tok_parse_post(tok, item);

            if (status != EPD_OK) {
                return status;
            }
        }
        return EPD_OK;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        return EPD_OK; /* it moves offsets only: no ids */
    }
    if (strcmp(type, "TemplateProcessing") == 0) {
        return epd_tok_parse_template(tok, p);
    }
    return epd__tok_unsupported("post_processor", type);
}

static epd_status_t epd_tok_check_decoder(const json_t *d)
{
    const char *type = json_string_value(json_object_get(d, "type"));

    if (type != NULL && strcmp(type, "ByteLevel") == 0) {
        return EPD_OK;
    }
    return epd__tok_unsupported("decoder", type);
}

static epd_status_t epd_tok_check_model(const json_t *m)
{
    const char *type = json_string_value(json_object_get(m, "type"));
    const char *csp = json_string_value(json_object_get(m, "continuing_subword_prefix"));
    const char *ews = json_string_value(json_object_get(m, "end_of_word_suffix"));
    const json_t *dropout = json_object_get(m, "dropout");

    if (!json_is_object(m)) {
        return epd__tok_malformed("no model");
    }
    if (type != NULL && strcmp(type, "BPE") != 0) {
        return epd__tok_unsupported("model", type);
    }
    if (csp != NULL && csp[0] != '\0') {
        return epd__tok_unsupported("BPE continuing_subword_prefix", csp);
    }
    if (ews != NULL && ews[0] != '\0') {
        return epd__tok_unsupported("BPE end_of_word_suffix", ews);
    }
    if (epd__tok_flag(m, "byte_fallback")) {
        return epd__tok_unsupported("BPE option", "byte_fallback");
    }
    if (dropout != NULL && !json_is_null(dropout) &&
        !(json_is_number(dropout) && json_number_value(dropout) == 0.0)) {
        return epd__tok_unsupported("BPE option", "dropout");
    }
    return EPD_OK;
}

epd_status_t epd__tok_parse_pipeline(epd_tokenizer_t *tok, const json_t *root)
{
    epd_status_t status;

    status = epd_tok_check_model(json_object_get(root, "model"));
    if (status == EPD_OK) {
        status = epd_tok_check_decoder(json_object_get(root, "decoder"));
    }
    if (status == EPD_OK) {
        status = epd_tok_parse_normalizer(tok, json_object_get(root, "normalizer"));
    }
    if (status == EPD_OK) {
        status = epd_tok_parse_pre(tok, json_object_get(root, "pre_tokenizer"));
    }
    if (status == EPD_OK) {
        status = epd_tok_parse_post(tok, json_object_get(root, "post_processor"));
    }
    if (status == EPD_OK &&
        (tok->n_pre == 0 || tok->pre[tok->n_pre - 1].kind != EPD_TOK_PRE_BYTELEVEL)) {
        status = epd__tok_unsupported("pre_tokenizer", "without ByteLevel (not a byte-level BPE)");
    }
    return status;
}
