/* epd_status.c — strings and scopes of epd_status_t, from the one X-macro list. */
#include "epd_status.h"

const char *epd_status_string(epd_status_t status)
{
    switch (status) {
#define EPD__STATUS_STR(name, value, text) \
    case name:                             \
        return text;
        EPD_STATUS_LIST(EPD__STATUS_STR)
#undef EPD__STATUS_STR
    }
    return "unknown status";
}

const char *epd_status_name(epd_status_t status)
{
    switch (status) {
#define EPD__STATUS_NAME(name, value, text) \
    case name:                              \
        return #name;
        EPD_STATUS_LIST(EPD__STATUS_NAME)
#undef EPD__STATUS_NAME
    }
    return "EPD_UNKNOWN_STATUS";
}

epd_status_scope_t epd_status_scope(epd_status_t status)
{
    int v = (int)status;

    if (v >= 0) {
        return EPD_SCOPE_NONE;
    }
    if (v > -100) {
        return EPD_SCOPE_REQUEST;
    }
    if (v > -200) {
        return EPD_SCOPE_CONNECTION;
    }
    if (v > -300) {
        return EPD_SCOPE_PEER;
    }
    return EPD_SCOPE_NODE;
}
