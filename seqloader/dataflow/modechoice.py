"""The decode mode a Loader's ``decode``, ``transform`` and ``device`` ask for, chosen
once when it is built (NOTE [ decode modes ])."""
from __future__ import annotations

from typing import Any, Callable

from .cpumode import CPUMode
from .decodemode import DecodeMode
from .gpugather import GPUOptions
from .rawmode import RawMode

__all__ = ["decode_mode"]


def decode_mode(decode: Any, transform: Callable | None, *, output: str = "float",
                device: Any = None, rank: int = 0, world_size: int = 1) -> DecodeMode:
    """``decode`` (``"cpu"``, ``"gpu"``, a :class:`GPUOptions` or a mode) as a
    :class:`DecodeMode`, checked against ``transform``, ``output`` and ``device``; the
    GPU mode checks the device decoder here (NOTE [ GPU setup ]).  ValueError for a bad
    setting, :class:`~seqloader.errors.DeviceError` for a device that cannot decode."""
    if isinstance(decode, DecodeMode):
        return decode
    if isinstance(decode, GPUOptions):
        options = decode
    elif decode == "gpu":
        options = GPUOptions()
    elif decode == "cpu":
        return RawMode() if transform is None else CPUMode()
    else:
        raise ValueError(f"decode must be 'cpu', 'gpu' or a GPUOptions, got {decode!r}")
    if transform is None:
        raise ValueError("decode='gpu' decodes for a transform: give the recipe (e.g. "
                         "RandomResizedCrop + flip + ToTensor + Normalize); transform=None "
                         "yields encoded bytes, which decode nowhere")
    if device is None:
        raise ValueError("decode='gpu' needs device= (e.g. device='cuda'; device='cpu' runs "
                         "the same path on CPU tensors, for tests)")
    if output != "float":
        raise ValueError(f"decode='gpu' with output={output!r}: the batch is rendered on the "
                         "device, so output= does not apply; choose its dtype with "
                         "decode=GPUOptions(dtype=torch.bfloat16)")
    from .gpumode import GPUMode, resolve_device  # (torch, only for decode="gpu")

    return GPUMode(options, resolve_device(device, rank=rank, world_size=world_size))
