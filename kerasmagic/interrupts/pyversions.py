"""The Pythons the Ctrl-C code that reads opcodes and frames was checked on; elsewhere it is off.

Raising again a Ctrl-C that a library dropped (``swallowed``) reads the opcode each frame is
at, and raising again one lost in a callback (``lost``) traces a frame opcode by opcode: both
rest on CPython's bytecode and tracing, which change with every minor version. They were
tested on CPython 3.11, 3.12 and 3.13 (tests/test_kernelguard.py, tests/test_trust.py). On any
other Python they stay off, and loading the extension says so in one line: such interrupts are
then left to Python and ipykernel, as without kerasmagic. Holding Ctrl-C around kerasmagic's
own work and the kernel's code (``held``, ``kernelguard``) uses only signal handlers and
stays on.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger(__name__)
CHECKED = ((3, 11), (3, 12), (3, 13))
RUNNING = (sys.implementation.name, sys.version_info[:2])  # the seam tests change
_told = False


def unchecked() -> str | None:
    """Return the line that says what is off on this Python, or None where all is checked."""
    implementation, version = RUNNING
    if implementation == "cpython" and version in CHECKED:
        return None
    newest = ".".join(map(str, CHECKED[-1]))
    return (
        f"kerasmagic: on {implementation} {'.'.join(map(str, version))} a Ctrl-C that a library "
        "swallows or a callback loses is left to Python (raising it again reads opcodes and "
        f"frames, checked on CPython 3.11 to {newest} only)"
    )


def frames_checked() -> bool:
    """Return whether the opcode- and frame-reading code may run; say once if it may not."""
    global _told
    line = unchecked()
    if line is not None and not _told:
        _told = True
        log.warning(line)
    return line is None
