"""Pure-numpy reference implementation of the LSTM forward and backward.

This module is a test oracle: it is written for clarity, not speed. It loops
over time steps in Python, uses numpy for each step, and always computes in
float64 whatever the input dtype (float16, bfloat16, float32 or float64),
returning results in the input dtype. Validation is minimal.

The two functions have exactly the signatures of :func:`lstmcy.lstm_forward`
and :func:`lstmcy.lstm_backward` and the semantics of PyTorch's
``torch._VF.lstm`` (including its packed-sequence overload) differentiated by
float64 autograd.

Internally every sequence tensor is brought to a padded time-major float64
array ``[T, B, W]`` with zeros at inactive positions; at step ``t`` only rows
``b < batch_sizes[t]`` are active (PackedSequence order: lengths sorted in
decreasing order).
"""

import functools

import numpy as np

from lstmcy._engine.cache import SAVED_NAMES, ForwardCall, LSTMCache, refuse_cache
from lstmcy._engine.config import config_of

__all__ = ["lstm_forward", "lstm_backward", "LSTMCache"]



# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _quiet(function):
    """Run ``function`` without numpy floating-point warnings.

    Non-finite inputs are legitimate (they propagate as in PyTorch), so the
    overflow and invalid-operation warnings they cause are silenced.
    """
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return function(*args, **kwargs)
    return wrapper


