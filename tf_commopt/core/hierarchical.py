"""Two-level averaging (pure, exact): replicas on one host average every h steps, all every H = m·h.

Replica i lives on host c(i) with n_c replicas (w_c = n_c / R). Local steps are today's (replica i
applies R·g_i − Δ_i; ``gradient`` sums G_i). At an **intra-host sync** (every h steps)::

    x̄_c = Σ_{j∈c} x_j / n_c,   x_i ← x̄_c
    vrl:       Δ_i ← Δ_i + (x̄_c − x_i) / (h·clr)
    gradient:  Ḡ_c = Σ_{j∈c} G_j / n_c,  Δ_i ← (G_i − Ḡ_c)/h + β_c,  S_c ← S_c + Ḡ_c,  G_i ← 0

At a **global sync** (every H steps) the intra-host sync above happens first, then across hosts from
the host models, D_c = x̄_c − x₀ (x₀: the last global model), optionally compressed with error feedback
(:mod:`tf_commopt.core.compress`: Q_c = round(D_c + E_c), E_c ← D_c + E_c − Q_c; else Q_c = D_c)::

    x̄ = x₀ + Σ_c w_c Q_c,   x_i ← x̄
    vrl:       Δ_i ← Δ_i + (Q̄ − Q_c) / (H·clr),   Q̄ = Σ_c w_c Q_c
    gradient:  β_c ← (Ŝ_c − Σ_d w_d Ŝ_d) / H  (Ŝ_c = S_c, or compressed with its residual),
               Δ_i ← (G_i − Ḡ_c)/h + β_c,  S_c ← 0

Σ_{i∈c} of the intra-host updates is 0 and Σ_c n_c of the host-level ones is 0, so Σ_i Δ_i stays 0
at both levels. With one host every sync is today's rule with H = h; with m = 1 (uncompressed) every
sync is today's rule with H = h (:func:`two_level_sync` takes those paths, so they are bit for bit).

Every function uses only ``+ − * /`` on its array arguments (and the rounding it is given).

Example:
    >>> import numpy as np
    >>> hosts = host_groups([0, 0, 1, 1])
    >>> xs = [np.array([v]) for v in (1.0, 3.0, 5.0, 7.0)]
    >>> out = intra_host_sync(xs, hosts, "vrl", 2, clr=1.0, deltas=[np.zeros(1)] * 4)
    >>> [float(x[0]) for x in out.xs], [float(d[0]) for d in out.deltas]
    ([2.0, 2.0, 6.0, 6.0], [0.5, -0.5, 0.5, -0.5])
"""

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

from tf_commopt.core import compress
from tf_commopt.errors import InputError

__all__ = ["host_groups", "LevelState", "intra_host_sync", "global_sync", "two_level_sync"]

Hosts = Tuple[Tuple[int, ...], ...]


def host_groups(host_of: Sequence[object], where: str = "host_of") -> Hosts:
    """The replicas of each host, hosts in order of first appearance: ``host_of[i]`` = replica i's host.

    >>> host_groups([0, 0, 1, 1]), host_groups(["b", "a", "b"])
    (((0, 1), (2, 3)), ((0, 2), (1,)))
    """
    if isinstance(host_of, (str, bytes)) or not hasattr(host_of, "__len__") or len(host_of) == 0:
        raise InputError(f"must be a non-empty list (the host of each replica), got {host_of!r}", where=where)
    groups: dict = {}
    for i, h in enumerate(host_of):
        if h is None or isinstance(h, (bool, float)):
            raise InputError(f"must be a host name or number, got {h!r}", where=f"{where}[{i}]")
        groups.setdefault(h, []).append(i)
    return tuple(tuple(g) for g in groups.values())


class LevelState(NamedTuple):
    """Every replica's state between syncs (lists indexed by replica; host quantities repeated on
    each replica of the host, as each replica holds its own copy)."""

    xs: List[Any]
    deltas: List[Any]
    grad_sums: Optional[List[Any]] = None  # G_i, since the last intra-host sync (gradient)
    host_sums: Optional[List[Any]] = None  # S_c, since the last global sync (gradient)
    host_deltas: Optional[List[Any]] = None  # β_c (gradient)
    residuals: Optional[List[Any]] = None  # E_c (compressed inter-host level)
    grad_residuals: Optional[List[Any]] = None  # residual of S_c (compressed, gradient)


def _mean(parts: Sequence[Any]) -> Any:
    return compress.reduce_sum(parts) / len(parts)


def _check(hosts: Hosts, n: int, rule: str) -> None:
    if sorted(i for g in hosts for i in g) != list(range(n)):
        raise InputError(f"the hosts' replicas must be 0..{n - 1}, got {hosts!r}", where="hosts")
    if rule not in compress.RULES:
        raise InputError(f"unknown rule {rule!r}; expected one of {', '.join(compress.RULES)}", where="rule")


def _fill(state: LevelState, rule: str) -> LevelState:
    zeros = [x * 0.0 for x in state.xs]
    fields = {k: (v if v is not None else list(zeros)) for k, v in state._asdict().items() if k != "xs"}
    if rule == "gradient" and state.grad_sums is None:
        raise InputError("the gradient rule needs one gradient sum per replica", where="grad_sums")
    return LevelState(list(state.xs), **{k: list(v) for k, v in fields.items()})


