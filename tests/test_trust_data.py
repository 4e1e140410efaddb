"""Data that cannot mislabel (issue #31): labels map by the backbone's names or an explicit label map,
never by a silent fallback; one class, columns that are the label, flags of the other modality and image
folders with entries they would skip are refused."""

from __future__ import annotations

import json
import os

import pytest

from sopfast.adapters.preprocessing import Preprocessing
from sopfast.data import user_data as D
from sopfast.data.folders import check_image_folder
from sopfast.data.labels import DataError, label_ids
from sopfast.data.splits import DataOptions

NAMED = Preprocessing("image", label2id={"cat": 0, "dog": 1, "owl": 2}, num_classes=3)
PARTLY = Preprocessing("image", label2id={"cat": 0, "dog": 1}, num_classes=3)
UNNAMED = Preprocessing("image", num_classes=3)


def ids(labels, prep, class_names=None, label_map=None) -> list[int]:
    to_id, _ = label_ids(labels, prep, class_names, "data.csv", label_map)
    return [to_id(v) for v in labels]


@pytest.mark.parametrize(
    "labels, prep, match",
    [
        (
            ["cat", "dog", "Owl"],
            NAMED,
            r"labels \['Owl'\] are not classes .*did you mean: 'Owl' → 'owl'\?",
        ),
        (["cat", "dog", "owl"], PARTLY, r"labels \['owl'\] are not classes of the backbone"),
        (["cat", "1", "dog"], NAMED, r"labels \['1'\] are not classes"),
    ],
)
def test_a_label_the_backbone_does_not_name_is_an_error(labels, prep, match):
    with pytest.raises(DataError, match=match + ".*--label-map"):
        ids(labels, prep)


def test_classlabel_names_map_by_name_or_fail():
    assert ids([0, 1, 0], NAMED, class_names=["dog", "owl"]) == [1, 2, 1]
    with pytest.raises(DataError, match=r"labels \['bird'\]"):
        ids([0, 1], NAMED, class_names=["dog", "bird"])
    assert ids([0, 1], UNNAMED, class_names=["dog", "bird"]) == [0, 1]  # no names: the column's order


def test_names_and_ids_map_as_before_where_nothing_is_ambiguous():
    assert ids(["owl", "cat", "dog"], NAMED) == [2, 0, 1]
    assert ids(["owl", "cat", "dog"], UNNAMED) == [2, 0, 1]  # sorted: the backbone names no classes
    assert ids([2, "0", 1.0], NAMED) == [2, 0, 1]


def test_a_label_map_maps_every_label():
    assert ids(["cat", "dog", "Owl"], NAMED, label_map={"cat": 0, "dog": "dog", "Owl": "owl"}) == [0, 1, 2]
    with pytest.raises(DataError, match=r"label_map does not map the labels \['Owl'\]"):
        ids(["cat", "Owl"], NAMED, label_map={"cat": 0})
    with pytest.raises(DataError, match=r"label_map 'cat' → 5 is outside the backbone's 3 classes"):
        ids(["cat"], NAMED, label_map={"cat": 5})
    with pytest.raises(DataError, match=r"'cat' → 'lion' is neither a class id \(an integer\) nor a class name"):
        ids(["cat"], NAMED, label_map={"cat": "lion"})


def _table(tmp_path, labels) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"image": [[0, 0], [0, 0]], "label": y}) + "\n" for y in labels))
    return str(path)


def test_one_class_training_data_is_refused_for_every_source(tmp_path):
    table = _table(tmp_path, ["cat"] * 4)
    with pytest.raises(DataError, match=r"training data holds one class \('cat'\)"):
        D.load_split(table, "train", NAMED)
    assert len(D.load_split(table, "test", NAMED, holdout=0.5)[0]) == 2  # evaluation data of one class is fine
    folder = tmp_path / "folder" / "cat"
    folder.mkdir(parents=True)
    (folder / "a.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"holds one class \('cat'\)"):
        D.open_source(str(tmp_path / "folder"))


def test_a_column_that_is_the_label_is_refused(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("text,label\ngood,pos\nbad,neg\n")
    text = Preprocessing("text")
    with pytest.raises(DataError, match=r"text-pair column \(--text-pair-column\) 'label' is the label column"):
        D.load_split(str(table), "train", text, columns=D.Columns(text_pair="label"))
    with pytest.raises(DataError, match=r"text-pair column .* 'text' is the text column"):
        D.load_split(str(table), "train", text, columns=D.Columns(text_pair="text"))
    with pytest.raises(DataError, match=r"text column 'label' is the label column"):
        D.load_split(str(table), "train", text, columns=D.Columns(text="label"))


@pytest.mark.parametrize(
    "options, modality, match",
    [
        (
            DataOptions(image_size=[32]),
            "text",
            r"image_size \(--image-size\) is for image data; the backbone is a text",
        ),
        (DataOptions(columns=D.Columns(text="t")), "image", r"text_column \(--text-column\) is for text data"),
        (DataOptions(max_length=16), "image", r"max_length \(--max-length\)"),
    ],
)
def test_options_of_the_other_modality_are_refused(options, modality, match):
    with pytest.raises(DataError, match=match):
        options.check_modality(modality)


def _image_folder(tmp_path):
    root = tmp_path / "images"
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        (root / name / "0.png").write_bytes(b"png")
    return root


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda root: os.symlink(root / "missing.png", root / "cat" / "1.png"), "1.png is a broken symbolic link"),
        (lambda root: os.mkfifo(root / "cat" / "1.png"), "1.png is not a regular file"),
        (lambda root: (root / "cat" / "1.png").mkdir(), "1.png is a directory named like an image"),
        (lambda root: (root / "owl").mkdir(), "owl holds no images"),
    ],
)
def test_image_folder_entries_that_would_be_skipped_are_refused(tmp_path, make, match):
    root = _image_folder(tmp_path)
    check_image_folder(str(root))
    make(root)
    with pytest.raises(DataError, match=match):
        check_image_folder(str(root))
