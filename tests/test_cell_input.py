"""``%%fresh_model`` and ``%gpu_mem`` on every kind of cell and magic line, in a real shell.

Loop cells rebind their names; cells run as plain cells do (top-level ``await``, ``__future__``,
``!cmd``, huge bodies, ``Cell In[N]`` tracebacks); every bad magic line is one ``UsageError``
line that drops nothing and runs nothing (checked on seeded fuzzed lines).
"""

from __future__ import annotations

import ast
import importlib.util
import random
import re
import sys
import time
import weakref
from typing import Any

import faultcounts
import pytest
from conftest import kernel_run as kernel_run_text
from conftest import names_cell, real_kernel, run
from IPython.core.compilerop import CachingCompiler
from IPython.core.error import UsageError
from IPython.core.inputtransformer2 import TransformerManager
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from jupyter_client.manager import start_new_kernel
from shared_cells import INTERRUPT_IN_GC_CALLBACK

from kerasmagic.cells.rebinding import rebinding_in
from kerasmagic.cells.run import AwaitTransformer
from kerasmagic.magics import parse_line

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def fresh(shell: InteractiveShell, cell: str, line: str = "-q") -> object:
    return run(shell, f"%%fresh_model {line}\n{cell}")


def output(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    return ANSI.sub("", captured.out + captured.err)


def old_model_alive_when_cell_starts(kip: InteractiveShell, cell: str) -> bool:
    """Bind ``model``, run ``cell`` under the magic; return whether the old model was alive."""
    run(kip, "model = build()")
    kip.user_ns["old_ref"] = weakref.ref(kip.user_ns["model"])
    fresh(kip, f"alive = old_ref() is not None\n{cell}")
    return bool(kip.user_ns["alive"])


# --- A: loop cells --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cell",
    [
        "for fold in range(2):\n    model = build()\n    model.fit(x, y, verbose=0)",
        "i = 0\nwhile i < 2:\n    model = build()\n    i += 1",
        "for a in range(1):\n    for b in range(1):\n        model = build()",
        "try:\n    model = build()\nexcept ValueError:\n    pass",
    ],
)
def test_loop_and_try_bodies_rebind(kip: InteractiveShell, cell: str) -> None:
    assert not old_model_alive_when_cell_starts(kip, cell)


@pytest.mark.parametrize(
    "cell",
    [
        "retrain = False\nif retrain:\n    model = build()",
        "if len(x) > 0:\n    for i in range(1):\n        model = build()",
        "for model in []:\n    pass",  # an empty loop leaves the old value in place
        "for i in range(2):\n    prev = model\n    model = build()",
        "for i in range(2):\n    if i == 9:\n        break\n    model = build()",
        "def get():\n    return model\nfor i in range(1):\n    model = build()",
        "try:\n    pass\nexcept ValueError:\n    model = build()",
    ],
)
def test_conditional_or_read_first_keeps_the_old_model(kip: InteractiveShell, cell: str) -> None:
    assert old_model_alive_when_cell_starts(kip, cell)


def test_if_cell_never_loses_a_trained_model(kip: InteractiveShell) -> None:
    run(kip, "model = build()\nmodel.fit(x, y, verbose=0);\nretrain = False")
    trained = kip.user_ns["model"]
    fresh(kip, "if retrain:\n    model = build()\nmodel.fit(x, y, verbose=0);")
    assert kip.user_ns["model"] is trained


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("async for i in agen():\n    model = f()", {"model"}),
        ("with s:\n    for i in r:\n        model = f()", {"model"}),
        ("for i in r:\n    with s:\n        if c:\n            continue\n        m = f()", set()),
        ("for i in r:\n    pass\nelse:\n    model = f()", set()),
        ("while True:\n    model = f()\n    break", {"model"}),
        ("match c:\n    case 1:\n        model = f()", set()),
        ("try:\n    a = f()\nfinally:\n    b = g()", {"a", "b"}),
        ("try:\n    pass\nexcept E:\n    pass\nelse:\n    model = f()", set()),
        ("g = lambda: model\nmodel = f()", {"g"}),
        ("best = [m for m in model]\nmodel = f()", {"best"}),
        ("for model.x in r:\n    model = f()", set()),
        ("for i in model:\n    model = f()", set()),
    ],
)
def test_rebinding_rule(source: str, names: set[str]) -> None:
    assert rebinding_in(ast.parse(source)).names == names


