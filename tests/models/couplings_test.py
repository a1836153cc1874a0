"""Generated couplings a first batch does not show (`tests/support/
couplings.py`), on 2 replicas: each ends equal to `keras.Model` on one
device, or stopped by name no earlier than its coupling starts.
`.ci/differential` runs 100 more seeds on 2 replicas and 100 on 3."""

import couplings
import devices
import pytest


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("seed", range(8))
def test_a_coupling_ends_exact_or_stopped_by_name(seed):
    assert couplings.check(seed, devices.get("mirrored")) is None
