# api/: the HTTP/1.1 server (epd_http_*) and the OpenAI API layer
# (epd_openai_*: request parsing, response and SSE encoding) the router
# serves with, tested on their own.  Above common/ and engine/ (epd_openai
# uses engine/epd_utf8), below router/; link it before epd_engine and
# epd_common.
API_SRCS := api/epd_http_conn.c api/epd_http_server.c api/epd_http_respond.c \
            api/epd_http_auth.c api/epd_http_proxy.c \
            api/epd_openai_json.c api/epd_openai_scan.c api/epd_openai_parse.c \
            api/epd_openai_encode.c api/epd_openai_fields.c api/epd_openai_logprobs.c
$(eval $(call epd_lib,epd_api,$(API_SRCS)))
