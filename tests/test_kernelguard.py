"""Ctrl-C where only the kernel, a library or a gc callback sees it, in a real ipykernel.

Each case makes the kernel send itself SIGINT at one exact point of an execute request: in
ipykernel's code before the cell (without kerasmagic the interrupt escapes and the reply never
comes), in an IPython ``pre_execute`` callback (printed as "Error in callback", the cell runs on),
in a ``post_execute`` callback, in ipykernel's code after the cell (again no reply), inside a
library's bare ``except:`` (TensorFlow's ``DType.max`` among them: dropped, or turned into
``TypeError``) and in a gc callback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import faultcounts
import pytest
from conftest import kernel_run, kernel_value, real_kernel

pytestmark = pytest.mark.slow

ARM = """
import os, signal, sys, time
def sigint_once(owner, name, skip=0):
    '''Make ``owner.name`` (a method or an event) send this kernel SIGINT on a later call.'''
    calls = [0]
    def due():
        calls[0] += 1
        return calls[0] > skip
    def fire():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs here
    if name in get_ipython().events.callbacks:
        def callback(*args):
            if due():
                get_ipython().events.unregister(name, callback)
                fire()
        get_ipython().events.register(name, callback)
        return
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        if due():
            setattr(owner, name, original)
            fire()
        return original(*args, **kwargs)
    setattr(owner, name, wrapper)
"""
LIBRARY = """
import gc, os, signal, time
def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # the handler runs here
def swallow():
    try:
        ctrl_c()
    except:
        pass
    return 1
def convert():
    try:
        ctrl_c()
    except:
        raise TypeError("Cannot find maximum value")
def retry():
    while True:
        try:
            time.sleep(0.01)
        except:
            pass
class Scope:
    # a context stack like TensorFlow's device and autograph scopes
    stack = []
    def __enter__(self):
        Scope.stack.append(self)
    def __exit__(self, *exc):
        assert Scope.stack.pop() is self, "scope nesting broken"
released = []
def deliberate():
    try:
        ctrl_c()
    except KeyboardInterrupt:
        return "stopped"
def reworded():
    try:
        ctrl_c()
    except KeyboardInterrupt:
        raise KeyboardInterrupt("Interrupted by user") from None  # as ipykernel's input() does
def through_a_with():
    with Scope():
        ctrl_c()
def swallowed_in_a_with():
    with Scope():
        try:
            ctrl_c()
        except:
            pass
    return 1
def swallowed_twice():
    try:
        swallow()  # raised again as swallow() goes on: caught here a second time
    except:
        pass
    return 1
def run_callback(fn):
    # a library calling the user's code (Keras's fit calling a callback), then going on
    fn()
    return "fit done"
def collect_in_a_bare_except():
    # the Ctrl-C lands in a gc callback, lost there, then raised in this frame's try
    try:
        gc.collect()
    except:
        pass
    return 1
def swallowed_before_a_finally():
    try:
        try:
            ctrl_c()
        except:
            pass
    finally:
        released.append(1)
"""
CELL = "ran = True"
CLEAN = "KeyboardInterrupt caught", "Error in callback", "kerasmagic:"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real ipykernel with kerasmagic loaded, ``sigint_once`` defined, and a library with
    bare ``except:`` clauses installed (a module under a ``site-packages`` folder)."""
    folder = tmp_path_factory.mktemp("kernelguard")
    (folder / "site-packages").mkdir()
    (folder / "site-packages" / "swallower.py").write_text(LIBRARY)
    with real_kernel(str(folder)) as (_, client):
        kernel_run(client, ARM, timeout_s=60)
        kernel_run(client, f"sys.path.insert(0, {str(folder / 'site-packages')!r})")
        yield client


