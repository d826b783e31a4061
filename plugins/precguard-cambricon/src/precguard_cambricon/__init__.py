"""precguard plugin for Cambricon MLUs; the hooks live in :mod:`precguard_cambricon.plugin`."""

__version__ = "0.1.0"
