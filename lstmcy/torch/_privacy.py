"""Per-sample gradients of :class:`lstmcy.torch.LSTM` for differentially private training.

Two consumers ask a module for each sample's weight gradients:

- PyTorch's ExpandedWeights (``torch.nn.utils._per_sample_grad.call_for_per_sample_grads``,
  Opacus's ``grad_sample_mode="ew"``): the module's weights arrive wrapped as
  ``ExpandedWeight``; the per-sample gradients go to ``orig_weight.grad_sample`` as
  ExpandedWeights' own layers put them (scaled by the batch size for a mean loss; no
  ``.grad``).
- Opacus's ``GradSampleModule`` with hooks (``make_private``'s default): the grad sampler
  registered here for the class (when ``opacus.grad_sample`` is imported, before or after
  ``lstmcy.torch``) has the gradients the module's backward computed put where Opacus
  accumulates a batch's (``_current_grad_sample``), without copies. Opacus's
  hook sees only the gradient of ``output``, not those of ``h_n`` and ``c_n``, so the
  module computes them itself, in its backward, from every output's gradient.

- Opacus's ghost clipping (``grad_sample_mode="ghost"``, ``GradSampleModuleFastGradientClipping``):
  the norm sampler registered here hands Opacus each sample's gradient norm per weight,
  which the module's backward computes without forming the per-sample gradients. Opacus
  then runs a second backward, of the loss reweighted by its clipping coefficients, with
  its hooks disabled: its summed weight gradients are the clipped sum, formed from the
  first backward's gate gradients (:func:`_rescaled`). The first leaves the weights'
  ``.grad`` alone (Opacus sets it to zero between the two).

Either way the forward runs :class:`PerSampleFunction`, whose backward is
:func:`lstmcy._per_sample.backward`: the kernels' gate gradients summed over each
sample's own steps (or those sums' norms).
"""
import functools
import importlib.abc
import importlib.util
import math
import sys

import torch

from lstmcy.torch import _engine as engine
from lstmcy.torch import _per_sample

__all__ = ["PerSample", "PerSampleFunction", "per_sample_mode", "register_opacus"]