@pytest.mark.parametrize(
    ("arm", "status", "ran"),
    [
        # ipykernel's code between the execute_input message and IPython's cell runner
        ("sigint_once(get_ipython().kernel, '_forward_input')", "error", False),
        # IPython's own pre_execute callbacks run before kerasmagic's
        ("sigint_once(None, 'pre_execute')", "error", False),
        ("sigint_once(None, 'pre_run_cell')", "error", False),
        # the cell's code is over: the cell is marked interrupted, its values kept
        ("sigint_once(None, 'post_execute', skip=1)", "error", True),
        # ipykernel's code after IPython's: the reply is being built, the Ctrl-C is dropped
        ("sigint_once(get_ipython().kernel, '_restore_input', skip=1)", "ok", True),
    ],
)
def test_ctrl_c_in_the_kernels_code_gets_a_reply(
    client: Any, arm: str, status: str, ran: bool
) -> None:
    content, text = kernel_run(client, f"ran = False\n{arm}", timeout_s=30)
    assert content["status"] == "ok", text
    content, text = kernel_run(client, CELL, timeout_s=30)  # no reply at all: queue.Empty
    faultcounts.add("interrupts sent", 1)
    assert content["status"] == status, text
    assert status == "ok" or content["ename"] == "KeyboardInterrupt"
    assert not any(m in text for m in CLEAN), text
    assert kernel_value(client, "ran") is ran
    content, _ = kernel_run(client, "after = 1", timeout_s=30)
    assert content["status"] == "ok"  # the next cell runs normally


def test_ctrl_c_after_a_nested_run_cell_still_stops_the_cell(client: Any) -> None:
    cell = (
        "ran = False\nget_ipython().run_cell('inner = 1')\n"
        "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\nran = True"
    )
    content, text = kernel_run(client, cell, timeout_s=30)
    assert content["status"] == "error" and content["ename"] == "KeyboardInterrupt", text
    assert kernel_value(client, "[ran, inner]") == [False, 1]


def test_ctrl_c_in_an_async_cell_is_left_to_ipykernel(client: Any) -> None:
    cell = (
        "import asyncio\nran = False\nos.kill(os.getpid(), signal.SIGINT)\n"
        "await asyncio.sleep(5)\nran = True"
    )
    content, text = kernel_run(client, cell, timeout_s=30)
    assert content["status"] == "error", text  # ipykernel cancels the cell's coroutine
    assert kernel_value(client, "ran") is False


def test_a_cells_own_sigint_handler_is_left_alone(client: Any) -> None:
    cell = (
        "caught = []\nsignal.signal(signal.SIGINT, lambda *a: caught.append(1))\n"
        "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.2)"
    )
    content, text = kernel_run(client, cell, timeout_s=30)
    assert content["status"] == "ok", text
    assert kernel_value(client, "caught") == [1]
    kernel_run(client, "signal.signal(signal.SIGINT, signal.default_int_handler)")


def test_unload_gives_the_kernel_its_hooks_back(client: Any) -> None:
    check = (
        "[sorted(n for n in ('pre_handler_hook', 'post_handler_hook') "
        "if n in vars(get_ipython().kernel)), "
        "sum(type(t).__name__ == 'CellStopper' for t in get_ipython().ast_transformers)]"
    )
    assert kernel_value(client, check) == [["post_handler_hook", "pre_handler_hook"], 1]
    kernel_run(client, "%unload_ext kerasmagic")
    assert kernel_value(client, check) == [[], 0]
    kernel_run(client, "%load_ext kerasmagic")
    assert kernel_value(client, check) == [["post_handler_hook", "pre_handler_hook"], 1]


@pytest.mark.parametrize(
    "call", ["swallower.swallow()", "swallower.convert()", "swallower.swallowed_twice()"]
)
def test_ctrl_c_swallowed_by_a_librarys_bare_except_still_stops_the_cell(
    client: Any, call: str
) -> None:
    content, text = kernel_run(client, f"import swallower\nran = False\n{call}\nran = True")
    faultcounts.add("interrupts sent", 1)
    assert content["status"] == "error" and content["ename"] == "KeyboardInterrupt", text
    assert kernel_value(client, "ran") is False
    assert "kerasmagic" not in text  # raised again by kerasmagic: its frames are not shown


@pytest.mark.parametrize(
    "call",
    ["through_a_with()", "swallowed_in_a_with()", "swallowed_before_a_finally()"],
)
def test_a_librarys_exits_and_finally_blocks_still_run(client: Any, call: str) -> None:
    """Raised again at the code that leaves a ``with`` or enters a ``finally``, the interrupt
    skipped the ``__exit__`` or the ``finally`` (TensorFlow's scopes then broke: AssertionError,
    "Exiting device scope without proper scope nesting")."""
    kernel_run(client, "import swallower\nswallower.released.clear()")
    content, text = kernel_run(client, f"ran = False\nswallower.{call}\nran = True")
    faultcounts.add("interrupts sent", 1)
    assert content["status"] == "error" and content["ename"] == "KeyboardInterrupt", text
    assert kernel_value(client, "[ran, len(swallower.Scope.stack)]") == [False, 0]
    if "finally" in call:
        assert kernel_value(client, "swallower.released") == [1]


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("result = swallower.deliberate()", "stopped"),
        # IPython's !cmd stops the command on Ctrl-C, prints it and goes on (exit code -2)
        (
            "threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
            "!sleep 5\nresult = _exit_code",
            -2,
        ),
    ],
)
def test_a_librarys_own_except_keyboardinterrupt_is_respected(
    client: Any, cell: str, expected: Any
) -> None:
    content, text = kernel_run(
        client, f"import swallower, threading\nran = False\n{cell}\nran = True"
    )
    faultcounts.add("interrupts sent", 1)
    assert content["status"] == "ok", text
    assert kernel_value(client, "[ran, result]") == [True, expected]


