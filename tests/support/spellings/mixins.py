"""A user's mixins, each bringing a `train_step`: `BY_READING[reading]`."""

import keras_ctl
from spellings import helpers


class OneDeviceStep:
    def train_step(self, data):
        logs = self.step(data)
        if self.log_replicas:
            logs = {**logs, "replicas": self.replicas}
        return logs


class StepInShares:
    def train_step(self, data):
        return helpers.shares_undeclared(self, data)


class DeclaredStepInShares:
    @keras_ctl.written_in_shares
    def train_step(self, data):
        return helpers.shares_undeclared(self, data)


BY_READING = {
    "one_device": OneDeviceStep,
    "shares_undeclared": StepInShares,
    "shares_declared": DeclaredStepInShares,
}
