"""precguard plugin for Ascend NPUs; the hooks live in :mod:`precguard_ascend.plugin`."""

__version__ = "0.1.0"
