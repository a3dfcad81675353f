"""``rookgrpo`` command line. Subcommands: ``train`` (wraps ``accelerate launch``), ``preflight``, ``inspect``,
``recipes``, ``callbacks``, ``rewards`` (``list``, ``audit``), ``data generate``, ``evaluate``, ``plot``, ``doctor``
(``rookgrpo --help`` prints them with one line each).

Errors a user can fix (:class:`~rookgrpo.errors.ConfigError`) print one clear line and exit with status 2, with no
traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import ConfigError

# Passed to `accelerate launch` when no config file is: the values it would default to anyway, so it does not print
# its "values were not passed" warnings. Mixed precision is the trainer's own (bf16/fp16 in the recipe).
ACCELERATE_DEFAULTS = ("--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no")


def run_module(argv: Sequence[str]) -> int:
    """Entry point of ``python -m rookgrpo``: train in this process (one rank when launched by accelerate)."""
    if not argv or argv[0] in ("-h", "--help"):
        from .recipe import make_parser

        make_parser().print_help()
        return 0
    _setup_logging()
    try:
        from .train import main as train_main

        return train_main(argv)
    except ConfigError as exc:
        print(f"rookgrpo: error: {exc}", file=sys.stderr)
        return 2


def launch_command(argv: Sequence[str]) -> list[str]:
    """Build the ``accelerate launch`` arguments for ``rookgrpo train RECIPE [flags]``.

    ``accelerate_config`` and ``num_processes`` come from the flags, else from the recipe (as ``trl grpo`` does) and are
    consumed here; every other flag goes on to the training process, where it overrides the recipe.
    """
    from .recipe import _check_recipe_keys, normalize_argv

    argv = normalize_argv(argv)
    if "--config" not in argv:
        raise ConfigError("rookgrpo train needs a recipe: `rookgrpo train recipes/rookworld-tiny.yaml [--flag value]`.")
    _check_recipe_keys(argv)
    recipe = _read_yaml(argv[argv.index("--config") + 1])
    forwarded, launch = _pop_launch_flags(argv, ("accelerate_config", "num_processes"))
    accelerate_config = launch.get("accelerate_config", recipe.get("accelerate_config"))
    num_processes = launch.get("num_processes", recipe.get("num_processes"))
    args: list[str] = []
    if accelerate_config:
        config_file = resolve_accelerate_config(str(accelerate_config))
        args += ["--config_file", str(config_file)]
        config = _read_yaml(str(config_file))
        from .config import _has_accelerator

        if config.get("use_cpu") and not any(a == "--use_cpu" or a.startswith("--use_cpu=") for a in forwarded):
            # A CPU config (cpu-ddp): the run trains on CPU (accelerate's torchrun launcher, which starts the processes,
            # does not tell them).
            forwarded += ["--use_cpu", "true"]
        if (config.get("use_cpu") or not _has_accelerator()) and "OMP_NUM_THREADS" not in os.environ:
            # On CPU (a CPU config, or a GPU config such as zero2 on a machine without GPUs, which the trainer runs on
            # CPU processes and says so) each process gets its share of the cores, not accelerate's one thread.
            processes = int(num_processes or config.get("num_processes") or 1)
            args += ["--num_cpu_threads_per_process", str(max(1, (os.cpu_count() or 1) // processes))]
    else:  # what accelerate would otherwise default with a block of warnings (precision is the recipe's bf16/fp16)
        args += list(ACCELERATE_DEFAULTS)
        from .config import _has_accelerator

        if not _has_accelerator():
            if num_processes is None:
                num_processes = 1  # accelerate's own choice without GPUs (it picks one process per GPU otherwise)
            if "OMP_NUM_THREADS" not in os.environ:
                # accelerate sets OMP_NUM_THREADS=1 unless told (its CPU default applies only with --cpu), which leaves
                # a CPU run on one core: give each process its share of the cores instead.
                threads = max(1, (os.cpu_count() or 1) // int(num_processes))
                args += ["--num_cpu_threads_per_process", str(threads)]
    if num_processes is not None:
        args += ["--num_processes", str(int(num_processes))]
        if int(num_processes) > 1 and not accelerate_config:
            args += ["--multi_gpu"]  # accelerate's DDP launcher; on a machine without GPUs it runs gloo on CPU
    return [*args, "-m", "rookgrpo", *forwarded]


def resolve_accelerate_config(name: str) -> Path:
    """An accelerate config: a file, a packaged config's name (``cpu-ddp``, ``ddp``, ``zero2``, ``zero3``,
    ``fsdp``: found from any working directory), or the name of one of TRL's bundled configs."""
    from .recipe import find_packaged, packaged_accelerate_configs

    packaged = packaged_accelerate_configs()
    found = find_packaged(name, packaged, "accelerate")
    if found is not None:
        return found
    from importlib import resources

    bundled = resources.files("trl.accelerate_configs").joinpath(f"{name}.yaml")
    if bundled.is_file():
        return Path(str(bundled))
    raise ConfigError(
        f"accelerate_config: {name!r} is neither a file nor a known config name. Use a path, or one of "
        f"{', '.join(packaged)} (packaged with rookgrpo; `rookgrpo recipes` lists them)."
    )


