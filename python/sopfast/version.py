"""The one version string of sopfast (read by setup.py)."""

__version__ = "0.7.0"
