"""What :mod:`lstmcy.sktime` and :mod:`lstmcy.aeon` share: their parameters (those of
:class:`~lstmcy.estimators.LSTMClassifier` / :class:`~lstmcy.estimators.LSTMRegressor`
but ``channels_first``, which the adapters set from the layout they are given), the
scikit-learn estimator they fit, and the conversion of their inner data types to it.

An adapter is one model behind another library's base class: ``fit`` fits
``estimator_``, a scikit-learn estimator of the same parameters, and every prediction
is that estimator's.
"""
import inspect

import numpy as np

from lstmcy.estimators._classifier import LSTMClassifier

__all__ = ["LSTMAdapter", "adapter_signature"]

# The library's data types the adapters take as they come: equal-length collections as a
# 3-D (n_cases, n_channels, n_timepoints) array, unequal-length ones as a list of 2-D
# (n_channels, n_timepoints_i) arrays (aeon) or as sktime's nested or (instance, time)
# indexed DataFrames, which lstmcy.estimators reads directly.
SKTIME_INNER_MTYPES = ["numpy3D", "nested_univ", "pd-multiindex", "df-list"]
AEON_INNER_TYPES = ["numpy3D", "np-list"]


# Defaults spelled otherwise than in lstmcy.estimators: sktime's constructor test takes
# no type as a default but np.float64 and np.int64, so the dtype is named.
_ADAPTER_DEFAULTS = {"dtype": "float32"}


def _adapter_parameters(estimator_class):
    """The parameters of ``estimator_class.__init__`` (``self`` first) but
    ``channels_first``, with the adapters' defaults."""
    return [p.replace(default=_ADAPTER_DEFAULTS.get(name, p.default))
            for name, p in inspect.signature(estimator_class.__init__).parameters.items()
            if name != "channels_first"]


def adapter_signature(estimator_class):
    """The adapter's ``__init__`` signature, what scikit-learn's and skbase's
    ``get_params`` read: the parameters of ``estimator_class`` but ``channels_first``."""
    return inspect.Signature(_adapter_parameters(estimator_class))


def _set_params_of(estimator_class):
    params = _adapter_parameters(estimator_class)[1:]
    return [p.name for p in params], {p.name: p.default for p in params}


class LSTMAdapter:
    """The adapters' shared part (a mixin before the library's base class).

    A subclass that sets ``_estimator_class`` gets an ``__init__`` with that estimator's
    parameters (but ``channels_first``) as its signature, which stores them and then runs
    the library base class's ``__init__``.
    """

    _estimator_class = LSTMClassifier

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_estimator_class" not in cls.__dict__:
            return

        def __init__(self, **params):
            self._store_params(params)
            super(cls, self).__init__()

        __init__.__signature__ = adapter_signature(cls._estimator_class)
        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        cls.__init__ = __init__

    def _fit(self, X, y):
        return self._fit_estimator(X, y)

    def _predict(self, X):
        return self.estimator_.predict(self._sequences(X))

    def _store_params(self, values):
        names, defaults = _set_params_of(self._estimator_class)
        unknown = set(values) - set(names)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected parameters "
                            f"{sorted(unknown)}")
        for name in names:
            setattr(self, name, values.get(name, defaults[name]))

    def _estimator_params(self):
        names, _ = _set_params_of(self._estimator_class)
        return {name: getattr(self, name) for name in names}

    @staticmethod
    def _sequences(X):
        """The inner data ``X`` as ``LSTMClassifier(channels_first=True)`` reads it: 3-D
        arrays, lists of 2-D arrays (aeon's ``np-list``) and DataFrames as they are, a
        list of ``(n_timepoints, n_channels)`` DataFrames (sktime's ``df-list``)
        transposed (views)."""
        if isinstance(X, list) and X and hasattr(X[0], "to_numpy"):
            return [frame.to_numpy(dtype=np.float64).T for frame in X]
        return X

    def _fit_estimator(self, X, y):
        self.estimator_ = self._estimator_class(channels_first=True,
                                                **self._estimator_params())
        self.estimator_.fit(self._sequences(X), y)
        return self

    @classmethod
    def _test_params(cls):
        """Small, quick settings for the libraries' ``get_test_params``."""
        return [{"hidden_size": 4, "max_iter": 5, "n_iter_no_change": None, "random_state": 0},
                {"hidden_size": 3, "head": "mean", "bidirectional": True, "max_iter": 3,
                 "n_iter_no_change": None, "random_state": 0}]

