"""The three ways to launch, end to end in subprocesses: accelerate (two CPU ranks), `rookgrpo train`, `python -m`; and
every launch line of the README's and the how-to's launching sections, run as written."""

import re
import shlex
import sys

import pytest

from conftest import REPO, losses_and_rewards, read_json, run_cli, venv_bin, write_recipe

pytestmark = pytest.mark.slow


def test_rookgrpo_train_and_python_m_agree_and_flags_override(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", max_steps=6)
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    # accelerate launch picks its own OMP thread count; pin it so both runs reduce floats in the same order.
    threads = {"OMP_NUM_THREADS": "1"}
    a = run_cli([venv_bin("rookgrpo"), "train", str(recipe), "--max_steps", "3", "--output_dir", str(out_a)], env=threads)
    assert a.returncode == 0, a.stderr[-4000:]
    assert "accelerate launch" in a.stderr
    assert "were not passed" not in a.stderr  # accelerate's defaults are passed, so it has nothing to warn about
    b = run_cli([sys.executable, "-m", "rookgrpo", str(recipe), "--max_steps", "3", "--output_dir", str(out_b)],
                env=threads)
    assert b.returncode == 0, b.stderr[-4000:]
    state_a, state_b = read_json(out_a / "trainer_state.json"), read_json(out_b / "trainer_state.json")
    assert state_a["global_step"] == state_b["global_step"] == 3  # the flag beat the recipe's 6
    logs_a, logs_b = losses_and_rewards(state_a["log_history"]), losses_and_rewards(state_b["log_history"])
    assert len(logs_a) == 3 and logs_a == logs_b  # same seed, same numbers, whichever launcher


@pytest.mark.parametrize(
    "overrides, flags, message",
    [
        ({"learning_rat": 0.1}, [], "did you mean 'learning_rate'"),
        ({"reward_funcs": ["uci_charst"]}, [], "unknown reward 'uci_charst'"),
        ({"reward_funcs": ["rewards/missing.py:fn"]}, [], "reward file 'rewards/missing.py'"),
        ({"num_generations": 1, "per_device_train_batch_size": 4}, [], "num_generations: got 1"),
        ({}, ["--num_generation", "4"], "unknown command-line flag"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(tmp_path, overrides, flags, message):
    recipe = write_recipe(tmp_path / "r.yaml", **overrides)
    proc = run_cli([sys.executable, "-m", "rookgrpo", str(recipe), *flags])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "rookgrpo: error:" in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "run_info.json").exists()  # nothing trained


def test_rookgrpo_train_reports_recipe_errors_before_launching(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", learning_rat=0.1)
    proc = run_cli([venv_bin("rookgrpo"), "train", str(recipe)])
    assert proc.returncode == 2 and "did you mean 'learning_rate'" in proc.stderr
    assert "accelerate launch" not in proc.stderr


def test_a_gpu_recipe_on_a_machine_without_one_trains_on_cpu_with_one_notice(tmp_path):
    """No `use_cpu`, `bf16: true`, no GPU: one line says what changed, then it trains; never transformers' traceback."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    recipe = write_recipe(tmp_path / "r.yaml", max_steps=1, bf16=True)
    text = recipe.read_text().replace("use_cpu: true\n", "")
    recipe.write_text(text)
    assert "use_cpu" not in text
    proc = run_cli([venv_bin("rookgrpo"), "train", str(recipe)])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and "doesn't support bf16" not in proc.stderr
    notices = [line for line in proc.stderr.splitlines() if "no GPU here" in line]
    assert len(notices) == 1 and "use_cpu: true, bf16: false" in notices[0]
    assert read_json(tmp_path / "out" / "trainer_state.json")["global_step"] == 1


# ---- the docs' launch lines, as written ---------------------------------------------------------------------------

#: The sections whose command blocks say how to launch: (file, heading).
LAUNCH_SECTIONS = [("README.md", "## Launching on CPU, several processes and GPUs"),
                   ("docs/howto.md", "## Run on several GPUs, or several CPU processes")]
#: Accelerate configs that need GPUs: their lines are shown, not run, here.
GPU_CONFIGS = ("ddp", "zero2", "zero3", "fsdp")


def _same_launch(command: str) -> str:
    """A command with packaged recipes named as the CLI resolves them (``recipes/smoke.yaml`` is ``smoke``)."""
    return re.sub(r"(?<!\S)recipes/([\w-]+)\.yaml(?!\S)", r"\1", re.sub(r"\s+", " ", command))


def _launch_lines():
    lines, seen = [], {}
    for path, heading in LAUNCH_SECTIONS:
        text = (REPO / path).read_text()
        section = text[text.index(heading):]
        section = section[: section.find("\n## ", 1)]
        for block in re.findall(r"```bash\n(.*?)```", section, re.S):
            for line in block.splitlines():
                command = line.split("#", 1)[0].strip()
                if command:
                    several = re.search(r"--num_processes [2-9]|--multi_gpu|--accelerate_config", command)  # configs: 2+
                    marks = [pytest.mark.distributed] if several else []
                    first = seen.setdefault(_same_launch(command), f"{path}: {command}")
                    if first != f"{path}: {command}":  # the packaged recipe by path, launched by name above
                        marks.append(pytest.mark.skip(reason=f"the same launch as {first}, which runs"))
                    lines.append(pytest.param(command, id=f"{path}:{command[:60]}", marks=marks))
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("line", _launch_lines())
def test_every_launch_line_of_the_docs_runs_as_written(line, tmp_path):
    """Each CPU line, as written, plus a 2-step cap and an output folder; the world size the run saw is the one the
    line says (two processes for --num_processes 2 and cpu-ddp), in the layout it names, for both steps. GPU lines are
    shown only: they need GPUs (a GPU config with --use_cpu true, such as zero3 on 2 CPU processes, runs). A line that
    repeats an earlier one with the packaged recipe's path for its name is the same launch, run once."""
    words = shlex.split(line)
    config = words[words.index("--accelerate_config") + 1] if "--accelerate_config" in words else None
    if config in GPU_CONFIGS and "--use_cpu true" not in line:  # a GPU config on CPU processes runs here
        pytest.skip(f"needs GPUs (accelerate_config {config})")
    words[0] = venv_bin(words[0]) if words[0] in ("rookgrpo", "accelerate") else sys.executable
    proc = run_cli([*words, "--max_steps", "2", "--output_dir", str(tmp_path / "out")], env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = config == "cpu-ddp" or "--num_processes 2" in line
    info = read_json(tmp_path / "out" / "run_info.json")
    assert info["world_size"] == (2 if two else 1) and info["global_step"] == 2
    layout = "DEEPSPEED" if config in ("zero2", "zero3") else "MULTI_CPU" if two else "NO"
    assert layout in info["distributed_type"], info["distributed_type"]
    assert info["judges"] == []  # the doctor reads which rewards are reward models from here; a function is not


@pytest.mark.distributed
@pytest.mark.slow
def test_accelerate_launch_with_the_packaged_cpu_ddp_config_starts_two_processes(tmp_path):
    """`accelerate launch --config_file` with the packaged file, not only `rookgrpo train --accelerate_config`."""
    from rookgrpo.cli import resolve_accelerate_config

    config = resolve_accelerate_config("cpu-ddp")
    proc = run_cli([venv_bin("accelerate"), "launch", "--config_file", str(config), "-m", "rookgrpo", "smoke",
                    "--max_steps", "1", "--output_dir", str(tmp_path / "out")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = read_json(tmp_path / "out" / "run_info.json")
    assert info["world_size"] == 2 and "MULTI_CPU" in info["distributed_type"]
