/*
 * epd_xport_ofi.c — the libfabric backend of epd_xport: libfabric loaded
 * (dlopen), provider chosen, fabric, domain, AV, CQ and endpoint opened, pools
 * made; destroy, the address, and the ops table.  How the backend works is in
 * epd_xport_ofi_int.h.
 */
#include "epd_xport_ofi_int.h"

static pthread_once_t epd__fi_once = PTHREAD_ONCE_INIT;
static char epd__fi_error[256]; /* empty: loaded */

static void epd__ofi_close_all(epd__ofi_t *be)
{
    /* Order matters: the endpoint first (it cancels what is posted), then
     * what it was bound to, the regions, the domain, the fabric.  A shm
     * process that skips fi_close leaves its POSIX shm segment behind. */
    if (be->ep != NULL) {
        fi_close(&be->ep->fid);
        be->ep = NULL;
    }
    if (be->av != NULL) {
        fi_close(&be->av->fid);
        be->av = NULL;
    }
    if (be->cq != NULL) {
        fi_close(&be->cq->fid);
        be->cq = NULL;
    }
    for (size_t i = 0; be->reqs != NULL && i < be->req_count; i++) {
        if (be->reqs[i].tmp_mr != NULL) {
            fi_close(&be->reqs[i].tmp_mr->fid);
            be->reqs[i].tmp_mr = NULL;
        }
    }
    if (be->rx_mr != NULL) {
        fi_close(&be->rx_mr->fid);
        be->rx_mr = NULL;
    }
    if (be->tx_mr != NULL) {
        fi_close(&be->tx_mr->fid);
        be->tx_mr = NULL;
    }
    if (be->scratch_mr != NULL) {
        fi_close(&be->scratch_mr->fid);
        be->scratch_mr = NULL;
    }
    if (be->sink.mr != NULL) {
        fi_close(&be->sink.mr->fid);
        be->sink.mr = NULL;
    }
    if (be->domain != NULL) {
        fi_close(&be->domain->fid);
        be->domain = NULL;
    }
    if (be->fabric != NULL) {
        fi_close(&be->fabric->fid);
        be->fabric = NULL;
    }
    if (be->info != NULL) {
        epd__fi.freeinfo(be->info);
        be->info = NULL;
    }
}

static void epd__ofi_free_mem(epd__ofi_t *be)
{
    epd_free(be->addr_blob);
    epd_free(be->rx_bufs);
    epd_free(be->rx);
    epd_free(be->tx_bufs);
    epd_free(be->tx);
    epd_free(be->inject_buf);
    epd_free(be->parts);
    epd_free(be->scratch);
    epd_free(be->sink.buf);
    epd_free(be->reqs);
    for (unsigned i = 0; i < EPD__OFI_REASM; i++) {
        epd_free(be->reasm[i].buf);
    }
    epd_free(be);
}

static size_t epd__ofi_env_size(const char *name)
{
    const char *text = getenv(name);
    char *end;
    unsigned long long v;

    if (text == NULL || *text == '\0') {
        return 0;
    }
    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v == 0 || v > SIZE_MAX) {
        epd_log_warn(EPD__OFI_LOG, 0, "ignoring %s=%s (want bytes > 0)", name, text);
        return 0;
    }
    return (size_t)v;
}

/*
 * The largest message the provider delivers in order with the messages
 * around it.  rxm sends messages up to its eager limit through bounce
 * buffers in order, but larger ones through segmentation or rendezvous
 * protocols whose receive completions arrive hundreds of messages late
 * (measured on tcp;ofi_rxm 1.17), so messages are cut into fragments that
 * stay eager.  shm keeps order up to its inject size.
 */
