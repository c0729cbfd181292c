"""GroupedHybridTrainer: pipelines inside device groups, synchronous data parallelism between groups.

Example:
    >>> import tf_keras as keras                                                   # doctest: +SKIP
    >>> from tf_commopt.distribute.hybrid import GroupedHybridTrainer
    >>> strategy = GroupedHybridTrainer(devices=["/GPU:0", "/GPU:1", "/GPU:2", "/GPU:3"],
    ...                                  capacities=[1, 1, 0.5, 0.5], num_groups=2, microbatches=4)  # doctest: +SKIP
    >>> with strategy.scope():                                                     # doctest: +SKIP
    ...     model = build_model()
    ...     strategy.compile(model, optimizer=keras.optimizers.SGD(0.1),
    ...                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> strategy.fit(dataset, epochs=2)          # or: strategy.train_step(x, y); or model.fit(dataset)  # doctest: +SKIP

The rules:

* **Groups.** ``groups`` as given; with a multi-worker TF_CONFIG one group per worker host
  (:mod:`hosts`: each process runs its host's group on its local devices; the hosts start from host
  0's weights, exchange their throughputs once, slice the same global batch and sum their gradients
  with one collective per step); otherwise ``num_groups`` groups by the planner's snake rule.
* **Plan.** :func:`tf_commopt.core.planner.plan_hybrid` of the model's cost graph
  (:func:`tf_commopt.tf.graph_import.from_keras_model`) on the devices' capacities
  (:mod:`capacity`): each group's capacity-aware pipeline and the batch split ``(1/t_g) / sum(1/t_h)``,
  ``t_g`` the group's pipeline alone on the whole batch; the same function and defaults the simulator's
  callers use. Or ``plans`` (one per group) and ``group_weights``. ``B_g`` = largest-remainder
  rounding, each group at least one sample.
* **Program.** :attr:`GroupedHybridTrainer.program` is
  :func:`tf_commopt.core.schedule.hybrid.hybrid_program` of the plan, the simulator's program; the
  executor (:mod:`executor`) runs exactly its streams (``executed`` records the order).
* **Gradient weighting.** Group g splits B_g into M micro-batches of b_{g,m} samples and weights each
  micro-batch loss by ``b_{g,m} / B``; the all-reduce SUMS the groups' gradients: the gradient of the
  global batch's mean loss, whatever the (uneven) B_g. After every ``OptimizerStep`` each group's own
  optimizer (a clone of the one given) applies the reduced gradients.

Modules: :mod:`trainer` (the class), :mod:`executor`, :mod:`program` (the program bound to the model's
variables), :mod:`hosts`, :mod:`capacity`, :mod:`keras_fit` (``model.fit``).
"""

from tf_commopt.core.schedule.hybrid import split_batch
from tf_commopt.distribute.hybrid.hosts import groups_from_tf_config
from tf_commopt.distribute.hybrid.trainer import GroupedHybridTrainer

__all__ = ["GroupedHybridTrainer", "groups_from_tf_config", "split_batch"]
