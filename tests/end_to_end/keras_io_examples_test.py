"""The keras.io corpus, end to end: the longer exact examples on 2
replicas, every exact example on 3 replicas (a child process) in float64
(1e-9) and float32 (1e-5), and every example as written, with its own
randomness, on 2 replicas.
"""

import json

import children
import devices
import keras
import keras_io
import numpy as np
import pytest

import keras_ctl

STEPS = keras_io.EPOCHS * -(-keras_io.SIZE // keras_io.BATCH)


@pytest.mark.parametrize("name", keras_io.SLOW)
def test_a_longer_example_equals_one_device_on_2_replicas(name):
    largest, same_updates = keras_io.difference_on_2_replicas(name)
    assert largest <= keras_io.TOLERANCE["float64"] and same_updates


def test_the_examples_equal_one_device_on_3_replicas(tmp_path):
    out = tmp_path / "3.json"
    result = children.run([children.PYTHON, "keras_io_child.py", 3, out], timeout=900)
    assert result.returncode == 0, children.output(result)
    found = json.loads(out.read_text())
    for dtype, tolerance in keras_io.TOLERANCE.items():
        assert set(found[dtype]) == set(keras_io.EXACT)
        off = {name: d for name, d in found[dtype].items() if d > tolerance}
        assert not off, (dtype, off)


@pytest.mark.parametrize("name", keras_io.AS_WRITTEN)
def test_an_example_runs_as_written_on_2_replicas(name):
    keras.utils.set_random_seed(1)
    got = keras_io.train(
        name, keras_ctl.CTLModel, devices.get("mirrored"), parity=False
    )
    # 17 examples in batches of 8: 3 steps an epoch, every optimizer the
    # step uses applied the same number of times a step (once, or the
    # WGAN-GP critic's extra steps; a GAN's `super().compile()` adds a
    # default optimizer that it never uses).
    used = [count for count in got["iterations"] if count]
    assert used and STEPS in used and all(count % STEPS == 0 for count in used)
    assert all(np.isfinite(w).all() for w in got["weights"])
    # A step counter of the model's own (AdaMatch's loss-weight ramp)
    # counts steps, as on one device.
    assert got.get("current_step", STEPS) == STEPS
    if name not in keras_io.LOCAL_MEANS_LOGGED:
        for values in got["history"].values():
            assert np.isfinite(values).all() and len(values) == keras_io.EPOCHS
