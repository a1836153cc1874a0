"""The matrix of seeded random layers (`random_layers`): a third of the
layers of `keras.layers` that take a `seed`, drawn by a hash of the name,
each in a model of its own on 2 replicas with
`random_draws="as_one_device"`, in float64 (float32 where Keras fails in
float64), on a static (48 examples) or a dynamic (49) batch: one device's
weights (float64 1e-9, float32 1e-5); and every layer refused by name, on
a static batch (refused as the step is traced).
`.ci/random_layers.py` runs every layer, both dtypes and both batches, on 2
and 3 replicas."""

import devices
import pytest
import random_layers

SAMPLE = [
    (name, *random_layers.in_suite(name))
    for name in sorted(random_layers.BUILDERS)
    if random_layers.in_suite(name)
] + [(name, "float64", 48) for name in sorted(random_layers.REFUSED)]


@pytest.mark.parametrize("name, dtype, examples", SAMPLE)
def test_a_seeded_layer_draws_as_one_device_or_is_refused(name, dtype, examples):
    expected, found = random_layers.check(
        name, dtype, examples, devices.get("mirrored")
    )
    assert expected[0] in ("exact", "refused")
    assert random_layers.passed(expected, found), (expected, found)
