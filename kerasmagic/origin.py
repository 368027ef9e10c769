"""Whose code is this: the user's (a notebook cell, a module of the user's own) or a library's
(an installed package, the standard library). One rule for every part that must tell."""

from __future__ import annotations

import site
import sys
import sysconfig
from functools import lru_cache

_INSTALLED = ("site-packages", "dist-packages")
_STDLIB = sysconfig.get_paths()["stdlib"]


@lru_cache(maxsize=4096)
def library_file(path: str) -> bool:
    """Return whether the file ``path`` belongs to an installed package or the standard library
    (or is no file at all: ``<frozen ...>``, ``<string>``); a notebook cell's is the user's."""
    if path.startswith("<ipython-input-"):
        return False  # a terminal IPython cell
    if path.startswith("<") or path.startswith(_STDLIB) or any(p in path for p in _INSTALLED):
        return True
    prefixes = (sys.base_prefix, sys.prefix, *_site_packages())
    return any(path.startswith(prefix) for prefix in prefixes if prefix)


def _site_packages() -> tuple[str, ...]:
    try:
        return tuple(site.getsitepackages())
    except AttributeError:  # a virtualenv's old site module
        return ()


def user_module(name: object) -> bool:
    """Return whether the module called ``name`` is the user's: ``__main__`` (a notebook) or
    a module imported from a file of the user's, judged without running any module code."""
    if type(name) is not str or name.split(".")[0] in ("builtins", "kerasmagic"):
        return False
    if name == "__main__":
        return True
    module = sys.modules.get(name)
    if module is None:
        return False
    try:  # the module's own dict: a lazy module's __getattr__ never runs
        path = object.__getattribute__(module, "__dict__").get("__file__")
    except Exception:
        return False
    return type(path) is str and not library_file(path)
