"""One inference step of a cell, or of a one-step LSTM call, on a step kernel object.

``lstmcy.torch.LSTMCell`` and ``lstmcy.torch.LSTM`` (one layer, one direction, no
projection, ``T = 1``) hand a step to :func:`infer` when nothing needs its gradient and
the call is plain eager PyTorch (:func:`plain_eager`): numpy views of the tensors go to
the thread's plan's ``StepForward`` for the shape (``lstmcy._engine.step``), whose checks
are in C, and its new arrays come back as tensors. The results are bitwise those of the
module's other routes. Any call it does not take (other dtypes, layouts, devices, sizes
beyond one thread's step) returns None and runs the module's full path, with its checks.
The cell's training step (``lstmcy.torch._cell``) uses the same pieces: the eager check,
the weights' views and the module's kernel object.
"""
import torch
from torch import nn

from lstmcy._engine import fpmode as _fpmode
from lstmcy._engine import step as _step
from lstmcy._engine.dispatch import kernels as _lstm
from lstmcy._engine.plan import _thread_plan

__all__ = ["recording", "plain_eager", "weight_views", "plain_states", "infer", "cell_step",
           "remember"]

_KERNEL_DTYPES = (torch.float32, torch.float64)


# The checks of plain_eager, bound once (each is a call per step).
_is_compiling = torch.compiler.is_compiling
_tracing_state = torch._C._get_tracing_state
_transforms = torch._C._functorch.peek_interpreter_stack
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_forward_ad = torch.autograd.forward_ad
_inference_mode = torch.is_inference_mode_enabled


def recording():
    """Whether autograd records a call: grad mode on, outside inference mode (where
    ``torch.enable_grad`` turns grad mode on but nothing is recorded). Under
    ``torch.compile``, grad mode alone (Dynamo does not trace the inference-mode query)."""
    return torch.is_grad_enabled() and (_is_compiling() or not _inference_mode())


def plain_eager():
    """Whether a call runs in plain eager mode: no ``torch.compile``, tracing,
    ``torch.func`` transform, forward-mode AD or Python dispatch / function mode."""
    return not (_is_compiling() or _tracing_state() is not None or _transforms() is not None
                or _forward_ad._current_level >= 0 or _dispatch_modes() or _function_modes())


def weight_views(module, weights):
    """Numpy views of ``weights`` (CPU parameters of one dtype), kept on
    ``module._step_views`` while they are the same tensors (objects and TensorImpls) over
    the same memory, of the same shapes (a weight's values may change in place: the views
    read them). None where a weight is not a plain contiguous CPU parameter of a kernel
    dtype (so the views are C-contiguous and aligned, as the kernels take them)."""
    kept = getattr(module, "_step_views", None)  # modules pickled before it had them
    if kept is not None:
        tensors, impls, pointers, shapes, views = kept
        if len(weights) == len(tensors):
            # The tensor object and its TensorImpl (torch.utils.swap_tensors, which
            # load_state_dict and .to() use with swapping on, changes the second alone).
            for w, tensor, impl, pointer, shape in zip(weights, tensors, impls, pointers,
                                                       shapes):
                if (w is not tensor or w._cdata != impl or w.data_ptr() != pointer
                        or w.shape != shape):
                    break
            else:
                return views
    dtype = weights[0].dtype
    for w in weights:
        if (type(w) is not nn.Parameter or w.dtype is not dtype or dtype not in _KERNEL_DTYPES
                or not w.is_cpu or w.layout is not torch.strided or not w.is_contiguous()):
            return None
    module._step_views = (list(weights), [w._cdata for w in weights],
                          [w.data_ptr() for w in weights], [w.shape for w in weights],
                          [w.detach().numpy() for w in weights])
    return module._step_views[4]


def plain_states(hx, dtype, shape):
    """``hx = (h0, c0)`` when it is a tuple of two plain CPU tensors of ``dtype`` and
    ``shape``, ``(None, None)`` for None (zeros), else None (the call takes the full
    path, with its checks)."""
    if hx is None:
        return None, None
    if type(hx) is not tuple or len(hx) != 2:
        return None
    for state in hx:
        if (type(state) is not torch.Tensor or state.dtype is not dtype or not state.is_cpu
                or state.shape != shape):
            return None
    return hx


def _array(tensor):
    """The numpy view of a plain CPU tensor (None for a subclass, or where ``numpy()``
    refuses: another device or layout, a tensor that requires grad)."""
    if type(tensor) is not torch.Tensor:
        return None
    try:
        return tensor.numpy()
    except (RuntimeError, TypeError):
        return None


