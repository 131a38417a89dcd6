"""Per-sample weight gradients of :class:`lstmcy.torch.LSTM` from lstmcy's kernels.

Differentially private training (DP-SGD) clips each sample's gradient before summing.
The backward kernel computes every row's gate gradients ``dgates`` (``[N, 4H]`` per layer
and direction) on its way to the summed weight gradients; a sample's weight gradient is
the sum over its own steps only:

- ``dW_ih[b] = sum_t dgates[t, b]^T x[t, b]`` (``x`` the layer's input),
- ``dW_hh[b] = sum_t dgates[t, b]^T h_prev[t, b]`` (the state before the step, in the
  direction's processing order),
- ``db_ih[b] = db_hh[b] = sum_t dgates[t, b]``,
- with projections, ``dW_hr[b] = sum_t dh[t, b]^T r[t, b]`` (``dh`` the gradient of the
  projected state, ``r = o * tanh(c)``).

:func:`backward` runs the kernel backward one layer at a time (each layer's gate
gradients are read from the calling thread's plan before the next layer's call reuses
its work buffer; the summed weight gradients are not computed) and forms the sums above
with the kernels' per-sample products (``per_sample_products``: one small product a
sequence, the steps its inner dimension, on the thread pool, bias sums alongside); a
backward with ``create_graph`` forms them with torch's batched products instead, which
autograd records. Padded steps of a packed batch have zero gate gradients, so they add
nothing.

Ghost clipping needs only each sample's gradient norm. For ``dW[b] = sum_t g_t a_t^T``
(``g_t`` a row of gradients, ``a_t`` of values),
``||dW[b]||_F^2 = sum_{t,t'} (g_t . g_t') (a_t . a_t')``: two Gram matrices ``[T, T]`` a
sample, ``T^2 (G + F)`` multiply-adds against ``T G F`` to form ``dW[b]``, so the norms come
from the Gram matrices when that is fewer (short sequences, wide layers), else from
``dW[b]`` formed a few samples at a time and never kept (:func:`_norms_of_sums`).
"""
import numpy as np
import torch

from lstmcy._engine import plan as _core
from lstmcy._engine import fpmode as _fpmode
from lstmcy._engine import layer_loops as kernel_engine
from lstmcy._engine.dispatch import kernels as _kernels
from lstmcy.torch import _engine as engine
from lstmcy._engine.schedule import gate_row_stride
from lstmcy._engine.threads import threads_for as _threads_for

__all__ = ["backward"]


def _plan_rows(name, D, rows, width, stride, dtype):
    """The calling thread's plan buffer ``name`` as ``[D, rows, width]`` (rows ``stride``
    elements apart), as the last kernel call left it."""
    plan = _core._thread_plan()
    buffer, offset = plan._buffers.current(name)
    itemsize = np.dtype(dtype).itemsize
    flat = buffer[offset:offset + D * rows * stride * itemsize].view(dtype)
    return torch.from_numpy(flat.reshape(D, rows, stride)[:, :, :width])


def _padded(rows, problem, fill=None):
    """Packed ``[N, F]`` rows as time-major ``[T, B, F]`` (zeros, or ``fill``'s rows, at
    padded positions); padded input is reshaped as it is."""
    T, B = problem.T, problem.B
    if problem.layout != "packed":
        return rows.reshape(T, B, rows.shape[-1])  # (the width given: B may be 0)
    width = rows.shape[-1]
    out = rows.new_zeros((T * B, width)) if fill is None else fill.reshape(T * B, width).clone()
    out[torch.from_numpy(engine._packed_rows(problem))] = rows
    return out.view(T, B, width)


def _active(problem):
    """``[T, B, 1]`` bool: whether sequence b has step t (None: all have every step)."""
    if problem.layout != "packed":
        return None
    sizes = torch.from_numpy(np.asarray(problem.batch_sizes))
    return (torch.arange(problem.B)[None, :] < sizes[:, None])[:, :, None]


def _previous_states(h, h0, reverse, active):
    """``h_prev[t, b]``: the state the step of row ``(t, b)`` starts from, in the
    direction's order (``h [T, B, P]``, ``h0 [B, P]``)."""
    if not reverse:
        return torch.cat([h0[None], h[:-1]])
    following = torch.cat([h[1:], h0[None]])
    if active is None:
        return following
    # A sequence's last step (its first in reverse) starts from h0.
    has_next = torch.cat([active[1:], torch.zeros_like(active[:1])])
    return torch.where(has_next, following, h0[None].expand_as(following))


