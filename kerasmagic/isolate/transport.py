"""Move Python objects between processes: cloudpickle, with large buffers in memory-mapped files.

Pickle protocol 5 hands every large contiguous buffer (a numpy array's data) to a callback
instead of copying it into the stream. Those above ``threshold_bytes`` are written to their own
file in ``/dev/shm`` (RAM-backed) and the reader maps them copy-on-write, so a 400 MB array never
goes through a pipe and is never copied on the reading side.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

THRESHOLD_BYTES = 1 << 20
_SHM = Path("/dev/shm")


class RefusedObject(TypeError):
    """An object that must not travel back to the kernel (a Keras model, a TF tensor)."""


def workdir() -> Path:
    """Return a fresh private directory, in ``/dev/shm`` when it is usable.

    Its name carries this process's pid; directories of dead owners (a kernel killed mid-cell)
    are removed on the way.
    """
    base = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else Path(tempfile.gettempdir())
    remove_stale(base)
    return Path(tempfile.mkdtemp(prefix=f"kerasmagic-{os.getpid()}-", dir=base))


def remove_stale(base: Path) -> list[Path]:
    """Remove this user's ``kerasmagic-PID-*`` directories whose PID is no longer running."""
    removed = []
    for path in base.glob("kerasmagic-*-*"):
        owner = path.name.split("-")[1]
        if not owner.isdigit() or _running(int(owner)):
            continue
        with contextlib.suppress(OSError):
            if path.is_dir() and path.stat().st_uid == os.getuid():
                shutil.rmtree(path)
                removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
