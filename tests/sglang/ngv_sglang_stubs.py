"""Import stubs for SGLang 0.5.12's serving layer on a CPU machine (the SGLang test venv only, never the trainer's).

Copied into ``.cache/sglang-venv`` by ``scripts/setup_sglang.sh`` (a change here rebuilds that venv: its stamp holds
this file's hash). Standalone: imports only the standard library.

SGLang's HTTP server imports packages at module level that its chat path never uses and that cannot be installed on a
CPU machine as they are (``torchvision``: the PyPI wheel is a CUDA build whose ops fail to register against CPU torch)
or are not worth installing (``IPython``: notebook helpers). A stub root serves itself and every submodule below it;
each name looked up on a stub module is a placeholder that raises ``StubUsed`` when called or instantiated, so a test
that actually reaches one fails loudly, naming it. Attribute chains on placeholders (``InterpolationMode.BILINEAR``,
used as dict keys at import time by transformers) resolve to further placeholders.

torchvision is deliberately *visible* (``importlib.util.find_spec`` finds it): transformers 5.x registers
``AutoImageProcessor`` only when torchvision is available, and SGLang registers its own image processors on it while
importing ``sglang.srt.configs`` (``configs/utils.py:18``). Its version is ``0.0.0+ngvstub`` and it has no dist-info.

Installed by the venv's ``ngv_sglang_stubs.pth`` (``import ngv_sglang_stubs; ngv_sglang_stubs.install()``) so every
process of the venv -- pytest, Ray workers -- has them before SGLang is imported; appended to ``sys.meta_path``, so a
real installed package always wins.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

# Stub roots (each serves itself and any submodule below it) and who imports them. Found by importing SGLang 0.5.12's
# http_server and engine modules (and what they import: transformers 5.x image/video utils) until it worked.
STUB_ROOTS: dict[str, str] = {
    # sglang/srt/utils/common.py:90 `from torchvision.io import decode_jpeg`; transformers' image_utils.py:54-56,
    # image_processing_utils.py:48, image_processing_backends.py:74, video_utils.py:49 (behind is_torchvision_available)
    "torchvision": "the PyPI wheel is a CUDA build: its ops fail to register on CPU torch",
    # sglang/utils.py:26 `from IPython.display import HTML, display`
    "IPython": "notebook helpers, never called by a server",
    # sglang/srt/mem_cache/memory_pool_host.py:47 `from sgl_kernel.kvcacheio import ...` (reached through the engine
    # and scheduler modules verl's server imports)
    "sgl_kernel": "CUDA kernels only",
}
# Names with a real answer rather than a placeholder: probes other libraries make when the package is importable.
STUB_ATTRS: dict[str, dict[str, object]] = {
    # Ray's logging (ray/_private/ray_logging/__init__.py:119) and transformers ask "are we in a notebook?"
    "IPython": {"get_ipython": lambda: None},
}
VERSION = "0.0.0+ngvstub"


class StubUsed(RuntimeError):
    """A stubbed module's name was called: the code under test reached something this venv cannot provide."""


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}", cls.__module__)

    def __call__(cls, *args, **kwargs):
        raise StubUsed(f"{cls.__module__}.{cls.__qualname__} is a stub in the SGLang test venv (not available here)")

    def __repr__(cls) -> str:
        return f"<stub {cls.__module__}.{cls.__qualname__}>"


def _placeholder(qualname: str, module: str) -> type:
    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "__module__": module})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(name, self.__name__)
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in STUB_ROOTS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module) -> None:
        module.__ngv_stub__ = True
        module.__version__ = VERSION
        module.__path__ = []  # a package: any submodule below a stub root is a stub too
        for name, value in STUB_ATTRS.get(module.__name__, {}).items():
            setattr(module, name, value)


def install() -> None:
    """Append the stub finder to ``sys.meta_path`` (after every real finder); idempotent."""
    if not any(type(f).__name__ == "_StubFinder" for f in sys.meta_path):
        sys.meta_path.append(_StubFinder())
