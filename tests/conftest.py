"""Shared fixtures: a tiny char-level GPT-2 built locally, offline settings, and helpers to run the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# No test may touch the network: hub lookups fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... under pytest -n N (make test)
if _WORKER:
    # Several workers share the cores: OpenMP threads that wait sleep instead of spinning on a core another worker's
    # process needs (the thread counts, and so every number, stay as in one process).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Each worker is its own job on this machine: its own sandbox uids (the hostile corpus counts what runs under them)
    # and its own temporary folder (where sandboxes make their work dirs, which the corpus checks are all removed).
    from rookgrpo.code.sandbox import SANDBOX_UID_BASE, UID_BASE_ENV, UIDS_PER_JOB

    os.environ[UID_BASE_ENV] = str(SANDBOX_UID_BASE + UIDS_PER_JOB * int(_WORKER.removeprefix("gw") or 0))
    _tmp = Path("/tmp") / f"pytest-worker-{os.getuid()}-{_WORKER}"
    _tmp.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(_tmp)
    tempfile.tempdir = None  # read TMPDIR again


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` (``make test``): a test that uses a module- or class-scoped fixture runs on its file's
    worker, so that fixture is built once; every other test goes to whichever worker is free."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        scopes = {d.scope for defs in (info.name2fixturedefs.values() if info else ()) for d in defs}
        if scopes & {"module", "class", "package"}:
            item.add_marker(pytest.mark.xdist_group(item.path.name))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Packaged short names build into a per-session cache, so tests never reuse a stale model."""
    if _WORKER:  # one cache for all of this run's workers (pytest-N/): a packaged model builds once, under its lock
        cache = tmp_path_factory.getbasetemp().parent / "rookgrpo-cache"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("rookgrpo-cache")
    old = os.environ.get("ROOKGRPO_CACHE")
    os.environ["ROOKGRPO_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("ROOKGRPO_CACHE", None)
    else:
        os.environ["ROOKGRPO_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rookgrpo.models.tiny_model import build_tiny_gpt2

    return build_tiny_gpt2(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture()
def smoke_dataset():
    from rookgrpo.data import load_recipe_dataset

    return load_recipe_dataset("rookgrpo/smoke-prompts").select(range(32))


def tiny_grpo_args(output_dir, **overrides):
    """A GRPO config small enough for a CPU unit test (a few seconds per run)."""
    from rookgrpo import RookGRPOConfig

    values = dict(
        output_dir=str(output_dir),
        seed=7,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        learning_rate=1e-2,
        max_steps=3,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    values.update(overrides)
    return RookGRPOConfig(**values)


def vanilla_args(rook_args, output_dir):
    """A plain TRL ``GRPOConfig`` with the same settings as a ``tiny_grpo_args`` config (rookgrpo fields dropped)."""
    from trl import GRPOConfig

    keys = ("seed", "use_cpu", "bf16", "gradient_checkpointing", "report_to", "save_strategy", "learning_rate",
            "max_steps", "per_device_train_batch_size", "num_generations", "max_completion_length", "logging_steps",
            "disable_tqdm", "dataloader_num_workers", "beta", "scale_rewards", "steps_per_generation",
            "gradient_accumulation_steps", "num_iterations", "temperature")
    return GRPOConfig(**{k: getattr(rook_args, k) for k in keys}, output_dir=str(output_dir))


def write_recipe(path: Path, **overrides) -> Path:
    """Write the smoke recipe with overrides, pointed at an output dir inside the test's tmp dir."""
    import yaml

    recipe = yaml.safe_load((REPO / "recipes" / "smoke.yaml").read_text())
    recipe.update(max_steps=4, logging_steps=1, per_device_train_batch_size=8, num_generations=4,
                  output_dir=str(path.parent / "out"))
    recipe.update(overrides)
    path.write_text(yaml.safe_dump(recipe))
    return path


def run_cli(args: list[str], cwd: Path = REPO, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a command from the venv's bin (or ``python -m``) and capture its output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(args, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def write_flat_data(path: Path, n: int) -> Path:
    """``n`` smoke prompts as JSONL with a ``signal`` column (even rows), the data of ``tests/assets/flat_reward.py``."""
    from rookgrpo.data import load_recipe_dataset

    rows = load_recipe_dataset("rookgrpo/smoke-prompts").select(range(n))
    path.write_text("".join(json.dumps({"prompt": r["prompt"], "signal": i % 2 == 0}) + "\n" for i, r in enumerate(rows)))
    return path


def write_flat_recipe(tmp_path: Path, n_prompts: int, max_steps: int, callbacks: list) -> Path:
    """The smoke recipe on ``n_prompts`` flat-data prompts with the ``mostly_flat`` reward and ``callbacks``."""
    data = write_flat_data(tmp_path / "flat.jsonl", n_prompts)
    return write_recipe(tmp_path / "r.yaml", max_steps=max_steps, dataset_name=str(data), beta=0.0,
                        reward_funcs=[str(REPO / "tests/assets/flat_reward.py") + ":mostly_flat"], callbacks=callbacks)


def launch_two_cpu_processes(recipe: Path, probe_dir: Path, timeout: int = 600) -> list[list[dict]]:
    """Train ``recipe`` on two CPU ranks (gloo); returns what each rank's probe callback wrote (``rank-R.jsonl``)."""
    probe_dir.mkdir(exist_ok=True)
    proc = run_cli([venv_bin("accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "-m", "rookgrpo",
                    str(recipe), "--use_cpu", "true"],
                   env={"ROOKGRPO_TEST_PROBE_DIR": str(probe_dir), "PYTHONPATH": str(REPO / "tests" / "assets")},
                   timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [[json.loads(line) for line in (probe_dir / f"rank-{r}.jsonl").read_text().splitlines()] for r in (0, 1)]


def venv_bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def losses_and_rewards(log_history: list[dict]) -> list[dict]:
    """The per-step numbers that must match between two runs (timings excluded; reward isolation's own counts,
    ``rewards/<name>/failed`` and ``/none``, which a TRL run does not log, left out)."""
    keep = ("loss", "reward", "reward_std", "grad_norm", "entropy", "frac_reward_zero_std", "completions/mean_length")
    return [
        {k: v for k, v in h.items()
         if k in keep or k.startswith("rewards/") and not k.endswith(("/failed", "/none"))}
        for h in log_history
        if "loss" in h
    ]


def load_script(path: Path | str, name: str | None = None):
    """Import a script that is not part of the package (``scripts/``, ``benchmarks/``) as a module."""
    import importlib.util

    path = Path(path)
    if str(path.parent) not in sys.path:  # its siblings (benchmarks/common.py), as when run as a script
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: a dataclass in it looks its module up there
    spec.loader.exec_module(module)
    return module


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="session")
def engine_settings():
    """Low-depth Stockfish: real engine, fast enough for the suite."""
    from rookgrpo.chess.engine import EngineSettings

    return EngineSettings(depth=6, workers=2)


@pytest.fixture(scope="session")
def generated_lines(engine_settings):
    """A small mixed P:/A: RookWorld sample from the project's own generator (deterministic)."""
    from rookgrpo.chess.data import generate

    return generate(120, seed=11, settings=engine_settings, progress=False)


# ---- a vLLM server the vLLM legs share (tests/test_vllm_server.py, tests/test_async_grpo.py) ------------------------

@pytest.fixture(scope="session")
def chat_qwen2(tmp_path_factory) -> Path:
    """A tiny Qwen2 (head size 32, grouped-query attention) with a BPE tokenizer trained on RookWorld lines and
    Qwen2.5's own chat template (TRL's copy): the code recipe's architecture, and a chat model TRL's async trainer
    recognises."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from rookgrpo.chess.data import prepare_rookworld
    from rookgrpo.data import load_recipe_dataset
    from rookgrpo.models.shapes import build_qwen2_shape

    texts = list(prepare_rookworld(load_recipe_dataset("rookgrpo/tiny-rookworld-grpo"))["text"][:400])
    texts += [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(200)]
    model = build_qwen2_shape(tmp_path_factory.mktemp("chat-qwen2") / "model", texts, hidden_size=64,
                              num_attention_heads=2, num_key_value_heads=1, intermediate_size=128, vocab_size=512)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.save_pretrained(str(model))
    return model


@pytest.fixture(scope="session")
def chat_qwen2_server(chat_qwen2, tmp_path_factory):
    """One ``vllm serve`` of :func:`chat_qwen2` with the CPU weight transport, started once for the session (about
    40 s each), with chunked prefill off as TRL's async rollout worker needs on CPU (rookgrpo.async_grpo_cpu)."""
    from rookgrpo.async_grpo_cpu import SERVER_FLAGS
    from vllm_checks import Server

    server = Server(chat_qwen2, tmp_path_factory.mktemp("chat-qwen2-log") / "serve.log", extra=list(SERVER_FLAGS))
    yield server
    server.stop()
