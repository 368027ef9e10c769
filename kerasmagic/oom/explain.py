"""Word an out-of-memory error: the device, its allocator, what holds the memory, one remedy."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kerasmagic.oom.detect import OomError
from kerasmagic.units import fmt_bytes

if TYPE_CHECKING:
    from kerasmagic.cleanup.holders import LiveModel
    from kerasmagic.probes.nvml_types import GpuDevice
    from kerasmagic.snapshot import MemorySnapshot

LABELS = {"tensorflow": "TensorFlow", "torch": "PyTorch", "jax": "JAX"}


def limit_bytes(oom: OomError, snap: MemorySnapshot) -> int | None:
    """Return the failed device's memory limit where it is known."""
    return device_limit_bytes(oom.device, snap.gpu.devices)


def device_limit_bytes(device: str | None, gpus: Sequence[GpuDevice]) -> int | None:
    """Return a device's memory limit where it is known (BFC's CPU cap, a GPU's total)."""
    if device is not None and device.upper().startswith("CPU"):
        cap = os.environ.get("TF_CPU_BFC_MEM_LIMIT_IN_MB", "")
        return int(cap) * 2**20 if cap.isdigit() else None
    if device is not None and device.upper().startswith(("GPU", "CUDA")) and gpus:
        index = int(device.split(":")[-1] or 0)
        return gpus[index].total_bytes if index < len(gpus) else None
    return None


def explain(oom: OomError, snap: MemorySnapshot, models: Sequence[LiveModel]) -> str:
    """Return the lines printed after an out-of-memory traceback."""
    where = oom.device or "the device"
    lines = [f"kerasmagic: out of memory on {where} ({LABELS.get(oom.backend, oom.backend)})"]
    if oom.wanted_bytes is not None:
        what = f"a {oom.dtype} tensor of shape {list(oom.shape)}" if oom.shape else "one block"
        lines.append(f"  wanted     {fmt_bytes(oom.wanted_bytes)} for {what}")
    in_use, peak = _allocator(oom, snap)
    limit = limit_bytes(oom, snap)
    figures = [f"in use {fmt_bytes(in_use)}" if in_use is not None else None,
               f"peak {fmt_bytes(peak)}" if peak is not None else None,
               f"limit {fmt_bytes(limit)}" if limit is not None else None]  # fmt: skip
    shown = ", ".join(f for f in figures if f) or "no allocator figures on this device"
    lines.append(f"  allocator  {shown}")
    ranked = sorted(models, key=lambda m: (not m.freeable, -m.size_bytes))
    for m in ranked[:5]:
        state = "freeable" if m.freeable else "kept"
        held = ", ".join(m.holders[:3]) or "nothing in the namespace"
        lines.append(
            f"  held by    {m.type} {m.name!r} {fmt_bytes(m.size_bytes)} ({state}): {held}"
        )
    lines.append(f"  remedy     {remedy(oom, in_use, limit, ranked)}")
    return "\n".join(lines)


def _allocator(oom: OomError, snap: MemorySnapshot) -> tuple[int | None, int | None]:
    """Return in use and peak bytes of the failed device, from the backend's reading."""
    for backend in snap.backends:
        if backend.name != oom.backend:
            continue
        for d in backend.devices:
            if oom.device is None or d.name.upper() == oom.device.upper():
                return d.in_use_bytes, d.peak_bytes
    return None, None


def remedy(
    oom: OomError, in_use: int | None, limit: int | None, models: Sequence[LiveModel]
) -> str:
    """Return the one remedy that the figures point to."""
    stale = [m for m in models if m.freeable]
    if stale:
        freed = sum(m.size_bytes for m in stale)
        return (
            f"%%fresh_model on this cell (or kerasmagic.reset()) frees {fmt_bytes(freed)} held "
            f"by {len(stale)} earlier model{'s' if len(stale) > 1 else ''}, then re-run it"
        )
    wanted = oom.wanted_bytes
    if wanted is not None and limit is not None and wanted > limit:
        return (
            f"this one tensor needs more than the whole device ({fmt_bytes(limit)}): make it "
            "smaller (a smaller batch, layer or input)"
        )
    if wanted is not None and limit is not None and in_use is not None and in_use + wanted < limit:
        return (
            f"{fmt_bytes(limit - in_use)} is free but in pieces smaller than this tensor (the "
            "allocator keeps the regions it took): a smaller tensor fits; only a new process "
            "(%%fresh_model --isolate, or a restart) joins them again"
        )
    if wanted is not None and limit is not None and in_use is not None and oom.shape:
        free = max(0, limit - in_use)
        batch = oom.shape[0]
        fits = int(batch * free / wanted) if wanted else batch
        if 0 < fits < batch:
            return (
                f"a tensor of {batch} rows did not fit in {fmt_bytes(free)} free: batch <= {fits}"
            )
    return (
        "the memory is held by what you keep: del what you no longer need, then "
        "kerasmagic.reset(), or use a smaller batch"
    )
