"""The fused recipes as torch tensor operations, for batches decoded on the device
(``Loader(decode="gpu")``, NOTE [ GPU batches ] in :mod:`seqloader.dataflow.gpugather`).

Only :func:`decode_jpegs` needs a GPU: on CUDA it is torchvision's batched nvJPEG
decode; on any other device the CPU decoder (:func:`~seqloader.transforms.decode_rgb`)
stands in for it, so everything after it -- per-sample crop and resize, flip, rounding,
normalisation -- runs, and is tested, on CPU tensors too.  No torchvision import
otherwise.

NOTE [ GPU pixels ]
The boxes and flips are the fused CPU path's (drawn by the same function); the pixels
are not bit-equal: the image is decoded at full scale (the CPU path decodes at 1/2,
1/4 or 1/8 where the crop allows) and resized by ``torch.nn.functional.interpolate``
(``antialias=True``: PIL's triangle filter, where the CPU path uses box halvings, a
blur and bilinear).  Each sample is rounded to whole grey levels before normalising,
as the CPU path's uint8 stage is.  The distance to ``decode="cpu"`` is measured by
``benchmarks/gpu_node.py`` and bounded by ``tests/transforms/test_gpu.py``;
docs/gpu.md states it.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DeviceError
from .geometry import ResizeCropGeometry, crop_span

__all__ = ["decode_jpegs", "JpegDecoder", "TensorRecipe", "TORCH_MODES",
           "MIN_TORCHVISION", "MAX_STEP", "cpu_decode", "tiny_jpeg"]

#: The fused pipeline's interpolation modes that torch's ``interpolate`` renders
#: ("pil-bilinear" is PIL's antialiased bilinear: ``interpolate``'s with antialias).
TORCH_MODES = {"bilinear": "bilinear", "pil-bilinear": "bilinear", "bicubic": "bicubic",
               "nearest": "nearest", "nearest-exact": "nearest-exact"}


#: The torchvision release whose ``decode_jpeg`` takes a list of images and decodes them
#: in one batched nvJPEG call (older ones take one tensor).
MIN_TORCHVISION = (0, 19)

# NOTE [ antialias limit ]
# ``interpolate(antialias=True)`` on CUDA keeps a sample's filter weights in 48 KB of
# shared memory and refuses a downscale whose kernel needs more: bilinear beyond ~94x,
# bicubic beyond ~47x (``Resize(256)`` of a 25,000 px image).  Such a downscale is done
# in steps of at most these factors (each step antialiased), on every device alike.
MAX_STEP = {"bilinear": 64.0, "bicubic": 32.0}


def _version(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def tiny_jpeg() -> bytes:
    """A 16x16 colour baseline JPEG (4:2:0), for a decoder's setup check."""
    import cv2

    img = np.zeros((16, 16, 3), np.uint8)
    img[:, 8:] = (40, 160, 220)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    return buf.tobytes()


def cpu_decode(data: torch.Tensor) -> torch.Tensor:
    """One JPEG (a 1-D uint8 CPU tensor) decoded by the CPU decoder to ``[3, H, W]`` uint8
    RGB: the stand-in for nvJPEG off CUDA, and the fallback for an image nvJPEG refuses."""
    from .ops import decode_rgb

    return torch.from_numpy(decode_rgb(data.numpy())).permute(2, 0, 1)


