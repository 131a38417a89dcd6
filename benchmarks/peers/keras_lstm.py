"""TensorFlow/Keras peer: ``keras.layers.LSTM`` in a ``tf.function``, gradients by ``tf.GradientTape``.

The model is what a Keras user writes: one ``keras.layers.LSTM`` per layer
(``return_sequences``, ``return_state``), wrapped in ``keras.layers.Bidirectional``
(``merge_mode="concat"``, PyTorch's output layout) for two directions, with the
case's weights assigned (:mod:`peers.layout`: kernels ``[I_l, 4H]``, one bias, the
sum of PyTorch's two) and the initial states passed in. Keras is batch-major:
the data is transposed to ``[B, T, ...]`` once, before anything is timed. A
variable-length batch passes a ``[B, T]`` mask: Keras carries the state through
masked steps (the reverse direction starts at each sequence's last step) and,
with ``zero_output_for_mask``, writes zeros there.

On a CPU, Keras's LSTM runs its generic recurrence: a ``tf.while_loop`` over the
cell, inputs projected step by step (its fused kernel is cuDNN's, for GPUs).
``tf.function`` runs without XLA (``jit_compile=False``), as Keras's own
``jit_compile="auto"`` does on a CPU-only machine.

A GradientTape's backward cannot run apart from its forward, so there is no
``backward`` here: the report derives one from the forward+backward and forward
times and marks it so.
"""
import os

import numpy as np

from . import PeerRun
from .layout import active_mask, grads_to_torch, to_input_major

__all__ = ["prepare", "setup", "LABEL"]

LABEL = ("keras.layers.LSTM (in keras.layers.Bidirectional for two directions, a mask on variable-length "
         "batches) in tf.function, GradientTape")


def prepare(threads):
    """Import TensorFlow and Keras with ``threads`` intra-op and inter-op threads.

    TensorFlow's thread pools are created with its runtime, on the first operation:
    this must run before TensorFlow computes anything.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no start-up INFO lines on stderr
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras

    if keras.backend.backend() != "tensorflow":
        raise ImportError(f"Keras runs on {keras.backend.backend()!r}; set KERAS_BACKEND=tensorflow")
    return {"version": tf.__version__, "keras": keras.__version__, "threads": threads,
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "onednn_opts": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")}


def _build(case, x, h0, c0, mask):
    """The Keras layers for ``case``, built by one call, and their cells in PyTorch's order."""
    import keras

    layers, cells = [], []
    for _ in range(case.L):
        lstm = keras.layers.LSTM(case.H, return_sequences=True, return_state=True,
                                 zero_output_for_mask=True, dtype=case.dtype)
        if case.bidirectional:
            layer = keras.layers.Bidirectional(lstm, merge_mode="concat", dtype=case.dtype)
        else:
            layer = lstm
        layers.append(layer)
    _run(layers, case, x, h0, c0, mask)  # builds the weights
    for layer in layers:
        if case.bidirectional:
            cells += [layer.forward_layer.cell, layer.backward_layer.cell]
        else:
            cells.append(layer.cell)
    return layers, cells


def _run(layers, case, x, h0, c0, mask):
    import tensorflow as tf

    y, h_n, c_n = x, [], []
    for layer_index, layer in enumerate(layers):
        first = layer_index * case.D
        states = []
        for k in range(first, first + case.D):
            states += [h0[k], c0[k]]
        y, *final = layer(y, initial_state=states, mask=mask, training=True)
        h_n += final[0::2]
        c_n += final[1::2]
    return y, tf.stack(h_n), tf.stack(c_n)


def setup(case, inp):
    """:class:`peers.PeerRun` for ``case`` with the weights and cotangents of ``inp``."""
    import tensorflow as tf

    def batch_major(a):
        return tf.constant(np.ascontiguousarray(np.swapaxes(a, 0, 1)))

    x, dy = batch_major(inp["x"]), batch_major(inp["dy"])
    h0, c0, dh, dc = (tf.constant(inp[k]) for k in ("h0", "c0", "dh", "dc"))
    mask = None
    if case.packed:
        mask = tf.constant(active_mask(case.T, inp["lengths"]).T)  # [B, T]
    layers, cells = _build(case, x, h0, c0, mask)
    variables = []
    for cell, (kernel, recurrent, bias) in zip(cells, to_input_major(inp["params"], case.L, case.D)):
        cell.kernel.assign(kernel)
        cell.recurrent_kernel.assign(recurrent)
        cell.bias.assign(bias)
        variables += [cell.kernel, cell.recurrent_kernel, cell.bias]

    @tf.function(jit_compile=False)
    def forward():
        return _run(layers, case, x, h0, c0, mask)

    @tf.function(jit_compile=False)
    def forward_backward():
        with tf.GradientTape() as tape:
            tape.watch([x, h0, c0])
            out = _run(layers, case, x, h0, c0, mask)
        grads = tape.gradient(list(out), [x, h0, c0] + variables, output_gradients=[dy, dh, dc])
        return out, grads

    def results():
        (y, h_n, c_n), grads = forward_backward()
        dx, dh0, dc0 = (g.numpy() for g in grads[:3])
        weight_grads = [g.numpy() for g in grads[3:]]
        return {"y": np.swapaxes(y.numpy(), 0, 1), "h_n": h_n.numpy(), "c_n": c_n.numpy(),
                "dx": np.swapaxes(dx, 0, 1), "dh0": dh0, "dc0": dc0,
                "dparams": grads_to_torch([weight_grads[k:k + 3] for k in range(0, len(weight_grads), 3)])}

    return PeerRun(forward=forward, forward_backward=forward_backward, backward=None, results=results,
                   label=LABEL)
