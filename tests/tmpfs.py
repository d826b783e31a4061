"""A real, small tmpfs for disk-full tests (skipped where mounting is not permitted)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (``"24k"``, ``"2m"``) at ``where/disk``; unmount after."""
    mnt = where / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", f"pg-{uuid.uuid4().hex[:8]}", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
