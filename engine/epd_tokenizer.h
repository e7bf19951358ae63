/*
 * epd_tokenizer.h — byte-level BPE tokenizers from a Hugging Face
 * `tokenizer.json` (GPT-2, Llama-3, Qwen2/Qwen3 and their kin).
 *
 * The pipeline is Hugging Face `tokenizers`' own, step for step, so that the
 * ids equal what the Rust crate gives for the same text:
 *   1. added tokens (special or not) are cut out first, leftmost-longest,
 *      each one id: those with "normalized": false on the raw text, those
 *      with "normalized": true on the normalized pieces between them;
 *      one with lstrip / rstrip takes the whitespace before / after it;
 *   2. the normalizer (NFC, NFD, NFKC, NFKD, or a Sequence of them; ICU);
 *   3. the pre-tokenizer: Split on a regex (Oniguruma, the engine the Rust
 *      crate compiles patterns with, so \p{L}, \s and lookaheads agree) or a
 *      string, with behavior Isolated / Removed / MergedWithPrevious /
 *      MergedWithNext / Contiguous and `invert`; ByteLevel (the GPT-2 regex
 *      when use_regex, the prefix space when add_prefix_space); a Sequence;
 *   4. the BPE model per pre-token: `ignore_merges` first (a pre-token that
 *      is itself in the vocabulary is one token), then merges by rank,
 *      lowest first, leftmost among equals;
 *   5. with EPD_TOKENIZE_ADD_SPECIAL, the post-processor's ids around the
 *      text (TemplateProcessing's single template; ByteLevel adds none).
 * Byte-level tokens are kept as raw bytes inside (the ByteLevel
 * byte<->unicode map is applied once, at load), so BPE runs over bytes.
 *
 * Text that is not valid UTF-8 (the Rust crate takes only strings, so this
 * is epd's own rule): the input is cut into maximal valid runs and invalid
 * bytes; each valid run goes through steps 2-4 on its own, and each invalid
 * byte is one token, the ByteLevel token of that byte.  Decoding gives the
 * bytes back, so decode(encode(b)) == b for any bytes b.
 *
 * A tokenizer.json that uses anything else (a WordPiece or Unigram model,
 * Metaspace, byte_fallback, added tokens with single_word, a
 * pair template...) is refused at load with EPD_ERR_UNSUPPORTED and a log
 * line naming the part.
 *
 * Threads: a tokenizer is immutable after load except for its scratch
 * buffers (the regex match region, the BPE arrays), so encode, decode and
 * the stream functions on one tokenizer are called by one thread at a time;
 * different tokenizers are independent.
 */
#ifndef EPD_TOKENIZER_H
#define EPD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "epd_status.h"

typedef struct epd_tokenizer epd_tokenizer_t;

/* Loads DIR/tokenizer.json (borrowed path).  DIR/tokenizer_config.json,
 * when present, names the BOS and EOS tokens (epd_tokenizer_bos/eos).
 * *tok_p is owned by the caller (epd_tokenizer_destroy).  EPD_ERR_IO (no
 * file), EPD_ERR_MALFORMED (not a tokenizer.json), EPD_ERR_UNSUPPORTED, or
 * EPD_ERR_NO_MEMORY; the cause is logged. */
epd_status_t epd_tokenizer_load(const char *dir, epd_tokenizer_t **tok_p);

/* As epd_tokenizer_load, from the text of a tokenizer.json in
 * json[0..len) (borrowed) and optionally a tokenizer_config.json in
 * config[0..config_len) (NULL: none). */
epd_status_t epd_tokenizer_create(const char *json, size_t len, const char *config,
                                  size_t config_len, epd_tokenizer_t **tok_p);

/* NULL is a no-op. */
void epd_tokenizer_destroy(epd_tokenizer_t *tok);

/* epd_tokenizer_encode flags */
enum {
    /* apply the post-processor (e.g. Llama-3's <|begin_of_text|> first) */
    EPD_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* special added tokens typed in the text are plain text (Hugging Face's
     * split_special_tokens): "<|im_start|>" becomes the BPE tokens of its
     * characters; non-special added tokens still match */
    EPD_TOKENIZE_SPECIAL_AS_TEXT = 1u << 1,
};

