"""An out-of-memory error explained: its figures, the block printed after the cell, the record.

``read_figures`` takes the failed device's allocator from readings already made (the kernel's
snapshot); ``figures_now`` reads them afresh, for an isolated child at the moment it fails.
``explain`` words them: the device, its allocator, what holds the memory, one remedy. The
loaded part (``load``) prints that block after the traceback (IPython shows that first) and
never replaces it; it loads before the live monitor, so its hook runs first, and the monitor's
record of the same cell takes the facts from ``Explainer.facts``.
"""

from __future__ import annotations

import gc
import logging
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kerasmagic.backends import LABELS, BackendDevice, BackendInfo
from kerasmagic.backends.oom import OomError, device_limit, find_oom, is_cpu, same_device
from kerasmagic.shellstate import ShellState
from kerasmagic.units import fmt_bytes

log = logging.getLogger(__name__)
FIND_BATCH = "kerasmagic.find_batch_size(model, x, y) finds the largest batch that fits"

if TYPE_CHECKING:
    from kerasmagic.cleanup.holders import LiveModel
    from kerasmagic.probes.nvml import GpuDevice


@dataclass(frozen=True)
class Figures:
    """The failed device's allocator: bytes in use, peak and limit (None: not known)."""

    device: str | None
    in_use_bytes: int | None = None
    peak_bytes: int | None = None
    limit_bytes: int | None = None
    limit_source: str | None = None  # where the limit comes from, in words
    rss_bytes: int | None = None  # the process's RAM, where no allocator keeps figures

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Figures:
        """Rebuild from ``to_dict`` output, ignoring fields this version does not know."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class OomFacts:
    """An out-of-memory error as a cell's record carries it (docs/protocol.md, ``oom``)."""

    backend: str
    device: str | None
    wanted_bytes: int | None
    shape: tuple[int, ...] | None
    dtype: str | None
    in_use_bytes: int | None
    peak_bytes: int | None
    limit_bytes: int | None
    limit_source: str | None
    remedy: str
    isolated: bool = False  # raised in a %%fresh_model --isolate child, now gone

    @classmethod
    def of(cls, oom: OomError, figures: Figures, remedy: str, isolated: bool) -> OomFacts:
        """Return the facts of ``oom`` with the device's ``figures``."""
        f = figures
        # fmt: off
        return cls(oom.backend, f.device or oom.device, oom.wanted_bytes, oom.shape, oom.dtype,
                   f.in_use_bytes, f.peak_bytes, f.limit_bytes, f.limit_source, remedy, isolated)
        # fmt: on

    def to_dict(self) -> dict[str, Any]:
        """Return a plain dict that ``json.dumps`` accepts (the shape as a list)."""
        return {**asdict(self), "shape": None if self.shape is None else list(self.shape)}


def read_figures(
    oom: OomError,
    backends: Sequence[BackendInfo],
    gpus: Sequence[GpuDevice],
    host_total: int | None = None,
    rss: int | None = None,
) -> Figures:
    """Return the failed device's figures from readings already made.

    The message's own figures (PyTorch's CUDA message gives them at the failure) win over the
    reading; a device the message does not name (JAX's) is the backend's first.
    """
    mine = [d for info in backends if info.name == oom.backend for d in info.devices]
    unread = BackendDevice(oom.device or "", None)  # the backend reads no such device
    d = next((d for d in mine if oom.device is None or same_device(d.name, oom.device)), unread)
    device = d.name or None
    in_use = d.in_use_bytes if oom.in_use_bytes is None else oom.in_use_bytes
    reported = oom.limit_bytes or d.limit_bytes  # the backend's own limit for the device
    limit = device_limit(oom.backend, device, gpus, reported, host_total)
    source = "the error message" if oom.limit_bytes else (limit.source if limit else None)
    return Figures(device, in_use, d.peak_bytes, limit.bytes if limit else None, source,
                   rss if in_use is None else None)  # fmt: skip


