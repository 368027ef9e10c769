"""Record op stack traces as strings, so re-run cells stop feeding TensorFlow's frame cache.

TensorFlow records the Python stack of every op it creates while tracing. Its C++ capture
memoises each deep stack in a process-wide map keyed by code objects, never emptied; a notebook
cell re-run is a new code object, so every re-run ``fit`` adds ~350 entries (~0.5 MB) that ``gc``
cannot see. ``ops.py`` looks ``tf_stack.extract_stack`` up at call time, so it is swapped for a
Python walk that applies TensorFlow's own source maps and filters and hands back a trace made of
strings: no code object is held.

What is recorded: the frames TensorFlow's error messages show as "defined at", the user's
frames. TensorFlow's own frames (its C++ rule: a file under ``tensorflow/python``, Keras's
excepted) are left out, so the message reads as it does natively; and the walk ends at the
notebook cell (``stop_at``: IPython's and kerasmagic's cell runners), leaving out the kernel's
30 to 70 frames above it. ``op.traceback`` is TensorFlow's minus those frames.

Speed (``benchmarks/stack_traces.py``): stacks share their outer frames and many ops share a
whole stack (a layer's ops, a loop, the next model), so traces live in a tree of frames keyed
from the outermost (the tree below); a stack seen before costs one walk of the frames, a new one
only encodes its new inner frames. A frame is keyed by what decides its line (file, function,
first line, line table, last instruction), not by its code object, so line numbers, the slow
part, are only computed for new frames. ``clear_cache()`` (kerasmagic's cleanup calls it)
empties the tree; it also resets itself past ``MAX_NODES`` frames.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from types import CodeType
from typing import Any, TypeVar

from kerasmagic.compat.registry import broken, say_once, works

T = TypeVar("T")
MAX_MAPS = 64  # source maps whose files are remembered (autograph builds one per function)

_original: Callable[..., Any] | None = None
_stops: dict[int, CodeType] = {}  # id -> code whose frames (and those above) are not recorded
_map_files: dict[object, tuple[Any, frozenset[str]]] = {}
_own: dict[str, bool] = {}  # file -> whether it is TensorFlow's own (not recorded)
_lock = threading.RLock()  # re-entrant: a finalizer run inside a capture may create an op
_NO_FILES: frozenset[str] = frozenset()


def _key(frame: Any, drop: int, source_map: Any, filtered: Any, kept: list[Any]) -> list[object]:
    """Return one entry per frame TensorFlow keeps, innermost first, without line numbers.

    TensorFlow drops filtered files, then the ``drop`` innermost frames left; its own frames
    and the kernel's above a notebook cell (``stop_at``) are not recorded. A line follows from
    the code's first line, line table and last instruction, so those stand in for it; frames in
    a source-mapped file are mapped here (the result is the entry), as is the innermost frame
    when every frame is TensorFlow's (a trace is never empty). The frames are appended to
    ``kept``, so that the lines of new ones can be read without another walk.
    """
    __tracebackhide__ = True  # where a Ctrl-C most often lands while TensorFlow traces
    mapped_files = _mapped_files(source_map)
    out: list[object] = []
    append, keep, own, stops = out.append, kept.append, _own.get, _stops
    innermost = None  # recorded if every frame is TensorFlow's: a trace is never empty
    while frame is not None:
        code = frame.f_code
        if id(code) in stops:  # by id: a code object's own hash reads its whole bytecode
            break
        filename = code.co_filename
        if filename not in filtered:
            if drop:
                drop -= 1
            else:
                tensorflows = own(filename)
                if tensorflows is None:  # as TensorFlow's C++ judges user frames
                    path = filename.replace("\\", "/")
                    tensorflows = "tensorflow/python" in path and "keras" not in path
                    tensorflows = _own[filename] = tensorflows and "test.py" not in path
                if not tensorflows:
                    keep(frame)
                    if filename in mapped_files:
                        append(_frame(frame, source_map))
                    else:  # inline: this runs for every frame of every op
                        line = (code.co_firstlineno, code.co_linetable, frame.f_lasti)
                        append((filename, code.co_name, *line))
                elif innermost is None:
                    innermost = frame
        frame = frame.f_back
    if not out and innermost is not None:  # rare: its line, not what stands in for it
        keep(innermost)
        append(_frame(innermost, source_map))
    return out


def _frame(frame: Any, source_map: Any) -> tuple[str, int, str]:
    """Return the (file, line, function) TensorFlow records for ``frame``."""
    code, lineno = frame.f_code, frame.f_lineno or 0
    mapped = source_map.get((code.co_filename, lineno)) if source_map else None
    return mapped or (code.co_filename, lineno, code.co_name)  # type: ignore[no-any-return]


def _memo(table: dict[Any, tuple[Any, T]], owner: Any, key: object, make: Callable[[], T]) -> T:
    """Return ``table[key]``'s value, made by ``make()`` the first time. ``key`` holds
    ``id(owner)``: ``owner`` is kept with the value, so the id stays its own."""
    known = table.get(key)
    if known is None or known[0] is not owner:
        known = table[key] = (owner, make())
    return known[1]


def _mapped_files(source_map: Any) -> Any:
    """Return the files ``source_map`` has lines of (remembered per map: TF builds each once)."""
    if not source_map:
        return _NO_FILES
    files = _memo(
        _map_files, source_map, id(source_map), lambda: frozenset(f for f, _ in source_map)
    )
    while len(_map_files) > MAX_MAPS:
        _map_files.pop(next(iter(_map_files)))
    return files


def _make_extract_stack(
    tf_stack: Any, native: Any, original: Callable[..., Any]
) -> Callable[..., Any]:
    mappers, filters = tf_stack._source_mapper_stacks, tf_stack._source_filter_stacks
    load, ident = native.LoadTracesFromDebugInfo, threading.get_ident

    def extract_stack(stacklevel: int = 1) -> Any:
        __tracebackhide__ = True  # IPython hides it: a Ctrl-C here is shown in TF's own frames
        try:
            return capture(stacklevel + 1)
        except Exception:  # never break model building: TensorFlow's own capture instead
            failed = "kerasmagic: string op stack traces failed; TensorFlow's own are used"
            say_once([failed], exc_info=True)
            return original(stacklevel + 1)  # + this frame

    def capture(stacklevel: int) -> Any:
        __tracebackhide__ = True
        thread = ident()
        source_map = mappers[thread][-1].get_effective_source_map()
        filtered = filters[thread][-1].get_filtered_filenames()
        # TensorFlow's own capture starts in its extract_stack; ours is two frames deep.
        caller, drop = sys._getframe(2), max(stacklevel - 2, 0)
        kept: list[Any] = []
        with _lock:  # one thread at a time in the tree and its memos; clear_cache waits
            key = _key(caller, drop, source_map, filtered, kept)
            node, missing = find(key)
            if missing == 0 and node.trace is not None:
                return node.trace
            leaf, pieces = grow(key, missing, kept, source_map)
            leaf.trace = load(encode(leaf, pieces))["t"][:]  # [:]: keeps user frames
            return leaf.trace

    return extract_stack


def stop_at(code: CodeType) -> None:
    """Record op stacks up to, not including, frames of ``code`` (a notebook cell's runner).

    The kernel's own frames above a cell (runpy, the event loop, IPython's machinery, ~30 to 70
    frames) are the same for every op of every cell; leaving them out of the traces makes each
    op's capture cheaper, and TensorFlow's "defined at" lists shorter.
    """
    _stops[id(code)] = code  # kept, so the id stays its own


def clear_cache() -> int:
    """Forget the remembered traces (ops keep theirs); return how many frames were kept."""
    with _lock:
        _map_files.clear()
        return clear()


def install() -> str | None:
    """Swap in the string-only capture; return None on success, else why it was not done."""
    global _original
    if _original is not None:
        return None
    tf_stack: Any = sys.modules.get("tensorflow.python.util.tf_stack")
    native: Any = getattr(tf_stack, "_tf_stack", None)
    needed = ("_source_mapper_stacks", "_source_filter_stacks", "extract_stack")
    found = all(hasattr(tf_stack, n) for n in needed) and hasattr(native, "LoadTracesFromDebugInfo")
    reaches = ("tf.stack_capture", "tf.debug_info", "cpython.frames")  # off: said by compat
    if not found or not all(works(reach) for reach in reaches):
        return "TensorFlow's tf_stack internals not found; op stack traces left as they are"
    frames = [("a.py", 3, "f"), ("b/é.py", 70_000, "g"), ("a.py", 1, "<module>")]
    traces = native.LoadTracesFromDebugInfo(encode_frames(frames))["t"][:]
    read = [(f.filename, f.lineno, f.name) for f in traces]
    if read != frames:  # this TensorFlow numbers GraphDebugInfo's fields otherwise
        broken("tf.debug_info", "reads GraphDebugInfo bytes differently")
        return "TensorFlow reads GraphDebugInfo differently; op stack traces left as they are"
    _original = tf_stack.extract_stack
    tf_stack.extract_stack = _make_extract_stack(tf_stack, native, _original)
    return None


def uninstall() -> None:
    """Restore TensorFlow's own capture and forget the remembered traces."""
    global _original
    tf_stack = sys.modules.get("tensorflow.python.util.tf_stack")
    if _original is not None and tf_stack is not None:
        setattr(tf_stack, "extract_stack", _original)  # noqa: B010
    _original = None
    clear_cache()


