"""OpenCV/numpy versions of the torchvision transforms of the ImageNet recipe, and a
fused decode-to-sample fast path.

Conventions (every class here):

* ``t(img, rng=None)``: ``img`` is an HWC **RGB** uint8 numpy image (HW for gray) or,
  after :class:`ToTensor`, a CHW float32 numpy array.  Floating 3-D arrays are taken as
  CHW (1, 3 or 4 channels first, else a ValueError), everything else as HWC/HW; other
  array-likes (PIL images, CPU tensors) are converted with ``np.asarray``.  ``rng`` is a ``numpy.random.Generator``; random
  transforms draw from it only.  With ``rng=None`` they use this process's default
  generator (:func:`get_default_rng`), created from fresh OS entropy at import and
  reseeded by :func:`seed_default`.  Spawned workers therefore differ, but forked ones
  share the parent's state: pass explicit generators for reproducibility.
* Same names, arguments, defaults and semantics as ``torchvision.transforms`` (v1),
  including the rounding rules; randomness comes from numpy instead of torch, so
  the *distribution* matches torchvision, not the exact stream.
* Classes carry ``accepts_rng = True``; :class:`Compose` passes ``rng`` to transforms
  that have it and calls others as ``t(img)``.
* Picklable (plain attributes only; interpolation is stored as its string name),
  stateless, thread-safe and reentrant.  Nothing keeps OpenCV objects or threads.
* Resampling: see NOTE [ interpolation equivalence ] in ``seqloader/transforms/resample.py``.
  Upscales use ``cv2.INTER_LINEAR`` (bicubic: ``INTER_CUBIC``).  Antialiased downscales
  do *not* use ``cv2.INTER_AREA``: its fractional-factor path costs more than the JPEG
  decode; instead exact 2x box halvings + a variance-matched 3-tap blur + bilinear,
  ~4x faster and closer to PIL/torchvision.
* :class:`ToTensor` returns a numpy float32 array, not a torch tensor (the Loader
  stacks samples into torch batch tensors); this module needs no torch.

:func:`compile_fused` turns the standard recipes into a :class:`FusedPipeline` that
goes from JPEG bytes to the finished sample: the crop is sampled from the JPEG header
(same ``rng`` draws as the unfused transforms), the JPEG is decoded straight to RGB
at 1/2, 1/4 or 1/8 scale when the crop is at least that many times the output size
(libjpeg DCT scaling; never below the output resolution) and only down to the crop's
last row (NOTE [ row-limited decode ] in ``jpegwindow.py``), only the crop is resized,
into ``out`` itself (uint8) or a per-thread scratch buffer, and flip + ToTensor +
Normalize become one table lookup per pixel writing ``out``.  :func:`adapt` wraps
any other transform (including torchvision ones) for the generic path.
"""
from .compile import adapt, compile_fused
from .fused import FusedPipeline
from .ops import (CenterCrop, Compose, RandomHorizontalFlip, RandomResizedCrop, Resize,
                  decode_rgb)
from .rng import get_default_rng, seed_default
from .tensor import DeviceNormalize, Normalize, ToTensor

__all__ = ["Compose", "RandomResizedCrop", "RandomHorizontalFlip", "Resize", "CenterCrop",
           "ToTensor", "Normalize", "DeviceNormalize", "FusedPipeline", "compile_fused",
           "adapt", "decode_rgb", "seed_default", "get_default_rng"]
