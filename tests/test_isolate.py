"""The local fresh-process runner, through ``%%fresh_model --isolate`` and the Python API."""

from __future__ import annotations

import _thread
import contextlib
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import run
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import kerasmagic
from kerasmagic.isolate import api, child
from kerasmagic.isolate.api import IsolatedCrash, IsolatedError, IsolatedTimeout


def _error(ip: InteractiveShell, cell: str) -> BaseException:
    result = ip.run_cell(cell)
    assert result.error_in_exec is not None, "the cell should have failed"
    return result.error_in_exec


def test_outputs_come_back_and_inputs_go_in(ip: InteractiveShell) -> None:
    run(ip, "import numpy as np\nx = np.arange(5)\ndef square(v):\n    return v * v")
    value = run(
        ip,
        "%%fresh_model --isolate --inputs x square --outputs y pid\n"
        "import os\ny = square(x)\npid = os.getpid()\ny.sum()",
    )
    assert value == 30
    assert ip.user_ns["y"].tolist() == [0, 1, 4, 9, 16]
    assert ip.user_ns["pid"] != os.getpid()


def test_exception_shows_the_childs_traceback_and_keeps_variables(ip: InteractiveShell) -> None:
    run(ip, "y = 'kept'")
    err = _error(
        ip,
        "%%fresh_model --isolate --outputs y\n"
        "def inner():\n    raise ValueError('boom from child')\ny = 1\ninner()",
    )
    assert isinstance(err, IsolatedError)
    text = "\n".join(err._render_traceback_())
    assert "<isolated cell>" in text and "in inner" in text
    assert "raise ValueError('boom from child')" in text
    assert text.rstrip().endswith("ValueError: boom from child")
    assert ip.user_ns["y"] == "kept"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("import ctypes\nctypes.string_at(0)", "killed by SIGSEGV — segmentation fault"),
        ("import os\nos._exit(3)", "exited with code 3 before returning a result"),
        (
            "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
            "killed by SIGKILL — likely out of memory",
        ),
    ],
    ids=["segfault", "os._exit", "sigkill"],
)
def test_crash_is_reported_in_words(ip: InteractiveShell, body: str, words: str) -> None:
    run(ip, "z = 'kept'")
    err = _error(ip, f"%%fresh_model --isolate --outputs z\nz = 1\n{body}")
    assert isinstance(err, IsolatedCrash)
    assert words in str(err)
    assert ip.user_ns["z"] == "kept"