def installed() -> bool:
    """Return True while the string-only capture is in place."""
    return _original is not None


# -- tracetree: A tree of stack frames, outermost first, for ``tfstack``: each node a frame of a
Frame = tuple[str, int, str]

MAX_NODES = 30_000  # a Keras fit's ~280 stacks of ~70 frames share all but a few thousand

_VARINTS = tuple(bytes((i,)) for i in range(128))


class Node:
    """One frame of a stack; its children are the frames it called."""

    __slots__ = ("children", "files", "piece", "trace")

    def __init__(self, piece: bytes, files: dict[str, int]) -> None:
        self.children: dict[object, Node] = {}
        self.piece = piece  # the frame's FileLineCol, as a field of StackTrace
        self.files = files  # file -> index, for this frame and those above it
        self.trace: Any = None  # TensorFlow's StackTrace of the stack ending here


_root = Node(b"", {})
_nodes = 0
_tails: dict[object, tuple[str, bytes]] = {}  # entry -> (file, FileLineCol fields but the file)
_pieces: dict[tuple[int, bytes], bytes] = {}  # (file index, tail) -> the frame's field
_grown: dict[object, tuple[Any, dict[str, int]]] = {}  # -> (files, grown)
_headers: dict[object, tuple[Any, bytes]] = {}  # id(files) -> (files, encoded list)


