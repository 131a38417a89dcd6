"""The one entry point from :mod:`lstmcy.torch` into lstmcy's kernels, tensors in and out.

:func:`forward` and :func:`backward` take and return CPU tensors (float32 or float64, in
``aten::lstm``'s layouts) and run :mod:`lstmcy._engine.layer_loops` on numpy views of them: no copies
on the way in; on the way out, the outputs ``y, h_n, c_n`` are copied into torch's memory
(resizable, as ``aten::lstm``'s), the saved activations and gradients are not. Both the
module's eager autograd ``Function`` and the registered custom operators
(:mod:`lstmcy.torch._ops`) call only these two functions, so the engine behind them can
change in one place.

A call's settings are an :class:`lstmcy.LSTMConfig` (``cfg``), the numpy API's, of which
the engine reads the layout: ``num_layers``, ``bidirectional``, ``batch_first`` (padded
input only; packed input is time-ordered rows), ``has_bias`` and ``proj_size``. Dropout
comes as masks drawn from torch's generator, and whether to keep the activations as
``train``, so ``cfg.dropout`` and ``cfg.train`` are not read. The hidden size comes beside
it, as ``hidden_size``: the module has checked the states against it, and the weights are
checked against it here.

The module has checked every tensor as ``torch.nn.LSTM`` does, so its padded input skips
lstmcy's argument checks (:func:`~lstmcy._engine.validation.trusted_problem`); packed input, and
every call of the public operators, goes through :func:`~lstmcy._engine.validation.check_problem`.
"""
import contextlib
import ctypes
import functools
import sys

import numpy as np
import torch

from lstmcy import _threadpool
from lstmcy._engine import layer_loops as _engine
from lstmcy._engine.layer_loops import SAVED_NAMES, check_problem, trusted_problem

__all__ = ["forward", "backward", "problem_for", "saved_parts", "saved_numel"]


def _torch_libgomp():
    """The path of the libgomp torch has loaded (Linux), or None."""
    if not sys.platform.startswith("linux") or not torch.backends.openmp.is_available():
        return None
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if path.rsplit("/", 1)[-1].startswith("libgomp") and ".so" in path:
                    return path
    except OSError:
        pass
    return None


def _use_torch_openmp():
    """Hand lstmcy's pool torch's OpenMP team (libgomp's GOMP_parallel), so that the kernel
    calls of this module run on torch's intra-op threads: those spin for milliseconds after
    each of torch's parallel regions (the optimiser's, the loss's), and lstmcy's own
    workers would share the cores with them meanwhile. The library is the one already
    loaded (never a new one); without it the pool's own workers run the calls."""
    path = _torch_libgomp()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path)
        addresses = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                     for name in ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads",
                                  "omp_in_parallel")]
    except (OSError, AttributeError):
        return False
    _threadpool.set_omp_runtime(*addresses)
    return True


_use_torch_openmp()


@contextlib.contextmanager
def _on_torch_threads():
    """The calling thread's kernel calls run on torch's OpenMP team meanwhile."""
    previous = _threadpool.use_omp(True)
    try:
        yield
    finally:
        _threadpool.use_omp(previous)


def _np(tensor):
    """Numpy view of a CPU tensor (None stays None): zero-copy, but for a lazy negated or
    conjugated view (``z.conj().imag``), whose memory holds other values than the tensor's
    until it is resolved into a copy."""
    return None if tensor is None else tensor.detach().resolve_neg().resolve_conj().numpy()


def problem_for(input, batch_sizes, h0, c0, weights, cfg, hidden_size, names=None):
    """The checked :class:`~lstmcy._engine.validation.Problem` of one call (numpy views of the
    tensors; the backward of a call rebuilds the forward's from the same tensors).

    With ``names`` (the operators', which anyone may call) every argument goes through
    lstmcy's checks under those names. Without (the module's calls, whose tensors
    ``nn.LSTM``'s own checks have passed), padded input is trusted
    (:func:`~lstmcy._engine.validation.trusted_problem`).
    """
    x = _np(input)
    params = [_np(w) for w in weights]
    if batch_sizes is None:
        if names is None:
            return trusted_problem(x, _np(h0), _np(c0), params, hidden_size=hidden_size,
                                   has_bias=cfg.has_bias, num_layers=cfg.num_layers,
                                   bidirectional=cfg.bidirectional, batch_first=cfg.batch_first,
                                   proj_size=cfg.proj_size)
        sizes = None
    else:
        sizes = _np(batch_sizes)
        if x.ndim != 2 or (sizes.ndim == 1 and x.shape[0] != sizes.sum()):
            # lstmcy's numpy API reads T*B rows as a padded layout (and 3-D input with
            # batch_sizes as padded sequences); packed data is never read in another layout.
            raise ValueError(f"packed input must be [sum(batch_sizes) = {sizes.sum()}, I], "
                             f"got shape {tuple(x.shape)}")
    hx = None if h0 is None else (_np(h0), _np(c0))
    return check_problem(x, hx, params, has_bias=cfg.has_bias, num_layers=cfg.num_layers,
                         bidirectional=cfg.bidirectional,
                         batch_first=cfg.batch_first and sizes is None, batch_sizes=sizes,
                         proj_size=cfg.proj_size, names=names)


