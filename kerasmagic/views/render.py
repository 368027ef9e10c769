"""Turn a snapshot, a deep scan and the per-cell history into rows: text in a terminal, HTML
in a notebook; and ``show``, ``%gpu_mem --live/--history/--plot`` (widget, line per cell, table,
plot).
"""

from __future__ import annotations

import html
import io
import os
import re
import weakref
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.display import Image, display

from kerasmagic.backends import LABELS, NAMES, BackendDevice, BackendInfo, unsupported
from kerasmagic.live import CellRecord, LeakVerdict, LiveMonitor, get_monitor
from kerasmagic.snapshot import MemorySnapshot
from kerasmagic.units import fmt_bytes, reserved_text, signed_bytes

if TYPE_CHECKING:
    from kerasmagic.cleanup import CleanupReport
    from kerasmagic.cleanup.holders import LiveModel
    from kerasmagic.compat.registry import Off
    from kerasmagic.probes import Variable

Row = tuple[str, str]
CACHES = {  # a backend's cache -> how a row says it
    "live_arrays": "{} live arrays ({})",
    "compiled": "{} compiled executables",
    "compiled_frames": "{} torch.compile frames",
}
PLOT_MISSING = "kerasmagic: --plot needs matplotlib: pip install 'kerasmagic[plot]'"


def snapshot_rows(snap: MemorySnapshot) -> list[Row]:
    """Return (label, value) rows for every figure in a snapshot."""
    ram, lead, gpu = snap.ram, snap.headline, snap.gpu
    rows = []
    if lead.what == "allocator":  # what runs out leads, NVML's reservation named beside it
        limit = "" if lead.limit_bytes is None else f" of {fmt_bytes(lead.limit_bytes)}"
        source = f" ({lead.limit_label})" if lead.limit_label else ""
        reserved = "" if lead.reserved_bytes is None else f"; {reserved_text(lead.reserved_bytes)}"
        said = f"{lead.label}: {fmt_bytes(lead.used_bytes)}"
        rows.append(("Runs out", f"{said}{limit}{source}{reserved}"))
    peak = max(ram.peak_rss_bytes or 0, ram.rss_bytes)
    host = f"host {fmt_bytes(ram.available_bytes)} free of {fmt_bytes(ram.total_bytes)}"
    rows.append(("RAM", f"RSS {fmt_bytes(ram.rss_bytes)} (peak {fmt_bytes(peak)}); {host}"))
    for d in gpu.devices:
        used = d.process_used_bytes
        mine = d.process_note or "unknown" if used is None else fmt_bytes(used)
        figures = f"{fmt_bytes(d.used_bytes)} / {fmt_bytes(d.total_bytes)} used"
        rows.append((f"GPU {d.cuda_index}", f"{d.name}: {figures}, this kernel {mine}"))
    if gpu.message or not gpu.devices:  # a stale reading says how old it is
        rows.append(("GPU", gpu.message or gpu.status))
    backends = [r for b in snap.backends if b.name != "tensorflow" for r in backend_rows(b)]
    if snap.keras_backend is not None and snap.keras_backend not in NAMES:
        backends.insert(0, ("Backend", unsupported(snap.keras_backend)))
    if snap.backend_named("tensorflow") is not None or not backends:  # TF's, or nothing in use
        backends += [("TF allocator", _tf_text(snap)), ("Graph", _graph_text(snap))]
    keras = [
        _opt(snap.keras.live_models, "live models named in the notebook"),
        _opt(snap.keras.name_counter, "auto-named layers (name counter)"),
    ]
    return [*rows, *backends, ("Keras", ", ".join(k for k in keras if k) or "Keras not imported")]


def _tf_text(snap: MemorySnapshot) -> str:
    if (tf := snap.backend_named("tensorflow")) is None:
        return "TensorFlow not imported"
    if tf.platform is None:
        return "runtime not started yet (no GPU memory taken)"
    devices = [
        f"{d.name} ({(d.kind or 'gpu').upper()}) tensors in use {fmt_bytes(d.in_use_bytes or 0)}"
        f", peak {fmt_bytes(d.peak_bytes or 0)}" + (f" ({d.uncounted})" if d.uncounted else "")
        for d in tf.devices
    ]
    return "; ".join(devices) or no_stats()


