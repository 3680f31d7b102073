"""[distributed.ps]: the parameter servers' options (`--num-ps`, `--ps-mode`, ...), owned by
--strategy ps. processes = workers + num_ps: the servers hold the parameters and the optimizer
state, sharded over them; the workers compute gradients."""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.config import register_table
from scaletrain.options import option as _f


@dataclass(kw_only=True, slots=True)
class PSOptions:
    num_ps: int = _f(1, "--strategy ps: parameter-server processes (the parameters are sharded over them by size)",
                     ge=1)
    ps_mode: str = _f("sync", "--strategy ps: sync (every step waits for the workers' gradients) or async (each "
                      "gradient is applied as it arrives)", choices=("sync", "async"), training_only=True)
    backup_workers: int = _f(0, "--strategy ps: an epoch ends once all but B workers have finished their share (the "
                             "rest of the others' is dropped); in sync mode each step also applies the first workers "
                             "- B gradients and drops the late ones. Nothing waits for the slowest B", ge=0,
                             training_only=True)
    max_staleness: int | None = _f(None, "--ps-mode async: drop gradients computed on parameters more than this many "
                                   "updates old", ge=0, training_only=True)
    stale_lr: bool = _f(False, "--ps-mode async: divide the learning rate by 1 + the gradient's staleness",
                        training_only=True)
    sync_warmup_epochs: int = _f(0, "--ps-mode async: train the first N epochs in sync mode (a warm-up on one "
                                 "consistent model before gradients can be stale)", ge=0, training_only=True)
    ps_roll_call_s: float = _f(5.0, "--strategy ps, async or backups: after a failed collective of the workers, how "
                               "long the survivors wait for each other at the roll call before going on without "
                               "the missing", gt=0, training_only=True)

    @property
    def survives_lost_workers(self) -> bool:
        """Async and backup modes never wait for a given worker, so they go on without a dead one
        (the strategy's workers and its servers both ask)."""
        return self.ps_mode == "async" or self.backup_workers > 0

    def problem(self, cfg) -> str | None:
        if self.ps_mode == "sync" and (self.max_staleness is not None or self.stale_lr or self.sync_warmup_epochs):
            return ("--max-staleness, --stale-lr and --sync-warmup-epochs apply to --ps-mode async (sync gradients "
                    "are never stale)")
        # Not yet built for parameter servers (the servers step the optimizer; the workers never see a whole update).
        unsupported = {"--clip-grad-norm": cfg.optim.clip_grad_norm, "--compile": cfg.compile,
                       "--precision fp16-mixed": cfg.precision.policy == "fp16-mixed",
                       "--grad-accum-steps": cfg.optim.grad_accum_steps > 1}
        given = [flag for flag, on in unsupported.items() if on]
        if given:
            return f"--strategy ps does not support {given[0]} yet; drop it, or use --strategy ddp"
        return None


register_table("ps", PSOptions, owners=("ps",))
