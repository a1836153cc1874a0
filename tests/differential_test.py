"""Generated configurations: CTLModel equals `keras.Model` on one device.

Each seed draws a configuration nobody here chose (`configurations.draw`):
model kind, loss and reduction, sample or class weights, metrics, optimizer
and its options, `steps_per_execution`, `jit_compile`, arrays or `tf.data`,
a dataset size that leaves uneven or empty replicas, validation data. In
float64, CTLModel on one device equals keras.Model to round-off and under
several replicas to 1e-9 (relative). A failure prints its configuration and
`python tests/configurations.py SEED` reproduces it.
"""

import json

import configurations
import pytest
import strategies
from children import PYTHON
from children import output
from children import run

# The fast tier's fixed sample (under a minute on 2 cores).
FAST_SEEDS = range(6)


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_a_generated_configuration_equals_keras(seed):
    config = configurations.draw(seed)
    for name in ("default", "mirrored"):
        passed, found = configurations.check(config, strategies.get(name))
        assert passed, (
            f"{name}: {found}\n{configurations.describe(config)}\n"
            f"reproduce: python tests/configurations.py {seed}"
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "replicas, seeds", [(2, "100:200"), (3, "200:300")], ids=["2_replicas", "3"]
)
def test_two_hundred_generated_configurations_equal_keras(replicas, seeds):
    result = run(
        [PYTHON, "configurations.py", "--replicas", replicas, "--seeds", seeds],
        timeout=1500,
    )
    assert result.returncode == 0, output(result)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line]
    counts = lines[-1]
    assert counts["checked"] == 200, output(result)  # 100 seeds, 2 places
    reproduce = f"python tests/configurations.py --replicas {replicas}"
    assert counts["failed"] == 0, "\n".join(
        f"seed {item['seed']} ({item['where']}): {item['found']}\n"
        f"  reproduce: {reproduce} {item['seed']}"
        for item in lines[:-1]
    )
