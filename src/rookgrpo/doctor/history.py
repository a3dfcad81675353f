"""A run's logged metrics, from whatever it left behind: ``trainer_state.json`` (any transformers/TRL run, a vanilla
``GRPOTrainer`` included) or any JSON object holding its ``log_history``, a bare JSON list of logged dicts (what
``json.dump(trainer.state.log_history, f)`` writes), a JSON-lines log, a CSV export (W&B, TensorBoard), or TensorBoard
event files: one loader, the format told from the content, not the file name.

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
    #: how the log was read where it was not one plain run: stitched after a resume, or one phase of several
    note: str = ""
    #: settings the run's recipe chose by measurement, {field: where} (``run_info.json``'s ``measured_settings``)
    measured: dict[str, str] = field(default_factory=dict)
    #: ``"fp16"``, ``"bf16"`` or ``"fp32"`` where the run recorded it (``run_info.json``), else ``None``
    precision: str | None = None
    #: reward name -> its first failure ("ConnectionError: ..."), where the run recorded them (``run_info.json``'s
    #: ``reward_failures``, written by ``reward_isolation``)
    reward_errors: dict[str, str] = field(default_factory=dict)
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


#: What the loader recognises, for its one-line error on a file it cannot read.
FORMATS = ("a JSON object with a log_history list (trainer_state.json under any name), a JSON list of logged dicts "
           "(json.dump(trainer.state.log_history)), JSON lines, a CSV export with a step column (W&B, TensorBoard), "
           "or TensorBoard event files")
#: Step columns of CSV exports and JSON-lines logs, in the order they are looked for.
STEP_COLUMNS = ("step", "Step", "global_step", "train/global_step", "_step", "trainer/global_step")


def _with_steps(entries: list, where: Path) -> list[dict]:
    """Logged dicts with a ``step`` (from a step column where they have none; else their position)."""
    out = []
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, Mapping):
            continue
        entry = canonical(entry)  # a W&B export's train/global_step is global_step
        if "step" not in entry:
            step = next((entry[k] for k in STEP_COLUMNS if isinstance(entry.get(k), (int, float))), number)
            entry["step"] = int(step)
        out.append(entry)
    return _train_entries(out)


def _read_json_text(text: str, path: Path) -> list[dict] | None:
    """Entries of a JSON document (a trainer_state-like object or a bare list), or None when it is none of them."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(data, Mapping) and isinstance(data.get("log_history"), list):
        return _with_steps(data["log_history"], path)
    if isinstance(data, list) and data and all(isinstance(e, Mapping) for e in data):
        return _with_steps(data, path)
    if isinstance(data, Mapping):
        raise ConfigError(f"{path} is a JSON object without a log_history list (keys: "
                          f"{', '.join(list(map(str, data))[:8])}); the doctor reads {FORMATS}.")
    return None


def _read_jsonl_text(text: str, path: Path) -> list[dict] | None:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            return None if number == 1 else _bad_line(path, number)
        if not isinstance(row, Mapping):
            return None
        rows.append(row)
    return _with_steps(rows, path) if rows else None


def _bad_line(path: Path, number: int):
    raise ConfigError(f"{path}:{number} is not a JSON object, though the lines before it are (a JSON-lines log).")


