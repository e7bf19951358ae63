/*
 * epd_router_dispatch.c — an attempt's workers and its submission: the
 * prefill and decode worker (and an encoder per image) the registry's
 * policy picks among those with room, around the prefill/decode pairs
 * known to be broken, and the request submitted through the request-plane
 * client — a migrated attempt (proto/README.md rule 37) with the tokens
 * already streamed at the end of its prompt.  Part of a request's life
 * (epd_router_req.c, which alone changes its state, calls it); calls the
 * registry, the hints, the client and the metrics.
 */
#include <string.h>

#include "epd_alloc.h"
#include "epd_log.h"
#include "epd_router_int.h"
#include "epd_time.h"

/* ----------------------------------------------------------- broken pairs */

/* The slot remembering the pair (p, d) — these two incarnations — or NULL. */
static epd_router_pair_t *epd_router_pair_slot(epd_router_t *rt, const epd_router_worker_t *p,
                                               const epd_router_worker_t *d)
{
    for (int i = 0; i < EPD_ROUTER_PAIRS_MAX; i++) {
        epd_router_pair_t *b = &rt->broken[i];

        if (b->prefill[0] != '\0' && b->p_registered_ns == p->registered_ns &&
            b->d_registered_ns == d->registered_ns && strcmp(b->prefill, p->info.worker_id) == 0 &&
            strcmp(b->decode, d->info.worker_id) == 0) {
            return b;
        }
    }
    return NULL;
}

/* The broken pair (p, d) still avoided, or NULL. */
static epd_router_pair_t *epd_router_pair_find(epd_router_t *rt, const epd_router_worker_t *p,
                                               const epd_router_worker_t *d, uint64_t now_ns)
{
    epd_router_pair_t *b = epd_router_pair_slot(rt, p, d);

    return b != NULL && b->until_ns > now_ns ? b : NULL;
}

/* Remembers (p, d) as broken: avoided for EPD_ROUTER_PAIR_PROBE_MS, twice
 * that for each failure in a row, at most EPD_ROUTER_PAIR_BROKEN_MS (a
 * free or the oldest slot makes room). */
void epd__router_pair_break(epd_router_t *rt, const epd_router_worker_t *p,
                            const epd_router_worker_t *d, uint64_t now_ns)
{
    epd_router_pair_t *b = epd_router_pair_slot(rt, p, d);
    uint64_t ms;

    if (b == NULL) {
        b = &rt->broken[0];
        for (int i = 1; i < EPD_ROUTER_PAIRS_MAX && b->prefill[0] != '\0'; i++) {
            if (rt->broken[i].prefill[0] == '\0' || rt->broken[i].until_ns < b->until_ns) {
                b = &rt->broken[i];
            }
        }
        memset(b, 0, sizeof(*b));
        snprintf(b->prefill, sizeof(b->prefill), "%s", p->info.worker_id);
        snprintf(b->decode, sizeof(b->decode), "%s", d->info.worker_id);
        b->p_registered_ns = p->registered_ns;
        b->d_registered_ns = d->registered_ns;
    } else if (b->until_ns > now_ns) {
        return; /* another request of the same failure: one strike */
    }
    ms = (uint64_t)EPD_ROUTER_PAIR_PROBE_MS << (b->strikes < 8 ? b->strikes : 8);
    ms = ms > EPD_ROUTER_PAIR_BROKEN_MS ? EPD_ROUTER_PAIR_BROKEN_MS : ms;
    b->strikes++;
    b->until_ns = now_ns + ms * 1000000ull;
    epd_log_warn(EPD_ROUTER_LOG, 0,
                 "prefill worker '%s' and decode worker '%s' reach the router but not each "
                 "other: routing around the pair for %llu ms (failure %u in a row)",
                 b->prefill, b->decode, (unsigned long long)ms, b->strikes);
}

