/*
 * epd_image.c — PNG and JPEG decoding with libraries made for untrusted
 * input: libspng (PNG) and libjpeg-turbo through its libjpeg API (JPEG),
 * both Debian's.
 *
 * The probe is our own header reader (PNG: the IHDR chunk; JPEG: the
 * segments up to the first frame header): it allocates nothing, reports
 * the declared size however large, and tells the JPEG kinds we do not
 * decode (lossless, arithmetic coding, 12-bit) apart as unsupported.
 *
 * epd_image_decode checks in the order a refusal should be named: the
 * number of bytes, then the format and header (the probe), then the sides
 * and the pixels (the pixel limit is inclusive), and only then lets a
 * library near the data, with its own limits set to the probed size:
 *   - libspng: image limits of exactly the probed width and height, a
 *     cache limit on what ancillary chunks (text, ICC profiles) may hold
 *     once inflated, (its default) limit on how many it keeps; it inflates
 *     straight into the output rows, so a zlib stream longer than the
 *     image never grows a buffer.  Every allocation goes through
 *     epd_malloc.
 *   - libjpeg: errors longjmp out of the library (the only way its API
 *     reports them) and nothing is printed; a frame whose size differs from
 *     the probed one is refused; at most EPD_IMAGE_JPEG_MAX_SCANS scans (a
 *     progressive file of thousands of tiny scans is a CPU bomb); its memory
 *     manager may hold at most what the declared size needs.  A component
 *     that names a quantization or Huffman table no DQT/DHT defined is
 *     refused by libjpeg itself (stb_image, used before, decoded such a
 *     file with whatever the heap held: the same request gave different
 *     answers).  libjpeg allocates with its own malloc, not epd_malloc:
 *     only the output buffer is ours.
 * Corrupt entropy-coded data that libjpeg can resynchronize past (a
 * truncated scan, a bad restart marker) is a warning there, not an error:
 * such a file decodes, as in browsers, and deterministically (libjpeg fills
 * what is missing with zeros).
 */
#include "epd_image.h"

#include <limits.h>
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE */
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>
#include <spng.h>

#include "epd_alloc.h"
#include "epd_log.h"

#define EPD_IMAGE_LOG "image"

/* Progressive JPEGs have a handful of scans (libjpeg's own encoder writes
 * 10); TurboJPEG's limit, for the same reason. */
#define EPD_IMAGE_JPEG_MAX_SCANS 500

/* What the ancillary chunks of a PNG may hold in libspng's cache (text,
 * ICC profile, Exif...; inflated, where compressed), and one of them. */
#define EPD_IMAGE_PNG_CHUNK_MAX (4u << 20)
#define EPD_IMAGE_PNG_CACHE_MAX (8u << 20)
/* How many it keeps is libspng's default, 1000: its setter in 0.7.3
 * (SPNG_CHUNK_COUNT_LIMIT) refuses any value above the count read so far. */

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
            i++; /* padding between segments, which libjpeg skips too */
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

/* ---- PNG: libspng -------------------------------------------------------- */

/* Set when epd_malloc fails inside a libspng call on this thread: libspng
 * reports that and its own limits alike (SPNG_EMEM), and only the first is
 * ours to call out of memory. */
static _Thread_local int epd_image_png_oom;

static void *epd_image_spng_malloc(size_t size)
{
    void *p = epd_malloc(size);

    epd_image_png_oom |= p == NULL;
    return p;
}

static void *epd_image_spng_realloc(void *ptr, size_t size)
{
    void *p = epd_realloc(ptr, size);

    epd_image_png_oom |= p == NULL;
    return p;
}

static void *epd_image_spng_calloc(size_t n, size_t size)
{
    void *p = epd_calloc(n, size);

    epd_image_png_oom |= p == NULL;
    return p;
}

static void epd_image_spng_free(void *ptr)
{
    epd_free(ptr);
}

/* Decodes the PNG (already probed: `info`) into a new [h][w][3] buffer
 * (epd_free), *rgb_p written only on success. */
