"""`compile(random_draws="as_one_device")`: seeded `Dropout`, noise and
augmentation layers, `keras.random` draws in a step of one's own, and a
GAN's latents and label noise equal one device on 2 and 3 replicas (the
last batch leaves a replica empty) and on 2 worker processes; each
replica's own draws (the default) do not (`random_draws.py`)."""

import json

import children
import devices
import keras
import pytest
import random_draws

TOLERANCE = {"float64": 1e-9, "float32": 1e-5}
CHILD_TIMEOUT_S = 600
# (replicas, dtype) of each child run: float64 tells logic from round-off;
# the GAN (float32 losses) runs in float32.
RUNS = ((3, "float64"), (2, "float32"))
NAMES = {
    "float64": random_draws.CASES,
    "float32": (*random_draws.CASES, "gan"),
}


@pytest.fixture(scope="module")
def replica_results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("random_draws")
    results = {}
    for replicas, dtype in RUNS:
        output = folder / f"{replicas}_{dtype}.json"
        command = [children.PYTHON, "random_draws_child.py", replicas, output, dtype]
        result = children.run(command, timeout=CHILD_TIMEOUT_S)
        assert result.returncode == 0, children.output(result)
        results[replicas, dtype] = json.loads(output.read_text())
    return results


@pytest.mark.parametrize(
    "replicas, dtype, case",
    [(r, d, case) for r, d in RUNS for case in NAMES[d]],
)
def test_draws_as_one_device_equal_one_device(replicas, dtype, case, replica_results):
    run = replica_results[replicas, dtype][case]
    difference = random_draws.largest_difference(run["as_one_device"], run["reference"])
    assert difference <= TOLERANCE[dtype]
    # The check can fail: each replica's own draws are another run.
    assert random_draws.largest_difference(run["per_replica"], run["reference"]) > 1e-3


def test_two_workers_draw_as_one_device(tmp_path):
    output = tmp_path / "workers.json"
    command = [children.PYTHON, "random_draws_child.py", "worker", output, "float32"]
    result = children.run(children.launched(2, command, timeout=500), timeout=550)
    assert result.returncode == 0, children.output(result)
    one_device = devices.get("default")
    for case in NAMES["float32"]:
        if case == "gan":
            continue  # its one-device run is `GAN`'s own, compared on replicas
        reference = random_draws.run(case, keras.Model, one_device)
        for index in (0, 1):
            got = json.loads(output.with_suffix(f".json.{index}").read_text())[case]
            assert random_draws.largest_difference(got, reference) <= 1e-5, case
