"""Mutation testing of every module of src/ with mutmut: every small change mutmut makes inside
a function (an operator, a comparison, a constant, a string, an argument dropped or set to
None) is run against that module's fast tests, and a change no test notices is reported.

    make mutants                                  # every module of scripts/mutation.toml
    make mutants ARGS="runs/integrity.py"         # one module (paths under src/repro/)
    make mutants ARGS="sweeps/ runs/trust.py"     # a folder's modules, and another
    make mutants ARGS="--list"                    # the modules and the tests that guard each
    make mutants ARGS="--last runs/trust.py"      # its last run reported again, nothing run
    make mutants ARGS="shards/ --record"          # and its scores kept as the new figures
    make mutants ARGS="--again engine/loop.py"    # only its last run's survivors, run again

scripts/mutation.toml maps each module to its fast tests (in-process: no `slow`, no `e2e`),
so that a mutant takes seconds; scripts/mutation_equivalents.toml lists the mutants reviewed
as equivalent (no test could tell them from the code), each with its reason, and they leave
the score: killed / (mutants - equivalent). A timeout counts as killed.
scripts/mutation_scores.toml holds each module's last recorded score: a run below it is a
regression, named, and the command exits non-zero (a module under 90% is named too);
`--record` writes the run's figures there instead. After a review,
`--last` reports the last run again with the equivalents as they are now.

mutmut works in mutants/ (git-ignored; `make clean` removes it): a copy of src/ in which each
function dispatches to its mutants, and tests/ beside it. Each module runs in a process of its
own, with mutmut's settings from pyproject.toml ([tool.mutmut]) narrowed to the module and its
tests; every mutant of the module is run again each time, so a test added since counts.
`--again` runs only the last run's survivors, for the tests added after a review: the killed
stay killed, the run time stays the whole run's, and a module changed since is refused.
`uv run mutmut show NAME` prints one mutant; `uv run mutmut browse` browses the last results.
scripts/mutants.py (`make mutants-known`) is the other harness: hand-written bugs that break
an end-to-end promise, against the slow tests that run the entry points.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: mutmut depends on the toml package there
    import toml as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "repro"  # scripts/new_project.py renames it
TABLE = ROOT / "scripts" / "mutation.toml"
EQUIVALENTS = ROOT / "scripts" / "mutation_equivalents.toml"
SCORES = ROOT / "scripts" / "mutation_scores.toml"
FLOOR = 90.0  # percent: a module under it has promises without a fast test
WORK = ROOT / "mutants"  # mutmut's own folder name; it cannot be changed
KILLED = {"killed", "timeout"}  # a mutant that makes the tests hang was noticed too


@dataclasses.dataclass(frozen=True)
class Table:
    targets: tuple[str, ...]  # files, or folders ending in "/", under src/
    tests: dict[str, tuple[str, ...]]  # module under src/ -> test files under tests/


@dataclasses.dataclass(frozen=True)
class Equivalent:
    mutant: str  # mutmut's name: package.module.x_function__mutmut_N
    changes: str  # the lines it removes and adds, as `changed_lines` writes them
    reason: str


@dataclasses.dataclass(frozen=True)
class Record:
    """A module's last recorded run: what `make mutants` compares a new run against."""

    mutants: int
    killed: int
    equivalent: int
    seconds: float
    measured: str  # when and where, e.g. "2026-11-28, 2-core AMD EPYC"

    def percent(self) -> float:
        counted = self.mutants - self.equivalent
        return 100 * self.killed / counted if counted else 100.0


