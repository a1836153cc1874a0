"""A loss of the user's own given to `compile()` is read as one device
computes it, measured on the first batch (`loss_mean.read_compiled_losses`):
a mean keeps the mean reading, a sum (the tutorial's recipe inside a
`Loss`, `sum(per_example) / GLOBAL_BATCH`, or a `reduction="sum"` of one
value) is each replica's share summed as it is, and a loss that couples
the batch's examples is refused by name. Each equals `keras.Model` on one
device in float64 (weights, `history`, `evaluate()`), with a last batch
split unevenly; on 3 replicas in a child process (slow)."""

import children
import compiled_losses
import devices
import keras
import pytest

import keras_ctl
from keras_ctl._engine import state as engine_state


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("kind", sorted(compiled_losses.LOSSES))
def test_a_compiled_loss_of_ones_own_equals_one_device(kind):
    _, expected = compiled_losses.run(kind, keras.Model, devices.get("default"))
    model, got = compiled_losses.run(kind, keras_ctl.CTLModel, devices.get("mirrored"))
    assert compiled_losses.largest_difference(expected, got) <= 1e-9
    readings = set(engine_state.of(model).loss_readings.values())
    assert readings == {compiled_losses.READING.get(kind, "mean")}


def test_evaluate_before_fit_reads_the_loss_too():
    _, expected = compiled_losses.run(
        "recipe", keras.Model, devices.get("default"), evaluate_first=True
    )
    _, got = compiled_losses.run(
        "recipe", keras_ctl.CTLModel, devices.get("mirrored"), evaluate_first=True
    )
    assert compiled_losses.largest_difference(expected, got) <= 1e-9


# Judged against the round-off measured (the batch in reverse order), at
# least 1024 epsilons of float64: a coupling of a millionth is found.
@pytest.mark.parametrize("coupling", [1.0, 1e-6])
def test_a_compiled_loss_coupling_the_batch_is_refused_by_name(coupling):
    with pytest.raises(ValueError) as error:
        compiled_losses.run(
            "coupled", keras_ctl.CTLModel, devices.get("mirrored"), coupling=coupling
        )
    message = str(error.value)
    assert "(Coupled) is neither a mean nor a sum over examples" in message
    assert "measured on a batch of 4" in message
    assert 'compute_loss_over="global_batch"' in message


@pytest.mark.slow
def test_three_replicas_read_each_loss_as_one_device(tmp_path):
    out = tmp_path / "3.json"
    command = [children.PYTHON, "compiled_loss_child.py", 3, out]
    found = children.json_written(command, out, timeout=600)
    assert "error" not in found, found
    assert all(found[kind] <= 1e-9 for kind in compiled_losses.LOSSES), found
    assert "neither a mean nor a sum" in found["coupled"], found
