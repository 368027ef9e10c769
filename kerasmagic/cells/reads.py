"""The rebinding rule's second half: names that earlier cells' code reads are kept.

``model = keep_training()``, where ``keep_training`` (an earlier cell) fits the global
``model``, reads ``model`` before rebinding it: dropping it first would leave the function a
``NameError`` and the user without the model. So each name a cell reads before rebinding a
name is resolved in the namespace and walked (``walk.reads``) for the globals the notebook's
functions it holds read; those count as reads too. Past the walk's limit, the names not
decided yet are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kerasmagic.cells.parse import Rebinding
from kerasmagic.walk.reads import GlobalReads, TooMuch

log = logging.getLogger(__name__)


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
