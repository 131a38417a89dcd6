"""Optimisers of :mod:`lstmcy.estimators`: Adam and SGD with momentum on lists of arrays.

They follow :class:`~sklearn.neural_network.MLPClassifier`'s ``solver='adam'`` and
``solver='sgd'`` (constant learning rate) and update the parameters in place. Their state
is one flat array per moment over all the parameters (of one dtype), so that an update is
a handful of numpy operations whatever the number of parameter arrays: the estimators'
small batches make a step's fixed costs count. Every element goes through the same
operations in the same order as it would array by array.
"""
import numpy as np

__all__ = ["Adam", "SGD"]


def _flat(arrays):
    """The arrays' elements, one after the other, in one new 1-D array."""
    return np.concatenate([a.ravel() for a in arrays])


def _parts(params, flat):
    """Each parameter with its part of ``flat``, shaped like it."""
    start = 0
    for param in params:
        stop = start + param.size
        yield param, flat[start:stop].reshape(param.shape)
        start = stop


class Adam:
    """Adam (Kingma & Ba) on a list of arrays of one dtype, updated in place."""

    def __init__(self, params, learning_rate, beta_1, beta_2, epsilon):
        self.learning_rate = learning_rate
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.t = 0
        size = sum(p.size for p in params)
        self.m = np.zeros(size, dtype=params[0].dtype)
        self.v = np.zeros(size, dtype=params[0].dtype)

    def update(self, params, grads):
        self.t += 1
        b1, b2 = self.beta_1, self.beta_2
        step = self.learning_rate * np.sqrt(1.0 - b2 ** self.t) / (1.0 - b1 ** self.t)
        grad, m, v = _flat(grads), self.m, self.v
        m *= b1
        m += (1.0 - b1) * grad
        v *= b2
        v += (1.0 - b2) * grad * grad
        # step is a float64 scalar: the quotient is float64, rounded to m's dtype before
        # the subtraction.
        delta = (step * m / (np.sqrt(v) + self.epsilon)).astype(m.dtype, copy=False)
        for param, part in _parts(params, delta):
            param -= part


class SGD:
    """SGD with (Nesterov) momentum, as MLPClassifier's ``solver='sgd'``, on a list of arrays
    of one dtype, updated in place."""

    def __init__(self, params, learning_rate, momentum, nesterov):
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.nesterov = nesterov
        self.velocity = np.zeros(sum(p.size for p in params), dtype=params[0].dtype)

    def update(self, params, grads):
        lr, mu = self.learning_rate, self.momentum
        grad, velocity = _flat(grads), self.velocity
        velocity *= mu
        velocity -= lr * grad
        delta = mu * velocity - lr * grad if self.nesterov else velocity
        for param, part in _parts(params, delta):
            param += part
