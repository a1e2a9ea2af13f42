"""A benchmark script of ``bench/`` (or any file) imported as a module, for tests that check its
cases."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(script: str, name: str) -> ModuleType:
    """``bench/<script>.py`` as the module ``name`` (once per run; dataclasses look their
    module up in ``sys.modules``). A name of its own keeps a script from shadowing a package of
    its name (the bench scripts put ``bench/`` first on ``sys.path``; the fused kernels' timing
    script is ``fused_kernels.py``, not ``kernels.py``, for Hugging Face's ``kernels`` package,
    which transformers imports)."""
    return load_file(BENCH / f"{script}.py", name)


def load_file(path: Path, name: str) -> ModuleType:
    """The Python file ``path`` as the module ``name``, once per run (``load``)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]
