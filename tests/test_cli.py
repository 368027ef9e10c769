"""``kerasmagic`` on the command line: help, errors, and the demo's progress on a terminal and
in a pipe."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from kerasmagic._demo import StepProgress, bar, main, remaining_s, run_variant_process

CLI = [sys.executable, "-m", "kerasmagic"]


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as sys.stdout does in an interactive shell."""

    def isatty(self) -> bool:
        return True


def test_no_command_prints_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: kerasmagic [-h] COMMAND ...")
    assert "%load_ext kerasmagic" in out
    assert "demo      the leak loop and a capped K-fold loop, with and without us" in out
    assert err == ""


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["demo", "--help"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "``" not in out and ":func:" not in out


def test_demo_help_says_what_it_does_and_how_long(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for said in (
        "each in a fresh Python process on the CPU (no GPU needed)",
        "1. no cleanup",
        "2. Keras's own cleanup: del model + keras.backend.clear_session() + gc.collect()",
        "3. kerasmagic: kerasmagic.reset() before each model",
        "RSS and Python objects kept per model",
        "per variant on 2 CPU cores",
        "--models N models built and fitted per variant (default 30, at least 8)",
        "--samples ROWS training rows of 100 features per fit (default 4000",
        "pip install 'kerasmagic[tf]'",
        "ten folds of a 256-1024-1024-10 model in one loop",
        "--no-folds skip the last part",
    ):
        assert said in out


def test_bad_sizes_are_one_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["demo", "--models", "3"])
    assert done.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "kerasmagic: error: use at least 8 models and 256 samples"


def test_demo_without_tensorflow_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['tensorflow'] = None\n"  # what find_spec sees when TF is absent
        "from kerasmagic._demo import main; raise SystemExit(main(['demo']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == "kerasmagic demo needs TensorFlow: pip install 'kerasmagic[tf]'\n"
    assert done.stdout == ""


def test_bar_and_time_left() -> None:
    assert bar(0, 30) == "[" + "." * 20 + "]"
    assert bar(15, 30) == "[" + "#" * 10 + "." * 10 + "]"
    assert bar(30, 30) == "[" + "#" * 20 + "]"
    assert remaining_s(1, 30, 10.0, 10.0) is None  # one model: only the imports were timed
    # the first model took 10 s (imports); 10 more took 20 s, so 2 s each for the last 19
    assert remaining_s(11, 30, 30.0, 10.0) == pytest.approx(38.0)
    assert remaining_s(30, 30, 70.0, 10.0) is None


def test_progress_in_a_pipe_is_plain_lines() -> None:
    stream = io.StringIO()
    with StepProgress(stream, "[1/3] no cleanup", 30) as progress:
        for done in range(1, 31):
            progress.update(done)
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[0] == "[1/3] no cleanup: started"
    assert lines[1].startswith("[1/3] no cleanup: 30/30 models in ")
    assert len(lines) == 2


def test_progress_on_a_terminal_redraws_one_line() -> None:
    stream = Terminal()
    with StepProgress(stream, "[2/3] keras", 30) as progress:
        progress.update(1)
        progress.update(15)
        middle = stream.getvalue()
    text = stream.getvalue()
    assert middle.count("\n") == 0  # nothing but redraws until the step ends
    assert "\r[2/3] keras  [##########..........] 15/30 models" in middle
    assert "s left" in middle
    assert text.endswith("\n") and text.count("\n") == 1
    assert text.rsplit("\r", 1)[1].startswith("[2/3] keras: 15/30 models in ")


def test_progress_on_a_terminal_ticks_while_nothing_finishes() -> None:
    stream = Terminal()
    with StepProgress(stream, "[1/3] none", 30):
        deadline = time.monotonic() + 10
        while "starting (importing TensorFlow)" not in stream.getvalue():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert re.search(r"\r\[1/3\] none: 0/30 models in \d+ s +\n$", stream.getvalue())


def test_a_failed_step_says_stopped() -> None:
    stream = io.StringIO()
    with pytest.raises(KeyboardInterrupt), StepProgress(stream, "[3/3] kerasmagic", 30):
        raise KeyboardInterrupt
    assert stream.getvalue().splitlines()[-1] == "[3/3] kerasmagic: stopped"


def test_a_failing_child_is_one_error() -> None:
    with pytest.raises(RuntimeError, match=r"bogus loop failed:\n(.|\n)*invalid choice: 'bogus'"):
        run_variant_process("bogus", 8, 256, 5)


@pytest.mark.slow
def test_child_reports_each_model_as_it_finishes() -> None:
    seen: list[tuple[int, float]] = []
    result = run_variant_process("kerasmagic", 8, 256, 5, lambda n: seen.append((n, time.time())))
    assert [n for n, _ in seen] == list(range(1, 9))
    assert result.models == 8 and len(result.rss_mb) == 8
    assert seen[-1][1] - seen[0][1] > 0  # streamed as they came, not all at the end


@pytest.mark.slow
def test_demo_in_a_pipe_has_no_carriage_returns() -> None:
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run(
        [*CLI, "demo", "--models", "8", "--samples", "256", "--no-folds"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stdout
    lines = done.stdout.splitlines()
    for step, label in enumerate(("no cleanup", "del + keras clear_session()", "with kerasmagic")):
        assert any(
            line.startswith(f"[{step + 1}/3] {label}") and ": started" in line for line in lines
        )
        assert any(
            line.startswith(f"[{step + 1}/3] {label}") and ": 8/8 models in" in line
            for line in lines
        )
    assert "kerasmagic keeps" in lines[-1]


@pytest.mark.slow
def test_ctrl_c_stops_the_child_and_says_interrupted() -> None:
    proc = subprocess.Popen(
        [*CLI, "demo", "--models", "8", "--samples", "256"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("Building, fitting and predicting 8")
    assert proc.stdout.readline() == "[1/5] no cleanup (model reassigned): started\n"
    deadline = time.monotonic() + 60
    while not psutil.Process(proc.pid).children():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (child,) = psutil.Process(proc.pid).children()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.endswith("kerasmagic demo: interrupted\n")
    assert "Traceback" not in err
    assert out.endswith("[1/5] no cleanup (model reassigned): stopped\n")
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_a_long_label_is_shortened_to_keep_the_figures() -> None:
    label = "[2/3] del + keras clear_session() + gc.collect()"
    progress = StepProgress(Terminal(), label, 30)
    progress.update(1)
    progress.update(12)
    line = progress.line(72)
    assert len(line) <= 71
    assert line.startswith("[2/3] del + ") and "...  [########" in line
    assert line.endswith(" s left") and "12/30 models" in line
    assert progress.line(200).startswith(label + "  [########")
