/*
 * epd_tokenize.c — `epd-tokenize --model DIR [--add-special]
 * [--special-as-text] [--decode | --decode-bytes] [--skip-special]`: the
 * tokenizer of a Hugging Face model folder (DIR/tokenizer.json, and
 * DIR/tokenizer_config.json when there) as a line filter.
 *
 * Encoding (the default), one line in, one line out:
 *   in:  a JSON string ("Hello"), or a JSON array of byte values
 *        ([72, 255]) for bytes that are not UTF-8
 *   out: a JSON array of ids: the text's own ids, nothing added unless
 *        --add-special (the post-processor: Llama-3's <|begin_of_text|>)
 * Decoding (--decode, --decode-bytes):
 *   in:  a JSON array of ids
 *   out: --decode: a JSON string; bytes that are not valid UTF-8 become
 *        U+FFFD, one per maximal invalid sequence (the Rust decoder's
 *        from_utf8_lossy); it runs the streaming decoder, id by id
 *        --decode-bytes: a JSON array of the byte values, lossless
 * Chat (--chat): the model's chat template (engine/epd_chat.h)
 *   in:  a JSON array of messages, each {"role": string, "content":
 *        string} (an assistant's "reasoning_content": string is Qwen3's)
 *   out: the rendered prompt as a JSON string, or with --ids the ids
 *        the router sends for it (template specials one id each, content
 *        with its special-token text as plain text)
 *   --no-generation-prompt, --enable-thinking 0|1 (Qwen3; default 1),
 *   --chat-template NAME (override the recognised template), --date STR
 *   (llama3.2's "Today Date"; default today)
 * A blank line is skipped; a line that is not what the mode reads ends the
 * run: exit 1, naming it.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_chat.h"
#include "epd_log.h"
#include "epd_tokenizer.h"
#include "epd_utf8.h"

typedef struct {
    const char *model;
    unsigned encode_flags;
    unsigned decode_flags;
    int decode; /* 1: --decode, 2: --decode-bytes */
    int chat;   /* 1: --chat, 2: --chat --ids */
    const char *chat_template;
    epd_chat_options_t chat_opt;
} epd_tkz_args_t;

/* reusable output buffers */
typedef struct {
    int32_t *ids;
    size_t ids_cap;
    char *bytes;
    size_t bytes_cap;
    char *text;
    size_t text_cap;
    epd_chat_message_t *msgs;
    size_t msgs_cap;
} epd_tkz_buf_t;

static void epd_tkz_usage(FILE *f)
{
    fprintf(f, "usage: epd-tokenize --model DIR [--add-special] [--special-as-text]\n"
               "                    [--decode | --decode-bytes] [--skip-special]\n"
               "  Reads one JSON value per line on stdin, writes one per line on stdout.\n"
               "  encode (default): a JSON string, or an array of byte values -> an array of ids\n"
               "  --add-special     apply the post-processor (e.g. Llama-3's <|begin_of_text|>)\n"
               "  --special-as-text special tokens typed in the text are plain text\n"
               "  --decode          an array of ids -> a JSON string (invalid UTF-8 as U+FFFD)\n"
               "  --decode-bytes    an array of ids -> an array of byte values (lossless)\n"
               "  --skip-special    decoding leaves special tokens out\n"
               "  --chat            a JSON array of messages {role, content} -> the prompt the\n"
               "                    model's chat template renders, as a JSON string\n"
               "  --ids             with --chat: the prompt's ids instead\n"
               "  --no-generation-prompt   no assistant header at the end\n"
               "  --enable-thinking 0|1    Qwen3's enable_thinking (default 1)\n"
               "  --chat-template NAME     " EPD_CHAT_NAMES "\n"
               "  --date STR        llama3.2's \"Today Date\" (default today, \"%%d %%b %%Y\")\n");
}

