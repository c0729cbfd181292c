"""CLI: partition a profile into pipeline stages and print the plan as one JSON object.

Example::

    python -m tf_commopt.partition --profile pipedream/inception_v3 --stages 4 --method ga \\
        --capacities 1,1,0.5,0.5 --bandwidth-gbps 10 --seed 0 --out plan.json --dot plan.dot
    python -m tf_commopt.partition --profile pipedream/vgg16 --stages 4 --schedule 1f1b --microbatches 32
    python -m tf_commopt.partition --profile pipedream/vgg16 --stages 4 --score objective
    python -m tf_commopt.partition --profile pipedream/vgg16 --method given --assignment vgg16.pd.graph.txt

The default (``--score simulated``) returns the plan fastest in the simulator for ``--schedule`` (gpipe)
with ``--microbatches`` (4 x stages for gpipe, 8 x stages for 1f1b) on the given devices and links; the
plan JSON records them (``cluster``, ``schedule``, ``microbatches``) and ``python -m tf_commopt.sim``
uses them. ``--method given`` scores an external assignment: a PipeDream optimizer output (graph.txt
whose node lines carry ``stage_id=N``) given by ``--assignment`` (default: the ``--profile`` file).

``--profile`` takes a PipeDream graph.txt, our JSON, or a bundled name (``pipedream/resnet50``,
``h200/resnet50.bf16``; ``h200/resnet50`` loads all three kinds, chosen per device with ``--kinds``),
or a model to import: a SavedModel directory, a ``.keras``/``.h5`` file or a GraphDef, costed at
``--batch-size`` with the roofline of ``--device`` (printed on stderr and kept in the plan's ``extra``).
When fewer stages than asked are busy the plan's ``extra`` and stderr say why and from which
bandwidth pipelining pays.
Progress of the genetic algorithm goes to stderr, ending with the generation it stopped at (``stopped
early at gen k/N`` when it found nothing better for a while), then a short table per stage (nodes, ms,
memory, bytes sent to the next stage); ``--quiet`` drops both. ``--format text`` prints that table on
stdout instead of the JSON. ``--out`` and ``--dot`` files get the usual permissions (0644 under umask 022).
Bad input exits with code 2 and one line on stderr. Flags may also be spelled with underscores
(``--bandwidth_gbps``); ``--tf-log-level`` sets TensorFlow's C++ logging (default: errors only).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
from typing import List, Optional

from tf_commopt._cli import CliParser, add_tf_log_level, quiet_tensorflow
from tf_commopt.core.devices import parse_capacities
from tf_commopt.core.partition.api import METHODS, SCHEDULES, SCORES
from tf_commopt.core.plan import PartitionPlan
from tf_commopt.core.planner import given_plan, partition, read_stage_ids
from tf_commopt.core.stagecost import hop_bytes
from tf_commopt.errors import InputError, TfCommoptError
from tf_commopt.partition.profile_arg import load_profile_or_model

_PALETTE = [
    "#8dd3c7",
    "#ffffb3",
    "#bebada",
    "#fb8072",
    "#80b1d3",
    "#fdb462",
    "#b3de69",
    "#fccde5",
    "#d9d9d9",
    "#bc80bd",
    "#ccebc5",
    "#ffed6f",
]


class _Parser(CliParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"{self.prog}: {' '.join(message.split())}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="python -m tf_commopt.partition",
        description=__doc__.split("\n")[0],
        usage="python -m tf_commopt.partition --profile PROFILE --stages K [options]",
    )
    ap.add_argument("--profile", required=True, help="graph.txt, our JSON, or a bundled name")
    ap.add_argument("--stages", default=None, help="number of pipeline stages (not with --method given)")
    ap.add_argument("--method", default="ga", help=f"one of {', '.join(METHODS + ('given',))}")
    ap.add_argument(
        "--assignment",
        default=None,
        help="for --method given: graph.txt with stage_id=N per node (default: the --profile file)",
    )
    ap.add_argument("--capacities", default=None, help="relative device speeds, e.g. 1,1,0.5,0.5")
    ap.add_argument(
        "--kinds", default=None, help="device kind per device (or one for all), e.g. bf16,bf16,fp32,fp32"
    )
    ap.add_argument("--bandwidth-gbps", default="10", help="link bandwidth in Gbit/s (default 10)")
    ap.add_argument("--latency-ms", default="0", help="per-message latency in ms (default 0)")
    ap.add_argument("--memory-gb", default=None, help="memory cap per device in GB (10**9 bytes)")
    ap.add_argument("--seed", default="0", help="random seed (default 0)")
    ap.add_argument("--out", default=None, help="also write the plan JSON here")
    ap.add_argument(
        "--dot",
        default=None,
        help="write the graph coloured by stage (Graphviz DOT; PNG too if `dot` exists)",
    )
    ap.add_argument(
        "--score",
        default="simulated",
        help=f"one of {', '.join(SCORES)}: simulated (default: fastest in the simulator), pipeline "
        "(closed-form pipeline time), objective (additive objective only)",
    )
    ap.add_argument(
        "--schedule", default="gpipe", help=f"the schedule that will run: one of {', '.join(SCHEDULES)}"
    )
    ap.add_argument(
        "--microbatches",
        default=None,
        help="micro-batches per mini-batch for gpipe / simulated for 1f1b (default 4*stages, 8*stages)",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress and no per-stage summary on stderr")
    ap.add_argument(
        "--format",
        default="json",
        choices=("json", "text"),
        help="stdout: the plan as one JSON object, or the per-stage summary as text",
    )
    ap.add_argument(
        "--batch-size",
        default=None,
        help="for model files (SavedModel, .keras, .h5, GraphDef): batch size (default 32)",
    )
    ap.add_argument(
        "--device",
        default=None,
        help="for model files: roofline preset (v100, h200, h200-bf16, cpu, cpu-here...)",
    )
    add_tf_log_level(ap)
    return ap


def _number(text: str, flag: str, kind=float, positive: bool = True):
    try:
        v = kind(text)
    except (TypeError, ValueError):
        raise InputError(
            f"{text!r} is not a{'n integer' if kind is int else ' number'}", where=flag
        ) from None
    if kind is float and not (v == v and abs(v) != float("inf")):
        raise InputError(f"{text!r} is not finite", where=flag)
    if positive and v <= 0:
        raise InputError(f"{text!r} must be positive", where=flag)
    if not positive and v < 0:
        raise InputError(f"{text!r} must not be negative", where=flag)
    return v


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"


def summary(plan: PartitionPlan, graph) -> str:
    """A short human table of the plan: per stage its device, nodes, ms, memory and bytes sent on.

    ``ms`` is the stage's time per mini-batch in the plan (compute plus sending), ``out`` the activation
    bytes per mini-batch it sends to the next stage (the gradients come back over the same hop).
    """
    k = plan.num_stages
    nodes = [0] * k
    for st in plan.stage_of_node.values():
        nodes[st] += 1
    out = hop_bytes(graph, plan.stage_of_node, k) + [0.0]
    mem = list(plan.stage_memory_bytes) if plan.stage_memory_bytes else [float("nan")] * k
    sim = plan.extra.get("simulated_ms")
    head = (
        f"{plan.method} plan, {k} stage(s), {plan.schedule or 'no'} schedule"
        + (f" x {plan.microbatches} micro-batches" if plan.microbatches else "")
        + (f": {sim:.1f} ms per mini-batch in the simulator" if isinstance(sim, (int, float)) else "")
        + "; ms = a stage's compute + sending per mini-batch"
    )
    rows = [head, f"{'stage':>5} {'device':>6} {'nodes':>6} {'ms':>10} {'memory':>9} {'out':>9}"]
    for s in range(k):
        m = "-" if math.isnan(mem[s]) else _size(mem[s])
        rows.append(
            f"{s:>5} {plan.device_of_stage[s]:>6} {nodes[s]:>6} {plan.stage_ms[s]:>10.1f} {m:>9} "
            f"{_size(out[s]) if s < k - 1 else '-':>9}"
        )
    return "\n".join(rows)


def _write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` with the usual permissions (0666 & ~umask, e.g. 0644)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_dot(plan: PartitionPlan, graph, path: str) -> Optional[str]:
    """Write ``graph`` as Graphviz DOT, nodes filled with their stage's colour; PNG beside it if possible."""
    lines = [
        f'digraph "{graph.name or "graph"}" {{',
        "  rankdir=TB;",
        "  node [style=filled, shape=box, fontsize=10];",
    ]
    for name in graph.topological_order():
        s = plan.stage_of_node[name]
        n = graph[name]
        label = f"{name}\\n{(n.label or '')[:30]}\\nstage {s}".replace('"', "'")
        lines.append(f'  "{name}" [label="{label}", fillcolor="{_PALETTE[s % len(_PALETTE)]}"];')
    for a, b in graph.edges:
        cross = plan.stage_of_node[a] != plan.stage_of_node[b]
        lines.append(f'  "{a}" -> "{b}"' + (" [color=red, penwidth=2];" if cross else ";"))
    lines.append("}")
    _write_text(path, "\n".join(lines) + "\n")
    exe = shutil.which("dot")
    if exe:
        png = os.path.splitext(path)[0] + ".png"
        r = subprocess.run([exe, "-Tpng", path, "-o", png], capture_output=True, timeout=120)
        if r.returncode == 0:
            return png
    return None


