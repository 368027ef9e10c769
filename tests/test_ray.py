"""Trials on a real local Ray cluster (2 CPUs, 2 fake GPUs, everything in a temp dir)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import run
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import kerasmagic

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    """One real local cluster for the module; HOME and Ray's temp dir in a short temp path."""
    InteractiveShell.instance()  # its history database stays under the real HOME
    root = tempfile.mkdtemp(prefix="kmr", dir="/tmp")  # short: Ray's socket paths are limited
    saved = {k: os.environ.get(k) for k in ("HOME", "RAY_TMPDIR")}
    os.environ.update(HOME=root, RAY_TMPDIR=root)
    ray.init(
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        object_store_memory=int(200e6),
        _temp_dir=os.path.join(root, "ray"),
        log_to_driver=True,
    )
    yield
    ray.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(root, ignore_errors=True)


def whoami(i: int, wait: float = 0.0) -> dict[str, Any]:
    time.sleep(wait)
    return {"i": i, "pid": os.getpid(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


def test_each_trial_gets_a_fresh_worker_in_submission_order() -> None:
    trials = kerasmagic.sweep(whoami, [{"i": i, "wait": 0.3 * (3 - i)} for i in range(4)], on="ray")
    assert [t.status for t in trials] == ["ok"] * 4, trials[0].error
    assert [t.value["i"] for t in trials] == [0, 1, 2, 3]
    pids = {t.value["pid"] for t in trials}
    assert len(pids) == 4 and os.getpid() not in pids
    assert {t.value["cuda"] for t in trials} == {""}  # CPU trials: forced empty, not unset


def test_gpus_are_pinned_per_trial() -> None:
    trials = kerasmagic.sweep(whoami, [{"i": i, "wait": 1.0} for i in range(2)], on="ray", gpus=1)
    assert sorted(t.value["cuda"] for t in trials) == ["0", "1"]
    halves = kerasmagic.sweep(whoami, range(2), on="ray", gpus=0.5)
    assert all(t.value["cuda"] in ("0", "1") for t in halves)


def test_timeout_really_stops_the_task(tmp_path: Path) -> None:
    def stuck(path: str) -> None:
        Path(path).write_text(str(os.getpid()))
        time.sleep(120)

    start = time.monotonic()
    trials = kerasmagic.sweep(stuck, [str(tmp_path / "pid")], on="ray", timeout=4)
    assert trials[0].status == "timeout" and time.monotonic() - start < 30
    worker = psutil.Process(int((tmp_path / "pid").read_text()))
    psutil.wait_procs([worker], timeout=15)
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


def test_crash_and_error_do_not_stop_other_trials() -> None:
    def trial(kind: str) -> str:
        if kind == "crash":
            os._exit(1)
        if kind == "raise":
            raise ValueError("bad config")
        return kind

    trials = kerasmagic.sweep(trial, ["ok", "crash", "raise"], on="ray")
    assert [t.status for t in trials] == ["ok", "crashed", "error"]
    assert "ValueError: bad config" in (trials[2].error or "")
    with pytest.raises(kerasmagic.isolate.api.IsolatedCrash):
        kerasmagic.run_isolated(trial, "crash", on="ray")


def test_isolated_cell_on_ray(ip: InteractiveShell) -> None:
    run(ip, "base = 20")
    assert (
        run(
            ip,
            "%%fresh_model --isolate --on ray --inputs base --outputs total\n"
            "total = base + 22\ntotal",
        )
        == 42
    )
    assert ip.user_ns["total"] == 42


def settings() -> dict[str, str | None]:
    names = ("KERAS_BACKEND", "XLA_PYTHON_CLIENT_MEM_FRACTION", "TF_CPP_MIN_LOG_LEVEL")
    return {name: os.environ.get(name) for name in names}


def test_backend_and_memory_settings_reach_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's workers inherit the environment of the cluster's start, not the driver's now."""
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".25")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    assert kerasmagic.run_isolated(settings, on="ray") == {
        "KERAS_BACKEND": "jax",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": ".25",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }


def test_bad_addresses_never_reach_ray_init(ip: InteractiveShell) -> None:
    for on in ("ray://", "ray://no-port", "ray://host:notaport", "file:///etc/passwd", ""):
        with pytest.raises(ValueError, match="on: expected 'ray' or 'ray://host:port'"):
            kerasmagic.run_isolated(settings, on=on)
    with pytest.raises(UsageError, match="--on: expected"):
        ip.run_cell_magic("fresh_model", "--isolate --on ray://host:notaport", "x = 1")
