"""Cross-check of a peer's outputs and gradients against lstmcy's, before any timing.

A peer computes the same training pass as lstmcy (same data, weights and
cotangents). Its results count only when every output and gradient agrees with
lstmcy's to within :data:`TOLERANCE` of the array's largest magnitude; a peer that
disagrees is reported and not timed, so a mapping error (gate order, a bias, a
transposed kernel, a direction or a mask) cannot pass as a speed result.
"""
import math

import numpy as np

from .layout import padded_to_packed

__all__ = ["TOLERANCE", "lstmcy_results", "cross_check", "rel_err"]

# max |peer - lstmcy| / max |lstmcy| allowed per array. lstmcy agrees with PyTorch to
# about 3e-6 (float32) and 7e-15 (float64) on the suite's shapes.
TOLERANCE = {"float32": 1e-4, "float64": 1e-11}

_ARRAYS = ("y", "h_n", "c_n", "dx", "dh0", "dc0")
_PARAM_NAMES = ("dW_ih", "dW_hh", "db_ih", "db_hh")


def lstmcy_results(forward, backward):
    """lstmcy's outputs and gradients as the dict :class:`peers.PeerRun` ``results`` returns.

    ``forward`` and ``backward`` are ``run.py``'s lstmcy closures (``lstm_forward(train=True)``
    and ``lstm_backward`` with the case's cotangents); for a packed case ``y`` and
    ``dx`` are in PackedSequence row order.
    """
    y, h_n, c_n, _ = forward()
    dx, dh0, dc0, dparams = backward()
    return {"y": y, "h_n": h_n, "c_n": c_n, "dx": dx, "dh0": dh0, "dc0": dc0,
            "dparams": list(dparams)}


def _param_label(index, num_directions):
    slot, k = divmod(index, 4)
    layer, direction = divmod(slot, num_directions)
    return f"{_PARAM_NAMES[k]}[layer {layer}{', reverse' if direction else ''}]"


def rel_err(ours, theirs):
    """``max|theirs - ours| / max|ours|`` and a problem (a shape mismatch) or None."""
    ours = np.asarray(ours, dtype=np.float64)
    theirs = np.asarray(theirs, dtype=np.float64)
    if ours.shape != theirs.shape:
        return math.inf, f"shape {theirs.shape}, lstmcy's {ours.shape}"
    scale = max(float(np.abs(ours).max(initial=0.0)), 1e-300)
    err = float(np.abs(theirs - ours).max(initial=0.0)) / scale
    return (math.inf if math.isnan(err) else err), None


def cross_check(case, inp, ours, theirs, tolerance=None):
    """Compare a peer's results with lstmcy's.

    Parameters
    ----------
    case : cases.Case
    inp : dict
        ``cases.make_inputs(case)`` (its ``lengths`` map padded rows to packed ones).
    ours : dict
        :func:`lstmcy_results`.
    theirs : dict
        The peer's ``PeerRun.results()`` (padded ``y`` and ``dx``).
    tolerance : float, optional
        Default :data:`TOLERANCE` of the case's dtype.

    Returns
    -------
    dict
        ``ok`` (bool), ``max_rel_err``, ``worst`` (the array with the largest error),
        ``tolerance``, ``errors`` (per array) and ``problems`` (shape mismatches,
        missing arrays).
    """
    tol = TOLERANCE[case.dtype] if tolerance is None else tolerance
    theirs = dict(theirs)
    if case.packed:
        for key in ("y", "dx"):
            if key in theirs:
                theirs[key] = padded_to_packed(theirs[key], inp["lengths"])
    errors, problems = {}, []
    pairs = [(key, ours[key], theirs.get(key)) for key in _ARRAYS]
    their_params = list(theirs.get("dparams") or [])
    if len(their_params) != len(ours["dparams"]):
        problems.append(f"dparams: {len(their_params)} arrays, lstmcy has {len(ours['dparams'])}")
    pairs += [(_param_label(i, case.D), a, their_params[i] if i < len(their_params) else None)
              for i, a in enumerate(ours["dparams"])]
    for key, a, b in pairs:
        if b is None:
            errors[key] = math.inf
            problems.append(f"{key}: missing")
            continue
        errors[key], problem = rel_err(a, b)
        if problem:
            problems.append(f"{key}: {problem}")
    worst = max(errors, key=errors.get)
    return {"ok": errors[worst] <= tol and not problems, "max_rel_err": errors[worst], "worst": worst,
            "tolerance": tol, "errors": errors, "problems": problems}
