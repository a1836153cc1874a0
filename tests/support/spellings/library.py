"""A library's model base class (standing for a package such as keras-rs),
whose `train_step` the user's model inherits."""

import keras_ctl
from spellings import helpers


def model_class(base, reading):
    """The library's model on `base` (`keras.Model`, or `CTLModel` for the
    library's keras_ctl flavour), its `train_step` written for `reading`."""

    class LibraryModel(base):
        def train_step(self, data):
            if reading != "one_device":
                return helpers.shares_undeclared(self, data)
            logs = self.step(data)
            if self.log_replicas:
                logs = {**logs, "replicas": self.replicas}
            return logs

    if reading != "shares_declared":
        return LibraryModel

    class DeclaredLibraryModel(LibraryModel):
        # Declared on an override that runs the base class's step.
        @keras_ctl.written_in_shares
        def train_step(self, data):
            return super().train_step(data)

    return DeclaredLibraryModel