def infer(module, views, x, hx, B, I, H, batch_first=None):
    """One inference step as new numpy arrays, or None: ``(h1, c1)`` ``[B, H]`` for a
    cell; for the LSTM module ``(y, h_n, c_n)``, ``y`` in the input's layout, the states
    ``[1, B, H]``.

    Parameters
    ----------
    module : LSTMCell or LSTM
        The module that steps: it keeps the tensors its last step returned beside their
        arrays (:func:`remember`), so that states handed back need no conversion.
    views : list of ndarray
        ``w_ih [4H, I], w_hh [4H, H]`` and, with biases, ``b_ih, b_hh [4H]``.
    x : Tensor
        The step's input: ``[B, I]``, or with ``batch_first`` given ``[1, B, I]`` (False)
        or ``[B, 1, I]`` (True).
    hx : tuple of Tensor or None
        ``(h0, c0)``, each ``[B, H]`` (``[1, B, H]`` when ``batch_first`` is given); None
        for zeros.
    batch_first : bool or None
        None for a cell's step, else the LSTM module's layout.
    """
    kernel = _kernel(module, B, I, H, views[0].dtype)
    if kernel is None:
        return None
    xa = _array(x)
    if xa is None:
        return None
    hx = _state_arrays(module, hx)
    if hx is False:
        return None
    layout = (_CELL if batch_first is None else _BATCH_FIRST if batch_first else _TIME_MAJOR)
    return kernel.run(xa, hx, views, len(views), None, _fpmode._flush, layout)


def _state_arrays(module, hx):
    """The numpy arrays of the states ``hx = (h0, c0)``: those of the tensors ``module``'s
    last step returned when they come back as they are, else their views; None for None
    (zeros); False where ``hx`` is not two plain CPU tensors."""
    if hx is None:
        return None
    if type(hx) not in (tuple, list) or len(hx) != 2:
        return False
    h0, c0 = hx
    last = getattr(module, "_step_last", None)  # modules pickled before it had them
    if last is not None and h0 is last[0] and c0 is last[2]:
        return (last[1], last[3])
    h0, c0 = _array(h0), _array(c0)
    return False if h0 is None or c0 is None else (h0, c0)


def _kernel(module, B, I, H, dtype):
    """The step kernel object of ``module``'s steps of ``B`` rows in ``dtype``: the one
    its last step used, else the thread's plan's (kept on the module, with that plan: a
    kernel object serves any thread, as it runs holding the GIL). None where the step
    does not fit one (or the plan traces its kernel calls)."""
    kept = getattr(module, "_step_kernel", None)  # modules pickled before it had them
    if kept is None or kept[0] != B or kept[1] is not dtype:
        plan = _thread_plan()
        key = (B, I, H, dtype)
        if _step.step_shape(B, I, H, dtype).kernel_key is None:
            return None
        kept = module._step_kernel = (B, dtype, _step.step_kernel(plan, key), plan)
    return None if kept[3].trace is not None else kept[2]


_CELL = _lstm.StepLayout.STEP_CELL
_TIME_MAJOR = _lstm.StepLayout.STEP_TIME_MAJOR
_BATCH_FIRST = _lstm.StepLayout.STEP_BATCH_FIRST


def cell_step(cell, x, hx):
    """:class:`~lstmcy.torch.LSTMCell`'s inference step ``(h1, c1)`` as tensors, or None:
    :func:`infer` for a cell, its lookups folded into one function (a step of the usual
    sizes costs a few microseconds: each lookup is a part of it)."""
    if not plain_eager():  # first: under a transform the weights are not read as arrays
        return None
    views = weight_views(cell, cell._weights())
    if views is None:
        return None
    kernel = _kernel(cell, x.shape[0], cell.input_size, cell.hidden_size, views[0].dtype)
    xa = _array(x)
    if kernel is None or xa is None:
        return None
    hx = _state_arrays(cell, hx)
    if hx is False:
        return None
    out = kernel.run(xa, hx, views, len(views), None, _fpmode._flush)
    if out is None:
        return None
    h1, c1 = torch.from_numpy(out[0]), torch.from_numpy(out[1])
    remember(cell, h1, out[0], c1, out[1])
    return h1, c1


def remember(module, h, h_array, c, c_array):
    """Keep the tensors ``h`` and ``c`` a step returned with the arrays their memory is
    (the next step's states, when they come back as they are)."""
    # In the instance's dict: Module.__setattr__'s checks (parameter, buffer, submodule)
    # cost more than a small step's arithmetic, and a tuple is none of those.
    module.__dict__["_step_last"] = (h, h_array, c, c_array)
