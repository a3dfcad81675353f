"""Training-dynamics callbacks, and the registry that lets recipes name them.

The core's are listed once, in ``rookgrpo.BUILTIN_CALLBACKS`` (recipe name -> module and class; task packs register
their own, e.g. the chess pack's ``chess_eval``); the machinery behind them is in :mod:`rookgrpo.dynamics`. The hooks a callback may implement are declared on :class:`RookCallback`.
"""

from .. import BUILTIN_CALLBACKS
from .adaptive_beta import AdaptiveBeta
from .base import HOOKS, RookCallback
from .diagnostics import Diagnostics
from .doctor import Doctor
from .heldout_eval import HeldoutEval
from .heldout_guard import HeldoutGuard
from .kl_cap import KLCap
from .nonfinite import SkipNonfinite
from .selection import PromptSelection
from .sft_anchor import SFTAnchor
from .zero_std import ZeroStdResampling
from .registry import available_callbacks, register_callback, resolve_callback, resolve_callbacks

__all__ = ["HOOKS", "RookCallback", *sorted(cls for _, cls in BUILTIN_CALLBACKS.values()), "available_callbacks",
           "register_callback", "resolve_callback", "resolve_callbacks"]


def __getattr__(name):
    if name == "ChessEval":  # the chess pack's, kept importable from here
        from ..registry import lookup

        return lookup("callback", "chess_eval")
    raise AttributeError(f"module 'rookgrpo.callbacks' has no attribute {name!r}")
