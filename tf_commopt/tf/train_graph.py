"""Training-step graphs: tell forward, gradient and optimizer ops apart, and say whose cost each is.

A ``tf.function`` training step (``GradientTape`` + ``optimizer.apply_gradients``) holds three kinds
of computational ops:

* **gradient ops** — everything under a gradient name scope (``gradient_tape/`` in TF2,
  ``gradients/``, ``gradients_1/``... in TF1), plus ops of a gradient type (``*Grad``,
  ``*GradV2/V3``, ``*BackpropInput``, ``*BackpropFilter``) elsewhere;
* **optimizer ops** — every op that consumes a gradient (directly or through other optimizer
  ops), and the other ops of the top-level scopes those ops live in (``SGD/``, ``Adam/``: the
  iteration counter, learning-rate arithmetic);
* **forward ops** — the rest (the model, the loss, BatchNorm moving-average updates);
* **dead** gradient ops — when there are optimizer ops, gradient ops none of them depends on
  (``tf.gradients`` also differentiates w.r.t. the inputs; TensorFlow prunes that at run time):
  not costed.

Attribution (:func:`attribute`):

* a gradient op ``gradient_tape/<path>/<GradOp>`` belongs to the forward op whose name is the
  longest prefix of ``<path>`` (``gradient_tape/m/conv/Conv2D/Conv2DBackpropFilter`` ->
  ``m/conv/Conv2D``); failing that to the last forward op of the longest matching name scope
  (``gradient_tape/m/gap/truediv`` -> the op of scope ``m/gap``); failing that to the forward op it
  reads; failing that to the last forward op (the loss);
* an optimizer op belongs to the forward op that holds the variable it updates (the variable's
  first forward reader, where its ``param_bytes`` are counted: the variable's stage), found from
  its resource inputs, else through the gradient it consumes (whose forward op reads the
  variable), else through the update it feeds; ops tied to no variable (the iteration counter)
  are reported as unattributed.

Each forward node's ``backward_ms`` is then the sum of the roofline times of the gradient and
optimizer ops attributed to it — no backward factor.

Example:
    >>> kinds = classify(graph.get_operations())            # doctest: +SKIP
    >>> owner = attribute(graph.get_operations(), kinds, forward_kept, var_owner)  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Dict, Optional, Sequence, Set

__all__ = ["classify", "attribute", "summary", "GRAD_SCOPE", "is_gradient_type"]

#: first name component of TensorFlow's gradient scopes
GRAD_SCOPE = re.compile(r"^(gradient_tape|gradients(_\d+)?)$")
_GRAD_TYPE = re.compile(r"(Grad(V\d)?|GradGrad|Backprop(Input|Filter)(V\d)?|GradWithArgmax)$")
#: ops that write a variable
UPDATE_TYPES = re.compile(
    r"^(AssignVariableOp|Assign(Add|Sub)VariableOp|Resource(Sparse)?Apply\w+|ResourceScatter\w+|"
    r"Assign|AssignAdd|AssignSub|Apply\w+|SparseApply\w+)$"
)


def is_gradient_type(op_type: str) -> bool:
    return bool(_GRAD_TYPE.search(op_type))


def _first(name: str) -> str:
    return name.split("/", 1)[0]


def classify(ops: Sequence[Any]) -> Dict[str, str]:
    """``{op name: "forward" | "gradient" | "optimizer" | "dead"}`` for every op of the graph
    (``dead``: a gradient op whose result reaches no optimizer op)."""
    kind: Dict[str, str] = {}
    for op in ops:
        kind[op.name] = (
            "gradient" if GRAD_SCOPE.match(_first(op.name)) or is_gradient_type(op.type) else "forward"
        )
    grads = [op for op in ops if kind[op.name] == "gradient"]
    if not grads:
        return kind
    # downstream of a gradient op: still gradient work when it feeds further gradient ops (the tape's
    # AddN of a tensor used twice lives outside its scope), else the optimizer
    down = _reach(grads, forward=True)
    up = _reach(grads, forward=False)
    opt_roots: Set[str] = set()
    for op in ops:
        if op.name in down and kind[op.name] != "gradient":
            if op.name in up:
                kind[op.name] = "gradient"
            else:
                kind[op.name] = "optimizer"
                opt_roots.add(_first(op.name))
    # zeros_like & co. made by the tape outside its scope: forward-looking ops feeding only gradient ops
    changed = True
    while changed:
        changed = False
        for op in reversed(list(ops)):
            if kind[op.name] != "forward" or op.type in (
                "Placeholder",
                "ReadVariableOp",
                "VarHandleOp",
                "Const",
            ):
                continue
            cons = [c for t in op.outputs for c in t.consumers()]
            zero_like = op.type in ("ZerosLike", "OnesLike", "Fill") and all(
                kind[c.name] != "forward" for c in cons
            )
            if zero_like or cons and all(kind[c.name] == "gradient" for c in cons):
                kind[op.name] = "gradient"
                changed = True
    # gradient ops feeding no optimizer op are dead code (tf.gradients builds dX for inputs too;
    # TensorFlow prunes them at run time): they cost nothing
    opt_ops = [op for op in ops if kind[op.name] == "optimizer"]
    if opt_ops:
        live = _reach(opt_ops, forward=False)
        for op in ops:
            if kind[op.name] == "gradient" and op.name not in live:
                kind[op.name] = "dead"
    # the optimizer's own scope (SGD/, Adam/): counters and schedules that never touch a gradient
    for op in ops:
        r = _first(op.name)
        if kind[op.name] == "forward" and r in opt_roots and "/" in op.name and op.type != "Placeholder":
            if not any(
                kind.get(c.name) == "forward" and _first(c.name) != r
                for t in op.outputs
                for c in t.consumers()
            ):
                kind[op.name] = "optimizer"
    return kind


def _reach(start: Sequence[Any], forward: bool) -> Set[str]:
    """Names of ops reachable from ``start`` (excluded) along data and control edges, down or up."""
    from tf_commopt._compat import op_control_outputs

    seen: Set[str] = set()
    queue = deque(start)
    while queue:
        op = queue.popleft()
        if forward:
            nxt = [c for t in op.outputs for c in t.consumers()] + op_control_outputs(op)
        else:
            nxt = [t.op for t in op.inputs] + list(op.control_inputs)
        for c in nxt:
            if c.name not in seen:
                seen.add(c.name)
                queue.append(c)
    return seen


def _strip_grad_scope(name: str) -> str:
    parts = name.split("/")
    return "/".join(parts[1:]) if parts and GRAD_SCOPE.match(parts[0]) else name


def attribute(
    ops: Sequence[Any],
    kind: Dict[str, str],
    forward: Sequence[str],
    var_owner: Dict[str, str],
    up: Any,
    reads: Optional[Dict[str, str]] = None,
) -> Dict[str, Optional[str]]:
    """``{gradient/optimizer op name: forward op name or None}`` (see the module docstring).

    Args:
        ops: all ops of the graph.
        kind: from :func:`classify`.
        forward: the kept (costed) forward ops, in topological order.
        var_owner: variable handle name -> forward op holding its parameters.
        up: ``up(op)`` -> kept forward op names reached upward from a dropped op through plumbing.
        reads: variable-read op name -> variable handle name (reads replaced by shaped placeholders).
    """
    reads = reads or {}
    fwd_set = set(forward)
    pos = {n: i for i, n in enumerate(forward)}
    in_scope: Dict[str, list] = {}
    for n in forward:
        parts = n.split("/")
        for k in range(1, len(parts)):
            in_scope.setdefault("/".join(parts[:k]), []).append(n)
    by_name = {op.name: op for op in ops}
    owner: Dict[str, Optional[str]] = {}

    def forward_read_by(op: Any) -> Optional[str]:
        best = None
        for t in op.inputs:
            p = t.op
            cands = [p.name] if p.name in fwd_set else sorted(up(p) & fwd_set)
            for c in cands:
                if best is None or pos[c] > pos[best]:
                    best = c
        return best

    def type_of(n: str) -> str:
        return by_name[n].type

    def grad_owner(op: Any) -> Optional[str]:
        path = _strip_grad_scope(op.name).split("/")
        for k in range(len(path), 0, -1):
            cand = "/".join(path[:k])
            if cand in fwd_set:
                return cand
            if cand in by_name and kind.get(cand) == "forward":  # a dropped forward op: its kept producer
                ups = sorted(up(by_name[cand]) & fwd_set, key=pos.get)
                if ups:
                    return ups[-1]
        for k in range(len(path) - 1, 0, -1):
            members = in_scope.get("/".join(path[:k]))
            if members:
                return _pick_in_scope(op, members, forward_read_by, type_of)
        return forward_read_by(op) or (forward[-1] if forward else None)

    for op in ops:
        if kind[op.name] == "gradient":
            owner[op.name] = grad_owner(op)

    def var_of(op: Any) -> Optional[str]:
        for t in op.inputs:
            n = t.op.name
            if n in var_owner:
                return var_owner[n]
            h = reads.get(n, n)
            if h in slot_owner:
                return slot_owner[h]
        return None

    # optimizer slots (momentum, Adam's m and v): the variable whose update reads the slot
    slot_owner: Dict[str, str] = {}
    for op in ops:
        if kind[op.name] == "optimizer" and UPDATE_TYPES.match(op.type) and op.inputs:
            w = var_owner.get(op.inputs[0].op.name)
            if w is None:
                continue
            for t in op.inputs[1:]:
                h = reads.get(t.op.name)
                if h is not None and h not in var_owner:
                    slot_owner.setdefault(h, w)

    def optimizer_owner(op: Any) -> Optional[str]:
        v = var_of(op)
        if v is not None:
            return v
        # upward to the gradient it consumes (IdentityN passes output k from input k only)
        queue_t = deque(op.inputs)
        seen_t: Set[str] = set()
        while queue_t:
            t = queue_t.popleft()
            if t.name in seen_t:
                continue
            seen_t.add(t.name)
            p = t.op
            if kind.get(p.name) == "gradient":
                return owner.get(p.name)
            if p.type == "IdentityN":
                queue_t.append(p.inputs[t.value_index])
            elif kind.get(p.name) == "optimizer" or p.type in ("Identity", "ReadVariableOp"):
                queue_t.extend(p.inputs)
        # downward to the update it feeds
        from tf_commopt._compat import op_control_outputs

        queue, seen = deque([op]), {op.name}
        while queue:
            x = queue.popleft()
            for c in [c for t in x.outputs for c in t.consumers()] + op_control_outputs(x):
                if c.name in seen:
                    continue
                seen.add(c.name)
                v = var_of(c)
                if v is not None and UPDATE_TYPES.match(c.type):
                    return v
                if kind.get(c.name) == "optimizer":
                    queue.append(c)
        return None

    for op in ops:
        if kind[op.name] == "optimizer":
            owner[op.name] = optimizer_owner(op)
    return owner


def _forward_type(grad_type: str) -> str:
    """``FusedBatchNormGradV3`` -> ``FusedBatchNormV3``, ``Relu6Grad`` -> ``Relu6``, ``Conv2DBackpropInput`` -> ``Conv2D``."""
    t = re.sub(r"Backprop(Input|Filter)(V\d)?$", "", grad_type)
    return re.sub(r"Grad(?=(V\d)?$)", "", t)


def _pick_in_scope(op: Any, members: Sequence[str], forward_read_by: Any, type_of: Any) -> str:
    """The forward op of a scope a gradient op differentiates: one of the same type family, else
    one it reads, else the scope's last op that is not a variable update."""
    want = _forward_type(op.type)
    same = [m for m in members if type_of(m) == want]
    if same:
        return same[-1]
    read = forward_read_by(op)
    if read in members:
        return read
    plain = [m for m in members if not UPDATE_TYPES.match(type_of(m))]
    return (plain or list(members))[-1]


def summary(owner: Dict[str, Optional[str]], kind: Dict[str, str]) -> Dict[str, int]:
    """Counts of gradient / optimizer ops and of those left unattributed."""
    out = {"gradient_ops": 0, "optimizer_ops": 0, "unattributed_ops": 0}
    for n, k in kind.items():
        if k in ("gradient", "optimizer"):
            out[f"{k}_ops"] += 1
            if owner.get(n) is None:
                out["unattributed_ops"] += 1
    return out