# --- B: cells run as plain cells do ---------------------------------------------------------


def test_a_rerun_cell_runs_the_same_code_below_the_same_frames(ip: InteractiveShell) -> None:
    """TF's eager runtime caches the innermost frames of each op by code object: a re-run runs
    the code compiled the first time, and the frames within TF's window of the cell's frame are
    the same objects' code each run (IPython compiles a new code object per run;
    benchmarks/cell_code_objects.py measures what this keeps)."""
    from kerasmagic.cells.run import PADDING_FRAMES

    run(ip, "import sys\nseen = []")
    ip.user_ns["PADDING_FRAMES"] = PADDING_FRAMES
    body = (
        "f, codes = sys._getframe(), []\n"
        "while f is not None and len(codes) <= PADDING_FRAMES:\n"
        "    codes.append(f.f_code)\n"
        "    f = f.f_back\n"
        "seen.append(codes)"
    )
    for _ in range(3):
        fresh(ip, body)
    first, *later = ip.user_ns["seen"]
    assert all(len(codes) == PADDING_FRAMES + 1 for codes in ip.user_ns["seen"])
    assert all(all(a is b for a, b in zip(first, codes, strict=True)) for codes in later)
    run(ip, body)  # a plain cell: a new code object each run, as IPython compiles it
    run(ip, body)
    assert ip.user_ns["seen"][-1][0] is not ip.user_ns["seen"][-2][0]


def test_top_level_await(ip: InteractiveShell) -> None:
    run(ip, "import asyncio")
    fresh(ip, "await asyncio.sleep(0)\nawaited = True")
    assert ip.user_ns["awaited"] is True
    assert fresh(ip, "await asyncio.sleep(0, result=42)") == 42
    assert ip.user_ns["Out"][ip.execution_count - 1] == 42


