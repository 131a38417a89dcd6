"""Sequence input of :mod:`lstmcy.estimators`: layouts, NaN padding, mini-batches.

The estimators accept the layouts time-series data comes in:

* a 3-D array ``(n_samples, n_timesteps, n_features)``, or ``(n_samples, n_channels,
  n_timepoints)`` (sktime's and aeon's layout) with ``channels_first=True``;
* a list of 2-D arrays ``(n_timesteps_i, n_features)`` (``(n_channels, n_timepoints_i)``
  with ``channels_first``) or of 1-D arrays (univariate), whose lengths may differ;
* a 2-D array ``(n_samples, n_timesteps)`` of univariate sequences (handled by the
  estimators, which also keep scikit-learn's column bookkeeping for it).

Trailing NaN marks the end of a sequence: a time step whose features are all NaN, and
every step after it, is padding. This is how variable-length series are often stored in
one array. NaN anywhere else is an error naming the sample.

This module turns all of them into :class:`Sequences` (the real time steps of every
sequence, as rows) and cuts those into packed kernel calls (:class:`Part`, PyTorch's
``PackedSequence`` layout) that cost their real time steps: :class:`Batch` es for
training, :meth:`Sequences.parts` for prediction.
"""
import sys
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_array

__all__ = ["Batch", "Part", "Sequences", "cut", "is_sequence_list", "check_sequence_list", "check_3d",
           "from_padded", "item_sequences", "pandas_sequences",
           "trim_nan_padding"]

# A 3-D array whose features outnumber its time steps by this factor (or that has one
# step) probably is channels-first data read the other way round.
_CHANNELS_FIRST_RATIO = 10


# A kernel call's padded area (its longest sequence times its sequences) is at most this
# many times its real time steps: the kernels keep a training call's saved activations
# (and a stacked layer's output) padded, so a long sequence among short ones is cut off
# into a call of its own rather than padding every short one to its length.
MAX_PADDING = 2


def _positions(batch_sizes):
    """The position in its call of the sequence of each packed row."""
    starts = np.cumsum(batch_sizes) - batch_sizes
    return np.arange(starts[-1] + batch_sizes[-1]) - np.repeat(starts, batch_sizes)


class Part:
    """One packed kernel call: sequences sorted by decreasing length, in PyTorch's
    ``PackedSequence`` layout (lstmcy's ``batch_sizes``).

    Attributes
    ----------
    input : ndarray ``[sum(lengths), F]``
        The packed rows: step 0 of every sequence, then step 1 of those that have one, ...
    batch_sizes : ndarray of int64 ``[T]``
        Sequences active at each step.
    lengths : ndarray of intp ``[B]``
        Length of each sequence of the call, decreasing.
    sample_index : ndarray of intp
        Dataset index of the first ``len(sample_index)`` sequences of the call (the
        others, if any, are the one-step sequences of zeros :meth:`Sequences.parts` adds
        to reach ``min_size``).
    uniform : bool
        Whether every sequence has the same length (the input is ``[T, B, F]`` time-major).
    """

    __slots__ = ("input", "batch_sizes", "lengths", "sample_index", "uniform")

    def __init__(self, input, batch_sizes, lengths, sample_index, uniform):
        self.input = input
        self.batch_sizes = batch_sizes
        self.lengths = lengths
        self.sample_index = sample_index
        self.uniform = uniform

    @property
    def steps(self):
        return len(self.batch_sizes)

    def kernel_input(self, dtype=None):
        """``(input, batch_sizes)`` for ``lstm_forward`` (``input`` in ``dtype`` if given):
        ``[T, B, F]`` time-major and None where the sequences have one length (the same
        rows; the kernels check that call quicker), else the packed rows and
        ``batch_sizes``."""
        rows = self.input if dtype is None else self.input.astype(dtype, copy=False)
        if self.uniform:
            return rows.reshape(self.steps, len(self.lengths), rows.shape[1]), None
        return rows, self.batch_sizes

    @property
    def packed_start(self):
        """First packed row of each step."""
        return np.cumsum(self.batch_sizes) - self.batch_sizes

    @property
    def positions(self):
        """The sequence (position in the call) of each packed row."""
        if self.uniform:
            return np.tile(np.arange(len(self.lengths)), self.steps)
        return _positions(self.batch_sizes)

    def step_sums(self, rows):
        """Sum over each sequence's steps of the packed ``rows`` ``[sum(lengths), F]``:
        ``[B, F]``, each sequence's rows added one step after the other, so that its sum
        does not depend on the other sequences of the call."""
        if self.uniform:
            return rows.reshape(self.steps, len(self.lengths), -1).sum(axis=0)
        sizes = self.batch_sizes
        total = rows[:sizes[0]].copy()
        start = int(sizes[0])
        for size in sizes[1:].tolist():
            total[:size] += rows[start:start + size]
            start += size
        return total


