"""The prompts both sides decode from: a prompts file, or the target's texts or batch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from precguard.errors import TargetError, UsageError
from precguard.target import Target, raised
from precguard.text import shown


@dataclass(frozen=True)
class Prompt:
    """One prompt: its token ids (``[1, P]``) and, when it came as text, the text."""

    ids: torch.Tensor
    text: str | None = None


#: a prompts file is text the user wrote: a few megabytes is thousands of prompts
MAX_PROMPTS_BYTES = 256 * 1024 * 1024


def read_prompts_file(path: Path) -> list[str | list[int]]:
    """Prompts from ``path``: JSON Lines (``{"text": ...}`` or ``{"input_ids": [...]}``
    per line), a JSON list of those or of strings, or plain text with one prompt a line."""
    from precguard.dump.untrusted import parse_json, read_bytes

    # a regular file of bounded size (a FIFO would hang the read), nesting bounded
    data = read_bytes(path, limit=MAX_PROMPTS_BYTES, what="prompts file", error=UsageError)
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--prompts {shown(path)}: not UTF-8 text") from exc
    items: list[Any]
    if path.suffix == ".json":
        items = parse_json(data, where=f"--prompts {shown(path)}", error=UsageError)
        if not isinstance(items, list):
            raise UsageError(f"--prompts {path}: expected a JSON list of prompts")
    elif path.suffix == ".jsonl":
        items = []
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append(parse_json(line, where="", error=UsageError))
            except UsageError as exc:
                raise UsageError(f"--prompts {shown(path)} line {n}: not a JSON object") from exc
    else:
        items = [line for line in raw.splitlines() if line.strip()]
    prompts: list[str | list[int]] = []
    for n, item in enumerate(items, 1):
        if isinstance(item, dict):
            item = item.get("input_ids", item.get("text"))
        if (isinstance(item, str) and item) or (
            isinstance(item, list)
            and item
            and all(type(i) is int and 0 <= i < 2**63 for i in item)  # torch's int64
        ):
            prompts.append(item)
        else:
            raise UsageError(
                f"--prompts {path} prompt {n}: expected text or a list of token ids, got "
                f"{type(item).__name__}"
            )
    if not prompts:
        raise UsageError(f"--prompts {path}: holds no prompt")
    return prompts


def build_prompts(target: Target, given: list[str | list[int]] | None) -> list[Prompt]:
    """Token ids for each prompt: ``given`` (texts or ids), else the target's ``texts``
    through its tokenizer, else each row of the target's ``batch(0)`` ids."""
    tokenizer = None
    if target.tokenizer is not None and (given is None or any(isinstance(p, str) for p in given)):
        try:
            tokenizer = target.tokenizer()
        except (Exception, SystemExit) as exc:
            raise TargetError(
                f"target {target.name!r}: building the tokenizer {raised(exc)}"
            ) from exc
    if given is None:
        if target.texts and tokenizer is not None:
            given = list(target.texts)
        else:
            rows = _batch_prompts(target)
            if not rows:
                raise UsageError(f"target {target.name!r}: batch(0) holds no rows to decode")
            return rows
    if not given:
        raise UsageError("no prompts to decode: nothing would be compared")
    prompts = []
    for p in given:
        text = p if isinstance(p, str) else None
        if text is not None and tokenizer is None:
            raise UsageError(
                f"target {target.name!r} has no tokenizer: give prompts as token ids "
                '({"input_ids": [...]} lines in a .jsonl file)'
            )
        ids = list(tokenizer.encode(text) if text is not None else p)
        prompts.append(Prompt(torch.tensor([ids], dtype=torch.long), text))
    if any(p.ids.shape[1] == 0 for p in prompts):
        raise UsageError("a prompt encodes to no tokens")
    return prompts


def _batch_prompts(target: Target) -> list[Prompt]:
    try:
        batch = target.batch(0)
    except (Exception, SystemExit) as exc:
        raise TargetError(f"target {target.name!r}: batch(0) {raised(exc)}") from exc
    ids = batch.get("input_ids") if isinstance(batch, dict) else batch
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.is_floating_point():
        raise UsageError(
            f"target {target.name!r} has no texts and tokenizer, and its batch(0) is not "
            "token ids [batch, seq]: give --prompts"
        )
    return [Prompt(row[None].long()) for row in ids]


def make_tokenizer(target: Target) -> Any:
    """The target's tokenizer, or None when it has none or it cannot be built."""
    if target.tokenizer is None:
        return None
    try:
        return target.tokenizer()
    except Exception:  # only used to show token texts: ids are shown instead
        return None


def token_texts(tokenizer: Any, ids: list[int]) -> list[str] | None:
    """Each token's text through ``tokenizer``, or None without one."""
    if tokenizer is None:
        return None
    try:
        return [str(tokenizer.decode([i])) for i in ids]
    except Exception:  # a tokenizer that cannot decode single ids: show ids only
        return None
