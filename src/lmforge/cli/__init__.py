"""Command-line verbs, one module each (see :mod:`lmforge.cli.main`)."""
