"""The sidebar protocol (docs/protocol.md): its envelope and the validation of requests; no comm,
no kernel. What an error echoes of a request is clipped. The frontend's types of the data on the
wire are generated from kerasmagic's dataclasses by ``labextension/wire.py``.
"""

from __future__ import annotations

import reprlib
from typing import Any

PROTOCOL = 3  # 3: a cleanup report's allocator_freed_bytes, of allocator_backend
REQUESTS = ("snapshot", "history", "free_memory", "scan")
FIELDS = frozenset({"protocol", "type", "id"})
MAX_ID_CHARS = 64
SHORT = reprlib.Repr()  # 3.11's takes no keyword arguments
SHORT.maxlevel, SHORT.maxdict, SHORT.maxlist, SHORT.maxstring, SHORT.maxother = 3, 4, 4, 60, 60


def message(kind: str, **fields: Any) -> dict[str, Any]:
    """Return a kernel-to-frontend message of type ``kind``."""
    return {"protocol": PROTOCOL, "type": kind, **fields}


def clip(text: str, limit: int = 200) -> str:
    """Return ``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def brief(value: Any) -> str:
    """Return a short ``repr`` of a request's value: a huge or deep one is described, never
    expanded (``repr`` of a 5,000-digit integer raises, of a deep list recurses)."""
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


def check(data: Any, allowed: tuple[str, ...] = REQUESTS) -> str | None:
    """Return why ``data`` is not a valid request of an ``allowed`` type, or None if it is."""
    if not isinstance(data, dict):
        return "a request must be a JSON object"
    hello = allowed == ("hello",)
    fields = FIELDS - {"id"} if hello else FIELDS
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
    """Return the request's ``id`` if it may be echoed, else None: a short string that can go
    back on the wire (a lone surrogate, ``"\\ud800"``, cannot be UTF-8)."""
    rid = data.get("id") if isinstance(data, dict) else None
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_ID_CHARS:
        return None
    return None if any("\ud800" <= c <= "\udfff" for c in rid) else rid
