"""More seeds of the generated coupled losses than the fast tier runs
(tests/models/global_batch_test.py): their gradients on 2 replicas are one
device's."""

import coupled_losses
import devices
import pytest


@pytest.mark.parametrize("seed", range(4, 24))
def test_generated_coupled_losses_have_one_devices_gradients(seed):
    coupled_losses.check(seed, devices.get("mirrored"))
