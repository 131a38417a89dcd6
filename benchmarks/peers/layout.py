"""Weights and sequences between PyTorch's layout and the peers'.

PyTorch keeps, per layer and direction, ``W_ih`` ``[4H, I_l]``, ``W_hh`` ``[4H, H]``
and two biases ``b_ih``, ``b_hh`` ``[4H]``, gates in the order i, f, g, o. Keras
keeps ``kernel`` ``[I_l, 4H]``, ``recurrent_kernel`` ``[H, 4H]`` and one ``bias``,
gates in the order i, f, c, o (c is PyTorch's g): the same order, so the mapping is
a transpose and the sum of the two biases. The JAX peer uses Keras's layout too (an
input-major fused-gate cell, as Flax's LSTM cells keep their kernels).

Since the peers' single bias is ``b_ih + b_hh``, its gradient is the gradient of
each of PyTorch's two biases.
"""
import numpy as np

__all__ = ["GATES", "to_input_major", "grads_to_torch", "active_mask", "padded_to_packed"]

GATES = ("i", "f", "g", "o")  # PyTorch's order; Keras's (i, f, c, o) is the same


def _check_flat(params, num_layers, num_directions):
    expected = 4 * num_layers * num_directions
    if len(params) != expected:
        raise ValueError(f"params: expected {expected} arrays (W_ih, W_hh, b_ih, b_hh per layer "
                         f"and direction), got {len(params)}")


def to_input_major(params, num_layers, num_directions):
    """PyTorch's flat parameter list as ``[(kernel, recurrent_kernel, bias), ...]``.

    Parameters
    ----------
    params : list of ndarray
        ``W_ih, W_hh, b_ih, b_hh`` for each layer and direction, layer-major
        (``torch.nn.LSTM._flat_weights`` order).
    num_layers, num_directions : int

    Returns
    -------
    list of tuple of ndarray
        One ``(W_ih.T [I_l, 4H], W_hh.T [H, 4H], b_ih + b_hh [4H])`` per layer and
        direction, in the same order, C-contiguous.
    """
    _check_flat(params, num_layers, num_directions)
    out = []
    for k in range(0, len(params), 4):
        w_ih, w_hh, b_ih, b_hh = params[k:k + 4]
        out.append((np.ascontiguousarray(w_ih.T), np.ascontiguousarray(w_hh.T), b_ih + b_hh))
    return out


def grads_to_torch(grads):
    """Gradients in the input-major layout back to PyTorch's flat list.

    Parameters
    ----------
    grads : list of tuple of ndarray
        ``(d kernel [I_l, 4H], d recurrent_kernel [H, 4H], d bias [4H])`` per layer
        and direction.

    Returns
    -------
    list of ndarray
        ``dW_ih [4H, I_l], dW_hh [4H, H], db_ih, db_hh`` per layer and direction
        (both bias gradients are the gradient of the summed bias).
    """
    out = []
    for d_kernel, d_recurrent, d_bias in grads:
        d_bias = np.asarray(d_bias)
        out += [np.asarray(d_kernel).T, np.asarray(d_recurrent).T, d_bias, d_bias.copy()]
    return out


def active_mask(T, lengths):
    """``[T, B]`` booleans, true where step ``t`` is inside sequence ``b`` (``t < lengths[b]``)."""
    return np.arange(T)[:, None] < np.asarray(lengths)[None, :]


def padded_to_packed(array, lengths):
    """Rows of a padded ``[T, B, ...]`` array in PackedSequence order (step-major, active only)."""
    array = np.asarray(array)
    return np.ascontiguousarray(array[active_mask(array.shape[0], lengths)])
