"""Devices beyond torch's own CPU and CUDA: XLA devices (TPUs, and XLA on a CPU) through torch_xla
(xla.py). Nothing here imports torch_xla until a run asks for an XLA device."""
