"""12 generated configurations equal `keras.Model` on one device (see
`tests/models/differential_test.py`): 6 seeds on one device and 2
replicas, 6 on 3 replicas, in two child processes: a long check, run by
`bash .ci/long_checks` (`bash .ci/differential`
runs 200 others before an issue is resolved). Three in four configurations
override one of Keras's extension points, and those with a step of one's
own run their first step eagerly: about twice the time of a plain one.
"""

import json

import children
import pytest

# (replicas, seeds, also on one device).
SWEEPS = ((2, "3:9", True), (3, "103:109", False))
SWEEP_TIMEOUT_S = 1800


@pytest.mark.long
def test_generated_configurations_equal_keras():
    running = []
    for replicas, seeds, one_device in SWEEPS:
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
            f"{f['where']}: {f['found']}\nreproduce: python "
            f"tests/support/configurations.py {f['seed']}"
            for f in failures
        )
        checked += lines[-1]["checked"]
    # 6 seeds on one device and 2 replicas, 6 on 3 replicas.
    assert checked == 18
