"""A run's logged metrics, from whatever it left behind: ``trainer_state.json`` (any transformers/TRL run, a vanilla
``GRPOTrainer`` included), a JSON-lines log, or TensorBoard event files.

Everything is read into one list of log entries, ``{"step": N, name: value, ...}``, as transformers keeps them in
``trainer_state.json``'s ``log_history``; :class:`History` gives a metric's curve over steps.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError


#: Other names the same metric is logged under, read where an entry lacks the name the detectors use (docs/doctor.md):
#: TRL before 0.17 (``completion_length``, one ``clip_ratio``), and ``rewards/<name>`` without ``/mean`` (below).
ALIASES = {
    "completions/mean_length": ("completion_length", "completions/mean_length_mean"),
    "clip_ratio/region_mean": ("clip_ratio",),
    "frac_reward_zero_std": ("frac_zero_std",),
}
#: Prefixes of W&B and TensorBoard exports: ``train/reward`` is ``reward``, ``eval/loss`` is ``eval_loss``.
PREFIXES = (("train/", ""), ("eval/", "eval_"))


def canonical(entry: Mapping) -> dict:
    """One log entry with the names the detectors read (``ALIASES``, ``PREFIXES``; ``rewards/<name>`` as
    ``rewards/<name>/mean``) added where absent; the entry's own names are kept.

    >>> canonical({"train/global_step": 3, "train/completion_length": 40.0, "rewards/fmt": 0.5, "eval/loss": 1.2})
    ... # doctest: +NORMALIZE_WHITESPACE
    {'train/global_step': 3, 'train/completion_length': 40.0, 'rewards/fmt': 0.5, 'eval/loss': 1.2, 'global_step': 3,
     'completion_length': 40.0, 'eval_loss': 1.2, 'completions/mean_length': 40.0, 'rewards/fmt/mean': 0.5}
    """
    out = dict(entry)
    for key, value in entry.items():
        for prefix, replacement in PREFIXES:
            if key.startswith(prefix):
                out.setdefault(replacement + key[len(prefix):], value)
    for name, aliases in ALIASES.items():
        if name not in out:
            for alias in aliases:
                if alias in out:
                    out[name] = out[alias]
                    break
    for key in [k for k in out if k.startswith("rewards/") and k.count("/") == 1]:
        out.setdefault(key + "/mean", out[key])
    return out


@dataclass
class History:
    """Log entries of one run, in step order, and where they came from.

    Example:
        >>> h = History([{"step": 1, "reward": 0.1}, {"step": 2, "reward": float("nan")}, {"step": 3, "reward": 0.3}])
        >>> h.curve("reward")
        ([1, 3], [0.1, 0.3])
        >>> h.curve("kl")
        ([], [])
    """

    entries: list[dict]
    source: str = "<memory>"
    #: reward name -> weight, when the run recorded them (rookgrpo's ``run_info.json``); else empty (weights 1)
    reward_weights: dict[str, float] = field(default_factory=dict)
    #: the rewards that were reward models (judges), when the run recorded them (``run_info.json``); else ``None``
    judges: tuple[str, ...] | None = None
    _names: set[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.entries = [canonical(entry) for entry in self.entries]

    def curve(self, name: str, finite: bool = True) -> tuple[list[int], list[float]]:
        """(steps, values) of every entry that logged ``name`` as a number; NaN and inf dropped unless ``finite`` is
        False."""
        steps, values = [], []
        for entry in self.entries:
            value = entry.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if finite and not math.isfinite(value):
                continue
            steps.append(int(entry["step"]))
            values.append(float(value))
        return steps, values

    def names(self) -> set[str]:
        """Every metric name logged at least once (scanned once: several detectors ask)."""
        if self._names is None:
            self._names = {k for entry in self.entries for k in entry if k != "step"}
        return self._names

    @property
    def kind(self) -> str:
        """What trained: ``"preference"`` (DPO/KTO/ORPO: chosen/rejected rewards or log-probs), ``"grpo"`` (GRPO/RLOO
        keys: a reward, KL, flat-group share, completion stats), ``"sft"`` (a loss and token accuracy, nothing of RL).
        Detectors and advice that only make sense for a policy-gradient run with groups are not run on the others.

        >>> History([{"step": 1, "loss": 1.0, "eval_loss": 1.2}]).kind
        'sft'
        >>> History([{"step": 1, "rewards/chosen": 0.1, "rewards/margins": 0.2}]).kind
        'preference'
        >>> History([{"step": 1, "reward": 0.3, "frac_reward_zero_std": 0.5}]).kind
        'grpo'
        """
        names = self.names()
        if any(n.startswith(("rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected"))
               for n in names):
            return "preference"
        if any(n in ("reward", "kl", "frac_reward_zero_std") or n.startswith(("rewards/", "completions/", "clip_ratio"))
               for n in names):
            return "grpo"
        if "mean_token_accuracy" in names or names & {"loss", "eval_loss", "train_loss"}:
            return "sft"
        return "grpo"  # nothing to tell by (a curve or two): every detector judges what it finds

    @property
    def last_step(self) -> int:
        return max((int(e["step"]) for e in self.entries), default=0)


def _train_entries(log_history: list) -> list[dict]:
    # The closing summary (train_runtime, train_loss, ...) describes the whole run, not a step.
    return [dict(h) for h in log_history if isinstance(h, Mapping) and "step" in h and "train_runtime" not in h]


def _read_trainer_state(path: Path) -> list[dict]:
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path} is not valid JSON ({err}).") from None
    if not isinstance(state, Mapping) or not isinstance(state.get("log_history"), list):
        raise ConfigError(f"{path} has no log_history list; is it a transformers trainer_state.json?")
    return _train_entries(state["log_history"])


def _read_jsonl(path: Path) -> list[dict]:
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}:{number} is not a JSON object ({err}).") from None
        if isinstance(entry, Mapping):
            entry = canonical(entry)  # a W&B export's train/global_step is global_step
            entry.setdefault("step", entry.get("global_step", entry.get("_step", number)))
            entries.append(entry)
    return _train_entries(entries)


def _read_tensorboard(folder: Path) -> list[dict]:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise ConfigError(f"{folder} holds TensorBoard event files; reading them needs the tensorboard "
                          "package (pip install tensorboard), or point doctor at the run's trainer_state.json.") from None
    by_step: dict[int, dict] = {}
    for events in sorted({p.parent for p in folder.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            name = tag[len("train/"):] if tag.startswith("train/") else tag.replace("eval/", "eval_", 1)
            for event in acc.Scalars(tag):
                by_step.setdefault(int(event.step), {"step": int(event.step)})[name] = float(event.value)
    return [by_step[s] for s in sorted(by_step)]


def _run_info(run_info: Path) -> tuple[dict[str, float], tuple[str, ...] | None]:
    """What ``rookgrpo train`` recorded in ``run_info.json`` for the doctor: the reward weights by reward name ({} when
    absent) and the rewards that were reward models (``None`` when not recorded)."""
    try:
        info = json.loads(run_info.read_text())
    except (OSError, ValueError):
        return {}, None
    try:
        weights = {str(n): float(w) for n, w in zip(info["reward_funcs"], info["reward_weights"])}
    except (KeyError, TypeError, ValueError):
        weights = {}
    try:
        judges = tuple(str(n) for n in info["judges"])
    except (KeyError, TypeError):
        judges = None
    return weights, judges


def load_history(path: str | Path) -> History:
    """The logged metrics of the run at ``path``: a run's output_dir (its ``trainer_state.json``, else the newest
    ``checkpoint-*``'s, else TensorBoard event files under it), a ``trainer_state.json``, or a ``.jsonl`` log.

    Raises :class:`~rookgrpo.errors.ConfigError` naming what was looked for when there is nothing to read.
    """
    path = Path(path)
    if path.is_file():
        if path.suffix == ".jsonl":
            return History(_read_jsonl(path), str(path))
        if path.name.startswith("events.out.tfevents"):
            return History(_read_tensorboard(path.parent), str(path.parent))
        return History(_read_trainer_state(path), str(path))
    if not path.is_dir():
        raise ConfigError(f"{path} does not exist. Give a run's output_dir, its trainer_state.json or a .jsonl log.")
    state = path / "trainer_state.json"
    if not state.is_file():
        checkpoints = sorted(path.glob("checkpoint-*/trainer_state.json"),
                             key=lambda p: int(p.parent.name.split("-")[-1]) if p.parent.name.split("-")[-1].isdigit() else -1)
        state = checkpoints[-1] if checkpoints else None
    if state is not None:
        return History(_read_trainer_state(state), str(state), *_run_info(path / "run_info.json"))
    if any(path.rglob("events.out.tfevents.*")):
        return History(_read_tensorboard(path), str(path))
    raise ConfigError(f"no trainer_state.json in {path} or its checkpoint-* folders, and no TensorBoard event "
                      "files under it. Point it at a run's output_dir (transformers writes trainer_state.json there at "
                      "the end of training and in every checkpoint).")
