"""Kubeflow's TFJob, as its training operator turns it into pods: each
pod's `TF_CONFIG`, written as the operator writes it (training-operator,
`pkg/controller.v1/tensorflow/tensorflow.go`, `genTFConfigJSONStr`):

- `cluster`: every replica type but `Evaluator`, in lower case, each pod
  at `<job>-<type>-<index>.<namespace>.svc:<port>` (the port of the
  container `tensorflow` named `tfjob-port`, else 2222);
- `task`: the pod's type and index; `environment`: `"cloud"`;
- keys in Go's order (the struct's fields; a map's keys sorted), compact.
"""

import copy
import json

import doc_pages
import yaml

DEFAULT_PORT = 2222


def docs_manifest():
    """The TFJob manifest of the multi-worker guide."""
    page = doc_pages.DOCS / "guides" / "multi-worker.md"
    [manifest] = [
        yaml.safe_load(code)
        for kind, code in doc_pages.blocks(page)
        if kind == "yaml" and "kind: TFJob" in code
    ]
    return manifest


def with_replicas(manifest, **replicas):
    """`manifest` with these replica types (`Worker=2`, `Chief=0` to drop
    one, a new type takes the first one's pod template)."""
    manifest = copy.deepcopy(manifest)
    specs = manifest["spec"]["tfReplicaSpecs"]
    template = next(iter(specs.values()))["template"]
    for kind, count in replicas.items():
        if count == 0:
            specs.pop(kind, None)
        else:
            spec = specs.setdefault(kind, {"template": copy.deepcopy(template)})
            spec["replicas"] = count
    return manifest


def with_command(manifest, kind, command):
    """`manifest` with the pods of `kind` running `command`."""
    manifest = copy.deepcopy(manifest)
    spec = manifest["spec"]["tfReplicaSpecs"][kind]
    _container(spec)["command"] = list(command)
    return manifest


def pods(manifest):
    """`(type, index, command)` of each pod, `type` in lower case."""
    for kind, spec in manifest["spec"]["tfReplicaSpecs"].items():
        for index in range(spec.get("replicas", 1)):
            yield kind.lower(), index, _container(spec)["command"]


def service_address(manifest, kind, index):
    """A pod's address as the operator names it (its headless service)."""
    meta = manifest["metadata"]
    host = f"{meta['name']}-{kind.lower()}-{index}.{meta.get('namespace', 'default')}"
    return f"{host}.svc:{port(manifest, kind)}"


def port(manifest, kind):
    spec = manifest["spec"]["tfReplicaSpecs"][kind]
    for entry in _container(spec).get("ports", ()):
        if entry.get("name") == "tfjob-port":
            return entry["containerPort"]
    return DEFAULT_PORT


def tf_configs(manifest, address=None):
    """`{(type, index): TF_CONFIG}` of every pod; `address(kind, index)`
    gives a pod's address (default: the operator's service names)."""
    address = address or (lambda kind, index: service_address(manifest, kind, index))
    specs = manifest["spec"]["tfReplicaSpecs"]
    cluster = {
        kind.lower(): [address(kind, i) for i in range(spec.get("replicas", 1))]
        for kind, spec in specs.items()
        if kind != "Evaluator"  # not part of the training cluster
    }
    return {
        (kind, index): json.dumps(
            {
                "cluster": dict(sorted(cluster.items())),
                "task": {"type": kind, "index": index},
                "environment": "cloud",
            },
            separators=(",", ":"),
        )
        for kind, index, _ in pods(manifest)
    }


def _container(spec):
    [container] = [
        c for c in spec["template"]["spec"]["containers"] if c["name"] == "tensorflow"
    ]
    return container
