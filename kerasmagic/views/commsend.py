"""Send on a comm without moving ipykernel 7's routing of its requests off their subshell.

JupyterLab sends a comm's messages to a kernel subshell, so they are handled while the main
shell runs a cell. ipykernel 7 (``ipykernel.comm.comm.BaseComm.publish_msg``) then routes
every later message of that comm to the subshell of the *parent* of the comm's latest outgoing
message. A push from the sampler thread or from the main shell's ``post_run_cell`` has the
main shell's request as parent, so one push would send the next requests to the main shell,
where they wait for the running cell. ``send`` publishes with the comm's own latest request
(``home``) as parent instead, which keeps the routing where the frontend put it.
"""

from __future__ import annotations

import contextvars
from typing import Any

from kerasmagic.compat.reaches import works


def send(comm: Any, data: dict[str, Any], home: dict[str, Any] | None, kernel: Any) -> None:
    """Send ``data`` on ``comm`` as a reply to ``home`` (the message the comm last received)."""
    parent_var = getattr(kernel, "_shell_parent", None)  # ipykernel >= 7: a ContextVar
    if home is None or not isinstance(parent_var, contextvars.ContextVar):
        if home is not None and kernel is not None:
            works("ipykernel.shell_parent")  # a kernel with subshells but without it: said
        comm.send(data)
        return

    def publish() -> None:
        parent_var.set(home)  # only in this copied context: the caller's parent is untouched
        comm.send(data)

    contextvars.copy_context().run(publish)
