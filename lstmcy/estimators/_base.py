"""The base of the scikit-learn estimators built on lstmcy's forward and backward.

:class:`LSTMClassifier` and :class:`LSTMRegressor` follow the conventions of
:class:`~sklearn.neural_network.MLPClassifier` and
:class:`~sklearn.neural_network.MLPRegressor`: an LSTM (``lstmcy.lstm_forward``)
reads each sequence (in patches of consecutive time steps, ``patch_size``), a head
turns its last hidden state (or the mean of its outputs over time) into features, and
one linear layer maps those to class scores (softmax) or to the regression targets
(identity). Training is mini-batch
Adam or SGD with momentum; the head's gradients are computed in numpy and every
gradient of the LSTM comes from the forward's ``LSTMCache.backward``.

This module needs scikit-learn (the ``[sklearn]`` extra: ``pip install -e ".[sklearn]"``); ``import lstmcy``
does not import it.

Input ``X`` can be (see :mod:`lstmcy.estimators._sequences` and docs/estimators.md)

* a 3-D array ``(n_samples, n_timesteps, n_features)``, or ``(n_samples, n_channels,
  n_timepoints)`` as in sktime and aeon with ``channels_first=True``;
* a 2-D array ``(n_samples, n_timesteps)``, read as univariate sequences (one
  feature per step). This is also how scikit-learn's generic tools see it: its
  columns are the estimator's ``n_features_in_``;
* a list of 2-D arrays ``(n_timesteps_i, n_features)`` or of 1-D arrays whose lengths
  may differ: a variable-length batch, packed internally (sorted by length, PyTorch's
  ``PackedSequence`` layout) and returned in the caller's order.

* sktime's nested DataFrame or a DataFrame with an ``(instance, time)`` row index.

Trailing NaN ends a sequence, so NaN-padded arrays hold variable-length data too. Each
feature is standardised with the training data's mean and standard deviation
(``standardize=True``).
"""
import functools
import math
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils.validation import _check_sample_weight, check_array, validate_data

import lstmcy
from lstmcy.estimators._optimizers import SGD, Adam
from lstmcy._engine.schedule import FUSED_INPUT_ROWS
from lstmcy.estimators._progress import FitProgress
from lstmcy.estimators._sequences import (Sequences, check_3d, check_sequence_list, from_padded,
                                          is_sequence_list, item_sequences, pandas_sequences)


# Sequences and time steps of a forward call at prediction time: they bound the packed
# [steps, D*H] output held at once (inference keeps no cache).
_PREDICT_CHUNK = 1024
_PREDICT_TOKENS = 1 << 16
# Sequences of a forward call at prediction time, at least (one-step sequences of zeros
# are added): the kernels compute x's product another way below FUSED_INPUT_ROWS
# sequences, and from there on a sequence's outputs do not depend on the other sequences
# of the call.
_PREDICT_MIN_SEQUENCES = FUSED_INPUT_ROWS


# Zero arrays of at most this many bytes are shared between calls (see _zeros).
_SHARED_ZEROS_BYTES = 16 << 20


@functools.lru_cache(maxsize=4)
def _shared_zeros(shape, dtype):
    zeros = np.zeros(shape, dtype=dtype)
    zeros.flags.writeable = False
    return zeros


def _linear(features, coef, intercept):
    """``features @ coef + intercept``, each output a sum over the features in their order,
    so that a row's result does not depend on the other rows (a BLAS product's does: it
    takes other kernels for other numbers of rows)."""
    out = np.empty((len(features), coef.shape[1]), dtype=np.result_type(features, coef))
    out[...] = intercept
    for k in range(coef.shape[0]):
        out += features[:, k, None] * coef[k]
    return out


def _zeros(shape, dtype):
    """Zeros, read-only, shared by the batches of a fit when small (the ``dy`` of a head on
    the last hidden state: a fresh one would cost an allocation and its page faults at
    every batch)."""
    if math.prod(shape) * np.dtype(dtype).itemsize > _SHARED_ZEROS_BYTES:
        return np.zeros(shape, dtype=dtype)
    return _shared_zeros(shape, dtype)


# batch_size='auto': about _AUTO_STEPS steps per epoch, between _AUTO_BATCH_MIN and
# _AUTO_BATCH_MAX sequences a batch.
_AUTO_STEPS = 10
_AUTO_BATCH_MIN = 4
_AUTO_BATCH_MAX = 64
# early_stopping='auto' holds out a validation set from this many held-out samples on.
_AUTO_MIN_VALIDATION = 100
# learning_rate='adaptive': where the watched loss stops improving, divide the learning
# rate by _LR_DIVISOR and go on, up to _LR_REDUCTIONS times; a small set's training loss
# is noisy at the first plateau and still falls at a smaller step.
_LR_DIVISOR = 5
_LR_REDUCTIONS = 2
# patch_size='auto': the LSTM reads a training sequence of the median length in at most
# _AUTO_PATCH_STEPS steps, each a patch of consecutive time points. Over 150-251 points
# read one at a time, the default classifier fitted GunPoint and ArrowHead to 0.78 and
# 0.35 mean accuracy over seeds 0-4; in patches of 5 and 8 (30 and 32 steps) to 0.96 and
# 0.70, while 16 steps cost ArrowHead 0.07 and 64 steps BasicMotions 0.015 (docs/estimators.md,
# "The rule"; benchmarks/RESULTS.md, sktime and aeon).
_AUTO_PATCH_STEPS = 32


