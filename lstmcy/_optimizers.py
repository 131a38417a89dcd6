"""Optimisers of :mod:`lstmcy.estimators`: Adam and SGD with momentum on lists of arrays.

They follow :class:`~sklearn.neural_network.MLPClassifier`'s ``solver='adam'`` and
``solver='sgd'`` (constant learning rate) and update the parameters in place.
"""
import numpy as np

__all__ = ["Adam", "SGD"]


class Adam:
    """Adam (Kingma & Ba) on a list of arrays, updated in place."""

    def __init__(self, params, learning_rate, beta_1, beta_2, epsilon):
        self.learning_rate = learning_rate
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.t = 0
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]

    def update(self, params, grads):
        self.t += 1
        b1, b2 = self.beta_1, self.beta_2
        step = self.learning_rate * np.sqrt(1.0 - b2 ** self.t) / (1.0 - b1 ** self.t)
        for param, grad, m, v in zip(params, grads, self.m, self.v):
            m *= b1
            m += (1.0 - b1) * grad
            v *= b2
            v += (1.0 - b2) * grad * grad
            param -= (step * m / (np.sqrt(v) + self.epsilon)).astype(param.dtype, copy=False)


class SGD:
    """SGD with (Nesterov) momentum, as MLPClassifier's ``solver='sgd'``, updated in place."""

    def __init__(self, params, learning_rate, momentum, nesterov):
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.nesterov = nesterov
        self.velocities = [np.zeros_like(p) for p in params]

    def update(self, params, grads):
        lr, mu = self.learning_rate, self.momentum
        for param, grad, velocity in zip(params, grads, self.velocities):
            velocity *= mu
            velocity -= lr * grad
            if self.nesterov:
                param += mu * velocity - lr * grad
            else:
                param += velocity
