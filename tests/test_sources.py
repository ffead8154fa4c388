"""Image sources (repro.core.data.sources) in-process: tensors in memory, files decoded to RGB, a
folder per class, and targets of any shape as tensors and as text."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from PIL import Image

from repro.core.data import sources
from repro.core.data.sources import ImageFiles, TensorImages
from repro.core.errors import DataError


def pixels(height: int = 4, width: int = 6) -> np.ndarray:
    return (np.arange(height * width * 3).reshape(height, width, 3) * 7 % 256).astype(np.uint8)


@pytest.mark.parametrize(
    ("labels", "dtype"),
    [
        (torch.tensor([1, 0, 2], dtype=torch.uint8), torch.int64),
        (torch.tensor([1, 0, 2], dtype=torch.int32), torch.int64),
        (torch.tensor([True, False, True]), torch.bool),
        (torch.tensor([0.5, 1.0, 0.0]), torch.float32),
        (torch.tensor([[1, 0], [0, 1], [1, 1]], dtype=torch.int32), torch.int32),
    ],
)
def test_class_indices_become_int64_and_other_targets_keep_their_dtype(labels, dtype):
    held = TensorImages(torch.zeros(3, 1, 2, 2, dtype=torch.uint8), labels)
    assert held.labels.dtype == dtype and len(held) == 3


def test_tensor_images_give_a_sample_a_subset_and_the_tensors_themselves():
    images = torch.arange(4 * 3 * 2 * 2, dtype=torch.uint8).view(4, 3, 2, 2)
    held = TensorImages(images, torch.tensor([3, 1, 0, 2]))
    image, label = held[1]
    assert torch.equal(image, images[1]) and label == 1 and type(label) is int
    part = held.subset(torch.tensor([2, 0]))
    assert torch.equal(part.images, images[[2, 0]]) and part.labels.tolist() == [0, 3]
    assert held.tensors()[0] is images
    rows = TensorImages(images, torch.eye(4))
    assert torch.equal(rows[2][1], torch.eye(4)[2])


def test_only_a_source_that_hands_over_its_tensors_is_in_memory(tmp_path):
    held = TensorImages(torch.zeros(2, 1, 1, 1, dtype=torch.uint8), torch.tensor([0, 1]))
    copy = sources.in_memory(held)
    assert copy.images is held.images and copy.labels is held.labels
    assert sources.in_memory(ImageFiles([tmp_path / "a.png"], [0])) is None

    class Odd:
        tensors = (torch.zeros(1), torch.zeros(1))  # not a method

    assert sources.in_memory(Odd()) is None


@pytest.mark.parametrize("suffix", [".png", ".PNG", ".bmp", ".tiff"])
def test_a_file_decodes_to_its_rgb_pixels_whichever_decoder(tmp_path, suffix):
    path = tmp_path / f"image{suffix}"
    Image.fromarray(pixels()).save(path, format=suffix[1:].upper())
    decoded = sources.decode_file(path)
    assert decoded.dtype == torch.uint8 and decoded.shape == (3, 4, 6)
    assert decoded.is_contiguous() or suffix.lower() == ".png"  # PIL's, made contiguous
    assert np.array_equal(decoded.permute(1, 2, 0).numpy(), pixels())


def test_a_grey_or_palette_image_comes_out_in_three_channels(tmp_path):
    grey = tmp_path / "grey.png"
    Image.fromarray(pixels()[..., 0]).save(grey)
    decoded = sources.decode_file(grey)
    assert decoded.shape == (3, 4, 6)
    assert torch.equal(decoded[0], decoded[2]) and torch.equal(decoded[0], decoded[1])
    palette = tmp_path / "palette.gif"
    Image.fromarray(pixels()).convert("P").save(palette)
    assert sources.decode_file(palette).shape == (3, 4, 6)


def test_which_decoder_reads_a_file_goes_by_its_suffix(tmp_path, monkeypatch):
    used = []
    real = sources.torchvision_decoder()

    def counted(data):
        used.append(len(data))
        return real(data)

    monkeypatch.setattr(sources, "torchvision_decoder", lambda: counted)
    for name, kind in (("a.JPG", "JPEG"), ("b.bmp", "BMP"), ("c.webp", "WEBP")):
        Image.fromarray(pixels()).save(tmp_path / name, format=kind)
        sources.decode_file(tmp_path / name)
    assert len(used) == 2, "JPEG and WebP through torchvision, BMP through PIL"
    monkeypatch.setattr(sources, "torchvision_decoder", lambda: None)
    assert sources.decode_file(tmp_path / "a.JPG").shape == (3, 4, 6)
    assert len(used) == 2, "without torchvision's decoders, PIL reads everything"


def test_without_torchvisions_decoders_there_is_no_decoder(monkeypatch):
    sources.torchvision_decoder.cache_clear()
    try:
        with monkeypatch.context() as patched:
            patched.setitem(sys.modules, "torchvision.io", None)
            assert sources.torchvision_decoder() is None
    finally:
        sources.torchvision_decoder.cache_clear()
    decoder = sources.torchvision_decoder()
    assert decoder.keywords["mode"].name == "RGB"


@pytest.mark.parametrize("suffix", [".png", ".bmp"])
def test_an_unreadable_image_is_one_data_error_naming_the_file(tmp_path, suffix):
    path = tmp_path / f"broken{suffix}"
    path.write_bytes(b"this is not an image at all")
    with pytest.raises(DataError) as refused:
        sources.decode_file(path)
    assert str(refused.value).startswith(f"{path}: not a readable image (")
    with pytest.raises(DataError, match="missing"):
        sources.decode_file(tmp_path / "missing.png")


def test_targets_become_one_tensor_as_they_were_given():
    given = torch.tensor([1, 2])
    assert sources.stack_targets(given) is given
    rows = sources.stack_targets([torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])])
    assert rows.dtype == torch.float32 and rows.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    indices = sources.stack_targets([3, 1])
    assert indices.dtype == torch.int64 and indices.tolist() == [3, 1]
    empty = sources.stack_targets([])
    assert empty.dtype == torch.int64 and empty.shape == (0,)


def test_a_target_as_text_is_its_number_or_its_dtype_shape_and_values():
    assert sources.target_text(3) == "3" and sources.target_text(torch.tensor(4)) == "4"
    row = torch.tensor([1.0, 0.0, 0.5])
    assert sources.target_text(row) == "float32(3,)[1.0, 0.0, 0.5]"
    grid = torch.tensor([[1, 0]], dtype=torch.uint8)
    assert sources.target_text(grid) == "uint8(1, 2)[[1, 0]]"


def test_a_folder_per_class_gives_its_images_sorted_and_labelled_in_class_order(tmp_path):
    layout = {
        "cat/b.png": 1,
        "cat/a.PNG": 1,
        "cat/deep/c.jpg": 1,
        "cat/notes.txt": None,
        "dog/z.bmp": 0,
        "dog/readme": None,
        "bird/x.png": None,  # a class not asked for
    }
    for name in layout:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    files = ImageFiles.from_folder(tmp_path, ["dog", "cat"])
    names = [str(path.relative_to(tmp_path)) for path in files.paths]
    assert names == ["dog/z.bmp", "cat/a.PNG", "cat/b.png", "cat/deep/c.jpg"]
    assert files.labels == [0, 1, 1, 1] and len(files) == 4
    part = files.subset(torch.tensor([3, 0]))
    assert part.paths == [files.paths[3], files.paths[0]] and part.labels == [1, 0]


def test_an_image_file_gives_its_pixels_and_its_target(tmp_path):
    Image.fromarray(pixels()).save(tmp_path / "a.png")
    target = torch.tensor([1.0, 0.0])
    image, label = ImageFiles([tmp_path / "a.png"], [target])[0]
    assert image.shape == (3, 4, 6) and label is target


def test_a_grey_file_read_by_pil_comes_out_in_three_channels(tmp_path):
    Image.fromarray(pixels()[..., 1]).save(tmp_path / "grey.bmp")
    decoded = sources.decode_file(tmp_path / "grey.bmp")
    assert decoded.shape == (3, 4, 6) and torch.equal(decoded[0], decoded[2])


def test_an_image_over_the_pixel_cap_is_refused_naming_its_file(tmp_path):
    import struct

    header = struct.pack(">IIBBBBB", 2**15, 2**15, 8, 2, 0, 0, 0)
    huge = tmp_path / "huge.png"
    huge.write_bytes(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + header)
    with pytest.raises(DataError) as refused:
        sources.decode_file(huge)
    assert str(refused.value).startswith(f"{huge}: an image of 32768 x 32768 pixels")


@pytest.mark.parametrize(
    "images",
    [torch.zeros(2, 1, 2, 2), torch.zeros(2, 2, 2, dtype=torch.uint8)],
    ids=["float", "three dimensions"],
)
def test_tensor_images_are_uint8_and_four_dimensional(images):
    with pytest.raises(AssertionError):
        TensorImages(images, torch.tensor([0, 1]))