static epd_status_t epd_image_decode_png(const void *data, size_t len, const epd_image_info_t *info,
                                         unsigned char **rgb_p)
{
    struct spng_alloc alloc = {
        .malloc_fn = epd_image_spng_malloc,
        .realloc_fn = epd_image_spng_realloc,
        .calloc_fn = epd_image_spng_calloc,
        .free_fn = epd_image_spng_free,
    };
    struct spng_ihdr ihdr;
    unsigned char *rgb = NULL;
    size_t need = 0;
    spng_ctx *ctx;
    epd_status_t status;
    int err;

    epd_image_png_oom = 0;
    ctx = spng_ctx_new2(&alloc, 0);
    if (ctx == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    /* the limits first, then the bytes (spng_set_png_buffer borrows them) */
    err = spng_set_image_limits(ctx, info->width, info->height);
    if (err == 0) {
        err = spng_set_chunk_limits(ctx, EPD_IMAGE_PNG_CHUNK_MAX, EPD_IMAGE_PNG_CACHE_MAX);
    }
    if (err == 0) {
        /* a bad CRC on pixel data is an error, on an ancillary chunk (which
         * we never use) a reason to skip that chunk */
        err = spng_set_crc_action(ctx, SPNG_CRC_ERROR, SPNG_CRC_DISCARD);
    }
    if (err == 0) {
        err = spng_set_png_buffer(ctx, data, len);
    }
    if (err == 0) {
        err = spng_get_ihdr(ctx, &ihdr);
    }
    if (err == 0 && (ihdr.width != info->width || ihdr.height != info->height)) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "PNG header of %u x %u pixels read as %u x %u", info->width,
                     info->height, ihdr.width, ihdr.height);
        status = EPD_ERR_MALFORMED;
        goto out;
    }
    if (err == 0) {
        err = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &need);
    }
    if (err == 0 && need != (size_t)info->width * info->height * 3) {
        err = SPNG_EOVERFLOW; /* not RGB8 rows without padding: never expected */
    }
    if (err == 0) {
        rgb = epd_malloc(need);
        if (rgb == NULL) {
            status = EPD_ERR_NO_MEMORY;
            goto out;
        }
        /* no gamma, no transparency: alpha is dropped, as documented */
        err = spng_decode_image(ctx, rgb, need, SPNG_FMT_RGB8, 0);
    }
    if (err != 0) {
        if (epd_image_png_oom) {
            status = EPD_ERR_NO_MEMORY;
            goto out;
        }
        epd_log_warn(EPD_IMAGE_LOG, 0, "PNG of %u x %u pixels: %s", info->width, info->height,
                     err == SPNG_ECHUNK_LIMITS ? "its ancillary chunks hold too much"
                                               : spng_strerror(err));
        status = EPD_ERR_MALFORMED;
        goto out;
    }
    *rgb_p = rgb;
    rgb = NULL;
    status = EPD_OK;
out:
    epd_free(rgb);
    spng_ctx_free(ctx);
    return status;
}

/* ---- JPEG: libjpeg-turbo ------------------------------------------------- */

/* libjpeg's error manager, extended with where to jump and what went wrong. */
typedef struct {
    struct jpeg_error_mgr pub; /* first: libjpeg casts cinfo->err to it */
    jmp_buf jump;
    char why[JMSG_LENGTH_MAX];
    int out_of_memory;
} epd_image_jerr_t;

typedef struct {
    struct jpeg_progress_mgr pub; /* first: libjpeg casts cinfo->progress to it */
    epd_image_jerr_t *jerr;
} epd_image_jprog_t;

/* libjpeg: a fatal error.  Must not return: back to the setjmp in
 * epd_image_decode_jpeg, which destroys the decompressor. */
static void epd_image_jpeg_error_exit(j_common_ptr cinfo)
{
    epd_image_jerr_t *jerr = (epd_image_jerr_t *)cinfo->err;

    cinfo->err->format_message(cinfo, jerr->why);
    jerr->out_of_memory = cinfo->err->msg_code == JERR_OUT_OF_MEMORY;
    longjmp(jerr->jump, 1);
}

