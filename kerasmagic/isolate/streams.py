"""The child's stdout and stderr, read without blocking by the thread that runs the cell."""

from __future__ import annotations

import codecs
import os
import selectors
import subprocess
import sys
from collections.abc import Callable

from kerasmagic.isolate.tflog import LogFilter

Sink = Callable[[str, bool], None]  # (text, is_stderr)


def to_std_streams(text: str, is_stderr: bool) -> None:
    """Write child output to this process's ``sys.stdout`` / ``sys.stderr`` at once."""
    stream = sys.stderr if is_stderr else sys.stdout
    stream.write(text)
    stream.flush()


class Output:
    """The child's two pipes, read without blocking, decoded, TF log lines dropped."""

    def __init__(self, proc: subprocess.Popen[bytes], sink: Sink, log_level: str | None) -> None:
        self.sink, self.logs = sink, LogFilter(log_level)
        self.selector = selectors.DefaultSelector()
        for pipe, is_stderr in ((proc.stdout, False), (proc.stderr, True)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe.fileno(), selectors.EVENT_READ, is_stderr)
        self.decoders = {f: codecs.getincrementaldecoder("utf-8")("replace") for f in (0, 1)}

    def open(self) -> bool:
        """Return True while a pipe is still open."""
        return bool(self.selector.get_map())

    def read(self, wait_s: float) -> None:
        """Forward what arrives within ``wait_s``."""
        for key, _ in self.selector.select(wait_s):
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self.selector.unregister(key.fd)
            self._emit(self.decoders[key.data].decode(chunk, final=not chunk), key.data)

    def _emit(self, text: str, is_stderr: bool) -> None:
        text = self.logs.feed(text) if is_stderr else text
        if text:
            self.sink(text, is_stderr)

    def close(self) -> None:
        self._emit(self.logs.flush(), True)
        self.selector.close()
