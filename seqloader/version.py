"""The package version, in a module of its own so that any module can import it without
importing the package's top level."""

__version__ = "0.2.0"
