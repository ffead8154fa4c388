"""The mutation harness itself, read without running a mutant: scripts/mutants.py's
hand-written bugs must name code that is there, once, and tests that exist."""

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
    assert said.startswith("mutant twice: its code is ") and "times in engine/loop.py" in said


def test_a_parametrized_case_is_checked_by_its_function():
    [test] = mutants.MUTANTS[-2].tests
    assert "[" in test  # export-normalisation names one case
    assert mutants.defined_tests(ROOT / "tests" / test.split("::")[0]) >= {
        test.split("::")[1].split("[")[0]
    }
