#!/usr/bin/env python3
"""epd_mh_delay.py — a transparent TCP relay that adds latency (stdlib only).

This kernel has no netem (sch_netem), so a high-latency link is made in
user space: nftables in a host's namespace redirects the connections to
delay (`type nat hook output`, `redirect to :PORT`), this relay accepts
them on PORT, finds where each was going (SO_ORIGINAL_DST), connects there
itself — its own sockets carry SO_MARK, which the nftables rule skips, so
they are not redirected again — and forwards every chunk in each direction
DELAY ms after it arrived, in order (a one-way latency; no bandwidth limit:
tc tbf does that).  Half-closes are forwarded, late too; an error on
either side closes both.

  epd_mh_delay.py --listen HOST:PORT --delay-ms D [--mark 0x4d]
                  [--ready-file F] [--stats-file F]

PORT 0 picks one; the ready file gets "port=PORT" once listening.  The
stats file holds "connections=N bytes=B" (rewritten every 0.2 s and at
exit); SIGTERM or SIGINT ends it with exit 0.
"""
import argparse
import asyncio
import os
import signal
import socket
import struct
import sys

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h


def original_dst(sock):
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, addr = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(addr), port


class Relay:
    def __init__(self, delay_s, mark):
        self.delay_s = delay_s
        self.mark = mark
        self.connections = 0
        self.bytes = 0

    async def pump(self, reader, writer):
        """Forwards reader -> writer, each chunk delay_s after it arrived."""
        loop = asyncio.get_running_loop()
        q = asyncio.Queue()

        async def read_side():
            try:
                while True:
                    data = await reader.read(65536)
                    q.put_nowait((loop.time() + self.delay_s, data))
                    if not data:
                        return
            except (ConnectionError, OSError):
                q.put_nowait((loop.time(), None))

        async def write_side():
            while True:
                when, data = await q.get()
                wait = when - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:  # the reading side failed: close
                    writer.close()
                    return
                if not data:  # EOF: half-close, as the sender did
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                self.bytes += len(data)
                writer.write(data)
                await writer.drain()

        r = asyncio.ensure_future(read_side())
        try:
            await write_side()
        except (ConnectionError, OSError):
            writer.close()
        finally:
            r.cancel()

    async def serve(self, c_reader, c_writer):
        sock = c_writer.get_extra_info("socket")
        try:
            host, port = original_dst(sock)
            up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            up.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.mark)
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up.setblocking(False)
            await asyncio.get_running_loop().sock_connect(up, (host, port))
            u_reader, u_writer = await asyncio.open_connection(sock=up)
        except OSError:
            c_writer.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections += 1
        await asyncio.gather(self.pump(c_reader, u_writer), self.pump(u_reader, c_writer),
                             return_exceptions=True)
        for w in (c_writer, u_writer):
            w.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", required=True)
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--mark", type=lambda v: int(v, 0), default=0x4D)
    ap.add_argument("--ready-file")
    ap.add_argument("--stats-file")
    a = ap.parse_args()
    host, port = a.listen.rsplit(":", 1)
    relay = Relay(a.delay_ms / 1000.0, a.mark)
    server = await asyncio.start_server(relay.serve, host, int(port))
    bound = server.sockets[0].getsockname()[1]
    if a.ready_file:
        with open(a.ready_file + ".tmp", "w") as f:
            f.write("port=%d\n" % bound)
        os.rename(a.ready_file + ".tmp", a.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)

    def stats():
        if a.stats_file:
            with open(a.stats_file + ".tmp", "w") as f:
                f.write("connections=%d bytes=%d\n" % (relay.connections, relay.bytes))
            os.rename(a.stats_file + ".tmp", a.stats_file)

    while not stop.is_set():
        stats()
        try:
            await asyncio.wait_for(stop.wait(), 0.2)
        except asyncio.TimeoutError:
            pass
    server.close()
    stats()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
