"""The estimators' defaults: input standardisation, patches of time steps, the
learning-rate schedule, the early stopping rule, scikit-learn's check_regressors_train, accuracy over seeds on packaged
UCR/UEA datasets (raw and standardised), and the time-series containers they accept.

``pytest --runslow -k five_seeds`` runs the 5-seed defaults test (about a minute);
without ``--runslow`` its fast variant runs two seeds.
"""
import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from estimator_helpers import motions, quiet_fit, ragged_sequences  # noqa: E402
from timeseries_data import packaged, standardized_per_channel  # noqa: E402
from lstmcy.estimators import LSTMClassifier, LSTMRegressor  # noqa: E402

SMALL = dict(hidden_size=6, max_iter=4, n_iter_no_change=None, dtype=np.float64, random_state=0)


# --------------------------------------------------------------------------- standardisation

def test_standardize_makes_the_model_independent_of_each_channels_scale():
    X, y = motions(60, seed=0)
    rescaled = X * np.array([1000.0, 0.01, 3.0]) + np.array([-50.0, 7.0, 0.0])
    a = quiet_fit(LSTMClassifier(**SMALL), X, y)
    b = quiet_fit(LSTMClassifier(**SMALL), rescaled, y)
    for p, q in zip(a.lstm_params_, b.lstm_params_):
        np.testing.assert_allclose(p, q, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(a.predict_proba(X[:10]), b.predict_proba(rescaled[:10]),
                               rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(b.input_mean_, [-50.0, 7.0, 0.0] + X.reshape(-1, 3).mean(axis=0)
                               * [1000.0, 0.01, 3.0], rtol=1e-9, atol=1e-9)
    # without it the channels' scales matter
    c = quiet_fit(LSTMClassifier(standardize=False, **SMALL), X, y)
    d = quiet_fit(LSTMClassifier(standardize=False, **SMALL), rescaled, y)
    assert c.input_mean_ is None and d.input_scale_ is None
    assert not np.allclose(c.lstm_params_[0], d.lstm_params_[0], rtol=1e-3)


def test_standardize_weighs_the_time_steps_of_ragged_and_weighted_samples():
    X = ragged_sequences(n=30, features=2, seed=3)
    y = np.arange(30) % 2
    weights = np.arange(30) % 3
    clf = quiet_fit(LSTMClassifier(**SMALL), X, y, sample_weight=weights)
    steps = np.concatenate([np.repeat(x, w, axis=0) for x, w in zip(X, weights)])
    np.testing.assert_allclose(clf.input_mean_, steps.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(clf.input_scale_, steps.std(axis=0), rtol=1e-12)


def test_standardize_is_fitted_once_for_partial_fit_and_warm_start():
    X, y = motions(40, seed=1)
    clf = LSTMClassifier(**SMALL).partial_fit(X, y, classes=np.arange(4))
    mean = clf.input_mean_.copy()
    clf.partial_fit(X * 10 + 3, y)
    np.testing.assert_array_equal(clf.input_mean_, mean)
    stepped = LSTMClassifier(**SMALL)
    for _ in range(2):
        stepped.partial_fit(X, y, classes=np.arange(4))
    fitted = quiet_fit(LSTMClassifier(**dict(SMALL, max_iter=2)), X, y)
    np.testing.assert_array_equal(stepped.lstm_params_[0], fitted.lstm_params_[0])


def test_constant_channel_is_only_centred():
    X, y = motions(40, seed=2)
    X[:, :, 1] = 5.0
    clf = quiet_fit(LSTMClassifier(**SMALL), X, y)
    assert clf.input_scale_[1] == 1.0 and clf.input_mean_[1] == 5.0
    assert np.isfinite(clf.predict_proba(X)).all()


# --------------------------------------------------------------------------- patches

def _patched_by_hand(X, k):
    """Each sequence's time steps in groups of ``k`` (the last one completed with its last
    step), a group's steps side by side."""
    out = []
    for x in X:
        pad = -len(x) % k
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
        out.append(x.reshape(len(x) // k, k * x.shape[1]))
    return out


@pytest.mark.parametrize("head", ["last", "mean"])
def test_patches_are_groups_of_consecutive_time_steps(head):
    X = ragged_sequences(n=30, features=2, max_len=11, seed=4)
    y = np.arange(30) % 3
    settings = dict(SMALL, head=head, standardize=False)
    patched = quiet_fit(LSTMClassifier(patch_size=3, **settings), X, y)
    by_hand = quiet_fit(LSTMClassifier(patch_size=1, **settings), _patched_by_hand(X, 3), y)
    assert patched.patch_size_ == 3 and patched.input_size_ == 2
    assert patched.lstm_params_[0].shape == (4 * 6, 6)
    for p, q in zip(patched._all_params(), by_hand._all_params()):
        np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(patched.predict_proba(X), by_hand.predict_proba(
        _patched_by_hand(X, 3)), rtol=1e-10, atol=1e-12)


def test_auto_patch_size_reads_a_median_sequence_in_at_most_32_steps():
    rng = np.random.default_rng(0)
    for steps, expected in [(24, 1), (32, 1), (33, 2), (150, 5), (251, 8)]:
        X = rng.standard_normal((8, 1, steps))
        clf = quiet_fit(LSTMClassifier(channels_first=True, **SMALL), X, np.arange(8) % 2)
        assert clf.patch_size_ == expected, steps
        assert clf.lstm_params_[0].shape[1] == expected
    # one long sequence among short ones leaves the short ones as they are
    X = [rng.standard_normal((5, 2)) for _ in range(9)] + [rng.standard_normal((400, 2))]
    clf = quiet_fit(LSTMClassifier(**SMALL), X, np.arange(10) % 2)
    assert clf.patch_size_ == 1
    # from the samples of positive weight: a zero weight is as if the sample were left out
    X = [rng.standard_normal((40, 1)) for _ in range(5)] + [rng.standard_normal((400, 1))] * 6
    clf = quiet_fit(LSTMClassifier(**SMALL), X, np.arange(11) % 2,
                    sample_weight=np.repeat([1.0, 0.0], [5, 6]))
    assert clf.patch_size_ == 2
    # 2-D input: univariate sequences of n_features_in_ steps
    reg = quiet_fit(LSTMRegressor(**SMALL), rng.standard_normal((10, 100)), np.arange(10.0))
    assert reg.patch_size_ == 4 and reg.n_features_in_ == 100 and reg.input_size_ == 1
    assert reg.predict(rng.standard_normal((3, 100))).shape == (3,)


def test_patch_size_is_checked_and_kept_by_warm_start_and_partial_fit():
    X, y = motions(40, seed=3, steps=70)
    for bad, error in [("big", ValueError), (0, ValueError), (2.5, TypeError)]:
        with pytest.raises(error, match="patch_size must be"):
            LSTMClassifier(patch_size=bad).fit(X, y)
    clf = quiet_fit(LSTMClassifier(warm_start=True, **SMALL), X, y)
    assert clf.patch_size_ == 3
    quiet_fit(clf, X[:, :40], y)  # 'auto' keeps the fitted patches
    assert clf.patch_size_ == 3
    clf.set_params(patch_size=2)
    with pytest.raises(ValueError, match="patch_size=2 differs from the fitted model's "
                                         "patch_size=3"):
        clf.fit(X, y)
    stepped = LSTMClassifier(**SMALL).partial_fit(X, y, classes=np.arange(4))
    stepped.partial_fit(X[:, :10], y)
    assert stepped.patch_size_ == 3


# --------------------------------------------------------------------------- schedule

def test_adaptive_learning_rate_divides_it_at_a_plateau_before_stopping(capsys):
    X, y = motions(60, seed=0)
    settings = dict(hidden_size=4, learning_rate_init=0.05, n_iter_no_change=2, max_iter=200,
                    random_state=0)
    constant = quiet_fit(LSTMClassifier(learning_rate="constant", **settings), X, y)
    adaptive = LSTMClassifier(verbose=1, **settings).fit(X, y)
    out = capsys.readouterr().out.splitlines()
    notes = [line for line in out if ": learning rate divided by 5 to" in line]
    assert len(notes) == 2 and notes[0].endswith("to 0.01.") and notes[1].endswith("to 0.002.")
    assert out[-1].startswith("Training loss did not improve more than tol=0.0001 for 2 "
                              "consecutive epochs at the learning rate divided by 5^2. Stopping.")
    assert adaptive.loss_curve_[:constant.n_iter_] == constant.loss_curve_
    assert adaptive.n_iter_ >= constant.n_iter_ + 2 * 3
    with pytest.raises(ValueError, match="learning_rate must be 'constant' or 'adaptive'"):
        LSTMClassifier(learning_rate="invscaling").fit(X, y)
    with pytest.raises(TypeError, match="standardize must be a bool"):
        LSTMClassifier(standardize="yes").fit(X, y)


def test_default_regressor_passes_check_regressors_train():
    from sklearn.utils.estimator_checks import check_regressors_train
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_regressors_train("LSTMRegressor", LSTMRegressor())


# --------------------------------------------------------------------------- UCR/UEA

def _mean_accuracy(name, seeds, standardized):
    X_train, y_train = packaged(name, "train")
    X_test, y_test = packaged(name, "test")
    if standardized:
        X_train, X_test = standardized_per_channel(X_train, X_test)
    scores = []
    for seed in seeds:
        clf = quiet_fit(LSTMClassifier(channels_first=True, random_state=seed), X_train, y_train)
        scores.append(clf.score(X_test, y_test))
    return float(np.mean(scores)), scores


@pytest.mark.slow
@pytest.mark.parametrize("standardized", [False, True], ids=["raw", "standardized"])
def test_defaults_on_basic_motions_over_five_seeds(standardized):
    mean, scores = _mean_accuracy("BasicMotions", range(5), standardized)
    assert mean >= 0.95, scores


@pytest.mark.parametrize("standardized", [False, True], ids=["raw", "standardized"])
def test_defaults_on_basic_motions_two_seeds(standardized):
    """The fast variant of the 5-seed test: seeds 0 and 1."""
    mean, scores = _mean_accuracy("BasicMotions", range(2), standardized)
    assert mean >= 0.95, scores


def test_defaults_on_gun_point_two_seeds():
    """The fast variant for long univariate series (150 steps, read in patches of 5)."""
    mean, scores = _mean_accuracy("GunPoint", range(2), standardized=False)
    assert mean >= 0.93, scores


@pytest.mark.slow
@pytest.mark.parametrize("name, floor", [("JapaneseVowels", 0.95), ("ItalyPowerDemand", 0.95),
                                         ("GunPoint", 0.93), ("ArrowHead", 0.65)])
def test_defaults_keep_their_accuracy_on_other_packaged_sets(name, floor):
    mean, scores = _mean_accuracy(name, range(5), standardized=False)
    assert mean >= floor, scores


# --------------------------------------------------------------------------- containers

def test_nested_and_multiindex_dataframes_are_the_sequences_they_hold():
    pd = pytest.importorskip("pandas")
    X = ragged_sequences(n=12, features=2, seed=1)
    y = np.arange(12) % 2
    nested = pd.DataFrame({f"dim_{c}": [pd.Series(x[:, c]) for x in X] for c in range(2)})
    long = pd.concat([pd.DataFrame(x, columns=["a", "b"]) for x in X], keys=range(12),
                     names=["instance", "time"])
    expected = quiet_fit(LSTMClassifier(**SMALL), X, y).predict_proba(X)
    for frame in (nested, long):
        clf = quiet_fit(LSTMClassifier(**SMALL), frame, y)
        assert clf.input_size_ == 2
        np.testing.assert_array_equal(clf.predict_proba(frame), expected)
        # channels and time are explicit in a DataFrame: channels_first changes nothing
        flipped = quiet_fit(LSTMClassifier(channels_first=True, **SMALL), frame, y)
        np.testing.assert_array_equal(flipped.predict_proba(frame), expected)


def test_bad_nested_dataframes_name_the_layout_and_the_fix():
    pd = pytest.importorskip("pandas")
    y = np.array([0, 1])
    unequal = pd.DataFrame({"a": [pd.Series([1.0, 2, 3]), pd.Series([1.0, 2])],
                            "b": [pd.Series([1.0, 2, 3]), pd.Series([1.0, 2, 3])]})
    with pytest.raises(ValueError, match=r"X is a nested DataFrame .* the channels of row 1 "
                                         r"have different lengths \[2, 3\].*pad the shorter"):
        LSTMClassifier(**SMALL).fit(unequal, y)
    words = pd.DataFrame({"a": [pd.Series(["x", "y"]), pd.Series([1.0, 2])]})
    with pytest.raises(ValueError, match=r"nested DataFrame .* X.iloc\[0, 0\] is Series"):
        LSTMClassifier(**SMALL).fit(words, y)
    deep = pd.DataFrame({"a": np.arange(8.0)},
                        index=pd.MultiIndex.from_product([[0, 1], [0, 1], [0, 1]]))
    with pytest.raises(ValueError, match="3-level row index; a collection of series needs "
                                         r"two levels, \(instance, time\)"):
        LSTMClassifier(**SMALL).fit(deep, y)


def test_ragged_containers_numpy_cannot_stack_are_read_item_by_item():
    X = ragged_sequences(n=10, features=2, seed=2)
    y = np.arange(10) % 2
    expected = quiet_fit(LSTMClassifier(**SMALL), X, y).predict_proba(X)

    class Ragged:  # what an awkward Array of variable-length sequences looks like to numpy
        def __init__(self, items):
            self.items = items

        def __len__(self):
            return len(self.items)

        def __iter__(self):
            return (item.tolist() for item in self.items)

        def __array__(self, dtype=None, copy=None):
            raise ValueError("cannot convert to RegularArray")

    clf = quiet_fit(LSTMClassifier(**SMALL), Ragged(X), y)
    np.testing.assert_array_equal(clf.predict_proba(Ragged(X)), expected)
    nested_lists = [x.tolist() for x in X]  # a list of lists of lists of different lengths
    np.testing.assert_array_equal(quiet_fit(LSTMClassifier(**SMALL), nested_lists, y)
                                  .predict_proba(X), expected)
    with pytest.raises(ValueError, match=r"X \(list\) is not an array: .* Pass a 3-D array"):
        LSTMClassifier(**SMALL).fit([[[1.0, 2.0], [3.0]], [[1.0]]], y[:2])
