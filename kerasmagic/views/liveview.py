"""``%gpu_mem --live/--history/--plot``: pick the view (widget, line per cell, table, plot)."""

from __future__ import annotations

import io
import weakref
from collections.abc import Sequence
from typing import Any

from IPython.core.error import UsageError
from IPython.display import Image, display

from kerasmagic.live import CellRecord, LiveMonitor, get_monitor
from kerasmagic.live.leak import LeakVerdict
from kerasmagic.units import fmt_bytes, signed_bytes
from kerasmagic.views.render import Table

PLOT_MISSING = "kerasmagic: --plot needs matplotlib: pip install 'kerasmagic[plot]'"


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
        parts.append(f"models {end.keras.live_models}, names {end.keras.name_counter}")
    line = "kerasmagic " + " | ".join(parts)
    if verdict is not None and verdict.growing:
        line += f"\nkerasmagic WARNING: {verdict.message}"
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
