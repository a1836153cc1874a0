"""Step outputs, the step plan, the resume plan and the version check."""

import devices
import keras
import pytest
import tensorflow as tf
from packaging.specifiers import SpecifierSet

import keras_ctl
from keras_ctl import _compat
from keras_ctl._engine.plan import StepPlan
from keras_ctl._engine.resume import ResumePlan
from keras_ctl._keras.iterators import DeferredDataset
from keras_ctl._keras.iterators import opened
from keras_ctl.outputs import all_reduce_logs


def reduced(outputs_fn, metrics=()):
    strategy = devices.get("mirrored")

    @tf.function
    def run():
        logs = strategy.run(lambda: all_reduce_logs(outputs_fn(), metrics))
        return tf.nest.map_structure(
            lambda value: tf.stack(strategy.experimental_local_results(value)), logs
        )

    return tf.nest.map_structure(lambda t: t.numpy(), run())


def first(per_replica):
    """The first replica's logs, after checking every replica has the same."""

    def check(values):
        assert (values[0] == values[1]).all()
        return values[0].tolist()

    return tf.nest.map_structure(check, per_replica)


def replica_id():
    return tf.cast(
        tf.distribute.get_replica_context().replica_id_in_sync_group, "float32"
    )


def test_every_output_type_reduces_as_documented():
    def step():
        r = replica_id()  # 0 and 1
        return {
            "sum": keras_ctl.ReplicaSum(r + 1.0),  # 1 + 2
            "example_mean": keras_ctl.ExampleMean(r * 4.0, r + 1.0),  # 4 / 3
            "synchronized": keras_ctl.Synchronized(r * 0.0 + 7.0),
            "untyped": r * 2.0,  # mean of 0 and 2
            "nested": [keras_ctl.ReplicaSum(r), (keras_ctl.ReplicaSum(r * 0 + 1.0),)],
            "vector": keras_ctl.ReplicaSum(tf.stack([r, 2 * r])),
        }

    logs = first(reduced(step))
    assert logs["example_mean"] == pytest.approx(4.0 / 3.0)
    assert logs["synchronized"] == 7.0
    assert logs["untyped"] == 1.0
    assert logs["nested"] == [1.0, (2.0,)]
    assert logs["vector"] == [1.0, 2.0]


def test_example_mean_of_no_examples_is_zero():
    logs = first(
        reduced(lambda: {"m": keras_ctl.ExampleMean(replica_id(), replica_id() * 0)})
    )
    assert logs["m"] == 0.0


def test_untyped_values_named_like_metrics_are_read_exactly():
    with devices.get("mirrored").scope():
        accuracy = keras.metrics.Mean(name="accuracy")

    def step():
        r = replica_id()
        # Replica 0 sees 3 examples of value 1, replica 1 one example of 5.
        accuracy.update_state(tf.fill([tf.cast(3 - 2 * r, "int32")], 1.0 + 4.0 * r))
        return {
            "accuracy": accuracy.result(),  # a per-replica mean: 1 and 5
            "other": r,
            "typed": keras_ctl.ReplicaSum(r * 0.0 + 1.0),
        }

    logs = first(reduced(step, [accuracy]))
    # One device: (1 + 1 + 1 + 5) / 4, not the mean of the replicas' means.
    assert logs == {"accuracy": 2.0, "other": 0.5, "typed": 2.0}


@pytest.mark.parametrize(
    "options, message",
    [
        ({"steps_per_execution": 0}, "Received: steps_per_execution=0"),
        ({"xla": "always"}, "Received: xla='always'"),
        ({"run_eagerly": True, "xla": "whole_step"}, "run_eagerly=True"),
    ],
)
def test_step_plan_rejects_invalid_combinations(options, message):
    with pytest.raises(ValueError, match=message):
        StepPlan(**options)


@pytest.mark.parametrize(
    "jit, eager, replicas, default_loss, xla",
    [
        (True, False, 1, False, "whole_step"),
        (True, False, 2, True, "per_replica_pass"),
        (True, False, 2, False, "off"),
        (True, True, 2, True, "off"),
        (False, False, 2, True, "off"),
    ],
)
def test_step_plan_decides_xla_once(jit, eager, replicas, default_loss, xla):
    class Model:
        jit_compile, run_eagerly, steps_per_execution = jit, eager, 4

        class distribute_strategy:  # noqa: N801 - stands for a strategy
            num_replicas_in_sync = replicas

    plan = StepPlan.for_model(Model, default_loss)
    assert (plan.xla, plan.steps_per_execution, plan.run_eagerly) == (xla, 4, eager)


