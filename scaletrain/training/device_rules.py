"""What a kind of device cannot run, asked once per job: by the launch before any worker starts
(preflight.py) and by the Trainer before its strategy opens the device (the path a single
process and the Python API take). One line each, with the fix."""

from __future__ import annotations

from scaletrain.config import TrainConfig


def device_problem(cfg: TrainConfig, strategy, world: int) -> str | None:
    """Why `cfg` cannot train on the kind of device it names (one line, with the fix), or None:
    the strategy's `device_types`, and what an XLA device cannot do (accelerators/xla.py)."""
    from scaletrain.accelerators.xla import device_type
    kind = device_type(cfg.device)
    if cfg.precision.policy != "auto":     # what the policy itself needs (fp8: torchao, float8 tensor cores)
        from scaletrain.precision import get_policy
        problem = get_policy(cfg.precision.policy).problem(cfg.precision, kind, None)
        if problem:
            return problem
    if kind != "xla":
        if kind not in strategy.device_types:
            return (f"--strategy {strategy.name} runs on {' or '.join(strategy.device_types)} devices only; "
                    f"use --device {strategy.device_types[0]}")
        return None
    from scaletrain.accelerators import xla
    if not xla.installed():
        return xla.MISSING
    if world > 1:
        return ("--device xla runs in one process, which drives every XLA device of the host: drop --nproc "
                "(--strategy spmd spreads the batch over the devices)")
    if kind not in strategy.device_types:
        return (f"--strategy {strategy.name} does not run on XLA devices; use --strategy single (one device) "
                "or spmd (data parallel over every XLA device of the host)")
    if cfg.precision.policy.startswith("fp16"):
        return (f"--precision {cfg.precision.policy} on an XLA device: fp16's dynamic loss scale skips steps "
                "through fused optimizer kernels, which XLA has not; use --precision bf16-mixed")
    if cfg.compile:
        return "--compile on an XLA device: XLA compiles every step's graph already; drop --compile"
    from scaletrain.optim.optimizers import device_problem as optimizer_problem
    return optimizer_problem(cfg.optim.optimizer, kind)
