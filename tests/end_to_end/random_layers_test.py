"""The matrix of seeded random layers (`random_layers`): a third of the
layers of `keras.layers` that take a `seed`, drawn by a hash of the name,
each in a model of its own on 2 replicas with
`random_draws="as_one_device"`, in float64 (float32 where Keras fails in
float64), on a static (48 examples) or a dynamic (49) batch: one device's
weights (float64 1e-9, float32 1e-5); and every layer refused by name, on
a static batch (refused as the step is traced).
Five layers of different kinds also in the keras.io guide's step of one's
own (2 replicas, float64) and on 2 workers (both dtypes, both batches).
`.ci/random_layers.py` runs every layer, both dtypes and both batches, on 2
and 3 replicas and 2 workers, and on 2 replicas in a step of one's own."""

import children
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


# A layer of each kind: dropout, noise, an augmentation that draws per
# example, one with a value per row of its draw, and a recurrent layer.
ACROSS_KINDS = [
    "SpatialDropout2D",
    "GaussianNoise",
    "RandomZoom",
    "RandomErasing",
    "GRU",
]


@pytest.mark.parametrize("name", ACROSS_KINDS)
def test_a_seeded_layer_in_a_step_of_ones_own_draws_as_one_device(name):
    for examples in (48, 49):
        expected, found = random_layers.check(
            name, "float64", examples, devices.get("mirrored"), own_step=True
        )
        assert random_layers.passed(expected, found), (examples, expected, found)


def test_seeded_layers_on_two_workers_draw_as_one_device(tmp_path):
    out = tmp_path / "matrix.json"
    command = [children.PYTHON, "random_layers_child.py", "workers", out]
    command += ["--only", ",".join(ACROSS_KINDS)]
    rows = children.json_written(
        children.launched(2, command, timeout=600), out, timeout=660
    )
    assert "error" not in rows, rows
    # Each layer in both dtypes, on static and dynamic batches.
    assert len(rows) == 4 * len(ACROSS_KINDS)
    for name, dtype, examples, expected, found, passed in rows:
        assert passed, (name, dtype, examples, expected, found)
