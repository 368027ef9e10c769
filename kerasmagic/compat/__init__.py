"""What this environment turns off or lacks, said once in one line each.

``versions``: libraries older than kerasmagic is tested with. ``sidebar``: a JupyterLab kernel
whose kerasmagic was installed without its sidebar. Read at ``%load_ext``; nothing here imports
a framework or touches NVML.
"""

from __future__ import annotations

import logging
from typing import Any

from kerasmagic.compat.sidebar import missing_sidebar
from kerasmagic.compat.versions import too_old

log = logging.getLogger(__name__)
_said: set[str] = set()  # each line once per process, however often the extension loads


def notes_at_load(shell: Any) -> list[str]:
    """Return the lines ``%load_ext`` says about this environment."""
    lines = [old.line for old in too_old(frameworks=True)]
    sidebar = missing_sidebar(shell)
    return [*lines, sidebar] if sidebar is not None else lines


def say_once(lines: list[str]) -> None:
    """Say each line not said before in this process, one warning each."""
    for line in lines:
        if line not in _said:
            _said.add(line)
            log.warning(line)
