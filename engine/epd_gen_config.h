/*
 * epd_gen_config.h — the default sampling of a Hugging Face model folder's
 * generation_config.json (temperature, top_p, top_k), which a server
 * applies to a request that does not give them (as vLLM does with its
 * default --generation-config auto).  do_sample is not read (vLLM does not
 * either): a folder that wants greedy decoding says temperature 0.
 */
#ifndef EPD_GEN_CONFIG_H
#define EPD_GEN_CONFIG_H

#include <stdint.h>

#include "epd_status.h"

typedef struct {
    int has_temperature;
    double temperature; /* [0, 2] */
    int has_top_p;
    double top_p; /* (0, 1] */
    int has_top_k;
    int64_t top_k; /* >= 0; 0: off */
} epd_gen_defaults_t;

/* Reads DIR/generation_config.json (borrowed path) into *out_p (caller's;
 * zeroed first).  A folder without the file has no defaults (EPD_OK, every
 * has_ 0).  A value out of range or of the wrong type is refused with one
 * log line naming the key: EPD_ERR_MALFORMED; EPD_ERR_IO when the file
 * exists but cannot be read.  Blocking (reads a file); any thread. */
epd_status_t epd_gen_defaults_load(const char *dir, epd_gen_defaults_t *out_p);

#endif
