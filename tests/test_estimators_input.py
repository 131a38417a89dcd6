"""Tests of the input layouts of lstmcy.estimators.

Each layout (lists of 1-D arrays, NaN-padded arrays, channels-first arrays and lists) is
checked against the layout it stands for: the same random_state must give bit-identical
parameters and predictions. Bad input must raise a ValueError naming the sample.
"""
import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from estimator_helpers import params_equal, quiet_fit, ragged_sequences  # noqa: E402
from lstmcy.estimators import LSTMClassifier, LSTMRegressor  # noqa: E402

SETTINGS = dict(hidden_size=5, max_iter=3, dtype=np.float64, random_state=0)


def nan_padded(sequences):
    """The 3-D array ``(n, max_len, F)`` of ``sequences``, padded with trailing NaN."""
    padded = np.full((len(sequences), max(map(len, sequences)), sequences[0].shape[1]), np.nan)
    for i, seq in enumerate(sequences):
        padded[i, :len(seq)] = seq
    return padded


def targets_of(sequences):
    return np.array([seq[:, 0].sum() > 0 for seq in sequences]).astype(int)


def fit_both(a, b, y, **settings):
    """Fit one classifier on each of two spellings of the same data."""
    first = quiet_fit(LSTMClassifier(**{**SETTINGS, **settings}), a, y)
    second = quiet_fit(LSTMClassifier(**{**SETTINGS, **settings}), b, y)
    return first, second


# --------------------------------------------------------------------------- lists of 1-D

def test_list_of_1d_arrays_is_univariate_variable_length():
    sequences = ragged_sequences(n=30, features=1, seed=2)
    y = targets_of(sequences)
    one_d = [seq[:, 0] for seq in sequences]
    with pytest.raises(ValueError, match="inhomogeneous"):
        np.asarray(one_d)  # what numpy (and check_array) make of it
    a, b = fit_both(one_d, sequences, y)
    assert params_equal(a, b)
    assert a.input_size_ == a.n_features_in_ == 1
    np.testing.assert_array_equal(a.predict_proba(one_d), b.predict_proba(sequences))
    np.testing.assert_array_equal(a.predict_proba([list(s) for s in one_d]), a.predict_proba(one_d))


def test_list_of_equal_length_1d_arrays_is_the_2d_table():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((20, 6))
    y = (table.sum(axis=1) > 0).astype(int)
    a, b = fit_both(list(table), table, y)
    assert params_equal(a, b) and a.n_features_in_ == 6


# --------------------------------------------------------------------------- NaN padding

@pytest.mark.parametrize("features", [1, 3])
def test_trailing_nan_padding_is_the_end_of_a_sequence(features):
    sequences = ragged_sequences(n=30, features=features, seed=features)
    y = targets_of(sequences)
    padded = nan_padded(sequences)
    before = padded.copy()
    a, b = fit_both(padded, sequences, y)
    assert params_equal(a, b)
    np.testing.assert_array_equal(a.predict_proba(padded), b.predict_proba(sequences))
    np.testing.assert_array_equal(padded, before)  # the input is not modified
    if features == 1:  # a 2-D NaN-padded table of univariate sequences
        c = quiet_fit(LSTMClassifier(**SETTINGS), padded[:, :, 0], y)
        assert params_equal(a, c)
        np.testing.assert_array_equal(c.predict_proba(padded[:, :, 0]), a.predict_proba(padded))


def test_padding_common_to_all_samples_is_trimmed():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.standard_normal((20, 5, 2)), np.full((20, 3, 2), np.nan)], axis=1)
    y = (X[:, 0, 0] > 0).astype(int)
    a, b = fit_both(X, X[:, :5], y)
    assert params_equal(a, b)


@pytest.mark.parametrize("where, message", [
    ((2, 1, 0), r"X\[2\] has NaN at time step 1, inside the sequence \(its last observed step "
                r"is 5\)"),
    ((4, 5, 1), r"X\[4\] has NaN at time step 5, inside the sequence"),  # one feature of two
])
def test_nan_inside_a_sequence_names_the_sample(where, message):
    X = np.random.default_rng(0).standard_normal((6, 6, 2))
    X[where] = np.nan
    with pytest.raises(ValueError, match=message):
        LSTMClassifier(**SETTINGS).fit(X, np.arange(6) % 2)
    fitted = quiet_fit(LSTMClassifier(**SETTINGS), np.nan_to_num(X), np.arange(6) % 2)
    with pytest.raises(ValueError, match=message):
        fitted.predict(X)
    with pytest.raises(ValueError, match=message.replace("X\\[2\\]", "X\\[0\\]")
                       .replace("X\\[4\\]", "X\\[0\\]")):
        fitted.predict([X[where[0]]])


def test_all_nan_sample_and_infinity_are_refused():
    X = np.random.default_rng(0).standard_normal((6, 4, 2))
    X[3] = np.nan
    with pytest.raises(ValueError, match=r"X\[3\] has no time steps: all its values are NaN"):
        LSTMClassifier(**SETTINGS).fit(X, np.arange(6) % 2)
    X[3] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        LSTMClassifier(**SETTINGS).fit(X, np.arange(6) % 2)


# --------------------------------------------------------------------------- zero length

