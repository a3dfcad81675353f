"""The chess pack's commands (``rookgrpo rewards audit``, ``data generate``, ``evaluate``), dispatched to by
:mod:`rookgrpo.cli`, which holds their argument parsers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..cli import _parse_pairs, _read_yaml
from ..errors import ConfigError


def rewards_audit(args: argparse.Namespace) -> int:
    import time

    from .data import load_rookworld
    from .audit import audit, format_tables, recipe_rewards

    from ..recipe import resolve_recipe

    recipe = _read_yaml(str(resolve_recipe(args.recipe)))
    if args.depth is not None:
        recipe["stockfish_depth"] = args.depth
    funcs, weights, settings = recipe_rewards(recipe)
    if any(getattr(f, "__name__", "") in ("code_exec", "code_format") for f in funcs):
        from ..code.audit import audit_command

        return audit_command(args, recipe, funcs, weights)
    names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
    print(f"recipe {args.recipe}: rewards {', '.join(f'{n} x {w:g}' for n, w in zip(names, weights))}; "
          f"Stockfish depth {settings.depth}, nodes {settings.nodes}\n")
    report = []
    for data in args.data:
        start = time.perf_counter()
        lines = load_rookworld(data)["text"]
        tables = audit(funcs, weights, lines, settings, n=args.n, seed=args.seed, title=f"{data}: ")
        print(format_tables(tables))
        print(f"({time.perf_counter() - start:.1f} s)\n")
        report.append({"data": data, "tables": [t.as_dict() for t in tables]})
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"recipe": args.recipe, "weights": weights, "rewards": names,
                                               "depth": settings.depth, "data": report}, indent=2))
        print(f"wrote {args.json}")
    return 0


def _engine_settings(args: argparse.Namespace):
    from .engine import EngineSettings

    return EngineSettings(path=args.stockfish_path, depth=args.depth, nodes=args.nodes, workers=args.workers)


def data_generate(args: argparse.Namespace, extra: list[str]) -> int:
    from .data import generate, write_lines

    lines = generate(args.n, tasks=args.tasks.split(","), seed=args.seed, settings=_engine_settings(args),
                     layout=args.layout, a_share=args.a_share, max_plies=args.max_plies)
    write_lines(lines, args.out)
    print(f"wrote {len(lines)} lines to {args.out}")
    return 0


def evaluate_command(args: argparse.Namespace, extra: list[str]) -> int:
    from .evaluate import evaluate, format_table, write_json

    if args.samples:
        return _headroom(args)

    metrics = evaluate(args.model, args.data, n=args.n, batch_size=args.batch_size,
                       max_new_tokens=args.max_new_tokens, settings=_engine_settings(args),
                       temperature=args.temperature, seed=args.seed, device=args.device)
    print(format_table(metrics))
    if args.baseline:
        from .evaluate import format_comparison

        if not Path(args.baseline).is_file():
            raise ConfigError(f"--baseline: {args.baseline} does not exist; give an earlier `rookgrpo evaluate` JSON.")
        print(f"\ncompared with {args.baseline}:")
        baseline = json.loads(Path(args.baseline).read_text())
        # A model's build_info.json (scripts/build_tiny_model.py) holds its evaluation under "eval".
        baseline = baseline["eval"] if isinstance(baseline.get("eval"), dict) else baseline
        print(format_comparison(baseline, metrics))
    out = args.out or str(Path(args.model if Path(args.model).is_dir() else ".") / "eval.json")
    write_json(metrics, out)
    print(f"wrote {out}")
    return 0


def _parse_task_temperatures(items: list[str] | None) -> dict[str, float]:
    return _parse_pairs(items, "--task-temperature", "TASK=T (e.g. P=0.5 A=0.6)")


def _headroom(args: argparse.Namespace) -> int:
    from .evaluate import format_headroom, headroom, write_json

    temps = _parse_task_temperatures(args.task_temperature)
    if args.temperature:
        temps = {"P": args.temperature, "A": args.temperature, **temps}
    result = headroom(args.model, args.data, samples=args.samples, temperatures=temps, n=args.n,
                      batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, settings=_engine_settings(args),
                      seed=args.seed, device=args.device)
    print(format_headroom(result))
    if args.out:
        write_json(result, args.out)
        print(f"wrote {args.out}")
    return 0
