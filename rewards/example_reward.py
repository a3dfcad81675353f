"""Example of a user reward that a recipe names by path: ``rewards/example_reward.py:prompt_charset``.

Copy this file, change the function, and point your recipe at it; nothing needs registering or installing.
"""


def prompt_charset(prompts, completions, **kwargs):
    """Share of completion characters that also occur in the prompt. Range [0, 1]; an empty completion earns 0.

    It rewards a model for staying in the prompt's alphabet, e.g. for a chess prompt: digits, ranks and piece letters.
    ``kwargs`` also holds every dataset column (here ``fen``) and TRL's ``trainer_state``, if your reward needs them.

    Example:
        >>> prompt_charset(["P: 8/8/8 w "] * 2, ["8/8 w", "xyz"])
        [1.0, 0.0]
    """
    rewards = []
    for prompt, completion in zip(prompts, completions, strict=True):
        if not isinstance(completion, str) or not completion:
            rewards.append(0.0)
            continue
        alphabet = set(prompt)
        rewards.append(sum(ch in alphabet for ch in completion) / len(completion))
    return rewards
