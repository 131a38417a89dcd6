"""PyTorch oracle and problem generator shared by the lstmcy test modules.

:func:`torch_lstm` evaluates ``torch._VF.lstm`` (or its packed overload when
``batch_sizes`` is given) on the same arguments as :func:`lstmcy.lstm_forward` /
:func:`lstmcy.lstm_backward` and differentiates it with autograd, by default in
float64. Dropout is reproduced exactly: with ``dropout_masks`` the layers are run
as single-layer torch calls and each layer's output is multiplied by the recorded
mask before entering the next one.

:func:`make_case` draws a random problem (input, states, parameters and output
gradients) in any of the four layouts lstmcy accepts.

For the tests of :mod:`lstmcy.torch`: :func:`module_pair` builds an
``lstmcy.torch.LSTM`` and a ``torch.nn.LSTM`` with the same weights,
:func:`random_states` initial states for them and :func:`assert_close` compares tensors.
"""

import contextlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch

__all__ = ["LAYOUTS", "Case", "OracleResult", "make_case", "make_params", "param_names",
           "lengths_to_batch_sizes", "packed_index", "torch_lstm", "run_lstmcy",
           "output_names", "as_f64", "assert_close", "module_pair", "random_states",
           "single_torch_thread", "norm_rel_err", "assert_no_worse_than"]

#: Layouts of the sequence tensors (input, y, dy, dx).
LAYOUTS = ("time_major", "batch_first", "packed", "padded_2d")


def as_f64(array):
    """``array`` (numpy, any float dtype incl. ml_dtypes.bfloat16) as a float64 ndarray."""
    return np.asarray(array).astype(np.float64)


def norm_rel_err(actual, expected):
    """Norm-wise relative error ``||actual - expected|| / ||expected||`` (absolute if
    ``expected`` is all 0)."""
    actual, expected = as_f64(actual), as_f64(expected)
    assert actual.shape == expected.shape
    scale = np.linalg.norm(expected.ravel())
    err = np.linalg.norm((actual - expected).ravel())
    return float(err / scale) if scale > 0 else float(err)


def assert_no_worse_than(ours, theirs, exact, what, factor=1.05, below=None):
    """Each output's norm-wise relative error against ``exact`` is at most ``factor``
    times that of ``theirs`` (and below ``below``, if given); dicts name -> array. The
    failure message lists every output that is not."""
    errors = {name: (norm_rel_err(ours[name], exact[name]), norm_rel_err(theirs[name], exact[name]))
              for name in exact}
    bad = {name: f"ours {e:.3g} vs theirs {t:.3g}" for name, (e, t) in errors.items()
           if not (e <= factor * t and (below is None or e < below))}
    assert not bad, f"{what}: error above {factor:g}x theirs" + (
        f" or not below {below:.3g}" if below is not None else "") + f" in {bad}"


def param_names(num_layers, bidirectional, has_bias):
    """Names of the flat parameter list, as ``torch.nn.LSTM`` names them."""
    names = []
    for layer in range(num_layers):
        for direction in range(2 if bidirectional else 1):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            kinds = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if has_bias \
                else ("weight_ih", "weight_hh")
            names += [kind + suffix for kind in kinds]
    return names


def output_names(case):
    """Names of every forward and backward output, in comparison order."""
    return ["y", "h_n", "c_n", "dx", "dh_prev", "dc_prev"] + param_names(
        case.num_layers, case.bidirectional, case.has_bias)


def lengths_to_batch_sizes(lengths):
    """int64 PackedSequence batch sizes of sequence lengths (any order)."""
    lengths = np.asarray(lengths)
    return np.array([(lengths > t).sum() for t in range(int(lengths.max(initial=0)))],
                    dtype=np.int64)


def packed_index(batch_sizes, batch):
    """Rows of a padded time-major ``[T*B, F]`` array that form the packed ``[N, F]`` one."""
    return np.concatenate([t * batch + np.arange(n) for t, n in enumerate(batch_sizes)]
                          + [np.zeros(0, dtype=np.int64)]).astype(np.int64)


