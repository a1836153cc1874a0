"""keras_ctl on a real Slurm cluster started on this machine
(`slurm_cluster.py`): `srun` tasks as the workers of
`MultiWorkerMirroredStrategy`, equal to one device in float64."""

import json

import children
import numpy as np
import pytest
import slurm_cluster

TOLERANCE = 1e-9


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster.running(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def child(config):
    return [children.PYTHON, f"{children.HERE}/cluster_child.py", json.dumps(config)]


def assert_one_device(got, reference):
    """Weights and every epoch's logs within 1e-9 of one device's."""
    for g, w in zip(got["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(g, w, atol=TOLERANCE, rtol=0)
    assert got["logs"].keys() == reference["logs"].keys()
    for epoch, logs in reference["logs"].items():
        assert got["logs"][epoch] == pytest.approx(logs, abs=TOLERANCE, rel=0)


def test_srun_tasks_train_as_one_device(cluster, tmp_path):
    """`srun -n 2 python train.py`: no TF_CONFIG, the step's two tasks are the
    workers (on ports Slurm reserved), a CTLModel and a GAN end with one
    device's weights and logs."""
    config = {"out": str(tmp_path), "models": ["ctl", "gan"], "strategy": "multiworker"}
    result = cluster.run(
        ["srun", "--ntasks=2", *child(config)], timeout=240, cwd=tmp_path
    )
    assert result.returncode == 0, children.output(result) + cluster.logs()
    workers = [json.loads((tmp_path / f"worker_{i}.json").read_text()) for i in (0, 1)]
    reference = workers[0]["reference"]
    for worker in workers:
        for name in ("ctl", "gan"):
            assert_one_device(worker[name], reference[name])
    assert workers[0]["ctl"]["batches"] == 15  # 3 epochs of 5 batches