static size_t epd__ofi_frag_limit(const epd__ofi_t *be)
{
    const char *prov = epd__ofi_prov(be);
    size_t v;

    if (strstr(prov, "ofi_rxm") != NULL) {
        v = epd__ofi_env_size("FI_OFI_RXM_EAGER_LIMIT");
        if (v == 0) {
            v = epd__ofi_env_size("FI_OFI_RXM_BUFFER_SIZE");
        }
        return v != 0 ? v : 16384;
    }
    if (epd__ofi_is_shm(prov)) {
        return be->info->tx_attr->inject_size != 0 ? be->info->tx_attr->inject_size
                                                   : EPD__OFI_FRAG_DEFAULT;
    }
    return EPD__OFI_FRAG_DEFAULT;
}

static void epd__fi_load(void)
{
    static struct sigaction before[NSIG];
    static bool had[NSIG];
    void *h;

    for (int sig = 1; sig < NSIG; sig++) {
        had[sig] = sigaction(sig, NULL, &before[sig]) == 0;
    }
    h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction now;

        if (had[sig] && sigaction(sig, NULL, &now) == 0 &&
            (now.sa_handler != before[sig].sa_handler || now.sa_flags != before[sig].sa_flags)) {
            sigaction(sig, &before[sig], NULL);
        }
    }
    if (h == NULL) {
        snprintf(epd__fi_error, sizeof(epd__fi_error), "%s", dlerror());
        return;
    }
    *(void **)&epd__fi.getinfo = dlsym(h, "fi_getinfo");
    *(void **)&epd__fi.freeinfo = dlsym(h, "fi_freeinfo");
    *(void **)&epd__fi.dupinfo = dlsym(h, "fi_dupinfo");
    *(void **)&epd__fi.fabric = dlsym(h, "fi_fabric");
    *(void **)&epd__fi.strerror = dlsym(h, "fi_strerror");
    if (epd__fi.getinfo == NULL || epd__fi.freeinfo == NULL || epd__fi.dupinfo == NULL ||
        epd__fi.fabric == NULL || epd__fi.strerror == NULL) {
        snprintf(epd__fi_error, sizeof(epd__fi_error),
                 "libfabric.so.1 lacks fi_getinfo, "
                 "fi_freeinfo, fi_dupinfo, fi_fabric or fi_strerror");
    }
}

/* Builds the hints; `dc` asks for FI_DELIVERY_COMPLETE. */
static struct fi_info *epd__ofi_hints(const char *prov, bool dc)
{
    struct fi_info *hints = epd__fi.dupinfo(NULL); /* fi_allocinfo() */

    if (hints == NULL) {
        return NULL;
    }
    hints->caps = FI_MSG | FI_RMA | FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE;
    if (!dc) {
        hints->caps |= FI_READ | FI_REMOTE_READ; /* the flush's ordering read */
    }
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = EPD__OFI_MR_REQUEST;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->tx_attr->msg_order = FI_ORDER_SAS | (dc ? 0 : FI_ORDER_RAW);
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    if (dc) {
        hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    }
    if (prov != NULL) {
        /* fi_freeinfo releases it with free(): it must come from libc, not
         * from the epd_malloc funnel. */
        hints->fabric_attr->prov_name = strdup(prov);
        if (hints->fabric_attr->prov_name == NULL) {
            epd__fi.freeinfo(hints);
            return NULL;
        }
    }
    return hints;
}

