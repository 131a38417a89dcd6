"""aeon's ``LSTMClassifier`` and ``LSTMRegressor`` (:mod:`lstmcy.estimators._aeon`).

Needs aeon (the ``[aeon]`` extra: ``pip install -e ".[aeon]"``).
"""
from lstmcy.estimators._aeon import LSTMClassifier, LSTMRegressor

__all__ = ["LSTMClassifier", "LSTMRegressor"]
