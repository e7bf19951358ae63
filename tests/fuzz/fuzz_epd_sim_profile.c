/*
 * libFuzzer target for the sim engine's profile parsers
 * (engine/epd_sim_profile): any text is parsed into a checked profile or
 * refused with a reason.  `make fuzz`.
 */
#include <stdint.h>

#include "epd_log.h"
#include "epd_sim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    epd_sim_model_t model;
    epd_sim_accel_t accel;

    epd_log_set_level(EPD_LOG_ERROR);
    (void)epd_sim_model_parse((const char *)data, size, "fuzz", &model);
    (void)epd_sim_accel_parse((const char *)data, size, "fuzz", &accel);
    return 0;
}
