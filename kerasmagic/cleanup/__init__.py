"""``reset()``: drop stale models, reset Keras/TensorFlow state, purge TF's caches, collect.

The same cleanup runs before a ``%%fresh_model`` cell, from the sidebar's "Free memory" button,
and from plain Python (``kerasmagic.reset()`` / ``with kerasmagic.fresh():``) in search loops.
``holders.py``'s plan decides what is stale and how to cut it; here ``run_steps`` runs the
cleanup step by step (each named and timed) and says what it did (``CleanupReport``). There is
one garbage collection (``collect``), and a second only when something that should have gone
survived the first (``survivors``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any

from kerasmagic import backends
from kerasmagic.cleanup import holders
from kerasmagic.cleanup.loops import Freezer
from kerasmagic.compat import check_now
from kerasmagic.compat.probes import find_libc as libc
from kerasmagic.compat.registry import broken, say_once, works
from kerasmagic.interrupts.held import held_interrupts
from kerasmagic.probes import read_ram
from kerasmagic.shellstate import current, state_of
from kerasmagic.units import fill, fmt_bytes, signed_bytes
from kerasmagic.walk import held_by, state_types


def reset(
    namespace: MutableMapping[str, Any] | None = None,
    *,
    rebinding: Iterable[str] = (),
    keep: Iterable[str] = (),
    drop_all: bool = False,
    dry_run: bool = False,
    patch_stack_traces: bool = True,
) -> CleanupReport:
    """Free stale Keras models and TensorFlow state; return what was done.

    ``namespace`` defaults to IPython's user namespace (or nothing outside IPython). Stale
    means: models under ``rebinding`` names (or every model with ``drop_all``), and models held
    only by IPython's output cache, stored tracebacks or callbacks (where ``namespace`` is the
    running shell's). Names in ``keep`` survive. A Ctrl-C during the cleanup is held until it
    is complete, then raised.
    """
    if namespace is not None and not isinstance(namespace, MutableMapping):
        raise TypeError(f"reset() takes a namespace such as globals(), not a "
                        f"{type(namespace).__name__}: to free a model, name it, as in "
                        "reset(rebinding=['model'])")  # fmt: skip
    rebinding, keep = _given_names("rebinding", rebinding), _given_names("keep", keep)
    shell = holders.ipython_shell()
    if namespace is None:
        namespace = getattr(shell, "user_ns", {})
    elif namespace is not getattr(shell, "user_ns", None):
        shell = None
    return clean(shell, namespace, rebinding=rebinding, keep=keep, drop_all=drop_all,
                 dry_run=dry_run, patch_stack_traces=patch_stack_traces)  # fmt: skip


def _given_names(option: str, names: Iterable[str]) -> tuple[str, ...]:
    """Return ``names`` as a tuple: one string is one name, not its letters."""
    listed: tuple[Any, ...]
    try:
        listed = (names,) if isinstance(names, str) else tuple(names)
    except TypeError:
        listed = (names,)
    if not all(isinstance(name, str) for name in listed):
        raise TypeError(f"{option} takes variable names (a string or strings), not {names!r}")
    return listed


def clean(
    shell: Any | None,
    namespace: MutableMapping[str, Any],
    *,
    rebinding: Iterable[str] = (),
    keep: Iterable[str] = (),
    drop_all: bool = False,
    dry_run: bool = False,
    patch_stack_traces: bool = True,
) -> CleanupReport:
    """``reset()`` of ``namespace`` with ``shell``'s own holders (None: none), as
    ``%%fresh_model`` and the sidebar's "Free memory" run it."""
    with held_interrupts() as held:
        start = time.perf_counter()
        check_now(shell)  # what is off in the frameworks imported now, said once
        report = run_steps(  # no local here holds the plan: run_steps lets it go in time
            holders.plan_cleanup(
                namespace, rebinding=rebinding, keep=keep, drop_all=drop_all, shell=shell
            ),
            patch_stack_traces,
            start,
            dry_run,
        )
    held.deliver()
    if report.dry_run:
        return report
    state = state_of(shell) if shell is not None else current()
    if state is not None:
        state.last_report = report
    else:
        _outside[:] = [report]
    return report