def figures_now(oom: OomError) -> Figures:
    """Return the failed device's figures read now (an isolated child, as it fails)."""
    import psutil

    from kerasmagic.backends import read_active
    from kerasmagic.probes import read_gpus

    on_gpu = oom.device is not None and not is_cpu(oom.device)
    gpus = read_gpus().devices if on_gpu and oom.backend == "tensorflow" else ()
    rss = int(psutil.Process().memory_info().rss)
    return read_figures(oom, read_active(), gpus, int(psutil.virtual_memory().total), rss)


def explain(
    oom: OomError,
    figures: Figures,
    models: Sequence[LiveModel],
    isolated_pid: int | None = None,
    batch_rows: bool = True,
) -> tuple[str, OomFacts]:
    """Return the lines printed after an out-of-memory traceback, and the record's facts.

    With ``isolated_pid`` the error came from that ``%%fresh_model --isolate`` child: its
    figures are the child's at the failure, and its memory went with it. ``batch_rows``: the
    tensor's first axis may be the batch (see ``rows_are_batch``).
    """
    where = figures.device or oom.device or "the device"
    label = LABELS.get(oom.backend, oom.backend)
    child = f", in isolated process {isolated_pid}" if isolated_pid is not None else ""
    lines = [f"kerasmagic: out of memory on {where} ({label}){child}"]
    if oom.wanted_bytes is not None:
        what = f"a {oom.dtype} tensor of shape {list(oom.shape)}" if oom.shape else "one block"
        lines.append(f"  wanted     {fmt_bytes(oom.wanted_bytes)} for {what}")
    lines.append(f"  allocator  {_allocator_line(figures, label)}")
    if isolated_pid is not None:
        lines.append("  after      that process has ended, and its memory with it: this kernel "
                     "holds none of it")  # fmt: skip
    else:
        lines.append("  after      the next cell drops this error and what its frames hold "
                     "(%debug or %tb first, to look at it)")  # fmt: skip
    ranked = sorted(models, key=lambda m: (not m.freeable, -m.size_bytes))
    for m in ranked[:5]:
        state = "this cell's" if _own(m) else "freeable" if m.freeable else "kept"
        held = ", ".join(m.holders[:3]) or "nothing in the namespace"
        lines.append(
            f"  held by    {m.type} {m.name!r} {fmt_bytes(m.size_bytes)} ({state}): {held}"
        )
    said = remedy(oom, figures, ranked, isolated_pid is not None, batch_rows)
    lines.append(f"  remedy     {said}")
    return "\n".join(lines), OomFacts.of(oom, figures, said, isolated_pid is not None)


def _allocator_line(f: Figures, label: str) -> str:
    """Return the allocator's figures in words, or why there are none."""
    limit = _said("limit", f.limit_bytes)
    if limit and f.limit_source:
        limit += f" ({f.limit_source})"
    figures = (_said("in use", f.in_use_bytes), _said("peak", f.peak_bytes), limit)
    if f.in_use_bytes is None and f.peak_bytes is None:
        none = f"no allocator figures ({label} keeps none on {f.device or 'this device'})"
        return "; ".join(x for x in (none, _said("process RSS", f.rss_bytes), limit) if x)
    return ", ".join(x for x in figures if x)


def _said(word: str, n: int | None) -> str | None:
    """Return ``word`` and ``n`` bytes in words, or None for a figure not known."""
    return None if n is None else f"{word} {fmt_bytes(n)}"


def _own(model: LiveModel) -> bool:
    """Whether only the error's own traceback holds ``model``: the failing code built or ran it,
    so freeing it and re-running builds it again (it is no earlier model)."""
    return bool(model.holders) and all(h.startswith("sys.last_") for h in model.holders)


