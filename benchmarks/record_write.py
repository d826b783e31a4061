"""Cost of writing records: validation through the pydantic model plus its JSON, per record.

``RunWriter.write_records`` validates each flushed batch with one
``TypeAdapter(list[Record])`` and writes pydantic's own JSON. This prints the
time per record (best of ``--repeat`` rounds) for batches shaped like a
LLaMA step's (statistics of forward outputs), next to the plain
``json.dumps`` of the same dicts without validation, the cheapest a
hand-written writer could be, and capture's ``trusted=True`` batches (each
record layout validated once per writer, so a steady run validates none).
Multiply by the records per step (``benchmarks/overhead.py`` prints them) to
compare with a forward's time.

    .venv/bin/python benchmarks/record_write.py [--records 2000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import timeit
from pathlib import Path
from typing import Any


def _records(n: int) -> list[dict[str, Any]]:
    stats = {"min": -1.2345678, "max": 2.345678, "mean": 1.234e-3, "std": 0.98765}
    stats |= {"absmax": 2.345678, "l2": 123.456, "nan": 0, "inf": 0, "zeros": 3, "numel": 65536}
    return [
        {
            "key": f"model.layers.{i}.mlp.0.forward.output.0",
            "module": f"model.layers.{i}.mlp",
            "module_type": "LlamaMLP",
            "call": 0,
            "phase": "forward",
            "role": "output",
            "index": 0,
            "name": "output",
            "step": 0,
            "rank": 0,
            "seq": i,
            "dtype": "float32",
            "shape": [2, 128, 256],
            "stats": dict(stats, min=-math.inf) if i % 97 == 0 else dict(stats),
        }
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    from precguard.dump.writer import RunWriter

    batch = _records(args.records)
    with tempfile.TemporaryDirectory() as tmp:
        writer = RunWriter(Path(tmp) / "run")
        validated = min(
            timeit.repeat(lambda: writer.write_records(batch), number=1, repeat=args.repeat)
        )
        writer.close()
        # capture's batches: each record layout validated once per writer
        writer = RunWriter(Path(tmp) / "trusted")
        trusted = min(
            timeit.repeat(
                lambda: writer.write_records(batch, trusted=True), number=1, repeat=args.repeat
            )
        )
        writer.close()

    def plain() -> str:
        return "\n".join(json.dumps(r, separators=(",", ":"), allow_nan=True) for r in batch)

    unvalidated = min(timeit.repeat(plain, number=1, repeat=args.repeat))
    per = 1e6 / args.records
    print(f"records per batch:                 {args.records}")
    print(f"write_records (validated, pydantic JSON): {validated * per:6.2f} us/record")
    print(f"write_records(trusted=True), steady:     {trusted * per:6.2f} us/record")
    print(f"json.dumps only (no validation, no I/O):  {unvalidated * per:6.2f} us/record")


if __name__ == "__main__":
    main()