class Batch:
    """One mini-batch: its samples in one or more packed :class:`Part` s.

    Attributes
    ----------
    parts : list of Part
    sample_index : ndarray of intp
        Dataset index of each entry, in the order of the parts' sequences (outputs are
        put back with ``out[sample_index] = batch_out``).
    """

    __slots__ = ("parts", "sample_index")

    def __init__(self, parts):
        self.parts = parts
        self.sample_index = (parts[0].sample_index if len(parts) == 1
                             else np.concatenate([part.sample_index for part in parts]))

    @property
    def size(self):
        return len(self.sample_index)


def cut(lengths, max_samples=None, max_tokens=None):
    """Cut sequences of decreasing ``lengths`` into consecutive kernel calls.

    A call starts at its longest sequence and takes the next ones while its padded area
    stays within ``MAX_PADDING`` times its real steps, and it holds at most
    ``max_samples`` sequences and ``max_tokens`` steps (but always one sequence).

    Returns
    -------
    list of (start, stop)
    """
    n = len(lengths)
    total = np.concatenate([[0], np.cumsum(lengths)])
    if (max_samples is None or n <= max_samples) and (max_tokens is None or total[-1] <= max_tokens) \
            and lengths[0] * n <= MAX_PADDING * total[-1]:
        return [(0, n)]  # the common case: one call
    bounds = []
    start = 0
    while start < n:
        stop = n if max_samples is None else min(n, start + max_samples)
        count = np.arange(1, stop - start + 1)
        steps = total[start + 1:stop + 1] - total[start]
        # Both conditions hold for a prefix of the candidates (lengths decrease).
        fits = lengths[start] * count <= MAX_PADDING * steps
        if max_tokens is not None:
            fits &= steps <= max_tokens
        fits[0] = True
        stop = start + (len(fits) if fits.all() else int(np.argmin(fits)))
        bounds.append((start, stop))
        start = stop
    return bounds