/* libjpeg: print a message.  The bytes are someone else's: never to stderr
 * (a refusal is logged once, by us). */
static void epd_image_jpeg_output_message(j_common_ptr cinfo)
{
    (void)cinfo;
}

/* libjpeg: called between scans and rows; refuses a file of too many
 * scans (each progressive scan walks every coefficient again). */
static void epd_image_jpeg_progress(j_common_ptr cinfo)
{
    epd_image_jprog_t *prog = (epd_image_jprog_t *)cinfo->progress;

    if (cinfo->is_decompressor &&
        ((j_decompress_ptr)cinfo)->input_scan_number > EPD_IMAGE_JPEG_MAX_SCANS) {
        snprintf(prog->jerr->why, sizeof(prog->jerr->why), "more than %d scans",
                 EPD_IMAGE_JPEG_MAX_SCANS);
        longjmp(prog->jerr->jump, 1);
    }
}

/* 255 * a * b / (255 * 255), rounded: a CMYK channel times K (as stb_image
 * did, so CMYK files decode as before). */
static unsigned char epd_image_mul8(unsigned a, unsigned b)
{
    unsigned t = a * b + 128;

    return (unsigned char)((t + (t >> 8)) >> 8);
}

/* Decodes the JPEG (already probed: `info`) into a new [h][w][3] buffer
 * (epd_free), *rgb_p written only on success. */
static epd_status_t epd_image_decode_jpeg(const void *data, size_t len,
                                          const epd_image_info_t *info, unsigned char **rgb_p)
{
    struct jpeg_decompress_struct cinfo;
    epd_image_jerr_t jerr;
    epd_image_jprog_t prog;
    /* written after setjmp (and rgb freed after a longjmp): volatile */
    unsigned char *volatile rgb = NULL;
    JSAMPARRAY volatile cmyk_row = NULL;
    volatile int cmyk = 0;
    size_t row_bytes = (size_t)info->width * 3;

    memset(&cinfo, 0, sizeof(cinfo));
    memset(&jerr, 0, sizeof(jerr));
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = epd_image_jpeg_error_exit;
    jerr.pub.output_message = epd_image_jpeg_output_message;
    if (setjmp(jerr.jump) != 0) {
        jpeg_destroy_decompress(&cinfo);
        epd_free(rgb);
        if (jerr.out_of_memory) {
            return EPD_ERR_NO_MEMORY;
        }
        epd_log_warn(EPD_IMAGE_LOG, 0, "JPEG of %u x %u pixels: %s", info->width, info->height,
                     jerr.why);
        return EPD_ERR_MALFORMED;
    }
    jpeg_create_decompress(&cinfo);
    /* What the declared size needs at most: coefficients of up to 4
     * components padded to whole MCUs (2 bytes x 64 per 8 x 8 block, kept
     * whole for a progressive file), row buffers, and 4 MiB for tables and
     * small objects.  Beyond it libjpeg refuses rather than allocates. */
    cinfo.mem->max_memory_to_use =
        (long)(4ull * 128 * (info->width / 8 + 5) * (info->height / 8 + 5) +
               4ull * 64 * (info->width + 64) + (4ull << 20));
    prog.pub.progress_monitor = epd_image_jpeg_progress;
    prog.jerr = &jerr;
    cinfo.progress = &prog.pub;
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK) {
        /* tables only, no image (read_header errors out on anything else) */
        snprintf(jerr.why, sizeof(jerr.why), "no image, only tables");
        longjmp(jerr.jump, 1);
    }
    if (cinfo.image_width != info->width || cinfo.image_height != info->height) {
        snprintf(jerr.why, sizeof(jerr.why), "its frame was read as %u x %u pixels",
                 cinfo.image_width, cinfo.image_height);
        longjmp(jerr.jump, 1);
    }
    switch (cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
        cinfo.out_color_space = JCS_EXT_RGB; /* grey replicated */
        cmyk = 0;
        break;
    case JCS_CMYK:
    case JCS_YCCK:
        cinfo.out_color_space = JCS_CMYK; /* converted to RGB below */
        cmyk = 1;
        break;
    default:
        snprintf(jerr.why, sizeof(jerr.why), "%d components of an unknown colour space",
                 cinfo.num_components);
        longjmp(jerr.jump, 1);
    }
    /* the exact integer IDCT: the same pixels on every CPU */
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_width != info->width || cinfo.output_height != info->height ||
        cinfo.output_components != (cmyk ? 4 : 3)) {
        snprintf(jerr.why, sizeof(jerr.why), "decodes to %u x %u pixels of %d components",
                 cinfo.output_width, cinfo.output_height, cinfo.output_components);
        longjmp(jerr.jump, 1);
    }
    if (cmyk) {
        /* freed with the decompressor */
        cmyk_row =
            cinfo.mem->alloc_sarray((j_common_ptr)&cinfo, JPOOL_IMAGE, cinfo.output_width * 4, 1);
    }
    rgb = epd_malloc(row_bytes * info->height);
    if (rgb == NULL) {
        jpeg_destroy_decompress(&cinfo);
        return EPD_ERR_NO_MEMORY;
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        unsigned char *out = rgb + row_bytes * cinfo.output_scanline;
        JSAMPROW row = cmyk ? cmyk_row[0] : out;

        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
            snprintf(jerr.why, sizeof(jerr.why), "no row %u", cinfo.output_scanline);
            longjmp(jerr.jump, 1);
        }
        if (cmyk) {
            /* Adobe's inverted CMYK (libjpeg gives YCCK as that too) */
            for (uint32_t x = 0; x < info->width; x++) {
                const unsigned char *p = row + 4 * (size_t)x;

                out[3 * x] = epd_image_mul8(p[0], p[3]);
                out[3 * x + 1] = epd_image_mul8(p[1], p[3]);
                out[3 * x + 2] = epd_image_mul8(p[2], p[3]);
            }
        }
    }
    /* every row is out: what follows the last scan is not read */
    jpeg_destroy_decompress(&cinfo);
    *rgb_p = rgb;
    return EPD_OK;
}

