"""A preemption notice: a signal that asks training to save and stop.

Cloud machines are preempted with SIGTERM, a grace period, then SIGKILL.
`Notice` turns the signal into a flag that the training loop reads between
steps, so the step in flight finishes and a backup can be written; a
second signal while saving only sets the flag again. If no step reads the
flag within `deadline_s` (a step that hangs, or training that ended with an
error), the process ends as the signal would have ended it (exit code
128 + the signal's number).

Several workers must stop at the same step, or the ones still training wait
in a collective for the ones gone. The notice rides in the all-reduce the
step makes anyway for its logs (`NOTICE_LOG`, summed over workers), so a
signal reaching any worker stops all of them after the same step: no
collective of its own, no thread, no service to ask.
"""

import os
import signal
import threading

import tensorflow as tf

# The exit code of a process that saved on notice: restart it to resume
# (TensorFlow's `PreemptionCheckpointHandler` exits with the same code).
SAVED_ON_NOTICE = 42

SIGNAL_NAMES = ("SIGTERM", "SIGINT")

# The log through which workers share a notice; the step function removes
# it before Keras sees the logs.
NOTICE_LOG = "_keras_ctl_notice"

# Process-wide, as signals are: whether an installed `Notice` caught one,
# and whether some worker did as of the last step (`agreed`).
_state = {"watching": False, "received": False, "agreed": False, "variable": None}


def notice_variable():
    """A local float32 variable, 1.0 once this process caught a signal: the
    step reads it into the logs' all-reduce."""
    if _state["variable"] is None:
        with tf.init_scope():
            _state["variable"] = tf.Variable(0.0, trainable=False, name="notice")
    return _state["variable"]


def before_step():
    """Shows a caught signal to the next step (under several workers)."""
    if _state["received"] and _state["variable"] is not None:
        _state["variable"].assign(1.0)


def after_step(logs):
    """Takes the shared notice out of `logs`; returns the logs."""
    if isinstance(logs, dict) and NOTICE_LOG in logs:
        logs = dict(logs)
        shared = logs.pop(NOTICE_LOG)
        if _state["watching"]:
            _state["agreed"] = bool(shared > 0)
    return logs


def agreed():
    """Whether some worker caught a signal before the last step."""
    return _state["agreed"]


def check_signal_names(names):
    """Returns `names` as a tuple, or raises a ValueError naming the argument."""
    names = tuple(names or ())
    unknown = [name for name in names if name not in SIGNAL_NAMES]
    if unknown:
        raise ValueError(
            f"Expected `save_on_signals` among {SIGNAL_NAMES}, or () to turn "
            f"saving on notice off. Received: save_on_signals={names!r}."
        )
    return names


class Notice:
    """Catches `names` (e.g. `("SIGTERM",)`) while installed.

    Args:
        names: Signal names.
        deadline_s: Seconds after a signal within which the loop must have
            read it; then the process ends as the signal would end it.
    """

    def __init__(self, names, deadline_s):
        self._signals = [getattr(signal, name) for name in names]
        self._deadline_s = deadline_s
        self._previous = {}
        self._timer = None
        self.received = None  # the first signal's name, once one arrived

    def install(self):
        """Catches the signals; returns False outside the main thread, where
        Python cannot install handlers."""
        if threading.current_thread() is not threading.main_thread():
            return False
        _state.update(watching=True, received=False, agreed=False)
        if _state["variable"] is not None:
            _state["variable"].assign(0.0)
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def uninstall(self):
        """Gives the signals back to their previous handlers."""
        if self._timer is not None:
            self._timer.cancel()
        _state.update(watching=False, received=False, agreed=False)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        del frame
        if self.received is not None:
            return  # already saving or about to
        self.received = signal.Signals(signum).name
        _state["received"] = True
        self._timer = threading.Timer(self._deadline_s, self._expire, args=(signum,))
        self._timer.daemon = True
        self._timer.start()

    def _expire(self, signum):
        # Only the main thread may restore a handler; end as the signal would.
        os._exit(128 + signum)
