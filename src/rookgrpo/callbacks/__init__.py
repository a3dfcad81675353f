"""Training-dynamics callbacks, and the registry that lets recipes name them."""

from .adaptive_beta import AdaptiveBeta
from .base import RookCallback
from .registry import available_callbacks, register_callback, resolve_callback, resolve_callbacks

__all__ = ["AdaptiveBeta", "RookCallback", "available_callbacks", "register_callback", "resolve_callback",
           "resolve_callbacks"]