def _graph_text(snap: MemorySnapshot) -> str:
    graph = [
        _opt(snap.cache("tensorflow", "default_graph_ops"), "ops in the default graph"),
        _opt(snap.cache("tensorflow", "custom_gradients"), "custom gradients registered"),
        _opt(snap.cache("tensorflow", "functions"), "traced functions"),
    ]
    return ", ".join(g for g in graph if g) or "TensorFlow not imported"


def no_stats() -> str:
    """Say why TensorFlow keeps no allocator figures here, and how to get them."""
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS") == "0":
        why = "TF_ENABLE_ONEDNN_OPTS=0 in this kernel turns its CPU statistics off"
    else:
        why = "TensorFlow keeps CPU statistics only where it turns oneDNN on, by CPU"
    return (
        f"no allocator statistics on this TensorFlow's devices ({why}); "
        "TF_CPU_ALLOCATOR_USE_BFC=true, set before TensorFlow is imported, counts every tensor"
    )


def backend_rows(b: BackendInfo) -> list[Row]:
    """Return the rows of one non-TensorFlow backend: version, devices, caches, notes."""
    label, c = LABELS.get(b.name, b.name), b.caches
    where = "devices not started yet" if b.platform is None else f"on {b.platform.upper()}"
    where += ", Keras's backend" if b.keras else ""
    rows = [(label, f"{b.name} {b.version or '?'} {where}")]
    rows += [(f"{label} {d.name}", _device_text(d)) for d in b.devices]
    arrays = fmt_bytes(c.get("live_array_bytes"))  # format() drops it where unused
    caches = [text.format(c[key], arrays) for key, text in CACHES.items() if key in c]
    rows += [(f"{label} caches", ", ".join(caches))] if caches else []
    return rows + [(f"{label} note", note) for note in b.notes]


def _device_text(d: BackendDevice) -> str:
    figures = {"in use": d.in_use_bytes, "peak": d.peak_bytes, "reserved": d.reserved_bytes}
    figures["limit"] = d.limit_bytes
    shown = [f"{what} {fmt_bytes(n)}" for what, n in figures.items() if n is not None]
    if shown:
        return ", ".join(shown)
    if d.name.lower().startswith("cpu"):
        return "keeps no allocator statistics on the CPU (RSS is the figure here)"
    return "no allocator figures on this device"


def _opt(n: int | None, what: str) -> str | None:
    """Return "1 live model ..." / "3 live models ...": ``what`` is written in the plural."""
    if n == 1:  # its first plural noun made singular: "ops in the ..." -> "op in the ..."
        what = re.sub(r"\b(\w*[^\Ws])s\b", r"\1", what, count=1)
    return None if n is None else f"{n} {what}"


def off_rows(found: Sequence[Off]) -> list[Row]:
    """Return one "Off" row per private structure that did not look as expected."""
    return [
        ("Off", f"{o.reach.consequence} ({o.reach.library} {o.version} {o.found})") for o in found
    ]


_FRAME = re.compile(r"^(sys\.last_\w+ \([^:]+):")  # "sys.last_traceback (train: model)"


def grouped_holders(holders: Sequence[str], remedies: Sequence[str]) -> list[tuple[str, str]]:
    """Return ``(holder, remedy)`` pairs, the stored error's entries as one where the first was.

    A model an error's frames keep is listed once per frame and local (``sys.last_traceback
    (fit: self)``, ``sys.last_value (...)``, ...); two or more are shown once, as "the stored
    error (8 frames)". A single entry stays as it is: it already says where the model is held.
    """
    pairs = [(h, remedies[i] if i < len(remedies) else "") for i, h in enumerate(holders)]
    error = [i for i, h in enumerate(holders) if h.startswith("sys.last_")]
    if len(error) < 2:
        return pairs
    frames = len({m.group(1) for m in map(_FRAME.match, holders) if m is not None})
    name = "the stored error" + (f" ({frames} frame{'s' if frames != 1 else ''})" if frames else "")
    kept = [p for i, p in enumerate(pairs) if i not in error[1:]]
    kept[error[0]] = (name, pairs[error[0]][1])
    return kept


