"""scikit-learn's LSTM sequence regressor (:class:`LSTMRegressor`)."""
import numpy as np
from sklearn.base import RegressorMixin
from sklearn.metrics import r2_score
from sklearn.utils.validation import check_array, check_consistent_length, check_is_fitted

from lstmcy.estimators._base import _BaseLSTM


class LSTMRegressor(RegressorMixin, _BaseLSTM):
    """LSTM sequence regressor trained with lstmcy's exact forward and backward.

    As :class:`LSTMClassifier` with an identity output: the loss is the weighted mean
    over a mini-batch of ``sum((prediction - y)**2) / 2`` (summed over outputs) plus the
    L2 term. ``y`` may have several columns (multi-output regression); with one
    (1-D, or of shape (n_samples, 1)), predictions are 1-D, as ``MLPRegressor``'s.

    Parameters
    ----------
    hidden_size, num_layers, bidirectional, dropout, head, channels_first, solver, \
batch_size, learning_rate_init, alpha, clip_norm, max_iter, tol, n_iter_no_change, \
early_stopping, validation_fraction, shuffle, random_state, warm_start, verbose, momentum, \
nesterovs_momentum, beta_1, beta_2, epsilon, dtype, standardize, learning_rate, \
patch_size
        As in :class:`LSTMClassifier`. The validation set of early stopping is not
        stratified, and its score is R² (weighted by ``sample_weight``).

    Attributes
    ----------
    n_features_in_, feature_names_in_, input_size_, patch_size_, input_mean_, input_scale_, \
lstm_params_, loss_curve_, \
validation_loss_curve_, validation_scores_, best_validation_loss_, best_validation_score_, \
best_loss_, n_iter_, t_
        As in :class:`LSTMClassifier` (validation scores are R²).
    head_coef_ : ndarray of shape (D*hidden_size, n_outputs)
        Weights of the output layer.
    head_intercept_ : ndarray of shape (n_outputs,)
        Bias of the output layer.
    n_outputs_ : int
        Number of targets.
    out_activation_ : str
        'identity'.

    Examples
    --------
    >>> import numpy as np
    >>> from lstmcy.estimators import LSTMRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((60, 5))
    >>> y = X.sum(axis=1)
    >>> LSTMRegressor(hidden_size=8, max_iter=5, random_state=0).fit(X, y).predict(X[:3]).shape
    (3,)
    """

    _stratify = False

    def _n_outputs_for(self, targets):
        return targets.shape[1]

    def _validate_targets(self, y, n_samples, *, first_pass, incremental, classes, dtype):
        y = check_array(y, ensure_2d=False, dtype=[np.float64, np.float32], input_name="y")
        if y.ndim not in (1, 2):
            raise ValueError(f"y must be 1-D or 2-D, got shape {y.shape}")
        check_consistent_length(np.empty(n_samples), y)
        self.out_activation_ = "identity"
        return np.asarray(y.reshape(n_samples, -1), dtype=dtype)

    def _output_loss(self, raw, targets):
        """Half the squared error per sample (summed over outputs) and its gradient."""
        diff = raw - targets
        return 0.5 * np.einsum("ij,ij->i", diff, diff), diff

    def _score_outputs(self, raw, targets, weights):
        return r2_score(targets, raw, sample_weight=weights)

    def partial_fit(self, X, y, sample_weight=None):
        """Update the model with one epoch over ``X`` (no early stopping).

        Parameters
        ----------
        X : array-like or list of arrays
            As in :meth:`fit`.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Targets.
        sample_weight : array-like of shape (n_samples,), default=None
            As in :meth:`fit`.

        Returns
        -------
        self : object
            The updated estimator.
        """
        return self._fit(X, y, incremental=True, sample_weight=sample_weight)

    def predict(self, X):
        """Predicted targets.

        Parameters
        ----------
        X : array-like or list of arrays
            As in :meth:`fit`.

        Returns
        -------
        y : ndarray of shape (n_samples,) or (n_samples, n_outputs)
            float64; 1-D when the model has one output (also when fitted on ``y`` of
            shape (n_samples, 1)), as :class:`~sklearn.neural_network.MLPRegressor`.
        """
        check_is_fitted(self, "lstm_params_")
        raw = self._raw_outputs(self._validate_X(X, reset=False))
        return raw.ravel() if self.n_outputs_ == 1 else raw

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = True
        return tags
