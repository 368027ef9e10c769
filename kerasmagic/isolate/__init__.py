"""Run code in a fresh process (locally or on Ray) so its memory is all returned when it ends.

The public names (``run_isolated``, ``isolated``, ``sweep``) live in :mod:`kerasmagic.isolate.api`
and are re-exported lazily from ``kerasmagic``; importing this package imports nothing heavy.
"""
