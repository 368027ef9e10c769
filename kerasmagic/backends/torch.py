"""PyTorch: the CUDA caching allocator per device, torch.compile's caches, a memory cap.

PyTorch keeps freed CUDA blocks reserved for reuse: ``memory_allocated`` is what tensors use,
``memory_reserved`` what the process holds. On CPU none of this applies and RSS is the figure.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

from kerasmagic.backends import BackendDevice, BackendInfo, Modes, attempt, keras_backend
from kerasmagic.compat.registry import loaded, works

RESTORED = (
    "kerasmagic: the error stopped PyTorch inside torch.no_grad(), which left gradients off; "
    "they are on again, as before the cell"
)


def loaded_torch() -> Any | None:
    """Return the torch module once ``import torch`` has finished, else None."""
    return loaded("torch")


def in_use() -> bool:
    """PyTorch is in use once imported (Keras imports it only when it runs on it)."""
    return loaded_torch() is not None


def cuda_started(torch: Any) -> bool:
    """Return True once PyTorch has initialised CUDA in this process (never initialises it)."""
    return bool(attempt(lambda: torch.cuda.is_initialized(), False))


def device_limit(torch: Any, index: int) -> tuple[int, str]:
    """Return a GPU's limit for PyTorch: its total, times ``set_per_process_memory_fraction``."""
    total = int(torch.cuda.get_device_properties(index).total_memory)
    fraction = attempt(lambda: float(torch.cuda.get_per_process_memory_fraction(index)), 1.0)
    if fraction < 1.0:
        return int(total * fraction), "PyTorch's memory fraction"
    return total, "the GPU's total"


def _gpus(torch: Any) -> range:
    """Return the CUDA devices' indices once PyTorch has initialised CUDA, else none."""
    started = torch is not None and cuda_started(torch)
    return range(attempt(lambda: int(torch.cuda.device_count()), 0) if started else 0)


def _device(torch: Any, i: int) -> BackendDevice:
    def get(name: str) -> int | None:
        return attempt(lambda: int(getattr(torch.cuda, name)(i)), None)

    limit = attempt(lambda: device_limit(torch, i)[0], None)
    used, peak, reserved = map(get, ("memory_allocated", "max_memory_allocated", "memory_reserved"))
    return BackendDevice(f"cuda:{i}", used, peak, limit, reserved, "gpu")


def read() -> BackendInfo:
    """Return per-GPU allocated/reserved/peak once CUDA is up, and how many code objects
    torch.compile (dynamo) has compiled, if dynamo is loaded."""
    torch = loaded_torch()
    version, keras = getattr(torch, "__version__", None), keras_backend() == "torch"
    if torch is None:
        return BackendInfo("torch", version, keras, None)
    convert = sys.modules.get("torch._dynamo.convert_frame")
    tracker = getattr(convert, "input_codes", None) if works("torch.dynamo") else None
    frames = attempt(lambda: len(tracker.seen), None) if tracker is not None else None
    caches = {} if frames is None else {"compiled_frames": frames}
    devices = tuple(_device(torch, i) for i in _gpus(torch))
    platform = "gpu" if cuda_started(torch) else "cpu"
    return BackendInfo("torch", version, keras, platform, devices, caches)


def reset() -> list[str]:
    """Drop torch.compile's caches."""
    dynamo = sys.modules.get("torch._dynamo") if loaded_torch() is not None else None
    if dynamo is None or not works("torch.dynamo"):  # moved: said once, by compat
        return []
    dynamo.reset()
    return ["torch._dynamo.reset"]


def release() -> list[str]:
    """After the cleanup's collection (tensors in reference cycles are gone by then): hand the
    cached CUDA blocks no tensor uses back to the driver."""
    if (torch := loaded_torch()) is None or not cuda_started(torch):
        return []
    torch.cuda.empty_cache()
    torch.cuda.ipc_collect()
    return ["torch.cuda.empty_cache"]


def configure(growth: bool, limit_mb: int | None) -> str:
    """Cap each GPU with ``set_per_process_memory_fraction``; growth is PyTorch's default."""
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed: pip install 'kerasmagic[torch]'"
    torch = importlib.import_module("torch")  # the user asked for PyTorch's settings
    if not attempt(lambda: bool(torch.cuda.is_available()), False):
        return "no CUDA GPU visible to PyTorch: nothing to configure"
    parts = ["PyTorch allocates GPU memory on demand already"] if growth else []
    if limit_mb is not None:
        count = int(torch.cuda.device_count())
        for i in range(count):
            total = int(torch.cuda.get_device_properties(i).total_memory)
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit_mb * 2**20 / total), i)
        parts.append(f"memory capped at {limit_mb} MB for {count} GPU(s)")
    return "; ".join(parts)


def reset_peaks() -> list[str]:
    """Reset PyTorch's peak counters on every CUDA device; return the devices reset."""
    torch: Any = loaded_torch()
    for i in (gpus := _gpus(torch)):
        torch.cuda.reset_peak_memory_stats(i)
    return [f"cuda:{i}" for i in gpus]


def put_back(before: object, failed: bool) -> list[str]:
    """After a failed cell that started with gradients on: switch them on again if an
    interrupt inside ``torch.no_grad()`` left them off (a cell that succeeds keeps its own
    ``torch.set_grad_enabled(False)``)."""
    torch = loaded_torch()
    if not failed or before is not True or torch is None or torch.is_grad_enabled():
        return []
    torch.set_grad_enabled(True)
    return [RESTORED]


def grad_enabled() -> bool | None:
    """Return whether gradients are on for this thread, once PyTorch is imported."""
    return bool(torch.is_grad_enabled()) if (torch := loaded_torch()) is not None else None


modes = Modes(grad_enabled, put_back)
