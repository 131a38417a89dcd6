"""lstmcy's engine, apart from its front doors (the numpy API in :mod:`lstmcy`, the torch
bindings in :mod:`lstmcy.torch`, the estimators in :mod:`lstmcy.estimators`).

Modules: ``config`` (a call's settings), ``validation`` (the one check of a call's
arguments, the :class:`~lstmcy._engine.validation.Problem`), ``plan`` (``LSTMPlan`` and
the plain functions), ``layer_loops`` (the layers of one call), ``layers`` (the kernel
calls of a layer and their work buffers), ``work_buffers``, ``results`` (result memory),
``saved`` (the saved block), ``cache`` (``LSTMCache``), ``step`` (one time step),
``schedule`` (how a kernel call is cut into tasks), ``threads`` (thread counts and the
tuner), ``fpmode`` (subnormals), ``saturation`` (where PyTorch's float64 tanh reaches 1
on this CPU), ``dispatch`` (the kernel build for this CPU, and the CPU's facts it is
told). The
compiled kernels are ``lstmcy._lstm*``, ``lstmcy._blas`` and ``lstmcy._threadpool``
(``src/lstmcy/``).
"""
