"""The mutation harnesses themselves, read without running a mutant: scripts/mutants.py's
hand-written bugs must name code that is there, once, and tests that exist; scripts/mutation.py's
table must name every module of its targets and test files that exist, and its score must
leave out only the equivalents that still change what was reviewed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import ROOT


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


mutants = _script("mutants")


def test_every_hand_written_mutant_names_code_found_once_and_tests_that_exist():
    assert mutants.problems(mutants.MUTANTS) == []


def test_a_test_that_does_not_exist_is_an_error_naming_it_before_anything_runs(monkeypatch):
    first = mutants.MUTANTS[0]
    gone = mutants.Mutant(
        "gone", "a renamed test", first.file, first.old, first.new,
        (first.tests[0], "test_resume_state.py::test_that_was_renamed", "test_no_such_file.py"),
    )  # fmt: skip
    moved = mutants.Mutant("moved", "moved code", "no/such/module.py", "x", "y", first.tests)
    found = mutants.problems([gone, moved])
    assert found == [
        "mutant gone: no test tests/test_resume_state.py::test_that_was_renamed",
        "mutant gone: no test file tests/test_no_such_file.py",
        "mutant moved: no file src/repro/no/such/module.py",
    ]

    def refused(*args, **kwargs):
        raise AssertionError("nothing may run before the mutants are checked")

    monkeypatch.setattr(mutants, "MUTANTS", [gone])
    monkeypatch.setattr(mutants, "scratch_copy", refused)
    monkeypatch.setattr(subprocess, "run", refused)
    with pytest.raises(SystemExit, match=r"test_resume_state\.py::test_that_was_renamed"):
        mutants.main([])


def test_code_found_twice_is_an_error_too():
    first = mutants.MUTANTS[0]
    twice = mutants.Mutant("twice", "ambiguous", first.file, "self", "that", first.tests)
    [said] = mutants.problems([twice])
    assert said.startswith("mutant twice: its code is ") and "times in core/engine/loop.py" in said


def test_a_parametrized_case_is_checked_by_its_function():
    [test] = mutants.MUTANTS[-2].tests
    assert "[" in test  # export-normalisation names one case
    assert mutants.defined_tests(ROOT / "tests" / test.split("::")[0]) >= {
        test.split("::")[1].split("[")[0]
    }


# scripts/mutation.py: mutmut over the engine's modules, each against the fast tests its table
# names.
mutation = _script("mutation")


def test_the_table_maps_every_module_of_its_targets_to_test_files_that_exist():
    table = mutation.read_table()
    assert mutation.table_problems(table, mutation.read_equivalents()) == []
    assert f"{mutation.PACKAGE}/core/runs/integrity.py" in table.tests
    assert any(module.startswith("hydra_plugins/") for module in table.tests)


def test_a_module_left_out_a_stray_entry_and_a_missing_test_file_are_named(tmp_path):
    for name in ("a.py", "b.py", "sub/c.py"):
        (tmp_path / "src" / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / "pkg" / name).write_text("def f():\n    return 1\n")
    (tmp_path / "src" / "pkg" / "__init__.py").write_text('"""Nothing to mutate."""\n')
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    table = mutation.Table(
        ("pkg/",), {"pkg/a.py": ("test_a.py",), "pkg/sub/c.py": ("test_gone.py",), "pkg/d.py": ()}
    )
    loose = mutation.Equivalent("other.x_f__mutmut_1", "- a\n+ b", "a reason")
    assert mutation.table_problems(table, [loose], root=tmp_path) == [
        "pkg/b.py: a module of the targets with no tests in the table",
        "pkg/sub/c.py: no test file tests/test_gone.py",
        "pkg/d.py: in the table but no module with functions under the targets",
        "pkg/d.py: no test files",
        "equivalent other.x_f__mutmut_1: of no module in the table",
    ]


def test_arguments_name_a_module_or_a_folder_under_the_package_or_src():
    table = mutation.read_table()
    package = mutation.PACKAGE
    assert mutation.choose(table, ["core/runs/integrity.py"]) == [
        f"{package}/core/runs/integrity.py"
    ]
    assert mutation.choose(table, [f"src/{package}/core/runs/integrity.py"]) == [
        f"{package}/core/runs/integrity.py"
    ]
    sweeps = mutation.choose(table, ["core/sweeps/"])
    assert sweeps and all(module.startswith(f"{package}/core/sweeps/") for module in sweeps)
    assert mutation.choose(table, ["hydra_plugins"]) == [
        module for module in table.tests if module.startswith("hydra_plugins/")
    ]
    assert mutation.choose(table, []) == list(table.tests)
    with pytest.raises(SystemExit, match=r"runs/nothing\.py: no module"):
        mutation.choose(table, ["runs/nothing.py"])


DIFF = """--- src/repro/m.py
+++ src/repro/m.py
@@ -1,3 +1,3 @@
 def f(x):