class _Progress:
    """The GA's progress line on stderr: a bar on a terminal, every 5th generation otherwise, and always
    the generation the search ended at (``stopped early at gen k/N`` when it stalled before N)."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.last = None  # (gen, total, best) of the last call
        self.shown = None  # gen of the last printed line

    def _text(self, gen: int, total: int, best: float) -> str:
        done = int(30 * gen / max(total, 1))
        return f"ga [{'#' * done}{'.' * (30 - done)}] gen {gen}/{total} best {best:.3f} ms"

    def __call__(self, gen: int, total: int, best: float) -> None:
        self.last = (gen, total, best)
        if self.tty:
            print("\r" + self._text(gen, total, best), end="", file=sys.stderr, flush=True)
        elif gen % 5 == 0:
            self.shown = gen
            print(self._text(gen, total, best), file=sys.stderr, flush=True)

    def end(self) -> None:
        if self.last is None:
            return
        gen, total, best = self.last
        tail = "" if gen >= total else f" (stopped early at gen {gen}/{total}: no better plan for a while)"
        if self.tty:
            print("\r" + self._text(gen, total, best) + tail, file=sys.stderr, flush=True)
        elif self.shown != gen or tail:
            print(self._text(gen, total, best) + tail, file=sys.stderr, flush=True)


def _kinds(text: Optional[str], n_dev: int, graph) -> Optional[List[Optional[str]]]:
    if text is None:
        return None
    kinds = [k.strip() or None for k in text.split(",")]
    if len(kinds) == 1:
        kinds = kinds * n_dev
    if len(kinds) != n_dev:
        raise InputError(f"{len(kinds)} kinds for {n_dev} devices", where="--kinds")
    bad = [k for k in kinds if k is not None and k not in graph.kinds]
    if bad:
        raise InputError(
            f"kind {bad[0]!r} not in the profile (kinds: {graph.kinds or 'none'})", where="--kinds"
        )
    return kinds


def _check_flags(args) -> None:
    given = args.method == "given"
    if args.method not in METHODS and not given:
        raise InputError(
            f"unknown method {args.method!r}; choose from {', '.join(METHODS + ('given',))}", where="--method"
        )
    if args.assignment is not None and not given:
        raise InputError("only with --method given", where="--assignment")
    if args.stages is None and not given:
        raise InputError("required (the number of pipeline stages)", where="--stages")
    if args.score not in SCORES:
        raise InputError(f"unknown score {args.score!r}; choose from {', '.join(SCORES)}", where="--score")
    if args.schedule not in SCHEDULES:
        raise InputError(
            f"unknown schedule {args.schedule!r}; choose from {', '.join(SCHEDULES)}", where="--schedule"
        )


def _inputs(args) -> dict:
    """Every flag checked and converted (one-line InputError naming the flag), and the profile loaded."""
    _check_flags(args)
    out = {
        "microbatches": _number(args.microbatches, "--microbatches", int)
        if args.microbatches is not None
        else None,
        "bandwidth_gbps": _number(args.bandwidth_gbps, "--bandwidth-gbps"),
        "latency_ms": _number(args.latency_ms, "--latency-ms", positive=False),
        "capacities": parse_capacities(args.capacities, "--capacities")
        if args.capacities is not None
        else None,
        "memory": _number(args.memory_gb, "--memory-gb") * 1e9 if args.memory_gb is not None else None,
        "schedule": args.schedule,
    }
    seed = _number(args.seed, "--seed", int, positive=False)
    batch = None if args.batch_size is None else _number(args.batch_size, "--batch-size", int)
    graph, source = load_profile_or_model(args.profile, device=args.device, batch_size=batch)
    if "summary" in source and not args.quiet:
        print(source["summary"], file=sys.stderr)
    son = None
    if args.method == "given":
        son = read_stage_ids(args.assignment or args.profile)
        stages = len(set(son.values()))
        if args.stages is not None and _number(args.stages, "--stages", int) != stages:
            raise InputError(f"{args.stages} but the assignment has {stages} stages", where="--stages")
    else:
        stages = _number(args.stages, "--stages", int)
    caps = out["capacities"]
    n_dev = len(caps) if caps is not None else stages
    out["kinds"] = _kinds(args.kinds, n_dev, graph)
    if stages > n_dev:
        raise InputError(
            f"{stages} stages need at least as many devices; --capacities gives {n_dev}", where="--stages"
        )
    if stages > len(graph):
        raise InputError(f"{stages} stages for a graph of {len(graph)} nodes", where="--stages")
    return {"graph": graph, "source": source, "stages": stages, "seed": seed, "son": son, "kw": out}


def _make_plan(args, inp: dict) -> PartitionPlan:
    """The plan of ``--method`` (the planner's ``partition``, or ``given_plan`` for ``--method given``)."""
    graph, kw = inp["graph"], inp["kw"]
    if inp["son"] is not None:
        return given_plan(graph, inp["son"], **kw)
    progress = _Progress() if not args.quiet and args.method == "ga" else None
    plan = partition(graph, inp["stages"], method=args.method, seed=inp["seed"], progress=progress,
                     score=args.score, **kw)  # fmt: skip
    if progress is not None:
        progress.end()
    return plan


def _annotate(plan: PartitionPlan, inp: dict) -> None:
    """Idle stages (and from which bandwidth pipelining pays), the cost model, memory warnings."""
    from tf_commopt.tf.stage_use import idle_stage_report

    kw, caps = inp["kw"], inp["kw"]["capacities"]
    idle = idle_stage_report(
        inp["graph"], plan, kw["bandwidth_gbps"], kw["latency_ms"], capacity=max(caps) if caps else 1.0
    )
    plan.extra.update({"cost_model": inp["source"]} if "summary" in inp["source"] else {})
    if idle is not None:
        plan.extra.update(idle)
        print(f"note: {idle['message']}", file=sys.stderr)
    if not plan.extra.get("feasible", True):
        over = [i for i, q in enumerate(plan.extra.get("stage_penalty_ms", [])) if q > 0]
        print(
            f"warning: the plan exceeds the memory cap on stage(s) {over} (see stage_memory_bytes)",
            file=sys.stderr,
        )


def _write_files(args, plan: PartitionPlan, graph) -> None:
    if args.out:
        try:
            plan.save(args.out)
        except OSError as e:
            raise InputError(f"cannot write: {e.strerror}", where="--out") from None
    if args.dot:
        try:
            png = write_dot(plan, graph, args.dot)
        except OSError as e:
            raise InputError(f"cannot write: {e.strerror}", where="--dot") from None
        if png and not args.quiet:
            print(f"wrote {args.dot} and {png}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    quiet_tensorflow(args.tf_log_level)
    try:
        inp = _inputs(args)
        plan = _make_plan(args, inp)
        _annotate(plan, inp)
        _write_files(args, plan, inp["graph"])
    except TfCommoptError as e:
        print(str(e).splitlines()[0] if str(e) else type(e).__name__, file=sys.stderr)
        return 2
    try:
        if args.format == "text":
            print(summary(plan, inp["graph"]), flush=True)
        else:
            if not args.quiet:
                print(summary(plan, inp["graph"]), file=sys.stderr, flush=True)
            print(plan.to_json(), flush=True)
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
