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
message in few packets. The forwarding loop is C (link_switch.c, compiled with `cc` on first use):
in Python it took a fifth to a half of one of the 2 cores that 8 hosts' compute shares, and their
DDP step ran 18-20 % slower than over tbf. `--self-test` measures the latency and rate it gives.

    with switched_hosts(4, rate_mbit=1000, latency_ms=1.0) as hosts:
        ...   # hosts: (namespace, device, None, address) as shaped_links.shaped_hosts yields

Needs root (namespaces, /dev/net/tun).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

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


def switch_binary() -> Path:
    """link_switch.c compiled (once per version of the source) into the temporary folder."""
    source = Path(__file__).with_suffix(".c")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    binary = Path(tempfile.gettempdir()) / f"scaletrain-link-switch-{digest}"
    if not binary.exists():
        built = binary.with_suffix(".tmp")
        result = subprocess.run(["cc", "-O2", "-o", str(built), str(source)], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"cannot compile {source.name} (a C compiler is needed: apt-get install gcc):\n"
                               f"{result.stderr[-2000:]}")
        built.replace(binary)
    return binary


def _serve(binary: str, names: list[str], namespaces: list[str], addresses: list[str], rate_mbit: float,
           latency_ms: float) -> None:
    """Creates the devices, moves each into its namespace, says "ready", then becomes the C loop,
    which inherits the devices and reads this process's standard input for the end."""
    fds = []
    for name, ns, address in zip(names, namespaces, addresses, strict=True):
        fds.append(_open_tun(name))
        os.set_inheritable(fds[-1], True)
        _sh("ip", "link", "set", name, "netns", ns)
        _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", name)
        _sh("ip", "-n", ns, "link", "set", name, "mtu", str(MTU), "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
    print("ready", flush=True)
    os.execv(binary, [binary, repr(rate_mbit * 1e6 / 8), repr(latency_ms / 1e3),
                      *(f"{address}={fd}" for address, fd in zip(addresses, fds, strict=True))])


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
        switch = subprocess.Popen([sys.executable, __file__, "--serve", str(switch_binary()), ",".join(names),
                                   ",".join(namespaces), ",".join(addresses), str(rate_mbit), str(latency_ms)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if switch.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the link switch did not start (exit {switch.wait()})")
        yield [(ns, name, None, address) for ns, name, address in zip(namespaces, names, addresses, strict=True)]
    finally:
        if switch is not None:
            switch.stdin.close()
            try:
                switch.wait(timeout=10)
            except subprocess.TimeoutExpired:
                switch.kill()
        for ns in namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# What a host runs for the self-test, listening on port 29700: echo every byte back, or count the
# bytes of one stream and print its rate (bits/s) from its first byte to its last.
ECHO = """
import socket
server = socket.create_server(("0.0.0.0", 29700))
print("listening", flush=True)
conn, _ = server.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (data := conn.recv(1 << 20)):
    conn.sendall(data)
"""
SINK = """
import socket, time
server = socket.create_server(("0.0.0.0", 29700))
print("listening", flush=True)
conn, _ = server.accept()
data = conn.recv(1 << 20)
first, received = time.perf_counter(), len(data)
while (data := conn.recv(1 << 20)):
    received += len(data)
print(received * 8 / (time.perf_counter() - first), flush=True)
"""


def _in_host(ns: str, code: str) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def round_trip_s(sender, receiver, repeats: int = 20) -> list[float]:
    """Round trips of 64 bytes over TCP from one host to another and back (two latencies, plus what
    forwarding costs), each measured in the sending host."""
    server = _in_host(receiver[0], ECHO)
    assert server.stdout.readline().strip() == "listening"
    client = subprocess.run(["ip", "netns", "exec", sender[0], sys.executable, "-c", f"""
import socket, time
c = socket.create_connection(("{receiver[3]}", 29700)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range({repeats} + 3):
    t = time.perf_counter(); c.sendall(bytes(64)); got = 0
    while got < 64: got += len(c.recv(64 - got))
    print(time.perf_counter() - t)
"""], capture_output=True, text=True, check=True).stdout
    server.communicate(timeout=30)
    return [float(line) for line in client.split()][3:]     # the first few: connection warm-up


def stream_rate_bps(sender, receiver, size: int) -> float:
    """One TCP stream of `size` bytes, timed from the receiver's first byte to its last."""
    sink = _in_host(receiver[0], SINK)
    assert sink.stdout.readline().strip() == "listening"
    subprocess.run(["ip", "netns", "exec", sender[0], sys.executable, "-c",
                    f"import socket; c = socket.create_connection(('{receiver[3]}', 29700)); c.sendall(bytes({size}))"],
                   check=True)
    return float(sink.communicate(timeout=120)[0].strip())


def _self_test(rate_mbit: float, latency_ms: float) -> None:
    """Two hosts: round trips (two latencies) and one TCP stream's rate."""
    import statistics
    with switched_hosts(2, rate_mbit, latency_ms) as hosts:
        trips = round_trip_s(hosts[0], hosts[1])
        print(f"round trip of 64 bytes: median {statistics.median(trips) * 1e3:.3f} ms, min {min(trips) * 1e3:.3f} "
              f"(2 x {latency_ms:g} ms set)")
        rate = stream_rate_bps(hosts[0], hosts[1], 64 * 2**20)
        print(f"one stream: {rate / 1e6:,.0f} Mbit/s (rate {rate_mbit:,.0f} Mbit/s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", nargs=6, metavar=("BINARY", "DEVICES", "NAMESPACES", "ADDRESSES", "MBIT", "MS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--self-test", nargs=2, type=float, metavar=("MBIT", "MS"),
                        help="two hosts at this rate and latency: round trips and one TCP stream")
    args = parser.parse_args()
    if args.serve:
        binary, names, namespaces, addresses, mbit, ms = args.serve
        return _serve(binary, names.split(","), namespaces.split(","), addresses.split(","), float(mbit), float(ms))
    if args.self_test:
        return _self_test(*args.self_test)
    parser.print_help()


if __name__ == "__main__":
    main()
