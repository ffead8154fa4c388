"""The test kit's view of a project (repro.extras.testkit.project) and its pytest plugin, in this process:
the project's options, the tiny config it composes, the experiment each option is meant for,
the choices an experiment asks for that do not run, and the plugin acting only where asked.
(test_new_project.py and test_testkit_optin.py run them in generated projects.)"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from repro.extras.testkit import project as kit
from repro.extras.testkit.project import Project

from conftest import ROOT

pytest_plugins = ["pytester"]


@pytest.fixture
def conf(tmp_path) -> Path:
    """A copy of the template's conf/, as a project's; the engine's groups come with it."""
    return Path(shutil.copytree(ROOT / "conf", tmp_path / "conf"))


def test_a_folder_without_config_yaml_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"holds no config\.yaml \(set repro_conf"):
        Project(tmp_path)


def test_options_are_the_groups_own_files_sorted_and_stateful_ones_named_with_their_group(
    conf, tmp_path
):
    project = Project(conf, tmp_path / "runs")
    assert project.root == conf.parent and project.conf == conf.resolve()
    experiments = project.options("experiment")
    assert experiments == sorted(p.stem for p in (conf / "experiment").glob("*.yaml"))
    assert len(experiments) >= 2 and project.options("no_such_group") == []
    (conf / "callbacks").mkdir()
    (conf / "callbacks" / "watch.yaml").write_text("{}\n")
    (conf / "components").mkdir(exist_ok=True)
    (conf / "components" / "a_part.yaml").write_text("{}\n")
    stateful = project.stateful_options()
    assert stateful[0] == "callbacks=watch"
    assert "components=a_part" in stateful and all("=" in option for option in stateful)


def test_the_config_is_make_trains_cut_to_a_tiny_run_and_overrides_come_last(conf):
    project = Project(conf)
    cfg = project.config()
    assert cfg.trainer.max_steps == 4 and cfg.trainer.eval_every_steps == 2
    assert cfg.trainer.checkpoint_every_steps == 2 and cfg.trainer.save_checkpoints is True
    assert cfg.logger.fingerprint_every_steps == 1 and cfg.trainer.device == "cpu"
    assert cfg.trainer.num_threads == 1
    assert project.config("trainer.max_steps=6").trainer.max_steps == 6


def test_an_option_is_meant_for_the_first_experiment_that_chooses_it(conf):
    project = Project(conf)
    choosing = [e for e in project.options("experiment") if "cifar10" in e]
    assert project.meant_for("data", "cifar10") == [f"experiment={choosing[0]}"]
    assert project.meant_for("data", "imagefolder") == ["experiment=imagefolder_example"]
    assert project.meant_for("data", "synthetic") == []  # no experiment chooses it
    (conf / "metrics" / "mine.yaml").write_text("# @package metrics\n{}\n")
    (conf / "experiment" / "aaa.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /metrics: [top5, f1]\n"
    )
    assert project.meant_for("metrics", "f1") == ["experiment=aaa"]  # one of a list


PLAIN = """# @package _global_
defaults:
  - override /data: synthetic
trainer:
  epochs: 3
optimizer:
  lr: ${trainer.epochs}
"""


def test_the_choices_an_experiment_asks_for_that_do_not_run_are_named(conf):
    (conf / "experiment" / "plain.yaml").write_text(PLAIN)
    project = Project(conf)
    assert project.dropped_choices("plain") == []  # an interpolation is not compared
    # Choices made after the engine's list (experiments included) override the experiment's.
    (conf / "config.yaml").write_text(
        "defaults:\n  - engine\n  - override data: imagefolder\n  - _self_\ntrainer:\n  epochs: 7\n"
    )
    fresh = Project(conf)
    assert fresh.dropped_choices("plain") == [
        "data=synthetic (composed: imagefolder)",
        "trainer.epochs: 3 (composed: 7)",
    ]


LISTED = """# @package _global_
defaults:
  - override /metrics: [top5, f1]
  - _self_
trainer:
  epochs: 3
"""


def test_a_list_of_options_is_compared_as_a_set_and_a_plain_entry_is_passed(conf):
    (conf / "experiment" / "listed.yaml").write_text(LISTED)
    project = Project(conf)
    assert project.dropped_choices("listed") == []  # composed [f1, top5]: the same options
    (conf / "config.yaml").write_text(
        "defaults:\n  - engine\n  - override metrics: [f1]\n  - _self_\n"
    )
    assert Project(conf).dropped_choices("listed") == ["metrics=['top5', 'f1'] (composed: ['f1'])"]


def test_an_option_is_meant_only_for_an_experiment_that_chooses_it_whole(conf):
    project = Project(conf)
    chosen = project._choices("imagefolder_example")["data"]
    assert project.meant_for("data", chosen[:-1]) == []  # a prefix of the choice is not it
    assert project.runs.project == project.root


