"""The tiers, by folder:

- `tests/unit/`: seconds each, no training;
- `tests/models/`: CTLModel trained in this process, against `keras.Model`;
- `tests/end_to_end/`: child processes, the CLI, long runs; marked `slow`
  here (the fast tier is `pytest -m "not slow"`).

`tests/support/` holds the shared cases, the child scripts and the device
helpers. They import as top-level modules, as in the child processes that
run them as scripts.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

import devices  # noqa: E402

# Logical CPU devices must exist before TensorFlow initializes its devices.
devices.configure_logical_cpus()


def pytest_collection_modifyitems(items):
    for item in items:
        if "end_to_end" in item.path.parts:
            item.add_marker(pytest.mark.slow)
