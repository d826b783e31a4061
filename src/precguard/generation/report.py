"""The ``generate-diff`` report: pydantic models written as JSON by ``--json``.

One :class:`GenerationDiff` per run: a :class:`PromptResult` per prompt (the
first token where the sides' decoding differs, the per-step curves, the KV-cache
comparison), a :class:`Summary` over prompts, and ``layerwise``: the compare
result of the teacher-forced replay at the first real divergence, with its
``first_divergence`` exactly as ``precguard compare`` writes it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from precguard.compare.impact_report import RemedyCheck
from precguard.errors import ExitCode

GENERATION_SCHEMA_VERSION = 1


class _Frozen(BaseModel):
    """A frozen report part; NaN/Inf written as strings."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")


FlipKind = Literal["near-tie", "divergence"]
CacheStatus = Literal["pass", "fail", "nonfinite", "missing"]


class SideReport(_Frozen):
    """The report's account of one side: where and how its model ran."""

    device: str = Field(description="Device string (cpu, cuda:0, emu:bf16-mixed, ...).")
    dtype: str = Field(description="dtype the model's weights were stored in.")
    compute_dtype: str = Field(
        description="Precision the values were computed in (the emu: profile's or the "
        "model's dtype); the near-tie bound is taken from the less precise side's."
    )
    target: str = Field(description="The target the model came from.")
    saved: str | None = Field(
        default=None, description="The --save-run directory it was read from."
    )


class TokenDivergence(_Frozen):
    """The first decoding step where the two sides chose different tokens."""

    step: int = Field(description="0-based index of the generated token (0: after the prefill).")
    golden_token: int = Field(description="Token id the golden side chose.")
    actual_token: int = Field(description="Token id the actual side chose.")
    golden_text: str | None = Field(default=None, description="The golden token's text.")
    actual_text: str | None = Field(default=None, description="The actual token's text.")
    golden_margin: float | None = Field(
        description="Golden's score of its own token minus its score of the actual's token "
        "(logits, or logits/T + Gumbel noise when sampling); None when non-finite."
    )
    actual_margin: float | None = Field(
        description="Actual's score of its own token minus its score of the golden's token."
    )
    tolerance: float = Field(
        description="The score difference the compute precision explains at this step: "
        "z * sqrt(2) * explained relative logit error * rms(golden logits) (docs/generate.md)."
    )
    logits_error: float | None = Field(
        description="Relative L2 error of the actual's logits against the golden's at this "
        "step; None when non-finite."
    )
    explained_error: float = Field(
        description="Relative logit error the compute precision explains: rounding_floor("
        "dtype, hidden size) * sqrt(number of layers)."
    )
    kind: FlipKind = Field(
        description="'near-tie': both margins within the tolerance and the logits within "
        "the explained error, a flip between two tokens within rounding of each other; "
        "'divergence': anything else."
    )
    reason: str = Field(description="One sentence saying why it is that kind.")


class StepPoint(_Frozen):
    """The two next-token distributions at one decoding step."""

    step: int = Field(description="0-based index of the generated token.")
    golden_token: int = Field(description="Token the golden chose (and both sides were fed).")
    actual_token: int = Field(description="Token the actual side would have chosen.")
    kl: float | None = Field(
        description="KL(golden || actual) of the next-token distributions in nats; None "
        "when either side's logits are non-finite."
    )
    top_k_overlap: float = Field(
        description="Share of the golden's top-k tokens that are in the actual's top-k."
    )
    logits_error: float | None = Field(
        description="Relative L2 error of the actual's logits; None when non-finite."
    )


class CacheEntry(_Frozen):
    """One cache tensor (a layer's keys or values) compared across the sides."""

    name: str = Field(description="Which tensor: 'layers.3.keys', 'layers.3.values', ...")
    golden_dtype: str = Field(description="dtype the golden's cache stored it in.")
    actual_dtype: str = Field(description="dtype the actual's cache stored it in.")
    shape: list[int] = Field(description="Shape (golden's).")
    rel_l2: float | None = Field(description="||a - g|| / ||g||; None when non-finite.")
    max_abs_err: float | None = Field(description="max |a - g|; None when non-finite.")
    golden_absmax: float = Field(description="max |g| over the finite elements.")
    nonfinite: int = Field(description="Elements non-finite on the actual side only.")
    first_nonfinite_position: int | None = Field(
        description="Sequence position of the first such element (the cache's -2 dimension)."
    )
    status: CacheStatus = Field(
        description="'nonfinite': values the golden holds finite are NaN/Inf; 'fail': the "
        "error at least doubles the largest error of the caches before it (or exceeds the "
        "explained error at the first); 'missing': one side lacks it or shapes differ."
    )


class CacheSnapshot(_Frozen):
    """The caches of both sides at one point of decoding."""

    after: str = Field(description="'prefill' or 'step N' (after N generated tokens).")
    entries: list[CacheEntry] = Field(description="Per layer, keys then values.")
    first_divergence: str | None = Field(
        description="Name of the first entry whose status is not 'pass'."
    )


class CacheConsistency(_Frozen):
    """Decoding with the cache against one forward without it, on the same side."""

    golden_error: float | None = Field(
        description="Largest relative L2 error over steps between the golden's cached "
        "logits and its cache-free logits; None when non-finite."
    )
    actual_error: float | None = Field(description="The same on the actual side.")
    threshold: float = Field(description="Largest error two correct computations explain.")
    actual_consistent: bool = Field(
        description="False: the actual's cached decoding computes something its own "
        "cache-free forward does not (cache precision, a RoPE position offset)."
    )
    golden_consistent: bool = Field(description="The same for the golden.")


