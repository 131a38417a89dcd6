"""The engine: a checked problem in, the kernels' results out.

This is the internal API the front ends build on (the numpy functions through
:class:`~lstmcy._core.LSTMPlan`, :mod:`lstmcy.torch` directly). A call is described once by
a :class:`~lstmcy._validation.Problem`:

* :func:`~lstmcy._validation.check_problem` builds it from any arguments the numpy API
  takes, checking each one;
* :func:`~lstmcy._validation.trusted_problem` builds it for a padded call whose caller has
  checked its arrays itself (``lstmcy.torch``: the module checks its tensors as
  ``torch.nn.LSTM`` does).

:func:`forward` runs it and returns the saved activations as one flat block;
:func:`backward` takes that block back. Both run on the calling thread's plan (its work
buffers reused between calls; thread-safe, since each thread has its own) unless given
another :class:`~lstmcy._core.LSTMPlan`. Arrays are numpy arrays: a caller with tensors
hands in zero-copy views.

Dropout between layers is the caller's to draw: ``masks`` are the ``L - 1`` multipliers of
the lower layers' outputs, each ``[T, B, D*P]`` time-major (padded rows are ignored),
scaled by ``1 / (1 - p)`` where kept.
"""
from lstmcy._core import _block_reader, _thread_plan, saved_arrays, saved_size
from lstmcy._validation import SAVED_NAMES, check_problem, trusted_problem

__all__ = ["forward", "backward", "saved_size", "saved_views", "check_problem",
           "trusted_problem", "SAVED_NAMES"]


def forward(problem, train=True, masks=None, plan=None):
    """Run the forward of ``problem``.

    Parameters
    ----------
    problem : Problem
        From :func:`check_problem` or :func:`trusted_problem`.
    train : bool
        Keep the activations the backward needs.
    masks : list of ndarray [T, B, D*P], optional
        Dropout multipliers of layers ``0 .. L-2``'s outputs (None: no dropout).
    plan : LSTMPlan, optional
        Whose buffers and thread count to use (default: the calling thread's plan).

    Returns
    -------
    y : ndarray
        Output in the input's layout, ``D*P`` features, in the problem's dtype.
    h_n, c_n : ndarray [L*D, B, P], [L*D, B, H]
    saved : ndarray or None
        When ``train``: the seven activations of every layer and direction as one flat
        block of :func:`saved_size` elements in the compute dtype (float32 for
        float16/bfloat16 problems); :func:`saved_views` shows its parts. Else None.
    """
    plan = _thread_plan() if plan is None else plan
    return plan._run_forward(problem, train, masks)[:4]


def backward(problem, saved, dy, dh=None, dc=None, masks=None,
             output_mask=(True, True, True, True), plan=None):
    """Gradients of the forward of ``problem`` that returned ``saved``.

    Parameters
    ----------
    problem : Problem
        The forward's, or one built the same way from the same arrays.
    saved : ndarray
        :func:`forward`'s block (used as is: no copy, no check of its values).
    dy : ndarray
        Gradient of ``y``, shaped like it (ignored at padded positions).
    dh, dc : ndarray [L*D, B, P], [L*D, B, H], optional
        Gradients of ``h_n`` and ``c_n`` (None: zeros).
    masks : list of ndarray [T, B, D*P], optional
        The forward's dropout multipliers.
    output_mask : tuple of 4 bool
        Which of ``(dx, dh0, dc0, dparams)`` to compute.
    plan : LSTMPlan, optional
        As for :func:`forward`.

    Returns
    -------
    dx, dh0, dc0 : ndarray or None
        In the problem's dtype; None where ``output_mask`` is False.
    dparams : list of ndarray or None
        In the order of the problem's parameters.
    """
    if saved is None or saved.size != saved_size(problem):
        raise ValueError(f"saved must be the forward's block of {saved_size(problem)} elements, "
                         f"got {None if saved is None else saved.size}")
    # The kernels index these by the problem's sizes: their shapes are checked even for a
    # trusted problem.
    shapes = problem.shapes
    arrays = {"dy": _shaped("dy", dy, problem.output_shape())}
    if dh is not None:
        arrays["dh"] = _shaped("dh", dh, shapes.h_state)
    if dc is not None:
        arrays["dc"] = _shaped("dc", dc, shapes.c_state)
    if masks is not None:
        if len(masks) != problem.L - 1:
            raise ValueError(f"masks must be {problem.L - 1} arrays, got {len(masks)}")
        mask_shape = (problem.T, problem.B, problem.D * problem.P)
        arrays["dropout_masks"] = [_shaped(f"masks[{k}]", m, mask_shape)
                                   for k, m in enumerate(masks)]
    plan = _thread_plan() if plan is None else plan
    return plan._run_backward(problem, _block_reader(saved, problem), arrays,
                              tuple(bool(m) for m in output_mask))


def _shaped(name, array, shape):
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
    return array


def saved_views(saved, problem):
    """The parts of a saved block: name (``SAVED_NAMES``) -> ``[L*D, T, B, F]`` view (F is
    H, for h P)."""
    p = problem
    return dict(zip(SAVED_NAMES, saved_arrays(saved, p, by_step=True)))
