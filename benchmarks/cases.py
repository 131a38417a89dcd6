"""The benchmark cases: shapes, inputs, FLOP counts and targets.

A :class:`Case` is one LSTM configuration ``(T, B, I, H, L)`` plus direction count,
dtype and whether the batch has variable lengths. :func:`make_inputs` builds the
numpy arrays; ``run.py`` copies the same parameters into a ``torch.nn.LSTM``.

Targets are "torch time / lstmcy time" ratios (higher is better for lstmcy) and
efficiencies (achieved GF/s over the GEMM peak measured in the same run).
"""
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import numpy as np

__all__ = ["Case", "CASES", "select_cases", "make_inputs", "backward_flops", "forward_flops",
           "lengths_spread"]


@dataclass(frozen=True)
class Case:
    """One benchmark configuration: sequence length ``T``, batch ``B``, input size ``I``,
    hidden size ``H`` and layers ``L``, and what goes with them."""

    name: str  # unique, selected by --shapes
    T: int
    B: int
    I: int
    H: int
    L: int = 1
    bidirectional: bool = False
    dtype: str = "float32"
    packed: bool = False  # a variable-length batch: lengths spread 1..T, PackedSequence layout
    group: str = "small"  # "tiny", "small" or "large": which targets apply
    quick: bool = False  # part of the --quick subset
    # metric -> (minimum, source); the metrics are bwd_ratio, fwd_ratio, bwd_efficiency,
    # packed_vs_torch_packed and packed_vs_own_padded
    targets: dict = field(default_factory=dict, hash=False, compare=False)
    note: str = ""  # where the shape comes from

    @property
    def D(self):
        return 2 if self.bidirectional else 1

    @property
    def shape_label(self):
        bi = " bi" if self.bidirectional else ""
        return f"({self.T},{self.B},{self.I},{self.H},{self.L}){bi}"


# Where a target comes from: the suite's per-shape targets, and the headline (ahead of
# PyTorch on every shape).
SUITE = "suite"
HEADLINE = "headline (ahead of PyTorch on every shape)"

# (name, T, B, I, H, L, group, fp32 bwd target, fp64 bwd target, note, in quick subset)
_BASE = [
    ("tiny", 20, 1, 16, 32, 1, "tiny", 5.0, 12.0, "", True),
    ("small-32x16", 32, 16, 32, 64, 1, "small", 1.3, 3.0, "", False),
    ("small-50x8", 50, 8, 64, 64, 1, "small", 1.5, 3.5, "", False),
    ("small-50x32", 50, 32, 64, 128, 1, "small", 1.0, 2.5, "", True),
    ("braun", 100, 64, 125, 320, 1, "large", 0.9, None, "Braun 2018 rnn benchmark", False),
    ("large-256", 50, 64, 256, 256, 1, "large", 0.9, None, "", False),
    ("deepbench-512", 25, 32, 512, 512, 1, "large", 0.9, None, "DeepBench-style", True),
    ("ptb-medium", 35, 20, 650, 650, 2, "large", 0.9, None, "PTB medium", False),
]


def _build_cases():
    cases = []
    for name, T, B, I, H, L, group, t32, t64, note, quick in _BASE:
        targets = {"bwd_ratio": (t32, SUITE)}
        if group == "large":
            targets["bwd_efficiency"] = (0.80, SUITE)
            targets["fwd_ratio"] = (0.9, SUITE)
        else:
            # "faster than PyTorch's training forward on the small shapes"
            targets["fwd_ratio"] = (1.0, SUITE)
        cases.append(Case(name, T, B, I, H, L, group=group, quick=quick, targets=targets, note=note))
    for name, T, B, I, H, L, group, t32, t64, note, quick in _BASE:
        if t64 is not None:
            targets = {"bwd_ratio": (t64, SUITE)}
        else:
            targets = {"bwd_ratio": (1.0, HEADLINE)}
        cases.append(Case(name + "-f64", T, B, I, H, L, dtype="float64", group=group,
                          quick=quick and name in ("tiny", "small-50x32"), targets=targets, note=note))
    cases.append(Case("bidir2-small", 50, 32, 64, 128, 2, bidirectional=True, group="small", quick=True,
                      targets={"bwd_ratio": (1.0, HEADLINE)}, note="bidirectional 2-layer"))
    cases.append(Case("bidir2-large", 50, 64, 256, 256, 2, bidirectional=True, group="large",
                      targets={"bwd_ratio": (0.9, SUITE + " (large shapes)"),
                               "bwd_efficiency": (0.80, SUITE + " (large shapes)")},
                      note="bidirectional 2-layer"))
    packed_targets = {"packed_vs_torch_packed": (4.0, SUITE), "packed_vs_own_padded": (1.0, SUITE)}
    cases.append(Case("packed-small", 50, 32, 64, 128, 1, packed=True, group="small", quick=True,
                      targets=dict(packed_targets), note="lengths spread 1..T"))
    cases.append(Case("packed-large", 50, 64, 256, 256, 1, packed=True, group="large",
                      targets=dict(packed_targets), note="lengths spread 1..T"))
    return cases