_outside: list[CleanupReport] = []  # outside IPython (a script): the last report, if any


def last_report(shell: Any | None = None) -> CleanupReport | None:
    """Return the report of the most recent cleanup of ``shell`` (by default the running
    IPython shell; in a script, of this process), or None before any."""
    state = state_of(shell) if shell is not None else current()
    if state is not None:
        report: CleanupReport | None = state.last_report  # shellstate keeps it untyped
        return report
    return _outside[0] if _outside else None


@contextlib.contextmanager
def fresh(
    namespace: MutableMapping[str, Any] | None = None,
    *,
    rebinding: Iterable[str] = (),
    keep: Iterable[str] = (),
    drop_all: bool = False,
    dry_run: bool = False,
    patch_stack_traces: bool = True,
) -> Iterator[CleanupReport]:
    """Run ``reset()`` (same arguments) before the block: ``with kerasmagic.fresh(): ...``."""
    yield reset(namespace, rebinding=rebinding, keep=keep, drop_all=drop_all, dry_run=dry_run,
                patch_stack_traces=patch_stack_traces)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CleanupReport:
    """What one cleanup dropped, what it freed, and which models are still alive and why."""

    dropped: tuple[str, ...]
    kept: tuple[str, ...]
    not_freed: tuple[str, ...]
    freed_bytes: int
    allocator_freed_bytes: int | None  # by the allocator of ``allocator_backend``, if it says
    allocator_backend: str | None  # "tensorflow", ...: Keras's own first, of those that say
    released: tuple[str, ...]  # what the backends released around the collection, in words
    elapsed_s: float
    dry_run: bool = False
    notes: tuple[str, ...] = ()
    stale_models: int = 0  # models the cleanup set out to free (freed_bytes / this: per model)
    steps: tuple[tuple[str, float], ...] = ()  # each step's name and seconds

    def summary(self) -> str:
        """Return what the cleanup did in full, a part per line, each within ``WIDTH``
        columns: printed in any notebook, no line needs the frontend to break it (which
        breaks inside words). Under a ``%%fresh_model`` cell it is the line's detail."""
        if self.dry_run:
            return f"dry run: would drop {_names(self.dropped)}; would keep {_names(self.kept)}"
        parts = [f"{self._freed()} in {self.elapsed_s:.2f} s", f"dropped {_names(self.dropped)}"]
        parts += self.released
        if self.kept:
            parts.append(f"still alive: {_names(self.kept)}")
        if self.not_freed:
            parts.append(f"NOT freed: {_names(self.not_freed)}")
        return "\n".join(fill(part) for part in parts + list(self.notes))

    def _freed(self) -> str:
        """Say what was freed, in units that show it (12.0 KB, not 0.0 MB); what was freed
        while nothing was dropped is what earlier cells left for the collector."""
        ram = f"{fmt_bytes(self.freed_bytes)} of RAM" if self.freed_bytes > 0 else ""
        freed, name = self.allocator_freed_bytes, self.allocator_backend or ""
        label = backends.LABELS.get(name, name)
        tensors = f"{fmt_bytes(freed)} of {label} tensors" if freed and freed > 0 else ""
        said = " and ".join(part for part in (ram, tensors) if part)
        if not said:
            return "freed no memory"
        return f"freed {said}" + ("" if self.dropped else " (garbage earlier cells left)")

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-able dict (for the sidebar and logs)."""
        return dataclasses.asdict(self)


def _names(items: tuple[str, ...], limit: int = 6) -> str:
    if not items:
        return "nothing"
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def report_text(
    report: CleanupReport, start_rss: int, after_rss: int, record: Any, end_rss: int
) -> str:
    """Return a ``%%fresh_model`` cell's short line once the cell is recorded: the cell's RSS
    change (its record's, which its badge and the sidebar's chart show) as the cleanup's part
    plus the cell's own, the allocator's tensors alike, what was dropped and what was not
    freed. ``start_rss`` (before the cleanup), ``after_rss`` (after it) and ``end_rss`` are
    the magic's readings; the record's own start and end replace the first and the last."""
    if record is not None:
        start_rss, end_rss = record.start.ram.rss_bytes, record.end.ram.rss_bytes
    parts = [_split("RSS", end_rss - start_rss, after_rss - start_rss)]
    name, freed = report.allocator_backend, report.allocator_freed_bytes
    net = None if record is None or name is None else record.delta.device_bytes.get(name)
    if net is not None and freed is not None and (net or freed):
        label = "TF" if name == "tensorflow" else backends.LABELS.get(name or "", name)
        parts.append(_split(f"{label} tensors", net, -freed))
    if report.dropped:
        parts.append(f"dropped {_short(report.dropped)}")
    if len(report.not_freed) == 1:
        parts.append(f"NOT freed: {report.not_freed[0]}")  # what holds it, said whole
    elif report.not_freed:  # what holds each is the detail's
        parts.append(f"NOT freed: {len(report.not_freed)} objects, {_short(report.not_freed)}")
    return "; ".join(parts)


def _short(labels: tuple[str, ...]) -> str:
    """The first two of ``labels``' names, without their descriptions, and how many more."""
    return _names(tuple(dict.fromkeys(label.split(" (")[0] for label in labels)), 2)


