/*
 * epd_secret.c — the cluster secret file (see epd_secret.h).
 */
#include "epd_secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

epd_status_t epd_secret_load(const char *path, epd_secret_t *secret_p, char *why, size_t cap)
{
    unsigned char buf[EPD_SECRET_MAX + 2];
    struct stat sb;
    ssize_t n;
    size_t len;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, cap, "cannot open '%s': %s", path, strerror(errno));
        return EPD_ERR_IO;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(why, cap, "'%s' is not a regular file", path);
        close(fd);
        return EPD_ERR_CONFIG;
    }
    if ((sb.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
        snprintf(why, cap, "'%s' may be read by other users (mode %03o): chmod 600 it", path,
                 (unsigned)(sb.st_mode & 0777));
        close(fd);
        return EPD_ERR_CONFIG;
    }
    n = read(fd, buf, sizeof(buf));
    close(fd);
    if (n < 0) {
        snprintf(why, cap, "cannot read '%s': %s", path, strerror(errno));
        return EPD_ERR_IO;
    }
    len = (size_t)n;
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' ||
                       buf[len - 1] == '\t')) {
        len--;
    }
    if (len < EPD_SECRET_MIN || len > EPD_SECRET_MAX) {
        snprintf(why, cap, "'%s' holds %zu bytes: a secret is %d to %d bytes", path, len,
                 EPD_SECRET_MIN, EPD_SECRET_MAX);
        sodium_memzero(buf, sizeof(buf));
        return EPD_ERR_CONFIG;
    }
    memcpy(secret_p->bytes, buf, len);
    secret_p->len = len;
    sodium_memzero(buf, sizeof(buf));
    return EPD_OK;
}

void epd_secret_wipe(epd_secret_t *secret)
{
    sodium_memzero(secret->bytes, sizeof(secret->bytes));
    secret->len = 0;
}
