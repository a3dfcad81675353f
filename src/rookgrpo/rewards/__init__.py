"""Reward functions in TRL's signature, and the registry that lets recipes name them."""

from .isolation import FAILED, RewardFunctionError
from .registry import available_rewards, get_reward, register_reward, resolve_reward_func

__all__ = ["FAILED", "RewardFunctionError", "available_rewards", "get_reward", "register_reward", "resolve_reward_func"]
