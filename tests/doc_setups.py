"""What a doc example needs before its ``$ precguard`` lines run, made as the docs say.

``tests/test_doc_examples.py`` runs an example marked ``<!-- doc-example setup=NAME -->``
in a directory of its own, inside ``SETUPS[NAME](directory)``: the runs a training
script, a torchrun job, a Python snippet or a git history made, which a ``$ precguard``
line cannot make. Each setup does what the doc around the example describes, through the
public API or the script the doc names, and nothing the example then checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
    "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
    "OMP_NUM_THREADS": "1",
}


def _run(*args: str, cwd: Path) -> None:
    proc = subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"setup `{' '.join(args)}` failed:\n{proc.stdout}{proc.stderr}"


def _precguard(*args: str, cwd: Path) -> None:
    _run(sys.executable, "-m", "precguard", *args, cwd=cwd)


@contextlib.contextmanager
def rope_bug_golden(here: Path) -> Iterator[None]:
    """compare.md's replay: ``g``, the hand-written decoder recorded on the CPU, as the
    rope-bug example further down records it."""
    _precguard("record", "--target", "handwritten-llama-rope-bug", "--device", "cpu",
               "--out", "g", "--tensors", "*", cwd=here)  # fmt: skip
    yield


TWO_FAULTS = '''\
"""tiny-llama with two planted faults: layer 0's o_proj output 0.01 % too large, layer 1's
down_proj output 1 % too large."""

import dataclasses

from precguard.targets import build_tiny_llama, tiny_llama

FAULTS = {"model.layers.0.self_attn.o_proj": 1.0001, "model.layers.1.mlp.down_proj": 1.01}


def model():
    built = build_tiny_llama()
    for name, gain in FAULTS.items():
        built.get_submodule(name).register_forward_hook(lambda _m, _a, y, g=gain: y * g)
    return built


def target():
    return dataclasses.replace(tiny_llama(), model=model, name="two-faults")
'''


@contextlib.contextmanager
def two_faults(here: Path) -> Iterator[None]:
    """compare.md's ``--replay``: the target file ``two_faults.py`` (tiny-llama with two
    planted faults) that the example records and replays."""
    (here / "two_faults.py").write_text(TWO_FAULTS)
    yield


@contextlib.contextmanager
def renamed_blocks(here: Path) -> Iterator[None]:
    """compare.md's ``--map``: one MLP stack recorded as ``blocks.*`` (v1) and, with the
    same weights, as ``layers.*`` (v2): a rename between two versions of the code."""
    from collections import OrderedDict

    import torch
    from torch import nn

    import precguard

    class Stack(nn.Module):
        def __init__(self, name: str) -> None:
            super().__init__()
            torch.manual_seed(0)
            blocks = [
                nn.Sequential(
                    OrderedDict(fc1=nn.Linear(8, 16), act=nn.GELU(), fc2=nn.Linear(16, 8))
                )
                for _ in range(2)
            ]
            self.name = name
            setattr(self, name, nn.ModuleList(blocks))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in getattr(self, self.name):
                x = x + block(x)
            return x

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    for version, name in (("v1", "blocks"), ("v2", "layers")):
        model = Stack(name)
        with torch.no_grad(), precguard.monitor(model, out=here / "runs" / version):
            model(x)
    yield


@contextlib.contextmanager
def ranks_nan(here: Path) -> Iterator[None]:
    """distributed.md's ``ranks``: a real two-rank torchrun (gloo, CPU) whose rank 1 makes
    NaN before an all_reduce (``tests/distributed/collectives_run.py nan``)."""
    script = ROOT / "tests" / "distributed" / "collectives_run.py"
    _run(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
         "--monitor-interval=2", str(script), "runs/job", "nan", cwd=here)  # fmt: skip
    yield


@contextlib.contextmanager
def lock_held(here: Path) -> Iterator[None]:
    """recording.md's lock: ``runs/cpu`` while another process records there (this one
    holds the directory's ``flock``, as a recording's writer does)."""
    run = here / "runs" / "cpu"
    run.mkdir(parents=True)
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def bitwise_runs(here: Path) -> Iterator[None]:
    """watch.md's ``bitwise``: the same 3 training steps watched with ``hashes=True``
    twice (a, b), and once with the pooling's rows summed in reverse order (c)."""
    import torch

    from tests.watch.test_bitwise import _train

    forward = torch.arange(8)
    for name, order in (("a", forward), ("b", forward), ("c", forward.flip(0))):
        _train(here / "runs" / name, order)
    yield


#: the test file of guard.md (and of tests/guard/test_plugin_project.py)
GUARD_TEST = (
    (ROOT / "tests" / "guard" / "test_plugin_project.py")
    .read_text()
    .split('TESTS = """\\\n')[1]
    .split('"""')[0]
)


@contextlib.contextmanager
def guard_project(here: Path) -> Iterator[None]:
    """guard.md's story, before its first ``pytest``: a fresh project with the plugin's
    test file, ``tests/guard/models.py`` as ``model.py``, and a ``pytest.ini`` that says
    ``testpaths = tests`` and ``pythonpath = .``."""
    if (here / "tests").is_symlink():  # the project's own tests/, not the repository's
        (here / "tests").unlink()
    (here / "tests").mkdir()
    (here / "pytest.ini").write_text("[pytest]\ntestpaths = tests\npythonpath = .\n")
    shutil.copy(ROOT / "tests" / "guard" / "models.py", here / "model.py")
    (here / "tests" / "test_precision.py").write_text(GUARD_TEST)
    yield


@contextlib.contextmanager
def guard_gain(here: Path) -> Iterator[None]:
    """guard.md's step 4: the goldens committed with the code (``git add tests/goldens``),
    then the 0.1 % gain planted on layer 1 (``GAINS = {1: 1.001}`` in ``model.py``)."""
    git = ("git", "-c", "user.name=doc", "-c", "user.email=doc@example.com")
    _run("git", "init", "-q", cwd=here)
    _run(*git, "add", "pytest.ini", "model.py", "tests", cwd=here)
    _run(*git, "commit", "-qm", "goldens", cwd=here)
    source = (here / "model.py").read_text()
    planted = source.replace("GAINS: dict[int, float] = {}", "GAINS: dict[int, float] = {1: 1.001}")
    assert planted != source
    (here / "model.py").write_text(planted)
    yield


SETUPS: dict[str, Callable[[Path], contextlib.AbstractContextManager[None]]] = {
    "rope-bug-golden": rope_bug_golden,
    "two-faults": two_faults,
    "renamed-blocks": renamed_blocks,
    "ranks-nan": ranks_nan,
    "lock-held": lock_held,
    "bitwise-runs": bitwise_runs,
    "guard-project": guard_project,
    "guard-gain": guard_gain,
}