class PerSample:
    """Where one forward's per-sample gradients go.

    Parameters
    ----------
    weights : list of Tensor
        The tensors the kernels compute with (ExpandedWeights unwrapped).
    targets : list of Tensor or None
        For each weight, the parameter whose ``grad_sample`` receives its gradients
        (ExpandedWeights), or None (Opacus: stored on ``module``).
    scale : float
        Multiplier of the gradients (the batch size for a mean-reduced loss).
    module : Module or None
        Opacus's: the module whose parameters receive the gradients where Opacus
        accumulates them (see :func:`_grad_sampler`).
    summed : bool
        Also return the summed weight gradients to autograd (``.grad``).
    batch_size : int or None
        The batch the per-sample gradients must have (ExpandedWeights'), or None.
    norms : bool
        Opacus's ghost clipping: hand over each sample's gradient norms, not the gradients.
    owner : object or None
        Opacus's hooks object; while its hooks are disabled the backward is the plain one.
    """

    def __init__(self, weights, targets, scale, module=None, summed=False, batch_size=None,
                 norms=False, owner=None):
        self.weights, self.targets, self.scale = weights, targets, scale
        self.module, self.summed, self.batch_size = module, summed, batch_size
        self.norms, self.owner = norms, owner
        self.unsorted_indices = None  # packed input: batch order of the sorted sequences
        # Opacus: its backward hook, and whether it sees the input (a tensor, not packed).
        self.hook, self.tensor_input = None, True

    def active(self):
        """Whether this backward gives per-sample results (Opacus's hooks are enabled)."""
        return self.owner is None or getattr(self.owner, "hooks_enabled", True)

    def deliver(self, per_sample, hook_follows=True):
        """Hand over ``per_sample`` (``[B, *w.shape]`` per weight, in the kernels' order);
        ``hook_follows``: Opacus's backward hook runs after this backward."""
        if self.unsorted_indices is not None:
            per_sample = [g[self.unsorted_indices] for g in per_sample]
        if self.batch_size is not None and per_sample and per_sample[0].shape[0] != self.batch_size:
            raise RuntimeError(f"ExpandedWeights' batch size is {self.batch_size} but the "
                               f"LSTM's batch has {per_sample[0].shape[0]} sequences")
        if self.module is not None:
            module = self.module
            params = [module._parameters.get(name) for name in module._flat_weights_names]
            pairs = [(param, grad.to(param.dtype)) for param, grad in zip(params, per_sample)
                     if param is not None and param.requires_grad]
            if self.norms:
                self._deliver_norms(pairs, hook_follows)
                return
            if module.__dict__.get("_lstmcy_deferred", 0) > 0:
                # Opacus's hook ran first (no input needed a gradient: it fires with the
                # output's) and took _grad_sampler's placeholders.
                module._lstmcy_deferred -= 1
                placeholders = module.__dict__.get("_lstmcy_placeholders", {})
                for param, grad in pairs:
                    _put_deferred(param, grad, placeholders.pop(param, None))
                return
            # Opacus's hook follows: the gradients go where it accumulates this batch's
            # (added to a call's before, for a module called twice), and its grad sampler
            # returns no rows to add (a copy of them into fresh zeros otherwise).
            for param, grad in pairs:
                current = getattr(param, "_current_grad_sample", None)
                param._current_grad_sample = grad if current is None else _added(current, grad)
            module._lstmcy_delivered = module.__dict__.get("_lstmcy_delivered", 0) + 1
            if not hook_follows:
                # Opacus's hook sees only tensors among the module's inputs and outputs,
                # and runs with their gradients: with neither (packed input and output,
                # or an unused output and an input without gradient), it is called here.
                self.hook(module, (), (pairs[0][1].new_zeros(1),))
            return
        for target, grad in zip(self.targets, per_sample):
            if target is None or not target.requires_grad:
                continue
            grad = grad.to(target.dtype)
            existing = getattr(target, "grad_sample", None)
            target.grad_sample = grad if existing is None else existing + grad

    def _deliver_norms(self, pairs, hook_follows):
        """Opacus's ghost clipping: ``(param, norms [B])`` pairs to its norm sampler (or,
        if its hook has run already, to the ``_norm_sample`` it set)."""
        module = self.module
        if module.__dict__.get("_lstmcy_deferred", 0) > 0:
            module._lstmcy_deferred -= 1
            for param, norm in pairs:
                param._norm_sample = norm  # in place of _norm_sampler's empty placeholder
            return
        module._lstmcy_norm_samples = dict(pairs)
        if not hook_follows:
            self.hook(module, (), (pairs[0][1].new_zeros(1),))


def _put_deferred(param, grad, placeholder):
    """Put ``grad`` (``param``'s per-sample gradients) where Opacus's hook, run before the
    backward, left ``param``'s: in place of ``placeholder`` (the broadcast zeros
    :func:`_grad_sampler` started the accumulation with, None if it did not), else added
    to it. The hook's accumulation is promoted to ``grad_sample`` once the module's last
    call has been through it; until then it is ``_current_grad_sample``."""
    current = getattr(param, "_current_grad_sample", None)
    if current is not None:
        param._current_grad_sample = grad if current is placeholder else _added(current, grad)
        return
    stored = param.grad_sample
    if isinstance(stored, list):  # accumulated over steps: this step's is last
        stored[-1] = grad if stored[-1] is placeholder else _added(stored[-1], grad)
    else:
        param.grad_sample = (grad if stored is None or stored is placeholder
                             else _added(stored, grad))


def _added(accumulated, grad):
    """The sum of two calls' per-sample gradients as Opacus adds them
    (``_current_grad_sample[:n] += grad_sample``: a call on fewer sequences adds to the
    first ones); a new tensor."""
    if accumulated.shape == grad.shape:
        return accumulated + grad
    more, fewer = (accumulated, grad) if accumulated.shape[0] > grad.shape[0] else (grad, accumulated)
    total = more.clone()
    total[:fewer.shape[0]] += fewer
    return total


