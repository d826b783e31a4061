"""The one compiled part of precguard: capture's one-read statistics kernel.

Everything else about the package is in pyproject.toml. The extension is optional:
where no C++ compiler is found the install goes on without it, and capture takes
NumPy's and torch's passes instead (docs/capture.md, "Cost").
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "precguard.capture._fused",
            sources=["src/precguard/capture/_fused.cpp"],
            depends=["src/precguard/capture/_fused_kernels.h"],
            extra_compile_args=["-O3", "-std=c++17"],
            language="c++",
            optional=True,
        )
    ]
)
