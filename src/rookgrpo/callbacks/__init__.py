"""Training-dynamics callbacks, and the registry that lets recipes name them."""

from .adaptive_beta import AdaptiveBeta
from .base import RookCallback
from .chess_eval import ChessEval
from .diagnostics import Diagnostics
from .kl_cap import KLCap
from .reference_credit import ReferenceCredit
from .selection import PromptSelection
from .sft_anchor import SFTAnchor
from .zero_std import ZeroStdResampling
from .registry import available_callbacks, register_callback, resolve_callback, resolve_callbacks

__all__ = ["AdaptiveBeta", "ChessEval", "Diagnostics", "KLCap", "PromptSelection", "ReferenceCredit", "RookCallback", "SFTAnchor", "ZeroStdResampling", "available_callbacks", "register_callback", "resolve_callback",
           "resolve_callbacks"]
