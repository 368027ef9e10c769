"""Isolation faults: process trees, escapes, floods, kernel death, hostile folders, bad input.

Every run here carries a marker in its environment; after each test no process may carry it
and the test process may have no new descendants (``0 processes left behind``). Bad inputs
must give one ``UsageError``/``ValueError`` line (``0 raw tracebacks``). The whole file stays
well under a minute.
"""

from __future__ import annotations

import _thread
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import faultcounts
import psutil
import pytest
from conftest import run
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import kerasmagic
from kerasmagic.isolate.api import IsolatedTimeout

MARK = "KERASMAGIC_FAULT_TEST"


def _marked(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["environ"]):
        if (proc.info.get("environ") or {}).get(MARK) == token:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.Error:
                continue
    return found


def _left_behind(token: str, before: set[int], wait_s: float = 5.0) -> list[psutil.Process]:
    """Processes of this test still alive after ``wait_s``: marked ones, new descendants."""
    deadline = time.monotonic() + wait_s
    while True:
        kids = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
        ]
        left = {p.pid: p for p in [*kids, *_marked(token)]}
        if not left or time.monotonic() > deadline:
            return list(left.values())
        time.sleep(0.1)


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A token every process started by the test inherits; asserts none of them outlives it."""
    token = os.urandom(8).hex()
    monkeypatch.setenv(MARK, token)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield token
    left = _left_behind(token, before)
    for proc in left:  # never leak, even from a failing test
        proc.kill()
    faultcounts.add("processes left behind", len(left))
    assert not left, f"{len(left)} processes left behind: {[p.cmdline() for p in left]}"


def make_tree(ready: str) -> None:
    """Start the nasty tree, note its pids in ``ready``, then sleep: the run must be killed."""
    py = sys.executable
    ignores_term = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    a = subprocess.Popen([py, "-c", ignores_term + "time.sleep(60)"])
    b = subprocess.Popen([py, "-c", "import time; time.sleep(60)"], start_new_session=True)
    daemon = f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    open({ready!r} + '.d', 'w').write(str(os.getpid()))\n    time.sleep(60)"  # noqa: E501
    subprocess.Popen([py, "-c", daemon]).wait()  # double fork: its parent is gone at once
    daemon_file = Path(ready + ".d")
    while not daemon_file.exists() or not daemon_file.read_text():
        time.sleep(0.01)
    pids = [os.getpid(), a.pid, b.pid, int(daemon_file.read_text())]
    Path(ready).write_text(" ".join(map(str, pids)))
    time.sleep(60)


def _wait_for(path: Path, timeout_s: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the isolated run never got going"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


@pytest.mark.slow
def test_timeout_kills_the_whole_tree_and_says_what(marker: str, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    with pytest.raises(IsolatedTimeout) as caught:
        kerasmagic.run_isolated(make_tree, str(ready), timeout=6)
    faultcounts.add("isolation faults")
    pids = _wait_for(ready, 0)
    message = str(caught.value)
    assert "killed" in message
    for pid in pids:  # the worker, the SIGTERM-ignorer, the setsid one, the double-forked daemon
        assert f"pid {pid})" in message


@pytest.mark.slow
def test_ctrl_c_kills_the_whole_tree(
    marker: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ready = tmp_path / "ready"
    threading.Thread(target=lambda: (_wait_for(ready), _thread.interrupt_main())).start()
    with pytest.raises(KeyboardInterrupt):
        kerasmagic.run_isolated(make_tree, str(ready))
    faultcounts.add("isolation faults")
    err = capsys.readouterr().err
    assert "kerasmagic: interrupted; killed" in err
    assert all(f"pid {pid})" in err for pid in _wait_for(ready, 0))


@pytest.mark.slow
def test_kernel_death_ends_the_tree_and_its_shm_folder(marker: str, tmp_path: Path) -> None:
    """The "kernel" is any process running a cell; SIGKILL it mid-run."""
    ready = tmp_path / "ready"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
        import kerasmagic
        from test_isolate_faults import make_tree
        kerasmagic.run_isolated(make_tree, {str(ready)!r})
    """)
    kernel = subprocess.Popen([sys.executable, "-c", script])
    try:
        _wait_for(ready)
        runs = [
            p for p in psutil.Process(kernel.pid).children() if "kerasmagic-" in str(p.cmdline())
        ]
        work = next(arg for arg in runs[0].cmdline() if "kerasmagic-" in arg)
        kernel.kill()
    finally:
        kernel.kill()
        kernel.wait()
    faultcounts.add("isolation faults")
    assert not _left_behind(marker, before, wait_s=10)
    deadline = time.monotonic() + 5
    while os.path.exists(work) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(work), "the killed kernel's /dev/shm folder was left behind"


