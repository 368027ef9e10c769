"""The sidebar protocol (docs/protocol.md): its envelope, the validation of requests and the data
types on the wire; no comm, no kernel.

Every request is checked against a closed list of fields and message types. What an error
echoes back of the request is clipped, so a huge request never becomes a huge reply.

``python -m kerasmagic.views.protocol > labextension/src/wire.ts`` writes the TypeScript
interfaces the frontend compiles against, generated from the Python dataclasses (and the
backends' ``LABELS``, so both sides name a backend alike); a test fails when the committed file
and this output differ, so the two sides cannot drift. ``EXTRA`` holds what ``to_dict`` or the
comm adds beside a dataclass's own fields (a ``?`` marks what older kernels do not send).
"""

from __future__ import annotations

import dataclasses
import reprlib
import types
import typing
from typing import Any

from kerasmagic.backends import LABELS, BackendDevice, BackendInfo
from kerasmagic.cleanup import CleanupReport
from kerasmagic.cleanup.holders import LiveModel
from kerasmagic.live.leak import CellRecord, LeakVerdict
from kerasmagic.oom.explain import OomFacts
from kerasmagic.probes import GpuDevice, GpuInfo, KerasInfo, RamInfo, Variable
from kerasmagic.snapshot import Headline, MemorySnapshot, SnapshotDelta

PROTOCOL = 3  # 3: a cleanup report's allocator_freed_bytes, of allocator_backend
REQUESTS = ("snapshot", "history", "free_memory", "scan")
HELLO_FIELDS = frozenset({"protocol", "type"})
FIELDS = frozenset({"protocol", "type", "id"})
MAX_ID_CHARS = 64
MAX_ECHO_CHARS = 200  # of the request's own text, in an error message
SHORT = reprlib.Repr()  # 3.11's takes no keyword arguments
SHORT.maxlevel, SHORT.maxdict, SHORT.maxlist, SHORT.maxstring, SHORT.maxother = 3, 4, 4, 60, 60


def message(kind: str, **fields: Any) -> dict[str, Any]:
    """Return a kernel-to-frontend message of type ``kind``."""
    return {"protocol": PROTOCOL, "type": kind, **fields}


