/*
 * epd_utf8.h — UTF-8 repair for model output.
 *
 * A byte-level model can emit any byte sequence.  Text handed to a client
 * must be valid UTF-8, so invalid bytes are replaced by U+FFFD (EF BF BD),
 * one per maximal invalid subsequence, exactly as the WHATWG Encoding
 * standard's UTF-8 decoder does (and as browsers and Python's
 * errors="replace" do): "\xF0\x9F\x98" -> one U+FFFD, "\xC0\x80" -> two,
 * "\xED\xA0\x80" (a surrogate) -> three.  Pure functions, any thread.
 */
#ifndef EPD_UTF8_H
#define EPD_UTF8_H

#include <stddef.h>

#include "epd_status.h"

/* Output bytes that always suffice for `n` input bytes. */
#define EPD_UTF8_REPAIR_MAX(n) ((n)*3)

/* Copies in[0..len) (borrowed) to out[0..cap) (caller's), replacing each
 * maximal invalid subsequence by U+FFFD; *out_len_p = bytes written (no NUL
 * added).  EPD_ERR_TOO_LONG when cap is too small (then nothing is
 * promised about out). */
epd_status_t epd_utf8_repair(const void *in, size_t len, char *out, size_t cap, size_t *out_len_p);

/* For streaming: the number of trailing bytes of in[0..len) that form an
 * incomplete but so far valid sequence (0..3).  A streamer holds them back
 * until more bytes arrive (or repairs them at the end of the stream). */
size_t epd_utf8_incomplete_tail(const void *in, size_t len);

/* The length of the longest prefix of in[0..len) that is valid UTF-8 (by
 * the same rules as epd_utf8_repair: no overlongs, surrogates or code
 * points above U+10FFFF); len when all of it is. */
size_t epd_utf8_valid_prefix(const void *in, size_t len);

#endif
