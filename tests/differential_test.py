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
from children import finish
from children import output
from children import start

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


SLOW_RUNS = {2: "100:200", 3: "200:300"}  # replicas: seeds


@pytest.mark.slow
def test_two_hundred_generated_configurations_equal_keras():
    # One child per replica count (one device set per process), both at
    # once: one per core.
    started = {
        replicas: start(
            [PYTHON, "configurations.py", "--replicas", replicas, "--seeds", seeds]
        )
        for replicas, seeds in SLOW_RUNS.items()
    }
    for replicas, process in started.items():
        result = finish(process, timeout=1800)
        assert result.returncode == 0, output(result)
        lines = [json.loads(line) for line in result.stdout.splitlines() if line]
        assert lines[-1]["checked"] == 200, output(result)  # 100 seeds, 2 places
        reproduce = f"python tests/configurations.py --replicas {replicas}"
        assert lines[-1]["failed"] == 0, "\n".join(
            f"seed {item['seed']} ({item['where']}): {item['found']}\n"
            f"  reproduce: {reproduce} {item['seed']}"
            for item in lines[:-1]
        )