static epd_status_t epd__ofi_getinfo(epd__ofi_t *be, const char *prov, const char *node)
{
    const char *dc_env = getenv("EPD_OFI_DELIVERY_COMPLETE");
    /* test knob: "0" takes the path of providers without delivery complete */
    int first = dc_env != NULL && strcmp(dc_env, "0") == 0 ? 1 : 0;

    for (int attempt = first; attempt < 2; attempt++) {
        bool dc = attempt == 0;
        struct fi_info *hints = epd__ofi_hints(prov, dc);
        struct fi_info *info = NULL;
        int ret;

        if (hints == NULL) {
            return EPD_ERR_NO_MEMORY;
        }
        ret = epd__fi.getinfo(FI_VERSION(1, 17), node, NULL, node != NULL ? FI_SOURCE : 0, hints,
                              &info);
        epd__fi.freeinfo(hints);
        if (ret == 0 && info != NULL) {
            /* DC was only asked to learn that the provider has it; the
             * endpoint's default stays plain so sends do not wait for acks,
             * and writes ask for it per operation. */
            info->tx_attr->op_flags &= ~(uint64_t)FI_DELIVERY_COMPLETE;
            if (info->next != NULL) {
                epd__fi.freeinfo(info->next);
                info->next = NULL;
            }
            be->info = info;
            be->dc = dc;
            return EPD_OK;
        }
        if (ret != -FI_ENODATA) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_getinfo(provider %s, node %s) failed: %s",
                          prov != NULL ? prov : getenv("FI_PROVIDER"),
                          node != NULL ? node : "(none)", epd__fi.strerror(-ret));
            return EPD_ERR_CONFIG;
        }
    }
    epd_log_error(EPD__OFI_LOG, 0,
                  "no libfabric provider matches: provider %s%s, node %s, FI_EP_RDM with "
                  "FI_MSG|FI_RMA and send-after-send ordering",
                  prov != NULL ? prov : getenv("FI_PROVIDER"),
                  prov != NULL ? "" : " (from FI_PROVIDER)", node != NULL ? node : "(none)");
    return EPD_ERR_CONFIG;
}

static epd_status_t epd__ofi_open_cq(epd__ofi_t *be, size_t size)
{
    struct fi_cq_attr attr;
    int ret;

    memset(&attr, 0, sizeof(attr));
    attr.format = FI_CQ_FORMAT_DATA;
    attr.size = size;
    attr.wait_obj = FI_WAIT_FD;
    ret = fi_cq_open(be->domain, &attr, &be->cq, NULL);
    if (ret == 0) {
        int fd = -1;

        ret = fi_control(&be->cq->fid, FI_GETWAIT, &fd);
        if (ret == 0 && fd >= 0) {
            be->wait_fd = fd;
            return EPD_OK;
        }
        fi_close(&be->cq->fid);
        be->cq = NULL;
    }
    /* shm and other providers without fd-wait: poll the CQ */
    attr.wait_obj = FI_WAIT_NONE;
    ret = fi_cq_open(be->domain, &attr, &be->cq, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_cq_open failed: %s", epd__fi.strerror(-ret));
        return EPD_ERR_TRANSPORT;
    }
    be->wait_fd = -1;
    return EPD_OK;
}

static epd_status_t epd__ofi_open(epd__ofi_t *be)
{
    struct fi_info *info = be->info;
    struct fi_av_attr av_attr;
    size_t cq_size;
    int ret;

    ret = epd__fi.fabric(info->fabric_attr, &be->fabric, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_fabric(%s) failed: %s", epd__ofi_prov(be),
                      epd__fi.strerror(-ret));
        return EPD_ERR_CONFIG;
    }
    ret = fi_domain(be->fabric, info, &be->domain, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_domain(%s) failed: %s", info->domain_attr->name,
                      epd__fi.strerror(-ret));
        return EPD_ERR_CONFIG;
    }
    memset(&av_attr, 0, sizeof(av_attr));
    av_attr.type =
        info->domain_attr->av_type != FI_AV_UNSPEC ? info->domain_attr->av_type : FI_AV_TABLE;
    ret = fi_av_open(be->domain, &av_attr, &be->av, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_av_open failed: %s", epd__fi.strerror(-ret));
        return EPD_ERR_TRANSPORT;
    }
    cq_size = (size_t)be->rx_count + be->tx_count + EPD__OFI_PARTS + 64;
    if (epd__ofi_open_cq(be, cq_size) != EPD_OK) {
        return EPD_ERR_TRANSPORT;
    }
    ret = fi_endpoint(be->domain, info, &be->ep, NULL);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_endpoint failed: %s", epd__fi.strerror(-ret));
        return EPD_ERR_TRANSPORT;
    }
    ret = fi_ep_bind(be->ep, &be->av->fid, 0);
    if (ret == 0) {
        ret = fi_ep_bind(be->ep, &be->cq->fid, FI_TRANSMIT | FI_RECV);
    }
    if (ret == 0) {
        ret = fi_enable(be->ep);
    }
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "binding/enabling the endpoint failed: %s",
                      epd__fi.strerror(-ret));
        return EPD_ERR_TRANSPORT;
    }
    return EPD_OK;
}

