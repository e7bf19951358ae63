/* epd_engine_int.h — internals shared by the engine registry and the
 * built-in engines (not an API: daemons include epd_engine.h only). */
#ifndef EPD_ENGINE_INT_H
#define EPD_ENGINE_INT_H

#include "epd_engine.h"

/* The built-in `ref` engine (epd_ref.c). */
extern const epd_engine_ops_t epd__ref_ops;
/* The built-in `sim` timing model (epd_sim.c). */
extern const epd_engine_ops_t epd__sim_ops;

#endif
