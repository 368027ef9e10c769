"""Which names a cell rebinds before it reads them, and which names it assigns at all.

The rule (``rebinding_in``): a name is rebound when a plain assignment (``x = ...``,
``a, b = ...``, ``x: T = ...``) binds it in code that runs whenever the cell runs, before any
read of it in program order. Code that runs whenever the cell runs: the cell's top level and
the bodies of ``with``, ``for``, ``while`` (also ``async``), ``try`` and ``finally``, up to a
``break`` or ``continue`` of that loop. ``if``/``elif``/``else``, ``match`` cases, ``except``
handlers and loop/``try`` ``else`` clauses are conditional: their writes never count, and
neither does anything nested in them. A ``for`` loop's own target is not counted. A read is any
use of the name anywhere earlier in program order: in a condition, a loop header, a ``def``,
``lambda``, comprehension or class body, or earlier in the same loop body. A function from an
earlier cell that the cell calls (or uses) before the assignment reads what its code reads
(and a ``%magic`` or ``!command`` line reads every name it mentions).

That second half (``rebound_now``) is resolved against the namespace when the cell runs:
``model = keep_training()``, where ``keep_training`` (an earlier cell) fits the global
``model``, reads ``model`` before rebinding it: dropping it first would leave the function a
``NameError`` and the user without the model. So each name a cell reads before rebinding a
name is resolved in the namespace and walked (``walk.state.GlobalReads``) for the globals the
notebook's functions it holds read; those count as reads too. Past the walk's limit, the names
not decided yet are kept.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kerasmagic.walk import GlobalReads, TooMuch

log = logging.getLogger(__name__)

LOOPS = (ast.For, ast.AsyncFor, ast.While)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
TRIES = (ast.Try, ast.TryStar)


def _loads(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            yield n.id
        elif _is_magic_call(n):  # %time evaluate(), !echo {model}: the line is code too
            for arg in n.args:  # type: ignore[attr-defined]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield from _IDENTIFIER.findall(arg.value)


_IDENTIFIER = re.compile(r"[^\W\d]\w*")


def _is_magic_call(node: ast.AST) -> bool:
    """Return whether ``node`` is ``get_ipython().<method>(...)``, what IPython makes of a
    ``%magic``, ``%%magic`` or ``!command`` line."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "get_ipython"
    )


def _target_names(target: ast.expr) -> Iterator[str]:
    """Yield plain names a target binds (``a``, ``a, b``, ``*a``), not ``a[0]`` or ``a.x``."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def _leaves_loop(stmt: ast.stmt) -> bool:
    """Return whether ``stmt`` may ``break``/``continue`` the loop whose body it is in."""
    if isinstance(stmt, (ast.Break, ast.Continue)):
        return True
    if isinstance(stmt, SCOPES):
        return False
    if isinstance(stmt, LOOPS):  # a break in its own body leaves it; its else clause is ours
        return any(_leaves_loop(child) for child in stmt.orelse)
    children: list[ast.stmt] = []
    for child in ast.iter_child_nodes(stmt):
        if isinstance(child, ast.stmt):
            children.append(child)
        elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
            children.extend(child.body)
    return any(_leaves_loop(child) for child in children)


class _Scan:
    """One pass over a cell in program order; each node is read once (linear in cell size)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.order: list[str] = []  # the names read, in the order first read
        self.rebound: dict[str, int] = {}  # name -> how many of ``order`` were read before

    def read(self, *nodes: ast.AST | None) -> None:
        for node in nodes:
            if node is not None:
                for name in _loads(node):
                    if name not in self.seen:
                        self.seen.add(name)
                        self.order.append(name)

    def bind(self, targets: list[ast.expr]) -> None:
        for name in (n for t in targets for n in _target_names(t)):
            if name not in self.seen:
                self.rebound.setdefault(name, len(self.order))

    def body(self, stmts: list[ast.stmt], in_loop: bool = False) -> None:
        """Scan statements that run unconditionally (until a loop exit, when ``in_loop``)."""
        for index, stmt in enumerate(stmts):
            self.stmt(stmt, in_loop)
            if in_loop and _leaves_loop(stmt):
                for rest in stmts[index + 1 :]:
                    self.read(rest)
                return

    def stmt(self, stmt: ast.stmt, in_loop: bool) -> None:
        if isinstance(stmt, ast.Assign):
            self.read(stmt.value, *stmt.targets)
            self.bind(stmt.targets)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self.read(stmt.value, stmt.target, stmt.annotation)
            self.bind([stmt.target])
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            self.read(*(item.context_expr for item in stmt.items))
            self.read(*(item.optional_vars for item in stmt.items))
            self.body(stmt.body, in_loop)
        elif isinstance(stmt, LOOPS):  # a for's target binds only if its iterable is not empty
            header = [stmt.test] if isinstance(stmt, ast.While) else [stmt.iter, stmt.target]
            self.read(*header)
            self.body(stmt.body, in_loop=True)
            self.read(*stmt.orelse)
        elif isinstance(stmt, TRIES):
            self.body(stmt.body, in_loop)
            self.read(*stmt.handlers, *stmt.orelse)
            self.body(stmt.finalbody, in_loop)
        else:  # conditional or other statements: their reads count, their writes do not
            self.read(stmt)


@dataclass(frozen=True)
class Rebinding:
    """The names a cell rebinds, and what it reads before each (for ``rebound_now``)."""

    names: frozenset[str]
    read_order: tuple[str, ...]  # every name the cell reads, in the order first read
    read_before: Mapping[str, int]  # name -> how many of ``read_order`` it comes after


def rebinding_in(tree: ast.Module) -> Rebinding:
    """Return the top-level names ``tree`` assigns unconditionally before reading them.

    ``model = build()`` rebinds ``model``, also inside ``for``/``while``/``with``/``try``
    bodies; ``model = model.fit(...)``, ``results += [...]`` and ``if c: model = build()`` do
    not (the module docstring states the whole rule).
    """
    scan = _Scan()
    scan.body(tree.body)
    return Rebinding(frozenset(scan.rebound), tuple(scan.order), scan.rebound)


def assigned_in(tree: ast.Module) -> set[str]:
    """Return every name ``tree`` stores anywhere (``--keep`` may name what the cell defines)."""
    return {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    }


def rebound_now(ns: Mapping[str, Any], rebinding: Rebinding) -> frozenset[str]:
    """Return the names of ``rebinding`` that nothing the cell uses before reads first."""
    reads = GlobalReads(ns)
    done = 0
    out: set[str] = set()
    try:
        for name in sorted(rebinding.names, key=lambda n: rebinding.read_before.get(n, 0)):
            upto = rebinding.read_before.get(name, 0)
            reads.add(rebinding.read_order[done:upto])
            done = upto
            if name not in reads.names:
                out.add(name)
    except TooMuch:  # too much to follow: keep what was not decided yet
        pass
    except Exception:  # an object no walk foresaw: keep what was not decided yet, run the cell
        log.debug("kerasmagic: reads through earlier cells' code not followed", exc_info=True)
    return frozenset(out)
