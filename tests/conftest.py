"""The tiers, by folder:

- `tests/unit/`: seconds each, no training;
- `tests/models/`: CTLModel trained in this process, against `keras.Model`;
- `tests/end_to_end/`: child processes, the CLI, long runs; marked `slow`
  here (the fast tier is `pytest -m "not slow"`).

`tests/support/` holds the shared cases, the child scripts and the device
helpers. They import as top-level modules, as in the child processes that
run them as scripts.
"""

import gc
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test, its cyclic garbage collected and what outlives it
    (TensorFlow and Keras as imported, fixtures, caches) set aside from
    later collections (`gc.freeze`): a full collection then walks one
    test's objects, not the worker's million. Walking them all, seconds on
    a quiet machine, took 20 to 30 s a collection on a loaded one, and a
    test allocating much (parsing the package's source) sat through
    several."""
    yield
    gc.collect()
    gc.freeze()


def pytest_terminal_summary(terminalreporter):
    """Each tier's total test time and test count, so the suite's growth
    shows in every run's log (`--durations=25` lists the slowest tests)."""
    totals = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) is None:
                continue
            tier = _tier(report.nodeid)
            seconds, tests = totals.get(tier, (0.0, set()))
            tests.add(report.nodeid)
            totals[tier] = (seconds + report.duration, tests)
    if not totals:
        return
    terminalreporter.section("time by tier (test time, summed over workers)")
    for tier in sorted(totals):
        seconds, tests = totals[tier]
        terminalreporter.write_line(f"{tier}: {seconds:.0f} s, {len(tests)} tests")


def _tier(nodeid):
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]