def _split(what: str, net: int, cleanup: int) -> str:
    """``RSS +1.0 MB (cleanup -2.0 MB, the cell +3.0 MB)``: the parts add up to the net, as
    printed where the three share a unit (the cell's is what the two others leave)."""
    parts = [signed_bytes(n) for n in (net, cleanup, net - cleanup)]
    (total, unit), (part, _) = parts[0].split(), parts[1].split()
    one_unit = all(p.endswith(f" {unit}") for p in parts)
    if one_unit and unit != "B":
        parts[2] = f"{float(total) - float(part):+.1f} {unit}"
    return "{} {} (cleanup {}, the cell {})".format(what, *parts)


# The steps, in order: the order matters where the comments say.


def run_steps(plan: holders.Plan, patch: bool, start: float, dry_run: bool) -> CleanupReport:
    """Run the plan's steps in order, each timed by its name in ``CleanupReport.steps``."""
    ns, shell = plan.ns, plan.shell
    dropped = tuple(d for d, _ in plan.actions if d and not d.startswith("displayhook."))
    kept = tuple(path for path, _ in plan.kept.values())
    if dry_run:
        elapsed = time.perf_counter() - start
        return CleanupReport(dropped, kept, (), 0, None, None, (), elapsed, dry_run=True)
    stale_models = sum(plan.types.kind(type(obj)) == "model" for _, obj in plan.stale.values())
    rss_before, held_before = read_ram().rss_bytes, backends.allocated()
    timings: list[tuple[str, float]] = []
    began = time.perf_counter()

    def done(step: str) -> None:
        nonlocal began
        now = time.perf_counter()
        timings.append((step, now - began))
        began = now

    # cut: names, container items, Out[], stored frames, links
    watched = _weak(plan.stale.values())
    notes = list(dict.fromkeys(plan.notes))
    _cut([*(act for _, act in plan.actions), *plan.unlinks])
    done("cut")
    # Before the collection: drop the tf.function traces of what was cut (their graphs hold
    # the variables); traces of what is kept stay.
    notes += backends.clear_traces(ns, [obj for _, obj in plan.stale.values()], plan.roots)
    del plan  # it holds the stale objects: they go before the collection
    done("clear_traces")
    reset_backend()  # Keras's global state (user settings kept), then each backend's caches
    if patch:  # TF's op stack traces (TensorFlow imported since the load)
        notes += backends.attach()
    done("reset_backends")
    Freezer.thaw()  # a loop froze the old objects: a cleanup looks at everything
    released = backends.collect_active()  # the one collection (TF's gradient registry purged)
    done("collect")
    # What should have gone and did not, and what holds it; a stored error that holds it goes
    # too (its frames keep the functions they ran), then one more collection.
    not_freed = _survivors(watched, ns)
    by_error = any(label.startswith("sys.last") for label in dropped)
    if not_freed and by_error and holders.drop_stored_errors(shell):
        notes.append("dropped the stored error too: it held a model (%tb has nothing to show)")
        released += backends.collect_active()
        not_freed = _survivors(watched, ns)
    done("survivors")
    backends.release_active()  # cached device blocks no tensor uses go back to the driver
    done("release_backends")
    malloc_trim()
    done("trim_heap")
    after = backends.allocated()
    freed = {name: held - after[name] for name, held in held_before.items() if name in after}
    allocator, allocator_freed = next(iter(freed.items()), (None, None))
    freed_bytes, elapsed = rss_before - read_ram().rss_bytes, time.perf_counter() - start
    return CleanupReport(dropped, kept, not_freed, freed_bytes, allocator_freed, allocator,
                         tuple(released), elapsed, notes=tuple(notes), stale_models=stale_models,
                         steps=tuple(timings))  # fmt: skip


