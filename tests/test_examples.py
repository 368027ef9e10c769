"""Every example notebook runs top to bottom in a real kernel without an error."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.ipynb"))
NEEDS = {"04_backends.ipynb": ("jax", "torch")}  # beyond TensorFlow and Keras


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path) -> None:
    for module in NEEDS.get(path.name, ()):
        pytest.importorskip(module)
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": path.parent}}
    )
    client.execute()
