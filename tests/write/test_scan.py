import os

import numpy as np
import pytest

from seqloader.write.scan import scan_class_tree, scan_labelled_folder


def _touch(p, data=b"x"):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def imagefolder_reference(root):
    """torchvision ImageFolder's rule, written out (torchvision cannot be imported here)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    exts = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
    out = []
    for label, c in enumerate(classes):
        for d, _, files in sorted(os.walk(root / c, followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(exts):
                    out.append((os.path.relpath(os.path.join(d, f), root), label))
    return classes, out


def test_classes_and_labels_follow_imagefolder(tmp_path):
    for rel in ["n02/b.JPEG", "n02/a.jpg", "n01/x.PNG", "n01/deep/er/y.jpeg", "n03/z.JpEg",
                "n01/readme.txt", "n03/w.webp"]:
        _touch(tmp_path / rel)
    (tmp_path / "n00").mkdir()  # empty class keeps label 0
    with pytest.warns(UserWarning, match="keep their labels"):
        scan = scan_class_tree(tmp_path)
    classes, ref = imagefolder_reference(tmp_path)
    assert scan.classes == classes == ["n00", "n01", "n02", "n03"]
    assert list(zip(scan.paths, scan.labels.tolist())) == ref
    assert scan.empty_classes == ["n00"] and scan.ignored == 1
    assert scan.labels.dtype == np.int32


def test_hidden_files_and_folders_inside_classes_are_ignored(tmp_path):
    _touch(tmp_path / "c/.hidden.JPEG")
    _touch(tmp_path / "c/._resource.JPEG")
    _touch(tmp_path / "c/.cache/x.JPEG")
    _touch(tmp_path / "c/ok.JPEG")
    scan = scan_class_tree(tmp_path)
    assert scan.paths == ["c/ok.JPEG"]


def test_scan_errors_name_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        scan_class_tree(tmp_path / "nope")
    _touch(tmp_path / "flat.JPEG")
    with pytest.raises(ValueError, match="no class sub-folders.*--val-labels"):
        scan_class_tree(tmp_path)


@pytest.mark.parametrize("style", ["space", "csv", "loc_csv", "numeric", "no_ext"])
def test_labels_file_layouts(tmp_path, style):
    val = tmp_path / "val"
    for i in range(4):
        _touch(val / f"ILSVRC2012_val_{i:08d}.JPEG")
    classes = ["n01", "n02", "n03"]
    want = {0: 2, 1: 0, 2: 1, 3: 2}
    lines = []
    if style in ("csv", "loc_csv"):
        lines.append("ImageId,PredictionString")
    for i, lab in want.items():
        name = f"ILSVRC2012_val_{i:08d}" + ("" if style in ("no_ext", "loc_csv") else ".JPEG")
        if style == "space" or style == "no_ext":
            lines.append(f"{name} {classes[lab]}")
        elif style == "csv":
            lines.append(f"{name},{classes[lab]}")
        elif style == "loc_csv":
            lines.append(f"{name},{classes[lab]} 1 2 3 4 {classes[lab]} 5 6 7 8")
        else:
            lines.append(f"{name} {lab}")
    (tmp_path / "labels.txt").write_text("\n".join(lines) + "\n")
    scan = scan_labelled_folder(val, tmp_path / "labels.txt", classes)
    assert scan.classes == classes
    assert scan.labels.tolist() == [want[i] for i in range(4)]


def test_labels_file_must_cover_every_image(tmp_path):
    val = tmp_path / "val"
    _touch(val / "a.JPEG")
    _touch(val / "b.JPEG")
    (tmp_path / "l.txt").write_text("a.JPEG n1\n")
    with pytest.raises(ValueError, match=r"1 image\(s\).*have no line.*b.JPEG"):
        scan_labelled_folder(val, tmp_path / "l.txt", ["n1"])
    (tmp_path / "l.txt").write_text("a.JPEG n1\nb.JPEG n1\nc.JPEG n1\n")
    with pytest.raises(ValueError, match=r"l.txt:3: no image 'c.JPEG'"):
        scan_labelled_folder(val, tmp_path / "l.txt", ["n1"])
    (tmp_path / "l.txt").write_text("a.JPEG n1\nb.JPEG n9\n")
    with pytest.raises(ValueError, match=r"class 'n9' is not one of"):
        scan_labelled_folder(val, tmp_path / "l.txt", ["n1"])


def test_an_unreadable_folder_is_an_error_not_missing_images(tmp_path, monkeypatch):
    """os.walk skips a folder it cannot list; its images must not silently vanish.
    (Tests run as root here, where chmod does not stop listing: the error is injected.)"""
    for i in range(3):
        _touch(tmp_path / "a" / f"{i}.JPEG")
        _touch(tmp_path / "b" / "nested" / f"{i}.JPEG")
    real = os.scandir

    def scandir(path="."):
        if str(path).endswith("nested"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(ValueError, match=r"cannot list folder .*nested: Permission denied.*permissions"):
        scan_class_tree(tmp_path)


def test_symlink_loops_and_repeats_are_walked_once(tmp_path):
    """Links are followed (ImageFolder does), but a loop (``self -> .``), a link up
    (``up -> ..``: the class itself and the other classes) or a second link to a
    folder must not repeat images or hang the scan."""
    for cls in ("a", "b"):
        for i in range(3):
            _touch(tmp_path / cls / f"{i}.JPEG")
    _touch(tmp_path / "a" / "sub" / "s.JPEG")
    (tmp_path / "a" / "self").symlink_to(".")
    (tmp_path / "a" / "up").symlink_to("..")
    (tmp_path / "a" / "sub2").symlink_to("sub")
    (tmp_path / "b" / "shared").symlink_to(tmp_path / "a" / "sub")  # another class: kept
    with pytest.warns(UserWarning, match="skipped 3 folder"):
        scan = scan_class_tree(tmp_path)
    assert sorted(scan.paths) == ["a/0.JPEG", "a/1.JPEG", "a/2.JPEG", "a/sub/s.JPEG",
                                  "b/0.JPEG", "b/1.JPEG", "b/2.JPEG", "b/shared/s.JPEG"]
    assert list(scan.labels[[p.startswith("b/") for p in scan.paths]]) == [1] * 4


def test_a_class_folder_linking_to_the_split_or_above_is_empty(tmp_path):
    """A class "folder" that is a link to the split folder (``zz -> .``) or above it
    pulled every image in again under its own label; it is kept as a class (labels
    stay ImageFolder's) with no images of its own, and warned about."""
    for cls in ("a", "b"):
        for i in range(2):
            _touch(tmp_path / "train" / cls / f"{i}.JPEG")
    (tmp_path / "train" / "y_up").symlink_to("..")
    (tmp_path / "train" / "z_self").symlink_to(".")
    with pytest.warns(UserWarning) as got:
        scan = scan_class_tree(tmp_path / "train")
    assert scan.classes == ["a", "b", "y_up", "z_self"]
    assert scan.paths == ["a/0.JPEG", "a/1.JPEG", "b/0.JPEG", "b/1.JPEG"]
    msgs = " ".join(str(w.message) for w in got)
    assert "skipped 2 folder" in msgs and "have no images" in msgs


def test_labels_file_with_a_bom_a_missing_first_image_or_not_utf8(tmp_path):
    """A UTF-8 byte-order mark is not part of the first name; a first line naming a
    missing image is an error like any other line, not a header skipped silently; a
    file that is not UTF-8 is an error naming it (it was a bare codec error)."""
    val = tmp_path / "val"
    _touch(val / "a.JPEG")
    _touch(val / "b.JPEG")
    (tmp_path / "l.txt").write_bytes("a.JPEG n1\nb.JPEG n2\n".encode("utf-8-sig"))
    assert scan_labelled_folder(val, tmp_path / "l.txt", ["n1", "n2"]).labels.tolist() == [0, 1]
    (tmp_path / "l.txt").write_text("gone.JPEG n1\na.JPEG n1\nb.JPEG n2\n")
    with pytest.raises(ValueError, match=r"l.txt:1: no image 'gone.JPEG'"):
        scan_labelled_folder(val, tmp_path / "l.txt", ["n1", "n2"])
    (tmp_path / "l.txt").write_text("file,class\na.JPEG,n1\nb.JPEG,n2\n")  # a header
    assert scan_labelled_folder(val, tmp_path / "l.txt", ["n1", "n2"]).labels.tolist() == [0, 1]
    (tmp_path / "l.txt").write_bytes(b"a.JPEG caf\xe9\n")
    with pytest.raises(ValueError, match=r"l.txt is not UTF-8 text.*save it as UTF-8"):
        scan_labelled_folder(val, tmp_path / "l.txt", ["n1"])
