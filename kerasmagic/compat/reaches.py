"""Every private structure kerasmagic reads or writes, probed where it runs; never a silent miss.

kerasmagic frees what Keras's own cleanup cannot by reaching into TensorFlow, Keras, IPython
and ipykernel internals (the list is ``registry.REACHES``). Each reach is probed, cheaply and
without importing anything, once the module it lives in is imported: at ``%load_ext``, at
``kerasmagic.reset()`` outside IPython, and again when a framework is imported later
(``watch``). A reach that does not look as expected turns off only the feature that needs it
(the code asks ``works(name)`` first) and is said once, in one line naming the feature, the
version found and the consequence; ``%gpu_mem`` and ``%gpu_mem --json`` list what is off.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kerasmagic.compat.versions import installed

Probe = Callable[[Any], "str | None"]  # given the shell (or None): None, or what differs


@dataclass(frozen=True)
class Reach:
    """One private structure: where it is, what needs it, what is lost without it."""

    name: str  # "keras.global_state"
    library: str  # the distribution whose version is named: "keras", "tensorflow", "ipython"
    module: str  # probed once this module is imported
    structure: str  # what is read or written
    access: str  # "read" or "write"
    feature: str  # what kerasmagic does with it
    consequence: str  # the line's first words when it is off
    verified: str  # the versions CI checks it on
    probe: Probe
    own_line: bool = False  # its feature says its own line when off (not said again here)


@dataclass(frozen=True)
class Off:
    """A reach that did not look as expected: its feature is off."""

    reach: Reach
    version: str | None
    found: str  # what differs, in words ("moved global_state.get_global_attribute")

    @property
    def line(self) -> str:
        """Return the one line said when it is found."""
        reach, version = self.reach, self.version or "(version unknown)"
        return (
            f"kerasmagic: {reach.consequence}: {reach.library} {version} {self.found} "
            f"(checked on {reach.verified})"
        )

    def to_dict(self) -> dict[str, Any]:
        """Return what ``%gpu_mem --json`` lists for it."""
        reach = self.reach
        return {
            "reach": reach.name,
            "structure": reach.structure,
            "feature": reach.feature,
            "consequence": reach.consequence,
            "library": reach.library,
            "version": self.version,
            "found": self.found,
            "line": self.line,
        }


_results: dict[str, Off | None] = {}  # reach name -> its finding (None: as expected)
_lock = threading.Lock()


def _registry() -> tuple[Reach, ...]:
    from kerasmagic.compat.registry import REACHES

    return REACHES


def probe(reach: Reach, shell: Any = None) -> Off | None:
    """Probe one reach now; return what is off, or None when it looks as expected."""
    try:
        found = reach.probe(shell)
    except Exception as exc:  # a probe that fails found a structure it cannot read
        found = f"failed the check ({type(exc).__name__}: {exc})"
    return None if found is None else _with_version(reach, found)


def _with_version(reach: Reach, found: str) -> Off:
    if reach.library == "cpython":
        version: str | None = ".".join(map(str, sys.version_info[:3]))
    elif reach.library == "glibc":
        import platform

        version = platform.libc_ver()[1] or None
    else:
        version = installed(reach.library, reach.module.partition(".")[0])
    return Off(reach, version, found)


def ready(module: str, finished: frozenset[str] = frozenset()) -> bool:
    """Return whether ``module`` and its package are imported and done importing: a module
    still running its code (``import tensorflow`` on the main thread, seen from the sampler's)
    has not defined everything yet, and a probe then would find it "moved". ``finished``: top
    packages whose code has just run (a post-import hook runs before importlib says so)."""
    top = module.partition(".")[0]
    for name in (top, module):
        found = sys.modules.get(name)
        if found is None:
            return False
        if name not in finished and getattr(found.__spec__, "_initializing", False):
            return False
    return True


def check(
    shell: Any = None, again: bool = False, finished: frozenset[str] = frozenset()
) -> list[Off]:
    """Probe every reach whose module is imported and not probed yet (``again``: all of them);
    return the newly found ones that are off."""
    new: list[Off] = []
    for reach in _registry():
        if not ready(reach.module, finished) or (reach.name in _results and not again):
            continue
        if reach.library in ("ipython", "ipykernel") and shell is None:
            continue  # probed against a shell, at %load_ext
        found = probe(reach, shell)
        with _lock:
            before = _results.get(reach.name)
            _results[reach.name] = found
        fresh = before is None or before.found != getattr(found, "found", None)
        if found is not None and fresh and not reach.own_line:
            new.append(found)
    return new


def works(name: str) -> bool:
    """Return whether the reach ``name`` looks as expected (probed now if its module was
    imported since the last check; said once when it does not)."""
    if name not in _results:
        reach = next((r for r in _registry() if r.name == name), None)
        if reach is None:
            raise KeyError(f"kerasmagic names no reach {name!r}")
        if ready(reach.module):
            from kerasmagic.compat import say_once

            found = probe(reach, _current_shell())
            _results[name] = found
            if found is not None and not reach.own_line:
                say_once([found.line])
    return _results.get(name) is None


def broken(name: str, found: str) -> None:
    """Record that kerasmagic found the reach ``name`` not as expected while using it (a
    structure a probe cannot see without a live object); say it once; its feature is off."""
    reach = next(r for r in _registry() if r.name == name)
    if _results.get(name) is not None:
        return
    off = _with_version(reach, found)
    _results[name] = off
    if not reach.own_line:
        from kerasmagic.compat import say_once

        say_once([off.line])


def off() -> list[Off]:
    """Return every reach found off so far, in the registry's order."""
    return [found for r in _registry() if (found := _results.get(r.name)) is not None]


def forget() -> None:
    """Forget every finding (tests; a framework reloaded)."""
    _results.clear()


def _current_shell() -> Any:
    ipython = sys.modules.get("IPython")
    return None if ipython is None else ipython.get_ipython()
