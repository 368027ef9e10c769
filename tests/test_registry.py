"""Every private structure of another library that kerasmagic's code uses is named in the one
registry (``kerasmagic/compat/registry.py``): ``PRIVATE_NAMES`` maps each private name to the
``Reach`` whose feature uses it, so its probe, its consequence line and its gate cover it.

The package is parsed, not imported: a private attribute (``x._name``, also as the string of a
``getattr``/``vars()`` lookup), a private module (``jax._src``, ``_signal``), ``sys._getframe``,
``ctypes`` and ``gc.get_referrers``/``get_objects`` count, unless kerasmagic defines the name
itself (its own classes' attributes, its own modules' names).
"""

from __future__ import annotations

import ast
from pathlib import Path

from kerasmagic.compat.registry import PRIVATE_NAMES, REACHES

PACKAGE = Path(__file__).resolve().parents[1] / "kerasmagic"
# Documented names with a leading underscore: os._exit, namedtuple's API, IPython's output
# cache and history names (the user's namespace: _, _i, _ih, _oh, _dh).
PUBLIC = {"_exit", "_fields", "_asdict", "_replace", "_make", "_", "_i", "_ih", "_oh", "_dh"}


def _private(name: str) -> bool:
    return (
        name.startswith("_")
        and not name.startswith(("__", "_kerasmagic"))  # an attribute kerasmagic itself sets
        and name not in PUBLIC
    )


def _own_names(trees: list[ast.Module]) -> set[str]:
    """Return the names kerasmagic defines: module-level and class-level names, attributes set
    on ``self``/``cls``, and function names."""
    own: set[str] = set()
    for tree in trees:
        scopes = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        for body in scopes:
            for node in body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    own.add(node.name)
                targets = (
                    node.targets if isinstance(node, ast.Assign) else
                    [node.target] if isinstance(node, ast.AnnAssign) else []
                )  # fmt: skip
                own.update(t.id for t in targets if isinstance(t, ast.Name))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                own.add(node.name)
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                own.add(node.attr)
    return own


def _uses(tree: ast.Module, own: set[str]) -> set[str]:
    """Return the private names of other libraries ``tree`` uses."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            found.add(node.attr)
        elif isinstance(node, ast.Attribute) and node.attr in ("get_referrers", "get_objects"):
            found.add(f"gc.{node.attr}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.isidentifier()
            and _private(node.value)
            and node.value not in own
        ):
            found.add(node.value)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.append(node.module)
                found.update(a.name for a in node.names if _private(a.name))
            for module in modules:
                if module.startswith("kerasmagic"):
                    continue
                found.update(p for p in module.split(".") if _private(p))
                if module.split(".")[0] == "ctypes":
                    found.add("ctypes")
    return found


def _scan() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    trees = [ast.parse(p.read_text()) for p in paths]
    own = _own_names(trees) - set(PRIVATE_NAMES)  # a registered name is never "own"
    used: dict[str, set[str]] = {}
    for path, tree in zip(paths, trees, strict=True):
        for name in _uses(tree, own):
            used.setdefault(name, set()).add(str(path.relative_to(PACKAGE.parent)))
    return used


def test_every_private_name_used_is_in_the_registry() -> None:
    missing = {name: sorted(files) for name, files in _scan().items() if name not in PRIVATE_NAMES}
    assert missing == {}, "private names of other libraries not in compat/registry.py's table"


def test_every_registered_name_belongs_to_a_reach_and_is_used() -> None:
    reaches = {reach.name for reach in REACHES}
    assert {n: r for n, r in PRIVATE_NAMES.items() if r not in reaches} == {}
    assert set(PRIVATE_NAMES) - set(_scan()) == set(), "registered but no longer used"


def test_the_scan_sees_a_private_reach() -> None:
    """The scanner itself: a new private attribute, module and string are all found."""
    tree = ast.parse(
        "import jax._src.core\nx = obj._secret\ny = getattr(obj, '_hidden')\n"
        "import ctypes\nimport sys\nf = sys._getframe(1)\nclass A:\n    _mine = 1\n"
    )
    own = _own_names([tree])
    assert _uses(tree, own) == {"_src", "_secret", "_hidden", "ctypes", "_getframe"}