class Sequences:
    """Validated sequences in the compute dtype, stored as rows of time steps.

    Sequence ``i`` is ``rows[starts[i]:starts[i] + lengths[i]]``. Subsets share the rows.

    Parameters
    ----------
    rows : ndarray ``[n_rows, F]``, C-contiguous
    starts, lengths : ndarray of intp ``[n]``
    """

    def __init__(self, rows, starts, lengths):
        self.rows = rows
        self.starts = starts
        self.lengths = lengths
        self.n_samples = len(lengths)
        self.n_features = rows.shape[1]

    @classmethod
    def from_arrays(cls, arrays):
        """The 2-D ``arrays`` ``[T_i, F]``, one after the other."""
        lengths = np.array([len(array) for array in arrays], dtype=np.intp)
        return cls(np.concatenate(arrays), np.cumsum(lengths) - lengths, lengths)

    @classmethod
    def from_dense(cls, array):
        """The sequences of a C-contiguous ``[n, T, F]`` array (its rows, not a copy)."""
        n, steps, n_features = array.shape
        return cls(array.reshape(n * steps, n_features), np.arange(n, dtype=np.intp) * steps,
                   np.full(n, steps, dtype=np.intp))

    def row_index(self):
        """The index in ``rows`` of every time step of the sequences, one sequence after
        the other."""
        ends = np.cumsum(self.lengths)
        return np.repeat(self.starts - (ends - self.lengths), self.lengths) + np.arange(ends[-1])

    def subset(self, index):
        return Sequences(self.rows, self.starts[index], self.lengths[index])

    def part(self, index, min_size=1):
        """The :class:`Part` of the samples ``index`` (in decreasing order of length),
        with one-step sequences of zeros after them up to ``min_size`` sequences."""
        lengths = self.lengths[index]
        starts = self.starts[index]
        extra = max(0, min_size - len(index))
        if extra:
            lengths = np.concatenate([lengths, np.ones(extra, dtype=np.intp)])
            starts = np.concatenate([starts, np.zeros(extra, dtype=np.intp)])
        B, steps = len(lengths), int(lengths[0])
        if lengths[-1] == steps:  # [T, B] rows, time-major
            source = (starts[None, :] + np.arange(steps)[:, None]).ravel()
            batch_sizes = np.full(steps, B, dtype=np.int64)
        else:
            # batch_sizes[t] = sequences longer than t
            batch_sizes = B - np.cumsum(np.bincount(lengths, minlength=steps + 1)[:steps])
            source = starts[_positions(batch_sizes)] + np.repeat(np.arange(steps), batch_sizes)
        input = self.rows[source]
        if extra:
            input[len(index):B] = 0  # the added sequences' one step: step 0's last rows
        return Part(input, batch_sizes.astype(np.int64, copy=False), lengths,
                    np.asarray(index, dtype=np.intp), bool(lengths[-1] == steps))

    def batch(self, index):
        """The :class:`Batch` of the samples ``index``: sorted by decreasing length and
        packed, in as many parts as :func:`cut` makes."""
        index = np.asarray(index, dtype=np.intp)
        index = index[np.argsort(-self.lengths[index], kind="stable")]
        return Batch([self.part(index[start:stop])
                      for start, stop in cut(self.lengths[index])])

    def parts(self, max_samples, max_tokens, min_size=1):
        """Every sample in :class:`Part` s of at most ``max_samples`` sequences and
        ``max_tokens`` steps (see :func:`cut`), longest first, each of at least
        ``min_size`` sequences (with added one-step sequences of zeros)."""
        index = np.argsort(-self.lengths, kind="stable")
        for start, stop in cut(self.lengths[index], max_samples, max_tokens):
            yield self.part(index[start:stop], min_size)


# --------------------------------------------------------------------------- layouts

def _ndim(item):
    try:
        return np.ndim(item)
    except ValueError:  # a ragged nested list
        return None


def is_sequence_list(X):
    """Whether ``X`` is a list (or 1-D object array) of sequences rather than a table.

    A list of 2-D arrays always is. A list of 1-D arrays is when their lengths differ:
    univariate sequences of different lengths (equal lengths make the 2-D table that
    scikit-learn's tools pass as lists of rows).
    """
    if isinstance(X, np.ndarray):
        if X.dtype != object or X.ndim != 1:
            return False
    elif not isinstance(X, (list, tuple)):
        return False
    if len(X) == 0 or sp.issparse(X[0]):
        return False
    ndim = _ndim(X[0])
    if ndim == 2:
        return True
    if ndim != 1:
        return False
    lengths = set()
    for item in X:
        if _ndim(item) != 1:
            return False
        lengths.add(len(item))
    return len(lengths) > 1