def _engine_masks(masks, problem):
    """Dropout multipliers in ``aten::lstm``'s layer-output layout (time-major
    ``[T, B, F]``, or packed ``[N, F]``) as the ``[T, B, F]`` arrays the engine applies to
    its internal time-major layer outputs (padded rows, which it ignores, get 0)."""
    if not masks:
        return None
    if problem.layout != "packed":
        return [_np(m) for m in masks]
    T, B = problem.T, problem.B
    rows = _packed_rows(problem)
    engine = []
    for mask in masks:
        values = _np(mask)
        padded = np.zeros((T * B, values.shape[1]), dtype=values.dtype)
        padded[rows] = values
        engine.append(padded.reshape(T, B, -1))
    return engine


def _packed_rows(problem):
    """Row ``t * B + b`` of each packed row ``packed_start[t] + b``."""
    sizes = problem.batch_sizes
    steps = np.repeat(np.arange(problem.T), sizes)
    within = np.arange(problem.N) - np.repeat(problem.packed_start, sizes)
    return steps * problem.B + within


def forward(input, batch_sizes, h0, c0, weights, masks, cfg, hidden_size, train, problem=None):
    """Run the LSTM.

    Parameters
    ----------
    input : Tensor
        ``[T, B, I]`` (``[B, T, I]`` if ``cfg.batch_first``), or packed ``[N, I]`` with
        ``batch_sizes``.
    batch_sizes : Tensor or None
        int64 ``PackedSequence.batch_sizes``.
    h0, c0 : Tensor or None
        ``[L*D, B, H]``; None means zeros.
    weights : sequence of Tensor
        ``nn.LSTM._flat_weights``.
    masks : sequence of Tensor or None
        ``L - 1`` dropout multipliers in ``aten::lstm``'s layer-output layout.
    cfg : LSTMConfig
        The call's settings (the layout is read; see the module docstring).
    hidden_size : int
        H.
    train : bool
        Keep what the backward needs.
    problem : Problem, optional
        The call's, when the caller has checked it already (:func:`problem_for`).

    Returns
    -------
    y, h_n, c_n : Tensor
    saved : Tensor
        The saved activations, the engine's flat block (empty unless ``train``; see
        :func:`saved_parts`).
    problem : Problem
        The checked call, which :func:`backward` may reuse.
    """
    if problem is None:
        problem = problem_for(input, batch_sizes, h0, c0, weights, cfg, hidden_size)
    if problem.T == 0:
        # As aten::lstm (lstmcy's numpy API accepts T = 0).
        raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
    with _on_torch_threads():
        y, h_n, c_n, block = _engine.forward(problem, train, _engine_masks(masks, problem))
    saved = torch.from_numpy(block) if train else torch.empty(0, dtype=input.dtype)
    return _resizable(y), _resizable(h_n), _resizable(c_n), saved, problem


def _resizable(array):
    """``array`` copied into memory of torch's own: a tensor over numpy's memory cannot
    grow, and ``aten::lstm``'s outputs can (``resize_``)."""
    return torch.from_numpy(array).clone()


@functools.lru_cache(maxsize=2)  # the last shapes only: a large model's y is megabytes
def _zeros(shape, dtype):
    """A read-only zero gradient (the loss did not use ``y``): shared between calls, since
    a fresh one of this size costs page faults on every step, and the backward only
    reads it."""
    zeros = np.zeros(shape, dtype=dtype)
    zeros.flags.writeable = False
    return zeros


def backward(problem, saved, masks, grad_y, grad_h_n, grad_c_n, output_mask):
    """Gradients of :func:`forward`'s ``y, h_n, c_n``.

    Parameters
    ----------
    problem : Problem
        :func:`forward`'s (or :func:`problem_for`'s on the same tensors).
    saved : Tensor
        :func:`forward`'s saved activations.
    masks : sequence of Tensor or None
        The forward's dropout multipliers.
    grad_y, grad_h_n, grad_c_n : Tensor or None
        Gradients of the outputs; None means zeros.
    output_mask : tuple of 4 bool
        Which of ``(dx, dh0, dc0, dweights)`` to compute.

    Returns
    -------
    dx, dh0, dc0 : Tensor or None
    dweights : list of Tensor or None
        In ``weights`` order.
    """
    if not any(output_mask):
        return None, None, None, None
    if grad_y is None:
        dy = _zeros(problem.output_shape(), problem.dtype)
    else:
        dy = _np(grad_y)
    with _on_torch_threads():
        dx, dh0, dc0, dparams = _engine.backward(
            problem, _np(saved.contiguous()), dy, _np(grad_h_n), _np(grad_c_n),
            _engine_masks(masks, problem), tuple(output_mask))
    return (None if dx is None else torch.from_numpy(dx),
            None if dh0 is None else torch.from_numpy(dh0),
            None if dc0 is None else torch.from_numpy(dc0),
            None if dparams is None else [torch.from_numpy(g) for g in dparams])


def saved_parts(saved, cfg, hidden_size, T, B):
    """The seven activations of a saved block (:func:`forward`'s, of a call with ``T``
    steps and ``B`` sequences) as ``[L*D, T, B, F]`` views, in ``SAVED_NAMES`` order (F is
    the hidden size, for h the output size)."""
    rows = cfg.num_layers * cfg.num_directions * T * B
    parts, start = [], 0
    for name in SAVED_NAMES:
        width = (cfg.proj_size or hidden_size) if name == "h" else hidden_size
        parts.append(saved[start:start + rows * width].view(
            cfg.num_layers * cfg.num_directions, T, B, width))
        start += rows * width
    return parts


def saved_numel(cfg, hidden_size, T, B):
    """Elements of :func:`forward`'s saved block for ``T`` steps and ``B`` sequences."""
    H = hidden_size
    return cfg.num_layers * cfg.num_directions * T * B * (6 * H + (cfg.proj_size or H))
