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
from kerasmagic.units import fmt_bytes, signed_bytes

if TYPE_CHECKING:
    from kerasmagic.cleanup import CleanupReport
    from kerasmagic.cleanup.holders import LiveModel
    from kerasmagic.compat.registry import Off
    from kerasmagic.probes import Variable

Row = tuple[str, str]
PLOT_MISSING = "kerasmagic: --plot needs matplotlib: pip install 'kerasmagic[plot]'"


def _gpu_rows(snap: MemorySnapshot) -> list[Row]:
    if not snap.gpu.devices:
        return [("GPU", snap.gpu.message or snap.gpu.status)]
    rows = []
    for d in snap.gpu.devices:
        mine = (
            d.process_note or "unknown"
            if d.process_used_bytes is None
            else fmt_bytes(d.process_used_bytes)
        )
        rows.append(
            (
                f"GPU {d.cuda_index}",
                f"{d.name}: {fmt_bytes(d.used_bytes)} / "
                f"{fmt_bytes(d.total_bytes)} used, this kernel {mine}",
            )
        )
    if snap.gpu.message:  # a stale reading says how old it is
        rows.append(("GPU", snap.gpu.message))
    return rows


def _tf_row(snap: MemorySnapshot) -> Row:
    tf = snap.backend_named("tensorflow")
    if tf is None:
        return ("TF allocator", "TensorFlow not imported")
    if tf.platform is None:
        return ("TF allocator", "runtime not started yet (no GPU memory taken)")
    if not tf.devices:
        return ("TF allocator", no_stats())
    return (
        "TF allocator",
        "; ".join(
            f"{d.name} ({(d.kind or 'gpu').upper()}) tensors in use "
            f"{fmt_bytes(d.in_use_bytes or 0)}, peak {fmt_bytes(d.peak_bytes or 0)}"
            + (f" ({d.uncounted})" if d.uncounted else "")
            for d in tf.devices
        ),
    )


def _lead_row(snap: MemorySnapshot) -> list[Row]:
    """The headline, where the allocator leads (beside a GPU): what runs out, against its
    limit, and NVML's reservation named as such (``kerasmagic/snapshot.py``)."""
    lead = snap.headline
    if lead.what != "allocator":
        return []
    limit = "" if lead.limit_bytes is None else f" of {fmt_bytes(lead.limit_bytes)}"
    source = f" ({lead.limit_label})" if lead.limit_label else ""
    reserved = (
        ""
        if lead.reserved_bytes is None
        else f"; {fmt_bytes(lead.reserved_bytes)} reserved on the GPU (NVML)"
    )
    return [("Runs out", f"{lead.label}: {fmt_bytes(lead.used_bytes)}{limit}{source}{reserved}")]


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


def _device_text(d: BackendDevice) -> str:
    figures = [
        ("in use", d.in_use_bytes),
        ("peak", d.peak_bytes),
        ("reserved", d.reserved_bytes),
        ("limit", d.limit_bytes),
    ]
    shown = [f"{what} {fmt_bytes(n)}" for what, n in figures if n is not None]
    if shown:
        return ", ".join(shown)
    if d.name.lower().startswith("cpu"):
        return "keeps no allocator statistics on the CPU (RSS is the figure here)"
    return "no allocator figures on this device"


def _cache_text(b: BackendInfo) -> str | None:
    c = b.caches
    parts = []
    if "live_arrays" in c:
        parts.append(f"{c['live_arrays']} live arrays ({fmt_bytes(c.get('live_array_bytes'))})")
    if "compiled" in c:
        parts.append(f"{c['compiled']} compiled executables")
    if "compiled_frames" in c:
        parts.append(f"{c['compiled_frames']} torch.compile frames")
    return ", ".join(parts) or None


