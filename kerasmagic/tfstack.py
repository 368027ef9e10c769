"""Record op stack traces as strings, so re-run cells stop feeding TensorFlow's frame cache.

TensorFlow records the Python stack of every op it creates while tracing. Its C++ capture
memoises each stack in a process-wide map keyed by code objects, never emptied; a notebook cell
re-run is a new code object, so every re-run ``fit`` adds ~350 entries (~0.5 MB) that ``gc``
cannot see. ``ops.py`` looks ``tf_stack.extract_stack`` up at call time, so swapping it for a
Python walk that applies TensorFlow's own source maps and filters and hands back a strings-only
trace keeps error messages ("defined at ...") while holding no code object. Trade-off:
``op.traceback`` is built a little slower (~10% more time per traced step).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

_original: Callable[..., Any] | None = None


def _modules() -> tuple[Any, Any, Any] | None:
    """Return (tf_stack, _tf_stack, graph_debug_info_pb2) if they look as expected."""
    tf_stack = sys.modules.get("tensorflow.python.util.tf_stack")
    if tf_stack is None:
        return None
    native = getattr(tf_stack, "_tf_stack", None)
    try:
        from tensorflow.core.framework import graph_debug_info_pb2
    except ImportError:
        return None
    needed = ("_source_mapper_stacks", "_source_filter_stacks", "extract_stack")
    if native is None or not all(hasattr(tf_stack, n) for n in needed):
        return None
    if not hasattr(native, "LoadTracesFromDebugInfo"):
        return None
    return tf_stack, native, graph_debug_info_pb2


def _frames(stacklevel: int, source_map: Any, filtered: Any) -> list[tuple[str, int, str]]:
    """Return (file, line, function) outermost first, as TensorFlow's capture would."""
    frames: list[tuple[str, int, str]] = []
    frame = sys._getframe(2)  # skip _frames and the extract_stack replacement's caller frame
    while frame is not None:
        code = frame.f_code
        filename, lineno = code.co_filename, frame.f_lineno or 0
        if filename not in filtered:
            mapped = source_map.get((filename, lineno)) if source_map else None
            frames.append(mapped if mapped else (filename, lineno, code.co_name))
        frame = frame.f_back  # type: ignore[assignment]
    frames.reverse()
    drop = max(stacklevel - 1, 0)  # our own frame is not in the list
    return frames[: len(frames) - drop] if drop else frames


def _make_extract_stack(tf_stack: Any, native: Any, pb2: Any) -> Callable[..., Any]:
    def extract_stack(stacklevel: int = 1) -> Any:
        key = threading.get_ident()
        mapper = tf_stack._source_mapper_stacks[key][-1]
        filt = tf_stack._source_filter_stacks[key][-1]
        frames = _frames(
            stacklevel, mapper.get_effective_source_map(), filt.get_filtered_filenames()
        )
        info = pb2.GraphDebugInfo()
        index: dict[str, int] = {}
        trace = info.traces["t"]
        for filename, lineno, func in frames:
            if filename not in index:
                index[filename] = len(info.files)
                info.files.append(filename)
            trace.file_line_cols.add(file_index=index[filename], line=lineno, func=func or "")
        return native.LoadTracesFromDebugInfo(info.SerializeToString())["t"]

    return extract_stack


def install() -> str | None:
    """Swap in the string-only capture; return None on success, else why it was not done."""
    global _original
    if _original is not None:
        return None
    found = _modules()
    if found is None:
        return "TensorFlow's tf_stack internals not found; op stack traces left as they are"
    tf_stack, native, pb2 = found
    _original = tf_stack.extract_stack
    tf_stack.extract_stack = _make_extract_stack(tf_stack, native, pb2)
    return None


def uninstall() -> None:
    """Restore TensorFlow's own capture."""
    global _original
    tf_stack = sys.modules.get("tensorflow.python.util.tf_stack")
    if _original is not None and tf_stack is not None:
        setattr(tf_stack, "extract_stack", _original)  # noqa: B010
    _original = None


def installed() -> bool:
    """Return True while the string-only capture is in place."""
    return _original is not None
