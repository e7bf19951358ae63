/*
 * epd_http_auth.c — the API keys of the HTTP server (see epd_http.h, "keys"):
 * a set of BLAKE2b-256 digests, read from a key file at start-up, and the
 * check of an Authorization header against them.
 *
 * Why digests: comparing a presented key with a stored one byte by byte
 * (memcmp, strcmp) ends at the first difference, and comparing lengths
 * first tells an attacker how long a key is; a digest has a fixed length,
 * so one sodium_memcmp over 32 bytes per stored key takes the same time
 * whatever was presented.  The keys themselves are never kept.
 *
 * Pure code below epd_http_server.c (which checks requests with it); it
 * calls nothing else of the server.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "epd_alloc.h"
#include "epd_http_int.h"
#include "epd_log.h"

#define EPD_HTTP_KEY_DIGEST 32                  /* BLAKE2b-256 */
#define EPD_HTTP_KEY_FILE_MAX ((size_t)1 << 20) /* a key file over this is refused */

struct epd_http_keys {
    unsigned char (*digest)[EPD_HTTP_KEY_DIGEST]; /* [n] */
    size_t n;
    size_t cap;
};

epd_status_t epd_http_keys_create(epd_http_keys_t **keys_p)
{
    epd_http_keys_t *keys;

    if (sodium_init() < 0) {
        return EPD_ERR_IO;
    }
    keys = epd_calloc(1, sizeof(*keys));
    if (keys == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    *keys_p = keys;
    return EPD_OK;
}

void epd_http_keys_destroy(epd_http_keys_t *keys)
{
    if (keys == NULL) {
        return;
    }
    if (keys->digest != NULL) {
        sodium_memzero(keys->digest, keys->cap * sizeof(*keys->digest));
    }
    epd_free(keys->digest);
    epd_free(keys);
}

size_t epd_http_keys_count(const epd_http_keys_t *keys)
{
    return keys != NULL ? keys->n : 0;
}

/* A byte a Bearer token may hold here: visible ASCII. */
static int epd_http_key_byte_ok(unsigned char c)
{
    return c > 0x20 && c < 0x7f;
}

epd_status_t epd_http_keys_add(epd_http_keys_t *keys, const char *key, size_t len)
{
    if (keys == NULL || key == NULL || len == 0) {
        return EPD_ERR_INVALID_PARAM;
    }
    for (size_t i = 0; i < len; i++) {
        if (!epd_http_key_byte_ok((unsigned char)key[i])) {
            return EPD_ERR_INVALID_PARAM;
        }
    }
    if (keys->n == keys->cap) {
        size_t cap = keys->cap < 4 ? 4 : keys->cap * 2;
        unsigned char(*d)[EPD_HTTP_KEY_DIGEST] = epd_calloc(cap, sizeof(*d));

        if (d == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        if (keys->n > 0) {
            memcpy(d, keys->digest, keys->n * sizeof(*d));
            sodium_memzero(keys->digest, keys->cap * sizeof(*keys->digest));
        }
        epd_free(keys->digest);
        keys->digest = d;
        keys->cap = cap;
    }
    crypto_generichash(keys->digest[keys->n], EPD_HTTP_KEY_DIGEST, (const unsigned char *)key, len,
                       NULL, 0);
    keys->n++;
    return EPD_OK;
}

int epd_http_keys_check(const epd_http_keys_t *keys, const char *authorization)
{
    unsigned char d[EPD_HTTP_KEY_DIGEST];
    const char *tok;
    size_t len;
    int match = 0;

    if (keys == NULL || authorization == NULL || strncasecmp(authorization, "Bearer ", 7) != 0) {
        return 0;
    }
    tok = authorization + 7;
    while (*tok == ' ' || *tok == '\t') {
        tok++;
    }
    len = strlen(tok);
    while (len > 0 && (tok[len - 1] == ' ' || tok[len - 1] == '\t')) {
        len--;
    }
    if (len == 0) {
        return 0;
    }
    /* Hash whatever was presented (its length is the client's own
     * business), then compare fixed-length digests with every key: no early
     * exit, so the time does not say which key, if any, came close. */
    crypto_generichash(d, sizeof(d), (const unsigned char *)tok, len, NULL, 0);
    for (size_t i = 0; i < keys->n; i++) {
        match |= sodium_memcmp(d, keys->digest[i], sizeof(d)) == 0;
    }
    sodium_memzero(d, sizeof(d));
    return match;
}

/* The whole file into an epd_malloc'ed, NUL-terminated buffer. */
static epd_status_t epd_http_keys_read(const char *path, char **data_p, size_t *len_p, char *why,
                                       size_t why_cap)
{
    struct stat st;
    char *data;
    size_t len = 0;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_cap, "cannot open it: %s", strerror(errno));
        return errno == ENOENT ? EPD_ERR_NOT_FOUND : EPD_ERR_IO;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, why_cap, "not a regular file");
        close(fd);
        return EPD_ERR_IO;
    }
    if ((size_t)st.st_size > EPD_HTTP_KEY_FILE_MAX) {
        snprintf(why, why_cap, "%lld bytes: a key file is at most %zu", (long long)st.st_size,
                 EPD_HTTP_KEY_FILE_MAX);
        close(fd);
        return EPD_ERR_TOO_LONG;
    }
    if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
        epd_log_warn(EPD_HTTP_LOG, 0,
                     "the API key file %s can be read by its group or others (mode %04o): "
                     "chmod 600 it",
                     path, (unsigned)(st.st_mode & 07777));
    }
    data = epd_malloc(EPD_HTTP_KEY_FILE_MAX + 1);
    if (data == NULL) {
        close(fd);
        snprintf(why, why_cap, "out of memory");
        return EPD_ERR_NO_MEMORY;
    }
    for (;;) {
        ssize_t k = read(fd, data + len, EPD_HTTP_KEY_FILE_MAX + 1 - len);

        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k < 0) {
            snprintf(why, why_cap, "cannot read it: %s", strerror(errno));
            sodium_memzero(data, len);
            epd_free(data);
            close(fd);
            return EPD_ERR_IO;
        }
        if (k == 0) {
            break;
        }
        len += (size_t)k;
        if (len > EPD_HTTP_KEY_FILE_MAX) {
            snprintf(why, why_cap, "over %zu bytes", EPD_HTTP_KEY_FILE_MAX);
            sodium_memzero(data, len);
            epd_free(data);
            close(fd);
            return EPD_ERR_TOO_LONG;
        }
    }
    close(fd);
    data[len] = '\0';
    *data_p = data;
    *len_p = len;
    return EPD_OK;
}

