/*
 * epd_chat.h — the chat templates of the built-in model families, written
 * in C: a conversation (role, content) to the prompt the model was tuned
 * on, byte for byte what Hugging Face transformers' apply_chat_template
 * renders with the family's real Jinja template (tests/tokenizer/
 * test_chat_oracle.sh proves it against jinja2 and @huggingface/jinja).
 *
 * Built in (the name is what --chat-template takes):
 *   chatml    Qwen2.5's ChatML: <|im_start|>role\n...<|im_end|>\n, and
 *             Qwen2.5's default system message when the first message is
 *             not a system one; role "tool" is wrapped in <tool_response>
 *             as the template does
 *   qwen3     Qwen3's: a past assistant turn's <think>...</think> is
 *             dropped before the last user query and kept after it (or
 *             taken from reasoning_content); enable_thinking = 0 adds the
 *             empty think block to the generation prompt
 *   llama3    Llama-3's: bos, <|start_header_id|>role<|end_header_id|>\n\n
 *             content.strip() <|eot_id|>
 *   llama3.2  Llama-3.1/3.2's: the system header with "Cutting Knowledge
 *             Date: December 2023" and "Today Date: DD Mon YYYY"
 * The template is recognised by the exact text of tokenizer_config.json's
 * chat_template (a string, or the "default" of a list of {name,
 * template}) or of chat_template.jinja beside it: a text that is none of
 * the known ones is refused, naming the built-in families, unless a name
 * overrides the choice.  Tools
 * (tool_calls, a tools list) are not rendered: the templates' tool-less
 * path only.
 *
 * The output is SEGMENTS over one text buffer: special tokens the template
 * writes (one id each), the template's other text, and message content.
 * Tokenizing keeps a user's "<|im_start|>" as plain text
 * (EPD_TOKENIZE_SPECIAL_AS_TEXT) while the template's own specials are one
 * id each; text between two template specials is encoded as one run, as
 * Hugging Face encodes the rendered string, so the ids equal
 * apply_chat_template(tokenize=True)'s whenever no content spells a
 * special token.
 *
 * Threads: a template is immutable after creation; any thread.
 */
#ifndef EPD_CHAT_H
#define EPD_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"
#include "epd_tokenizer.h"

typedef enum {
    EPD_CHAT_CHATML = 0, /* Qwen2.5 */
    EPD_CHAT_QWEN3 = 1,
    EPD_CHAT_LLAMA3 = 2,
    EPD_CHAT_LLAMA3_2 = 3,
} epd_chat_family_t;

/* The names --chat-template takes, for messages: "chatml, qwen3, llama3,
 * llama3.2". */
#define EPD_CHAT_NAMES "chatml (Qwen2/Qwen2.5), qwen3, llama3, llama3.2"

typedef struct epd_chat_template epd_chat_template_t;

/* Reads DIR/tokenizer_config.json (borrowed path) and picks its template
 * (DIR/chat_template.jinja instead when there, as transformers loads it);
 * `name` (borrowed; NULL: recognise the template text) overrides the
 * choice.  *t_p is owned by the caller (epd_chat_destroy).  Statuses:
 * EPD_ERR_NOT_FOUND no template text and no name given (the caller
 * decides; nothing logged);
 * EPD_ERR_UNSUPPORTED a chat_template that is none of the built-in ones;
 * EPD_ERR_INVALID_PARAM an unknown name; EPD_ERR_MALFORMED not JSON;
 * EPD_ERR_NO_MEMORY.  Each error but NOT_FOUND logs one line saying why. */
epd_status_t epd_chat_load(const char *dir, const char *name, epd_chat_template_t **t_p);

/* As epd_chat_load, from the text of a tokenizer_config.json in
 * config[0..len) (borrowed); config NULL: none (a name is then required). */
epd_status_t epd_chat_create(const char *config, size_t len, const char *name,
                             epd_chat_template_t **t_p);

/* NULL is a no-op. */
void epd_chat_destroy(epd_chat_template_t *t);

/* "chatml", "qwen3", "llama3" or "llama3.2" (static). */
const char *epd_chat_name(const epd_chat_template_t *t);
epd_chat_family_t epd_chat_family(const epd_chat_template_t *t);

/* One message; all borrowed, any bytes (not NUL-terminated). */
typedef struct {
    const char *role;
    size_t role_len;
    const char *content;
    size_t content_len;
    /* Qwen3's reasoning_content of an assistant turn; NULL: absent */
    const char *reasoning;
    size_t reasoning_len;
} epd_chat_message_t;

typedef struct {
    int add_generation_prompt; /* 1: end with the assistant header */
    int enable_thinking;       /* Qwen3; 1 (the default) or 0 */
    /* llama3.2's "Today Date" (borrowed, e.g. "26 Jul 2024"); NULL: today,
     * local time, as transformers' strftime_now("%d %b %Y") */
    const char *date;
} epd_chat_options_t;

/* Hugging Face's defaults: a generation prompt, thinking on, today. */
void epd_chat_options_init(epd_chat_options_t *opt);

typedef enum {
    EPD_CHAT_SEG_SPECIAL = 0, /* a special token of the template: one id */
    EPD_CHAT_SEG_TEXT = 1,    /* the template's other text */
    EPD_CHAT_SEG_CONTENT = 2, /* from a message: special tokens are plain text */
} epd_chat_seg_kind_t;

typedef struct {
    epd_chat_seg_kind_t kind;
    size_t off, len; /* into the prompt's text */
} epd_chat_seg_t;

/* A rendered prompt: text[0..len) is the whole string (NUL-terminated;
 * content may itself hold NULs), segs[0..n_segs) cut it in order.  Owned
 * by the caller: epd_chat_prompt_free. */
typedef struct {
    char *text;
    size_t len, cap;
    epd_chat_seg_t *segs;
    size_t n_segs, segs_cap;
} epd_chat_prompt_t;

/* Renders msgs[0..n) (borrowed; n >= 1) into *out (zeroed by the caller or
 * a prompt to reuse: its old content is dropped).  EPD_ERR_INVALID_PARAM
 * for no messages; EPD_ERR_NO_MEMORY. */
epd_status_t epd_chat_render(const epd_chat_template_t *t, const epd_chat_message_t *msgs, size_t n,
                             const epd_chat_options_t *opt, epd_chat_prompt_t *out);

/* Frees what the prompt holds and zeroes it; NULL is a no-op. */
void epd_chat_prompt_free(epd_chat_prompt_t *p);

/* The ids of a rendered prompt into ids[0..cap) (the caller's), *n_p their
 * number: each SPECIAL segment is its token's id (a text that is no token
 * of tok is encoded as text with its special tokens parsed), the TEXT and
 * CONTENT between two specials one run encoded with
 * EPD_TOKENIZE_SPECIAL_AS_TEXT.  Nothing else is added (the template wrote
 * the bos it wants).  EPD_ERR_TOO_LONG when they do not fit (*n_p = the
 * number needed; ids[0..cap) may be partly written); EPD_ERR_NO_MEMORY. */
epd_status_t epd_chat_tokenize(const epd_chat_prompt_t *p, epd_tokenizer_t *tok, int32_t *ids,
                               size_t cap, size_t *n_p);

#endif
