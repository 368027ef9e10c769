"""Drop TensorFlow's C++ log lines from a child's stderr, as ``TF_CPP_MIN_LOG_LEVEL`` asks.

TensorFlow 2.16+ logs through absl, and the lines written before ``absl::InitializeLog()`` (the
oneDNN notice, ``cpu_feature_guard``) ignore ``TF_CPP_MIN_LOG_LEVEL``. They share one format,
``I0000 00:00:1796099673.497028    9428 port.cc:153] ...``, so the runner filters them out of the
stream by severity. Everything else, ``\\r`` progress updates included, passes untouched.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\s:]+:\d+\] ")
_ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called"
_CONTINUED = "To enable the following instructions:"  # second line of cpu_feature_guard's notice
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}


class LogFilter:
    """Feed stderr text in; get it back without the TF log lines below ``min_level``."""

    def __init__(self, min_level: str | None) -> None:
        try:
            self.min_level = int(min_level or 0)
        except ValueError:
            self.min_level = 0
        self._tail = ""
        self._dropped_last = False

    def _keep(self, line: str) -> bool:
        found = _LINE.match(line)
        if found is not None:
            drop = _SEVERITY[found.group(1)] < self.min_level
        elif line.startswith(_ABSL_NOTICE):
            drop = self.min_level >= 1
        else:
            drop = self._dropped_last and line.startswith(_CONTINUED)
        self._dropped_last = drop
        return not drop

    def feed(self, text: str) -> str:
        """Return what can be shown of ``text`` now; an unfinished line waits for its end."""
        if self.min_level <= 0:
            return text
        lines = (self._tail + text).splitlines(keepends=True)
        self._tail = lines.pop() if lines and not lines[-1].endswith(("\n", "\r")) else ""
        if self._tail and not self._could_be_log(self._tail):
            lines.append(self._tail)
            self._tail = ""
        return "".join(line for line in lines if self._keep(line))

    def _could_be_log(self, text: str) -> bool:
        starts_log = re.match(r"[IWEF]\d", text) is not None
        return starts_log or _ABSL_NOTICE.startswith(text) or text.startswith(_ABSL_NOTICE)

    def flush(self) -> str:
        """Return the unfinished line still held back (at the end of the run)."""
        tail, self._tail = self._tail, ""
        return tail if tail and self._keep(tail) else ""
