/*
 * epd_image.c — PNG / JPEG decoding with stb_image (libstb-dev 2.27),
 * whose implementation is compiled here, PNG and JPEG only, no stdio, no
 * float paths, all memory through epd_malloc.
 *
 * The probe is our own header reader (PNG: the IHDR chunk; JPEG: the
 * segments up to the first frame header): it allocates nothing, reports
 * the declared size even when stb would refuse it as too large (so the
 * pixel guard, not stb's 2^30-byte limit, is what refuses a bomb) and tells
 * the JPEG kinds stb cannot decode (lossless, arithmetic, 12-bit) apart as
 * unsupported.  Decoding is the public stbi_load_from_memory asking for 3
 * channels.
 *
 * The allocation bound.  stb grows its zlib output buffer as long as the
 * stream produces bytes, so a PNG that declares 1 x 1 pixels but carries a
 * deflate stream of gigabytes would pass the pixel guard.  During a decode
 * this thread's epd_image_tls.cap holds the most one allocation may need
 * for an image of the probed size (16-bit RGBA rows with their filter
 * bytes, JPEG coefficient planes padded to whole MCUs, the compressed data
 * collected from the file); the STBI_MALLOC / STBI_REALLOC hooks refuse
 * anything larger, which stb reports as out of memory and we as malformed.
 */
#include "epd_image.h"

#include <limits.h>
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"

#define EPD_IMAGE_LOG "image"

/* This thread's current call into stb: the bound on one allocation (0
 * outside a decode), and what made an allocation fail, since stb reports
 * both as "outofmem". */
typedef struct {
    size_t cap;
    int refused; /* an allocation was over the bound: the file's fault */
    int failed;  /* epd_malloc returned NULL: out of memory */
} epd_image_tls_t;

static _Thread_local epd_image_tls_t epd_image_tls;

static void *epd_image_stb_malloc(size_t size)
{
    void *p;

    if (epd_image_tls.cap != 0 && size > epd_image_tls.cap) {
        epd_image_tls.refused = 1;
        return NULL;
    }
    p = epd_malloc(size);
    epd_image_tls.failed |= p == NULL;
    return p;
}

static void *epd_image_stb_realloc(void *ptr, size_t size)
{
    void *p;

    if (epd_image_tls.cap != 0 && size > epd_image_tls.cap) {
        epd_image_tls.refused = 1;
        return NULL; /* stb keeps (and later frees) ptr, as after a failed realloc */
    }
    p = epd_realloc(ptr, size);
    epd_image_tls.failed |= p == NULL;
    return p;
}

static void epd_image_tls_begin(size_t cap)
{
    epd_image_tls.cap = cap;
    epd_image_tls.refused = 0;
    epd_image_tls.failed = 0;
}

#define STBI_MALLOC(sz) epd_image_stb_malloc(sz)
#define STBI_REALLOC(p, newsz) epd_image_stb_realloc(p, newsz)
#define STBI_FREE(p) epd_free(p)
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#define STBI_MAX_DIMENSIONS (1 << 16)

