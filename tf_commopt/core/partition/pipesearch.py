"""Local search on the pipeline time: the memetic descent the partitioner and its GA use.

It minimises :class:`pipemodel.PipelineModel` (the GPipe iteration, exact for the simulator, or the
1F1B period), tie-broken by the bytes crossing stage boundaries. Plans are ``(stage, devs)`` pairs:
stage of every node (nodes in topological order) and device of every stage.

Example:
    >>> from tf_commopt.core.partition.synthetic import branchy_graph
    >>> from tf_commopt.core.devices import Cluster
    >>> from tf_commopt.core.partition.objective import Problem
    >>> from tf_commopt.core.partition.pipemodel import PipelineModel
    >>> from tf_commopt.core.partition.baselines import balanced
    >>> from tf_commopt.core.partition.pipesearch import pipe_local_search
    >>> p = Problem(branchy_graph(120, seed=3), Cluster.homogeneous(4, bandwidth_gbps=10), 4)
    >>> model = PipelineModel(p, "gpipe", 16)
    >>> start = (balanced(p, [0, 1, 2, 3]), [0, 1, 2, 3])
    >>> stage, devs = pipe_local_search(p, model, *start)
    >>> model.time(stage, devs) <= model.time(*start)
    True

**The descent** (:func:`pipe_improve`): best improvement. A move sends a boundary node (all its
successors in later stages, or all its predecessors in earlier ones) to the adjacent stage, over
*every* boundary (the pipeline time has sums, not only a maximum, so any hop matters); when no single
move helps, on heterogeneous clusters every swap of two stages' devices, then the closure of a sampled
node (a whole branch: it and its in-stage descendants going up, ancestors going down) out of the
slowest stage or across the slowest hop. A move is evaluated in O(edges touching it + K) from
incrementally kept per-stage forward/backward compute and hop bytes (:class:`local_search.State`).
The GA (:mod:`evolve`) runs short descents focused on the stages next to the slowest stage and hop.
"""

from __future__ import annotations

import random
from typing import List, Optional, Sequence, Tuple

from tf_commopt.core.partition.local_search import State
from tf_commopt.core.partition.objective import Problem
from tf_commopt.core.partition.pipemodel import PipelineModel

__all__ = ["pipe_improve", "pipe_local_search", "PipeState"]

Plan = Tuple[List[int], List[int]]


class PipeState(State):
    """A :class:`State` that also answers the pipeline model's time for the current plan and for moves."""

    def __init__(self, p: Problem, model: PipelineModel, stage: Sequence[int], devs: Sequence[int]):
        super().__init__(p, stage, devs)
        self.model = model

    def _lists(self, devs: Sequence[int]):
        p = self.p
        ks = [p.kind_of_dev[d] for d in devs]
        fwd = [self.ckf[k][s] for s, k in enumerate(ks)]
        comp = [self.ck[k][s] for s, k in enumerate(ks)]
        return fwd, comp

    def _penalty(self, devs: Sequence[int], pars: Sequence[float], acts: Sequence[float]) -> float:
        p = self.p
        if all(p.mem_cap[d] is None for d in devs):
            return 0.0
        K = p.K
        return max(
            p.penalty_ms(p.weight_versions[s] * pars[s] + (K - s) * acts[s], devs[s]) for s in range(K)
        )

    def value(self, devs: Optional[Sequence[int]] = None) -> float:
        devs = self.devs if devs is None else devs
        fwd, comp = self._lists(devs)
        return self.model.from_parts(fwd, comp, self.hop, devs, self._penalty(devs, self.pars, self.acts))

    def key(self, devs: Optional[Sequence[int]] = None) -> Tuple[float, float]:  # type: ignore[override]
        return (float(f"{self.value(devs):.12g}"), float(f"{sum(self.hop[:-1]):.12g}"))

    def try_key(self, M: Sequence[int], s: int, t: int) -> Tuple[float, float]:
        """The key ``(time, bytes)`` if ``M`` moved from ``s`` to ``t`` (nothing changes)."""
        p = self.p
        dck, dact, dpar, hop_h = self._delta(M, s, t)
        dckf = self.delta_fwd(M)
        fwd, comp = self._lists(self.devs)
        ks, kt = p.kind_of_dev[self.devs[s]], p.kind_of_dev[self.devs[t]]
        fwd[s] -= dckf[ks]
        fwd[t] += dckf[kt]
        comp[s] -= dck[ks]
        comp[t] += dck[kt]
        hop = list(self.hop)
        h = min(s, t)
        hop[h] = max(hop_h, 0.0)
        pen = 0.0
        if any(p.mem_cap[d] is not None for d in self.devs):
            pars, acts = list(self.pars), list(self.acts)
            pars[s] -= dpar
            pars[t] += dpar
            acts[s] -= dact
            acts[t] += dact
            pen = self._penalty(self.devs, pars, acts)
        v = self.model.from_parts(fwd, comp, hop, self.devs, pen)
        return (float(f"{v:.12g}"), float(f"{sum(hop[:-1]):.12g}"))


