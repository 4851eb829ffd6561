"""What an image tree looks like: image file names, class folders, and the sentence that
tells a user a folder is an image tree to preprocess rather than a database.

Shared by the writer's scan (which reads such trees) and the database finder (which
says so when it is pointed at one); cheap: it lists folders, it never opens an image."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["IMG_EXTENSIONS", "is_image_file", "subfolders", "holds_images", "class_folders",
           "image_tree_hint"]

#: torchvision's ``IMG_EXTENSIONS``, compared case-insensitively.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def is_image_file(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(IMG_EXTENSIONS)


def subfolders(folder: Path) -> list[str]:
    """The sorted names of ``folder``'s non-hidden sub-folders ([] if it cannot be listed)."""
    try:
        with os.scandir(folder) as it:
            return sorted(e.name for e in it if not e.name.startswith(".") and e.is_dir())
    except OSError:
        return []


def holds_images(folder: Path) -> bool:
    """Whether ``folder`` directly holds an image file (stops at the first one)."""
    try:
        with os.scandir(folder) as it:
            return any(is_image_file(e.name) for e in it)
    except OSError:
        return False


def class_folders(folder: Path, probe: int = 3) -> int:
    """How many sub-folders ``folder`` has if one of its first ``probe`` holds images
    (the ImageFolder layout ``folder/<class>/<image>``), else 0."""
    subs = subfolders(folder)
    return len(subs) if any(holds_images(folder / c) for c in subs[:probe]) else 0


def image_tree_hint(folder: str | Path) -> str | None:
    """If ``folder`` looks like an image tree rather than a folder of databases -- an
    ImageNet root (``<split>/<class>/<image>``), one split's folder (``<class>/<image>``)
    or a folder of images -- a sentence saying so and how to preprocess it into another
    folder; else None.
    Cheap on any tree: lists the folder, up to four split folders and three class
    folders in each, whatever the number of images."""
    folder = Path(folder)
    subs = subfolders(folder)
    splits = [s for s in ("train", "val") if s in subs] + [s for s in subs if s not in ("train", "val")]
    for split in splits[:4]:
        n = class_folders(folder / split)
        if n:
            return (f"{folder} looks like an image tree ({n} class folders under {split}/), not "
                    f"a folder of seqloader databases: preprocess it into another folder, "
                    f"`seqloader preprocess {folder} OUT` (or `python preprocess_sequential.py "
                    f"{folder} OUT`), and read OUT")
    n = class_folders(folder)
    if n:
        parent = folder.resolve().parent
        return (f"{folder} looks like one split's image folder ({n} class folders of images), "
                f"not a seqloader database: preprocess the folder above it into another "
                f"folder, `seqloader preprocess {parent} OUT --splits {folder.resolve().name}`, "
                f"and read OUT")
    if holds_images(folder):
        return (f"{folder} holds image files, not seqloader databases: preprocess the image "
                f"tree (the folder holding train/ and val/ class folders) into another folder, "
                f"`seqloader preprocess <imagenet dir> OUT`, and read OUT")
    return None
