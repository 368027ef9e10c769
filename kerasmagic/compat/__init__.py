"""What this environment turns off or lacks, said once in one line each.

``reaches``: the private structures kerasmagic reaches (``registry``), each probed where it
runs. ``versions``: libraries older than kerasmagic is tested with. ``sidebar``: a JupyterLab
kernel whose kerasmagic was installed without its sidebar. Read at ``%load_ext`` and when a
framework is imported later; nothing here imports a framework or touches NVML.
"""

from __future__ import annotations

import logging
from typing import Any

from kerasmagic.compat import reaches
from kerasmagic.compat.sidebar import missing_sidebar
from kerasmagic.compat.versions import too_old

log = logging.getLogger(__name__)
_said: set[str] = set()  # each line once per process, however often the extension loads


FRAMEWORKS = ("tensorflow", "keras", "tf_keras", "jax", "torch")
_watching: list[Any] = []  # the post-import hook, while some shell has the extension loaded


def notes_at_load(shell: Any) -> list[str]:
    """Return the lines ``%load_ext`` says about this environment."""
    lines = [old.line for old in too_old(frameworks=True)]
    lines += [found.line for found in reaches.check(shell)]
    sidebar = missing_sidebar(shell)
    return [*lines, sidebar] if sidebar is not None else lines


def check_now(shell: Any = None, finished: frozenset[str] = frozenset()) -> None:
    """Probe what was imported since the last check and say what is off (``reset()`` outside
    IPython, ``%gpu_mem``, and the post-import hook, for which ``finished`` frameworks are
    done importing although importlib still marks them as importing)."""
    say_once([old.line for old in too_old(frameworks=True)])
    say_once([found.line for found in reaches.check(shell, finished=finished)])


def watch() -> None:
    """Check again each time a framework is imported (until ``unwatch``): once its code has
    run, though importlib still marks it as importing (a framework importing another is not)."""
    if not _watching:
        from kerasmagic.onimport import AfterImport

        hook = AfterImport(FRAMEWORKS, _just_imported, named=True)
        hook.install()
        _watching.append(hook)


def _just_imported(name: str) -> None:
    """A framework's code has just run: check what it holds now (``name`` counts as done)."""
    check_now(finished=frozenset({name}))


def unwatch() -> None:
    """Stop checking at framework imports."""
    while _watching:
        _watching.pop().uninstall()


def say_once(lines: list[str]) -> None:
    """Say each line not said before in this process, one warning each."""
    for line in lines:
        if line not in _said:
            _said.add(line)
            log.warning(line)