def model_rows(models: Sequence[LiveModel]) -> list[Row]:
    """Return one row per live model: weights, traced graphs (estimated), holders, remedies.

    Keras restarts its names after a reset, so two live models can both be ``sequential``: each
    is told apart by what holds it (``sequential (held as Out[3])``), else by ``#1``, ``#2``.
    """
    if not models:
        return [("models", "no live Keras model")]
    names, labels, texts = Counter(m.name for m in models), [], []
    for m in models:
        pairs = grouped_holders(m.holders, m.remedies)
        labels.append(
            m.name if names[m.name] == 1 or not pairs else f"{m.name} (held as {pairs[0][0]})"
        )
        by_remedy: dict[str, dict[str, None]] = {}  # the holders sharing a remedy, once each
        for holder, remedy in pairs:
            by_remedy.setdefault(remedy, {})[holder] = None
        holders = "; ".join(
            ", ".join(shown) + (f" → {remedy}" if remedy else "")
            for remedy, shown in by_remedy.items()
        )
        size, estimate = f"weights {fmt_bytes(m.size_bytes)}", fmt_bytes(m.estimate_bytes)
        if m.traced_ops:
            size += f" + traced graphs {m.traced_ops:,} ops (≈{estimate}, estimate)"
        verdict = "Free memory frees it" if m.freeable else "kept"
        texts.append(f"{size}; held by {holders} [{verdict}]")
    counts, seen = Counter(labels), Counter[str]()
    for i, label in enumerate(labels):
        if counts[label] > 1:
            seen[label] += 1
            labels[i] = f"{label} #{seen[label]}"
    return [
        (f"{label} ({m.type})", text) for label, m, text in zip(labels, models, texts, strict=True)
    ]


def variable_rows(variables: Sequence[Variable]) -> list[Row]:
    """Return the largest data variables (read-only: kerasmagic never frees them)."""
    rows = [
        (v.name, f"{fmt_bytes(v.size_bytes)} ({v.type}; yours, never freed)") for v in variables
    ]
    return rows or [("data", "no array, DataFrame or tensor in the namespace")]


def freed_row(report: CleanupReport | None) -> list[Row]:
    """Return the measured figure of the last cleanup, per model dropped, if there was one."""
    if report is None or report.dry_run or not report.stale_models:
        return []
    n, each = report.stale_models, fmt_bytes(int(report.freed_bytes / report.stale_models))
    said = f"freed {fmt_bytes(report.freed_bytes)} dropping {n} model{'s' if n != 1 else ''}"
    return [("last cleanup", f"{said} (≈{each} each, measured)")]


class Table:
    """Rows shown as aligned text (``repr``) or an HTML table (``_repr_html_``)."""

    def __init__(self, title: str, rows: Sequence[Row]) -> None:
        self.title, self.rows = title, list(rows)

    def __repr__(self) -> str:
        width = max((len(label) for label, _ in self.rows), default=0)
        return "\n".join(
            [self.title, *(f"  {label:<{width}}  {value}" for label, value in self.rows)]
        )

    def _repr_html_(self) -> str:
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
            f"<td style='text-align:left'>{html.escape(value)}</td></tr>"
            for label, value in self.rows
        )
        return (
            f"<table class='kerasmagic-table'><caption style='text-align:left'><b>"
            f"{html.escape(self.title)}</b></caption>{body}</table>"
        )


# Text that wraps between words in every frontend: JupyterLab and classic Notebook (Colab's)
# draw printed output in a <pre> that breaks lines anywhere (``word-break: break-all``).
WRAPPED = (
    "white-space:pre-wrap;word-break:normal;overflow-wrap:break-word;"
    "font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,13px)"
)


class ReportLine:
    """A short line and its detail: in a notebook, HTML that wraps between words with the
    detail one click away (under the line's ▸, open with ``verbose``); as text, the line, and
    the detail under it with ``verbose``."""

    def __init__(self, line: str, detail: str = "", verbose: bool = False) -> None:
        self.line, self.detail, self.verbose = line, detail, verbose

    def __repr__(self) -> str:
        shown = self.detail if self.verbose else ""
        return "\n".join([self.line, *(f"  {row}" for row in shown.splitlines())])

    def _repr_html_(self) -> str:
        line = html.escape(self.line)
        if not self.detail:
            return f"<div class='kerasmagic-line' style='{WRAPPED}'>{line}</div>"
        return (
            f"<details{' open' if self.verbose else ''} class='kerasmagic-line' style='{WRAPPED}'>"
            f"<summary style='cursor:pointer' title='what the cleanup did: click'>{line}</summary>"
            f"{html.escape(self.detail)}</details>"
        )


