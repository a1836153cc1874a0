"""Generated steps of one's own (`generated_steps`: Keras `Loss` objects,
`self.compute_loss`, raw means, layer losses, sample weights, trackers,
metrics under other keys, one or two tapes and optimizers, `tf.function`)
equal `keras.Model` on one device in float64 on 2 replicas, and on 3 in a
child process, whatever their spelling (inline, a helper module, alias
imports, a decorator, a free function, a partial or lambda, a mixin, a
library's base class, a step set on the instance) and their data's shapes
(uneven, static, a replica without examples). A step written in replica
shares (the global-batch guide's recipe) equals one device when declared
with `keras_ctl.written_in_shares`, in the spelling's own way, and is
refused by `fit` when not. `bash .ci/differential` runs 200 more (100 on
2 replicas, 100 on 3)."""

import json

import children
import devices
import generated_steps
import pytest

# Chosen so that, with the 3-replica child's seeds, every spelling, reading
# and shape runs, and every spelling declares a step in shares:
#   2 alias_import, shares_undeclared, empty_replica
#   3 instance, one_device, dynamic
#   9 alias_import, one_device (logs the replica count), empty_replica
#  10 instance, shares_declared, dynamic (clipnorm)
#  15 mixin, one_device (logs the replica count), static
#  36 inline, one_device, empty_replica
#  41 free_function, shares_declared, static
#  85 decorator, shares_declared, empty_replica
# 154 helper_module, shares_declared, empty_replica
SEEDS = (2, 3, 9, 10, 15, 36, 41, 85, 154)
# 91 partial_or_lambda, shares_declared, dynamic; 92 library_base,
# one_device, empty_replica; 93 inline, shares_declared, static; 94
# instance, shares_undeclared, dynamic; 95 library_base, shares_declared,
# empty_replica; 96 free_function, one_device, static; 97 alias_import,
# shares_declared, empty_replica; 98 mixin, shares_declared, dynamic.
THREE_REPLICA_SEEDS = "91:99"


def test_the_seeds_cover_every_spelling_reading_and_shape():
    first, last = (int(part) for part in THREE_REPLICA_SEEDS.split(":"))
    drawn = [generated_steps.draw(seed) for seed in (*SEEDS, *range(first, last))]
    for key, values in (
        ("spelling", generated_steps.SPELLINGS),
        ("reading", generated_steps.READINGS),
        ("shapes", generated_steps.SHAPES),
    ):
        assert {config[key] for config in drawn} == set(values), key
    declared = {c["spelling"] for c in drawn if c["reading"] == "shares_declared"}
    assert declared == set(generated_steps.SPELLINGS)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_generated_step_equals_one_device_on_2_replicas(seed):
    difference = generated_steps.check(seed, devices.get("mirrored"))
    assert difference <= generated_steps.TOLERANCE, generated_steps.draw(seed)


@pytest.mark.slow
def test_generated_steps_equal_one_device_on_3_replicas():
    command = [
        children.PYTHON,
        "generated_steps.py",
        "--replicas",
        3,
        "--seeds",
        THREE_REPLICA_SEEDS,
    ]
    result = children.run(command, timeout=1200)
    assert result.returncode == 0, children.output(result)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line]
    assert [line for line in lines if "seed" in line] == []
    assert lines[-1]["checked"] == 8
