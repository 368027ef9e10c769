"""The sidebar's build hook: one clear line without Node.js, the usual build with it.

Node is hidden by pointing PATH at folders that hold only fake ``node``/``npm`` scripts; the
machine's own Node.js is never touched.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parent.parent


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hatch_build", ROOT / "hatch_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = load_hook()


def script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_no_node_on_path(tmp_path: Path) -> None:
    assert hook.node_problem(str(tmp_path)) == "Node.js (node) is not on PATH"


@pytest.mark.parametrize(
    ("version", "ok"),
    [("v16.20.2", False), ("v17.9.1", False), ("v18.0.0", True), ("v22.3.0", True)],
)
def test_node_version_floor(tmp_path: Path, version: str, ok: bool) -> None:
    script(tmp_path, "node", f"echo {version}")
    problem = hook.node_problem(str(tmp_path))
    assert (problem is None) is ok
    if not ok:
        assert problem == f"Node.js {version} at {tmp_path / 'node'} is too old"


def test_broken_node(tmp_path: Path) -> None:
    script(tmp_path, "node", "echo 'libnode.so: not found' >&2; exit 127")
    assert "--version failed (libnode.so: not found)" in str(hook.node_problem(str(tmp_path)))


@pytest.mark.parametrize("version", ["standard", "editable"])
def test_without_node_the_build_goes_on_without_the_sidebar_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no built sidebar here
    with pytest.warns(UserWarning) as said:
        hook.build_sidebar("wheel", version, path="labextension", npm=["jlpm"])
    (message,) = [str(w.message) for w in said]
    assert "\n" not in message
    assert message.startswith("kerasmagic: building without the JupyterLab sidebar: Node.js (node)")
    assert "install Node.js >= 18" in message
    assert not (tmp_path / hook.BUILT).exists()


@pytest.mark.parametrize(
    ("variable", "host"), [("COLAB_RELEASE_TAG", "Colab"), ("KAGGLE_KERNEL_RUN_TYPE", "Kaggle")]
)
def test_on_colab_and_kaggle_no_sidebar_is_built_even_with_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, host: str
) -> None:
    """Their frontends load no JupyterLab extension: npm's minutes and 400 MB buy nothing."""
    bin_dir = tmp_path / "bin"
    script(bin_dir, "node", "echo v20.11.1")
    log = tmp_path / "npm.log"
    script(bin_dir, "npm", f'echo "$*" >> {log}')
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv(variable, "release-colab_20260819" if host == "Colab" else "Interactive")
    with pytest.warns(UserWarning, match=f"no sidebar on {host}"):
        hook.build_sidebar("wheel", "standard", path=str(tmp_path), npm=["npm"])
    assert not log.exists()


def test_editable_without_node_keeps_an_earlier_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = tmp_path / hook.BUILT
    built.parent.mkdir(parents=True)
    built.write_text("// built earlier\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.chdir(tmp_path)
    with pytest.warns(UserWarning, match="sidebar not rebuilt"):
        hook.build_sidebar("wheel", "editable", path="labextension", npm=["jlpm"])
    assert built.read_text() == "// built earlier\n"


def test_with_node_it_runs_the_package_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("hatch_jupyter_builder")
    bin_dir, package = tmp_path / "bin", tmp_path / "labextension"
    package.mkdir()
    script(bin_dir, "node", "echo v20.11.1")
    log = tmp_path / "npm.log"
    script(bin_dir, "npm", f'echo "$PWD $*" >> {log}')
    monkeypatch.setenv("PATH", str(bin_dir))
    hook.build_sidebar("wheel", "standard", path=str(package), build_cmd="build:prod", npm=["npm"])
    assert log.read_text().splitlines() == [f"{package} install", f"{package} run build:prod"]


def copy_checkout(dest: Path) -> Path:
    """Copy the sources a wheel is built from, without any built sidebar or node_modules."""
    skip = shutil.ignore_patterns(
        ".venv", ".git", "node_modules", "lib", "static", "*_cache", "dist"
    )
    shutil.copytree(ROOT, dest, ignore=skip)
    shutil.rmtree(dest / "kerasmagic" / "labextension", ignore_errors=True)
    return dest


def pip_wheel(src: Path, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q"]
    return subprocess.run(
        [*cmd, str(src), "-w", str(out)], capture_output=True, text=True, env=env, timeout=300
    )


def wheel_names(dist: Path) -> list[str]:
    (wheel,) = dist.glob("kerasmagic-*.whl")
    return zipfile.ZipFile(wheel).namelist()


SIDEBAR_DATA = "kerasmagic-{version}.data/data/share/jupyter/labextensions/kerasmagic/"


@pytest.mark.slow
def test_pip_without_node_installs_the_python_package_and_a_built_sidebar_when_there(
    tmp_path: Path,
) -> None:
    for build_module in ("hatchling", "hatch_jupyter_builder"):
        pytest.importorskip(build_module)
    wired = 'build-function = "hatch_build.build_sidebar"'
    assert wired in (ROOT / "pyproject.toml").read_text(), f"pyproject.toml needs {wired}"
    from kerasmagic import __version__

    data = SIDEBAR_DATA.format(version=__version__)
    src = copy_checkout(tmp_path / "src")
    no_node = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    assert shutil.which("node", path=no_node["PATH"]) is None
    built = pip_wheel(src, tmp_path / "dist", no_node)
    assert built.returncode == 0, built.stderr
    names = wheel_names(tmp_path / "dist")
    assert "kerasmagic/_demo.py" in names
    assert not [n for n in names if n.startswith(data) or "labextension/static" in n]
    # An sdist's (or an earlier build's) sidebar is installed where JupyterLab finds it.
    static = src / "kerasmagic" / "labextension" / "static"
    static.mkdir(parents=True)
    (static / "style.js").write_text("// built\n")
    (src / "kerasmagic" / "labextension" / "package.json").write_text("{}\n")
    built = pip_wheel(src, tmp_path / "dist2", no_node)
    assert built.returncode == 0, built.stderr
    names = wheel_names(tmp_path / "dist2")
    assert {f"{data}package.json", f"{data}static/style.js", f"{data}install.json"} <= set(names)