static epd_status_t epd__ofi_make_address(epd__ofi_t *be)
{
    epd__ofi_addr_hdr_t hdr;
    size_t name_len = 0;
    unsigned char *blob;
    int ret;

    ret = fi_getname(&be->ep->fid, NULL, &name_len);
    if ((ret != 0 && ret != -FI_ETOOSMALL) || name_len == 0 || name_len > EPD__OFI_MAX_NAME) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_getname failed: %s (length %zu)", epd__fi.strerror(-ret),
                      name_len);
        return EPD_ERR_TRANSPORT;
    }
    blob = epd_calloc(1, sizeof(hdr) + name_len);
    if (blob == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    ret = fi_getname(&be->ep->fid, blob + sizeof(hdr), &name_len);
    if (ret != 0) {
        epd_log_error(EPD__OFI_LOG, 0, "fi_getname failed: %s", epd__fi.strerror(-ret));
        epd_free(blob);
        return EPD_ERR_TRANSPORT;
    }
    memset(&hdr, 0, sizeof(hdr));
    hdr.magic = EPD__OFI_ADDR_MAGIC;
    hdr.version = EPD__OFI_WIRE_VERSION;
    hdr.hdr_len = sizeof(hdr);
    hdr.name_len = (uint32_t)name_len;
    hdr.addr_format = be->info->addr_format;
    snprintf(hdr.prov, sizeof(hdr.prov), "%s", epd__ofi_prov(be));
    hdr.check = epd__ofi_blob_check(&hdr, sizeof(hdr), blob + sizeof(hdr), name_len);
    memcpy(blob, &hdr, sizeof(hdr));
    be->addr_blob = blob;
    be->addr_len = sizeof(hdr) + name_len;
    return EPD_OK;
}

/* The flush sink (see the top of the file): registered remote-read, and
 * its key kept (raw where the provider wants raw keys) for mr_pack. */