def test_a_librarys_own_keyboardinterrupt_is_shown_as_it_raised_it(client: Any) -> None:
    content, text = kernel_run(client, "import swallower\nswallower.reworded()")
    faultcounts.add("interrupts sent", 1)
    assert content["ename"] == "KeyboardInterrupt", text
    assert content["evalue"] == "Interrupted by user", text


def test_a_library_retry_loop_around_a_bare_except_does_not_keep_the_cell(client: Any) -> None:
    """Raised again where the loop went on without it, the interrupt leaves the loop (and a
    library that caught it more than ``MAX_RAISES`` times would be left to go on, never hung)."""
    cell = (
        "import swallower, threading\n"
        "threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()\n"
        "swallower.retry()"
    )
    content, text = kernel_run(client, cell, timeout_s=30)
    assert content["status"] == "error" and content["ename"] == "KeyboardInterrupt", text


@pytest.mark.parametrize(
    "cell",
    [
        "try:\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(0.2)\n"
        "except KeyboardInterrupt:\n    caught = True\nran = True",
        "def train():\n    try:\n        os.kill(os.getpid(), signal.SIGINT)\n"
        "        time.sleep(0.2)\n    except KeyboardInterrupt:\n        return 'stopped'\n"
        "caught = train() == 'stopped'\nran = True",
        # raised again by kerasmagic as a library's bare except dropped it: still the user's
        "import swallower\ndef train():\n    try:\n        swallower.swallow()\n"
        "    except KeyboardInterrupt:\n        return 'stopped'\n"
        "caught = train() == 'stopped'\nran = True",
        "import swallower\ntry:\n    swallower.swallow()\nexcept KeyboardInterrupt:\n"
        "    caught = True\nran = True",
        # ... in a callback a library called: the library goes on, as the user chose
        "import swallower\ndef cb():\n    global caught\n    try:\n        swallower.swallow()\n"
        "    except KeyboardInterrupt:\n        caught = True\n"
        "ran = swallower.run_callback(cb) == 'fit done'",
    ],
)
def test_the_users_own_except_keyboardinterrupt_is_respected(client: Any, cell: str) -> None:
    content, text = kernel_run(client, f"ran = caught = False\n{cell}")
    assert content["status"] == "ok", text
    assert kernel_value(client, "[ran, caught]") == [True, True]


INTERRUPT_IN_GC_CALLBACK = """
import gc
def _interrupt_once(phase, info, fired=[]):
    if phase == "start" and not fired:
        fired.append(1)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass
gc.callbacks.append(_interrupt_once)
reached = False
try:
    gc.collect()
    reached = True
finally:
    gc.callbacks.remove(_interrupt_once)
"""


STATE = "[reached, repr(sys.gettrace()), repr(sys.getprofile()), repr(signal.getsignal(2))]"


def test_ctrl_c_lost_in_a_gc_callback_stops_a_kernel_cell(client: Any) -> None:
    content, text = kernel_run(client, INTERRUPT_IN_GC_CALLBACK)
    if content["status"] != "error":  # seen once in CI (3.13), not here: say what the kernel had
        pytest.fail(f"ran on ({text!r}); reached, tracer, profiler, handler: "
                    f"{kernel_value(client, STATE)}")  # fmt: skip
    assert content["ename"] == "KeyboardInterrupt", text
    assert "Exception ignored" not in text and "kerasmagic" not in text
    assert kernel_value(client, "reached") is False