# -- the per-cell history: %gpu_mem --live/--history/--plot ----------------------------------
def cell_line(record: CellRecord, verdict: LeakVerdict | None = None) -> str:
    """Return one line: cell, duration, RSS (delta, peak), VRAM, graph, models, warning."""
    end, delta = record.end, record.delta
    parts = [f"[{record.execution_count}] {record.duration_s:.2f}s"]
    parts.append(_figure("RSS", end.ram.rss_bytes, delta.rss_bytes, record.peak_rss_bytes))
    if (gpu := end.gpu_used_bytes) is not None:
        parts.append(_figure("VRAM", gpu, delta.gpu_used_bytes, record.peak_gpu_bytes))
    if (gradients := end.cache("tensorflow", "custom_gradients")) is not None:
        parts.append(f"custom gradients {gradients}")
    if end.keras.live_models is not None:
        parts.append(f"models named {end.keras.live_models}, names {end.keras.name_counter}")
    line = "kerasmagic " + " | ".join(parts)
    if verdict is not None and verdict.growing:
        line += f"\nkerasmagic WARNING:\n{verdict.message}"  # wrapped within 80 columns
    return line


def _figure(what: str, now: int | None, change: int | None, peak: int | None) -> str:
    return f"{what} {fmt_bytes(now)} ({signed_bytes(change)}, peak {fmt_bytes(peak)})"


def plot_png(records: Sequence[CellRecord]) -> bytes:
    """Return a PNG of RSS (end and peak) and VRAM per cell; needs matplotlib."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    cells, mb = [r.execution_count for r in records], 2**20
    fig = Figure(figsize=(7, 3), dpi=90)
    ax = fig.add_subplot()
    ax.plot(cells, [r.end.ram.rss_bytes / mb for r in records], "o-", label="RSS at end")
    ax.plot(cells, [r.peak_rss_bytes / mb for r in records], "x--", label="RSS peak")
    gpu = [r.end.gpu_used_bytes for r in records]
    if any(g is not None for g in gpu):
        ax.plot(cells, [(g or 0) / mb for g in gpu], "s-", label="VRAM at end")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # cells are whole numbers
    ax.set(xlabel="cell (execution count)", ylabel="MB")
    ax.legend(loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


class LinePrinter:
    """Print one line per finished cell (terminal IPython: no widget frontend)."""

    def __init__(self, monitor: LiveMonitor) -> None:
        self._monitor = weakref.ref(monitor)  # the monitor's subscriber list holds us
        self.close = monitor.subscribe(self._on_event)

    def _on_event(self, kind: str, payload: Any) -> None:
        if kind == "cell" and (monitor := self._monitor()) is not None:
            print(cell_line(payload, monitor.verdict()))


def show(shell: Any, *, live: bool, history: bool, plot: bool) -> None:
    """Run the live-monitor options of ``%gpu_mem``: the history's table, its plot, and the
    widget in a kernel (one per kernel: the newest replaces it), else a line per cell."""
    if (monitor := get_monitor(shell)) is None:
        raise UsageError("the live monitor is not running: %load_ext kerasmagic first")
    if history:
        cells = monitor.history()
        rows = [(f"[{r.execution_count}]", cell_line(r).split(" ", 2)[2]) for r in cells]
        title = "kerasmagic: per-cell memory" + (" (cell, duration, end figures)" if rows else "")
        display(Table(title, rows or [("history", "no cell recorded yet")]))
    if plot:
        try:
            display(Image(data=plot_png(monitor.history()), format="png"))
        except ImportError:
            print(PLOT_MISSING)
    if live and getattr(shell, "kernel", None) is not None:
        from kerasmagic.views.widget import LiveWidget

        widget = LiveWidget(monitor)
        if (old := monitor.attach("widget", widget)) is not None:
            old.close()
        display(widget)
    elif live and monitor.view("printer") is None:
        monitor.attach("printer", LinePrinter(monitor))
        print("kerasmagic: printing memory after every cell (no widget frontend here)")