def remedy(
    oom: OomError,
    f: Figures,
    models: Sequence[LiveModel],
    isolated: bool = False,
    batch_rows: bool = True,
) -> str:
    """Return the one remedy that the figures point to (``batch_rows``: as ``explain``)."""
    stale = [m for m in models if m.freeable and not _own(m)]
    wanted, limit, in_use = oom.wanted_bytes, f.limit_bytes, f.in_use_bytes
    if stale and not isolated:
        freed, s = fmt_bytes(sum(m.size_bytes for m in stale)), "s" if len(stale) > 1 else ""
        return (f"%%fresh_model on this cell (or kerasmagic.reset()) frees {freed} held by "
                f"{len(stale)} earlier model{s}, then re-run it")  # fmt: skip
    if wanted is not None and limit is not None and wanted > limit:
        host = is_cpu(f.device) and f.limit_source == "host RAM"
        whole = "the host's RAM" if host else "the whole device"
        return (f"this one allocation needs more than {whole} ({fmt_bytes(limit)}): make it "
                "smaller (a smaller batch, layer or input)")  # fmt: skip
    if isolated:
        return ("the isolated process started with nothing else on the device and still ran out: "
                f"use a smaller batch or model ({FIND_BATCH}, in the isolated cell)")  # fmt: skip
    if wanted is not None and limit is not None and in_use is not None:
        # in use is read once the error has unwound the step's tensors: the peak bounds what
        # was in use as it failed (a step of 32 MB failed at a 145 MB peak of 160, 59 MB after)
        used = max(in_use, f.peak_bytes or 0)
        if used + wanted < limit:
            return (f"{fmt_bytes(limit - in_use)} is free but in pieces smaller than this tensor "
                    "(the allocator keeps the regions it took): a smaller tensor fits; only a new "
                    "process (%%fresh_model --isolate, or a restart) joins them again")  # fmt: skip
        free, batch = limit - used, oom.shape[0] if oom.shape else 0
        if oom.shape and not batch_rows:
            return (f"a tensor shaped as a weight ({list(oom.shape)}: a weight, its gradient or "
                    f"optimizer slot) did not fit in the {fmt_bytes(max(free, 0))} left at the "
                    "peak: del what you no longer need, then kerasmagic.reset(), or use smaller "
                    "layers")  # fmt: skip
        fits = int(batch * free / wanted) if wanted else 0  # a negative free fits none
        if 0 < fits < batch:
            return (f"a tensor of {batch} rows did not fit in the {fmt_bytes(free)} left at the "
                    f"peak: a batch under {fits} at most (what fit holds whatever its batch "
                    "comes on top); %%fresh_model --predict on this cell frees what the error "
                    "holds and names the batch that fits before the fit starts")  # fmt: skip
    return ("the memory is held by what you keep: del what you no longer need, then "
            f"kerasmagic.reset(), or use a smaller batch ({FIND_BATCH})")  # fmt: skip


@dataclass(frozen=True)
class OomReport:
    """An out-of-memory error explained: the printed block and the record's facts."""

    text: str
    facts: OomFacts


def report(shell: Any, error: BaseException | None) -> OomReport | None:
    """Return the explanation of ``error`` if it is an out-of-memory error, else None."""
    if (oom := find_oom(error)) is None:
        return None
    outcome: Any = getattr(error, "outcome", None)
    if getattr(outcome, "error_type", None) is not None:
        said = getattr(outcome, "oom", None)  # the child's figures, read as it failed
        figures = Figures.from_dict(said) if isinstance(said, dict) else Figures(oom.device)
        return OomReport(*explain(oom, figures, (), isolated_pid=outcome.pid))
    from kerasmagic.cleanup.holders import live_models
    from kerasmagic.snapshot import take_snapshot

    snap = take_snapshot(shell.user_ns, light=True)
    rss, total = snap.ram.rss_bytes, snap.ram.total_bytes
    figures = read_figures(oom, snap.backends, snap.gpu.devices, total, rss)
    models = live_models(shell.user_ns)
    return OomReport(*explain(oom, figures, models, batch_rows=rows_are_batch(oom, error)))


BUILDING = frozenset({"build", "build_wrapper", "add_weight"})


