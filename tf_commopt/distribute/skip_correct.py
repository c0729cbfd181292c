"""SkipCorrectStrategy: local updates on every replica, one fused global average every H steps,
and a divergence correction ("skip-and-correct").

Example:
    >>> import os; os.environ["TF_USE_LEGACY_KERAS"] = "1"          # doctest: +SKIP
    >>> import tensorflow as tf                                       # doctest: +SKIP
    >>> from tf_commopt.distribute import AutoInterval, SkipCorrectStrategy   # doctest: +SKIP
    >>> strategy = SkipCorrectStrategy(interval=AutoInterval(max_interval=64))   # doctest: +SKIP
    >>> with strategy.scope():                                        # doctest: +SKIP
    ...     model = tf.keras.Sequential([tf.keras.layers.Dense(10)])
    ...     model.compile("sgd", "sparse_categorical_crossentropy")
    >>> model.fit(x, y, epochs=1)                                     # doctest: +SKIP
    >>> strategy.stats()["syncs"]                                     # doctest: +SKIP

The exact rule (docs/skip_correct.md). Steps t = 1, 2, ... are counted per ``apply_gradients``
(``optimizer.iterations`` after the step); R = ``num_replicas_in_sync``; lr = the optimizer's current
learning rate; Δ_i = 0 initially. Gradients follow tf.distribute's convention (the loss of each replica
is scaled by 1/global batch, so the SUM over replicas is the global gradient); replica i's own
estimate of the gradient is therefore R·g_i.

* t ≤ warmup_steps: synchronous SGD — the gradients are all-reduced (SUM) and applied, as
  MirroredStrategy does.
* otherwise, local step: replica i applies R·g_i − Δ_i to its own copy x_i with the user's optimizer
  (no gradient all-reduce). k ← k + 1 (local steps since the last scheduled sync).
* when k == H: x̄ = mean_i x_i — one fused all-reduce of all trainable variables packed into one flat
  buffer per dtype, plus the non-trainable MEAN-aggregated state (BatchNorm moving statistics) and, if
  ``average_optimizer_state``, the optimizer slots; for ``vrl``: Δ_i ← Δ_i + (x̄ − x_i)/(k·lr); for
  ``gradient`` (the raw gradients R·g_i summed over the period, G_i, travel in the same all-reduce):
  Δ_i ← (G_i − Ḡ)/k, G_i ← 0; then x_i ← x̄ and k ← 0. The default ``correction="auto"`` is ``vrl``
  for plain SGD (where the two are equal) and ``gradient`` for every other optimizer.

With ``correction="none"`` and H = 1 this is exactly synchronous SGD (for plain SGD; with stateful
optimizers the slots stay local unless ``average_optimizer_state=True``).

Modules: this one is the thin Strategy and its argument checks; the behaviour is in its StrategyExtended
(``sc_extended.py``): the local step (``local_step.py``), the averaging (``averaging.py``, overlapped:
``overlap.py``), when to average (``interval_policy.py``, ``interval_state.py``, with two levels
``two_level_interval.py``), the correction rules (``correction.py``) and their checkpointed state
(``state.py``). tf-keras optimizers and models built under the scope reach the strategy through
per-instance wrappers (``_keras_hooks.py``).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional, Sequence, Union

import tensorflow as tf

from tf_commopt._compat import (
    distribute_lib,
    next_collective_key_base,
    require_internals,
    strategy_cluster_resolver,
)
from tf_commopt.core.compress import BLOCK_CODECS, validate_compression
from tf_commopt.core.interval import validate_interval
from tf_commopt.core.levels import TwoLevelInterval
from tf_commopt.core.period import TimeBudget, resolve_period
from tf_commopt.distribute import _keras_hooks
from tf_commopt.distribute import correction as _corr
from tf_commopt.distribute.interval_policy import AutoInterval, resolve_interval
from tf_commopt.distribute.overlap import validate_overlap
from tf_commopt.distribute.sc_extended import MultiWorkerSkipCorrectExtended, SkipCorrectExtended
from tf_commopt.distribute.two_level_interval import resolve_host_interval
from tf_commopt.errors import InputError

__all__ = [
    "SkipCorrectStrategy",
    "SkipCorrectExtended",
    "MultiWorkerSkipCorrectExtended",
    "AutoInterval",
    "TwoLevelInterval",
    "TimeBudget",
]


def _tf_config_has_cluster() -> bool:
    from tf_commopt.core.tfconfig import tf_config_from_env

    if tf_config_from_env() is None:  # unset or blank; a malformed TF_CONFIG is a one-line InputError here
        return False
    return bool(tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec().as_dict())


def _check_keras() -> None:
    """Keras 3 optimizers do not route through tf.distribute's update path we extend: point to tf-keras."""
    if "tf_keras" in sys.modules or os.environ.get("TF_USE_LEGACY_KERAS", "") in ("1", "true", "True"):
        return
    try:
        import keras

        major = int(str(getattr(keras, "__version__", "0")).split(".")[0])
    except Exception:  # no Keras at all: custom loops with tf-keras optimizers only
        return
    if major >= 3:
        raise InputError(
            "Keras 3 is the active tf.keras, and its optimizers all-reduce gradients themselves; "
            "SkipCorrectStrategy needs tf-keras: pip install tf-keras and set "
            "TF_USE_LEGACY_KERAS=1 before importing tensorflow",
            where="SkipCorrectStrategy",
        )