epd_status_t epd_http_keys_load(const char *path, epd_http_keys_t **keys_p, char *why,
                                size_t why_cap)
{
    epd_http_keys_t *keys = NULL;
    char *data = NULL;
    size_t len = 0;
    size_t line = 0;
    epd_status_t st;

    st = epd_http_keys_read(path, &data, &len, why, why_cap);
    if (st != EPD_OK) {
        return st;
    }
    st = epd_http_keys_create(&keys);
    if (st != EPD_OK) {
        snprintf(why, why_cap, "out of memory");
        goto err_free_data;
    }
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(data + at, '\n', len - at);
        size_t end = nl != NULL ? (size_t)(nl - data) : len;
        size_t a = at, b = end;

        line++;
        at = end + 1;
        while (a < b && (data[a] == ' ' || data[a] == '\t' || data[a] == '\r')) {
            a++;
        }
        while (b > a && (data[b - 1] == ' ' || data[b - 1] == '\t' || data[b - 1] == '\r')) {
            b--;
        }
        if (a == b || data[a] == '#') {
            continue;
        }
        st = epd_http_keys_add(keys, data + a, b - a);
        if (st == EPD_ERR_INVALID_PARAM) {
            /* the key itself stays out of the message */
            snprintf(why, why_cap,
                     "line %zu: a key may hold only visible ASCII characters (no spaces)", line);
            goto err_destroy_keys;
        }
        if (st != EPD_OK) {
            snprintf(why, why_cap, "out of memory");
            goto err_destroy_keys;
        }
    }
    if (keys->n == 0) {
        snprintf(why, why_cap, "no key in it (one key a line; '#' starts a comment)");
        st = EPD_ERR_INVALID_PARAM;
        goto err_destroy_keys;
    }
    sodium_memzero(data, len);
    epd_free(data);
    *keys_p = keys;
    return EPD_OK;

err_destroy_keys:
    epd_http_keys_destroy(keys);
err_free_data:
    sodium_memzero(data, len);
    epd_free(data);
    return st;
}