def backend_rows(b: BackendInfo) -> list[Row]:
    """Return the rows of one non-TensorFlow backend: version, devices, caches, notes."""
    label = LABELS.get(b.name, b.name)
    where = "devices not started yet" if b.platform is None else f"on {b.platform.upper()}"
    head = f"{b.name} {b.version or '?'} {where}" + (", Keras's backend" if b.keras else "")
    rows = [(label, head)]
    rows += [(f"{label} {d.name}", _device_text(d)) for d in b.devices]
    caches = _cache_text(b)
    if caches:
        rows.append((f"{label} caches", caches))
    rows += [(f"{label} note", note) for note in b.notes]
    return rows


def _backends(snap: MemorySnapshot) -> list[Row]:
    """Rows of the backends in use; TensorFlow's own rows when TF is in use or nothing is."""
    rows = [r for b in snap.backends if b.name != "tensorflow" for r in backend_rows(b)]
    name = snap.keras_backend
    if name is not None and name not in NAMES:
        rows.insert(0, ("Backend", unsupported(name)))
    if snap.backend_named("tensorflow") is not None or not rows:
        rows += [_tf_row(snap), _graph_row(snap)]
    return rows


def _graph_row(snap: MemorySnapshot) -> Row:
    graph = [
        _opt(snap.cache("tensorflow", "default_graph_ops"), "ops in the default graph"),
        _opt(snap.cache("tensorflow", "custom_gradients"), "custom gradients registered"),
        _opt(snap.cache("tensorflow", "functions"), "traced functions"),
    ]
    return ("Graph", ", ".join(g for g in graph if g) or "TensorFlow not imported")


def _opt(n: int | None, what: str) -> str | None:
    """Return "1 live model ..." / "3 live models ...": ``what`` is written in the plural."""
    if n is None:
        return None
    if n == 1:
        noun, _, rest = what.partition(" (")
        words = noun.split(" ")
        for i in range(len(words) - 1, -1, -1):  # the last plural noun: "ops in the ..."
            if words[i].endswith("s") and not words[i].endswith("ss"):
                words[i] = words[i][:-1]
                break
        what = " ".join(words) + (f" ({rest}" if rest else "")
    return f"{n} {what}"


def snapshot_rows(snap: MemorySnapshot) -> list[Row]:
    """Return (label, value) rows for every figure in a snapshot."""
    ram = snap.ram
    peak = max(ram.peak_rss_bytes or 0, ram.rss_bytes)
    keras = [
        _opt(snap.keras.live_models, "live models named in the notebook"),
        _opt(snap.keras.name_counter, "auto-named layers (name counter)"),
    ]
    return [
        *_lead_row(snap),
        (
            "RAM",
            f"RSS {fmt_bytes(ram.rss_bytes)} (peak {fmt_bytes(peak)}); host "
            f"{fmt_bytes(ram.available_bytes)} free of {fmt_bytes(ram.total_bytes)}",
        ),
        *_gpu_rows(snap),
        *_backends(snap),
        ("Keras", ", ".join(k for k in keras if k) or "Keras not imported"),
    ]


def off_rows(found: Sequence[Off]) -> list[Row]:
    """Return one "Off" row per private structure that did not look as expected."""
    return [
        ("Off", f"{o.reach.consequence} ({o.reach.library} {o.version} {o.found})") for o in found
    ]


STORED_ERROR = "sys.last_"
_FRAME = re.compile(r"^(sys\.last_\w+ \([^:]+):")  # "sys.last_traceback (train: model)"


def grouped_holders(holders: Sequence[str], remedies: Sequence[str]) -> list[tuple[str, str]]:
    """Return ``(holder, remedy)`` pairs, the stored error's entries as one where the first was.

    A model an error's frames keep is listed once per frame and local (``sys.last_traceback
    (fit: self)``, ``sys.last_value (...)``, ...); two or more are shown once, as "the stored
    error (8 frames)". A single entry stays as it is: it already says where the model is held.
    """
    pairs = [(h, remedies[i] if i < len(remedies) else "") for i, h in enumerate(holders)]
    error = [i for i, h in enumerate(holders) if h.startswith(STORED_ERROR)]
    if len(error) < 2:
        return pairs
    frames = len({m.group(1) for m in map(_FRAME.match, holders) if m is not None})
    name = "the stored error" + (f" ({frames} frame{'s' if frames != 1 else ''})" if frames else "")
    kept = [p for i, p in enumerate(pairs) if i not in error[1:]]
    kept[error[0]] = (name, pairs[error[0]][1])
    return kept


