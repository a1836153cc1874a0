"""Generated steps of one's own, written for one device (`generated_steps`:
Keras `Loss` objects, `self.compute_loss`, raw means, layer losses, sample
weights, trackers, metrics under other keys, one or two tapes and
optimizers, `tf.function`), equal `keras.Model` on one device in float64
on 2 replicas, and on 3 in a child process, uneven and empty replicas
included. `bash .ci/differential` runs 200 more (100 on 2 replicas, 100
on 3)."""

import json

import children
import devices
import generated_steps
import pytest

SEEDS = (3, 8, 36, 40, 41)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_generated_step_equals_one_device_on_2_replicas(seed):
    difference = generated_steps.check(seed, devices.get("mirrored"))
    assert difference <= generated_steps.TOLERANCE, generated_steps.draw(seed)


@pytest.mark.slow
def test_generated_steps_equal_one_device_on_3_replicas():
    command = [
        children.PYTHON,
        "generated_steps.py",
        "--replicas",
        3,
        "--seeds",
        "100:108",
    ]
    result = children.run(command, timeout=1200)
    assert result.returncode == 0, children.output(result)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line]
    assert [line for line in lines if "seed" in line] == []
    assert lines[-1]["checked"] == 8
