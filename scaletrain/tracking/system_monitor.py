"""System samples during training, taken by a background thread: process RSS and CPU always,
GPU memory and utilisation through NVML where a GPU is used. The thread never touches a CUDA
stream (NVML reads the driver's counters out of band), so sampling adds no host sync to the
training step; samples are buffered and written to the store at epoch ends."""

from __future__ import annotations

import threading
import time

from scaletrain.tracking.store import Sample


class _NvmlDevice:
    def __init__(self, index: int):
        import pynvml
        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> tuple[int, float]:
        memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        return int(memory.used), float(util.gpu)


def _nvml_device(device) -> _NvmlDevice | None:
    if device is None or device.type != "cuda":
        return None
    try:
        import torch
        # NVML numbers devices physically; CUDA_VISIBLE_DEVICES renumbers them for torch.
        index = torch.cuda._get_nvml_device_index(device.index or 0)
        return _NvmlDevice(index)
    except Exception:  # nvidia-ml-py not installed or no driver: CPU-side samples only
        return None


class SystemMonitor:
    """Samples every `interval_s` seconds from `start()` to `stop()`; `drain()` hands over the
    samples taken since the last drain."""

    def __init__(self, interval_s: float = 1.0, device=None):
        import psutil
        self.interval_s = interval_s
        self._process = psutil.Process()
        self._gpu = _nvml_device(device)
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()

    def start(self, t0: float | None = None) -> None:
        self._t0 = time.perf_counter() if t0 is None else t0
        self._process.cpu_percent(None)  # the first call only sets the reference point
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="scaletrain-system-monitor", daemon=True)
        self._thread.start()

    def sample(self) -> Sample:
        sample = Sample(elapsed_s=time.perf_counter() - self._t0, rss_bytes=self._process.memory_info().rss,
                        cpu_percent=self._process.cpu_percent(None))
        if self._gpu is not None:
            try:
                sample.gpu_memory_bytes, sample.gpu_util_percent = self._gpu.read()
            except Exception:  # NVML lost the device or the driver: keep the CPU-side samples
                self._gpu = None
        return sample

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            sample = self.sample()
            with self._lock:
                self._samples.append(sample)

    def stop(self) -> None:
        """Stops the thread and takes one last sample, so even a run shorter than the interval has one."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        with self._lock:
            self._samples.append(self.sample())

    def drain(self) -> list[Sample]:
        with self._lock:
            out, self._samples = self._samples, []
        return out
