"""A differentiable LSTM in plain torch operations, for what lstmcy's kernels cannot do.

:func:`lstm` computes what ``aten::lstm`` computes (gate order i, f, g, o; ``_flat_weights``
order; packed sequences; dropout masks between layers; projections), one time step at a
time with ordinary torch operations, so autograd, forward-mode AD and every ``torch.func``
transform can differentiate it to any order. :mod:`lstmcy.torch` uses it where the
kernels give no derivative: gradients of gradients (``create_graph=True``,
:func:`second_derivatives`), forward-mode AD (``torch.func.jvp``, ``jacfwd``), and output
gradients batched by the legacy vmap (:func:`gradients`). It is slower than the kernels
(a Python loop over steps), which those uses accept.

:func:`gradients` and :func:`second_derivatives` take the call's settings as ``cfg``, an
:class:`lstmcy.LSTMConfig` (of which they read ``num_layers``, ``bidirectional``,
``has_bias``, ``batch_first`` and ``proj_size``; dropout comes as masks), and its
``hidden_size`` beside it.
"""
import torch

__all__ = ["lstm", "gradients", "second_derivatives"]


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


def _outputs(cfg, hidden_size, batch_sizes, masks, input, h0, c0, weights):
    """``(y, h_n, c_n)`` of :func:`lstm` with the layout of ``cfg``."""
    return lstm(input, (h0, c0), weights, hidden_size=hidden_size,
                num_layers=cfg.num_layers, bidirectional=cfg.bidirectional,
                has_bias=cfg.has_bias, batch_first=cfg.batch_first, batch_sizes=batch_sizes,
                masks=list(masks) or None, proj_size=cfg.proj_size)


def gradients(cfg, hidden_size, input, batch_sizes, h0, c0, weights, masks, grad_y, grad_h_n,
              grad_c_n):
    """``(dx, dh0, dc0, dweights)`` of :func:`lstm` by autograd on detached copies of the
    inputs (None for ``dh0``/``dc0`` when ``h0`` is None): for output gradients that the
    kernels cannot take, such as those of the legacy vmap (``torch.autograd.functional``'s
    ``vectorize=True``)."""
    had_h0 = h0 is not None
    h0, c0 = _initial_states(input, batch_sizes, h0, c0, cfg, hidden_size)
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (input, h0, c0, *weights)]
        outputs = _outputs(cfg, hidden_size, batch_sizes, masks, *leaves[:3], leaves[3:])
        pairs = [(out, g) for out, g in zip(outputs, (grad_y, grad_h_n, grad_c_n))
                 if g is not None]
        grads = torch.autograd.grad([out for out, _ in pairs], leaves, [g for _, g in pairs],
                                    allow_unused=True)
    grads = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves)]
    return grads[0], grads[1] if had_h0 else None, grads[2] if had_h0 else None, grads[3:]


def _initial_states(input, batch_sizes, h0, c0, cfg, hidden_size):
    """``h0``, ``c0`` as given, or zeros of the right shape when None."""
    if h0 is not None:
        return h0, c0
    D = cfg.num_directions
    if batch_sizes is not None:
        B = int(batch_sizes[0])
    else:
        B = input.shape[0] if cfg.batch_first else input.shape[1]
    out_size = cfg.proj_size if cfg.proj_size > 0 else hidden_size
    return (input.new_zeros((cfg.num_layers * D, B, out_size)),
            input.new_zeros((cfg.num_layers * D, B, hidden_size)))


def second_derivatives(cfg, hidden_size, output_mask, input, batch_sizes, h0, c0, weights, masks,
                       grad_y, grad_h_n, grad_c_n, incoming):
    """The backward of a backward: the vjp of the first derivatives of :func:`lstm` with
    ``incoming``, the cotangents of ``(dx, dh0, dc0, *dweights)`` (None, or empty for
    outputs not computed, means zero), at ``(input, h0, c0, weights)`` and the output
    gradients ``(grad_y, grad_h_n, grad_c_n)`` the first derivatives were taken with.
    ``output_mask`` says which of ``(dx, dh0, dc0, dweights)`` were computed.

    Returns the gradients of ``(input, h0, c0, weights, grad_y, grad_h_n, grad_c_n)``
    (None for ``h0``/``c0`` when they were None, for absent output gradients, and for
    what the result does not depend on). When the result must be differentiable again
    (grad mode on: third derivatives) or under ``torch.func`` transforms, it uses
    ``torch.func.vjp``, whose levels keep each input's own history apart; else autograd
    on detached copies of the inputs, whose graphs are much cheaper to build.
    """
    had_h0 = h0 is not None
    h0, c0 = _initial_states(input, batch_sizes, h0, c0, cfg, hidden_size)
    primals = [input, h0, c0, *weights]
    given = [grad_y, grad_h_n, grad_c_n]
    present = [k for k, g in enumerate(given) if g is not None]
    n_primals = len(primals)
    want_dx, want_dh, want_dc, want_dw = output_mask
    wanted = [want_dx, want_dh, want_dc] + [want_dw] * len(weights)
    used = [k for k, (g, w) in enumerate(zip(incoming, wanted))
            if w and g is not None and g.numel()]

    def run(*xs):
        return _outputs(cfg, hidden_size, batch_sizes, masks, *xs[:3], xs[3:])

    def first_derivatives(*args):
        """``(dx, dh0, dc0, *dweights)`` at ``(*primals, *given output gradients)``."""
        grads = list(given)
        for k, value in zip(present, args[n_primals:]):
            grads[k] = value
        xs = args[:n_primals]
        if use_func:
            outputs, vjp = torch.func.vjp(run, *xs)
        else:
            outputs = run(*xs)
        cotangents = tuple(torch.zeros_like(out) if g is None else g
                           for g, out in zip(grads, outputs))
        if use_func:
            return vjp(cotangents)
        return torch.autograd.grad(outputs, xs, cotangents, create_graph=True)

    args = primals + [given[k] for k in present]
    use_func = (torch.is_grad_enabled()
                or torch._C._functorch.peek_interpreter_stack() is not None)
    if use_func:
        outputs, vjp = torch.func.vjp(first_derivatives, *args)
        grads = vjp(tuple(incoming[k] if k in used else torch.zeros_like(out)
                          for k, out in enumerate(outputs)))
    elif used:
        with torch.enable_grad():
            leaves = [a.detach().requires_grad_() for a in args]
            firsts = first_derivatives(*leaves)
            grads = torch.autograd.grad([firsts[k] for k in used], leaves,
                                        [incoming[k] for k in used], allow_unused=True)
    else:
        grads = [None] * len(args)
    d_output = [None, None, None]
    for k, g in zip(present, grads[n_primals:]):
        d_output[k] = g
    d_h0, d_c0 = grads[1:3] if had_h0 else (None, None)
    return (grads[0], d_h0, d_c0, list(grads[3:n_primals]), *d_output)
