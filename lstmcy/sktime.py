"""sktime's ``LSTMClassifier`` and ``LSTMRegressor`` (:mod:`lstmcy.estimators._sktime`).

Needs sktime (the ``[sktime]`` extra: ``pip install -e ".[sktime]"``).
"""
from lstmcy.estimators._sktime import LSTMClassifier, LSTMRegressor

__all__ = ["LSTMClassifier", "LSTMRegressor"]
