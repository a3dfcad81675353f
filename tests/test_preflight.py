"""``rookgrpo preflight``: the worst-case step before the run commits, under a real memory limit.

The recipe: a char GPT-2 (2 layers, width 64, 2048 positions) on 64 prompts, 63 of them about 20 characters and one of
1400 (row 40), 4 prompts x 4 completions per step, 16 steps (one epoch): the long prompt comes at step 13, and its batch
(TRL pads it to the long prompt) needs about twice the memory of the others. The limit is an address-space
rlimit (``RLIMIT_AS``) set in the subprocess, with glibc's arenas capped (``MALLOC_ARENA_MAX=2``) so the process's
address space follows its allocations: a limit the short steps fit under and the long one does not.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import pytest
import yaml

from conftest import REPO

pytestmark = pytest.mark.slow

# Measured here: the short steps fit in 2.2 GiB; the worst case (16 rows of 1416 tokens) needs over 4.2 GiB; half its
# rows (per_device_train_batch_size 8) fit from 3.2 GiB. The limit sits between those, 0.5 GiB from each.
CAP = int(3.7 * 2**30)
LONG_ROW, LONG_CHARS = 40, 1400


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    from rookgrpo.models.tiny_model import TinyGPT2Spec, build_tiny_gpt2

    root = tmp_path_factory.mktemp("preflight")
    build_tiny_gpt2(root / "model", TinyGPT2Spec(n_layer=2, n_head=4, n_embd=64, n_positions=2048))
    rows = [{"prompt": f"e2e4 move {i} " * 2} for i in range(64)]
    rows[LONG_ROW]["prompt"] = ("e2e4 d7d5 " * (LONG_CHARS // 10))
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "model_name_or_path": str(root / "model"), "dataset_name": str(root / "data.jsonl"),
        "reward_funcs": ["uci_charset"], "seed": 42, "use_cpu": True, "bf16": False, "report_to": "none",
        "save_strategy": "no", "learning_rate": 1e-3, "max_steps": 16, "per_device_train_batch_size": 16,
        "num_generations": 4, "max_completion_length": 16, "logging_steps": 1, "temperature": 1.0,
        "disable_tqdm": True}))
    return path


def _run(recipe, out, *flags, cap: int | None = None):
    def limit():
        if cap is not None:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "2"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rookgrpo", str(recipe), "--output_dir", str(out), *flags],
                          preexec_fn=limit, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    proc.seconds = time.perf_counter() - start
    proc.steps = proc.stdout.count("'step_time'")
    return proc


def test_preflight_fails_in_the_first_minute_under_a_cap_where_the_unguarded_run_fails_later(recipe, tmp_path):
    pre = _run(recipe, tmp_path / "pre", "--preflight", "only", cap=CAP)
    assert pre.returncode == 2, pre.stderr[-3000:]
    assert pre.seconds < 60
    error = pre.stderr.split("rookgrpo: error: ")[-1]
    assert error.startswith(f"preflight: the worst-case step does not fit under a limit of {CAP / 2**20:.0f} MiB "
                            "(RLIMIT_AS")
    assert f"4 prompt(s) of up to {LONG_CHARS} tokens x 4 completions of 16 tokens, per_device_train_batch_size 16" \
           in error
    assert "can't allocate memory" in error
    assert "Measured to fit: per_device_train_batch_size 8, gradient_accumulation_steps 2, steps_per_generation 1" \
           in error
    report = json.loads((tmp_path / "pre" / "preflight.json").read_text())
    assert report["fits"] is False and report["attempts"][0]["fits"] is False
    fitting = next(a for a in report["attempts"][1:] if a["fits"])
    assert 0 < fitting["peak_mib"] * 2**20 < CAP

    # The same recipe without the preflight: the short steps run, the long prompt's step dies
    run = _run(recipe, tmp_path / "run", cap=CAP)
    assert run.returncode != 0 and "can't allocate memory" in run.stderr
    assert run.steps >= 10, "it failed only later, after the steps that fit"

    # The settings the preflight measured to fit train the whole epoch, long prompt included, under the same limit
    fixed = _run(recipe, tmp_path / "fixed", *[str(x) for kv in fitting["settings"].items() for x in
                                             (f"--{kv[0]}", kv[1])], cap=CAP)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert fixed.steps == 16


@pytest.mark.alone  # its estimate is compared with a run's time: another test on the cores would skew one of them
def test_under_a_limit_that_fits_it_passes_and_estimates_the_run_within_a_quarter(recipe, tmp_path):
    run = _run(recipe, tmp_path / "run", "--preflight", "on", cap=2 * CAP)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert report["fits"] and report["shape"]["prompt_tokens"] == LONG_CHARS
    assert report["shape"]["completion_tokens_min"] == 16, "every worst-case completion at max_completion_length"
    assert report["run_steps"] == 16 and report["worst_step_seconds"] > 5 * report["typical_step_seconds"]
    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    runtime = next(h["train_runtime"] for h in history if "train_runtime" in h)
    print(f"estimate {report['estimate_seconds']:.1f} s, run {runtime:.1f} s")
    assert abs(report["estimate_seconds"] / runtime - 1) <= 0.25, (report["estimate_seconds"], runtime)
    assert run.steps == 2 + 8 + 16, "the worst case's 2 steps, the typical 8, then the run's 16"


# ---- parts ---------------------------------------------------------------------------------------------------------

def test_the_worst_case_is_the_longest_prompts_by_tokens_with_every_completion_at_the_limit(tiny_model_dir):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from rookgrpo.preflight import _force_length, longest_prompts

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = Dataset.from_dict({"prompt": ["ab", "abcdef", "a", "abcd"], "n": [0, 1, 2, 3]})
    rows, longest = longest_prompts(data, tokenizer, 3)
    assert rows["n"] == [1, 3, 0] and longest == 6
    rows, _ = longest_prompts(data.select([0, 1]), tokenizer, 3)  # fewer rows than a step takes: repeated
    assert rows["n"] == [1, 0, 1]

    class Args:
        generation_kwargs, use_vllm = '{"top_k": 5}', False

    args = Args()
    _force_length(args, 96)
    assert args.generation_kwargs == {"top_k": 5, "min_new_tokens": 96}
    args.use_vllm = True
    _force_length(args, 96)
    assert args.generation_kwargs["min_tokens"] == 96


def test_smaller_settings_keep_the_completions_per_optimizer_step():
    from rookgrpo.preflight import _candidates

    shape = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 1, "steps_per_generation": 1,
             "num_generations": 4, "processes": 1, "completion_tokens": 64}
    found = _candidates(shape)
    batches = [c for c in found if "max_completion_length" not in c]
    assert [(c["per_device_train_batch_size"], c["gradient_accumulation_steps"]) for c in batches] == [(8, 2), (4, 4)]
    assert all(c["per_device_train_batch_size"] * c["gradient_accumulation_steps"] == 16 for c in batches)
    assert [c["max_completion_length"] for c in found if "max_completion_length" in c] == [48, 32]


def test_a_bad_preflight_mode_is_refused_naming_the_field():
    from rookgrpo.errors import ConfigError
    from rookgrpo.preflight import normalize_mode

    assert [normalize_mode(v) for v in (True, False, "only", "on")] == ["on", "off", "only", "on"]
    with pytest.raises(ConfigError, match="preflight: 'maybe' is not a mode"):
        normalize_mode("maybe")


@pytest.mark.distributed  # two processes: `make test` runs these alone, after the rest
def test_on_two_processes_each_measures_its_own_worst_case(tmp_path):
    from conftest import run_cli, venv_bin

    proc = run_cli([venv_bin("rookgrpo"), "preflight", "smoke", "--num_processes", "2", "--use_cpu", "true",
                    "--max_steps", "10", "--output_dir", str(tmp_path / "out")], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "preflight.json").read_text())
    assert report["shape"]["processes"] == 2 and len(report["peak_mib_per_process"]) == 2
    assert report["peak_mib"] == max(report["peak_mib_per_process"]) > 0
    assert report["shape"]["completion_tokens_min"] == report["shape"]["completion_tokens"] == 16
    assert report["run_steps"] == 10 and not (tmp_path / "out" / "trainer_state.json").exists()  # `only`: no run
