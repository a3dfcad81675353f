"""Builders of the small local models rookgrpo ships or tests with (no hub needed).

- :mod:`.tiny_model`: tiny GPT-2s with character or move-level tokenizers (tests, smoke runs, the packaged
  chess model's architecture).
- :mod:`.shapes`: the hub models the recipes name (RookWorld-LM-124M, Qwen2.5-Coder-0.5B) at their real architecture
  with random weights, written in the hub's file layout.
- :mod:`.judge`: the fill-in task and the small frozen judge trained on it (judge-scored GRPO without a hub).
"""
