"""What runs in the fresh process: the guard, the worker, and how objects travel both ways.

Started as ``python -c BOOT ROOT WORKDIR`` (see :data:`BOOT`): the bootstrap drops the working
folder from ``sys.path`` before any import, so a notebook folder holding ``queue.py`` or
``typing.py`` cannot replace the runner's own modules, and imports kerasmagic from ``ROOT``,
where the kernel has it. The guard (:func:`main`)

- becomes a child subreaper: every orphan of the run (double forks, ``setsid`` escapes) is
  re-parented to it instead of to init, so it stays findable and killable;
- forks the worker (:func:`run_worker`), which runs the user's code and dies with the guard;
- when the worker ends, kills what it left running, notes it in ``WORKDIR/killed`` and exits
  with the worker's own status (the same signal, when it was killed by one);
- when the kernel dies (its parent changes), kills the whole run, removes ``WORKDIR``, exits.

The parent writes ``WORKDIR/call`` (a function, its arguments); the worker writes
``WORKDIR/result``: ``("ok", value)`` or ``("error", (type, message, traceback))``. Objects travel
as cloudpickle, protocol 5: every buffer above ``THRESHOLD_BYTES`` (a numpy array's data) goes
to its own file beside it, which the reader maps copy-on-write, so a 400 MB array never goes
through a pipe and is never copied on the reading side. Only the standard library is imported
at the top: TensorFlow is imported by the user's code, after the environment is in place.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import linecache
import mmap
import os
import pickle
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

ErrorInfo = tuple[str, str, str]  # exception type, message, formatted traceback
Result = tuple[str, Any]
T = TypeVar("T")
CELL_FILENAME = "<isolated cell>"
THRESHOLD_BYTES = 1 << 20
TOKEN_VAR = "KERASMAGIC_RUN_TOKEN"  # in the environment of every process of a run
_ROUNDS = 50
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

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
    "from kerasmagic.isolate.child import main\n"
)
BOOT = PRELUDE + "main(sys.argv[2])\n"

_PASSED_ENV = (
    "KERAS_BACKEND",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "PYTORCH_CUDA_ALLOC_CONF",
    "JAX_PLATFORMS",
)


def _keras_backend() -> str | None:
    """Return the backend of a Keras already imported in this process, else None."""
    keras = sys.modules.get("keras")
    try:
        return str(keras.backend.backend()) if keras is not None else None
    except Exception:  # a half-imported or stand-in module: no choice to pass on
        return None


def isolation_env(gpus: str | None, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Return the variables to set in a child: backend, memory settings, GPUs, quiet TF logs.

    The user's own values win; the defaults are memory growth for TF, no preallocation for
    JAX, TF's C++ logs off, and the backend of the Keras already imported here.
    """
    env = {name: base[name] for name in _PASSED_ENV if name in base}
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONUNBUFFERED"] = "1"
    if "KERAS_BACKEND" not in env and (backend := _keras_backend()) is not None:
        env["KERAS_BACKEND"] = backend
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
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