def _validated(
    interval: Any,
    shorthand: Dict[str, Any],
    correction: Any,
    warmup_steps: Any,
    average_optimizer_state: Any,
    correction_lr: Any,
    overlap: Any,
    graph_loop: Any = True,
    compression: Any = None,
    period: Any = "steps",
    host_interval: Any = None,
    hosts: Any = None,
) -> Dict[str, Any]:
    """The StrategyExtended's keyword arguments from the constructor's, each checked (one-line InputError
    naming the argument)."""
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise InputError(
            f"must be a non-negative integer, got {warmup_steps!r}",
            where="SkipCorrectStrategy(warmup_steps=...)",
        )
    resolved = resolve_interval(interval, shorthand, owner="SkipCorrectStrategy")
    budget = resolve_period(period, where="SkipCorrectStrategy(period=...)")
    if budget is not None and not isinstance(resolved, int):
        raise InputError(
            "period='time' needs a fixed integer interval", where="SkipCorrectStrategy(period=...)"
        )
    if budget is not None and overlap:
        raise InputError(
            "period='time' does not overlap syncs; use overlap=False", where="SkipCorrectStrategy(period=...)"
        )
    if compression is not None and budget is not None:
        raise InputError(
            "compression with period='time' is not supported yet; use one of them",
            where="SkipCorrectStrategy(compression=...)",
        )
    host_interval = _check_two_level(host_interval, hosts, resolved, budget, overlap)
    if compression in BLOCK_CODECS and host_interval is None:
        raise InputError(
            f"{compression!r} needs two-level averaging (host_interval): int8 values cannot be summed on "
            "the wire, so the hosts exchange them by all-gather; flat syncs take 'bf16' or 'fp16'",
            where="SkipCorrectStrategy(compression=...)",
        )
    return dict(
        host_interval=host_interval,
        hosts=hosts,
        interval=resolved,
        period=budget,
        correction=_corr.validate_correction(correction, where="SkipCorrectStrategy(correction=...)"),
        warmup_steps=warmup_steps,
        average_optimizer_state=bool(average_optimizer_state),
        correction_lr=_corr.validate_correction_lr(
            correction_lr, where="SkipCorrectStrategy(correction_lr=...)"
        ),
        overlap=validate_overlap(overlap, where="SkipCorrectStrategy(overlap=...)"),
        graph_loop=validate_overlap(graph_loop, where="SkipCorrectStrategy(graph_loop=...)"),
        compression=validate_compression(compression, where="SkipCorrectStrategy(compression=...)"),
    )


