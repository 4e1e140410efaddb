"""Build sopfast and its native extension ``sopfast._C``.

The C++ CPU kernels in ``csrc/cpu`` are always compiled.  The CUDA kernels in ``csrc/cuda``
are added when the installed torch is a CUDA build, ``nvcc`` is found and a GPU is visible
(``SOPFAST_BUILD_CUDA=auto``, the default: pointless on a machine that cannot run them);
``SOPFAST_BUILD_CUDA=1`` builds them without a GPU, ``=0`` never.  They are compiled for one
architecture, the visible GPU's (sm_90 without one), unless ``TORCH_CUDA_ARCH_LIST`` lists others;
their translation units compile in parallel (ninja).
``SOPFAST_NO_EXTENSION=1`` skips the extension entirely (ops then use their PyTorch references).
Install with ``pip install --no-build-isolation -e .`` so the build sees the installed torch.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _cuda_wanted(torch_module) -> bool:
    flag = os.environ.get("SOPFAST_BUILD_CUDA", "auto").lower()
    if flag in ("0", "false", "no"):
        return False
    has_nvcc = shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")
    buildable = torch_module.version.cuda is not None and has_nvcc
    if flag in ("1", "true", "yes"):
        if not buildable:
            sys.exit("SOPFAST_BUILD_CUDA=1 but torch has no CUDA or nvcc is missing")
        return True
    if flag != "auto":
        sys.exit(f"SOPFAST_BUILD_CUDA must be auto, 1 or 0, got {flag!r}")
    return buildable and torch_module.cuda.is_available()


def _cuda_arch_flags(torch_module) -> list[str]:
    """nvcc ``-gencode`` flags: none when ``TORCH_CUDA_ARCH_LIST`` is set (torch's cpp_extension
    then adds its architectures), else the visible GPUs' architectures, else sm_90 (H100/H200)."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return []
    visible = range(torch_module.cuda.device_count()) if torch_module.cuda.is_available() else []
    arches = sorted({"{}{}".format(*torch_module.cuda.get_device_capability(i)) for i in visible}) or ["90"]
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}" for arch in arches]


def _cuda_paths() -> tuple[list[str], list[str]]:
    """Headers and libraries of CUDA_HOME, then of the pip-installed CUDA toolkit (torch looks only
    in CUDA_HOME; the pip headers are incomplete, so CUDA_HOME's must be searched first)."""
    import site

    home = os.environ["CUDA_HOME"]
    includes, libs = [os.path.join(home, "include")], [os.path.join(home, "lib64")]
    for sp in site.getsitepackages():
        for sub in ("nvidia/cu13", "nvidia/cu12", "nvidia/cuda_runtime"):
            base = os.path.join(sp, sub)
            if os.path.isdir(os.path.join(base, "include")):
                includes.append(os.path.join(base, "include"))
            if os.path.isdir(os.path.join(base, "lib")):
                libs.append(os.path.join(base, "lib"))
    return includes, libs


def _version() -> str:
    """The one version string, ``__version__`` in ``python/sopfast/version.py``."""
    with open(os.path.join(ROOT, "python", "sopfast", "version.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _extensions():
    if os.environ.get("SOPFAST_NO_EXTENSION") == "1":
        return [], {}
    import torch

    build_cuda = _cuda_wanted(torch)
    if build_cuda:  # before cpp_extension is imported: it reads CUDA_HOME once, at import
        os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
    from torch.utils import cpp_extension

    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")) + glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    # torch >= 2.13 headers need C++20; -fno-trapping-math lets the compiler vectorise compare-and-select
    # loops (results unchanged: no reassociation); -ffp-contract=off: no fused multiply-add where the source
    # rounds a product and a sum apart (the blur rounds as on every backend, on FMA hosts too)
    cxx_flags = ["-O3", "-std=c++20", "-fopenmp", "-fno-trapping-math", "-ffp-contract=off"]
    common = dict(include_dirs=[os.path.join(ROOT, "csrc")], extra_link_args=["-fopenmp"])
    if build_cuda:
        includes, libs = _cuda_paths()
        # the kernels (*.cu, no torch headers) and their torch binding (*.cpp)
        cuda_dir = os.path.join("csrc", "cuda")
        cuda_sources = sorted(glob.glob(os.path.join(cuda_dir, "*.cu")) + glob.glob(os.path.join(cuda_dir, "*.cpp")))
        ext = cpp_extension.CUDAExtension(
            "sopfast._C",
            sources + cuda_sources,
            define_macros=[("SOPFAST_WITH_CUDA", "1")],
            extra_compile_args={
                "cxx": cxx_flags,
                "nvcc": ["-O3", "-std=c++17", *_cuda_arch_flags(torch)],
            },
            include_dirs=common["include_dirs"] + includes,
            library_dirs=libs,
            extra_link_args=common["extra_link_args"],
        )
    else:
        ext = cpp_extension.CppExtension("sopfast._C", sources, extra_compile_args={"cxx": cxx_flags}, **common)
    return [ext], {"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = _extensions()

setup(
    name="sopfast",
    version=_version(),
    description="Fast Sum-of-Parts self-attributing models: fused kernels and token-dropping execution",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    package_dir={"sopfast": "python/sopfast", "sop_kernels": "sop_kernels"},
    packages=["sopfast"] + [f"sopfast.{p}" for p in find_packages("python/sopfast")] + ["sop_kernels"],
    package_data={"sopfast": ["py.typed"]},
    install_requires=["torch>=2.4", "numpy", "tqdm", "safetensors", "pyyaml", "matplotlib"],
    # Optional, imported only where used: `sopfast --help` needs none of them.
    extras_require={
        "models": ["transformers>=4.40", "timm>=1.0", "torchvision"],  # HF / timm / torchvision backbones
        # your own data (image folders, CSV/JSONL, saved datasets) and stratified holdouts; the digits demo data;
        # sopfast predict's Parquet output
        "data": ["datasets>=4.0", "scikit-learn", "pyarrow"],
        # Hub-style models: SOP.push_to_hub and loading by a Hub id (saving and loading directories need none)
        "hub": ["huggingface_hub>=0.24"],
        "tensorboard": ["tensorboard"],  # TensorBoard events in run folders
        "explain": ["captum>=0.7", "quantus>=0.6"],  # the Captum / Quantus interop of sopfast.explain
        "theory": ["scipy"],  # sopfast theory
        "test": [
            "pytest",
            "hypothesis",
            "pytest-benchmark",
            "transformers>=4.40",
            "timm>=1.0",
            "torchvision",
            "scikit-learn",
            "scipy",
            "ruff",
            "datasets>=4.0",
            "captum>=0.7",
            "quantus>=0.6",
            "accelerate",
            "tensorboard",
        ],
        "bench": ["pytest-benchmark", "entmax"],
        "triton": ["triton"],
        "baselines": ["captum>=0.7", "scikit-learn"],
    },
    entry_points={"console_scripts": ["sopfast=sopfast.cli:main"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    zip_safe=False,
)