def end_tree(root: int | None, token: str | None) -> list[str]:
    """SIGKILL every live process under ``root`` or carrying ``token``; return them as text.

    Found as descendants of ``root`` (a guard: a subreaper) and by ``token`` in their initial
    environment, which catches what went to init after the guard died. ``root`` itself and this
    process are spared. Each round stops what it finds before killing it, so nothing can fork
    in between. Returns ``["sleep (pid 12)", ...]``.
    """
    import psutil

    def alive(proc: psutil.Process) -> bool:
        try:
            return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def targets() -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        if root is not None:
            with contextlib.suppress(psutil.Error):
                found.update((p.pid, p) for p in psutil.Process(root).children(recursive=True))
        if token is not None:
            for proc in psutil.process_iter(["environ"]):
                if (proc.info.get("environ") or {}).get(TOKEN_VAR) == token:
                    found[proc.pid] = proc
        for pid in (os.getpid(), root):
            found.pop(pid or 0, None)
        return [p for p in found.values() if alive(p)]

    def label(proc: psutil.Process) -> str:
        try:
            return f"{proc.name()} (pid {proc.pid})"
        except psutil.Error:
            return f"pid {proc.pid}"

    killed: dict[int, str] = {}
    for _ in range(_ROUNDS):
        procs = targets()
        if not procs:
            break
        for proc in procs:
            killed.setdefault(proc.pid, label(proc))
            with contextlib.suppress(psutil.Error):
                proc.suspend()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        deadline = time.monotonic() + 1.0
        while any(alive(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.01)
    return list(killed.values())


# -- the worker ---------------------------------------------------------------------------------


class Shown:
    """The text of a value that could not travel back; displays as that text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def error_info(exc: BaseException) -> ErrorInfo:
    """Return ``exc`` as text, without the leading frames of this package."""
    tb = exc.__traceback__
    here = os.path.dirname(__file__)
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return type(exc).__qualname__, str(exc), text


def oom_figures(exc: BaseException) -> dict[str, Any] | None:
    """Return the allocator's figures if ``exc`` ran out of memory, read now: the failed
    step's tensors are still alive (the kernel sees the process gone, its memory with it)."""
    try:
        from kerasmagic.backends.oom import find_oom

        oom = find_oom(exc)
        if oom is None:
            return None
        from kerasmagic.oom.explain import figures_now

        return figures_now(oom).to_dict()
    except Exception:  # figures are a help: the error itself goes back whatever happens here
        return None


def call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Result:
    """Run ``fn``; return ``("ok", value)`` or ``("error", info)`` (SystemExit included).

    After an out-of-memory error, ``info`` carries the allocator's figures as a fourth item.
    """
    try:
        return "ok", fn(*args, **kwargs)
    except BaseException as exc:  # reported to the parent, never swallowed
        return "error", (*error_info(exc), oom_figures(exc))


def exec_cell(source: str, inputs: dict[str, Any], outputs: Sequence[str]) -> dict[str, Any]:
    """Run cell ``source`` with ``inputs`` as globals; return the outputs and the last value."""
    linecache.cache[CELL_FILENAME] = (len(source), None, source.splitlines(True), CELL_FILENAME)
    tree = ast.parse(source, CELL_FILENAME)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    ns: dict[str, Any] = {"__name__": "__main__", **inputs}
    exec(compile(tree, CELL_FILENAME, "exec"), ns)
    value = None
    if isinstance(last, ast.Expr):
        value = eval(compile(ast.Expression(last.value), CELL_FILENAME, "eval"), ns)
    missing = [name for name in outputs if name not in ns]
    if missing:
        raise NameError(f"the cell did not define the output(s) {', '.join(missing)}")
    if value is not None and _refusal(value) is not None:
        value = Shown(repr(value))
    return {"outputs": {name: ns[name] for name in outputs}, "value": value}


def send(result: Result, write: Callable[..., T]) -> T:
    """Return ``write(result, refuse_tf=True)``; if it cannot travel (a model, unpicklable),
    return ``write`` of why instead."""
    try:
        return write(result, refuse_tf=True)
    except Exception as exc:
        kind, message, _ = error_info(exc)
        text = f"{kind}: the result could not be sent back: {message}\n"
        return write(("error", (kind, message, text)))


def run_worker(work: Path) -> int:
    """Run the call in ``work`` with the kernel's ``sys.path``; write its result."""
    import cloudpickle  # noqa: F401  # the runner's own modules, before the user's path

    runner_path = list(sys.path)
    user_path = json.loads((work / "path").read_text())
    pythonpath = os.environ.pop("KERASMAGIC_PYTHONPATH", None)
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath  # for the user's own subprocesses
    sys.path[:] = user_path
    try:
        fn, args, kwargs = load(work / "call")
        result = call(fn, args, kwargs)
    except BaseException as exc:  # e.g. a module the function needs is missing here
        result = ("error", error_info(exc))
    finally:
        sys.path[:] = runner_path
    send(result, lambda obj, refuse_tf=False: dump(obj, work / "result", refuse_tf=refuse_tf))
    return 0


# -- transport ----------------------------------------------------------------------------------


class RefusedObject(TypeError):
    """An object that must not travel back to the kernel (a Keras model, a TF tensor)."""


def _refusal(obj: Any) -> str | None:
    """Return why ``obj`` must not be sent to the kernel, or None."""
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(obj, keras.Model):
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


def _pickler(stream: io.BytesIO, buffers: list[pickle.PickleBuffer] | None, refuse: bool) -> Any:
    import cloudpickle

    def keep_out_of_band(buf: pickle.PickleBuffer) -> bool:
        if buffers is None or buf.raw().nbytes < THRESHOLD_BYTES:
            return True  # small: stays in the stream
        buffers.append(buf)
        return False

    class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            if refuse and (why := _refusal(obj)) is not None:
                raise RefusedObject(why)
            return super().reducer_override(obj)

    return Pickler(stream, protocol=5, buffer_callback=keep_out_of_band)


def dump(obj: Any, path: Path, *, refuse_tf: bool = False) -> None:
    """Write ``obj`` to ``path`` and its large buffers to ``path.0``, ``path.1``, ..."""
    stream = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []
    _pickler(stream, buffers, refuse_tf).dump(obj)
    for i, buf in enumerate(buffers):
        with open(f"{path}.{i}", "wb") as f:
            f.write(buf.raw())
    with open(path, "wb") as f:
        f.write(len(buffers).to_bytes(4, "little"))
        f.write(stream.getbuffer())


def dumps(obj: Any, *, refuse_tf: bool = False) -> bytes:
    """Return ``obj`` pickled in one piece (for Ray, whose object store moves the bytes)."""
    stream = io.BytesIO()
    _pickler(stream, None, refuse_tf).dump(obj)
    return stream.getvalue()


def _mapped(path: str) -> memoryview:
    """Map ``path`` copy-on-write and unlink it; the mapping lives as long as its users."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) if size else bytearray()
    os.unlink(path)
    return memoryview(data)


def load(path: Path) -> Any:
    """Read what :func:`dump` wrote (and remove the buffer files, which stay mapped)."""
    with open(path, "rb") as f:
        count = int.from_bytes(f.read(4), "little")
        body = f.read()
    buffers = [_mapped(f"{path}.{i}") for i in range(count)]
    return pickle.loads(body, buffers=buffers)