/* ---- the API -------------------------------------------------------------- */

epd_status_t epd_image_decode(const void *data, size_t len, uint64_t max_pixels,
                              epd_image_t *image_p)
{
    epd_image_info_t info;
    unsigned char *rgb = NULL;
    epd_status_t status;

    if (image_p == NULL || (data == NULL && len > 0)) {
        return EPD_ERR_INVALID_PARAM;
    }
    /* the size first: too many bytes is the refusal, whatever they are */
    if (len > EPD_IMAGE_MAX_BYTES) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "image of %zu bytes: more than the limit of %llu bytes", len,
                     (unsigned long long)EPD_IMAGE_MAX_BYTES);
        return EPD_ERR_TOO_LONG;
    }
    status = epd_image_probe(data, len, &info);
    if (status != EPD_OK) {
        return status;
    }
    if (max_pixels == 0) {
        max_pixels = EPD_IMAGE_MAX_PIXELS_DEFAULT;
    }
    if (info.width > EPD_IMAGE_MAX_SIDE || info.height > EPD_IMAGE_MAX_SIDE) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "%s of %u x %u pixels: a side is over the limit of %u",
                     epd_image_format_name(info.format), info.width, info.height,
                     EPD_IMAGE_MAX_SIDE);
        return EPD_ERR_TOO_LONG;
    }
    /* inclusive: an image of exactly max_pixels is accepted */
    if ((uint64_t)info.width * info.height > max_pixels) {
        epd_log_warn(EPD_IMAGE_LOG, 0, "%s of %u x %u pixels: more than the limit of %llu",
                     epd_image_format_name(info.format), info.width, info.height,
                     (unsigned long long)max_pixels);
        return EPD_ERR_TOO_LONG;
    }
    if (info.format == EPD_IMAGE_PNG) {
        status = epd_image_decode_png(data, len, &info, &rgb);
    } else {
        status = epd_image_decode_jpeg(data, len, &info, &rgb);
    }
    if (status != EPD_OK) {
        return status;
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
