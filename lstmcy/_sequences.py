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

This module turns all of them into :class:`Sequences` (one 3-D array, or a list of 2-D
arrays of different lengths) and cuts those into :class:`Batch` es for ``lstm_forward``.
"""
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import check_array

__all__ = ["Batch", "Sequences", "is_sequence_list", "check_sequence_list", "check_3d",
           "from_padded", "trim_nan_padding"]

# A 3-D array whose features outnumber its time steps by this factor (or that has one
# step) probably is channels-first data read the other way round.
_CHANNELS_FIRST_RATIO = 10


class Batch:
    """One mini-batch as lstmcy's forward wants it.

    Attributes
    ----------
    input : ndarray
        ``[B, T, F]`` (``batch_first``) for equal lengths, or packed ``[sum(lengths), F]``.
    batch_first : bool
    batch_sizes : ndarray of int64 or None
        PackedSequence batch sizes (sequences sorted by decreasing length).
    lengths : ndarray of int
        Length of each sequence, in batch order.
    sample_index : ndarray of int
        Dataset index of each batch entry (batch order is sorted for packed batches,
        so outputs are put back with ``out[sample_index] = batch_out``).
    mask : ndarray of bool or None
        ``[T, B]`` active positions of a packed batch; ``padded[mask]`` gives packed rows.
    """

    __slots__ = ("input", "batch_first", "batch_sizes", "lengths", "sample_index", "mask")

    def __init__(self, input, batch_first, batch_sizes, lengths, sample_index, mask):
        self.input = input
        self.batch_first = batch_first
        self.batch_sizes = batch_sizes
        self.lengths = lengths
        self.sample_index = sample_index
        self.mask = mask

    @property
    def size(self):
        return len(self.sample_index)


class Sequences:
    """Validated sequences in the compute dtype: one 3-D array or a list of 2-D arrays.

    Parameters
    ----------
    dense : ndarray ``[n, T, F]`` or None
    ragged : list of ndarray ``[T_i, F]`` or None
    """

    def __init__(self, dense=None, ragged=None):
        self.dense = dense
        self.ragged = ragged
        if dense is not None:
            self.n_samples, _, self.n_features = dense.shape
            self.lengths = np.full(self.n_samples, dense.shape[1], dtype=np.intp)
        else:
            self.n_samples = len(ragged)
            self.n_features = ragged[0].shape[1]
            self.lengths = np.array([len(seq) for seq in ragged], dtype=np.intp)

    @classmethod
    def from_arrays(cls, arrays):
        """One 3-D array when the 2-D ``arrays`` all have one length, else a ragged list."""
        if len({len(array) for array in arrays}) == 1:
            return cls(dense=np.stack(arrays))
        return cls(ragged=list(arrays))

    def subset(self, index):
        if self.dense is not None:
            return Sequences(dense=self.dense[index])
        return Sequences(ragged=[self.ragged[i] for i in index])

    def batch(self, index):
        """Build the :class:`Batch` of the samples ``index``."""
        index = np.asarray(index, dtype=np.intp)
        if self.dense is not None:
            return Batch(self.dense[index], True, None, self.lengths[index], index, None)
        lengths = self.lengths[index]
        order = np.argsort(-lengths, kind="stable")
        sample_index = index[order]
        lengths = lengths[order]
        steps = int(lengths[0])
        mask = np.arange(steps)[:, None] < lengths[None, :]  # [T, B], time-major
        padded = np.zeros((steps, len(index), self.n_features), dtype=self.ragged[0].dtype)
        for position, sample in enumerate(sample_index):
            padded[: lengths[position], position] = self.ragged[sample]
        batch_sizes = mask.sum(axis=1).astype(np.int64)
        return Batch(padded[mask], False, batch_sizes, lengths, sample_index, mask)


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
            f"as in sktime and aeon, pass channels_first=True.", UserWarning, stacklevel=5)
    return from_padded(array, dtype)


def from_padded(array, dtype):
    """:class:`Sequences` of the NaN-padded ``array [n, T, F]``, in ``dtype``."""
    lengths = trim_nan_padding(array, name_of=lambda i: f"X[{i}]")
    if (lengths == lengths[0]).all():
        return Sequences(dense=np.ascontiguousarray(array[:, :lengths[0]], dtype=dtype))
    return Sequences(ragged=[np.ascontiguousarray(array[i, :length], dtype=dtype)
                             for i, length in enumerate(lengths)])


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
