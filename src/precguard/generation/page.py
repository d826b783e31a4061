"""The ``generate-diff --html`` page: verdict, per-prompt token strips, the KL curve.

Built on the frame every precguard report shares (:mod:`precguard.report.page`):
one self-contained file, every untrusted string (prompt and token texts, module
names) escaped.
"""

from __future__ import annotations

import math
from pathlib import Path

from precguard.generation.report import GenerationDiff, PromptResult
from precguard.report.page import document, esc, number, status_span, write_page
from precguard.report.plots import figure, log_floor, positive, to_svg

_STRIP_CSS = (
    "<style>.strip{font-family:ui-monospace,monospace;font-size:90%;line-height:2;}"
    ".strip span{border:1px solid #d0d7de;border-radius:3px;padding:0 .25em;margin:0 1px;"
    "white-space:pre;}.strip span.diff{background:#ffebe9;border-color:#cf222e;}"
    ".strip span.tie{background:#fff8c5;border-color:#9a6700;}"
    ".strip b{display:inline-block;width:4.5em;color:#57606a;font-weight:600;}</style>"
)


def _cell(text: str | None, token: int) -> str:
    shown = text if text is not None and text.isprintable() else None
    return esc(shown if shown else f"#{token}")


def _strip(r: PromptResult) -> str:
    fd = r.first_divergence
    rows = []
    for label, tokens, texts in (
        ("golden", r.golden_tokens, r.golden_texts),
        ("actual", r.actual_tokens, r.actual_texts),
    ):
        cells = []
        for t, token in enumerate(tokens):
            cls = ""
            if r.golden_tokens[t] != r.actual_tokens[t]:
                first_tie = fd is not None and fd.step == t and fd.kind == "near-tie"
                cls = " class='tie'" if first_tie else " class='diff'"
            text = texts[t] if texts else None
            cells.append(f"<span{cls} title='step {t}: id {token}'>{_cell(text, token)}</span>")
        rows.append(f"<div><b>{label}</b>{''.join(cells)}</div>")
    return f"<div class='strip'>{''.join(rows)}</div>"


def _kl_plot(result: GenerationDiff) -> str:
    fig = figure(11.0, 3.2)
    ax = fig.add_subplot()
    values = [k for r in result.prompts for k in r.kl]
    floor = log_floor(values)
    for r in result.prompts:
        ax.plot(range(len(r.kl)), positive(r.kl, floor), marker=".", label=f"prompt {r.index}")
        fd = r.first_divergence
        if fd is not None and fd.step < len(r.kl):
            k = r.kl[fd.step]
            y = max(k, floor) if k is not None and math.isfinite(k) else floor
            ax.plot([fd.step], [y], marker="x" if fd.kind == "divergence" else "o", color="k")
    ax.set_yscale("log")
    ax.set_xlabel("decoding step (teacher-forced on the golden's tokens after a flip)")
    ax.set_ylabel("KL(golden || actual), nats")
    if len(result.prompts) <= 12:
        ax.legend(fontsize=8, ncol=4)
    return to_svg(fig)


def _prompt_section(r: PromptResult) -> str:
    fd = r.first_divergence
    if fd is None:
        head = status_span("pass", "same tokens")
        detail = ""
    else:
        head = status_span("warn" if fd.kind == "near-tie" else "fail", fd.kind)
        detail = (
            f"<p>step {fd.step}: golden {_cell(fd.golden_text, fd.golden_token)} "
            f"(margin {number(fd.golden_margin)}), actual "
            f"{_cell(fd.actual_text, fd.actual_token)} (margin {number(fd.actual_margin)}); "
            f"tolerance {number(fd.tolerance)}. {esc(fd.reason)}</p>"
        )
    kv = ""
    if r.kv_cache is not None and r.kv_cache.verdict == "cache":
        kv = f"<p>{status_span('fail', 'kv-cache')} {esc(r.kv_cache.reason)}</p>"
    text = f"<p class='sub mono'>{esc(r.text)}</p>" if r.text else ""
    return (
        f"<h3>prompt {r.index} — {head} <span class='sub'>({r.prompt_tokens} tokens, "
        f"{r.flips} flip(s), {r.seconds:.2f} s)</span></h3>{text}{detail}{kv}{_strip(r)}"
    )


def render_html(result: GenerationDiff) -> str:
    """The whole page as HTML text."""
    s = result.summary
    g, a = result.golden, result.actual
    box = {"match": "ok", "near-ties": "warn", "inconclusive": "warn"}.get(result.verdict, "")
    layer = ""
    if result.layerwise is not None:
        fd = result.layerwise.first_divergence or {}
        layer = (
            f"<dt>layerwise</dt><dd>prompt {result.layerwise.prompt}, step "
            f"{result.layerwise.step}: <code>{esc(fd.get('module') or '-')}</code> — "
            f"{esc(fd.get('reason') or result.layerwise.verdict)}</dd>"
        )
    cause = ""
    if result.cause is not None:
        cause = (
            f"<dt>cause</dt><dd>{esc(result.cause.kind)} <code>{esc(result.cause.where or '-')}"
            f"</code>: {esc(result.cause.reason)}</dd>"
        )
    for check in result.remedies:  # --verify: the cause's remedy, its before/after
        cause += f"<dt>remedy</dt><dd>{esc(check.describe())}</dd>"
    body = (
        f"{_STRIP_CSS}<h1>generate-diff</h1>"
        f"<p class='sub'>golden {esc(g.device)} ({esc(g.compute_dtype)}) vs actual "
        f"{esc(a.device)} ({esc(a.compute_dtype)}); {esc(result.mode)}, {s.steps} new tokens</p>"
        f"<div class='box {box}'><span class='verdict'>{esc(result.verdict)}</span><dl>"
        f"<dt>prompts</dt><dd>{s.diverged}/{s.prompts} diverged, {s.near_ties} near-tie(s); "
        f"median first step {number(s.median_first_step)}</dd>"
        f"<dt>KL</dt><dd>mean {number(s.mean_kl)}, max {number(s.max_kl)} nats</dd>"
        f"<dt>KV cache</dt><dd>{s.kv_cache_faults} prompt(s) with a cache fault</dd>"
        f"{layer}{cause}</dl></div>"
        f"<h2>KL divergence along the steps</h2>{_kl_plot(result)}"
        "<h2>Prompts</h2><p class='sub'>Tokens in red differ (yellow: the first flip, a "
        "near-tie); after a flip both sides are fed the golden's tokens.</p>"
        + "".join(_prompt_section(r) for r in result.prompts)
    )
    return document("precguard generate-diff", body)


def write_html(result: GenerationDiff, path: Path) -> Path:
    """Write the page to ``path``."""
    return write_page(path, render_html(result))
