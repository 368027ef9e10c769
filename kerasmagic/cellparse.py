"""Which names a cell rebinds before it reads them."""

from __future__ import annotations

import ast


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _target_names(target: ast.expr) -> set[str]:
    """Return plain names a target binds (``a``, ``a, b``, ``*a``), not ``a[0]`` or ``a.x``."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(t) for t in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return set()


def _scan(body: list[ast.stmt], seen: set[str], rebound: set[str]) -> None:
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            seen |= _loads(stmt.value) | set().union(*(_loads(t) for t in stmt.targets))
            for target in stmt.targets:
                rebound |= _target_names(target) - seen
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            seen |= _loads(stmt.value)
            rebound |= _target_names(stmt.target) - seen
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):  # its body runs unconditionally
            for item in stmt.items:
                seen |= _loads(item.context_expr)
            _scan(stmt.body, seen, rebound)
        else:  # conditional or other statements: their reads count, their writes do not
            seen |= _loads(stmt)
        seen |= rebound


def rebound_names(source: str) -> set[str]:
    """Return top-level names the code assigns unconditionally before reading them.

    ``model = build()`` rebinds ``model``; ``model = model.fit(...)`` and ``results += [...]``
    read the old value first, so they do not. Code that does not parse rebinds nothing.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    rebound: set[str] = set()
    _scan(tree.body, set(), rebound)
    return rebound