/* Third-party code: its warnings are not ours to fix. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wtype-limits"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_image.h>
#pragma GCC diagnostic pop

static const unsigned char epd_image_png_magic[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};

const char *epd_image_format_name(epd_image_format_t format)
{
    switch (format) {
    case EPD_IMAGE_PNG:
        return "PNG";
    case EPD_IMAGE_JPEG:
        return "JPEG";
    }
    return "?";
}

static int epd_image_sniff(const unsigned char *p, size_t len, epd_image_format_t *format_p)
{
    if (len >= sizeof(epd_image_png_magic) &&
        memcmp(p, epd_image_png_magic, sizeof(epd_image_png_magic)) == 0) {
        *format_p = EPD_IMAGE_PNG;
        return 1;
    }
    if (len >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff) {
        *format_p = EPD_IMAGE_JPEG;
        return 1;
    }
    return 0;
}

static uint32_t epd_image_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The IHDR chunk, which a PNG must start with. */
static epd_status_t epd_image_probe_png(const unsigned char *p, size_t len,
                                        epd_image_info_t *info)
{
    const unsigned char *h = p + 16; /* after signature, length, "IHDR" */
    uint32_t depth;
    uint32_t color;

    if (len < 8 + 8 + 13 || epd_image_be32(p + 8) != 13 || memcmp(p + 12, "IHDR", 4) != 0) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "PNG header: no IHDR chunk first (%zu bytes)", len);
        return EPD_ERR_MALFORMED;
    }
    info->width = epd_image_be32(h);
    info->height = epd_image_be32(h + 4);
    depth = h[8];
    color = h[9];
    if (info->width == 0 || info->height == 0 || info->width > INT32_MAX ||
        info->height > INT32_MAX) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "PNG header: %u x %u pixels", info->width, info->height);
        return EPD_ERR_MALFORMED;
    }
    /* the depths each colour type allows (PNG spec, table 11.1) */
    switch (color) {
    case 0: /* grey */
        info->channels = 1;
        break;
    case 2: /* RGB */
        info->channels = 3;
        break;
    case 3: /* palette (of RGB; transparency, if any, is dropped) */
        info->channels = 3;
        break;
    case 4: /* grey + alpha */
        info->channels = 2;
        break;
    case 6: /* RGBA */
        info->channels = 4;
        break;
    default:
        info->channels = 0;
        break;
    }
    if (info->channels == 0 || (depth != 1 && depth != 2 && depth != 4 && depth != 8 &&
                                depth != 16) ||
        (depth < 8 && color != 0 && color != 3) || (depth == 16 && color == 3) || h[10] != 0 ||
        h[11] != 0 || h[12] > 1) {
        epd_log_warn(EPD_IMAGE_LOG, 0,
                     "PNG header: colour type %u, depth %u, compression %u, filter %u, "
                     "interlace %u is not valid PNG",
                     color, depth, h[10], h[11], h[12]);
        return EPD_ERR_MALFORMED;
    }
    return EPD_OK;
}

/* Walks the JPEG segments up to the first start-of-frame. */
static epd_status_t epd_image_probe_jpeg(const unsigned char *p, size_t len,
                                         epd_image_info_t *info)
{
    size_t i = 2; /* after SOI */

    for (;;) {
        unsigned m;
        size_t seg;

        if (i >= len) {
            break;
        }
        if (p[i] != 0xff) {
            i++; /* padding between segments, which stb skips too */
            continue;
        }
        while (i < len && p[i] == 0xff) { /* fill bytes */
            i++;
        }
        if (i >= len) {
            break;
        }
        m = p[i++];
        if (m == 0x01 || (m >= 0xd0 && m <= 0xd7)) {
            continue; /* TEM, RSTn: no length */
        }
        if (m == 0xd8 || m == 0xd9 || m == 0xda || m == 0x00) {
            break; /* SOI again, EOI or scan data before any frame */
        }
        if (len - i < 2) {
            break;
        }
        seg = (size_t)p[i] << 8 | p[i + 1];
        if (seg < 2 || seg > len - i) {
            break;
        }
        if (m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc) {
            const unsigned char *f = p + i + 2; /* precision, height, width, components */
            unsigned comps;

            if (seg < 8) {
                break;
            }
            info->height = (uint32_t)f[1] << 8 | f[2];
            info->width = (uint32_t)f[3] << 8 | f[4];
            comps = f[5];
            if (m != 0xc0 && m != 0xc1 && m != 0xc2) {
                epd_log_warn(EPD_IMAGE_LOG, 0,
                             "JPEG: frame type SOF%u (only baseline, extended and progressive "
                             "Huffman JPEG are supported)",
                             m - 0xc0);
                return EPD_ERR_UNSUPPORTED;
            }
            if (f[0] != 8) {
                epd_log_warn(EPD_IMAGE_LOG, 0, "JPEG: %u-bit samples (only 8-bit)", f[0]);
                return EPD_ERR_UNSUPPORTED;
            }
            if (info->width == 0 || info->height == 0 || (comps != 1 && comps != 3 && comps != 4)) {
                epd_log_warn(EPD_IMAGE_LOG, 0, "JPEG header: %u x %u pixels of %u components",
                             info->width, info->height, comps);
                return EPD_ERR_MALFORMED;
            }
            info->channels = comps == 1 ? 1 : 3; /* CMYK and YCCK decode to RGB */
            return EPD_OK;
        }
        i += seg;
    }
    epd_log_warn(EPD_IMAGE_LOG, 0, "JPEG header: no frame header in %zu bytes", len);
    return EPD_ERR_MALFORMED;
}

