"""The help text of ``precguard compare`` (kept apart so cli/compare.py stays a parser)."""

COMPARE_HELP = """Compare ACTUAL with GOLDEN and name the layer that introduced the error.

Records are paired by key (then by order within the same parent module), measured
(full tensors when both runs saved them, else statistics, a weaker test) and judged
by the error their precision (the less precise side's, --tolerance-dtype), their
reduction length and what they consumed explain (--profile fixed: a fixed
tolerance per dtype).

[bold]Reading the verdict[/bold]

[green]match[/green] (exit 0): every paired record is within tolerance.

[red]diverged[/red] (exit 1): some record is not. [bold]first divergence[/bold] names the first
module, in execution order, that made error [italic]itself[/italic] (local): its inputs matched and
it at least doubled the error its precision and inputs explain, or its error is >= 10x
that (the amplification), or its output is scaled relative to golden beyond what its
inputs' scale explains (a systematic bias), or its own weights differ. Records after it
that fail only passed the error on (propagated). [bold]suspects[/bold] lists every other module
that made error of its own. Pairs compared on statistics only (no full tensors) are a
weaker test: the verdict says "likely" and prints the --tensors glob that settles it.

[yellow]partial match[/yellow] (exit 3): what was compared matches, but part of the recordings
was not compared: steps or phases (backward) only one side recorded, or a run that did not
finish (it raised, or was killed). The gaps are printed first. --allow-partial makes it exit 0.

Exit 2: unusable input (missing or corrupt recording, different models, a recording compared
with itself), one line on stderr.

GOLDEN and ACTUAL may each be an msprobe (mindstudio-probe) dump directory, read as a
recording (see docs/msprobe.md; `precguard import-msprobe` converts one once).

Profiles (--profile): default judges each record by the error its precision explains, as
above: it fails beyond 10x that (the amplification), on a significant scale error of its own,
or when NaN/Inf differ. fixed: rel-L2 <= k x assert_close's rtol (k 2 for fp32/fp64, 3 for
fp16/bf16) and cosine >= 0.99. strict: every element as torch.testing.assert_close. msprobe:
Ascend msprobe's lax verdict. --rtol/--atol make the default a fixed tolerance with those
numbers. See docs/compare.md.

Bitwise identity by recorded hashes is its own command: `precguard bitwise GOLDEN ACTUAL`.
"""
