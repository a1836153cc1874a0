"""A user's helper module: the step's body, called from `train_step`.

One function per reading: `one_device` (the generated step, written for
one device), and the global-batch guide's recipe written in replica
shares, `shares_undeclared` and `shares_declared` (marked with
`keras_ctl.written_in_shares`). `free_function` and `partial_or_lambda`
seeds use them as the step itself.
"""

import keras
import tensorflow as tf

import keras_ctl


def one_device(model, data):
    return with_replicas(model, model.step(data))


def shares_undeclared(model, data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        rows = [keras_ctl.all_gather(t) for t in (y, y_pred, sample_weight)]
        loss = model.coupled_loss(*rows)  # the global batch's, on every replica
        # Gradients are summed across replicas: each adds its 1/R.
        share = loss / keras_ctl.num_replicas()
    variables = model.trainable_variables
    model.optimizer.apply(tape.gradient(share, variables), variables)
    return model.logs(y, y_pred, loss)


@keras_ctl.written_in_shares
def shares_declared(model, data):
    return shares_undeclared(model, data)


def with_replicas(model, logs):
    """`logs` with the replica count when the model logs it: information
    only, which must not change how the step is read."""
    if model.log_replicas:
        return {**logs, "replicas": model.replicas}
    return logs