static epd_status_t epd__ofi_make_sink(epd__ofi_t *be)
{
    struct epd__ofi_sink *k = &be->sink;
    epd_status_t status;

    k->buf = epd_calloc(1, EPD__OFI_SINK_BYTES);
    if (k->buf == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    status = epd__ofi_reg(be, k->buf, EPD__OFI_SINK_BYTES, FI_REMOTE_READ, &k->mr);
    if (status != EPD_OK) {
        return status;
    }
    k->key = fi_mr_key(k->mr);
    if ((be->mr_mode & FI_MR_RAW) != 0) {
        size_t raw_len = sizeof(k->raw);
        int ret = fi_mr_raw_attr(k->mr, &k->raw_base, k->raw, &raw_len, 0);

        if (ret != 0 || raw_len == 0 || raw_len > sizeof(k->raw)) {
            epd_log_error(EPD__OFI_LOG, 0, "fi_mr_raw_attr (flush sink) failed: %s",
                          epd__fi.strerror(-ret));
            return EPD_ERR_TRANSPORT;
        }
        k->raw_len = raw_len;
    } else if (k->key == FI_KEY_NOTAVAIL) {
        epd_log_error(EPD__OFI_LOG, 0, "provider returned no key for the flush sink");
        return EPD_ERR_TRANSPORT;
    }
    return EPD_OK;
}

static epd_status_t epd__ofi_make_pools(epd__ofi_t *be, size_t max_inflight)
{
    epd_status_t status;

    be->rx_bufs = epd_calloc(be->rx_count, be->frag_size);
    be->rx = epd_calloc(be->rx_count, sizeof(*be->rx));
    be->tx_bufs = epd_calloc(be->tx_count, be->frag_size);
    be->tx = epd_calloc(be->tx_count, sizeof(*be->tx));
    be->inject_buf = epd_calloc(1, be->inject_size != 0 ? be->inject_size : 1);
    be->parts = epd_calloc(EPD__OFI_PARTS, sizeof(*be->parts));
    be->scratch = epd_calloc(1, 64);
    be->req_count = max_inflight + EPD__OFI_REQ_SPARE;
    be->reqs = epd_calloc(be->req_count, sizeof(*be->reqs));
    if (be->rx_bufs == NULL || be->rx == NULL || be->tx_bufs == NULL || be->tx == NULL ||
        be->inject_buf == NULL || be->parts == NULL || be->scratch == NULL || be->reqs == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    for (unsigned i = 0; i < be->rx_count; i++) {
        be->rx[i].kind = EPD__OFI_X_RECV;
        be->rx[i].buf = be->rx_bufs + (size_t)i * be->frag_size;
    }
    be->rx_unposted = be->rx_count;
    for (unsigned i = be->tx_count; i-- > 0;) {
        be->tx[i].kind = EPD__OFI_X_SEND;
        be->tx[i].buf = be->tx_bufs + (size_t)i * be->frag_size;
        be->tx[i].next_free = be->tx_free;
        be->tx_free = &be->tx[i];
    }
    be->tx_nfree = be->tx_count;
    for (unsigned i = EPD__OFI_PARTS; i-- > 0;) {
        be->parts[i].kind = EPD__OFI_X_PART;
        be->parts[i].next_free = be->parts_free;
        be->parts_free = &be->parts[i];
    }
    for (size_t i = be->req_count; i-- > 0;) {
        be->reqs[i].next = be->req_free;
        be->req_free = &be->reqs[i];
    }

    if ((be->mr_mode & FI_MR_LOCAL) != 0) {
        status = epd__ofi_reg(be, be->rx_bufs, (size_t)be->rx_count * be->frag_size, FI_RECV,
                              &be->rx_mr);
        if (status != EPD_OK) {
            return status;
        }
        status = epd__ofi_reg(be, be->tx_bufs, (size_t)be->tx_count * be->frag_size, FI_SEND,
                              &be->tx_mr);
        if (status != EPD_OK) {
            return status;
        }
        if (!be->dc) {
            status = epd__ofi_reg(be, be->scratch, 64, FI_READ, &be->scratch_mr);
            if (status != EPD_OK) {
                return status;
            }
        }
    }
    if (!be->dc) {
        status = epd__ofi_make_sink(be);
        if (status != EPD_OK) {
            return status;
        }
    }
    return EPD_OK;
}

static epd_status_t epd__ofi_create(epd_xport_t *core, const epd_xport_config_t *config,
                                    void **be_p)
{
    const char *env_prov = getenv("FI_PROVIDER");
    const char *prov;
    const char *node;
    size_t max_msg;
    size_t max_inflight;
    char mode_text[128];
    epd__ofi_t *be;
    epd_status_t status;

    if (core == NULL || config == NULL || be_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    max_msg = config->max_msg_size != 0 ? config->max_msg_size : 65536;
    if (max_msg > (1u << 30)) {
        epd_log_error(EPD__OFI_LOG, 0, "max_msg_size %zu is too large for message buffers",
                      max_msg);
        return EPD_ERR_CONFIG;
    }
    max_inflight = config->max_inflight != 0 ? config->max_inflight : 4096;
    prov = (env_prov != NULL && *env_prov != '\0')
               ? NULL
               : (config->provider != NULL && *config->provider != '\0' ? config->provider
                                                                        : "tcp;ofi_rxm");
    node =
        config->bind_host != NULL && *config->bind_host != '\0' ? config->bind_host : "127.0.0.1";
    pthread_once(&epd__fi_once, epd__fi_load);
    if (epd__fi_error[0] != '\0') {
        epd_log_error(EPD__OFI_LOG, 0, "libfabric: %s (is the libfabric1 package installed?)",
                      epd__fi_error);
        return EPD_ERR_UNSUPPORTED;
    }

    be = epd_calloc(1, sizeof(*be));
    if (be == NULL) {
        return EPD_ERR_NO_MEMORY;
    }
    be->core = core;
    be->wait_fd = -1;
    be->max_total = max_msg + EPD__OFI_HDR_ROOM;
    be->nonce = epd_rng_entropy() << 24;
    be->rx_count = EPD__OFI_RX_SLOTS;
    be->tx_count = EPD__OFI_TX_SLOTS;
    if (epd__ofi_is_shm(prov != NULL ? prov : env_prov)) {
        /* shm names its address after the node: two processes given the
         * same node collide (EBUSY); without one the name is the pid. */
        node = NULL;
    }

    status = epd__ofi_getinfo(be, prov, node);
    if (status != EPD_OK) {
        goto err_free;
    }
    be->mr_mode = be->info->domain_attr->mr_mode;
    be->key_mask = be->info->domain_attr->mr_key_size > 0 && be->info->domain_attr->mr_key_size < 8
                       ? (UINT64_C(1) << (8 * be->info->domain_attr->mr_key_size)) - 1
                       : UINT64_MAX;
    if ((be->mr_mode & FI_MR_RAW) != 0 &&
        be->info->domain_attr->mr_key_size > EPD__OFI_MAX_RAW_KEY) {
        epd_log_error(EPD__OFI_LOG, 0, "provider %s needs %zu-byte raw keys (at most %u supported)",
                      epd__ofi_prov(be), be->info->domain_attr->mr_key_size, EPD__OFI_MAX_RAW_KEY);
        status = EPD_ERR_CONFIG;
        goto err_close;
    }
    if (be->info->tx_attr->size != 0 && be->tx_count > be->info->tx_attr->size) {
        be->tx_count = (unsigned)be->info->tx_attr->size;
    }
    if (be->info->rx_attr->size != 0 && be->rx_count > be->info->rx_attr->size) {
        be->rx_count = (unsigned)be->info->rx_attr->size;
    }
    be->frag_size = epd__ofi_frag_limit(be);
    if (be->frag_size > be->max_total + sizeof(epd__ofi_frag_t)) {
        be->frag_size = be->max_total + sizeof(epd__ofi_frag_t);
    }
    if (be->info->ep_attr->max_msg_size < be->frag_size) {
        be->frag_size = be->info->ep_attr->max_msg_size;
    }
    if (be->frag_size < EPD__OFI_FRAG_MIN) {
        epd_log_error(EPD__OFI_LOG, 0, "provider %s carries messages up to %zu bytes, need %u",
                      epd__ofi_prov(be), be->info->ep_attr->max_msg_size, EPD__OFI_FRAG_MIN);
        status = EPD_ERR_CONFIG;
        goto err_close;
    }
    be->inject_size = be->info->tx_attr->inject_size;
    if (be->inject_size > be->frag_size) {
        be->inject_size = be->frag_size;
    }
    be->write_chunk = be->info->ep_attr->max_msg_size;
    {
        size_t env_chunk = epd__ofi_env_size("EPD_OFI_WRITE_CHUNK");

        if (env_chunk != 0 && env_chunk < be->write_chunk) {
            be->write_chunk = env_chunk;
        }
    }

    status = epd__ofi_open(be);
    if (status != EPD_OK) {
        goto err_close;
    }
    status = epd__ofi_make_address(be);
    if (status != EPD_OK) {
        goto err_close;
    }
    status = epd__ofi_make_pools(be, max_inflight);
    if (status != EPD_OK) {
        goto err_close;
    }
    epd__ofi_post_recvs(be);
    if (be->rx_unposted == be->rx_count) {
        epd_log_error(EPD__OFI_LOG, 0, "could not post any receive buffer");
        status = EPD_ERR_TRANSPORT;
        goto err_close;
    }

    epd__ofi_mr_mode_str(be->mr_mode, mode_text, sizeof(mode_text));
    snprintf(be->desc, sizeof(be->desc),
             "ofi provider %s fabric %s domain %s mr_mode %s max_msg_size %zu inject %zu "
             "wait_fd %s writes %s",
             epd__ofi_prov(be), be->info->fabric_attr->name, be->info->domain_attr->name, mode_text,
             be->info->ep_attr->max_msg_size, be->inject_size, be->wait_fd >= 0 ? "yes" : "no",
             be->dc ? "delivery-complete" : "read-flushed");
    epd_log_info(EPD__OFI_LOG, 0,
                 "%s (node %s, messages up to %zu bytes in fragments of %zu, %u+%u slots)",
                 be->desc, node != NULL ? node : "(none)", be->max_total, be->frag_size,
                 be->rx_count, be->tx_count);

    *be_p = be;
    return EPD_OK;

err_close:
    epd__ofi_close_all(be);
err_free:
    epd__ofi_free_mem(be);
    return status;
}

static void epd__ofi_destroy(void *arg)
{
    epd__ofi_t *be = arg;

    if (be == NULL) {
        return;
    }
    while (be->eps != NULL) {
        epd__ofi_ep_destroy(be->eps);
    }
    epd__ofi_close_all(be); /* the AV is gone: unrefs below only free */
    while (be->zombies != NULL) {
        epd__ofi_ep_t *ep = be->zombies;

        be->zombies = ep->next;
        epd__ofi_ep_free(be, ep);
    }
    epd__ofi_free_mem(be);
}

static epd_status_t epd__ofi_address(void *arg, const void **blob_p, size_t *len_p)
{
    epd__ofi_t *be = arg;

    if (be == NULL || blob_p == NULL || len_p == NULL) {
        return EPD_ERR_INVALID_PARAM;
    }
    *blob_p = be->addr_blob;
    *len_p = be->addr_len;
    return EPD_OK;
}

static void epd__ofi_describe(void *arg, char *buf, size_t len)
{
    epd__ofi_t *be = arg;

    if (buf == NULL || len == 0) {
        return;
    }
    snprintf(buf, len, "%s", be != NULL ? be->desc : "ofi (none)");
}

const epd__xport_backend_ops_t epd__xport_ofi_ops = {
    .size = sizeof(epd__xport_backend_ops_t),
    .name = "ofi",
    .create = epd__ofi_create,
    .destroy = epd__ofi_destroy,
    .address = epd__ofi_address,
    .describe = epd__ofi_describe,
    .ep_create = epd__ofi_ep_create,
    .ep_destroy = epd__ofi_ep_destroy,
    .ep_describe = epd__ofi_ep_describe,
    .send = epd__ofi_send,
    .write = epd__ofi_write,
    .flush = epd__ofi_flush,
    .mr_alloc = epd__ofi_mr_alloc,
    .mr_reg = epd__ofi_mr_reg,
    .mr_dereg = epd__ofi_mr_dereg,
    .mr_pack = epd__ofi_mr_pack,
    .rkey_unpack = epd__ofi_rkey_unpack,
    .rkey_destroy = epd__ofi_rkey_destroy,
    .grant_open = epd__ofi_grant_open,
    .grant_pack = epd__ofi_grant_pack,
    .grant_revoke = epd__ofi_grant_revoke,
    .grant_settled = epd__ofi_grant_settled,
    .grant_close = epd__ofi_grant_close,
    .limbo = epd__ofi_limbo,
    .progress = epd__ofi_progress,
    .get_fd = epd__ofi_get_fd,
    .arm = epd__ofi_arm,
};