def _critical_moves(st: PipeState) -> List[Tuple[int, int]]:
    """(from, to) stage pairs worth a branch move: out of the slowest stage, and across the slowest hop."""
    p, K = st.p, st.p.K
    comp = [st.ck[p.kind_of_dev[d]][s] / p.cap[d] for s, d in enumerate(st.devs)]
    sc = max(range(K), key=lambda s: comp[s])
    pairs = [(sc, sc - 1), (sc, sc + 1)]
    if K > 1:
        ht = [st.hop[h] / p.bpm[st.devs[h]][st.devs[h + 1]] for h in range(K - 1)]
        hc = max(range(K - 1), key=lambda h: ht[h])
        if ht[hc] > 0:
            pairs += [(hc, hc + 1), (hc + 1, hc)]
    return [(a, b) for a, b in dict.fromkeys(pairs) if 0 <= a < K and 0 <= b < K]


def pipe_improve(
    st: PipeState,
    max_steps: int = 10_000,
    rng: Optional[random.Random] = None,
    closure_samples: int = 16,
    closure_limit: int = 64,
    focus: bool = False,
) -> int:
    """Best-improvement descent of ``st`` on the pipeline model, in place; returns moves applied.

    ``focus``: single moves only out of the stages next to the slowest stage and the slowest hop (the
    GA's short memetic steps), instead of across every boundary.
    """
    p, K = st.p, st.p.K
    rng = rng or random.Random(0)
    hetero = len(set((p.cap[d], p.kind_of_dev[d]) for d in st.devs)) > 1
    steps = 0
    while steps < max_steps:
        best_key = st.key()
        best = None
        sources = range(K)
        if focus:
            sources = sorted(
                {x for pair in _critical_moves(st) for y in pair for x in (y - 1, y, y + 1) if 0 <= x < K}
            )
        for s in sources:
            if len(st.members[s]) <= 1:
                continue
            for t, front in ((s + 1, st.up_front[s]), (s - 1, st.down_front[s])):
                if not 0 <= t < K:
                    continue
                for v in sorted(front):
                    k = st.try_key([v], s, t)
                    if k < best_key:
                        best, best_key = ("move", [v], s, t), k
        if best is None and hetero:
            for a in range(K):
                for c in range(a + 1, K):
                    devs = list(st.devs)
                    devs[a], devs[c] = devs[c], devs[a]
                    k = st.key(devs)
                    if k < best_key:
                        best, best_key = ("swap", a, c), k
        if best is None:
            for s, t in _critical_moves(st):
                if not 0 <= t < K or len(st.members[s]) <= 1:
                    continue
                pool = sorted(st.members[s])
                if len(pool) > closure_samples:
                    pool = rng.sample(pool, closure_samples)
                for v in pool:
                    M = st.closure(v, t, closure_limit)
                    if M is None or len(M) == 1:
                        continue
                    k = st.try_key(M, s, t)
                    if k < best_key:
                        best, best_key = ("move", M, s, t), k
        if best is None:
            break
        if best[0] == "swap":
            st.swap_devices(best[1], best[2])
        else:
            st.apply_move(best[1], best[2], best[3])
        steps += 1
    return steps


def pipe_local_search(
    p: Problem,
    model: PipelineModel,
    stage: Sequence[int],
    devs: Sequence[int],
    max_steps: int = 10_000,
    seed: int = 0,
) -> Plan:
    """Descend from a convex plan on the pipeline model; returns ``(stage, devs)``."""
    st = PipeState(p, model, stage, devs)
    pipe_improve(st, max_steps=max_steps, rng=random.Random(seed))
    return list(st.stage), list(st.devs)
