"""Keras's backends (TensorFlow, JAX, PyTorch): allocator, caches, reset and memory settings.

One module per backend, each with a ``BACKEND`` of the same callables. Nothing here imports a
framework: a backend is in use only once the user (or Keras) has imported it, and a private API
that is missing or changed gives a "not available" value (None, an empty tuple), never an error.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

NAMES = ("tensorflow", "jax", "torch")
LABELS = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}
T = TypeVar("T")


@dataclass(frozen=True)
class BackendDevice:
    """One device as the backend's allocator sees it, in bytes (None: not reported)."""

    name: str
    in_use_bytes: int | None
    peak_bytes: int | None = None
    limit_bytes: int | None = None
    reserved_bytes: int | None = None


@dataclass(frozen=True)
class BackendInfo:
    """What one backend holds now: per-device allocator figures, cache sizes, notes."""

    name: str
    version: str | None
    keras: bool  # Keras runs on this backend
    platform: str | None  # "cpu", "gpu", "tpu"; None before the backend started its devices
    devices: tuple[BackendDevice, ...] = ()
    caches: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def in_use_bytes(self) -> int | None:
        """Return the bytes in use over all devices that report it, else None."""
        used = [d.in_use_bytes for d in self.devices if d.in_use_bytes is not None]
        return sum(used) if used else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BackendInfo:
        """Rebuild from ``dataclasses.asdict`` output."""
        return cls(
            name=str(data["name"]),
            version=data.get("version"),
            keras=bool(data.get("keras", False)),
            platform=data.get("platform"),
            devices=tuple(BackendDevice(**d) for d in data.get("devices", ())),
            caches={str(k): int(v) for k, v in dict(data.get("caches", {})).items()},
            notes=tuple(data.get("notes", ())),
        )


@dataclass(frozen=True)
class Backend:
    """The same small interface for every backend; see the modules beside this one."""

    name: str
    in_use: Callable[[], bool]
    read: Callable[[], BackendInfo]
    reset: Callable[[], list[str]]
    configure: Callable[[bool, int | None], str]
    reset_peaks: Callable[[], list[str]]


def attempt(read: Callable[[], T], default: T) -> T:
    """Return ``read()``, or ``default`` when a backend's (often private) API fails."""
    try:
        return read()
    except Exception:  # a changed private API is "not available", never the user's problem
        return default


def get(name: str) -> Backend:
    """Return the backend called ``name`` (one of ``NAMES``); never imports the framework."""
    if name not in NAMES:
        raise ValueError(unsupported(name))
    backend: Backend = importlib.import_module(f"kerasmagic.backends.{name}").BACKEND
    return backend


def keras_backend() -> str | None:
    """Return the backend Keras runs on, if Keras (or legacy tf-keras) is imported."""
    config = sys.modules.get("keras.src.backend.config")
    if config is not None and callable(getattr(config, "backend", None)):
        return attempt(lambda: str(config.backend()), None)
    return "tensorflow" if "tf_keras" in sys.modules else None


def chosen() -> str:
    """Return the backend Keras runs on, or will run on once imported (env, keras.json)."""
    name = keras_backend() or os.environ.get("KERAS_BACKEND")
    if name:
        return name
    home = Path(os.environ.get("KERAS_HOME", Path.home() / ".keras"))
    config: Any = attempt(lambda: json.loads((home / "keras.json").read_text()), {})
    return str(config.get("backend") or "tensorflow") if isinstance(config, dict) else "tensorflow"


def unsupported(name: str) -> str:
    """Return the one line shown for a Keras backend kerasmagic does not know."""
    return (
        f"the Keras backend {name!r} is not supported by kerasmagic (supported: "
        f"{', '.join(NAMES)}): only RAM and NVML figures are shown, cleanup is Keras's own"
    )


def active() -> list[Backend]:
    """Return the backends in use, Keras's own first."""
    first = keras_backend()
    names = sorted(NAMES, key=lambda n: n != first)
    return [b for b in (get(n) for n in names) if attempt(b.in_use, False)]


def read_active(known: Mapping[str, BackendInfo] | None = None) -> tuple[BackendInfo, ...]:
    """Read every backend in use; ``known`` holds readings the caller has already taken."""
    known = known or {}
    out = []
    for b in active():
        info = known.get(b.name) or attempt(b.read, None)
        if info is not None:
            out.append(info)
    return tuple(out)


def reset_active(skip: tuple[str, ...] = ()) -> list[str]:
    """Reset every backend in use (caches, cached allocator blocks); return what was done."""
    done: list[str] = []
    for b in active():
        if b.name not in skip:
            done.extend(attempt(b.reset, []))
    return done


def reset_peaks_active(skip: tuple[str, ...] = ()) -> list[str]:
    """Reset the peak counters of every backend in use; return the devices reset."""
    done: list[str] = []
    for b in active():
        if b.name not in skip:
            done.extend(attempt(b.reset_peaks, []))
    return done


def configure(growth: bool, limit_mb: int | None) -> str:
    """Apply growth / a memory cap to the backend Keras runs (or will run) on."""
    name = chosen()
    if name not in NAMES:
        return unsupported(name)
    return get(name).configure(growth, limit_mb)
