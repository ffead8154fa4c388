"""repro.shards.pack unit by unit: sizes as written on the command line, the image folder and
CIFAR-10 read as sources, the cut into shards, the shuffle each split gets, the pixels of
`--pixels`, and each refusal in one line with nothing written."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from repro.core.errors import DataError, StorageError
from repro.shards import pack as packing
from repro.shards.dataset import decode_bytes
from repro.shards.format import parse_manifest
from repro.shards.pack import pack, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("256MB", 256 * 10**6),
        ("64KiB", 65536),
        ("1GB", 10**9),
        ("2MiB", 2 << 20),
        ("1GiB", 1 << 30),
        ("1.5MB", 1_500_000),
        (" 2 kb ", 2000),
        ("12B", 12),
        ("100", 100),
        ("3kB", 3000),
    ],
)
def test_sizes_are_read_in_decimal_and_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["12XB", "MB", "1.2.3MB", "-5MB", "", "5 M B"])
def test_a_size_that_is_not_one_is_one_line(text):
    with pytest.raises(DataError) as refused:
        parse_size(text)
    assert str(refused.value) == f"--shard-size {text}: not a size (256MB, 64KiB, 1GB or bytes)"


def _png(path: Path, value: int, size: tuple[int, int] = (4, 3)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (value, 255 - value, value // 2)).save(path)
    return path


def _tree(root: Path, splits=("train", "val"), per_class: int = 3) -> Path:
    for split in splits:
        for c, name in enumerate(("cat", "dog")):
            for i in range(per_class):
                _png(root / split / name / f"{i}.png", 10 * c + i)
    return root


def test_an_image_folder_is_read_class_by_class_with_nested_images_and_only_images(tmp_path):
    root = _tree(tmp_path / "src")
    _png(root / "train" / "dog" / "deep" / "x.png", 200)
    (root / "train" / "dog" / "notes.txt").write_text("not an image")
    (root / "train" / "dog" / "UPPER.PNG").write_bytes(
        (root / "train" / "cat" / "0.png").read_bytes()
    )
    classes, splits = packing.image_folder(root)
    assert classes == ["cat", "dog"] and list(splits) == ["train", "val"]
    train = [
        (ext, where.relative_to(root).as_posix(), label) for ext, where, label in splits["train"]
    ]
    assert train == [
        ("png", "train/cat/0.png", 0),
        ("png", "train/cat/1.png", 0),
        ("png", "train/cat/2.png", 0),
        ("png", "train/dog/0.png", 1),
        ("png", "train/dog/1.png", 1),
        ("png", "train/dog/2.png", 1),
        ("png", "train/dog/UPPER.PNG", 1),
        ("png", "train/dog/deep/x.png", 1),
    ]
    assert len(splits["val"]) == 6


def test_a_folder_with_one_class_or_a_split_without_images_is_one_line(tmp_path):
    one = tmp_path / "one"
    _png(one / "train" / "cat" / "0.png", 1)
    with pytest.raises(DataError) as refused:
        packing.image_folder(one)
    assert str(refused.value) == f"{one}/train: 1 class folders; need 2+"
    empty = _tree(tmp_path / "empty", splits=("train",))
    (empty / "test" / "cat").mkdir(parents=True)
    with pytest.raises(DataError) as no_images:
        packing.image_folder(empty)
    assert str(no_images.value) == (
        f"{empty / 'test'}: no images (.bmp, .gif, .jpeg, .jpg, .png, .ppm, .tif, .tiff, .webp)"
    )


def test_links_out_of_the_folder_are_refused_naming_them_and_hard_links_inside_pass(tmp_path):
    root = _tree(tmp_path / "src", splits=("train",))
    inside = root / "train" / "cat" / "0.png"
    os.link(inside, root / "train" / "dog" / "copy.png")  # a deduplicated dataset
    packing.refuse_links(root)
    outside = tmp_path / "secret.png"
    os.link(root / "train" / "cat" / "1.png", outside)
    with pytest.raises(DataError) as hard:
        packing.refuse_links(root)
    assert str(hard.value) == (
        f"{root / 'train' / 'cat' / '1.png'}: has a hard link outside the folder to pack: "
        "refused, it is another file's contents; put a copy of its own in its place"
    )
    outside.unlink()
    (root / "train" / "cat" / "link.png").symlink_to(outside)
    with pytest.raises(DataError) as soft:
        packing.refuse_links(root)
    assert str(soft.value) == (
        f"{root / 'train' / 'cat' / 'link.png'}: a symbolic link in the folder to pack (to "
        f"{outside}): refused, its target would go into the shards; put a copy in its place"
    )


def _cifar(root: Path, images: int = 2) -> np.ndarray:
    root.mkdir(parents=True)
    with (root / "batches.meta").open("wb") as handle:
        pickle.dump({b"label_names": [b"cat", b"dog"]}, handle)
    pixels = np.random.default_rng(1).integers(0, 256, (6, images, 3 * 32 * 32), dtype=np.uint8)
    for number, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        with (root / name).open("wb") as handle:
            labels = [(number + i) % 2 for i in range(images)]
            pickle.dump({b"data": pixels[number], b"labels": labels}, handle)
    return pixels


def test_cifar10_is_read_from_its_folder_or_its_parent_as_pngs_of_its_pixels(tmp_path):
    pixels = _cifar(tmp_path / "cifar-10-batches-py")
    for src in (tmp_path, tmp_path / "cifar-10-batches-py"):
        classes, splits = packing.read_source(src)
        assert classes == ["cat", "dog"] and list(splits) == ["train", "test"]
        assert len(splits["train"]) == 10 and len(splits["test"]) == 2
    ext, data, label = splits["train"][2]  # batch 2, image 0
    assert (ext, label) == ("png", 1)
    decoded = decode_bytes(data, "here")
    assert decoded.tolist() == pixels[1][0].reshape(3, 32, 32).tolist()


def test_a_cifar_batch_that_is_no_pickle_or_not_laid_out_as_one_is_one_line(tmp_path):
    root = tmp_path / "c"
    _cifar(root)
    (root / "data_batch_4").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match=r"^.*data_batch_4: not a CIFAR-10 batch \("):
        packing.cifar10(root)
    with (root / "data_batch_4").open("wb") as handle:
        pickle.dump({b"labels": [0]}, handle)
    with pytest.raises(DataError) as layout:
        packing.cifar10(root)
    assert str(layout.value) == (
        f"{root / 'data_batch_4'}: not laid out as a CIFAR-10 batch (KeyError: b'data')"
    )
    with (root / "batches.meta").open("wb") as handle:
        pickle.dump([1], handle)
    with pytest.raises(DataError, match=r"batches\.meta: not laid out as a CIFAR-10 batch \(Type"):
        packing.cifar10(root)


def test_a_source_that_is_neither_is_one_line(tmp_path):
    with pytest.raises(DataError) as refused:
        packing.read_source(tmp_path)
    assert str(refused.value) == (
        f"{tmp_path}: expected an image folder (train/<class>/...) or CIFAR-10 "
        "(cifar-10-batches-py)"
    )


def test_items_are_cut_in_runs_of_about_the_size_asked_and_never_empty():
    items = [("png", b"x" * n, 0) for n in (100, 100, 5000, 10, 10)]

    def cut(limit: int) -> list[list[int]]:
        return [[len(item[1]) for item in shard] for shard in packing._cut(items, limit)]

    # Each item counts its bytes and 1536 of headers and padding: 100 + 1536 + 100 = 1736.
    assert cut(1736) == [[100, 100], [5000], [10, 10]]
    assert cut(1735) == [[100], [100], [5000], [10, 10]]
    assert cut(1) == [[100], [100], [5000], [10], [10]]  # never an empty shard
    assert list(packing._cut([], 10)) == []


def test_each_split_is_shuffled_with_the_seed_and_its_own_stream_then_cut(tmp_path):
    root = _tree(tmp_path / "src", per_class=4)
    manifest = pack(root, tmp_path / "out", 3000, seed=7)
    classes, splits = packing.image_folder(root)
    parsed = parse_manifest(manifest.read_bytes(), "m")
    for number, split in enumerate(("train", "val")):
        order = np.random.default_rng([7, number]).permutation(len(splits[split]))
        expected = [splits[split][i][1].read_bytes() for i in order]
        packed = []
        for s, shard in enumerate(parsed.splits[split]):
            data = (manifest.parent / shard.name).read_bytes()
            assert shard.name == f"{split}-{s:06d}.tar"
            packed += [data[o : o + n] for o, n, _, _ in shard.index.tolist()]
            with tarfile.open(manifest.parent / shard.name) as tar:
                keys = [name.rsplit(".", 1)[0] for name in tar.getnames()[::2]]
            assert keys == [f"{split}-{s:06d}-{p:06d}" for p in range(len(shard.index))]
        assert packed == expected
        assert len(parsed.splits[split]) > 1
    assert parsed.classes == classes


def test_pixels_are_stored_decoded_as_the_readers_decode_them(tmp_path):
    root = _tree(tmp_path / "src", splits=("train",), per_class=1)
    manifest = pack(root, tmp_path / "out", 10**6, pixels=True)
    [shard] = parse_manifest(manifest.read_bytes(), "m").splits["train"]
    data = (manifest.parent / shard.name).read_bytes()
    with tarfile.open(manifest.parent / shard.name) as tar:
        assert [n.rsplit(".", 1)[1] for n in tar.getnames()] == ["npy", "cls", "npy", "cls"]
    items = packing.image_folder(root)[1]["train"]
    order = np.random.default_rng([0, 0]).permutation(2)
    for (offset, size, label, _), i in zip(shard.index.tolist(), order, strict=True):
        stored = np.load(io.BytesIO(data[offset : offset + size]), allow_pickle=False)
        expected = decode_bytes(items[i][1].read_bytes(), "x").numpy()
        assert np.array_equal(stored, expected) and label == items[i][2]
    ext, encoded, label = packing.as_pixels(("png", items[0][1].read_bytes(), 5))
    assert (ext, label) == ("npy", 5) and np.load(io.BytesIO(encoded)).shape == (3, 3, 4)


def test_a_destination_that_exists_is_refused_and_a_failed_pack_leaves_nothing(tmp_path):
    root = _tree(tmp_path / "src", splits=("train",))
    (tmp_path / "out").mkdir()
    with pytest.raises(DataError) as exists:
        pack(root, tmp_path / "out")
    assert str(exists.value) == (
        f"{tmp_path / 'out'}: exists; pack into a new folder (a dataset is never rewritten)"
    )
    (tmp_path / ".fresh.partial").mkdir()
    (tmp_path / ".fresh.partial" / "stale.tar").write_bytes(b"left by a kill")
    manifest = pack(root, tmp_path / "fresh")
    assert manifest == tmp_path / "fresh" / "manifest.json"
    assert sorted(p.name for p in manifest.parent.iterdir()) == [
        "manifest.json",
        "train-000000.tar",
    ]
    assert not (tmp_path / ".fresh.partial").exists()
    (root / "train" / "cat" / "0.png").write_bytes(b"not an image")
    with pytest.raises(DataError):
        pack(root, tmp_path / "broken", pixels=True)
    assert not (tmp_path / "broken").exists() and not (tmp_path / ".broken.partial").exists()


def test_a_cifar_batch_is_read_as_python_2_wrote_it_and_nothing_else_is_imported(tmp_path):
    # CIFAR-10's batches were pickled by Python 2: their keys are str there, bytes here.
    python2 = b"\x80\x02}q\x00U\x06labelsq\x01]q\x02K\x01as."
    (tmp_path / "batch").write_bytes(python2)
    assert packing.load_cifar_batch(tmp_path / "batch") == {b"labels": [1]}
    (tmp_path / "code").write_bytes(b"\x80\x02cos\nsystem\nq\x00.")
    with pytest.raises(DataError) as refused:
        packing.load_cifar_batch(tmp_path / "code")
    assert (
        str(refused.value)
        == f"{tmp_path / 'code'}: holds os.system, not CIFAR-10's arrays; refused"
    )
    (tmp_path / "link").symlink_to(tmp_path / "batch")
    with pytest.raises(DataError) as linked:
        packing.load_cifar_batch(tmp_path / "link")
    assert str(linked.value).startswith(f"{tmp_path / 'link'}: ")


def test_pixels_that_cannot_be_decoded_name_their_file_or_say_an_image(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"no image")
    with pytest.raises(DataError) as named:
        packing.as_pixels(("png", bad, 0))
    assert str(named.value) == f"{bad}: not a readable image (UnidentifiedImageError)"
    with pytest.raises(DataError) as made:
        packing.as_pixels(("png", b"no image", 0))
    assert str(made.value) == "an image: not a readable image (UnidentifiedImageError)"


def test_a_cifar_batch_with_more_labels_than_images_is_one_line(tmp_path):
    root = tmp_path / "c"
    _cifar(root)
    with (root / "test_batch").open("wb") as handle:
        pickle.dump({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0, 1, 0]}, handle)
    with pytest.raises(DataError, match=r"test_batch: not laid out as a CIFAR-10 batch \(Value"):
        packing.cifar10(root)


def test_a_shard_after_a_cut_starts_empty():
    items = [("png", b"x" * n, 0) for n in (5000, 100, 100)]
    # 100 + 1536 + 100 = 1736: the two small items share the shard after the large one's.
    assert [[len(i[1]) for i in s] for s in packing._cut(items, 1736)] == [[5000], [100, 100]]


def test_pack_shuffles_with_seed_0_by_default_and_makes_missing_parent_folders(tmp_path):
    root = _tree(tmp_path / "src", splits=("train",))
    default = pack(root, tmp_path / "a" / "b" / "default", 3000)
    assert default.read_bytes() == pack(root, tmp_path / "zero", 3000, seed=0).read_bytes()
    assert default.read_bytes() != pack(root, tmp_path / "one", 3000, seed=1).read_bytes()


def test_a_destination_that_cannot_be_made_or_an_image_that_is_no_file_is_one_line(tmp_path):
    root = _tree(tmp_path / "src", splits=("train",))
    (tmp_path / "file.txt").write_text("a file, not a folder")
    with pytest.raises(StorageError) as unwritable:
        pack(root, tmp_path / "file.txt" / "out")
    assert str(unwritable.value).startswith(
        f"cannot write {tmp_path / 'file.txt' / '.out.partial'}: "
    )
    fifo = root / "train" / "cat" / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(DataError) as special:
        pack(root, tmp_path / "out")
    assert str(special.value).startswith(f"{fifo}: ")
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.partial").exists()
