"""What a run ran on (repro.core.runtime.environment), piece by piece in-process: each reading from
the machine, torch's build and the installed packages, on stand-ins this test controls."""

from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from repro.core.runtime import environment

PYTHON = sys.executable


@pytest.fixture(autouse=True)
def caches_cleared():
    """Each reading is cached per process: these tests change what it reads."""
    cached = (environment.cpu_model, environment._build_libraries, environment.dependencies)
    for function in cached:
        function.cache_clear()
    yield
    for function in cached:
        function.cache_clear()


def test_a_command_gives_its_output_or_none():
    assert environment._run(PYTHON, "-c", "print(' two words ')") == "two words"
    assert environment._run(PYTHON, "-c", "print('kept ')", exact=True) == "kept \n"
    assert environment._run(PYTHON, "-c", "import sys; print('x'); sys.exit(1)") is None
    assert environment._run("no-such-command-anywhere") is None
    # git diff --no-index says "they differ" with 1: that is still its output.
    differ = (PYTHON, "-c", "import sys; print('d'); sys.exit(1)", "--no-index")
    assert environment._run(*differ) == "d"
    failed = (PYTHON, "-c", "import sys; sys.exit(2)", "--no-index")
    assert environment._run(*failed) is None


def test_a_command_runs_in_the_folder_asked(tmp_path):
    where = environment._run(PYTHON, "-c", "import os; print(os.getcwd())", cwd=tmp_path)
    assert Path(where).resolve() == tmp_path.resolve()
    assert Path(environment._run(PYTHON, "-c", "import os; print(os.getcwd())")).resolve() == (
        environment.SOURCE_DIR
    )


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        (
            "  - Math Kernel Library Version 2024.2.1\n  - oneDNN v3.5.3 (Git Hash x)\n"
            "  - BLAS_INFO=mkl, LAPACK_INFO=mkl",
            {"onednn": "v3.5.3", "blas": "mkl 2024.2.1"},
        ),
        ("  - MKL-DNN v2.7.3\n  - BLAS_INFO=open,", {"onednn": "v2.7.3", "blas": "open"}),
        ("  - BLAS_INFO=mkl, no version shown", {"onednn": None, "blas": "mkl"}),
        ("nothing of either", {"onednn": None, "blas": None}),
    ],
)
def test_onednn_and_blas_come_from_torchs_build_description(monkeypatch, shown, expected):
    monkeypatch.setattr(torch.__config__, "show", lambda: shown)
    assert environment._build_libraries() == expected


@pytest.fixture
def cpuinfo(monkeypatch, tmp_path):
    """/proc/cpuinfo as the test writes it (absent until then)."""
    stand_in = tmp_path / "cpuinfo"
    real = environment.Path
    monkeypatch.setattr(
        environment, "Path", lambda name: stand_in if name == "/proc/cpuinfo" else real(name)
    )
    return stand_in


def test_the_cpu_is_named_by_its_model_name_line(cpuinfo):
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7R13 Processor  \nflags\t: x\n")
    assert environment.cpu_model() == "AMD EPYC 7R13 Processor"


def test_without_a_model_name_the_platform_names_the_cpu(cpuinfo, monkeypatch):
    cpuinfo.write_text("processor\t: 0\nCPU part\t: 0xd0c\n")
    monkeypatch.setattr(environment.platform, "system", lambda: "Linux")
    monkeypatch.setattr(environment.platform, "processor", lambda: "")
    monkeypatch.setattr(environment.platform, "machine", lambda: "aarch64")
    assert environment.cpu_model() == "aarch64"
    environment.cpu_model.cache_clear()
    monkeypatch.setattr(environment.platform, "processor", lambda: "arm")
    assert environment.cpu_model() == "arm"


def test_a_mac_is_asked_through_sysctl(cpuinfo, monkeypatch):
    asked = []
    monkeypatch.setattr(environment.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(environment, "_run", lambda *command: asked.append(command) or "Apple M3")
    assert environment.cpu_model() == "Apple M3"
    assert asked == [("sysctl", "-n", "machdep.cpu.brand_string")]
    environment.cpu_model.cache_clear()
    monkeypatch.setattr(environment, "_run", lambda *command: None)
    monkeypatch.setattr(environment.platform, "processor", lambda: "arm")
    assert environment.cpu_model() == "arm"


def test_a_cpu_run_records_no_gpu_details():
    expected = {"compute_capability": None, "gpu_driver": None, "nccl": None}
    assert environment._cuda(torch.device("cpu")) == expected


@pytest.mark.parametrize(
    ("driver", "nccl", "expected"),
    [
        ("550.54.15\n535.104.05", (2, 21, 5), {"gpu_driver": "550.54.15", "nccl": "2.21.5"}),
        (None, 2708, {"gpu_driver": None, "nccl": 2708}),
    ],
)
def test_a_gpu_run_records_its_capability_driver_and_nccl(monkeypatch, driver, nccl, expected):
    asked = []
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda device: (9, 0) if device.index == 0 else None
    )
    monkeypatch.setattr(environment, "_run", lambda *command: asked.append(command) or driver)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: nccl)
    recorded = environment._cuda(torch.device("cuda", 0))
    assert recorded == {"compute_capability": "9.0", **expected}
    assert asked == [("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")]
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    assert environment._cuda(torch.device("cuda", 0))["nccl"] is None


