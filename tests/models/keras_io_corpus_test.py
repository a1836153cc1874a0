"""The keras.io corpus (`tests/support/keras_io/`): examples that override
`train_step`, `compute_loss` or `compute_metrics`, their model code as
published with `keras_ctl.CTLModel` as the base.

In parity mode (the step's random draws taken from the data) each exact
example equals `keras.Model` on one device in float64 to 1e-9, with a
replica that gets no example in the last batch. The suite runs each
example on 2 or 3 replicas (`keras_io.replicas_in_suite`, from its name);
the shorter ones on 2 replicas run here, the others in
`tests/end_to_end/keras_io_examples_test.py`, and `.ci/keras_io` runs every
example on 1, 2 and 3 replicas in float64 and float32, and as written.
"""

import keras_io
import pytest


@pytest.mark.parametrize(
    "name",
    [
        name
        for name in keras_io.EXACT
        if name not in keras_io.SLOW and keras_io.replicas_in_suite(name) == 2
    ],
)
def test_an_example_equals_one_device_on_2_replicas(name):
    largest, same_updates = keras_io.difference_on_2_replicas(name)
    assert largest <= keras_io.tolerance(name, "float64") and same_updates
