"""The release: the workflow that publishes to PyPI, and the sdist and wheel it would publish.

The fast tests read ``.github/workflows/release.yml``, ``.ci/run`` and the docs. The others
check a built sdist and wheel in ``KERASMAGIC_RELEASE_DIST`` (``.ci/run``'s release stage
builds them with ``python -m build``): the wheel holds the sidebar, the sdist installs with no
Node.js on PATH, and the wheel, installed in a clean venv with its runtime dependencies only
(no TensorFlow), loads in a real IPython shell from outside the checkout. Without the variable
they skip, unless ``KERASMAGIC_REQUIRE_RELEASE=1`` (CI's release stage) makes that a failure.
By hand: ``python -m build -o dist && KERASMAGIC_RELEASE_DIST=dist pytest tests/test_release.py``.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
VERSION = str(runpy.run_path(str(ROOT / "kerasmagic" / "_version.py"))["__version__"])
SIDEBAR = "share/jupyter/labextensions/kerasmagic/"
SIDEBAR_FILES = ["package.json", "install.json", "static/style.js"]
RUNTIME = {"ipython", "ipywidgets", "psutil", "nvidia-ml-py", "traitlets"}
PUBLISH = "pypa/gh-action-pypi-publish@"
PYPI_LINE = "%pip install -q kerasmagic\n"  # what works once kerasmagic is on PyPI
WHEEL_LINE = "%pip install -q kerasmagic-"  # <version>-py3-none-any.whl: the wheel, uploaded


def workflow() -> dict[Any, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(loaded, dict)
    return loaded


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["steps"])


def test_the_release_workflow_publishes_a_version_tag_by_trusted_publishing() -> None:
    flow = workflow()
    trigger = flow.get("on", flow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert trigger == {"push": {"tags": ["v*"]}}
    jobs = flow["jobs"]
    (publish,) = [
        job
        for job in jobs.values()
        if any(str(s.get("uses", "")).startswith(PUBLISH) for s in steps(job))
    ]
    assert publish["permissions"] == {"id-token": "write"}
    environment = publish["environment"]
    assert (environment["name"] if isinstance(environment, dict) else environment) == "pypi"
    (upload,) = [s for s in steps(publish) if str(s.get("uses", "")).startswith(PUBLISH)]
    assert not {"password", "user", "repository-url"} & set(upload.get("with", {}))
    assert "secrets." not in WORKFLOW.read_text()  # no token anywhere
    build = jobs[publish["needs"]]
    runs = [str(s.get("run", "")) for s in steps(build)]
    uses = [str(s.get("uses", "")) for s in steps(build)]
    assert any(u.startswith("actions/setup-node@") for u in uses)  # the sidebar in the wheel
    assert "python -m build" in runs
    assert "twine check --strict dist/*" in runs
    assert any("labextensions/kerasmagic/static/style.js" in r for r in runs)


@pytest.mark.parametrize(
    ("tag", "ok"), [(f"v{VERSION}", True), ("v0.0.0", False), (VERSION, False)]
)
def test_the_release_refuses_a_tag_that_is_not_the_version(tag: str, ok: bool) -> None:
    """The workflow's own check, run here with the tag it would see."""
    (build,) = [job for job in workflow()["jobs"].values() if "needs" not in job]
    (check,) = [s for s in steps(build) if "_version.py" in str(s.get("run", ""))]
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # python
    env = {**os.environ, "GITHUB_REF_NAME": tag, "PATH": path}
    done = subprocess.run(
        ["bash", "-e", "-c", check["run"]], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert (done.returncode == 0) is ok, done.stdout + done.stderr
    if not ok:
        assert f"tag {tag} is not v{VERSION}" in done.stdout


def test_ci_builds_checks_and_installs_the_release() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m build" in ci
    assert 'twine check --strict "$work/dist"/*' in ci
    assert "KERASMAGIC_REQUIRE_RELEASE=1" in ci and "tests/test_release.py" in ci
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    assert {re.split(r"[<>=!~;\[ ]", r)[0] for r in test_extra} >= {"build", "twine"}


@pytest.mark.parametrize("doc", ["README.md", "docs/colab.md"])
def test_the_docs_give_a_colab_line_that_works_before_the_first_release(doc: str) -> None:
    """Until kerasmagic is on PyPI, ``%pip install -q kerasmagic`` finds nothing: each doc
    gives the wheel's line, and says the PyPI line is for after the first release."""
    text = (ROOT / doc).read_text()
    assert f"{WHEEL_LINE}{VERSION}-py3-none-any.whl" in text  # the name `pip wheel` writes
    assert "pip wheel --no-deps ." in text  # where the wheel comes from
    for found in re.finditer(re.escape(PYPI_LINE.strip()) + r"(?!-)", text):
        near = text[max(0, found.start() - 300) : found.end() + 300]
        assert "after the first release" in near.lower(), f"{doc}: {near!r}"


# --- the built sdist and wheel (.ci/run's release stage) ---


@pytest.fixture(scope="module")
def dist() -> Path:
    """Return the folder holding the built sdist and wheel."""
    folder = os.environ.get("KERASMAGIC_RELEASE_DIST")
    if not folder:
        why = "needs KERASMAGIC_RELEASE_DIST, a folder with `python -m build`'s sdist and wheel"
        if os.environ.get("KERASMAGIC_REQUIRE_RELEASE") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return Path(folder).resolve()


def built(dist: Path, pattern: str) -> Path:
    (path,) = dist.glob(pattern)
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would make a venv see the checkout."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def pip_install(python: Path, *args: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_the_wheel_and_sdist_are_this_version_and_the_wheel_holds_the_sidebar(
    dist: Path,
) -> None:
    wheel = built(dist, f"kerasmagic-{VERSION}-py3-none-any.whl")
    built(dist, f"kerasmagic-{VERSION}.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = f"kerasmagic-{VERSION}.data/data/{SIDEBAR}"
    assert {data + name for name in SIDEBAR_FILES} <= names
    assert any(re.fullmatch(re.escape(data) + r"static/remoteEntry\.\w+\.js", n) for n in names)
    metadata = zipfile.ZipFile(wheel).read(f"kerasmagic-{VERSION}.dist-info/METADATA").decode()
    required = re.findall(r"^Requires-Dist: ([\w-]+)[^;\n]*$", metadata, re.MULTILINE)
    assert set(required) == RUNTIME  # what the clean venv below installs with it


@pytest.mark.slow
def test_the_sdist_installs_with_no_node_and_carries_the_sidebar(
    dist: Path, tmp_path: Path
) -> None:
    """pip builds the sdist in an isolated build environment, PATH holding only the venv."""
    python = venv(tmp_path / "venv")
    no_node = str(python.parent)
    assert shutil.which("node", path=no_node) is None
    sdist = built(dist, f"kerasmagic-{VERSION}.tar.gz")
    pip_install(python, "--no-deps", str(sdist), env=clean_env(PATH=no_node))
    share = tmp_path / "venv" / SIDEBAR
    assert [name for name in SIDEBAR_FILES if not (share / name).is_file()] == []


SMOKE = """
import importlib.util, json
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
import kerasmagic
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "kerasmagic")
loaded = sorted(shell.magics_manager.magics["line"])
with capture_output() as out:
    shell.run_line_magic("gpu_mem", "--json")
snapshot = json.loads(out.stdout)
shell.run_line_magic("unload_ext", "kerasmagic")
print(json.dumps({
    "file": kerasmagic.__file__, "version": kerasmagic.__version__, "snapshot": snapshot,
    "tensorflow": importlib.util.find_spec("tensorflow") is not None, "loaded": loaded,
    "unloaded": sorted(shell.magics_manager.magics["line"]),
}))
"""


@pytest.mark.slow
def test_the_wheel_loads_from_a_clean_venv(dist: Path, tmp_path: Path) -> None:
    """The wheel and its runtime dependencies only; run from outside the checkout."""
    python = venv(tmp_path / "venv")
    wheel = built(dist, f"kerasmagic-{VERSION}-py3-none-any.whl")
    pip_install(python, str(wheel), env=clean_env())
    done = subprocess.run(
        [str(python), "-I", "-c", SMOKE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    site = Path(result["file"]).resolve()
    assert site.is_relative_to((tmp_path / "venv").resolve()), site
    assert ROOT.resolve() not in site.parents
    assert result["version"] == VERSION
    assert result["snapshot"]["pid"] > 0 and result["snapshot"]["ram"]["rss_bytes"] > 0
    assert not result["tensorflow"]  # runtime dependencies only
    assert "gpu_mem" in result["loaded"] and "gpu_mem" not in result["unloaded"]
    assert (tmp_path / "venv" / SIDEBAR / "static" / "style.js").is_file()