def rows_are_batch(oom: OomError, error: BaseException | None) -> bool:
    """Whether the failed tensor's first axis may be the batch: not while weights are made
    (a frame of the traceback builds a layer), and not in a tensor shaped as a live model's
    weight (its gradient or an optimizer slot: a batch of 64 failed on a [2000, 2000] one)."""
    tb = getattr(error, "__traceback__", None)
    while tb is not None:
        if tb.tb_frame.f_code.co_name in BUILDING:
            return False
        tb = tb.tb_next
    if not oom.shape:
        return False
    from kerasmagic import walk

    models = walk.live_model_objects(walk.model_types())
    weights = (w for m in models for w in walk.guarded(lambda m=m: list(m.weights), []))
    return all(walk.guarded(lambda w=w: tuple(w.shape), ()) != oom.shape for w in weights)


class Explainer:
    """Explains each cell's out-of-memory error once, for the printed block and the record.

    It keeps the report of the latest cell only, with a weak reference to IPython's result
    object (never the error itself: its frames hold what ran out of memory).
    """

    def __init__(self, shell: Any) -> None:
        self._shell = shell
        self._last: tuple[Callable[[], Any], OomReport | None] = (lambda: None, None)

    def explain(self, result: Any) -> OomReport | None:
        """Return the report of the cell whose ``result`` this is (None: no OOM)."""
        if result is None:
            return None
        if self._last[0]() is result:
            return self._last[1]
        found = None
        try:  # no error: find_oom(None) is None
            found = report(self._shell, getattr(result, "error_in_exec", None))
        except Exception:  # the user's traceback is already shown; ours must never add one
            log.warning("kerasmagic: could not explain the out-of-memory error", exc_info=True)
        self._last = (weakref.ref(result), found)  # IPython's ExecutionResult takes one
        return found

    def facts(self, result: Any) -> OomFacts | None:
        """Return the record's facts of the cell whose ``result`` this is (None: no OOM)."""
        return found.facts if (found := self.explain(result)) else None

    def after(self, result: Any) -> None:
        """Print the block after an out-of-memory error (``post_run_cell``)."""
        if (found := self.explain(result)) is not None:
            print(found.text)

    def before(self, info: Any) -> None:
        """Drop a stored out-of-memory error before the next cell (``pre_run_cell``), unless
        that cell looks at it (``%debug``, ``%tb``, ``%pdb``).

        Its frames hold the step's data and tensors: under TF's capped CPU allocator the next
        plain ``fit`` of 8,000 rows hung while the error of a fit of 20,000 held 126 MB of 160,
        and ran once it was dropped (``tests/test_oom.py``). A cleanup drops it too.
        """
        stored = getattr(sys, "last_value", None)
        if stored is None or getattr(stored, "outcome", None) is not None:  # none, or isolated
            return
        words = str(getattr(info, "raw_cell", "") or "").split(None, 1)
        if (words and words[0].lstrip("%") in LOOKS) or find_oom(stored) is None:
            return
        try:
            from kerasmagic.cleanup.holders import drop_stored_errors

            drop_stored_errors(self._shell)
            del stored
            gc.collect()  # the frames and what they hold are in cycles
        except Exception:  # the user's cell runs whatever happens here
            log.warning("kerasmagic: could not drop the out-of-memory error", exc_info=True)


LOOKS = frozenset({"debug", "tb", "pdb"})  # magics that read the stored error


def load(state: ShellState) -> Explainer:
    """Register the hooks that explain an out-of-memory error and drop it after."""
    explainer = Explainer(state.shell)
    state.shell.events.register("post_run_cell", explainer.after)
    state.shell.events.register("pre_run_cell", explainer.before)
    return explainer


def unload(state: ShellState, explainer: Explainer) -> None:
    """Remove the hooks."""
    state.shell.events.unregister("post_run_cell", explainer.after)
    state.shell.events.unregister("pre_run_cell", explainer.before)
