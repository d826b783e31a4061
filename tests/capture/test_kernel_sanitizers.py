"""The one-read kernel under AddressSanitizer and UndefinedBehaviorSanitizer.

``capture/_fused.cpp`` reads the user's tensors through raw addresses: an
out-of-bounds read, a misaligned load (a tensor at an odd byte offset), a signed
overflow or a float cast out of range would be silent in the release build. This
test compiles the kernel with ``-fsanitize=address,undefined -fno-sanitize-recover``
and runs the kernel's own tests (test_fused_kernel.py) and the statistics' edge cases
against that build, in a subprocess with ``libasan`` preloaded (Python itself is not
instrumented), once per instruction set. Any report aborts the child: the test fails
with the sanitizer's own lines. Skipped where no C++ compiler or no sanitizer runtime is
installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SOURCE = ROOT / "src" / "precguard" / "capture" / "_fused.cpp"

#: loads the sanitized build as precguard.capture._fused before anything imports the
#: installed one, then runs pytest on the given arguments
_RUNNER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("precguard.capture._fused", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.modules["precguard.capture._fused"] = module
from precguard.capture import stats
assert stats._fused is module, "the sanitized kernel was not the one loaded"
print("sanitized kernel loaded:", stats.FUSED_KERNELS, flush=True)
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""

#: what the sanitized build runs: the kernel's tests, and the statistics' cases whose
#: values or layouts are the kernel's edges (odd offsets, subnormals, long rows, threads)
_TESTS = [
    "tests/capture/test_fused_kernel.py",
    "-k",
    # instruction_sets starts the installed build in subprocesses (each set is run here
    # instead); the passes do not call the kernel
    "not instruction_sets and not passes",
    "tests/capture/test_stats_paths.py::test_host_path_equals_the_straightforward_computation",
]


def _runtime(compiler: str, name: str) -> str | None:
    """The path of the compiler's sanitizer runtime ``name``, or None."""
    found = subprocess.run(
        [compiler, f"-print-file-name={name}"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return found if found and os.path.isabs(found) and os.path.exists(found) else None


@pytest.fixture(scope="module")
def sanitized_kernel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The kernel built with ASan and UBSan, and the libasan to preload."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler here")
    libasan = _runtime(compiler, "libasan.so")
    if libasan is None:
        pytest.skip(f"{compiler} has no AddressSanitizer runtime (libasan.so)")
    out = tmp_path_factory.mktemp("asan") / "_fused_asan.so"
    flags = [
        "-O1",
        "-g",
        "-std=c++17",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-fno-omit-frame-pointer",
        "-fopenmp",  # as setup.py builds it: split scans on the OpenMP pool
        "-shared",
        "-fPIC",
        f"-I{sysconfig.get_paths()['include']}",
    ]
    built = subprocess.run(
        [compiler, *flags, str(SOURCE), "-o", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if built.returncode != 0:
        pytest.skip(f"the sanitized build failed: {built.stderr.strip()[-500:]}")
    return out, libasan


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["", "baseline"], ids=["best", "baseline"])
def test_the_kernel_is_clean_under_address_and_undefined_behaviour_sanitizers(
    sanitized_kernel: tuple[Path, str], kernels: str
) -> None:
    library, libasan = sanitized_kernel
    env = {
        **os.environ,
        "LD_PRELOAD": libasan,
        "PRECGUARD_KERNELS": kernels,
        # Python's own allocations are not the kernel's: leaks are not checked
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "OMP_NUM_THREADS": "2",
    }
    done = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(library), "-q", "-p", "no:cacheprovider", *_TESTS],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    report = (done.stdout + done.stderr)[-6000:]
    assert "sanitized kernel loaded" in done.stdout, report
    assert done.returncode == 0, report
    assert "runtime error" not in done.stderr and "AddressSanitizer" not in done.stderr, report
    assert " passed" in done.stdout and " failed" not in done.stdout, report
