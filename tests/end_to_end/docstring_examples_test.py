"""The examples of the public docstrings run, so none goes stale: one test
per public object and user method, named after it
(`docstring_examples.py` says how each runs)."""

import docstring_examples
import pytest

EXAMPLES = docstring_examples.examples()
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The processes of every example, started together."""
    folder = tmp_path_factory.mktemp("docstring_examples")
    started = docstring_examples.Jobs(EXAMPLES, folder, timeout=TIMEOUT_S)
    yield started
    started.stop()


def test_every_public_object_and_user_method_has_an_example_to_run():
    assert len(EXAMPLES) > 40
    assert [e.name for e in EXAMPLES if not e.python] == []


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_docstring_example_runs(example, jobs):
    jobs.check(example)
