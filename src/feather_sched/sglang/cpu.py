"""Import SGLang's scheduler modules next to a CPU-only torch (tests and benchmarks only).

SGLang 0.5.x imports torchvision at import time, and PyPI's torchvision wheels are CUDA builds:
next to the CPU torch their op library (`torchvision/_C.so`) does not load and
torchvision/_meta_registrations.py fails on `register_fake("torchvision::nms")`. Declaring the
schemas of the ops it registers fakes for (nms, qnms in torchvision 0.28) lets its pure-Python
parts import; the scheduler code runs no torchvision op. Where the op library loads, a no-op.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_libs: list = []  # keep the fragment alive: dropping it would unregister the schemas


def prepare_cpu_import() -> bool:
    """Make `import torchvision` (and so SGLang) work on a CPU torch. True if it had to act."""
    if _libs or importlib.util.find_spec("torch") is None:
        return False
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    import torch

    so = next(Path(spec.submodule_search_locations[0]).glob("_C*.so"), None)
    try:
        if so is None:
            raise OSError("torchvision/_C.so not found")
        torch.ops.load_library(str(so))
        return False  # the real ops are there
    except (OSError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for name, schema in _SCHEMAS.items():
        if not hasattr(torch.ops.torchvision, name):
            lib.define(schema)
    _libs.append(lib)
    return True