@pytest.mark.parametrize("empty", [np.zeros((0, 2)), np.zeros(0)], ids=["2-D", "1-D"])
def test_zero_length_sequence_names_the_sample(empty):
    sequences = ragged_sequences(n=5, features=2 if empty.ndim == 2 else 1)
    if empty.ndim == 1:
        sequences = [seq[:, 0] for seq in sequences]
    sequences[2] = empty
    with pytest.raises(ValueError, match=r"X\[2\] has no time steps: every sequence needs at "
                                         r"least one"):
        LSTMRegressor(**SETTINGS).fit(sequences, np.arange(5.0))


def test_zero_time_steps_in_a_3d_array():
    with pytest.raises(ValueError, match=r"X has shape \(4, 0, 3\) .* at least one time step"):
        LSTMRegressor(**SETTINGS).fit(np.zeros((4, 0, 3)), np.arange(4.0))


# --------------------------------------------------------------------------- channels first

def test_channels_first_3d_array():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((24, 3, 7))  # (n_samples, n_channels, n_timepoints)
    y = (X[:, 0].sum(axis=1) > 0).astype(int)
    a, b = fit_both(X, X.transpose(0, 2, 1).copy(), y)
    assert not params_equal(a, b)  # without the option the axes are read the other way
    a = quiet_fit(LSTMClassifier(channels_first=True, **SETTINGS), X, y)
    assert params_equal(a, b) and a.input_size_ == 3
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X.transpose(0, 2, 1)))


def test_channels_first_lists_and_nan_padding():
    sequences = ragged_sequences(n=30, features=3, seed=5)
    y = targets_of(sequences)
    first = [seq.T for seq in sequences]  # aeon's unequal-length layout: (n_channels, T_i)
    a = quiet_fit(LSTMClassifier(channels_first=True, **SETTINGS), first, y)
    b = quiet_fit(LSTMClassifier(**SETTINGS), sequences, y)
    assert params_equal(a, b)
    padded_first = nan_padded(sequences).transpose(0, 2, 1)
    np.testing.assert_array_equal(a.predict_proba(padded_first), b.predict_proba(sequences))


def test_channels_first_list_read_channels_last_gets_a_hint():
    sequences = [np.zeros((3, length)) for length in (5, 8, 6)]
    with pytest.raises(ValueError, match=r"X\[1\] has 8 features per time step, but X\[0\] has "
                                         r"5.*pass channels_first=True"):
        LSTMRegressor(**SETTINGS).fit(sequences, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"X\[1\] has 3 features .* X\[0\] has 2") as info:
        LSTMRegressor(**SETTINGS).fit([np.zeros((4, 2)), np.zeros((5, 3))], [0.0, 1.0])
    assert "channels_first" not in str(info.value)  # rows differ too: not channels-first


@pytest.mark.parametrize("shape", [(12, 6, 100), (12, 1, 4)])
def test_warns_when_3d_input_looks_channels_first(shape):
    X = np.random.default_rng(0).standard_normal(shape)
    y = np.arange(12) % 2
    with pytest.warns(UserWarning, match=rf"X has shape \({shape[0]}, {shape[1]}, {shape[2]}\) "
                                         r"and is read as \(n_samples, n_timesteps, n_features\)"
                                         r".*pass channels_first=True") as record:
        LSTMClassifier(n_iter_no_change=None, **SETTINGS).fit(X, y)
    assert record[0].filename == __file__  # points at the call of fit
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        quiet_fit(LSTMClassifier(channels_first=True, **SETTINGS), X, y)
        quiet_fit(LSTMClassifier(**SETTINGS), X.transpose(0, 2, 1), y)  # channels-last
        quiet_fit(LSTMClassifier(**SETTINGS), np.zeros((12, 3, 29)), y)  # not far more features


def test_channels_first_does_not_change_2d_tables():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((20, 6))
    y = (table.sum(axis=1) > 0).astype(int)
    a, b = fit_both(table, table, y, channels_first=True)
    c = quiet_fit(LSTMClassifier(**SETTINGS), table, y)
    assert params_equal(a, c) and a.input_size_ == 1


# --------------------------------------------------------------------------- other errors

def test_input_layout_errors():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 6, 3))
    y = (X[:, :, 0].sum(axis=1) > 0).astype(int)
    clf = quiet_fit(LSTMClassifier(hidden_size=4, max_iter=1), X, y)
    assert clf.n_features_in_ == 3 and clf.input_size_ == 3
    with pytest.raises(ValueError, match="2 features per time step, but LSTMClassifier is "
                                         "expecting 3"):
        clf.predict(X[:, :, :2])
    with pytest.raises(ValueError, match="univariate"):
        clf.predict(X[:, :, 0])
    with pytest.raises(ValueError, match=r"X\[1\] has 2 features"):
        clf.predict([X[0], X[1][:, :2]])
    with pytest.raises(ValueError, match="must be 2-D .* 3-D"):
        clf.predict(X[:, :, :, None])
    with pytest.raises(ValueError, match=r"X\[\d+\] has NaN at time step \d+, inside"):
        clf.predict(np.where(X > 2, np.nan, X))
    # Other sequence lengths are fine for 3-D input.
    assert clf.predict(X[:, :2]).shape == (30,)


def test_table_fit_checks_columns_but_univariate_3d_is_accepted():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 5))
    model = quiet_fit(LSTMRegressor(hidden_size=4, max_iter=1), X, X.sum(axis=1))
    with pytest.raises(ValueError, match="X has 4 features, but LSTMRegressor is expecting 5"):
        model.predict(X[:, :4])
    assert model.predict(X[:, :4, None]).shape == (60,)