def _pop_launch_flags(argv: list[str], names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    rest, found, i = [], {}, 0
    while i < len(argv):
        key = argv[i][2:] if argv[i].startswith("--") else None
        if key is not None and "=" in key and key.split("=", 1)[0] in names:
            k, v = key.split("=", 1)
            found[k] = v
        elif key in names:
            if i + 1 >= len(argv):
                raise ConfigError(f"--{key} needs a value.")
            found[key] = argv[i + 1]
            i += 1
        else:
            rest.append(argv[i])
        i += 1
    return rest, found


def _read_yaml(path: str) -> dict:
    import yaml

    with open(path) as fh:
        return yaml.safe_load(fh) or {}


def _cmd_train(args: argparse.Namespace, extra: list[str]) -> int:
    from accelerate.commands.launch import launch_command as accelerate_launch
    from accelerate.commands.launch import launch_command_parser

    launch_args = launch_command([args.recipe, *extra])
    print("accelerate launch " + " ".join(launch_args), file=sys.stderr)
    parsed = launch_command_parser().parse_args(launch_args)
    try:
        accelerate_launch(parsed)
    except SystemExit as exc:  # accelerate's launchers exit with the child's status
        return int(exc.code or 0)
    except Exception as exc:  # the child already printed its error; report the status, not a second traceback
        code = getattr(exc, "returncode", 1)
        print(f"rookgrpo: training process failed ({type(exc).__name__}, status {code})", file=sys.stderr)
        return int(code) or 1
    return 0


def _cmd_preflight(args: argparse.Namespace, extra: list[str]) -> int:
    """``rookgrpo preflight RECIPE``: ``rookgrpo train RECIPE --preflight only``, launched as the run would be."""
    return _cmd_train(args, [*extra, "--preflight", "only"])


def _cmd_recipes(args: argparse.Namespace, extra: list[str]) -> int:
    import shutil

    from .recipe import packaged_accelerate_configs, packaged_recipes

    recipes, configs = packaged_recipes(), packaged_accelerate_configs()
    if args.name is None:
        if args.copy:
            raise ConfigError("recipes --copy needs a NAME: `rookgrpo recipes rookworld-tiny --copy .`.")
        print("recipes (rookgrpo train NAME, or `rookgrpo recipes NAME --copy DIR` to edit one):")
        for name, path in recipes.items():
            print(f"  {name:16s} {_first_comment(path)}")
        print("accelerate configs (accelerate_config: NAME in a recipe, or --accelerate_config NAME):")
        for name, path in configs.items():
            print(f"  {name:16s} {_first_comment(path)}")
        return 0
    path = recipes.get(args.name) or configs.get(args.name)
    if path is None:
        import difflib

        close = difflib.get_close_matches(args.name, [*recipes, *configs], n=2)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise ConfigError(f"recipes: no packaged recipe or accelerate config {args.name!r}.{hint} Packaged: "
                          f"{', '.join([*recipes, *configs])}.")
    if not args.copy:
        print(path.read_text(), end="")
        return 0
    target = Path(args.copy).expanduser() / path.name
    if target.exists():
        raise ConfigError(f"recipes --copy: {target} exists; remove it or copy into another directory.")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    print(f"wrote {target} (train it with `rookgrpo train {target}`)")
    return 0


def _first_comment(path: Path) -> str:
    """The first comment line of a packaged YAML file: what it is for."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("# ").strip()
            return text if len(text) <= 100 else text[:97] + "..."
    return ""


def _cmd_rewards(args: argparse.Namespace, extra: list[str]) -> int:
    if getattr(args, "rewards_command", None) == "audit":
        return _pack_command("rookgrpo.chess.commands:rewards_audit")(args, [])
    from .rewards.registry import available_rewards, get_reward

    for name in available_rewards():
        try:
            doc = (get_reward(name).__doc__ or "").strip().splitlines()
        except ConfigError as exc:  # its pack's extra is not installed: say so on its line
            doc = [str(exc).split(": ", 1)[-1]]
        print(f"{name:24s} {doc[0] if doc else ''}")
    return 0


def _cmd_callbacks(args: argparse.Namespace, extra: list[str]) -> int:
    from .callbacks.registry import _lookup, available_callbacks, callback_fields_markdown

    if args.name:
        print(callback_fields_markdown(args.name))
        return 0
    for name in available_callbacks():
        try:
            doc = (_lookup(name).__doc__ or "").strip().splitlines()
        except ConfigError as exc:  # its pack's extra is not installed: say so on its line
            doc = [str(exc).split(": ", 1)[-1]]
        print(f"{name:24s} {doc[0].replace('``', '') if doc else ''}")
    return 0


def _add_engine_args(p: argparse.ArgumentParser, depth: int = 10) -> None:
    p.add_argument("--stockfish-path", default=None, help="Stockfish binary (default: found on PATH)")
    p.add_argument("--depth", type=int, default=depth, help=f"search depth (default {depth})")
    p.add_argument("--nodes", type=int, default=None, help="node limit per analysis (instead of/with depth)")
    p.add_argument("--workers", type=int, default=None, help="Stockfish processes (default min(cores, 4))")


def _pack_command(target: str):
    """A task pack's command, imported when run (a missing extra is one line naming it)."""

    def run(args: argparse.Namespace, extra: list[str]) -> int:
        import importlib

        from .registry import builtin_pack_entry, naming_the_extra

        module, _, attr = target.partition(":")
        # The pack's modules import its dependencies where they are used: the call is inside too.
        with naming_the_extra(builtin_pack_entry(module), f"`rookgrpo {args.command}`"):
            func = getattr(importlib.import_module(module), attr)
            return func(args) if attr == "rewards_audit" else func(args, extra)

    return run


def _cmd_plot(args: argparse.Namespace, extra: list[str]) -> int:
    from .plot import load_log_history, plot_run, text_curve

    out = plot_run(args.run_dir, args.out)
    print(text_curve(load_log_history(args.run_dir), args.metric))
    print(f"wrote {out}")
    return 0


def _cmd_inspect(args: argparse.Namespace, extra: list[str]) -> int:
    from .inspection import format_report, inspect_recipe

    report = inspect_recipe([args.recipe, *extra])
    print(format_report(report, max_groups=args.groups))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0


def _parse_pairs(items: list[str] | None, flag: str, form: str) -> dict[str, float]:
    """``NAME=VALUE`` items as {name: float}, or a ConfigError naming ``flag`` and the ``form`` it takes."""
    out = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise ConfigError(f"{flag}: expected {form}, got {item!r}.")
    return out


#: ``rookgrpo doctor``'s exit status for a log too short to judge (0: judged; 1: findings with --strict; 2: an error).
TOO_FEW_TO_JUDGE = 3


def _cmd_doctor(args: argparse.Namespace, extra: list[str]) -> int:
    import json

    from .doctor import Thresholds, diagnose, load_histories
    from .doctor.report import format_report, plot_findings, too_few

    histories = load_histories(args.run)
    weights = _parse_pairs(args.reward_weights, "--reward-weights", "NAME=W (e.g. accuracy=1 format=0.2)")
    results = []
    for history in histories:
        judges = tuple(args.judges) if args.judges is not None else history.judges
        thresholds = Thresholds(reward_weights=weights or history.reward_weights, judges=judges)
        short = too_few(history, thresholds)
        findings, skipped = ([], {}) if short else diagnose(history, thresholds)
        results.append((history, findings, skipped, short))
    if args.json:
        out = [{"source": h.source, "note": h.note, "judged": not short, "too_few": short,
                "findings": [f.to_dict() for f in findings], "skipped": skipped}
               for h, findings, skipped, short in results]
        print(json.dumps(out[0] if len(out) == 1 else {"phases": out}, indent=1))
    else:
        print("\n".join(format_report(h, findings, skipped, short) for h, findings, skipped, short in results), end="")
    if args.plot:
        history, findings = next(((h, f) for h, f, _, short in reversed(results) if not short), results[-1][:2])
        print(f"wrote {plot_findings(history, findings, args.plot)}", file=sys.stderr if args.json else sys.stdout)
    if all(short for *_, short in results):
        return TOO_FEW_TO_JUDGE
    return 1 if args.strict and any(findings for _, findings, _, _ in results) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rookgrpo", description="GRPO with TRL: chess and code rewards, recipes.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "train",
        help="train from a recipe through `accelerate launch` (extra --field value flags override the recipe)",
    )
    p.add_argument("recipe", help="recipe YAML, or a packaged recipe's name (e.g. rookworld-tiny; `rookgrpo recipes`)")
    p.set_defaults(func=_cmd_train, allow_extra=True)
    p = sub.add_parser(
        "preflight",
        help="the recipe's worst-case step (longest prompts, completions at max_completion_length) and a few typical "
             "ones, launched as training is: peak memory, step times, the run's time; exit 2 where it does not fit",
    )
    p.add_argument("recipe", help="recipe YAML or packaged recipe name (extra --field value flags override it)")
    p.set_defaults(func=_cmd_preflight, allow_extra=True)
    p = sub.add_parser("recipes", help="list the packaged recipes and accelerate configs; `recipes NAME --copy DIR` "
                                       "writes one out to edit")
    p.add_argument("name", nargs="?", default=None, help="a packaged recipe or accelerate config (e.g. rookworld-tiny)")
    p.add_argument("--copy", default=None, metavar="DIR", help="write NAME.yaml into DIR (refuses to overwrite)")
    p.set_defaults(func=_cmd_recipes, allow_extra=False)
    p = sub.add_parser(
        "inspect",
        help="one real training step of a recipe on one batch, printed phase by phase (one process, no launch)",
    )
    p.add_argument("recipe", help="recipe YAML or packaged recipe name (extra --field value flags override it)")
    p.add_argument("--json", default=None, help="also write the full report as JSON here")
    p.add_argument("--groups", type=int, default=4, help="groups to print in full (default 4)")
    p.set_defaults(func=_cmd_inspect, allow_extra=True)
    p = sub.add_parser("callbacks", help="list the registered callbacks; `callbacks NAME`: its fields, defaults and meaning")
    p.add_argument("name", nargs="?", default=None, help="a registered callback (e.g. adaptive_beta)")
    p.set_defaults(func=_cmd_callbacks, allow_extra=False)
    p = sub.add_parser("rewards", help="list the registered reward functions; `rewards audit RECIPE`: degenerate answers")
    p.set_defaults(func=_cmd_rewards, allow_extra=False)
    rewards_sub = p.add_subparsers(dest="rewards_command")
    rewards_sub.add_parser("list", help="list the registered reward functions (the default)")
    g = rewards_sub.add_parser(
        "audit", help="what degenerate answers (constant, exhaustive, copied) earn under a recipe's rewards and weights",
    )
    g.add_argument("recipe", help="recipe YAML or packaged recipe name: its reward_funcs, reward_weights and "
                   "stockfish_* settings are used")
    g.add_argument("--data", nargs="+", default=["rookgrpo/tiny-rookworld-eval"],
                   help="RookWorld data (files, directories, packaged names); default: rookgrpo/tiny-rookworld-eval")
    g.add_argument("--n", type=int, default=200,
                   help="positions per task and data set (default 200); for a code recipe, problems")
    g.add_argument("--seed", type=int, default=0, help="seed of the random-legal-move answers")
    g.add_argument("--depth", type=int, default=None, help="override the recipe's stockfish_depth")
    g.add_argument("--json", default=None, help="also write the tables as JSON here")
    p = sub.add_parser("data", help="RookWorld data tools")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    g = data_sub.add_parser("generate", help="generate RookWorld P:/A: lines with python-chess + Stockfish")
    g.add_argument("--tasks", default="P,A", help="P, A or P,A (default)")
    g.add_argument("--n", type=int, required=True, help="number of lines")
    g.add_argument("--out", required=True, help="output .txt (RookWorld lines) or .jsonl ({text: ...})")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--layout", choices=["padded", "compact"], default="padded")
    g.add_argument("--a-share", type=float, default=0.27, help="share of A: rows when both tasks (default 0.27)")
    g.add_argument("--max-plies", type=int, default=160,
                   help="stop each game after this many plies (default 160); e.g. 24 keeps positions in the opening")
    _add_engine_args(g)
    g.set_defaults(func=_pack_command("rookgrpo.chess.commands:data_generate"), allow_extra=False)
    p = sub.add_parser("evaluate", help="greedy completions on RookWorld prompts, scored with Stockfish")
    p.add_argument("--model", required=True, help="model path, hub id or rookgrpo/<name>")
    p.add_argument("--data", required=True, help="RookWorld data: .txt/.jsonl/.parquet file, directory or hub id")
    p.add_argument("--n", type=int, default=None, help="evaluate only the first N rows")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 1.25 x longest reference completion")
    p.add_argument("--out", default=None, help="JSON output (default MODEL/eval.json or ./eval.json)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 (default): greedy; > 0: sample at this temperature (no top-k/top-p), seeded by --seed")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (with --temperature or --samples)")
    p.add_argument("--device", default="auto",
                   help="where the model runs: auto (default: the GPU when there is one, else the CPU), cpu, cuda, "
                        "cuda:N, mps")
    p.add_argument("--samples", type=int, default=0,
                   help="headroom: also sample K completions per prompt and print greedy pass@1 against sampled pass@1 "
                        "and pass@k per task (what GRPO can sharpen)")
    p.add_argument("--task-temperature", nargs="*", default=None, metavar="TASK=T",
                   help="with --samples: each task's sampling temperature, e.g. P=0.5 A=0.6 (a recipe's "
                        "task_generation_kwargs); default --temperature, else 1.0")
    p.add_argument("--baseline", default=None,
                   help="an earlier evaluation's JSON (or a model's build_info.json): also print before → after")
    _add_engine_args(p)
    p.set_defaults(func=_pack_command("rookgrpo.chess.commands:evaluate_command"), allow_extra=False)
    p = sub.add_parser("plot", help="plot reward, KL, beta and zero-std share of a run (PNG + text curve)")
    p.add_argument("run_dir", help="a run's output_dir (holds trainer_state.json or checkpoint-*/)")
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/training_curves.png)")
    p.add_argument("--metric", default="reward", help="metric for the text curve (default: reward)")
    p.set_defaults(func=_cmd_plot, allow_extra=False)
    p = sub.add_parser("doctor", help="name every way a finished GRPO run failed, from its logs (any TRL run)",
                       description="Exit status: 0 judged (with or without findings), 1 findings with --strict, "
                                   "2 an error (nothing readable), 3 a log too short to judge.")
    p.add_argument("run", help="a run's output_dir, or a log file: trainer_state.json or any JSON holding its "
                               "log_history, a JSON list of logged dicts, JSON lines, a CSV export, TensorBoard events")
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw the curves with the findings marked")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when there is a finding (for CI)")
    p.add_argument("--reward-weights", nargs="*", default=None, metavar="NAME=W",
                   help="the run's reward weights by reward name (default: its run_info.json, else read off the log "
                        "where the logged reward determines them)")
    p.add_argument("--judges", nargs="*", default=None, metavar="NAME",
                   help="the rewards that are reward models (judges), for the causes a collapsed reward is given "
                        "(default: its run_info.json, else both a rule's and a judge's)")
    p.set_defaults(func=_cmd_doctor, allow_extra=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if extra and not args.allow_extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args, extra)
    except ConfigError as exc:  # every subcommand: one clear line, status 2
        print(f"rookgrpo: error: {exc}", file=sys.stderr)
        return 2


def _setup_logging() -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
