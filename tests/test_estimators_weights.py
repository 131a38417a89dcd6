"""Tests of sample and class weights in lstmcy.estimators.

scikit-learn's own check that integer weights equal repeated samples (and zero weights
removed ones) runs on full-batch training, where it holds to rounding. On mini-batches
it holds in distribution: the weighted and the repeated fits differ by no more than fits
with different seeds do, while ignoring the weights makes a clear difference.
"""
import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn.metrics import accuracy_score, r2_score  # noqa: E402
from sklearn.utils.class_weight import compute_class_weight  # noqa: E402
from sklearn.utils.estimator_checks import (  # noqa: E402
    check_sample_weight_equivalence_on_dense_data)

from estimator_helpers import params_equal, quiet_fit, sum_sign_problem  # noqa: E402
from lstmcy.estimators import LSTMClassifier, LSTMRegressor  # noqa: E402

# Deterministic full-batch training: weights and repetitions give the same gradients.
FULL_BATCH = dict(hidden_size=8, batch_size=10**6, early_stopping=False, n_iter_no_change=None,
                  max_iter=30, learning_rate_init=0.01, dtype=np.float64)


@pytest.mark.parametrize("estimator", [LSTMClassifier(**FULL_BATCH), LSTMRegressor(**FULL_BATCH)],
                         ids=lambda e: type(e).__name__)
def test_sklearn_sample_weight_equivalence_on_full_batches(estimator):
    check_sample_weight_equivalence_on_dense_data(type(estimator).__name__, estimator)


