/*
 * epd_msg_sample.c — a request's SamplingParams logit adjustments into
 * engine/epd_sample's parameters (prefill and decode read them alike).
 * A file of its own: libepd_proto's users that link no engine (the
 * encoder's tools) never pull it in.
 */
#include <stdint.h>
#include <stdio.h>

#include "epd_msg.h"

epd_status_t epd_sample_params_from_msg(const Epd__SamplingParams *s, uint32_t vocab,
                                        epd_sample_params_t *sp, char *msg, size_t cap)
{
    epd_sample_adjust_t a;

    if (s->n_logit_bias_ids != s->n_logit_bias_values ||
        s->n_logit_bias_ids > EPD_SAMPLE_MAX_BIAS) {
        snprintf(msg, cap, "logit bias of %zu ids and %zu values (at most %d)", s->n_logit_bias_ids,
                 s->n_logit_bias_values, EPD_SAMPLE_MAX_BIAS);
        return EPD_ERR_INVALID_PARAM;
    }
    sp->presence_penalty = s->presence_penalty;
    sp->frequency_penalty = s->frequency_penalty;
    sp->repetition_penalty = s->repetition_penalty;
    sp->min_tokens = s->min_tokens;
    if (s->logprobs > 1 + EPD_SAMPLE_MAX_LOGPROBS) {
        snprintf(msg, cap, "logprobs %u (at most 1 + %d)", s->logprobs, EPD_SAMPLE_MAX_LOGPROBS);
        return EPD_ERR_INVALID_PARAM;
    }
    sp->logprobs = s->logprobs;
    sp->ignore_eos = s->ignore_eos != 0;
    sp->n_bias = (uint32_t)s->n_logit_bias_ids;
    for (size_t i = 0; i < s->n_logit_bias_ids; i++) {
        sp->bias[i].id = s->logit_bias_ids[i];
        sp->bias[i].bias = s->logit_bias_values[i];
    }
    if (s->n_stop_token_ids <= EPD_SAMPLE_MAX_STOP_IDS) { /* (more: decode refuses) */
        sp->n_stop_ids = (uint32_t)s->n_stop_token_ids;
        for (size_t i = 0; i < s->n_stop_token_ids; i++) {
            sp->stop_ids[i] = s->stop_token_ids[i];
        }
    }
    epd_sample_adjust_of(sp, NULL, 0, &a);
    if (epd_sample_adjust_check(&a, vocab) != EPD_OK) {
        snprintf(msg, cap,
                 "bad logit adjustments (penalties presence %g, frequency %g, repetition %g; "
                 "a bias id >= %u or outside [-100, 100]?)",
                 (double)sp->presence_penalty, (double)sp->frequency_penalty,
                 (double)sp->repetition_penalty, vocab);
        return EPD_ERR_INVALID_PARAM;
    }
    return EPD_OK;
}
