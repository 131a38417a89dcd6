"""Tests of lstmcy.estimators: scikit-learn conformance, learning, variable lengths, state.

The conformance suite runs scikit-learn's own ``parametrize_with_checks`` on small
models; the learning tests train to a threshold (digits accuracy, noisy-sine R²); the
gradient test compares the estimator's loss gradients (head in numpy + lstm_backward,
packed variable-length batches) with central finite differences.
"""
import pickle
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import ConvergenceWarning, NotFittedError  # noqa: E402
from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

from estimator_helpers import (motions, params_equal, quiet_fit,  # noqa: E402
                               ragged_sequences, sum_sign_problem)
from lstmcy.estimators._sequences import Sequences  # noqa: E402
from lstmcy.estimators import LSTMClassifier, LSTMRegressor, auto_batch_size  # noqa: E402


# Small models keep the suite quick; they must still learn scikit-learn's toy problems
# (blobs accuracy > 0.83, regression R² > 0.5 on the training data) in a few epochs. The
# third is a stacked bidirectional mean-head variant with dropout. All train on
# mini-batches; the classifiers hold out a validation set ('auto') where the data allows
# it. The regressor does not: on check_regressors_train's noisy data (one informative
# step of ten) the epoch of lowest validation loss comes before the training data is fit
# to R² 0.5. The defaults are checked by the slow test below.
SMALL = dict(hidden_size=8, learning_rate_init=0.03, max_iter=12, batch_size=20)
SMALL_REGRESSOR = dict(SMALL, max_iter=20, early_stopping=False)


def mini_batch_expected_failures(estimator):
    # Mini-batches and the validation split are drawn from the rows, so integer weights
    # and repeated rows give the same model only in distribution: test_estimators_weights
    # tests that, and runs this check on full-batch training, where it holds exactly.
    return {"check_sample_weight_equivalence_on_dense_data":
            "mini-batch training: weights equal repetitions in distribution only"}


def defaults_expected_failures(estimator):
    return mini_batch_expected_failures(estimator)


@parametrize_with_checks([
    LSTMClassifier(**SMALL), LSTMRegressor(**SMALL_REGRESSOR),
    LSTMClassifier(head="mean", bidirectional=True, num_layers=2, dropout=0.1, **SMALL)],
    expected_failed_checks=mini_batch_expected_failures, xfail_strict=True)
