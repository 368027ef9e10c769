"""The typed GPU readings: what ``read_gpus`` returns and the snapshot carries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# "stale": NVML did not answer in time; ``devices`` are the last good reading, ``message`` says
# how old. Every other status but "ok" comes with no devices and the reason in ``message``.
GpuStatus = Literal["ok", "stale", "no_driver", "no_gpu", "hidden", "error"]


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as CUDA sees it in this process, memory in bytes."""

    cuda_index: int
    nvml_index: int | None
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    process_used_bytes: int | None  # None: not available or not ours to match, see the note
    process_note: str | None = None  # why process_used_bytes is None, in one line


@dataclass(frozen=True)
class GpuInfo:
    """All GPUs visible to this process, or why there are none."""

    status: GpuStatus
    message: str | None
    devices: tuple[GpuDevice, ...]

    @property
    def used_bytes(self) -> int | None:
        """Return this process's VRAM over all GPUs, else the devices' total use, else None."""
        if not self.devices:
            return None
        mine = [d.process_used_bytes for d in self.devices]
        if all(m is not None for m in mine):
            return sum(m for m in mine if m is not None)
        return sum(d.used_bytes for d in self.devices)
