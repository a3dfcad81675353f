"""rookgrpo: a plugin for TRL's GRPOTrainer (training-dynamics callbacks, a doctor, recipes; chess, code and judge
task packs).

The public names below are imported on first use (PEP 562), so light parts of the package (the code sandbox's runner
processes, the CLI's help) start without loading torch and TRL.
"""

__version__ = "0.1.0"

#: The core's callbacks: recipe name -> (module under ``rookgrpo.callbacks``, class). The callback registry registers
#: these by import path, and the package root exports these classes, so a new built-in is added here once. Task packs
#: register their own (the chess pack's ``chess_eval``).
BUILTIN_CALLBACKS = {
    "adaptive_beta": ("adaptive_beta", "AdaptiveBeta"),
    "diagnostics": ("diagnostics", "Diagnostics"),
    "doctor": ("doctor", "Doctor"),
    "heldout_eval": ("heldout_eval", "HeldoutEval"),
    "heldout_guard": ("heldout_guard", "HeldoutGuard"),
    "kl_cap": ("kl_cap", "KLCap"),
    "prompt_selection": ("selection", "PromptSelection"),
    "sft_anchor": ("sft_anchor", "SFTAnchor"),
    "skip_nonfinite": ("nonfinite", "SkipNonfinite"),
    "zero_std_resampling": ("zero_std", "ZeroStdResampling"),
}

_EXPORTS = {
    **{cls: ".callbacks" for _, cls in BUILTIN_CALLBACKS.values()},
    "ChessEval": ".chess.heldout",  # the chess pack's held-out evaluation (imports python-chess when used)
    "ConfigError": ".errors",
    "FAILED": ".rewards",
    "RewardFunctionError": ".rewards",
    "RookCallback": ".callbacks",
    "RookGRPOConfig": ".config",
    "RookGRPOTrainer": ".trainer",
    "RookScriptArguments": ".config",
    "available_rewards": ".rewards",
    "get_reward": ".rewards",
    "register_callback": ".callbacks",
    "register_reward": ".rewards",
    "register": ".registry",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rookgrpo' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