def test_resume_plan_skips_trained_batches_then_ends_the_epoch():
    iterator = iter(range(10))
    plan = ResumePlan(batches_done=3, steps_per_epoch=5)
    plan.before_call(iterator, steps_per_call=1)
    assert next(iterator) == 3  # batches 0-2 were skipped
    plan.before_call(iterator, steps_per_call=1)
    assert not plan.finished
    with pytest.raises(StopIteration):
        plan.before_call(iterator, steps_per_call=1)
    assert plan.finished


def test_resume_plan_without_a_known_epoch_length_lets_the_data_end_it():
    iterator = iter(range(10))
    plan = ResumePlan(batches_done=2, steps_per_epoch=None)
    plan.before_call(iterator, steps_per_call=1)
    assert plan.finished and next(iterator) == 2


def test_versions_outside_the_range_fail_clearly(monkeypatch):
    monkeypatch.setattr(
        _compat, "supported_ranges", lambda: {"keras": SpecifierSet(">=3.12,<3.16")}
    )
    monkeypatch.setattr(_compat, "installed_version", lambda name: _version("3.16.0"))
    with pytest.raises(ImportError, match=r"keras<3.16,>=3.12. Received: keras 3.16.0"):
        _compat.check_versions()
    monkeypatch.setattr(_compat, "installed_version", lambda name: _version("3.15.1"))
    _compat.check_versions()


def test_declared_ranges_hold_the_installed_versions():
    ranges = _compat.supported_ranges()
    assert set(ranges) == {"keras", "tensorflow"}
    for name, specifier in ranges.items():
        assert _compat.installed_version(name).base_version in specifier


def _version(text):
    from packaging.version import Version

    return Version(text)


def test_write_path_sends_other_workers_to_a_sibling(monkeypatch):
    assert keras_ctl.strategies.write_path("out/model.keras") == "out/model.keras"
    monkeypatch.setenv(
        "TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"index": 1}}'
    )
    assert keras_ctl.strategies.task_index() == 1
    monkeypatch.setattr(keras_ctl.strategies, "is_chief", lambda strategy=None: False)
    assert keras_ctl.strategies.write_path("out/model.keras") == (
        "out/model_workertemp_1.keras"
    )
    assert keras_ctl.strategies.write_path("out/backup/") == "out/backup_workertemp_1"


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_positive_int_arguments_name_the_value(value):
    with pytest.raises(ValueError, match=rf"Received: replicas={value!r}"):
        keras_ctl.strategies.local_mirrored_strategy(value)


def test_a_deferred_iterator_opens_on_first_read():
    """Keras opens the next epoch's distributed iterator in advance (about
    0.5 s at 8 replicas); deferred, it opens only when a step reads it."""
    strategy = devices.get("mirrored")
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.range(8).batch(4)
    )
    iterator = iter(DeferredDataset(dataset))
    assert iterator._iterator is None
    batches = [strategy.experimental_local_results(b) for b in iterator]
    assert [[t.numpy().tolist() for t in b] for b in batches] == [
        [[0, 1], [2, 3]],
        [[4, 5], [6, 7]],
    ]
    assert isinstance(opened(iterator), tf.distribute.DistributedIterator)


def test_engine_state_lives_beside_its_model_as_long_as_it():
    import gc
    import weakref

    from keras_ctl._engine import state

    inputs = keras.Input((2,))
    model = keras_ctl.CTLModel(inputs, keras.layers.Dense(1)(inputs))
    plain = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    kept = state.attach(model)
    kept.predicted_batches = 3
    assert state.of(model) is kept and state.kept_for(model)
    # Any other model gets a new empty state, kept nowhere.
    assert state.of(plain) is not state.of(plain) and not state.kept_for(plain)
    assert state.of(plain).predicted_batches == 0
    gone = weakref.ref(kept)
    del model, kept
    gc.collect()
    assert gone() is None


def test_not_converted_leaves_a_function_to_python():
    from keras_ctl._engine.autograph import not_converted

    def magnitude(x):
        if x > 0:  # a Python `if` on a tensor: AutoGraph makes it a `tf.cond`
            return x
        return -x

    converted = tf.function(magnitude)
    assert float(converted(tf.constant(-2.0))) == 2.0
    left_as_written = tf.function(not_converted(magnitude))
    with pytest.raises(TypeError, match="tf.Tensor"):
        left_as_written(tf.constant(-2.0))