def read_toml(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def read_table(path: Path = TABLE) -> Table:
    data = read_toml(path)
    tests = {module: tuple(files) for module, files in data.get("tests", {}).items()}
    return Table(tuple(data.get("targets", ())), tests)


def read_equivalents(path: Path = EQUIVALENTS) -> list[Equivalent]:
    return [
        Equivalent(
            entry.get("mutant", ""), entry.get("changes", "").strip(), entry.get("reason", "")
        )
        for entry in read_toml(path).get("equivalent", [])
    ]


def read_records(path: Path = SCORES) -> dict[str, Record]:
    if not path.is_file():
        return {}
    return {
        module: Record(**fields) for module, fields in read_toml(path).get("scores", {}).items()
    }


def write_records(records: dict[str, Record], order: list[str], path: Path = SCORES) -> None:
    """The records, in the table's order, written whole to a new file renamed over the old."""
    lines = [
        "# Each module's last recorded `make mutants` run (scripts/mutation.py --record writes it).",
        "# A run whose score falls below its module's figure here is a regression: make mutants",
        "# names it and exits non-zero.",
        "",
        "[scores]",
    ]
    for module in sorted(records, key=lambda m: (order.index(m) if m in order else len(order), m)):
        r = records[module]
        lines.append(
            f'"{module}" = {{ mutants = {r.mutants}, killed = {r.killed}, '
            f'equivalent = {r.equivalent}, seconds = {round(r.seconds)}, measured = "{r.measured}" }}'
        )
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text("\n".join(lines) + "\n")
    partial.replace(path)


def record_one(module: str, record: Record, order: list[str], path: Path = SCORES) -> None:
    """Keep one module's figure as soon as it is judged, over the file as it is now: a run cut
    off keeps the modules it finished, and two runs on different modules keep both."""
    records = read_records(path)
    records[module] = record
    write_records(records, order, path)


def measured_here() -> str:
    """When and where a score was measured: the date and the CPU (scores differ by machine
    only in their times)."""
    model = "a CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        found = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        model = found.group(1).strip() if found else model
    return f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {model}"


def judge(module: str, counted: Tally, record: Record | None) -> tuple[str, bool]:
    """What a run's score says against the module's record and the floor: (line, regression)."""
    percent = counted.percent()
    if percent is None:
        return f"{module}: nothing to score", False
    if record is None:
        floor = f"; under the {FLOOR:.0f}% floor" if percent < FLOOR else ""
        return f"{module}: {percent:.1f}%, no recorded score yet (--record keeps it){floor}", False
    if percent < record.percent():
        return (
            f"{module}: REGRESSION: {percent:.1f}% < {record.percent():.1f}% recorded "
            f"({record.measured}): a test that killed mutants no longer does, or new code "
            "has no test",
            True,
        )
    floor = f"; under the {FLOOR:.0f}% floor" if percent < FLOOR else ""
    return f"{module}: {percent:.1f}%, recorded {record.percent():.1f}%{floor}", False


def has_functions(path: Path) -> bool:
    """Whether mutmut finds anything to mutate: it mutates inside functions only."""
    tree = ast.parse(path.read_text())
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) for node in ast.walk(tree))


def targeted(table: Table, root: Path = ROOT) -> list[str]:
    """Every module under the targets that holds a function, as a path under src/."""
    found = set()
    for target in table.targets:
        path = root / "src" / target
        paths = sorted(path.rglob("*.py")) if target.endswith("/") else [path]
        found |= {
            p.relative_to(root / "src").as_posix()
            for p in paths
            if p.is_file() and has_functions(p)
        }
    return sorted(found)


def table_problems(
    table: Table,
    equivalents: list[Equivalent],
    root: Path = ROOT,
    records: dict[str, Record] | None = None,
) -> list[str]:
    """What is wrong with the table or the equivalents, read from the files alone."""
    modules = targeted(table, root)
    untested = [module for module in modules if module not in table.tests]
    found = [f"{module}: a module of the targets with no tests in the table" for module in untested]
    for module, files in table.tests.items():
        if module not in modules:
            found.append(f"{module}: in the table but no module with functions under the targets")
        if not files:
            found.append(f"{module}: no test files")
        found += [
            f"{module}: no test file tests/{f}" for f in files if not (root / "tests" / f).is_file()
        ]
    for module in records or {}:
        if module not in table.tests:
            found.append(f"{module}: a recorded score for no module in the table")
    for entry in equivalents:
        if not (entry.mutant and entry.changes and entry.reason.strip()):
            found.append(f"equivalent {entry.mutant or '?'}: needs mutant, changes and reason")
        elif not any(entry.mutant.startswith(dotted(m) + ".") for m in table.tests):
            found.append(f"equivalent {entry.mutant}: of no module in the table")
    return found


def dotted(module: str) -> str:
    """`repro/core/runs/integrity.py` -> `repro.core.runs.integrity`, the prefix of its
    mutants' names."""
    return module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def choose(table: Table, asked: list[str]) -> list[str]:
    """The table's modules that `asked` names: paths under src/<package>/ or src/ (a folder
    names its modules); all of them when nothing is asked."""
    if not asked:
        return list(table.tests)
    chosen: list[str] = []
    for name in asked:
        name = name.removeprefix("src/")
        matches = [
            module
            for prefix in (name, f"{PACKAGE}/{name}")
            for module in table.tests
            if module == prefix or module.startswith(prefix.rstrip("/") + "/")
        ]
        if not matches:
            sys.exit(f"error: {name}: no module of scripts/mutation.toml (see --list)")
        chosen += [module for module in matches if module not in chosen]
    return chosen