def intra_host_sync(
    xs: Sequence[Any],
    hosts: Hosts,
    rule: str,
    h: int,
    clr: float = 1.0,
    deltas: Optional[Sequence[Any]] = None,
    grad_sums: Optional[Sequence[Any]] = None,
    host_sums: Optional[Sequence[Any]] = None,
    host_deltas: Optional[Sequence[Any]] = None,
) -> LevelState:
    """Average within each host (module docstring); returns the new :class:`LevelState` (no residuals)."""
    state = _fill(LevelState(list(xs), deltas, grad_sums, host_sums, host_deltas), rule)
    _check(hosts, len(xs), rule)
    new_x, deltas, gsum, ssum = (
        list(state.xs),
        list(state.deltas),
        list(state.grad_sums),
        list(state.host_sums),
    )
    for group in hosts:
        x_c = _mean([state.xs[i] for i in group])
        g_c = _mean([state.grad_sums[i] for i in group]) if rule == "gradient" else None
        for i in group:
            new_x[i] = x_c
            if rule == "vrl":
                deltas[i] = deltas[i] + (x_c - state.xs[i]) / (h * clr)
            elif rule == "gradient":
                deltas[i] = (state.grad_sums[i] - g_c) / h + state.host_deltas[i]
                ssum[i] = ssum[i] + g_c
                gsum[i] = gsum[i] * 0.0
    return state._replace(xs=new_x, deltas=deltas, grad_sums=gsum, host_sums=ssum)


def _host_level(
    x0, after: LevelState, hosts: Hosts, rule, big_h, clr, codec, round_fn, reduce
) -> compress.SyncResult:
    """The inter-host step as a compressed sync among host representatives weighted by n_c."""
    reps = [g[0] for g in hosts]
    r = len(after.xs)
    # weight host c by n_c: a sync over R "workers" where each host appears n_c times is Σ_c w_c (·)
    members = [c for c, g in enumerate(hosts) for _ in g]
    pick = [reps[c] for c in members]
    out = compress.compressed_sync(
        x0,
        [after.xs[p] for p in pick],
        rule,
        big_h,
        clr,
        deltas=[x0 * 0.0 for _ in range(r)],
        residuals=[after.residuals[p] for p in pick],
        grad_sums=[after.host_sums[p] for p in pick] if rule == "gradient" else None,
        grad_residuals=[after.grad_residuals[p] for p in pick],
        codec=codec,
        round_fn=round_fn,
        reduce=reduce,
    )
    return out


def global_sync(
    x0: Any,
    state: LevelState,
    hosts: Hosts,
    rule: str,
    h: int,
    m: int,
    clr: float = 1.0,
    codec: Optional[str] = None,
    round_fn: Optional[Callable[[Any], Any]] = None,
    reduce: str = "exact",
) -> LevelState:
    """The global sync at H = m·h: the intra-host sync, then the host level (module docstring).

    With ``codec=None`` the host level is exact: x̄ = Σ_i x_i / R after the intra-host averages.
    """
    after = intra_host_sync(
        state.xs, hosts, rule, h, clr, state.deltas, state.grad_sums, state.host_sums, state.host_deltas
    )
    after = after._replace(residuals=state.residuals, grad_residuals=state.grad_residuals)
    after = _fill(after, rule)
    big_h = m * h
    out = _host_level(x0, after, hosts, rule, big_h, clr, codec, round_fn, reduce)
    order = [i for g in hosts for i in g]  # replica of each position in the expanded sync
    r = len(state.xs)
    xs, deltas = [out.x] * r, list(after.deltas)
    residuals, g_res = list(after.residuals), list(after.grad_residuals)
    host_sums, host_deltas = list(after.host_sums), list(after.host_deltas)
    for pos, i in enumerate(order):
        if rule == "vrl":
            deltas[i] = after.deltas[i] + out.deltas[pos]
        elif rule == "gradient":
            host_deltas[i] = out.deltas[pos]
            deltas[i] = after.deltas[i] - after.host_deltas[i] + out.deltas[pos]
            host_sums[i] = host_sums[i] * 0.0
        residuals[i] = out.residuals[pos]
        if out.grad_residuals is not None:
            g_res[i] = out.grad_residuals[pos]
    return LevelState(list(xs), deltas, after.grad_sums, host_sums, host_deltas, residuals, g_res)


def two_level_sync(
    x0: Any,
    state: LevelState,
    hosts: Hosts,
    rule: str,
    h: int,
    m: int,
    is_global: bool,
    clr: float = 1.0,
    codec: Optional[str] = None,
    round_fn: Optional[Callable[[Any], Any]] = None,
    reduce: str = "exact",
) -> LevelState:
    """The sync due after h local steps: global when ``is_global`` (every m-th), else intra-host.

    One host, or m = 1 without compression, is today's rule (one all-reduce over every replica with
    H = h), computed as today's rule computes it; one host has no inter-host level, so nothing is
    compressed there.
    """
    _check(hosts, len(state.xs), rule)
    for name, v in (("h", h), ("m", m)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"must be an integer >= 1, got {v!r}", where=name)
    if len(hosts) == 1 or (m == 1 and codec is None):
        full = _fill(state, rule)
        out = compress.compressed_sync(x0, full.xs, rule, h, clr, full.deltas, grad_sums=full.grad_sums)
        zeros = [g * 0.0 for g in full.grad_sums]
        return full._replace(xs=[out.x] * len(full.xs), deltas=out.deltas, grad_sums=zeros)
    if is_global:
        return global_sync(x0, state, hosts, rule, h, m, clr, codec, round_fn, reduce)
    after = intra_host_sync(
        state.xs, hosts, rule, h, clr, state.deltas, state.grad_sums, state.host_sums, state.host_deltas
    )
    return after._replace(residuals=state.residuals, grad_residuals=state.grad_residuals)
