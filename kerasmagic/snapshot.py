"""The one memory snapshot type that magics, widget, sidebar and benchmarks all read."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kerasmagic.backends import BackendInfo, keras_backend, read_active
from kerasmagic.backends.tensorflow import info as tensorflow_info
from kerasmagic.backends.tensorflow.alloc import TfDeviceMemory, TfInfo, read_tf
from kerasmagic.backends.tensorflow.graph import GraphInfo, read_graph
from kerasmagic.probes import (
    GpuDevice,
    GpuInfo,
    KerasInfo,
    RamInfo,
    read_gpus,
    read_keras,
    read_ram,
)

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class MemorySnapshot:
    """Everything kerasmagic measures at one instant; JSON-serialisable via ``to_dict``."""

    time_s: float
    pid: int
    ram: RamInfo
    gpu: GpuInfo
    tf: TfInfo
    graph: GraphInfo
    keras: KerasInfo
    keras_backend: str | None = None  # what Keras runs on, once imported
    backends: tuple[BackendInfo, ...] = ()  # every backend in use, Keras's own first

    @property
    def backend(self) -> BackendInfo | None:
        """Return the figures of the backend Keras runs on (else the first in use), or None."""
        mine = [b for b in self.backends if b.keras] or list(self.backends)
        return mine[0] if mine else None

    @property
    def gpu_used_bytes(self) -> int | None:
        """Return this process's VRAM over all GPUs, else the devices' total use, else None."""
        return self.gpu.used_bytes

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict (``version`` first) that ``json.dumps`` accepts."""
        return {"version": SCHEMA_VERSION, **dataclasses.asdict(self)}

    def to_json(self) -> str:
        """Return the snapshot as a JSON string."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemorySnapshot:
        """Rebuild a snapshot from ``to_dict`` output."""
        gpu = data["gpu"]
        tf = data["tf"]
        return cls(
            time_s=float(data["time_s"]),
            pid=int(data["pid"]),
            ram=RamInfo(**data["ram"]),
            gpu=GpuInfo(
                gpu["status"], gpu["message"], tuple(GpuDevice(**d) for d in gpu["devices"])
            ),
            tf=TfInfo(
                tf["imported"], tf["initialized"], tuple(TfDeviceMemory(**d) for d in tf["devices"])
            ),
            graph=GraphInfo(**data["graph"]),
            keras=KerasInfo(**data["keras"]),
            keras_backend=data.get("keras_backend"),
            backends=tuple(BackendInfo.from_dict(b) for b in data.get("backends", ())),
        )


@dataclass(frozen=True)
class SnapshotDelta:
    """``after - before`` for each figure both snapshots know (None where either lacks it)."""

    elapsed_s: float
    rss_bytes: int
    gpu_used_bytes: int | None
    tf_current_bytes: int | None
    default_graph_ops: int | None
    custom_gradients: int | None
    functions: int | None
    live_models: int | None
    name_counter: int | None
    backend_bytes: int | None = None  # the Keras backend's allocator, all devices
    backend_caches: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict for JSON."""
        return dataclasses.asdict(self)


def _minus(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


def diff(before: MemorySnapshot, after: MemorySnapshot) -> SnapshotDelta:
    """Return what changed from ``before`` to ``after``."""
    return SnapshotDelta(
        elapsed_s=after.time_s - before.time_s,
        rss_bytes=after.ram.rss_bytes - before.ram.rss_bytes,
        gpu_used_bytes=_minus(after.gpu_used_bytes, before.gpu_used_bytes),
        tf_current_bytes=_minus(after.tf.current_bytes, before.tf.current_bytes),
        default_graph_ops=_minus(after.graph.default_graph_ops, before.graph.default_graph_ops),
        custom_gradients=_minus(after.graph.custom_gradients, before.graph.custom_gradients),
        functions=_minus(after.graph.functions, before.graph.functions),
        live_models=_minus(after.keras.live_models, before.keras.live_models),
        name_counter=_minus(after.keras.name_counter, before.keras.name_counter),
        backend_bytes=_minus(_backend_bytes(after), _backend_bytes(before)),
        backend_caches=_cache_deltas(before, after),
    )


def _backend_bytes(snap: MemorySnapshot) -> int | None:
    return None if snap.backend is None else snap.backend.in_use_bytes


def _cache_deltas(before: MemorySnapshot, after: MemorySnapshot) -> dict[str, int]:
    """Return ``after - before`` of each cache figure of the same backend in both."""
    old, new = before.backend, after.backend
    if old is None or new is None or old.name != new.name:
        return {}
    return {k: v - old.caches[k] for k, v in new.caches.items() if k in old.caches}


def take_snapshot(
    namespace: Mapping[str, Any] | None = None, *, functions: bool = True
) -> MemorySnapshot:
    """Read every probe once; ``namespace`` lets Keras models be counted."""
    tf, graph = read_tf(), read_graph(functions=functions)
    return MemorySnapshot(
        time_s=time.time(),
        pid=os.getpid(),
        ram=read_ram(),
        gpu=read_gpus(),
        tf=tf,
        graph=graph,
        keras=read_keras(namespace),
        keras_backend=keras_backend(),
        backends=read_active({"tensorflow": tensorflow_info(tf, graph)}),
    )
