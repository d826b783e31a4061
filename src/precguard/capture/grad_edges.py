"""Where a module's own autograd graph hands gradient to its inputs.

The gradient w.r.t. a tensor is the sum over every use of it. A module's own
input gradient, its contribution to that sum, is the gradient its internal
graph sends along the edges that end at the input: the edges from the
nodes the module created to the node that produced the input. Hooks on
those nodes observe it without adding a node to the graph, so nothing the
model computes changes (a wrapping identity node, as in
``register_full_backward_hook``, would re-associate the sum).

Only leaf modules (no submodules: a Linear, a norm) are walked: their graph
is a handful of nodes, so the walk is cheap, and every node it meets after
the inputs were made belongs to the module (a module with submodules could
capture tensors made outside it).
"""

from __future__ import annotations

from typing import Any

import torch

#: a walk that meets more nodes than this gives up (the caller falls back to the
#: gradient of the whole tensor); a leaf module's graph holds a handful
MAX_NODES = 64

Edge = tuple[Any, int]  # (autograd node, index of the edge in its next_functions)


def consumer_edges(
    outputs: list[torch.Tensor], inputs: list[torch.Tensor]
) -> list[list[Edge]] | None:
    """For each of ``inputs``, the edges by which the graph of ``outputs`` reaches it.

    Only the part of the graph made after every input (by the module between
    its inputs and its outputs) is walked. A leaf input (a parameter, a user
    tensor) is reached through its ``AccumulateGrad`` node. Returns None when
    the walk exceeds :data:`MAX_NODES`.
    """
    targets: dict[tuple[Any, int], int] = {}
    leaves: dict[int, int] = {}  # id(leaf tensor) -> its position among the inputs
    threshold = -1
    for k, t in enumerate(inputs):
        node = t.grad_fn
        if node is None:
            leaves[id(t)] = k
            continue
        targets[(node, t.output_nr)] = k
        threshold = max(threshold, node._sequence_nr())
    producers = {node for node, _ in targets}
    edges: list[list[Edge]] = [[] for _ in inputs]
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node in seen or node in producers:
            continue
        seen.add(node)
        if len(seen) > MAX_NODES:
            return None
        if node._sequence_nr() <= threshold:
            continue  # made before the module was called: not the module's
        for i, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            k = targets.get((nxt, nr))
            if k is None and leaves and not nxt.next_functions:
                variable = getattr(nxt, "variable", None)  # AccumulateGrad of a leaf
                k = leaves.get(id(variable)) if variable is not None else None
            if k is not None:
                edges[k].append((node, i))
            elif nxt not in seen:
                stack.append(nxt)
    return edges
