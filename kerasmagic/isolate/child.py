"""What runs in the fresh process: the guard, the worker, and how objects travel both ways.

Started as ``python -c BOOT ROOT WORKDIR``: the bootstrap drops the working folder from
``sys.path`` before any import (a notebook's ``queue.py`` cannot replace the runner's modules)
and imports kerasmagic from ``ROOT``, where the kernel has it. The guard (:func:`main`) is a
child subreaper, so every orphan of the run stays in its tree; it forks the worker, which runs
the user's code and dies with the guard; when the worker ends it kills what was left running,
notes it in ``WORKDIR/killed`` and exits with the worker's status; when the kernel dies it kills
the run, removes ``WORKDIR`` and exits.

The parent writes ``WORKDIR/call`` (a function, its arguments); the worker writes
``WORKDIR/result``: ``("ok", value)`` or ``("error", (type, message, traceback, figures))``.
Objects travel as cloudpickle protocol 5; every buffer above ``THRESHOLD_BYTES`` goes to its own
file, mapped copy-on-write by the reader. Only the standard library is imported at the top.
"""

from __future__ import annotations

import ast
import contextlib
import io
import linecache
import mmap
import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

CELL_FILENAME = "<isolated cell>"
THRESHOLD_BYTES = 1 << 20
TOKEN_VAR = "KERASMAGIC_RUN_TOKEN"  # in the environment of every process of a run

# kerasmagic comes from ROOT (argv[1]), where the kernel imported it, even when another copy
# comes first on this interpreter's path: the child must run the kernel's own copy.
PRELUDE = (  # the working folder leaves sys.path before any other import
    "import sys\nif sys.path[:1] == ['']: del sys.path[0]\nimport importlib.util as u\n"
    "p = sys.argv[1] + '/kerasmagic'\ns = u.spec_from_file_location('kerasmagic', p + "
    "'/__init__.py', submodule_search_locations=[p])\nsys.modules['kerasmagic'] = m = "
    "u.module_from_spec(s)\ns.loader.exec_module(m)\nsys.path.append(sys.argv[1])\n"
    "from kerasmagic.isolate.child import main\n"
)
BOOT = PRELUDE + "main(sys.argv[2])\n"
_PASSED_ENV = ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL", "TF_FORCE_GPU_ALLOW_GROWTH",
               "JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
               "XLA_PYTHON_CLIENT_ALLOCATOR", "PYTORCH_CUDA_ALLOC_CONF")  # fmt: skip


