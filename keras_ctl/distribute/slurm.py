"""The cluster of a Slurm job step, read from the variables `srun` sets.

`srun -n N python train.py` starts N tasks, each told its rank
(`SLURM_PROCID`), the step's nodes (`SLURM_STEP_NODELIST`) and how many
tasks run on each (`SLURM_STEP_TASKS_PER_NODE`). Every task is a worker;
task `i` listens on its node at the `i`-th port of the node's tasks: the
ports Slurm reserved for the step (`SLURM_STEP_RESV_PORTS`, with
`MpiParams=ports=...` in `slurm.conf` or `srun --resv-ports`), else
`port_base`, `port_base + 1`, ...

TensorFlow's `SlurmClusterResolver` resolves this on GPU nodes where every
task gets GPUs of its own; it fails elsewhere: without `nvidia-smi` (CPU
nodes: `FileNotFoundError`), with no GPU or fewer GPUs than tasks on a node
(Slurm binding one GPU to each task included: `range() arg 3 must not be
zero`), with reserved ports that are not consecutive, and with node names
whose text order is not Slurm's (`node10` before `node2`: it gives tasks
the wrong addresses). There, keras_ctl resolves the same cluster itself.
"""

import os
import re
import shutil
import subprocess

import tensorflow as tf

# What `srun` sets in each task; a batch script or `salloc` shell has no step.
STEP_VARIABLES = (
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)

# TensorFlow's `SlurmClusterResolver` default.
DEFAULT_PORT_BASE = 8888


def in_step() -> bool:
    """Whether this process is a task of an `srun` step."""
    return "SLURM_STEP_ID" in os.environ


def rank() -> int:
    """This task's index among the step's tasks (its worker index)."""
    return int(_step()["SLURM_PROCID"])


def cluster_resolver(
    port_base: int = DEFAULT_PORT_BASE,
) -> tf.distribute.cluster_resolver.ClusterResolver:
    """A `tf.distribute.cluster_resolver.ClusterResolver` of the step's tasks,
    all workers, this task the `SLURM_PROCID`-th.

    TensorFlow's `SlurmClusterResolver` where it works (it also sets each
    task's `CUDA_VISIBLE_DEVICES`), else a `SimpleClusterResolver` of the
    same cluster that leaves the devices as Slurm set them.

    Raises:
        RuntimeError: naming the missing variable when the environment is
            not a whole step's, or when the tasks are not laid out on the
            nodes in blocks (`srun --distribution=block`, the default).
    """
    step = _step()
    hosts = _expand(step["SLURM_STEP_NODELIST"])
    counts = _tasks_per_node(step["SLURM_STEP_TASKS_PER_NODE"], len(hosts))
    ports = _ports(step, max(counts), port_base)
    # Under block distribution the ranks fill the nodes in Slurm's order.
    layout = [(host, local) for host, n in zip(hosts, counts) for local in range(n)]
    here = int(step["SLURM_PROCID"])
    _check_layout(step, layout, here)
    gpus = _visible_gpus(step)
    if _tensorflow_resolves(hosts, ports, gpus, max(counts)):
        resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=ports[0], gpus_per_node=gpus
        )
        resolver.cluster_spec()  # sets task_type, task_id and the devices
        return resolver
    addresses = [f"{host}:{ports[local]}" for host, local in layout]
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": addresses}),
        task_type="worker",
        task_id=here,
        rpc_layer="grpc",
        num_accelerators={"GPU": gpus},
    )


def _step():
    missing = [name for name in STEP_VARIABLES if name not in os.environ]
    if missing:
        found = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SLURM_")}
        raise RuntimeError(
            "Expected the variables `srun` sets in each task of a Slurm step; "
            f"missing: {', '.join(missing)}. Received: "
            f"{found or 'no SLURM_ variable'}. Start the script with `srun` "
            "(in an `sbatch` script or `salloc`), or describe the cluster in "
            "TF_CONFIG instead."
        )
    return os.environ


def _expand(text):
    """Slurm's lists: `node[1-2,10],gpu3` -> node1, node2, node10, gpu3 (in
    Slurm's order); `12000-12002,12005` -> 12000, 12001, 12002, 12005."""
    items = []
    for prefix, ranges, plain in re.findall(r"([^,\[]*)\[([^\]]+)\]|([^,]+)", text):
        if plain and not re.fullmatch(r"\d+-\d+", plain):
            items.append(plain)
            continue
        for part in (ranges or plain).split(","):
            first, _, last = part.partition("-")
            for number in range(int(first), int(last or first) + 1):
                items.append(f"{prefix}{str(number).zfill(len(first))}")
    return items


def _tasks_per_node(text, nodes):
    """`2(x3),1` -> [2, 2, 2, 1]."""
    counts = []
    for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", text):
        counts.extend([int(count)] * int(repeat or 1))
    if len(counts) != nodes:
        raise RuntimeError(
            f"Expected a task count for each of the {nodes} node(s) of "
            f"SLURM_STEP_NODELIST. Received: SLURM_STEP_TASKS_PER_NODE={text!r}."
        )
    return counts


def _ports(step, needed, port_base):
    """The ports of a node's tasks, in the order of their local index."""
    reserved = step.get("SLURM_STEP_RESV_PORTS")
    if not reserved:
        return list(range(port_base, port_base + needed))
    ports = [int(port) for port in _expand(reserved)]
    if len(ports) < needed:
        raise RuntimeError(
            f"Expected a reserved port for each of the {needed} task(s) of a "
            f"node. Received: SLURM_STEP_RESV_PORTS={reserved!r}. Reserve more "
            "(`srun --resv-ports`), or none, to use `port_base` and up."
        )
    return ports


def _check_layout(step, layout, here):
    # `srun -m cyclic` (or plane) deals the ranks out otherwise: a task would
    # listen where the others do not look for it.
    node, local = step.get("SLURMD_NODENAME"), step.get("SLURM_LOCALID")
    if here >= len(layout) or (
        node is not None and local is not None and layout[here] != (node, int(local))
    ):
        raise RuntimeError(
            "Expected the step's tasks laid out on its nodes in blocks (srun's "
            f"default). Received: SLURM_PROCID={here} on SLURMD_NODENAME={node} "
            f"as SLURM_LOCALID={local}, SLURM_STEP_NODELIST="
            f"{step['SLURM_STEP_NODELIST']}, SLURM_STEP_TASKS_PER_NODE="
            f"{step['SLURM_STEP_TASKS_PER_NODE']}. Start it with "
            "`srun --distribution=block`."
        )


def _visible_gpus(step):
    """GPUs this task sees: `CUDA_VISIBLE_DEVICES` as Slurm (or the user) set
    it, else what `nvidia-smi` lists, else none (a CPU node)."""
    visible = step.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([device for device in visible.split(",") if device.strip()])
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(
        ["nvidia-smi", "--list-gpus"], capture_output=True, text=True, check=False
    )
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


def _tensorflow_resolves(hosts, ports, gpus, tasks_per_node):
    """Where TensorFlow's resolver gives this cluster: GPUs for every task of
    a node, consecutive ports (it takes a base), and hosts already in sorted
    order (it sorts them, as text)."""
    base = ports[0]
    consecutive = ports[:tasks_per_node] == list(range(base, base + tasks_per_node))
    return gpus >= tasks_per_node and consecutive and sorted(hosts) == hosts
