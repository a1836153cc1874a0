"""The cluster of a Slurm step, read from the variables `srun` sets: the
same cluster TensorFlow's `SlurmClusterResolver` gives where it works, and
keras_ctl's own where it fails (CPU nodes, node names it sorts wrongly)."""

import os

import pytest
import tensorflow as tf

from keras_ctl.distribute import slurm

SlurmClusterResolver = tf.distribute.cluster_resolver.SlurmClusterResolver


def step(monkeypatch, procid, nodelist, tasks_per_node, node, local, **more):
    """This process as task `procid` of an `srun` step (as `srun` sets it)."""
    for name in list(os.environ):
        if name.startswith("SLURM") or name == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name)
    variables = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_STEP_NUM_TASKS": str(more.pop("tasks", 2)),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURMD_NODENAME": node,
        "SLURM_LOCALID": str(local),
        **more,
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def test_a_cpu_node_gets_the_cluster_tensorflow_cannot_resolve(monkeypatch):
    step(
        monkeypatch,
        1,
        "localhost",
        "2",
        "localhost",
        1,
        SLURM_STEP_RESV_PORTS="16901-16903",
    )
    with pytest.raises(FileNotFoundError):  # it runs nvidia-smi
        SlurmClusterResolver()
    with pytest.raises(ValueError, match="range\\(\\) arg 3 must not be zero"):
        SlurmClusterResolver(gpus_per_node=0).cluster_spec()
    resolver = slurm.cluster_resolver()
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["localhost:16901", "localhost:16902"]  # Slurm's reserved ports
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.num_accelerators() == {"GPU": 0}
    assert slurm.in_step() and slurm.rank() == 1


def test_gpu_nodes_use_tensorflows_resolver_and_its_devices(monkeypatch):
    step(
        monkeypatch,
        3,
        "gpu[1-2]",
        "2(x2)",
        "gpu2",
        1,
        CUDA_VISIBLE_DEVICES="0,1",
        tasks=4,
    )
    resolver = slurm.cluster_resolver(port_base=12000)
    assert isinstance(resolver, SlurmClusterResolver)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["gpu1:12000", "gpu1:12001", "gpu2:12000", "gpu2:12001"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 3)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"  # its GPU of the node's two


def test_nodes_keep_slurms_order_where_tensorflow_sorts_them_as_text(monkeypatch):
    step(
        monkeypatch,
        1,
        "node[1-2,10]",
        "1(x3)",
        "node2",
        0,
        CUDA_VISIBLE_DEVICES="0",
        tasks=3,
    )
    # TensorFlow's resolver gives task 1 (on node2) the address of node10.
    tensorflows = SlurmClusterResolver(gpus_per_node=1).cluster_spec().as_dict()
    assert tensorflows["worker"][1] == "node10:8888"
    resolver = slurm.cluster_resolver()
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["node1:8888", "node2:8888", "node10:8888"]
    }
    assert resolver.task_id == 1


def test_a_partial_environment_names_the_missing_variable(monkeypatch):
    step(monkeypatch, 0, "localhost", "2", "localhost", 0)
    monkeypatch.delenv("SLURM_STEP_NODELIST")
    with pytest.raises(RuntimeError, match="missing: SLURM_STEP_NODELIST. Received: "):
        slurm.cluster_resolver()
    monkeypatch.delenv("SLURM_STEP_ID")
    assert not slurm.in_step()


def test_tasks_dealt_out_cyclically_are_refused_by_name(monkeypatch):
    # srun -m cyclic: task 1 runs on node2, where blocks would put task 2.
    step(monkeypatch, 1, "node[1-2]", "2(x2)", "node2", 0, tasks=4)
    with pytest.raises(RuntimeError, match="srun --distribution=block"):
        slurm.cluster_resolver()
