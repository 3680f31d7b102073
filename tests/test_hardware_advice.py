"""The hardware warnings the seeds teach: 16-bit precisions on devices without the units for them,
and the CUDA allocator retrying when memory is nearly full. The rules read device facts, so the
GPUs we do not have are described by their compute capability."""

import pytest

from scaletrain.precision.hardware import (
    DeviceFacts,
    _cpu_flags,
    allocator_retry_warning,
    device_facts,
    precision_warnings,
)
from scaletrain.precision.policies import get_policy
from tests.test_cli import run_cli

P100 = DeviceFacts("cuda", "Tesla P100", (6, 0))
V100 = DeviceFacts("cuda", "Tesla V100", (7, 0))
T4 = DeviceFacts("cuda", "Tesla T4", (7, 5))
A100 = DeviceFacts("cuda", "NVIDIA A100", (8, 0))
H100 = DeviceFacts("cuda", "NVIDIA H100", (9, 0))
OLD_CPU = DeviceFacts("cpu", "cpu", cpu_flags=frozenset({"sse2", "avx2", "avx512f"}))
BF16_CPU = DeviceFacts("cpu", "cpu", cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"}))


def warnings(policy: str, facts: DeviceFacts) -> list[str]:
    return precision_warnings(get_policy(policy), facts)


def test_fp16_without_tensor_cores_is_named_with_the_capability():
    [line] = warnings("fp16-mixed", P100)
    assert "Tesla P100" in line and "6.0" in line and "no tensor cores" in line
    assert warnings("fp16-mixed", V100) == warnings("fp16-mixed", T4) == warnings("fp16-mixed", H100) == []


@pytest.mark.parametrize("policy", ["bf16-mixed", "bf16-true"])
def test_bf16_before_ampere_is_emulated(policy):
    for facts in (P100, V100, T4):
        [line] = warnings(policy, facts)
        assert "no native bfloat16" in line and policy in line and "fp16-mixed" in line
    assert warnings(policy, A100) == warnings(policy, H100) == []


def test_tf32_before_ampere_runs_as_fp32_and_fp32_is_never_warned_about():
    [line] = warnings("tf32", T4)
    assert "no TF32" in line
    assert warnings("tf32", A100) == []
    for facts in (P100, V100, T4, A100, OLD_CPU, BF16_CPU):
        assert warnings("fp32", facts) == []


def test_bf16_on_a_cpu_needs_its_bf16_instructions():
    [line] = warnings("bf16-mixed", OLD_CPU)
    assert "avx512_bf16" in line
    assert warnings("bf16-mixed", BF16_CPU) == warnings("bf16-true", BF16_CPU) == []
    assert warnings("bf16-mixed", DeviceFacts("cpu", "cpu")) == []   # flags unknown: no guess


def test_fp16_on_a_cpu_is_warned_about_everywhere():
    for facts in (OLD_CPU, BF16_CPU):
        assert any("no fast CPU kernels" in line for line in warnings("fp16-mixed", facts))


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: X\nflags\t\t: fpu sse2 avx512_bf16 avx2\n\n")
    assert _cpu_flags(info) == {"fpu", "sse2", "avx512_bf16", "avx2"}
    assert _cpu_flags(tmp_path / "missing") == frozenset()


def test_allocator_retries_are_warned_about_only_when_they_grow():
    assert allocator_retry_warning(0, 0) is None and allocator_retry_warning(4, 4) is None
    line = allocator_retry_warning(4, 7)
    assert "retried 3 allocation" in line and "--batch-size" in line and "expandable_segments" in line


@pytest.mark.usefixtures("processes")
def test_a_training_prints_this_devices_precision_notes(tmp_path):
    """Through the CLI on this CPU: fp16-mixed is named as slow here, once, before training."""
    import torch
    expected = precision_warnings(get_policy("fp16-mixed"), device_facts(torch.device("cpu")))
    result = run_cli("train", "--model", "mlp", "--data", "digits", "--epochs", "1", "--precision", "fp16-mixed",
                     "--no-record", "--no-progress", "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert expected and all(result.stdout.count(f"note: {line[:60]}") == 1 for line in expected)
