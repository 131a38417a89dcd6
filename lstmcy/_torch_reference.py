"""A differentiable LSTM in plain torch operations, for what lstmcy's kernels cannot do.

:func:`lstm` computes what ``aten::lstm`` computes (gate order i, f, g, o; ``_flat_weights``
order; packed sequences; dropout masks between layers; projections), one time step at a
time with ordinary torch operations, so autograd, forward-mode AD and every ``torch.func``
transform can differentiate it to any order. :mod:`lstmcy.torch` uses it where the
kernels give no derivative: gradients of gradients (``create_graph=True``), and
forward-mode AD (``torch.func.jvp``, ``jacfwd``). It is slower than the kernels (a Python
loop over steps), which those uses accept.
"""
import torch

__all__ = ["lstm"]


def _split_weights(weights, num_layers, num_directions, has_bias, proj_size):
    """Per layer and direction ``(w_ih, w_hh, b_ih, b_hh, w_hr)`` (None where absent), from
    the flat list in ``nn.LSTM._flat_weights`` order."""
    per_direction = 2 + (2 if has_bias else 0) + (1 if proj_size > 0 else 0)
    if len(weights) != num_layers * num_directions * per_direction:
        raise ValueError(f"weights must hold {num_layers * num_directions * per_direction} "
                         f"tensors, got {len(weights)}")
    layers = []
    for layer in range(num_layers):
        directions = []
        for direction in range(num_directions):
            base = (layer * num_directions + direction) * per_direction
            group = list(weights[base:base + per_direction])
            w_ih, w_hh = group[0], group[1]
            b_ih, b_hh = (group[2], group[3]) if has_bias else (None, None)
            w_hr = group[-1] if proj_size > 0 else None
            directions.append((w_ih, w_hh, b_ih, b_hh, w_hr))
        layers.append(directions)
    return layers


def _direction(steps_in, h, c, w_ih, w_hh, b_ih, b_hh, w_hr, sizes, reverse):
    """One direction of one layer over time-ordered step inputs ``steps_in[t]``
    ``[sizes[t], F]`` (``sizes`` None: every step has all rows). Returns the step outputs
    in time order and the final ``h``, ``c`` (each row's state after its last step)."""
    T = len(steps_in)
    outputs = [None] * T
    order = range(T - 1, -1, -1) if reverse else range(T)
    for t in order:
        x_t = steps_in[t]
        n = x_t.shape[0] if sizes is None else sizes[t]
        # Rows past n have ended (forward) or not started (reverse): their state stays.
        h_act, c_act = (h, c) if sizes is None else (h[:n], c[:n])
        gates = x_t @ w_ih.t() + h_act @ w_hh.t()
        if b_ih is not None:
            gates = gates + b_ih + b_hh
        i, f, g, o = gates.chunk(4, dim=-1)
        c_new = torch.sigmoid(f) * c_act + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(c_new)
        if w_hr is not None:
            h_new = h_new @ w_hr.t()
        outputs[t] = h_new
        if sizes is None or n == h.shape[0]:
            h, c = h_new, c_new
        else:
            h = torch.cat([h_new, h[n:]])
            c = torch.cat([c_new, c[n:]])
    return outputs, h, c


def lstm(input, hx, weights, *, hidden_size, num_layers=1, bidirectional=False, has_bias=True,
         batch_first=False, batch_sizes=None, masks=None, proj_size=0):
    """Multi-layer LSTM forward as ``aten::lstm`` computes it, in differentiable torch ops.

    Parameters
    ----------
    input : Tensor
        ``[T, B, I]`` (``[B, T, I]`` if ``batch_first``), or packed ``[N, I]`` with
        ``batch_sizes``.
    hx : tuple of Tensor or None
        ``(h0 [L*D, B, P or H], c0 [L*D, B, H])``; None means zeros.
    weights : sequence of Tensor
        ``nn.LSTM._flat_weights``: per layer and direction ``w_ih, w_hh[, b_ih, b_hh][, w_hr]``.
    hidden_size, num_layers, bidirectional, has_bias, batch_first, proj_size
        As for ``torch.nn.LSTM``.
    batch_sizes : Tensor or sequence of int, optional
        ``PackedSequence.batch_sizes`` (non-increasing): ``input`` is packed.
    masks : sequence of Tensor, optional
        ``num_layers - 1`` multipliers of the layer outputs (dropout), each shaped like a
        layer's output inside ``aten::lstm``: ``[T, B, D*P]`` time-major, or ``[N, D*P]``
        packed.

    Returns
    -------
    output, h_n, c_n : Tensor
        As ``torch._VF.lstm`` returns them (``output`` packed ``[N, D*P]`` with
        ``batch_sizes``).
    """
    D = 2 if bidirectional else 1
    out_size = proj_size if proj_size > 0 else hidden_size
    packed = batch_sizes is not None
    if packed:
        sizes = [int(n) for n in batch_sizes]
        starts = [0]
        for n in sizes[:-1]:
            starts.append(starts[-1] + n)
        B = sizes[0] if sizes else 0
    else:
        sizes = None
        if batch_first:
            input = input.transpose(0, 1)
        B = input.shape[1]
    if hx is None:
        h0 = input.new_zeros((num_layers * D, B, out_size))
        c0 = input.new_zeros((num_layers * D, B, hidden_size))
    else:
        h0, c0 = hx
    layers = _split_weights(list(weights), num_layers, D, has_bias, proj_size)

    layer_in = input
    h_n, c_n = [], []
    for layer, directions in enumerate(layers):
        if packed:
            steps_in = [layer_in[s:s + n] for s, n in zip(starts, sizes)]
        else:
            steps_in = list(layer_in.unbind(0))
        outs = []
        for direction, (w_ih, w_hh, b_ih, b_hh, w_hr) in enumerate(directions):
            k = layer * D + direction
            steps_out, h, c = _direction(steps_in, h0[k], c0[k], w_ih, w_hh, b_ih, b_hh, w_hr,
                                         sizes, reverse=direction == 1)
            outs.append(torch.cat(steps_out) if packed else torch.stack(steps_out))
            h_n.append(h)
            c_n.append(c)
        layer_out = outs[0] if D == 1 else torch.cat(outs, dim=-1)
        if masks is not None and layer < num_layers - 1:
            layer_out = layer_out * masks[layer]
        layer_in = layer_out
    output = layer_in
    if not packed and batch_first:
        output = output.transpose(0, 1)
    return output, torch.stack(h_n), torch.stack(c_n)