def isolation_env(gpus: str | None) -> dict[str, str]:
    """Return the child's variables: the user's backend and memory settings, else our defaults."""
    env = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    env |= {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONUNBUFFERED": "1"}
    env |= {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
    if "KERAS_BACKEND" not in env and (keras := sys.modules.get("keras")) is not None:
        with contextlib.suppress(Exception):  # a half-imported or stand-in module: no choice
            env["KERAS_BACKEND"] = str(keras.backend.backend())
    env |= {} if gpus is None else {"CUDA_VISIBLE_DEVICES": gpus}
    if gpus == "":
        env.setdefault("JAX_PLATFORMS", "cpu")
    return env


# -- the guard ----------------------------------------------------------------------------------


def prctl(option: int, value: int) -> None:
    """Call Linux's ``prctl``; do nothing elsewhere (reach ``glibc.mallopt``: ctypes)."""
    from kerasmagic.compat.registry import works

    if sys.platform.startswith("linux") and works("glibc.mallopt"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def main(workdir: str) -> None:
    """Fork the worker, wait for it, kill what it left running, exit the way it did."""
    work, guard = Path(workdir), os.getpid()
    parent = int(work.name.split("-")[1])  # the kernel: api.workdir names the folder after it
    prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    if os.getppid() != parent:
        os._exit(70)  # the kernel died before we got here
    if (worker := os.fork()) == 0:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != guard:
            os._exit(70)
        run_worker(work)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # skip interpreter teardown: TensorFlow's can take seconds
    (work / "worker").write_text(str(worker))
    try:
        wake = [os.pidfd_open(worker)]
    except (AttributeError, OSError):
        wake = []
    while not (done := os.waitpid(worker, os.WNOHANG))[0]:
        if os.getppid() != parent:  # the kernel died: end the run, remove its folder
            import shutil

            end_tree(os.getpid(), None)
            shutil.rmtree(work, ignore_errors=True)
            os._exit(70)
        select.select(wake, [], [], 0.2 if wake else 0.05)
    (work / "killed").write_text("\n".join(end_tree(os.getpid(), None)))
    if (code := os.waitstatus_to_exitcode(done[1])) < 0:  # killed by a signal: the same one
        with contextlib.suppress(OSError, ValueError):  # SIGKILL cannot be handled
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(128 - code if code < 0 else code)


def end_tree(root: int | None, token: str | None) -> list[str]:
    """SIGKILL every live process under ``root`` or carrying ``token`` (neither ``root`` nor this
    process), each round stopped before killed; return them as ``["sleep (pid 12)", ...]``."""
    if root == os.getpid():  # the guard: its descendants were all re-parented to it
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return []  # no child left at all: the common case costs no psutil import
    import psutil

    def alive(proc: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):
            return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
        return False

    killed: dict[int, str] = {}
    for _ in range(50):
        found: dict[int, psutil.Process] = {}
        if root is not None:
            with contextlib.suppress(psutil.Error):
                found.update((p.pid, p) for p in psutil.Process(root).children(recursive=True))
        for proc in psutil.process_iter(["environ"]) if token is not None else ():
            if (proc.info.get("environ") or {}).get(TOKEN_VAR) == token:
                found[proc.pid] = proc
        procs = [p for pid, p in found.items() if pid not in (os.getpid(), root) and alive(p)]
        if not procs:
            break
        for proc in procs:  # each named when first found
            with contextlib.suppress(psutil.Error):
                killed.setdefault(proc.pid, f"{proc.name()} (pid {proc.pid})")
                proc.suspend()
            killed.setdefault(proc.pid, f"pid {proc.pid}")
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        deadline = time.monotonic() + 1.0
        while any(alive(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.01)
    return list(killed.values())


# -- the worker ---------------------------------------------------------------------------------


class Shown(str):
    """The text of a value that could not travel back; displays as that text."""

    __repr__ = str.__str__


def error_info(exc: BaseException) -> tuple[str, str, str]:
    """Return ``exc``'s type, message and traceback, without this package's leading frames."""
    tb, here = exc.__traceback__, os.path.dirname(__file__)
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    return type(exc).__qualname__, str(exc), "".join(traceback.format_exception(type(exc), exc, tb))


def exec_cell(source: str, inputs: dict[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
    """Run cell ``source`` with ``inputs`` as globals; return the outputs and the last value."""
    linecache.cache[CELL_FILENAME] = (len(source), None, source.splitlines(True), CELL_FILENAME)
    tree = ast.parse(source, CELL_FILENAME)
    last: Any = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    ns: dict[str, Any] = {"__name__": "__main__", **inputs}
    exec(compile(tree, CELL_FILENAME, "exec"), ns)
    value = last and eval(compile(ast.Expression(last.value), CELL_FILENAME, "eval"), ns)
    if missing := [name for name in outputs if name not in ns]:
        raise NameError(f"the cell did not define the output(s) {', '.join(missing)}")
    value = Shown(repr(value)) if _refusal(value) else value
    return {"outputs": {name: ns[name] for name in outputs}, "value": value}


def answer(read: Callable[[], Any], write: Callable[[Any], Any]) -> Any:
    """Run the ``(fn, args, kwargs)`` that ``read`` returns; return what ``write`` returns of
    ``("ok", value)`` or ``("error", (*error_info, figures))``, the allocator's figures after an
    out-of-memory error (read at once, while the failed step's tensors are alive), or of why the
    result cannot travel."""
    try:
        fn, args, kwargs = read()
        result: Any = "ok", fn(*args, **kwargs)
    except BaseException as exc:  # reported to the parent, never swallowed (SystemExit too)
        figures = None
        with contextlib.suppress(Exception):  # a help: the error goes back whatever happens
            from kerasmagic.backends.oom import find_oom

            if (oom := find_oom(exc)) is not None:
                from kerasmagic.oom.explain import figures_now

                figures = figures_now(oom).to_dict()
        result = "error", (*error_info(exc), figures)
    try:
        return write(result)
    except Exception as exc:
        kind, message, _ = error_info(exc)
        text = f"{kind}: the result could not be sent back: {message}\n"
        return write(("error", (kind, message, text, None)))


def run_worker(work: Path) -> None:
    """Run the call in ``work`` with the kernel's ``sys.path``; write its result."""
    import cloudpickle  # noqa: F401  # the runner's own modules, before the user's path

    runner_path = list(sys.path)
    if (pythonpath := os.environ.pop("KERASMAGIC_PYTHONPATH", None)) is not None:
        os.environ["PYTHONPATH"] = pythonpath  # for the user's own subprocesses
    sys.path[:] = (work / "path").read_text().split("\0")

    def write(result: Any) -> None:
        sys.path[:] = runner_path  # the result is pickled with the runner's own path
        dump(result, work / "result", refuse_tf=True)

    answer(lambda: load(work / "call"), write)


def ray_trial(blob: bytes, env: dict[str, str]) -> tuple[int, bytes]:
    """Run one pickled call on a Ray worker, its environment set first (TF reads it on import)."""
    os.environ.update(env)
    import cloudpickle

    return os.getpid(), answer(lambda: cloudpickle.loads(blob), partial(dumps, refuse_tf=True))


# -- transport ----------------------------------------------------------------------------------


class RefusedObject(TypeError):
    """An object that must not travel back to the kernel (a Keras model, a TF tensor)."""


def _refusal(obj: Any) -> str | None:
    """Return why ``obj`` must not be sent to the kernel, or None."""
    if (keras := sys.modules.get("keras")) is not None and isinstance(obj, keras.Model):
        return (
            f"cannot return a Keras model ({type(obj).__name__}) to the kernel: that would load "
            "TensorFlow there and bring its memory back. Return model.get_weights(), "
            "history.history, metrics, or model.save('m.keras') and return the path."
        )
    if type(obj).__module__.split(".")[0] not in ("keras", "tensorflow", "tf_keras"):
        return None
    return (
        f"cannot return a {type(obj).__module__}.{type(obj).__qualname__} to the kernel: that "
        "would import TensorFlow there. Convert it first (tensor.numpy(), history.history, "
        "model.get_weights())."
    )


def dumps(
    obj: Any, *, refuse_tf: bool = False, buffers: list[pickle.PickleBuffer] | None = None
) -> bytes:
    """Return ``obj`` pickled; buffers above ``THRESHOLD_BYTES`` go to ``buffers`` if given."""
    import cloudpickle

    def in_band(buf: pickle.PickleBuffer) -> bool:
        if buffers is None or buf.raw().nbytes < THRESHOLD_BYTES:
            return True
        buffers.append(buf)
        return False

    class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            if refuse_tf and (why := _refusal(obj)) is not None:
                raise RefusedObject(why)
            return super().reducer_override(obj)

    stream = io.BytesIO()
    Pickler(stream, protocol=5, buffer_callback=in_band).dump(obj)
    return stream.getvalue()


def dump(obj: Any, path: Path, *, refuse_tf: bool = False) -> None:
    """Write ``obj`` to ``path`` and its large buffers to ``path.0``, ``path.1``, ..."""
    buffers: list[pickle.PickleBuffer] = []
    body = dumps(obj, refuse_tf=refuse_tf, buffers=buffers)
    for i, buf in enumerate(buffers):
        Path(f"{path}.{i}").write_bytes(buf.raw())
    Path(path).write_bytes(len(buffers).to_bytes(4, "little") + body)


def load(path: Path) -> Any:
    """Read what :func:`dump` wrote; the buffer files are mapped copy-on-write, then removed."""
    body, buffers = Path(path).read_bytes(), []
    for i in range(int.from_bytes(body[:4], "little")):
        with open(f"{path}.{i}", "rb") as f:  # never empty: at least THRESHOLD_BYTES
            buffers.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY))
        os.unlink(f"{path}.{i}")
    return pickle.loads(memoryview(body)[4:], buffers=buffers)
