"""Numbers read back from keras_ctl's refusals of a loss that is not a
mean over examples (`keras_ctl/_engine/loss_mean.py`)."""


def relative_difference(message):
    """The relative difference of the gradients a refusal names (`"... are
    0.5 off (relative) one device's gradients ..."`)."""
    return float(message.split(" off (relative)")[0].split()[-1])


def step_named(message):
    """The step a refusal names: 1 for the first batch, `N` for `"on step
    N's batch"`, else `None`."""
    if "on the first batch" in message:
        return 1
    if "on step " not in message:
        return None
    return int(message.split("on step ")[1].split("'")[0])
