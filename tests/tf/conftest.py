"""The ``tf`` tier: one process with 4 logical CPU devices (configured before any op runs)."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf

NUM_LOGICAL_CPUS = 4
_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
    )
except RuntimeError:  # already initialised by an earlier import in this process
    pass
