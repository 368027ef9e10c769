"""Fuzzed ``%%fresh_model`` and ``%gpu_mem`` lines: a bad line is one ``UsageError`` line.

Every line and cell magic kerasmagic registers gets seeded random flag strings (unknown flags,
``--``, help flags, values of the wrong type, huge, negative and non-finite numbers, empty
values, unbalanced quotes, non-ASCII, NUL bytes, very long lines, repeated flags), also as the
wrong kind of magic (``%fresh_model``, ``%%gpu_mem``) and over empty or blank bodies. Each must
end in exactly one printed line, ``UsageError: ...``, or be accepted and run without an error;
``-h``/``--help`` prints the help and runs nothing; no input changes the user's variables.
"""

from __future__ import annotations

import random
import re
import time

import faultcounts
import IPython
import pytest
from conftest import run
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

ANSI = re.compile(r"\x1b\[[0-9;]*m")
SEED = 26_4
CASES = 300  # per magic; ~10 s on a 2-core machine with TensorFlow loaded

FRESH_FLAGS = [
    *("--all", "--keep", "--dry-run", "-q", "--quiet", "--isolate", "--inputs", "--outputs"),
    *("--timeout", "--gpus", "--on", "-h", "--help", "--", "-", "--bogus", "-x", "--keep="),
]
GPU_FLAGS = [
    *("--live", "--history", "--plot", "--json", "--reset-peak", "--deep", "--growth"),
    *("--limit", "-h", "--help", "--", "-", "--bogus", "--lim", "--json=1", "--limit="),
]
NUMBERS = [
    *("0", "1", "-1", "-5", "1.5", str(2**63), str(-(2**63)), str(10**400), "9" * 5_000),
    *("nan", "-nan", "NaN", "inf", "-inf", "1e400", "-1e400", "1e-400", "0x10", "1_000"),
    *("½", "٣", "²", "0,1", "0, 1", "1,,2", "-0", "+1", " 1"),
]
WORDS = [
    *("base", "arr", "bsae", "1x", "class", "None", "a,,b", ",", "base,", "x.y", "z"),
    *("ünïcödé", "名前", "🙂", "\u200b", "\x00", "a\x00b", "\x7f", "\x1b[31m", "$arr", "{arr}"),
    *("`ls`", "!ls", "%gpu_mem", "RAY", "ray:", "ray://h:0", "ray://h:99999", "ray://:1"),
    *("ray://h:" + "9" * 5_000, "local", "--", "-q", "--keep", "-h"),
]
QUOTES = ['"', "'", '"open', "'open", '"a b"', "\\", '"""', "'\"'", '""', "''", '"\x00"']
LONG_CHARS = (20_000, 90_000, 300_000, 2_000_000)
BODIES = ["z = 1\n", "", "   ", "\n\n", "\t\n  \n", "z = 1"]


def token(rng: random.Random, flags: list[str]) -> str:
    """One random word of a magic line: a flag, a value, a ``--flag=value``, a quote."""
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(flags)
    if roll < 0.55:
        return rng.choice(NUMBERS)
    if roll < 0.75:
        return rng.choice(WORDS)
    if roll < 0.85:
        return f"{rng.choice(flags)}={rng.choice(NUMBERS + WORDS)}"
    return rng.choice(QUOTES)


