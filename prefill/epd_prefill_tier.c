/*
 * epd_prefill_tier.c — the host and disk tier of prefill's prefix cache
 * (kv/epd_kvtier.h): a role part called only by the cache part.
 *
 * A block the cache evicts from the pool is gathered — every attention
 * layer's part of it in layer order ([attn layer][2][kv_head][tok][dim],
 * the pool's dtype), then its recurrent-state checkpoint when it has one
 * ([linear layer][state]) — into one payload and put into the tier, which
 * compresses it (byte-plane shuffle by the KV element size, zstd at
 * --kv-tier-level) and keeps it in host memory, then on disk.  A prompt
 * whose next blocks miss the pool but are in the tier gets them back into
 * fresh pool blocks (the cache part inserts them as if the request had
 * computed them) when restoring is faster than computing: the restore
 * rate (raw bytes per second of the tier's gets, disk reads included)
 * against the prefill rate (tokens per second of finished runs), both
 * EWMAs; before either is measured it restores.  Every restored block was
 * verified against the XXH3-128 of its payload; one that fails is not
 * used, and the run of restored blocks stops there (the rest computes).
 *
 * A store is a copy and a hand-off: the block is gathered into a buffer of
 * its own and the tier thread (daemon/epd_handoff) hashes, shuffles and
 * compresses it (epd_kvtier_pack, about 260 us a 64 KiB block at level 3 —
 * a long prompt evicting thousands of blocks used to hold the loop, and
 * every short prompt on the worker, for seconds); the loop inserts it when
 * it comes back.  The tier thread runs at a nice value 10 over the
 * daemon's: compressing is background work, and on a busy host it took the
 * CPU from the loop and the compute thread.  The copy is the loop's for an
 * admission that evicts a few blocks; one that evicts more
 * (EPD_PREFILL_EVICT_SYNC_MAX, cache part) hands the copies to a copy
 * thread of their own (normal priority); no chunk of the admitted
 * request's run writes a block before it is copied out (srv->blk_copy,
 * req->copy_from / copy_wait; the compute module parks a turn that would,
 * epd_prefill_compute_copied resumes it): gathering a few hundred MB on
 * the loop held every short prompt for 0.7 s.  Payload buffers are reused
 * (up to EPD_PREFILL_TIER_SPARE_BYTES kept): a fresh one cost a page fault
 * every 4 KiB it was written; a deferred store with no spare at hand gets
 * a fresh one on the copy thread (a malloc per block of a long prompt's
 * thousands held the loop: 8% of its samples in a long-mixed run).  The
 * buffers of the stores on their way are capped at the host tier's size
 * (--kv-host-bytes, at least 64 MiB): a block evicted beyond the cap is
 * not kept (counted with the tier's dropped blocks).  A lookup that meets a
 * block still on its way waits for it, so what was stored is found:
 * nothing but such a lookup ever waits.  Reads and decompression at
 * admission stay on the loop (docs/prefix-cache.md "Host and disk tier"
 * has what a block costs).
 */
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "epd_alloc.h"
#include "epd_handoff.h"
#include "epd_list.h"
#include "epd_log.h"
#include "epd_prefill_int.h"
#include "epd_time.h"

#define EPD_PREFILL_TIER_BUCKETS 4096u
#define EPD_PREFILL_TIER_JOBS_MAX 65536u
#define EPD_PREFILL_TIER_WAIT_MS 10000u
/* payload buffers kept for the next stores once theirs are in the tier */
#define EPD_PREFILL_TIER_SPARE_BYTES (64u << 20)
/* the tier thread's nice value over the daemon's (Linux: per thread) */
#define EPD_PREFILL_TIER_NICE 10

/* One store on its way.  The loop owns it but for what the tier thread
 * reads (key, payload) and writes (pk, status, then done) while it packs. */
