"""A test-only ``torchvision.io`` for ``decode="gpu"`` without a GPU: it records every
``decode_jpeg`` call and decodes on the CPU (seqloader's own decoder, so its pixels are
the CPU fallback's), returning CPU tensors -- everything after the decode then runs on
CPU tensors.  Installed with :meth:`FakeTorchvision.install` (monkeypatch, sys.modules);
``force_cuda`` makes torch report CUDA devices so that the CUDA branch runs."""
from __future__ import annotations

import enum
import sys
import types

import torch


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    RGB = 3


class FakeTorchvision:
    """``version``: what ``torchvision.__version__`` says.  ``refuse``: encoded images
    (bytes) the device decoder rejects, as nvJPEG rejects unusual chroma subsampling.
    ``error``: an exception every call raises (no nvJPEG, out of memory)."""

    def __init__(self, version: str = "0.19.1", *, refuse=(), error: BaseException | None = None):
        self.version, self.refuse, self.error = version, set(refuse), error
        #: one dict per call: inputs (dtype, device, dim of each), mode, device
        self.calls: list[dict] = []

    def decode_jpeg(self, input, mode=ImageReadMode.UNCHANGED, device="cpu",
                    apply_exif_orientation=False):
        from seqloader.transforms.ops import decode_rgb

        items = input if isinstance(input, list) else [input]
        self.calls.append({"list": isinstance(input, list), "mode": mode, "device": device,
                           "inputs": [(t.dtype, t.device.type, t.dim()) for t in items],
                           "nbytes": [int(t.numel()) for t in items]})
        if self.error is not None:
            raise self.error
        out = []
        for t in items:
            data = t.numpy().tobytes()
            if data in self.refuse:
                raise RuntimeError("nvjpegDecodeBatchedPhaseOne failed: "
                                   "NVJPEG_STATUS_JPEG_NOT_SUPPORTED (chroma subsampling)")
            out.append(torch.from_numpy(decode_rgb(data)).permute(2, 0, 1).contiguous())
        return out if isinstance(input, list) else out[0]

    def install(self, monkeypatch) -> "FakeTorchvision":
        tv = types.ModuleType("torchvision")
        tv.__version__ = self.version
        io = types.ModuleType("torchvision.io")
        io.ImageReadMode = ImageReadMode
        io.decode_jpeg = self.decode_jpeg
        tv.io = io
        monkeypatch.setitem(sys.modules, "torchvision", tv)
        monkeypatch.setitem(sys.modules, "torchvision.io", io)
        return self


def force_cuda(monkeypatch, count: int = 2, current: int = 0) -> None:
    """torch reports ``count`` CUDA devices, ``current`` the current one (no kernels run)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)


def no_torchvision(monkeypatch) -> None:
    """``import torchvision`` fails."""
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