@pytest.mark.parametrize("flag", ["--help", "-h", "--dry-run"])
def test_an_awaiting_cell_that_runs_nothing_is_no_error(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """The transformer writes ``await run_cell_magic(...)``: the magic returned None for
    ``--help`` and ``--dry-run``, and the cell raised "NoneType can't be used in 'await'"."""
    run(ip, "import asyncio")
    result = ip.run_cell(f"%%fresh_model {flag}\nawaited = await asyncio.sleep(0, result=1)")
    assert result.error_in_exec is None and result.result is None, result.error_in_exec
    assert "awaited" not in ip.user_ns  # nothing ran
    out = capsys.readouterr().out
    assert ("usage: %%fresh_model" if flag != "--dry-run" else "kerasmagic: ") in out
    assert ip.run_cell_magic("fresh_model", flag, "await asyncio.sleep(0)") is None  # no loop


def test_await_without_the_transformer_runs_on_the_shells_loop(ip: InteractiveShell) -> None:
    run(ip, "import asyncio")
    assert ip.run_cell_magic("fresh_model", "-q", "await asyncio.sleep(0, result=3)") == 3


def test_await_transformer_follows_load_and_unload(ip: InteractiveShell) -> None:
    assert ip.transform_cell("%%fresh_model -q\nawait f()").startswith("await get_ipython()")
    assert ip.transform_cell("%%fresh_model -q\nf()").startswith("get_ipython()")
    ip.run_line_magic("unload_ext", "kerasmagic")
    try:
        assert not any(isinstance(t, AwaitTransformer) for t in ip.input_transformers_cleanup)
    finally:
        ip.run_line_magic("load_ext", "kerasmagic")


def test_top_level_await_in_a_real_kernel() -> None:
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        kernel_run(client, "%load_ext kerasmagic\nimport asyncio")
        shown = kernel_run(client, "%%fresh_model -q\nv = await asyncio.sleep(0, result=5)\nv * 2")
        assert shown == ["10"] and kernel_run(client, "v") == ["5"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def kernel_run(client: Any, code: str) -> list[str]:
    """Run ``code`` in the kernel; return its shown results (errors as ``!Name: value``)."""
    msg_id = client.execute(code)
    shown = []
    while True:
        msg = client.get_iopub_msg(timeout=120)
        kind, content = msg["msg_type"], msg["content"]
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if kind == "execute_result":
            shown.append(content["data"]["text/plain"])
        elif kind == "error":
            shown.append(f"!{content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            return shown


def test_semicolon_silences_the_last_value_as_in_a_plain_cell(ip: InteractiveShell) -> None:
    assert fresh(ip, "41 + 1;  # comment") is None
    assert ip.execution_count - 1 not in ip.user_ns["Out"]
    run(ip, "import asyncio")
    assert fresh(ip, "await asyncio.sleep(0, result=1);") is None
    assert fresh(ip, "'a;b'") == "a;b"


def test_async_for_loop_rebinds(kip: InteractiveShell) -> None:
    run(kip, "async def folds():\n    for i in range(2):\n        yield i")
    assert not old_model_alive_when_cell_starts(kip, "async for f in folds():\n    model = build()")


def test_future_import_in_the_cell_holds_for_later_cells(ip: InteractiveShell) -> None:
    flags = ip.compile.flags
    try:
        fresh(ip, "from __future__ import annotations\ndef f(v: int): pass\na1 = f.__annotations__")
        run(ip, "def g(v: int): pass\na2 = g.__annotations__")
    finally:
        ip.compile.flags = flags
    assert ip.user_ns["a1"] == {"v": "int"} and ip.user_ns["a2"] == {"v": "int"}


def test_magics_and_shell_commands_in_the_cell(ip: InteractiveShell) -> None:
    fresh(ip, "!echo hi\n%time t = 1\nout = %sx echo hi\nn = len(out)")
    assert list(ip.user_ns["out"]) == ["hi"] and ip.user_ns["n"] == 1 and ip.user_ns["t"] == 1
    if ip.run_cell("plain = !echo hi").error_before_exec is not None:
        return  # IPython 7.34 on Python 3.12+ cannot read "x = !cmd" in any cell (Colab's)
    fresh(ip, "out2 = !echo hi\nn2 = len(out2)")
    assert list(ip.user_ns["out2"]) == ["hi"] and ip.user_ns["n2"] == 1


def test_two_megabyte_cell_is_parsed_in_linear_time(ip: InteractiveShell) -> None:
    body = "".join(f"a{i} = 1  # {'padding ' * 5}\n" for i in range(40_000))
    assert len(body) > 2_000_000
    start = time.perf_counter()
    fresh(ip, body)
    elapsed_s = time.perf_counter() - start
    assert ip.user_ns["a39999"] == 1
    assert elapsed_s < 30  # a quadratic scan took 45 s; linear is ~3 s here


def test_traceback_names_the_cell_and_hides_kerasmagic(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(ip, "1")
    number = ip.execution_count
    ip.run_cell("%%fresh_model -q\nz = 1\nraise ValueError('boom')", store_history=True)
    text = output(capsys)
    assert names_cell(text, number, 3) and "ValueError: boom" in text
    assert "Cell In[0]" not in text and "kerasmagic" not in text and "run_padded" not in text
    # from the cell's own line on, as a plain cell: not IPython's call of the magic above it
    assert "run_cell_magic" not in text and "hidden" not in text


def test_lines_keep_their_numbers_after_leading_blank_lines(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """IPython drops a cell's leading blank lines before compiling: the line an error names is
    still the line of the notebook cell, under %%fresh_model and in an isolated cell."""
    number = ip.execution_count
    ip.run_cell("%%fresh_model -q\n\n  \nz = 1\nraise ValueError('boom')", store_history=True)
    assert names_cell(output(capsys), number, 5)
    number = ip.execution_count
    ip.run_cell("%%fresh_model -q --isolate\n\nz = (1,\n", store_history=True)
    text = output(capsys)
    # (Python 3.13's incomplete input is a SyntaxError IPython 7 shows by its own class name)
    assert names_cell(text, number, 3) and re.search(r"\w*Error: incomplete input", text), text
    assert ".py, line" not in text and "Traceback" not in text  # not a temporary file's name
    if importlib.util.find_spec("cloudpickle") is not None:  # isolation's own need
        ip.run_cell("%%fresh_model -q --isolate\n\n\nz = 1\nraise ValueError(3)")
        assert '"<isolated cell>", line 5' in output(capsys)


# --- B2: cells that do not compile are refused as plain cells are -------------------------

BAD_BODIES = {
    "syntax": "z = 1 +\n",
    "unclosed": "z = (1,\n",
    "indent": "  z = 1\ny = 2\n",
    "dedent": "if True:\n    z = 1\n  y = 2\n",
    "tabs": "def f():\n\tif 1:\n        pass\n",
    "return": "z = 1\nreturn z\n",
    "break": "z = 1\nbreak\n",
    "duplicate argument": "def f(a, a):\n    pass\n",
    "nul": "z = 1\x00\n",
    "parentheses": "z = " + "(" * 300 + ")" * 300 + "\n",
    "nested blocks": "".join(" " * i + "if 1:\n" for i in range(120)) + " " * 120 + "z = 1\n",
    "deep unary": "z = " + "-" * 100_000 + "1\n",  # the parser's stack: MemoryError
    "deep lambdas": "z = " + "lambda: " * 5_000 + "1\n",
}


def shown_error(text: str) -> str:
    """Return the last line of a shown error (``SyntaxError: invalid syntax``)."""
    return text.strip().splitlines()[-1]


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_a_cell_that_does_not_compile_is_refused_as_a_plain_cell_is(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str], body: str
) -> None:
    plain = ip.run_cell(body, store_history=True)
    plain_text = output(capsys)
    ip.user_ns.pop("z", None)  # IPython runs a plain cell's statements up to one that fails
    number = ip.execution_count
    result = ip.run_cell(f"%%fresh_model -q\n{body}", store_history=True)
    text = output(capsys)
    error = result.error_before_exec
    if plain.success:  # IPython 7 dedents a first line's indent: then the cell is valid
        assert result.success and ip.execution_count == number + 1, text
        return
    assert result.error_in_exec is None and isinstance(error, SyntaxError), text[-500:]
    assert "kerasmagic" not in text and "Traceback" not in text and "run_cell_magic" not in text
    assert "z" not in ip.user_ns and ip.execution_count == number + 1
    if isinstance(plain.error_before_exec, SyntaxError):  # else the parser's MemoryError
        assert type(error) is type(plain.error_before_exec)
        assert shown_error(text) == shown_error(plain_text)
    else:
        assert shown_error(text).startswith("SyntaxError: too deeply nested")
    if error.lineno is not None:  # the magic's line is line 1: the body's lines are one down
        assert error.lineno == (plain.error_before_exec.lineno or 0) + 1  # type: ignore[union-attr]
        where = ("File <tokenize>:{line}", "File <string>:{line}", 'File "<string>", line {line}')
        # (IPython's tokenizer found it, before Python's compiler; 3.11, 3.12+)
        in_tokenizer = any(w.format(line=error.lineno) in text for w in where)
        assert names_cell(text, number, error.lineno) or in_tokenizer, text


def test_a_cell_that_does_not_compile_runs_no_cleanup(kip: InteractiveShell) -> None:
    run(kip, "model = build()")
    run(kip, "build()")  # held by Out[] only: the first thing a cleanup drops
    held = kip.user_ns["Out"][kip.execution_count - 1]
    result = kip.run_cell("%%fresh_model\nmodel = build()\nreturn 5", store_history=True)
    assert isinstance(result.error_before_exec, SyntaxError)
    assert kip.user_ns["Out"][kip.execution_count - 2] is held


def test_a_cell_is_parsed_once_and_the_parse_is_not_kept(ip: InteractiveShell) -> None:
    from kerasmagic.shellstate import state_of

    state = state_of(ip)
    assert state is not None
    parses = []
    real_parse = ip.compile.ast_parse

    def counted(*args: Any, **kwargs: Any) -> Any:
        parses.append(args[0])
        return real_parse(*args, **kwargs)

    ip.compile.ast_parse = counted  # type: ignore[method-assign]
    try:
        fresh(ip, "parsed_once = 1")
    finally:
        del ip.compile.ast_parse
    assert ip.user_ns["parsed_once"] == 1
    body_parses = [p for p in parses if "parsed_once" in p and "run_cell_magic" not in p]
    assert body_parses == ["\nparsed_once = 1\n"]
    cache = state.part("cells")
    assert cache.checked is None and cache.transformed is None
    ip.run_cell("%%fresh_model --bogus\nkept_parse = 1", store_history=True)  # refused line
    assert cache.checked is None and cache.transformed is None


def test_a_cell_being_typed_is_not_called_invalid(ip: InteractiveShell) -> None:
    """Terminal IPython and Jupyter's is_complete ask while the user types: no SyntaxError yet."""
    manager = ip.input_transformer_manager
    assert manager.check_complete("%%fresh_model -q\nx = (1,\n")[0] == "incomplete"


def test_an_isolated_cell_that_needs_ipython_is_refused_in_one_line(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    """The child is plain Python: a get_ipython() there failed late, with NameError."""
    for body in ("shell = get_ipython()\nz = 1", "%time z = 1", "z = 1\n!echo hi"):
        result = ip.run_cell(f"%%fresh_model --isolate\n{body}", store_history=True)
        text = output(capsys)
        assert text.startswith("UsageError: an isolated cell runs plain Python"), text
        assert text.strip().count("\n") == 0 and "z" not in ip.user_ns
        assert isinstance(result.error_in_exec, UsageError)


def test_isolate_without_cloudpickle_says_what_to_install_in_one_line(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # as if not installed
    ip.user_ns["z"] = "kept"
    result = ip.run_cell("%%fresh_model --isolate --outputs z\nz = 1", store_history=True)
    text = output(capsys)
    assert text == "UsageError: --isolate needs cloudpickle: pip install 'kerasmagic[isolate]'\n"
    assert isinstance(result.error_in_exec, UsageError) and ip.user_ns["z"] == "kept"


@pytest.mark.slow
def test_an_isolated_cell_may_import_get_ipython_itself(ip: InteractiveShell) -> None:
    fresh(ip, "from IPython import get_ipython\nz = get_ipython()", "-q --isolate --outputs z")
    assert ip.user_ns["z"] is None  # as in any plain Python process


CYCLE_THAT_INTERRUPTS = """
import gc, os, signal
class Bomb:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # Python runs the SIGINT handler here
            pass
gc.disable()  # collected by the cleanup's gc.collect(), not before
bomb = Bomb()
bomb.me = bomb
del bomb
"""


def test_a_ctrl_c_held_through_the_cleanup_shows_no_kerasmagic_frame(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    run(ip, CYCLE_THAT_INTERRUPTS)
    try:
        result = ip.run_cell("%%fresh_model -q\nz = 1", store_history=True)
    finally:
        run(ip, "gc.enable()")
    text = output(capsys)
    assert isinstance(result.error_in_exec, KeyboardInterrupt) and "z" not in ip.user_ns
    assert "kerasmagic" not in text and "held.py" not in text, text


# --- C: bad magic lines ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('--keep "base', "No closing quotation"),
        ("--keep bsae", "did you mean 'base'?"),
        ("--keep base,1x", "'1x' is not a Python name"),
        ("--all --keep $name", "'$name' is not a Python name"),  # no $var expansion
    ],
)
def test_bad_fresh_model_lines(
    kip: InteractiveShell, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    run(kip, "base = build()\nmodel = build()\nname = 'base'")
    models = kip.user_ns["base"], kip.user_ns["model"]
    capsys.readouterr()
    kip.run_cell(f"%%fresh_model {line}\nmodel = build()\nz = 1", store_history=True)
    text = output(capsys)
    faultcounts.add("bad inputs")
    faultcounts.add("raw tracebacks", "Traceback" in text)
    faultcounts.add("user values lost", (kip.user_ns["base"], kip.user_ns["model"]) != models)
    assert text.strip().count("\n") == 0 and text.startswith("UsageError:") and message in text
    assert (kip.user_ns["base"], kip.user_ns["model"]) == models and "z" not in kip.user_ns


def test_keep_splits_commas_and_accepts_names_the_cell_defines(kip: InteractiveShell) -> None:
    run(kip, "base = build()\nenc = build()\nother = build()")
    fresh(kip, "z = 1", line="--all --keep base,enc")
    assert {"base", "enc"} <= set(kip.user_ns) and "other" not in kip.user_ns
    fresh(kip, "newname = 1", line="--keep newname")
    assert kip.user_ns["newname"] == 1


def test_empty_gpus_spec_reaches_the_isolate_helper(ip: InteractiveShell) -> None:
    args = parse_line(ip.find_cell_magic("fresh_model"), '--isolate --gpus ""')
    assert args.gpus == ""


@pytest.mark.parametrize("value", ["abc", "-5", "1e99", "0", "99999999999"])
def test_gpu_mem_limit_must_be_megabytes(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    ip.run_cell(f"%gpu_mem --limit {value}")
    text = output(capsys)
    assert text.startswith("UsageError: argument --limit: expected whole megabytes, 1 to")
    assert text.strip().count("\n") == 0


# --- D: fuzzed magic lines ------------------------------------------------------------------

FLAGS = ["--keep", "--dry-run", "-q", "--inputs", "--outputs", "--timeout", "--gpus", "--on"]
GPU_FLAGS = ["--limit", "--growth", "--reset-peak", "--json", "--deep=1", "--live=x"]
JUNK = [
    *("--", "-", "---", "-k", "--keep=", "--all=1", "--limit=", "=", ",", "a,,b", "base,"),
    *("bsae", "arr", "123", "1e99", "nan", "-5", "inf", "0x10", "None", "class"),
    *('"', "'", '"open', "'x", '""', "''", "\\", '"a b"', '"""', "`ls`"),
    *("ünïcödé", "名前", "🙂", "\u200b", "$arr", "{arr}", "${x}", "$(ls)", "%", "!", "?", "#"),
]
GOOD = {
    "fresh_model": ["-q", "--dry-run", "--keep base", "--keep arr,base", "--quiet", ""],
    "gpu_mem": ["--json", "--reset-peak", ""],
}
BAD = ['"', "--bogus", "--keep bsae", "--keep 9", "'open", "--limit abc"]


def fuzz_lines(rng: random.Random, flags: list[str], good: list[str], count: int) -> list[str]:
    """Random flag/junk lines; a quarter carry ``--all`` with a bad token (must drop nothing)."""
    lines = []
    for i in range(count):
        words = [rng.choice(flags + JUNK) for _ in range(rng.randint(1, 6))]
        if i % 4 == 1:
            words = rng.sample(good, 2)
        elif i % 4 == 0:
            words = ["--all", *words, rng.choice(BAD)]
        if i % 25 == 0:
            words.append(rng.choice(JUNK) * rng.randint(2_000, 10_000))
        lines.append(" ".join(words))
    return lines


def check_one(shell: InteractiveShell, capsys: pytest.CaptureFixture[str], cell: str) -> bool:
    """Run one fuzzed cell; return whether it was refused; fail on any other kind of error."""
    shell.user_ns.pop("z", None)
    result = shell.run_cell(cell, store_history=True)
    text = output(capsys)
    refused = "UsageError:" in text
    faultcounts.add("bad inputs")
    faultcounts.add("raw tracebacks", "Traceback" in text or "Error in" in text)
    assert "Traceback" not in text and "Error in" not in text, cell[:200]
    assert result.error_before_exec is None, cell[:200]
    assert result.error_in_exec is None or refused, (cell[:200], result.error_in_exec)
    if refused:
        error_lines = [x for x in text.splitlines() if "Error" in x]
        assert len(error_lines) == 1 and error_lines[0].startswith("UsageError:"), cell[:200]
        assert len(error_lines[0]) < 400 and "z" not in shell.user_ns, cell[:200]
    elif cell.startswith("%%") and "--dry-run" not in cell.partition("\n")[0]:
        assert shell.user_ns["z"] == 1, cell[:200]
    return refused


def test_fuzzed_magic_lines(kip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    run(kip, "base = build()\narr = x.copy()")
    base, arr, arr_bytes = kip.user_ns["base"], kip.user_ns["arr"], kip.user_ns["arr"].tobytes()
    rng = random.Random(8_9)
    cells = [
        f"%%fresh_model {line}\nz = 1" for line in fuzz_lines(rng, FLAGS, GOOD["fresh_model"], 120)
    ]
    cells += [f"%gpu_mem {line}" for line in fuzz_lines(rng, GPU_FLAGS, GOOD["gpu_mem"], 120)]
    capsys.readouterr()
    start = time.perf_counter()
    refused = sum(check_one(kip, capsys, cell) for cell in cells)
    elapsed_s = time.perf_counter() - start
    lost = kip.user_ns.get("base") is not base or kip.user_ns.get("arr") is not arr
    faultcounts.add("user values lost", lost or arr.tobytes() != arr_bytes)
    assert kip.user_ns["base"] is base and kip.user_ns["arr"] is arr
    assert arr.tobytes() == arr_bytes
    with capsys.disabled():
        print(
            f"\nfuzz: {len(cells)} magic lines, {refused} refused with one UsageError line, "
            f"{len(cells) - refused} accepted, 0 tracebacks, 0 values lost, {elapsed_s:.1f} s"
        )


def test_autograph_converts_lambdas_under_the_magic(kip: InteractiveShell) -> None:
    """AutoGraph finds a lambda by parsing the cell's cached source: it must be Python."""
    with capture_output() as out:
        result = kip.run_cell(
            "%%fresh_model -q\nds = tf.data.Dataset.range(4).map(lambda v: v * 2)\n"
            "got = [int(v) for v in ds.as_numpy_iterator()]",
            store_history=True,
        )
    assert result.success and kip.user_ns["got"] == [0, 2, 4, 6]
    assert "could not transform" not in out.stdout + out.stderr


# --- E: in a real kernel, no traceback shows kerasmagic -------------------------------------

GOOD_CELLS = [
    "for fold in range(2):\n    model = build()\n    model.fit(x, y, verbose=0)\n",
    "def f(a, b=2):\n    return [a * b for _ in range(3)]\nz = f(1)\n",
    "with open('f') as fh:\n    text = fh.read()\n",
    "class A:\n    def m(self):\n        return {'k': (1, 2)}\n",
    "z = lambda v: v ** 2\nprint(f'{z(3)}')\n",
    "try:\n    import numpy as np\nexcept ImportError:\n    np = None\n",
    "async def g():\n    await asyncio.sleep(0)\n",
    "%time z = 1\n!echo hi\n",
]
BREAKS = [
    *("(", ")", "[", "]", "{", ":", "'", '"', '"""', "\\", "\t", "\x00", "\n  ", "\n\t"),
    *("return ", "break", "yield ", "def ", "lambda", "=", "**", "@", "async ", "else:"),
    *("nonlocal q", ",", ".", "1a", "f'{", "global z\n", "*a = 1\n", "del 1\n"),
]


def refusal(body: str) -> str | None:
    """Return the last line IPython shows for ``body`` under ``%%fresh_model`` if it does not
    compile (computed here, from IPython's transform and Python's compiler), else None."""
    compiler = CachingCompiler()  # IPython's own: its flags shape Python's messages
    try:
        code = TransformerManager().transform_cell(body)
        with compiler.extra_flags(ast.PyCF_ALLOW_TOP_LEVEL_AWAIT):
            compiler(compiler.ast_parse("\n" + code), "<cell>", "exec")
    except SyntaxError as error:
        return f"{type(error).__name__}: {error.msg}"
    except (MemoryError, RecursionError, ValueError):
        return "SyntaxError: too deeply nested"
    return None


def fuzzed_bad_bodies(rng: random.Random, count: int) -> list[str]:
    """Good cells broken at random places (a bracket, a quote, an indent, a NUL byte, a
    statement out of place, a character dropped): those that do not compile."""
    bodies: list[str] = []
    while len(bodies) < count:
        body = rng.choice(GOOD_CELLS)
        at = rng.randrange(len(body))
        if rng.random() < 0.25:
            body = body[:at] + body[at + rng.randint(1, 3) :]
        else:
            body = body[:at] + rng.choice(BREAKS) + body[at:]
        if refusal(body) is not None:
            bodies.append(body)
    return bodies


@pytest.mark.slow
def test_no_bad_cell_shows_kerasmagic_in_a_real_kernel(tmp_path: Any) -> None:
    """Fuzzed bodies that do not compile, a Ctrl-C held through the cleanup, one the cell sends
    itself, one lost in a gc callback and a runtime error: each traceback shows the user's
    lines, never kerasmagic's."""
    known = [body for body in BAD_BODIES.values() if refusal(body) is not None]  # IPython 7
    bodies = [*known, *fuzzed_bad_bodies(random.Random(20), 150)]  # takes "  z = 1\ny = 2"
    interrupting = {
        "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nz = 1": "KeyboardInterrupt",
        INTERRUPT_IN_GC_CALLBACK: "KeyboardInterrupt",
        "def f():\n    return 1 / 0\nf()": "ZeroDivisionError",
    }
    shown = 0
    with real_kernel(str(tmp_path)) as (_, client):
        kernel_cell(client, CYCLE_THAT_INTERRUPTS)  # a Ctrl-C held through the cleanup
        reply, text = kernel_cell(client, "%%fresh_model -q\nz = 1")
        kernel_cell(client, "gc.enable()")
        assert reply["ename"] == "KeyboardInterrupt" and "kerasmagic" not in text, text
        for body in bodies:
            reply, text = kernel_cell(client, f"%%fresh_model -q\n{body}")
            expected = refusal(body)
            faultcounts.add("bad inputs")
            faultcounts.add("raw tracebacks", "kerasmagic" in text or "Traceback" in text)
            assert reply["status"] == "error" and expected is not None, body[:200]
            assert "kerasmagic" not in text and "run_cell_magic" not in text, (body[:200], text)
            assert ANSI.sub("", text).strip().splitlines()[-1].startswith(expected), text
            shown += 1
        for body, ename in interrupting.items():
            for cell in (body, f"%%fresh_model -q\n{body}"):
                reply, text = kernel_cell(client, cell)
                assert reply["ename"] == ename and "kerasmagic" not in text, (cell, text)
                shown += 1
    assert shown == len(bodies) + 2 * len(interrupting)


def kernel_cell(client: Any, code: str) -> tuple[dict[str, Any], str]:
    """Run ``code`` in the kernel; return its reply and what it showed, colours removed. Bad
    cells follow one another at once: not stopped on error (ipykernel 6.17 would abort the
    next one if it came before it stopped aborting)."""
    reply, text = kernel_run_text(client, code, stop_on_error=False)
    return reply, ANSI.sub("", text)