typedef struct epd_prefill_tjob {
    struct epd_prefill_tjob *pnext;        /* srv->tier_pend bucket (loop) */
    struct epd_prefill_tjob *prev, *next;  /* srv->tier_jobs (loop; epd_list.h) */
    epd_prefill_srv_t *srv;
    epd_prefix_hash_t key;
    unsigned char *payload; /* owned; len bytes, the last ckpt_len a checkpoint */
    size_t len, ckpt_len;
    uint32_t block;          /* deferred: the pool block the KV is copied from */
    uint64_t seq;            /* deferred: its number (srv->blk_copy) */
    int deferred;            /* the copy thread copies the KV, then the tier thread packs */
    atomic_int copied;       /* the KV is in payload (a deferred job: the copy thread's) */
    int pack_submitted;      /* loop: handed to the tier thread */
    epd_kvtier_packed_t *pk; /* tier thread: the result */
    epd_status_t status;
    atomic_int done;         /* tier thread: pk and status are set */
    int taken;               /* loop: inserted (or given up), out of the bucket */
} epd_prefill_tjob_t;

static uint32_t epd_prefill_tier_bucket(const epd_prefix_hash_t *key)
{
    uint32_t b;

    memcpy(&b, key->b, sizeof(b)); /* a BLAKE2b output: any bytes index well */
    return b % EPD_PREFILL_TIER_BUCKETS;
}

/* Loop: a payload buffer (tier_blk_bytes + ckpt_bytes): a spare one, else
 * a fresh one (NULL: no memory). */
static unsigned char *epd_prefill_tier_buf_get(epd_prefill_srv_t *srv)
{
    if (srv->tier_n_spare > 0) {
        return srv->tier_spare[--srv->tier_n_spare];
    }
    return epd_malloc(srv->tier_blk_bytes + srv->ckpt_bytes);
}

/* Loop: a payload buffer back: kept as a spare while there is room (its
 * pages stay mapped: the next store's copy takes no page faults), else
 * freed.  NULL is a no-op. */
static void epd_prefill_tier_buf_put(epd_prefill_srv_t *srv, unsigned char *buf)
{
    if (buf != NULL && srv->tier_n_spare < srv->tier_spare_max) {
        srv->tier_spare[srv->tier_n_spare++] = buf;
    } else {
        epd_free(buf);
    }
}

static epd_prefill_tjob_t *epd_prefill_tier_pending(const epd_prefill_srv_t *srv,
                                                    const epd_prefix_hash_t *key)
{
    epd_prefill_tjob_t *j = srv->tier_pend[epd_prefill_tier_bucket(key)];

    while (j != NULL && memcmp(j->key.b, key->b, sizeof(key->b)) != 0) {
        j = j->pnext;
    }
    return j;
}

/* Pool block `block`'s KV, every attention layer's part in layer order,
 * into dst (tier_blk_bytes).  Any thread: the block is nobody's meanwhile. */
static void epd_prefill_tier_gather(const epd_prefill_srv_t *srv, uint32_t block,
                                    unsigned char *dst)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    const unsigned char *base = srv->pool.base;
    size_t off = 0;

    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t o;

        if (kv->kind[l] != EPD_LAYER_ATTENTION) {
            continue;
        }
        (void)epd_kv_block_offset(kv, srv->kv_blocks, l, block, &o);
        /* quantized blocks move as they are, scales included: no re-quantization */
        memcpy(dst + off, base + o, epd_kv_layer_block_bytes(kv, l));
        off += epd_kv_layer_block_bytes(kv, l);
    }
}

/* Copy thread: a deferred store's KV out of the pool, into a payload of
 * its own when the loop had no spare at hand (allocated here, not on the
 * loop: a fresh buffer per block of a long prompt's thousands of
 * evictions is a malloc each — over glibc's mmap threshold for most
 * models — that held every short prompt behind the admission).  No
 * memory: payload stays NULL, and the loop gives the store up. */
static void epd_prefill_tier_copy_out(const epd_prefill_srv_t *srv, epd_prefill_tjob_t *j)
{
    if (j->payload == NULL) {
        /* a spare's size (epd_prefill_tier_buf_get): it may become one */
        j->payload = epd_malloc(srv->tier_blk_bytes + srv->ckpt_bytes);
    }
    if (j->payload != NULL) {
        epd_prefill_tier_gather(srv, j->block, j->payload);
    }
}