def fuzz_line(rng: random.Random, flags: list[str], i: int) -> str:
    """A random magic line; some repeat one flag, every 40th is very long."""
    words = [token(rng, flags) for _ in range(rng.randint(1, 7))]
    if i % 7 == 3:
        flag = rng.choice(flags)
        words += [flag, rng.choice(NUMBERS + WORDS), flag]
    if i % 40 == 0:  # 20 KB to 2 MB: the parser must refuse or read it in well under a second
        piece, length = rng.choice(WORDS + QUOTES + NUMBERS), rng.choice(LONG_CHARS)
        words.append((piece * (length // len(piece) + 1))[:length])
    return " ".join(words)


HELP_LINES = ["-h", "--help", "-q --help", "--help -q", "-h --", "--keep base -h"]
GOOD_FRESH_LINES = ["", "-q", "--quiet", "--keep base", "--dry-run", "--all -q", "--keep=arr -q"]


def fresh_model_cells(rng: random.Random, count: int) -> list[str]:
    """``%%fresh_model`` cells, none of which may start a process: an accepted ``--isolate``
    line would run one, so those lines keep a token the isolate checks refuse. The help and
    valid lines come first, with a body that must run (or, under help, must not)."""
    cells = [f"%%fresh_model {line}\nz = 1\n" for line in HELP_LINES + GOOD_FRESH_LINES]
    for i in range(count):
        line = fuzz_line(rng, FRESH_FLAGS, i)
        if "--isolate" in line:
            line += rng.choice([" --timeout nan", " --timeout -1", " --gpus x", " --on local"])
        cells.append(f"%%fresh_model {line}\n{rng.choice(BODIES)}")
    return cells


def gpu_mem_cells(rng: random.Random, count: int) -> list[str]:
    """``%gpu_mem`` lines; ``--growth``/``--limit`` only reach the backend when TF is up (a
    one-line refusal), ``--deep``/``--plot``/``--live`` are accepted and show their views."""
    fixed = [f"%gpu_mem {line}" for line in [*HELP_LINES[:2], "", "--json", "--deep"]]
    return fixed + [f"%gpu_mem {fuzz_line(rng, GPU_FLAGS, i)}" for i in range(count)]


def wrong_kind_cells(rng: random.Random, count: int) -> list[str]:
    """A cell magic called as a line magic and the other way round."""
    cells = []
    for i in range(count):
        if i % 2:
            cells.append(f"%fresh_model {fuzz_line(rng, FRESH_FLAGS, i)}")
        else:
            cells.append(f"%%gpu_mem {fuzz_line(rng, GPU_FLAGS, i)}\n{rng.choice(BODIES)}")
    return cells


def user_values(shell: InteractiveShell) -> dict[str, int]:
    """The user's variables (not IPython's ``_``, ``In``, ``Out``...), by identity."""
    hidden = set(shell.user_ns_hidden) | {"In", "Out", "exit", "quit", "get_ipython"}
    return {k: id(v) for k, v in shell.user_ns.items() if not k.startswith("_") and k not in hidden}


def ipython_refuses_nul(cell: str, error: BaseException | None) -> bool:
    """IPython 7 writes a magic line's NUL byte into the Python it compiles, which refuses it,
    for every magic: the cell never reaches kerasmagic (IPython 8 escapes it)."""
    nul = "\x00" in cell.partition("\n")[0] and IPython.version_info < (8,)
    return nul and isinstance(error, SyntaxError) and "null bytes" in str(error)


def check_cell(shell: InteractiveShell, capsys: pytest.CaptureFixture[str], cell: str) -> str:
    """Run one fuzzed cell; return "refused", "help" or "accepted"; fail on anything else."""
    shell.user_ns.pop("z", None)
    before = user_values(shell)
    result = shell.run_cell(cell, store_history=True)
    captured = capsys.readouterr()
    out, err = ANSI.sub("", captured.out), ANSI.sub("", captured.err)
    text = out + err
    what = repr(cell[:300])
    raw = "Traceback" in text or "Error in" in text or "Exception ignored" in text
    faultcounts.add("bad inputs")
    faultcounts.add("raw tracebacks", raw)
    assert not raw, (what, text[-2000:])
    if ipython_refuses_nul(cell, result.error_before_exec):
        assert user_values(shell) == before, what
        return "refused"
    assert result.error_before_exec is None, (what, result.error_before_exec)
    error = result.error_in_exec
    if error is not None:
        assert isinstance(error, UsageError), (what, repr(error))
        lines = text.splitlines()
        assert len(lines) == 1 and lines[0].startswith("UsageError: "), (what, text[-2000:])
        assert len(lines[0]) <= 400, (what, lines[0][:500])
        assert "z" not in shell.user_ns, what
        after = user_values(shell)
        faultcounts.add("user values lost", after != before)
        assert after == before, (what, set(before) ^ set(after))
        return "refused"
    assert "Error" not in err, (what, err[-2000:])
    if "usage: %" in out:  # the help, and the cell not run
        assert "z" not in shell.user_ns and user_values(shell) == before, what
        return "help"
    shell.user_ns.pop("z", None)
    after = user_values(shell)
    if "--all" in cell.splitlines()[0]:  # --all drops every model, here the user's ``base``
        assert "base" not in after, what
        shell.user_ns["base"] = shell.user_ns["build"]()
        after = user_values(shell) | {"base": before["base"]}
    assert after == before, what
    return "accepted"


@pytest.fixture
def fuzz_shell(kip: InteractiveShell) -> InteractiveShell:
    """``kip`` with two models, one only in ``Out[]`` (what a cleanup drops), and data."""
    run(kip, "base = build()\narr = x.copy()\nbuild()")
    return kip


def run_all(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str], cells: list[str]
) -> dict[str, int]:
    capsys.readouterr()
    arr, arr_bytes = shell.user_ns["arr"], shell.user_ns["arr"].tobytes()
    counts = {"refused": 0, "help": 0, "accepted": 0}
    start = time.perf_counter()
    for cell in cells:
        counts[check_cell(shell, capsys, cell)] += 1
    elapsed_s = time.perf_counter() - start
    assert shell.user_ns["arr"] is arr and arr.tobytes() == arr_bytes
    with capsys.disabled():
        print(f"\nfuzz: {len(cells)} cells, {counts}, {elapsed_s:.1f} s")
    return counts


def test_fuzzed_fresh_model_lines(
    fuzz_shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    counts = run_all(fuzz_shell, capsys, fresh_model_cells(random.Random(SEED), CASES))
    assert counts["refused"] > CASES // 2 and counts["help"] and counts["accepted"], counts


def test_fuzzed_gpu_mem_lines(
    fuzz_shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    counts = run_all(fuzz_shell, capsys, gpu_mem_cells(random.Random(SEED + 1), CASES))
    assert counts["refused"] > CASES // 2 and counts["help"] and counts["accepted"], counts


def test_fuzzed_magics_of_the_wrong_kind(
    fuzz_shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    counts = run_all(fuzz_shell, capsys, wrong_kind_cells(random.Random(SEED + 2), 60))
    assert counts == {"refused": 60, "help": 0, "accepted": 0}