def changed_lines(diff: str) -> str:
    """A mutant's diff reduced to its removed and added lines, indentation dropped."""
    lines = diff.splitlines()
    return "\n".join(
        f"{line[0]} {line[1:].strip()}"
        for line in lines
        if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))
    )


READ_BY_TESTS = ("conf", "docs", "README.md", "benchmarks", "scripts", "Makefile", ".ci")


# --- one module, in a process of its own ---------------------------------------------------


def run_module(
    module: str, tests: tuple[str, ...], workers: int, only: list[str] | None = None
) -> dict:
    """mutmut over `module` against `tests`: {mutant name: {status, diff}}, or an error.
    `only`: those mutants alone, each with its diff (to check it is the change it was)."""
    from mutmut import __main__ as mutmut_main
    from mutmut import configuration
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.state import state
    from mutmut.stats import status_by_exit_code

    os.chdir(ROOT)
    WORK.mkdir(exist_ok=True)
    # The tests read conf/, docs/, the README ... beside src/, which mutmut does not copy; the
    # trusted targets are those git tracks in conf/, which a copy inside an ignored folder
    # would not be: links to this checkout's own.
    for name in READ_BY_TESTS:
        link = WORK / name
        if not link.is_symlink():
            shutil.rmtree(link, ignore_errors=True)
            link.symlink_to(Path("..") / name)
    # mutmut leaves a module it did not mutate this time as a plain copy, newer than the
    # source, which it would then take for its mutated file: generated afresh each run. And
    # it keeps each mutant's last result while its function's code is unchanged, skipping it:
    # a result from before the tests changed (or a run cut short) would stand. Dropped too.
    (WORK / "src" / module).unlink(missing_ok=True)
    (WORK / "src" / f"{module}.meta").unlink(missing_ok=True)
    # mutmut records which tests reach a function only for the functions it mutated in that
    # run, and keeps the record while its settings look the same: two modules guarded by the
    # same test files would share it, and the second find no test reaching any of its own.
    (WORK / "mutmut-stats.json").unlink(missing_ok=True)
    configuration._config = dataclasses.replace(
        configuration.config(),
        only_mutate=[f"src/{module}"],
        pytest_add_cli_args_test_selection=[f"tests/{name}" for name in tests],
    )
    _fastest_tests_first(mutmut_main, state)
    reached = True
    try:
        mutmut_main._run(only or [f"{dotted(module)}.*"], workers)
    except SystemExit as stop:
        # The tests reach none of the module's functions: mutmut stops before any mutant.
        reached = any(state().tests_by_mangled_function_name.values())
        if stop.code not in (None, 0) and reached:
            return {"error": f"mutmut stopped ({stop.code}): see its log"}
    except AssertionError as error:
        if "nothing matches" not in str(error):
            raise
        return {"mutants": {}}  # nothing to mutate
    data = SourceFileMutationData(path=Path("src") / module)
    data.load()
    mutants = {}
    for name, code in data.exit_code_by_key.items():
        if only is not None and name not in only:
            continue
        status = status_by_exit_code[code] if reached else "no tests"
        diff = "" if status in KILLED and only is None else _diff(name, data)
        mutants[name] = {"status": status, "diff": diff}
    return {"mutants": mutants}


def survivors_of(result: dict) -> list[str]:
    """The mutants of a module's run that no test killed."""
    return [name for name, found in result["mutants"].items() if found["status"] not in KILLED]


def merged_again(previous: dict, rerun: dict) -> dict:
    """`previous` (a module's last run) with the statuses of `rerun`, which ran its survivors
    alone; an error if one of them is not the change it was (the module changed since)."""
    if "mutants" not in rerun:
        return rerun
    mutants = dict(previous["mutants"])
    for name, found in rerun["mutants"].items():
        before = mutants.get(name)
        if before is None or changed_lines(before["diff"]) != changed_lines(found["diff"]):
            return {
                "error": f"{name} is not the change it was in the last run: the module changed "
                "since, run it whole (without --again)"
            }
        killed = found["status"] in KILLED
        mutants[name] = {"status": found["status"], "diff": "" if killed else found["diff"]}
    missing = set(survivors_of(previous)) - set(rerun["mutants"])
    if missing:
        return {"error": f"mutmut did not run {len(missing)} of the survivors again"}
    return {**previous, "mutants": mutants}


