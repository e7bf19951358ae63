/*
 * epd_image.h — image files (PNG, JPEG) to RGB8 pixels, for the vision
 * encoder.
 *
 * The decoder is stb_image (Debian's libstb-dev), compiled into
 * epd_image.c with only PNG and JPEG enabled and every allocation routed
 * through epd_malloc (so tests can fail any of them).  Bytes come from the
 * network, so decoding is guarded twice:
 *   - the header is probed first and an image of more than max_pixels
 *     pixels is refused before any pixel memory exists (a 100-byte PNG may
 *     declare 60000 x 60000: the decompression bomb);
 *   - while decoding, no single allocation may exceed what an image of the
 *     probed size needs (a PNG whose zlib stream inflates far past its
 *     declared size is refused instead of growing a buffer to gigabytes).
 * Everything is reentrant: no process-wide state is written (stb's flip and
 * unpremultiply settings are never touched; its failure reason and the
 * allocation bound above are thread-local).
 */
#ifndef EPD_IMAGE_H
#define EPD_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_status.h"

/* The default pixel guard (width x height) of epd_image_decode. */
#define EPD_IMAGE_MAX_PIXELS_DEFAULT (4096ull * 4096ull)

typedef enum {
    EPD_IMAGE_PNG = 1,  /* starts with 89 'P' 'N' 'G' 0D 0A 1A 0A */
    EPD_IMAGE_JPEG = 2, /* starts with FF D8 FF */
} epd_image_format_t;

/* What the header says; plain data. */
typedef struct {
    epd_image_format_t format;
    uint32_t width;
    uint32_t height;
    uint32_t channels; /* in the file: 1 grey, 2 grey+alpha, 3 RGB (also a PNG
                        * palette and a CMYK JPEG), 4 RGBA */
} epd_image_info_t;

/* A decoded image (caller's storage): rgb is owned by it, [height][width][3]
 * bytes, rows top to bottom, no padding.  Release with epd_image_cleanup. */
typedef struct {
    uint32_t width;
    uint32_t height;
    uint8_t *rgb;
} epd_image_t;

/*
 * Reads the header of the image in data[0..len) (borrowed for the call)
 * without decoding pixels: the format from the magic bytes, the size and
 * the channels.  EPD_ERR_UNSUPPORTED when the bytes are neither PNG nor
 * JPEG (GIF, BMP, text...) or a JPEG kind the decoder lacks (lossless,
 * arithmetic coding, 12-bit), EPD_ERR_MALFORMED for a PNG or JPEG whose
 * header is broken or truncated, EPD_ERR_INVALID_PARAM for NULL pointers.
 * The size is reported as declared, however large.  *info_p is written only
 * on success.  Any thread; allocates nothing.
 */
epd_status_t epd_image_probe(const void *data, size_t len, epd_image_info_t *info_p);

/*
 * Decodes the image in data[0..len) (borrowed for the call) to RGB8: grey
 * is replicated, alpha is dropped (not composited), 16-bit samples are
 * reduced to 8 bits.  Probes first and refuses with EPD_ERR_TOO_LONG, before
 * allocating anything, when width * height > max_pixels (0 means
 * EPD_IMAGE_MAX_PIXELS_DEFAULT) or a side exceeds 65536.  Other errors as
 * epd_image_probe, plus EPD_ERR_TOO_LONG for len > INT_MAX,
 * EPD_ERR_NO_MEMORY, EPD_ERR_MALFORMED for corrupt or truncated pixel data,
 * or data needing far more memory than the declared size (the cause is
 * logged once at warn level: the bytes are someone else's).  On success
 * *image_p owns the pixels (epd_image_cleanup); on failure it is not
 * written and nothing stays allocated.  Any thread, synchronous.
 */
epd_status_t epd_image_decode(const void *data, size_t len, uint64_t max_pixels,
                              epd_image_t *image_p);

/* Frees the pixels of `image` (NULL, or an image already cleaned, is a
 * no-op) and zeroes it.  The thread that owns the image. */
void epd_image_cleanup(epd_image_t *image);

/* A borrowed view of `image` for epd_engine_encode_image (valid while the
 * image is).  Pure. */
static inline epd_image_view_t epd_image_view(const epd_image_t *image)
{
    epd_image_view_t v = {.width = image->width, .height = image->height, .rgb = image->rgb};

    return v;
}

/* "PNG", "JPEG" (static string; "?" for another value).  Any thread. */
const char *epd_image_format_name(epd_image_format_t format);

#endif