static int epd_tkz_parse(int argc, char **argv, epd_tkz_args_t *a)
{
    int ids = 0;

    memset(a, 0, sizeof(*a));
    epd_chat_options_init(&a->chat_opt);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            a->model = argv[++i];
        } else if (strcmp(argv[i], "--add-special") == 0) {
            a->encode_flags |= EPD_TOKENIZE_ADD_SPECIAL;
        } else if (strcmp(argv[i], "--special-as-text") == 0) {
            a->encode_flags |= EPD_TOKENIZE_SPECIAL_AS_TEXT;
        } else if (strcmp(argv[i], "--decode") == 0) {
            a->decode = 1;
        } else if (strcmp(argv[i], "--decode-bytes") == 0) {
            a->decode = 2;
        } else if (strcmp(argv[i], "--chat") == 0) {
            a->chat = 1;
        } else if (strcmp(argv[i], "--ids") == 0) {
            ids = 1;
        } else if (strcmp(argv[i], "--no-generation-prompt") == 0) {
            a->chat_opt.add_generation_prompt = 0;
        } else if (strcmp(argv[i], "--enable-thinking") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "0") == 0 || strcmp(argv[i + 1], "1") == 0)) {
            a->chat_opt.enable_thinking = argv[++i][0] == '1';
        } else if (strcmp(argv[i], "--chat-template") == 0 && i + 1 < argc) {
            a->chat_template = argv[++i];
        } else if (strcmp(argv[i], "--date") == 0 && i + 1 < argc) {
            a->chat_opt.date = argv[++i];
        } else if (strcmp(argv[i], "--skip-special") == 0) {
            a->decode_flags |= EPD_DETOKENIZE_SKIP_SPECIAL;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            epd_tkz_usage(stdout);
            return 2;
        } else {
            fprintf(stderr, "epd-tokenize: unknown or incomplete argument '%s'\n", argv[i]);
            epd_tkz_usage(stderr);
            return 1;
        }
    }
    if (ids && !a->chat) {
        fprintf(stderr, "epd-tokenize: --ids goes with --chat\n");
        return 1;
    }
    if (a->chat && a->decode) {
        fprintf(stderr, "epd-tokenize: --chat encodes; it does not go with --decode\n");
        return 1;
    }
    a->chat += ids;
    if (a->model == NULL) {
        fprintf(stderr, "epd-tokenize: --model DIR is required\n");
        epd_tkz_usage(stderr);
        return 1;
    }
    return 0;
}

static int epd_tkz_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t n = *cap ? *cap : 256;
    void *q;

    if (need <= *cap) {
        return 0;
    }
    while (n < need) {
        n *= 2;
    }
    q = epd_realloc(*p, n * elem);
    if (q == NULL) {
        return -1;
    }
    *p = q;
    *cap = n;
    return 0;
}

static void epd_tkz_print_ints(const int32_t *v, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++) {
        printf(i ? ",%d" : "%d", v[i]);
    }
    fputs("]\n", stdout);
}

/* One encode line: 0, or 1 after printing why not. */
static int epd_tkz_encode(epd_tokenizer_t *tok, const epd_tkz_args_t *a, json_t *v,
                          epd_tkz_buf_t *b, unsigned long line)
{
    const char *text;
    size_t len, n = 0;
    epd_status_t status;

    if (json_is_string(v)) {
        text = json_string_value(v);
        len = json_string_length(v);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *x;

        len = json_array_size(v);
        if (epd_tkz_grow((void **)&b->bytes, &b->bytes_cap, len + 1, 1) != 0) {
            fprintf(stderr, "epd-tokenize: out of memory\n");
            return 1;
        }
        json_array_foreach(v, i, x)
        {
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 255) {
                fprintf(stderr, "epd-tokenize: line %lu: item %zu is not a byte value 0..255\n",
                        line, i);
                return 1;
            }
            b->bytes[i] = (char)json_integer_value(x);
        }
        text = b->bytes;
    } else {
        fprintf(stderr, "epd-tokenize: line %lu: not a JSON string or array of bytes\n", line);
        return 1;
    }
    status = epd_tokenizer_encode(tok, text, len, a->encode_flags, b->ids, b->ids_cap, &n);
    if (status == EPD_ERR_TOO_LONG) {
        if (epd_tkz_grow((void **)&b->ids, &b->ids_cap, n, sizeof(int32_t)) != 0) {
            fprintf(stderr, "epd-tokenize: out of memory\n");
            return 1;
        }
        status = epd_tokenizer_encode(tok, text, len, a->encode_flags, b->ids, b->ids_cap, &n);
    }
    if (status != EPD_OK) {
        fprintf(stderr, "epd-tokenize: line %lu: %s\n", line, epd_status_string(status));
        return 1;
    }
    epd_tkz_print_ints(b->ids, n);
    return 0;
}

