"""The keras.io corpus (`tests/support/keras_io/`): examples that override
`train_step`, `compute_loss` or `compute_metrics`, their model code as
published with `keras_ctl.CTLModel` as the base.

In parity mode (the step's random draws taken from the data) each exact
example equals `keras.Model` on one device in float64 to 1e-9, on 2
replicas, with a replica that gets no example in the last batch. The
longer examples, 3 replicas and the runs as written are in
`tests/end_to_end/keras_io_examples_test.py`.
"""

import keras_io
import pytest


@pytest.mark.parametrize(
    "name", [name for name in keras_io.EXACT if name not in keras_io.SLOW]
)
def test_an_example_equals_one_device_on_2_replicas(name):
    largest, same_updates = keras_io.difference_on_2_replicas(name)
    assert largest <= keras_io.TOLERANCE["float64"] and same_updates
