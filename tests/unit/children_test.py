"""The start of the tests' child processes (`children.py`): their
`sitecustomize` holds full garbage collections until TensorFlow or Keras
has imported, then freezes the heap and gives Python its thresholds back."""

import gc
import json
import os

import children

CHILD = """
import gc, json, sys
import sitecustomize
held = gc.get_threshold()
sitecustomize._WATCHED.add("fractions")  # a module this child has not imported
import fractions
print(json.dumps({
    "site": sitecustomize.__file__,
    "held": held,
    "frozen": gc.get_freeze_count(),
    "after": gc.get_threshold(),
}))
"""


def test_a_child_freezes_its_heap_once_the_watched_module_imports():
    result = children.run([children.PYTHON, "-c", CHILD], timeout=60)
    assert result.returncode == 0, children.output(result)
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["site"].startswith(children.CHILD_SITE)
    assert found["held"][2] >= 2**30  # no full collection before it
    assert found["frozen"] > 1000
    assert tuple(found["after"]) == gc.get_threshold()  # Python's own again


def test_quiet_env_puts_the_child_site_first_once():
    env = children.quiet_env({"PYTHONPATH": "elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [children.CHILD_SITE, "elsewhere"]
    assert children.quiet_env(env)["PYTHONPATH"] == env["PYTHONPATH"]
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "3"