/* Encodes text[0..len) (borrowed; any bytes) into ids[0..cap) (the
 * caller's); *n_p = the number of ids.  EPD_ERR_TOO_LONG when they do not
 * fit: then *n_p is the number needed and ids[0..cap) holds the first cap. */
epd_status_t epd_tokenizer_encode(epd_tokenizer_t *tok, const char *text, size_t len,
                                  unsigned flags, int32_t *ids, size_t cap, size_t *n_p);

/* One past the largest id (the size of the id space, added tokens
 * included). */
uint32_t epd_tokenizer_n_ids(const epd_tokenizer_t *tok);

/* The bytes of one id as the ByteLevel decoder gives them (borrowed from
 * the tokenizer; not NUL-terminated), *len_p their length, or NULL for an
 * id that names no token.  *special_p (may be NULL) = 1 for a special
 * added token. */
const char *epd_tokenizer_id_bytes(const epd_tokenizer_t *tok, int32_t id, size_t *len_p,
                                   int *special_p);

/* The id of a token (exact text, byte-level form for vocabulary tokens:
 * "Ġthe"), or -1. */
int32_t epd_tokenizer_token_id(const epd_tokenizer_t *tok, const char *token, size_t len);

/* BOS / EOS ids named by tokenizer_config.json (bos_token, eos_token), or
 * -1 when it names none (or there was no config). */
int32_t epd_tokenizer_bos(const epd_tokenizer_t *tok);
int32_t epd_tokenizer_eos(const epd_tokenizer_t *tok);

/* epd_tokenizer_decode flags */
enum {
    EPD_DETOKENIZE_SKIP_SPECIAL = 1u << 0, /* special added tokens give no bytes */
};

/* The bytes of ids[0..n) concatenated into buf[0..cap) (the caller's; no
 * NUL added), *len_p their length; they may be invalid UTF-8 (a character
 * split across ids at the end, or ids a model emitted in a bad order):
 * epd_utf8_repair makes text of them.  EPD_ERR_OUT_OF_RANGE for an id that
 * names no token; EPD_ERR_TOO_LONG when they do not fit (*len_p = the
 * length needed). */
epd_status_t epd_tokenizer_decode(const epd_tokenizer_t *tok, const int32_t *ids, size_t n,
                                  unsigned flags, char *buf, size_t cap, size_t *len_p);

/* Streaming decode: ids arrive one at a time (a generation), and bytes are
 * handed out as soon as they are whole UTF-8 characters.  A character whose
 * bytes are split across ids is held back (at most 3 bytes) until it is
 * complete; bytes that can never become valid are handed out as they are,
 * so the concatenation of all output equals epd_tokenizer_decode of all the
 * ids, byte for byte.  The caller's storage; no cleanup needed. */
typedef struct {
    unsigned flags; /* EPD_DETOKENIZE_* */
    uint8_t held[4];
    size_t n_held;
} epd_tokenizer_stream_t;

void epd_tokenizer_stream_init(epd_tokenizer_stream_t *st, unsigned flags);

/* Feeds one id; writes the bytes now complete to buf[0..cap), *len_p their
 * count.  A buffer of epd_tokenizer_max_token_bytes(tok) + 3 bytes always
 * suffices.  EPD_ERR_OUT_OF_RANGE (bad id; nothing changed) or
 * EPD_ERR_TOO_LONG (nothing changed). */
epd_status_t epd_tokenizer_stream_push(const epd_tokenizer_t *tok, epd_tokenizer_stream_t *st,
                                       int32_t id, char *buf, size_t cap, size_t *len_p);

/* Ends the stream: the bytes still held (an incomplete character, 0..3
 * bytes) into buf[0..cap), *len_p their count. */
epd_status_t epd_tokenizer_stream_finish(epd_tokenizer_stream_t *st, char *buf, size_t cap,
                                         size_t *len_p);

/* The most bytes one id decodes to. */
size_t epd_tokenizer_max_token_bytes(const epd_tokenizer_t *tok);

#endif
