"""The one figure every view leads with: the memory that runs out, against its limit.

TensorFlow reserves nearly a whole GPU at its first GPU operation unless memory growth is on,
so NVML's figure for the kernel stays flat while TensorFlow's allocator fills that reservation
to an out-of-memory error. Where the Keras backend keeps allocator figures and there is a GPU,
the headline is what the allocator has in use against its limit, with NVML's reservation beside
it, named as such; with a GPU and no allocator figures, NVML's figure; without a GPU, RSS.
The sidebar's headline, its chart and status item, the cell badges and the widget read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from kerasmagic.backends import LABELS
from kerasmagic.oom.limits import device_limit

if TYPE_CHECKING:
    from kerasmagic.snapshot import MemorySnapshot


@dataclass(frozen=True)
class Headline:
    """What runs out first, in bytes: its use, its limit, and NVML's reservation beside it."""

    what: Literal["allocator", "vram", "rss"]
    label: str  # "TensorFlow's tensors on GPU:0", "this kernel's VRAM", "this kernel's RAM"
    used_bytes: int
    limit_bytes: int | None = None
    limit_label: str | None = None  # where the limit comes from: "GPU:0's memory limit", ...
    reserved_bytes: int | None = None  # NVML: what the process holds on its GPUs (allocator)


def headline(snap: MemorySnapshot) -> Headline:
    """Return the figure ``snap``'s views lead with."""
    gpus = snap.gpu.devices
    backend = snap.backend
    counted = [d for d in backend.devices if d.in_use_bytes is not None] if backend else []
    if gpus and backend is not None and counted:
        on_gpu = [d for d in counted if d.kind == "gpu"] or counted
        limits = [
            device_limit(backend.name, d.name, gpus, d.limit_bytes, snap.ram.total_bytes)
            for d in on_gpu
        ]
        known = [lim for lim in limits if lim is not None]
        label = f"{LABELS.get(backend.name, backend.name)}'s tensors on "
        return Headline(
            "allocator",
            label + ", ".join(d.name for d in on_gpu),
            sum(d.in_use_bytes or 0 for d in on_gpu),
            sum(lim.bytes for lim in known) if len(known) == len(limits) else None,
            known[0].source if len(known) == 1 else None,
            snap.gpu_used_bytes,
        )
    if gpus and snap.gpu_used_bytes is not None:
        total = sum(d.total_bytes for d in gpus)
        return Headline("vram", "this kernel's VRAM", snap.gpu_used_bytes, total, "the GPUs")
    ram = snap.ram
    return Headline("rss", "this kernel's RAM (RSS)", ram.rss_bytes, ram.total_bytes, "host RAM")