static void epd_prefill_tier_copy_run(void *arg, void *job_v, uint32_t queue)
{
    epd_prefill_srv_t *srv = arg;
    epd_prefill_tjob_t *j = job_v;

    (void)queue;
    epd_prefill_tier_copy_out(srv, j);
    atomic_store_explicit(&j->copied, 1, memory_order_release);
    epd_handoff_post(srv->tier_copy_ho, j);
}

/* Tier thread: packs a store. */
static void epd_prefill_tier_run(void *arg, void *job_v, uint32_t queue)
{
    epd_prefill_srv_t *srv = arg;
    epd_prefill_tjob_t *j = job_v;

    (void)queue;
    j->status = epd_kvtier_pack(srv->tier_packer, &j->key, j->payload, j->len, j->ckpt_len,
                                &j->pk);
    atomic_store_explicit(&j->done, 1, memory_order_release);
    epd_handoff_post(srv->tier_ho, j);
}

/* Loop: a packed job into the tier (once), out of the bucket, its buffer
 * freed. */
static void epd_prefill_tier_take(epd_prefill_srv_t *srv, epd_prefill_tjob_t *j)
{
    epd_prefill_tjob_t **pp = &srv->tier_pend[epd_prefill_tier_bucket(&j->key)];
    epd_status_t st = j->status;

    if (j->taken) {
        return;
    }
    j->taken = 1;
    while (*pp != NULL && *pp != j) {
        pp = &(*pp)->pnext;
    }
    if (*pp == j) {
        *pp = j->pnext;
    }
    if (st == EPD_OK) {
        st = epd_kvtier_insert(srv->tier, j->pk); /* takes it */
        j->pk = NULL;
    }
    if (st != EPD_OK && st != EPD_ERR_TOO_LONG) {
        epd_log_warn(EPD_PREFILL_LOG, 0, "kv tier: block not kept: %s", epd_status_string(st));
    }
    srv->tier_staged -= j->len;
    epd_prefill_tier_buf_put(srv, j->payload);
    j->payload = NULL;
}

static void epd_prefill_tier_free(epd_prefill_srv_t *srv, epd_prefill_tjob_t *j)
{
    EPD_LIST_REMOVE_N(EPD_LIST_SELF, srv->tier_jobs, j);
    epd_kvtier_packed_free(j->pk);
    epd_free(j->payload);
    epd_free(j);
}

/* Loop: j (its KV copied) onto the packing queue, once.  EPD_OK, or the
 * job is given up (taken, freed with the rest at cleanup: the queue holds
 * every job, so this is not reached). */
static epd_status_t epd_prefill_tier_pack_submit(epd_prefill_srv_t *srv, epd_prefill_tjob_t *j)
{
    j->pack_submitted = 1;
    if (j->payload == NULL || epd_handoff_submit(srv->tier_ho, 0, j) != EPD_OK) {
        /* no payload: the copy thread had no memory for it */
        j->status = j->payload == NULL ? EPD_ERR_NO_MEMORY : EPD_ERR_NO_RESOURCE;
        atomic_store(&j->done, 1);
        epd_prefill_tier_take(srv, j);
        return EPD_ERR_NO_RESOURCE;
    }
    return EPD_OK;
}

/* Loop: the copy thread copied a deferred store out of the pool. */
static void epd_prefill_tier_on_copied(void *arg, void *ev)
{
    epd_prefill_srv_t *srv = arg;
    epd_prefill_tjob_t *j = ev;

    /* copies run in order: every store up to this one is out */
    srv->tier_copied = j->seq > srv->tier_copied ? j->seq : srv->tier_copied;
    if (srv->blk_copy[j->block] == j->seq) {
        srv->blk_copy[j->block] = 0;
    }
    if (srv->compute != NULL) {
        epd_prefill_compute_copied(srv->compute, srv->tier_copied); /* parked runs go on */
    }
    if (!j->pack_submitted) {
        (void)epd_prefill_tier_pack_submit(srv, j);
    }
}

