"""The package's imports point down one written order, with no circle (docs/architecture.md).

Every import counts, at the top of a module or inside a function, ``TYPE_CHECKING`` ones too:
a module may import its own package's modules and any module in a lower layer, never a higher
one. The layers, top first, are ``LAYERS``; a module is in the layer of its longest prefix.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kerasmagic"
# Top first: a module (or package) may import its own package's modules and lower layers only.
# "kerasmagic" is the package's __init__ alone (the public API, imported lazily).
LAYERS: tuple[str, ...] = (
    "kerasmagic.__main__",
    "kerasmagic._demo",
    "kerasmagic",
    "kerasmagic._extension",
    "kerasmagic.magics",
    "kerasmagic.views",
    "kerasmagic.live",
    "kerasmagic.isolate",
    "kerasmagic.cells",
    "kerasmagic.oom",
    "kerasmagic.cleanup",
    "kerasmagic.interrupts",
    "kerasmagic.shellstate",
    "kerasmagic.snapshot",
    "kerasmagic.backends",
    "kerasmagic.probes",
    "kerasmagic.walk",
    "kerasmagic.heap",
    "kerasmagic.compat",
    "kerasmagic.imports",
    "kerasmagic.units",
    "kerasmagic._version",
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Return the kerasmagic modules ``name`` imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            # ``from pkg import sub`` depends on pkg.sub; ``from mod import name`` on mod
            subs = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t for t in subs if t in known] or [base]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def _layer(module: str) -> int:
    for index, prefix in enumerate(LAYERS):
        if module == prefix or (prefix != "kerasmagic" and module.startswith(prefix + ".")):
            return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def test_every_import_points_down_the_layers() -> None:
    upward = [
        f"{name} -> {target}"
        for name, targets in _graph().items()
        for target in targets
        if _layer(target) < _layer(name)
    ]
    assert upward == [], "imports against the layer order:\n" + "\n".join(sorted(upward))


def test_no_circle_between_modules() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == [], "\n".join(" -> ".join(c) for c in circles)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: an upward import in a module is found."""
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from kerasmagic.views import render\n")
    known = {"kerasmagic.views", "kerasmagic.views.render", "kerasmagic.walk.m"}
    found = _imports("kerasmagic.walk.m", bad, known)
    assert found == {"kerasmagic.views.render"}
    assert _layer("kerasmagic.views.render") < _layer("kerasmagic.walk.m")
