"""Every example notebook runs top to bottom in a real kernel without an error, and shows none
of TensorFlow's C++ log lines in its outputs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.ipynb"))
NEEDS = {"04_backends.ipynb": ("jax", "torch")}  # beyond TensorFlow and Keras
# TensorFlow's C++ lines (absl format: severity, date, time, thread, file:line]) and absl's notice
TF_LOG_LINE = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\s:]+:\d+\] "
    r"|WARNING: All log messages before absl::InitializeLog\(\)"
    r"|To enable the following instructions: )"
)


def user_kernel_env() -> dict[str, str]:
    """Return the environment of a kernel that JupyterLab starts for a user: without the log
    settings this test session sets for itself (tests/conftest.py), so a notebook must set them,
    and without PYTEST_CURRENT_TEST, under which ipykernel does not forward what C++ code
    writes to file descriptors 1 and 2 to the notebook (in JupyterLab it does)."""
    test_only = ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", "PYTEST_CURRENT_TEST")
    return {name: value for name, value in os.environ.items() if name not in test_only}


def tf_log_lines(notebook: nbformat.NotebookNode) -> list[str]:
    """Return every TensorFlow C++ log line found in the notebook's outputs."""
    found = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            texts = [output.get("text", ""), *output.get("data", {}).values()]
            texts += output.get("traceback", [])
            for text in texts:
                text = "".join(text) if isinstance(text, list) else str(text)
                found += [line for line in text.splitlines() if TF_LOG_LINE.match(line)]
    return found


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path) -> None:
    for module in NEEDS.get(path.name, ()):
        pytest.importorskip(module)
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": path.parent}}
    )
    client.execute(env=user_kernel_env())
    assert without_cuda_notice(tf_log_lines(notebook)) == []


ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog()"


def without_cuda_notice(lines: list[str]) -> list[str]:
    """Drop the one notice no setting hides: the full ``tensorflow`` wheel on a machine without
    a GPU says "Could not find cuda drivers" at import (with absl's preamble before it). The
    README tells users about it; every other line (oneDNN, cpu_feature_guard) must be gone."""
    rest = [line for line in lines if "cudart_stub.cc" not in line]
    if len(rest) < len(lines):
        rest = [line for line in rest if not line.startswith(ABSL_PREAMBLE)]
    return rest


def test_only_the_cuda_notice_is_tolerated() -> None:
    cuda = "I0000 00:00:1796103603.055699   22546 cudart_stub.cc:31] Could not find cuda drivers"
    one_dnn = "I0000 00:00:1796100018.076852   17285 port.cc:153] oneDNN custom operations are on."
    assert without_cuda_notice([ABSL_PREAMBLE + " ...", cuda]) == []
    assert without_cuda_notice([ABSL_PREAMBLE + " ...", one_dnn]) == [
        ABSL_PREAMBLE + " ...",
        one_dnn,
    ]
    assert without_cuda_notice([ABSL_PREAMBLE, cuda, one_dnn]) == [one_dnn]


def test_the_log_check_sees_tensorflows_lines() -> None:
    printed = (  # TensorFlow 2.21 on import, verbatim but shortened
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1796100018.076852   17285 port.cc:153] oneDNN custom operations are on.\n"
        "I0000 00:00:1796100018.151934   17285 cpu_feature_guard.cc:227] This TensorFlow binary\n"
        "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild\n"
        "E0000 00:00:1796100878.034843   23161 cuda_platform.cc:52] failed call to cuInit\n"
    )
    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("import keras")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text=printed),
        nbformat.v4.new_output("stream", name="stdout", text="I0000 is a fine name\nloss 0.5\n"),
    ]
    notebook.cells.append(cell)
    assert len(tf_log_lines(notebook)) == 5