def _sigmoid(x):
    """Logistic function ``1 / (1 + exp(-x))`` (overflow to inf gives 0)."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _mask_dtype(dtype):
    """Dtype of the dropout masks: the input dtype.

    Like every other array in the cache, the masks are stored in the caller's
    dtype (as :mod:`lstmcy._engine.plan` does), so both implementations, given the
    same seed, use bit-identical masks (``1 / (1 - dropout)`` rounded to that
    dtype).
    """
    return np.dtype(dtype)


class _Layout:
    """How sequence tensors (input, y, dy, dx) are laid out.

    Parameters
    ----------
    shape : tuple of int
        Shape of ``input``.
    batch_sizes : array_like or None
        PackedSequence batch sizes.
    batch_first : bool
        Whether a 3-D input is ``[B, T, I]``.
    batch_hint : int or None
        Batch size taken from ``hx`` (used only when it cannot be inferred
        from the input, i.e. packed input with T = 0).

    Attributes
    ----------
    kind : str
        ``"time_major"`` ([T,B,W]), ``"batch_first"`` ([B,T,W]), ``"packed"``
        (2-D, sum(batch_sizes) rows) or ``"padded_2d"`` (2-D, T*B rows,
        time-major).
    T, B : int
        Sequence length and batch size.
    batch_sizes : ndarray of int64, shape [T]
        Active rows per step (all B when no batch_sizes were given).
    """

    def __init__(self, shape, batch_sizes, batch_first, batch_hint):
        if batch_sizes is None:
            if len(shape) != 3:
                raise ValueError(
                    f"input must be 3-D when batch_sizes is None, got shape {shape}")
            self.kind = "batch_first" if batch_first else "time_major"
            if batch_first:
                self.B, self.T = shape[0], shape[1]
            else:
                self.T, self.B = shape[0], shape[1]
            self.batch_sizes = np.full(self.T, self.B, dtype=np.int64)
            return
        bs = np.asarray(batch_sizes, dtype=np.int64).reshape(-1)
        self.batch_sizes = bs
        self.T = int(bs.shape[0])
        if len(shape) == 3:
            self.kind = "batch_first" if batch_first else "time_major"
            if batch_first:
                self.B, T = shape[0], shape[1]
            else:
                T, self.B = shape[0], shape[1]
            if T != self.T:
                raise ValueError(
                    f"input has {T} time steps but batch_sizes has {self.T}")
        elif len(shape) == 2:
            if self.T > 0:
                self.B = int(bs[0])
            else:
                self.B = int(batch_hint) if batch_hint is not None else 0
            rows = shape[0]
            if rows == int(bs.sum()):
                self.kind = "packed"
            elif rows == self.T * self.B:
                self.kind = "padded_2d"
            else:
                raise ValueError(
                    f"2-D input has {rows} rows; expected sum(batch_sizes)="
                    f"{int(bs.sum())} (packed) or T*B={self.T * self.B} (padded)")
        else:
            raise ValueError(f"input must be 2-D or 3-D, got shape {shape}")

    def active(self):
        """Boolean ``[T, B]`` array, True where row b is active at step t."""
        return np.arange(self.B)[None, :] < self.batch_sizes[:, None]

    def to_time_major(self, arr):
        """Return ``arr`` as a float64 ``[T, B, W]`` array, zero where inactive."""
        arr = np.asarray(arr)
        width = arr.shape[-1]
        if self.kind == "time_major":
            out = arr.astype(np.float64)
        elif self.kind == "batch_first":
            out = arr.astype(np.float64).transpose(1, 0, 2)
        elif self.kind == "padded_2d":
            out = arr.astype(np.float64).reshape(self.T, self.B, width)
        else:  # packed: the rows of step t are contiguous, steps in order
            out = np.zeros((self.T, self.B, width))
            start = 0
            for t in range(self.T):
                n = int(self.batch_sizes[t])
                out[t, :n] = arr[start:start + n]
                start += n
            return out
        # Inactive positions are ignored: whatever they hold (even NaN) is
        # replaced by zero.
        return np.where(self.active()[:, :, None], out, 0.0)

    def from_time_major(self, arr, dtype):
        """Inverse of :meth:`to_time_major`, cast to ``dtype``."""
        if self.kind == "time_major":
            out = arr
        elif self.kind == "batch_first":
            out = arr.transpose(1, 0, 2)
        elif self.kind == "padded_2d":
            out = arr.reshape(self.T * self.B, arr.shape[-1])
        else:
            out = np.concatenate(
                [arr[t, :int(self.batch_sizes[t])] for t in range(self.T)]
                + [np.zeros((0, arr.shape[-1]))], axis=0)
        return np.ascontiguousarray(out).astype(dtype)


def _split_params(params, num_layers, num_directions, has_bias, projected=False):
    """Group the flat parameter list per (layer, direction), in float64.

    Returns
    -------
    list of tuple
        ``[(w_ih, w_hh, b_ih, b_hh, w_hr), ...]`` indexed ``layer * D + direction``;
        the biases are zero vectors when ``has_bias`` is False, ``w_hr`` is None
        without a projection.
    """
    per = (4 if has_bias else 2) + (1 if projected else 0)
    expected = num_layers * num_directions * per
    if len(params) != expected:
        raise ValueError(f"params must hold {expected} arrays, got {len(params)}")
    groups = []
    for k in range(num_layers * num_directions):
        w_ih = np.asarray(params[k * per]).astype(np.float64)
        w_hh = np.asarray(params[k * per + 1]).astype(np.float64)
        if has_bias:
            b_ih = np.asarray(params[k * per + 2]).astype(np.float64)
            b_hh = np.asarray(params[k * per + 3]).astype(np.float64)
        else:
            b_ih = np.zeros(w_ih.shape[0])
            b_hh = np.zeros(w_ih.shape[0])
        w_hr = np.asarray(params[k * per + per - 1]).astype(np.float64) if projected else None
        groups.append((w_ih, w_hh, b_ih, b_hh, w_hr))
    return groups


def _initial_state(hx, num_states, batch, hidden, h_size=None):
    """Return (h0, c0) as float64 ``[D*L, B, P]``, ``[D*L, B, H]`` arrays (zeros if hx is
    None; ``h_size`` is P, default H)."""
    if hx is None:
        return (np.zeros((num_states, batch, hidden if h_size is None else h_size)),
                np.zeros((num_states, batch, hidden)))
    h0, c0 = hx
    return np.asarray(h0).astype(np.float64), np.asarray(c0).astype(np.float64)


# ---------------------------------------------------------------------------
# one layer, one direction
# ---------------------------------------------------------------------------

def _forward_direction(x, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_sizes, reverse, w_hr=None):
    """Run one direction of one layer.

    Parameters
    ----------
    x : ndarray, shape [T, B, I]
        Layer input, float64.
    h0, c0 : ndarray, shape [B, P], [B, H]
        Initial state (P = H without a projection).
    w_ih, w_hh, b_ih, b_hh : ndarray
        Weights and biases (gate order i, f, g, o).
    batch_sizes : ndarray of int64, shape [T]
        Active rows per step.
    reverse : bool
        Run from the last valid step of each sequence down to step 0.
    w_hr : ndarray [P, H] or None
        The projection: ``h = (o * tanh(c)) @ w_hr.T``.

    Returns
    -------
    saved : dict of str to ndarray
        ``i, g, f, o, c, tanhc``, each ``[T, B, H]``, and ``h`` ``[T, B, P]``, zero
        where inactive.
    h_n, c_n : ndarray, shape [B, P], [B, H]
        Final state of each sequence (forward: at its last valid step;
        reverse: at step 0).
    """
    T, B = x.shape[0], x.shape[1]
    H = w_hh.shape[0] // 4
    P = w_hh.shape[1]
    saved = {name: np.zeros((T, B, P if name == "h" else H)) for name in SAVED_NAMES}
    h = h0.copy()
    c = c0.copy()
    steps = range(T - 1, -1, -1) if reverse else range(T)
    for t in steps:
        n = int(batch_sizes[t])
        # Rows >= n are inactive at step t and keep their state. In reverse,
        # a row becomes active for the first time at its last valid step and
        # then still holds h0/c0: each sequence starts from the initial state.
        gates = (x[t, :n] @ w_ih.T + b_ih) + (h[:n] @ w_hh.T + b_hh)
        i = _sigmoid(gates[:, 0:H])
        f = _sigmoid(gates[:, H:2 * H])
        g = np.tanh(gates[:, 2 * H:3 * H])
        o = _sigmoid(gates[:, 3 * H:4 * H])
        c_new = f * c[:n] + i * g
        tanhc = np.tanh(c_new)
        h_new = o * tanhc
        if w_hr is not None:
            h_new = h_new @ w_hr.T
        h[:n] = h_new
        c[:n] = c_new
        for name, value in zip(SAVED_NAMES, (i, g, f, o, h_new, c_new, tanhc)):
            saved[name][t, :n] = value
    return saved, h, c


def _backward_direction(x, dy, dh, dc, h0, c0, saved, w_ih, w_hh, batch_sizes,
                        reverse, w_hr=None):
    """Backpropagate through one direction of one layer.

    Parameters
    ----------
    x : ndarray, shape [T, B, I]
        The layer input of the forward pass, float64.
    dy : ndarray, shape [T, B, P]
        Gradient of this direction's output, zero where inactive.
    dh, dc : ndarray, shape [B, P], [B, H]
        Gradient of h_n, c_n.
    h0, c0 : ndarray, shape [B, P], [B, H]
        Initial state of the forward pass.
    saved : dict of str to ndarray
        ``i, g, f, o, c, tanhc``, each ``[T, B, H]``, ``h`` ``[T, B, P]``.
    w_ih, w_hh : ndarray
        Weights.
    batch_sizes : ndarray of int64, shape [T]
        Active rows per step.
    reverse : bool
        Direction of the forward pass.
    w_hr : ndarray [P, H] or None
        The projection.

    Returns
    -------
    dx : ndarray, shape [T, B, I]
    dh0, dc0 : ndarray, shape [B, P], [B, H]
    dw_ih, dw_hh : ndarray
    db : ndarray, shape [4H]
    dw_hr : ndarray [P, H] or None
    """
    T, B, I = x.shape
    H = w_hh.shape[0] // 4
    dx = np.zeros((T, B, I))
    dw_ih = np.zeros_like(w_ih)
    dw_hh = np.zeros_like(w_hh)
    dw_hr = None if w_hr is None else np.zeros_like(w_hr)
    db = np.zeros(4 * H)
    dh_next = dh.copy()
    dc_next = dc.copy()
    # Walk the steps in the opposite order of the forward pass.
    steps = range(T) if reverse else range(T - 1, -1, -1)
    for t in steps:
        n = int(batch_sizes[t])
        # State before step t: from the forward's previous step for the rows
        # active there, from h0/c0 for the rows whose sequence starts at t.
        prev_t = t + 1 if reverse else t - 1
        h_prev = h0[:n].copy()
        c_prev = c0[:n].copy()
        if 0 <= prev_t < T:
            m = min(n, int(batch_sizes[prev_t]))
            h_prev[:m] = saved["h"][prev_t, :m]
            c_prev[:m] = saved["c"][prev_t, :m]
        i = saved["i"][t, :n]
        g = saved["g"][t, :n]
        f = saved["f"][t, :n]
        o = saved["o"][t, :n]
        tanhc = saved["tanhc"][t, :n]

        delta_h = dy[t, :n] + dh_next[:n]
        if w_hr is not None:  # h = r @ w_hr.T with r = o * tanh(c)
            dw_hr += delta_h.T @ (o * tanhc)
            delta_h = delta_h @ w_hr
        delta_c = (delta_h * o) * (1.0 - tanhc * tanhc) + dc_next[:n]
        delta_o = (delta_h * tanhc) * (1.0 - o) * o
        delta_i = (delta_c * g) * (1.0 - i) * i
        delta_f = (delta_c * c_prev) * (1.0 - f) * f
        delta_g = (delta_c * i) * (1.0 - g * g)
        delta_gates = np.concatenate([delta_i, delta_f, delta_g, delta_o], axis=1)

        dc_next[:n] = delta_c * f
        dh_next[:n] = delta_gates @ w_hh
        dx[t, :n] = delta_gates @ w_ih
        dw_ih += delta_gates.T @ x[t, :n]
        dw_hh += delta_gates.T @ h_prev
        db += delta_gates.sum(axis=0)
    return dx, dh_next, dc_next, dw_ih, dw_hh, db, dw_hr


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------

@_quiet
def lstm_forward(input, hx, params, *, config=None, has_bias=True, num_layers=1,
                 dropout=0.0, train=True, bidirectional=False, batch_first=False,
                 batch_sizes=None, seed=None, proj_size=0):
    """Multi-layer LSTM forward pass (numpy reference, float64 internally).

    Parameters
    ----------
    input : array_like
        ``[T, B, I]`` (``[B, T, I]`` if ``batch_first``). With
        ``batch_sizes``: 2-D with ``sum(batch_sizes)`` rows (packed) or
        ``T * B`` rows (padded time-major), or 3-D padded.
    hx : tuple of array_like or None
        ``(h0, c0)``, ``[D * L, B, P]`` and ``[D * L, B, H]``; None means zeros.
    params : sequence of array_like
        Per layer, forward direction then reverse: ``w_ih [4H, I_l]``,
        ``w_hh [4H, P]``, ``b_ih [4H]``, ``b_hh [4H]`` (no biases when
        ``has_bias`` is False), then ``w_hr [P, H]`` with a projection. Gate
        order i, f, g, o.
    config : LSTMConfig, optional
        The settings below in one object (then none of them as a keyword).
    has_bias : bool, optional
        Whether ``params`` holds biases.
    num_layers : int, optional
        Number of stacked layers L.
    dropout : float, optional
        Dropout probability between layers (only when ``train``).
    train : bool, optional
        Training mode (dropout active).
    bidirectional : bool, optional
        Run a reverse direction too (D = 2).
    batch_first : bool, optional
        3-D sequence tensors are ``[B, T, *]``.
    batch_sizes : array_like of int64 or None, optional
        Active sequences per step, non-increasing, ``batch_sizes[0] == B``.
    seed : int, numpy.random.Generator or None, optional
        Passed to ``numpy.random.default_rng`` to draw the dropout masks.
    proj_size : int, optional
        P, the size of the projected h (0: none, P = H).

    Returns
    -------
    y : ndarray
        Output of the last layer, laid out like ``input`` with last axis
        ``D * P``; zero at padded positions.
    h_n, c_n : ndarray, shape [D * L, B, P], [D * L, B, H]
        Final states (per sequence, at its last valid step for the forward
        direction, at step 0 for the reverse direction).
    cache : LSTMCache
        Saved activations (time-major ``[T, B, H]``, zero where inactive), the
        dropout masks (``[T, B, D * H]`` each, or None) and the call:
        ``cache.backward(dy)`` runs :func:`lstm_backward`.

    Notes
    -----
    The masks are ``(rng.random((T, B, D * P)) >= dropout) / (1 - dropout)``
    with ``rng = numpy.random.default_rng(seed)`` (``seed`` may also be a
    ``numpy.random.Generator``), one per layer boundary in order, stored in
    the input dtype.
    """
    cfg = config_of(config, num_layers, bidirectional, batch_first, has_bias, dropout, train,
                    proj_size)
    has_bias, num_layers, dropout, train = cfg.has_bias, cfg.num_layers, cfg.dropout, cfg.train
    bidirectional, batch_first, proj_size = cfg.bidirectional, cfg.batch_first, cfg.proj_size
    x_in = np.asarray(input)
    dtype = x_in.dtype
    D = 2 if bidirectional else 1
    L = int(num_layers)
    groups = _split_params(list(params), L, D, has_bias, proj_size > 0)
    H = groups[0][1].shape[0] // 4
    P = groups[0][1].shape[1]
    batch_hint = np.asarray(hx[0]).shape[1] if hx is not None else None
    layout = _Layout(x_in.shape, batch_sizes, batch_first, batch_hint)
    T, B, bs = layout.T, layout.B, layout.batch_sizes
    h0, c0 = _initial_state(hx, D * L, B, H, P)

    masks = None
    if dropout > 0 and train and L > 1:
        rng = np.random.default_rng(seed)
        masks = [((rng.random((T, B, D * P)) >= dropout) / (1.0 - dropout))
                 .astype(_mask_dtype(dtype)) for _ in range(L - 1)]

    saved_all = {name: [] for name in SAVED_NAMES}
    h_n = np.zeros((D * L, B, P))
    c_n = np.zeros((D * L, B, H))
    layer_input = layout.to_time_major(x_in)
    layer_output = np.zeros((T, B, D * P))
    for layer in range(L):
        layer_output = np.zeros((T, B, D * P))
        for direction in range(D):
            k = layer * D + direction
            w_ih, w_hh, b_ih, b_hh, w_hr = groups[k]
            saved, h_last, c_last = _forward_direction(
                layer_input, h0[k], c0[k], w_ih, w_hh, b_ih, b_hh, bs,
                reverse=(direction == 1), w_hr=w_hr)
            layer_output[:, :, direction * P:(direction + 1) * P] = saved["h"]
            h_n[k] = h_last
            c_n[k] = c_last
            for name in SAVED_NAMES:
                saved_all[name].append(saved[name].astype(dtype))
        if masks is not None and layer < L - 1:
            layer_input = layer_output * masks[layer].astype(np.float64)
        else:
            layer_input = layer_output

    y = layout.from_time_major(layer_output, dtype)
    call = ForwardCall(cfg, input, hx, params,
                       None if batch_sizes is None else np.array(batch_sizes), masks, dtype,
                       layout.kind, lstm_backward)
    cache = LSTMCache(*(saved_all[name] for name in SAVED_NAMES),
                      dropout_masks=masks, call=call)
    return y, h_n.astype(dtype), c_n.astype(dtype), cache


@_quiet
def lstm_backward(input, hx, params, dy, dh, dc, i, g=None, f=None, o=None, h=None, c=None,
                  tanhc=None, *, config=None, batch_sizes=None, has_bias=True, num_layers=1,
                  dropout=0.0, train=True, bidirectional=False, batch_first=False,
                  output_mask=(True, True, True, True), dropout_masks=None, proj_size=0):
    """Multi-layer LSTM backward pass (numpy reference, float64 internally).

    Parameters
    ----------
    input, hx, params
        As given to :func:`lstm_forward`.
    dy : array_like
        Gradient of ``y``, laid out like ``y``; ignored at padded positions.
    dh, dc : array_like or None
        Gradients of ``h_n``, ``c_n``, ``[D * L, B, P]`` and ``[D * L, B, H]``;
        None means zeros.
    i, g, f, o, h, c, tanhc : sequence of array_like
        The forward's saved activations (``cache.saved()``), ``D * L`` arrays
        ``[T, B, H]`` each (h: ``[T, B, P]``).
    config, batch_sizes, has_bias, num_layers, dropout, train, bidirectional, batch_first, proj_size
        As given to :func:`lstm_forward`.
    output_mask : sequence of 4 bool, optional
        Which of ``(dx, dh_prev, dc_prev, dparams)`` to return; False entries
        give None.
    dropout_masks : sequence of array_like or None, optional
        ``cache.dropout_masks``; required when ``dropout > 0`` and ``train``
        and ``num_layers > 1``.

    Returns
    -------
    dx : ndarray or None
        Gradient of ``input``, laid out like it (zero at padded positions).
    dh_prev, dc_prev : ndarray or None
        Gradients of ``h0``, ``c0``, ``[D * L, B, P]`` and ``[D * L, B, H]``.
    dparams : list of ndarray or None
        Gradients laid out like ``params`` (``db_ih`` equals ``db_hh``).

    Raises
    ------
    ValueError
        If ``dropout_masks`` is missing while dropout is active.
    """
    refuse_cache(i)
    cfg = config_of(config, num_layers, bidirectional, batch_first, has_bias, dropout, train,
                    proj_size)
    has_bias, num_layers, dropout, train = cfg.has_bias, cfg.num_layers, cfg.dropout, cfg.train
    bidirectional, batch_first, proj_size = cfg.bidirectional, cfg.batch_first, cfg.proj_size
    x_in = np.asarray(input)
    dtype = x_in.dtype
    D = 2 if bidirectional else 1
    L = int(num_layers)
    groups = _split_params(list(params), L, D, has_bias, proj_size > 0)
    H = groups[0][1].shape[0] // 4
    P = groups[0][1].shape[1]
    batch_hint = np.asarray(hx[0]).shape[1] if hx is not None else None
    layout = _Layout(x_in.shape, batch_sizes, batch_first, batch_hint)
    B, bs = layout.B, layout.batch_sizes
    h0, c0 = _initial_state(hx, D * L, B, H, P)
    dh = np.zeros((D * L, B, P)) if dh is None else np.asarray(dh).astype(np.float64)
    dc = np.zeros((D * L, B, H)) if dc is None else np.asarray(dc).astype(np.float64)

    saved_all = []
    for k in range(D * L):
        saved_all.append({name: np.asarray(arr[k]).astype(np.float64)
                          for name, arr in zip(SAVED_NAMES, (i, g, f, o, h, c, tanhc))})

    masks = None
    if dropout > 0 and train and L > 1:
        if dropout_masks is None:
            raise ValueError(
                "dropout_masks is required when dropout > 0, train and "
                "num_layers > 1 (pass cache.dropout_masks)")
        masks = [np.asarray(m).astype(np.float64) for m in dropout_masks]

    # Inputs of each layer as the forward saw them.
    layer_inputs = [layout.to_time_major(x_in)]
    for layer in range(1, L):
        below = np.concatenate(
            [saved_all[(layer - 1) * D + d]["h"] for d in range(D)], axis=2)
        if masks is not None:
            below = below * masks[layer - 1]
        layer_inputs.append(below)

    dh_prev = np.zeros((D * L, B, P))
    dc_prev = np.zeros((D * L, B, H))
    dgroups = [None] * (D * L)
    grad_output = layout.to_time_major(dy)  # zero at padded positions
    dx = None
    for layer in range(L - 1, -1, -1):
        x = layer_inputs[layer]
        dx = np.zeros(x.shape)
        for direction in range(D):
            k = layer * D + direction
            w_ih, w_hh, _, _, w_hr = groups[k]
            dx_dir, dh0, dc0, dw_ih, dw_hh, db, dw_hr = _backward_direction(
                x, grad_output[:, :, direction * P:(direction + 1) * P],
                dh[k], dc[k], h0[k], c0[k], saved_all[k], w_ih, w_hh, bs,
                reverse=(direction == 1), w_hr=w_hr)
            dx += dx_dir
            dh_prev[k] = dh0
            dc_prev[k] = dc0
            dgroups[k] = (dw_ih, dw_hh, db, dw_hr)
        if layer > 0:
            grad_output = dx * masks[layer - 1] if masks is not None else dx

    dparams = []
    for dw_ih, dw_hh, db, dw_hr in dgroups:
        dparams.append(dw_ih.astype(dtype))
        dparams.append(dw_hh.astype(dtype))
        if has_bias:
            dparams.append(db.astype(dtype))
            dparams.append(db.astype(dtype))
        if dw_hr is not None:
            dparams.append(dw_hr.astype(dtype))

    want_dx, want_dh, want_dc, want_dparams = (bool(m) for m in output_mask)
    return (layout.from_time_major(dx, dtype) if want_dx else None,
            dh_prev.astype(dtype) if want_dh else None,
            dc_prev.astype(dtype) if want_dc else None,
            dparams if want_dparams else None)
