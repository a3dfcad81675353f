"""Recipe parsing, command-line overrides, launch-command building and the errors raised before training."""

import os
from pathlib import Path

import pytest
import yaml

from conftest import REPO, write_recipe
from rookgrpo import ConfigError, RookGRPOTrainer
from rookgrpo.cli import launch_command, resolve_accelerate_config
from rookgrpo.recipe import parse_recipe


def test_recipe_values_load_and_flags_override_them(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", learning_rate=0.01, max_steps=4)
    script, train, model = parse_recipe([str(recipe), "--learning_rate", "1e-6"])
    assert train.learning_rate == 1e-6  # flag wins
    assert train.max_steps == 4  # recipe value kept
    assert script.reward_funcs == ["uci_charset"]
    assert model.model_name_or_path == "rookgrpo/tiny-random"
    # TRL's own `--config` spelling works too.
    _, train2, _ = parse_recipe(["--config", str(recipe)])
    assert train2.learning_rate == 0.01


def test_unknown_recipe_key_is_named_with_a_suggestion(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", learning_rat=0.1)
    with pytest.raises(ConfigError) as err:
        parse_recipe([str(recipe)])
    msg = str(err.value)
    assert "unknown key in recipe" in msg and "'learning_rat'" in msg and "did you mean 'learning_rate'" in msg


def test_unknown_command_line_flag_is_an_error(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml")
    with pytest.raises(ConfigError, match="unknown command-line flag: 'max_step'"):
        parse_recipe([str(recipe), "--max_step", "3"])


def test_num_generations_one_is_rejected_with_the_fix(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", num_generations=1, per_device_train_batch_size=4)
    with pytest.raises(ConfigError, match=r"num_generations: got 1.*at least 2.*Set num_generations to 2 or more"):
        parse_recipe([str(recipe)])


def test_missing_recipe_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        parse_recipe([str(tmp_path / "missing.yaml")])


def test_trainer_rejects_num_generations_one_from_a_plain_config(tiny_model_dir, smoke_dataset, tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                      num_generations=2, per_device_train_batch_size=4)
    args.num_generations = 1  # slipped past the config (e.g. mutated after construction)
    with pytest.raises(ConfigError, match="num_generations"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=args, train_dataset=smoke_dataset)


def test_unknown_reward_fails_before_the_model_loads(smoke_dataset, tmp_path):
    from conftest import tiny_grpo_args

    # The model path does not exist: reaching model loading would raise OSError, not ConfigError.
    with pytest.raises(ConfigError, match="unknown reward 'not_a_reward'"):
        RookGRPOTrainer(model=str(tmp_path / "no-model"), reward_funcs=["not_a_reward"],
                        args=tiny_grpo_args(tmp_path), train_dataset=smoke_dataset)


def test_missing_prompt_column_is_named(tiny_model_dir, tmp_path):
    from datasets import Dataset

    from conftest import tiny_grpo_args

    ds = Dataset.from_dict({"text": ["P: 8/8 w"] * 8})
    with pytest.raises(ConfigError, match="no 'prompt' column.*dataset_prompt_column"):
        RookGRPOTrainer(model=str(tiny_model_dir), reward_funcs="uci_charset", args=tiny_grpo_args(tmp_path),
                        train_dataset=ds)


def test_launch_command_takes_accelerate_keys_from_recipe_and_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the repository: the packaged config is found by name
    recipe = write_recipe(tmp_path / "r.yaml", accelerate_config="cpu-ddp", num_processes=2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # else the CPU config also passes each process its share of cores
    args = launch_command([str(recipe), "--max_steps", "2"])
    packaged = Path(__import__("rookgrpo").__file__).parent / "recipes" / "accelerate" / "cpu-ddp.yaml"
    assert args[:4] == ["--config_file", str(packaged), "--num_processes", "2"]
    # cpu-ddp is a CPU config: the run is told to train on CPU (accelerate's torchrun launcher does not tell it)
    assert args[4:] == ["-m", "rookgrpo", "--config", str(recipe), "--max_steps", "2", "--use_cpu", "true"]
    monkeypatch.delenv("OMP_NUM_THREADS")
    args = launch_command([str(recipe)])
    assert args[args.index("--num_cpu_threads_per_process") + 1] == str(max(1, (os.cpu_count() or 1) // 2))
    # Flags win over the recipe and are consumed, not forwarded to training.
    args = launch_command([str(recipe), "--num_processes", "1", "--accelerate_config=ddp"])
    assert "--num_processes" in args and args[args.index("--num_processes") + 1] == "1"
    assert args[1].endswith("ddp.yaml") and "--accelerate_config=ddp" not in args


def test_launch_without_gpu_gives_each_process_its_share_of_the_cores(tmp_path, monkeypatch):
    """accelerate would run a CPU process on one thread (OMP_NUM_THREADS=1) unless told otherwise."""
    import os

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    recipe = write_recipe(tmp_path / "r.yaml")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for processes, flags in ((1, []), (2, ["--num_processes", "2"])):
        args = launch_command([str(recipe), *flags])
        threads = args[args.index("--num_cpu_threads_per_process") + 1]
        assert int(threads) == max(1, os.cpu_count() // processes)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's setting stands
    assert "--num_cpu_threads_per_process" not in launch_command([str(recipe)])


def test_accelerate_config_names_resolve_to_files(monkeypatch):
    monkeypatch.chdir(REPO)
    for name in ("cpu-ddp", "ddp", "zero2", "zero3", "fsdp"):
        path = resolve_accelerate_config(name)
        config = yaml.safe_load(path.read_text())
        assert "distributed_type" in config
        first_line = path.read_text().splitlines()[0]
        assert first_line.startswith(f"# {name}:"), f"{name} lacks its one-line 'when to use' comment"
    assert resolve_accelerate_config("zero1").name == "zero1.yaml"  # TRL's bundled configs by name
    with pytest.raises(ConfigError, match="neither a file nor a known config name"):
        resolve_accelerate_config("zero9")


@pytest.mark.parametrize("recipe", sorted(p.name for p in (REPO / "recipes").glob("*.yaml")))
def test_every_shipped_recipe_parses(recipe, monkeypatch):
    monkeypatch.chdir(REPO)
    script, train, model = parse_recipe([f"recipes/{recipe}", "--use_cpu", "true", "--bf16", "false"])
    assert model.model_name_or_path and script.dataset_name and script.reward_funcs
    from rookgrpo.rewards import resolve_reward_func

    for entry in script.reward_funcs:
        resolved = resolve_reward_func(entry)
        assert callable(resolved) or (Path(resolved) / "config.json").exists()  # a function, or a judge's directory


def test_no_gpu_means_cpu_without_mixed_precision_with_one_notice(tmp_path, caplog):
    import logging

    import torch

    from rookgrpo import RookGRPOConfig

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with caplog.at_level(logging.WARNING, logger="rookgrpo.config"):
        args = RookGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, bf16=True)
        kept = RookGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                              use_cpu=True, bf16=False)
    assert args.use_cpu and not args.bf16 and args.device.type == "cpu"
    assert kept.use_cpu and not kept.bf16
    notices = [r.getMessage() for r in caplog.records if "no GPU here" in r.getMessage()]
    assert notices == ["no GPU here: training on CPU without mixed precision (use_cpu: true, bf16: false). Set these "
                       "in the recipe to silence this notice."]  # once, for the recipe that did not say; none for the one that did


def test_a_deepspeed_run_on_cpu_builds_no_inference_kernel(tmp_path, monkeypatch):
    """Under DeepSpeed on CPU processes the config marks DeepSpeed's shared-memory inference kernel (tensor-parallel
    inference only) unbuildable, so its communication backend starts without a minute of gcc: ``build_shm_op``, which
    the backend calls at start, returns ``None`` instead of compiling or loading it. Without DeepSpeed nothing changes."""
    import torch

    deepspeed = pytest.importorskip("deepspeed")
    from deepspeed.comm.torch import build_shm_op

    from rookgrpo import RookGRPOConfig

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    name = "deepspeed_shm_comm"
    ops = deepspeed.ops.__compatible_ops__
    monkeypatch.setitem(ops, name, True)  # as DeepSpeed probes it on a machine with a compiler; restored after
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    kwargs = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, use_cpu=True, bf16=False)
    RookGRPOConfig(**kwargs)
    assert ops[name] is True  # not a DeepSpeed run: untouched
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setattr(RookGRPOConfig.__mro__[1], "__post_init__", lambda self: None)  # no DeepSpeed state here
    RookGRPOConfig(**kwargs)
    assert ops[name] is False and build_shm_op() is None
