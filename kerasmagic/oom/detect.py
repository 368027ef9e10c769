"""Recognise an out-of-memory error of any Keras backend, by type and message (no imports)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Bytes per element of the dtype names TensorFlow writes in its OOM message.
ITEMSIZE = {
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2,
    "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16,
}  # fmt: skip
TF_OOM = re.compile(
    r"OOM when allocating tensor with shape\s*\[(?P<shape>[\d,\s]*)\]\s*and type (?P<dtype>\w+)"
    r"\s*on (?P<device>\S+)"
)
TORCH_OOM = re.compile(r"Tried to allocate (?P<amount>[\d.]+) (?P<unit>[KMGT]i?B)")
JAX_OOM = re.compile(r"trying to allocate (?P<bytes>\d+) bytes")
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 2**10, "MB": 2**20,
         "GB": 2**30, "TB": 2**40}  # fmt: skip


@dataclass(frozen=True)
class OomError:
    """What an out-of-memory error says: backend, device, and what the failed allocation wanted."""

    backend: str  # "tensorflow", "torch", "jax"
    device: str | None  # "CPU:0", "GPU:0"
    wanted_bytes: int | None
    shape: tuple[int, ...] | None
    dtype: str | None


def find_oom(error: BaseException | None) -> OomError | None:
    """Return the OOM in ``error`` or what it was raised from, else None."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found = _parse(error)
        if found is not None:
            return found
        error = error.__cause__ or error.__context__
    return None


def _parse(error: BaseException) -> OomError | None:
    kind, module = type(error).__name__, type(error).__module__ or ""
    text = str(error)
    if kind == "ResourceExhaustedError" or "OOM when allocating" in text:
        return _tensorflow(text)
    torch_oom = module.startswith("torch") and kind == "OutOfMemoryError"
    if torch_oom or "CUDA out of memory" in text:
        match = TORCH_OOM.search(text)
        wanted = int(float(match["amount"]) * UNITS[match["unit"]]) if match else None
        gpu = re.search(r"GPU (\d+)", text)
        return OomError("torch", f"GPU:{gpu[1]}" if gpu else None, wanted, None, None)
    if text.lstrip().startswith("RESOURCE_EXHAUSTED"):
        match = JAX_OOM.search(text)
        return OomError("jax", None, int(match["bytes"]) if match else None, None, None)
    return None


def _tensorflow(text: str) -> OomError:
    match = TF_OOM.search(text)
    if match is None:
        return OomError("tensorflow", None, None, None, None)
    shape = tuple(int(n) for n in match["shape"].replace(" ", "").split(",") if n)
    size = ITEMSIZE.get(match["dtype"])
    wanted = None if size is None else math.prod(shape) * size
    device = match["device"].rsplit("device:", 1)[-1]
    return OomError("tensorflow", device, wanted, shape, match["dtype"])
