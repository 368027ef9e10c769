"""The sidebar protocol's envelope and its validation (docs/protocol.md); no comm, no kernel.

Every request is checked against a closed list of fields and message types. What an error
echoes back of the request is clipped, so a huge request never becomes a huge reply.
"""

from __future__ import annotations

from typing import Any

PROTOCOL = 1
REQUESTS = ("snapshot", "history", "free_memory", "scan")
HELLO_FIELDS = frozenset({"protocol", "type"})
FIELDS = frozenset({"protocol", "type", "id"})
MAX_ID_CHARS = 64
MAX_ECHO_CHARS = 200  # of the request's own text, in an error message


def message(kind: str, **fields: Any) -> dict[str, Any]:
    """Return a kernel-to-frontend message of type ``kind``."""
    return {"protocol": PROTOCOL, "type": kind, **fields}


def clip(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """Return ``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def check(data: Any, allowed: tuple[str, ...]) -> str | None:
    """Return why ``data`` is not a valid request of an ``allowed`` type, or None if it is."""
    if not isinstance(data, dict):
        return "a request must be a JSON object"
    hello = allowed == ("hello",)
    fields = HELLO_FIELDS if hello else FIELDS
    extra = sorted(clip(repr(k), 40) for k in set(data) - fields)
    if extra:
        return clip(f"unknown fields [{', '.join(extra)}]; it has only {sorted(fields)}", 400)
    version = data.get("protocol")
    if type(version) is not int or version != PROTOCOL:
        return f"unsupported protocol {clip(repr(version))}; this kernel speaks {PROTOCOL}"
    if data.get("type") not in allowed:
        kind = clip(repr(data.get("type")))
        return f"unknown request type {kind}; expected one of {list(allowed)}"
    if not hello and request_id(data) is None:
        return f"'id' must be a non-empty string of at most {MAX_ID_CHARS} characters"
    return None


def request_id(data: Any) -> str | None:
    """Return the request's ``id`` if it is valid (so it may be echoed), else None."""
    rid = data.get("id") if isinstance(data, dict) else None
    return rid if isinstance(rid, str) and 0 < len(rid) <= MAX_ID_CHARS else None
