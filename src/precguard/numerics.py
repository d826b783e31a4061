"""The one numerics core every judge of error asks: floors, lengths, one measure, one ladder.

Compare's judge, divergence, replay, op-check, the optimizer and routing rules,
impact's remedy verdicts and generate-diff all decide "is this error what a
correct computation explains?". They share here, defined once:

- **the unit roundoff** of a precision (:func:`unit_roundoff`) and **the rounding
  floor** (:func:`rounding_floor`): one rounding to the precision plus the
  probabilistic accumulation error ``sqrt(K) * u_acc`` of a reduction of length
  ``K`` (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019; the worst case is
  ``gamma_K = K u / (1 - K u)``, Higham, *Accuracy and Stability of Numerical
  Algorithms*, 2nd ed., §3.1). Accelerators store bf16/fp16 and accumulate in
  fp32 (docs/emu.md), so ``u_acc`` is fp32's unless the precision is finer;
- **the reduction length** ``K`` of a call (:func:`reduction_length`);
- **one measure of two tensors** (:func:`measure`): relative L2, max-abs,
  max-relative, ULPs, the least-squares scale, and the NaN/Inf counts of each
  side, where a non-finite element on one side only is never a zero error;
- **one status ladder** (:func:`ladder`, :func:`status`): non-finite, then
  exact (indices), then the error against what is allowed;
- **the thresholds**, each a multiple of the floor with the arithmetic it stands
  for (a growth factor, a worst-case sum of roundings, a z-score, a triangle
  inequality) in its comment.

It imports only :mod:`precguard.difference` (the chunked sums of :func:`measure`): every
package may ask it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    import torch

#: significand bits (with the implicit one) of the precisions judged; besides torch's float
#: dtypes, the reduced-precision fp32 matmul modes a backend can report as its compute
#: precision: TF32 (NVIDIA, Cambricon: 10 stored mantissa bits) and Ascend's HF32 (11).
#: Fewer bits is less precise.
SIGNIFICAND_BITS: dict[str, int] = {
    "float64": 53,
    "float32": 24,
    "hfloat32": 12,
    "tfloat32": 11,
    "float16": 11,
    "bfloat16": 8,
    # float8 (OCP e4m3/e5m2, and the fnuz variants): compared upcast to fp32/fp64
    "float8_e4m3fn": 4,
    "float8_e4m3fnuz": 4,
    "float8_e5m2": 3,
    "float8_e5m2fnuz": 3,
}

#: a complex tensor is measured as its real view: each of its two parts in this float dtype
#: (``torch.view_as_real``; Llama 4's rotary embedding returns ``complex64`` frequencies)
COMPLEX_PARTS: dict[str, str] = {
    "complex32": "float16",
    "complex64": "float32",
    "complex128": "float64",
}

# -- the thresholds, as multiples of the floor ----------------------------------------------

#: the factor by which a correct module may grow the relative error of what it consumed.
#: A product of two operands that each carry a relative error ``d`` (``q . k``, ``gate * up``,
#: ``x * w``) carries ``(1 + d)^2 - 1 ~ 2 d``; a sum or a normalization carries at most ``d``.
#: So a module whose inputs are within tolerance is *local* only when it at least doubled
#: their error (compare/divergence.py), and a scale error grows by at most 2 through it.
PRODUCT_GROWTH = 2.0
#: alias in divergence's words: below this growth, propagated error merely crossed the
#: threshold at the module's output
MIN_LOCAL_GROWTH = PRODUCT_GROWTH

#: a correct module replayed on golden inputs rounded to its dtype stays within this many
#: times its expected error ``E = max(e_in, floor)``. By the triangle inequality its output
#: error is at most the sum of: its inputs' rounding grown by :data:`PRODUCT_GROWTH`
#: (``2 e_in``), its weights' rounding to the same dtype (about ``e_in`` again: the same
#: rounding of the same precision), and its own rounding floor (``floor``):
#: ``2 e_in + e_in + floor <= (PRODUCT_GROWTH + 2) E = 4 E``.
REPLAY_MARGIN = PRODUCT_GROWTH + 2.0

#: op-check allows ``OPCHECK_ROUNDINGS`` unit roundoffs of the compute dtype on max|e| /
#: max|truth|, on top of the accumulation term. Op-check's inputs are rounded to the dtype
#: first (exact on both sides), so the error is the op's own: the worst case of ``n``
#: roundings lined up in one element is ``gamma_n ~ n u`` (Higham §3.1). The longest chain
#: of the built-in ops (layer_norm: centre, square, rsqrt, scale, weight, bias, plus the
#: roundings of the mean and variance it broadcasts to every element) is under 8 roundings
#: on the value and 8 on the statistic: 16.
OPCHECK_ROUNDINGS = 16
#: the same tolerance in machine epsilons (``eps = 2 u``), as op-check has always named it
TOLERANCE_EPS = OPCHECK_ROUNDINGS // 2

#: op-check re-centres a norm's rows to a mean this many times their spread
#: (opcheck/norm.py). A correct norm rounds the row mean once (``M u`` of the spread for a
#: mean ``M`` times the spread) and centres before squaring: at ``M = TOLERANCE_EPS = 8``
#: that is ``8 u``, half the tolerance of ``16 u``. The one-pass variance
#: ``E[x^2] - E[x]^2`` rounds two terms of ``M^2`` times the variance: up to ``2 M^2 u =
#: 128 u`` of the variance, ``64 u`` of the scale, four times the tolerance. One ratio
#: separates the two on every dtype, derived from the tolerance alone.
MEAN_TO_SPREAD = TOLERANCE_EPS

#: a row routed to other experts on the two sides differs by at most the norm of both
#: sides' rows (triangle inequality: ``||a - g|| <= ||a|| + ||g||``), the two of about the
#: same norm: twice its own norm (compare/routing.py)
REROUTED_ROW_ERROR = 2.0

#: standard deviations of a rounding error within which a difference is explained: a z-score
#: of 3, which a Gaussian error exceeds with probability 0.27 % (two-sided). A gradient
#: element within ``Z_SCORE`` error standard deviations of zero counts as zero when only its
#: global error is known (compare/optimizer.py); two tokens whose scores are within
#: ``Z_SCORE`` standard deviations of their difference's explained error are a near-tie
#: (generation/judge.py)
Z_SCORE = 3.0
#: a gradient's density at zero times its rms, taken as the most a real gradient has: a
#: Gaussian has ``1/sqrt(2 pi) = 0.40``, a Laplace ``1/sqrt(2) = 0.71``; 1 is ``sqrt(2)``
#: times the Laplace's, the peakiest common model. The share within ``z e_g rms`` of zero is
#: then ``f <= 2 * Z_SCORE * ZERO_DENSITY * e_g`` (density times width).
ZERO_DENSITY = 1.0

#: a remedy is verified when its output error is at most this multiple of the floor. The
#: output error of a correct run is the root of a sum of squares of many independent
#: roundings (every module's); a remedy computes one module differently from the floor's
#: correct kernel (float32 weights instead of rounded ones, another rounding order), which
#: moves that sum by the module's own part of it: ``1 + 1/4`` lets that one module own up to
#: a quarter of the floor's error, more than any single module of a correct run should (a
#: module beyond that is itself a finding of the budget) (localize/impact.py).
FLOOR_SLACK = 1.25

#: a re-run reproduces a recorded output error when within this share of it: the same code
#: on the same device gives the same bits (0); another device of the same precision rounds
#: each module otherwise, which moves a correct run's error by what one module may own of
#: it, the :data:`FLOOR_SLACK` margin's quarter (localize/impact.py)
REPRODUCED = FLOOR_SLACK - 1.0

#: the profile's amplification: an error at least ten times (one order of magnitude) what
#: explains it is made by the module itself (compare/tolerance.py)
AMPLIFICATION = 10.0
#: a remedy that removes less than this share of the excess over the floor did not help: the
#: reciprocal of :data:`AMPLIFICATION`. A change an order of magnitude below the excess is
#: what the judge treats as explained, not made (an excess that stays above 90 % is the same
#: fault, not a partial fix) (localize/impact.py).
HELP_SHARE = 1.0 / AMPLIFICATION

#: a slice's relative error is taken against at least this share of the typical
#: slice's golden norm (``rms(golden) * sqrt(elements per slice)``), the full level's
#: slices (compare/metrics.py, compare/sampled.py) and the per-position norms
#: alike. A slice's error has two sources a correct run explains: the rounding of its
#: own values (relative to its own norm) and its share of the error that every
#: operation mixing slices spreads over the tensor (a norm's input gradient puts
#: ``mean(g w x)`` terms of the row's scale into every channel; attention mixes
#: positions): an even share is ``rel_l2`` times the *typical* slice's norm, whatever
#: the slice's own. Against ``max(own norm, typical norm)`` both read as at most the
#: relative error the judge already expects (the consumed records' error), so a
#: channel of near-zero golden values carrying its share reads ``rel_l2``, not
#: ``rel_l2 * typical / own`` (10x at a floor of 0.1: a LayerNorm's input gradient in
#: the parallel decoder); a slice that carries more than its share still reads more
#: (an error confined to one of S slices: ``sqrt(S)`` times ``rel_l2``)
SLICE_FLOOR = 1.0

#: sampled elements an output's peak error must reach before it counts (the rule of three;
#: compare/sampled.py): an error confined to a share ``p`` of a tensor's elements escapes a sample
#: of ``n`` with probability ``(1 - p)^n ~ exp(-n p)``, so inputs whose samples saw no such error
#: exclude a source of prevalence ``k / n`` with confidence ``1 - exp(-k)``: 95 % at ``k = 3``
#: (Hanley & Lippman-Hand, JAMA 249(13), 1983). An error that only one or two of the output's
#: sampled elements carry (the row of a token a router sent elsewhere in an earlier layer) may come
#: from a source the inputs' samples missed as easily. The confidence is the rule's, not
#: ``bias_z``'s: at ``exp(-z^2 / 2)`` with ``z = 4`` an error had to reach 8 of 128 sampled
#: elements, and the RoPE bug's late positions (4-6 of them) would go unseen (docs/compare.md,
#: "Sampling uncertainty")
RARE_COUNT = 3

#: How far a correct device run's output error may exceed its floor (localize/bisect.py), the
#: error of the same forward with every leaf module computed at reference precision and its
#: inputs and output rounded once to the device's format (the code between leaves stays
#: on the device). That floor holds every rounding a correct device must do: each hand-off
#: between modules stored in its format. A correct leaf adds the roundings of its own
#: intermediate values; each is one rounding relative to a value no larger than what it
#: feeds (a well-conditioned kernel does not amplify them), so, rounding errors being
#: independent, they add at most as much again in quadrature: sqrt(1 + 1) times the floor.
#: A leaf whose code is ill-conditioned in the device's precision (one-pass variance of a
#: row with a large mean, angles rounded before the sine, a matmul past the format's
#: range) exceeds it. Measured on ``emu:bf16`` (``precguard bisect``, docs/bisect.md):
#: parallel-decoder 1.08x its floor, tiny-llama 1.2x, the one-pass LayerNorm twin 1.96x.
CORRECT_RUN_GROWTH = math.sqrt(2.0)


# -- thresholds of the scale (bias) test, the judges' factors of two, and the tools' -------
# (issue 38: each was defined beside the code that used it; the arithmetic is here)

#: standard errors by which a least-squares scale must differ from 1 to count as a systematic
#: error (``Profile.bias_z``'s default; compare/tolerance.py, expected.py, routing.py,
#: sampled.py). Unlike :data:`Z_SCORE`, which judges one decision (one token, one gradient
#: element), the scale test runs on every measured record of a step, a family of ``N`` ~ 1000
#: (a 16-layer model's forward and backward records). A Gaussian estimate exceeds ``z``
#: standard errors with probability ``p(z) = erfc(z / sqrt 2)`` (two-sided); the chance that
#: any of ``N`` does is at most ``N p(z)`` (Bonferroni). At ``z = 3``, ``N p = 2.7``: several
#: false systematic errors per step; a family-wise rate of at most 10 % at ``N = 1000`` needs
#: ``p <= 1e-4``, ``z >= 3.9``; 4 is that, rounded up to a whole standard error (``N p = 0.06``).
BIAS_Z = 4.0

#: a scale is read as a perturbation of golden only while every input is this close to
#: golden (relative L2 error; compare/expected.py). The scale test reads a module's output
#: scale to first order: inputs scaled by ``1 + d`` give a product ``(1 + d)^2 = 1 + 2 d +
#: d^2`` (:data:`PRODUCT_GROWTH`), and the neglected ``d^2`` is ``d / 2`` of the term kept.
#: At ``d = 1/4`` that is an eighth, the most a first-order reading may be off before its
#: scale says more of the inputs' difference than of the module (beyond it the runs compute
#: different things altogether: other input data).
BIAS_MAX_INPUT_ERROR = 0.25

#: a factor of a linear module's scale ratio (compare/expected.py ``linear_factors``) must
#: be within this many unit roundoffs of golden: :data:`AMPLIFICATION`, the judge's own gate
#: on one rounding. An error within it is rounding, random, and its projection on the output
#: is what the standard errors measure; one beyond is the judge's finding upstream, and may
#: be structured
RATIO_MAX_ULPS = AMPLIFICATION

#: a router's top-k flips when the two scores of a pair move apart, each by the largest
#: element error the judge accepts for the scores record: the margin rounding can cross is
#: the two bounds added (triangle inequality; compare/routing.py ``margin_tolerance``)
SCORE_PAIR = 2.0

#: the error of a difference of two values each carrying ``e``: at most ``2 e`` (triangle
#: inequality; the optimizer's update and the parameter after it, compare/judge.py: two
#: correct optimizers fed gradients that differ by rounding take steps that differ by at
#: most twice the golden step's size)
DIFFERENCE_GROWTH = 2.0

#: a near-tie of generate-diff also needs the whole logits vector within this many times
#: its explained error (generation/judge.py, generation/kvcache.py): the logits' relative
#: error of a correct run is a draw of the explained error (:func:`stacked_floor`), and
#: :data:`Z_SCORE` of it is what a correct draw stays within
LOGITS_SLACK = Z_SCORE

#: op-check's growth verdict (opcheck/measure.py): an error that grows by more than this
#: factor over the swept lengths "grows". A correct op's mean error is its output rounding,
#: flat in the length (the fp32 accumulation, ``sqrt(n) u_32``, adds under 4e-6 at 4096
#: terms, 1 % of bf16's or fp16's rounding); an op accumulating in its compute dtype grows as
#: ``n u`` (32x over the default 128 -> 4096), a probabilistic one as ``sqrt(n)`` (5.7x). The
#: error doubled twice (``PRODUCT_GROWTH ** 2``) is beyond the scatter of a flat fit (a
#: fraction of one rounding) and below both kinds of growth.
GROWTH_FACTOR = PRODUCT_GROWTH**2

#: a check warns on an error above its tolerance and fails on one this many times beyond
#: it (checks/attention.py, checks/norm.py): ``2^3``, the three significand bits that
#: separate fp16 (11) from bf16 (8). A kernel within it rounds more than the tolerance's
#: precision assumes (another order, an extra rounding: a warning); one beyond it has lost
#: a whole precision class (it computes in a lower format than it claims)
PRECISION_STEP = 2.0 ** (SIGNIFICAND_BITS["float16"] - SIGNIFICAND_BITS["bfloat16"])

#: an additive attention mask's fill masks a key when ``exp`` of it rounds to zero in
#: float32, where softmax's exponentials are taken (upcast, or accumulated in fp32): below
#: half fp32's smallest subnormal, ``2^-150``, so ``fill < -150 ln 2 = -104`` (attention
#: scores are O(1)-O(10), far inside that). Two masks whose fills both lie there (fp32's
#: ``finfo.min`` -3.4e38, bf16's -3.39e38, fp16's -65504 or -inf) mask the same keys: one
#: mask in two formats, compared as masks (compare/padding.py)
MASK_FILL_MAX = -150.0 * math.log(2.0)

#: a slice's or the peak element's error is told as concentrated in a why line
#: (compare/divergence.py) when at least this many times the global error: an error confined
#: to a share ``p`` of the slices reads ``1 / sqrt(p)`` times the global error in them (the
#: same squared error over fewer elements), so twice is a share of at most a quarter, where
#: an even error (rounding) reads about once
CONCENTRATION = 2.0

#: an error below this share of the compute dtype's epsilon counts as that share when
#: op-check fits the growth (opcheck/sweep.py). One correct rounding errs by ``u / 2 = eps /
#: 4`` on average (uniform on ``[-u, u]``); a quarter of that, ``eps / 16``, is below what an
#: op that rounds its output even once shows, so an error under it is noise, not a length
#: dependence
GROWTH_FLOOR_EPS = 1.0 / 16.0


# -- the rounding floor and the reduction length --------------------------------------------


def unit_roundoff(dtype: str) -> float:
    """Half the machine epsilon of ``dtype`` (float32's for non-float dtypes).

    >>> unit_roundoff("bfloat16") == 2.0**-8
    True
    """
    return 2.0 ** -SIGNIFICAND_BITS.get(dtype, SIGNIFICAND_BITS["float32"])


#: exponent bits of the 16-bit floats: their most negative finite value (``finfo.min``) is
#: what models put in attention masks as a stand-in for -inf
EXPONENT_BITS_16: dict[str, int] = {"float16": 5, "bfloat16": 8}


def mask_floor(dtype: str) -> float:
    """Values at or below this are ``dtype``'s stand-in for -inf (-inf: it has none).

    For fp16 and bf16 their most negative finite value, ``-(2 - 2^(1-p)) 2^emax`` with ``p``
    significand bits and ``emax = 2^(e-1) - 1`` for ``e`` exponent bits: -65504 and about
    -3.39e38. Wider floats' masks use -inf itself or their own min, which no error reaches.

    >>> mask_floor("float16")
    -65504.0
    """
    e = EXPONENT_BITS_16.get(dtype)
    if e is None:
        return -math.inf
    return -(2.0 - 2.0 ** (1 - SIGNIFICAND_BITS[dtype])) * 2.0 ** (2 ** (e - 1) - 1)


def accumulation_error(k: int | None, dtype: str = "float32") -> float:
    """The probabilistic error ``sqrt(k) * u_acc`` of a reduction of length ``k``.

    ``u_acc`` is fp32's, or ``dtype``'s when that is more precise (accelerators
    accumulate in fp32). Zero for no reduction (``k`` None, 0 or 1).
    """
    if not k or k <= 1:
        return 0.0
    u_acc = min(unit_roundoff(dtype), unit_roundoff("float32"))
    return math.sqrt(k) * u_acc


def rounding_floor(dtype: str, k: int | None = None) -> float:
    """Relative error a correct output in ``dtype`` carries when its inputs are exact.

    One rounding to ``dtype`` plus :func:`accumulation_error` of dot products of
    length ``k``.

    >>> rounding_floor("bfloat16") == 2.0**-8
    True
    """
    if dtype in FP8_FORMATS:
        return fp8_gemm_error(dtype, k)
    return unit_roundoff(dtype) + accumulation_error(k, dtype)


def expected_error(input_error: float, dtype: str, k: int | None = None) -> float:
    """The output error a correct module explains: its inputs' error or its rounding floor."""
    return max(input_error, rounding_floor(dtype, k))


# -- the checks' precision classes and a rotary embedding's cos/sin ------------------------

#: the formats an op's relative error vs fp64 is named after (checks/ops.py
#: ``effective_precision``), finest first; past the last, an op "behaves like" the next
#: coarser format, fp8 e4m3 (4 bits), told as "below bfloat16"
PRECISION_CLASSES: tuple[str, ...] = ("float32", "float16", "bfloat16")


def precision_class(err: float) -> str:
    """The format a relative error vs fp64 points to: the one whose unit roundoff is nearest
    in bits (``log2``), or "below bfloat16".

    A correct op in format ``F`` errs by about one rounding, ``u_F`` (the probes of
    checks/ops.py measure 0.2-1 ``u_F`` on CPU, bf16's 0.4-1; an fp32 reduction over 4096
    terms adds ``sqrt(k) u_32``, up to 6 ``u_32``, still far from fp16). The boundary
    between ``F`` and the next coarser ``G`` is their geometric mean ``sqrt(u_F u_G)``: an
    error below it is nearer ``F``'s rounding than ``G``'s in bits. fp32 | fp16 at
    ``2^-17.5`` (5.4e-6), fp16 | bf16 at ``2^-9.5`` (1.4e-3, 0.35 ``u_bf16``: a bf16 op
    under it is told as fp16, never as lowered), bf16 | fp8 e4m3 at ``2^-6`` (1.6e-2): each
    at least 2.8x above the largest error a correct op of the finer format shows, and
    2.8x below one rounding of the coarser.

    >>> precision_class(unit_roundoff("float16")), precision_class(unit_roundoff("bfloat16"))
    ('float16', 'bfloat16')
    """
    coarser = (*PRECISION_CLASSES[1:], "float8_e4m3fn")
    for fmt, nxt in zip(PRECISION_CLASSES, coarser, strict=True):
        if err < math.sqrt(unit_roundoff(fmt) * unit_roundoff(nxt)):
            return fmt
    return "below bfloat16"


#: the fp32 roundings an angle ``theta = p * f`` of a rotary embedding carries before its
#: cos/sin: the inverse frequency's power ``base^(-2i/d)``, its exponent's division, the
#: product with the position, and cos/sin's argument reduction, each at most ``u_32`` of
#: ``|theta|`` (relative). cos and sin have slope at most 1, so their outputs are off by at
#: most that, absolutely (:func:`rope_allowed`)
ROPE_ANGLE_ROUNDINGS = 4


def rope_floor(eps: float) -> float:
    """The error a rotary embedding's cos/sin are allowed in a compute dtype of machine
    epsilon ``eps``, whatever the angle: :data:`PRECISION_STEP` roundings.

    cos/sin lie in [-1, 1], where the spacing of a format is at most ``eps = 2u``, so one
    correct rounding to the compute dtype errs by at most ``u = eps / 2``, absolutely.
    Within ``PRECISION_STEP`` of them, an implementation rounds more often than one cast
    (an extra cast, the attention scaling); beyond, it computes cos/sin in a format three
    bits coarser than the compute dtype (checks/rope.py, ``4 eps``).
    """
    return PRECISION_STEP * (eps / 2)


#: the largest angle (radians) a sweep for cos/sin found by behaviour must reach. Angles
#: computed in the compute dtype itself (unit roundoff ``u``; the port bug) err by at most
#: ``u·|theta|`` per rounding (the frequency, then the product); the check fails past
#: :func:`rope_floor` ``= PRECISION_STEP·u``. The largest error over a bin of positions
#: reaches only a fraction of that bound: integer positions times the fastest frequency,
#: 1, are exact in bf16 below 256, so the error comes from the slower, rounded frequencies
#: (handmade's bf16 RoPE: about ``u·|theta|/4`` at 32 positions). So a quarter of the
#: bound must clear the allowance twice over (the last bin also has to be four times the
#: first): ``u·theta/4 >= 2·2·PRECISION_STEP·u``, ``theta >= 16·PRECISION_STEP`` = 128
#: radians. Coarser angle formats show sooner; fp32 angles never pass the allowance.
ROPE_DETECT_ANGLE = 16 * PRECISION_STEP


def rope_sweep_positions(max_frequency: float) -> int:
    """Positions ``0..n-1`` that bring the fastest rotary frequency (radians per position)
    to :data:`ROPE_DETECT_ANGLE`: the shortest sweep on which angles computed in the
    compute dtype fail ``checks/rope.py``'s judgement: 129 for the usual ``inv_freq[0] = 1``.

    >>> rope_sweep_positions(1.0)
    129
    """
    if not max_frequency > 0:
        raise ValueError(f"a rotary frequency must be positive, got {max_frequency}")
    return math.ceil(ROPE_DETECT_ANGLE / max_frequency) + 1


def rope_allowed(eps: float, max_angle: float) -> float:
    """Error allowed a rotary embedding's cos/sin at angles up to ``max_angle``: the
    larger of :func:`rope_floor` and what fp32 angles cost there
    (:data:`ROPE_ANGLE_ROUNDINGS` ``u_32 (1 + |theta|)``; the 1 keeps one rounding at
    small angles)."""
    return max(rope_floor(eps), ROPE_ANGLE_ROUNDINGS * unit_roundoff("float32") * (1 + max_angle))


def stacked_floor(dtype: str, k: int | None, blocks: int) -> float:
    """The rounding floor of a stack of ``blocks`` residual blocks, each ending in a
    reduction of length ``k``: each block adds its own rounding to the residual stream,
    and roundings of random sign add in quadrature (Higham & Mary 2019): ``sqrt(blocks)``
    times :func:`rounding_floor` (generate-diff's explained logit error)."""
    return rounding_floor(dtype, k) * math.sqrt(max(blocks, 1))


def less_precise(first: str, second: str) -> str:
    """The less precise of two dtype names: fewer significand bits (bf16 before fp16), a
    float one when only one of them is (``int64`` indices beside ``float32``)."""
    f, s = SIGNIFICAND_BITS.get(first), SIGNIFICAND_BITS.get(second)
    if f is None or s is None:
        return second if s is not None else first
    return first if f < s else second


def opcheck_tolerance(dtype: str, n: int) -> float:
    """Op-check's default allowance: :data:`OPCHECK_ROUNDINGS` unit roundoffs of the
    compute ``dtype`` plus the accumulation of ``n`` terms in fp32 (Higham & Mary: it lets
    a softmax or matmul over 4096 terms on an fp32 device pass, and is negligible next to
    fp16/bf16 output rounding)."""
    return OPCHECK_ROUNDINGS * unit_roundoff(dtype) + accumulation_error(n, "float32")


def reduction_length(
    shapes: Iterable[Sequence[int] | None] = (),
    *,
    backward: bool = False,
    widths: Iterable[int] = (),
) -> int | None:
    """The longest dot product a call computes (``K``), None when nothing tells.

    From the shapes of what the call consumed: their last dimension (a Linear's
    in-features); in ``backward`` also the product of their leading dimensions (a
    weight gradient sums over every row). ``widths`` are reduction lengths known
    otherwise (the in-features of the linear layers a replayed module holds).

    >>> reduction_length([(2, 5, 64), (128, 64)])
    64
    >>> reduction_length([(2, 5, 64)], backward=True)
    64
    >>> reduction_length([(4, 100, 64)], backward=True)
    400
    """
    k = max((int(w) for w in widths), default=0)
    for shape in shapes:
        if not shape:
            continue
        last = int(shape[-1])
        k = max(k, last)
        if backward and last:
            k = max(k, math.prod(shape) // last)
    return k or None


# -- one measure of two tensors -------------------------------------------------------------


def relative_l2(diff_norm: float, golden_norm: float) -> float:
    """``||a - g|| / ||g||``: 0 when both are 0, inf when only golden's norm is (never a
    zero error for a difference from an all-zero golden), inf when either is not finite."""
    if not (math.isfinite(diff_norm) and math.isfinite(golden_norm)):
        return math.inf
    if golden_norm > 0:
        return diff_norm / golden_norm
    return 0.0 if diff_norm == 0 else math.inf


def relative_l2_rows(diff_norms: torch.Tensor, golden_norms: torch.Tensor) -> torch.Tensor:
    """:func:`relative_l2` of each row, vectorized: the same 0 for 0/0, inf for a
    difference from an all-zero row, inf where either norm is not finite."""
    import torch

    finite = diff_norms.isfinite() & golden_norms.isfinite()
    zero = golden_norms == 0
    out = diff_norms / torch.where(zero, torch.ones_like(golden_norms), golden_norms)
    out = torch.where(zero, torch.where(diff_norms == 0, 0.0, math.inf), out)
    return torch.where(finite, out, math.inf)


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each of ``values`` (fp64; subnormal spacing below tiny)."""
    import torch

    from precguard.difference import spacing

    return torch.from_numpy(spacing(values.detach().to("cpu", torch.float64).numpy(), dtype))


@dataclass(frozen=True)
class Measurement:
    """Two tensors' difference, measured on the elements both hold finite.

    Where one side holds NaN or ±Inf and the other does not (or not the same one),
    every error is inf: a non-finite mismatch is never a small or zero error. Elements
    non-finite alike on both sides (the same NaN, the same infinity) are left out of the
    errors and counted.
    """

    numel: int
    #: ||a - g|| / ||g|| (:func:`relative_l2`)
    rel_l2: float
    #: max |a - g|
    max_abs: float
    #: mean |a - g|
    mean_abs: float
    #: max |a - g| / max |g| (relative to the tensor's scale: an element near zero does not
    #: blow it up)
    max_rel: float
    #: mean |a - g| / mean |g|
    mean_rel: float
    #: max |a - g| in units of the spacing of ``dtype`` at golden (None: no dtype given)
    ulps: float | None
    #: the least-squares scale ``<a, g> / <g, g>`` of actual on golden (None: golden is 0)
    scale: float | None
    #: NaN and Inf counts of golden and actual
    golden_nan: int
    golden_inf: int
    actual_nan: int
    actual_inf: int
    #: elements non-finite on one side and not alike on the other
    nonfinite_mismatch: int

    @property
    def finite(self) -> bool:
        """True when neither side holds a non-finite element."""
        return not (self.golden_nan or self.golden_inf or self.actual_nan or self.actual_inf)


def _ratio(top: float, scale: float) -> float:
    if scale > 0:
        return top / scale
    return 0.0 if top == 0 else math.inf


def measure(
    actual: torch.Tensor, golden: torch.Tensor, dtype: torch.dtype | None = None
) -> Measurement:
    """Measure ``actual`` against ``golden`` (any shapes of the same element count; fp64).

    ``dtype``: the precision ULPs are counted in (the compute dtype). Raises
    ValueError when the element counts differ. The sums are compare's
    (:func:`precguard.difference.accumulate`, by chunks), so a norm measured here
    equals compare's bit for bit.
    """
    import torch

    from precguard.difference import Plan, accumulate, blocks

    a, g = actual.detach().to("cpu"), golden.detach().to("cpu")
    if a.numel() != g.numel():
        raise ValueError(f"actual has {a.numel()} elements, golden {g.numel()}")
    tiny = torch.finfo(torch.float64).tiny
    s = accumulate(g, a, Plan(floor=tiny, spacing=dtype, **blocks(g.numel())))
    counts = {
        "golden_nan": s.golden_nan,
        "golden_inf": s.golden_inf,
        "actual_nan": s.actual_nan,
        "actual_inf": s.actual_inf,
    }
    mismatch = s.nan_mismatch + s.inf_mismatch
    if mismatch:
        inf = math.inf
        return Measurement(a.numel(), inf, inf, inf, inf, inf, inf if dtype else None, None,
                           nonfinite_mismatch=mismatch, **counts)  # fmt: skip
    n = max(s.n - s.nonfinite, 1)
    return Measurement(
        numel=a.numel(),
        rel_l2=relative_l2(math.sqrt(s.sum_sq), math.sqrt(s.gg)),
        max_abs=s.max_abs,
        mean_abs=s.sum_abs / n,
        max_rel=_ratio(s.max_abs, s.g_absmax),
        mean_rel=_ratio(s.sum_abs / n, s.sum_gabs / n),
        ulps=None if dtype is None else s.max_spacing,
        scale=s.ga / s.gg if s.gg > 0 else None,
        nonfinite_mismatch=0,
        **counts,
    )


def scale_excess(scale: float | None, scale_se: float | None, z: float = BIAS_Z) -> float:
    """How far a least-squares scale lies beyond ``z`` standard errors from 1:
    ``|scale - 1| - z * scale_se`` (-inf when it was not measured). The one scale-bias
    test: a systematic error is an excess above a floor (compare's tolerance, expected
    error, routing and divergence each ask with their own floor).

    >>> scale_excess(1.01, 0.001) > 0
    True
    """
    if scale is None or scale_se is None:
        return -math.inf
    return abs(scale - 1.0) - z * scale_se


# -- one status ladder ----------------------------------------------------------------------

Verdict = Literal["pass", "fail", "nonfinite"]


class Measured(Protocol):
    """What the ladder reads of a measured pair (compare's ``Metrics``)."""

    nan_mismatch: int
    inf_mismatch: int
    level: str  # "exact" metrics also carry ``mismatched`` (read after the level says so)
    error: float


def ladder(m: Measured) -> Verdict | None:
    """The rungs every judge climbs first; None when the error decides.

    1. **non-finite**: NaN/Inf differ between the sides;
    2. **exact** (indices, ids, masks): fail when any element differs; a router's indices
       (``rerouted`` set) pass here, routing.py judges them from the router's scores;
    3. **none** (nothing measurable: a shape mismatch carries error inf): fail when the
       error is above zero, unless re-routed (routing.py judges the follower).

    Then the error against what is allowed (:func:`status`, or a judge's own rule).
    """
    if m.nan_mismatch or m.inf_mismatch:
        return "nonfinite"
    rerouted = getattr(m, "rerouted", None) is not None
    if m.level == "exact":
        return "fail" if getattr(m, "mismatched", 0) and not rerouted else "pass"
    if m.level == "none":
        return "fail" if m.error > 0 and not rerouted else "pass"
    return None


def status(
    m: Measured, allowed: float | None, *, ratio: float | None = None, found: bool = False
) -> Verdict:
    """The verdict on one measured pair: non-finite first (:func:`ladder`); then ``fail``
    when a rule ``found`` the error unexplained by something besides its size (a scale
    of its own, the precision a loss was computed in, a router's choice); then the rest of
    the ladder; then the error against what is ``allowed`` (None: no threshold applies,
    a rule judged the record otherwise).

    ``ratio``: where a judge holds more than ``m.error`` to its limit (compare's
    expected-error judge: the larger of the global and the concentrated error, each over
    what explains it, over the amplification), that figure over its limit: above 1 fails.
    """
    settled = ladder(m)
    if settled == "nonfinite":
        return settled
    if found:
        return "fail"
    if settled is not None:
        return settled
    if ratio is not None:
        return "fail" if ratio > 1.0 else "pass"
    if allowed is None:
        return "pass"
    return "fail" if m.error > allowed else "pass"


# -- fp8 GEMMs (issue 40) ---------------------------------------------------------------------
#
# An fp8 GEMM (Transformer Engine, DeepSeek-V3) divides each operand by a scale, rounds it to
# an 8-bit format with saturation, sums the products in fp32 and multiplies the sum back by
# the scales; its output is stored in bf16. Its error relative to the exact product, derived
# term by term (:func:`fp8_gemm_error`):
#
# 1. **the operands' rounding.** Round-to-nearest gives each operand element a relative error
#    ``delta`` with ``|delta| <= u`` (``u = 2^-p`` for ``p`` significand bits: 2^-4 for e4m3,
#    2^-3 for e5m2); its mean square is at most ``u^2 / 3`` (the absolute error is uniform
#    over half a spacing either side, and the spacing is at most ``2u`` times the value).
#    A product ``a_i b_i`` carries ``delta_a + delta_b``, independent terms, so a dot product
#    ``sum a_i b_i (1 + delta_a,i + delta_b,i)`` is off by a sum of independent errors whose
#    root mean square, relative to the root of ``sum (a_i b_i)^2`` (the dot product's size
#    for terms of random sign), is ``sqrt(2/3) u``: :data:`FP8_OPERAND_ROUNDINGS`.
#    The scale does not change this: dividing by it and multiplying back are exact when it is
#    a power of two and one fp32 rounding (negligible) otherwise.
# 2. **underflow.** An element below the format's smallest normal number ``tiny`` (after
#    scaling) keeps an absolute error up to half the smallest subnormal spacing,
#    ``tiny * u``, times its scale ``amax / fmax``. Relative to the rms of its scaling block
#    that is at most ``u * tiny / fmax * (amax / rms)``, and a block of ``n`` elements has
#    ``amax / rms <= sqrt(n)`` (one element holding the whole norm). Rounding the scale up to a
#    power of two (E8M0 scales) gives up at most one binade of range: twice the term.
#    Per-tensor scaling's block is the whole tensor: :data:`FP8_TENSOR_ELEMENTS` bounds its
#    crest factor at 2^10 (one element a thousand times the rms). A tensor beyond it has
#    most of its elements squeezed toward the underflow range by one outlier, which the
#    ``fp8.underflow`` check reports from the recorded underflow share, not the judge.
# 3. **the output's rounding** to bf16 and the fp32 accumulation of the ``K`` terms: the
#    ordinary :func:`rounding_floor` of the output dtype.
#
# e4m3 per tensor: 0.816 u + 2^-6 / 448 * 2^10 u (0.0022) + 2^-8 + sqrt(K) 2^-24 = 0.0572 at
# K = 4096, under one unit roundoff of e4m3 (0.0625); block scaling (1 x 128 / 128 x 128)
# lowers only the underflow term (to 0.0002). A saturated share, a stale scale or a scale
# shared with the wrong block are none of these terms: the values they clip carry an error
# of their whole excess over the range (at most 100 %), which the judge names when it
# exceeds its amplification (10x) of what the inputs carried or shows as a scale error;
# the ``fp8`` checks read the saturated share itself.

#: the fp8 formats by dtype name: (largest finite value, smallest normal value)
FP8_FORMATS: dict[str, tuple[float, float]] = {
    "float8_e4m3fn": (448.0, 2.0**-6),
    "float8_e4m3fnuz": (240.0, 2.0**-7),
    "float8_e5m2": (57344.0, 2.0**-14),
    "float8_e5m2fnuz": (57344.0, 2.0**-15),
}
#: root mean square of the relative error of a product of two operands each rounded to
#: nearest, in unit roundoffs: ``sqrt(2 * 1/3)`` (term 1 above)
FP8_OPERAND_ROUNDINGS = math.sqrt(2.0 / 3.0)
#: elements of the largest scaling block per-tensor scaling meets (term 2 above)
FP8_TENSOR_ELEMENTS = 2**20
#: the output dtype of an fp8 GEMM (Transformer Engine and DeepSeek-V3 write bf16)
FP8_OUTPUT_DTYPE = "bfloat16"


def fp8_underflow_error(dtype: str, block_elements: int | None = None, pow2: bool = False) -> float:
    """Relative error of a block's underflowed elements (term 2 of the fp8 section).

    >>> fp8_underflow_error("float8_e4m3fn", 128) < 1e-4
    True
    """
    top, tiny = FP8_FORMATS[dtype]
    n = block_elements or FP8_TENSOR_ELEMENTS
    return (2.0 if pow2 else 1.0) * unit_roundoff(dtype) * tiny / top * math.sqrt(n)


def fp8_gemm_error(
    dtype: str,
    k: int | None = None,
    block_elements: int | None = None,
    pow2: bool = False,
) -> float:
    """The relative error a correct fp8 GEMM's bf16 output carries (the fp8 section above).

    ``block_elements``: the elements one scale covers (None: per tensor, up to
    :data:`FP8_TENSOR_ELEMENTS`); ``pow2``: scales rounded to powers of two.

    >>> round(fp8_gemm_error("float8_e4m3fn", 4096), 4)
    0.0572
    """
    return (
        FP8_OPERAND_ROUNDINGS * unit_roundoff(dtype)
        + fp8_underflow_error(dtype, block_elements, pow2)
        + unit_roundoff(FP8_OUTPUT_DTYPE)
        + accumulation_error(k, "float32")
    )


def fp8_saturation_share(dtype: str, numel: int) -> float:
    """The largest saturated share a correctly scaled fp8 tensor shows: one element.

    A scale made from the tensor's own amax (current or block scaling) maps the
    largest element to the format's max (within the division's rounding, which
    :func:`fp8_saturation_bound` does not count), so nothing saturates; a delayed scale
    from an amax history may let the one element that set a new record saturate (it
    clips by less than the growth since the history's maximum). More than one element
    beyond the range is a scale that does not fit the tensor.
    """
    return 1.0 / max(numel, 1)


def fp8_saturation_bound(dtype: torch.dtype) -> float:
    """The smallest ``|x / scale|`` that an fp8 GEMM operand loses to saturation.

    A scale made from the operand's own amax is ``amax / fmax`` in float32, so
    ``amax / scale`` lands on ``fmax`` only up to the division's rounding (one float32
    ulp either side): counting ``|x / scale| > fmax`` as saturated counts every block's
    largest element about half the time (a block-scaled operand then "saturates" one
    element per 1 x 128 tile). What rounding to the format would carry to ``fmax``
    anyway is no loss: the format's spacing at its max is ``2^floor(log2 fmax) eps``
    (32 in e4m3fn, 8192 in e5m2), and round to nearest maps everything below
    ``fmax`` plus half that spacing to ``fmax`` (464 in e4m3fn, 61440 in e5m2; the tie
    goes to ``fmax``, its significand even). Beyond
    it the clamp, not the rounding, decides the value: a saturation.
    """
    import torch

    info = torch.finfo(dtype)
    top = float(info.max)
    spacing = 2.0 ** math.floor(math.log2(top)) * float(info.eps)
    return top + spacing / 2


def fp8_below_max(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 format below its max (416 in e4m3fn).

    The format's spacing at its max is ``2^floor(log2 fmax) eps`` (see
    :func:`fp8_saturation_bound`), so the value below the max is the max less that.
    """
    import torch

    info = torch.finfo(dtype)
    top = float(info.max)
    return top - 2.0 ** math.floor(math.log2(top)) * float(info.eps)


def fp8_stored_saturation_share(numel: int, below_share: float) -> float:
    """The largest share at ±max a correctly scaled *stored* float8 tensor shows.

    A stored tensor no longer tells a clipped element from one that rounding carried to
    the max, so :func:`fp8_saturation_share`'s one element does not hold: with its scale
    from its own amax, the max holds every element within half a spacing below the
    amax (5 % of a uniform weight in e4m3fn). That band is half as wide as the band
    rounding maps to the value below the max (:func:`fp8_below_max`: half a spacing
    either side), and a density that does not rise toward its own maximum puts no more
    elements in each unit of width near the top, so a clean tensor expects at ±max at
    most half the count it holds at the value below. A clip piles everything beyond the
    range onto the max. Allowed: the count at the value below (twice the clean
    expectation) plus :data:`Z_SCORE` standard deviations of a count (sqrt of it, plus
    one for an empty neighbour), and never less than one element.

    >>> fp8_stored_saturation_share(640, 0.0)  # nothing below: a few elements allowed
    0.0046875
    """
    n = max(numel, 1)
    below = below_share * n
    return max(1.0, below + Z_SCORE * math.sqrt(below + 1.0)) / n


def fp8_underflow_share(dtype: str) -> float:
    """The flushed share above which a GEMM operand's scale is too coarse for its values.

    A nonzero element flushes to zero below half the smallest subnormal times its
    scale: ``amax * tiny * u / fmax`` (2^-17.8 of the amax in e4m3, 2^-32 in e5m2).
    A scale made from the operand's own amax flushes only what lies that far below the
    largest element, a share that term 2 of the section above counts as error. When
    more than one unit roundoff of the format (6.25 % in e4m3) of the elements is lost
    to zero, a single rounding to the format (what the operand is allowed) no longer
    bounds the loss: an outlier sets the scale far above the bulk, and the GEMM's
    error is no longer the one :func:`fp8_gemm_error` derives.
    """
    return unit_roundoff(dtype)


#: two correct kernels that add the same terms in another order (a split count chosen by
#: the batch size) differ by at most the sum of their two reduction errors: twice the
#: rounding floor of one (triangle inequality); the batch check calls a difference within
#: it "within rounding" (checks/batch.py)
REORDER_DIFFERENCE = 2.0


__all__ = [
    "AMPLIFICATION",
    "BIAS_MAX_INPUT_ERROR",
    "BIAS_Z",
    "CONCENTRATION",
    "DIFFERENCE_GROWTH",
    "FLOOR_SLACK",
    "FP8_FORMATS",
    "FP8_OPERAND_ROUNDINGS",
    "FP8_OUTPUT_DTYPE",
    "FP8_TENSOR_ELEMENTS",
    "GROWTH_FACTOR",
    "GROWTH_FLOOR_EPS",
    "HELP_SHARE",
    "LOGITS_SLACK",
    "MEAN_TO_SPREAD",
    "MIN_LOCAL_GROWTH",
    "OPCHECK_ROUNDINGS",
    "PRECISION_CLASSES",
    "PRECISION_STEP",
    "PRODUCT_GROWTH",
    "RATIO_MAX_ULPS",
    "REORDER_DIFFERENCE",
    "REPLAY_MARGIN",
    "REROUTED_ROW_ERROR",
    "ROPE_ANGLE_ROUNDINGS",
    "SCORE_PAIR",
    "SIGNIFICAND_BITS",
    "TOLERANCE_EPS",
    "ZERO_DENSITY",
    "Z_SCORE",
    "Measured",
    "Measurement",
    "Verdict",
    "accumulation_error",
    "cosine_distance",
    "expected_error",
    "fp8_gemm_error",
    "fp8_saturation_bound",
    "fp8_saturation_share",
    "fp8_underflow_error",
    "fp8_underflow_share",
    "ladder",
    "less_precise",
    "measure",
    "opcheck_tolerance",
    "precision_class",
    "reduction_length",
    "relative_l2",
    "rope_allowed",
    "rope_floor",
    "rounding_floor",
    "scale_excess",
    "stacked_floor",
    "status",
    "ulp",
    "unit_roundoff",
]


def cosine_distance(actual: torch.Tensor, golden: torch.Tensor) -> float:
    """``1 - cos(a, g)`` of two flat fp64 tensors (0 when both are zero, 1 when one is)."""
    na, ng = float(actual.norm()), float(golden.norm())
    if not na or not ng:
        return 0.0 if na == ng else 1.0
    return max(0.0, 1.0 - float(actual @ golden) / (na * ng))
