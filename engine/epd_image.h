/*
 * epd_image.h — image files (PNG, JPEG) to RGB8 pixels, for the vision
 * encoder.
 *
 * The decoders are Debian's libraries made for untrusted input: libspng
 * for PNG (every allocation through epd_malloc) and libjpeg-turbo, through
 * its libjpeg API, for JPEG.  Bytes come from the network, so before either
 * library sees them the size in bytes, the format and header (our own
 * probe, which allocates nothing), the sides and the pixels are checked, in
 * that order: a 100-byte PNG may declare 60000 x 60000 pixels (the
 * decompression bomb) and is refused before any pixel memory exists.  Each
 * library then decodes under limits set to the probed size (see
 * epd_image.c).  The answer depends on the bytes alone: the same input
 * always gives the same pixels or the same refusal.
 * Everything is reentrant: no process-wide state is written.
 */
#ifndef EPD_IMAGE_H
#define EPD_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "epd_engine.h"
#include "epd_status.h"

/* The default pixel guard (width x height) of epd_image_decode. */
#define EPD_IMAGE_MAX_PIXELS_DEFAULT (4096ull * 4096ull)

/* The longest side epd_image_decode accepts, whatever the pixel guard:
 * libjpeg's own limit (JPEG_MAX_DIMENSION), applied to PNG as well. */
#define EPD_IMAGE_MAX_SIDE 65500u

/* The most bytes epd_image_decode reads (a file is refused for its size
 * before its format is looked at). */
#define EPD_IMAGE_MAX_BYTES ((size_t)INT32_MAX)

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
 * JPEG (GIF, BMP, text...) or a JPEG kind we do not decode (lossless,
 * arithmetic coding, 12-bit, hierarchical), EPD_ERR_MALFORMED for a PNG or JPEG whose
 * header is broken or truncated, EPD_ERR_INVALID_PARAM for NULL pointers.
 * The size is reported as declared, however large.  *info_p is written only
 * on success.  Any thread; allocates nothing.
 */
epd_status_t epd_image_probe(const void *data, size_t len, epd_image_info_t *info_p);

/*
 * Decodes the image in data[0..len) (borrowed for the call) to RGB8: grey
 * is replicated, alpha is dropped (not composited), 16-bit samples are
 * reduced to 8 bits, CMYK is multiplied out.  Refuses, in this order and
 * before allocating anything: len > EPD_IMAGE_MAX_BYTES with
 * EPD_ERR_TOO_LONG (whatever the bytes are); what epd_image_probe refuses,
 * as it does; a side over EPD_IMAGE_MAX_SIDE, or width * height over
 * max_pixels (0 means EPD_IMAGE_MAX_PIXELS_DEFAULT; exactly max_pixels is
 * accepted), with EPD_ERR_TOO_LONG.  Then EPD_ERR_NO_MEMORY, or
 * EPD_ERR_MALFORMED for pixel data the decoder refuses: corrupt or
 * truncated PNG data, a JPEG naming a quantization or Huffman table it
 * never defined, more than 500 scans, a frame differing from the header
 * (the cause is logged once at warn level: the bytes are someone
 * else's).  A JPEG whose entropy-coded data is cut short or damaged may
 * still decode (what is missing is zeros), as in browsers.  The result
 * depends on the bytes alone.  On success
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
