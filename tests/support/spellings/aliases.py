"""A user's module that imports keras_ctl's replica arithmetic under
other names; the same steps as `helpers`."""

import tensorflow as tf
from keras.utils import unpack_x_y_sample_weight as unpack

from keras_ctl import all_gather as gather_rows
from keras_ctl import num_replicas as replica_count
from keras_ctl import written_in_shares as in_shares


def one_device(model, data):
    logs = model.step(data)
    if model.log_replicas:
        logs = {**logs, "replicas": model.replicas}
    return logs


def shares_undeclared(model, data):
    x, y, sample_weight = unpack(data)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.coupled_loss(
            gather_rows(y), gather_rows(y_pred), gather_rows(sample_weight)
        )
        share = loss / replica_count()
    variables = model.trainable_variables
    model.optimizer.apply(tape.gradient(share, variables), variables)
    return model.logs(y, y_pred, loss)


@in_shares
def shares_declared(model, data):
    return shares_undeclared(model, data)
