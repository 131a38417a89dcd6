"""lstmcy's kernels under ``torch.func`` transforms (``grad``, ``vjp``, ``jacrev``, ``vmap``).

The custom operators' own autograd formulas (:mod:`lstmcy.torch._ops`) serve autograd,
``torch.compile`` and export, but ``torch.func`` refuses them: it wants an
:class:`torch.autograd.Function` with a separate ``setup_context``. :func:`lstm` is that
function pair around the same operators:

- :class:`_Forward` runs ``lstm_forward``; its backward is :class:`_Backward`;
- :class:`_Backward` runs ``lstm_backward``; its backward (second derivatives, e.g.
  ``grad(grad(f))``, ``hessian`` of a scalar) is
  :func:`lstmcy._reference.second_derivatives`, through the differentiable reference.

Both generate their vmap rule (``generate_vmap_rule``): under ``vmap`` their
``forward`` runs on batched tensors, which the operators' vmap rules handle, so
``vmap(grad(loss))`` gives per-sample gradients.
"""
import torch

from lstmcy.torch import _ops
from lstmcy.torch._reference import second_derivatives

__all__ = ["lstm"]


def lstm(cfg, hidden_size, input, batch_sizes, h0, c0, weights, masks):
    """``(y, h_n, c_n)`` of the LSTM of settings ``cfg`` (an :class:`lstmcy.LSTMConfig`) and
    ``hidden_size``, differentiable under ``torch.func`` transforms."""
    masks = list(masks or ())
    y, h_n, c_n, _ = _Forward.apply(cfg, hidden_size, len(masks), input, batch_sizes, h0, c0,
                                    *masks, *weights)
    return y, h_n, c_n


class _Forward(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(cfg, hidden_size, num_masks, input, batch_sizes, h0, c0, *masks_and_weights):
        masks, weights = masks_and_weights[:num_masks], masks_and_weights[num_masks:]
        return _ops.lstm_forward(input, batch_sizes, h0, c0, list(weights), list(masks),
                                       *_ops.layout_arguments(cfg, hidden_size), True)

    @staticmethod
    def setup_context(ctx, inputs, output):
        cfg, hidden_size, num_masks, input, batch_sizes, h0, c0, *masks_and_weights = inputs
        ctx.cfg, ctx.hidden_size = cfg, hidden_size
        ctx.num_masks = num_masks
        ctx.save_for_backward(input, batch_sizes, h0, c0, output[3], *masks_and_weights)
        ctx.mark_non_differentiable(output[3])
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_y, grad_h_n, grad_c_n, _grad_saved):
        input, batch_sizes, h0, c0, saved, *masks_and_weights = ctx.saved_tensors
        # (cfg, hidden_size, num_masks, input, batch_sizes, h0, c0, *masks, *weights)
        needs = ctx.needs_input_grad
        weight_needs = needs[7 + ctx.num_masks:]
        output_mask = (needs[3], h0 is not None and needs[5], c0 is not None and needs[6],
                       any(weight_needs))
        nothing = (None,) * len(needs)
        if not any(output_mask):
            return nothing
        grads = _Backward.apply(ctx.cfg, ctx.hidden_size, ctx.num_masks, output_mask, input,
                                batch_sizes, h0, c0, saved, grad_y, grad_h_n, grad_c_n,
                                *masks_and_weights)
        dx, dh0, dc0, *dweights = grads
        if not output_mask[3]:
            dweights = [None] * len(weight_needs)
        return (None, None, None, dx if output_mask[0] else None, None,
                dh0 if output_mask[1] else None, dc0 if output_mask[2] else None,
                *([None] * ctx.num_masks), *dweights)


class _Backward(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(cfg, hidden_size, num_masks, output_mask, input, batch_sizes, h0, c0, saved,
                grad_y, grad_h_n, grad_c_n, *masks_and_weights):
        masks, weights = masks_and_weights[:num_masks], masks_and_weights[num_masks:]
        dx, dh0, dc0, dweights = _ops.lstm_backward(
            input, batch_sizes, h0, c0, list(weights), list(masks), saved, grad_y, grad_h_n,
            grad_c_n, *_ops.layout_arguments(cfg, hidden_size), list(output_mask))
        return (dx, dh0, dc0, *dweights)

    @staticmethod
    def setup_context(ctx, inputs, output):
        (cfg, hidden_size, num_masks, output_mask, input, batch_sizes, h0, c0, saved, grad_y,
         grad_h_n, grad_c_n, *masks_and_weights) = inputs
        ctx.cfg, ctx.hidden_size = cfg, hidden_size
        ctx.num_masks, ctx.output_mask = num_masks, output_mask
        ctx.save_for_backward(input, batch_sizes, h0, c0, grad_y, grad_h_n, grad_c_n,
                              *masks_and_weights)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_dx, grad_dh0, grad_dc0, *grad_dweights):
        input, batch_sizes, h0, c0, grad_y, grad_h_n, grad_c_n, *rest = ctx.saved_tensors
        masks, weights = rest[:ctx.num_masks], rest[ctx.num_masks:]
        if not ctx.output_mask[3]:
            grad_dweights = [None] * len(weights)
        d_input, d_h0, d_c0, d_weights, d_y, d_h_n, d_c_n = second_derivatives(
            ctx.cfg, ctx.hidden_size, ctx.output_mask, input, batch_sizes, h0, c0, weights,
            masks, grad_y, grad_h_n, grad_c_n, [grad_dx, grad_dh0, grad_dc0, *grad_dweights])
        return (None, None, None, None, d_input, None, d_h0, d_c0, None, d_y, d_h_n, d_c_n,
                *([None] * ctx.num_masks), *d_weights)
