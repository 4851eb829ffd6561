"""The loaders and modes ``seqloader bench`` measures, and each mode's transform."""
from __future__ import annotations

__all__ = ["LOADERS", "MODES", "imagenet_train_transform", "decode_transform"]

LOADERS = ("seqloader", "files")
MODES = ("raw", "decode", "full", "cpu-limit")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DECODE_CROP = 64


def imagenet_train_transform():
    """RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize (ImageNet)."""
    from ... import transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def decode_transform():
    """The ``decode`` mode's transform: a 64 px centre crop of the decoded image."""
    from ... import transforms as T

    return T.CenterCrop(DECODE_CROP)


def _transform_for(mode: str):
    if mode == "raw":
        return None
    if mode == "decode":
        return decode_transform()
    return imagenet_train_transform()

