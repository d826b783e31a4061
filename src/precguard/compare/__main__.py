"""``python -m precguard.compare GOLDEN ACTUAL [options]``: compare, also across a torchrun job.

Alone it is ``precguard compare``. Under ``torchrun`` (``WORLD_SIZE`` > 1) every
process takes a share of the (rank, step) units, rank 0 gathers the shares
(``gather_object`` of JSON strings over a gloo group: CPU only, whatever the
cluster's accelerators), merges and prints the report, and every process
exits with rank 0's exit code::

    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-endpoint HOST:29500 \\
        -m precguard.compare runs/golden runs/actual --json verdict.json

Both recordings must be readable from every node (a shared file system).
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str] | None = None) -> None:
    """Run ``precguard compare`` with ``argv``, sharing the work with a torchrun job if any."""
    from precguard.cli import main as cli_main

    args = sys.argv[1:] if argv is None else argv
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        cli_main(["compare", *args])
        return
    import torch.distributed as dist

    from precguard.compare import parallel

    dist.init_process_group("gloo")
    parallel.activate_job()
    code: int | str | None = 0
    try:
        cli_main(["compare", *args])
    except parallel.ShareSent:
        code = None  # rank 0 decides
    except SystemExit as exc:
        code = exc.code
    box = [json.dumps(code if isinstance(code, int) or code is None else 2)]
    dist.broadcast_object_list(box, src=0)
    dist.destroy_process_group()
    # gloo's threads can abort the interpreter's teardown ("terminate called without an
    # active exception"), which would replace rank 0's exit code by -6: the report is
    # written, so flush and leave without the teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(json.loads(box[0]) or 0)


if __name__ == "__main__":
    main()
