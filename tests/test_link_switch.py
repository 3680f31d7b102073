"""benchmarks/link_switch.py, the emulated links the scaling predictor is checked over: two hosts
(network namespaces) joined by the compiled switch give the latency and the rate they were set
to, measured with real TCP traffic between them."""

from __future__ import annotations

import shutil
import statistics

import pytest

from tests.test_multihost import REASON

pytestmark = [pytest.mark.skipif(REASON is not None or shutil.which("cc") is None,
                                 reason=REASON or "needs a C compiler for the switch's loop"),
              pytest.mark.alone]   # latencies and rates of a switch that forwards on the CPU


@pytest.mark.parametrize("latency_ms", [0.0, 5.0])
def test_the_switch_delays_each_way_by_its_latency(latency_ms):
    from benchmarks.link_switch import round_trip_s, switched_hosts
    with switched_hosts(2, rate_mbit=100, latency_ms=latency_ms) as hosts:
        trips = round_trip_s(hosts[0], hosts[1])
    # Two latencies, plus the forwarding of two small packets (a few hundred microseconds on 2
    # cores); never less than the two latencies.
    assert min(trips) >= 2 * latency_ms / 1e3
    assert statistics.median(trips) < 2 * latency_ms / 1e3 + 1.5e-3, trips


def test_the_switch_carries_a_stream_at_its_rate():
    from benchmarks.link_switch import stream_rate_bps, switched_hosts
    with switched_hosts(2, rate_mbit=200, latency_ms=1.0) as hosts:
        rate = stream_rate_bps(hosts[0], hosts[1], 16 * 2**20)      # 0.67 s at 200 Mbit/s
    # The rate it was set to, less TCP/IP headers and the stream's start.
    assert 0.85 * 200e6 < rate <= 1.01 * 200e6, rate