def test_the_projects_distribution_is_found_by_its_package_name(monkeypatch):
    assert environment._distribution() == metadata.distribution("repro").name

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", not_installed)
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {"repro": ["my-copy", "x"]})
    assert environment._distribution() == "my-copy"
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {})
    assert environment._distribution() is None


def test_every_direct_dependency_is_recorded_with_its_version_but_not_the_extras(monkeypatch):
    required = [
        "torch>=2.4",
        "hydra-core (>=1.3)",
        "rich[jupyter]~=13.0",
        "numpy;python_version>'3'",
        "pytest>=8; extra == 'dev'",
        "not-installed-here==1.0",
    ]
    monkeypatch.setattr(environment, "_distribution", lambda: "my-copy")
    monkeypatch.setattr(metadata, "requires", lambda name: required if name == "my-copy" else [])
    assert environment.dependencies() == {
        "torch": metadata.version("torch"),
        "hydra-core": metadata.version("hydra-core"),
        "rich": metadata.version("rich"),
        "numpy": metadata.version("numpy"),
        "not-installed-here": None,
    }
    environment.dependencies.cache_clear()
    monkeypatch.setattr(environment, "_distribution", lambda: None)
    assert environment.dependencies() == {}
    environment.dependencies.cache_clear()
    monkeypatch.setattr(environment, "_distribution", lambda: "my-copy")
    monkeypatch.setattr(metadata, "requires", lambda name: None)
    assert environment.dependencies() == {}


def test_the_lock_files_digest_or_none_without_one(monkeypatch, tmp_path):
    monkeypatch.setattr(environment, "PROJECT_DIR", tmp_path)
    assert environment._lock_sha256() is None
    (tmp_path / "uv.lock").write_bytes(b"version = 1\n")
    assert environment._lock_sha256() == hashlib.sha256(b"version = 1\n").hexdigest()


@pytest.mark.parametrize(
    ("commit", "patch", "dirty"),
    [(None, "diff", None), ("abc", None, False), ("abc", "diff", True)],
)
def test_a_tree_is_dirty_only_when_it_has_a_commit_and_a_patch(monkeypatch, commit, patch, dirty):
    monkeypatch.setattr(environment, "git_commit", lambda: commit)
    monkeypatch.setattr(environment, "source_patch", lambda: patch)
    described = environment.describe(torch.device("cpu"))
    assert described["git_commit"] == commit and described["git_dirty"] is dirty


def test_a_gpu_run_is_named_by_its_gpu_and_a_cpu_run_by_its_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"GPU {device.index}")
    monkeypatch.setattr(environment, "_cuda", lambda device: {"gpu_driver": "1"})
    on_gpu = environment.describe(torch.device("cuda", 1))
    assert on_gpu["device"] == "cuda" and on_gpu["device_name"] == "GPU 1"
    assert on_gpu["gpu_driver"] == "1"
    on_cpu = environment.describe(torch.device("cpu"))
    assert on_cpu["device"] == "cpu" and on_cpu["device_name"] == environment.cpu_model()
    assert on_cpu["pythonhashseed"] == environment.python_hash_seed()
    assert on_cpu["python"] == sys.version.split()[0]
    assert on_cpu["torch"] == torch.__version__ and on_cpu["cuda"] == torch.version.cuda
    assert on_cpu["torchvision"] == metadata.version("torchvision")
    assert on_cpu["onednn"] == environment._build_libraries()["onednn"]
    cudnn = torch.backends.cudnn
    assert on_cpu["cudnn"] == (cudnn.version() if cudnn.is_available() else None)


def test_git_is_asked_about_the_source_tree():
    import subprocess

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=environment.SOURCE_DIR, capture_output=True, text=True
    )
    expected = head.stdout.strip() if head.returncode == 0 else None
    assert environment._git("rev-parse", "HEAD") == expected


def test_a_command_has_ten_seconds(monkeypatch):
    import subprocess

    asked = {}

    def run(command, **options):
        asked.update(options)
        return subprocess.CompletedProcess(command, 0, "out\n", "")

    monkeypatch.setattr(environment.subprocess, "run", run)
    assert environment._run("anything") == "out" and asked["timeout"] == 10


def test_git_diff_no_index_says_same_with_0_and_differ_with_1():
    same = (PYTHON, "-c", "print('s')", "--no-index")
    assert environment._run(*same) == "s"