def test_timeout_kills_the_whole_process_tree(ip: InteractiveShell, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    cell = (
        f"%%fresh_model --isolate --timeout 2\n"
        "import os, subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}')\n"
        "time.sleep(60)"
    )
    start = time.monotonic()
    err = _error(ip, cell)
    assert isinstance(err, IsolatedTimeout) and isinstance(err, TimeoutError)
    assert time.monotonic() - start < 10
    procs = [psutil.Process(int(p)) for p in pids.read_text().split() if psutil.pid_exists(int(p))]
    _, alive = psutil.wait_procs(procs, timeout=5)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_ctrl_c_kills_the_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"

    def sleeper(path: str) -> None:
        Path(path).write_text(str(os.getpid()))
        time.sleep(60)

    threading.Timer(1.5, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        kerasmagic.run_isolated(sleeper, str(pid_file))
    # Killed: gone, or a zombie its new parent has not reaped yet (init in a container may not)
    with contextlib.suppress(psutil.NoSuchProcess):
        assert psutil.Process(int(pid_file.read_text())).status() == psutil.STATUS_ZOMBIE


def test_notebook_function_ships_by_value(ip: InteractiveShell) -> None:
    run(ip, "import kerasmagic\nscale = 3\ndef triple(v):\n    return v * scale")
    assert run(ip, "kerasmagic.run_isolated(triple, 14)") == 42
    assert run(ip, "kerasmagic.isolated(triple)(5)") == 15


def test_big_array_round_trip_through_shared_memory(ip: InteractiveShell) -> None:
    arr = np.random.default_rng(0).random(50_000_000, dtype=np.float32)  # 200 MB
    ip.user_ns["big"] = arr
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    run(ip, "%%fresh_model --isolate -q --inputs big --outputs back\nback = big * 2")
    back = ip.user_ns["back"]
    assert back.shape == arr.shape and back.dtype == np.float32
    np.testing.assert_array_equal(back[::9973], arr[::9973] * 2)
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    # this process's own: a test on another xdist worker may have its run's folder there now
    assert not {n for n in after - before if n.startswith(f"kerasmagic-{os.getpid()}-")}


def test_transport_keeps_big_buffers_out_of_the_stream(tmp_path: Path) -> None:
    data = {"a": np.ones(2_000_000), "small": np.arange(3), "text": "t"}
    child.dump(data, tmp_path / "obj")
    assert (tmp_path / "obj").stat().st_size < 100_000
    assert (tmp_path / "obj.0").stat().st_size == 16_000_000
    back = child.load(tmp_path / "obj")
    assert back["a"].sum() == 2_000_000 and back["small"].tolist() == [0, 1, 2]
    back["a"][0] = 5  # copy-on-write mapping: writable
    assert not (tmp_path / "obj.0").exists()


def test_returning_a_model_is_refused(kip: InteractiveShell) -> None:
    kip.user_ns["model"] = "kept"
    err = _error(
        kip,
        "%%fresh_model --isolate --outputs model\n"
        "import keras\nmodel = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])",
    )
    assert isinstance(err, IsolatedError)
    assert "cannot return a Keras model (Sequential)" in str(err)
    assert "get_weights()" in str(err) and ".keras" in str(err)
    assert kip.user_ns["model"] == "kept"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--isolate --inputs nowhere", "not defined in the notebook: nowhere"),
        ("--isolate --outputs 1x", "not a Python name: 1x"),
        ("--isolate --gpus cpu", "--gpus"),
        ("--isolate --timeout 0", "--timeout must be a positive"),
        ("--isolate --on dask", "expected 'ray' or 'ray://host:port'"),
        ("--timeout 5", "need --isolate"),
    ],
)
def test_bad_flags_are_usage_errors(ip: InteractiveShell, line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("fresh_model", line, "x = 1")


def test_magics_in_an_isolated_cell_are_refused(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="plain Python"):
        ip.run_cell_magic("fresh_model", "--isolate", "!ls")


def test_gpu_pinning_and_memory_growth_env() -> None:
    def env() -> tuple[str | None, str | None]:
        return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")

    assert kerasmagic.run_isolated(env, gpus="") == ("", "true")
    assert kerasmagic.run_isolated(env, gpus=[1, 0]) == ("1,0", "true")
    with pytest.raises(ValueError, match="device indices"):
        kerasmagic.run_isolated(env, gpus="gpu0")
    with pytest.raises(ValueError, match="device indices"):
        kerasmagic.run_isolated(env, gpus=object())


@pytest.mark.parametrize("workers", [0, 1.5, "2", True, [2]])
def test_a_bad_worker_count_is_one_clear_error_before_any_run(workers: object) -> None:
    with pytest.raises(ValueError, match="workers must be a whole number of at least 1, not"):
        kerasmagic.sweep(print, [1], workers=workers)  # type: ignore[arg-type]


def test_more_workers_than_runs_start_one_per_run() -> None:
    trials = kerasmagic.sweep(abs, [-1, -2], workers=10**11, progress=False)  # was a MemoryError
    assert [t.value for t in trials] == [1, 2]


def test_sweep_keeps_order_and_reports_each_trial(capsys: pytest.CaptureFixture[str]) -> None:
    def trial(i: int) -> int:
        time.sleep(0.3 * (3 - i))  # later trials finish first
        if i == 1:
            raise RuntimeError("trial one fails")
        return i * 10

    trials = kerasmagic.sweep(trial, range(4), workers=2, gpus=["0", "1"])
    assert [t.index for t in trials] == [0, 1, 2, 3]
    assert [t.status for t in trials] == ["ok", "error", "ok", "ok"]
    assert [t.value for t in trials] == [0, None, 20, 30]
    assert "RuntimeError: trial one fails" in (trials[1].error or "")
    assert len({t.pid for t in trials}) == 4
    assert "sweep 4/4 done · 0 running · 1 failed" in capsys.readouterr().out


def test_sweep_dict_configs_and_timeouts() -> None:
    def trial(a: int, wait: float) -> int:
        time.sleep(wait)
        print("done", a)
        return a

    configs = [{"a": 1, "wait": 0}, {"a": 2, "wait": 30}]
    trials = kerasmagic.sweep(trial, configs, workers=2, timeout=2, progress=False)
    assert [t.status for t in trials] == ["ok", "timeout"]
    assert trials[0].output == "done 1\n" and trials[1].config == configs[1]


def child_env() -> dict[str, str | None]:
    names = (
        "TF_CPP_MIN_LOG_LEVEL",
        "KERAS_BACKEND",
        "TF_FORCE_GPU_ALLOW_GROWTH",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "PYTORCH_CUDA_ALLOC_CONF",
        "JAX_PLATFORMS",
        "CUDA_VISIBLE_DEVICES",
        "PYTHONPATH",
    )
    return {name: os.environ.get(name) for name in names}


def test_backend_and_memory_settings_reach_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    import keras  # the kernel's Keras decides the child's backend when KERAS_BACKEND is unset

    for name in ("TF_CPP_MIN_LOG_LEVEL", "KERAS_BACKEND", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".3")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("PYTHONPATH", "/nowhere")
    env = kerasmagic.run_isolated(child_env, gpus="")
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "3"
    assert env["KERAS_BACKEND"] == keras.backend.backend()
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == ".3"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["JAX_PLATFORMS"] == "cpu"
    assert env["PYTHONPATH"] == "/nowhere"  # the user's own value, for the cell's subprocesses
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    env = kerasmagic.run_isolated(child_env, gpus="1")
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "1" and env["KERAS_BACKEND"] == "jax"
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["JAX_PLATFORMS"] is None


@pytest.mark.slow
def test_tensorflow_log_lines_stay_out_of_the_cell(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    cell = "import sys, tensorflow as tf\nprint('two', int(tf.constant(1) + 1), file=sys.stderr)"
    run(ip, f"%%fresh_model --isolate -q\n{cell}")
    err = capfd.readouterr().err
    assert "two 2" in err
    for noise in ("oneDNN", "cpu_feature_guard", "absl::InitializeLog", "To enable the following"):
        assert noise not in err


def test_log_filter_drops_only_tf_lines_below_the_level() -> None:
    from kerasmagic.isolate.api import LogFilter

    absl = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    )
    info = "I0000 00:00:1796099673.497028    9428 port.cc:153] oneDNN custom operations are on.\n"
    guard = "I0000 00:00:17.5    9 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n"
    more = "To enable the following instructions: AVX2 FMA, rebuild TensorFlow.\n"
    error = "E0000 00:00:1796099673.497028    9428 cuda.cc:1] failed call to cuInit\n"
    logs = LogFilter("2")
    text = absl + info
    assert logs.feed(absl + info[:30]) == ""  # an unfinished line that may be a log line waits
    assert logs.feed(info[30:] + guard + more + error + "\r 10%|##") == error + "\r 10%|##"
    assert logs.feed(" user line\n") == " user line\n"
    assert logs.feed(more) == more  # not after a dropped line: the user's own text
    assert LogFilter("0").feed(text) == text
    assert LogFilter(None).feed(info) == info
    warn = LogFilter("3")
    assert warn.feed("W0000 00:00:1.5 1 a.cc:1] x\nF0000 00:00:1.5 1 a.cc:1] y\n").startswith("F")


def test_folders_of_dead_kernels_are_removed_by_the_next_run() -> None:
    gone = psutil.Popen(["true"])
    gone.wait()
    base = api.workdir().parent
    stale, live = base / f"kerasmagic-{gone.pid}-old", base / f"kerasmagic-{os.getpid()}-live"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "call").write_bytes(b"x" * 1000)
    try:
        fresh = api.workdir()
        assert not stale.exists() and live.exists() and fresh.exists()
    finally:
        for folder in (stale, live, fresh):
            shutil.rmtree(folder, ignore_errors=True)


def test_the_child_runs_the_kernels_own_kerasmagic_when_another_comes_first(
    tmp_path: Path,
) -> None:
    """An editable install beside a checkout puts another copy first on the child's path; the
    child must still run the copy the kernel imported (its result format is the kernel's)."""
    import subprocess
    import sys

    from kerasmagic.isolate.child import PRELUDE

    other = tmp_path / "kerasmagic"
    other.mkdir()
    (other / "__init__.py").write_text("raise ImportError('the other copy was imported')\n")
    root = str(Path(kerasmagic.__file__).resolve().parents[1])
    code = PRELUDE + "print(sys.modules['kerasmagic.isolate.child'].__file__)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, root, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(Path(root) / "kerasmagic" / "isolate" / "child.py")
