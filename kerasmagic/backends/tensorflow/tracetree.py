"""A tree of stack frames, outermost first, for ``tfstack``: each node a frame of a stack.

A node keeps its frame's ``GraphDebugInfo.FileLineCol`` bytes (its file numbered in the order
the stack meets files, which only depends on the frames above it) and, once an op was created
with exactly that stack, the trace TensorFlow loaded. Stacks share their outer frames, so a new
stack adds only its new inner frames. Keys are strings, ints and line-table bytes, never code
objects. The tree resets itself past ``MAX_NODES`` frames (~300 bytes each).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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
_file_fields: dict[str, bytes] = {}
_tails: dict[object, tuple[str, bytes]] = {}  # entry -> (file, FileLineCol fields but the file)
_pieces: dict[tuple[int, bytes], bytes] = {}  # (file index, tail) -> the frame's field
_grown: dict[tuple[int, str], tuple[dict[str, int], dict[str, int]]] = {}  # -> (files, grown)
_headers: dict[int, tuple[dict[str, int], bytes]] = {}  # id(files) -> (files, encoded list)


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
    key: Sequence[object], missing: int, frames: Callable[[list[int]], Sequence[Frame]]
) -> tuple[Node, list[bytes]]:
    """Add the ``missing`` innermost entries of ``key``; ``frames(positions)`` gives those frames.

    ``frames`` is only asked for entries new to every stack (their lines are computed then).
    Return the node of the whole stack and the pieces of the frames on its path.
    """
    global _nodes
    node, pieces = _root, []
    for entry in reversed(key[missing:]):
        node = node.children[entry]
        pieces.append(node.piece)
    new = key[:missing]
    tails = _tails_of(new, frames)
    for entry, (filename, tail) in zip(reversed(new), reversed(tails), strict=True):
        files = node.files
        index = files.get(filename)
        if index is None:
            files = _with_file(files, filename)
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


def _tails_of(
    entries: Sequence[object], frames: Callable[[list[int]], Sequence[Frame]]
) -> list[tuple[str, bytes]]:
    """Return each entry's file and FileLineCol line and function fields."""
    tails = [_tails.get(entry) for entry in entries]
    wanted = [i for i, tail in enumerate(tails) if tail is None]
    if wanted:
        for i, (filename, lineno, func) in zip(wanted, frames(wanted), strict=True):
            tails[i] = _tails[entries[i]] = (filename, _tail(lineno, func))
    return tails  # type: ignore[return-value]


def _with_file(files: dict[str, int], filename: str) -> dict[str, int]:
    """Return ``files`` with ``filename`` numbered next (one dict per parent and file)."""
    step = (id(files), filename)
    known = _grown.get(step)
    if known is not None and known[0] is files:  # files is kept with it: its id stays its own
        return known[1]
    grown = {**files, filename: len(files)}
    _grown[step] = (files, grown)
    return grown


def encode(node: Node, pieces: Sequence[bytes]) -> bytes:
    """Return a ``GraphDebugInfo`` with one trace ``"t"``: the stack ending at ``node``."""
    return _document(_files(node.files), pieces)


def encode_frames(frames: Sequence[Frame]) -> bytes:
    """Return a ``GraphDebugInfo`` whose trace ``"t"`` is ``frames``, outermost first, written as
    ``encode`` writes a stack (kerasmagic's self-check reads it back through TensorFlow)."""
    files: dict[str, int] = {}
    pieces = []
    for filename, lineno, func in frames:
        index = files.setdefault(filename, len(files))
        pieces.append(_piece(index, _tail(lineno, func)))
    return _document(b"".join(_field(b"\x0a", _utf8(name)) for name in files), pieces)


# GraphDebugInfo's wire format: files = 1, traces = 2 (a map: key 1, value 2); StackTrace's
# file_line_cols = 1; FileLineCol's file_index = 1, line = 2, func = 4 (varints, a string).
def _document(files: bytes, pieces: Sequence[bytes]) -> bytes:
    entry = b"\x0a\x01t" + _field(b"\x12", b"".join(pieces))  # map entry: "t" -> StackTrace
    return files + _field(b"\x12", entry)


def _piece(index: int, tail: bytes) -> bytes:
    return _field(b"\x0a", b"\x08" + _varint(index) + tail)


def _tail(lineno: int, func: str) -> bytes:
    return b"\x10" + _varint(lineno) + _field(b"\x22", _utf8(func or ""))


def clear() -> int:
    """Drop every node; return how many there were."""
    global _root, _nodes
    count, _root, _nodes = _nodes, Node(b"", {}), 0
    for memo in (_file_fields, _tails, _pieces, _grown, _headers):
        memo.clear()
    return count


def _files(files: dict[str, int]) -> bytes:
    known = _headers.get(id(files))
    if known is not None and known[0] is files:
        return known[1]
    out = []
    for name in files:  # in index order: a dict keeps insertion order
        field = _file_fields.get(name)
        if field is None:
            field = _file_fields[name] = _field(b"\x0a", _utf8(name))
        out.append(field)
    header = b"".join(out)
    _headers[id(files)] = (files, header)
    return header


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


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "replace")  # protobuf strings must be valid UTF-8
