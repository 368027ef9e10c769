"""Modules: whose code a file is (the user's, or an installed library's), and a hook that runs
a callback as soon as a module has been imported.

``AfterImport`` sits first in ``sys.meta_path`` and answers only for the modules it names: it
asks the other finders for the real spec and wraps its loader, which runs the module as usual
and then the callback, on whatever thread imported it. The module keeps its real loader.
"""

from __future__ import annotations

import functools
import importlib.abc
import logging
import site
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, cast

_INSTALLED = ("site-packages", "dist-packages")
_STDLIB = sysconfig.get_paths()["stdlib"]


@functools.lru_cache(maxsize=4096)
def library_file(path: str) -> bool:
    """Return whether the file ``path`` belongs to an installed package or the standard library
    (or is no file at all: ``<frozen ...>``, ``<string>``); a notebook cell's is the user's."""
    if path.startswith("<ipython-input-"):
        return False  # a terminal IPython cell
    # a virtualenv's old site module has no getsitepackages
    packages: list[str] = getattr(site, "getsitepackages", list)()
    prefixes = ("<", _STDLIB, sys.base_prefix, sys.prefix, *packages)
    return any(p in path for p in _INSTALLED) or path.startswith(tuple(p for p in prefixes if p))


def user_module(name: object) -> bool:
    """Return whether the module called ``name`` is the user's: ``__main__`` (a notebook) or
    a module imported from a file of the user's, judged without running any module code."""
    if type(name) is not str or name.split(".")[0] in ("builtins", "kerasmagic"):
        return False
    if name == "__main__":
        return True
    try:  # the module's own dict: a lazy module's __getattr__ never runs (None has no dict)
        path = object.__getattribute__(sys.modules.get(name), "__dict__").get("__file__")
    except Exception:
        return False
    return type(path) is str and not library_file(path)


log = logging.getLogger(__name__)


class AfterImport(importlib.abc.MetaPathFinder):
    """Call ``callback()`` right after any of ``names`` is imported (each time it is); with
    ``named``, ``callback(name)``, the module's name."""

    def __init__(
        self, names: Sequence[str], callback: Callable[..., None], named: bool = False
    ) -> None:
        self._names, self._callback, self._named = frozenset(names), callback, named
        self._finding = threading.local()  # the other finders may import: not through us

    def install(self) -> None:
        """Put the hook first in ``sys.meta_path`` (once)."""
        if self not in sys.meta_path:
            sys.meta_path = [self, *sys.meta_path]  # a new list: an import running on another
            # thread goes on through the one it is reading

    def uninstall(self) -> None:
        """Take the hook out of ``sys.meta_path``."""
        if self in sys.meta_path:
            sys.meta_path = [finder for finder in sys.meta_path if finder is not self]

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self._names or getattr(self._finding, "on", False):
            return None
        self._finding.on = True
        try:  # the real spec: the first other finder's
            finds = [getattr(f, "find_spec", None) for f in sys.meta_path if f is not self]
            specs = (find(fullname, path, target) for find in finds if find is not None)
            spec: ModuleSpec | None = next((s for s in specs if s is not None), None)
        finally:
            self._finding.on = False
        if spec is None or spec.loader is None:
            return None
        then = functools.partial(self._callback, fullname) if self._named else self._callback
        spec.loader = _ThenCall(spec.loader, then)
        return spec


class _ThenCall(importlib.abc.Loader):
    """A loader that runs the real one's module, then the callback."""

    def __init__(self, loader: Any, callback: Callable[[], None]) -> None:
        self._loader, self._callback = loader, callback

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return cast("ModuleType | None", self._loader.create_module(spec))

    def exec_module(self, module: ModuleType) -> None:
        __tracebackhide__ = True  # read by IPython: an import's error shows the module's frames
        module.__loader__ = self._loader  # what the module and its spec say: the real loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        try:
            self._callback()
        except Exception:  # a failing hook never breaks the user's import
            log.warning("kerasmagic: a post-import hook failed", exc_info=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
