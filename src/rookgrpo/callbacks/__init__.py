"""Training-dynamics callbacks, and the registry that lets recipes name them."""

from .registry import available_callbacks, register_callback, resolve_callback, resolve_callbacks

__all__ = ["available_callbacks", "register_callback", "resolve_callback", "resolve_callbacks"]
