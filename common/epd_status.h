/*
 * epd_status.h — the one status type of epd.
 *
 * EPD_OK is 0, EPD_INPROGRESS is 1 (an asynchronous operation was posted and
 * will complete through its callback), every error is negative.  Errors are
 * grouped in ranges by how much they take down, so that a caller (the router
 * above all) can decide "retry elsewhere" versus "drain the peer" from the code
 * alone, with epd_status_scope():
 *
 *   -1   .. -99   request:    this request failed; the peer and node are fine
 *   -100 .. -199  connection: one endpoint is unusable; reconnecting may help
 *   -200 .. -299  peer:       the remote daemon is dead, restarted or draining
 *   -300 .. -399  node:       this process cannot go on (configuration, fatal)
 *
 * The list is an X-macro so that the enum and epd_status_string() can never
 * disagree.
 */
#ifndef EPD_STATUS_H
#define EPD_STATUS_H

#define EPD_STATUS_LIST(X)                                                           \
    X(EPD_OK, 0, "success")                                                          \
    X(EPD_INPROGRESS, 1, "operation in progress")                                    \
    /* request scope */                                                              \
    X(EPD_ERR_INVALID_PARAM, -1, "invalid parameter")                                \
    X(EPD_ERR_NO_MEMORY, -2, "out of memory")                                        \
    X(EPD_ERR_NO_RESOURCE, -3, "no resource now (backpressure): retry after progress") \
    X(EPD_ERR_NO_CAPACITY, -4, "no capacity (e.g. KV blocks) for this request")      \
    X(EPD_ERR_TIMEOUT, -5, "timed out")                                              \
    X(EPD_ERR_CANCELED, -6, "canceled")                                              \
    X(EPD_ERR_NOT_FOUND, -7, "not found")                                            \
    X(EPD_ERR_MALFORMED, -8, "malformed input")                                      \
    X(EPD_ERR_OUT_OF_RANGE, -9, "value or region out of range")                      \
    X(EPD_ERR_CORRUPT, -10, "checksum mismatch: data corrupt")                       \
    X(EPD_ERR_UNSUPPORTED, -11, "unsupported")                                       \
    X(EPD_ERR_TOO_LONG, -12, "input longer than the configured limit")               \
    X(EPD_ERR_IO, -13, "input/output error")                                         \
    X(EPD_ERR_EXISTS, -14, "already exists")                                         \
    X(EPD_ERR_BUSY, -15, "busy")                                                     \
    /* connection scope */                                                           \
    X(EPD_ERR_UNREACHABLE, -100, "peer unreachable")                                 \
    X(EPD_ERR_CONNECTION_RESET, -101, "connection reset")                            \
    X(EPD_ERR_TRANSPORT, -102, "transport error")                                    \
    X(EPD_ERR_BAD_ADDRESS, -103, "malformed peer address")                           \
    X(EPD_ERR_BAD_RKEY, -104, "malformed remote key")                                \
    /* peer scope */                                                                 \
    X(EPD_ERR_PEER_DEAD, -200, "peer declared dead")                                 \
    X(EPD_ERR_STALE_EPOCH, -201, "message from a stale peer epoch")                  \
    X(EPD_ERR_DRAINING, -202, "peer is draining")                                    \
    /* the peer is not a proven member of the cluster (no or another secret, a    \
     * forged frame): another try with the same peer fails the same way */         \
    X(EPD_ERR_AUTH, -203, "authentication failed: peer not proven a cluster member") \
    /* node scope */                                                                 \
    X(EPD_ERR_CONFIG, -300, "configuration error")                                   \
    X(EPD_ERR_FATAL, -301, "fatal internal error")

typedef enum {
#define EPD__STATUS_ENUM(name, value, text) name = value,
    EPD_STATUS_LIST(EPD__STATUS_ENUM)
#undef EPD__STATUS_ENUM
} epd_status_t;

typedef enum {
    EPD_SCOPE_NONE = 0,   /* EPD_OK / EPD_INPROGRESS */
    EPD_SCOPE_REQUEST,
    EPD_SCOPE_CONNECTION,
    EPD_SCOPE_PEER,
    EPD_SCOPE_NODE,
} epd_status_scope_t;

/* A static string describing `status`; never NULL ("unknown status" for a
 * value outside the list).  Any thread. */
const char *epd_status_string(epd_status_t status);

/* The symbolic name ("EPD_ERR_TIMEOUT"); never NULL.  Any thread. */
const char *epd_status_name(epd_status_t status);

/* How much `status` takes down (see the ranges above).  Any thread. */
epd_status_scope_t epd_status_scope(epd_status_t status);

#endif