def _weak(found: Iterable[tuple[str, Any]]) -> list[tuple[str, weakref.ref[Any]]]:
    out = []
    for path, obj in found:
        with contextlib.suppress(TypeError):  # state that takes no weak reference: not watched
            out.append((path, weakref.ref(obj)))
    return out


def _cut(cuts: list[Callable[[], object]]) -> None:
    """Make each cut (in a function: a loop variable would keep the last one's objects)."""
    for act in cuts:
        act()


def _survivors(
    watched: list[tuple[str, weakref.ref[Any]]], ns: MutableMapping[str, Any]
) -> tuple[str, ...]:
    """Name what was watched and survived, with what holds it."""
    if not any(ref() is not None for _, ref in watched):
        return ()
    gc.collect()  # objects freed by the first pass can release others (finalizers, weakrefs)
    alive = [(path, obj) for path, obj in ((p, r()) for p, r in watched) if _weighs(obj)]
    if not alive:
        return ()
    paths = holders.holder_paths(ns, [obj for _, obj in alive])
    out = []
    for path, obj in alive:
        try:
            held = paths.get(id(obj)) or holders.referrer_kinds(obj, (alive, *alive))
        except Exception:  # an odd object among the referrers: the report still comes
            held = ["something kerasmagic could not look into"]
        out.append(f"{path} (held by {', '.join(held)})")
    return tuple(out)


def _weighs(obj: Any) -> bool:
    """Return whether a survivor is worth naming: a model, or state that still holds weights
    (a kept base's graph keeps the symbolic inputs of every call on it, which hold none)."""
    kind = state_types().kind(type(obj))
    return obj is not None and (kind in (None, "model") or held_by(obj, kind).size_bytes > 0)


# Keras's global state, reset with its user settings kept.


STATE = "keras.src.backend.common.global_state"

# Keras keeps user settings in the same global state that clear_session() throws away: the
# dtype policy (keras.mixed_precision.set_global_policy), the seed (keras.utils.set_random_seed).
KERAS_SETTINGS: tuple[str, ...] = ("dtype_policy", "global_random_seed", "interactive_logging")
KERAS_SETTINGS += ("traceback_filtering", "flash_attention", "nnx_enabled")


def _keras_settings() -> dict[str, Any]:
    """Return Keras's user settings to put back after ``clear_session()``; {} when its global
    state moved (said once: ``compat``).

    ``clear_session()`` resets names, graphs and kernel caches, and with them user settings
    kept in the same global state (dtype policy, random seed): those are saved and put back.
    """
    state = sys.modules.get(STATE)
    if state is None or not works("keras.global_state"):
        return {}
    try:
        values = {name: state.get_global_attribute(name) for name in KERAS_SETTINGS}
    except Exception as exc:
        broken("keras.global_state", f"changed get_global_attribute ({type(exc).__name__})")
        return {}
    return {name: value for name, value in values.items() if value is not None}