-    return x + 1
+    return x - 1
"""


def test_an_equivalent_leaves_the_score_only_while_it_changes_the_same_lines(capsys):
    assert mutation.changed_lines(DIFF) == "- return x + 1\n+ return x - 1"
    stale = DIFF.replace("x - 1", "x * 1")
    result = {"mutants": {
        "repro.m.x_f__mutmut_1": {"status": "killed", "diff": ""},
        "repro.m.x_f__mutmut_2": {"status": "survived", "diff": DIFF},
        "repro.m.x_f__mutmut_3": {"status": "survived", "diff": stale},
        "repro.m.x_f__mutmut_10": {"status": "no tests", "diff": DIFF},
        "repro.m.x_f__mutmut_4": {"status": "timeout", "diff": ""},
    }}  # fmt: skip
    changes = "- return x + 1\n+ return x - 1"
    listed = {
        name: mutation.Equivalent(name, changes, "reviewed")
        for name in ("repro.m.x_f__mutmut_1", "repro.m.x_f__mutmut_2", "repro.m.x_f__mutmut_3")
    }
    notes: list[str] = []
    counted = mutation.tally(result, listed, notes)
    assert (counted.total, counted.killed, counted.equivalent) == (5, 2, 1)
    assert [name for name, _, _ in counted.survivors] == [
        "repro.m.x_f__mutmut_3", "repro.m.x_f__mutmut_10"
    ]  # fmt: skip
    assert counted.score() == "2/4 = 50.0%"
    assert notes == [
        "repro.m.x_f__mutmut_1: listed as equivalent but a test kills it: drop the entry",
        "repro.m.x_f__mutmut_3: listed as equivalent, but it now changes other lines",
    ]
    mutation.show("repro/m.py", counted, 3.0)
    assert capsys.readouterr().out.splitlines() == [
        "repro/m.py: 5 mutants, 2 killed, 2 survived, 1 equivalent; score 2/4 = 50.0%; 3 s",
        "  SURVIVED repro.m.x_f__mutmut_3",
        "      - return x + 1",
        "      + return x * 1",
        "  NO TEST reaches these functions (their mutants): x_f (1)",
    ]


def test_a_run_again_takes_its_survivors_new_statuses_and_keeps_the_rest_of_the_last_run():
    previous = {
        "seconds": 900.0,
        "mutants": {
            "repro.m.x_f__mutmut_1": {"status": "killed", "diff": ""},
            "repro.m.x_f__mutmut_2": {"status": "survived", "diff": DIFF},
            "repro.m.x_f__mutmut_3": {"status": "no tests", "diff": DIFF.replace("x - 1", "x")},
            "repro.m.x_f__mutmut_4": {"status": "survived", "diff": DIFF.replace("x - 1", "x * 1")},
        },
    }
    assert mutation.survivors_of(previous) == [f"repro.m.x_f__mutmut_{n}" for n in (2, 3, 4)]
    rerun = {
        "mutants": {
            "repro.m.x_f__mutmut_2": {"status": "killed", "diff": DIFF},
            "repro.m.x_f__mutmut_3": {"status": "timeout", "diff": DIFF.replace("x - 1", "x")},
            "repro.m.x_f__mutmut_4": {"status": "survived", "diff": DIFF.replace("x - 1", "x * 1")},
        }
    }
    merged = mutation.merged_again(previous, rerun)
    assert merged["seconds"] == 900.0  # the whole run's time
    statuses = {name: found["status"] for name, found in merged["mutants"].items()}
    assert statuses == {
        "repro.m.x_f__mutmut_1": "killed",
        "repro.m.x_f__mutmut_2": "killed",
        "repro.m.x_f__mutmut_3": "timeout",
        "repro.m.x_f__mutmut_4": "survived",
    }
    assert [found["diff"] for found in merged["mutants"].values()] == [
        "",
        "",
        "",
        rerun["mutants"]["repro.m.x_f__mutmut_4"]["diff"],
    ]
    assert previous["mutants"]["repro.m.x_f__mutmut_2"]["status"] == "survived", "a copy"
    changed = {
        "mutants": {
            **rerun["mutants"],
            "repro.m.x_f__mutmut_2": {"status": "survived", "diff": DIFF.replace("x - 1", "x + 2")},
        }
    }
    assert mutation.merged_again(previous, changed) == {
        "error": "repro.m.x_f__mutmut_2 is not the change it was in the last run: the module "
        "changed since, run it whole (without --again)"
    }
    fewer = {"mutants": {"repro.m.x_f__mutmut_2": rerun["mutants"]["repro.m.x_f__mutmut_2"]}}
    assert mutation.merged_again(previous, fewer) == {
        "error": "mutmut did not run 2 of the survivors again"
    }
    assert mutation.merged_again(previous, {"error": "mutmut stopped (1)"}) == {
        "error": "mutmut stopped (1)"
    }


def test_progress_is_read_from_mutmuts_last_status_line(tmp_path):
    log = tmp_path / "m.log"
    log.write_text("⠋ Generating mutants")
    assert mutation.progress(log) == "generating mutants, then running the tests unmutated"
    log.write_text("⠋ 3/34  🎉 2 🫥 0  ⏰ 0  🙁 1\r⠙ 12/34  🎉 10 🫥 0  ⏰ 0  🙁 2\r")
    assert mutation.progress(log) == "12/34 mutants run, 10 killed"


def test_each_mutant_gets_its_tests_fastest_first():
    """pytest stops at the first failure: a unit test that kills a mutant at once runs before
    a training test that would take a minute to say the same."""
    from types import SimpleNamespace

    recorded = SimpleNamespace(
        duration_by_test={"t::slow": 30.0, "t::fast": 0.1, "t::mid": 2.0, "t::tie": 2.0},
        tests_by_mangled_function_name={},
    )

    def collect(runner, **settings):  # what mutmut's stats pass leaves behind
        recorded.tests_by_mangled_function_name.update(
            f={"t::slow", "t::mid", "t::fast", "t::tie"}, g={"t::slow"}
        )
        recorded.settings = (runner, settings)

    mutmut_main = SimpleNamespace(collect_or_load_stats=collect)
    mutation._fastest_tests_first(mutmut_main, lambda: recorded)
    mutmut_main.collect_or_load_stats("runner", apply_config_invalidation=True)
    assert recorded.settings == ("runner", {"apply_config_invalidation": True})
    assert recorded.tests_by_mangled_function_name == {
        "f": ["t::fast", "t::mid", "t::tie", "t::slow"],
        "g": ["t::slow"],
    }


def test_a_score_below_its_record_is_a_regression_and_a_low_one_is_named():
    def ran(total: int, killed: int, equivalent: int = 0) -> object:
        return mutation.Tally(total=total, killed=killed, equivalent=equivalent)

    record = mutation.Record(mutants=100, killed=92, equivalent=2, seconds=60.0, measured="then")
    assert record.percent() == pytest.approx(93.877, abs=1e-3)
    said, fell = mutation.judge("m.py", ran(100, 91, 2), record)
    assert fell and said.startswith("m.py: REGRESSION: 92.9% < 93.9% recorded (then)")
    assert mutation.judge("m.py", ran(100, 92, 2), record) == (
        "m.py: 93.9%, recorded 93.9%",
        False,
    )
    # More mutants, the same ones missed: the score is what is compared, not the counts.
    said, fell = mutation.judge("m.py", ran(120, 112, 2), record)
    assert not fell and said == "m.py: 94.9%, recorded 93.9%"
    low = mutation.Record(10, 5, 0, 1.0, "then")
    assert mutation.judge("m.py", ran(10, 6), low) == (
        "m.py: 60.0%, recorded 50.0%; under the 90% floor",
        False,
    )
    assert mutation.judge("m.py", ran(10, 9), None) == (
        "m.py: 90.0%, no recorded score yet (--record keeps it)",
        False,
    )
    assert mutation.judge("m.py", ran(3, 0, 3), None) == ("m.py: nothing to score", False)


def test_records_round_trip_in_the_tables_order_and_a_stray_one_is_named(tmp_path):
    path = tmp_path / "scores.toml"
    records = {
        "pkg/b.py": mutation.Record(7, 7, 0, 12.4, "2026-11-28, 2 cores"),
        "pkg/a.py": mutation.Record(30, 25, 1, 100.0, 'a "quoted" CPU'.replace('"', "")),
    }
    mutation.write_records(records, ["pkg/a.py", "pkg/b.py"], path)
    assert mutation.read_records(path) == {
        "pkg/a.py": mutation.Record(30, 25, 1, 100, "a quoted CPU"),
        "pkg/b.py": mutation.Record(7, 7, 0, 12, "2026-11-28, 2 cores"),
    }
    assert path.read_text().index('"pkg/a.py"') < path.read_text().index('"pkg/b.py"')
    assert not list(tmp_path.glob(".*"))  # the partial file was renamed into place
    assert mutation.read_records(tmp_path / "none.toml") == {}
    # One module's new figure joins the file as it is now: the others' are kept, not rewritten
    # from an older view.
    path.write_text(path.read_text().replace("seconds = 12,", "seconds = 13,"))
    mutation.record_one("pkg/a.py", mutation.Record(31, 30, 1, 50.0, "now"), ["pkg/a.py"], path)
    assert mutation.read_records(path) == {
        "pkg/a.py": mutation.Record(31, 30, 1, 50, "now"),
        "pkg/b.py": mutation.Record(7, 7, 0, 13, "2026-11-28, 2 cores"),
    }
    table = mutation.Table((), {"pkg/a.py": ("test_a.py",)})
    assert "pkg/b.py: a recorded score for no module in the table" in mutation.table_problems(
        table, [], root=tmp_path, records=records
    )


def test_every_module_of_src_is_under_mutation_and_the_records_name_table_modules():
    table = mutation.read_table()
    src = ROOT / "src"
    everything = mutation.targeted(mutation.Table(("hydra_plugins/", f"{mutation.PACKAGE}/"), {}))
    assert everything == sorted(
        path.relative_to(src).as_posix()
        for path in src.rglob("*.py")
        if mutation.has_functions(path)
    )
    assert mutation.targeted(table) == everything
    records = mutation.read_records()
    assert set(records) <= set(table.tests) and records
