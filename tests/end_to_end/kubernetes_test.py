"""keras_ctl under the `TF_CONFIG` Kubeflow's training operator gives the
pods of a TFJob: the multi-worker guide's manifest, turned into pods as
the operator does (`tfjob.py`), each pod a process on 127.0.0.1, equal to
one device in float64 with a replica left empty by the last batch."""

import json

import children
import numpy as np
import pytest
import tfjob

from keras_ctl.launch import free_ports

TOLERANCE = 1e-9
TIMEOUT_S = 240
SERVE = ["python", "-m", "keras_ctl.launch", "--serve"]


def manifests():
    """The three shapes of a TFJob, from the guide's manifest."""
    guide = tfjob.docs_manifest()
    parameter_servers = tfjob.with_replicas(guide, PS=1, Evaluator=1)
    parameter_servers = tfjob.with_command(parameter_servers, "PS", SERVE)
    parameter_servers = tfjob.with_command(parameter_servers, "Worker", SERVE)
    parameter_servers = tfjob.with_command(
        parameter_servers, "Evaluator", ["python", "evaluate.py"]
    )
    return {
        "chief_and_worker": guide,
        "workers_only": tfjob.with_replicas(guide, Chief=0, Worker=2),
        "parameter_servers_and_evaluator": parameter_servers,
    }


def test_the_operator_names_each_pod_by_its_service():
    """What the operator writes for the guide's manifest, before the test
    puts the pods on 127.0.0.1."""
    configs = tfjob.tf_configs(tfjob.docs_manifest())
    assert configs[("worker", 0)] == (
        '{"cluster":{"chief":["train-chief-0.default.svc:2222"],'
        '"worker":["train-worker-0.default.svc:2222"]},'
        '"task":{"type":"worker","index":0},"environment":"cloud"}'
    )


@pytest.mark.parametrize("shape", list(manifests()))
def test_a_tfjobs_pods_train_as_one_device(shape, tmp_path):
    manifest = manifests()[shape]
    parameter_servers = shape.startswith("parameter_servers")
    config = {
        "out": str(tmp_path),
        "models": ["ctl"],
        "strategy": "parameter_server" if parameter_servers else "multiworker",
        "save": parameter_servers,
    }
    for script in ("train.py", "evaluate.py"):
        (tmp_path / script).write_text(
            children.script_of("cluster_child.py", json.dumps(config))
        )
    pods = list(tfjob.pods(manifest))
    ports = iter(free_ports(len(pods)))
    addresses = {(kind.lower(), i): f"127.0.0.1:{next(ports)}" for kind, i, _ in pods}
    configs = tfjob.tf_configs(manifest, lambda kind, i: addresses[(kind.lower(), i)])
    running = {}
    try:
        for kind, index, command in pods:
            env = dict(children.quiet_env(), TF_CONFIG=configs[(kind, index)])
            command = [children.PYTHON if c == "python" else c for c in command]
            running[(kind, index)] = children.start(command, env=env, cwd=tmp_path)
        for pod, process in running.items():
            if process.args[1:] != SERVE[1:]:  # the servers run until stopped
                result = children.finish(process, TIMEOUT_S)
                assert result.returncode == 0, (pod, children.output(result))
    finally:
        for process in running.values():
            children.stop(process)
    trainers = [f"{kind}_{i}" for kind, i, c in pods if c[-1] == "train.py"]
    results = {
        name: json.loads((tmp_path / f"{name}.json").read_text()) for name in trainers
    }
    chief = "chief_0" if "chief_0" in results else "worker_0"
    reference = results[chief]["reference"]["ctl"]
    largest = 0.0
    for result in results.values():
        for got, want in zip(
            result["ctl"]["weights"], reference["weights"], strict=True
        ):
            np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)
            largest = max(largest, float(np.max(np.abs(np.subtract(got, want)))))
        for epoch, logs in reference["logs"].items():
            assert result["ctl"]["logs"][epoch] == pytest.approx(logs, abs=TOLERANCE)
    if parameter_servers:
        evaluated = json.loads((tmp_path / "evaluator_0.json").read_text())
        np.testing.assert_allclose(
            evaluated["evaluate"], reference["evaluate"], atol=TOLERANCE, rtol=0
        )
    print(f"{shape}: {sorted(results)} {largest:.1e} off one device")
