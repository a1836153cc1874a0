"""Argument checks shared by the public classes and functions."""


def positive_int(name, value):
    """Raises `ValueError` unless `value` is an int >= 1, naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"Expected `{name}` to be an integer >= 1. Received: {name}={value!r}."
        )
    return value
