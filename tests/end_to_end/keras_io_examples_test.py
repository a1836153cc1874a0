"""The keras.io corpus, end to end: the longer exact examples the suite
runs on 2 replicas (`keras_io.replicas_in_suite`), and the others on 3
replicas (a child process), in float64 to 1e-9. `.ci/keras_io` runs every
example on 1, 2 and 3 replicas in float64 and float32, and as written.
"""

import json

import children
import keras_io
import pytest


@pytest.mark.parametrize(
    "name",
    [
        name
        for name in keras_io.SLOW
        if name in keras_io.EXACT and keras_io.replicas_in_suite(name) == 2
    ],
)
def test_a_longer_example_equals_one_device_on_2_replicas(name):
    largest, same_updates = keras_io.difference_on_2_replicas(name)
    assert largest <= keras_io.tolerance(name, "float64") and same_updates


def test_the_other_examples_equal_one_device_on_3_replicas(tmp_path):
    names = [name for name in keras_io.EXACT if keras_io.replicas_in_suite(name) == 3]
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
