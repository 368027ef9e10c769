"""What %load_ext says about the environment: libraries older than tested, a missing sidebar."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from IPython.core.interactiveshell import InteractiveShell

from kerasmagic.compat import (
    FLOORS,
    LINE,
    installed,
    missing_sidebar,
    notes_at_load,
    parse,
    too_old,
)


def test_versions_parse_as_release_numbers() -> None:
    assert parse("2.20.0rc1") == (2, 20, 0) and parse("7.34.0") == (7, 34, 0)
    assert parse("8.1.5.dev0+g1") == (8, 1, 5) and parse("unknown") == ()
    assert parse("7.34") >= (7, 34) and parse("7.33.9") < (7, 34)


def test_this_environment_is_not_older_than_tested() -> None:
    """CI's venvs sit at the floors (Colab's pins, the oldest TF/Keras) or above them."""
    assert too_old(frameworks=True) == []
    assert installed("ipython", "IPython") == __import__("IPython").__version__


def test_an_older_library_is_said_in_one_line_with_the_pip_line() -> None:
    old = {"ipython": "7.16.1", "ipywidgets": "7.7.0", "ipykernel": "6.17.1", "keras": "3.2.1"}
    found = too_old(version_of=lambda dist, _module: old.get(dist, "99"))
    assert [f.distribution for f in found] == ["ipython", "ipywidgets"]  # keras: not imported
    (line,) = [f.line for f in found if f.distribution == "ipython"]
    assert line == (
        "kerasmagic: ipython 7.16.1 is older than 7.34, the oldest kerasmagic is tested with; "
        "some parts may fail: pip install 'ipython>=7.34'"
    )
    assert "\n" not in line


def test_a_framework_is_looked_at_only_once_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def version_of(dist: str, module: str) -> str:
        asked.append(dist)
        return "1.0"

    monkeypatch.delitem(sys.modules, "keras", raising=False)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    too_old(frameworks=True, version_of=version_of)
    assert "keras" not in asked and "tensorflow" not in asked
    assert {dist for dist, _, _ in FLOORS} - set(asked) == {"keras", "tensorflow"}


def test_missing_sidebar_is_said_where_jupyterlab_could_show_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("jupyterlab")
    for name in ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE"):
        monkeypatch.delenv(name, raising=False)
    kernel_shell = SimpleNamespace(kernel=object())
    assert missing_sidebar(kernel_shell, [str(tmp_path)]) == LINE
    assert missing_sidebar(SimpleNamespace(), [str(tmp_path)]) is None  # no kernel: no frontend
    built = tmp_path / "kerasmagic" / "package.json"
    built.parent.mkdir()
    built.write_text("{}")
    assert missing_sidebar(kernel_shell, [str(tmp_path / "none"), str(tmp_path)]) is None
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20260819")
    assert missing_sidebar(kernel_shell, [str(tmp_path / "none")]) is None  # no Lab on Colab


def test_load_says_nothing_here(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    """At the floors and with the sidebar installed (or no kernel), %load_ext is silent."""
    assert notes_at_load(ip) == []
    ip.run_line_magic("unload_ext", "kerasmagic")
    capsys.readouterr()
    ip.run_line_magic("load_ext", "kerasmagic")
    captured = capsys.readouterr()
    assert "kerasmagic" not in captured.out + captured.err