def pandas_sequences(X):
    """The sequences of a pandas collection of time series, as a list of 2-D arrays
    ``(n_timepoints_i, n_channels)``; None if ``X`` is not one.

    Two layouts are collections: sktime's nested DataFrame (``nested_univ``: one row per
    series, one column per channel, each cell a Series or array of that channel's time
    points, whose lengths may differ between rows) and the long DataFrame with a
    two-level row index ``(instance, time)`` and one column per channel (sktime's
    ``pd-multiindex``, aeon's and sktime's loaders' other output). Channels and time are
    explicit in both, so ``channels_first`` does not apply.
    """
    pd = sys.modules.get("pandas")
    if pd is None or not isinstance(X, pd.DataFrame):
        return None
    if isinstance(X.index, pd.MultiIndex):
        if X.index.nlevels != 2:
            raise ValueError(
                f"X is a DataFrame with a {X.index.nlevels}-level row index; a collection of "
                f"series needs two levels, (instance, time), with one column per channel. "
                f"Drop the outer levels or fit one model per group")
        try:
            return [np.ascontiguousarray(frame.to_numpy(dtype=np.float64))
                    for _, frame in X.groupby(level=0, sort=False)]
        except (TypeError, ValueError) as error:
            raise ValueError(f"X is a DataFrame with an (instance, time) row index whose "
                             f"columns (the channels) must be numeric: {error}") from None
    if len(X) == 0 or X.shape[1] == 0:
        return None
    first = X.iloc[0, 0]
    if not isinstance(first, (pd.Series, np.ndarray, list)):
        return None
    arrays = []
    for i in range(len(X)):
        channels = []
        for c in range(X.shape[1]):
            cell = X.iloc[i, c]
            try:
                channels.append(np.asarray(cell, dtype=np.float64).ravel())
            except (TypeError, ValueError):
                raise ValueError(
                    f"X is a nested DataFrame (one series per row, one channel per column), "
                    f"but X.iloc[{i}, {c}] is {type(cell).__name__!s} {str(cell)[:40]!r}, not "
                    f"a Series or array of numbers") from None
        lengths = {len(channel) for channel in channels}
        if len(lengths) > 1:
            raise ValueError(
                f"X is a nested DataFrame (one series per row, one channel per column), but "
                f"the channels of row {i} have different lengths {sorted(lengths)}: every "
                f"channel of a series needs the same time points (pad the shorter ones at "
                f"the end with NaN)")
        arrays.append(np.stack(channels, axis=1))
    return arrays


def item_sequences(X):
    """``X``'s items as numpy arrays if it is a collection that numpy cannot make one array
    of (a ragged nested list, an awkward Array of variable-length sequences); else None."""
    if isinstance(X, (np.ndarray, str, bytes)) or not hasattr(X, "__len__") \
            or not hasattr(X, "__iter__"):
        return None
    try:
        items = [np.asarray(item, dtype=np.float64) for item in X]
    except (TypeError, ValueError):
        return None
    if not items or any(item.ndim not in (1, 2) for item in items):
        return None
    return items


def _channels_first_hint(channels_first):
    if channels_first:
        return ""
    return (" (if the arrays are (n_channels, n_timepoints), as in sktime and aeon, pass "
            "channels_first=True)")


def check_sequence_list(X, dtype, *, channels_first=False):
    """Validate a list of sequences; return them as 2-D arrays in ``dtype``, C-contiguous.

    Items are 2-D ``(n_timesteps_i, n_features)`` (``(n_features, n_timesteps_i)`` with
    ``channels_first``) or 1-D univariate sequences. Trailing all-NaN steps are dropped
    (see :func:`trim_nan_padding`).
    """
    arrays = []
    for index, item in enumerate(X):
        name = f"X[{index}]"
        if sp.issparse(item):
            raise TypeError(f"{name} is a sparse matrix; sequences must be dense 2-D arrays")
        array = check_array(item, dtype=[np.float64, np.float32], input_name=name,
                            ensure_2d=False, ensure_min_samples=0, ensure_min_features=0,
                            ensure_all_finite="allow-nan")
        if array.ndim == 1:
            array = array[:, None]
        elif array.ndim != 2:
            raise ValueError(f"{name} has shape {array.shape}: each sequence must be a 2-D "
                             f"array (n_timesteps, n_features) or a 1-D univariate sequence")
        elif channels_first:
            array = array.T
        if array.shape[1] == 0:
            raise ValueError(f"{name} has shape {np.shape(item)}: it has no features")
        if arrays and array.shape[1] != arrays[0].shape[1]:
            same_rows = len({np.shape(x)[0] for x in X if _ndim(x) == 2}) == 1
            raise ValueError(
                f"{name} has {array.shape[1]} features per time step, but X[0] has "
                f"{arrays[0].shape[1]}: every sequence must have the same number of features"
                + (_channels_first_hint(channels_first) if same_rows else ""))
        length = int(trim_nan_padding(array[None], name_of=lambda i: name)[0])
        arrays.append(np.ascontiguousarray(array[:length], dtype=dtype))
    return arrays


