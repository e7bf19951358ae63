/*
 * epd_utf8.c — the WHATWG UTF-8 decoder state machine (Encoding standard,
 * section 9.1.1), emitting the original bytes of each valid sequence and
 * U+FFFD for each error.  A byte that ends an invalid sequence without
 * belonging to it is processed again as the start of the next one.
 */
#include "epd_utf8.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    unsigned needed;
    unsigned seen;
    uint8_t lower;
    uint8_t upper;
} epd_utf8_state_t;

static void epd_utf8_reset(epd_utf8_state_t *st)
{
    st->needed = 0;
    st->seen = 0;
    st->lower = 0x80;
    st->upper = 0xBF;
}

/* Feeds one lead byte; returns 1 when it starts a sequence, 0 when it is
 * complete by itself (ASCII), -1 when it is invalid. */
static int epd_utf8_lead(epd_utf8_state_t *st, uint8_t b)
{
    if (b <= 0x7F) {
        return 0;
    }
    if (b >= 0xC2 && b <= 0xDF) {
        st->needed = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        st->lower = b == 0xE0 ? 0xA0 : 0x80;
        st->upper = b == 0xED ? 0x9F : 0xBF;
        st->needed = 2;
    } else if (b >= 0xF0 && b <= 0xF4) {
        st->lower = b == 0xF0 ? 0x90 : 0x80;
        st->upper = b == 0xF4 ? 0x8F : 0xBF;
        st->needed = 3;
    } else {
        return -1;
    }
    return 1;
}

static int epd_utf8_put(char *out, size_t cap, size_t *n, const void *src, size_t len)
{
    if (cap - *n < len) {
        return -1;
    }
    memcpy(out + *n, src, len);
    *n += len;
    return 0;
}

epd_status_t epd_utf8_repair(const void *in, size_t len, char *out, size_t cap, size_t *out_len_p)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    const uint8_t *p = in;
    epd_utf8_state_t st;
    size_t seq_start = 0;
    size_t n = 0;
    size_t i = 0;

    epd_utf8_reset(&st);
    while (i < len) {
        uint8_t b = p[i];

        if (st.needed == 0) {
            int r = epd_utf8_lead(&st, b);

            if (r == 0 && epd_utf8_put(out, cap, &n, &b, 1) != 0) {
                return EPD_ERR_TOO_LONG;
            }
            if (r < 0 && epd_utf8_put(out, cap, &n, fffd, 3) != 0) {
                return EPD_ERR_TOO_LONG;
            }
            seq_start = i;
            i++;
            continue;
        }
        if (b < st.lower || b > st.upper) {
            /* the sequence so far is one error; b is reconsidered */
            epd_utf8_reset(&st);
            if (epd_utf8_put(out, cap, &n, fffd, 3) != 0) {
                return EPD_ERR_TOO_LONG;
            }
            continue;
        }
        st.lower = 0x80;
        st.upper = 0xBF;
        st.seen++;
        i++;
        if (st.seen == st.needed) {
            if (epd_utf8_put(out, cap, &n, p + seq_start, i - seq_start) != 0) {
                return EPD_ERR_TOO_LONG;
            }
            epd_utf8_reset(&st);
        }
    }
    if (st.needed != 0 && epd_utf8_put(out, cap, &n, fffd, 3) != 0) {
        return EPD_ERR_TOO_LONG;
    }
    *out_len_p = n;
    return EPD_OK;
}

size_t epd_utf8_incomplete_tail(const void *in, size_t len)
{
    const uint8_t *p = in;
    epd_utf8_state_t st;
    size_t seq_start = 0;
    size_t i = 0;

    epd_utf8_reset(&st);
    while (i < len) {
        uint8_t b = p[i];

        if (st.needed == 0) {
            epd_utf8_lead(&st, b);
            seq_start = i++;
            continue;
        }
        if (b < st.lower || b > st.upper) {
            epd_utf8_reset(&st);
            continue;
        }
        st.lower = 0x80;
        st.upper = 0xBF;
        i++;
        if (++st.seen == st.needed) {
            epd_utf8_reset(&st);
        }
    }
    return st.needed != 0 ? len - seq_start : 0;
}

size_t epd_utf8_valid_prefix(const void *in, size_t len)
{
    const uint8_t *p = in;
    size_t i = 0;

    while (i < len) {
        uint8_t b = p[i];
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;

        if (b < 0x80) {
            i++;
            continue;
        }
        if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            lo = b == 0xE0 ? 0xA0 : 0x80;
            hi = b == 0xED ? 0x9F : 0xBF;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            lo = b == 0xF0 ? 0x90 : 0x80;
            hi = b == 0xF4 ? 0x8F : 0xBF;
        } else {
            return i;
        }
        if (len - i - 1 < need || p[i + 1] < lo || p[i + 1] > hi) {
            return i;
        }
        for (size_t k = 2; k <= need; k++) {
            if ((p[i + k] & 0xC0) != 0x80) {
                return i;
            }
        }
        i += need + 1;
    }
    return len;
}
