"""lstmcy: fast, exact LSTM forward and backward on the CPU.

The backward follows Huawei CANN's ``aclnnLstmBackward`` operator, which mirrors
PyTorch's ``aten::lstm`` backward. See :func:`lstm_forward`, whose :class:`LSTMCache`
gives the gradients (:meth:`LSTMCache.backward`), and :func:`lstm_backward`, the
operator's own argument list; :class:`LSTMConfig` holds a call's settings and
:class:`LSTMPlan` reuses work buffers across calls.
"""
from lstmcy._engine.cache import LSTMCache, LSTMGradients
from lstmcy._engine.config import LSTMConfig
from lstmcy._engine.plan import LSTMPlan, lstm_backward, lstm_forward, lstm_vjp, release_workspaces
from lstmcy._engine.fpmode import get_flush_denormals, set_flush_denormals
from lstmcy._engine.threads import get_num_threads, set_num_threads

__version__ = "0.1.0"
__all__ = ["lstm_forward", "lstm_backward", "lstm_vjp", "LSTMConfig", "LSTMPlan", "LSTMCache",
           "LSTMGradients", "set_num_threads",
           "get_num_threads", "set_flush_denormals", "get_flush_denormals",
           "release_workspaces", "__version__"]
