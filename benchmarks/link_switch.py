"""Hosts joined by a switch with a link rate and a one-way latency, on one machine, where the
kernel has no netem to delay packets (`tc qdisc ... netem`: "Specified qdisc kind is unknown").

Each host is a network namespace holding one TUN device. The switch (this file run as a
process) holds every device's other end and forwards IPv4 packets by destination address. A
packet from host i to host j is delivered at

    leaves i   = max(now, when i's link is free) + size / rate      (i's link, one way)
    delivered  = max(leaves i + latency, when j's link is free + size / rate)

so each host sends and receives at the rate, full duplex, a lone packet arrives `latency` after
it has left, and packets converging on one host (a parameter server's W pushes) share its link.
The queues do not drop: TCP sees the rate as delay, never as loss (a drop would cost it a 200 ms
retransmission timeout on a link this short). The devices' MTU is 65000, so TCP moves a large
message in few packets and the switch, one Python process, forwards 1 Gbit/s with a few per cent
of a core (`--self-test` measures that).

    with switched_hosts(4, rate_mbit=1000, latency_ms=1.0) as hosts:
        ...   # hosts: (namespace, device, None, address) as shaped_links.shaped_hosts yields

Needs root (namespaces, /dev/net/tun).
"""

from __future__ import annotations

import argparse
import fcntl
import heapq
import os
import select
import socket
import struct
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
MTU = 65000


def _open_tun(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def forward(fds: list[int], addresses: list[str], rate_Bps: float, latency_s: float, stop_after_s: float = 0.0) -> dict:
    """The switch: forwards until stdin closes (the benchmark ending) or `stop_after_s` passes.
    Returns counts of what it forwarded and how late it wrote packets past their due time."""
    index = {socket.inet_aton(a): i for i, a in enumerate(addresses)}
    host_of = {fd: i for i, fd in enumerate(fds)}
    link_out, link_in = [0.0] * len(fds), [0.0] * len(fds)
    due: list = []                              # (delivery time, order, host, packet)
    order = packets = late = 0
    watched = [*fds, sys.stdin.fileno()] if not stop_after_s else list(fds)
    ends = time.monotonic() + stop_after_s if stop_after_s else float("inf")
    while time.monotonic() < ends:
        wait = max(due[0][0] - time.monotonic(), 0.0) if due else min(1.0, max(ends - time.monotonic(), 0.0))
        readable, _, _ = select.select(watched, [], [], wait)
        for fd in readable:
            if fd == sys.stdin.fileno():
                if not os.read(fd, 4096):          # the benchmark closed our stdin: it is over
                    return {"packets": packets, "late_packets": late}
                continue
            sender = host_of[fd]
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if len(packet) < 20 or packet[0] >> 4 != 4:
                    continue                        # not IPv4 (IPv6 router solicitations and the like)
                receiver = index.get(packet[16:20])
                if receiver is None:
                    continue
                now = time.monotonic()
                wire = len(packet) / rate_Bps
                link_out[sender] = leaves = max(now, link_out[sender]) + wire
                link_in[receiver] = arrives = max(leaves + latency_s, link_in[receiver] + wire)
                heapq.heappush(due, (arrives, order, receiver, packet))
                order += 1
        now = time.monotonic()
        while due and due[0][0] <= now:
            when, _, receiver, packet = heapq.heappop(due)
            late += now - when > 100e-6
            os.write(fds[receiver], packet)
            packets += 1
    return {"packets": packets, "late_packets": late}


def _serve(names: list[str], namespaces: list[str], addresses: list[str], rate_mbit: float, latency_ms: float) -> None:
    """Creates the devices, moves each into its namespace, says "ready", then forwards."""
    import ctypes
    # A timed wait may end up to the timer slack late (50 us by default): 1 ns keeps the delivery
    # times the rate and latency set.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(29, 1)    # PR_SET_TIMERSLACK
    fds = []
    for name, ns, address in zip(names, namespaces, addresses):
        fds.append(_open_tun(name))
        _sh("ip", "link", "set", name, "netns", ns)
        _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", name)
        _sh("ip", "-n", ns, "link", "set", name, "mtu", str(MTU), "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
    print("ready", flush=True)
    forward(fds, addresses, rate_mbit * 1e6 / 8, latency_ms / 1e3)


@contextmanager
def switched_hosts(n: int, rate_mbit: float, latency_ms: float):
    """n namespaces joined by the switch: each host's link at `rate_mbit`, `latency_ms` one way."""
    tag = uuid.uuid4().hex[:4]
    namespaces = [f"sts{tag}{i}" for i in range(n)]
    names = [f"stt{tag}{i}" for i in range(n)]
    addresses = [f"10.79.{int(tag[:2], 16) % 200}.{i + 1}" for i in range(n)]
    switch = None
    try:
        for ns in namespaces:
            _sh("ip", "netns", "add", ns)
        switch = subprocess.Popen([sys.executable, __file__, "--serve", ",".join(names), ",".join(namespaces),
                                   ",".join(addresses), str(rate_mbit), str(latency_ms)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if switch.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the link switch did not start (exit {switch.wait()})")
        yield [(ns, name, None, address) for ns, name, address in zip(namespaces, names, addresses)]
    finally:
        if switch is not None:
            switch.stdin.close()
            try:
                switch.wait(timeout=10)
            except subprocess.TimeoutExpired:
                switch.kill()
        for ns in namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _self_test(rate_mbit: float, latency_ms: float) -> None:
    """Two hosts: a ping's round trip (two latencies) and one TCP stream's rate, with the switch's
    CPU time over the stream."""
    import re
    with switched_hosts(2, rate_mbit, latency_ms) as hosts:
        (ns0, _, _, a0), (ns1, _, _, a1) = hosts
        ping = subprocess.run(["ip", "netns", "exec", ns0, "ping", "-c", "5", "-i", "0.2", a1],
                              capture_output=True, text=True).stdout
        rtts = [float(v) for v in re.findall(r"time=([\d.]+) ms", ping)]
        print(f"ping round trips ms: {rtts} (2 x {latency_ms} ms expected, plus forwarding)")
        size = 64 * 2**20
        sink = subprocess.Popen(["ip", "netns", "exec", ns1, sys.executable, "-c",
                                 "import socket; s = socket.create_server(('0.0.0.0', 29700)); c, _ = s.accept()\n"
                                 "n = 0\nwhile (b := c.recv(1 << 20)): n += len(b)\nprint(n)"],
                                stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        started = time.perf_counter()
        subprocess.run(["ip", "netns", "exec", ns0, sys.executable, "-c",
                        f"import socket; c = socket.create_connection(('{a1}', 29700)); c.sendall(bytes({size}))"],
                       check=True)
        received = int(sink.communicate(timeout=120)[0])
        seconds = time.perf_counter() - started
        print(f"one stream: {received * 8 / seconds / 1e6:,.0f} Mbit/s over {seconds:.2f} s "
              f"(rate {rate_mbit:,.0f} Mbit/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", nargs=5, metavar=("DEVICES", "NAMESPACES", "ADDRESSES", "MBIT", "MS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--self-test", nargs=2, type=float, metavar=("MBIT", "MS"),
                        help="two hosts at this rate and latency: ping and one TCP stream")
    args = parser.parse_args()
    if args.serve:
        names, namespaces, addresses, mbit, ms = args.serve
        return _serve(names.split(","), namespaces.split(","), addresses.split(","), float(mbit), float(ms))
    if args.self_test:
        return _self_test(*args.self_test)
    parser.print_help()


if __name__ == "__main__":
    main()
