"""The frameworks lstmcy is compared with beside PyTorch: JAX and TensorFlow/Keras.

Each peer is one module with

``prepare(threads)``
    Import the framework with ``threads`` intra-op threads (and inter-op threads
    where it has them) and return a dict describing it (version, thread settings).
    Raises ``ImportError`` when the framework is not installed. Called once, before
    the framework runs anything: thread pools are sized when they are created.
``setup(case, inp)``
    Build the model with the case's weights (``inp`` from ``cases.make_inputs``)
    and return a :class:`PeerRun`.

PyTorch is not a module here: ``run.py`` always times it, it is the suite's
reference. :mod:`peers.check` compares a peer's results with lstmcy's before the
peer is timed.
"""
import importlib
from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["PeerRun", "MODULES", "CHOICES", "parse_peers", "load_peers", "install_hint"]

# name on the command line -> module implementing it
MODULES = {"jax": "peers.jax_lstm", "tf": "peers.keras_lstm"}
CHOICES = ("torch",) + tuple(MODULES)
_PACKAGES = {"jax": "jax jaxlib", "tf": "tensorflow-cpu (Keras 3 comes with it)"}


@dataclass
class PeerRun:
    """One peer's training pass on one case, as zero-argument callables.

    Attributes
    ----------
    forward : callable
        Training forward: the outputs, and whatever the framework keeps for its
        backward when it can hand that over (JAX's vjp residuals).
    forward_backward : callable
        Forward and gradients of every input and weight in one call (what a
        training step runs).
    backward : callable or None
        Gradients from a saved forward, when the framework can run them apart;
        ``None`` when it cannot (a GradientTape's backward runs with its forward).
    results : callable
        ``dict`` of numpy arrays: ``y`` ``[T, B, D*H]`` (padded), ``h_n``, ``c_n``
        ``[L*D, B, H]``, ``dx`` ``[T, B, I]``, ``dh0``, ``dc0`` and ``dparams`` (a list
        in PyTorch's flat order, see :func:`peers.layout.grads_to_torch`), for the
        cotangents ``dy``, ``dh``, ``dc`` of the case's inputs.
    label : str
        What runs, for the report (e.g. ``"keras.layers.LSTM in tf.function"``).
    """

    forward: Callable
    forward_backward: Callable
    backward: Optional[Callable]
    results: Callable
    label: str


def parse_peers(spec):
    """Peer names from ``--peers`` (comma-separated); ``torch`` is always included.

    Raises ``ValueError`` naming the valid choices for an unknown name.
    """
    names = [p.strip().lower() for p in (spec or "torch").split(",") if p.strip()]
    unknown = [n for n in names if n not in CHOICES]
    if unknown:
        raise ValueError(f"--peers: unknown {', '.join(unknown)}; choose from {', '.join(CHOICES)}")
    return ["torch"] + [n for n in MODULES if n in names]


def install_hint(name):
    return f"pip install -e '.[bench]' (or {_PACKAGES[name]})"


def load_peers(names, threads, modules=None):
    """Import and configure the peers in ``names`` other than ``torch``.

    Parameters
    ----------
    names : list of str
        From :func:`parse_peers`.
    threads : int
        Intra-op threads for each framework (the suite's thread count).
    modules : dict, optional
        ``name -> module path``; default :data:`MODULES` (tests substitute fakes).

    Returns
    -------
    loaded : dict
        ``name -> (module, info)`` for each peer that imported.
    skipped : dict
        ``name -> reason`` for each that did not (not installed, or failed to start).
    """
    modules = MODULES if modules is None else modules
    loaded, skipped = {}, {}
    for name in names:
        if name == "torch":
            continue
        try:
            module = importlib.import_module(modules[name])
            info = module.prepare(threads)
        except ImportError as exc:
            hint = install_hint(name) if name in _PACKAGES else "install it"
            skipped[name] = f"not installed ({exc}); {hint}"
            continue
        loaded[name] = (module, info)
    return loaded, skipped
