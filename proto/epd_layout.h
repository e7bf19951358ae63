/*
 * epd_layout.h — the KV layout between its in-memory form (the engine's
 * epd_kv_layout_t, plain data) and its wire form (epd.KvLayout).  Prefill
 * and decode must agree exactly on it before a single byte is written.
 * Pure functions, any thread.
 */
#ifndef EPD_LAYOUT_H
#define EPD_LAYOUT_H

#include "epd_engine.h"
#include "epd_msg.h"

/* Room for the layer pattern string ('A'/'L' per layer + NUL), then the
 * canonical KV dtype map string (KvLayout.kv_dtype_map) after it. */
#define EPD_LAYOUT_MAP_MAX 4096
#define EPD_LAYOUT_PATTERN_MAX (EPD_KV_MAX_LAYERS + 1 + EPD_LAYOUT_MAP_MAX)

/* Fills `msg` (caller's storage, initialized here) from `layout`;
 * msg->layer_pattern and msg->kv_dtype_map point into pattern[] (caller's
 * storage). */
void epd_layout_to_msg(const epd_kv_layout_t *layout, Epd__KvLayout *msg,
                       char pattern[EPD_LAYOUT_PATTERN_MAX]);

/* EPD_OK when `msg` describes exactly `layout` (the KV dtype map included:
 * a prefill and a decode quantizing differently would write bytes the
 * other misreads); otherwise
 * EPD_ERR_INVALID_PARAM and, when why_p is not NULL, a static string naming
 * the first field that differs. */
epd_status_t epd_layout_check(const epd_kv_layout_t *layout, const Epd__KvLayout *msg,
                              const char **why_p);

#endif