/*
 * Guards against what stb 2.27 gets wrong on hostile JPEGs (fixed in later
 * stb releases): a Huffman table (DHT) whose 16 code counts add up to more
 * than 256 overflows stb's tables, and a scan that uses a table no DHT
 * defined makes stb index with garbage.  The walk follows stb's own parse:
 * segments skipped by their length, entropy-coded data scanned byte by
 * byte for the next marker (FF 00 is a stuffed byte, FF D0..D7 a restart).
 * NULL when the file passes, else why not.
 */
static const char *epd_image_jpeg_hazard(const unsigned char *p, size_t len)
{
    unsigned char dc_def[4] = {0}; /* Huffman tables defined so far */
    unsigned char ac_def[4] = {0};
    int progressive = 0;
    size_t i = 2;

    while (i < len) {
        unsigned m;
        size_t seg;

        if (p[i] != 0xff) {
            i++;
            continue;
        }
        while (i < len && p[i] == 0xff) {
            i++;
        }
        if (i >= len) {
            break;
        }
        m = p[i++];
        if (m == 0x00 || m == 0x01 || (m >= 0xd0 && m <= 0xd8)) {
            continue; /* no length */
        }
        if (m == 0xd9 || len - i < 2) {
            break;
        }
        seg = (size_t)p[i] << 8 | p[i + 1];
        if (seg < 2) {
            break; /* stb refuses it */
        }
        if (m == 0xc2) {
            progressive = 1;
        }
        if (m == 0xc4) {
            /* as stb: tables while the segment has bytes left, a table's
             * counts read even past the segment's end (zeros past EOF) */
            long left = (long)seg - 2;

            for (size_t t = i + 2; left > 0;) {
                unsigned q = t < len ? p[t] : 0;
                unsigned n = 0;

                if ((q >> 4) > 1 || (q & 15) > 3) {
                    break; /* stb refuses it */
                }
                for (size_t k = 1; k <= 16; k++) {
                    n += t + k < len ? p[t + k] : 0;
                }
                if (n > 256) {
                    return "a Huffman table with more than 256 codes";
                }
                if (q >> 4) {
                    ac_def[q & 15] = 1;
                } else {
                    dc_def[q & 15] = 1;
                }
                left -= 17 + (long)n;
                t += 17 + n;
            }
        }
        if (m == 0xda && seg >= 3 && i + seg <= len) {
            /* stb decodes with whatever memory an undefined table holds
             * (its tables are not zeroed): every table the scan uses must
             * have been defined.  Ns components of 2 bytes, then Ss, Se,
             * Ah/Al. */
            unsigned ns = p[i + 2];

            if (seg >= 2 + 1 + 2 * (size_t)ns + 3) {
                const unsigned char *c = p + i + 3;
                unsigned ss = c[2 * ns];
                unsigned ah = c[2 * ns + 2] >> 4;
                int need_dc = !progressive || (ss == 0 && ah == 0);
                int need_ac = !progressive || ss != 0;

                for (unsigned k = 0; k < ns; k++) {
                    unsigned td = c[2 * k + 1] >> 4;
                    unsigned ta = c[2 * k + 1] & 15;

                    if ((need_dc && (td > 3 || !dc_def[td])) ||
                        (need_ac && (ta > 3 || !ac_def[ta]))) {
                        return "a scan uses a Huffman table that was never defined";
                    }
                }
            }
        }
        i += seg;
    }
    return NULL;
}