def make_params(rng, num_layers, num_directions, input_size, hidden, has_bias, dtype=np.float64):
    """Random flat parameter list in ``nn.LSTM`` order (float64 values cast to ``dtype``)."""
    params = []
    for layer in range(num_layers):
        layer_input = input_size if layer == 0 else num_directions * hidden
        for _ in range(num_directions):
            params.append(rng.uniform(-0.8, 0.8, (4 * hidden, layer_input)))
            params.append(rng.uniform(-0.8, 0.8, (4 * hidden, hidden)))
            if has_bias:
                params.append(rng.uniform(-0.5, 0.5, 4 * hidden))
                params.append(rng.uniform(-0.5, 0.5, 4 * hidden))
    return [p.astype(dtype) for p in params]


@dataclass
class Case:
    """One random problem: arguments of lstm_forward / lstm_backward and output gradients."""

    x: np.ndarray
    h0: np.ndarray
    c0: np.ndarray
    params: list
    dy: np.ndarray
    dh: np.ndarray
    dc: np.ndarray
    num_layers: int
    bidirectional: bool
    has_bias: bool
    layout: str
    batch_sizes: np.ndarray = None
    dropout: float = 0.0
    seed: int = 0
    T: int = 0
    B: int = 0
    H: int = 0

    @property
    def batch_first(self):
        return self.layout == "batch_first"

    @property
    def hx(self):
        return (self.h0, self.c0)

    def kwargs(self):
        """Keyword arguments shared by lstm_forward and lstm_backward (besides dropout)."""
        return dict(has_bias=self.has_bias, num_layers=self.num_layers,
                    bidirectional=self.bidirectional, batch_first=self.batch_first,
                    batch_sizes=self.batch_sizes)

    def arrays(self):
        """Name -> array of every input array (x, h0, c0, params[k], dy, dh, dc)."""
        named = {"x": self.x, "h0": self.h0, "c0": self.c0}
        named.update({f"params[{k}]": p for k, p in enumerate(self.params)})
        named.update({"dy": self.dy, "dh": self.dh, "dc": self.dc})
        return named

    def valid_rows(self):
        """Boolean mask over the rows/positions of x, y that are real (not padding)."""
        if self.layout != "padded_2d":
            return np.ones(self.x.shape[:-1], dtype=bool)
        mask = np.zeros(self.T * self.B, dtype=bool)
        mask[packed_index(self.batch_sizes, self.B)] = True
        return mask