void epd__router_pair_ok(epd_router_t *rt, const epd_router_worker_t *p,
                         const epd_router_worker_t *d)
{
    epd_router_pair_t *b = epd_router_pair_slot(rt, p, d);

    if (b != NULL) {
        epd_log_info(EPD_ROUTER_LOG, 0,
                     "prefill worker '%s' and decode worker '%s' serve together again", b->prefill,
                     b->decode);
        memset(b, 0, sizeof(*b));
    }
}

/* The policy's decode worker for prefill worker `pw`, around a broken pair:
 * another decode worker when there is one; else *pw_p becomes another
 * prefill worker for `dw` when there is one; else the pair as is (trying
 * it beats refusing). */
static epd_router_worker_t *epd_router_pick_around(epd_router_t *rt, epd_router_req_t *r,
                                                   epd_router_worker_t **pw_p,
                                                   epd_router_worker_t *dw, uint64_t now_ns)
{
    epd_router_worker_t *avoid[EPD_ROUTER_MAX_AVOID + 1];
    epd_router_worker_t *alt;

    if (epd_router_pair_find(rt, *pw_p, dw, now_ns) == NULL) {
        return dw;
    }
    memcpy(avoid, r->avoid, r->n_avoid * sizeof(avoid[0]));
    avoid[r->n_avoid] = dw;
    alt = epd_router_registry_pick(&rt->reg, EPD_CLIENT_ROLE_DECODE, r->prompt, r->n_prompt, avoid,
                                   r->n_avoid + 1);
    if (alt != NULL && epd_router_pair_find(rt, *pw_p, alt, now_ns) == NULL) {
        return alt;
    }
    if (r->n_images == 0) {
        avoid[r->n_avoid] = *pw_p;
        alt = epd_router_registry_pick(&rt->reg, EPD_CLIENT_ROLE_PREFILL, r->prompt, r->n_prompt,
                                       avoid, r->n_avoid + 1);
        if (alt != NULL && epd_router_pair_find(rt, alt, dw, now_ns) == NULL) {
            *pw_p = alt;
        }
    }
    return dw;
}

/* --------------------------------------------------------------- dispatch */

/* Lets `r` use again the workers it avoids (they failed an earlier
 * attempt) that have since proved alive: still registered, READY, a
 * heartbeat after they were avoided — a worker stopped a while and
 * resumed, not a broken one.  Called when the request finds no pair
 * otherwise.  Returns how many it let go. */
static uint32_t epd_router_avoid_expire(epd_router_t *rt, epd_router_req_t *r)
{
    uint32_t kept = 0, n = r->n_avoid;

    for (uint32_t i = 0; i < n; i++) {
        epd_router_worker_t *w = r->avoid[i];

        /* only a worker still in the registry is looked at: an entry may
         * outlive the worker it names (they are not referenced) */
        if (epd_router_registry_has(&rt->reg, w) && w->state == EPD_ROUTER_READY &&
            w->last_hb_ns > r->avoid_ns[i]) {
            continue;
        }
        r->avoid[kept] = w;
        r->avoid_ns[kept++] = r->avoid_ns[i];
    }
    r->n_avoid = kept;
    return n - kept;
}

/* Submits an attempt to a prefill and a decode worker chosen by the
 * policy among those with room.  EPD_OK; EPD_ERR_UNREACHABLE (no eligible
 * worker), EPD_ERR_NO_CAPACITY (workers, but none with room now: the
 * request waits), EPD_ERR_NO_RESOURCE (transport backpressure: it waits
 * too), EPD_ERR_OUT_OF_RANGE (no prefill or decode pool could ever hold
 * it: r->never_* say which and how much; nothing was reserved),
 * EPD_ERR_TOO_LONG, other submit errors. */
