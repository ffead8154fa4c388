#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, measured again on this machine's GPU, one part a call:
#
#   bash scripts/gpu_figures.sh PART IMAGES OUT
#
# PART: checks | airbench | speedrun | throughput | overhead | data | profile | peers (each fits in one
# 10-minute device call; run them in that order, checks first). IMAGES: CIFAR-10 as an image
# folder (IMAGES/train/<class>/*, IMAGES/test/<class>/*), decoded into memory by every run
# that reads it (the overhead, data and checks parts use the built-in synthetic data; pass
# any folder). OUT: only the tables go there, OUT/<part>.md, each headed by the commit, the
# versions and the GPU; the run folders, checkpoints included, go to SCRATCH (default
# /tmp/gpu_figures, emptied first). Every ratio in a table comes from runs of the same call.
#
# Environment: PYTHON (default python3, else python), COMMIT (the commit measured: the copy on
# a device machine has no .git; default: git's, where there is one), PART_TIMEOUT (seconds,
# default 540: a part stops under a 10-minute call limit, its table noting what did not run).
set -euo pipefail
usage="usage: gpu_figures.sh checks|airbench|speedrun|throughput|overhead|data|profile|peers IMAGES OUT"
part=${1:?$usage}
images=${2:?$usage}
out=${3:?$usage}
python=${PYTHON:-$(command -v python3 || command -v python)}
scratch=${SCRATCH:-/tmp/gpu_figures}
deadline=$((SECONDS + ${PART_TIMEOUT:-540}))
commit=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo "unknown (set COMMIT)")}
case $part in
    checks | airbench | speedrun | throughput | overhead | data | profile | peers) ;;
    *) echo "error: part=$part is not one of checks, airbench, speedrun, throughput, overhead, data, profile, peers" >&2; exit 2 ;;
esac
rm -rf "$scratch" && mkdir -p "$scratch" "$out"
table="$out/$part.md"