def auto_patch_size(lengths):
    """``patch_size='auto'`` for training sequences of ``lengths`` time steps."""
    return max(1, math.ceil(float(np.median(lengths)) / _AUTO_PATCH_STEPS))


def auto_batch_size(n_samples):
    """``batch_size='auto'`` for ``n_samples`` training sequences."""
    batch_size = min(_AUTO_BATCH_MAX, max(_AUTO_BATCH_MIN, n_samples // _AUTO_STEPS))
    return min(batch_size, n_samples)


# --------------------------------------------------------------------------- parameters

def _check_number(name, value, kind, low=None, high=None, low_open=False, high_open=False,
                  allow_none=False):
    if value is None and allow_none:
        return
    types = Integral if kind == "int" else Real
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, types):
        what = "an int" if kind == "int" else "a float"
        raise TypeError(f"{name} must be {what}{' or None' if allow_none else ''}, got {value!r}")
    if value != value:  # NaN passes every comparison below
        raise ValueError(f"{name} must be a number, got {value!r}")
    if low is not None and (value <= low if low_open else value < low) or \
            high is not None and (value >= high if high_open else value > high):
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        interval = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


def _check_flag(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}")


# --------------------------------------------------------------------------- base estimator

class _BaseLSTM(BaseEstimator):
    """Shared training and inference of :class:`LSTMClassifier` and :class:`LSTMRegressor`."""

    def __init__(self, hidden_size=64, num_layers=1, bidirectional=False, dropout=0.0,
                 head="last", channels_first=False, solver="adam", batch_size="auto",
                 learning_rate_init=0.001, alpha=0.0001, clip_norm=5.0, max_iter=200, tol=1e-4,
                 n_iter_no_change=10, early_stopping="auto", validation_fraction=0.1,
                 shuffle=True, random_state=None, warm_start=False, verbose=0, momentum=0.9,
                 nesterovs_momentum=True, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 dtype=np.float32, standardize=True, learning_rate="adaptive", patch_size="auto"):
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bidirectional = bidirectional
        self.dropout = dropout
        self.head = head
        self.channels_first = channels_first
        self.solver = solver
        self.batch_size = batch_size
        self.learning_rate_init = learning_rate_init
        self.alpha = alpha
        self.clip_norm = clip_norm
        self.max_iter = max_iter
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.shuffle = shuffle
        self.random_state = random_state
        self.warm_start = warm_start
        self.verbose = verbose
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.dtype = dtype
        self.standardize = standardize
        self.learning_rate = learning_rate
        self.patch_size = patch_size

    # ------------------------------------------------------------------ parameters

    def _validate_params(self):
        _check_number("hidden_size", self.hidden_size, "int", low=1)
        _check_number("num_layers", self.num_layers, "int", low=1)
        _check_flag("bidirectional", self.bidirectional)
        _check_number("dropout", self.dropout, "real", low=0, high=1, high_open=True)
        if self.head not in ("last", "mean"):
            raise ValueError(f"head must be 'last' or 'mean', got {self.head!r}")
        _check_flag("channels_first", self.channels_first)
        if self.solver not in ("adam", "sgd"):
            raise ValueError(f"solver must be 'adam' or 'sgd', got {self.solver!r}")
        if not (isinstance(self.batch_size, str) and self.batch_size == "auto"):
            if isinstance(self.batch_size, str):
                raise ValueError(f"batch_size must be 'auto' or a positive int, got {self.batch_size!r}")
            _check_number("batch_size", self.batch_size, "int", low=1)
        _check_number("learning_rate_init", self.learning_rate_init, "real", low=0, low_open=True)
        _check_number("alpha", self.alpha, "real", low=0)
        _check_number("clip_norm", self.clip_norm, "real", low=0, low_open=True, allow_none=True)
        _check_number("max_iter", self.max_iter, "int", low=1)
        _check_number("tol", self.tol, "real", low=0)
        _check_number("n_iter_no_change", self.n_iter_no_change, "int", low=1, allow_none=True)
        if not (isinstance(self.early_stopping, str) and self.early_stopping == "auto"):
            if isinstance(self.early_stopping, str):
                raise ValueError(f"early_stopping must be 'auto' or a bool, got "
                                 f"{self.early_stopping!r}")
            _check_flag("early_stopping", self.early_stopping)
        _check_number("validation_fraction", self.validation_fraction, "real", low=0, high=1,
                      low_open=True, high_open=True)
        _check_flag("shuffle", self.shuffle)
        _check_flag("warm_start", self.warm_start)
        if not isinstance(self.verbose, (bool, np.bool_, Integral)):
            raise TypeError(f"verbose must be a bool or an int, got {self.verbose!r}")
        _check_number("momentum", self.momentum, "real", low=0, high=1)
        _check_flag("nesterovs_momentum", self.nesterovs_momentum)
        _check_number("beta_1", self.beta_1, "real", low=0, high=1, high_open=True)
        _check_number("beta_2", self.beta_2, "real", low=0, high=1, high_open=True)
        _check_number("epsilon", self.epsilon, "real", low=0, low_open=True)
        _check_flag("standardize", self.standardize)
        if self.learning_rate not in ("constant", "adaptive"):
            raise ValueError(f"learning_rate must be 'constant' or 'adaptive', got "
                             f"{self.learning_rate!r}")
        if not (isinstance(self.patch_size, str) and self.patch_size == "auto"):
            if isinstance(self.patch_size, str):
                raise ValueError(f"patch_size must be 'auto' or a positive int, got "
                                 f"{self.patch_size!r}")
            _check_number("patch_size", self.patch_size, "int", low=1)
        try:
            dtype = np.dtype(self.dtype)
        except TypeError:
            raise TypeError(f"dtype must be float32 or float64, got {self.dtype!r}") from None
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype}")
        return dtype

    # ------------------------------------------------------------------ input

    def _validate_X(self, X, *, reset, dtype=None):
        """Turn ``X`` into :class:`~lstmcy.estimators._sequences.Sequences`; on ``reset`` record its
        layout, else standardise it as the training data (:meth:`_standardized`)."""
        data = self._read_X(X, reset=reset, dtype=dtype)
        return data if reset else self._patched(self._standardized(data))

    def _fit_standardization(self, data, weights):
        """``input_mean_`` and ``input_scale_``: each feature's mean and standard deviation
        over the training time steps, a step weighted by its sample's weight (so that an
        integer weight counts as copies of the sample); None without ``standardize``."""
        if not self.standardize:
            self.input_mean_ = self.input_scale_ = None
            return
        rows = data.rows[data.row_index()].astype(np.float64)
        step_weights = np.repeat(weights, data.lengths)
        total = step_weights.sum()
        mean = step_weights @ rows / total
        rows -= mean
        scale = np.sqrt(step_weights @ np.square(rows) / total)
        # A constant feature (up to rounding) is only centred, as StandardScaler does.
        scale[scale <= 10 * np.finfo(np.float64).eps * np.maximum(1.0, np.abs(mean))] = 1.0
        self.input_mean_, self.input_scale_ = mean, scale

    def _standardized(self, data):
        """``data`` standardised with the training data's ``input_mean_`` and
        ``input_scale_`` (new rows in ``data``'s dtype), or ``data`` without them."""
        mean = getattr(self, "input_mean_", None)
        if mean is None:
            return data
        rows = ((data.rows - mean) / self.input_scale_).astype(data.rows.dtype, copy=False)
        return Sequences(rows, data.starts, data.lengths)

    def _fit_patch_size(self, lengths):
        """``patch_size_``: ``patch_size``, or with ``'auto'`` the fewest time steps per
        patch that read a training sequence of the median length (of ``lengths``) in at
        most ``_AUTO_PATCH_STEPS`` patches (:func:`auto_patch_size`)."""
        if self.patch_size == "auto":
            self.patch_size_ = auto_patch_size(lengths)
        else:
            self.patch_size_ = int(self.patch_size)

    def _patched(self, data):
        """``data`` read in patches of ``patch_size_`` consecutive time steps: a sequence of
        ``T`` steps of ``F`` features becomes ``ceil(T / patch_size_)`` steps of
        ``patch_size_ * F`` features (step by step, each step's features in order), its
        last patch completed by repeating its last time step; ``data`` itself for patches
        of one step."""
        k = getattr(self, "patch_size_", 1)
        if k == 1:
            return data
        lengths = -(-data.lengths // k)
        ends = np.cumsum(lengths)
        sequence = np.repeat(np.arange(data.n_samples), lengths)
        patch = np.arange(ends[-1]) - (ends - lengths)[sequence]
        steps = np.minimum(patch[:, None] * k + np.arange(k),
                           (data.lengths - 1)[sequence][:, None])
        rows = data.rows[data.starts[sequence][:, None] + steps]
        return Sequences(rows.reshape(len(rows), k * data.n_features), ends - lengths, lengths)

    def _read_X(self, X, *, reset, dtype=None):
        """Turn ``X`` into :class:`~lstmcy.estimators._sequences.Sequences`; on ``reset`` record its layout.

        ``n_features_in_`` is what scikit-learn's tools expect: the number of columns of a
        2-D ``X`` (the time steps of univariate sequences) and the number of features per
        step for 3-D or list input. ``input_size_`` is always the features per step.
        """
        if dtype is None:  # inference (see _raw_outputs)
            dtype = np.float64
        name = type(self).__name__
        channels_first = bool(self.channels_first)
        frames = pandas_sequences(X)
        if frames is not None:  # channels and time points are explicit
            X, kind, channels_first = frames, "list", False
        elif sp.issparse(X):
            kind = "table"
        elif is_sequence_list(X):
            kind = "list"
        else:
            ndim = getattr(X, "ndim", None)
            if ndim is None:
                try:  # lists, or objects with __array__ only
                    ndim = np.asarray(X).ndim
                except (ValueError, TypeError):
                    # ragged: a nested list or an awkward Array of sequences of any lengths
                    items = item_sequences(X)
                    if items is None:
                        raise ValueError(
                            f"X ({type(X).__name__}) is not an array: numpy cannot read it "
                            f"as one, and its items are not 1-D or 2-D sequences of numbers. "
                            f"Pass a 3-D array (n_samples, n_timesteps, n_features), a list "
                            f"of 2-D arrays (n_timesteps_i, n_features), a list of 1-D "
                            f"arrays or a nested DataFrame") from None
                    X, ndim = items, None
            kind = "list" if ndim is None else "3d" if ndim >= 3 else "table"

        if kind == "table":
            if reset or getattr(self, "_fitted_on_table", False):
                table = validate_data(self, X, reset=reset, dtype=[np.float64, np.float32],
                                      ensure_all_finite="allow-nan")
            else:
                table = check_array(X, dtype=[np.float64, np.float32], input_name="X",
                                    ensure_all_finite="allow-nan")
                if self.input_size_ != 1:
                    raise ValueError(
                        f"X is 2-D, read as univariate sequences (n_samples, n_timesteps), but "
                        f"{name} was fitted on sequences with {self.input_size_} features per "
                        f"time step: pass a 3-D array or a list of 2-D arrays")
            if reset:
                self._fitted_on_table = True
                self.input_size_ = 1
            return from_padded(table[:, :, None], dtype)

        if kind == "list":
            arrays = check_sequence_list(X, dtype, channels_first=channels_first)
            data = Sequences.from_arrays(arrays)
        else:
            data = check_3d(X, dtype, channels_first=channels_first, warn_layout=reset)
        if reset:
            self._fitted_on_table = False
            self.n_features_in_ = data.n_features
            self.input_size_ = data.n_features
            if hasattr(self, "feature_names_in_"):
                del self.feature_names_in_
        elif data.n_features != self.input_size_:
            raise ValueError(f"X has {data.n_features} features per time step, but {name} is "
                             f"expecting {self.input_size_} features per time step as input")
        return data

    def _sample_weights(self, sample_weight, targets, n_samples, *, incremental):
        """Per-sample weights (``sample_weight`` times any class weight), float64."""
        weights = _check_sample_weight(sample_weight, np.empty((n_samples, 0)),
                                       dtype=np.float64, ensure_non_negative=True)
        return weights

    # ------------------------------------------------------------------ model

    @property
    def _num_directions(self):
        return 2 if self.bidirectional else 1

    def _initialize(self, input_size, n_outputs, dtype, random_state):
        H, L, D = self.hidden_size, self.num_layers, self._num_directions
        bound = 1.0 / np.sqrt(H)  # torch.nn.LSTM's initialisation
        params = []
        for layer in range(L):
            in_size = input_size if layer == 0 else D * H
            for _ in range(D):
                for shape in ((4 * H, in_size), (4 * H, H), (4 * H,), (4 * H,)):
                    params.append(random_state.uniform(-bound, bound, shape).astype(dtype))
        self.lstm_params_ = params
        fan_in = D * H
        glorot = np.sqrt(6.0 / (fan_in + n_outputs))
        self.head_coef_ = random_state.uniform(-glorot, glorot, (fan_in, n_outputs)).astype(dtype)
        self.head_intercept_ = np.zeros(n_outputs, dtype=dtype)
        self.n_outputs_ = n_outputs
        self.n_iter_ = 0
        self.t_ = 0
        self.loss_curve_ = []
        self.validation_scores_ = None
        self.validation_loss_curve_ = None
        self.best_validation_score_ = None
        self.best_validation_loss_ = None
        self.best_loss_ = np.inf
        self._no_improvement_count = 0
        if hasattr(self, "_optimizer"):
            del self._optimizer

    def _check_same_model(self, dtype, incremental):
        """Raise ValueError naming the parameter if ``hidden_size``, ``num_layers``,
        ``bidirectional``, ``dtype`` or an int ``patch_size`` differs from the fitted
        model's, which ``warm_start`` and ``partial_fit`` continue (``'auto'`` keeps the
        fitted ``patch_size_``)."""
        H = self.lstm_params_[1].shape[1]
        D = self.head_coef_.shape[0] // H
        fitted = {"hidden_size": H, "num_layers": len(self.lstm_params_) // (4 * D),
                  "bidirectional": D == 2, "dtype": self.lstm_params_[0].dtype,
                  "patch_size": self.patch_size_}
        given = {"hidden_size": self.hidden_size, "num_layers": self.num_layers,
                 "bidirectional": bool(self.bidirectional), "dtype": dtype,
                 "patch_size": self.patch_size_ if self.patch_size == "auto" else self.patch_size}
        for name, value in fitted.items():
            if given[name] != value:
                shown = (lambda v: v.name) if name == "dtype" else repr
                how = ("partial_fit continues" if incremental
                       else "fit with warm_start=True continues")
                instead = ("call fit to train a new model" if incremental
                           else "set warm_start=False to train a new model")
                raise ValueError(
                    f"{name}={shown(given[name])} differs from the fitted model's "
                    f"{name}={shown(value)}: {how} the fitted parameters, so {name} cannot "
                    f"change; {instead}")

    def _all_params(self):
        return self.lstm_params_ + [self.head_coef_, self.head_intercept_]

    def _is_weight(self):
        """Which entries of :meth:`_all_params` get the L2 penalty (weights, not biases)."""
        return [k % 4 < 2 for k in range(len(self.lstm_params_))] + [True, False]

    def _lstm_config(self, train):
        """The :class:`lstmcy.LSTMConfig` of the estimator's LSTM calls."""
        return lstmcy.LSTMConfig(num_layers=self.num_layers, bidirectional=self.bidirectional,
                                 has_bias=True, dropout=self.dropout, train=train)

    def _features(self, part, y, h_n):
        """The head's input ``[B, D*H]`` from the LSTM's packed output ``y`` and final
        states ``h_n`` of a :class:`~lstmcy.estimators._sequences.Part`."""
        L, D = self.num_layers, self._num_directions
        if self.head == "last":
            return np.concatenate([h_n[(L - 1) * D + d] for d in range(D)], axis=1)
        return part.step_sums(y) / part.lengths[:, None].astype(y.dtype)

    def _feature_grads(self, part, y, h_n, d_features):
        """``dy`` and ``dh`` for ``lstm_backward`` from the gradient of the head's input."""
        H, L, D = self.hidden_size, self.num_layers, self._num_directions
        if self.head == "last":
            dh = np.zeros_like(h_n)
            for d in range(D):
                dh[(L - 1) * D + d] = d_features[:, d * H:(d + 1) * H]
            return _zeros(y.shape, y.dtype), dh
        per_step = d_features / part.lengths[:, None].astype(d_features.dtype)
        if part.uniform:
            return np.tile(per_step, (part.steps, 1)), None
        return per_step[part.positions], None

    def _raw_outputs(self, data, dtype=np.float64):
        """Head outputs before the output activation, ``[n_samples, n_outputs]``, float64.

        Inference (predict, score) runs in float64 whatever ``dtype`` trained the
        parameters, in calls of at least ``_PREDICT_MIN_SEQUENCES`` sequences, and the
        output layer sums in a fixed order (:func:`_linear`): a sample's outputs do not
        depend on which samples are predicted with it. The validation score during a fit
        passes the training ``dtype``: float64 would cost up to a tenth of an epoch.
        """
        params = [p.astype(dtype, copy=False) for p in self.lstm_params_]
        coef = self.head_coef_.astype(dtype, copy=False)
        intercept = self.head_intercept_.astype(dtype, copy=False)
        out = np.empty((data.n_samples, self.n_outputs_), dtype=np.float64)
        for part in data.parts(_PREDICT_CHUNK, _PREDICT_TOKENS, _PREDICT_MIN_SEQUENCES):
            x, batch_sizes = part.kernel_input(dtype)
            y, h_n, _, _ = lstmcy.lstm_forward(x, None, params, config=self._lstm_config(False),
                                               batch_sizes=batch_sizes)
            rows = y.reshape(len(part.input), -1)  # packed rows (a view)
            features = self._features(part, rows, h_n)[:len(part.sample_index)]
            out[part.sample_index] = _linear(features, coef, intercept)
        return out

    def _loss_and_grads(self, batch, targets, weights, seed):
        """Loss and gradients of :meth:`_all_params` on one :class:`~lstmcy.estimators._sequences.Batch`
        (``targets`` and ``weights`` in its order).

        The loss is ``(sum_i w_i * loss_i + 0.5 * alpha * ||W||^2) / sum_i w_i`` over the
        batch's samples ``i`` (``weights``), as MLP's with ``sample_weight``. The LSTM's
        gradients are the sums of its parts' (one kernel call each).
        """
        config = self._lstm_config(True)
        masks_from = None if seed is None else np.random.default_rng(seed)
        runs = []
        for part in batch.parts:
            x, batch_sizes = part.kernel_input()
            y, h_n, _, cache = lstmcy.lstm_forward(
                x, None, self.lstm_params_, config=config, batch_sizes=batch_sizes,
                seed=masks_from)
            y_shape = y.shape
            y = y.reshape(len(part.input), -1)  # packed rows (a view)
            runs.append((part, y, h_n, cache, self._features(part, y, h_n), y_shape))
        features = runs[0][4] if len(runs) == 1 else np.concatenate([run[4] for run in runs])
        raw = features @ self.head_coef_ + self.head_intercept_
        weight_sum = float(weights.sum())
        sample_loss, d_raw = self._output_loss(raw.astype(np.float64), targets)
        loss = float(weights @ sample_loss) / weight_sum
        d_raw = (d_raw * (weights / weight_sum)[:, None]).astype(raw.dtype)
        d_coef = features.T @ d_raw
        d_intercept = d_raw.sum(axis=0)
        d_features = d_raw @ self.head_coef_.T
        d_lstm = None
        start = 0
        while runs:
            part, y, h_n, cache, part_features, y_shape = runs.pop(0)  # its cache freed once used
            stop = start + len(part_features)
            dy, dh = self._feature_grads(part, y, h_n, d_features[start:stop])
            start = stop
            d_part = cache.backward(dy.reshape(y_shape), dh,
                                    output_mask=(False, False, False, True)).dparams
            if d_lstm is None:
                d_lstm = list(d_part)
            else:
                for total, grad in zip(d_lstm, d_part):
                    total += grad
        grads = d_lstm + [d_coef, d_intercept]
        if self.alpha:
            penalty = 0.0
            scale = self.alpha / weight_sum
            for param, grad, is_weight in zip(self._all_params(), grads, self._is_weight()):
                if is_weight:
                    penalty += float(np.vdot(param, param))
                    grad += grad.dtype.type(scale) * param
            loss += 0.5 * scale * penalty
        return loss, grads

    def _evaluate(self, data, targets, weights):
        """Weighted mean loss (without the L2 term) and score of ``data``, computed in the
        training dtype."""
        raw = self._raw_outputs(data, self.lstm_params_[0].dtype)
        sample_loss, _ = self._output_loss(raw, targets)
        return float(np.average(sample_loss, weights=weights)), \
            self._score_outputs(raw, targets, weights)

    def _clip(self, grads):
        """Scale ``grads`` in place to a global L2 norm of at most ``clip_norm``.

        Where the squares overflow the gradients' dtype (float32's from a norm of about
        1.8e19), the norm is summed again in float64 over the gradients divided by their
        largest magnitude. A non-finite norm (an inf or NaN gradient) raises, as PyTorch's
        ``clip_grad_norm_(error_if_nonfinite=True)``: scaling by it would zero (or NaN)
        every gradient and silently stop training.
        """
        if self.clip_norm is None:
            return
        with np.errstate(over="ignore", invalid="ignore"):
            norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads))
        if not math.isfinite(norm):
            largest = max(float(np.abs(g).max(initial=0.0)) for g in grads)
            if math.isfinite(largest):
                norm = largest * math.sqrt(sum(
                    float(np.square(g.astype(np.float64) / largest).sum()) for g in grads))
        if not math.isfinite(norm):
            raise ValueError(
                f"The gradients' global norm is {norm}, so it cannot be clipped to clip_norm="
                f"{self.clip_norm}: a gradient is infinite or NaN. The input data or the "
                f"targets may contain large values and need to be scaled, or "
                f"learning_rate_init is too large.")
        if norm > self.clip_norm:
            scale = self.clip_norm / norm
            for grad in grads:
                grad *= grad.dtype.type(scale)

    def _make_optimizer(self):
        params = self._all_params()
        if self.solver == "adam":
            return Adam(params, self.learning_rate_init, self.beta_1, self.beta_2, self.epsilon)
        return SGD(params, self.learning_rate_init, self.momentum, self.nesterovs_momentum)

    # ------------------------------------------------------------------ training loop

    def _fit(self, X, y, *, incremental, classes=None, sample_weight=None):
        dtype = self._validate_params()
        if self.dropout > 0 and self.num_layers == 1:
            # As torch.nn.LSTM: dropout acts between layers, so one layer has none.
            warnings.warn(f"dropout option adds dropout after all but last recurrent layer, so "
                          f"non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={self.dropout} and num_layers={self.num_layers}",
                          UserWarning, stacklevel=3)
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None.")
        fitted = hasattr(self, "lstm_params_")
        first_pass = not fitted or (not self.warm_start and not incremental)
        if not first_pass:
            self._check_same_model(dtype, incremental)
        data = self._validate_X(X, reset=first_pass, dtype=dtype)
        targets = self._validate_targets(y, data.n_samples, first_pass=first_pass,
                                         incremental=incremental, classes=classes, dtype=dtype)
        weights = self._sample_weights(sample_weight, targets, data.n_samples,
                                       incremental=incremental)
        if not weights.any():
            raise ValueError("The weights of the samples (sample_weight times class_weight) "
                             "are all zero: at least one must be positive")
        if first_pass:
            self._random_state = check_random_state(self.random_state)
            # from the samples of positive weight: a zero weight is as if left out
            self._fit_patch_size(data.lengths[weights > 0])
            self._initialize(data.n_features * self.patch_size_, self._n_outputs_for(targets),
                             dtype, self._random_state)
        elif self.head_coef_.shape[1] != self._n_outputs_for(targets):
            raise ValueError(f"y has {self._n_outputs_for(targets)} outputs, but "
                             f"{type(self).__name__} was fitted with {self.head_coef_.shape[1]}")
        if not incremental or not hasattr(self, "_optimizer"):
            self._optimizer = self._make_optimizer()
        if not (weights > 0).all():  # a zero weight is the same as leaving the sample out
            keep = np.flatnonzero(weights > 0)
            data, targets, weights = data.subset(keep), targets[keep], weights[keep]
        if first_pass:  # later passes' data is standardised and patched by _validate_X
            self._fit_standardization(data, weights)
            data = self._patched(self._standardized(data))
        self._train(data, targets, weights, incremental=incremental)
        return self

    def _holds_out(self, n_samples, targets):
        """Whether this fit holds out a validation set (``early_stopping``)."""
        if self.early_stopping is False:
            return False
        n_validation = math.ceil(self.validation_fraction * n_samples)
        smaller_part = min(n_validation, n_samples - n_validation)
        reason = None
        if self._stratify:
            counts = np.bincount(targets)
            rarest = np.flatnonzero(counts)[np.argmin(counts[counts > 0])]
            if counts[rarest] < 2:
                reason = (f"class {self.classes_[rarest].item()!r} has 1 sample, and a "
                          f"stratified split needs 2 of each class")
            elif smaller_part < max(2, np.count_nonzero(counts)):
                reason = (f"{smaller_part} samples cannot hold each of the "
                          f"{np.count_nonzero(counts)} classes")
        elif smaller_part < 2:
            reason = f"a part of {smaller_part} sample{'s' if smaller_part != 1 else ''} is too small"
        if self.early_stopping == "auto":
            return reason is None and n_validation >= _AUTO_MIN_VALIDATION
        if reason is not None:
            raise ValueError(
                f"early_stopping=True holds out validation_fraction={self.validation_fraction} "
                f"of the {n_samples} training samples ({n_validation}) for validation, but "
                f"{reason}: use more data, another validation_fraction or "
                f"early_stopping='auto'")
        return True

    def _train(self, data, targets, weights, *, incremental):
        random_state = self._random_state
        early_stopping = not incremental and self._holds_out(data.n_samples, targets)
        val_data = None
        if early_stopping:
            train_index, val_index = train_test_split(
                np.arange(data.n_samples), random_state=random_state,
                test_size=self.validation_fraction,
                stratify=targets if self._stratify else None)
            val_data, val_targets, val_weights = (data.subset(val_index), targets[val_index],
                                                  weights[val_index])
            data, targets, weights = (data.subset(train_index), targets[train_index],
                                      weights[train_index])
            if self.validation_scores_ is None:
                self.validation_scores_, self.validation_loss_curve_ = [], []
            self.best_validation_loss_ = np.inf
            self.best_loss_ = None
        elif self.best_loss_ is None:  # warm start after a fit with early stopping
            self.best_loss_ = np.inf
        if not incremental:
            self._no_improvement_count = 0
        n_samples = data.n_samples
        batch_size = (auto_batch_size(n_samples) if self.batch_size == "auto"
                      else min(self.batch_size, n_samples))
        n_batches = -(-n_samples // batch_size)
        max_epochs = 1 if incremental else self.max_iter
        progress = None
        if self.verbose:
            progress = FitProgress(type(self).__name__, max_epochs, self.n_iter_ + 1, n_batches)
            progress.begin(n_samples, 0 if val_data is None else val_data.n_samples, batch_size)
        params = self._all_params()
        stop_message = None
        reductions = 0  # of the learning rate, this fit
        for _ in range(max_epochs):
            order = random_state.permutation(n_samples) if self.shuffle else np.arange(n_samples)
            loss_sum = weight_sum = 0.0
            for number, start in enumerate(range(0, n_samples, batch_size), start=1):
                batch = data.batch(order[start:start + batch_size])
                seed = (int(random_state.randint(np.iinfo(np.int32).max))
                        if self.dropout > 0 and self.num_layers > 1 else None)
                batch_weights = weights[batch.sample_index]
                loss, grads = self._loss_and_grads(batch, targets[batch.sample_index],
                                                   batch_weights, seed)
                if not np.isfinite(loss):
                    raise ValueError("Solver produced a non-finite loss. The input data may contain "
                                     "large values and need to be scaled, or learning_rate_init "
                                     "is too large.")
                loss_sum += loss * float(batch_weights.sum())
                weight_sum += float(batch_weights.sum())
                self._clip(grads)
                self._optimizer.update(params, grads)
                if progress is not None:
                    progress.batch_done(self.n_iter_ + 1, number)
            self.n_iter_ += 1
            self.t_ += n_samples
            self.loss_curve_.append(loss_sum / weight_sum)

            best = False
            if early_stopping:
                val_loss, score = self._evaluate(val_data, val_targets, val_weights)
                self.validation_loss_curve_.append(val_loss)
                self.validation_scores_.append(score)
                improved = val_loss < self.best_validation_loss_ - self.tol
                if val_loss < self.best_validation_loss_:
                    best = True
                    self.best_validation_loss_ = val_loss
                    self.best_validation_score_ = score
                    self._best_params = [p.copy() for p in params]
                    self._best_epoch = self.n_iter_
            else:
                val_loss = score = None
                improved = self.loss_curve_[-1] < self.best_loss_ - self.tol
                self.best_loss_ = min(self.best_loss_, self.loss_curve_[-1])
            self._no_improvement_count = 0 if improved else self._no_improvement_count + 1
            if progress is not None:
                progress.epoch_done(self.n_iter_, self.loss_curve_[-1], val_loss, score, best)

            if self.n_iter_no_change is not None and \
                    self._no_improvement_count > self.n_iter_no_change:
                watched = "Validation loss" if early_stopping else "Training loss"
                self._no_improvement_count = 0
                if self.learning_rate == "adaptive" and reductions < _LR_REDUCTIONS:
                    reductions += 1
                    self._optimizer.learning_rate /= _LR_DIVISOR
                    if progress is not None:
                        progress.note(f"{watched} did not improve more than tol={self.tol} for "
                                      f"{self.n_iter_no_change} consecutive epochs: learning "
                                      f"rate divided by {_LR_DIVISOR} to "
                                      f"{self._optimizer.learning_rate:.3g}.")
                    continue
                stop_message = (f"{watched} did not improve more than tol={self.tol} for "
                                f"{self.n_iter_no_change} consecutive epochs"
                                + (f" at the learning rate divided by {_LR_DIVISOR}"
                                   f"{'' if reductions == 1 else f'^{reductions}'}"
                                   if reductions else "") + ". Stopping.")
                break
        if stop_message is None and not incremental:
            stop_message = f"Reached max_iter={self.max_iter}."
            if self.n_iter_no_change is not None:
                warnings.warn(f"Stochastic Optimizer: Maximum iterations ({self.max_iter}) reached "
                              f"and the optimization hasn't converged yet.", ConvergenceWarning)
        if early_stopping and hasattr(self, "_best_params"):
            for param, best in zip(params, self._best_params):
                param[...] = best
            stop_message += (f" Kept the parameters of epoch {self._best_epoch} (validation loss "
                             f"{self.best_validation_loss_:.4f}, score "
                             f"{self.best_validation_score_:.4f}).")
            del self._best_params, self._best_epoch
        if progress is not None and stop_message is not None:
            progress.end(stop_message)

    # ------------------------------------------------------------------ public API

    def fit(self, X, y, sample_weight=None):
        """Fit the model to sequences ``X`` and targets ``y``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_timesteps, n_features) or (n_samples, n_timesteps), \
                or list of arrays of shape (n_timesteps_i, n_features) or (n_timesteps_i,)
            Training sequences. 2-D input is read as univariate sequences; a list may hold
            sequences of different lengths; trailing NaN ends a sequence. With
            ``channels_first=True``, 3-D input and 2-D list items are read as
            ``(..., n_channels, n_timepoints)``.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Target values (class labels for the classifier).
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weight of each sample in the loss and in the validation loss
            and score of early stopping. An integer weight counts like that many copies
            of the sample, a zero weight like leaving it out (but ``classes_`` comes
            from ``y`` whatever the weights, as in scikit-learn).

        Returns
        -------
        self : object
            The fitted estimator.
        """
        return self._fit(X, y, incremental=False, sample_weight=sample_weight)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.three_d_array = True
        return tags
