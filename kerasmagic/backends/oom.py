"""What runs out: a device's memory limit, and an out-of-memory error of any Keras backend.

An error is recognised by type and message: the same parser reads a raised exception in the
kernel and an isolated child's error, which comes back as its type's name and its message only.
A device's limit is the cap the user set, else the device's size.

JAX and PyTorch report their own limit (``bytes_limit``; the total, times
``set_per_process_memory_fraction``); TensorFlow's cap is read by its backend's ``limit``
(``backends/tensorflow/runtime.py``). Without a cap, a GPU's limit is its total (NVML) and a
CPU's the host's RAM.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kerasmagic.backends import LABELS, NAMES, BackendInfo, Limit, get

# Bytes per element of the dtype names TensorFlow writes in its OOM message.
ITEMSIZE = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2,
    "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16,
}  # fmt: skip
TF_OOM = re.compile(
    r"OOM when allocating tensor with shape\s*\[(?P<shape>[\d,\s]*)\]\s*and type (?P<dtype>\w+)"
    r"\s*on (?P<device>\S+)"
)
SIZE = r"(?P<{}>[\d.]+ ?(?:bytes|B|[KMGT]i?B))"
TORCH_WANTED = re.compile(r"Tried to allocate " + SIZE.format("size"))
TORCH_TOTAL = re.compile(  # 2.1+: "has a total capacity of 79.15 GiB"; older: "79.15 GiB total"
    r"total capacity of " + SIZE.format("a") + "|" + SIZE.format("b") + " total capacity"
)
TORCH_ALLOWED = re.compile(SIZE.format("size") + " allowed")  # set_per_process_memory_fraction
TORCH_IN_USE = re.compile(  # 2.1+: "76.1 GiB is allocated by PyTorch"; older: "already allocated"
    SIZE.format("a") + " is allocated by PyTorch|" + SIZE.format("b") + " already allocated"
)
TORCH_CPU = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+)")
JAX_WANTED = re.compile(  # CPU: "Out of memory allocating N bytes"; GPU: "... trying to allocate"
    r"allocat\w* (?P<bytes>\d+) bytes|allocate request for [\d.]+ ?\w+ \((?P<b>\d+)B\)"
)
JAX_DEVICE = re.compile(r"device ordinal (\d+)")
UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
         "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}  # fmt: skip


@dataclass(frozen=True)
class OomError:
    """What an out-of-memory error says: backend, device, and what the failed allocation wanted.

    ``in_use_bytes`` and ``limit_bytes`` are what the message itself says of the allocator at
    the failure (PyTorch's CUDA message does), else None.
    """

    backend: str  # "tensorflow", "torch", "jax"
    device: str | None  # "CPU:0", "GPU:0"
    wanted_bytes: int | None
    shape: tuple[int, ...] | None
    dtype: str | None
    in_use_bytes: int | None = None
    limit_bytes: int | None = None


def find_oom(error: BaseException | None) -> OomError | None:
    """Return the OOM in ``error`` or what it was raised from, else None.

    An isolated cell's error (``IsolatedError``) is read from the child's error type and
    message, which it carries as ``outcome``.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        outcome = getattr(error, "outcome", None)
        kind = getattr(outcome, "error_type", None)
        if isinstance(kind, str):
            text = getattr(outcome, "error_message", None) or getattr(outcome, "error", "")
            found = parse_oom(kind, "", str(text or ""))
        else:
            found = parse_oom(type(error).__name__, type(error).__module__ or "", str(error))
        if found is not None:
            return found
        error = error.__cause__ or error.__context__
    return None


def parse_oom(kind: str, module: str, text: str) -> OomError | None:
    """Return the OOM an error of type ``kind`` (from ``module``, if known) says, else None."""
    kind = kind.rsplit(".", 1)[-1]
    if kind == "ResourceExhaustedError" or "OOM when allocating" in text:
        match = TF_OOM.search(text)
        if match is None:
            return OomError("tensorflow", None, None, None, None)
        shape = tuple(int(n) for n in match["shape"].replace(" ", "").split(",") if n)
        size = ITEMSIZE.get(match["dtype"])
        wanted = None if size is None else math.prod(shape) * size
        device = match["device"].rsplit("device:", 1)[-1]
        return OomError("tensorflow", device, wanted, shape, match["dtype"])
    torch_type = kind == "OutOfMemoryError" and (not module or module.startswith("torch"))
    if torch_type or "CUDA out of memory" in text:
        gpu = re.search(r"GPU (\d+)", text)
        limit = _size(TORCH_ALLOWED.search(text)) or _size(TORCH_TOTAL.search(text))
        wanted, in_use = _size(TORCH_WANTED.search(text)), _size(TORCH_IN_USE.search(text))
        return OomError("torch", gpu and f"cuda:{gpu[1]}", wanted, None, None, in_use, limit)
    cpu = TORCH_CPU.search(text)
    if cpu is not None:
        return OomError("torch", "cpu", int(cpu[1]), None, None)
    if "RESOURCE_EXHAUSTED" in text and (kind in JAX_ERRORS or text.lstrip().startswith("RES")):
        asked, ordinal = JAX_WANTED.search(text), JAX_DEVICE.search(text)
        wanted = int(asked["bytes"] or asked["b"]) if asked else None
        return OomError("jax", ordinal and f"gpu:{ordinal[1]}", wanted, None, None)
    return None


JAX_ERRORS = ("JaxRuntimeError", "XlaRuntimeError")  # jax.errors; jaxlib's older name


def _size(match: re.Match[str] | None) -> int | None:
    """Return the bytes of a matched ``SIZE`` group (whichever alternative matched)."""
    if match is None:
        return None
    said = next(g for g in match.groups() if g)
    number, unit = re.fullmatch(r"([\d.]+) ?(\w+)", said).groups()  # type: ignore[union-attr]
    return int(float(number) * UNITS[unit])


# -- a device's limit, and where it comes from --------------------------------------------------
GPU_TOTAL = "the GPU's total"
HOST_RAM = "host RAM"


def is_cpu(device: str | None) -> bool:
    """Return True for a CPU device name (``CPU:0``, ``cpu:0``, ``cpu``)."""
    return device is not None and device.lower().startswith("cpu")


def index_of(device: str | None) -> int:
    """Return a device name's index (``GPU:1`` -> 1; ``cuda`` -> 0)."""
    tail = (device or "").rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def device_limit(
    backend: str,
    device: str | None,
    gpus: Sequence[Any],  # each with its ``total_bytes`` (NVML's ``probes.nvml.GpuDevice``)
    reported: int | None = None,
    host_total: int | None = None,
) -> Limit | None:
    """Return the memory limit of ``backend``'s ``device`` where it is known.

    ``reported`` is the backend's own figure (JAX's ``bytes_limit``, PyTorch's capped total);
    ``host_total`` the host's RAM, the limit of a CPU without a cap. A backend that caps its
    devices without reporting it (TensorFlow) says through its ``limit``.
    """
    own = getattr(get(backend), "limit", None) if backend in NAMES else None
    if own is not None and device is not None:
        return own(device, [g.total_bytes for g in gpus], host_total)  # type: ignore[no-any-return]
    if reported:
        return Limit(reported, f"{LABELS.get(backend, backend)}'s limit")
    if is_cpu(device) and host_total:
        return Limit(host_total, HOST_RAM)
    index = index_of(device)
    return Limit(gpus[index].total_bytes, GPU_TOTAL) if device and index < len(gpus) else None


def reported_limit(backends: Sequence[BackendInfo], backend: str, device: str | None) -> int | None:
    """Return the limit the backend itself reports for ``device``, if any."""
    mine = [d for info in backends if info.name == backend for d in info.devices]
    return next((d.limit_bytes for d in mine if same_device(d.name, device)), None)


def same_device(a: str | None, b: str | None) -> bool:
    """Return True when two names mean the same device (``cuda:0`` is ``GPU:0``)."""
    if a is None or b is None:
        return a is b
    names = [name.lower().replace("cuda", "gpu").partition(":") for name in (a, b)]
    return len({(kind, index or "0") for kind, _, index in names}) == 1
