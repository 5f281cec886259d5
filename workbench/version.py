"""The version of workbench (what model files record as their writer)."""

__version__ = "0.1.0"