/* Loop: the tier thread packed a store. */
static void epd_prefill_tier_on_event(void *arg, void *ev)
{
    epd_prefill_srv_t *srv = arg;
    epd_prefill_tjob_t *j = ev;

    epd_prefill_tier_take(srv, j);
    epd_prefill_tier_free(srv, j);
}

/* Loop: waits (bounded) for the pending store of key, then inserts it.
 * The thread copies before it packs, and packs in order, so this waits for
 * the stores before it too. */
static void epd_prefill_tier_wait_for(epd_prefill_srv_t *srv, epd_prefill_tjob_t *j,
                                      uint64_t until)
{
    struct timespec ts = {0, 50000};

    if (!j->pack_submitted) {
        /* a deferred copy: its event would submit the pack, but this loop
         * is not handling events while it waits */
        while (!atomic_load_explicit(&j->copied, memory_order_acquire)) {
            if (epd_time_now_ns() > until) {
                return;
            }
            nanosleep(&ts, NULL);
        }
        if (epd_prefill_tier_pack_submit(srv, j) != EPD_OK) {
            return;
        }
    }
    while (!atomic_load_explicit(&j->done, memory_order_acquire)) {
        if (epd_time_now_ns() > until) {
            return; /* a miss: the block is computed */
        }
        nanosleep(&ts, NULL);
    }
    epd_prefill_tier_take(srv, j);
}

/* Waits (on the loop: a blocking wait, traced as "tier wait") until block
 * job j is stored, EPD_PREFILL_TIER_WAIT_MS at most. */
static void epd_prefill_tier_wait(epd_prefill_srv_t *srv, epd_prefill_tjob_t *j)
{
    uint64_t t0 = epd_time_now_ns();

    epd_prefill_tier_wait_for(srv, j, t0 + (uint64_t)EPD_PREFILL_TIER_WAIT_MS * EPD_NSEC_PER_MSEC);
    epd_trace_span(srv->trace, "tier wait", "wait", 0, -1, t0, epd_time_now_ns());
}

