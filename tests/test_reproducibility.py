"""The exactness contract: same config, same weights; another seed, other weights."""

from __future__ import annotations

from conftest import tiny, train_in_process


def test_same_config_gives_the_same_weights_and_seeds_differ(tmp_path):
    first = train_in_process(tmp_path / "a", *tiny("seed=1"))
    again = train_in_process(tmp_path / "b", *tiny("seed=1"))
    other = train_in_process(tmp_path / "c", *tiny("seed=2"))
    assert first["weights_sha256"] == again["weights_sha256"]
    assert first["val_loss"] == again["val_loss"]
    assert first["weights_sha256"] != other["weights_sha256"]
    assert (first["seed"], other["seed"]) == (1, 2)


def test_weights_do_not_depend_on_workers_or_pinning(tmp_path):
    hashes = {
        (workers, pin): train_in_process(
            tmp_path / f"w{workers}-{pin}",
            *tiny(
                f"dataloader.num_workers={workers}",
                f"dataloader.pin_memory={pin}",
                "trainer.epochs=2",
            ),
        )["weights_sha256"]
        for workers, pin in [(0, False), (1, True), (2, False), (2, True)]
    }
    assert len(set(hashes.values())) == 1, hashes