# What was measured, where: the table's header.
{
    echo "# gpu_figures.sh $part, $(date -u +%Y-%m-%d)"
    echo
    echo "- commit: $commit"
    "$python" - <<'EOF'
import platform, torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
print(f"- python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
print(f"- device: {gpu}")
EOF
    echo
} > "$table"

# CIFAR-10's statistics and split, from image files: 45,000 train, 5,000 validation, 10,000 test.
cifar=(data=imagefolder "data.root=$images" data.cache=memory data.resize=null
       data.val_size=5000 "data.mean=[0.4914,0.4822,0.4465]"
       "data.std=[0.2470,0.2435,0.2616]" logger.progress=off)

left() { echo $((deadline - SECONDS)); }

run() {
    # One command under the part's remaining time; a failure or a timeout is noted in the
    # table and the part goes on with its next command.
    local name=$1
    shift
    if (($(left) < 10)); then
        echo "- $name: not run (the part's time was spent)" >> "$table"
        return 0
    fi
    timeout "$(left)" "$@" > "$scratch/$name.log" 2>&1 || {
        echo "- $name: failed or timed out (exit $?); the last lines:" >> "$table"
        tail -n 5 "$scratch/$name.log" | sed 's/^/    /' >> "$table"
    }
}

recipe() {
    # An experiment's seeds, eager then compiled. The first run of each is the warm-up (cold
    # caches, autotuning, a compilation): reported apart, kept out of the means.
    local experiment=$1 seeds=$2
    for compile in false true; do
        for seed in $(seq 0 "$seeds"); do
            run "$experiment-compile-$compile-seed-$seed" "$python" -m repro.train \
                "experiment=$experiment" "${cifar[@]}" "seed=$seed" "trainer.compile=$compile" \
                "hydra.run.dir=$scratch/runs/compile-$compile/seed-$seed"
        done
    done
    "$python" - "$scratch/runs" >> "$table" <<'EOF'
import json, statistics, sys
from pathlib import Path
print("| compile | seed | train_s | test_acc | |\n|---|---|---|---|---|")
for folder in sorted(Path(sys.argv[1]).iterdir()):
    runs = []
    for number, seed in enumerate(sorted(folder.glob("seed-*"), key=lambda p: int(p.name[5:]))):
        summary = seed / "summary.json"
        if not summary.exists():
            print(f"| {folder.name} | {seed.name} | failed | | |")
            continue
        run = json.loads(summary.read_text())
        note = "warm-up, not in the mean" if number == 0 else ""
        print(f"| {folder.name} | {run['seed']} | {run['train_s']:.2f} | {run['test_acc']:.4f} | {note} |")
        if number:
            runs.append(run)
    if len(runs) > 1:
        accs, secs = [r["test_acc"] for r in runs], [r["train_s"] for r in runs]
        print(f"| {folder.name} | mean of {len(runs)} | {statistics.mean(secs):.2f} "
              f"| **{statistics.mean(accs):.4f}** +- {statistics.stdev(accs):.4f} | |")
EOF
}

case $part in
    checks)
        # The CUDA-only tests, the exactness suite with the recipe features on, and the
        # world-invariant step with channels_last and CUDA's fused SGD (issue 34's defect 1).
        # Only the files that hold them: another file may import what a GPU image lacks (optuna).
        mapfile -t cuda_files < <(grep -l "mark.cuda" tests/*.py)
        run cuda-tests "$python" -m pytest -q -p no:cacheprovider -m cuda "${cuda_files[@]}"
        run exactness "$python" -m benchmarks suite=exactness augment.cutout=8 \
            augment.crop_padding_mode=reflect augment.flip=alternate +components=lookahead \
            "hydra.run.dir=$scratch/exactness"
        run invariant-fused "$python" -m repro.train trainer.world_invariant=true \
            trainer.global_batch=true trainer.micro_batch=64 ++optimizer.fused=true \
            optimizer.foreach=null memory_format=channels_last \
            trainer.max_steps=20 trainer.device=cuda "hydra.run.dir=$scratch/invariant"
        # The same with the recipes' fast features: bf16, channels_last, batches made on the GPU.
        # (preset=fast's bf16 and channels_last, with cuDNN's deterministic kernels.)
        run exactness-bf16 "$python" -m benchmarks suite=exactness preset=fast \
            cudnn=deterministic dataloader=device augment.cutout=8 \
            augment.crop_padding_mode=reflect augment.flip=alternate +components=lookahead \
            'suite.checks=[rerun,kill_resume]' "hydra.run.dir=$scratch/exactness-bf16"
        grep -h "passed\|failed" "$scratch/cuda-tests.log" | tail -n 1 | sed 's/^/- CUDA tests: /' >> "$table" || true
        [[ -f $scratch/exactness/bench.md ]] && cat "$scratch/exactness/bench.md" >> "$table"
        [[ -f $scratch/exactness-bf16/bench.md ]] && cat "$scratch/exactness-bf16/bench.md" >> "$table"
        [[ -f $scratch/invariant/summary.json ]] && echo "- world-invariant fused SGD: trained" >> "$table"
        ;;
    airbench) recipe cifar10_airbench 5 ;;
    speedrun) recipe cifar10_speedrun 3 ;;
    throughput)
        # ResNet-18 for CIFAR: the plain row (contiguous, fp32, worker loading) against the
        # fast path, in one suite=knobs call (its warm-up steps are timed apart).
        run knobs "$python" -m benchmarks suite=knobs experiment=cifar10_resnet18 "${cifar[@]}" \
            data.crop_padding=4 preset=fast suite.timed_steps=100 suite.warmup_steps=10 \
            'suite.rows=[{loader:2},{memory_format:channels_last,amp:bf16,loader:device,cudnn_benchmark:true,compile:true}]' \
            "hydra.run.dir=$scratch/throughput"
        cat "$scratch/throughput/bench.md" >> "$table" 2>/dev/null || true
        ;;
    overhead)
        for args in "" "preset=fast" "dataloader=device"; do
            name=${args:-default}
            name=${name//[=\/]/-}
            run "overhead-$name" "$python" -m benchmarks suite=overhead $args \
                "hydra.run.dir=$scratch/overhead/$name"
            cat "$scratch/overhead/$name/bench.md" >> "$table" 2>/dev/null || true
        done
        ;;
    data)
        run data "$python" -m benchmarks suite=data "hydra.run.dir=$scratch/data"
        cat "$scratch/data/bench.md" >> "$table" 2>/dev/null || true
        ;;
    profile)
        # Where a step of each recipe goes, op by op: steps 60-70, torch.profiler's table.
        for experiment in cifar10_airbench cifar10_resnet18; do
            run "profile-$experiment" "$python" -m repro.train "experiment=$experiment" \
                "${cifar[@]}" trainer.max_steps=80 "trainer.profile_steps=[60,70]" \
                "hydra.run.dir=$scratch/profile/$experiment"
            echo "## $experiment, steps 60-70" >> "$table"
            head -n 40 "$scratch/profile/$experiment/profile/steps-60-70.txt" >> "$table" 2>/dev/null || true
        done
        ;;
    peers)
        # airbench94 and timm's train.py beside our recipes (benchmarks/peers.py); PEER_ARGS
        # adds suite settings (e.g. suite.timm_train=PATH).
        run peers "$python" -m benchmarks suite=peers "${cifar[@]}" ${PEER_ARGS:-} \
            "hydra.run.dir=$scratch/peers"
        cat "$scratch/peers/bench.md" >> "$table" 2>/dev/null || true
        ;;
esac
# The raw records beside the table: every bench.json and log of the part, one archive.
(cd "$scratch" && find . -name bench.json -o -name '*.log' | tar -czf "$out/$part-raw.tar.gz" -T -) || true
echo "$table"
