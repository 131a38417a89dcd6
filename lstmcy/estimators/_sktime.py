"""sktime estimators: :class:`LSTMClassifier` and :class:`LSTMRegressor`.

They are sktime's ``BaseClassifier`` / ``BaseRegressor`` around
:class:`lstmcy.estimators.LSTMClassifier` / :class:`~lstmcy.estimators.LSTMRegressor`
(the same parameters but ``channels_first``: sktime's layouts say where the channels
are), so they take sktime's collections as they come (``numpy3D``, nested DataFrames,
``(instance, time)``-indexed DataFrames, lists of DataFrames; equal or unequal lengths,
one or more channels), work in sktime's pipelines, ``evaluate``, benchmarking and grid
search, and need no TensorFlow. The fitted scikit-learn estimator is ``estimator_``.

Needs sktime (the ``[sktime]`` extra: ``pip install -e ".[sktime]"``).
"""
from sktime.classification.base import BaseClassifier
from sktime.regression.base import BaseRegressor

from lstmcy import estimators
from lstmcy.estimators._timeseries import SKTIME_INNER_MTYPES, LSTMAdapter

__all__ = ["LSTMClassifier", "LSTMRegressor"]

_TAGS = {
    "authors": "lstmcy developers",
    "X_inner_mtype": SKTIME_INNER_MTYPES,
    "y_inner_mtype": "numpy1D",
    "capability:multivariate": True,
    "capability:unequal_length": True,
    # Trailing NaN ends a sequence, but NaN inside one is refused.
    "capability:missing_values": False,
    "capability:random_state": True,
    "python_dependencies": None,
}


class _SktimeAdapter(LSTMAdapter):
    @classmethod
    def get_test_params(cls, parameter_set="default"):
        """Small, quick settings for sktime's tests.

        Parameters
        ----------
        parameter_set : str, default="default"
            Ignored: there is one set.

        Returns
        -------
        params : list of dict
        """
        return cls._test_params()


class LSTMClassifier(_SktimeAdapter, BaseClassifier):
    """LSTM time-series classifier: :class:`lstmcy.estimators.LSTMClassifier` for sktime.

    An LSTM reads each series (its channels are the features of a time step), its last
    hidden state goes through a linear layer and a softmax. Parameters are those of
    :class:`lstmcy.estimators.LSTMClassifier` but ``channels_first``; defaults train
    without tuning (the input is standardised per channel inside the estimator).

    Attributes
    ----------
    estimator_ : lstmcy.estimators.LSTMClassifier
        The fitted scikit-learn estimator; every prediction is its.
    classes_ : ndarray
        Class labels.

    Examples
    --------
    >>> from sktime.datasets import load_basic_motions
    >>> from lstmcy.sktime import LSTMClassifier
    >>> X, y = load_basic_motions(split="train", return_X_y=True)
    >>> clf = LSTMClassifier(random_state=0).fit(X, y)  # doctest: +SKIP
    """

    _estimator_class = estimators.LSTMClassifier
    _tags = dict(_TAGS, **{"capability:predict_proba": True, "capability:class_weight": True})

    def _predict_proba(self, X):
        return self.estimator_.predict_proba(self._sequences(X))


class LSTMRegressor(_SktimeAdapter, BaseRegressor):
    """LSTM time-series regressor: :class:`lstmcy.estimators.LSTMRegressor` for sktime.

    As :class:`LSTMClassifier`, with a linear output for one target.

    Attributes
    ----------
    estimator_ : lstmcy.estimators.LSTMRegressor
        The fitted scikit-learn estimator; every prediction is its.

    Examples
    --------
    >>> import numpy as np
    >>> from lstmcy.sktime import LSTMRegressor
    >>> X = np.random.default_rng(0).standard_normal((20, 2, 15))  # numpy3D
    >>> reg = LSTMRegressor(hidden_size=4, max_iter=3, random_state=0).fit(X, X[:, 0].sum(1))
    >>> reg.predict(X[:3]).shape
    (3,)
    """

    _estimator_class = estimators.LSTMRegressor
    _tags = dict(_TAGS)


