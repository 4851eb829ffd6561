from setuptools import find_packages, setup

setup(
    name="seqloader",
    version="0.2.0",
    description="Fast sequential ImageNet-scale data loading from LMDB for PyTorch",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["seqloader", "seqloader.*"]),
    python_requires=">=3.9",
    install_requires=[
        "lmdb>=1.4",
        "msgpack>=1.0",
        "opencv-python-headless>=4.5",
        # JPEG decoding into our own buffers, and stopping below the crop without
        # libjpeg printing a warning per image (NOTE [ row-limited decode ])
        "simplejpeg>=1.6",
        "numpy>=1.22",
        "torch>=1.12",
        "tqdm>=4.60",
    ],
    extras_require={
        # pillow: writes the CMYK JPEGs of the synthetic dataset (OpenCV cannot)
        "test": ["pytest>=7", "pillow>=9"],
        # the S3 endpoint of the remote tests (tests/remote_servers.py)
        "test-remote": ["moto[server]>=5"],
        # webdataset's own reader of `seqloader export --format webdataset`'s shards
        "test-extras": ["webdataset>=0.2"],
        "plot": ["matplotlib>=3.5"],
        # parquet sources (Hugging Face's imagenet-1k data/*.parquet): Arrow's reader
        "parquet": ["pyarrow>=13"],
        # reading databases at URLs (s3://, https://, ...: any fsspec protocol)
        "remote": ["fsspec>=2023.1", "s3fs>=2023.1", "aiohttp>=3.8"],
        # the optional tests of the Lightning and accelerate integrations
        # (tests/test_integrations_*.py); README "Use with Lightning / accelerate"
        "integrations": ["lightning>=2.2", "accelerate>=0.20"],
        # decode="gpu": torchvision's batched nvJPEG decode_jpeg(list, device=cuda:N),
        # which takes a list of images from 0.19 on (docs/gpu.md); install the CUDA build
        # that matches torch
        "gpu": ["torchvision>=0.19"],
        # reading .tar.zst archives (the standard library reads gzip, bzip2 and xz only)
        "zstd": ["zstandard>=0.18"],
    },
    entry_points={"console_scripts": ["seqloader=seqloader.cli:main"]},
)