def chatter(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        print("tick", flush=True)
        time.sleep(0.01)


@pytest.mark.slow
def test_deadline_holds_while_the_child_prints(marker: str) -> None:
    start = time.monotonic()
    trials = kerasmagic.sweep(chatter, [30], timeout=2, progress=False, stream=False)
    faultcounts.add("isolation faults")
    assert trials[0].status == "timeout"
    assert time.monotonic() - start < 10, "a 2 s timeout must not wait for quiet output"
    assert trials[0].output.count("tick") > 20


@pytest.mark.slow
def test_sweep_ctrl_c_while_the_child_prints(marker: str) -> None:
    threading.Timer(2.0, _thread.interrupt_main).start()
    start = time.monotonic()
    trials = kerasmagic.sweep(chatter, [30, 30], progress=False, stream=False)
    faultcounts.add("isolation faults")
    assert [t.status for t in trials] == ["interrupted", "interrupted"]
    assert time.monotonic() - start < 12


def escape_holding_stdout() -> int:
    """Start a process in its own session that inherits stdout, then return at once."""
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    return 42


@pytest.mark.slow
def test_session_escape_holding_stdout_neither_hangs_nor_loses_the_result(
    marker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.monotonic()
    assert kerasmagic.run_isolated(escape_holding_stdout, timeout=20) == 42
    faultcounts.add("isolation faults")
    assert time.monotonic() - start < 10
    assert "(left running by the isolated code)" in capsys.readouterr().err


SHADOWS = ("queue", "typing", "signal", "subprocess", "pickle", "types", "ast", "json", "select")


@pytest.mark.slow
def test_stdlib_named_files_in_the_notebook_folder(
    ip: InteractiveShell, marker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the folder\\'s {name}.py')\n")
    (tmp_path / "helpers.py").write_text("VALUE = 42\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # a notebook's kernel has its folder on sys.path
    cell = "import os, helpers\nvalue = helpers.VALUE\ncwd = os.getcwd()"
    run(ip, f"%%fresh_model --isolate -q --outputs value cwd\n{cell}")
    faultcounts.add("isolation faults")
    assert ip.user_ns["value"] == 42 and ip.user_ns["cwd"] == str(tmp_path)


BAD_LINES = [
    ("--isolate --timeout nan", "--timeout must be a positive, finite number"),
    ("--isolate --timeout inf", "--timeout must be a positive, finite number"),
    ("--isolate --timeout -1", "--timeout must be a positive, finite number"),
    ("--isolate --timeout 0", "--timeout must be a positive, finite number"),
    ("--isolate --gpus gpu0", "--gpus"),
    ('--isolate --gpus "0,x"', "--gpus"),
    ("--isolate --on dask", "--on: expected 'ray' or 'ray://host:port'"),
    ('--isolate --on ""', "--on: expected 'ray' or 'ray://host:port'"),
    ("--isolate --on ray://", "--on: expected 'ray' or 'ray://host:port'"),
    ("--isolate --on ray://no-port", "--on: expected 'ray' or 'ray://host:port'"),
    ("--isolate --on ray://host:notaport", "--on: expected 'ray' or 'ray://host:port'"),
    ("--isolate --on ray://host:70000", "--on: expected 'ray' or 'ray://host:port'"),
    ("--isolate --on ray://host:0", "--on: expected 'ray' or 'ray://host:port'"),
    ("--isolate --on file:///etc/passwd", "--on: expected 'ray' or 'ray://host:port'"),
    ("--isolate --on 'ray://h:1 '", "--on: expected 'ray' or 'ray://host:port'"),
    ("--isolate --on ray --gpus half", "--gpus"),
]


@pytest.mark.parametrize(("line", "flag"), BAD_LINES)
def test_bad_isolate_flags_are_one_usage_error_line(
    ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch, line: str, flag: str
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # importing Ray would fail loudly
    run(ip, "kept = 'value'")
    faultcounts.add("bad inputs")
    try:
        ip.run_cell_magic("fresh_model", line, "kept = 'lost'")
    except UsageError as exc:
        assert flag in str(exc) and "\n" not in str(exc)
    except BaseException:
        faultcounts.add("raw tracebacks")
        raise
    else:
        pytest.fail(f"{line!r} was accepted")
    assert ip.user_ns["kept"] == "value"


BAD_ADDRESSES = ["", " ", "ray://", "ray://no-port", "ray://host:notaport", "file:///etc/passwd"]


@pytest.mark.parametrize("on", [*BAD_ADDRESSES, "ray://h:1 ", "ray:/h:1", "Ray"])
def test_bad_ray_addresses_fail_before_ray_is_imported(
    monkeypatch: pytest.MonkeyPatch, on: str
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # importing Ray would raise ImportError
    faultcounts.add("bad inputs", 3)
    with pytest.raises(ValueError, match="on: expected 'ray' or 'ray://host:port'"):
        kerasmagic.run_isolated(len, "abc", on=on)
    with pytest.raises(ValueError, match="on: expected"):
        kerasmagic.sweep(len, ["abc"], on=on)
    with pytest.raises(ValueError, match="on: expected"):
        kerasmagic.isolated(on=on)


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0, 0])
def test_bad_timeouts_in_the_api(timeout: float) -> None:
    faultcounts.add("bad inputs")
    with pytest.raises(ValueError, match="timeout must be a positive, finite number"):
        kerasmagic.run_isolated(len, "abc", timeout=timeout)


@pytest.mark.slow
def test_empty_gpus_means_cpu_only(ip: InteractiveShell, marker: str) -> None:
    for line in ('--gpus ""', "--gpus ''"):
        cell = "import os\ncuda = os.environ['CUDA_VISIBLE_DEVICES']"
        run(ip, f"%%fresh_model --isolate -q {line} --outputs cuda\n{cell}")
        assert ip.user_ns["cuda"] == ""
