"""Hardware figures the planners use: device peaks and interconnect presets.

Interconnect bandwidths are *effective all-reduce bus bandwidths* (what NCCL's busbw reports for
large messages), not link data-sheet numbers; latencies are per ring hop.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.errors import ConfigError

# Dense peaks of an H100 SXM (MEASURE.md), FLOP/s. `fp32` (PyTorch's default) runs convolutions
# in TF32 and matrix products in IEEE float32: its entry is the matrix products' 67, so a convnet's
# step priced under fp32 comes out slower than it runs (its convolutions reach TF32's 495, as
# `tf32` prices them); `fp32-strict` is IEEE everywhere.
H100_PEAK = {"fp32": 67e12, "fp32-strict": 67e12, "tf32": 495e12, "bf16-mixed": 989e12, "fp16-mixed": 989e12,
             "bf16-true": 989e12}


@dataclass(frozen=True, slots=True)
class Interconnect:
    name: str
    bus_bandwidth: float   # bytes/s, effective for a ring all-reduce
    hop_latency: float     # seconds per ring step
    description: str


INTERCONNECTS = {i.name: i for i in (
    Interconnect("pcie4", 20e9, 10e-6, "PCIe 4.0 x16 between GPUs of one host (32 GB/s raw, ~20 effective)"),
    Interconnect("pcie5", 40e9, 10e-6, "PCIe 5.0 x16 between GPUs of one host (64 GB/s raw, ~40 effective)"),
    Interconnect("nvlink-h100", 370e9, 5e-6, "NVLink 4 / NVSwitch on an H100 host (~370 GB/s bus bandwidth)"),
    Interconnect("100g", 11e9, 20e-6, "100 Gb/s network between hosts (12.5 GB/s raw)"),
    Interconnect("400g", 45e9, 10e-6, "400 Gb/s network (InfiniBand NDR class) between hosts (50 GB/s raw)"),
)}


def get_interconnect(name: str) -> Interconnect:
    if name not in INTERCONNECTS:
        raise ConfigError(f"unknown interconnect '{name}'; choose one of: {', '.join(INTERCONNECTS)}")
    return INTERCONNECTS[name]
