"""The package version (one definition: the package, cache keys and checkpoints read it)."""

__version__ = "0.1.0"