class PerSampleFunction(torch.autograd.Function):
    """``(x, h0, c0, *weights) -> (y, h_n, c_n)``, whose backward also gives each
    sample's weight gradients to ``sink`` (a :class:`PerSample`)."""

    @staticmethod
    def forward(ctx, sink, cfg, hidden_size, masks, batch_sizes, x, h0, c0, *weights):
        y, h_n, c_n, saved, _ = engine.forward(x, batch_sizes, h0, c0, weights, masks, cfg,
                                               hidden_size, True)
        ctx.set_materialize_grads(False)
        masks = masks or ()
        ctx.save_for_backward(x, h0, c0, batch_sizes, saved, *masks, *weights)
        ctx.sink, ctx.cfg, ctx.hidden_size, ctx.num_masks = sink, cfg, hidden_size, len(masks)
        return y, h_n, c_n

    @staticmethod
    def backward(ctx, dy, dh, dc):
        x, h0, c0, batch_sizes, saved, *rest = ctx.saved_tensors
        masks, weights = rest[:ctx.num_masks], rest[ctx.num_masks:]
        needs = ctx.needs_input_grad
        want = (needs[5], h0 is not None and needs[6], c0 is not None and needs[7])
        sink = ctx.sink
        if not sink.active():
            # Opacus's hooks are disabled (ghost clipping's second backward): plain gradients.
            output_mask = want + (any(needs[8:]),)
            if not any(output_mask):
                return (None,) * len(needs)
            rescaled = _rescaled(ctx, x, batch_sizes, weights, dy, dh, dc, want)
            if rescaled is not None:
                dx, dh0, dc0, dweights = rescaled
            else:
                problem = engine.problem_for(x, batch_sizes, h0, c0, weights, ctx.cfg,
                                             ctx.hidden_size)
                dx, dh0, dc0, dweights = engine.backward(problem, saved, masks, dy, dh, dc,
                                                         output_mask)
            dweights = ([g if need else None for g, need in zip(dweights, needs[8:])]
                        if output_mask[3] else [None] * len(weights))
            return (None, None, None, None, None, dx if want[0] else None,
                    dh0 if want[1] else None, dc0 if want[2] else None, *dweights)
        keep = [] if sink.norms else None
        dx, dh0, dc0, per_sample = _per_sample.backward(
            ctx.cfg, ctx.hidden_size, x, batch_sizes, h0, c0, list(weights), list(masks), saved,
            dy, dh, dc, want, sink.scale, norms=sink.norms, keep=keep)
        if keep:
            # For the second backward of ghost clipping (see _rescaled).
            ctx.kept = (keep, (dy, dh, dc),
                        tuple(None if g is None else g.clone() for g in (dx, dh0, dc0)))
        # Opacus's hook runs only once the output's gradient has reached it.
        sink.deliver(per_sample, sink.tensor_input and dy is not None)
        if sink.summed and not sink.norms:
            # (scale is the batch size for a mean loss: 0 for an empty batch, whose sum
            # is zeros.)
            factor = 1.0 / sink.scale if sink.scale else 0.0
            dweights = [_batch_sum(g, factor) if need else None
                        for g, need in zip(per_sample, needs[8:])]
        else:
            dweights = [None] * len(weights)
        return (None, None, None, None, None, dx if want[0] else None,
                dh0 if want[1] else None, dc0 if want[2] else None, *dweights)


def _batch_sum(per_sample, factor):
    """``factor * per_sample.sum(0)``, as one matrix-vector product: a pass over the
    per-sample gradients at memory speed (a reduction over the first axis, torch's or
    numpy's, takes twice as long)."""
    rows = per_sample.reshape(per_sample.shape[0], math.prod(per_sample.shape[1:]))
    weights = rows.new_full((rows.shape[0],), factor)
    return torch.mv(rows.t(), weights).view(per_sample.shape[1:])