def clip(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """Return ``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def brief(value: Any) -> str:
    """Return a short ``repr`` of a request's value, whatever it holds: a huge or deep value is
    described, never expanded (``repr`` of a 5,000-digit integer raises, of a deep list recurses).
    """
    if type(value) is int and value.bit_length() > 256:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        return clip(SHORT.repr(value))
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"


def failure(what: str, exc: BaseException) -> str:
    """Return a one-line error text for ``exc``, raised while ``what``."""
    try:
        text = str(exc)
    except Exception:  # an exception whose ``__str__`` fails still gets a line
        text = ""
    return clip(" ".join(f"{what}: {type(exc).__name__}: {text}".split()))


def check(data: Any, allowed: tuple[str, ...]) -> str | None:
    """Return why ``data`` is not a valid request of an ``allowed`` type, or None if it is."""
    if not isinstance(data, dict):
        return "a request must be a JSON object"
    hello = allowed == ("hello",)
    fields = HELLO_FIELDS if hello else FIELDS
    extra = sorted(clip(brief(k), 40) for k in set(data) - fields)
    if extra:
        return clip(f"unknown fields [{', '.join(extra)}]; it has only {sorted(fields)}", 400)
    version = data.get("protocol")
    if type(version) is not int or version != PROTOCOL:
        return f"unsupported protocol {brief(version)}; this kernel speaks {PROTOCOL}"
    if data.get("type") not in allowed:
        return f"unknown request type {brief(data.get('type'))}; expected one of {list(allowed)}"
    if not hello and request_id(data) is None:
        return f"'id' must be a non-empty UTF-8 string of at most {MAX_ID_CHARS} characters"
    return None


def request_id(data: Any) -> str | None:
    """Return the request's ``id`` if it is valid (so it may be echoed), else None: a short
    string that can go back on the wire (a lone surrogate, ``"\\ud800"``, cannot be UTF-8)."""
    rid = data.get("id") if isinstance(data, dict) else None
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_ID_CHARS:
        return None
    try:
        rid.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return rid


# -- the data types: dataclass -> TypeScript interface, in the order the file declares them ------
WIRE: tuple[tuple[type, str], ...] = (
    (RamInfo, "IRamInfo"),
    (GpuDevice, "IGpuDevice"),
    (GpuInfo, "IGpuInfo"),
    (BackendDevice, "IBackendDevice"),
    (BackendInfo, "IBackendInfo"),
    (KerasInfo, "IKerasInfo"),
    (Headline, "IHeadline"),
    (MemorySnapshot, "ISnapshot"),
    (SnapshotDelta, "ISnapshotDelta"),
    (OomFacts, "IOomFacts"),
    (CellRecord, "ICellRecord"),
    (LeakVerdict, "ILeakVerdict"),
    (CleanupReport, "ICleanupReport"),
    (LiveModel, "ILiveModel"),
    (Variable, "IVariable"),
)
EXTRA: dict[type, dict[str, str]] = {
    MemorySnapshot: {
        "version": "number",
        "headline?": "IHeadline",  # the figure every view leads with (kerasmagic/snapshot.py)
    },
    CellRecord: {"warning?": "string | null"},  # added by the comm to history records
    LeakVerdict: {"freed_since?": "boolean"},  # added by the comm
}
HEADER = (
    "// Generated by `python -m kerasmagic.views.protocol > labextension/src/wire.ts`: the\n"
    "// sidebar protocol's data types (docs/protocol.md), from kerasmagic's dataclasses.\n"
    "// Do not edit: change the dataclass and run the command again.\n"
)


def ts_type(hint: Any) -> str:
    """Return the TypeScript type of a Python annotation (as it goes through ``json``)."""
    names = {cls: name for cls, name in WIRE}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in names:
        return names[hint]
    simple = {int: "number", float: "number", str: "string", bool: "boolean"}
    if hint in simple:
        return simple[hint]
    if hint is type(None):
        return "null"
    if hint is Any:
        return "unknown"
    if origin in (types.UnionType, typing.Union):
        return " | ".join(ts_type(arg) for arg in args)
    if origin is typing.Literal:
        return " | ".join(f"'{arg}'" for arg in args)
    if origin in (tuple, list):
        items = [a for a in args if a is not Ellipsis]
        if origin is tuple and len(items) > 1 and Ellipsis not in args:
            return f"[{', '.join(ts_type(a) for a in items)}]"
        inner = ts_type(items[0]) if items else "unknown"
        return f"({inner})[]" if " " in inner else f"{inner}[]"
    if origin in (dict, typing.get_origin(typing.Mapping[str, int])):
        return f"{{ [key: string]: {ts_type(args[1])} }}"
    raise TypeError(f"no TypeScript type for {hint!r}")


def fields(cls: type) -> dict[str, str]:
    """Return ``{field: TypeScript type}`` of what ``cls`` puts on the wire."""
    known = {c.__name__: c for c, _ in WIRE}  # names a module imports for type checking only
    hints = typing.get_type_hints(cls, localns=known)
    own = {f.name: ts_type(hints[f.name]) for f in dataclasses.fields(cls)}
    return {**own, **EXTRA.get(cls, {})}


def typescript() -> str:
    """Return the whole generated TypeScript file."""
    blocks = [HEADER]
    for cls, name in WIRE:
        lines = [f"/** `{cls.__module__}.{cls.__name__}` on the wire. */"]
        lines.append(f"export interface {name} {{")
        lines += [f"  {field}: {kind};" for field, kind in fields(cls).items()]
        blocks.append("\n".join([*lines, "}\n"]))
    labels = ", ".join(f"{name}: '{label}'" for name, label in LABELS.items())
    blocks.append(
        "/** `kerasmagic.backends.LABELS`: each backend's name as the views write it. */\n"
        f"export const BACKEND_LABELS: {{ [name: string]: string }} = {{ {labels} }};\n"
    )
    return "\n".join(blocks)


if __name__ == "__main__":
    print(typescript(), end="")
