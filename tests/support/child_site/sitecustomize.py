"""The start of every child process of the tests (`children.quiet_env`
puts this folder first on `PYTHONPATH`): no full garbage collection while
TensorFlow and Keras import, and what they made set aside from later ones.

Importing them makes some 400,000 objects that live as long as the
process. Python's full collections walk every object tracked: seven of
them while TensorFlow and Keras import (0.6 s of a 4.5 s import), and each
later one walks that heap again. Here full collections wait until
`tensorflow` or `keras` has imported; then what exists is frozen
(`gc.freeze`, as `tests/conftest.py` does in the test processes) and the
thresholds are Python's own again, so a later full collection walks only
what the child made since. Young collections run as always. A child that
never imports either keeps collecting its young objects only.

Nothing of keras_ctl changes here: only when Python collects garbage.
"""

import gc
import importlib.abc
import importlib.util
import sys

_WATCHED = {"tensorflow", "keras"}
_THRESHOLDS = gc.get_threshold()


class _FreezeAfterImport(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` and `keras` as the other finders do, and freezes
    the heap when either has run its module."""

    def find_spec(self, name, path=None, target=None):
        if name not in _WATCHED:
            return None
        _WATCHED.discard(name)  # the search below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def run_then_freeze(module):
            run_module(module)
            gc.freeze()
            gc.set_threshold(*_THRESHOLDS)

        spec.loader.exec_module = run_then_freeze
        return spec


# Young and middle generations as Python's; the oldest never full enough.
gc.set_threshold(_THRESHOLDS[0], _THRESHOLDS[1], 2**30)
sys.meta_path.insert(0, _FreezeAfterImport())
