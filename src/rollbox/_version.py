"""The package's version, on the ground floor so every layer can name it without loading another."""

__version__ = "0.1.0"