def find(key: Sequence[object]) -> tuple[Node, int]:
    """Return the deepest node on ``key``'s path (innermost first) and how many entries are left."""
    node, missing = _root, len(key)
    for entry in reversed(key):
        child = node.children.get(entry)
        if child is None:
            break
        node, missing = child, missing - 1
    return node, missing


def grow(
    key: Sequence[object], missing: int, kept: list[Any], source_map: Any
) -> tuple[Node, list[bytes]]:
    """Add the ``missing`` innermost entries of ``key``, whose frames are ``kept`` (``_key``'s).

    Only the frames of entries new to every stack are read (their lines are computed then).
    Return the node of the whole stack and the pieces of the frames on its path.
    """
    global _nodes
    node, pieces = _root, []
    for entry in reversed(key[missing:]):
        node = node.children[entry]
        pieces.append(node.piece)
    new = key[:missing]
    tails = [_tails.get(entry) for entry in new]  # file, and FileLineCol's line and function
    for i in [i for i, tail in enumerate(tails) if tail is None]:
        filename, lineno, func = _frame(kept[i], source_map)
        tails[i] = _tails[new[i]] = (filename, _tail(lineno, func))
    for entry, (filename, tail) in zip(reversed(new), reversed(tails), strict=True):  # type: ignore[misc]
        files = node.files if filename in node.files else _with_file(node.files, filename)
        index = files[filename]
        piece = _pieces.get((index, tail))
        if piece is None:
            piece = _pieces[(index, tail)] = _piece(index, tail)
        node = node.children.setdefault(entry, Node(piece, files))
        pieces.append(node.piece)
    _nodes += missing
    if _nodes > MAX_NODES:
        clear()  # the nodes in hand stay usable; later stacks start a new tree
    return node, pieces


def _with_file(files: dict[str, int], filename: str) -> dict[str, int]:
    """Return ``files`` with ``filename`` numbered next (one dict per parent and file)."""
    return _memo(_grown, files, (id(files), filename), lambda: {**files, filename: len(files)})


def encode(node: Node, pieces: Sequence[bytes]) -> bytes:
    """Return a ``GraphDebugInfo`` with one trace ``"t"``: the stack ending at ``node``."""
    files = node.files
    return _document(_memo(_headers, files, id(files), lambda: _files(files)), pieces)


def encode_frames(frames: Sequence[Frame]) -> bytes:
    """Return a ``GraphDebugInfo`` whose trace ``"t"`` is ``frames``, outermost first, written as
    ``encode`` writes a stack (kerasmagic's self-check reads it back through TensorFlow)."""
    files: dict[str, int] = {}
    pieces = [_piece(files.setdefault(f, len(files)), _tail(n, func)) for f, n, func in frames]
    return _document(_files(files), pieces)


# GraphDebugInfo's wire format: files = 1, traces = 2 (a map: key 1, value 2); StackTrace's
# file_line_cols = 1; FileLineCol's file_index = 1, line = 2, func = 4 (varints, a string).
def _document(files: bytes, pieces: Sequence[bytes]) -> bytes:
    entry = b"\x0a\x01t" + _field(b"\x12", b"".join(pieces))  # map entry: "t" -> StackTrace
    return files + _field(b"\x12", entry)


def _piece(index: int, tail: bytes) -> bytes:
    return _field(b"\x0a", b"\x08" + _varint(index) + tail)


def _tail(lineno: int, func: str) -> bytes:
    return b"\x10" + _varint(lineno) + _field(b"\x22", (func or "").encode("utf-8", "replace"))


def clear() -> int:
    """Drop every node; return how many there were."""
    global _root, _nodes
    count, _root, _nodes = _nodes, Node(b"", {}), 0
    for memo in (_tails, _pieces, _grown, _headers):
        memo.clear()
    return count


def _files(files: dict[str, int]) -> bytes:
    # In index order; protobuf strings must be valid UTF-8.
    return b"".join(_field(b"\x0a", name.encode("utf-8", "replace")) for name in files)


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _VARINTS[value]
    value &= 0xFFFFFFFFFFFFFFFF  # a negative int32 takes ten bytes, two's complement
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload
