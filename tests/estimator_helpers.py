"""Data and fitting helpers shared by the tests of lstmcy.estimators."""
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning


def quiet_fit(estimator, X, y, **fit_params):
    """``estimator.fit`` without the ConvergenceWarning of short test fits."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(X, y, **fit_params)


def sum_sign_problem(n=120, steps=6, features=3, seed=0):
    """Classify whether the first feature sums to a positive number."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, steps, features))
    return X, (X[:, :, 0].sum(axis=1) > 0).astype(int)


def ragged_sequences(n=40, features=2, max_len=9, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=n)
    return [rng.standard_normal((length, features)) for length in lengths]


def params_equal(a, b):
    """Whether two fitted estimators have exactly the same parameters."""
    return all(np.array_equal(p, q) for p, q in zip(a._all_params(), b._all_params()))


def motions(n, seed, steps=30):
    """Four classes of 3-channel series, like accelerometer recordings of four movements.

    Class k oscillates slowly (even k) or fast (odd k), with a random phase, on channel
    k // 2; every channel has noise.
    """
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 4
    X = 0.2 * rng.standard_normal((n, steps, 3))
    t = np.arange(steps)
    for i, label in enumerate(y):
        X[i, :, label // 2] += np.sin((0.25 if label % 2 == 0 else 0.9) * t
                                      + rng.uniform(0, 2 * np.pi))
    return X, y