def _fastest_tests_first(mutmut_main: Any, state: Callable[[], Any]) -> None:
    """Hand each mutant its tests fastest first. mutmut keeps a function's tests as a set and
    pytest stops at the first failure (-x): a mutant that a unit test kills in a second would
    otherwise often wait for a training test that happened to come first."""
    collect = mutmut_main.collect_or_load_stats

    def collect_then_order(*args: Any, **kwargs: Any) -> None:
        collect(*args, **kwargs)
        seconds, by_function = state().duration_by_test, state().tests_by_mangled_function_name
        for function, tests in by_function.items():
            by_function[function] = sorted(tests, key=lambda test: (seconds[test], test))

    mutmut_main.collect_or_load_stats = collect_then_order


def _diff(name: str, data: object) -> str:
    """The mutant's diff. mutmut 3.8.1 fails to find the original of some methods (seen:
    `__init__` of export's `Normalised` and of `Scores`): then a pointer to `mutmut show`,
    rather than the module's whole report lost."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    try:
        return get_diff_for_mutant(name, path=data.path)  # type: ignore[attr-defined]
    except FileNotFoundError as error:
        return f"+ (no diff from mutmut: {error}; `uv run mutmut show {name}`)"


# --- the report -------------------------------------------------------------------------------


@dataclasses.dataclass
class Tally:
    total: int = 0
    killed: int = 0
    equivalent: int = 0
    survivors: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)

    def percent(self) -> float | None:
        counted = self.total - self.equivalent
        return 100 * self.killed / counted if counted else None

    def score(self) -> str:
        percent = self.percent()
        counted = self.total - self.equivalent
        return f"{self.killed}/{counted} = {percent:.1f}%" if percent is not None else "-"


def tally(result: dict, equivalents: dict[str, Equivalent], notes: list[str]) -> Tally:
    """Count one module's mutants; equivalents whose mutant changed or was killed are noted."""
    counted = Tally()
    for name, found in sorted(result["mutants"].items(), key=lambda item: _order(item[0])):
        counted.total += 1
        entry = equivalents.get(name)
        if found["status"] in KILLED:
            counted.killed += 1
            if entry:
                notes.append(f"{name}: listed as equivalent but a test kills it: drop the entry")
        elif entry and changed_lines(found["diff"]) == entry.changes:
            counted.equivalent += 1
        else:
            if entry:
                notes.append(f"{name}: listed as equivalent, but it now changes other lines")
            counted.survivors.append((name, found["status"], found["diff"]))
    return counted


def _order(name: str) -> tuple[str, int]:
    """mutmut's names in the order of their functions, then numerically."""
    base, _, number = name.rpartition("__mutmut_")
    return base, int(number) if number.isdigit() else 0


def show(module: str, counted: Tally, seconds: float) -> None:
    print(
        f"{module}: {counted.total} mutants, {counted.killed} killed, "
        f"{len(counted.survivors)} survived, {counted.equivalent} equivalent; "
        f"score {counted.score()}; {seconds:.0f} s",
        flush=True,
    )
    unreached: dict[str, int] = {}  # function -> its mutants that no test reaches
    for name, status, diff in counted.survivors:
        if status == "no tests":
            function = name.rpartition(".")[2].rpartition("__mutmut_")[0]
            unreached[function] = unreached.get(function, 0) + 1
            continue
        print(f"  {status.upper()} {name}")
        for line in changed_lines(diff).splitlines():
            print(f"      {line}")
    if unreached:
        listed = ", ".join(f"{function} ({count})" for function, count in unreached.items())
        print(f"  NO TEST reaches these functions (their mutants): {listed}")


PROGRESS_EVERY = 60  # seconds between two lines saying how far a module's run has got
PROGRESS = re.compile(r"(\d+)/(\d+)\s+\S+ (\d+) ")  # mutmut's "done/total  🎉 killed ..."


def _finished(child: subprocess.Popen, seconds: float) -> bool:
    try:
        child.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def progress(log: Path) -> str:
    """How far mutmut has got, from the last progress line of its log."""
    found = PROGRESS.findall(log.read_text(errors="replace")[-2000:])
    if not found:
        return "generating mutants, then running the tests unmutated"
    done, total, killed = found[-1]
    return f"{done}/{total} mutants run, {killed} killed"


