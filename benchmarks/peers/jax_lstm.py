"""JAX peer: an LSTM as ``jax.lax.scan`` over a fused-gate cell, ``jax.jit``, gradients by ``jax.vjp``.

Each layer and direction projects the whole input sequence with one GEMM
(``x @ kernel + bias``, ``[T, B, 4H]``), then scans the recurrence: one
``h @ recurrent_kernel`` per step, the four gates as slices of one ``[B, 4H]``
block (order i, f, g, o, see :mod:`peers.layout`). A variable-length batch runs
the same scan with a ``[T, B, 1]`` mask: outside a sequence the state is carried
unchanged and the output is zero, so the reverse direction starts at each
sequence's last step, as PyTorch's PackedSequence does. Layers and the two
directions are Python loops unrolled at trace time.

``forward`` is ``jax.vjp`` under ``jax.jit``: the outputs and the residuals the
backward needs (the jitted ``vjp`` function is a pytree and crosses the jit
boundary); ``backward`` applies that function, jitted, to the cotangents;
``forward_backward`` is both in one jitted function.
"""
import os
from functools import partial

import numpy as np

from . import PeerRun
from .layout import active_mask, grads_to_torch, to_input_major

__all__ = ["prepare", "setup", "LABEL"]

LABEL = "lax.scan over a fused-gate cell, jax.jit, jax.vjp (a length mask on variable-length batches)"


def _eigen_threads():
    """Threads of XLA's CPU intra-op pool in this process (named ``tf_XLAEigen``)."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                count += fh.read().startswith("tf_XLAEigen")
        except OSError:
            pass
    return count


def prepare(threads):
    """Import JAX on the CPU with ``threads`` intra-op threads and float64 enabled.

    XLA's CPU client sizes its intra-op (Eigen) pool from the ``NPROC`` environment
    variable when it is set (else from the CPU affinity), once, when the client is
    created: this must run before JAX computes anything. One thread also turns off
    XLA's multi-threaded Eigen kernels.
    """
    os.environ["NPROC"] = str(threads)
    if threads == 1 and "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    import jax
    import jaxlib

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_enable_x64", True)  # float64 cases; float32 arrays stay float32
    jax.block_until_ready(jax.jit(lambda a: a @ a)(np.ones((64, 64), np.float32)))
    return {"version": jax.__version__, "jaxlib": jaxlib.__version__, "threads": threads,
            "NPROC": os.environ["NPROC"], "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            "xla_eigen_threads": _eigen_threads()}


def _cell(recurrent, carry, inputs):
    import jax
    import jax.numpy as jnp

    h, c = carry
    z, m = inputs
    z = z + h @ recurrent
    i, f, g, o = jnp.split(z, 4, axis=-1)
    c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
    if m is None:
        return (h_new, c_new), h_new
    return (jnp.where(m, h_new, h), jnp.where(m, c_new, c)), jnp.where(m, h_new, 0)


def lstm(x, h0, c0, weights, mask, num_layers, num_directions):
    """Multi-layer (bidirectional) LSTM; ``weights`` as :func:`peers.layout.to_input_major`.

    Returns ``(y [T, B, D*H], h_n [L*D, B, H], c_n [L*D, B, H])``.
    """
    import jax.numpy as jnp
    from jax import lax

    layer_in, h_n, c_n = x, [], []
    for layer in range(num_layers):
        outs = []
        for direction in range(num_directions):
            k = layer * num_directions + direction
            kernel, recurrent, bias = weights[k]
            projected = layer_in @ kernel + bias
            (h, c), y = lax.scan(partial(_cell, recurrent), (h0[k], c0[k]), (projected, mask),
                                 reverse=direction == 1)
            outs.append(y)
            h_n.append(h)
            c_n.append(c)
        layer_in = outs[0] if num_directions == 1 else jnp.concatenate(outs, axis=-1)
    return layer_in, jnp.stack(h_n), jnp.stack(c_n)


def setup(case, inp):
    """:class:`peers.PeerRun` for ``case`` with the weights and cotangents of ``inp``."""
    import jax
    import jax.numpy as jnp

    model = partial(lstm, num_layers=case.L, num_directions=case.D)

    def vjp(x, h0, c0, weights, mask):
        return jax.vjp(lambda *a: model(*a, mask), x, h0, c0, weights)

    def forward_backward(x, h0, c0, weights, mask, cotangents):
        out, pullback = vjp(x, h0, c0, weights, mask)
        return out, pullback(cotangents)

    jit_forward = jax.jit(vjp)
    jit_backward = jax.jit(lambda pullback, cotangents: pullback(cotangents))
    jit_forward_backward = jax.jit(forward_backward)

    weights = [tuple(jnp.asarray(w) for w in kernels)
               for kernels in to_input_major(inp["params"], case.L, case.D)]
    mask = None
    if case.packed:
        mask = jnp.asarray(active_mask(case.T, inp["lengths"])[:, :, None])
    args = (jnp.asarray(inp["x"]), jnp.asarray(inp["h0"]), jnp.asarray(inp["c0"]), weights, mask)
    cotangents = tuple(jnp.asarray(inp[k]) for k in ("dy", "dh", "dc"))
    saved = jit_forward(*args)[1]

    def run_forward():
        return jax.block_until_ready(jit_forward(*args))

    def run_backward():
        return jax.block_until_ready(jit_backward(saved, cotangents))

    def run_forward_backward():
        return jax.block_until_ready(jit_forward_backward(*args, cotangents))

    def results():
        (y, h_n, c_n), (dx, dh0, dc0, dweights) = run_forward_backward()
        return {"y": np.asarray(y), "h_n": np.asarray(h_n), "c_n": np.asarray(c_n),
                "dx": np.asarray(dx), "dh0": np.asarray(dh0), "dc0": np.asarray(dc0),
                "dparams": grads_to_torch(dweights)}

    return PeerRun(forward=run_forward, forward_backward=run_forward_backward, backward=run_backward,
                   results=results, label=LABEL)
