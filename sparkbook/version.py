"""sparkbook's version: one place, read by the package face, the CLI, the notebooks' header and
the run fingerprint (a module of its own, so that nothing imports the package face for it)."""

__version__ = "0.1.0"
