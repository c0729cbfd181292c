"""The ``python -m tf_commopt.sim`` command: simulate a pipeline schedule for a profile and a partition plan.

Prints one JSON object (``schedule``, ``iteration_ms``, ``throughput`` in mini-batches per second,
``bubble_fraction``, ``bytes_injected`` per mini-batch, ``makespan_ms``, ``busy_ms`` per device, ...);
``--png`` also draws a Gantt chart of the timeline. Bad input: one line on stderr, exit code 2.

Example:
    python -m tf_commopt.partition --profile pipedream/vgg16 --stages 4 --method ga --out plan.json
    python -m tf_commopt.sim --profile pipedream/vgg16 --plan plan.json --schedule gpipe \\
        --microbatches 8 --bandwidth-gbps 10 --png timeline.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import List, Optional

from tf_commopt._cli import CliParser, add_tf_log_level, quiet_tensorflow
from tf_commopt.errors import InputError, TfCommoptError

__all__ = ["build_parser", "main"]


class _Parser(CliParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise InputError(message, where="python -m tf_commopt.sim")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return v


def _non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m tf_commopt.sim", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--profile",
        required=True,
        help="PipeDream graph.txt or tf_commopt JSON, or a bundled name (pipedream/vgg16, h200/resnet50.fp32)",
    )
    p.add_argument(
        "--plan", required=True, help="PartitionPlan JSON (python -m tf_commopt.partition ... --out)"
    )
    p.add_argument(
        "--schedule",
        default=None,
        choices=["gpipe", "1f1b", "1f1b_flush"],
        help="default: the plan's schedule",
    )
    p.add_argument(
        "--microbatches",
        default=None,
        type=_positive_int,
        help="GPipe: micro-batches per mini-batch; 1f1b: micro-batches streamed through (default: the plan's)",
    )
    p.add_argument(
        "--split",
        type=_positive_int,
        default=None,
        help="micro-batches per profiled mini-batch (default: M for gpipe, 1 for 1f1b)",
    )
    p.add_argument("--bandwidth-gbps", type=_non_negative, default=None, help="default: the plan's, else 10")
    p.add_argument("--latency-ms", type=_non_negative, default=None, help="default: the plan's, else 0")
    p.add_argument(
        "--capacities",
        default=None,
        help="comma-separated relative device speeds, e.g. 1,1,0.5,0.5 (default: the plan's, else all 1)",
    )
    p.add_argument(
        "--kinds",
        default=None,
        help="device kind per device (or one for all), naming per-kind costs of the profile (default: the plan's)",
    )
    p.add_argument("--optimizer-ms", type=_non_negative, default=0.0, help="cost of each optimizer step")
    p.add_argument(
        "--micro-profile", default=None, help="profile measured at the micro-batch size (not divided)"
    )
    p.add_argument("--events", action="store_true", help="include the full timeline in the JSON")
    p.add_argument("--png", default=None, help="write a Gantt chart of the timeline here")
    p.add_argument(
        "--batch-size", type=_positive_int, default=None, help="for model files: batch size (default 32)"
    )
    p.add_argument(
        "--device", default=None, help="for model files: roofline preset (v100, h200, h200-bf16, cpu-here...)"
    )
    add_tf_log_level(p)
    return p


def _from_plan(flag_value, plan_value, flag: str, path: str):
    """The flag's value, else the plan's; an error if both are given and differ, or neither is."""
    if flag_value is None:
        if plan_value is None:
            raise InputError(f"required: the plan {path} records no {flag[2:]}", where=flag)
        return plan_value
    if plan_value is not None and flag_value != plan_value:
        raise InputError(
            f"{flag_value} contradicts the plan's {plan_value} ({path}); omit {flag} or "
            f"re-partition for {flag_value}",
            where=flag,
        )
    return flag_value


def _device_flags(a, graph):
    """``--capacities`` and ``--kinds`` parsed and checked against the profile (None where not given)."""
    from tf_commopt.core.devices import parse_capacities

    caps = parse_capacities(a.capacities) if a.capacities else None
    kinds = None
    if a.kinds:
        kinds = [k.strip() or None for k in a.kinds.split(",")]
        for k in kinds:
            if k is not None and k not in graph.kinds:
                raise InputError(
                    f"unknown kind {k!r}; the profile has {graph.kinds or 'none'}", where="--kinds"
                )
    return caps, kinds


def _cluster(a, plan, caps, kinds):
    """The cluster to simulate: the plan's record, flags checked against it; else built from the flags."""
    from tf_commopt.core.devices import Cluster

    rec = plan.cluster
    if rec is not None:
        if caps is not None and [float(c) for c in caps] != rec["capacities"]:
            raise InputError(
                f"{a.capacities} contradicts the plan's {','.join(f'{c:g}' for c in rec['capacities'])} "
                f"({a.plan}); omit --capacities or re-partition",
                where="--capacities",
            )
        if kinds is not None:
            want = kinds * len(rec["kinds"]) if len(kinds) == 1 else kinds
            if want != rec["kinds"]:
                raise InputError(
                    f"{a.kinds} contradicts the plan's {rec['kinds']} ({a.plan}); omit --kinds or "
                    "re-partition",
                    where="--kinds",
                )
        a.bandwidth_gbps = _from_plan(a.bandwidth_gbps, rec["bandwidth_gbps"], "--bandwidth-gbps", a.plan)
        a.latency_ms = _from_plan(a.latency_ms, rec["latency_ms"], "--latency-ms", a.plan)
        caps, kinds = rec["capacities"], rec["kinds"]
    else:
        a.bandwidth_gbps = 10.0 if a.bandwidth_gbps is None else a.bandwidth_gbps
        a.latency_ms = 0.0 if a.latency_ms is None else a.latency_ms
        caps = caps if caps is not None else [1.0] * (max(plan.device_of_stage) + 1)
        if kinds is not None:
            if len(kinds) == 1:
                kinds = kinds * len(caps)
            if len(kinds) != len(caps):
                raise InputError(f"{len(kinds)} kinds for {len(caps)} devices", where="--kinds")
    mem = rec.get("memory_bytes") if rec is not None else None
    return Cluster.from_capacities(caps, a.bandwidth_gbps, a.latency_ms, kinds=kinds, memory_bytes=mem)


