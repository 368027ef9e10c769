"""A device's memory limit and where it comes from: a cap the user set, else the device's size.

TensorFlow's cap on ``CPU:0`` is ``TF_CPU_BFC_MEM_LIMIT_IN_MB``; on a GPU it is the logical
device's ``memory_limit`` (``%gpu_mem --limit``, ``tf.config.set_logical_device_configuration``),
read from the physical GPU's configuration, which starts nothing. JAX and PyTorch report their
own limit (``bytes_limit``; the total, times ``set_per_process_memory_fraction``). Without a
cap, a GPU's limit is its total (NVML) and a CPU's the host's RAM.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kerasmagic.backends import BackendInfo
    from kerasmagic.probes.nvml_types import GpuDevice

CPU_CAP_VAR = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
TF_CAP = "TensorFlow's memory_limit"
GPU_TOTAL = "the GPU's total"


@dataclass(frozen=True)
class Limit:
    """A device's memory limit in bytes, and where it comes from (in words)."""

    bytes: int
    source: str


def is_cpu(device: str | None) -> bool:
    """Return True for a CPU device name (``CPU:0``, ``cpu:0``, ``cpu``)."""
    return device is not None and device.lower().startswith("cpu")


def index_of(device: str | None) -> int:
    """Return a device name's index (``GPU:1`` -> 1; ``cuda`` -> 0)."""
    tail = (device or "").rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def tf_logical_gpus(tf: Any) -> list[tuple[int, int | None]]:
    """Return each logical GPU of TensorFlow as (physical index, memory_limit in MB or None).

    Reads the configuration set on each physical GPU; never starts TensorFlow's runtime.
    """
    out: list[tuple[int, int | None]] = []
    for physical, gpu in enumerate(tf.config.list_physical_devices("GPU")):
        configs = tf.config.get_logical_device_configuration(gpu) or [None]
        out.extend((physical, getattr(c, "memory_limit", None)) for c in configs)
    return out


def tf_gpu_limit(
    index: int, logical: Sequence[tuple[int, int | None]], totals: Sequence[int]
) -> Limit | None:
    """Return the limit of TensorFlow's ``GPU:index``: its memory_limit, else its GPU's total.

    ``logical`` is ``tf_logical_gpus``'s answer, ``totals`` each visible GPU's bytes (NVML).
    """
    physical, cap_mb = logical[index] if index < len(logical) else (index, None)
    if cap_mb:
        return Limit(int(cap_mb) * 2**20, TF_CAP)
    return Limit(totals[physical], GPU_TOTAL) if physical < len(totals) else None


def tf_cpu_cap() -> Limit | None:
    """Return the cap of TensorFlow's capped CPU allocator, if one is set."""
    cap = os.environ.get(CPU_CAP_VAR, "")
    return Limit(int(cap) * 2**20, CPU_CAP_VAR) if cap.isdigit() else None


def device_limit(
    backend: str,
    device: str | None,
    gpus: Sequence[GpuDevice],
    reported: int | None = None,
    host_total: int | None = None,
) -> Limit | None:
    """Return the memory limit of ``backend``'s ``device`` where it is known.

    ``reported`` is the backend's own figure (JAX's ``bytes_limit``, PyTorch's capped total);
    ``host_total`` the host's RAM, the limit of a CPU without a cap.
    """
    if backend == "tensorflow" and is_cpu(device):
        return tf_cpu_cap() or (Limit(host_total, "host RAM") if host_total else None)
    if backend == "tensorflow" and device is not None:
        tf = sys.modules.get("tensorflow")
        logical = tf_logical_gpus(tf) if tf is not None else []
        return tf_gpu_limit(index_of(device), logical, [g.total_bytes for g in gpus])
    if reported:
        return Limit(reported, f"{_label(backend)}'s limit")
    if is_cpu(device) and host_total:
        return Limit(host_total, "host RAM")
    index = index_of(device)
    return Limit(gpus[index].total_bytes, GPU_TOTAL) if device and index < len(gpus) else None


def reported_limit(backends: Sequence[BackendInfo], backend: str, device: str | None) -> int | None:
    """Return the limit the backend itself reports for ``device``, if any."""
    for info in backends:
        for d in info.devices if info.name == backend else ():
            if same_device(d.name, device):
                return d.limit_bytes
    return None


def same_device(a: str | None, b: str | None) -> bool:
    """Return True when two names mean the same device (``cuda:0`` is ``GPU:0``)."""
    if a is None or b is None:
        return a is b

    def norm(name: str) -> str:
        kind, _, index = name.lower().replace("cuda", "gpu").partition(":")
        return f"{kind}:{index or '0'}"

    return norm(a) == norm(b)


def _label(backend: str) -> str:
    return {"tensorflow": "TensorFlow", "torch": "PyTorch", "jax": "JAX"}.get(backend, backend)
