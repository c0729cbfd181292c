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
from typing import Any, Dict, Optional, Sequence, Set, Tuple

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


class _Attribution:
    """Owners of the gradient and optimizer ops of one graph (the rules of the module docstring)."""

    def __init__(
        self,
        ops: Sequence[Any],
        kind: Dict[str, str],
        forward: Sequence[str],
        var_owner: Dict[str, str],
        up: Any,
        reads: Dict[str, str],
    ):
        self.ops, self.kind, self.forward = ops, kind, list(forward)
        self.var_owner, self.up, self.reads = var_owner, up, reads
        self.fwd_set = set(forward)
        self.pos = {n: i for i, n in enumerate(forward)}
        self.in_scope: Dict[str, list] = {}
        for n in forward:
            parts = n.split("/")
            for k in range(1, len(parts)):
                self.in_scope.setdefault("/".join(parts[:k]), []).append(n)
        self.by_name = {op.name: op for op in ops}
        self.owner: Dict[str, Optional[str]] = {}
        self.slot_owner = self._slot_owners()

    # ---------------------------------------------------------------------------------- gradient ops
    def forward_read_by(self, op: Any) -> Optional[str]:
        """The latest kept forward op ``op`` reads (directly or through dropped plumbing)."""
        best = None
        for t in op.inputs:
            p = t.op
            cands = [p.name] if p.name in self.fwd_set else sorted(self.up(p) & self.fwd_set)
            for c in cands:
                if best is None or self.pos[c] > self.pos[best]:
                    best = c
        return best

    def type_of(self, name: str) -> str:
        return self.by_name[name].type

    def grad_owner(self, op: Any) -> Optional[str]:
        """Longest forward-op prefix of the gradient op's path, else its scope's op, else what it reads."""
        path = _strip_grad_scope(op.name).split("/")
        for k in range(len(path), 0, -1):
            cand = "/".join(path[:k])
            if cand in self.fwd_set:
                return cand
            if cand in self.by_name and self.kind.get(cand) == "forward":  # dropped: its kept producer
                ups = sorted(self.up(self.by_name[cand]) & self.fwd_set, key=self.pos.get)
                if ups:
                    return ups[-1]
        for k in range(len(path) - 1, 0, -1):
            members = self.in_scope.get("/".join(path[:k]))
            if members:
                return _pick_in_scope(op, members, self.forward_read_by, self.type_of)
        return self.forward_read_by(op) or (self.forward[-1] if self.forward else None)

    # --------------------------------------------------------------------------------- optimizer ops
    def _slot_owners(self) -> Dict[str, str]:
        """Optimizer slots (momentum, Adam's m and v) -> the variable whose update reads the slot."""
        slot_owner: Dict[str, str] = {}
        for op in self.ops:
            if self.kind[op.name] == "optimizer" and UPDATE_TYPES.match(op.type) and op.inputs:
                w = self.var_owner.get(op.inputs[0].op.name)
                if w is None:
                    continue
                for t in op.inputs[1:]:
                    h = self.reads.get(t.op.name)
                    if h is not None and h not in self.var_owner:
                        slot_owner.setdefault(h, w)
        return slot_owner

    def var_of(self, op: Any) -> Optional[str]:
        """The owner of the variable (or slot) ``op`` takes as an input, if any."""
        for t in op.inputs:
            n = t.op.name
            if n in self.var_owner:
                return self.var_owner[n]
            h = self.reads.get(n, n)
            if h in self.slot_owner:
                return self.slot_owner[h]
        return None

    def _via_gradient(self, op: Any) -> Tuple[bool, Optional[str]]:
        """Upward to the gradient ``op`` consumes (IdentityN passes output k from input k only):
        (whether one was found, its owner)."""
        queue_t = deque(op.inputs)
        seen_t: Set[str] = set()
        while queue_t:
            t = queue_t.popleft()
            if t.name in seen_t:
                continue
            seen_t.add(t.name)
            p = t.op
            if self.kind.get(p.name) == "gradient":
                return True, self.owner.get(p.name)
            if p.type == "IdentityN":
                queue_t.append(p.inputs[t.value_index])
            elif self.kind.get(p.name) == "optimizer" or p.type in ("Identity", "ReadVariableOp"):
                queue_t.extend(p.inputs)
        return False, None

    def _via_update(self, op: Any) -> Optional[str]:
        """Downward to the variable update ``op`` feeds."""
        from tf_commopt._compat import op_control_outputs

        queue, seen = deque([op]), {op.name}
        while queue:
            x = queue.popleft()
            for c in [c for t in x.outputs for c in t.consumers()] + op_control_outputs(x):
                if c.name in seen:
                    continue
                seen.add(c.name)
                v = self.var_of(c)
                if v is not None and UPDATE_TYPES.match(c.type):
                    return v
                if self.kind.get(c.name) == "optimizer":
                    queue.append(c)
        return None

    def optimizer_owner(self, op: Any) -> Optional[str]:
        """The forward op holding the variable ``op`` updates (see the module docstring)."""
        v = self.var_of(op)
        if v is not None:
            return v
        found, owner = self._via_gradient(op)
        return owner if found else self._via_update(op)

    def run(self) -> Dict[str, Optional[str]]:
        for op in self.ops:
            if self.kind[op.name] == "gradient":
                self.owner[op.name] = self.grad_owner(op)
        for op in self.ops:
            if self.kind[op.name] == "optimizer":
                self.owner[op.name] = self.optimizer_owner(op)
        return self.owner


def attribute(
    ops: Sequence[Any],
    kind: Dict[str, str],
    forward: Sequence[str],
    var_owner: Dict[str, str],
    up: Any,
    reads: Optional[Dict[str, str]] = None,
) -> Dict[str, Optional[str]]:
    """``{gradient/optimizer op name: forward op name or None}`` (see the module docstring).

    Example:
        >>> owner = attribute(ops, classify(ops), forward_kept, var_owner, up)   # doctest: +SKIP

    Args:
        ops: all ops of the graph.
        kind: from :func:`classify`.
        forward: the kept (costed) forward ops, in topological order.
        var_owner: variable handle name -> forward op holding its parameters.
        up: ``up(op)`` -> kept forward op names reached upward from a dropped op through plumbing.
        reads: variable-read op name -> variable handle name (reads replaced by shaped placeholders).
    """
    return _Attribution(ops, kind, forward, var_owner, up, reads or {}).run()


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
