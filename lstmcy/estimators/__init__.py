"""scikit-learn estimators built on lstmcy's forward and backward, and their sktime and aeon
front doors.

:class:`LSTMClassifier` and :class:`LSTMRegressor` follow the conventions of
:class:`~sklearn.neural_network.MLPClassifier` and
:class:`~sklearn.neural_network.MLPRegressor` (docs/estimators.md). The package needs
scikit-learn (the ``[sklearn]`` extra); ``import lstmcy`` does not import it.

Modules: ``_base`` (what both estimators share: input, training loop, early stopping,
prediction), ``_classifier`` and ``_regressor`` (their loss and targets), ``_sequences``
(input layouts, NaN padding, packed kernel calls, mini-batches), ``_optimizers`` (Adam, SGD
with momentum), ``_progress`` (a verbose fit's lines), ``_timeseries`` (what the sktime and
aeon adapters share), ``_sktime`` and ``_aeon`` (the adapters, public as :mod:`lstmcy.sktime`
and :mod:`lstmcy.aeon`).
"""
from lstmcy.estimators._base import auto_batch_size
from lstmcy.estimators._classifier import LSTMClassifier
from lstmcy.estimators._regressor import LSTMRegressor

__all__ = ["LSTMClassifier", "LSTMRegressor", "auto_batch_size"]
