/*
 * epd_config.h — long command-line flags and config files, from one table.
 *
 * A program describes its options once (name, type, where to store, range,
 * help) and gets:
 *   --name value  and  --name=value   (booleans: --name, --no-name, --name=0|1)
 *   --config FILE                     lines "name = value" (or "name value"),
 *                                     '#' comments; applied where it appears,
 *                                     so later flags override the file
 *   --help                            usage generated from the table
 * Every value is checked (type, range); the first bad one is reported with
 * the flag's name and the exact reason, and nothing is half-applied to it.
 */
#ifndef EPD_CONFIG_H
#define EPD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "epd_status.h"

typedef enum {
    EPD_OPT_STRING, /* value: const char ** (points into storage owned by the epd_opts_t) */
    EPD_OPT_INT,    /* value: int64_t * */
    EPD_OPT_DOUBLE, /* value: double * */
    EPD_OPT_BOOL,   /* value: int * (0 or 1) */
} epd_opt_type_t;

typedef struct {
    const char *name;    /* long flag without "--" */
    epd_opt_type_t type;
    void *value;         /* borrowed: where the parsed value is stored */
    double min;          /* numeric range, inclusive; ignored when min == max */
    double max;
    const char *help;    /* one line; the default is printed from *value */
} epd_opt_t;

typedef struct {
    const char *prog;    /* program name for usage and errors */
    const char *summary; /* one line printed under "usage:" */
    const epd_opt_t *opts;
    size_t n_opts;
    /* private: strings parsed from argv or files, owned here */
    char **owned_;
    size_t n_owned_;
    size_t cap_owned_;
} epd_opts_t;

/*
 * Parses argv[1..argc) into the table of `o`.  Options stop at "--" or at the
 * first argument not starting with "--"; its index goes to *argi_p (argc when
 * none).  Returns EPD_OK; EPD_ERR_CANCELED when --help printed the usage (the
 * program should exit 0); EPD_ERR_INVALID_PARAM (after one log line naming
 * the flag) for an unknown flag, a missing or bad value, a value out of
 * range, or an unreadable config file.  Strings stay valid until
 * epd_opts_cleanup.  Caller's thread.
 */
epd_status_t epd_opts_parse(epd_opts_t *o, int argc, char *const argv[], int *argi_p);

/* Applies one "name" = "value" pair (used by the config file reader; public
 * for tests and for programs that take settings from elsewhere). */
epd_status_t epd_opts_set(epd_opts_t *o, const char *name, const char *value);

/* Reads a config file of "name = value" lines into `o`. */
epd_status_t epd_opts_load_file(epd_opts_t *o, const char *path);

/* Prints the usage with every flag, its help and its current value. */
void epd_opts_usage(const epd_opts_t *o, FILE *out);

/* Frees the strings owned by `o` (string values become dangling). */
void epd_opts_cleanup(epd_opts_t *o);

#endif
