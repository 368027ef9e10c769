"""``python -m kerasmagic``: the same as the ``kerasmagic`` command."""

from kerasmagic._demo import main

raise SystemExit(main())