def reset_backend() -> None:
    """Reset Keras's global state (names, graphs, kernel caches), keep its user settings, then
    each backend in use (TF's default graph, JAX's compilation caches, torch's caches)."""
    saved = _keras_settings()
    for name in ("keras", "tf_keras"):
        clear = getattr(getattr(sys.modules.get(name), "backend", None), "clear_session", None)
        if clear is None:
            continue
        try:
            try:
                clear(free_memory=False)
            except TypeError:  # tf-keras has no free_memory argument
                clear()
        except Exception as exc:  # a Keras whose import was stopped part way (Ctrl-C) stays so
            say_once([f"kerasmagic: {name}.backend.clear_session() failed ({type(exc).__name__}: "
                      f"{exc}): its names and graphs were not reset; an import of {name} stopped "
                      "part way leaves it so until the kernel restarts"])  # fmt: skip
    try:  # saved holds something only where the global state module is imported
        for name, value in saved.items():
            sys.modules[STATE].set_global_attribute(name, value)
    except Exception as exc:
        broken("keras.global_state", f"changed set_global_attribute ({type(exc).__name__})")
    backends.reset_active()  # TF's default graph, JAX's jit caches, torch's


# -- glibc's heap -------------------------------------------------------------------------------
# glibc's heap: hand freed pages back to the OS, and keep big blocks off the heap.
#
# glibc serves a block of at least its mmap threshold (128 KiB at start) with its own ``mmap``,
# returned to the OS when freed. But the threshold is dynamic: each freed mmapped block raises it
# to that block's size (up to 32 MiB), so after the first big tensor is freed, blocks of a few MiB
# land on the heap, and a heap only shrinks from its top. Re-run model cells then grow RSS in
# steps the allocator keeps (``benchmarks/notebook_patterns.py``, a ``tf.data`` pipeline: 0.14 MB
# per re-run while malloc's in-use bytes stay flat). Pinning the threshold at a few MiB keeps
# blocks above it on ``mmap`` (0.03 MB per re-run) at no fit-time cost measured here; blocks
# below it (batches, activations) still come from the heap, at heap speed. glibc has no call that
# restores its dynamic mode, so a pin outlives ``%unload_ext``.
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MAX_MB = 32  # glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)

_pinned_mb: int | None = None


def malloc_trim() -> None:
    """Hand freed heap pages back to the OS (glibc), so RSS shows what was freed."""
    trim = getattr(libc(), "malloc_trim", None)  # musl and others lack it
    if trim is not None and works("glibc.mallopt"):
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        trim(0)


def pin_mmap_threshold(megabytes: int) -> str:
    """Pin glibc's mmap threshold at ``megabytes`` MiB (0: leave it); return what was done."""
    global _pinned_mb
    if not 0 <= megabytes <= MAX_MB:
        raise ValueError(f"mmap threshold must be 0 to {MAX_MB} MiB, not {megabytes}")
    if megabytes == 0:
        return "glibc's mmap threshold left dynamic"
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc." in os.getenv("GLIBC_TUNABLES", ""):
        return "glibc's malloc is configured by the environment: left as it is"
    if _pinned_mb != megabytes:
        mallopt = getattr(libc(), "mallopt", None)
        if mallopt is None or not works("glibc.mallopt"):
            return "not glibc: the allocator is left as it is"
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        if not mallopt(M_MMAP_THRESHOLD, megabytes * 2**20):
            return f"glibc refused an mmap threshold of {megabytes} MiB"
        _pinned_mb = megabytes
    return f"glibc's mmap threshold pinned at {megabytes} MiB"


__all__ = ["CleanupReport", "fresh", "last_report", "reset", "reset_backend"]