def _result_memory(shape, dtype):
    """An uninitialised ``shape`` array of ``dtype`` on the calling
    thread's result memory (:class:`~lstmcy._engine.results.ResultMemory`): per-sample
    gradients are megabytes a step, which fresh pages would fault in every step; these
    are reused once the caller has dropped them."""
    return _core._thread_plan()._results.empty(shape, dtype=dtype)


def _recorded(*tensors):
    """Whether autograd records operations on ``tensors`` (a backward with
    ``create_graph``)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _sum_over_steps(grads, values, scale, first=None, bias=None):
    """``[B, G, F]``: ``scale * sum_t grads[t, b]^T values[t, b]`` (``[T, B, G]``,
    ``[T, B, F]``), plus ``scale * first[0][b]^T first[1][b]`` (``[B, G]``, ``[B, F]``) if
    ``first`` is given; with ``bias`` a list, appends ``scale * sum_t grads[t, b]``
    (``[B, G]``) to it.

    On lstmcy's kernels (one small product a sequence, on the thread pool), into the
    result memory; where autograd records the products (a backward with
    ``create_graph``), batched products of torch over the batch, the steps their inner
    dimension, into fresh tensors. The strided views are read in place either way."""
    if _recorded(grads, values, *(first or ())):
        a, v = grads.permute(1, 2, 0), values.transpose(0, 1)
        out = torch.baddbmm(a.new_zeros(()), a, v, beta=0, alpha=scale)
        if first is not None:
            out = out.baddbmm(first[0].unsqueeze(2), first[1].unsqueeze(1), alpha=scale)
        if bias is not None:
            bias.append(grads.sum(0) * scale)
        return out
    T, B, G = grads.shape
    F = values.shape[-1]
    dtype = _NUMPY_DTYPES[grads.dtype]
    out = _result_memory((B, G, F), dtype)
    bias_out = None if bias is None else np.empty((B, G), dtype=dtype)
    flops = 2 * (T + (first is not None)) * B * G * F
    first_grads, first_values = (None, None) if first is None else (
        first[0].detach().numpy(), first[1].detach().contiguous().numpy())
    with engine._on_torch_threads():
        _kernels.per_sample_products(
            grads.detach().numpy(), values.detach().numpy(), out, scale, _threads_for(flops),
            first_grads, first_values, bias_out, _fpmode._flush)
    if bias is not None:
        bias.append(torch.from_numpy(bias_out))
    return torch.from_numpy(out)


_NUMPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}


def _gram(rows):
    """``[B, T, T]``: ``rows[t, b] . rows[t', b]`` (``rows [T, B, F]``)."""
    r = rows.transpose(0, 1)
    return torch.bmm(r, r.transpose(1, 2))


_CHUNK_BYTES = 1 << 22  # per-sample gradients formed at a time for their norms


def _use_gram(T, G, F):
    """Whether the norms of ``T``-step sums of ``[G, F]`` products (``F`` the widths of
    all the weights sharing the ``G``-wide gradients, added up) are fewer multiply-adds
    through Gram matrices (``T^2 (G + F)`` a sample, the gradients' Gram matrix shared)
    than formed (``T G F``)."""
    return T * (G + F) <= G * F


def _norms_of_sums(grads, values, scale, grads_gram):
    """``[B]``: ``||scale * sum_t grads[t, b]^T values[t, b]||_F`` (``[T, B, G]``,
    ``[T, B, F]``), from Gram matrices (``grads_gram``: :func:`_gram` of ``grads``, computed
    once for the weights that share them) or, with ``grads_gram`` None, from the sums
    formed a few samples at a time."""
    T, B, G = grads.shape
    F = values.shape[-1]
    if grads_gram is not None:
        squares = torch.linalg.vecdot(grads_gram().flatten(1), _gram(values).flatten(1))
        squares.clamp_(min=0)  # rounding can leave a zero norm slightly negative
    else:
        a, v = grads.permute(1, 2, 0), values.transpose(0, 1)
        step = max(1, _CHUNK_BYTES // (G * F * grads.element_size()))
        squares = torch.cat([torch.linalg.vector_norm(torch.bmm(a[i:i + step], v[i:i + step]),
                                                      dim=(1, 2)).square_()
                             for i in range(0, B, step)] or [grads.new_zeros(0)])
    return squares.sqrt_().mul_(abs(scale))


def _state_sums(grads, h, h0, reverse, active, scale):
    """``dW_hh`` per sequence: ``scale * sum_t grads[t, b]^T h_prev[t, b]``. Without
    packing, ``h_prev`` is ``h`` shifted by one step (h0 at the first): a product on views,
    the step that starts from h0 its first term, no shifted copy."""
    if active is not None:
        h_prev = _previous_states(h, h0, reverse, active) * active
        return _sum_over_steps(grads, h_prev, scale)
    inner, first = (slice(None, -1), -1) if reverse else (slice(1, None), 0)
    states = slice(1, None) if reverse else slice(None, -1)
    # The step that starts from h0 (zeros otherwise: nothing to add).
    return _sum_over_steps(grads[inner], h[states], scale,
                           None if h0 is None else (grads[first], h0))


def backward(cfg, hidden_size, x, batch_sizes, h0, c0, weights, masks, saved, dy, dh, dc, want,
             scale=1.0, norms=False, keep=None):
    """Input and state gradients, and the weight gradients of each sequence (or their
    norms).

    Parameters
    ----------
    cfg : LSTMConfig
        The call's settings (:mod:`lstmcy.torch._engine` reads their layout).
    hidden_size : int
        H.
    x, batch_sizes, h0, c0, weights, masks, saved
        The forward's arguments and saved block (:func:`lstmcy._engine.layer_loops.forward`).
    dy, dh, dc : Tensor or None
        Gradients of ``y``, ``h_n``, ``c_n`` (None: zeros).
    want : tuple of 3 bool
        Whether to compute ``dx``, ``dh0``, ``dc0``.
    scale : float
        Multiplier of the per-sample gradients (the batch size, for a mean loss).
    norms : bool
        Return each sequence's gradient norm for each weight instead of the gradients.
    keep : list or None
        With ``norms``: receives what :func:`weighted_sums` needs to form
        ``sum_b c[b] * (sequence b's weight gradients)`` later (the gate gradients are
        copied out of the kernels' buffers).

    Returns
    -------
    dx, dh0, dc0 : Tensor or None
    per_sample : list of Tensor
        ``[B, *w.shape]`` for each of ``weights`` (times ``scale``), or with ``norms``,
        ``[B]``, the Frobenius norms of those; in the batch order of the kernels' call (for
        packed input, the order of ``PackedSequence.batch_sizes``: sorted).
    """
    problem = engine.problem_for(x, batch_sizes, h0, c0, weights, cfg, hidden_size)
    T, B, H, P, L, D = problem.T, problem.B, problem.H, problem.P, problem.L, problem.D
    packed = problem.layout == "packed"
    cdt = problem.compute_dtype
    dtype = torch.from_numpy(np.empty(0, cdt)).dtype
    active = _active(problem)
    parts = dict(zip(kernel_engine.SAVED_NAMES, engine.saved_parts(saved, cfg, H, T, B)))
    per_dir = len(weights) // (L * D)
    if problem.layout == "batch_first":  # the layers run time-major
        x = x.transpose(0, 1)
        dy = None if dy is None else dy.transpose(0, 1)
    layer_cfg = cfg.replace(num_layers=1, batch_first=False)
    states = L * D
    h0_all = h0 if h0 is not None or not packed else x.new_zeros((states, B, P))
    dh0 = torch.empty((states, B, P), dtype=x.dtype) if want[1] else None
    dc0 = torch.empty((states, B, H), dtype=x.dtype) if want[2] else None
    per_sample = [None] * len(weights)
    upper = dy  # gradient of the current layer's output
    dx = None
    for layer in reversed(range(L)):
        ks = slice(layer * D, (layer + 1) * D)
        if layer == 0:
            layer_x = x
        else:
            below = parts["h"][(layer - 1) * D:layer * D]           # [D, T, B, P]
            layer_x = torch.cat(list(below), dim=-1)                  # [T, B, D*P]
            if masks:
                layer_x = layer_x * (_padded(masks[layer - 1], problem) if packed
                                     else masks[layer - 1])
            if packed:
                layer_x = layer_x.reshape(T * B, layer_x.shape[-1])[
                    torch.from_numpy(engine._packed_rows(problem))]
        layer_x = layer_x.contiguous()
        layer_w = weights[layer * D * per_dir:(layer + 1) * D * per_dir]
        layer_saved = saved if L == 1 else torch.cat(
            [parts[name][ks].reshape(-1) for name in kernel_engine.SAVED_NAMES])
        lh0 = None if h0 is None else h0[ks].contiguous()
        lc0 = None if c0 is None else c0[ks].contiguous()
        layer_problem = engine.problem_for(layer_x, batch_sizes, lh0, lc0, layer_w, layer_cfg,
                                            hidden_size)
        need_dx = layer > 0 or want[0]
        layer_dy = None if upper is None else upper.contiguous()
        ldx, ldh0, ldc0, _ = engine.backward(
            layer_problem, layer_saved, None, layer_dy,
            None if dh is None else dh[ks].contiguous(), None if dc is None else dc[ks].contiguous(),
            # dh0 always: a call that asks for nothing returns before the kernels run.
            (need_dx, True, want[2], False))
        # Read before the next layer's call reuses the buffers.
        N = layer_problem.N
        dgates = _plan_rows("gates", D, N, 4 * H, gate_row_stride(H, cdt), cdt)
        dh_rows = _plan_rows("dh_rows", D, N, P, P, cdt) if problem.projected else None
        values_x = _padded(layer_x.to(dtype), problem)
        for d in range(D):
            k = layer * D + d
            grads = _padded(dgates[d], problem)                     # [T, B, 4H]
            h_k = parts["h"][k].to(dtype)
            h0_k = None if h0_all is None else h0_all[k].to(dtype)
            r = (parts["o"][k].to(dtype) * parts["tanhc"][k].to(dtype)
                 if problem.projected else None)
            dh_k = _padded(dh_rows[d], problem) if problem.projected else None
            base = k * per_dir
            if norms:
                _direction_norms(per_sample, base, per_dir, grads, values_x, h_k, h0_k,
                                 d == 1, active, r, dh_k, cfg.has_bias, scale, keep)
                continue
            bias = [] if cfg.has_bias else None
            per_sample[base] = _sum_over_steps(grads, values_x, scale, bias=bias)
            per_sample[base + 1] = _state_sums(grads, h_k, h0_k, d == 1, active, scale)
            if cfg.has_bias:
                per_sample[base + 2] = bias[0]
                per_sample[base + 3] = bias[0].clone()
            if problem.projected:
                per_sample[base + per_dir - 1] = _sum_over_steps(dh_k, r, scale)
        if want[1]:
            dh0[ks] = ldh0
        if want[2]:
            dc0[ks] = ldc0
        if layer > 0:
            upper = ldx * masks[layer - 1] if masks else ldx
        else:
            dx = ldx
    if dx is not None and problem.layout == "batch_first":
        dx = dx.transpose(0, 1).contiguous()
    per_sample = [g.to(w.dtype) for g, w in zip(per_sample, weights)]
    return dx, dh0, dc0, per_sample


def _direction_norms(out, base, per_dir, grads, values_x, h, h0, reverse, active, r, dh,
                     has_bias, scale, keep=None):
    """Each sequence's gradient norm for the weights of one layer and direction, into
    ``out[base:base + per_dir]`` (``grads [T, B, 4H]`` its gate gradients, ``h`` its states,
    ``r``/``dh`` the projection's values and gradients or None); with ``keep``, appends
    ``(first weight index, gradient rows, value rows, bias, inputs)`` to it: the gate
    gradients with ``[x | h_prev]`` (the weights ``base``, ``base + 1`` split after
    ``inputs`` columns and, if ``bias``, the two biases), and the projection's with ``r``
    (``inputs`` None: one weight)."""
    if keep is not None:
        # Copies: the unpacked gate gradients are views of the kernels' work buffers.
        grads = grads.clone(memory_format=torch.contiguous_format)
        dh = None if dh is None else dh.clone(memory_format=torch.contiguous_format)
    T, _, G = grads.shape
    gram = []

    def gram_of_grads():  # shared by W_ih, W_hh and the biases
        if not gram:
            gram.append(_gram(grads))
        return gram[0]

    grads_gram = gram_of_grads if _use_gram(T, G, values_x.shape[-1] + h.shape[-1]) else None
    if h0 is None:
        h0 = h.new_zeros(h.shape[1:])
    h_prev = _previous_states(h, h0, reverse, active)
    if active is not None:
        h_prev = h_prev * active
    out[base] = _norms_of_sums(grads, values_x, scale, grads_gram)
    out[base + 1] = _norms_of_sums(grads, h_prev, scale, grads_gram)
    if has_bias:
        if grads_gram is not None:  # ||sum_t g_t||^2: the sum of the Gram matrix
            bias = grads_gram().sum((1, 2)).clamp_(min=0).sqrt_()
        else:
            bias = torch.linalg.vector_norm(grads.sum(0), dim=1)
        out[base + 2] = bias.mul_(abs(scale))
        out[base + 3] = out[base + 2].clone()
    if r is not None:
        out[base + per_dir - 1] = _norms_of_sums(
            dh, r, scale, (lambda: _gram(dh)) if _use_gram(T, dh.shape[-1], r.shape[-1]) else None)
    if keep is not None:
        # (Widths given: an empty batch has no rows to infer them from.)
        rows = grads.reshape(-1, G)
        n = rows.shape[0]
        values = torch.cat([values_x, h_prev], dim=-1)
        keep.append((base, rows, values.reshape(n, values.shape[-1]), has_bias,
                     values_x.shape[-1]))
        if r is not None:
            keep.append((base + per_dir - 1, dh.reshape(n, dh.shape[-1]),
                         r.reshape(n, r.shape[-1]), False, None))


def weighted_sums(kept, factors, weights):
    """``sum_b factors[b] * (sequence b's gradient)`` of each weight, from what
    :func:`backward` kept (``factors [B]``, in its batch order): one product over all
    rows for the input, state and bias weights of a layer and direction together (value
    rows ``[x | h_prev | 1]`` scaled by their sequence's factor), one for a projection."""
    out = [None] * len(weights)
    rows = kept[0][1].shape[0]
    dtype = kept[0][1].dtype
    # Row t*B + b's factor (none for an empty batch).
    per_row = factors.to(dtype).repeat(rows // factors.shape[0] if rows else 0)[:, None]
    for index, grads, values, bias, inputs in kept:
        width = values.shape[1]
        scaled = torch.empty((rows, width + bias), dtype=dtype)
        torch.mul(values, per_row, out=scaled[:, :width])
        if bias:
            scaled[:, width:] = per_row
        total = torch.mm(grads.t(), scaled)
        if inputs is None:  # a projection
            out[index] = total
            continue
        out[index], out[index + 1] = total[:, :inputs], total[:, inputs:width]
        if bias:
            out[index + 2] = total[:, width]
            out[index + 3] = total[:, width].clone()
    return [g.to(w.dtype).contiguous() for g, w in zip(out, weights)]


def rescaling_factors(pairs, batch, rtol):
    """Per-sample factors ``c [B]`` (float64) with ``second = c[b] * first`` for each
    sample's part of every pair, to within ``rtol`` of the part's norm, or None if there
    are none.

    ``pairs`` holds ``(first, second, where)``: two gradients of one output (either may
    be None, a zero gradient) and where the sample index is: a dimension, or a tensor
    giving each row's sample (packed rows).
    """
    parts = []
    for first, second, where in pairs:
        if first is None and second is None:
            continue
        if first is None or second is None:
            return None  # one pass used the output and the other did not
        parts.append((first.detach().double(), second.detach().double(), where))

    def per_sample(values, where):
        if isinstance(where, int):
            return values.sum([d for d in range(values.dim()) if d != where])
        return values.new_zeros(batch).index_add_(0, where, values.flatten(1).sum(1))

    def expand(c, values, where):
        if isinstance(where, int):
            return c.view([-1 if d == where else 1 for d in range(values.dim())])
        return c[where].view([-1] + [1] * (values.dim() - 1))

    if not parts:
        return None
    dot = sum(per_sample(a * b, w) for a, b, w in parts)
    first_sq = sum(per_sample(a * a, w) for a, _, w in parts)
    second_sq = sum(per_sample(b * b, w) for _, b, w in parts)
    c = torch.where(first_sq > 0, dot / first_sq.clamp(min=1e-300), 0.0)
    residual = sum(per_sample((b - expand(c, a, w) * a).square(), w) for a, b, w in parts)
    if bool((residual <= rtol * rtol * second_sq).all()):
        return c
    return None
