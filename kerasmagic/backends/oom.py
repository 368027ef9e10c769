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

from kerasmagic.backends import LABELS, NAMES, Limit, get

# Bytes per element of the dtype names TensorFlow writes in its OOM message.
ITEMSIZE = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2,
            "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16}  # fmt: skip
TF_OOM = re.compile(r"OOM when allocating tensor with shape\s*\[(?P<shape>[\d,\s]*)\]\s*and type "
                    r"(?P<dtype>\w+)\s*on (?P<device>\S+)")  # fmt: skip
SIZE = r"([\d.]+) ?(bytes|B|[KMGT]i?B)"  # a figure and its unit, read by ``_size``
TORCH_WANTED = re.compile(r"Tried to allocate " + SIZE)
# 2.1+: "has a total capacity of 79.15 GiB"; older: "79.15 GiB total capacity"
TORCH_TOTAL = re.compile(f"total capacity of {SIZE}|{SIZE} total capacity")
TORCH_ALLOWED = re.compile(SIZE + " allowed")  # set_per_process_memory_fraction
# 2.1+: "76.1 GiB is allocated by PyTorch"; older: "130.35 MiB already allocated"
TORCH_IN_USE = re.compile(f"{SIZE} is allocated by PyTorch|{SIZE} already allocated")
TORCH_CPU = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+)")
# CPU: "Out of memory allocating N bytes"; GPU: "... trying to allocate", or BFC's request
JAX_WANTED = re.compile(r"allocat\w* (\d+) (bytes)|allocate request for [\d.]+ ?\w+ \((\d+)(B)\)")
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
        text = getattr(outcome, "error_message", None) or getattr(outcome, "error", "")
        found = parse_oom(kind, "", str(text or "")) if isinstance(kind, str) else (
            parse_oom(type(error).__name__, type(error).__module__ or "", str(error)))  # fmt: skip
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
        shape, dtype = tuple(map(int, re.findall(r"\d+", match["shape"]))), match["dtype"]
        wanted = math.prod(shape) * ITEMSIZE[dtype] if dtype in ITEMSIZE else None
        device = match["device"].rsplit("device:", 1)[-1]
        return OomError("tensorflow", device, wanted, shape, dtype)
    torch_type = kind == "OutOfMemoryError" and (not module or module.startswith("torch"))
    if torch_type or "CUDA out of memory" in text:
        gpu = re.search(r"GPU (\d+)", text)
        limit = _size(TORCH_ALLOWED, text) or _size(TORCH_TOTAL, text)
        wanted, in_use = _size(TORCH_WANTED, text), _size(TORCH_IN_USE, text)
        return OomError("torch", gpu and f"cuda:{gpu[1]}", wanted, None, None, in_use, limit)
    cpu = TORCH_CPU.search(text)
    if cpu is not None:
        return OomError("torch", "cpu", int(cpu[1]), None, None)
    if "RESOURCE_EXHAUSTED" in text and (kind in JAX_ERRORS or text.lstrip().startswith("RES")):
        ordinal = JAX_DEVICE.search(text)
        return OomError("jax", ordinal and f"gpu:{ordinal[1]}", _size(JAX_WANTED, text), None, None)
    return None


JAX_ERRORS = ("JaxRuntimeError", "XlaRuntimeError")  # jax.errors; jaxlib's older name


def _size(pattern: re.Pattern[str], text: str) -> int | None:
    """Return the bytes ``pattern``'s figure says in ``text`` (whichever alternative matched)."""
    if (match := pattern.search(text)) is None:
        return None
    number, unit = (g for g in match.groups() if g)  # the one alternative that matched
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


def same_device(a: str | None, b: str | None) -> bool:
    """Return True when two names mean the same device (``cuda:0`` is ``GPU:0``)."""
    if a is None or b is None:
        return a is b
    names = [name.lower().replace("cuda", "gpu").partition(":") for name in (a, b)]
    return len({(kind, index or "0") for kind, _, index in names}) == 1
