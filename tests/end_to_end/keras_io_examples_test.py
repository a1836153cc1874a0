"""The keras.io corpus (`tests/support/keras_io/`): examples that override
`train_step`, `test_step` or `compute_loss`, their model code as published
with `keras_ctl.CTLModel` as the base.

In parity mode (the step's random draws taken from the data) each exact
example equals `keras.Model` on one device in float64 to 1e-9, with a
replica that gets no example in the last batch. The suite runs half of
them on 2 replicas (in this process); a quarter on 3 (a child process) is
a long check (`bash .ci/long_checks`),
from a hash of its name (`keras_io.replicas_in_suite`), but for the
longest (`keras_io.LONGEST`);
`.ci/keras_io.py` runs every example on 1, 2 and 3 replicas in float64 and
float32, and as written. An example that cannot run as written under
replicas (`keras_io.REFUSED_AS_WRITTEN`) stops with a message that names why
(here but for the longest). An example whose trained layers equal one
device but which keeps a value of each replica's examples in its
variables (`keras_io.WARNED`) is warned of by name.
"""

import json

import children
import devices
import keras
import keras_io
import pytest


@pytest.mark.parametrize("name", keras_io.in_suite(2))
def test_an_example_equals_one_device_on_2_replicas(name):
    largest, same_updates = keras_io.difference_on_2_replicas(name)
    assert largest <= keras_io.tolerance(name, "float64") and same_updates


@pytest.mark.long
def test_the_other_examples_equal_one_device_on_3_replicas(tmp_path):
    names = keras_io.in_suite(3)
    out = tmp_path / "3.json"
    command = [children.PYTHON, "keras_io_child.py", 3, out, "--dtypes", "float64"]
    result = children.run([*command, "--names", *names], timeout=1200)
    assert result.returncode == 0, children.output(result)
    found = json.loads(out.read_text())["float64"]
    assert set(found) == set(names)
    off = {
        name: d for name, d in found.items() if d > keras_io.tolerance(name, "float64")
    }
    assert not off, off


@pytest.mark.parametrize(
    "name", sorted(set(keras_io.REFUSED_AS_WRITTEN) - set(keras_io.LONGEST))
)
def test_an_example_that_cannot_run_as_written_is_refused_by_name(name):
    keras.utils.set_random_seed(1)
    assert keras_io.refusal_as_written(name, devices.get("mirrored")) == []


# Forward-Forward's mechanism (a metric's result kept in a variable, layers
# with optimizers of their own) is in the suite in
# `tests/models/layer_optimizers_test.py`; the example itself is a long check.
@pytest.mark.long
@pytest.mark.parametrize("name", sorted(keras_io.WARNED))
def test_an_example_keeping_a_replicas_value_is_warned_of_by_name(name):
    largest, said = keras_io.warned_on_2_replicas(name)
    assert largest <= keras_io.tolerance(name, "float64")
    assert any(keras_io.WARNED[name] in message for message in said), said
