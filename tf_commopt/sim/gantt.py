"""Gantt chart of a simulated timeline (matplotlib, Agg backend): one row per device.

Forward, backward and optimizer steps fill the row; transfers (activations, gradients) are drawn as
thinner bars in the lower part of the sender's row, because a device computes and sends concurrently;
collectives span the row.

Example:
    >>> from tf_commopt.sim.gantt import draw_gantt   # doctest: +SKIP
    >>> draw_gantt(result, "timeline.png")            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Optional

from tf_commopt.core.simulate.result import SimResult

__all__ = ["draw_gantt", "COLOURS"]

COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "optimizer": "#8C8C8C",
    "send_act": "#55A868",
    "send_grad": "#C44E52",
    "allreduce": "#8172B3",
    "average": "#937860",
}
_LABELS = {
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "send_act": "send activations",
    "send_grad": "send gradients",
    "allreduce": "all-reduce",
    "average": "average",
}


def draw_gantt(
    result: SimResult, path: str, title: Optional[str] = None, label_microbatches: bool = True
) -> None:
    """Write the timeline of ``result`` as a PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    devices = sorted(result.busy_ms)
    row = {d: i for i, d in enumerate(devices)}
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(devices) + 1.6))
    bars = {}
    for e in result.events:
        if e.device not in row:
            continue
        y = row[e.device]
        if e.kind.startswith("send"):
            y0, h = y + 0.02, 0.26
        else:
            y0, h = y + 0.32, 0.62
        bars.setdefault(e.kind, []).append((e.start, e.end - e.start, y0, h, e.mb))
    few = len(result.events) <= 400
    for kind, items in bars.items():
        for start, width, y0, h, mb in items:
            ax.broken_barh(
                [(start, width)],
                (y0, h),
                facecolors=COLOURS.get(kind, "black"),
                edgecolor="white",
                linewidth=0.3,
            )
            if (
                few
                and label_microbatches
                and mb >= 0
                and kind in ("forward", "backward")
                and width > 0.02 * result.makespan_ms
            ):
                ax.text(
                    start + width / 2,
                    y0 + h / 2,
                    str(mb),
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white",
                )
    ax.set_yticks([row[d] + 0.5 for d in devices])
    ax.set_yticklabels([f"device {d}" for d in devices])
    ax.set_ylim(len(devices), 0)
    ax.set_xlim(0, result.makespan_ms)
    ax.set_xlabel("time (ms)")
    ax.set_title(
        title
        or f"{result.schedule}: iteration {result.iteration_ms:.2f} ms, "
        f"bubble {100 * result.bubble_fraction:.1f}%"
    )
    ax.legend(
        handles=[Patch(color=COLOURS[k], label=_LABELS[k]) for k in COLOURS if k in bars],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=len(bars),
        fontsize=8,
        frameon=False,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