def _rescaled(ctx, x, batch_sizes, weights, dy, dh, dc, want):
    """The second backward of ghost clipping from the first's gate gradients, or None.

    Opacus's second backward is of the loss reweighted by each sample's clipping
    coefficient, so the output gradients reaching the module are, sample by sample, the
    first backward's times a factor ``c[b]`` (to within rounding). The backward is linear
    in them: its gate gradients are the first's times ``c[b]``, its weight gradients
    ``sum_b c[b] * (sample b's)`` and its input and state gradients the first's times
    ``c[b]``. Those are formed from what the first backward kept (no recurrence), when
    the output gradients are such multiples to within a few hundred units of rounding
    of each sample's norm; otherwise (None) the kernels run the backward again.
    """
    kept = getattr(ctx, "kept", None)
    if kept is None:
        return None
    keep, first, (dx1, dh0_1, dc0_1) = kept
    if (want[0] and dx1 is None) or (want[1] and dh0_1 is None) or (want[2] and dc0_1 is None):
        return None
    packed = batch_sizes is not None
    batch = int(batch_sizes[0]) if packed else x.shape[0 if ctx.cfg.batch_first else 1]
    if packed:  # each packed row's sequence (in the sorted order the kernels use)
        where_y = torch.cat([torch.arange(int(n)) for n in batch_sizes])
    else:
        where_y = 0 if ctx.cfg.batch_first else 1
    rtol = 256 * torch.finfo(x.dtype).eps
    factors = _per_sample.rescaling_factors(
        [(first[0], dy, where_y), (first[1], dh, 1), (first[2], dc, 1)], batch, rtol)
    if factors is None:
        return None

    def times(grad, where):  # each sample's part of grad times its factor
        if grad is None:
            return None
        c = factors.to(grad.dtype)
        if isinstance(where, torch.Tensor):  # packed rows
            return grad * c[where].view(-1, 1)
        return grad * c.view([-1 if d == where else 1 for d in range(grad.dim())])

    dweights = _per_sample.weighted_sums(keep, factors, list(weights))
    return (times(dx1, where_y) if want[0] else None, times(dh0_1, 1) if want[1] else None,
            times(dc0_1, 1) if want[2] else None, dweights)


# ---------------------------------------------------------------------------
# which mode a forward runs in
# ---------------------------------------------------------------------------

def _expanded_weight_type():
    module = sys.modules.get("torch.nn.utils._expanded_weights.expanded_weights_impl")
    return None if module is None else module.ExpandedWeight


def _batch_of(input, batch_first):
    """Sequences in a forward's input (1 for an unbatched one)."""
    if not isinstance(input, torch.Tensor):  # PackedSequence
        return int(input.batch_sizes[0])
    return input.shape[0 if batch_first else 1] if input.dim() == 3 else 1


def _opacus_hook(module):
    """The backward hook of the Opacus ``GradSampleModule`` hooking ``module`` (a
    ``functools.partial`` of ``capture_backprops_hook``, whose ``__self__`` is the hooks
    object), or None: not hooked, or its hooks disabled."""
    for hook in module._backward_hooks.values():
        if (isinstance(hook, functools.partial)
                and getattr(hook.func, "__name__", "") == "capture_backprops_hook"):
            owner = getattr(hook.func, "__self__", None)
            if owner is not None and not getattr(owner, "hooks_enabled", True):
                return None
            return hook
    return None


def per_sample_mode(module, weights, input):
    """The :class:`PerSample` of a forward of ``module`` on ``input`` whose weights are
    ``weights``, or None (no per-sample gradients asked for)."""
    expanded = _expanded_weight_type()
    if expanded is not None and any(isinstance(w, expanded) for w in weights):
        first = next(w for w in weights if isinstance(w, expanded))
        plain = [w.orig_weight if isinstance(w, expanded) else w for w in weights]
        targets = [w.orig_weight if isinstance(w, expanded) else None for w in weights]
        scale = first.batch_size if first.loss_reduction == "mean" else 1
        return PerSample(plain, targets, scale, batch_size=first.batch_size)
    hook = _opacus_hook(module) if module._backward_hooks else None
    if hook is None or not module.training or not torch.is_grad_enabled():
        return None
    # Opacus reads the batch size from here (its own guess reads the input's first axis).
    module.max_batch_len = batch = _batch_of(input, module.batch_first)
    reduction = hook.keywords.get("loss_reduction", "mean")
    owner = getattr(hook.func, "__self__", None)
    # Ghost clipping: the hooks object asks the registered norm sampler of the class.
    norms = (getattr(owner, "use_ghost_clipping", False)
             and type(module) in getattr(owner, "NORM_SAMPLERS", {}))
    sink = PerSample(list(weights), None, batch if reduction == "mean" else 1, module=module,
                     summed=True, norms=bool(norms), owner=owner)
    sink.hook, sink.tensor_input = hook, isinstance(input, torch.Tensor)
    return sink


