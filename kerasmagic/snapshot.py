"""The one memory snapshot type that magics, widget, sidebar and benchmarks all read.

Every Keras backend, TensorFlow included, is one ``BackendInfo`` entry in ``backends``: its
allocator per device and its cache sizes, each figure written once (docs/protocol.md).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kerasmagic.backends import LABELS, BackendInfo, keras_backend, read_active
from kerasmagic.backends.oom import device_limit
from kerasmagic.probes import (
    GpuDevice,
    GpuInfo,
    KerasInfo,
    RamInfo,
    read_gpus,
    read_keras,
    read_ram,
)

SCHEMA_VERSION = 2  # 2: TensorFlow's figures only in `backends`


# -- the headline: the memory that runs out, against its limit ------------------------------
# The one figure every view leads with: the memory that runs out, against its limit.
#
# TensorFlow reserves nearly a whole GPU at its first GPU operation unless memory growth is on,
# so NVML's figure for the kernel stays flat while TensorFlow's allocator fills that reservation
# to an out-of-memory error. Where the Keras backend keeps allocator figures and there is a GPU,
# the headline is what the allocator has in use against its limit, with NVML's reservation beside
# it, named as such; with a GPU and no allocator figures, NVML's figure; without a GPU, RSS.
# The sidebar's headline, its chart and status item, the cell badges and the widget read it.


@dataclass(frozen=True)
class Headline:
    """What runs out first, in bytes: its use, its limit, and NVML's reservation beside it."""

    what: Literal["allocator", "vram", "rss"]
    label: str  # "TensorFlow's tensors on GPU:0", "this kernel's VRAM", "this kernel's RAM"
    used_bytes: int
    limit_bytes: int | None = None
    limit_label: str | None = None  # where the limit comes from: "GPU:0's memory limit", ...
    reserved_bytes: int | None = None  # NVML: what the process holds on its GPUs (allocator)


# -- as_dict: dataclasses.asdict for the snapshot types, without its deep copies ----------
# A snapshot has ~100 leaves and is serialised after every cell for the sidebar; asdict
# deep-copies each leaf. Its types hold only numbers, strings, None, tuples, lists and dicts.
_LEAVES = frozenset({int, float, str, bool, type(None)})
_FIELDS: dict[type, tuple[str, ...]] = {}


def as_dict(obj: Any) -> Any:
    """Return what ``dataclasses.asdict(obj)`` returns (for a dataclass instance ``obj``)."""
    kind = type(obj)
    if kind in _LEAVES:
        return obj
    names = _FIELDS.get(kind)
    if names is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(obj))
    if names is not None:
        return {name: as_dict(getattr(obj, name)) for name in names}
    if kind is tuple or kind is list:
        return kind(as_dict(item) for item in obj)
    if kind is dict:
        return {as_dict(key): as_dict(value) for key, value in obj.items()}
    return copy.deepcopy(obj)