def make_case(seed, *, T=5, B=3, I=4, H=5, num_layers=1, bidirectional=False, has_bias=True,
              layout="time_major", dropout=0.0, dtype=np.float64, lengths=None,
              grad_scale_decades=0.0):
    """Draw a random problem.

    Parameters
    ----------
    seed : int
        Seed of everything random (also passed to lstm_forward for the dropout masks).
    T, B, I, H : int
        Sizes. For the variable-length layouts T is the longest length.
    layout : {"time_major", "batch_first", "packed", "padded_2d"}
        ``packed``: 2-D ``[sum(batch_sizes), I]``; ``padded``: 2-D ``[T*B, I]`` time-major
        with garbage (large random numbers) at the padded positions of x and dy.
    lengths : sequence of int, optional
        Sequence lengths for the variable-length layouts; default random in [1, T] with the
        first one T and (when B > 1) the last one shorter than T, sorted decreasing.
    grad_scale_decades : float
        dy, dh and dc get random signs and magnitudes ``10**U(-d, d)``.
    """
    rng = np.random.default_rng(seed)
    D = 2 if bidirectional else 1
    L = num_layers
    batch_sizes = None
    if layout in ("packed", "padded_2d"):
        if lengths is None:
            lengths = rng.integers(1, T + 1, size=B)
            if B:
                lengths[0] = T
            if B > 1 and T > 1:
                lengths[-1] = rng.integers(1, T)
        lengths = np.sort(np.asarray(lengths))[::-1]
        batch_sizes = lengths_to_batch_sizes(lengths)
        T = len(batch_sizes)

    def grads(shape):
        values = rng.standard_normal(shape)
        if grad_scale_decades:
            values *= 10.0 ** rng.uniform(-grad_scale_decades, grad_scale_decades, shape)
        return values

    x_tm = rng.standard_normal((T, B, I))
    dy_tm = grads((T, B, D * H))
    if layout == "time_major":
        x, dy = x_tm, dy_tm
    elif layout == "batch_first":
        x, dy = x_tm.transpose(1, 0, 2).copy(), dy_tm.transpose(1, 0, 2).copy()
    else:
        idx = packed_index(batch_sizes, B)
        x_rows, dy_rows = x_tm.reshape(T * B, I), dy_tm.reshape(T * B, D * H)
        if layout == "packed":
            x, dy = x_rows[idx].copy(), dy_rows[idx].copy()
        else:
            pad = np.ones(T * B, dtype=bool)
            pad[idx] = False
            x, dy = x_rows.copy(), dy_rows.copy()
            # Garbage where nothing is read: the result must not depend on it.
            # (drawn from a separate stream so that the other values equal the packed case's).
            garbage = np.random.default_rng([seed, 1])
            x[pad] = garbage.standard_normal((pad.sum(), I)) * 1e3
            dy[pad] = garbage.standard_normal((pad.sum(), D * H)) * 1e3
    h0 = rng.standard_normal((L * D, B, H))
    c0 = rng.standard_normal((L * D, B, H))
    params = make_params(rng, L, D, I, H, has_bias)
    dh = grads((L * D, B, H))
    dc = grads((L * D, B, H))
    cast = [a.astype(dtype) for a in (x, h0, c0, dy, dh, dc)]
    x, h0, c0, dy, dh, dc = cast
    return Case(x=x, h0=h0, c0=c0, params=[p.astype(dtype) for p in params], dy=dy, dh=dh, dc=dc,
                num_layers=L, bidirectional=bidirectional, has_bias=has_bias, layout=layout,
                batch_sizes=batch_sizes, dropout=dropout, seed=seed, T=T, B=B, H=H)


@dataclass
class OracleResult:
    """Forward outputs and gradients, as float64 numpy arrays in lstmcy's layouts."""

    y: np.ndarray
    h_n: np.ndarray
    c_n: np.ndarray
    dx: np.ndarray = None
    dh_prev: np.ndarray = None
    dc_prev: np.ndarray = None
    dparams: list = None

    def named(self, case):
        """Name -> array, in :func:`output_names` order (only what is present)."""
        out = {"y": self.y, "h_n": self.h_n, "c_n": self.c_n}
        if self.dx is not None:
            out.update(dx=self.dx, dh_prev=self.dh_prev, dc_prev=self.dc_prev)
            out.update(zip(param_names(case.num_layers, case.bidirectional, case.has_bias),
                           self.dparams))
        return out


