"""The one package that reads Keras internals (the seam).

Everything else in keras_ctl uses public Keras only, and this package
imports nothing of keras_ctl: it is an adapter, the lowest layer, and
what keras_ctl decides is handed to it. Each accessor says why no public
hook does the job. Every private name is looked up through `names`, which
fails with an error naming it and the Keras versions checked when Keras
moves it; its inventory is read off the source (`names.inventory()`), and
a test checks each name against the installed Keras. Every change of
Keras behaviour is one row of `table.REPLACEMENTS`, which names the
attribute replaced and the behaviour that replaces it; the behaviours are
registered by name (`behaviours`: keras_ctl's own by `keras_ctl._replaced`
on import, a row without one fails naming it), and in place only while a
keras_ctl call runs (`replacements.in_effect`); a row that one feature
needs names the public class to wrap where a Keras lacks its private name
(`fallback`), so that Keras disables nothing else. The supported range is
declared in pyproject.toml (checked on import by `keras_ctl._compat`), and
`.ci/compat` runs the fast tests at both of its ends and on the next
Keras. When a new Keras minor comes out, re-read the Keras code each
accessor names, then widen the range.

Modules: `names` (private lookups), `access` (plain accessors), `models`
(building from shapes, pickling, registration), `iterators` (distributed
iterators opened on first use, counting the batches they have left),
`optimizers`, `layers`, `losses`, `random`, `variables` (Keras's private
names in each area, and the few replacements that only adapt Keras's own
types), `stateless_rows` (one replica's rows of TensorFlow's stateless
draws), `ops` (the op types of collectives, the ops an eager step runs),
`state` (the replica step's thread record), `behaviours` (a row and its
behaviour by name), `table` (every replacement), `replacements`
(`in_effect` and `replica_step`).
"""

from keras_ctl._keras import names
from keras_ctl._keras import ops
from keras_ctl._keras.access import RAN_OUT_OF_DATA
from keras_ctl._keras.access import add_metric_update
from keras_ctl._keras.access import add_to_mean
from keras_ctl._keras.access import all_layers
from keras_ctl._keras.access import compile_loss
from keras_ctl._keras.access import compile_loss_terms
from keras_ctl._keras.access import compile_metrics
from keras_ctl._keras.access import end_epoch_early
from keras_ctl._keras.access import initial_epoch
from keras_ctl._keras.access import loss_tracker
from keras_ctl._keras.access import pack_like_compile_loss
from keras_ctl._keras.access import per_output_loss_trackers
from keras_ctl._keras.access import set_initial_epoch
from keras_ctl._keras.access import strategy_of_variable
from keras_ctl._keras.access import user_compute_loss
from keras_ctl._keras.access import user_loss
from keras_ctl._keras.models import SymbolicBuildFromFirstReplica
from keras_ctl._keras.models import build_from_spec
from keras_ctl._keras.models import reduce_as_saved_model
from keras_ctl._keras.models import register_under_name
from keras_ctl._keras.models import strategy_created_under
from keras_ctl._keras.models import without_strategy
from keras_ctl._keras.names import KerasInternalMissing
from keras_ctl._keras.optimizers import EmaAfterStep
from keras_ctl._keras.optimizers import count_micro_batch
from keras_ctl._keras.optimizers import keras_accumulators
from keras_ctl._keras.optimizers import micro_batch_iterations
from keras_ctl._keras.optimizers import one_update_of_accumulated_steps
from keras_ctl._keras.random import is_seed_state
from keras_ctl._keras.replacements import REPLACEMENTS
from keras_ctl._keras.replacements import gradients_already_summed
from keras_ctl._keras.replacements import in_effect
from keras_ctl._keras.replacements import keep_sharded_reads
from keras_ctl._keras.replacements import replaced
from keras_ctl._keras.replacements import replica_step
from keras_ctl._keras.state import count_only_real_examples
from keras_ctl._keras.state import real_examples
from keras_ctl._keras.state import without_placeholder
from keras_ctl._keras.variables import gradients

# Keras's functional class and the test `Model.__new__` applies to a
# constructor's arguments (no public name for either).
Functional = names.member("keras.src.models.functional", "Functional")
functional_init_arguments = names.member(
    "keras.src.models.model", "functional_init_arguments"
)

__all__ = [
    "EmaAfterStep",
    "Functional",
    "KerasInternalMissing",
    "RAN_OUT_OF_DATA",
    "REPLACEMENTS",
    "SymbolicBuildFromFirstReplica",
    "add_metric_update",
    "add_to_mean",
    "all_layers",
    "build_from_spec",
    "compile_loss",
    "compile_loss_terms",
    "compile_metrics",
    "count_micro_batch",
    "count_only_real_examples",
    "is_seed_state",
    "end_epoch_early",
    "functional_init_arguments",
    "gradients",
    "gradients_already_summed",
    "in_effect",
    "initial_epoch",
    "keep_sharded_reads",
    "keras_accumulators",
    "loss_tracker",
    "micro_batch_iterations",
    "names",
    "ops",
    "one_update_of_accumulated_steps",
    "pack_like_compile_loss",
    "per_output_loss_trackers",
    "real_examples",
    "reduce_as_saved_model",
    "register_under_name",
    "replaced",
    "replica_step",
    "set_initial_epoch",
    "strategy_created_under",
    "strategy_of_variable",
    "user_compute_loss",
    "user_loss",
    "without_placeholder",
    "without_strategy",
]
