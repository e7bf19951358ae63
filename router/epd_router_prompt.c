/*
 * epd_router_prompt.c — a request's prompt as token ids: text through the
 * model folder's tokenizer (BOS as epd-generate adds it), token-id prompts
 * checked against the vocabulary and the context, a chat through the
 * model's own template (engine/epd_chat.h, as epd-tokenize --chat --ids
 * gives it), and the placeholder tokens of each image where it stands.
 * The ids go to rt->tok_scratch.
 *
 * Below the routes that need ids (epd_router_api.c: generation requests;
 * epd_router_tok.c: /tokenize), which call it; it calls neither.
 */
#include <stdio.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_router_int.h"

int epd__router_tokenize(epd_router_t *rt, const char *text, size_t len, size_t *n_p)
{
    size_t cap = len + 2;
    epd_status_t st;

    for (;;) {
        if (rt->tok_scratch_cap < cap) {
            int32_t *p = epd_realloc(rt->tok_scratch, cap * sizeof(*p));

            if (p == NULL) {
                return -1;
            }
            rt->tok_scratch = p;
            rt->tok_scratch_cap = cap;
        }
        st = epd_engine_tokenize(rt->engine, text, len, 1, rt->tok_scratch, rt->tok_scratch_cap,
                                 n_p);
        if (st != EPD_ERR_TOO_LONG) {
            return st == EPD_OK ? 0 : -1;
        }
        cap = rt->tok_scratch_cap * 2;
    }
}

/* A prompt of token ids: checked against the vocabulary and the context
 * (before anything is copied: 100k ids cost one pass), then copied into
 * rt->tok_scratch as tokenizing would.  0, or -1 with *err filled. */
