"""Keras's backends (TensorFlow, JAX, PyTorch): allocator, caches, reset and memory settings.

One module per backend (``get``), each with the same small interface of functions. Nothing here
imports a framework: a backend is in use only once the user (or Keras) has imported it, and a
private API that is missing or changed gives a "not available" value (None, an empty tuple),
never an error.

Every backend module has ``in_use()``, ``read()`` (a ``BackendInfo``), ``reset()`` (empties the
backend's caches before a cleanup's collection; says what it did) and ``configure(growth,
limit_mb)`` (one line), and ``modes`` (a ``Modes``, or None). The rest is what only some
backends have (TensorFlow, mostly); missing: nothing to do. ``reset_peaks()`` (the devices
reset), ``release()`` (hands cached device blocks back to the driver after the collection),
``collect(run)`` (runs that one collection with the backend's own work around it: TensorFlow
purges its gradient registry; says what it released), ``allocated()`` (the bytes its allocator
holds now, the cleanup report's figure), ``read_light()`` (``read`` without its slow figures,
for the between-cell record) and ``refresh(earlier)`` (``read`` off the main thread, keeping the
per-thread figures of an earlier reading), ``clear_traces(namespace, stale, roots)`` (drop the
traced functions' entries that hold what a cleanup cut), ``traced(model)`` (a model's traced ops
and their estimated bytes), ``registered()`` and ``purge(namespace)`` (entries kept per model
until a purge, freed between models in one cell), ``attach(stop_at, patch)`` and ``detach()``
(patches that live while the extension is loaded; ``attach`` says in one line why one could not
be made), and ``limit(device, gpu_totals, host_total)`` (a device's ``Limit``, for a backend that
caps its devices without reporting the cap; without it: the reported limit, else host RAM or the
GPU's total).
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any, TypeVar

from kerasmagic.compat.registry import say_once, works

NAMES = ("tensorflow", "jax", "torch")
LABELS = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}
T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendDevice:
    """One device as the backend's allocator sees it, in bytes (None: not reported)."""

    name: str
    in_use_bytes: int | None
    peak_bytes: int | None = None
    limit_bytes: int | None = None
    reserved_bytes: int | None = None
    kind: str | None = None  # "cpu" or "gpu": TF keeps CPU:0's statistics as a GPU's
    uncounted: str | None = None  # what the figure is known to miss, and how to get it exact


@dataclass(frozen=True)
class Limit:
    """A device's memory limit in bytes, and where it comes from (in words)."""

    bytes: int
    source: str


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
        devices = tuple(BackendDevice(**d) for d in data.get("devices", ()))
        caches = {str(k): int(v) for k, v in dict(data.get("caches", {})).items()}
        head = str(data["name"]), data.get("version"), bool(data.get("keras", False))
        return cls(*head, data.get("platform"), devices, caches, tuple(data.get("notes", ())))


@dataclass(frozen=True)
class Modes:
    """A backend's thread-wide modes that a ``with`` block switches and an interrupt can leave
    switched: ``read`` them before a cell, ``put_back(before, failed)`` after it, which returns
    what it did, in lines to show."""

    read: Callable[[], object]
    put_back: Callable[[object, bool], list[str]]


def attempt(read: Callable[[], T], default: T, site: str | None = None) -> T:
    """Return ``read()``, or ``default`` when a backend's (often private) API fails.

    A figure a backend may simply not have (a CPU device's statistics) fails quietly (a debug
    line). A whole ``site`` (``"torch.read"``) that fails is kerasmagic's own fault or a changed
    framework: it is said once per site (``say_once``), as a warning with its traceback, so it
    never reads as "not available" alone.
    """
    try:
        return read()
    except Exception:  # a changed private API is "not available", never the user's problem
        if site is None:
            log.debug("kerasmagic: %r failed", read, exc_info=True)
        else:
            say_once([f"kerasmagic: {site} failed; its figures are left out"], exc_info=True)
        return default


def get(name: str) -> Any:
    """Return the module of the backend called ``name`` (one of ``NAMES``); never imports the
    framework."""
    if name not in NAMES:
        raise ValueError(unsupported(name))
    return importlib.import_module(f"kerasmagic.backends.{name}")


def keras_backend() -> str | None:
    """Return the backend Keras runs on, if Keras (or legacy tf-keras) is imported."""
    config = sys.modules.get("keras.src.backend.config")
    if config is not None and works("keras.backend_name"):  # moved: said once, by compat
        return attempt(lambda: str(config.backend()), None)
    return "tensorflow" if "tf_keras" in sys.modules else None


def chosen() -> str:
    """Return the backend Keras runs on, or will run on once imported (env, keras.json)."""
    if name := keras_backend() or os.environ.get("KERAS_BACKEND"):
        return name
    home = Path(os.environ.get("KERAS_HOME", Path.home() / ".keras"))
    config: Any = attempt(lambda: json.loads((home / "keras.json").read_text()), {})
    return str(config.get("backend") or "tensorflow") if isinstance(config, dict) else "tensorflow"


