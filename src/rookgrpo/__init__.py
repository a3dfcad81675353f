"""rookgrpo: a plugin for TRL's GRPOTrainer (chess and code rewards, training-dynamics callbacks, recipes)."""

__version__ = "0.1.0"

from .callbacks import AdaptiveBeta, Diagnostics, RookCallback, ZeroStdResampling, register_callback
from .config import RookGRPOConfig, RookScriptArguments
from .errors import ConfigError
from .rewards import available_rewards, get_reward, register_reward
from .trainer import RookGRPOTrainer

__all__ = [
    "AdaptiveBeta",
    "ConfigError",
    "Diagnostics",
    "RookGRPOConfig",
    "RookGRPOTrainer",
    "RookCallback",
    "RookScriptArguments",
    "__version__",
    "available_rewards",
    "get_reward",
    "register_callback",
    "register_reward",
    "ZeroStdResampling",
]
