"""Trainer tests run TensorFlow in the pytest process on 4 logical CPU devices, set up
before any TensorFlow op runs (it cannot change afterwards)."""

from __future__ import annotations

import tensorflow as tf

TOWER_DEVICES = 4

try:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * TOWER_DEVICES
    )
except RuntimeError as err:  # pragma: no cover - a test ran TF before this conftest
    raise RuntimeError("trainer tests need 4 logical CPU devices configured before TensorFlow starts") from err

DEVICES = [f"/device:CPU:{i}" for i in range(TOWER_DEVICES)]