def test_leaves_are_dotted_keys_of_a_nested_dict_and_a_list_is_one():
    assert kit._leaves({"a": {"b": 1, "c": [1, 2]}, "d": {}}) == [
        ("a.b", 1),
        ("a.c", [1, 2]),
        ("d", {}),
    ]
    assert kit._leaves({}) == [] and kit._leaves(5) == []


KIT_TEST = """
def test_each_data_option(data_option, repro_project):
    assert data_option in repro_project.options("data")


def test_each_experiment(experiment_option):
    assert experiment_option
"""


def test_the_plugin_acts_only_where_a_project_asks_and_reads_its_conf(pytester, conf):
    """The plugin comes from the engine's entry point, as in a user's project."""
    pytester.makepyfile(test_kit=KIT_TEST)
    shutil.copytree(conf, pytester.path / "settings")
    data = sorted(p.stem for p in (conf / "data").glob("*.yaml"))
    experiments = sorted(p.stem for p in (conf / "experiment").glob("*.yaml"))
    pytester.makeini("[pytest]\nrepro_testkit = true\nrepro_conf = settings\n")
    asked = pytester.runpytest_inprocess("-q")
    asked.assert_outcomes(passed=len(data) + len(experiments))
    pytester.makeini("[pytest]\n")  # a suite that did not ask: no kit fixtures at all
    unasked = pytester.runpytest_inprocess("-q")
    unasked.assert_outcomes(errors=2)
    assert "fixture 'data_option' not found" in unasked.stdout.str()


def test_the_kit_stays_off_when_a_project_says_false_and_reads_conf_by_default(pytester, conf):
    pytester.makepyfile(test_kit=KIT_TEST)
    shutil.copytree(conf, pytester.path / "conf")
    pytester.makeini("[pytest]\nrepro_testkit = false\n")  # a bool: "false" is not a yes
    pytester.runpytest_inprocess("-q").assert_outcomes(errors=2)
    pytester.makeini("[pytest]\nrepro_testkit = true\n")  # no repro_conf: conf/ is read
    data = list((conf / "data").glob("*.yaml"))
    experiments = list((conf / "experiment").glob("*.yaml"))
    pytester.runpytest_inprocess("-q").assert_outcomes(passed=len(data) + len(experiments))
    helped = pytester.runpytest_inprocess("--help").stdout.str()
    assert re.search(
        r"\n  repro_testkit \(bool\):\s+run the repro test kit in this project\n", helped
    )
    said = r"\n  repro_conf \(string\):\s+the project's conf/ folder, from the rootdir\n"
    assert re.search(said, helped)


IDS_TEST = """
def test_each_stateful_option(stateful_option, repro_project):
    assert repro_project.runs._scratch is not None  # pytest's own folder, not a temporary one


def test_each_objective(objective_option):
    pass
"""


def test_each_option_is_a_test_named_by_it_and_the_runs_go_under_pytests_folder(pytester, conf):
    pytester.makepyfile(test_kit=IDS_TEST)
    shutil.copytree(conf, pytester.path / "conf")
    (pytester.path / "conf" / "callbacks").mkdir(exist_ok=True)
    (pytester.path / "conf" / "callbacks" / "mine.yaml").write_text("{}\n")
    pytester.makeini("[pytest]\nrepro_testkit = true\n")
    collected = pytester.runpytest_inprocess("--collect-only", "-q").stdout.lines
    found = _stateful(pytester.path / "conf")
    stateful = [f"test_kit.py::test_each_stateful_option[{o}]" for o in found]
    objectives = sorted(p.stem for p in (conf / "objective").glob("*.yaml"))
    named = [f"test_kit.py::test_each_objective[{o}]" for o in objectives]
    assert [line for line in collected if line.startswith("test_kit.py::")] == stateful + named
    pytester.runpytest_inprocess("-q", "-k", "stateful").assert_outcomes(passed=len(stateful))


def _stateful(conf: Path) -> list[str]:
    found = []
    for group in ("callbacks", "components"):
        found += [f"{group}={p.stem}" for p in sorted((conf / group).glob("*.yaml"))]
    return found


def test_a_tiny_run_trains_in_this_process_with_the_kits_config_and_its_overrides(conf, tmp_path):
    project = Project(conf)
    run = tmp_path / "run"
    summary = project.train(run, "trainer.max_steps=2", "data=synthetic", "data.train_size=64")
    assert summary["step"] == 2 and summary["total_steps"] == 2
    assert (run / "checkpoints" / "step-00000002.pt").is_file()  # a checkpoint every 2 steps
    steps = [line.split(",")[0] for line in (run / "fingerprints.csv").read_text().splitlines()]
    assert steps == ["1", "2"]  # every step