def overlapping_classes(n, seed):
    """Two classes whose sequences overlap: where the boundary lies depends on the weights."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    X = rng.standard_normal((n, 5, 2)) + 0.6 * y[:, None, None]
    return X, y


def test_integer_weights_equal_repeated_samples_within_the_optimiser_noise():
    X, y = overlapping_classes(80, seed=0)
    weights = np.where(y == 1, 4, 1)
    X_test, _ = overlapping_classes(200, seed=1)
    settings = dict(hidden_size=8, learning_rate_init=0.003, max_iter=20, early_stopping=False,
                    n_iter_no_change=None)

    def proba_of_class_1(seed, X, y, sample_weight=None):
        clf = LSTMClassifier(random_state=seed, **settings).fit(X, y, sample_weight=sample_weight)
        return clf.predict_proba(X_test)[:, 1]

    weighted = [proba_of_class_1(seed, X, y, weights) for seed in (0, 1, 2)]
    repeated = [proba_of_class_1(seed, X.repeat(weights, axis=0), y.repeat(weights))
                for seed in (3, 4, 5)]
    unweighted = [proba_of_class_1(seed, X, y) for seed in (6, 7)]
    # The share of class 1 the models predict: weights move it as repetitions do.
    share = {name: [p.mean() for p in runs] for name, runs in
             [("weighted", weighted), ("repeated", repeated), ("unweighted", unweighted)]}
    assert abs(np.mean(share["weighted"]) - np.mean(share["repeated"])) < 0.03, share
    assert min(share["weighted"] + share["repeated"]) > max(share["unweighted"]) + 0.1, share

    # Sample by sample, a weighted and a repeated fit differ as two seeds of either do.
    def distance(runs, others):
        return np.mean([np.abs(a - b).mean() for a in runs for b in others if a is not b])

    noise = max(distance(weighted, weighted), distance(repeated, repeated))
    assert distance(weighted, repeated) < 1.5 * noise, (distance(weighted, repeated), noise)


@pytest.mark.parametrize("estimator_class", [LSTMClassifier, LSTMRegressor])
def test_zero_weight_is_the_same_as_leaving_the_sample_out(estimator_class):
    X, y = sum_sign_problem(n=60)
    weights = np.ones(60)
    weights[::4] = 0.0
    settings = dict(hidden_size=6, max_iter=4, early_stopping=True, validation_fraction=0.25,
                    random_state=0)
    a = quiet_fit(estimator_class(**settings), X, y, sample_weight=weights)
    b = quiet_fit(estimator_class(**settings), X[weights > 0], y[weights > 0])
    assert params_equal(a, b)
    assert a.validation_scores_ == b.validation_scores_ and len(a.validation_scores_) == 4


def test_a_class_whose_samples_all_weigh_zero_stays_a_class():
    # As scikit-learn's classifiers: classes_ comes from y, whatever the weights.
    X, y = sum_sign_problem(n=60)
    y = y.copy()
    y[:6] = 2
    weights = np.where(y == 2, 0.0, 1.0)
    clf = quiet_fit(LSTMClassifier(hidden_size=6, max_iter=3, random_state=0), X, y,
                    sample_weight=weights)
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    assert clf.predict_proba(X).shape == (60, 3)


def test_the_l2_term_is_relative_to_the_total_weight():
    """As for repeated samples: tripling every weight is like dividing alpha by three."""
    X, y = sum_sign_problem(n=60)
    weights = np.random.default_rng(0).uniform(0.5, 2.0, 60)
    settings = dict(hidden_size=6, max_iter=3, dtype=np.float64, random_state=0)
    a = quiet_fit(LSTMClassifier(alpha=0.3, **settings), X, y, sample_weight=3 * weights)
    b = quiet_fit(LSTMClassifier(alpha=0.1, **settings), X, y, sample_weight=weights)
    c = quiet_fit(LSTMClassifier(alpha=0.3, **settings), X, y, sample_weight=weights)
    for p, q in zip(a._all_params(), b._all_params()):
        np.testing.assert_allclose(p, q, rtol=1e-9, atol=1e-12)
    assert not params_equal(a, c)
    unweighted = quiet_fit(LSTMClassifier(**settings), X, y)
    ones = quiet_fit(LSTMClassifier(**settings), X, y, sample_weight=np.ones(60))
    assert params_equal(unweighted, ones)


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_validation_loss_and_score_are_weighted(dtype, rtol):
    # The validation runs in the training dtype, predict in float64: equal in float64,
    # within float32 rounding otherwise.
    X, y = sum_sign_problem(n=40)
    clf = quiet_fit(LSTMClassifier(hidden_size=6, max_iter=2, random_state=0, dtype=dtype), X, y)
    data = clf._validate_X(X, reset=False, dtype=dtype)
    codes = np.searchsorted(clf.classes_, y)
    weights = np.random.default_rng(0).uniform(0, 3, 40)
    loss, score = clf._evaluate(data, codes, weights)
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(loss, np.average(-np.log(proba[np.arange(40), codes]),
                                                weights=weights), rtol=rtol)
    assert score == accuracy_score(y, clf.predict(X), sample_weight=weights)
    reg = quiet_fit(LSTMRegressor(hidden_size=6, max_iter=2, random_state=0, dtype=dtype), X,
                    X.sum(axis=(1, 2)))
    targets = X.sum(axis=(1, 2))[:, None]
    loss, score = reg._evaluate(data, targets, weights)
    residual = reg.predict(X) - targets[:, 0]
    np.testing.assert_allclose(loss, np.average(0.5 * residual ** 2, weights=weights), rtol=rtol)
    assert score == pytest.approx(r2_score(targets, reg.predict(X), sample_weight=weights),
                                  rel=rtol)


def test_score_takes_sample_weight():
    X, y = sum_sign_problem(n=40)
    clf = quiet_fit(LSTMClassifier(hidden_size=4, max_iter=2, random_state=0), X, y)
    weights = np.arange(40.0)
    assert clf.score(X, y, sample_weight=weights) == accuracy_score(
        y, clf.predict(X), sample_weight=weights)


def test_partial_fit_takes_sample_weight():
    X, y = sum_sign_problem(n=40)
    weights = np.random.default_rng(0).integers(0, 3, 40).astype(float)
    a = LSTMClassifier(hidden_size=4, random_state=0).partial_fit(X, y, classes=[0, 1],
                                                                 sample_weight=weights)
    b = LSTMClassifier(hidden_size=4, random_state=0).partial_fit(X[weights > 0], y[weights > 0],
                                                                 classes=[0, 1],
                                                                 sample_weight=weights[weights > 0])
    assert params_equal(a, b) and a.t_ == np.count_nonzero(weights)
    reg = LSTMRegressor(hidden_size=4, random_state=0).partial_fit(X, y * 1.0, sample_weight=weights)
    assert reg.n_iter_ == 1


# --------------------------------------------------------------------------- class weights

def imbalanced(n=80, seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.uniform(size=n) < 0.2).astype(int)  # one in five is class 1
    X = rng.standard_normal((n, 4, 2)) + 0.8 * y[:, None, None]
    return X, np.array(["rare" if label else "common" for label in y])


def test_class_weight_dict_is_a_per_class_sample_weight():
    X, y = imbalanced()
    settings = dict(hidden_size=6, max_iter=3, random_state=0)
    weights = np.random.default_rng(1).uniform(0.5, 1.5, len(y))
    a = quiet_fit(LSTMClassifier(class_weight={"rare": 4.0, "common": 0.5}, **settings), X, y,
                  sample_weight=weights)
    b = quiet_fit(LSTMClassifier(**settings), X, y,
                  sample_weight=weights * np.where(y == "rare", 4.0, 0.5))
    assert params_equal(a, b)
    with pytest.raises(ValueError, match="not in class_weight"):
        LSTMClassifier(class_weight={"rare": 4.0, "other": 1.0}, **settings).fit(X, y)


def test_balanced_class_weight_counts_the_sample_weights():
    X, y = imbalanced()
    weights = np.random.default_rng(1).integers(1, 4, len(y)).astype(float)
    classes = np.unique(y)
    expected = compute_class_weight("balanced", classes=classes, y=y, sample_weight=weights)
    settings = dict(hidden_size=6, max_iter=3, random_state=0)
    a = quiet_fit(LSTMClassifier(class_weight="balanced", **settings), X, y, sample_weight=weights)
    b = quiet_fit(LSTMClassifier(**settings), X, y,
                  sample_weight=weights * expected[np.searchsorted(classes, y)])
    assert params_equal(a, b)


def test_balanced_class_weight_raises_the_recall_of_the_rare_class():
    X, y = imbalanced(n=200)
    X_test, y_test = imbalanced(n=400, seed=1)
    settings = dict(hidden_size=8, learning_rate_init=0.01, max_iter=20, n_iter_no_change=None,
                    random_state=0)
    plain = LSTMClassifier(**settings).fit(X, y)
    balanced = LSTMClassifier(class_weight="balanced", **settings).fit(X, y)

    def recall(clf):
        return np.mean(clf.predict(X_test[y_test == "rare"]) == "rare")

    assert recall(balanced) > recall(plain) + 0.15


def test_class_weight_errors():
    X, y = imbalanced()
    with pytest.raises(ValueError, match="class_weight must be None, 'balanced' or a dict"):
        LSTMClassifier(class_weight="even").fit(X, y)
    with pytest.raises(ValueError, match="'balanced' is not supported for partial_fit"):
        LSTMClassifier(class_weight="balanced").partial_fit(X, y, classes=np.unique(y))
    clf = LSTMClassifier(hidden_size=4, class_weight={"rare": 2.0, "common": 1.0})
    clf.partial_fit(X, y, classes=np.unique(y))
    with pytest.raises(ValueError, match="are all zero"):
        LSTMClassifier(class_weight={"rare": 0.0, "common": 0.0}).fit(X, y)
    with pytest.raises(ValueError, match="Negative values in data passed to `sample_weight`"):
        LSTMClassifier().fit(X, y, sample_weight=-np.ones(len(y)))
    with pytest.raises(ValueError, match=r"sample_weight.shape == \(3,\), expected \(80,\)"):
        LSTMClassifier().fit(X, y, sample_weight=np.ones(3))
