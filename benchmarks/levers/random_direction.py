"""A perturbation control for docs/tiny-model.md: the packaged model moved as far as a trained run moved it, in a
random direction.

For every weight tensor, the run's change ``run - base`` is replaced by Gaussian noise of the same L2 norm (seeded), so
the result is exactly as far from the packaged model as the run, tensor by tensor, but in no learned direction. If
held-out greedy moves shift as much under this as under training, "a small change of the weights flips near-tied
moves" would explain the training's gains; if not, the direction matters::

    python benchmarks/levers/random_direction.py --run runs/ema-s42 --seed 0 --out runs/random-s42-r0
    rookgrpo evaluate --model runs/random-s42-r0 --data rookgrpo/tiny-rookworld-eval --depth 8 --baseline <before.json>

``--distance`` only prints how far each ``--run`` is from the base model (L2 over all weights), for several runs::

    python benchmarks/levers/random_direction.py --distance --run runs/ema-s42 runs/anchor-only-s42
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rookgrpo.assets import resolve_model


def delta_norms(base: dict, run: dict, run_dir) -> dict[str, torch.Tensor]:
    """Each tensor's L2 change from ``base`` to ``run`` (the two must hold the same tensors)."""
    if set(base) != set(run):
        raise SystemExit(f"--run {run_dir}: its tensors are not the base model's ({len(run)} against {len(base)})")
    return {name: (run[name].float() - w.float()).norm() for name, w in base.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="rookgrpo/tiny-rookworld")
    p.add_argument("--run", required=True, nargs="+",
                   help="a trained model directory whose per-tensor change sets the norms (several with --distance)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out")
    p.add_argument("--distance", action="store_true", help="only print each run's L2 distance from the base model")
    args = p.parse_args(argv)

    base_dir = Path(resolve_model(args.base))
    base = load_file(base_dir / "model.safetensors")
    if args.distance:
        size = sum(float(w.float().norm()) ** 2 for w in base.values()) ** 0.5
        for run_dir in args.run:
            norms = delta_norms(base, load_file(Path(run_dir) / "model.safetensors"), run_dir)
            d = sum(float(n) ** 2 for n in norms.values()) ** 0.5
            print(f"{run_dir}: L2 distance from {args.base} {d:.3f} ({d / size:.4f} of its norm)")
        return 0
    if len(args.run) != 1 or not args.out:
        raise SystemExit("give one --run and --out (or --distance)")
    run_dir, out = Path(args.run[0]), Path(args.out)
    norms = delta_norms(base, load_file(run_dir / "model.safetensors"), run_dir)
    gen = torch.Generator().manual_seed(args.seed)
    moved, total = {}, 0.0
    for name, w in base.items():
        norm = norms[name]
        noise = torch.randn(w.shape, generator=gen)
        moved[name] = (w.float() + noise * (norm / noise.norm().clamp(min=1e-12))).to(w.dtype).contiguous()
        total += float(norm) ** 2
    shutil.copytree(run_dir, out, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("checkpoint-*", "*.safetensors", "eval*.json", "*.png"))
    save_file(moved, out / "model.safetensors", metadata={"format": "pt"})
    print(f"wrote {out}: every tensor moved as far as in {run_dir} (in all {total ** 0.5:.3f}), in a random direction")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
