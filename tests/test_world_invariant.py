"""trainer.world_invariant: the same weights on 1, 2 or 4 processes, and resume on another."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from repro.core.engine.invariant import InvariantStep, tree_sum
from repro.core.engine.settings import LoopSettings
from repro.core.errors import ConfigError
from repro.core.runtime.distributed import Context
from repro.core.runtime.memory_format import MemoryFormat
from repro.core.runtime.precision import Precision
from repro.core.tasks.objectives import CrossEntropy

from conftest import compose_config, read_summary, run_cli, tiny, torchrun, train_in_process

# 384 images, global batches of 64 in micro-batches of 16: 4 micro-batches per step, 6 steps
# per epoch. The thread count is fixed: CPU kernels sum in an order that follows it.
INVARIANT = tiny(
    "trainer.epochs=2", "trainer.global_batch=true", "trainer.world_invariant=true",
    "trainer.micro_batch=16", "trainer.num_threads=1", "trainer.checkpoint_every_steps=4",
    "dataloader.num_workers=0", "model.dropout=0.3",
)  # fmt: skip


def test_the_tree_sums_in_one_fixed_order():
    rows = torch.tensor([[1e8], [1.0], [-1e8], [1.0], [3.0]], dtype=torch.float32)
    # ((r0 + r1) + (r2 + r3)) + r4 in float32, where 1e8 + 1 rounds to 1e8: 3, while adding
    # the rows one after another gives 4. The order shows in the result.
    one_by_one = rows[0]
    for row in rows[1:]:
        one_by_one = one_by_one + row
    assert tree_sum(rows).item() == 3.0 and one_by_one.item() == 4.0
    assert tree_sum(rows[:1]).item() == 1e8


@pytest.mark.parametrize("norm", [torch.nn.BatchNorm2d, torch.nn.Identity])
def test_each_gradient_is_laid_out_as_its_parameter_is(norm):
    """CUDA's fused SGD (the fast recipes') refuses a gradient whose strides differ from its
    parameter's: a channels_last weight must get a channels_last gradient. CPU optimizers
    accept either, so the layout itself is checked (with and without BatchNorm layers)."""
    layout = MemoryFormat("channels_last")
    model = layout.model(torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), norm(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
    ))  # fmt: skip
    weight = model[0].weight
    assert weight.stride() != weight.contiguous().stride(), "a channels_last weight"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    step = InvariantStep(
        model, optimizer, scheduler, Precision("off", torch.device("cpu")), layout,
        LoopSettings(), CrossEntropy(), micro_batch=4, root_seed=0, dist=Context(),
    )  # fmt: skip
    step(torch.randn(8, 3, 8, 8), torch.arange(8) % 4, epoch=0, batch=0)
    for name, parameter in model.named_parameters():
        assert parameter.grad.stride() == parameter.stride(), name


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("one") / "run"
    done = run_cli("repro.train", *INVARIANT, f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    return read_summary(run_dir)


@pytest.mark.e2e
def test_two_processes_give_the_weights_of_one(one_process, tmp_path):
    done = torchrun(*INVARIANT, f"hydra.run.dir={tmp_path / 'two'}")
    assert done.returncode == 0, done.stderr[-3000:]
    two = read_summary(tmp_path / "two")
    assert two["world_size"] == 2 and two["weights_sha256"] == one_process["weights_sha256"]
    assert two["val_loss"] == one_process["val_loss"]


@pytest.mark.slow
@pytest.mark.e2e
def test_four_processes_give_the_weights_of_one(one_process, tmp_path):
    done = torchrun(*INVARIANT, f"hydra.run.dir={tmp_path / 'four'}", nproc=4, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_summary(tmp_path / "four")["weights_sha256"] == one_process["weights_sha256"]


@pytest.mark.e2e
@pytest.mark.slow
def test_two_processes_killed_then_resumed_on_one(one_process, tmp_path):
    run_dir = tmp_path / "run"
    killed = torchrun(*INVARIANT, f"hydra.run.dir={run_dir}", env={"REPRO_FAULT": "step:7"})
    assert killed.returncode != 0 and not (run_dir / "summary.json").exists()
    resumed = run_cli("repro.train", *INVARIANT, f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 6 and summary["world_size"] == 1  # the epoch end
    assert summary["weights_sha256"] == one_process["weights_sha256"]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["trainer.global_batch=false"], "trainer.global_batch"),
        (["trainer.micro_batch=24"], "trainer.micro_batch"),
        (["trainer.micro_batch=null"], "trainer.micro_batch"),
        (["trainer.accumulate_steps=2"], "trainer.accumulate_steps"),
        (["augment.cutmix_alpha=1.0"], "augment.mixup_alpha"),
        (["trainer.num_threads=null"], "trainer.num_threads"),
    ],
)
def test_what_world_invariance_needs_is_named(overrides, key, tmp_path):
    with pytest.raises(ConfigError, match=key):
        train_in_process(tmp_path, *INVARIANT, *overrides)
    assert compose_config(*INVARIANT).trainer.world_invariant


def test_dropout_and_batchnorm_run_per_micro_batch_in_one_process(tmp_path):
    once = train_in_process(tmp_path / "a", *INVARIANT, "trainer.max_steps=3")
    again = train_in_process(tmp_path / "b", *INVARIANT, "trainer.max_steps=3")
    plain = train_in_process(tmp_path / "c", *INVARIANT, "trainer.max_steps=3",
                             "trainer.world_invariant=false")  # fmt: skip
    assert once["weights_sha256"] == again["weights_sha256"] != plain["weights_sha256"]


# ---- the unit: one step's gradient, terms and BatchNorm statistics, against their definition --


def test_running_statistics_follow_batchnorms_own_update_one_micro_batch_at_a_time():
    from repro.core.engine.invariant import BatchNormStatistics

    torch.manual_seed(0)
    for momentum in (0.1, None):  # None: BatchNorm's cumulative average
        ours = torch.nn.Sequential(torch.nn.BatchNorm2d(3, momentum=momentum),
                                   torch.nn.BatchNorm1d(4, momentum=momentum),
                                   torch.nn.BatchNorm1d(2, momentum=momentum))  # fmt: skip
        ours[1].eval()  # a layer in eval mode keeps its statistics; the one after it does not
        reference = torch.nn.BatchNorm2d(3, momentum=momentum)
        last = torch.nn.BatchNorm1d(2, momentum=momentum)
        norms = BatchNormStatistics(ours)
        batches = [torch.randn(5, 3, 4, 4) * 3 + 1 for _ in range(3)]
        for x in batches:
            z = torch.randn(7, 2) * 2 - 1
            with norms:
                ours[0](x)
                ours[1](torch.randn(6, 4))
                ours[2](z)
            assert ours[0].track_running_stats and ours[0].running_mean.abs().sum() == 0
            reference(x)
            last(z)
        assert len(norms.pending) == 3 and norms.pending[0].shape == (2 * 3 + 2 * 4 + 2 * 2,)
        norms.apply(torch.stack(norms.pending))
        assert torch.allclose(ours[0].running_mean, reference.running_mean, atol=1e-6)
        assert torch.allclose(ours[0].running_var, reference.running_var, atol=1e-5)
        assert torch.allclose(ours[2].running_mean, last.running_mean, atol=1e-6)
        assert torch.allclose(ours[2].running_var, last.running_var, atol=1e-5)
        assert ours[0].num_batches_tracked.item() == 3 == ours[2].num_batches_tracked.item()
        assert ours[1].num_batches_tracked.item() == 0
        assert ours[1].running_mean.abs().sum() == 0 and torch.equal(
            ours[1].running_var, torch.ones(4)
        )


def test_a_step_uses_the_mean_gradient_and_terms_of_its_micro_batches():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    twin = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    twin.load_state_dict(model.state_dict())
    images, labels = torch.randn(6, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    # The definition: the mean over micro-batches of 2 of each one's mean loss and gradient.
    losses, gradients = [], []
    for x, y in zip(images.split(2), labels.split(2), strict=True):
        twin.zero_grad()
        loss = torch.nn.functional.cross_entropy(twin(x), y)
        loss.backward()
        losses.append(loss.detach())
        gradients.append([p.grad.clone() for p in twin.parameters()])
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    step = InvariantStep(
        model, optimizer, scheduler, Precision("off", torch.device("cpu")),
        MemoryFormat("contiguous"), LoopSettings(), CrossEntropy(), micro_batch=2, root_seed=0,
        dist=Context(),
    )  # fmt: skip
    before = [p.detach().clone() for p in model.parameters()]
    terms = step(images, labels, epoch=0, batch=0)
    assert list(terms) == ["loss"]
    assert torch.allclose(terms["loss"], torch.stack(losses).mean(), atol=1e-6)
    for index, (parameter, old) in enumerate(zip(model.parameters(), before, strict=True)):
        mean = sum(g[index] for g in gradients) / 3
        assert torch.allclose(parameter.grad, mean, atol=1e-6)
        assert torch.allclose(parameter.detach(), old - mean, atol=1e-6)  # lr 1
    assert scheduler.get_last_lr() == [0.5]  # the schedule stepped once


def test_a_clipped_step_clips_the_mean_gradient():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    step = InvariantStep(
        model, optimizer, scheduler, Precision("off", torch.device("cpu")),
        MemoryFormat("contiguous"), LoopSettings(grad_clip=1e-3), CrossEntropy(), micro_batch=2,
        root_seed=0, dist=Context(),
    )  # fmt: skip
    step(torch.randn(4, 4) * 100, torch.tensor([0, 1, 0, 1]), epoch=0, batch=0)
    norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert norm.item() == pytest.approx(1e-3, rel=1e-4)


def test_the_invariant_step_is_refused_where_this_world_cannot_keep_it_word_for_word():
    from types import SimpleNamespace

    from omegaconf import open_dict

    from repro.core.engine import assembly
    from repro.core.engine.settings import Knobs

    cpu = torch.device("cpu")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    parts = SimpleNamespace(model=model, optimizer=optimizer, scheduler=None,
                            context=SimpleNamespace(root_seed=5))  # fmt: skip
    off, layout = Precision("off", cpu), MemoryFormat("contiguous")
    cfg = compose_config(*INVARIANT)
    step = assembly._invariant_step(
        cfg, Knobs(Context(rank=1, world=2), cpu, off, layout), parts, CrossEntropy()
    )
    assert (step.micro_batch, step.root_seed, step.dist.world) == (16, 5, 2)
    assert step.settings == LoopSettings.from_config(cfg)
    cases = [
        ({"micro_batch": 24}, off, "trainer.micro_batch=24 is not allowed: a divisor of the 32 "
         "images each of 2 ranks gets"),
        ({}, SimpleNamespace(mode="fp16"), "amp='fp16' is not allowed: off or bf16 with "
         "trainer.world_invariant=true"),
        ({"num_threads": None}, off, "trainer.num_threads=None is not allowed: a fixed count "
         "(e.g. 1) with trainer.world_invariant=true on CPU"),
    ]  # fmt: skip
    for changes, precision, message in cases:
        cfg = compose_config(*INVARIANT)
        with open_dict(cfg):
            cfg.trainer.update(changes)
        knobs = Knobs(Context(rank=0, world=2), cpu, precision, layout)
        with pytest.raises(ConfigError) as refused:
            assembly._invariant_step(cfg, knobs, parts, CrossEntropy())
        assert str(refused.value) == message


def test_the_tree_adds_neighbours_first():
    rows = torch.tensor([[1.0], [2.0], [4.0], [8.0], [16.0], [32.0], [64.0]], dtype=torch.float64)
    assert tree_sum(rows).item() == 127.0
    assert tree_sum(rows[:4]).item() == 15.0 and tree_sum(rows[:2]).item() == 3.0


class _WithUnused(torch.nn.Module):
    """Dropout, two layers, and a parameter no forward pass uses."""

    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(12, 6), torch.nn.Linear(6, 3)
        self.dropout, self.unused = torch.nn.Dropout(0.5), torch.nn.Parameter(torch.ones(5))

    def forward(self, x):
        return self.second(self.dropout(self.first(x.flatten(1))))


class _Penalised:
    """An objective that reads the images and the model it is handed (a Batch)."""

    def __call__(self, logits, targets, batch):
        loss = torch.nn.functional.cross_entropy(logits, targets.labels, reduction="none")
        weight = batch.model.second.weight.square().sum()
        return {"loss": loss + weight * batch.images.mean(), "weight": weight}


def test_a_step_draws_each_micro_batches_dropout_from_its_own_stream_and_hands_the_objective_its_batch():
    from repro.core.runtime.seeding import stream_seed

    torch.manual_seed(0)
    model, twin = _WithUnused(), _WithUnused()
    twin.load_state_dict(model.state_dict())
    images, labels = torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])
    sums = [torch.zeros_like(p) for p in twin.parameters()]
    for index, (x, y) in enumerate(zip(images.split(2), labels.split(2), strict=True)):
        torch.manual_seed(stream_seed(9, "micro", 3, 5, index))  # (epoch, batch, micro-batch)
        twin.zero_grad()
        terms = _Penalised()(twin(x), SimpleNamespace(labels=y),
                             SimpleNamespace(images=x, model=twin))  # fmt: skip
        terms["loss"].mean().backward()
        for total, p in zip(sums, twin.parameters(), strict=True):
            total += p.grad if p.grad is not None else 0
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    step = InvariantStep(
        model, optimizer, scheduler, Precision("off", torch.device("cpu")),
        MemoryFormat("contiguous"), LoopSettings(), _Penalised(), micro_batch=2, root_seed=9,
        dist=Context(),
    )  # fmt: skip
    terms = step(images, labels, epoch=3, batch=5)
    assert list(terms) == ["loss", "weight"]
    for total, p in zip(sums, model.parameters(), strict=True):
        assert torch.allclose(p.grad, total / 2, atol=1e-6)
    assert torch.equal(model.unused.grad, torch.zeros(5))  # used by no forward pass


def test_the_ranks_micro_batches_are_gathered_in_rank_order(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    alone = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    alone.load_state_dict(model.state_dict())
    images, labels = torch.randn(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])
    gathered = []

    def all_gather(parts, rows):  # the other rank's rows are this rank's: a job of two copies
        gathered.append((len(parts), rows.is_contiguous()))
        for part in parts:
            part.copy_(rows)

    monkeypatch.setattr(torch.distributed, "all_gather", all_gather)

    def step_of(net, dist):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        return InvariantStep(
            net, optimizer, scheduler, Precision("off", torch.device("cpu")),
            MemoryFormat("contiguous"), LoopSettings(), CrossEntropy(), micro_batch=2,
            root_seed=0, dist=dist,
        )  # fmt: skip

    two = step_of(model, Context(rank=0, world=2))(images, labels, epoch=0, batch=0)
    one = step_of(alone, Context())(images, labels, epoch=0, batch=0)
    assert gathered == [(2, True)]  # one gather: gradients and terms together
    assert torch.allclose(two["loss"], one["loss"])
    for p, q in zip(model.parameters(), alone.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-7)
