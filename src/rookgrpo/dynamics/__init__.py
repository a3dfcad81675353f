"""How a GRPO batch is chosen, changed and measured: the machinery behind the training-dynamics callbacks.

- :mod:`.batch`: operations on TRL's scored generation batch (take rows, splice groups, recompute advantages), used by
  zero-std resampling, prompt selection and diagnostics.
- :mod:`.selection`: prompt selection before generation (rules, per-prompt history, the selecting sampler), used by
  the ``prompt_selection`` callback.
- :mod:`.task_sampling`: per-task generation settings and task-homogeneous generation batches
  (``task_generation_kwargs``).
- :mod:`.positions`: position ids from the attention mask (``position_ids_from_mask``).
- :mod:`.phases`: time and peak memory of each phase of a step (``diagnostics``).
- :mod:`.heldout`: one score per held-out evaluation and the best of them (``heldout_guard``, the doctor).
- :mod:`.kl_grad`: the KL term's share of the gradient (``doctor``'s ``loss/kl_grad_share``).

The callbacks a recipe names live in :mod:`rookgrpo.callbacks`; each is a thin front for one of these.
"""