def _run(argv: Optional[List[str]]) -> dict:
    from tf_commopt.core.devices import Cluster
    from tf_commopt.core.plan import PartitionPlan
    from tf_commopt.core.simulate import simulate_pipeline
    from tf_commopt.core.simulate.pipeline import stage_costs
    from tf_commopt.partition.profile_arg import load_profile_arg, load_profile_or_model

    a = build_parser().parse_args(argv)
    quiet_tensorflow(a.tf_log_level)
    if a.bandwidth_gbps is not None and a.bandwidth_gbps <= 0:
        raise InputError("must be > 0", where="--bandwidth-gbps")
    graph, source = load_profile_or_model(a.profile, batch_size=a.batch_size, device=a.device)
    plan = PartitionPlan.load(a.plan)
    caps, kinds = _device_flags(a, graph)  # flag syntax first, then the plan's fit to the graph,
    stage_costs(
        graph,
        dataclasses.replace(plan, device_of_stage=list(range(plan.num_stages))),
        Cluster.homogeneous(plan.num_stages),
    )  # then contradictions between flags and plan
    a.schedule = _from_plan(a.schedule, plan.schedule, "--schedule", a.plan)
    a.microbatches = _from_plan(a.microbatches, plan.microbatches, "--microbatches", a.plan)
    cluster = _cluster(a, plan, caps, kinds)
    micro = load_profile_arg(a.micro_profile, "--micro-profile") if a.micro_profile else None
    res = simulate_pipeline(
        graph,
        plan,
        a.schedule,
        a.microbatches,
        cluster=cluster,
        split=a.split,
        micro_profile=micro,
        optimizer_ms=a.optimizer_ms,
    )
    out = res.to_dict(events=a.events)
    out.update(profile=a.profile, plan=a.plan, bandwidth_gbps=a.bandwidth_gbps, latency_ms=a.latency_ms)
    if "summary" in source:
        out["cost_model"] = source
    if a.png:
        from tf_commopt.sim.gantt import draw_gantt

        try:
            draw_gantt(
                res,
                a.png,
                title=f"{graph.name or a.profile} / {plan.method}: {a.schedule}, "
                f"M={a.microbatches}, {a.bandwidth_gbps:g} Gbit/s",
            )
        except OSError as e:
            raise InputError(f"cannot write PNG: {e.strerror or e}", where=a.png) from None
        out["png"] = a.png
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """Run the CLI; return the exit code (0, or 2 on bad input)."""
    try:
        out = _run(argv)
    except TfCommoptError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0
