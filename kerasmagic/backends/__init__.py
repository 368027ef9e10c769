"""Keras's backends (TensorFlow, JAX, PyTorch): allocator, caches, reset and memory settings.

One module per backend, each with a ``BACKEND`` of the same callables. Nothing here imports a
framework: a backend is in use only once the user (or Keras) has imported it, and a private API
that is missing or changed gives a "not available" value (None, an empty tuple), never an error.
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
        keras, notes = bool(data.get("keras", False)), tuple(data.get("notes", ()))
        name, version, platform = str(data["name"]), data.get("version"), data.get("platform")
        return cls(name, version, keras, platform, devices, caches, notes)


ClearTraces = Callable[[Mapping[str, Any], Sequence[Any], Sequence[Any]], list[str]]
DeviceLimit = Callable[[str, Sequence[int], int | None], Limit | None]


@dataclass(frozen=True)
class Modes:
    """A backend's thread-wide modes that a ``with`` block switches and an interrupt can leave
    switched: ``read`` them before a cell, ``put_back(before, failed)`` after it, which returns
    what it did, in lines to show."""

    read: Callable[[], object]
    put_back: Callable[[object, bool], list[str]]


@dataclass(frozen=True)
class Backend:
    """The same small interface for every backend; see the modules beside this one.

    ``reset`` empties the backend's caches before a cleanup's collection; ``collect``, if
    any, runs that one collection with the backend's own work around it (TensorFlow purges
    its gradient registry) and says what it released; ``release`` hands cached device blocks
    back to the driver after it.

    The rest is what only some backends have (TensorFlow, today); None: nothing to do.
    ``allocated`` (the bytes its allocator holds now, the cleanup report's figure),
    ``read_light`` (``read`` without its slow figures, for the between-cell record) and
    ``refresh`` (``read`` off the main thread, keeping the per-thread figures of an earlier
    reading), ``clear_traces`` (drop the traced functions' entries that hold what a cleanup
    cut), ``traced`` (a model's traced ops and their estimated bytes), ``registered`` and
    ``purge`` (entries kept per model until a purge, freed between models in one cell),
    ``attach`` and ``detach`` (patches that live while the extension is loaded; ``attach``
    says in one line why one could not be made), ``modes``, and ``limit`` (a device's limit,
    given each GPU's total and the host's RAM, for a backend that caps its devices without
    reporting the cap; without it: the reported limit, else host RAM or the GPU's total).
    """

    name: str
    in_use: Callable[[], bool]
    read: Callable[[], BackendInfo]
    reset: Callable[[], list[str]]
    configure: Callable[[bool, int | None], str]
    reset_peaks: Callable[[], list[str]] | None = None
    release: Callable[[], list[str]] | None = None
    collect: Callable[[Callable[[], object]], list[str]] | None = None
    allocated: Callable[[], int | None] | None = None
    read_light: Callable[[], BackendInfo] | None = None
    refresh: Callable[[BackendInfo], BackendInfo] | None = None
    clear_traces: ClearTraces | None = None
    traced: Callable[[Any], tuple[int | None, int | None]] | None = None
    registered: Callable[[], int | None] | None = None
    purge: Callable[[Mapping[str, Any]], int] | None = None
    attach: Callable[[Sequence[CodeType], bool], str | None] | None = None
    detach: Callable[[], None] | None = None
    modes: Modes | None = None
    limit: DeviceLimit | None = None


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


def get(name: str) -> Backend:
    """Return the backend called ``name`` (one of ``NAMES``); never imports the framework."""
    if name not in NAMES:
        raise ValueError(unsupported(name))
    backend: Backend = importlib.import_module(f"kerasmagic.backends.{name}").BACKEND
    return backend


def keras_backend() -> str | None:
    """Return the backend Keras runs on, if Keras (or legacy tf-keras) is imported."""
    config = sys.modules.get("keras.src.backend.config")
    if config is not None and works("keras.backend_name"):  # moved: said once, by compat
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
    return [b for b in (get(n) for n in names) if attempt(b.in_use, False, f"{b.name}.in_use")]


def read_active(
    light: bool = False, earlier: Sequence[BackendInfo] | None = None
) -> tuple[BackendInfo, ...]:
    """Read every backend in use; ``light`` leaves out the figures that are slow to read.
    From a background thread, ``earlier`` (the last readings) gives what the thread cannot
    read afresh (TensorFlow's default graph is per thread): ``Backend.refresh``."""
    before = {info.name: info for info in earlier or ()}
    light = light or earlier is not None
    out = []
    for b in active():
        base = before.get(b.name)
        read = b.read_light if light and b.read_light else b.read
        if b.refresh is not None and base is not None:
            read = functools.partial(b.refresh, base)
        out.append(attempt(read, None, f"{b.name}.read"))
    return tuple(info for info in out if info is not None)


def _each(
    attr: str, *args: Any, site: str = "", every: bool = False, skip: Sequence[str] = ()
) -> dict[str, Any]:
    """Return each backend in use's (``every``: each one's) ``attr(*args)``, by name, where it
    has that field and is not in ``skip``; a failure (said once per ``site``, the field's name
    unless given) or a None answer is left out."""
    out = {}
    for b in [get(n) for n in NAMES] if every else active():
        call = getattr(b, attr)
        if call is not None and b.name not in skip:
            site_name = f"{b.name}.{site or attr}"
            out[b.name] = attempt(functools.partial(call, *args), None, site_name)
    return {name: answer for name, answer in out.items() if answer is not None}


def _lines(attr: str, *args: Any, site: str = "", skip: Sequence[str] = ()) -> list[str]:
    return [line for said in _each(attr, *args, site=site, skip=skip).values() for line in said]


def reset_active(skip: tuple[str, ...] = ()) -> list[str]:
    """Reset every backend in use (caches, cached allocator blocks); return what was done."""
    return _lines("reset", skip=skip)


def collect_active() -> list[str]:
    """Collect garbage once, each backend in use doing its work around that collection;
    return what they released, in words."""
    said: list[str] = []
    run: Callable[[], object] = gc.collect
    for b in active():
        if b.collect is not None:
            run = functools.partial(_around, b, run, said)
    run()
    return said


def _around(backend: Backend, inner: Callable[[], object], said: list[str]) -> None:
    ran: list[bool] = []

    def collect() -> None:
        ran.append(True)
        inner()

    wrap = backend.collect
    assert wrap is not None
    said.extend(attempt(lambda: wrap(collect), [], f"{backend.name}.collect"))
    if not ran:  # the backend's own work failed before it collected: collect anyway
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
    found = [pair for pair in _each("traced", model).values() if pair[0] is not None]
    return found[0] if found else (None, None)


def registered() -> int | None:
    """Return the entries the backends keep per model until a purge (TF's custom gradients);
    None when no backend in use keeps any. Never imports a framework."""
    found = [get(n).registered for n in NAMES]
    counts = [n for n in (attempt(f, None) for f in found if f is not None) if n is not None]
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