def check_3d(X, dtype, *, channels_first=False, warn_layout=False):
    """Validate a 3-D array; return :class:`Sequences` in ``dtype`` (ragged if NaN-padded).

    ``warn_layout`` warns when a channels-last array looks channels-first.
    """
    array = check_array(X, dtype=[np.float64, np.float32], allow_nd=True, input_name="X",
                        ensure_min_samples=1, ensure_all_finite="allow-nan")
    if array.ndim != 3:
        raise ValueError(f"X must be 2-D (n_samples, n_timesteps), 3-D (n_samples, n_timesteps, "
                         f"n_features) or a list of 2-D arrays; got an array of shape {array.shape}")
    if channels_first:
        array = array.transpose(0, 2, 1)
    n_samples, steps, n_features = array.shape
    if steps < 1 or n_features < 1:
        axes = "n_channels, n_timepoints" if channels_first else "n_timesteps, n_features"
        raise ValueError(f"X has shape {np.shape(X)} ({'n_samples, ' + axes}): it needs at least "
                         f"one time step and one feature per step")
    if warn_layout and not channels_first and n_features > 1 and (
            steps == 1 or n_features >= _CHANNELS_FIRST_RATIO * steps):
        warnings.warn(
            f"X has shape {array.shape} and is read as (n_samples, n_timesteps, n_features): "
            f"{n_samples} sequences of {steps} time step{'s' if steps > 1 else ''} with "
            f"{n_features} features each. If it is (n_samples, n_channels, n_timepoints), "
            f"as in sktime and aeon, pass channels_first=True.", UserWarning, stacklevel=6)
    return from_padded(array, dtype)


def from_padded(array, dtype):
    """:class:`Sequences` of the NaN-padded ``array [n, T, F]``, in ``dtype``: its real
    steps only, so that padding costs nothing beyond the caller's array."""
    lengths = trim_nan_padding(array, name_of=lambda i: f"X[{i}]")
    if (lengths == lengths[0]).all():
        return Sequences.from_dense(np.ascontiguousarray(array[:, :lengths[0]], dtype=dtype))
    starts = np.cumsum(lengths) - lengths
    sample = np.repeat(np.arange(len(lengths)), lengths)
    step = np.arange(lengths.sum()) - np.repeat(starts, lengths)
    return Sequences(np.ascontiguousarray(array[sample, step], dtype=dtype), starts, lengths)


def trim_nan_padding(array, *, name_of):
    """Lengths of the sequences of ``array [n, T, F]`` once trailing NaN padding is removed.

    A sequence ends before its first step of a run of all-NaN steps that reaches the end.
    Raises ValueError naming the sample (``name_of(index)``) for NaN before that point and
    for a sequence that is all padding.
    """
    n_samples, steps = array.shape[:2]
    if steps == 0:
        raise ValueError(f"{name_of(0)} has no time steps: every sequence needs at least one")
    nan = np.isnan(array)
    if not nan.any():
        return np.full(n_samples, steps, dtype=np.intp)
    observed = ~nan.all(axis=2)  # [n, T]: steps with at least one value
    lengths = np.where(observed.any(axis=1), steps - np.argmax(observed[:, ::-1], axis=1), 0)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise ValueError(f"{name_of(empty[0])} has no time steps: all its values are NaN "
                         f"(every sequence needs at least one step)")
    inside = nan.any(axis=2) & (np.arange(steps)[None, :] < lengths[:, None])
    if inside.any():
        sample, step = np.argwhere(inside)[0]
        raise ValueError(
            f"{name_of(sample)} has NaN at time step {step}, inside the sequence (its last "
            f"observed step is {lengths[sample] - 1}). NaN is only accepted as trailing "
            f"padding: a step whose features are all NaN ends the sequence, and every step "
            f"after it must be all NaN too")
    return lengths.astype(np.intp)
