/*
 * epd_msg_logprob.c — TokenLogprob messages to and from engine/epd_sample's
 * epd_sample_logprob_t (the struct only: no engine code, so the
 * request-plane client, which links no engine, can read them).
 */
#include <stdint.h>

#include "epd_msg.h"

void epd_token_logprob_view(const epd_sample_logprob_t *lp, Epd__TokenLogprob *msg)
{
    epd__token_logprob__init(msg);
    msg->logprob = lp->logprob;
    msg->n_top_ids = lp->n_top;
    msg->top_ids = (uint32_t *)(uintptr_t)lp->top_ids;
    msg->n_top_logprobs = lp->n_top;
    msg->top_logprobs = (double *)(uintptr_t)lp->top_logprobs;
}

int epd_token_logprob_read(const Epd__TokenLogprob *msg, uint32_t vocab, epd_sample_logprob_t *lp)
{
    if (msg == NULL || msg->n_top_ids != msg->n_top_logprobs ||
        msg->n_top_ids > EPD_SAMPLE_MAX_LOGPROBS) {
        return -1;
    }
    lp->logprob = msg->logprob;
    lp->n_top = (uint32_t)msg->n_top_ids;
    for (size_t i = 0; i < msg->n_top_ids; i++) {
        if (msg->top_ids[i] >= vocab) {
            return -1;
        }
        lp->top_ids[i] = msg->top_ids[i];
        lp->top_logprobs[i] = msg->top_logprobs[i];
    }
    return 0;
}
