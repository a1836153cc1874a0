"""A replica without examples in the last batch, on every input rank and
layer type: `fit()` with validation data, `evaluate()` and `predict()`
equal `keras.Model` on one device (`empty_replicas`: the tutorial's
classifier on 97 digits, batch 8, and generated configurations of rank 2,
3 and 4 with Keras's step and steps of one's own, in float32). 2 replicas
here; 3 in a child process (slow)."""

import children
import configurations
import devices
import empty_replicas
import keras
import pytest

import keras_ctl


@pytest.mark.parametrize(
    "floatx", ["float32", pytest.param("float64", marks=pytest.mark.slow)]
)
def test_the_tutorial_classifier_with_an_empty_replica_equals_one_device(floatx):
    expected = empty_replicas.classifier_run(
        keras.Model, devices.get("default"), floatx
    )
    got = empty_replicas.classifier_run(
        keras_ctl.CTLModel, devices.get("mirrored"), floatx
    )
    difference = empty_replicas.largest_difference(expected, got)
    assert difference <= empty_replicas.TOLERANCE[floatx]


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("name", sorted(empty_replicas.generated(2)))
def test_every_rank_and_step_with_an_empty_replica_equals_one_device(name):
    config = empty_replicas.generated(2)[name]
    passed, found = configurations.check(config, devices.get("mirrored"))
    assert passed, f"{found}\n{configurations.describe(config)}"


def _on_3_replicas(tmp_path, every):
    out = tmp_path / "3.json"
    command = [children.PYTHON, "empty_replica_child.py", 3, out]
    found = children.json_written(
        [*command, *(["--every"] if every else [])], out, timeout=900
    )
    assert "error" not in found, found
    assert set(found) == {
        "classifier-float32",
        "classifier-float64",
        *empty_replicas.generated(3, every),
    }
    assert all(passed for passed, _ in found.values()), found


@pytest.mark.slow
def test_three_replicas_with_empty_replicas_equal_one_device(tmp_path):
    # Each rank with one step and each step with one rank.
    _on_3_replicas(tmp_path, every=False)


@pytest.mark.slow  # `-m "not slow"` (the fast tier) replaces `-m "not long"`
@pytest.mark.long
def test_every_rank_and_step_on_three_replicas_equals_one_device(tmp_path):
    _on_3_replicas(tmp_path, every=True)