def unsupported(name: str) -> str:
    """Return the one line shown for a Keras backend kerasmagic does not know."""
    supported = ", ".join(NAMES)
    return (f"the Keras backend {name!r} is not supported by kerasmagic (supported: {supported}): "
            "only RAM and NVML figures are shown, cleanup is Keras's own")  # fmt: skip


def active() -> list[str]:
    """Return the names of the backends in use, Keras's own first."""
    first = keras_backend()
    names = sorted(NAMES, key=lambda n: n != first)
    return [n for n in names if attempt(get(n).in_use, False, f"{n}.in_use")]


def read_active(
    light: bool = False, earlier: Sequence[BackendInfo] | None = None
) -> tuple[BackendInfo, ...]:
    """Read every backend in use; ``light`` leaves out the figures that are slow to read.
    From a background thread, ``earlier`` (the last readings) gives what the thread cannot
    read afresh (TensorFlow's default graph is per thread): a backend's ``refresh``."""
    before, light = {info.name: info for info in earlier or ()}, light or earlier is not None
    out = []
    for name in active():
        b = get(name)
        read = getattr(b, "read_light", b.read) if light else b.read
        if hasattr(b, "refresh") and name in before:
            read = functools.partial(b.refresh, before[name])
        out.append(attempt(read, None, f"{name}.read"))
    return tuple(info for info in out if info is not None)


def _each(attr: str, *args: Any, site: str = "", every: bool = False) -> dict[str, Any]:
    """Return each backend in use's (``every``: each one's) ``attr(*args)``, by name, where it
    has that field; a failure (said once per ``site``, the field's name unless given) or a None
    answer is left out."""
    out = {name: attempt(functools.partial(call, *args), None, f"{name}.{site or attr}")
           for name in (NAMES if every else active())
           if (call := getattr(get(name), attr, None)) is not None}  # fmt: skip
    return {name: answer for name, answer in out.items() if answer is not None}


def _lines(attr: str, *args: Any, site: str = "") -> list[str]:
    return [line for said in _each(attr, *args, site=site).values() for line in said]


def reset_active() -> list[str]:
    """Reset every backend in use (caches, cached allocator blocks); return what was done."""
    return _lines("reset")


def collect_active() -> list[str]:
    """Collect garbage once, each backend in use doing its work around that collection;
    return what they released, in words."""
    said: list[str] = []
    run: Callable[[], object] = gc.collect
    for name in active():
        if hasattr(get(name), "collect"):
            run = functools.partial(_around, name, get(name).collect, run, said)
    run()
    return said


def _around(name: str, wrap: Callable[..., list[str]], inner: Any, said: list[str]) -> None:
    left = [inner]  # emptied as the backend's own work runs the collection
    said.extend(attempt(lambda: wrap(lambda: left.pop()()), [], f"{name}.collect"))
    if left:  # the backend's own work failed before it collected: collect anyway
        inner()


def release_active() -> list[str]:
    """After a collection: each backend in use hands its unused cached blocks back."""
    return _lines("release")


def reset_peaks() -> list[str]:
    """Reset the peak counters of every backend in use; return the devices reset."""
    return _lines("reset_peaks")


def configure_gpus(growth: bool = False, limit_mb: int | None = None) -> str:
    """Turn on memory growth and/or cap each GPU at ``limit_mb`` for the backend Keras runs (or
    will run) on: TensorFlow, JAX or PyTorch; return what happened in one line."""
    if limit_mb is not None and limit_mb <= 0:
        raise ValueError("the memory limit must be a positive number of MB")
    name = chosen()
    return get(name).configure(growth, limit_mb) if name in NAMES else unsupported(name)


def allocated() -> dict[str, int]:
    """Return the bytes each backend in use holds in its allocator now, Keras's own first,
    where the allocator says (the cleanup report's figure)."""
    return _each("allocated")


def clear_traces(
    namespace: Mapping[str, Any], stale: Sequence[Any], roots: Sequence[Any] = ()
) -> list[str]:
    """Drop what the backends in use traced of ``stale`` objects (reached from ``namespace``,
    keeping what ``roots`` still use); return what was done, in words."""
    return _lines("clear_traces", namespace, stale, roots, site="traces")


def traced(model: Any) -> tuple[int | None, int | None]:
    """Return the ops its backend traced for ``model`` and their estimated bytes, if known."""
    return next((p for p in _each("traced", model).values() if p[0] is not None), (None, None))


def registered() -> int | None:
    """Return the entries the backends keep per model until a purge (TF's custom gradients);
    None when no backend in use keeps any. Never imports a framework."""
    counts = _each("registered", every=True).values()
    return sum(counts) if counts else None


def purge(namespace: Mapping[str, Any]) -> int:
    """Free what the backends keep per model for models that are gone; return how many went."""
    return sum(_each("purge", namespace).values())


def attach(stop_at: Sequence[CodeType] = (), patch: bool = True) -> list[str]:
    """Give every backend the frames its traces end at (a cell's runners, ``stop_at``) and,
    with ``patch``, make the patches that live while the extension is loaded (TF's op stack
    traces, once TensorFlow is imported); return why any could not be made."""
    return list(_each("attach", stop_at, patch, every=True).values())


def detach() -> None:
    """Undo every backend's patches."""
    _each("detach", every=True)