CASES = _build_cases()


def select_cases(patterns=None, quick=False):
    """Cases selected by comma-separated ``patterns``, in suite order.

    A pattern that is a case name selects exactly that case; one with ``*?[`` is a
    glob; any other selects the names containing it (``f64``, ``packed``).
    ``quick`` keeps only the quick subset (before filtering).
    """
    cases = [c for c in CASES if c.quick] if quick else list(CASES)
    if not patterns:
        return cases
    names = {c.name for c in cases}
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]

    def matches(name, pattern):
        if pattern in names:  # an exact case name selects that case only
            return name == pattern
        if any(ch in pattern for ch in "*?["):
            return fnmatchcase(name, pattern)
        return pattern in name

    chosen = [c for c in cases if any(matches(c.name, p) for p in wanted)]
    if not chosen:
        listed = ", ".join(c.name for c in cases)
        raise SystemExit(f"--shapes {patterns!r} matches no case; cases are: {listed}")
    return chosen


def lengths_spread(T, B):
    """``B`` sequence lengths spread evenly over ``1..T``, sorted longest first."""
    if B == 1:
        return np.array([T], dtype=np.int64)
    return np.rint(np.linspace(T, 1, B)).astype(np.int64)


def _layer_inputs(case):
    return [case.I if layer == 0 else case.D * case.H for layer in range(case.L)]


def backward_flops(case, padded=False):
    """``16 T B H (I_l + H)`` per layer and direction (the GEMMs only).

    For a packed case ``T*B`` is replaced by the number of real tokens, unless
    ``padded`` (the same shape run as a full ``T x B`` batch).
    """
    packed = case.packed and not padded
    tokens = int(lengths_spread(case.T, case.B).sum()) if packed else case.T * case.B
    return sum(16 * tokens * case.H * (i + case.H) * case.D for i in _layer_inputs(case))


def forward_flops(case, padded=False):
    """``8 T B H (I_l + H)`` per layer and direction (the gate GEMMs)."""
    return backward_flops(case, padded) // 2


def make_inputs(case, seed=0):
    """Inputs for one case, numpy arrays of the case's dtype (no torch needed): ``x``
    ``[T, B, I]`` (zero beyond each length when packed), ``h0``, ``c0`` ``[L*D, B, H]``,
    ``params`` (drawn like ``torch.nn.LSTM``'s initialisation, uniform in
    ``[-1/sqrt(H), 1/sqrt(H)]``), ``dy`` ``[T, B, D*H]`` (zero beyond each length), ``dh``,
    ``dc``; for packed cases also ``lengths``, ``batch_sizes``, ``x_packed`` ``[N, I]`` and
    ``dy_packed`` ``[N, D*H]`` (PyTorch's packed row order)."""
    dtype = np.dtype(case.dtype)
    rng = np.random.default_rng(seed)
    T, B, D, H = case.T, case.B, case.D, case.H
    bound = 1.0 / np.sqrt(H)
    params = []
    for in_size in _layer_inputs(case):
        for _ in range(D):
            for shape in ((4 * H, in_size), (4 * H, H), (4 * H,), (4 * H,)):
                params.append(rng.uniform(-bound, bound, shape).astype(dtype))
    out = {
        "x": rng.standard_normal((T, B, case.I)).astype(dtype),
        "h0": (0.5 * rng.standard_normal((case.L * D, B, H))).astype(dtype),
        "c0": (0.5 * rng.standard_normal((case.L * D, B, H))).astype(dtype),
        "params": params,
        "dy": rng.standard_normal((T, B, D * H)).astype(dtype),
        "dh": rng.standard_normal((case.L * D, B, H)).astype(dtype),
        "dc": rng.standard_normal((case.L * D, B, H)).astype(dtype),
    }
    if case.packed:
        lengths = lengths_spread(T, B)
        batch_sizes = np.array([(lengths > t).sum() for t in range(T)], dtype=np.int64)
        active = np.arange(T)[:, None] < lengths[None, :]  # [T, B]
        out["x"] *= active[:, :, None]
        out["dy"] *= active[:, :, None]
        # PackedSequence rows: step by step, the active sequences in batch order.
        out.update(lengths=lengths, batch_sizes=batch_sizes,
                   x_packed=np.ascontiguousarray(out["x"][active]),
                   dy_packed=np.ascontiguousarray(out["dy"][active]))
    return out


def lstm_kwargs(case):
    """Keyword arguments shared by lstmcy's forward and backward for ``case``."""
    return dict(num_layers=case.L, bidirectional=case.bidirectional, has_bias=True)


def training_pass(case, inputs, plan):
    """The training forward and the backward of ``case`` on its padded ``inputs``, through
    ``plan`` (an ``lstmcy.LSTMPlan``)."""
    kw = lstm_kwargs(case)
    hx = (inputs["h0"], inputs["c0"])
    cache = plan.forward(inputs["x"], hx, inputs["params"], **kw)[3]
    plan.backward(inputs["x"], hx, inputs["params"], inputs["dy"], inputs["dh"], inputs["dc"],
                  *cache.saved(), **kw)
