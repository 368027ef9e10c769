"""The first process of an isolated run: a guard that forks the worker and outlives it.

Started as ``python -c BOOT ROOT WORKDIR`` (see :data:`BOOT`): the bootstrap drops the working
folder from ``sys.path`` before any import, so a notebook folder holding ``queue.py`` or
``typing.py`` cannot replace the runner's own modules, and imports kerasmagic from ``ROOT``,
where the kernel has it. The guard

- becomes a child subreaper: every orphan of the run (double forks, ``setsid`` escapes) is
  re-parented to it instead of to init, so it stays findable and killable;
- forks the worker, which runs the user's code (``_child.run_worker``) and dies with the guard;
- when the worker ends, kills what it left running, notes it in ``WORKDIR/killed`` and exits
  with the worker's own status (the same signal, when it was killed by one);
- when the kernel dies (its parent changes), kills the whole run, removes ``WORKDIR``, exits.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

# The package comes from ROOT, where the kernel imported it, even when another copy comes first
# on this interpreter's path (an editable install beside a checkout): the child must run the
# kernel's own kerasmagic, whose result it writes. ROOT goes last, after the standard library.
PRELUDE = (
    "import sys\n"
    "if sys.path[:1] == ['']: del sys.path[0]\n"  # before any other import: see above
    "import importlib.util as u\n"
    "p = sys.argv[1] + '/kerasmagic'\n"
    "s = u.spec_from_file_location('kerasmagic', p + '/__init__.py', "
    "submodule_search_locations=[p])\n"
    "sys.modules['kerasmagic'] = m = u.module_from_spec(s)\n"
    "s.loader.exec_module(m)\n"
    "sys.path.append(sys.argv[1])\n"
    "from kerasmagic.isolate._guard import main\n"
)
BOOT = PRELUDE + "main(sys.argv[2])\n"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> None:
    """Call Linux's ``prctl``; do nothing elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _wait(worker: int, parent: int, work: Path) -> int:
    """Return the worker's wait status; clean up and exit if the kernel dies meanwhile."""
    try:
        pidfd: int | None = os.pidfd_open(worker)
    except (AttributeError, OSError):
        pidfd = None
    while True:
        pid, status = os.waitpid(worker, os.WNOHANG)
        if pid:
            return status
        if os.getppid() != parent:
            import shutil

            _end_leftovers()
            shutil.rmtree(work, ignore_errors=True)
            os._exit(70)
        if pidfd is None:
            time.sleep(0.05)
        else:
            select.select([pidfd], [], [], 0.2)


def _end_leftovers() -> list[str]:
    """Kill every remaining descendant (all re-parented here); return them as text."""
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return []  # no child left at all: the common case costs no psutil import
    from kerasmagic.isolate.tree import end_tree

    return end_tree(os.getpid(), None)


def _relay(status: int) -> None:
    """Exit the way the worker did."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def main(workdir: str) -> None:
    """Fork the worker, wait for it, clean up after it, exit with its status."""
    work = Path(workdir)
    parent = int(os.environ.get("KERASMAGIC_PARENT_PID", "0"))
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    if parent and os.getppid() != parent:
        os._exit(70)  # the kernel died before we got here
    guard = os.getpid()
    worker = os.fork()
    if worker == 0:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != guard:
            os._exit(70)
        from kerasmagic.isolate._child import run_worker

        code = run_worker(work)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter teardown: TensorFlow's can take seconds
    (work / "worker").write_text(str(worker))
    status = _wait(worker, parent or os.getppid(), work)
    killed = _end_leftovers()
    if killed:
        (work / "killed").write_text("\n".join(killed))
    _relay(status)