/* One decode line: 0, or 1 after printing why not. */
static int epd_tkz_decode(epd_tokenizer_t *tok, const epd_tkz_args_t *a, json_t *v,
                          epd_tkz_buf_t *b, unsigned long line)
{
    size_t n = json_array_size(v), len = 0, i;
    json_t *x;
    epd_status_t status;

    if (!json_is_array(v)) {
        fprintf(stderr, "epd-tokenize: line %lu: not a JSON array of ids\n", line);
        return 1;
    }
    if (epd_tkz_grow((void **)&b->ids, &b->ids_cap, n + 1, sizeof(int32_t)) != 0) {
        fprintf(stderr, "epd-tokenize: out of memory\n");
        return 1;
    }
    json_array_foreach(v, i, x)
    {
        if (!json_is_integer(x) || json_integer_value(x) < 0 ||
            json_integer_value(x) >= (json_int_t)epd_tokenizer_n_ids(tok)) {
            fprintf(stderr, "epd-tokenize: line %lu: item %zu is not an id of this tokenizer\n",
                    line, i);
            return 1;
        }
        b->ids[i] = (int32_t)json_integer_value(x);
    }
    if (a->decode == 2) {
        status =
            epd_tokenizer_decode(tok, b->ids, n, a->decode_flags, b->bytes, b->bytes_cap, &len);
        if (status == EPD_ERR_TOO_LONG) {
            if (epd_tkz_grow((void **)&b->bytes, &b->bytes_cap, len, 1) != 0) {
                fprintf(stderr, "epd-tokenize: out of memory\n");
                return 1;
            }
            status =
                epd_tokenizer_decode(tok, b->ids, n, a->decode_flags, b->bytes, b->bytes_cap, &len);
        }
        if (status != EPD_OK) {
            fprintf(stderr, "epd-tokenize: line %lu: %s\n", line, epd_status_string(status));
            return 1;
        }
        putchar('[');
        for (size_t k = 0; k < len; k++) {
            printf(k ? ",%u" : "%u", (unsigned)(uint8_t)b->bytes[k]);
        }
        fputs("]\n", stdout);
        return 0;
    } else {
        /* the streaming decoder, id by id: what a server would send */
        epd_tokenizer_stream_t st;
        size_t step = epd_tokenizer_max_token_bytes(tok) + 4;
        size_t rlen = 0;
        json_t *s;
        char *out;

        epd_tokenizer_stream_init(&st, a->decode_flags);
        for (i = 0; i <= n; i++) {
            size_t got = 0;

            if (epd_tkz_grow((void **)&b->bytes, &b->bytes_cap, len + step, 1) != 0) {
                fprintf(stderr, "epd-tokenize: out of memory\n");
                return 1;
            }
            status =
                i < n ? epd_tokenizer_stream_push(tok, &st, b->ids[i], b->bytes + len, step, &got)
                      : epd_tokenizer_stream_finish(&st, b->bytes + len, step, &got);
            if (status != EPD_OK) {
                fprintf(stderr, "epd-tokenize: line %lu: %s\n", line, epd_status_string(status));
                return 1;
            }
            len += got;
        }
        if (epd_tkz_grow((void **)&b->text, &b->text_cap, EPD_UTF8_REPAIR_MAX(len) + 1, 1) != 0) {
            fprintf(stderr, "epd-tokenize: out of memory\n");
            return 1;
        }
        epd_utf8_repair(b->bytes, len, b->text, b->text_cap, &rlen);
        s = json_stringn(b->text, rlen);
        out = s != NULL ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
        if (out == NULL) {
            json_decref(s);
            fprintf(stderr, "epd-tokenize: out of memory\n");
            return 1;
        }
        puts(out);
        free(out);
        json_decref(s);
        return 0;
    }
}

/* The messages of one --chat line into *msgs_p (grown as needed; borrowed
 * from v): 0, or 1 after printing why not. */
static int epd_tkz_messages(json_t *v, epd_chat_message_t **msgs_p, size_t *cap_p,
                            unsigned long line)
{
    size_t i;
    json_t *m;

    if (!json_is_array(v) || json_array_size(v) == 0) {
        fprintf(stderr, "epd-tokenize: line %lu: not a non-empty JSON array of messages\n", line);
        return 1;
    }
    if (epd_tkz_grow((void **)msgs_p, cap_p, json_array_size(v), sizeof(**msgs_p)) != 0) {
        fprintf(stderr, "epd-tokenize: out of memory\n");
        return 1;
    }
    json_array_foreach(v, i, m)
    {
        json_t *role = json_object_get(m, "role");
        json_t *content = json_object_get(m, "content");
        json_t *reasoning = json_object_get(m, "reasoning_content");
        epd_chat_message_t *e = &(*msgs_p)[i];

        if (!json_is_string(role) || !json_is_string(content) ||
            (reasoning != NULL && !json_is_string(reasoning) && !json_is_null(reasoning))) {
            fprintf(stderr,
                    "epd-tokenize: line %lu: message %zu is not {\"role\": string, "
                    "\"content\": string}\n",
                    line, i);
            return 1;
        }
        e->role = json_string_value(role);
        e->role_len = json_string_length(role);
        e->content = json_string_value(content);
        e->content_len = json_string_length(content);
        e->reasoning = json_is_string(reasoning) ? json_string_value(reasoning) : NULL;
        e->reasoning_len = json_is_string(reasoning) ? json_string_length(reasoning) : 0;
    }
    return 0;
}

