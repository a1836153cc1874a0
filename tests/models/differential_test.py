"""Generated configurations: CTLModel equals `keras.Model` on one device.

Each seed draws a configuration nobody here chose (`configurations.draw`):
model kind, loss and reduction, sample or class weights, metrics, optimizer
and its options, `steps_per_execution`, `jit_compile`, arrays or `tf.data`,
a dataset size that leaves uneven or empty replicas, validation data. In
float64, CTLModel on one device equals keras.Model to 1e-12 and under
several replicas to 1e-9 (relative). A failure prints its configuration and
`python tests/support/configurations.py SEED` reproduces it. Here a fixed
sample; `tests/end_to_end/generated_sweeps_test.py` 12 more seeds (a long
check, `bash .ci/long_checks`);
`bash .ci/differential` 200 others.
"""

import configurations
import devices
import pytest

# The fast tier's fixed sample; 9 is a two-output model with a keras.io step
# of its own, whose per-output losses the eager first step once weighed.
# (The slow sweep's seed 7 adds layer losses computed from the batch, one
# through a Keras `Loss`.)
FAST_SEEDS = (0, 9)
# Seeds that draw a layer of state (`configurations.STATE_LAYERS`), each
# on a size that leaves a replica of 2 without examples or splits unevenly:
# 147 a position table under AdamW and Dropout, 353 a plain
# BatchNormalization under Adam, 211 BatchNormalization in a keras.io step
# of one's own, 107 a running mean assigned in `call()` (refused by name
# under several replicas with `batch_statistics="global"`).
STATE_SEEDS = (147, 353, 211, 107)


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("seed", FAST_SEEDS + STATE_SEEDS)
def test_a_generated_configuration_equals_keras(seed):
    config = configurations.draw(seed)
    tolerances = {
        "default": configurations.ONE_DEVICE_TOLERANCE,
        "mirrored": configurations.REPLICAS_TOLERANCE,
    }
    for name, tolerance in tolerances.items():
        passed, found = configurations.check(
            config, devices.get(name), tolerance=tolerance
        )
        assert passed, (
            f"{name}: {found}\n{configurations.describe(config)}\n"
            f"reproduce: python tests/support/configurations.py {seed}"
        )
