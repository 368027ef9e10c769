"""A ``%%fresh_model`` cell as IPython would run it: parsed for the names it rebinds
(``parse``), those names checked against what earlier cells' code reads (``reads``), compiled
once per source (``compiler``), run below fixed padding frames (``runner``), awaited when it
has a top-level ``await`` (``awaiting``)."""