int epd__router_prompt_ids(epd_router_t *rt, const epd_oai_request_t *oai, size_t *n_p,
                           epd_oai_error_t *err)
{
    size_t n = oai->n_prompt_ids;

    if (n >= rt->info->max_context) {
        epd_oai_error_set(err, 400, "prompt", "context_length_exceeded",
                          "This model's maximum context length is %u tokens. However, your "
                          "prompt is %zu tokens, which leaves no room for a completion.",
                          rt->info->max_context, n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (oai->prompt_ids[i] >= rt->info->vocab_size) {
            epd_oai_error_set(err, 400, "prompt", NULL,
                              "'prompt[%zu]' is %u: this model's token ids are 0 to %u.", i,
                              oai->prompt_ids[i], rt->info->vocab_size - 1);
            return -1;
        }
    }
    if (rt->tok_scratch_cap < n) {
        int32_t *p = epd_realloc(rt->tok_scratch, n * sizeof(*p));

        if (p == NULL) {
            epd_oai_error_set(err, 500, NULL, NULL, "The server is out of memory.");
            return -1;
        }
        rt->tok_scratch = p;
        rt->tok_scratch_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        rt->tok_scratch[i] = (int32_t)oai->prompt_ids[i];
    }
    *n_p = n;
    return 0;
}

/* A chat request through the model's own template (rt->chat): the
 * messages rendered into rt->chat_prompt, whose length *len_p is, for the
 * byte bound, what tokenizing reads.  0, or -1 out of memory. */
int epd__router_render_chat(epd_router_t *rt, const epd_oai_request_t *oai, size_t *len_p)
{
    epd_chat_options_t opt;

    if (rt->chat_msgs_cap < oai->n_msgs) {
        epd_chat_message_t *m = epd_realloc(rt->chat_msgs, oai->n_msgs * sizeof(*m));

        if (m == NULL) {
            return -1;
        }
        rt->chat_msgs = m;
        rt->chat_msgs_cap = oai->n_msgs;
    }
    for (size_t i = 0; i < oai->n_msgs; i++) {
        const epd_oai_msg_t *om = &oai->msgs[i];
        epd_chat_message_t *m = &rt->chat_msgs[i];

        m->role = oai->prompt + om->role_off;
        m->role_len = om->role_len;
        m->content = oai->prompt + om->content_off;
        m->content_len = om->content_len;
        m->reasoning = NULL;
        m->reasoning_len = 0;
    }
    epd_chat_options_init(&opt);
    opt.add_generation_prompt = oai->add_generation_prompt;
    opt.enable_thinking = oai->enable_thinking;
    if (epd_chat_render(rt->chat, rt->chat_msgs, oai->n_msgs, &opt, &rt->chat_prompt) != EPD_OK) {
        return -1;
    }
    *len_p = rt->chat_prompt.len;
    return 0;
}

/* The ids of rt->chat_prompt: the template's special tokens one id each,
 * a user's text that spells one plain text (epd_chat_tokenize), nothing
 * added (the template wrote the bos it wants).  The loop thread is the
 * router's only encoder, so the engine's tokenizer is used directly.
 * 0, or -1. */
int epd__router_tokenize_chat(epd_router_t *rt, size_t *n_p)
{
    epd_tokenizer_t *tok = (epd_tokenizer_t *)epd_engine_tokenizer(rt->engine);
    size_t cap = rt->chat_prompt.len + 2;
    epd_status_t st;

    for (;;) {
        if (rt->tok_scratch_cap < cap) {
            int32_t *p = epd_realloc(rt->tok_scratch, cap * sizeof(*p));

            if (p == NULL) {
                return -1;
            }
            rt->tok_scratch = p;
            rt->tok_scratch_cap = cap;
        }
        st = epd_chat_tokenize(&rt->chat_prompt, tok, rt->tok_scratch, rt->tok_scratch_cap, n_p);
        if (st != EPD_ERR_TOO_LONG) {
            return st == EPD_OK ? 0 : -1;
        }
        cap = *n_p;
    }
}

/* The prompt of a request with images: BOS, the text before image 0, its
 * image_embeddings placeholder tokens, the text up to image 1, ... (as
 * epd_engine_tokenize_images does with "<|image|>" markers, so the tokens
 * equal epd-generate's for the same template text with a marker where
 * each image stands).  img_pos[k] gets image k's first placeholder.
 * 0, or -1 out of memory. */
int epd__router_tokenize_images(epd_router_t *rt, const epd_oai_request_t *oai, uint32_t *img_pos,
                                size_t *n_p)
{
    size_t per = rt->info->image_embeddings;
    size_t cap = oai->prompt_len + 1 + oai->n_images * per;
    size_t n = 0, done = 0;

    if (rt->tok_scratch_cap < cap) {
        int32_t *p = epd_realloc(rt->tok_scratch, cap * sizeof(*p));

        if (p == NULL) {
            return -1;
        }
        rt->tok_scratch = p;
        rt->tok_scratch_cap = cap;
    }
    for (size_t k = 0; k <= oai->n_images; k++) {
        size_t end = k < oai->n_images ? oai->images[k].prompt_offset : oai->prompt_len;
        size_t got = 0;

        if (epd_engine_tokenize(rt->engine, oai->prompt + done, end - done, k == 0,
                                rt->tok_scratch + n, cap - n, &got) != EPD_OK) {
            return -1;
        }
        n += got;
        done = end;
        if (k < oai->n_images) {
            img_pos[k] = (uint32_t)n;
            for (size_t i = 0; i < per; i++) {
                rt->tok_scratch[n++] = rt->info->image_token;
            }
        }
    }
    *n_p = n;
    return 0;
}

int epd__router_tokenize_chat_request(epd_router_t *rt, const epd_oai_request_t *oai, size_t *n_p)
{
    size_t len;

    if (oai->n_images > 0) {
        return -1;
    }
    if (rt->chat != NULL) {
        return epd__router_render_chat(rt, oai, &len) != 0 ? -1
                                                           : epd__router_tokenize_chat(rt, n_p);
    }
    return epd__router_tokenize(rt, oai->prompt, oai->prompt_len, n_p);
}
