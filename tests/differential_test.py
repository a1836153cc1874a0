"""Generated configurations: CTLModel equals `keras.Model` on one device.

Each seed draws a configuration nobody here chose (`configurations.draw`):
model kind, loss and reduction, sample or class weights, metrics, optimizer
and its options, `steps_per_execution`, `jit_compile`, arrays or `tf.data`,
a dataset size that leaves uneven or empty replicas, validation data. In
float64, CTLModel on one device equals keras.Model to round-off and under
several replicas to 1e-9 (relative). A failure prints its configuration and
`python tests/configurations.py SEED` reproduces it. The long run (200
seeds on 2 and 3 replicas) is `bash .ci/differential`.
"""

import configurations
import pytest
import strategies

# The fast tier's fixed sample (about 30 s on 2 cores).
FAST_SEEDS = range(3)


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_a_generated_configuration_equals_keras(seed):
    config = configurations.draw(seed)
    for name in ("default", "mirrored"):
        passed, found = configurations.check(config, strategies.get(name))
        assert passed, (
            f"{name}: {found}\n{configurations.describe(config)}\n"
            f"reproduce: python tests/configurations.py {seed}"
        )
