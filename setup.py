"""The one compiled part of precguard: capture's one-read statistics kernel.

Everything else about the package is in pyproject.toml. The extension is optional:
where no C++ compiler is found the install goes on without it, and capture takes
NumPy's and torch's passes instead (docs/capture.md, "Cost"). It is built with
OpenMP where the compiler has it (a split scan then runs on torch's own OpenMP
thread pool), else without (a split scan starts threads of its own).
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPENMP = ["-fopenmp"]


class BuildWithOpenMP(build_ext):
    """Build each extension with OpenMP, and again without it where that fails."""

    def build_extension(self, ext: Extension) -> None:
        plain_compile, plain_link = list(ext.extra_compile_args), list(ext.extra_link_args)
        ext.extra_compile_args = plain_compile + OPENMP
        ext.extra_link_args = plain_link + OPENMP
        try:
            super().build_extension(ext)
        except Exception as exc:  # a compiler without OpenMP (CompileError, LinkError)
            print(f"building {ext.name} without OpenMP: {exc}")
            ext.extra_compile_args, ext.extra_link_args = plain_compile, plain_link
            super().build_extension(ext)


setup(
    cmdclass={"build_ext": BuildWithOpenMP},
    ext_modules=[
        Extension(
            "precguard.capture._fused",
            sources=["src/precguard/capture/_fused.cpp"],
            depends=["src/precguard/capture/_fused_kernels.h"],
            extra_compile_args=["-O3", "-std=c++17"],
            language="c++",
            optional=True,
        )
    ],
)