epd_status_t epd__router_dispatch(epd_router_t *rt, epd_router_req_t *r, uint64_t now_ns)
{
    epd_client_request_t q;
    epd_status_t st = EPD_ERR_UNREACHABLE;
    epd_router_probe_t probe, *pp = NULL;
    epd_prefix_media_t pm[EPD_CLIENT_MEDIA_MAX];
    epd_prefix_hash_t salted;
    int expired = 0;
    epd_router_fit_t whole = {.n_prompt = r->n_prompt, .max_new = r->max_new};

    /* a prompt no pool can ever hold would wait for room that never comes
     * (issue #25: long contexts): refused up front, before any reservation */
    if (epd_router_registry_never_fits(&rt->reg, EPD_CLIENT_ROLE_DECODE, &whole, &r->never_limit)) {
        r->never_role = EPD_CLIENT_ROLE_DECODE;
        r->never_need = (uint64_t)r->n_prompt + r->max_new;
        return EPD_ERR_OUT_OF_RANGE;
    }
    if (epd_router_registry_never_fits(&rt->reg, EPD_CLIENT_ROLE_PREFILL, &whole,
                                       &r->never_limit)) {
        r->never_role = EPD_CLIENT_ROLE_PREFILL;
        r->never_need = r->n_prompt;
        return EPD_ERR_OUT_OF_RANGE;
    }

    if (rt->reg.policy == EPD_ROUTER_POLICY_PREFIX_AFFINITY) {
        /* KV-aware: the prompt's block keys, hashed as far as a worker holds them */
        memset(&probe, 0, sizeof(probe));
        probe.plain = rt->prefix_plain.b;
        probe.root = rt->prefix_plain.b;
        if (r->oai->cache_salt != NULL) {
            epd_prefix_root(epd_engine_name(rt->engine), rt->info, r->oai->cache_salt,
                            strlen(r->oai->cache_salt), &salted);
            probe.root = salted.b;
        }
        for (uint32_t k = 0; k < r->n_images && k < EPD_CLIENT_MEDIA_MAX; k++) {
            pm[k] = (epd_prefix_media_t){
                .pos = r->img_pos[k], .n = rt->info->image_embeddings, .hash = r->img_hash[k]};
        }
        probe.media = pm;
        probe.n_media = r->n_images;
        probe.block_tokens = rt->info->kv.block_tokens;
        probe.tokens = r->prompt;
        probe.n_tokens = r->n_prompt;
        probe.hints = rt->probe_hints;
        probe.cap = rt->info->max_context / rt->info->kv.block_tokens;
        pp = &probe;
    }

    for (int tries = 0; tries < 4; tries++) {
        epd_router_fit_t fit = {.n_prompt = r->n_prompt, .max_new = r->max_new};
        epd_router_worker_t *pw, *dw;
        int p_full = 0, d_full = 0;
        uint64_t left_ms;

        epd_client_media_t media[EPD_CLIENT_MEDIA_MAX];
        epd_router_worker_t *ew[EPD_CLIENT_MEDIA_MAX];
        uint64_t t_send;

        /* a group's later choice: the prefill worker that computed its
         * prompt for the first (its prefix cache holds it), when it can
         * take it now; else the policy's pick */
        pw = r->pin_prefill[0] != '\0'
                 ? epd_router_registry_pinned(&rt->reg, EPD_CLIENT_ROLE_PREFILL, r->pin_prefill,
                                              &fit, r->avoid, r->n_avoid)
                 : NULL;
        pw = pw != NULL        ? pw
             : r->n_images > 0
                 ? epd_router_registry_pick_images(&rt->reg, r->prompt, r->n_prompt,
                                                   (const unsigned char(*)[32])r->img_hash,
                                                   r->n_images, r->avoid, r->n_avoid, now_ns)
                 : epd_router_registry_pick_room_kv(&rt->reg, EPD_CLIENT_ROLE_PREFILL, pp,
                                                    r->prompt, &fit, r->avoid, r->n_avoid, &p_full);
        /* no decode worker whose free blocks cannot hold it (rule 30) */
        dw = epd_router_registry_pick_room_kv(&rt->reg, EPD_CLIENT_ROLE_DECODE, pp, r->prompt, &fit,
                                              r->avoid, r->n_avoid, &d_full);
        if (pw == NULL || dw == NULL) {
            if ((pw != NULL || p_full) && (dw != NULL || d_full)) {
                return EPD_ERR_NO_CAPACITY; /* workers exist but are full: it waits for room */
            }
            if (!expired && rt->no_worker_wait_ms > 0 && epd_router_avoid_expire(rt, r) > 0) {
                expired = 1;
                continue; /* once more with the workers that came back */
            }
            return EPD_ERR_UNREACHABLE;
        }
        dw = epd_router_pick_around(rt, r, &pw, dw, now_ns);
        /* each image: the prefill worker's cache when we believe it holds
         * it, else the least loaded encoder, else the prefill worker itself */
        for (uint32_t k = 0; k < r->n_images; k++) {
            const epd_oai_image_t *im = &r->oai->images[k];

            memset(&media[k], 0, sizeof(media[k]));
            media[k].hash = r->img_hash[k];
            media[k].pos = r->img_pos[k];
            media[k].n = rt->info->image_embeddings;
            ew[k] = NULL;
            if (!r->no_hints && epd_router_cache_has(pw, r->img_hash[k], now_ns)) {
                r->img_src[k] = EPD_ROUTER_IMG_CACHE;
                continue;
            }
            media[k].image = im->data;
            media[k].image_len = im->len;
            ew[k] = r->oai->encode_local
                        ? NULL
                        : epd_router_registry_pick(&rt->reg, EPD_CLIENT_ROLE_ENCODER, NULL, 0,
                                                   r->avoid, r->n_avoid);
            if (ew[k] != NULL) {
                media[k].encoder = ew[k]->cw;
                r->img_src[k] = EPD_ROUTER_IMG_ENCODER;
            } else {
                media[k].inline_data = 1;
                r->img_src[k] = EPD_ROUTER_IMG_INLINE;
            }
        }
        left_ms = r->deadline_ns > now_ns ? (r->deadline_ns - now_ns) / 1000000ull : 0;
        if (left_ms == 0) {
            return EPD_ERR_TIMEOUT;
        }
        memset(&q, 0, sizeof(q));
        q.prompt = r->prompt;
        q.n_prompt = r->n_prompt;
        if (r->n_out > 0) {
            /* migrated (rule 37): the tokens out so far end its prompt;
             * prefill recomputes their KV, decode goes on at index n_out */
            size_t n = (size_t)r->n_prompt + r->n_out;

            if (rt->mig_prompt_cap < n) {
                uint32_t *p = epd_realloc(rt->mig_prompt, n * sizeof(*p));

                if (p == NULL) {
                    return EPD_ERR_NO_MEMORY;
                }
                rt->mig_prompt = p;
                rt->mig_prompt_cap = n;
            }
            memcpy(rt->mig_prompt, r->prompt, (size_t)r->n_prompt * sizeof(uint32_t));
            memcpy(rt->mig_prompt + r->n_prompt, r->out, (size_t)r->n_out * sizeof(uint32_t));
            q.prompt = rt->mig_prompt;
            q.n_prompt = r->n_prompt + r->n_out;
            q.resume_generated = r->n_out;
        }
        q.temperature = (float)r->oai->temperature;
        q.top_p = (float)r->oai->top_p;
        q.top_k = r->oai->top_k > 0 ? (uint32_t)r->oai->top_k : 0;
        q.seed = r->seed;
        q.max_tokens = r->max_new;
        q.presence_penalty = (float)r->oai->presence_penalty;
        q.frequency_penalty = (float)r->oai->frequency_penalty;
        q.repetition_penalty = (float)r->oai->repetition_penalty;
        q.bias_ids = r->oai->bias_ids;
        q.bias_values = r->oai->bias_values;
        q.n_bias = (uint32_t)r->oai->n_bias;
        q.min_tokens = (uint32_t)r->oai->min_tokens;
        q.ignore_eos = r->oai->ignore_eos;
        q.logprobs = r->oai->want_logprobs ? 1 + r->oai->top_logprobs : 0;
        q.stop_ids = r->oai->stop_token_ids;
        q.n_stop_ids = (uint32_t)r->oai->n_stop_token_ids;
        q.prefill = pw->cw;
        q.decode = dw->cw;
        q.deadline_ms = (uint32_t)(left_ms > UINT32_MAX ? UINT32_MAX : left_ms);
        q.user = r;
        q.media = r->n_images > 0 ? media : NULL;
        q.n_media = r->n_images;
        q.cache_salt = r->oai->cache_salt;
        q.cache_salt_len = r->oai->cache_salt != NULL ? strlen(r->oai->cache_salt) : 0;
        /* before the messages go: a worker may start on them before
         * submit returns, and its durations must lie after this (rule 38) */
        t_send = epd_time_now_ns();
        st = epd_client_submit(rt->client, &q, &r->client_id);
        if (st == EPD_OK) {
            for (uint32_t k = 0; k < r->n_images; k++) {
                r->img_enc[k] = ew[k];
                if (ew[k] != NULL) {
                    epd_router_worker_ref(ew[k]);
                    ew[k]->inflight++;
                    ew[k]->served++;
                }
            }
            if (rt->trace != NULL) {
                uint64_t t = epd_time_now_ns();

                if (r->attempts == 0) {
                    epd_trace_span(rt->trace, "parse + tokenize", "router", r->client_id, -1,
                                   r->t_arrival_ns, r->t_parsed_ns);
                    epd_trace_span(rt->trace, "choose + submit", "router", r->client_id, -1,
                                   r->t_parsed_ns, t);
                } else {
                    epd_trace_instant(rt->trace, "resubmitted", "router", r->client_id,
                                      (int32_t)r->attempts, t);
                }
                r->t_submit_ns = t;
            }
            r->trace_id = r->client_id;
            r->pw = pw;
            r->dw = dw;
            epd_router_worker_ref(pw);
            epd_router_worker_ref(dw);
            pw->inflight++;
            dw->inflight++;
            pw->served++;
            dw->served++;
            r->n_base = r->n_out;
            pw->queued_tokens += q.n_prompt; /* until its first token */
            r->dw_blocks = epd_router_decode_blocks(dw, &fit);
            dw->kv_pending += r->dw_blocks; /* until its next heartbeat says */
            r->t_dispatch_ns = now_ns;
            r->t_sent_ns = t_send; /* now_ns may be the arrival's own reading */
            if (pp != NULL) {
                /* they will hold the prompt's blocks: the next request with
                 * this prefix goes there before any heartbeat says so */
                epd_router_hints_expect(pw, pp, UINT32_MAX);
                if (r->n_images == 0) { /* decode never keeps a prompt with images */
                    epd_router_hints_expect(dw, pp,
                                            r->n_prompt > 0 && pp->block_tokens > 0
                                                ? (r->n_prompt - 1) / pp->block_tokens
                                                : 0);
                }
            }
            if (r->attempts++ == 0) {
                epd_router_histo_observe(&rt->m.dispatch, (double)(now_ns - r->t_arrival_ns) / 1e9);
            }
            return EPD_OK;
        }
        if (st != EPD_ERR_PEER_DEAD) {
            return st;
        }
        /* an endpoint that failed since the pick: never pick it again */
        {
            int bad_p = epd_client_worker_state(pw->cw) != EPD_OK;
            int bad_d = epd_client_worker_state(dw->cw) != EPD_OK;
            int bad_e = 0;

            for (uint32_t k = 0; k < r->n_images; k++) {
                if (ew[k] != NULL && ew[k]->state != EPD_ROUTER_DEAD &&
                    epd_client_worker_state(ew[k]->cw) != EPD_OK) {
                    epd_router_worker_kill(ew[k], now_ns);
                    rt->m.workers_died++;
                    bad_e = 1;
                }
            }
            if (!bad_p && !bad_d) {
                if (bad_e) {
                    continue;
                }
                return st;
            }
            if (bad_p) {
                epd_router_worker_kill(pw, now_ns);
                rt->m.workers_died++;
            }
            if (bad_d) {
                epd_router_worker_kill(dw, now_ns);
                rt->m.workers_died++;
            }
        }
    }
    return st;
}
