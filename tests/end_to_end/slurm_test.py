"""keras_ctl on a real Slurm cluster started on this machine
(`slurm_cluster.py`): `srun` tasks as the workers of
`MultiWorkerMirroredStrategy`, equal to one device in float64."""

import json
import os
import time

import children
import doc_pages
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
    """Weights and every epoch's logs within 1e-9 of one device's; returns
    the largest difference."""
    largest = 0.0
    for g, w in zip(got["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(g, w, atol=TOLERANCE, rtol=0)
        largest = max(largest, float(np.max(np.abs(np.subtract(g, w)))))
    assert got["logs"].keys() == reference["logs"].keys()
    for epoch, logs in reference["logs"].items():
        assert got["logs"][epoch] == pytest.approx(logs, abs=TOLERANCE, rel=0)
        for key, value in logs.items():
            largest = max(largest, abs(got["logs"][epoch][key] - value))
    return largest


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
    assert "TF_CONFIG" not in cluster.env
    for worker in workers:  # keras_ctl's resolution: a CPU node
        assert worker["resolver"] == "SimpleClusterResolver"
        addresses = worker["cluster"]["worker"]
        assert [a.split(":")[0] for a in addresses] == ["localhost", "localhost"]
        assert all(int(a.split(":")[1]) in cluster.step_ports for a in addresses)
    reference = workers[0]["reference"]
    differences = [
        assert_one_device(worker[name], reference[name])
        for worker in workers
        for name in ("ctl", "gan")
    ]
    assert workers[0]["ctl"]["batches"] == 15  # 3 epochs of 5 batches
    print(f"srun: {max(differences):.1e} off one device")


# A job of the docs' batch script, 3 epochs of 5 batches: its tasks wait
# for SIGTERM after batch 3 of the first run and after batch 8 (the third
# of epoch 2) of the second; each time the workers stop after the next
# step: 4 batches trained, then 5, and the last run trains the 6 left.
WAIT_AT = [[0, 2], [1, 2]]
DONE = (4, 9)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def docs_batch_script():
    """The batch script of the multi-worker guide, as written there."""
    page = doc_pages.DOCS / "guides" / "multi-worker.md"
    scripts = [code for kind, code in doc_pages.blocks(page) if "#SBATCH" in code]
    assert len(scripts) == 1, scripts
    return scripts[0]


def batch_job(folder):
    """A folder with the docs' `train.sh` and a `train.py` that runs
    `cluster_child.py` (a CTLModel, backed up in `folder/backup`)."""
    config = {
        "out": str(folder),
        "models": ["ctl"],
        "strategy": "multiworker",
        "backup": str(folder / "backup"),
        "wait_at": WAIT_AT,
    }
    (folder / "train.sh").write_text(docs_batch_script())
    script = children.script_of("cluster_child.py", json.dumps(config))
    (folder / "train.py").write_text(script)


def submit(cluster, folder, *options):
    return cluster.submit(
        folder / "train.sh", f"--output={folder}/job.out", *options, cwd=folder
    )


def wait_until_waiting(cluster, folder, job, point):
    deadline = time.monotonic() + 120
    while not (folder / f"waiting_{point}").exists():
        state = cluster.job(job)["JobState"]
        assert state in ("PENDING", "RUNNING") and time.monotonic() < deadline, (
            f"job {job} {state} before it waited for a signal:\n"
            + (folder / "job.out").read_text()[-3000:]
        )
        time.sleep(0.1)


def assert_saved_within_grace(folder, point):
    """The chief's backup, written after the signal, within the grace time,
    at the step where the workers stopped together; returns the seconds."""
    signalled = float((folder / f"signalled_{point}_worker_0").read_text())
    saved = os.path.getmtime(folder / "backup" / "latest.weights.h5")
    assert 0 < saved - signalled < slurm_cluster.GRACE_TIME
    position = json.loads((folder / "backup" / "training_metadata.json").read_text())
    assert position["epoch"] * 5 + position["batches_done"] == DONE[point]
    assert position["replicas"] == 2
    return saved - signalled


def requeued(cluster, job, times):
    """Waits until Slurm holds `job` pending, requeued `times` times (or
    more: the script and a preemption may both requeue it)."""
    cluster.wait_for(job, ("PENDING",), timeout=60, restarts=times)


def test_the_docs_batch_script_saves_on_notice_and_resumes_when_requeued(
    cluster, tmp_path
):
    """The guide's batch script on 2 tasks: `scancel --signal=TERM`, then a
    preemption by a job of the `urgent` partition (Slurm sends the script's
    `--signal=TERM@60` warning at once and gives it the partition's grace
    time); each time both tasks save at the same step and exit 42, the job
    is requeued (by the script, or by Slurm) and resumes. Submitted again
    with `--ntasks=1`, the last run resumes the 2 workers' backup on one
    worker and ends with one device's weights and logs."""
    batch_job(tmp_path)
    job = submit(cluster, tmp_path)
    wait_until_waiting(cluster, tmp_path, job, 0)
    cancel = cluster.run(["scancel", "--signal=TERM", job])
    assert cancel.returncode == 0, children.output(cancel)
    requeued(cluster, job, 1)
    seconds = [assert_saved_within_grace(tmp_path, 0)]
    # Slurm starts a requeued job after 2 minutes; here at once, but in a
    # later second than the requeue, which revoked the credentials of the
    # run before it (a job started in that second is killed: "Job
    # credential revoked").
    time.sleep(2)
    cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])

    wait_until_waiting(cluster, tmp_path, job, 1)
    urgent = cluster.run(
        ["sbatch", "--parsable", "--partition=urgent", "--ntasks=2", "--wrap=true"]
    )
    assert urgent.returncode == 0, children.output(urgent)
    requeued(cluster, job, 2)
    seconds.append(assert_saved_within_grace(tmp_path, 1))

    # Slurm keeps a requeued job's task count: the same script, on one task.
    cluster.run(["scancel", job])
    again = submit(cluster, tmp_path, "--ntasks=1")
    fields = cluster.wait_for(again, ENDED, timeout=120)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), (
        tmp_path / "job.out"
    ).read_text()[-3000:]
    result = json.loads((tmp_path / "worker_0.json").read_text())
    assert result["ctl"]["batches"] == 15 - DONE[1]
    logs = json.loads((tmp_path / "logs_ctl_worker_0.json").read_text())
    got = {**result["ctl"], "logs": logs}  # the epochs of the three runs
    difference = assert_one_device(got, result["reference"]["ctl"])
    print(f"requeued: saved {seconds} s after SIGTERM; {difference:.1e} off")
