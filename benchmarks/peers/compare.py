"""The peers in one benchmark case: cross-check, what to time, ratios and targets.

``run.py`` calls :func:`setup_case` before timing (a peer that fails the
cross-check is not timed) and :func:`summarise` on the medians. Ratios are
"peer time / lstmcy time" (above 1: lstmcy is faster), measured in the same
interleaved rounds as the rest of the case. Forward+backward is the headline: a
training step's gradients, ``lstmcy_fwdbwd`` against ``<peer>_fwdbwd``.
"""
from .check import cross_check

__all__ = ["setup_case", "summarise", "TARGET_SOURCE"]

TARGET_SOURCE = "ahead of each peer on every shape"


def setup_case(case, inp, loaded, ours):
    """Build and cross-check each loaded peer on one case.

    Parameters
    ----------
    case, inp
        The case and ``cases.make_inputs(case)``.
    loaded : dict
        ``name -> (module, info)`` from :func:`peers.load_peers`.
    ours : dict
        lstmcy's results, :func:`peers.check.lstmcy_results`.

    Returns
    -------
    functions : dict
        ``<peer>_fwd``, ``<peer>_fwdbwd`` and, where the peer has one,
        ``<peer>_bwd``, for the peers that passed the cross-check.
    status : dict
        Per peer: ``status`` (``"ran"``, ``"failed cross-check"`` or ``"error"``),
        ``label``, ``check`` (:func:`peers.check.cross_check`) or ``error``.
    """
    functions, status = {}, {}
    for name, (module, _info) in loaded.items():
        try:
            run = module.setup(case, inp)
            check = cross_check(case, inp, ours, run.results())
        except Exception as exc:  # noqa: BLE001  (a framework failing on one case is reported; the suite goes on)
            status[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            continue
        status[name] = {"status": "ran" if check["ok"] else "failed cross-check", "label": run.label,
                        "check": check}
        if check["ok"]:
            functions[f"{name}_fwd"] = run.forward
            functions[f"{name}_fwdbwd"] = run.forward_backward
            if run.backward is not None:
                functions[f"{name}_bwd"] = run.backward
    return functions, status


def summarise(result, medians):
    """Peer ratios, derived backward times, GF/s and targets into ``result``.

    ``result["peers"]`` says which peers ran; PyTorch's forward+backward
    (``torch_fwdbwd``) is compared like a peer's. A peer without a separate
    backward gets ``(forward+backward) - forward`` in ``result["derived_times"]``.
    """
    ratios, gflops, flops = result["ratios"], result["gflops"], result["flops"]
    derived, targets = {}, []
    ran = ["torch"] + [name for name, s in result["peers"].items() if s["status"] == "ran"]
    for name in ran:
        ratio = medians[f"{name}_fwdbwd"] / medians["lstmcy_fwdbwd"]
        ratios[f"{name}_fwdbwd_ratio"] = ratio
        targets.append({"metric": f"{name}_fwdbwd_ratio", "min": 1.0, "measured": ratio,
                        "met": bool(ratio > 1.0), "source": TARGET_SOURCE})
        if name == "torch":  # its backward and forward ratios are the suite's bwd_ratio / fwd_ratio
            continue
        ratios[f"{name}_fwd_ratio"] = medians[f"{name}_fwd"] / medians["lstmcy_fwd"]
        backward = medians.get(f"{name}_bwd")
        if backward is None:
            backward = medians[f"{name}_fwdbwd"] - medians[f"{name}_fwd"]
            backward = backward if backward > 0 else None  # noise can exceed a short backward
            derived[f"{name}_bwd"] = backward
            if backward is not None:
                gflops[f"{name}_bwd"] = flops["bwd"] / backward / 1e9
        ratios[f"{name}_bwd_ratio"] = None if backward is None else backward / medians["lstmcy_bwd"]
    result["derived_times"] = derived
    result["peer_targets"] = targets
