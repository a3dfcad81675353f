"""Training-dynamics callbacks, and the registry that lets recipes name them.

The built-in ones are listed once, in ``rookgrpo.BUILTIN_CALLBACKS`` (recipe name -> module and class); the machinery
behind them is in :mod:`rookgrpo.dynamics`. The hooks a callback may implement are declared on :class:`RookCallback`.
"""

from .. import BUILTIN_CALLBACKS
from .adaptive_beta import AdaptiveBeta
from .base import HOOKS, RookCallback
from .chess_eval import ChessEval
from .diagnostics import Diagnostics
from .doctor import Doctor
from .heldout_guard import HeldoutGuard
from .kl_cap import KLCap
from .selection import PromptSelection
from .sft_anchor import SFTAnchor
from .zero_std import ZeroStdResampling
from .registry import available_callbacks, register_callback, resolve_callback, resolve_callbacks

__all__ = ["HOOKS", "RookCallback", *sorted(cls for _, cls in BUILTIN_CALLBACKS.values()), "available_callbacks",
           "register_callback", "resolve_callback", "resolve_callbacks"]