def test_sklearn_conformance(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", [LSTMClassifier(), LSTMRegressor()], ids=repr)
def test_sklearn_conformance_with_defaults(estimator):
    """check_estimator on the defaults (hidden_size=64, 200 epochs): a few minutes."""
    from sklearn.utils.estimator_checks import check_estimator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        results = check_estimator(estimator, on_fail=None,
                                  expected_failed_checks=defaults_expected_failures(estimator))
    failed = [(r["check_name"], str(r["exception"])[:200]) for r in results
              if r["status"] == "failed"]
    assert not failed
    # The checks ran, and the defaults fail none but the sample-weight equivalence.
    assert sum(r["status"] == "passed" for r in results) >= 50
    others = {r["check_name"]: r["status"] for r in results if r["status"] != "passed"}
    assert others.pop("check_array_api_input", "skipped") == "skipped"  # SCIPY_ARRAY_API=1
    assert others == {"check_sample_weight_equivalence_on_dense_data": "xfail"}


# --------------------------------------------------------------------------- learning

def test_digits_demo_reaches_95_percent():
    from lstmcy._cli.demo import run_demo
    lines = []
    result = run_demo(plot=None, out=lines.append)
    assert result["accuracy"] >= 0.95, lines
    assert result["seconds"] < 60
    assert sum(line.startswith("epoch") for line in lines) == result["epochs"]
    assert result["loss_curve"][-1] < result["loss_curve"][0]


def noisy_sine_windows(n_windows, steps, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(n_windows + steps) * 0.3
    series = np.sin(t) + 0.5 * np.sin(0.37 * t) + 0.05 * rng.standard_normal(t.size)
    X = np.lib.stride_tricks.sliding_window_view(series[:-1], steps)[:n_windows]
    y = series[steps:steps + n_windows]
    return X, y


def test_noisy_sine_next_value_r2():
    X, y = noisy_sine_windows(700, steps=16, seed=0)
    X_train, y_train, X_test, y_test = X[:500], y[:500], X[500:], y[500:]
    model = quiet_fit(LSTMRegressor(hidden_size=16, learning_rate_init=0.01, max_iter=40,
                                    random_state=0), X_train, y_train)
    assert model.n_features_in_ == 16 and model.input_size_ == 1
    assert model.score(X_test, y_test) >= 0.95
    # The same windows as 3-D univariate sequences give the same predictions.
    np.testing.assert_allclose(model.predict(X_test[:, :, None]), model.predict(X_test))


@pytest.mark.parametrize("y_shape", [(60,), (60, 1)])
def test_one_output_regression_predicts_1d_as_mlp_regressor(y_shape):
    from sklearn.neural_network import MLPRegressor
    X, y = noisy_sine_windows(60, steps=5, seed=1)
    y = y.reshape(y_shape)
    model = quiet_fit(LSTMRegressor(hidden_size=4, max_iter=2, random_state=0), X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLPRegressor's about a column-vector y
        mlp = quiet_fit(MLPRegressor(hidden_layer_sizes=(4,), max_iter=2, random_state=0), X, y)
    assert model.predict(X).shape == mlp.predict(X).shape == (60,)
    assert np.isfinite(model.score(X, y))


def test_multi_output_regression():
    X, y = noisy_sine_windows(300, steps=10, seed=1)
    Y = np.column_stack([y, -2 * y])
    model = quiet_fit(LSTMRegressor(hidden_size=8, learning_rate_init=0.01, max_iter=30,
                                    random_state=0), X, Y)
    prediction = model.predict(X)
    assert prediction.shape == (300, 2) and prediction.dtype == np.float64
    assert model.n_outputs_ == 2 and model.head_coef_.shape == (8, 2)
    assert model.score(X, Y) > 0.8


@pytest.mark.parametrize("solver", ["adam", "sgd"])
def test_solvers_reduce_the_loss(solver):
    X, y = sum_sign_problem()
    clf = quiet_fit(LSTMClassifier(hidden_size=8, solver=solver, learning_rate_init=0.02,
                                   batch_size=20, max_iter=15, random_state=0), X, y)
    assert clf.loss_curve_[-1] < 0.7 * clf.loss_curve_[0]
    assert clf.score(X, y) > 0.8


def test_defaults_learn_a_small_multichannel_set():
    """40 training sequences: the defaults take several steps per epoch and train on all."""
    X, y = motions(40, seed=0)
    X_test, y_test = motions(200, seed=1)
    clf = LSTMClassifier(random_state=0).fit(X, y)
    assert clf.validation_scores_ is None  # too few samples to hold a validation set out
    assert clf.n_iter_ < clf.max_iter and clf.loss_curve_[-1] < 0.05  # converged, and stopped
    assert clf.score(X_test, y_test) >= 0.85  # 4 classes (seeds 0-4: 0.87 to 0.95)


@pytest.mark.parametrize("n, expected", [(1, 1), (3, 3), (5, 4), (36, 4), (120, 12),
                                         (639, 63), (640, 64), (20000, 64)])
def test_auto_batch_size_gives_several_steps_per_epoch(n, expected):
    assert auto_batch_size(n) == expected


def test_early_stopping_auto_holds_out_when_the_data_allows_it():
    X, y = sum_sign_problem(n=200)
    base = dict(hidden_size=4, max_iter=2, random_state=0)
    settings = dict(base, validation_fraction=0.5)
    # 'auto' holds out validation_fraction from 100 held-out samples on
    assert quiet_fit(LSTMClassifier(**settings), X[:199], y[:199]).validation_scores_ is not None
    assert quiet_fit(LSTMClassifier(**settings), X[:198], y[:198]).validation_scores_ is None
    assert quiet_fit(LSTMRegressor(**settings), X[:199], y[:199] * 1.0).validation_scores_ \
        is not None
    assert quiet_fit(LSTMRegressor(**settings), X[:198], y[:198] * 1.0).validation_scores_ is None
    # ... if every class can be in both parts
    rare = np.r_[np.zeros(198), 1].astype(int)
    assert quiet_fit(LSTMClassifier(**settings), X[:199], rare).validation_scores_ is None
    with pytest.raises(ValueError, match="class 1 has 1 sample, and a stratified split needs 2"):
        LSTMClassifier(early_stopping=True, **base).fit(X[:199], rare)
    # True holds out whatever the size, as long as both parts can have every class
    y3 = np.arange(30) % 3
    assert quiet_fit(LSTMClassifier(early_stopping=True, validation_fraction=0.2, **base),
                     X[:30], y3).validation_scores_ is not None
    with pytest.raises(ValueError, match=r"early_stopping=True holds out validation_fraction=0.1 "
                                         r"of the 19 training samples \(2\) for validation, but 2 "
                                         r"samples cannot hold each of the 3 classes"):
        LSTMClassifier(early_stopping=True, **base).fit(X[:19], y3[:19])
    assert quiet_fit(LSTMClassifier(early_stopping=False, **base), X, y).validation_scores_ \
        is None


def test_fixed_number_of_epochs_does_not_warn():
    X, y = sum_sign_problem(n=40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clf = LSTMClassifier(hidden_size=4, max_iter=3, n_iter_no_change=None).fit(X, y)
        assert clf.n_iter_ == 3
        LSTMClassifier(hidden_size=4, num_layers=2, dropout=0.2, max_iter=1,
                       n_iter_no_change=None).fit(X, y)
    with pytest.warns(ConvergenceWarning, match="Maximum iterations"):
        LSTMClassifier(hidden_size=4, max_iter=3).fit(X, y)


def test_dropout_with_one_layer_warns_as_torch_does():
    X, y = sum_sign_problem(n=40)
    torch_message = ("dropout option adds dropout after all but last recurrent layer, so non-zero "
                     "dropout expects num_layers greater than 1, but got dropout=0.2 and "
                     "num_layers=1")
    with pytest.warns(UserWarning, match=re.escape(torch_message)) as record:
        LSTMClassifier(hidden_size=4, dropout=0.2, max_iter=1, n_iter_no_change=None).fit(X, y)
    assert record[0].filename == __file__
    torch = pytest.importorskip("torch")
    with pytest.warns(UserWarning, match=re.escape(torch_message)):
        torch.nn.LSTM(2, 4, num_layers=1, dropout=0.2)


# --------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("head", ["last", "mean"])
@pytest.mark.parametrize("ragged", [False, True])
def test_loss_gradients_match_finite_differences(head, ragged):
    rng = np.random.default_rng(3)
    if ragged:
        X = ragged_sequences(n=5, features=2, max_len=4, seed=3)
    else:
        X = rng.standard_normal((5, 4, 2))
    y = np.array([0, 1, 2, 1, 0])
    weights = np.array([0.5, 2.0, 1.0, 3.0, 0.25])  # sample weights scale each sample's loss
    clf = LSTMClassifier(hidden_size=3, num_layers=2, bidirectional=True, head=head, alpha=0.3,
                         max_iter=1, dtype=np.float64, random_state=0)
    quiet_fit(clf, X, y)
    data = clf._validate_X(X, reset=False)
    assert (len(set(data.lengths)) > 1) == ragged
    batch = data.batch(np.array([4, 0, 3, 1, 2]))
    targets = np.searchsorted(clf.classes_, y)[batch.sample_index]
    weights = weights[batch.sample_index]
    _, grads = clf._loss_and_grads(batch, targets, weights, seed=None)
    params = clf._all_params()
    assert [g.shape for g in grads] == [p.shape for p in params]
    step = 1e-6
    for param, grad in zip(params, grads):
        for flat in rng.choice(param.size, size=min(3, param.size), replace=False):
            index = np.unravel_index(flat, param.shape)
            saved = param[index]
            param[index] = saved + step
            plus, _ = clf._loss_and_grads(batch, targets, weights, seed=None)
            param[index] = saved - step
            minus, _ = clf._loss_and_grads(batch, targets, weights, seed=None)
            param[index] = saved
            assert grad[index] == pytest.approx((plus - minus) / (2 * step), rel=1e-5, abs=1e-8)


def test_clip_by_global_norm():
    clf = LSTMClassifier(clip_norm=1.0)
    grads = [np.full(4, 3.0), np.full((2, 2), 4.0)]  # global norm sqrt(36 + 64) = 10
    clf._clip(grads)
    assert np.sqrt(sum(np.vdot(g, g) for g in grads)) == pytest.approx(1.0)
    np.testing.assert_allclose(grads[0], 0.3)
    small = [np.full(3, 0.1)]
    clf._clip(small)
    np.testing.assert_array_equal(small[0], 0.1)
    unclipped = [np.full(4, 3.0)]
    LSTMClassifier(clip_norm=None)._clip(unclipped)
    np.testing.assert_array_equal(unclipped[0], 3.0)


def test_clip_norm_beyond_float32_still_clips():
    # float32 squares overflow from a norm of ~1.8e19: the norm is summed in float64.
    grads = [np.full(4, 3e20, dtype=np.float32), np.full((2, 2), 4e20, dtype=np.float32)]
    LSTMRegressor(clip_norm=5.0)._clip(grads)
    assert np.sqrt(sum(np.vdot(g.astype(float), g.astype(float)) for g in grads)) == \
        pytest.approx(5.0, rel=1e-6)
    huge = [np.full(3, 1e200), np.full(2, -1e200)]  # float64 squares overflow: scaled first
    LSTMRegressor(clip_norm=1.0)._clip(huge)
    np.testing.assert_allclose(huge[0], 1 / np.sqrt(5))
    # Targets of ~1e20 in float32: clipping must not zero every gradient.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 5, 2))
    y = 1e20 * (1.0 + rng.random(40))
    model = quiet_fit(LSTMRegressor(hidden_size=4, max_iter=3, early_stopping=False,
                                    random_state=0), X, y)
    assert model.head_intercept_[0] > 0


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_clip_norm_refuses_a_non_finite_gradient(bad):
    grads = [np.array([1.0, bad], dtype=np.float32), np.ones(3, dtype=np.float32)]
    with pytest.raises(ValueError, match=r"global norm is (inf|nan), so it cannot be clipped "
                                         r"to clip_norm=5.0: a gradient is infinite or NaN"):
        LSTMRegressor(clip_norm=5.0)._clip(grads)


# --------------------------------------------------------------------------- variable length

@pytest.mark.parametrize("head", ["last", "mean"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_variable_length_outputs_match_one_sequence_at_a_time(head, bidirectional):
    X = ragged_sequences(n=30, seed=1)
    y = np.array([seq[:, 0].sum() for seq in X])
    model = quiet_fit(LSTMRegressor(hidden_size=6, num_layers=2, bidirectional=bidirectional,
                                    head=head, max_iter=3, dtype=np.float64, random_state=0), X, y)
    batched = model.predict(X)
    one_by_one = np.array([model.predict(seq[None])[0] for seq in X])
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-10, atol=1e-12)
    # Packing sorts by length: the outputs must come back in the caller's order.
    order = np.random.default_rng(0).permutation(len(X))
    np.testing.assert_allclose(model.predict([X[i] for i in order]), batched[order], rtol=1e-10)


def test_variable_length_learning():
    """Mean of each sequence's first feature, lengths 2..12: needs the right last step."""
    rng = np.random.default_rng(0)
    X = [rng.uniform(-1, 1, (length, 1)) for length in rng.integers(2, 13, size=400)]
    y = np.array([seq.mean() for seq in X])
    model = quiet_fit(LSTMRegressor(hidden_size=16, head="mean", learning_rate_init=0.01,
                                    max_iter=40, random_state=0), X[:300], y[:300])
    assert model.score(X[300:], y[300:]) > 0.9


@pytest.mark.parametrize("head", ["last", "mean"])
def test_predictions_match_torch_with_the_same_weights(head):
    """The head reads the top layer's final states (both directions) or the mean output."""
    torch = pytest.importorskip("torch")
    X = ragged_sequences(n=12, features=3, seed=4)
    y = np.arange(12) % 3
    clf = quiet_fit(LSTMClassifier(hidden_size=5, num_layers=2, bidirectional=True, head=head,
                                   standardize=False,
                                   max_iter=2, dtype=np.float64, random_state=0), X, y)
    lstm = torch.nn.LSTM(3, 5, num_layers=2, bidirectional=True).double()
    with torch.no_grad():
        for tensor, value in zip(lstm._flat_weights, clf.lstm_params_):
            tensor.copy_(torch.from_numpy(value))
        packed = torch.nn.utils.rnn.pack_sequence([torch.from_numpy(s) for s in X],
                                                  enforce_sorted=False)
        output, (h_n, _) = lstm(packed)
        if head == "last":
            features = torch.cat([h_n[-2], h_n[-1]], dim=1)
        else:
            padded, lengths = torch.nn.utils.rnn.pad_packed_sequence(output)
            features = padded.sum(dim=0) / lengths[:, None].double()
    logits = features.numpy() @ clf.head_coef_ + clf.head_intercept_
    proba = np.exp(logits - logits.max(axis=1, keepdims=True))
    proba /= proba.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(clf.predict_proba(X), proba, rtol=1e-10, atol=1e-12)


def test_sequence_batch_is_packed_in_length_order():
    seqs = [np.full((2, 1), 1.0), np.full((4, 1), 2.0), np.full((3, 1), 3.0)]
    batch = Sequences.from_arrays(seqs).batch(np.arange(3))
    [part] = batch.parts
    np.testing.assert_array_equal(part.batch_sizes, [3, 3, 2, 1])
    np.testing.assert_array_equal(batch.sample_index, [1, 2, 0])
    np.testing.assert_array_equal(part.input[:, 0], [2, 3, 1, 2, 3, 1, 2, 3, 2])


def test_equal_length_list_is_the_3d_case():
    X, y = sum_sign_problem(n=40)
    clf = quiet_fit(LSTMClassifier(hidden_size=4, max_iter=2, random_state=0), X, y)
    np.testing.assert_array_equal(clf.predict_proba(list(X)), clf.predict_proba(X))


# --------------------------------------------------------------------------- state

def test_partial_fit_continues_like_fit():
    X, y = sum_sign_problem()
    fitted = quiet_fit(LSTMClassifier(hidden_size=6, max_iter=3, early_stopping=False,
                                      random_state=0), X, y)
    stepped = LSTMClassifier(hidden_size=6, random_state=0)
    for _ in range(3):
        stepped.partial_fit(X, y, classes=[0, 1])
    assert stepped.n_iter_ == 3 and stepped.t_ == 3 * len(X)
    np.testing.assert_array_equal(stepped.loss_curve_, fitted.loss_curve_)
    for a, b in zip(stepped.lstm_params_, fitted.lstm_params_):
        np.testing.assert_array_equal(a, b)


def test_partial_fit_needs_classes_first():
    X, y = sum_sign_problem(n=20)
    unfitted = LSTMClassifier()
    with pytest.raises(ValueError, match="classes must be passed"):
        unfitted.partial_fit(X, y)
    with pytest.raises(NotFittedError):  # a failed first call leaves no model behind
        unfitted.predict(X)
    clf = LSTMClassifier(hidden_size=4).partial_fit(X, y, classes=[0, 1, 2])
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    with pytest.raises(ValueError, match="classes not in"):
        clf.partial_fit(X, y + 5)


def test_warm_start_continues_training():
    X, y = sum_sign_problem()
    clf = LSTMClassifier(hidden_size=6, max_iter=4, n_iter_no_change=None, warm_start=True,
                         random_state=0)
    quiet_fit(clf, X, y)
    params_after_first = [p.copy() for p in clf.lstm_params_]
    quiet_fit(clf, X, y)
    assert clf.n_iter_ == 8 and len(clf.loss_curve_) == 8
    assert clf.loss_curve_[4] < clf.loss_curve_[0]  # no re-initialisation
    assert not np.array_equal(clf.lstm_params_[0], params_after_first[0])
    clf.set_params(warm_start=False)
    quiet_fit(clf, X, y)
    assert clf.n_iter_ == 4 and len(clf.loss_curve_) == 4


@pytest.mark.parametrize("change", [dict(hidden_size=16), dict(bidirectional=True),
                                    dict(num_layers=2), dict(dtype=np.float64)], ids=repr)
@pytest.mark.parametrize("continuation", ["warm_start", "partial_fit"])
def test_continuing_with_another_architecture_names_the_parameter(change, continuation):
    X, y = sum_sign_problem(n=30)
    clf = quiet_fit(LSTMClassifier(hidden_size=8, max_iter=1, warm_start=True, random_state=0),
                    X, y)
    before = [p.copy() for p in clf._all_params()]
    clf.set_params(**change)
    [(name, value)] = change.items()
    shown = np.dtype(value).name if name == "dtype" else repr(value)
    with pytest.raises(ValueError, match=rf"^{name}={shown} differs from the fitted model's "
                                         rf"{name}=.*so {name} cannot change"):
        if continuation == "warm_start":
            clf.fit(X, y)
        else:
            clf.partial_fit(X, y)
    assert all(np.array_equal(p, q) for p, q in zip(clf._all_params(), before))
    clf.set_params(warm_start=False)
    quiet_fit(clf, X, y)  # a new model with the new architecture
    assert clf.get_params()[name] == value
    assert clf.lstm_params_[1].shape[1] == clf.hidden_size
    assert len(clf.lstm_params_) == 4 * clf.num_layers * (2 if clf.bidirectional else 1)
    assert clf.lstm_params_[0].dtype == clf.dtype


def test_early_stopping_keeps_the_parameters_of_the_best_epoch():
    X, y = sum_sign_problem(n=100)
    settings = dict(hidden_size=8, learning_rate_init=0.05, early_stopping=True,
                    n_iter_no_change=None, random_state=0)
    clf = LSTMClassifier(max_iter=25, **settings).fit(X, y)
    assert clf.n_iter_ == 25 and len(clf.validation_loss_curve_) == len(clf.validation_scores_) == 25
    best = int(np.argmin(clf.validation_loss_curve_))
    assert best + 1 < clf.n_iter_  # the precondition: the last epoch was not the best
    assert clf.best_validation_loss_ == clf.validation_loss_curve_[best]
    assert clf.best_validation_score_ == clf.validation_scores_[best]
    assert clf.best_loss_ is None
    # The first best+1 epochs draw the same batches: a fit that ends at the best epoch has
    # the kept parameters as its last.
    shorter = LSTMClassifier(max_iter=best + 1, **settings).fit(X, y)
    assert params_equal(clf, shorter)


def test_early_stopping_stops_after_n_iter_no_change_epochs_without_improvement():
    X, y = sum_sign_problem(n=100)
    clf = quiet_fit(LSTMClassifier(hidden_size=6, learning_rate_init=0.05, early_stopping=True,
                                   n_iter_no_change=3, tol=1e-3, max_iter=60, random_state=0,
                                   learning_rate="constant"),
                    X, y)
    curve = clf.validation_loss_curve_
    assert clf.n_iter_ < 60
    improving = [k for k in range(len(curve)) if curve[k] < min(curve[:k], default=np.inf) - 1e-3]
    assert clf.n_iter_ == improving[-1] + 1 + 3 + 1


def test_reproducible_with_random_state_and_dropout():
    X, y = sum_sign_problem()
    settings = dict(hidden_size=5, num_layers=2, dropout=0.3, max_iter=3)
    a = quiet_fit(LSTMClassifier(random_state=7, **settings), X, y)
    b = quiet_fit(LSTMClassifier(random_state=7, **settings), X, y)
    c = quiet_fit(LSTMClassifier(random_state=8, **settings), X, y)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))
    assert not np.array_equal(a.predict_proba(X), c.predict_proba(X))


def test_verbose_prints_one_line_per_epoch(capsys):
    X, y = sum_sign_problem(n=60)
    clf = LSTMClassifier(hidden_size=4, learning_rate_init=0.05, max_iter=30, n_iter_no_change=2,
                         early_stopping=True, verbose=1, random_state=0,
                         learning_rate="constant").fit(X, y)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("LSTMClassifier: 54 training sequences, 6 held out for early stopping; "
                      "batch size 5, 11 steps per epoch, at most 30 epochs")
    epochs = [line for line in out if line.startswith("epoch")]
    assert len(epochs) == clf.n_iter_ < 30 and len(out) == clf.n_iter_ + 2
    for number, line in enumerate(epochs, start=1):
        assert line.startswith(f"epoch {number:>4}/30  loss {clf.loss_curve_[number - 1]:.4f}  "
                               f"validation loss {clf.validation_loss_curve_[number - 1]:.4f} "
                               f"score {clf.validation_scores_[number - 1]:.4f}")
        assert " elapsed, at most " in line and line.endswith(" left")
    best = int(np.argmin(clf.validation_loss_curve_)) + 1
    assert " * " in epochs[best - 1]
    assert out[-1].startswith("Validation loss did not improve more than tol=0.0001 for 2 "
                              f"consecutive epochs. Stopping. Kept the parameters of epoch {best}")
    assert out[-1].endswith(" in all)")


def test_verbose_reports_inside_long_epochs_and_is_silent_by_default(capsys, monkeypatch):
    X, y = sum_sign_problem(n=40)
    quiet_fit(LSTMClassifier(hidden_size=4, max_iter=2, random_state=0), X, y)
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("LSTMCY_PROGRESS_INTERVAL", "0")  # a line after every batch
    quiet_fit(LSTMRegressor(hidden_size=4, max_iter=2, batch_size=10, early_stopping=False,
                            verbose=True, random_state=0), X, y.astype(float))
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("40 training sequences, no early stopping; batch size 10, 4 steps "
                           "per epoch, at most 2 epochs")
    assert [line.split(",")[0] for line in out if re.match(r"epoch +\d+: batch", line)] == \
        [f"epoch    {e}: batch {b}/4" for e in (1, 2) for b in (1, 2, 3, 4)]
    assert out[-2].startswith("epoch    2/2  loss ") and out[-2].endswith(" elapsed")
    assert out[-1].startswith("Reached max_iter=2. (")


def test_verbose_partial_fit_and_warm_start_number_their_epochs(capsys):
    X, y = sum_sign_problem(n=40)
    clf = LSTMClassifier(hidden_size=4, verbose=1, random_state=0)
    clf.partial_fit(X, y, classes=[0, 1])
    clf.partial_fit(X, y)
    first, second = (lines.splitlines() for lines in capsys.readouterr().out.split("\nLSTM"))
    assert first[0].endswith("10 steps per epoch, 1 epoch") and first[1].startswith("epoch    1/1 ")
    assert second[0].endswith("10 steps per epoch, 1 epoch (epoch 2)")
    assert second[1].startswith("epoch    2/2 ")
    clf = LSTMClassifier(hidden_size=4, max_iter=2, n_iter_no_change=None, warm_start=True,
                         verbose=1, random_state=0)
    clf.fit(X, y)
    capsys.readouterr()
    clf.fit(X, y)
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("10 steps per epoch, at most 2 epochs (epochs 3 to 4)")
    assert [line[:11] for line in out[1:3]] == ["epoch    3/", "epoch    4/"]


def test_format_seconds():
    from lstmcy.estimators._progress import format_seconds
    assert [format_seconds(s) for s in (0.04, 59.94, 61, 3599.6, 3725)] == \
        ["0.0 s", "59.9 s", "1:01", "1:00:00", "1:02:05"]


@pytest.mark.parametrize("value, seconds", [
    (None, 30.0), ("0", 0.0), ("2.5", 2.5), ("-1", 30.0), ("soon", 30.0), ("nan", 30.0)])
def test_progress_interval_from_the_environment(value, seconds):
    from lstmcy.estimators._progress import progress_interval
    environ = {} if value is None else {"LSTMCY_PROGRESS_INTERVAL": value}
    assert progress_interval(environ) == seconds


def test_pickle_round_trip_and_resume():
    X, y = sum_sign_problem()
    clf = LSTMClassifier(hidden_size=6, random_state=0).partial_fit(X, y, classes=[0, 1])
    restored = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(restored.predict_proba(X), clf.predict_proba(X))
    clf.partial_fit(X, y)
    restored.partial_fit(X, y)  # optimiser state and random stream travel with the pickle
    np.testing.assert_array_equal(restored.predict_proba(X), clf.predict_proba(X))


def test_clone_pipeline_and_float64():
    X, y = noisy_sine_windows(200, steps=8, seed=2)
    model = make_pipeline(StandardScaler(), LSTMRegressor(hidden_size=6, max_iter=5,
                                                          dtype=np.float64, random_state=0))
    quiet_fit(model, X, y)
    assert model[-1].lstm_params_[0].dtype == np.float64
    assert model.predict(X).shape == (200,)
    copy = clone(model)
    assert not hasattr(copy[-1], "lstm_params_")
    assert copy.get_params()["lstmregressor__hidden_size"] == 6


def test_grid_search_two_processes():
    X, y = sum_sign_problem(n=80, steps=4, features=2)
    grid = {"hidden_size": [3, 6], "head": ["last", "mean"]}
    base = LSTMClassifier(max_iter=4, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        parallel = GridSearchCV(base, grid, cv=2, n_jobs=2).fit(X, y)
        serial = GridSearchCV(base, grid, cv=2, n_jobs=1).fit(X, y)
    assert len(parallel.cv_results_["params"]) == 4
    np.testing.assert_array_equal(parallel.cv_results_["mean_test_score"],
                                  serial.cv_results_["mean_test_score"])
    assert parallel.best_params_ == serial.best_params_


# --------------------------------------------------------------------------- input checks

@pytest.mark.parametrize("param, value, error, match", [
    ("hidden_size", 0, ValueError, "hidden_size"),
    ("head", "max", ValueError, "head"),
    ("solver", "lbfgs", ValueError, "solver"),
    ("dropout", 1.0, ValueError, "dropout"),
    ("batch_size", "big", ValueError, "batch_size"),
    ("clip_norm", -1.0, ValueError, "clip_norm"),
    ("clip_norm", float("nan"), ValueError, "clip_norm must be a number"),
    ("learning_rate_init", float("nan"), ValueError, "learning_rate_init must be a number"),
    ("dtype", np.int32, ValueError, "dtype"),
    ("bidirectional", "yes", TypeError, "bidirectional"),
    ("max_iter", 2.5, TypeError, "max_iter"),
])
def test_bad_parameters_are_named(param, value, error, match):
    X, y = sum_sign_problem(n=10)
    with pytest.raises(error, match=match):
        LSTMClassifier(**{param: value}).fit(X, y)


def test_inputs_are_not_modified():
    X, y = sum_sign_problem(n=30)
    X.setflags(write=False)
    y.setflags(write=False)
    before = X.copy()
    clf = quiet_fit(LSTMClassifier(hidden_size=4, max_iter=2, dtype=np.float64), X, y)
    clf.predict(X)
    np.testing.assert_array_equal(X, before)


def test_import_lstmcy_does_not_import_sklearn():
    code = ("import sys, lstmcy; "
            "assert not [m for m in sys.modules if m.split('.')[0] == 'sklearn'], 'sklearn imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("solver", ["adam", "sgd", "sgd-nesterov"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_optimizers_follow_scikit_learns(solver, dtype):
    # lstmcy's optimisers keep their state flat over all the parameters; every array must
    # still move as MLPClassifier's optimisers move it, array by array.
    from sklearn.neural_network._stochastic_optimizers import AdamOptimizer, SGDOptimizer
    from lstmcy.estimators._optimizers import SGD, Adam

    rng = np.random.default_rng(0)
    shapes = [(16, 3), (16, 4), (16,), (16,), (4, 2), (2,)]
    ours = [rng.standard_normal(s).astype(dtype) for s in shapes]
    theirs = [p.astype(np.float64) for p in ours]
    if solver == "adam":
        opt, ref = Adam(ours, 0.01, 0.9, 0.999, 1e-8), AdamOptimizer(theirs, 0.01, 0.9, 0.999, 1e-8)
    else:
        nesterov = solver == "sgd-nesterov"
        opt = SGD(ours, 0.05, 0.9, nesterov)
        ref = SGDOptimizer(theirs, 0.05, "constant", 0.9, nesterov)
    for _ in range(25):
        grads = [rng.standard_normal(s).astype(dtype) for s in shapes]
        opt.update(ours, [g.copy() for g in grads])
        ref.update_params(theirs, [g.astype(np.float64) for g in grads])
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    for got, want in zip(ours, theirs):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