epd_status_t epd_image_probe(const void *data, size_t len, epd_image_info_t *info_p)
{
    epd_image_info_t info;
    epd_status_t status;

    if ((data == NULL && len > 0) || info_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    memset(&info, 0, sizeof(info));
    if (!epd_image_sniff(data, len, &info.format)) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "not a PNG or JPEG image (%zu bytes)", len);
        return EPD_ERR_UNSUPPORTED;
    }
    if (info.format == EPD_IMAGE_PNG) {
        status = epd_image_probe_png(data, len, &info);
    } else {
        status = epd_image_probe_jpeg(data, len, &info);
    }
    if (status != EPD_OK) {
        return status;
    }
    *info_p = info;
    return EPD_OK;
}

epd_status_t epd_image_decode(const void *data, size_t len, uint64_t max_pixels,
                              epd_image_t *image_p)
{
    epd_image_info_t info;
    uint64_t pixels;
    uint64_t cap;
    stbi_uc *rgb;
    epd_status_t status;
    int x = 0;
    int y = 0;
    int comp = 0;

    if (image_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    status = epd_image_probe(data, len, &info);
    if (status != EPD_OK) {
        return status;
    }
    if (max_pixels == 0) {
        max_pixels = EPD_IMAGE_MAX_PIXELS_DEFAULT;
    }
    pixels = (uint64_t)info.width * info.height;
    if (pixels > max_pixels || info.width > STBI_MAX_DIMENSIONS ||
        info.height > STBI_MAX_DIMENSIONS) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "%s of %u x %u pixels: more than the limit of %llu",
                     epd_image_format_name(info.format), info.width, info.height,
                     (unsigned long long)max_pixels);
        return EPD_ERR_TOO_LONG;
    }
    if (len > INT_MAX) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "%s of %zu bytes: larger than 2 GiB",
                     epd_image_format_name(info.format), len);
        return EPD_ERR_TOO_LONG;
    }
    if (info.format == EPD_IMAGE_JPEG) {
        const char *why = epd_image_jpeg_hazard(data, len);

        if (why != NULL) {
            epd_log_warn(EPD_IMAGE_LOG, 0, "JPEG of %u x %u pixels: %s", info.width,
                         info.height, why);
            return EPD_ERR_MALFORMED;
        }
    }
    /* Widths are below 2^16 (STBI_MAX_DIMENSIONS): no overflow here. */
    cap = 8ull * (info.width + 32) * (info.height + 32) + 2ull * len + (1u << 20);
    epd_image_tls_begin(cap > SIZE_MAX ? SIZE_MAX : (size_t)cap);
    rgb = stbi_load_from_memory(data, (int)len, &x, &y, &comp, 3);
    epd_image_tls.cap = 0;
    if (rgb == NULL) {
        const char *why = stbi_failure_reason();

        if (epd_image_tls.failed && !epd_image_tls.refused) {
            return EPD_ERR_NO_MEMORY;
        }
        if (why != NULL && strcmp(why, "too large") == 0) {
            /* stb's own limit (about 2^30 bytes of pixels) */
            epd_log_warn(EPD_IMAGE_LOG, 0, "%s of %u x %u pixels: too large to decode",
                         epd_image_format_name(info.format), info.width, info.height);
            return EPD_ERR_TOO_LONG;
        }
        epd_log_warn(EPD_IMAGE_LOG, 0, "%s of %u x %u pixels: %s",
                     epd_image_format_name(info.format), info.width, info.height,
                     epd_image_tls.refused ? "its data needs more memory than its size allows"
                     : why != NULL       ? why
                                         : "cannot decode");
        return EPD_ERR_MALFORMED;
    }
    if ((uint32_t)x != info.width || (uint32_t)y != info.height) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "%s decoded to %d x %d pixels, header says %u x %u",
                     epd_image_format_name(info.format), x, y, info.width, info.height);
        epd_free(rgb);
        return EPD_ERR_MALFORMED;
    }
    image_p->width = info.width;
    image_p->height = info.height;
    image_p->rgb = rgb;
    return EPD_OK;
}

void epd_image_cleanup(epd_image_t *image)
{
    if (image == NULL) {
        return;
    }
    epd_free(image->rgb);
    memset(image, 0, sizeof(*image));
}

/* gcc checks for static functions declared but never defined (two stb API
 * functions whose bodies are compiled out with GIF) at the end of the file,
 * under the diagnostic state found there. */
#pragma GCC diagnostic ignored "-Wunused-function"
