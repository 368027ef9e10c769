"""``reset()``: drop stale models, reset Keras/TensorFlow state, purge TF's caches, collect.

The same cleanup runs before a ``%%fresh_model`` cell, from the sidebar's "Free memory" button,
and from plain Python (``kerasmagic.reset()`` / ``with kerasmagic.fresh():``) in search loops.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

from kerasmagic.backends import allocated
from kerasmagic.cleanup.backend import reset_backend
from kerasmagic.cleanup.report import CleanupReport
from kerasmagic.cleanup.stale import plan_cleanup
from kerasmagic.cleanup.steps import Run, run_steps
from kerasmagic.compat import check_now
from kerasmagic.interrupts.held import held_interrupts
from kerasmagic.probes import read_ram
from kerasmagic.shellstate import current, state_of


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
    if not report.dry_run:
        _remember(report, shell)
    return report


_outside: list[CleanupReport] = []  # outside IPython (a script): the last report, if any


def _remember(report: CleanupReport, shell: Any | None) -> None:
    state = state_of(shell) if shell is not None else current()
    if state is not None:
        state.last_report = report
    else:
        _outside[:] = [report]


def last_report(shell: Any | None = None) -> CleanupReport | None:
    """Return the report of the most recent cleanup of ``shell`` (by default the running
    IPython shell; in a script, of this process), or None before any."""
    state = state_of(shell) if shell is not None else current()
    if state is not None:
        return state.last_report
    return _outside[0] if _outside else None


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
    check_now(shell)  # what is off in the frameworks imported now, said once (outside IPython too)
    ns: MutableMapping[str, Any] = (
        namespace if namespace is not None else getattr(shell, "user_ns", {})
    )
    plan = plan_cleanup(ns, rebinding=rebinding, keep=keep, drop_all=drop_all, shell=shell)
    dropped = tuple(d for d, _ in plan.actions if d and not d.startswith("displayhook."))
    kept = tuple(path for path, _ in plan.kept.values())
    if dry_run:
        return CleanupReport(dropped, kept, (), 0, None, (), time.perf_counter() - start, True)
    stale_models = plan.models()
    run = Run(ns, shell, plan, patch_stack_traces, dropped)
    del plan  # the run owns it now, and lets it go before collecting
    run_steps(run)
    tf_after = allocated("tensorflow")
    tf_freed = None if run.tf_before is None or tf_after is None else run.tf_before - tf_after
    return CleanupReport(
        dropped=dropped,
        kept=kept,
        not_freed=run.not_freed,
        freed_bytes=run.rss_before - read_ram().rss_bytes,
        tf_freed_bytes=tf_freed,
        released=tuple(run.released),
        elapsed_s=time.perf_counter() - start,
        notes=tuple(run.notes),
        stale_models=stale_models,
        steps=tuple(run.timings),
    )


@contextmanager
def fresh(
    namespace: MutableMapping[str, Any] | None = None, **options: Any
) -> Iterator[CleanupReport]:
    """Run ``reset()`` before the block; for loops: ``with kerasmagic.fresh(): model = ...``."""
    yield reset(namespace, **options)


__all__ = ["CleanupReport", "fresh", "last_report", "reset", "reset_backend"]