@contextlib.contextmanager
def _single_thread():
    """Run torch on one thread: the problems are tiny, and on a loaded machine torch's
    OpenMP threads spin against each other (and against OpenBLAS), making a call that takes
    milliseconds take seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _tensor(array, dtype, requires_grad=False):
    t = torch.tensor(as_f64(array), dtype=torch.float64).to(dtype)
    return t.requires_grad_(requires_grad)


def torch_lstm(input, hx, params, *, dy=None, dh=None, dc=None, has_bias=True, num_layers=1,
               bidirectional=False, batch_first=False, batch_sizes=None, dropout_masks=None,
               dtype=torch.float64):
    """Forward (and, given dy/dh/dc, backward) of PyTorch's LSTM on lstmcy's arguments.

    Parameters
    ----------
    input, hx, params, has_bias, num_layers, bidirectional, batch_first, batch_sizes
        As for :func:`lstmcy.lstm_forward`, numpy arrays of any float dtype. 2-D ``input``
        with ``batch_sizes`` is packed (``sum(batch_sizes)`` rows) or padded time-major
        (``T*B`` rows; converted to packed for torch, padded rows of ``y`` and ``dx`` are 0
        and padded rows of ``dy`` are ignored). ``hx`` None means zeros.
    dy, dh, dc : ndarray, optional
        Output gradients; when ``dy`` is given the gradients are computed (dh/dc None mean
        zeros).
    dropout_masks : list of ndarray, optional
        ``L - 1`` masks ``[T, B, D*H]`` (time-major) multiplying each layer's output before
        the next layer; the layers are then run as separate single-layer calls.
    dtype : torch.dtype
        Precision torch computes in (the values are rounded to it first).

    Returns
    -------
    OracleResult
        float64 numpy arrays (dparams in ``params`` order).
    """
    with _single_thread():
        return _torch_lstm(input, hx, params, dy=dy, dh=dh, dc=dc, has_bias=has_bias,
                           num_layers=num_layers, bidirectional=bidirectional,
                           batch_first=batch_first, batch_sizes=batch_sizes,
                           dropout_masks=dropout_masks, dtype=dtype)


def _torch_lstm(input, hx, params, *, dy, dh, dc, has_bias, num_layers, bidirectional,
                batch_first, batch_sizes, dropout_masks, dtype):
    D = 2 if bidirectional else 1
    L = num_layers
    x_np = as_f64(input)
    params_t = [_tensor(p, dtype, True) for p in params]
    H = params_t[1].shape[1]
    packed = batch_sizes is not None
    if packed:
        bs = np.asarray(batch_sizes, dtype=np.int64)
        T, B = len(bs), int(bs[0])
        n_rows = int(bs.sum())
        padded = x_np.shape[0] != n_rows or x_np.ndim == 3
        bs_t = torch.tensor(bs, dtype=torch.int64)
        row_index = torch.tensor(packed_index(bs, B))
    elif batch_first:
        B, T = x_np.shape[:2]
    else:
        T, B = x_np.shape[:2]

    x_leaf = _tensor(x_np, dtype, True)
    if packed and padded:
        x_in = x_leaf.reshape(T * B, -1).index_select(0, row_index)
    else:
        x_in = x_leaf
    if hx is None:
        h0 = torch.zeros((L * D, B, H), dtype=dtype, requires_grad=True)
        c0 = torch.zeros((L * D, B, H), dtype=dtype, requires_grad=True)
    else:
        h0, c0 = _tensor(hx[0], dtype, True), _tensor(hx[1], dtype, True)

    def call(inp, h, c, weights, layers):
        if packed:
            return torch._VF.lstm(inp, bs_t, (h, c), weights, has_bias, layers, 0.0, True,
                                  bidirectional)
        return torch._VF.lstm(inp, (h, c), weights, has_bias, layers, 0.0, True, bidirectional,
                              batch_first)

    if dropout_masks is None or L == 1:
        y, h_n, c_n = call(x_in, h0, c0, params_t, L)
    else:
        per_layer = len(params_t) // L
        layer_in, hs, cs = x_in, [], []
        for layer in range(L):
            states = slice(layer * D, (layer + 1) * D)
            weights = params_t[layer * per_layer:(layer + 1) * per_layer]
            y, h_l, c_l = call(layer_in, h0[states], c0[states], weights, 1)
            hs.append(h_l)
            cs.append(c_l)
            if layer < L - 1:
                mask = as_f64(dropout_masks[layer])  # [T, B, D*H]
                if packed:
                    mask = mask.reshape(T * B, D * H)[packed_index(bs, B)]
                elif batch_first:
                    mask = mask.transpose(1, 0, 2)
                layer_in = y * _tensor(mask, dtype)
        h_n, c_n = torch.cat(hs), torch.cat(cs)

    if packed and padded:
        y = torch.zeros((T * B, D * H), dtype=dtype).index_copy(0, row_index, y)
        if x_np.ndim == 3:
            y = y.reshape(T, B, D * H)
    result = OracleResult(*(t.detach().to(torch.float64).numpy() for t in (y, h_n, c_n)))
    if dy is None:
        return result

    def grad_or_zero(value, like):
        return torch.zeros_like(like) if value is None else _tensor(value, dtype)

    leaves = [x_leaf, h0, c0] + params_t
    grads = torch.autograd.grad(
        [y, h_n, c_n], leaves,
        [grad_or_zero(dy, y), grad_or_zero(dh, h_n), grad_or_zero(dc, c_n)],
        allow_unused=True)
    grads = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves)]
    grads = [g.detach().to(torch.float64).numpy() for g in grads]
    result.dx, result.dh_prev, result.dc_prev = grads[:3]
    result.dparams = grads[3:]
    return result


def run_lstmcy(module, case, *, dtype=None, output_mask=(True, True, True, True), hx="case"):
    """Forward and backward of ``module`` (lstmcy or lstmcy.reference) on ``case``.

    Returns ``(OracleResult-like of float64 arrays, cache, raw)``, where ``raw`` holds the
    arrays as returned (in the input dtype).
    """
    hx = case.hx if hx == "case" else hx
    kw = case.kwargs()
    y, h_n, c_n, cache = module.lstm_forward(case.x, hx, case.params, dropout=case.dropout,
                                             seed=case.seed, **kw)
    masks = cache.dropout_masks
    dx, dh_prev, dc_prev, dparams = module.lstm_backward(
        case.x, hx, case.params, case.dy, case.dh, case.dc, *cache.saved(), dropout=case.dropout,
        dropout_masks=masks, output_mask=output_mask, **kw)
    raw = OracleResult(y, h_n, c_n, dx, dh_prev, dc_prev, dparams)
    conv = OracleResult(as_f64(y), as_f64(h_n), as_f64(c_n),
                        None if dx is None else as_f64(dx),
                        None if dh_prev is None else as_f64(dh_prev),
                        None if dc_prev is None else as_f64(dc_prev),
                        None if dparams is None else [as_f64(p) for p in dparams])
    return conv, cache, raw


# ---------------------------------------------------------------------------
# module pairs: lstmcy.torch.LSTM against torch.nn.LSTM on the same weights
# ---------------------------------------------------------------------------

def assert_close(actual, desired, rtol=1e-10, what=""):
    """Max-norm relative comparison of two tensors: ``|a - d| <= rtol * max|d|``."""
    assert actual is not None and desired is not None, what
    actual = actual.detach().double().numpy()
    desired = desired.detach().double().numpy()
    assert actual.shape == desired.shape, (what, actual.shape, desired.shape)
    scale = float(np.max(np.abs(desired))) if desired.size else 0.0
    np.testing.assert_allclose(actual, desired, rtol=0, atol=rtol * max(scale, 1e-300),
                               err_msg=what)


def module_pair(input_size=3, hidden_size=4, dtype=torch.float64, seed=0, **kwargs):
    """An ``lstmcy.torch.LSTM`` and a ``torch.nn.LSTM`` holding the same random weights."""
    from lstmcy.torch import LSTM

    torch.manual_seed(seed)
    ours = LSTM(input_size, hidden_size, dtype=dtype, **kwargs)
    ref = torch.nn.LSTM(input_size, hidden_size, dtype=dtype, **kwargs)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def random_states(module, batch, seed=1, requires_grad=True, dtype=torch.float64):
    """Random ``(h0, c0)`` for ``module`` and a batch of ``batch`` sequences."""
    gen = torch.Generator().manual_seed(seed)
    layers = module.num_layers * (2 if module.bidirectional else 1)
    h_size = module.proj_size or module.hidden_size
    return (torch.randn((layers, batch, h_size), generator=gen, dtype=dtype)
            .requires_grad_(requires_grad),
            torch.randn((layers, batch, module.hidden_size), generator=gen, dtype=dtype)
            .requires_grad_(requires_grad))


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread():
    """Tiny problems: torch's thread pool only adds start-up (and, on a busy machine,
    oversubscription) cost, which made these tests slow and erratic. (Autouse in every
    test module that imports it.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
