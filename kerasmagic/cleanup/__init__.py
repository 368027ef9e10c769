"""``reset()``: drop stale models, reset Keras/TensorFlow state, purge TF's caches, collect.

The same cleanup runs before a ``%%fresh_model`` cell, from the sidebar's "Free memory" button,
and from plain Python (``kerasmagic.reset()`` / ``with kerasmagic.fresh():``) in search loops.
"""

from __future__ import annotations

import gc
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

from kerasmagic.backends.tensorflow import stack as tfstack
from kerasmagic.backends.tensorflow.alloc import read_tf
from kerasmagic.backends.tensorflow.purge import PurgeResult, purge_custom_gradients
from kerasmagic.backends.tensorflow.traces import clear_stale_traces
from kerasmagic.cleanup.backend import reset_backend
from kerasmagic.cleanup.heap import malloc_trim
from kerasmagic.cleanup.holders import holder_paths, referrer_kinds
from kerasmagic.cleanup.interrupts import held_interrupts
from kerasmagic.cleanup.report import CleanupReport
from kerasmagic.cleanup.stale import plan_cleanup
from kerasmagic.cleanup.tracebacks import drop_stored_errors
from kerasmagic.probes import read_ram


def _ipython_shell() -> Any | None:
    ipython = sys.modules.get("IPython")
    return None if ipython is None else ipython.get_ipython()


def reset(
    namespace: MutableMapping[str, Any] | None = None,
    *,
    rebinding: Iterable[str] = (),
    keep: Iterable[str] = (),
    drop_all: bool = False,
    dry_run: bool = False,
    patch_stack_traces: bool = True,
    shell: Any | None = None,
) -> CleanupReport:
    """Free stale Keras models and TensorFlow state; return what was done.

    ``namespace`` defaults to IPython's user namespace (or nothing outside IPython). Stale
    means: models under ``rebinding`` names (or every model with ``drop_all``), and models held
    only by IPython's output cache, stored tracebacks or callbacks. Names in ``keep`` survive.
    A Ctrl-C during the cleanup is held until it is complete, then raised.
    """
    with held_interrupts() as held:
        report = _reset(
            namespace,
            rebinding,
            keep,
            drop_all=drop_all,
            dry_run=dry_run,
            patch_stack_traces=patch_stack_traces,
            shell=shell,
        )
    held.deliver()
    global _last
    _last = report if not report.dry_run else _last
    return report


_last: CleanupReport | None = None


def last_report() -> CleanupReport | None:
    """Return the report of the most recent cleanup in this process (None before any)."""
    return _last


def _reset(
    namespace: MutableMapping[str, Any] | None,
    rebinding: Iterable[str],
    keep: Iterable[str],
    *,
    drop_all: bool,
    dry_run: bool,
    patch_stack_traces: bool,
    shell: Any | None,
) -> CleanupReport:
    start = time.perf_counter()
    if shell is None and namespace is None:
        shell = _ipython_shell()
    ns: MutableMapping[str, Any] = (
        namespace if namespace is not None else getattr(shell, "user_ns", {})
    )
    plan = plan_cleanup(ns, rebinding=rebinding, keep=keep, drop_all=drop_all, shell=shell)
    dropped = tuple(desc for desc, _ in plan.actions if not desc.startswith("displayhook."))
    kept = tuple(path for path, _ in plan.kept.values())
    if dry_run:
        return CleanupReport(dropped, kept, (), 0, None, None, time.perf_counter() - start, True)
    rss_before, tf_before = read_ram().rss_bytes, read_tf().current_bytes
    watched = [(path, weakref.ref(model)) for path, model in plan.stale.values()]
    plan_notes = list(dict.fromkeys(plan.notes))
    _cut(plan.actions)  # in a function: a loop variable here would keep the last cut's closure
    stale_and_kept = ([m for _, m in plan.stale.values()], [m for _, m in plan.kept.values()])
    plan_notes += clear_stale_traces(ns, *stale_and_kept)  # before the purge: frees their graphs
    del plan, stale_and_kept
    notes = plan_notes + _reset_tensorflow(patch_stack_traces)
    purge = _collect()
    not_freed = _survivors(watched, ns)
    held_by_error = any(label.startswith("sys.last") for label in dropped)
    if not_freed and held_by_error and drop_stored_errors(shell):  # see drop_stored_errors
        notes.append("dropped the stored error too: it held a model (%tb has nothing to show)")
        purge = _merge(purge, _collect())
        not_freed = _survivors(watched, ns)
    if purge is not None and purge.message:
        notes.append(purge.message)
    malloc_trim()
    tf_after = read_tf().current_bytes
    return CleanupReport(
        dropped=dropped,
        kept=kept,
        not_freed=not_freed,
        freed_bytes=rss_before - read_ram().rss_bytes,
        tf_freed_bytes=None if tf_before is None or tf_after is None else tf_before - tf_after,
        purge=purge,
        elapsed_s=time.perf_counter() - start,
        notes=tuple(notes),
        stale_models=len(watched),
    )


def _cut(actions: list[tuple[str, Callable[[], None]]]) -> None:
    for _, act in actions:
        act()


def _collect() -> PurgeResult | None:
    """Collect garbage, purging TF's custom gradients whose graphs go with it (None: no TF)."""
    if "tensorflow" in sys.modules:
        return purge_custom_gradients()
    gc.collect()
    return None


def _merge(first: PurgeResult | None, second: PurgeResult | None) -> PurgeResult | None:
    if first is None or second is None:
        return first or second
    dropped = first.dropped + second.dropped
    return PurgeResult(dropped, second.kept, second.unknown, first.message or second.message)


def _reset_tensorflow(patch_stack_traces: bool) -> list[str]:
    notes: list[str] = []
    reset_backend()
    tfstack.clear_cache()  # its remembered traces name old cells' frames (strings only)
    if patch_stack_traces and "tensorflow" in sys.modules:
        why = tfstack.install()
        if why:
            notes.append(why)
    return notes


def _survivors(
    watched: list[tuple[str, weakref.ref[Any]]], ns: MutableMapping[str, Any]
) -> tuple[str, ...]:
    if not any(ref() is not None for _, ref in watched):
        return ()
    gc.collect()  # objects freed by the first pass can release others (finalizers, weakrefs)
    alive = [(path, ref()) for path, ref in watched if ref() is not None]
    if not alive:
        return ()
    paths = holder_paths(ns, [model for _, model in alive])
    out = []
    for path, model in alive:
        holders = paths.get(id(model)) or _referrers(model, alive)
        out.append(f"{path} (held by {', '.join(holders)})")
    return tuple(out)


def _referrers(model: Any, alive: list[tuple[str, Any]]) -> list[str]:
    try:
        return referrer_kinds(model, (alive, *alive))
    except Exception:  # an odd object among the referrers: the report still comes
        return ["something kerasmagic could not look into"]


@contextmanager
def fresh(
    namespace: MutableMapping[str, Any] | None = None, **options: Any
) -> Iterator[CleanupReport]:
    """Run ``reset()`` before the block; for loops: ``with kerasmagic.fresh(): model = ...``."""
    yield reset(namespace, **options)


__all__ = ["CleanupReport", "fresh", "last_report", "reset", "reset_backend"]
