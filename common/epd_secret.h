/*
 * epd_secret.h — the cluster secret, read from the file every member of a
 * cluster is given (--cluster-secret-file).
 *
 * The file holds the secret's bytes; a trailing newline (and whitespace
 * after the last byte) is not part of it, so `head -c 32 /dev/urandom |
 * base64 > FILE` and an editor both work.  At least EPD_SECRET_MIN bytes,
 * at most EPD_SECRET_MAX.  A file that other users may read is refused: the
 * secret is what makes a process a member of the cluster.
 */
#ifndef EPD_SECRET_H
#define EPD_SECRET_H

#include <stddef.h>

#include "epd_status.h"

#define EPD_SECRET_MIN 16
#define EPD_SECRET_MAX 1024

typedef struct {
    unsigned char bytes[EPD_SECRET_MAX];
    size_t len; /* 0: no secret */
} epd_secret_t;

/*
 * Reads `path` into *secret_p (caller's storage).  EPD_OK; otherwise
 * EPD_ERR_IO (cannot read it), EPD_ERR_CONFIG (group or world may read it,
 * or it is shorter than EPD_SECRET_MIN or longer than EPD_SECRET_MAX) with
 * why[0..cap) saying which.  Nothing is written to *secret_p on failure.
 */
epd_status_t epd_secret_load(const char *path, epd_secret_t *secret_p, char *why, size_t cap);

/* Wipes the bytes (the compiler may not drop it). */
void epd_secret_wipe(epd_secret_t *secret);

#endif
