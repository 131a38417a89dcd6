"""scikit-learn's LSTM sequence classifier (:class:`LSTMClassifier`)."""
import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.metrics import accuracy_score
from sklearn.utils.class_weight import compute_class_weight
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_consistent_length, check_is_fitted, column_or_1d

from lstmcy.estimators._base import _BaseLSTM


class LSTMClassifier(ClassifierMixin, _BaseLSTM):
    """LSTM sequence classifier trained with lstmcy's exact forward and backward.

    An LSTM reads each sequence; its last hidden state (``head='last'``, directions
    concatenated) or the mean of its outputs over time (``head='mean'``) goes through a
    linear layer and a softmax. The loss is the weighted mean cross-entropy plus
    ``0.5 * alpha * ||W||^2 / sum(weights)`` over all weight matrices (not biases) and a
    mini-batch's samples, as in :class:`~sklearn.neural_network.MLPClassifier`.

    Parameters
    ----------
    hidden_size : int, default=64
        Features of the LSTM's hidden state.
    num_layers : int, default=1
        Stacked LSTM layers.
    bidirectional : bool, default=False
        Also read each sequence backwards; the head sees both directions.
    dropout : float in [0, 1), default=0.0
        Dropout on the output of each LSTM layer except the last, during training
        (so it needs ``num_layers > 1``; with one layer it warns, as ``torch.nn.LSTM``).
        Masks are drawn from ``random_state``.
    head : {'last', 'mean'}, default='last'
        Features of a sequence: the final hidden state of the top layer (for a
        variable-length batch, each sequence's state at its own last step), or its
        output averaged over the sequence's time steps.
    channels_first : bool, default=False
        Read 3-D ``X`` as ``(n_samples, n_channels, n_timepoints)`` and the items of a
        list as ``(n_channels, n_timepoints_i)``: the layout of sktime and aeon. Without
        it a 3-D ``X`` whose features outnumber its time steps tenfold (or that has one
        step) gets a warning at ``fit``.
    solver : {'adam', 'sgd'}, default='adam'
        Optimiser; 'sgd' uses ``momentum`` and ``nesterovs_momentum``.
    batch_size : int or 'auto', default='auto'
        Mini-batch size; 'auto' gives about ten steps per epoch, with batches of 4 to 64
        sequences (``min(64, max(4, n // 10))``, at most ``n``, for ``n`` training
        sequences).
    learning_rate_init : float, default=0.001
        Step size.
    alpha : float, default=0.0001
        Strength of the L2 penalty on the weights.
    clip_norm : float or None, default=5.0
        Rescale each mini-batch's gradients so their global L2 norm (summed in float64)
        is at most this; None disables clipping. An infinite or NaN gradient raises a
        ValueError.
    max_iter : int, default=200
        Maximum number of epochs (for each call to ``fit``).
    tol : float, default=1e-4
        Minimum decrease of the training loss (or of the validation loss with early
        stopping) that resets the ``n_iter_no_change`` counter.
    n_iter_no_change : int or None, default=10
        Stop after this many epochs without an improvement of ``tol``. None trains for
        exactly ``max_iter`` epochs (and does not warn about convergence).
    early_stopping : 'auto' or bool, default='auto'
        Hold out ``validation_fraction`` of the data (stratified by class), watch the
        weighted loss on it after every epoch, stop when it has not improved by ``tol``
        for ``n_iter_no_change`` epochs and keep the parameters of the epoch where it was
        lowest. 'auto' does so when the held-out part has at least 100 samples and every
        class can be on both sides (from 991 samples on); smaller sets, and
        False, train on all samples and stop on the training loss. True holds out at any
        size where the split is possible.
    validation_fraction : float in (0, 1), default=0.1
        Share of the training data held out for early stopping.
    shuffle : bool, default=True
        Shuffle the samples every epoch.
    random_state : int, RandomState instance or None, default=None
        Seeds initialisation, shuffling, the validation split and dropout masks.
    warm_start : bool, default=False
        Let ``fit`` continue from the current parameters instead of re-initialising.
        ``hidden_size``, ``num_layers``, ``bidirectional``, ``dtype`` and an int
        ``patch_size`` cannot change in between (nor between ``partial_fit`` calls): a
        ValueError names the changed one. 'auto' keeps the fitted ``patch_size_``.
    verbose : bool or int, default=0
        Print the progress of training: one line per epoch with the training loss, the
        validation loss and score, the time elapsed and an upper bound on the time
        left, a line every 30 s inside long epochs, and why training stopped.
    momentum : float in [0, 1], default=0.9
        Momentum of 'sgd'.
    nesterovs_momentum : bool, default=True
        Nesterov momentum for 'sgd'.
    beta_1, beta_2 : float in [0, 1), default=0.9, 0.999
        Decay rates of Adam's moment estimates.
    epsilon : float, default=1e-8
        Adam's numerical stability term.
    dtype : {numpy.float32, numpy.float64}, default=numpy.float32
        Precision of the parameters and of training. Predictions are computed in
        float64 from these parameters; a sample's prediction does not depend, to the
        last bit, on which samples are predicted with it.
    standardize : bool, default=True
        Standardise each feature (channel) with its mean and standard deviation over
        the training time steps (weighted by ``sample_weight``), fitted by ``fit`` (or
        the first ``partial_fit``) and applied to every later input; a constant feature
        is only centred. False reads the input as it is.
    learning_rate : {'adaptive', 'constant'}, default='adaptive'
        'adaptive': when the watched loss has not improved by ``tol`` for
        ``n_iter_no_change`` epochs, divide the learning rate by 5 and go on, at most
        twice; the next such plateau stops training. 'constant' stops at the first.
    patch_size : int or 'auto', default='auto'
        Consecutive time steps the LSTM reads as one step: a sequence of ``T`` steps of
        ``F`` features (after standardisation) becomes ``ceil(T / patch_size)`` steps of
        ``patch_size * F`` features, each step's features in order, the last patch
        completed by repeating the sequence's last time step. 'auto' takes the fewest
        that read a training sequence of the median length in at most 32 steps
        (``ceil(median / 32)``): 1 up to 32 steps, 5 for 150. Long series read one point
        at a time train slowly and unreliably through the recurrence; 1 reads every
        time step as it is.
    class_weight : dict, 'balanced' or None, default=None
        Weights of the classes, ``{label: weight}``, multiplying ``sample_weight``.
        'balanced' weighs each class by ``n_samples / (n_classes * count)``, counting
        the samples' weights (so it is not available in ``partial_fit``). None gives
        every class weight one.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels.
    n_features_in_ : int
        Columns of a 2-D training ``X`` (the length of univariate sequences), or
        features per time step for 3-D or list input.
    feature_names_in_ : ndarray of str
        Column names, when trained on a 2-D DataFrame with string column names.
    input_size_ : int
        Features per time step of the input (the LSTM reads ``patch_size_`` times as
        many per step).
    patch_size_ : int
        Time steps per patch (``patch_size``, or what 'auto' chose at the first fit).
    input_mean_, input_scale_ : ndarray of shape (input_size_,) or None
        The standardisation of the input (None with ``standardize=False``).
    lstm_params_ : list of ndarray
        LSTM parameters in lstmcy's (and ``torch.nn.LSTM``'s) order: per layer, forward
        direction then reverse, ``w_ih [4H, I_l]``, ``w_hh [4H, H]``, ``b_ih``, ``b_hh``;
        the first layer's ``I_0`` is ``patch_size_ * input_size_``.
    head_coef_ : ndarray of shape (D*hidden_size, n_outputs)
        Weights of the output layer.
    head_intercept_ : ndarray of shape (n_outputs,)
        Bias of the output layer.
    n_outputs_ : int
        Output units.
    loss_curve_ : list of float
        Mean training loss (weighted, with the L2 term) of each epoch.
    validation_loss_curve_ : list of float or None
        Weighted mean loss on the held-out data after each epoch (None without early
        stopping).
    validation_scores_ : list of float or None
        Accuracy on the held-out data after each epoch (None without early stopping).
    best_validation_loss_ : float or None
        Lowest of the last fit's ``validation_loss_curve_``: the kept parameters' loss.
    best_validation_score_ : float or None
        Validation score of the kept parameters (the epoch of ``best_validation_loss_``).
    best_loss_ : float or None
        Lowest training loss (None with early stopping).
    n_iter_ : int
        Epochs run.
    t_ : int
        Training samples seen by the optimiser.
    out_activation_ : str
        'softmax'.

    Examples
    --------
    >>> import numpy as np
    >>> from lstmcy.estimators import LSTMClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((60, 5, 2))
    >>> y = (X[:, :, 0].sum(axis=1) > 0).astype(int)
    >>> clf = LSTMClassifier(hidden_size=8, max_iter=5, random_state=0).fit(X, y)
    >>> clf.predict_proba(X[:2]).shape
    (2, 2)
    """

    _stratify = True

    # scikit-learn reads an estimator's parameters from its own __init__ signature, so the
    # base class's parameters are repeated here (as MLPClassifier does) with class_weight.
    def __init__(self, hidden_size=64, num_layers=1, bidirectional=False, dropout=0.0,
                 head="last", channels_first=False, solver="adam", batch_size="auto",
                 learning_rate_init=0.001, alpha=0.0001, clip_norm=5.0, max_iter=200, tol=1e-4,
                 n_iter_no_change=10, early_stopping="auto", validation_fraction=0.1,
                 shuffle=True, random_state=None, warm_start=False, verbose=0, momentum=0.9,
                 nesterovs_momentum=True, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 dtype=np.float32, standardize=True, learning_rate="adaptive", patch_size="auto",
                 class_weight=None):
        super().__init__(
            hidden_size=hidden_size, num_layers=num_layers, bidirectional=bidirectional,
            dropout=dropout, head=head, channels_first=channels_first, solver=solver,
            batch_size=batch_size, learning_rate_init=learning_rate_init, alpha=alpha,
            clip_norm=clip_norm, max_iter=max_iter, tol=tol, n_iter_no_change=n_iter_no_change,
            early_stopping=early_stopping, validation_fraction=validation_fraction,
            shuffle=shuffle, random_state=random_state, warm_start=warm_start, verbose=verbose,
            momentum=momentum, nesterovs_momentum=nesterovs_momentum, beta_1=beta_1,
            beta_2=beta_2, epsilon=epsilon, dtype=dtype, standardize=standardize,
            learning_rate=learning_rate, patch_size=patch_size)
        self.class_weight = class_weight

    def _validate_params(self):
        dtype = super()._validate_params()
        if not (self.class_weight is None or isinstance(self.class_weight, dict)
                or (isinstance(self.class_weight, str) and self.class_weight == "balanced")):
            raise ValueError(f"class_weight must be None, 'balanced' or a dict {{label: weight}}, "
                             f"got {self.class_weight!r}")
        return dtype

    def _n_outputs_for(self, targets):
        return len(self.classes_)

    def _validate_targets(self, y, n_samples, *, first_pass, incremental, classes, dtype):
        y = column_or_1d(y, warn=True)
        check_consistent_length(np.empty(n_samples), y)
        check_classification_targets(y)
        if incremental:
            if not hasattr(self, "classes_") or first_pass:
                if classes is None:
                    raise ValueError("classes must be passed on the first call to partial_fit.")
                self.classes_ = np.unique(np.asarray(classes))
            elif classes is not None and not np.array_equal(np.unique(np.asarray(classes)), self.classes_):
                raise ValueError(f"classes={classes!r} is not the same as on the first call to "
                                 f"partial_fit, which was {self.classes_!r}")
            unseen = np.setdiff1d(y, self.classes_)
            if len(unseen):
                raise ValueError(f"y has classes not in self.classes_ {self.classes_!r}: {unseen!r}")
        elif first_pass:
            self.classes_ = np.unique(y)
        else:
            if not np.array_equal(np.unique(y), self.classes_):
                raise ValueError(f"warm_start can only be used where y has the same classes as in "
                                 f"the previous call to fit. Previously got {self.classes_!r}, y has "
                                 f"{np.unique(y)!r}")
        self.out_activation_ = "softmax"
        return np.searchsorted(self.classes_, y)

    def _sample_weights(self, sample_weight, codes, n_samples, *, incremental):
        weights = super()._sample_weights(sample_weight, codes, n_samples,
                                          incremental=incremental)
        if self.class_weight is None:
            return weights
        if isinstance(self.class_weight, str):  # 'balanced'
            if incremental:
                raise ValueError(
                    "class_weight='balanced' is not supported for partial_fit: it needs the "
                    "class frequencies of all the data. Compute them with sklearn.utils."
                    "class_weight.compute_class_weight('balanced', classes=classes, y=y) on "
                    "(a large enough sample of) the training targets and pass the result as "
                    "class_weight={label: weight}.")
            counts = np.bincount(codes, weights=weights, minlength=len(self.classes_))
            present = counts > 0
            per_class = np.ones(len(self.classes_))
            per_class[present] = counts.sum() / (present.sum() * counts[present])
        else:
            per_class = compute_class_weight(self.class_weight, classes=self.classes_,
                                             y=self.classes_[codes])
        return weights * per_class[codes]

    def _output_loss(self, raw, codes):
        """Cross-entropy of the softmax of ``raw`` per sample and its gradient w.r.t. ``raw``."""
        shifted = raw - raw.max(axis=1, keepdims=True)
        log_proba = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        rows = np.arange(len(codes))
        grad = np.exp(log_proba)
        grad[rows, codes] -= 1.0
        return -log_proba[rows, codes], grad

    def _score_outputs(self, raw, codes, weights):
        return accuracy_score(codes, raw.argmax(axis=1), sample_weight=weights)

    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """Update the model with one epoch over ``X`` (no early stopping).

        Parameters
        ----------
        X : array-like or list of arrays
            As in :meth:`fit`.
        y : array-like of shape (n_samples,)
            Class labels.
        classes : array-like of shape (n_classes,), default=None
            All classes that can appear in any call; required on the first call.
        sample_weight : array-like of shape (n_samples,), default=None
            As in :meth:`fit`.

        Returns
        -------
        self : object
            The updated estimator.
        """
        return self._fit(X, y, incremental=True, classes=classes, sample_weight=sample_weight)

    def decision_function(self, X):
        """Class scores (logits) of the output layer.

        Parameters
        ----------
        X : array-like or list of arrays
            As in :meth:`fit`.

        Returns
        -------
        scores : ndarray of shape (n_samples,) or (n_samples, n_classes)
            For two classes, the score of ``classes_[1]`` minus that of ``classes_[0]``
            (positive means ``classes_[1]``), as scikit-learn's binary convention.
        """
        check_is_fitted(self, "lstm_params_")
        raw = self._raw_outputs(self._validate_X(X, reset=False))
        if raw.shape[1] == 2:
            return raw[:, 1] - raw[:, 0]
        return raw

    def predict_proba(self, X):
        """Class probabilities.

        Parameters
        ----------
        X : array-like or list of arrays
            As in :meth:`fit`.

        Returns
        -------
        proba : ndarray of shape (n_samples, n_classes)
            Columns follow ``classes_``.
        """
        check_is_fitted(self, "lstm_params_")
        raw = self._raw_outputs(self._validate_X(X, reset=False))
        raw -= raw.max(axis=1, keepdims=True)
        np.exp(raw, out=raw)
        raw /= raw.sum(axis=1, keepdims=True)
        return raw

    def predict_log_proba(self, X):
        """Logarithm of :meth:`predict_proba`.

        Parameters
        ----------
        X : array-like or list of arrays
            As in :meth:`fit`.

        Returns
        -------
        log_proba : ndarray of shape (n_samples, n_classes)
        """
        return np.log(self.predict_proba(X))

    def predict(self, X):
        """Predicted class of each sequence.

        Parameters
        ----------
        X : array-like or list of arrays
            As in :meth:`fit`.

        Returns
        -------
        y : ndarray of shape (n_samples,)
        """
        check_is_fitted(self, "lstm_params_")
        raw = self._raw_outputs(self._validate_X(X, reset=False))
        return self.classes_[raw.argmax(axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = False
        return tags
