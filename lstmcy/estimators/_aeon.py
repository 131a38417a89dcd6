"""aeon estimators: :class:`LSTMClassifier` and :class:`LSTMRegressor`.

They are aeon's ``BaseClassifier`` / ``BaseRegressor`` around
:class:`lstmcy.estimators.LSTMClassifier` / :class:`~lstmcy.estimators.LSTMRegressor`
(the same parameters but ``channels_first``), taking aeon's collections as they come (a
3-D ``(n_cases, n_channels, n_timepoints)`` array or a list of ``(n_channels,
n_timepoints_i)`` arrays), multivariate and of unequal lengths, without TensorFlow. The
fitted scikit-learn estimator is ``estimator_``.

Needs aeon (the ``[aeon]`` extra: ``pip install -e ".[aeon]"``).
"""
from aeon.classification.base import BaseClassifier
from aeon.regression.base import BaseRegressor

from lstmcy import estimators
from lstmcy.estimators._timeseries import AEON_INNER_TYPES, LSTMAdapter

__all__ = ["LSTMClassifier", "LSTMRegressor"]

_TAGS = {
    "X_inner_type": AEON_INNER_TYPES,
    "capability:multivariate": True,
    "capability:unequal_length": True,
    # Trailing NaN ends a sequence, but NaN inside one is refused.
    "capability:missing_values": False,
    "non_deterministic": False,
}


class _AeonAdapter(LSTMAdapter):
    @classmethod
    def _get_test_params(cls, parameter_set="default"):
        return cls._test_params()[0]


class LSTMClassifier(_AeonAdapter, BaseClassifier):
    """LSTM time-series classifier: :class:`lstmcy.estimators.LSTMClassifier` for aeon.

    Parameters are those of :class:`lstmcy.estimators.LSTMClassifier` but
    ``channels_first``; the defaults train without tuning.

    Attributes
    ----------
    estimator_ : lstmcy.estimators.LSTMClassifier
        The fitted scikit-learn estimator; every prediction is its.

    Examples
    --------
    >>> import numpy as np
    >>> from lstmcy.aeon import LSTMClassifier
    >>> X = np.random.default_rng(0).standard_normal((20, 2, 15))
    >>> clf = LSTMClassifier(hidden_size=4, max_iter=3, random_state=0).fit(X, np.arange(20) % 2)
    >>> clf.predict_proba(X[:3]).shape
    (3, 2)
    """

    _estimator_class = estimators.LSTMClassifier
    _tags = dict(_TAGS)

    def _predict_proba(self, X):
        return self.estimator_.predict_proba(self._sequences(X))



class LSTMRegressor(_AeonAdapter, BaseRegressor):
    """LSTM time-series regressor: :class:`lstmcy.estimators.LSTMRegressor` for aeon.

    Attributes
    ----------
    estimator_ : lstmcy.estimators.LSTMRegressor
        The fitted scikit-learn estimator; every prediction is its.
    """

    _estimator_class = estimators.LSTMRegressor
    _tags = dict(_TAGS)


