/*
 * epd_http_respond.c — the application's answers to an HTTP request (see
 * epd_http.h): a full response, or a Server-Sent Events stream (chunked
 * for HTTP/1.1, raw until the close for HTTP/1.0) whose unsent backlog is
 * bounded by max_stream_backlog — a slow reader is disconnected, never
 * buffered for without bound.
 *
 * Stands on epd_http_conn.c (writes, the FLUSH state, finishing a
 * request) and calls nothing of epd_http_server.c.
 */
#include <stdio.h>
#include <string.h>

#include "epd_http_int.h"
#include "epd_log.h"

static int epd_http_header_value_ok(const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '\r' || *s == '\n') {
            return 0;
        }
    }
    return 1;
}

epd_status_t epd_http_respond(epd_http_req_t *req, int status, const char *content_type,
                              const void *body, size_t len)
{
    return epd_http_respond_ex(req, status, content_type, NULL, body, len);
}

epd_status_t epd_http_respond_ex(epd_http_req_t *req, int status, const char *content_type,
                                 const char *headers, const void *body, size_t len)
{
    epd_http_conn_t *conn = req->conn;
    char head[768];
    int hlen;
    int is_head = strcmp(req->method, "HEAD") == 0;
    epd_status_t st;

    if (req->streaming) {
        return epd_http_stream_end(req) == EPD_OK ? EPD_ERR_INVALID_PARAM
                                                  : EPD_ERR_CONNECTION_RESET;
    }
    if (conn == NULL || conn->closing) {
        epd__http_req_finish(req);
        return EPD_ERR_CONNECTION_RESET;
    }
    if (status <= 100 || status >= 600) {
        status = 500;
    }
    if (content_type == NULL || !epd_http_header_value_ok(content_type) ||
        strlen(content_type) > 200) {
        epd_log_error(EPD_HTTP_LOG, 0, "refusing a bad content type: answering 500");
        content_type = "text/plain";
        status = 500;
        body = NULL;
        len = 0;
    }
    if (headers != NULL && strlen(headers) > 200) {
        headers = NULL; /* the application's lines; a bound keeps them in `head` */
    }
    hlen = snprintf(head, sizeof(head),
                    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%s\r\n", status,
                    epd_http_status_text(status), content_type, len,
                    headers != NULL ? headers : "",
                    conn->close_after      ? "Connection: close\r\n"
                    : req->http_minor == 0 ? "Connection: keep-alive\r\n"
                                           : "");
    epd__http_req_finish(req);
    /* HEAD: the headers of the answer without its body. */
    st = epd__http_conn_write(conn, head, (size_t)hlen, body, is_head ? 0 : len, NULL, 0);
    if (st != EPD_OK) {
        return st;
    }
    epd__http_conn_answered(conn);
    return EPD_OK;
}

epd_status_t epd_http_stream_start(epd_http_req_t *req, int status)
{
    return epd_http_stream_start_ex(req, status, NULL);
}

epd_status_t epd_http_stream_start_ex(epd_http_req_t *req, int status, const char *headers)
{
    epd_http_conn_t *conn = req->conn;
    char head[512];
    int hlen;
    epd_status_t st;

    if (req->streaming) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (conn == NULL || conn->closing) {
        return EPD_ERR_CONNECTION_RESET;
    }
    if (status <= 100 || status >= 600) {
        status = 500;
    }
    if (headers != NULL && strlen(headers) > 200) {
        headers = NULL; /* the application's lines; a bound keeps them in `head` */
    }
    req->chunked = req->http_minor >= 1;
    if (!req->chunked) {
        conn->close_after = 1; /* HTTP/1.0: the end of the stream is the close */
    }
    hlen = snprintf(head, sizeof(head),
                    "HTTP/1.1 %d %s\r\nContent-Type: text/event-stream\r\n"
                    "Cache-Control: no-cache\r\n%s%s\r\n",
                    status, epd_http_status_text(status), headers != NULL ? headers : "",
                    req->chunked
                        ? (conn->close_after ? "Transfer-Encoding: chunked\r\nConnection: close\r\n"
                                             : "Transfer-Encoding: chunked\r\n")
                        : "Connection: close\r\n");
    st = epd__http_conn_write(conn, head, (size_t)hlen, NULL, 0, NULL, 0);
    if (st != EPD_OK) {
        return st;
    }
    req->streaming = 1;
    return EPD_OK;
}

epd_status_t epd_http_stream_send(epd_http_req_t *req, const void *data, size_t len)
{
    epd_http_conn_t *conn = req->conn;
    size_t backlog;
    char size[24];
    int slen = 0;

    if (!req->streaming) {
        return EPD_ERR_INVALID_PARAM;
    }
    if (conn == NULL || conn->closing) {
        return EPD_ERR_CONNECTION_RESET;
    }
    if (len == 0) {
        return EPD_OK;
    }
    backlog = uv_stream_get_write_queue_size((uv_stream_t *)&conn->tcp);
    if (len > conn->server->config.max_stream_backlog ||
        backlog > conn->server->config.max_stream_backlog - len) {
        epd_log_warn(EPD_HTTP_LOG, 0,
                     "slow reader: %zu unsent bytes + %zu would pass the %zu-byte limit: closing",
                     backlog, len, conn->server->config.max_stream_backlog);
        epd__http_conn_close(conn);
        return EPD_ERR_CONNECTION_RESET;
    }
    if (req->chunked) {
        slen = snprintf(size, sizeof(size), "%zx\r\n", len);
    }
    return epd__http_conn_write(conn, size, (size_t)slen, data, len, "\r\n", req->chunked ? 2 : 0);
}

epd_status_t epd_http_stream_end(epd_http_req_t *req)
{
    epd_http_conn_t *conn = req->conn;
    int chunked = req->chunked;
    epd_status_t st = EPD_OK;

    if (!req->streaming) {
        epd_http_respond(req, 500, "text/plain", NULL, 0);
        return EPD_ERR_INVALID_PARAM;
    }
    if (conn == NULL || conn->closing) {
        epd__http_req_finish(req);
        return EPD_ERR_CONNECTION_RESET;
    }
    epd__http_req_finish(req);
    if (chunked) {
        st = epd__http_conn_write(conn, "0\r\n\r\n", 5, NULL, 0, NULL, 0);
    }
    if (st != EPD_OK) {
        return st;
    }
    epd__http_conn_answered(conn);
    return EPD_OK;
}