def holder_text(holders: Sequence[str], remedies: Sequence[str]) -> str:
    """Return the holders, those sharing a remedy together: ``Out[3], _, _3 → Free memory ...``."""
    by_remedy: dict[str, list[str]] = {}
    for holder, remedy in grouped_holders(holders, remedies):
        shown = by_remedy.setdefault(remedy, [])
        if holder not in shown:
            shown.append(holder)
    return "; ".join(
        ", ".join(shown) + (f" → {remedy}" if remedy else "") for remedy, shown in by_remedy.items()
    )


def model_labels(models: Sequence[LiveModel]) -> list[str]:
    """Return each model's name, told apart from another of the same name by what holds it.

    Keras restarts its names after a reset, so two live models can both be ``sequential``:
    ``sequential (held as model)``, ``sequential (held as Out[3])``, else ``#1``, ``#2``.
    """
    names = Counter(m.name for m in models)
    labels = []
    for m in models:
        pairs = grouped_holders(m.holders, m.remedies)
        unique = names[m.name] == 1 or not pairs
        labels.append(m.name if unique else f"{m.name} (held as {pairs[0][0]})")
    counts, seen = Counter(labels), Counter[str]()
    for i, label in enumerate(labels):
        if counts[label] > 1:
            seen[label] += 1
            labels[i] = f"{label} #{seen[label]}"
    return labels


def model_rows(models: Sequence[LiveModel]) -> list[Row]:
    """Return one row per live model: weights, traced graphs (estimated), holders, remedies."""
    if not models:
        return [("models", "no live Keras model")]
    labels = model_labels(models)
    return [
        (f"{label} ({m.type})", _model_text(m)) for label, m in zip(labels, models, strict=True)
    ]


def _model_text(m: LiveModel) -> str:
    size = f"weights {fmt_bytes(m.size_bytes)}"
    if m.traced_ops:
        size += f" + traced graphs {m.traced_ops:,} ops (≈{fmt_bytes(m.estimate_bytes)}, estimate)"
    holders = holder_text(m.holders, m.remedies)
    verdict = "Free memory frees it" if m.freeable else "kept"
    return f"{size}; held by {holders} [{verdict}]"


def variable_rows(variables: Sequence[Variable]) -> list[Row]:
    """Return the largest data variables (read-only: kerasmagic never frees them)."""
    if not variables:
        return [("data", "no array, DataFrame or tensor in the namespace")]
    return [
        (v.name, f"{fmt_bytes(v.size_bytes)} ({v.type}; yours, never freed)") for v in variables
    ]


def freed_row(report: CleanupReport | None) -> list[Row]:
    """Return the measured figure of the last cleanup, per model dropped, if there was one."""
    if report is None or report.dry_run or not report.stale_models:
        return []
    each = report.freed_bytes / report.stale_models
    text = (
        f"freed {fmt_bytes(report.freed_bytes)} dropping {report.stale_models} "
        f"model{'s' if report.stale_models != 1 else ''} (≈{fmt_bytes(int(each))} each, measured)"
    )
    return [("last cleanup", text)]


class Table:
    """Rows shown as aligned text (``repr``) or an HTML table (``_repr_html_``)."""

    def __init__(self, title: str, rows: Sequence[Row]) -> None:
        self.title = title
        self.rows = list(rows)

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
        tag = "<details open" if self.verbose else "<details"
        return (
            f"{tag} class='kerasmagic-line' style='{WRAPPED}'><summary style='cursor:pointer'"
            f" title='what the cleanup did: click'>{line}</summary>{html.escape(self.detail)}"
            "</details>"
        )


