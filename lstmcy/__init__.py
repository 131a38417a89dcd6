"""lstmcy: fast, exact LSTM forward and backward on the CPU.

The backward follows Huawei CANN's ``aclnnLstmBackward`` operator, which mirrors
PyTorch's ``aten::lstm`` backward. See :func:`lstm_forward` and :func:`lstm_backward`.
"""
from lstmcy._cache import LSTMCache
from lstmcy._core import lstm_backward, lstm_forward

__version__ = "0.1.0"
__all__ = ["lstm_forward", "lstm_backward", "LSTMCache", "__version__"]
