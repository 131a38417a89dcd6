"""Public forward and backward: validate, allocate, and run the Cython kernels.

The kernels (``lstmcy._lstm``) handle one layer and one direction. This module loops
over layers and directions, routes each layer's output (and, backwards, its input
gradient) to the next, applies dropout masks between layers and converts the results
back to the caller's dtype and layout.
"""
import numpy as np

from lstmcy import _lstm
from lstmcy._cache import LSTMCache
from lstmcy._validation import (SAVED_NAMES, check_backward, check_bool, check_dropout,
                                check_output_mask, check_problem, to_compute)

__all__ = ["lstm_forward", "lstm_backward"]


def _intp(values):
    return np.ascontiguousarray(values, dtype=np.intp)


def _flat_workspace(size, dtype):
    """One flat buffer whose leading part is reshaped per layer (a C-contiguous view)."""
    return np.empty(max(int(size), 0), dtype=dtype)


def _as_rows(array):
    """2-D view ``[rows, features]`` of a C-contiguous array (also when features == 0)."""
    return array.reshape(int(np.prod(array.shape[:-1])), array.shape[-1])


def _view(buffer, rows, cols):
    return buffer[: rows * cols].reshape(rows, cols)


def _draw_masks(problem, dropout, seed):
    """``L - 1`` masks ``[T, B, D*H]`` of 0 or ``1 / (1 - dropout)`` in the caller's dtype."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    shape = (problem.T, problem.B, problem.D * problem.H)
    scale = 1.0 / (1.0 - dropout)
    masks = []
    for _ in range(problem.L - 1):
        keep = rng.random(shape) >= dropout
        masks.append(np.where(keep, scale, 0.0).astype(problem.dtype))
    return masks


def _out_dtype(array, dtype):
    return array if array.dtype == dtype else array.astype(dtype)


def lstm_forward(input, hx, params, *, has_bias=True, num_layers=1, dropout=0.0, train=True,
                 bidirectional=False, batch_first=False, batch_sizes=None, seed=None):
    """Run a (multi-layer, optionally bidirectional) LSTM forward, saving what backward needs.

    Semantics are those of PyTorch's ``aten::lstm`` (and of the Ascend operator whose
    backward :func:`lstm_backward` mirrors).

    Parameters
    ----------
    input : ndarray
        ``[T, B, I]`` (``[B, T, I]`` if ``batch_first``). With ``batch_sizes``, also 2-D:
        ``[sum(batch_sizes), I]`` (PyTorch's packed layout) or ``[T*B, I]`` (padded,
        time-major).
    hx : tuple of ndarray or None
        ``(h0, c0)``, each ``[num_layers*D, B, H]`` with index ``layer*D + direction``
        (``D = 2`` if bidirectional). None means zeros.
    params : list of ndarray
        Per layer, forward direction then reverse: ``w_ih [4H, I_l]``, ``w_hh [4H, H]``,
        ``b_ih [4H]``, ``b_hh [4H]`` (no biases when ``has_bias`` is False). ``I_l = I`` for
        layer 0 and ``D*H`` above. Gate order i, f, g, o, as ``torch.nn.LSTM``.
    has_bias, num_layers, bidirectional, batch_first : as in ``torch.nn.LSTM``.
    dropout : float in [0, 1)
        Dropout applied to each layer's output except the last, when ``train``.
    train : bool
        False runs inference: no cache is kept and no dropout applied.
    batch_sizes : array of int, optional
        Active sequences per step, non-increasing, ``batch_sizes[0] == B``.
    seed : int, numpy.random.Generator or None
        Source of the dropout masks.

    Returns
    -------
    y : ndarray
        Last layer's output, input layout with ``D*H`` features (directions concatenated);
        zero at padded positions.
    h_n, c_n : ndarray [num_layers*D, B, H]
        Final states (for variable lengths, each sequence's state at its last step).
    cache : LSTMCache or None
        Saved activations and dropout masks (None when ``train`` is False).
    """
    train = check_bool("train", train)
    dropout = check_dropout(dropout)
    problem = check_problem(input, hx, params, has_bias=has_bias, num_layers=num_layers,
                            bidirectional=bidirectional, batch_first=batch_first,
                            batch_sizes=batch_sizes)
    p = problem
    T, B, H, L, D, N = p.T, p.B, p.H, p.L, p.D, p.N
    cdt = p.compute_dtype
    alloc = np.empty if p.uniform else np.zeros

    masks = _draw_masks(p, dropout, seed) if (train and dropout > 0 and L > 1) else None

    y = alloc(p.output_shape(D * H), dtype=cdt)
    y_rows = _as_rows(y)
    h_n = np.empty((L * D, B, H), dtype=cdt)
    c_n = np.empty((L * D, B, H), dtype=cdt)
    if train:
        saved = {name: alloc((L * D, T, B, H), dtype=cdt) for name in SAVED_NAMES}
    else:
        no_cache = np.empty((0, H), dtype=cdt)

    gates = np.empty((N, 4 * H), dtype=cdt)
    max_in = max(p.I, D * H) if L > 1 else p.I
    x_packed = _flat_workspace(N * max_in, cdt)
    internal_step_row, _, internal_packed = p.time_major_map

    layer_in, in_step_row, in_stride, in_packed = p.x_rows, p.step_row, p.batch_stride, p.rows_packed
    for layer in range(L):
        last = layer == L - 1
        if last:
            out, out_step_row, out_stride = y_rows, p.step_row, p.batch_stride
        else:
            out = alloc((T * B, D * H), dtype=cdt)
            out_step_row, out_stride = internal_step_row, 1
        in_size = layer_in.shape[1]
        for direction in range(D):
            k = layer * D + direction
            w_ih, w_hh, bias = p.weights[k]
            if train:
                rows = [saved[name][k].reshape(T * B, H) for name in ("i", "f", "g", "o", "c", "tanhc", "h")]
            else:
                rows = [no_cache] * 7
            _lstm.forward_layer(
                layer_in, in_step_row, in_stride, in_packed,
                w_ih, w_hh, bias, p.h0[k], p.c0[k],
                p.batch_sizes, p.packed_start, direction == 1,
                out, out_step_row, out_stride, direction * H,
                h_n[k], c_n[k], *rows, train,
                gates, _view(x_packed, N, in_size))
        if not last:
            if masks is not None:
                out = out * to_compute(masks[layer], cdt).reshape(T * B, D * H)
            layer_in, in_step_row, in_stride, in_packed = out, internal_step_row, 1, internal_packed

    dtype = p.dtype
    y, h_n, c_n = (_out_dtype(a, dtype) for a in (y, h_n, c_n))
    if not train:
        return y, h_n, c_n, None
    cache = LSTMCache(**{name: list(_out_dtype(saved[name], dtype)) for name in SAVED_NAMES},
                      dropout_masks=masks)
    return y, h_n, c_n, cache


def lstm_backward(input, hx, params, dy, dh, dc, i, g, f, o, h, c, tanhc, *, batch_sizes=None,
                  has_bias=True, num_layers=1, dropout=0.0, train=True, bidirectional=False,
                  batch_first=False, output_mask=(True, True, True, True), dropout_masks=None):
    """Gradients of an LSTM forward: the semantics of ``aclnnLstmBackward``.

    Parameters
    ----------
    input, hx, params, batch_sizes, has_bias, num_layers, dropout, train, bidirectional, batch_first
        As given to :func:`lstm_forward`.
    dy : ndarray
        Gradient of ``y``, shaped like ``y`` (directions concatenated on the last axis);
        ignored at padded positions.
    dh, dc : ndarray [num_layers*D, B, H] or None
        Gradients of ``h_n`` and ``c_n`` (None means zeros).
    i, g, f, o, h, c, tanhc : list of ndarray
        The forward's saved activations (``cache.saved()``): ``num_layers*D`` arrays
        ``[T, B, H]`` each, time-major, index ``layer*D + direction``.
    output_mask : tuple of 4 bool
        Which of (dx, dh_prev, dc_prev, dparams) to compute; False gives None there.
    dropout_masks : list of ndarray, optional
        ``cache.dropout_masks``; required when ``dropout > 0``, ``train`` and
        ``num_layers > 1``.

    Returns
    -------
    dx : ndarray or None
        Shaped like ``input`` (zero at padded positions).
    dh_prev, dc_prev : ndarray [num_layers*D, B, H] or None
        Gradients of ``h0`` and ``c0``.
    dparams : list of ndarray or None
        Shaped like ``params``; ``db_ih`` equals ``db_hh``.
    """
    p, arrays = check_backward(
        input, hx, params, dy, dh, dc, (i, g, f, o, h, c, tanhc), batch_sizes=batch_sizes,
        has_bias=has_bias, num_layers=num_layers, dropout=dropout, train=train,
        bidirectional=bidirectional, batch_first=batch_first, dropout_masks=dropout_masks)
    output_mask = check_output_mask(output_mask)
    T, B, I, H, L, D, N = p.T, p.B, p.I, p.H, p.L, p.D, p.N
    cdt = p.compute_dtype
    state_shape = (L * D, B, H)
    named = arrays
    masks = None
    if "dropout_masks" in arrays:
        masks = [to_compute(m, cdt).reshape(T * B, D * H) for m in arrays["dropout_masks"]]

    want_dx, want_dh, want_dc, want_dparams = output_mask
    if not any(output_mask):
        return None, None, None, None

    dy_rows = _as_rows(to_compute(named["dy"], cdt))
    # Working state: in, the gradients of h_n / c_n; out, those of h0 / c0.
    dh_state = to_compute(named["dh"], cdt).copy() if "dh" in named else np.zeros(state_shape, cdt)
    dc_state = to_compute(named["dc"], cdt).copy() if "dc" in named else np.zeros(state_shape, cdt)
    saved = {name: [to_compute(a, cdt).reshape(T * B, H) for a in named[name]]
             for name in SAVED_NAMES}

    alloc = np.empty if p.uniform else np.zeros
    internal_step_row, _, internal_packed = p.time_major_map
    max_in = max(I, D * H) if L > 1 else I
    dgates = np.empty((N, 4 * H), dtype=cdt)
    z_buf = _flat_workspace(N * (max_in + H), cdt) if want_dparams else np.empty(0, cdt)
    dw_buf = _flat_workspace(4 * H * (max_in + H), cdt) if want_dparams else np.empty(0, cdt)
    dx_packed_buf = _flat_workspace(N * max_in, cdt)
    dparams = [None] * (L * D * (4 if p.has_bias else 2))

    dx = None
    upper_dy, dy_step_row, dy_stride = dy_rows, p.step_row, p.batch_stride
    for layer in reversed(range(L)):
        if layer == 0:
            layer_in, in_step_row, in_stride, in_packed = p.x_rows, p.step_row, p.batch_stride, p.rows_packed
            layer_dx_needed = want_dx
        else:
            below = [saved["h"][(layer - 1) * D + d].reshape(T, B, H) for d in range(D)]
            layer_in = np.concatenate(below, axis=-1).reshape(T * B, D * H)
            if masks is not None:
                layer_in *= masks[layer - 1]
            in_step_row, in_stride, in_packed = internal_step_row, 1, internal_packed
            layer_dx_needed = True
        in_size = layer_in.shape[1]
        layer_dx = alloc(layer_in.shape, dtype=cdt) if layer_dx_needed else np.empty((0, in_size), cdt)
        for direction in range(D):
            k = layer * D + direction
            w_ih, w_hh, _ = p.weights[k]
            if want_dparams:
                dw_ih = np.empty((4 * H, in_size), dtype=cdt)
                dw_hh = np.empty((4 * H, H), dtype=cdt)
                db = np.empty(4 * H, dtype=cdt)
            else:
                dw_ih = dw_hh = np.empty((0, 0), dtype=cdt)
                db = np.empty(0, dtype=cdt)
            _lstm.backward_layer(
                layer_in, in_step_row, in_stride, in_packed,
                upper_dy, dy_step_row, dy_stride, direction * H,
                w_ih, w_hh, p.h0[k], p.c0[k],
                saved["i"][k], saved["f"][k], saved["g"][k], saved["o"][k],
                saved["c"][k], saved["tanhc"][k], saved["h"][k],
                p.batch_sizes, p.packed_start, direction == 1,
                dh_state[k], dc_state[k],
                layer_dx, layer_dx_needed, direction > 0,
                dw_ih, dw_hh, db, want_dparams,
                dgates, _view(z_buf, N, in_size + H) if want_dparams else np.empty((0, 0), cdt),
                _view(dw_buf, 4 * H, in_size + H) if want_dparams else np.empty((0, 0), cdt),
                _view(dx_packed_buf, N, in_size))
            if want_dparams:
                base = k * (4 if p.has_bias else 2)
                dparams[base] = dw_ih
                dparams[base + 1] = dw_hh
                if p.has_bias:
                    dparams[base + 2] = db
                    dparams[base + 3] = db.copy()
        if layer > 0:
            if masks is not None:
                layer_dx *= masks[layer - 1]
            upper_dy, dy_step_row, dy_stride = layer_dx, internal_step_row, 1
        elif want_dx:
            dx = layer_dx.reshape(p.input_shape)

    dtype = p.dtype
    dx = _out_dtype(dx, dtype) if want_dx else None
    dh_prev = _out_dtype(dh_state, dtype) if want_dh else None
    dc_prev = _out_dtype(dc_state, dtype) if want_dc else None
    dparams = [_out_dtype(a, dtype) for a in dparams] if want_dparams else None
    return dx, dh_prev, dc_prev, dparams