epd_status_t epd__prefill_tier_init(epd_prefill_srv_t *srv)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    epd_kvtier_config_t cfg;
    size_t esz = epd_dtype_size(kv->dtype);
    epd_status_t st;

    if (srv->pcache == NULL || (srv->tier_host_bytes == 0 && srv->tier_dir == NULL)) {
        return EPD_OK;
    }
    memset(&cfg, 0, sizeof(cfg));
    cfg.ns = srv->proot;
    cfg.host_bytes = srv->tier_host_bytes;
    cfg.disk_dir = srv->tier_dir;
    cfg.disk_bytes = srv->tier_disk_bytes;
    cfg.persist = srv->tier_persist;
    cfg.level = srv->tier_level;
    cfg.shuffle = esz == 2 || esz == 4 ? (uint32_t)esz : 0;
    cfg.log_comp = EPD_PREFILL_LOG;
    srv->tier_blk_bytes = (size_t)epd_kv_block_set_bytes(kv);
    srv->tier_buf = epd_malloc(srv->tier_blk_bytes + srv->ckpt_bytes + 1);
    srv->tier_pend = epd_calloc(EPD_PREFILL_TIER_BUCKETS, sizeof(*srv->tier_pend));
    srv->blk_copy = epd_calloc(srv->kv_blocks, sizeof(*srv->blk_copy));
    srv->tier_spare_max = (uint32_t)(EPD_PREFILL_TIER_SPARE_BYTES /
                                     (srv->tier_blk_bytes + srv->ckpt_bytes) + 1);
    srv->tier_spare = epd_calloc(srv->tier_spare_max, sizeof(*srv->tier_spare));
    if (srv->tier_buf == NULL || srv->tier_pend == NULL || srv->blk_copy == NULL ||
        srv->tier_spare == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    st = epd_kvtier_create(&cfg, &srv->tier);
    if (st != EPD_OK) {
        return st;
    }
    st = epd_kvtier_packer_create(&cfg, &srv->tier_packer);
    if (st != EPD_OK) {
        return st;
    }
    {
        epd_handoff_config_t hc;
        uint64_t jobs;

        srv->tier_staged_max = cfg.host_bytes > (64u << 20) ? cfg.host_bytes : 64u << 20;
        jobs = srv->tier_staged_max / (srv->tier_blk_bytes + srv->ckpt_bytes) + 1;
        jobs = jobs < EPD_PREFILL_TIER_JOBS_MAX ? jobs : EPD_PREFILL_TIER_JOBS_MAX;
        memset(&hc, 0, sizeof(hc));
        hc.name = "prefill kv tier";
        hc.n_queues = 1;
        hc.queue_cap[0] = (size_t)jobs;
        hc.event_cap = (size_t)jobs;
        hc.run = epd_prefill_tier_run;
        hc.run_arg = srv;
        hc.on_event = epd_prefill_tier_on_event;
        hc.event_arg = srv;
        /* compression is background work: the loop and the compute thread
         * win the CPU when they want it */
        hc.nice = EPD_PREFILL_TIER_NICE;
        st = epd_handoff_create(epd_daemon_loop(srv->d), &hc, &srv->tier_ho);
        if (st != EPD_OK) {
            return st;
        }
        hc.name = "prefill kv copy";
        hc.run = epd_prefill_tier_copy_run;
        hc.on_event = epd_prefill_tier_on_copied;
        hc.nice = 0; /* a run waits for it */
        st = epd_handoff_create(epd_daemon_loop(srv->d), &hc, &srv->tier_copy_ho);
        if (st != EPD_OK) {
            return st;
        }
    }
    epd_log_info(EPD_PREFILL_LOG, 0,
                 "kv tier on: host %llu bytes, disk %s (%llu bytes%s), zstd level %d, shuffle %u; "
                 "a block is %zu bytes (+ %llu of checkpoint)",
                 (unsigned long long)cfg.host_bytes, srv->tier_dir != NULL ? srv->tier_dir : "off",
                 (unsigned long long)cfg.disk_bytes, cfg.persist ? ", persistent" : "", cfg.level,
                 cfg.shuffle, srv->tier_blk_bytes, (unsigned long long)srv->ckpt_bytes);
    return EPD_OK;
}

void epd__prefill_tier_stop(epd_prefill_srv_t *srv)
{
    epd_prefill_tjob_t *j;

    if (srv->tier_ho == NULL) {
        return;
    }
    epd_handoff_destroy(srv->tier_copy_ho);
    epd_handoff_destroy(srv->tier_ho);
    srv->tier_copy_ho = NULL;
    srv->tier_ho = NULL;
    /* shutdown step 5: the pool is still there, the copies the thread did
     * not get to are made now (the blocks are nobody's any more) */
    EPD_LIST_FOREACH(j, srv->tier_jobs) {
        if (j->deferred && !atomic_load(&j->copied)) {
            epd_prefill_tier_copy_out(srv, j);
            atomic_store(&j->copied, 1);
        }
    }
}

void epd__prefill_tier_cleanup(epd_prefill_srv_t *srv)
{
    /* the thread first (joined): then every job is the loop's, and goes
     * into the tier before it closes (a persistent one keeps it) */
    epd__prefill_tier_stop(srv);
    while (srv->tier_jobs != NULL) {
        epd_prefill_tjob_t *j = srv->tier_jobs;

        if (!j->taken && srv->tier != NULL && atomic_load(&j->copied) && j->payload != NULL) {
            if (!atomic_load(&j->done)) {
                j->status = epd_kvtier_pack(srv->tier_packer, &j->key, j->payload, j->len,
                                            j->ckpt_len, &j->pk);
            }
            epd_prefill_tier_take(srv, j);
        }
        epd_prefill_tier_free(srv, j);
    }
    while (srv->tier_n_spare > 0) {
        epd_free(srv->tier_spare[--srv->tier_n_spare]);
    }
    epd_free(srv->tier_spare);
    srv->tier_spare = NULL;
    epd_free(srv->tier_pend);
    epd_free(srv->blk_copy);
    srv->tier_pend = NULL;
    srv->blk_copy = NULL;
    epd_kvtier_packer_destroy(srv->tier_packer);
    srv->tier_packer = NULL;
    epd_kvtier_destroy(srv->tier);
    epd_free(srv->tier_buf);
    srv->tier = NULL;
    srv->tier_buf = NULL;
}