class JpegDecoder:
    """Decodes batches of JPEGs (1-D uint8 CPU tensors) to ``[3, H, W]`` uint8 RGB
    tensors on ``device``: on CUDA one batched nvJPEG call (torchvision's
    ``decode_jpeg(list, mode=RGB, device=cuda:N)``), elsewhere the CPU decoder.

    Built where the Loader is: on CUDA it checks torchvision (>= 0.19, importable, its
    ``decode_jpeg`` present) and decodes a tiny JPEG on the device, raising
    :class:`DeviceError` with the fix when any of that fails."""

    def __init__(self, device: torch.device):
        self.device = device
        self.nvjpeg = device.type == "cuda"
        self._decode: Any = None
        if self.nvjpeg:
            self._decode = _torchvision_decode()
            self.check()

    def check(self) -> None:
        """Decode a tiny JPEG on the device (nvJPEG present and working)."""
        try:
            out = self([torch.frombuffer(bytearray(tiny_jpeg()), dtype=torch.uint8)])
        except Exception as e:
            raise DeviceError(
                f"decode='gpu': torchvision could not decode a test JPEG on {self.device} "
                f"({type(e).__name__}: {e}); a torchvision built without nvJPEG (e.g. a CPU "
                "or ROCm build) cannot decode on the GPU -- install the CUDA build matching "
                "torch (pip install 'seqloader[gpu]'), or use decode='cpu'") from e
        if len(out) != 1 or tuple(out[0].shape) != (3, 16, 16):
            raise DeviceError(
                f"decode='gpu': torchvision's decode_jpeg on {self.device} returned "
                f"{[tuple(o.shape) for o in out]} for one 16x16 RGB JPEG; expected "
                "[(3, 16, 16)] -- use torchvision >= 0.19 or decode='cpu'")

    def __call__(self, data: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Raises (RuntimeError / ValueError ...) if an image cannot be decoded."""
        if not data:
            return []
        if self.nvjpeg:
            from torchvision.io import ImageReadMode

            return list(self._decode(list(data), mode=ImageReadMode.RGB, device=self.device))
        return [cpu_decode(d).to(self.device) for d in data]


def _torchvision_decode() -> Any:
    """torchvision's ``decode_jpeg``, checked: importable, >= :data:`MIN_TORCHVISION`."""
    fix = ("pip install 'seqloader[gpu]' (torchvision >= 0.19, the CUDA build matching "
           "torch), or use decode='cpu'")
    try:
        import torchvision
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception as e:  # (ImportError, or a torchvision built for another torch)
        raise DeviceError(f"decode='gpu' needs torchvision, which cannot be imported "
                               f"({type(e).__name__}: {e}): {fix}") from e
    version = getattr(torchvision, "__version__", "0")
    if _version(version) < MIN_TORCHVISION:
        raise DeviceError(f"decode='gpu' needs torchvision >= 0.19 (its decode_jpeg "
                               f"decodes a list of images in one batched call); found "
                               f"{version}: {fix}")
    if not hasattr(ImageReadMode, "RGB"):
        raise DeviceError(f"decode='gpu': torchvision {version} has no "
                               f"ImageReadMode.RGB: {fix}")
    return decode_jpeg


def decode_jpegs(data: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Decode a batch of JPEGs with a :class:`JpegDecoder` for ``device`` (made, and on
    CUDA checked, per call: keep a decoder for repeated use)."""
    return JpegDecoder(device)(data)


def _steps(src: int, dst: int, limit: float) -> list[int]:
    """The sizes a downscale from ``src`` to ``dst`` goes through, each step at most
    ``limit`` times smaller (NOTE [ antialias limit ]); ``[dst]`` when one step does."""
    sizes = []
    while src > dst * limit:
        src = max(dst, -(-src // int(limit)))
        sizes.append(src)
    return sizes + [dst] if not sizes or sizes[-1] != dst else sizes


class TensorRecipe:
    """A :class:`~seqloader.transforms.FusedPipeline`'s recipe on tensors: :meth:`render`
    crops and resizes each decoded image into a float batch of grey levels (0..255), with
    the boxes gathered by the workers; :meth:`finish` flips, rounds, normalises and
    converts it.  Stateless apart from per-device constants; one per Loader."""

    def __init__(self, fused: Any, *, dtype: torch.dtype | None = None,
                 channels_last: bool = False):
        if fused.mode not in TORCH_MODES:
            raise ValueError(f"decode='gpu' renders with torch's interpolate, which has no "
                             f"{fused.mode!r} mode: use bilinear (the default), bicubic or "
                             f"nearest, or decode='cpu' for {fused.mode!r}")
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype={dtype!r}: decode='gpu' yields torch.float32, "
                             "torch.bfloat16 or torch.float16 batches")
        self.out_hw, self.to_tensor = fused.out_hw, fused.to_tensor
        self.mode = TORCH_MODES[fused.mode]
        self.antialias = bool(fused.antialias) and self.mode in ("bilinear", "bicubic")
        self.resize_first = isinstance(fused.geometry, ResizeCropGeometry)
        self.dtype, self.channels_last = dtype, bool(channels_last)
        mean = np.broadcast_to(fused.mean if fused.mean is not None else 0.0, (3,))
        std = np.broadcast_to(fused.std if fused.std is not None else 1.0, (3,))
        self.mean, self.std = [float(m) for m in mean], [float(s) for s in std]
        self._consts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def _resize(self, img: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        kw: dict = {"antialias": self.antialias} if self.mode in ("bilinear", "bicubic") else {}
        if self.mode in ("bilinear", "bicubic"):
            kw["align_corners"] = False
        x = img.unsqueeze(0).float()
        if self.antialias:  # NOTE [ antialias limit ]
            limit = MAX_STEP[self.mode]
            hs, ws = _steps(x.shape[2], size[0], limit), _steps(x.shape[3], size[1], limit)
            for k in range(max(len(hs), len(ws)) - 1):
                step = (hs[min(k, len(hs) - 1)], ws[min(k, len(ws) - 1)])
                x = F.interpolate(x, size=step, mode=self.mode, **kw)
        return F.interpolate(x, size=size, mode=self.mode, **kw)[0]

    def render(self, images: Sequence[torch.Tensor], boxes: np.ndarray) -> torch.Tensor:
        """The samples of ``images`` (``[3, h, w]`` uint8 each) as one ``[k, 3, H, W]``
        float32 batch of grey levels (zeros where a sample is padded), from their box
        rows ``boxes[k]``: ``(y0, x0, y1, x1, rh, rw)`` in source pixels --
        RandomResizedCrop's whole-pixel box, resized to the output, or, for Resize +
        CenterCrop, the size ``(rh, rw)`` the whole image is resized to before the centre
        crop.  Two kernels per sample (to float, resize) and one to stack them."""
        oh, ow = self.out_hw
        parts = []
        for img, b in zip(images, boxes):
            if self.resize_first:
                rh, rw = int(b[4]), int(b[5])
                ry0, ry1, oy0, oy1 = crop_span(rh, oh)
                rx0, rx1, ox0, ox1 = crop_span(rw, ow)
                r = self._resize(img, (rh, rw))[:, ry0:ry1, rx0:rx1]
                if (oy0, ox0, oy1, ox1) != (0, 0, oh, ow):  # CenterCrop larger than the image
                    r = F.pad(r, (ox0, ow - ox1, oy0, oh - oy1))
            else:
                y0, x0, y1, x1 = (int(v) for v in b[:4])
                r = self._resize(img[:, y0:y1, x0:x1], (oh, ow))
            parts.append(r)
        if not parts:
            return torch.zeros((0, 3, oh, ow))
        return torch.stack(parts)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._consts:
            std = torch.tensor(self.std, dtype=torch.float32)
            mean = torch.tensor(self.mean, dtype=torch.float32)
            # (x/255 - mean)/std as one multiply-add, as DeviceNormalize does
            self._consts[key] = ((1.0 / (255.0 * std)).view(1, 3, 1, 1).to(device),
                                 (-mean / std).view(1, 3, 1, 1).to(device))
        return self._consts[key]

    def finish(self, out: torch.Tensor, flip: torch.Tensor | None) -> torch.Tensor:
        """The batch as the recipe ends it: samples ``flip`` (indices, on ``out``'s
        device) mirrored, every value rounded to a whole grey level, then
        ``ToTensor + Normalize`` in :attr:`dtype` (NCHW, or channels-last), or without
        ``ToTensor`` uint8 NHWC."""
        if flip is not None and flip.numel():
            out[flip] = out[flip].flip(-1)
        out.round_().clamp_(0, 255)
        if not self.to_tensor:
            return out.to(torch.uint8).permute(0, 2, 3, 1).contiguous()
        scale, bias = self._constants(out.device)
        out.mul_(scale).add_(bias)
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return out.to(self.dtype, memory_format=fmt)