# ---------------------------------------------------------------------------
# Opacus
# ---------------------------------------------------------------------------

def _grad_sampler(layer, activations, backprops):
    """Opacus grad sampler of the per-sample gradients the layer's backward computes.

    Opacus calls it from a module backward hook and adds what it returns (``[rows,
    *param.shape]`` per parameter) into the parameter's ``_current_grad_sample``, which
    it makes as zeros of the batch's size when absent and moves to ``grad_sample`` after
    the module's last call. The hook runs after the module's backward when an input
    needs a gradient, else as soon as ``output``'s gradient is known, before it. Either
    way the backward's gradients are put in place of Opacus's accumulation, and this
    returns no rows: no fill of zeros the size of the per-sample gradients, and no copy.
    """
    params = [param for param in layer.parameters(recurse=False) if param.requires_grad]
    delivered = layer.__dict__.get("_lstmcy_delivered", 0)
    if delivered > 0:  # the backward ran first and put its gradients in place
        layer._lstmcy_delivered = delivered - 1
        return {param: param.new_zeros((0,) + tuple(param.shape)) for param in params}
    layer._lstmcy_deferred = layer.__dict__.get("_lstmcy_deferred", 0) + 1
    # Broadcast zeros start the accumulation (they cost nothing); the backward replaces
    # them, known by identity (_put_deferred).
    placeholders = layer.__dict__.setdefault("_lstmcy_placeholders", {})
    batch = (layer.max_batch_len,)
    for param in params:
        if getattr(param, "_current_grad_sample", None) is None:
            zeros = param.new_zeros(()).expand(batch + tuple(param.shape))
            param._current_grad_sample = placeholders[param] = zeros
    return {param: param.new_zeros((0,) + tuple(param.shape)) for param in params}


def _norm_sampler(layer, activations, backprops):
    """Opacus norm sampler (ghost clipping): each sample's gradient norm per weight, which
    the layer's backward computed. As :func:`_grad_sampler`, when the hook runs before
    the backward it returns empty placeholders, which the backward replaces."""
    stored = layer.__dict__.pop("_lstmcy_norm_samples", None)
    if stored:
        return stored
    layer._lstmcy_deferred = layer.__dict__.get("_lstmcy_deferred", 0) + 1
    return {param: param.new_zeros((0,))
            for param in layer.parameters(recurse=False) if param.requires_grad}


def register_opacus(cls):
    """Register ``cls``'s grad sampler (and norm sampler, for ghost clipping, where Opacus
    has them) with Opacus now if ``opacus.grad_sample`` is imported, else when it is."""
    grad_sample = sys.modules.get("opacus.grad_sample")
    if grad_sample is not None and hasattr(grad_sample, "register_grad_sampler"):
        grad_sample.register_grad_sampler(cls)(_grad_sampler)
        if hasattr(grad_sample, "register_norm_sampler"):
            grad_sample.register_norm_sampler(cls)(_norm_sampler)
        return
    if importlib.util.find_spec("opacus") is None:
        return
    sys.meta_path.insert(0, _OnImport("opacus.grad_sample", lambda mod: register_opacus(cls)))


class _OnImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` once ``name`` has been imported (then removes itself):
    importing opacus takes seconds, so ``lstmcy.torch`` does not import it."""

    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_register(module):
            exec_module(module)
            callback(module)
        spec.loader.exec_module = exec_then_register
        return spec