/* One --chat line: 0, or 1 after printing why not. */
static int epd_tkz_chat(epd_tokenizer_t *tok, const epd_chat_template_t *t, const epd_tkz_args_t *a,
                        json_t *v, epd_tkz_buf_t *b, epd_chat_prompt_t *p, unsigned long line)
{
    size_t n = 0;
    epd_status_t status;

    if (epd_tkz_messages(v, &b->msgs, &b->msgs_cap, line) != 0) {
        return 1;
    }
    status = epd_chat_render(t, b->msgs, json_array_size(v), &a->chat_opt, p);
    if (status == EPD_OK && a->chat == 2) {
        status = epd_chat_tokenize(p, tok, b->ids, b->ids_cap, &n);
        if (status == EPD_ERR_TOO_LONG) {
            if (epd_tkz_grow((void **)&b->ids, &b->ids_cap, n, sizeof(int32_t)) != 0) {
                fprintf(stderr, "epd-tokenize: out of memory\n");
                return 1;
            }
            status = epd_chat_tokenize(p, tok, b->ids, b->ids_cap, &n);
        }
    }
    if (status != EPD_OK) {
        fprintf(stderr, "epd-tokenize: line %lu: %s\n", line, epd_status_string(status));
        return 1;
    }
    if (a->chat == 2) {
        epd_tkz_print_ints(b->ids, n);
    } else {
        json_t *s = json_stringn(p->text, p->len);
        char *out = s != NULL ? json_dumps(s, JSON_ENCODE_ANY) : NULL;

        if (out == NULL) {
            json_decref(s);
            fprintf(stderr, "epd-tokenize: out of memory\n");
            return 1;
        }
        puts(out);
        free(out);
        json_decref(s);
    }
    return 0;
}

int main(int argc, char **argv)
{
    epd_tkz_args_t args;
    epd_tokenizer_t *tok = NULL;
    epd_chat_template_t *tmpl = NULL;
    epd_chat_prompt_t prompt = {0};
    epd_tkz_buf_t buf = {0};
    char *line = NULL;
    size_t line_cap = 0;
    unsigned long lineno = 0;
    ssize_t got;
    int rc;

    rc = epd_tkz_parse(argc, argv, &args);
    if (rc != 0) {
        return rc == 2 ? 0 : 1;
    }
    if (getenv("EPD_LOG_LEVEL") == NULL) {
        epd_log_set_level(EPD_LOG_ERROR);
    }
    if (epd_tokenizer_load(args.model, &tok) != EPD_OK) {
        fprintf(stderr, "epd-tokenize: cannot load the tokenizer of '%s' (see above)\n",
                args.model);
        return 1;
    }
    if (args.chat) {
        epd_status_t st = epd_chat_load(args.model, args.chat_template, &tmpl);

        if (st == EPD_ERR_NOT_FOUND) {
            fprintf(stderr,
                    "epd-tokenize: '%s' has no chat_template in tokenizer_config.json: name one "
                    "with --chat-template (%s)\n",
                    args.model, EPD_CHAT_NAMES);
        } else if (st != EPD_OK) {
            fprintf(stderr, "epd-tokenize: no chat template for '%s' (see above)\n", args.model);
        }
        if (st != EPD_OK) {
            epd_tokenizer_destroy(tok);
            return 1;
        }
    }
    while (rc == 0 && (got = getline(&line, &line_cap, stdin)) >= 0) {
        json_error_t jerr;
        json_t *v;

        lineno++;
        if (got == 0 || (got == 1 && line[0] == '\n')) {
            continue;
        }
        v = json_loadb(line, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
        if (v == NULL) {
            fprintf(stderr, "epd-tokenize: line %lu: not JSON: %s\n", lineno, jerr.text);
            rc = 1;
            break;
        }
        rc = args.chat     ? epd_tkz_chat(tok, tmpl, &args, v, &buf, &prompt, lineno)
             : args.decode ? epd_tkz_decode(tok, &args, v, &buf, lineno)
                           : epd_tkz_encode(tok, &args, v, &buf, lineno);
        json_decref(v);
        /* a line out per line in, now: the tool is also a coprocess */
        fflush(stdout);
    }
    if (ferror(stdout)) {
        fprintf(stderr, "epd-tokenize: cannot write: %s\n", strerror(errno));
        rc = 1;
    }
    free(line);
    epd_free(buf.ids);
    epd_free(buf.bytes);
    epd_free(buf.text);
    epd_free(buf.msgs);
    epd_chat_prompt_free(&prompt);
    epd_chat_destroy(tmpl);
    epd_tokenizer_destroy(tok);
    return rc;
}