void epd__prefill_tier_store(epd_prefill_srv_t *srv, const epd_prefix_hash_t *key, uint32_t block,
                             const void *ckpt, int defer)
{
    size_t ckpt_len = ckpt != NULL ? srv->ckpt_bytes : 0;
    size_t len = srv->tier_blk_bytes + ckpt_len;
    epd_prefill_tjob_t *j;

    if (epd_prefill_tier_pending(srv, key) != NULL) {
        return; /* on its way already */
    }
    if (srv->tier_staged + len > srv->tier_staged_max) {
        srv->tier_skipped++;
        return;
    }
    j = epd_calloc(1, sizeof(*j));
    if (j != NULL && (!defer || ckpt_len > 0 || srv->tier_n_spare > 0)) {
        /* a deferred store without a checkpoint and no spare at hand gets
         * its payload on the copy thread (epd_prefill_tier_copy_run) */
        j->payload = epd_prefill_tier_buf_get(srv);
        if (j->payload == NULL) {
            epd_free(j);
            j = NULL;
        }
    }
    if (j == NULL) {
        srv->tier_skipped++;
        return;
    }
    if (ckpt_len > 0) {
        memcpy(j->payload + srv->tier_blk_bytes, ckpt, ckpt_len); /* its slot is reused now */
    }
    j->srv = srv;
    j->key = *key;
    j->len = len;
    j->ckpt_len = ckpt_len;
    j->block = block;
    j->deferred = defer != 0;
    atomic_init(&j->done, 0);
    if (defer) {
        atomic_init(&j->copied, 0);
        j->seq = srv->tier_seq + 1;
    } else {
        epd_prefill_tier_gather(srv, block, j->payload);
        atomic_init(&j->copied, 1);
        j->pack_submitted = 1;
    }
    if (epd_handoff_submit(defer ? srv->tier_copy_ho : srv->tier_ho, 0, j) != EPD_OK) {
        /* the queues hold the cap's worth of blocks: not reached */
        epd_prefill_tier_buf_put(srv, j->payload);
        epd_free(j);
        srv->tier_skipped++;
        return;
    }
    if (defer) {
        srv->tier_seq = j->seq;
        srv->blk_copy[block] = j->seq;
    }
    j->pnext = srv->tier_pend[epd_prefill_tier_bucket(key)];
    srv->tier_pend[epd_prefill_tier_bucket(key)] = j;
    EPD_LIST_INSERT_HEAD_N(EPD_LIST_SELF, srv->tier_jobs, j);
    srv->tier_staged += j->len;
}

uint64_t epd__prefill_tier_copying(const epd_prefill_srv_t *srv, const uint32_t *blocks,
                                   uint32_t n)
{
    uint64_t want = 0;

    if (srv->blk_copy == NULL || srv->tier_copied == srv->tier_seq) {
        return 0;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t s = srv->blk_copy[blocks[i]];

        want = s > want ? s : want;
    }
    return want > srv->tier_copied ? want : 0;
}

uint32_t epd__prefill_tier_copies_last(const epd_prefill_srv_t *srv, uint32_t *blocks,
                                       uint32_t n)
{
    uint32_t i = 0, k = n;

    /* [0, i) not being copied, [k, n) being copied */
    while (i < k) {
        if (epd__prefill_tier_copying(srv, &blocks[i], 1) == 0) {
            i++;
        } else {
            uint32_t t = blocks[i];

            blocks[i] = blocks[--k];
            blocks[k] = t;
        }
    }
    return i;
}