class KVCache(_Frozen):
    """KV-cache evidence for one prompt."""

    snapshots: list[CacheSnapshot] = Field(description="After the prefill and after N steps.")
    consistency: CacheConsistency | None = Field(
        description="Cached vs cache-free on each side; None when not measured."
    )
    where: str | None = Field(
        default=None, description="The cache entry named: the first at fault or that differs."
    )
    verdict: Literal["consistent", "cache"] = Field(
        description="'cache': the actual's cache path is at fault (it is inconsistent with "
        "its own cache-free forward, or its cache holds values the golden's holds finite)."
    )
    reason: str = Field(description="One sentence naming the evidence.")


class PromptResult(_Frozen):
    """Everything measured for one prompt."""

    index: int = Field(description="0-based index of the prompt.")
    text: str | None = Field(description="The prompt's text, when it came as text.")
    prompt_tokens: int = Field(description="Length of the prompt in tokens.")
    golden_tokens: list[int] = Field(description="Tokens the golden generated.")
    actual_tokens: list[int] = Field(
        description="Tokens the actual chose at each step, fed the golden's tokens (teacher "
        "forcing: before the first flip this is its own free-running decoding)."
    )
    golden_texts: list[str] | None = Field(default=None, description="Text of each golden token.")
    actual_texts: list[str] | None = Field(default=None, description="Text of each actual token.")
    first_divergence: TokenDivergence | None = Field(
        description="The first step where the chosen tokens differ; None when they never do."
    )
    flips: int = Field(description="Steps where the chosen tokens differ (teacher-forced).")
    kl: list[float | None] = Field(description="KL(golden || actual) per step, nats.")
    steps: list[StepPoint] = Field(description="Per step: tokens, KL, top-k overlap.")
    kv_cache: KVCache | None = Field(description="KV-cache comparison; None without a cache.")
    seconds: float = Field(description="Wall time both sides spent on this prompt.")


class Summary(_Frozen):
    """Over all prompts."""

    prompts: int = Field(description="Number of prompts.")
    steps: int = Field(description="Decoding steps compared per prompt (max-new-tokens).")
    diverged: int = Field(description="Prompts whose first flip is a real divergence.")
    near_ties: int = Field(description="Prompts whose first flip is a near-tie.")
    share_diverged: float = Field(description="diverged / prompts.")
    share_flipped: float = Field(description="Prompts with any flip / prompts.")
    median_first_step: float | None = Field(
        description="Median step of the first flip over prompts that flipped."
    )
    mean_kl: float | None = Field(description="Mean KL over all finite steps and prompts.")
    max_kl: float | None = Field(description="Largest finite KL.")
    kv_cache_faults: int = Field(description="Prompts whose KV-cache verdict is 'cache'.")
    seconds_per_prompt: float = Field(description="Mean wall time per prompt (both sides).")


class Layerwise(_Frozen):
    """The teacher-forced replay at the first real divergence, compared layer by layer."""

    prompt: int = Field(description="Prompt replayed.")
    step: int = Field(description="Decoding step replayed (the divergent token's).")
    position: int = Field(description="Sequence position of the replayed forward's last token.")
    verdict: str = Field(description="The compare verdict.")
    first_divergence: dict[str, Any] | None = Field(
        description="The compare result's first_divergence, exactly as `precguard compare "
        "--json` writes it."
    )
    comparison: dict[str, Any] = Field(description="The whole compare result (its JSON).")
    recordings: list[str] | None = Field(
        default=None, description="Where the two recordings were kept (--keep-recordings)."
    )


class Cause(_Frozen):
    """The most likely cause, from the evidence above."""

    kind: Literal["layer", "kv-cache", "unknown"] = Field(description="What is at fault.")
    where: str | None = Field(description="The module, or the cache entry.")
    reason: str = Field(description="One sentence with the evidence.")


class GenerationDiff(_Frozen):
    """The result of ``precguard generate-diff``."""

    schema_version: int = Field(default=GENERATION_SCHEMA_VERSION, description="Format version.")
    golden: SideReport = Field(description="The reference side.")
    actual: SideReport = Field(description="The side under test.")
    mode: Literal["greedy", "sample"] = Field(description="Decoding rule.")
    seed: int | None = Field(description="Seed of the shared Gumbel noise when sampling.")
    temperature: float = Field(description="Sampling temperature (1 for greedy).")
    top_k: int = Field(description="k of the top-k overlap.")
    verdict: Literal["match", "near-ties", "diverged", "inconclusive"] = Field(
        description="'match': no flip; 'near-ties': only near-tie flips; 'diverged': a real one; "
        "'inconclusive': no step was decoded, so nothing was compared."
    )
    prompts: list[PromptResult] = Field(description="Per prompt.")
    summary: Summary = Field(description="Over prompts.")
    layerwise: Layerwise | None = Field(
        description="Compare result of the replay at the first real divergence; None when "
        "there is none or the replay was not run."
    )
    layerwise_note: str | None = Field(
        default=None, description="Why layerwise is null although a divergence was found."
    )
    cause: Cause | None = Field(description="The most likely cause of the first divergence.")
    remedies: list[RemedyCheck] = Field(
        default_factory=list,
        description="With --verify: the cause's remedy applied and the decoding re-run (a "
        "KV-cache cause: the cache kept in the model's dtype; docs/impact.md).",
    )

    @property
    def exit_code(self) -> int:
        """0 no real divergence (near-ties at most), 1 a divergence, 3 nothing compared."""
        if self.verdict == "inconclusive":
            return ExitCode.INCONCLUSIVE  # as compare and check: nothing compared is no pass
        return ExitCode.FAIL if self.verdict == "diverged" else ExitCode.PASS


def generation_schema() -> dict[str, Any]:
    """The JSON Schema of the ``generate-diff --json`` file."""
    return GenerationDiff.model_json_schema()
