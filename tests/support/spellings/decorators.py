"""A user's own decorators of step methods, written with `functools.wraps`."""

import functools

import keras_ctl


def traced(step):
    """Passes `step` through (where a user would log or time it)."""

    @functools.wraps(step)
    def wrapper(model, data):
        return step(model, data)

    return wrapper


def in_shares(step):
    """`traced`, declaring `step` written in replica shares: keras_ctl's
    decorator applied inside the user's."""

    @functools.wraps(step)
    @keras_ctl.written_in_shares
    def wrapper(model, data):
        return step(model, data)

    return wrapper
