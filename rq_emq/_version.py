"""The package's version, in a module of its own: the CLI prints it, and importing it from
the package root would make the CLI import the whole public API (and the root import it
back)."""

__version__ = "0.1.0"
