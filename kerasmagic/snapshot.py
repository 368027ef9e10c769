"""The one memory snapshot type that magics, widget, sidebar and benchmarks all read.

Every Keras backend, TensorFlow included, is one ``BackendInfo`` entry in ``backends``: its
allocator per device and its cache sizes. ``tf`` and ``graph`` are typed views of TensorFlow's
entry for the Python readers that want its figures by name; they are not written by ``to_dict``,
so the wire carries each figure once (docs/protocol.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kerasmagic.backends import BackendInfo, keras_backend, read_active
from kerasmagic.headline import Headline, headline
from kerasmagic.plain import as_dict
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
        return headline(self)

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

    ``device_bytes`` and ``caches`` hold each backend's change, by backend name; the Keras
    backend's are also ``backend_bytes`` and ``backend_caches``.
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

    @property
    def tf_current_bytes(self) -> int | None:
        """Return the change in TensorFlow's tensors (every device with statistics), or None."""
        return self.device_bytes.get("tensorflow")

    @property
    def default_graph_ops(self) -> int | None:
        """Return the change in the TF1 default graph's ops, or None."""
        return self.caches.get("tensorflow", {}).get("default_graph_ops")

    @property
    def custom_gradients(self) -> int | None:
        """Return the change in TF's custom-gradient registry entries, or None."""
        return self.caches.get("tensorflow", {}).get("custom_gradients")

    @property
    def functions(self) -> int | None:
        """Return the change in TF's eager function library, or None."""
        return self.caches.get("tensorflow", {}).get("functions")

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict for JSON."""
        data: dict[str, Any] = as_dict(self)
        return data


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
    namespace: Mapping[str, Any] | None = None, *, functions: bool = True
) -> MemorySnapshot:
    """Read every probe once; ``namespace`` lets Keras models be counted."""
    return MemorySnapshot(
        time_s=time.time(),
        pid=os.getpid(),
        ram=read_ram(),
        gpu=read_gpus(),
        keras=read_keras(namespace),
        keras_backend=keras_backend(),
        backends=read_active(light=not functions),
    )
