"""Variables that workers share on parameter servers: one atomic update
(the behaviour of the seam's `assign_add` and `assign_sub` rows)."""

import tensorflow as tf

from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step
from keras_ctl._keras.state import record_write
from keras_ctl.distribute import topology


@registered
def atomic_update(original, native):
    """Under `ParameterServerStrategy`, `variable.assign_add(v)` (or
    `assign_sub`, `native`) in a step is one atomic update on the parameter
    server.

    Keras implements them as `assign(self + v)` (`KerasVariable`): two
    workers that read the same value both write their own sum, and one
    update is lost (seen: 8 of 10 steps counted in `optimizer.iterations`,
    metrics short of examples). TensorFlow's own `assign_add` is one op on
    the variable's device. Checked on Keras 3.12.0 and 3.15.1.
    """

    def update(self, value):
        record_write(self)
        if not getattr(in_step, "active", False) or not topology.of().parameter_servers:
            return original(self, value)
        variable = self.value
        return getattr(variable, native)(tf.cast(value, variable.dtype))

    return update
