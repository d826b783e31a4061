"""precguard plugin for NVIDIA GPUs; the hooks live in :mod:`precguard_cuda.plugin`."""

__version__ = "0.1.0"
