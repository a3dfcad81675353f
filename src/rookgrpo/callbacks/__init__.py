"""Training-dynamics callbacks, and the registry that lets recipes name them."""

from .adaptive_beta import AdaptiveBeta
from .base import RookCallback
from .diagnostics import Diagnostics
from .zero_std import ZeroStdResampling
from .registry import available_callbacks, register_callback, resolve_callback, resolve_callbacks

__all__ = ["AdaptiveBeta", "Diagnostics", "RookCallback", "ZeroStdResampling", "available_callbacks", "register_callback", "resolve_callback",
           "resolve_callbacks"]
