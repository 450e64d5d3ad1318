"""The project version (the package's and the console script's)."""

__version__ = "0.2.0"