def run_child(module: str, workers: int, result_file: Path, again: bool = False) -> str | None:
    """One module's mutmut run, in a process of its own, its output in mutants/logs/.
    `again`: its last run's survivors alone; what went wrong, if anything (the last run's
    result is then kept as it was)."""
    log = WORK / "logs" / f"{dotted(module)}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    previous = result_file.with_suffix(".previous.json")
    if again:
        if not result_file.is_file():
            return "no last run to run again: run it whole first"
        result_file.replace(previous)  # the child reads it there
    result_file.unlink(missing_ok=True)
    began = time.perf_counter()
    with log.open("w") as out:
        command = [sys.executable, __file__, "--one", module, "--workers", str(workers)]
        command += ["--again"] if again else []
        child = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        while not _finished(child, PROGRESS_EVERY):
            print(f"  {module}: {progress(log)}", flush=True)
    result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    if again:
        if "mutants" in result:
            previous.unlink()
            return None
        previous.replace(result_file)  # the last run stands
        return result.get("error", f"mutmut ended without a result: {log.relative_to(ROOT)}")
    if result:
        result["seconds"] = time.perf_counter() - began
        result_file.write_text(json.dumps(result, indent=1))
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules or folders, under src/repro/")
    parser.add_argument("--list", action="store_true", help="list the modules and their tests")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--last",
        action="store_true",
        help="report the last run again (after a review), run nothing",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help=f"keep this run's scores in {SCORES.relative_to(ROOT)} as the modules' figures",
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="run only the survivors of each module's last run (after adding tests)",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one module
    args = parser.parse_args(argv)
    table, equivalents = read_table(), read_equivalents()
    if args.one:
        result_file = WORK / "results" / f"{dotted(args.one)}.json"
        if args.again:
            previous = json.loads(result_file.with_suffix(".previous.json").read_text())
            survivors = survivors_of(previous)
            rerun = run_module(args.one, table.tests[args.one], args.workers, survivors)
            result = merged_again(previous, rerun) if survivors else previous
        else:
            result = run_module(args.one, table.tests[args.one], args.workers)
        result_file.parent.mkdir(parents=True, exist_ok=True)
        result_file.write_text(json.dumps(result, indent=1))
        return
    found = table_problems(table, equivalents, records=read_records())
    if found:
        sys.exit("error: " + "\nerror: ".join(found))
    chosen = choose(table, args.modules)
    if args.list:
        for module in chosen:
            print(f"{module:40} {' '.join(table.tests[module])}")
        return
    by_name = {entry.mutant: entry for entry in equivalents}
    records, judged, regressions = read_records(), [], []
    total, notes, failed, started = Tally(), [], [], time.perf_counter()
    for module in chosen:
        result_file = WORK / "results" / f"{dotted(module)}.json"
        problem = None if args.last else run_child(module, args.workers, result_file, args.again)
        if problem:
            failed.append(module)
            print(f"{module}: {problem}", flush=True)
            continue
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
        if "mutants" not in result:
            said = result.get("error", "no result: mutmut ended without one, or never ran here")
            failed.append(module)
            print(f"{module}: {said}: mutants/logs/{dotted(module)}.log", flush=True)
            continue
        counted = tally(result, by_name, notes)
        show(module, counted, result.get("seconds", 0.0))
        said, fell = judge(module, counted, records.get(module))
        judged.append(said)
        if fell:
            regressions.append(module)
        if args.record and counted.total:
            seconds = result.get("seconds", 0.0)
            kept = (counted.total, counted.killed, counted.equivalent, seconds, measured_here())
            record_one(module, Record(*kept), list(table.tests))
        total.total += counted.total
        total.killed += counted.killed
        total.equivalent += counted.equivalent
        total.survivors += counted.survivors
    minutes = (time.perf_counter() - started) / 60
    print(
        f"\n{len(chosen) - len(failed)} modules, {total.total} mutants: {total.killed} killed, "
        f"{len(total.survivors)} survived, {total.equivalent} equivalent; "
        f"score {total.score()}; {minutes:.1f} min"
    )
    for note in notes:
        print(f"note: {note}")
    print("\nAgainst the recorded scores:", *judged, sep="\n  ")
    if args.record:
        print(f"recorded in {SCORES.relative_to(ROOT)}")
    if failed:
        sys.exit(f"error: mutmut failed on {', '.join(failed)} (logs in mutants/logs/)")
    if regressions and not args.record:
        sys.exit(f"error: below their recorded scores: {', '.join(regressions)}")


if __name__ == "__main__":
    main()