def _number(text: str):
    text = text.strip()
    if text == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return None if text.lower() not in ("nan", "inf", "-inf") else float(text.lower())
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _read_csv_text(text: str, path: Path) -> list[dict] | None:
    """A CSV export: a step column and metric columns (W&B's ``<run> - <metric>`` headers, its ``__MIN``/``__MAX``
    columns left out; TensorBoard's ``Wall time,Step,Value``, the metric named from the file's ``-tag-`` part)."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text)))
    if len(rows) < 2 or len(rows[0]) < 2:
        return None
    header = [h.strip() for h in rows[0]]
    step_col = next((header.index(c) for c in STEP_COLUMNS if c in header), None)
    if step_col is None:
        return None
    if set(header) >= {"Wall time", "Step", "Value"}:  # TensorBoard: one scalar per file
        tag = path.stem.split("-tag-", 1)[-1]
        for prefix in ("train_", "eval_"):
            if tag.startswith(prefix) and prefix == "train_":
                tag = "train/" + tag[len(prefix):]
        names = {header.index("Value"): tag}
    else:
        names = {}
        for i, h in enumerate(header):
            if i == step_col or h.endswith(("__MIN", "__MAX")) or h in ("Wall time", "_runtime", "_timestamp"):
                continue
            names[i] = h.split(" - ", 1)[1] if " - " in h else h
    entries = []
    for row in rows[1:]:
        if len(row) <= step_col:
            continue
        step = _number(row[step_col])
        if step is None:
            continue
        entry = {"step": int(step)}
        for i, name in names.items():
            value = _number(row[i]) if i < len(row) else None
            if value is not None:
                entry[name] = value
        entries.append(entry)
    return _with_steps(entries, path) if entries else None


def read_log_file(path: Path) -> list[dict]:
    """The log entries of one file, its format told from its content, not its name (:data:`FORMATS`)."""
    if path.name.startswith("events.out.tfevents"):
        return _read_tensorboard(path.parent)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file; the doctor reads {FORMATS}.") from None
    stripped = text.lstrip()
    for reader in ((_read_json_text, _read_jsonl_text) if stripped[:1] in "[{" else (_read_csv_text,)):
        entries = reader(text, path)
        if entries is not None:
            return entries
    raise ConfigError(f"{path}: no training log found in it; the doctor reads {FORMATS}.")


def _read_tensorboard(folder: Path) -> list[dict]:
    """The log entries of the newest TensorBoard run under ``folder`` (:func:`tensorboard_runs`)."""
    runs = tensorboard_runs(folder)
    return runs[-1][1] if runs else []


def tensorboard_runs(folder: Path) -> list[tuple[Path, list[dict]]]:
    """Each TensorBoard run under ``folder`` (a directory of event files, as transformers writes one per run under
    ``runs/%b%d_%H-%M-%S_host``) as (its directory, its log entries by step), oldest first by the time of its first
    event: the folders' names sort by month name, not by time, and two runs' steps must not be merged."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise ConfigError(f"{folder} holds TensorBoard event files; reading them needs the tensorboard "
                          "package (pip install tensorboard), or point doctor at the run's trainer_state.json.") from None
    runs = []
    for events in sorted({p.parent for p in folder.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        by_step: dict[int, dict] = {}
        first = float("inf")
        for tag in acc.Tags().get("scalars", []):
            name = tag[len("train/"):] if tag.startswith("train/") else tag.replace("eval/", "eval_", 1)
            for event in acc.Scalars(tag):
                first = min(first, float(event.wall_time))
                by_step.setdefault(int(event.step), {"step": int(event.step)})[name] = float(event.value)
        if by_step:
            runs.append((first, str(events), events, [by_step[s] for s in sorted(by_step)]))
    return [(path, entries) for _, _, path, entries in sorted(runs)]


def _run_info(run_info: Path) -> dict:
    """What ``rookgrpo train`` recorded in ``run_info.json`` for the doctor, as :class:`History` fields: the reward
    weights by reward name ({} when absent), the rewards that were reward models (``None`` when not recorded), the
    settings the recipe chose by measurement ({} when none), the training precision (``None`` when not recorded) and
    each failing reward's first error ({} when none)."""
    try:
        info = json.loads(run_info.read_text())
    except (OSError, ValueError):
        info = None
    if not isinstance(info, Mapping):
        return {}
    measured = info.get("measured_settings")
    measured = {str(k): str(v) for k, v in measured.items()} if isinstance(measured, Mapping) else {}
    try:
        weights = {str(n): float(w) for n, w in zip(info["reward_funcs"], info["reward_weights"])}
    except (KeyError, TypeError, ValueError):
        weights = {}
    try:
        judges = tuple(str(n) for n in info["judges"])
    except (KeyError, TypeError):
        judges = None
    precision = info.get("precision") if info.get("precision") in ("fp16", "bf16", "fp32") else None
    failures = info.get("reward_failures")
    errors = {str(n): str(f.get("first_error")) for n, f in failures.items()
              if isinstance(f, Mapping) and f.get("first_error")} if isinstance(failures, Mapping) else {}
    return {"reward_weights": weights, "judges": judges, "measured": measured, "precision": precision,
            "reward_errors": errors}


def split_phases(entries: list[dict]) -> tuple[list[list[dict]], str]:
    """A log whose step numbers go back is a resumed run or several runs in one file. Resumed (it goes back to a
    step after the first run's start, where a checkpoint was): stitched, the later run replacing the earlier one's
    steps from the resume point on. Restarted (back to the start or before it): separate phases, judged one by one.
    Returns the phases and a sentence saying which was done ('' for a log that never goes back).

    >>> log = [{"step": s} for s in (1, 2, 3, 4)] + [{"step": s} for s in (3, 4, 5)]
    >>> phases, note = split_phases(log)
    >>> [[e["step"] for e in p] for p in phases], note
    ([[1, 2, 3, 4, 5]], 'resumed at step 3: stitched, the later entries replacing steps 3-4 of the earlier')
    >>> phases, note = split_phases([{"step": s} for s in (1, 2, 3, 1, 2)])
    >>> [[e["step"] for e in p] for p in phases], note
    ([[1, 2, 3], [1, 2]], 'steps restart 1 time(s) (from step 3 back to 1): 2 phases, each judged on its own')
    """
    phases: list[list[dict]] = [[]]
    notes, restarts = [], []
    for entry in entries:
        current = phases[-1]
        last = current[-1]["step"] if current else None
        if last is not None and entry["step"] < last:
            first = current[0]["step"]
            if entry["step"] <= first:  # back to (or before) this phase's start: a new run
                restarts.append((last, entry["step"]))
                phases.append([entry])
                continue
            dropped = [e["step"] for e in current if e["step"] >= entry["step"]]
            notes.append(f"resumed at step {entry['step']}: stitched, the later entries replacing steps "
                         f"{dropped[0]}-{dropped[-1]} of the earlier")
            phases[-1] = [e for e in current if e["step"] < entry["step"]]
        phases[-1].append(entry)
    if restarts:
        where = ", ".join(f"from step {a} back to {b}" for a, b in restarts)
        notes.append(f"steps restart {len(restarts)} time(s) ({where}): {len(phases)} phases, each judged on its own")
    return [p for p in phases if p], "; ".join(notes)


def _find_log(path: Path) -> Path | None:
    """The log of a run folder: its trainer_state.json, else the newest checkpoint's, else a log file in it (any
    name: the one holding the most entries)."""
    state = path / "trainer_state.json"
    if state.is_file():
        return state
    checkpoints = sorted(path.glob("checkpoint-*/trainer_state.json"),
                         key=lambda p: int(p.parent.name.split("-")[-1]) if p.parent.name.split("-")[-1].isdigit() else -1)
    if checkpoints:
        return checkpoints[-1]
    best, most = None, 0
    for candidate in sorted(path.iterdir()):
        if candidate.suffix not in (".json", ".jsonl", ".csv", ".log", ".txt") or not candidate.is_file() \
                or candidate.name == "run_info.json":
            continue
        try:
            n = len(read_log_file(candidate))
        except (ConfigError, OSError, ValueError):
            continue
        if n > most:
            best, most = candidate, n
    return best


def load_histories(path: str | Path) -> list[History]:
    """The run at ``path`` as one :class:`History` per phase (:func:`split_phases`; one for most runs), each with a
    ``note`` saying how its log was read when it was stitched or split."""
    path = Path(path)
    if path.is_file():
        entries, source = read_log_file(path), path
        recorded = _run_info(path.parent / "run_info.json")
    elif path.is_dir():
        found = _find_log(path)
        if found is None:
            if any(path.rglob("events.out.tfevents.*")):
                recorded = _run_info(path / "run_info.json")
                runs = tensorboard_runs(path)
                if len(runs) > 1:  # several runs under one folder: each judged on its own, the newest last
                    return [History(e, f"{run} (TensorBoard run {i} of {len(runs)}, oldest first)",
                                    note=f"{len(runs)} TensorBoard runs under {path}: each judged on its own",
                                    **recorded) for i, (run, e) in enumerate(runs, 1)]
                entries, source = (runs[0][1], runs[0][0]) if runs else ([], path)
            else:
                raise ConfigError(f"no training log in {path}: looked for trainer_state.json (here and in its "
                                  f"checkpoint-* folders), TensorBoard event files, and log files (.json, .jsonl, "
                                  f".csv) holding {FORMATS}. Point it at a run's output_dir or its log file.")
        else:
            entries, source = read_log_file(found), found
        recorded = _run_info(path / "run_info.json")
    else:
        raise ConfigError(f"{path} does not exist. Give a run's output_dir or its log file ({FORMATS}).")
    phases, note = split_phases(entries)
    if len(phases) <= 1:
        return [History(phases[0] if phases else [], str(source), note=note, **recorded)]
    return [History(p, f"{source} (phase {i} of {len(phases)}, steps {p[0]['step']}-{p[-1]['step']})", note=note,
                    **recorded) for i, p in enumerate(phases, 1)]


def load_history(path: str | Path) -> History:
    """The logged metrics of the run at ``path``: a run's output_dir (its ``trainer_state.json``, else the newest
    ``checkpoint-*``'s, else TensorBoard event files or a log file under it), or a log file in any of :data:`FORMATS`,
    told from its content. A log whose steps restart holds several runs: this is the last one
    (:func:`load_histories` gives them all).

    Raises :class:`~rookgrpo.errors.ConfigError` naming what was looked for when there is nothing to read.
    """
    return load_histories(path)[-1]
