"""``python -m kerasmagic``: the same as the ``kerasmagic`` command."""

from kerasmagic._cli import main

raise SystemExit(main())
