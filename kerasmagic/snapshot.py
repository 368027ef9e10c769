"""The one memory snapshot type that magics, widget, sidebar and benchmarks all read.

Every Keras backend, TensorFlow included, is one ``BackendInfo`` entry in ``backends``: its
allocator per device and its cache sizes, each figure written once (docs/protocol.md).
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal

from kerasmagic.backends import LABELS, BackendInfo, keras_backend, read_active
from kerasmagic.backends.oom import device_limit
from kerasmagic.probes import KerasInfo, RamInfo, read_keras, read_ram
from kerasmagic.probes.nvml import GpuDevice, GpuInfo, read_gpus

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
_FIELDS: dict[type, tuple[str, ...]] = {}  # each dataclass's field names, read once (after
# every cell: 5.5 us a snapshot with them kept, 9 us reading fields() each time)


def as_dict(obj: Any) -> Any:
    """Return what ``dataclasses.asdict(obj)`` returns (for a dataclass instance ``obj``)."""
    if (kind := type(obj)) in _LEAVES:
        return obj
    if (names := _FIELDS.get(kind)) is None and is_dataclass(obj) and not isinstance(obj, type):
        names = _FIELDS[kind] = tuple(f.name for f in fields(obj))
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
        return next((b for b in self.backends if b.keras), next(iter(self.backends), None))

    def cache(self, backend: str, name: str) -> int | None:
        """Return the size of the cache ``name`` of ``backend`` (TensorFlow's
        ``default_graph_ops``, ``custom_gradients``, ``functions``), if it was read."""
        return None if (entry := self.backend_named(backend)) is None else entry.caches.get(name)

    @property
    def gpu_used_bytes(self) -> int | None:
        """Return this process's VRAM over all GPUs, else the devices' total use, else None."""
        return self.gpu.used_bytes

    @property
    def headline(self) -> Headline:
        """Return the figure every view leads with: what runs out, against its limit."""
        gpus, backend, ram, host = self.gpu.devices, self.backend, self.ram, self.ram.total_bytes
        counted = [d for d in backend.devices if d.in_use_bytes is not None] if backend else []
        if gpus and backend is not None and counted:
            on_gpu, name = [d for d in counted if d.kind == "gpu"] or counted, backend.name
            limits = [device_limit(name, d.name, gpus, d.limit_bytes, host) for d in on_gpu]
            known = [lim for lim in limits if lim is not None]
            label = f"{LABELS.get(name, name)}'s tensors on {', '.join(d.name for d in on_gpu)}"
            used = sum(d.in_use_bytes or 0 for d in on_gpu)
            limit = sum(lim.bytes for lim in known) if len(known) == len(limits) else None
            source = known[0].source if len(known) == 1 else None
            return Headline("allocator", label, used, limit, source, self.gpu_used_bytes)
        if gpus and self.gpu_used_bytes is not None:
            total = sum(d.total_bytes for d in gpus)
            return Headline("vram", "this kernel's VRAM", self.gpu_used_bytes, total, "the GPUs")
        return Headline("rss", "this kernel's RAM (RSS)", ram.rss_bytes, host, "host RAM")

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict (``version`` first) that ``json.dumps`` accepts."""
        return {"version": SCHEMA_VERSION, **as_dict(self), "headline": as_dict(self.headline)}

    def to_json(self) -> str:
        """Return the snapshot as a JSON string."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemorySnapshot:
        """Rebuild a snapshot from ``to_dict`` output."""
        time_s, pid, g = float(data["time_s"]), int(data["pid"]), data["gpu"]
        gpu = GpuInfo(g["status"], g["message"], tuple(GpuDevice(**d) for d in g["devices"]))
        backends = tuple(BackendInfo.from_dict(b) for b in data.get("backends", ()))
        ram, keras = RamInfo(**data["ram"]), KerasInfo(**data["keras"])
        return cls(time_s, pid, ram, gpu, keras, data.get("keras_backend"), backends)


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
    if not (isinstance(before, MemorySnapshot) and isinstance(after, MemorySnapshot)):
        raise TypeError("diff() takes two MemorySnapshots, as take_snapshot() returns")
    pairs = [(new, old) for new in after.backends if (old := before.backend_named(new.name))]
    changes = {new.name: _minus(new.in_use_bytes, old.in_use_bytes) for new, old in pairs}
    device_bytes = {name: change for name, change in changes.items() if change is not None}
    caches = {
        new.name: {k: v - old.caches[k] for k, v in new.caches.items() if k in old.caches}
        for new, old in pairs
    }
    mine, theirs = after.backend, before.backend  # the Keras backend's, after and before
    in_use = (mine.in_use_bytes if mine else None, theirs.in_use_bytes if theirs else None)
    keras_caches = caches.get(mine.name, {}) if mine and theirs and mine.name == theirs.name else {}
    return SnapshotDelta(
        elapsed_s=after.time_s - before.time_s,
        rss_bytes=after.ram.rss_bytes - before.ram.rss_bytes,
        gpu_used_bytes=_minus(after.gpu_used_bytes, before.gpu_used_bytes),
        live_models=_minus(after.keras.live_models, before.keras.live_models),
        name_counter=_minus(after.keras.name_counter, before.keras.name_counter),
        backend_bytes=_minus(*in_use),
        backend_caches=keras_caches,
        device_bytes=device_bytes,
        caches=caches,
    )


def take_snapshot(
    namespace: Mapping[str, Any] | None = None, *, light: bool = False
) -> MemorySnapshot:
    """Read every probe once; ``namespace`` lets Keras models be counted. ``light`` skips the
    backends' costlier counts (TensorFlow's function library), as the per-cell hooks do."""
    now, pid, ram, gpu = time.time(), os.getpid(), read_ram(), read_gpus()
    return MemorySnapshot(
        now, pid, ram, gpu, read_keras(namespace), keras_backend(), read_active(light=light)
    )
