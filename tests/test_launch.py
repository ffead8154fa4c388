"""What an entry point does before Hydra parses anything (repro.core.runtime.launch), in-process:
the hash seed, the recorded command, `seed=` shorthand, the run's name, torchrun's ranks."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from repro.core.runtime import distributed, launch


def test_the_entry_point_is_run_again_with_the_hash_seed_set_once(monkeypatch):
    runs = []
    monkeypatch.setattr(os, "execv", lambda path, argv: runs.append((path, argv)))
    monkeypatch.setattr(sys, "argv", ["/somewhere/train.py", "seed=3", "amp=bf16"])
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    launch.start("repro.train")
    assert os.environ["PYTHONHASHSEED"] == "0"
    again = [sys.executable, "-P", "-m", "repro.train", "seed=3", "amp=bf16"]
    assert runs == [(sys.executable, again)]
    monkeypatch.setenv("PYTHONHASHSEED", "")  # set, even if empty: the user's choice
    launch.start("repro.train")
    assert len(runs) == 1 and os.environ["PYTHONHASHSEED"] == ""
    monkeypatch.delenv("PYTHONHASHSEED")
    launch.start("repro.report", hash_seed=False)  # a tool that rebuilds no run: never again
    assert len(runs) == 1 and "PYTHONHASHSEED" not in os.environ


def test_start_takes_the_working_directory_off_the_path_and_lets_it_be_named_again(
    monkeypatch, tmp_path
):
    monkeypatch.chdir(tmp_path)
    here = os.getcwd()
    monkeypatch.setattr(sys, "path", [here, "/elsewhere", here])  # a user's own entry kept
    monkeypatch.setitem(sys.path_importer_cache, here, None)  # as the start-up hook leaves it
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    launch.start("repro.train")
    assert sys.path == ["/elsewhere", here] and here not in sys.path_importer_cache


def test_the_command_typed_is_kept_quoted_as_a_shell_would_need_it(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["x", "data.root=/my data", "seed=1", "+tag='a b'"])
    launch.record_command("repro.train")
    recorded = os.environ[launch.COMMAND_VARIABLE]
    assert recorded == "python -m repro.train 'data.root=/my data' seed=1 '+tag='\"'\"'a b'\"'\"''"


@pytest.mark.parametrize(
    ("typed", "given"),
    [
        ("seed=3", "seed.value=3"),
        ("seed=0,1,2", "seed.value=0,1,2"),
        ("seed=range(5)", "seed.value=range(5)"),
        ("seed=random", "seed=random"),
        ("seed=fixed", "seed=fixed"),
        ("seed=random,fixed", "seed=random,fixed"),
        ("seed=3, random", "seed=3, random"),
        ("seed.value=4", "seed.value=4"),
        ("my_seed=4", "my_seed=4"),
        ("seed=", "seed="),
    ],
)
def test_seed_shorthand_sets_the_value_and_leaves_the_groups_choices(typed, given):
    assert launch.expand_seed_shorthand(["amp=off", typed]) == ["amp=off", given]


def test_a_run_is_named_once_per_process_and_never_by_a_parents_name(monkeypatch):
    monkeypatch.delenv("REPRO_RUN", raising=False)
    stamp, token = launch.run_stamp(), launch.run_id()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d", stamp)
    assert re.fullmatch(r"[0-9a-f]{6}", token)
    assert os.environ["REPRO_RUN"] == f"{os.getpid()}:{stamp}:{token}"
    assert (launch.run_stamp(), launch.run_id()) == (stamp, token), "the same all run long"
    monkeypatch.setenv("REPRO_RUN", f"{os.getpid() + 1}:2020-01-01/00-00-00:abcdef")
    assert launch.run_id() != "abcdef", "a parent's (another pid's) name is not reused"
    monkeypatch.setenv("REPRO_RUN", f"{os.getpid()}:2020-01-01/00-00-00:")
    assert launch.run_stamp() != "2020-01-01/00-00-00", "a name without its id is made again"
    monkeypatch.setenv("REPRO_RUN", f"{os.getpid()}:2020-01-01/00-00-00:abcdef")
    assert (launch.run_stamp(), launch.run_id()) == ("2020-01-01/00-00-00", "abcdef")


def test_the_folder_resolvers_give_the_runs_name_once(monkeypatch):
    monkeypatch.setenv("REPRO_RUN", f"{os.getpid()}:2021-02-03/04-05-06:123abc")
    for name in ("run_id", "run_stamp"):
        if OmegaConf.has_resolver(name):
            OmegaConf.clear_resolver(name)
    launch.register_resolvers()
    cfg = OmegaConf.create(
        {"dir": "${run_stamp:}-${run_id:}", "id": "${run_id:}", "stamp": "${run_stamp:}"}
    )
    assert cfg.dir == "2021-02-03/04-05-06-123abc"
    monkeypatch.setenv("REPRO_RUN", f"{os.getpid()}:2022-02-03/04-05-06:ffffff")
    assert cfg.id == "123abc", "cached in the config: every reader sees one name"
    assert cfg.stamp == "2021-02-03/04-05-06"


def test_one_process_keeps_its_arguments(monkeypatch):
    argv = ["seed=1"]
    for world in (None, "1"):
        if world is None:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("WORLD_SIZE", world)
        assert launch.torchrun_argv(argv) is argv


@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_ranks_share_rank_zeros_name_and_only_it_writes_hydras_files(monkeypatch, rank):
    joined = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("REPRO_RUN", f"{os.getpid()}:2020-01-01/00-00-00:{rank}{rank}{rank}")
    monkeypatch.delenv("REPRO_DIST_BACKEND", raising=False)

    def join(context, backend):
        assert (context.rank, context.world) == (rank, 2)
        joined.append(backend)

    monkeypatch.setattr(distributed, "init", join)

    def from_rank_zero(value, context):
        assert context.rank == rank and context.world == 2
        assert value == ("2020-01-01/00-00-00", f"{rank}" * 3), "this rank's own name is sent"
        return ("2021-06-07/08-09-10", "0a0b0c")

    monkeypatch.setattr(distributed, "broadcast", from_rank_zero)
    argv = launch.torchrun_argv(["seed=1"])
    assert joined == ["auto"]
    assert os.environ["REPRO_RUN"] == f"{os.getpid()}:2021-06-07/08-09-10:0a0b0c"
    assert (launch.run_stamp(), launch.run_id()) == ("2021-06-07/08-09-10", "0a0b0c")
    if rank == 0:
        assert argv == ["seed=1"]
    else:
        assert argv == [
            "seed=1",
            "hydra.output_subdir=null",
            "hydra.job_logging.root.handlers=[console]",
            "hydra.job_logging.root.level=WARNING",
        ]
    monkeypatch.setenv("REPRO_DIST_BACKEND", "gloo")
    monkeypatch.setattr(distributed, "broadcast", lambda value, context: value)
    launch.torchrun_argv(["seed=1"])
    assert joined[-1] == "gloo"


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
@pytest.mark.parametrize(("hash_seed", "starts"), [("0", 1), (None, 2)])
def test_a_command_starts_one_interpreter_or_two_when_the_hash_seed_is_unset(
    tmp_path, hash_seed, starts
):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "PYTHONSAFEPATH")}
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = hash_seed
    trace = tmp_path / "trace"
    command = [sys.executable, "-m", "repro.verify", "--against"]  # a usage error, at once
    done = subprocess.run(
        ["strace", "-f", "-e", "trace=execve", "-o", str(trace), *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr
    started = [line for line in trace.read_text().splitlines() if "execve(" in line]
    assert sum(sys.executable in line for line in started) == starts, started
