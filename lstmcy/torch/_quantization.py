"""``torch.ao.quantization.quantize_dynamic`` for :class:`lstmcy.torch.LSTM`.

Eager-mode quantization looks modules up by their exact type: in the ``qconfig_spec``
(``{nn.LSTM}``, or its default set) when it assigns ``qconfig``, then in the module
mapping when it swaps. A subclass of ``nn.LSTM`` is in neither, so it would stay in
float without a word. :func:`register_for_dynamic_quantization` makes both lookups treat
the class as ``nn.LSTM``: wherever a ``qconfig_spec`` names ``nn.LSTM`` (and not the class
itself), the class gets the same qconfig, and the default dynamic mapping converts it
to ``torch.ao.nn.quantized.dynamic.LSTM`` as it converts ``nn.LSTM``.
"""
import importlib

from torch import nn
from torch.ao.nn.quantized import dynamic as nnqd
from torch.ao.quantization import quantization_mappings

# The submodule (the package re-exports a function of the same name).
_quantize_module = importlib.import_module("torch.ao.quantization.quantize")

__all__ = ["register_for_dynamic_quantization"]

_registered = set()


class _DynamicQuantizedLSTM:
    """Converter in the dynamic mapping: via an ``nn.LSTM`` with the same weights."""

    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant=False):
        float_lstm = nn.LSTM(mod.input_size, mod.hidden_size, num_layers=mod.num_layers,
                             bias=mod.bias, batch_first=mod.batch_first, dropout=mod.dropout,
                             bidirectional=mod.bidirectional, proj_size=mod.proj_size,
                             device=mod.weight_ih_l0.device, dtype=mod.weight_ih_l0.dtype)
        float_lstm.load_state_dict(mod.state_dict())
        float_lstm.qconfig = mod.qconfig
        return nnqd.LSTM.from_float(float_lstm,
                                    use_precomputed_fake_quant=use_precomputed_fake_quant)


def _with_registered_types(qconfig_dict):
    """``qconfig_dict`` with every registered class mapped as ``nn.LSTM`` is."""
    if not isinstance(qconfig_dict, dict) or nn.LSTM not in qconfig_dict:
        return qconfig_dict
    missing = [cls for cls in _registered if cls not in qconfig_dict]
    if not missing:
        return qconfig_dict
    extended = dict(qconfig_dict)
    for cls in missing:
        extended[cls] = qconfig_dict[nn.LSTM]
    return extended


def _wrap_propagate(propagate):
    def propagate_qconfig_(module, qconfig_dict=None, prepare_custom_config_dict=None):
        return propagate(module, _with_registered_types(qconfig_dict), prepare_custom_config_dict)
    propagate_qconfig_.__doc__ = propagate.__doc__
    propagate_qconfig_._lstmcy_wraps = propagate
    return propagate_qconfig_


def register_for_dynamic_quantization(cls):
    """Let ``quantize_dynamic`` convert ``cls`` (a subclass of ``nn.LSTM``) as ``nn.LSTM``."""
    _registered.add(cls)
    mappings = quantization_mappings.DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS
    mappings.setdefault(cls, _DynamicQuantizedLSTM)
    # quantize_dynamic (and prepare) call this module-level name at call time.
    if not hasattr(_quantize_module.propagate_qconfig_, "_lstmcy_wraps"):
        _quantize_module.propagate_qconfig_ = _wrap_propagate(_quantize_module.propagate_qconfig_)
