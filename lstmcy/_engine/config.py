"""``LSTMConfig``: the settings of one LSTM call, checked once.

The numpy API (:func:`lstmcy.lstm_forward`, :func:`lstmcy.lstm_backward`,
:class:`lstmcy.LSTMPlan`) takes the settings either as one ``config=LSTMConfig(...)`` or as
the keywords of ``torch.nn.LSTM``; :func:`config_of` turns either into the one
:class:`LSTMConfig` the call carries from there on (the forward's :class:`lstmcy.LSTMCache`
records it).
"""
from dataclasses import dataclass, fields, replace

from lstmcy._engine.validation import check_bool, check_dropout, check_int, check_proj_size

__all__ = ["LSTMConfig", "config_of", "SETTINGS"]


@dataclass(frozen=True)
class LSTMConfig:
    """The settings of an LSTM call, as ``torch.nn.LSTM`` names them (checked when made).

    Parameters
    ----------
    num_layers : int, default 1
        Stacked layers L (at least 1).
    bidirectional : bool, default False
        Run a reverse direction too (D = 2).
    batch_first : bool, default False
        3-D sequence arrays are ``[B, T, F]`` instead of ``[T, B, F]``.
    has_bias : bool, default True
        ``params`` holds ``b_ih`` and ``b_hh``.
    dropout : float in [0, 1), default 0.0
        Dropout on each layer's output except the last, when ``train``.
    train : bool, default True
        False runs inference: no cache, no dropout.
    proj_size : int, default 0
        Size P of the projected hidden state (0: no projection, P = H).

    Raises
    ------
    TypeError, ValueError
        A setting of the wrong type or out of range, named.

    Examples
    --------
    >>> cfg = LSTMConfig(num_layers=2, dropout=0.5)
    >>> cfg.replace(train=False).dropout
    0.5
    """

    num_layers: int = 1
    bidirectional: bool = False
    batch_first: bool = False
    has_bias: bool = True
    dropout: float = 0.0
    train: bool = True
    proj_size: int = 0

    def __post_init__(self):
        # Normalised values (numpy ints and bools, float subclasses) so that two configs
        # of the same settings compare and hash equal.
        checked = dict(num_layers=check_int("num_layers", self.num_layers, 1),
                       bidirectional=check_bool("bidirectional", self.bidirectional),
                       batch_first=check_bool("batch_first", self.batch_first),
                       has_bias=check_bool("has_bias", self.has_bias),
                       dropout=check_dropout(self.dropout),
                       train=check_bool("train", self.train),
                       proj_size=check_proj_size(self.proj_size))
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def num_directions(self):
        """D: 2 if bidirectional, else 1."""
        return 2 if self.bidirectional else 1

    @property
    def uses_dropout(self):
        """Whether a forward of these settings draws dropout masks (``L - 1`` of them)."""
        return self.train and self.dropout > 0 and self.num_layers > 1

    def replace(self, **changes):
        """A copy with ``changes`` (checked as the constructor checks them)."""
        return replace(self, **changes)

    def keywords(self):
        """The settings as the keywords of :func:`lstmcy.lstm_forward` /
        :func:`lstmcy.lstm_backward`."""
        return {name: getattr(self, name) for name in SETTINGS}


#: The names of the settings, in :class:`LSTMConfig`'s order.
SETTINGS = tuple(f.name for f in fields(LSTMConfig))
_DEFAULTS = LSTMConfig()
_configs = {}


def config_of(config, num_layers=1, bidirectional=False, batch_first=False, has_bias=True,
              dropout=0.0, train=True, proj_size=0):
    """The :class:`LSTMConfig` of a call given ``config`` (None or an :class:`LSTMConfig`)
    and the settings' keywords; a keyword other than its default beside a ``config`` is a
    TypeError (the call would say two things)."""
    values = (num_layers, bidirectional, batch_first, has_bias, dropout, train, proj_size)
    if config is not None:
        if type(config) is not LSTMConfig:
            raise TypeError("config must be an lstmcy.LSTMConfig or None, got "
                            f"{type(config).__name__}")
        for name, value in zip(SETTINGS, values):
            default = getattr(_DEFAULTS, name)
            if value is not default and (type(value) is not type(default) or value != default):
                raise TypeError(f"{name}={value!r} given beside config: give the settings "
                                f"either in config (config.{name} is {getattr(config, name)!r}) "
                                "or as keywords, not both")
        return config
    # Calls of plain values share one config (checking and building one costs more than
    # small calls' arithmetic); only exact types hit it, as True == 1.
    if (type(num_layers) is int and type(bidirectional) is bool and type(batch_first) is bool
            and type(has_bias) is bool and type(dropout) is float and type(train) is bool
            and type(proj_size) is int):
        cfg = _configs.get(values)
        if cfg is None:
            cfg = LSTMConfig(*values)
            if len(_configs) >= 256:
                _configs.clear()
            _configs[values] = cfg
        return cfg
    return LSTMConfig(*values)