def _check_two_level(host_interval: Any, hosts: Any, interval: Any, budget: Any, overlap: Any) -> Any:
    """The resolved ``host_interval`` (None, h or a ``TwoLevelInterval``); one-line errors for it, ``hosts``
    and what they do not combine with."""
    where = "SkipCorrectStrategy(host_interval=...)"
    if host_interval is None:
        if hosts is not None:
            raise InputError("hosts is only used with host_interval", where="SkipCorrectStrategy(hosts=...)")
        return None
    host_interval = resolve_host_interval(host_interval, interval, where=where)
    if budget is not None or overlap:
        raise InputError(
            "two-level averaging does not combine with period='time' or overlap=True", where=where
        )
    return host_interval


class SkipCorrectStrategy(distribute_lib.Strategy):
    """Local SGD with periodic global averaging and divergence correction, as a tf.distribute strategy.

    Example:
        >>> strategy = SkipCorrectStrategy(interval=4, correction="vrl")   # doctest: +SKIP
        >>> with strategy.scope():                                         # doctest: +SKIP
        ...     model = make_model(); model.compile("sgd", "mse")
        >>> model.fit(x, y)                                                # doctest: +SKIP

    Args:
        interval: H, local steps between two global averagings (int ≥ 1); an :class:`AutoInterval`
            (H chosen from the first steps' timings, then kept: the interval policy and its options);
            or ``"auto"``, which is ``AutoInterval()``.
        correction: ``"auto"`` (default: ``"vrl"`` for plain SGD, ``"gradient"`` for any other
            optimizer), ``"gradient"`` (the control variate from the period's averaged raw gradients,
            applied before the optimizer: momentum, Nesterov, Adam, RMSprop, ...; the gradient sums
            double a sync's bytes), ``"vrl"`` (VRL-SGD, Liang et al. 2019: the model-space form, exact
            for plain SGD) or ``"none"`` (plain local SGD).
        warmup_steps: steps of plain synchronous SGD before local steps begin (post-local SGD).
        average_optimizer_state: also average the optimizer slots (momentum, Adam moments) at each
            sync; by default they stay local.
        devices: local devices, as for MirroredStrategy (ignored with a TF_CONFIG cluster).
        cluster_resolver: a ClusterResolver for multi-worker training (default: TF_CONFIG).
        correction_lr: the lr in the vrl update: ``"effective"`` (default: lr / (1 − β) for tf-keras SGD
            with heavy-ball momentum β — the steady-state step per unit gradient; exactly the
            optimizer's lr for plain SGD and other optimizers) or ``"optimizer"`` (the rule read
            literally: the optimizer's current learning rate, which over-corrects with momentum).
        overlap: run each sync's all-reduce in the background while the replicas keep stepping, and apply
            the (one interval stale) average at the next sync as x_i ← x_i + (ȳ − y_i) (y_i: replica i's
            snapshot; Overlap-Local-SGD, :mod:`tf_commopt.distribute.overlap`). An ``AutoInterval`` then
            chooses H so that communication is hidden. ``sync()``, Keras evaluate/save and the end of
            ``fit`` apply an in-flight average first.
        graph_loop: ``model.fit`` runs the local steps up to each sync as one traced call (tf-keras's
            ``steps_per_execution`` set to the steps to the next sync while ``fit`` runs; callbacks' batch
            hooks then see every call's end) when the model was compiled with the default
            ``steps_per_execution=1`` (:mod:`tf_commopt.distribute.graph_loop`); ``False``: one step per
            call.
        compression: ``None`` (default: float32 syncs), ``"bf16"`` or ``"fp16"``: each scheduled sync sends
            the period's model delta x_i − x₀ (x₀ the last global model; and ``gradient``'s G_i) rounded to
            that dtype, with error feedback (the rounding residual kept per replica, in checkpoints, and
            added to the next delta): half the bytes (:mod:`tf_commopt.distribute.compressed_sync`,
            docs/skip_correct.md "Compressed syncs"). Averaged non-trainable state stays float32.
            ``"int8"`` (with ``host_interval``, vrl or none): the hosts exchange the delta in blocks of 256
            int8 values with a float32 scale each, by all-gather (docs/skip_correct.md, "int8 across hosts").
        period: ``"steps"`` (default: every replica takes H local steps per period) or ``"time"`` (every
            replica steps for the wall time the fastest needs for H steps, so a worker k times slower
            takes about H/k; the sync averages normalised updates, FedNova's rule, and equal speeds give
            the ``"steps"`` rule exactly; :mod:`tf_commopt.distribute.unequal_sync`), or a
            :class:`~tf_commopt.core.period.TimeBudget` (its options: ``min_steps``, fixed
            ``step_times``). Needs a fixed integer ``interval`` and ``overlap=False``.
        host_interval: h, two-level averaging (:mod:`tf_commopt.distribute.two_level`): the replicas of
            each host average every h local steps, all replicas every ``interval`` steps (a multiple of
            h), with the correction at both levels; a global sync crosses the hosts once per host
            value (the slow link carries 1/p of it per worker, p workers per host). ``None`` (default):
            one level. A fixed h needs a fixed integer ``interval``. ``"auto"``: h and H = m·h chosen
            together from the probe of the ``AutoInterval`` (``interval="auto"`` or one given), with
            :class:`~tf_commopt.core.levels.TwoLevelInterval`'s rule
            (:mod:`tf_commopt.distribute.two_level_interval`); a ``TwoLevelInterval`` instead of
            ``"auto"`` sets its ``intra_ratio`` (its ``target_ratio`` and ``max_interval`` equal to the
            ``AutoInterval``'s). Needs ``overlap=False`` and ``period="steps"``.
        hosts: with ``host_interval``, the host of each replica (names or numbers, in replica order);
            default: on a cluster, the launcher's ``$TF_COMMOPT_HOSTS`` or else the host part of each
            TF_CONFIG address (tasks with the same host name share a host); in one process, one host.
        target_ratio, max_interval, auto_warmup_steps, auto_probe_interval, auto_measure_syncs: shorthand
            for ``interval="auto"``: they build ``AutoInterval(target_ratio, max_interval, warmup_steps,
            probe_interval, measure_syncs)``; unused with a fixed H; an error next to an ``AutoInterval``.
    """

    _collective_key_base = 0

    def __init__(
        self,
        interval: Union[int, str, AutoInterval] = 4,
        correction: str = "auto",
        warmup_steps: int = 0,
        average_optimizer_state: bool = False,
        devices: Optional[Sequence[str]] = None,
        cluster_resolver: Any = None,
        correction_lr: str = "effective",
        overlap: bool = False,
        *,
        graph_loop: bool = True,
        compression: Optional[str] = None,
        period: Union[str, TimeBudget] = "steps",
        host_interval: Union[None, int, str, TwoLevelInterval] = None,
        hosts: Optional[Sequence[Any]] = None,
        target_ratio: Optional[float] = None,
        max_interval: Optional[int] = None,
        auto_warmup_steps: Optional[int] = None,
        auto_probe_interval: Optional[int] = None,
        auto_measure_syncs: Optional[int] = None,
    ):
        shorthand = dict(
            target_ratio=target_ratio,
            max_interval=max_interval,
            auto_warmup_steps=auto_warmup_steps,
            auto_probe_interval=auto_probe_interval,
            auto_measure_syncs=auto_measure_syncs,
        )
        sc = _validated(
            interval,
            shorthand,
            correction,
            warmup_steps,
            average_optimizer_state,
            correction_lr,
            overlap,
            graph_loop,
            compression,
            period,
            host_interval,
            hosts,
        )
        _check_keras()
        require_internals("SkipCorrectStrategy")
        # distinct collective group keys per instance (as TensorFlow's tests do), the same sequence on
        # every worker when they build their strategies in the same order
        self._collective_key_base = next_collective_key_base()
        if cluster_resolver is not None or (devices is None and _tf_config_has_cluster()):
            if devices is not None:
                raise InputError("give devices or cluster_resolver, not both", where="SkipCorrectStrategy")
            extended = MultiWorkerSkipCorrectExtended(self, cluster_resolver=cluster_resolver, **sc)
        else:
            extended = SkipCorrectExtended(self, devices=devices, **sc)
        super().__init__(extended)
        extended._sc_build_period()
        _keras_hooks.install(SkipCorrectStrategy)

    @property
    def cluster_resolver(self) -> Any:
        """The ClusterResolver of a multi-worker strategy (None in one process)."""
        return strategy_cluster_resolver(self)

    @property
    def interval(self) -> int:
        """The current H."""
        return int(self.extended.interval_state.interval.numpy())

    @property
    def overlap(self) -> bool:
        """True when syncs are overlapped with local steps (``overlap=True``)."""
        return self.extended._sc_overlap

    @property
    def compression(self) -> Optional[str]:
        """The wire dtype of the scheduled syncs' deltas: None, ``"bf16"`` or ``"fp16"``."""
        return self.extended.compression

    @property
    def period(self) -> str:
        """``"steps"`` or ``"time"`` (the options: ``extended.time_period.budget``)."""
        return "time" if self.extended.time_period is not None else "steps"

    @property
    def correction(self) -> str:
        return self.extended._sc_correction

    @property
    def warmup_steps(self) -> int:
        return self.extended._sc_warmup

    @property
    def auto_interval(self) -> bool:
        """True when H is chosen by an :class:`AutoInterval` (``interval="auto"`` or an ``AutoInterval``)."""
        return self.extended.interval_state.auto

    @property
    def interval_policy(self) -> Union[int, AutoInterval]:
        """The interval policy: the ``AutoInterval`` or the fixed H the strategy was built with."""
        ivs = self.extended.interval_state
        return ivs.policy if ivs.auto else self.interval

    def set_interval(self, interval: int) -> None:
        """Change H (every worker must set the same value; with two levels a multiple of the current h).
        The hook point for interval policies."""
        where = "SkipCorrectStrategy.set_interval"
        interval = validate_interval(interval, where=where)
        if interval == "auto":
            raise InputError("set_interval needs an integer", where=where)
        two = self.extended.two_level
        if two is not None and interval % int(two.h):
            raise InputError(f"{interval} is not a multiple of host_interval={int(two.h)}", where=where)
        self.extended.interval_state.set(int(interval))

    def sync(self) -> None:
        """Average the replicas now (cross-replica context; outside the H rhythm, no Δ update). With
        ``overlap=True`` an in-flight averaging is applied first (with its Δ update): call it before a
        custom-loop checkpoint so the file holds the global model and nothing is left in flight."""
        with self.scope():
            self.extended.sync_now()

    def stats(self) -> Dict[str, Any]:
        """Telemetry: interval, steps, syncs, comm_s, compute_s, bytes_communicated (this process),
        ``compression`` and ``sync_payload_bytes`` (one replica's bytes in one scheduled sync: the
        trainable deltas in the wire dtype, doubled for ``gradient``, plus averaged state in float32).

        With ``interval="auto"`` also: ``interval_chosen`` (0/1), ``interval_t_comm_s`` and
        ``interval_t_comp_s`` (the timings averaged over workers, from which H was chosen),
        ``interval_overhead_s`` (extra seconds spent choosing H: the agreement all-reduce and the
        policy) and ``interval_selection_comm_s`` (all sync seconds before H was fixed: the H = 1 syncs
        including the measured ones, and any earlier out-of-rhythm sync — an upper bound on the syncs
        the selection added), ``interval_t_comm_samples_s`` / ``interval_t_comp_samples_s`` (this
        worker's probe samples: the spread behind the medians).

        With ``host_interval``: ``host_interval`` (h; with ``"auto"`` 1 in the warm-up, the probe's until chosen), ``hosts``,
        ``host_syncs``, ``host_comm_s``, ``inter_host_bytes``; with ``host_interval="auto"`` also
        ``interval_t_intra_s`` (an intra-host sync), ``interval_t_inter_s`` (a global sync, the same as
        ``interval_t_comm_s``) and ``interval_t_intra_samples_s``.
        """
        e = self.extended
        out: Dict[str, Any] = e.interval_state.as_dict()
        out.update(e.telemetry.as_dict())
        out.update(compression=e.compression, sync_payload_bytes=e.sync_payload_bytes)
        if e.time_period is not None:
            out.update(e.time_period.as_dict())
        if e.two_level is not None:
            out.update(host_interval=int(e.two_level.h), hosts=e.two_level.hosts)
        return out

    def reset_step_clock(self) -> None:
        """Forget the end time of the last step (so a pause, e.g. evaluation, is not counted as compute)."""
        self.extended.telemetry.reset_clock()
