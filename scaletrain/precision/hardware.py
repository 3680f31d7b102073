"""What the device can do for a precision policy, and the warnings the seeds teach.

Seeds 000 and 001: mixed precision is fast on hardware with dedicated 16-bit units (NVIDIA's
tensor cores, compute capability 7.0 and newer); elsewhere fp16 saves memory but not time. bf16
has native GPU units from Ampere (8.0) on, and TF32 exists only there. On a CPU, bf16 is fast
where the cores have bf16 dot-product instructions (AVX-512 BF16, AMX); without them oneDNN
converts and computes in float32, usually slower than plain float32.

Seed 004: the caching allocator retrying an allocation (it freed its whole cache and synchronised
to find room) means memory is near full; each retry stalls the step.

Every rule reads a `DeviceFacts` value, so it is tested with the facts of devices we do not have.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from scaletrain.precision.policies import AUTO, PrecisionPolicy

TENSOR_CORES = (7, 0)      # Volta: the first fp16 tensor cores
NATIVE_BF16 = (8, 0)       # Ampere: bf16 and TF32 tensor cores
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    kind: str                                   # "cuda" or "cpu" (torch.device.type)
    name: str
    capability: tuple[int, int] | None = None   # CUDA compute capability
    cpu_flags: frozenset[str] = frozenset()     # /proc/cpuinfo's flags (Linux); empty where unknown


# The device `scaling --assume-h100-mfu` prices a step on.
H100 = DeviceFacts("cuda", "NVIDIA H100", (9, 0))


def device_facts(device: torch.device) -> DeviceFacts:
    """The facts of this process's device, read once."""
    if device.type == "cuda":
        return DeviceFacts("cuda", torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
    if device.type == "xla":
        return xla_facts()
    return DeviceFacts(device.type, device.type, cpu_flags=_cpu_flags())


def xla_facts() -> DeviceFacts:
    """An XLA device's facts, named by what the devices are ("TPU", or "CPU" for XLA on a CPU),
    read without starting its runtime."""
    from scaletrain.accelerators import xla
    return DeviceFacts("xla", xla.kind(), cpu_flags=_cpu_flags())


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def auto_precision(facts: DeviceFacts) -> tuple[str, str]:
    """The policy `--precision auto` runs on this device, and why, in a few words. bf16-mixed where
    the device computes bfloat16 natively (seed 000's "up to 3x": 5.2x eager over fp32 on an H200's
    WRN-16-10, BENCHMARKS.md), fp32 elsewhere: on older GPUs bf16 is emulated, and on a CPU a
    16-bit policy is a measured choice (`scaletrain autotune`), not a default. Composer chooses the
    same way (mixed precision on GPUs, fp32 on CPUs)."""
    if facts.kind == "cuda" and facts.capability is not None:
        cc = ".".join(map(str, facts.capability))
        if facts.capability >= NATIVE_BF16:
            return "bf16-mixed", f"{facts.name} computes bfloat16 natively (compute capability {cc})"
        return "fp32", (f"{facts.name} (compute capability {cc}) has no native bfloat16 (8.0 and newer); "
                        "--precision fp16-mixed may be faster there")
    if facts.kind == "xla" and facts.name == "TPU":
        return "bf16-mixed", "a TPU computes bfloat16 natively"
    if facts.kind == "xla":
        return "fp32", (f"XLA on a {facts.name} computes in float32 by default (a TPU would default to bf16-mixed); "
                        "--precision bf16-mixed runs it through XLA's autocast")
    return "fp32", (f"on a {facts.kind.upper()} the default is float32; try --precision bf16-mixed, or "
                    "`scaletrain autotune`, which measures it")


def settle_precision(requested: str, facts: DeviceFacts) -> tuple[str, str | None]:
    """(policy name, why) for a `--precision` value: `auto` becomes the device's policy with its
    reason; any other name stays as it is, with no reason (the user chose it)."""
    if requested != AUTO:
        return requested, None
    name, why = auto_precision(facts)
    return name, f"auto: {why}"


def precision_warnings(policy: PrecisionPolicy, facts: DeviceFacts) -> list[str]:
    """One line per way this device defeats the policy's purpose (empty when it does not)."""
    out = []
    dtypes = {policy.autocast_dtype, policy.param_dtype}
    if facts.kind == "cuda" and facts.capability is not None:
        cc = ".".join(map(str, facts.capability))
        if torch.float16 in dtypes and facts.capability < TENSOR_CORES:
            out.append(f"{facts.name} (compute capability {cc}) has no tensor cores: {policy.name} saves memory "
                       "but expect little or no speed-up over fp32 (tensor cores need 7.0, Volta, or newer)")
        if torch.bfloat16 in dtypes and facts.capability < NATIVE_BF16:
            out.append(f"{facts.name} (compute capability {cc}) has no native bfloat16: {policy.name} is emulated "
                       "and slower than fp32; use fp16-mixed (bf16 needs 8.0, Ampere, or newer)")
        elif policy.tf32_matmul and not policy.computes_in_16_bit and facts.capability < NATIVE_BF16:
            out.append(f"{facts.name} (compute capability {cc}) has no TF32: {policy.name} runs as fp32 there "
                       "(TF32 needs 8.0, Ampere, or newer)")
    elif facts.kind == "cpu":
        if torch.bfloat16 in dtypes and facts.cpu_flags and not facts.cpu_flags & CPU_BF16_FLAGS:
            out.append(f"this CPU has no bfloat16 instructions (avx512_bf16 or amx_bf16): {policy.name} is "
                       "converted to float32 inside every kernel and usually slower than fp32")
        if torch.float16 in dtypes:
            out.append(f"{policy.name} on a CPU: fp16 has no fast CPU kernels; use bf16-mixed where the CPU has "
                       "bfloat16 instructions, else fp32")
        if policy.tf32_matmul and not policy.computes_in_16_bit:   # (fp32 keeps cuDNN's TF32 convolutions only)
            out.append(f"{policy.name} on a CPU: TF32 is a format of NVIDIA's tensor cores, which a CPU has not; it "
                       "trains exactly as fp32 here (name fp32 for a run that says so)")
    return out


def allocator_retry_warning(retries_before: int, retries_after: int) -> str | None:
    """A line when the CUDA caching allocator had to retry allocations (torch.cuda.memory_stats'
    `num_alloc_retries`) between two reads; None when it did not."""
    new = retries_after - retries_before
    if new <= 0:
        return None
    return (f"the CUDA allocator retried {new} allocation(s) after freeing its cache (memory is nearly full; "
            "each retry synchronises the device): lower --batch-size, turn on --activation-checkpointing, or set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
