"""Steps that cannot run as one device's under 2 replicas stop with a
`ValueError` that names the cause and the fix, not TensorFlow's bare
`InvalidArgumentError`; each in a child process, as a step that fails
aborts the process's collectives (`named_errors`)."""

import named_errors


def test_a_queue_filled_from_a_replicas_own_rows_is_named():
    """A queue of 6 rows filled from twice the replica's rows. Measured on
    the first batch, in slices of 2 of each replica's 4 rows (within a
    replica's memory), the step assigns 4 rows: Keras's error, noted as
    the measurement's, before anything trains. Unmeasured, the last batch,
    1 example (2 rows on replica 0, none on replica 1), is named as the
    step runs (replica 0's nodes have no prefix)."""
    message = named_errors.in_child("queue")
    error, note = message.split("\nkeras_ctl: ")
    assert "variable.shape=(6, 3), Received: value.shape=(4, 3)" in error
    assert note.startswith(
        "raised as QueuedFromItsOwnRows's step was measured on the first "
        "batch (4 of its 8 examples, on 2 replicas), which runs it on each "
        "replica's part in slices"
    )
    assert '`compute_loss_over="replica_batch"`' in message
    message = named_errors.in_child("queue_unmeasured")
    said = "The step assigned a value of shape {} to a variable of shape [6, 3]"
    where = f" ({named_errors.__file__}, line "
    replica_0 = said.format("[2, 3]") + where in message
    replica_1 = said.format("[0, 3]") + where in message
    assert (replica_0 or replica_1) and "in train_step)" in message
    on = "replica 1 of 2" if replica_1 else "a replica"
    assert f"shape [{2 * replica_0}, 3] on {on}. Under 2 replicas each" in message
    assert "Gather the rows first, `keras_ctl.all_gather(rows)`" in message


def test_a_log_per_example_is_named_when_the_replicas_parts_differ():
    """The last batch, 1 example, gives replica 0 one value and replica 1
    none: the logs' collective cannot sum them."""
    message = named_errors.in_child("logs")
    assert message.startswith(
        "The replicas summed values of different sizes in one collective of the "
        "step. Received: "
    )
    assert "(the step's logs that are not scalars: `per_example`)" in message
    assert "Log a scalar" in message and "`keras_ctl.all_gather(rows)`" in message


def test_a_shuffle_of_the_replicas_rows_is_refused_as_the_step_runs():
    """A dataset's batches: the step is traced for batches of any size, so
    the refusal comes as it runs (static batches: tests/models)."""
    message = named_errors.in_child("shuffled_rows", 49, "dataset")
    assert message.startswith(named_errors.SHUFFLE_REFUSED)
    assert 'random_draws="per_replica"' in message
