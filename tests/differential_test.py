"""Generated configurations: CTLModel equals `keras.Model` on one device.

Each seed draws a configuration nobody here chose (`configurations.draw`):
model kind, loss and reduction, sample or class weights, metrics, optimizer
and its options, `steps_per_execution`, `jit_compile`, arrays or `tf.data`,
a dataset size that leaves uneven or empty replicas, validation data. In
float64, CTLModel on one device equals keras.Model to 1e-12 and under
several replicas to 1e-9 (relative). A failure prints its configuration and
`python tests/configurations.py SEED` reproduces it. The fast tier checks a
fixed sample; the slow tier 200 more seeds (100 on 2 replicas and one
device, 100 on 3 replicas, in two child processes); `bash .ci/differential`
runs 200 others.
"""

import json

import children
import configurations
import devices
import pytest

# The fast tier's fixed sample (about 30 s on 2 cores).
FAST_SEEDS = range(3)
# The slow tier's: (replicas, seeds, also on one device).
SLOW_SWEEPS = ((2, "3:103", True), (3, "103:203", False))
SWEEP_TIMEOUT_S = 1800


@pytest.mark.parametrize("seed", FAST_SEEDS)
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
            f"reproduce: python tests/configurations.py {seed}"
        )


@pytest.mark.slow
def test_200_generated_configurations_equal_keras():
    running = []
    for replicas, seeds, one_device in SLOW_SWEEPS:
        command = [
            children.PYTHON,
            "configurations.py",
            "--replicas",
            replicas,
            "--seeds",
            seeds,
        ]
        running.append(
            children.start(command + ([] if one_device else ["--no-one-device"]))
        )
    try:
        finished = [children.finish(p, SWEEP_TIMEOUT_S) for p in running]
    finally:
        for process in running:
            children.stop(process)
    checked = 0
    for result in finished:
        assert result.returncode == 0, children.output(result)
        lines = [json.loads(line) for line in result.stdout.splitlines() if line]
        failures = [line for line in lines if "seed" in line]
        assert not failures, "\n".join(
            f"{f['where']}: {f['found']}\nreproduce: python tests/configurations.py "
            f"{f['seed']}"
            for f in failures
        )
        checked += lines[-1]["checked"]
    # 100 seeds on one device and 2 replicas, 100 on 3 replicas.
    assert checked == 300