uint32_t epd__prefill_tier_worth(epd_prefill_srv_t *srv, const epd_prefix_hash_t *keys,
                                 uint32_t n)
{
    uint32_t run = 0;
    double restore_bps = epd_kvtier_restore_rate(srv->tier);

    while (run < n) {
        if (epd_kvtier_where(srv->tier, &keys[run]) == EPD_KVTIER_NONE) {
            epd_prefill_tjob_t *j = epd_prefill_tier_pending(srv, &keys[run]);

            if (j == NULL) {
                break;
            }
            epd_prefill_tier_wait(srv, j); /* stored a moment ago: found */
            if (epd_kvtier_where(srv->tier, &keys[run]) == EPD_KVTIER_NONE) {
                break;
            }
        }
        run++;
    }
    if (run > 0 && restore_bps > 0 && srv->tier_tps > 0) {
        /* seconds per block either way */
        double restore_s = (double)(srv->tier_blk_bytes + srv->ckpt_bytes) / restore_bps;
        double compute_s = (double)srv->info->kv.block_tokens / srv->tier_tps;

        if (restore_s >= compute_s) {
            return 0;
        }
    }
    return run;
}

epd_status_t epd__prefill_tier_restore(epd_prefill_srv_t *srv, const epd_prefix_hash_t *key,
                                       uint32_t block, const void **ckpt_p)
{
    const epd_kv_layout_t *kv = &srv->info->kv;
    unsigned char *base = srv->pool.base;
    size_t len = 0, ckpt_len = 0, off = 0;
    epd_status_t st;

    st = epd_kvtier_get(srv->tier, key, srv->tier_buf, srv->tier_blk_bytes + srv->ckpt_bytes,
                        &len, &ckpt_len);
    if (st != EPD_OK) {
        return st;
    }
    if (len - ckpt_len != srv->tier_blk_bytes || (ckpt_len != 0 && ckpt_len != srv->ckpt_bytes)) {
        /* our namespace, so our layout: only a bug gets here */
        epd_log_error(EPD_PREFILL_LOG, 0, "kv tier: a block of %zu bytes (%zu of checkpoint), "
                      "expected %zu: not used", len, ckpt_len, srv->tier_blk_bytes);
        return EPD_ERR_MALFORMED;
    }
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        uint64_t o;

        if (kv->kind[l] != EPD_LAYER_ATTENTION) {
            continue;
        }
        (void)epd_kv_block_offset(kv, srv->kv_blocks, l, block, &o);
        memcpy(base + o, srv->tier_buf + off, epd_kv_layer_block_bytes(kv, l));
        off += epd_kv_layer_block_bytes(kv, l);
    }
    *ckpt_p = ckpt_len > 0 ? srv->tier_buf + off : NULL;
    return EPD_OK;
}

void epd__prefill_tier_ran(epd_prefill_srv_t *srv, uint64_t tokens, uint64_t ns)
{
    double tps;

    if (srv->tier == NULL || tokens == 0 || ns == 0) {
        return;
    }
    tps = (double)tokens * 1e9 / (double)ns;
    srv->tier_tps = srv->tier_tps == 0 ? tps : 0.75 * srv->tier_tps + 0.25 * tps;
}

void epd__prefill_tier_stats(const epd_prefill_srv_t *srv, epd_prefix_stats_t *s_p)
{
    epd_kvtier_stats_t t;

    if (srv->tier == NULL) {
        return;
    }
    epd_kvtier_stats(srv->tier, &t);
    s_p->tier_stored = t.stored;
    s_p->tier_spilled = t.spilled;
    s_p->tier_restored_host = t.restored_host;
    s_p->tier_restored_disk = t.restored_disk;
    s_p->tier_restore_us = t.restore_us;
    s_p->tier_checksum_failures = t.checksum_failures;
    s_p->tier_refused_files = t.refused_files;
    s_p->tier_dropped = t.dropped + srv->tier_skipped;
    s_p->tier_host_bytes = t.host_bytes;
    s_p->tier_disk_bytes = t.disk_bytes;
}