# -- the per-cell history: %gpu_mem --live/--history/--plot ----------------------------------
def cell_line(record: CellRecord, verdict: LeakVerdict | None = None) -> str:
    """Return one line: cell, duration, RSS (delta, peak), VRAM, graph, models, warning."""
    end, delta = record.end, record.delta
    parts = [
        f"[{record.execution_count}] {record.duration_s:.2f}s",
        f"RSS {fmt_bytes(end.ram.rss_bytes)} ({signed_bytes(delta.rss_bytes)}, "
        f"peak {fmt_bytes(record.peak_rss_bytes)})",
    ]
    if end.gpu_used_bytes is not None:
        parts.append(
            f"VRAM {fmt_bytes(end.gpu_used_bytes)} ({signed_bytes(delta.gpu_used_bytes)}, "
            f"peak {fmt_bytes(record.peak_gpu_bytes)})"
        )
    gradients = end.cache("tensorflow", "custom_gradients")
    if gradients is not None:
        parts.append(f"custom gradients {gradients}")
    if end.keras.live_models is not None:
        parts.append(f"models named {end.keras.live_models}, names {end.keras.name_counter}")
    line = "kerasmagic " + " | ".join(parts)
    if verdict is not None and verdict.growing:
        line += f"\nkerasmagic WARNING:\n{verdict.message}"  # wrapped within 80 columns
    return line


def history_table(records: Sequence[CellRecord]) -> Table:
    """Return the per-cell history as a two-column table (newest last)."""
    if not records:
        return Table("kerasmagic: per-cell memory", [("history", "no cell recorded yet")])
    rows = [(f"[{r.execution_count}]", cell_line(r).split(" ", 2)[2]) for r in records]
    return Table("kerasmagic: per-cell memory (cell, duration, end figures)", rows)


def plot_png(records: Sequence[CellRecord]) -> bytes:
    """Return a PNG of RSS (end and peak) and VRAM per cell; needs matplotlib."""
    from matplotlib.figure import Figure

    cells = [r.execution_count for r in records]
    fig = Figure(figsize=(7, 3), dpi=90)
    ax = fig.add_subplot()
    ax.plot(cells, [r.end.ram.rss_bytes / 2**20 for r in records], "o-", label="RSS at end")
    ax.plot(cells, [r.peak_rss_bytes / 2**20 for r in records], "x--", label="RSS peak")
    gpu = [r.end.gpu_used_bytes for r in records]
    if any(g is not None for g in gpu):
        ax.plot(cells, [(g or 0) / 2**20 for g in gpu], "s-", label="VRAM at end")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # cells are whole numbers
    ax.set_xlabel("cell (execution count)")
    ax.set_ylabel("MB")
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
        monitor = self._monitor()
        if kind == "cell" and monitor is not None:
            print(cell_line(payload, monitor.verdict()))


def start_live(shell: Any, monitor: LiveMonitor) -> Any:
    """Display the widget in a kernel, else print one line per cell from now on."""
    if getattr(shell, "kernel", None) is not None:
        from kerasmagic.views.widget import LiveWidget

        widget = LiveWidget(monitor)
        old = monitor.attach("widget", widget)
        if old is not None:  # one live widget per kernel: the newest display replaces it
            old.close()
        display(widget)
        return widget
    printer = monitor.view("printer")
    if printer is None:
        printer = LinePrinter(monitor)
        monitor.attach("printer", printer)
        print("kerasmagic: printing memory after every cell (no widget frontend here)")
    return printer


def show(shell: Any, *, live: bool, history: bool, plot: bool) -> None:
    """Run the live-monitor options of ``%gpu_mem``."""
    monitor = get_monitor(shell)
    if monitor is None:
        raise UsageError("the live monitor is not running: %load_ext kerasmagic first")
    if history:
        display(history_table(monitor.history()))
    if plot:
        try:
            display(Image(data=plot_png(monitor.history()), format="png"))
        except ImportError:
            print(PLOT_MISSING)
    if live:
        start_live(shell, monitor)
