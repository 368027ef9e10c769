"""The README's set-up command installs everything the example notebooks need.

A newcomer runs the README's first ``pip install '.[...]'`` and then ``jupyter lab examples/``:
every package an example imports, or that a kerasmagic feature it uses needs, must come with
those extras (directly or through what they depend on). Example 04 is the exception
docs/install.md names: JAX and PyTorch have extras of their own.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

import nbformat
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.ipynb"))
OWN_EXTRAS = {"04_backends.ipynb": {"jax", "torch"}}  # docs/install.md points to [jax], [torch]
# What a kerasmagic feature needs that the notebook does not import itself.
FEATURES = {
    "--plot": "matplotlib",  # %gpu_mem --plot draws with matplotlib
    "--isolate": "cloudpickle",  # %%fresh_model --isolate sends the cell's inputs with it
    "kerasmagic.sweep(": "cloudpickle",
    "kerasmagic.run_isolated(": "cloudpickle",
}
SETUP = re.compile(r"^pip install '\.\[([\w,]+)\]'", re.MULTILINE)


def readme_extras() -> list[str]:
    """Return the extras of the README's first set-up command."""
    found = SETUP.search((ROOT / "README.md").read_text())
    assert found is not None, "the README has no `pip install '.[...]'` set-up command"
    return found.group(1).split(",")


def requirements(extras: list[str]) -> list[Requirement]:
    """Return kerasmagic's own requirements with these extras (self-references followed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = [Requirement(r) for r in project["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in project["optional-dependencies"][extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "kerasmagic":
                todo += sorted(req.extras)
            else:
                out.append(req)
    return out


def installed_closure(roots: list[Requirement]) -> set[str]:
    """Return the distributions these requirements bring, following installed metadata."""
    names: set[str] = set()
    todo = list(roots)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in names:
            continue
        names.add(name)
        try:
            needs = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in needs:
            dep = Requirement(text)
            env_extras = ["", *sorted(req.extras)]
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in env_extras):
                todo.append(dep)
    return names


def needed(path: Path) -> set[str]:
    """Return the top-level modules an example imports or its kerasmagic features need."""
    modules: set[str] = set()
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = cell.source
        modules |= {module for flag, module in FEATURES.items() if flag in source}
        if source.lstrip().startswith("%%"):
            continue  # a cell magic's body is not this kernel's Python (an isolated child's)
        python = "\n".join(line for line in source.splitlines() if line.lstrip()[:1] not in "%!")
        for node in ast.walk(ast.parse(python)):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m != "kerasmagic"}


def distribution_of(module: str) -> str:
    return canonicalize_name(metadata.packages_distributions().get(module, [module])[0])


def test_the_readme_setup_installs_what_the_examples_need() -> None:
    extras = readme_extras()
    assert {"tf", "lab"} <= set(extras), extras
    brought = installed_closure(requirements(extras))
    missing = {
        path.name: sorted(
            distribution_of(m)
            for m in needed(path) - OWN_EXTRAS.get(path.name, set())
            if distribution_of(m) not in brought
        )
        for path in EXAMPLES
    }
    assert {name: m for name, m in missing.items() if m} == {}


def test_the_check_sees_imports_and_features() -> None:
    """02 plots (matplotlib) and imports numpy and keras; 03 sweeps in fresh processes."""
    by_name = {path.name: needed(path) for path in EXAMPLES}
    assert {"matplotlib", "numpy", "keras"} <= by_name["02_live_monitor.ipynb"]
    assert "cloudpickle" in by_name["03_cross_validation.ipynb"]


def test_the_frontends_the_readme_names_come_with_its_setup() -> None:
    """Issue 39: the README names Notebook 7 (its memory figure in the toolbar), but no extra
    installed it: ``jupyter notebook`` was missing, or an old Notebook 6 without the sidebar."""
    readme = (ROOT / "README.md").read_text()
    named = {"jupyterlab": "4.6.4", "notebook": "7.0.0"}
    assert "jupyter lab" in readme and "Notebook 7" in readme
    found = {canonicalize_name(r.name): r for r in requirements(readme_extras())}
    for name, version in named.items():
        assert name in found, f"the README's set-up does not install {name}"
        assert found[name].specifier.contains(version), found[name]
    assert not found["notebook"].specifier.contains("6.5.7")  # Colab's: no sidebar there
