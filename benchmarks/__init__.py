"""lmforge's benchmarks: each module is a script (``python benchmarks/NAME.py`` or ``python -m benchmarks.NAME``)
that measures lmforge against a reference side by side and ends with one JSON line; ``common`` holds what
they share. ``lmforge bench`` runs the speed and memory ones; ``performance_doc`` renders its JSON record."""