@dataclass(frozen=True)
class MemorySnapshot:
    """Everything kerasmagic measures at one instant; JSON-serialisable via ``to_dict``."""

    time_s: float
    pid: int
    ram: RamInfo
    gpu: GpuInfo
    keras: KerasInfo
    keras_backend: str | None = None  # what Keras runs on, once imported
    backends: tuple[BackendInfo, ...] = ()  # every backend in use, Keras's own first

    def backend_named(self, name: str) -> BackendInfo | None:
        """Return the entry of the backend called ``name`` if it is in use, else None."""
        return next((b for b in self.backends if b.name == name), None)

    @property
    def backend(self) -> BackendInfo | None:
        """Return the figures of the backend Keras runs on (else the first in use), or None."""
        mine = [b for b in self.backends if b.keras] or list(self.backends)
        return mine[0] if mine else None

    def cache(self, backend: str, name: str) -> int | None:
        """Return the size of the cache ``name`` of ``backend`` (TensorFlow's
        ``default_graph_ops``, ``custom_gradients``, ``functions``), if it was read."""
        entry = self.backend_named(backend)
        return None if entry is None else entry.caches.get(name)

    @property
    def gpu_used_bytes(self) -> int | None:
        """Return this process's VRAM over all GPUs, else the devices' total use, else None."""
        return self.gpu.used_bytes

    @property
    def headline(self) -> Headline:
        """Return the figure every view leads with: what runs out, against its limit."""
        gpus, backend, ram = self.gpu.devices, self.backend, self.ram
        counted = [d for d in backend.devices if d.in_use_bytes is not None] if backend else []
        if gpus and backend is not None and counted:
            on_gpu = [d for d in counted if d.kind == "gpu"] or counted
            limits = [
                device_limit(backend.name, d.name, gpus, d.limit_bytes, ram.total_bytes)
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
                self.gpu_used_bytes,
            )
        if gpus and self.gpu_used_bytes is not None:
            total = sum(d.total_bytes for d in gpus)
            return Headline("vram", "this kernel's VRAM", self.gpu_used_bytes, total, "the GPUs")
        return Headline(
            "rss", "this kernel's RAM (RSS)", ram.rss_bytes, ram.total_bytes, "host RAM"
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict (``version`` first) that ``json.dumps`` accepts."""
        data = {"version": SCHEMA_VERSION, **as_dict(self)}
        data["headline"] = as_dict(self.headline)
        return data

    def to_json(self) -> str:
        """Return the snapshot as a JSON string."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemorySnapshot:
        """Rebuild a snapshot from ``to_dict`` output."""
        gpu = data["gpu"]
        return cls(
            time_s=float(data["time_s"]),
            pid=int(data["pid"]),
            ram=RamInfo(**data["ram"]),
            gpu=GpuInfo(
                gpu["status"], gpu["message"], tuple(GpuDevice(**d) for d in gpu["devices"])
            ),
            keras=KerasInfo(**data["keras"]),
            keras_backend=data.get("keras_backend"),
            backends=tuple(BackendInfo.from_dict(b) for b in data.get("backends", ())),
        )


@dataclass(frozen=True)
class SnapshotDelta:
    """``after - before`` for each figure both snapshots know (None where either lacks it).

    ``device_bytes`` and ``caches`` hold each backend's change, by backend name (``cache``
    reads one); the Keras backend's are also ``backend_bytes`` and ``backend_caches``.
    """

    elapsed_s: float
    rss_bytes: int
    gpu_used_bytes: int | None
    live_models: int | None
    name_counter: int | None
    backend_bytes: int | None = None  # the Keras backend's allocator, all devices
    backend_caches: dict[str, int] = field(default_factory=dict)
    device_bytes: dict[str, int] = field(default_factory=dict)  # backend -> allocator change
    caches: dict[str, dict[str, int]] = field(default_factory=dict)  # backend -> cache changes

    def cache(self, backend: str, name: str) -> int | None:
        """Return the change in the cache ``name`` of ``backend``, if both snapshots read it."""
        return self.caches.get(backend, {}).get(name)

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict for JSON."""
        return dict(as_dict(self))


def _minus(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def diff(before: MemorySnapshot, after: MemorySnapshot) -> SnapshotDelta:
    """Return what changed from ``before`` to ``after``."""
    device_bytes: dict[str, int] = {}
    caches: dict[str, dict[str, int]] = {}
    for new in after.backends:
        old = before.backend_named(new.name)
        if old is None:
            continue
        change = _minus(new.in_use_bytes, old.in_use_bytes)
        if change is not None:
            device_bytes[new.name] = change
        caches[new.name] = {k: v - old.caches[k] for k, v in new.caches.items() if k in old.caches}
    mine = after.backend
    same = mine is not None and before.backend is not None and before.backend.name == mine.name
    return SnapshotDelta(
        elapsed_s=after.time_s - before.time_s,
        rss_bytes=after.ram.rss_bytes - before.ram.rss_bytes,
        gpu_used_bytes=_minus(after.gpu_used_bytes, before.gpu_used_bytes),
        live_models=_minus(after.keras.live_models, before.keras.live_models),
        name_counter=_minus(after.keras.name_counter, before.keras.name_counter),
        backend_bytes=_minus(_backend_bytes(after), _backend_bytes(before)),
        backend_caches=caches.get(mine.name, {}) if same and mine is not None else {},
        device_bytes=device_bytes,
        caches=caches,
    )


def _backend_bytes(snap: MemorySnapshot) -> int | None:
    return None if snap.backend is None else snap.backend.in_use_bytes


def take_snapshot(
    namespace: Mapping[str, Any] | None = None, *, light: bool = False
) -> MemorySnapshot:
    """Read every probe once; ``namespace`` lets Keras models be counted. ``light`` skips the
    backends' costlier counts (TensorFlow's function library), as the per-cell hooks do."""
    return MemorySnapshot(
        time_s=time.time(),
        pid=os.getpid(),
        ram=read_ram(),
        gpu=read_gpus(),
        keras=read_keras(namespace),
        keras_backend=keras_backend(),
        backends=read_active(light=light),
    )
