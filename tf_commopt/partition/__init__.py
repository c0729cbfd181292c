"""Public partitioner API (pure: no TensorFlow). CLI: ``python -m tf_commopt.partition``.

Example:
    >>> from tf_commopt.partition import partition, load_profile
    >>> plan = partition(load_profile("pipedream/vgg16"), 4, method="ga", bandwidth_gbps=10.0, seed=0)
    >>> plan.method, plan.num_stages
    ('ga', 4)

See docs/partitioning.md for the objective and the methods.
"""
from tf_commopt.core.partition import METHODS, PartitionPlan, evaluate, make_cluster, partition
from tf_commopt.core.profiles import bundled_profile_path, load_profile, read_json, read_pipedream, write_json, write_pipedream

__all__ = ["partition", "evaluate", "make_cluster", "METHODS", "PartitionPlan", "load_profile",
           "bundled_profile_path", "read_json", "read_pipedream", "write_json", "write_pipedream"]
