"""Out-of-memory errors of every backend: recognise them (``detect``), explain them after the
cell (``part``: the loaded part that prints the block), and find the batch that fits
(``batch``). Importing this package imports none of them: ``detect`` has no imports of its
own, and the cleanup reads it without pulling in the part."""
