"""The cleanup, step by step: each step is a named function of one ``Run``, in ``STEPS`` order.

The order matters where the comments say; there is one garbage collection (``collect``),
and a second only when something that should have gone survived the first (``survivors``).
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from kerasmagic import backends
from kerasmagic.cleanup.backend import reset_backend
from kerasmagic.cleanup.holders import holder_paths, referrer_kinds
from kerasmagic.cleanup.loops import Freezer
from kerasmagic.cleanup.stale import Plan
from kerasmagic.cleanup.tracebacks import drop_stored_errors
from kerasmagic.native.heap import malloc_trim
from kerasmagic.probes import read_ram
from kerasmagic.walk.ownership import held_by
from kerasmagic.walk.state import state_types


@dataclass
class Run:
    """One cleanup as its steps see it: what the plan found, what was done, what it said."""

    ns: MutableMapping[str, Any]
    shell: Any | None
    plan: Plan | None
    patch_stack_traces: bool
    dropped: tuple[str, ...]
    watched: list[tuple[str, weakref.ref[Any]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)  # backends' words ("purged 2 ...")
    not_freed: tuple[str, ...] = ()
    rss_before: int = 0
    tf_before: int | None = None
    timings: list[tuple[str, float]] = field(default_factory=list)


def cut(run: Run) -> None:
    """Cut what the plan found: names, container items, Out[], stored frames, links."""
    assert run.plan is not None
    run.watched = _weak(run.plan.stale.values())
    run.notes += dict.fromkeys(run.plan.notes)
    _cut(run.plan.actions)  # in a function: a loop variable here would keep the last closure
    for unlink in run.plan.unlinks:
        unlink()


def clear_traces(run: Run) -> None:
    """Before the collection: drop the tf.function traces of what was cut (their graphs hold
    the variables); traces of what is kept stay."""
    assert run.plan is not None
    stale = [obj for _, obj in run.plan.stale.values()]
    run.notes += backends.clear_traces(run.ns, stale, run.plan.roots)
    run.plan = None  # the plan holds the stale objects: let them go before collecting


def reset_backends(run: Run) -> None:
    """Keras's global state (names, graphs; its user settings kept), then each backend's
    caches (TF's default graph and string traces, JAX's compilations, torch.compile's)."""
    reset_backend()
    if run.patch_stack_traces:  # TF's op stack traces (TensorFlow imported since the load)
        run.notes += backends.attach()


def collect(run: Run) -> None:
    """The one collection, each backend's work around it (TF's gradient registry purged)."""
    Freezer.thaw()  # a loop froze the old objects: a cleanup looks at everything
    run.released += backends.collect_active()


def survivors(run: Run) -> None:
    """Name what should have gone and did not, and what holds it; a stored error that holds
    it goes too (its frames keep the functions they ran), then one more collection."""
    run.not_freed = _survivors(run.watched, run.ns)
    by_error = any(label.startswith("sys.last") for label in run.dropped)
    if run.not_freed and by_error and drop_stored_errors(run.shell):
        run.notes.append("dropped the stored error too: it held a model (%tb has nothing to show)")
        run.released += backends.collect_active()
        run.not_freed = _survivors(run.watched, run.ns)


def release_backends(run: Run) -> None:
    """After the collection: cached device blocks no tensor uses go back to the driver."""
    backends.release_active()


def trim_heap(run: Run) -> None:
    """glibc's freed heap back to the operating system."""
    malloc_trim()


STEPS: tuple[Callable[[Run], None], ...] = (
    cut,
    clear_traces,
    reset_backends,
    collect,
    survivors,
    release_backends,
    trim_heap,
)


def run_steps(run: Run) -> None:
    """Run every step in order, timing each."""
    run.rss_before, run.tf_before = read_ram().rss_bytes, backends.allocated("tensorflow")
    for step in STEPS:
        start = time.perf_counter()
        step(run)
        run.timings.append((step.__name__, time.perf_counter() - start))


def _weak(found: Iterable[tuple[str, Any]]) -> list[tuple[str, weakref.ref[Any]]]:
    out = []
    for path, obj in found:
        try:
            out.append((path, weakref.ref(obj)))
        except TypeError:  # a kind of state that takes no weak reference: not watched
            continue
    return out


def _cut(actions: list[tuple[str, Callable[[], None]]]) -> None:
    for _, act in actions:
        act()


def _survivors(
    watched: list[tuple[str, weakref.ref[Any]]], ns: MutableMapping[str, Any]
) -> tuple[str, ...]:
    if not any(ref() is not None for _, ref in watched):
        return ()
    gc.collect()  # objects freed by the first pass can release others (finalizers, weakrefs)
    alive = [(path, obj) for path, obj in ((p, r()) for p, r in watched) if _weighs(obj)]
    if not alive:
        return ()
    paths = holder_paths(ns, [obj for _, obj in alive])
    out = []
    for path, obj in alive:
        holders = paths.get(id(obj)) or _referrers(obj, alive)
        out.append(f"{path} (held by {', '.join(holders)})")
    return tuple(out)


def _weighs(obj: Any) -> bool:
    """Return whether a survivor is worth naming: a model, or state that still holds weights
    (a kept base's graph keeps the symbolic inputs of every call on it, which hold none)."""
    if obj is None:
        return False
    kind = state_types().kind(type(obj))
    return kind in (None, "model") or held_by(obj, kind).size_bytes > 0


def _referrers(obj: Any, alive: list[tuple[str, Any]]) -> list[str]:
    try:
        return referrer_kinds(obj, (alive, *alive))
    except Exception:  # an odd object among the referrers: the report still comes
        return ["something kerasmagic could not look into"]
