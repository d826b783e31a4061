"""The rules of compare's verdict, in the order they run (compare/rule.py says what a rule is).

Each line is one rule's factory: it makes the rule for a step, or None when the rule has
nothing to do there. Every phase runs the rules in this order; at a record, a rule sees
what the rules before it settled. A new rule is one module (a ``BaseRule`` subclass
of compare/rule.py with a ``for_step`` factory) and one line here (docs/architecture.md,
"Where to add a rule", walks through one).
"""

from __future__ import annotations

from precguard.compare.caches import CacheRule
from precguard.compare.judge import ExpectedRule
from precguard.compare.loss import LossRule
from precguard.compare.optimizer import OptimizerRule
from precguard.compare.routing_rule import RoutingRule
from precguard.compare.rule import RuleFactory
from precguard.compare.tolerance import ProfileRule

RULES: tuple[RuleFactory, ...] = (
    # the expected error: each record against what it consumed explains (the default)
    ExpectedRule.for_step,
    # a fixed profile's tolerance per dtype instead (--profile fixed, strict, msprobe)
    ProfileRule.for_step,
    # an optimizer's update judged through its update rule (adjusts the expected error)
    OptimizerRule.for_step,
    # a router's top-k from its scores, and the records that follow its routing
    RoutingRule.for_step,
    # a loss computed in a lower precision than golden's, found by its dtype
    LossRule.for_step,
    # the KV cache an attention read, named in its why line
    CacheRule.for_step,
)
