/*
 * libFuzzer target for the request-plane decoder (proto/epd_msg.c): every
 * byte string either decodes into a checked envelope or is refused; never a
 * crash, leak or undefined behaviour.  Half of the inputs are wrapped in a
 * valid header and checksum so that the fuzzer also reaches the protobuf
 * decoder and the semantic checks behind the frame.  `make fuzz`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "epd_hash.h"
#include "epd_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Epd__Envelope *env = NULL;
    unsigned char *frame;
    uint64_t h;

    if (epd_msg_decode(data, size, &env, NULL) == EPD_OK) {
        (void)epd_msg_request_id(env);
        epd_msg_free(env);
    }
    if (size > (1u << 20)) {
        return 0;
    }
    frame = malloc(EPD_MSG_HDR_SIZE + size);
    if (frame == NULL) {
        return 0;
    }
    memset(frame, 0, EPD_MSG_HDR_SIZE);
    frame[0] = 'E';
    frame[1] = 'P';
    frame[2] = 'D';
    frame[3] = 'M';
    frame[4] = EPD_MSG_VERSION;
    for (int i = 0; i < 4; i++) {
        frame[8 + i] = (unsigned char)(size >> (8 * i));
    }
    h = epd_hash64(data, size, 0);
    for (int i = 0; i < 8; i++) {
        frame[16 + i] = (unsigned char)(h >> (8 * i));
    }
    memcpy(frame + EPD_MSG_HDR_SIZE, data, size);
    if (epd_msg_decode(frame, EPD_MSG_HDR_SIZE + size, &env, NULL) == EPD_OK) {
        (void)epd_msg_body_name(env);
        epd_msg_free(env);
    }
    free(frame);
    return 0;
}
