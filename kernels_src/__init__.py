"""kernels_src: the course's kernel library.

Importing this package first decides where GPU kernels run (see :mod:`kernels_src.device`), then
exposes the registry. Chapters add kernel families as modules under ``kernels_src/ops/``.
"""
from . import device
from .device import ceil_div, cuda
from .plots import show
from .registry import define_op, get_op, get_variant, ops, register, variants

__all__ = ["device", "cuda", "ceil_div", "define_op", "register", "ops", "get_op", "get_variant", "variants", "show"]
__version__ = "0.1.0"
