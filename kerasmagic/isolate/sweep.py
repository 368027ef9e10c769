"""Many trials, each in its own fresh process, a few at a time; results in submission order."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import fields
from typing import Any

from kerasmagic.isolate.outcome import Outcome, Trial
from kerasmagic.isolate.runner import run_local
from kerasmagic.isolate.streams import Sink, to_std_streams

Call = tuple[tuple[Any, ...], dict[str, Any]]


def as_call(config: Any) -> Call:
    """Return how a config is passed: a dict as keyword arguments, anything else as one argument."""
    if isinstance(config, Mapping):
        return (), dict(config)
    return (config,), {}


def as_trial(outcome: Outcome, index: int, config: Any) -> Trial:
    """Return ``outcome`` as the trial at ``index``."""
    values = {f.name: getattr(outcome, f.name) for f in fields(Outcome)}
    return Trial(**values, index=index, config=config)


class Progress:
    """Counts trials (done / running / failed) and prints one line when the counts change."""

    def __init__(self, total: int, enabled: bool, newline: bool) -> None:
        self.total, self.enabled, self.newline = total, enabled, newline
        self.running = self.done = self.failed = 0
        self._lock = threading.Lock()
        self._shown = ""
        self._start = time.monotonic()

    def started(self) -> None:
        with self._lock:
            self.running += 1

    def finished(self, ok: bool) -> None:
        with self._lock:
            self.running -= 1
            self.done += 1
            self.failed += not ok

    def line(self) -> str:
        """Return the progress line: ``sweep 3/8 done · 2 running · 1 failed``."""
        return (
            f"sweep {self.done}/{self.total} done · {self.running} running · {self.failed} failed"
        )

    def show(self, final: bool = False) -> None:
        """Print the line if it changed (``\\r``-updated, or one line each when output streams)."""
        line = self.line()
        if not self.enabled or (line == self._shown and not final):
            return
        self._shown = line
        elapsed = f" · {time.monotonic() - self._start:.1f} s"
        end = "\n" if self.newline or final else ""
        sys.stdout.write(("" if self.newline else "\r") + line + elapsed + end)
        sys.stdout.flush()


def _captured() -> tuple[list[str], Sink]:
    parts: list[str] = []
    return parts, lambda text, _is_stderr: parts.append(text)


def local_sweep(
    fn: Callable[..., Any],
    configs: Sequence[Any],
    *,
    workers: int,
    timeout_s: float | None,
    gpu_slots: Sequence[str | None],
    progress: Progress,
    stream: bool,
) -> list[Trial]:
    """Run every config in a fresh local process, ``workers`` at a time; Ctrl-C stops them all."""
    stop = threading.Event()
    free = list(gpu_slots)
    lock = threading.Lock()

    def one(index: int, config: Any) -> Trial:
        with lock:
            gpus = free.pop(0)
        parts, capture = _captured()
        progress.started()
        try:
            args, kwargs = as_call(config)
            sink = to_std_streams if stream else capture
            outcome = run_local(
                fn, args, kwargs, timeout_s=timeout_s, gpus=gpus, sink=sink, stop=stop
            )
        except Exception as exc:  # e.g. the config cannot be pickled: this trial fails
            outcome = Outcome("error", error=f"{type(exc).__name__}: {exc}\n")
            outcome.error_type = type(exc).__name__
        finally:
            with lock:
                free.append(gpus)
        outcome.output = "".join(parts)
        progress.finished(outcome.ok)
        return as_trial(outcome, index, config)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kerasmagic-sweep") as pool:
        futures = [pool.submit(one, i, c) for i, c in enumerate(configs)]
        _watch(futures, progress, stop)
    return [_result(f, i, c) for i, (f, c) in enumerate(zip(futures, configs, strict=True))]


def _watch(futures: list[Future[Trial]], progress: Progress, stop: threading.Event) -> None:
    try:
        while wait(futures, timeout=0.2).not_done:
            progress.show()
    except KeyboardInterrupt:
        stop.set()
        for future in futures:
            future.cancel()
        print("\nkerasmagic: sweep interrupted; running trials were killed", file=sys.stderr)
    progress.show(final=True)


def _result(future: Future[Trial], index: int, config: Any) -> Trial:
    if future.cancelled():
        return Trial("interrupted", error="not started", index=index, config=config)
    return future.result()
