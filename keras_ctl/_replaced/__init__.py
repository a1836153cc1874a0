"""What keras_ctl's replacements of Keras behaviour do.

The seam (`keras_ctl._keras`) says which attribute of Keras is replaced,
and when (`table.REPLACEMENTS`, put in place only while a keras_ctl call
runs); this package says what each replacement does for keras_ctl, and
the contexts a step enters to ask for it. Importing it registers every
behaviour the table names (`keras_ctl._keras.behaviours`); the seam never
imports it.

Modules, by what they change: `losses` (a `Loss` call's sum and count
made global; `loss_parts`), `metrics` (trackers in code of one's own,
metric results among logged values), `layers` (synchronized BatchNorm's
counts, empty replica batches, each replica's layer losses), `functions`
(a `tf.function` of one's own inlined in a replica step), `optimizers`
(`apply` summing before it clips, or captured), `variables` (atomic
updates on parameter servers), `random_rows` (one device's draws for a
replica's rows), `random_refused` (draws refused by name),
`seed_generators` (a seed generator per replica).
"""

from keras_ctl._replaced import functions
from keras_ctl._replaced import layers
from keras_ctl._replaced import losses
from keras_ctl._replaced import metrics
from keras_ctl._replaced import optimizers
from keras_ctl._replaced import random_refused
from keras_ctl._replaced import random_rows
from keras_ctl._replaced import seed_generators
from keras_ctl._replaced import variables

__all__ = [
    "functions",
    "layers",
    "losses",
    "metrics",
    "optimizers",
    "random_refused",
    "random_rows",
    "seed_generators",
    "variables",
]