def test_ctrl_c_lost_in_a_gc_callback_under_a_librarys_bare_except_stops_the_cell(
    client: Any,
) -> None:
    """Keras's ``_maybe_warn_inputs_struct_mismatch`` wraps a tree walk in a bare ``except:``;
    a collection there ran JAX's gc callback, the Ctrl-C landed in it and, raised again in the
    walk unfollowed, was dropped by that except: the cell ran to its end (1 in ~100 random
    Ctrl-Cs of a PyTorch ``fit`` loop)."""
    cell = INTERRUPT_IN_GC_CALLBACK.replace("gc.collect()", "swallower.collect_in_a_bare_except()")
    content, text = kernel_run(client, "import swallower\n" + cell)
    faultcounts.add("interrupts sent", 1)
    assert content["status"] == "error" and content["ename"] == "KeyboardInterrupt", text
    assert "Exception ignored" not in text and "kerasmagic" not in text
    assert kernel_value(client, "reached") is False


@pytest.mark.parametrize("dtype_call", ["finfo", "iinfo"])
def test_ctrl_c_in_tensorflows_dtype_max_stops_the_cell(client: Any, dtype_call: str) -> None:
    """TensorFlow's DType.max tries ml_dtypes.finfo, then iinfo, inside bare excepts: a Ctrl-C
    in finfo was dropped (the cell ran on), one in iinfo became TypeError."""
    content, text = kernel_run(client, "import tensorflow as tf, ml_dtypes", timeout_s=120)
    assert content["status"] == "ok", text
    kernel_run(client, f"sigint_once(ml_dtypes, {dtype_call!r})")
    content, text = kernel_run(client, "ran = False\nm = tf.int32.max\nran = True")
    faultcounts.add("interrupts sent", 1)
    assert content["status"] == "error" and content["ename"] == "KeyboardInterrupt", text
    assert kernel_value(client, "ran") is False


PRETEND = """
import kerasmagic.interrupts.watch as _watch
_watch.RUNNING = {running!r}
get_ipython().run_line_magic("unload_ext", "kerasmagic")
get_ipython().run_line_magic("load_ext", "kerasmagic")
"""


def test_on_a_python_not_checked_a_swallowed_ctrl_c_is_left_to_python(client: Any) -> None:
    """The seam (``watch.RUNNING``) set to 3.14 in the kernel: one line at load, and a
    Ctrl-C a library's bare except drops is dropped, as without kerasmagic."""
    _, told = kernel_run(client, PRETEND.format(running=("cpython", (3, 14))))
    swallowed, text = kernel_run(
        client, "import swallower\nran = False\nswallower.swallow()\nran = True"
    )
    ran = kernel_value(client, "ran")
    _, again = kernel_run(client, PRETEND.format(running=("cpython", (3, 11))))  # as it was
    assert told.strip().startswith("kerasmagic: on cpython 3.14 a Ctrl-C that a library")
    assert told.strip().count("\n") == 0 and again.strip() == ""
    assert swallowed["status"] == "ok" and ran is True, text
    content, text = kernel_run(client, "ran = False\nswallower.swallow()\nran = True")
    assert content["ename"] == "KeyboardInterrupt", text  # checked again: raised again


def test_a_ctrl_c_that_pybind11_replaced_with_its_own_error_stops_the_cell(client: Any) -> None:
    """A Ctrl-C while TensorFlow's C++ makes an error (the error's ``__init__`` is Python code)
    came out, on Python 3.11, as pybind11's "RuntimeError: ... MISMATCH of original and
    normalized active exception types: ORIGINAL InvalidArgumentError REPLACED BY
    KeyboardInterrupt", with no context: only its words say what it replaced (seen in CI's
    fault suite, during fit's dataset tracing). A later Python raises the interrupt itself."""
    content, text = kernel_run(client, "import tensorflow as tf", timeout_s=120)
    assert content["status"] == "ok", text
    kernel_run(client, "sigint_once(tf.errors.InvalidArgumentError, '__init__')")
    build = "ran = False\nwith tf.Graph().as_default():\n    tf.reshape(tf.ones({}), [2, 2])\n"
    build += "ran = True"
    content, text = kernel_run(client, build.format(3))
    faultcounts.add("interrupts sent", 1)
    assert content["status"] == "error" and content["ename"] == "KeyboardInterrupt", text
    assert "kerasmagic" not in text and kernel_value(client, "ran") is False
    content, text = kernel_run(client, build.format(4))  # the graph's scopes closed as they do
    assert content["status"] == "ok" and kernel_value(client, "ran") is True, text
