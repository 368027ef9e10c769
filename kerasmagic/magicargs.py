"""Parse and check magic lines: every bad line becomes one short ``UsageError`` line."""

from __future__ import annotations

import argparse
import difflib
import keyword
import shlex
from collections.abc import Collection, Iterable
from typing import Any

from IPython.core.error import UsageError

MAX_MESSAGE = 200  # characters of user input echoed back in an error
MAX_LIMIT_MB = 10**7  # 10 TB: beyond any GPU, below TensorFlow's integer limits
# shlex reads a word a character at a time into a growing string: quadratic, 3 s for a 400 KB
# word and hours for 100 MB. No line of options comes near this; a longer one is refused.
MAX_LINE_CHARS = 100_000


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "..."


def parse_line(magic: Any, line: str, cell: bool = False) -> argparse.Namespace | None:
    """Parse ``line`` with ``magic``'s ``@argument`` parser, shell-style (``--gpus ""`` is empty).

    IPython's own ``parse_argstring`` keeps quote characters (``'""'``) and raises a bare
    ``ValueError`` on an unbalanced quote; this raises ``UsageError`` for every bad line.
    A valid line with ``-h``/``--help`` prints the help and returns None: run nothing.
    """
    if len(line) > MAX_LINE_CHARS:
        msg = f"the magic line has {len(line):,} characters; at most {MAX_LINE_CHARS:,} are read"
        raise UsageError(msg)
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot read the magic line: {exc}") from None
    try:
        namespace: argparse.Namespace = magic.parser.parse_args(argv)
    except UsageError as exc:
        raise UsageError(_short(str(exc))) from None
    if getattr(namespace, "help", False):
        print(help_text(magic, cell))
        return None
    return namespace


def help_text(magic: Any, cell: bool = False) -> str:
    """Return ``magic``'s usage, description and options (what ``%magic?`` shows)."""
    text: str = magic.parser.format_help()
    # IPython's formatter writes reST for docstrings (``::`` then the usage) and one ``%``
    # whatever the kind of magic; a printed help reads ``usage: %%fresh_model [...]``.
    head, _, rest = text.partition(f"%{magic.parser.prog}")
    prefix = "%%" if cell else "%"
    return f"usage: {prefix}{magic.parser.prog}{rest}" if head.strip(" \n:") == "" else text


def megabytes(text: str) -> int:
    """Return a ``--limit`` value: a whole number of megabytes from 1 to 10,000,000."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT_MB:
        msg = f"expected a whole number of megabytes from 1 to {MAX_LIMIT_MB}, got {text!r}"
        raise argparse.ArgumentTypeError(_short(msg))
    return value


def keep_names(raw: Iterable[str], known: Collection[str], assigned: Collection[str]) -> list[str]:
    """Split ``--keep a,b c`` into names; refuse non-names and names that exist nowhere.

    A name is accepted if the namespace has it (``known``) or the cell assigns it; anything
    else is a typo, refused with the closest namespace name, so no model is dropped by mistake.
    """
    names = [name for item in raw for name in item.split(",") if name]
    for name in names:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise UsageError(_short(f"--keep: {name!r} is not a Python name"))
        if name not in known and name not in assigned:
            raise UsageError(_short(f"--keep: no variable {name!r}{_did_you_mean(name, known)}"))
    return names


def _did_you_mean(name: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(name, [k for k in known if not k.startswith("_")], n=1)
    return f"; did you mean {close[0]!r}?" if close else " in the namespace"
