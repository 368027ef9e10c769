"""One version: ``kerasmagic/_version.py``; the sidebar's package.json must say the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

import kerasmagic

ROOT = Path(__file__).resolve().parent.parent


def _js_version(package_json: Path) -> Version:
    return Version(json.loads(package_json.read_text())["version"])  # "0.2.0-alpha.1" -> 0.2.0a1


def test_labextension_sources_have_the_python_version() -> None:
    assert _js_version(ROOT / "labextension" / "package.json") == Version(kerasmagic.__version__)


def test_built_labextension_has_the_python_version() -> None:
    built = ROOT / "kerasmagic" / "labextension" / "package.json"
    if not built.exists():
        pytest.skip("the sidebar is not built here (pip install . builds it)")
    assert _js_version(built) == Version(kerasmagic.__version__), "stale build: rebuild it"


def test_labextension_paths_point_at_the_built_folder() -> None:
    (entry,) = kerasmagic._jupyter_labextension_paths()
    assert entry == {"src": "labextension", "dest": "kerasmagic"}
    assert json.loads((ROOT / "labextension" / "package.json").read_text())["name"] == "kerasmagic"
