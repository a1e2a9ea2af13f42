"""Kernel tests run in Triton's CPU interpreter, which Triton turns on at its own import.

``TRITON_INTERPRET=1`` must be in the environment when ``triton`` is first imported (the
``triton.language`` helpers are built then, compiled or interpreted: FINDINGS, "Triton on CPU").
This conftest is loaded before the tests of this folder are collected, so it sets the variable
there, unless a GPU is present (where ``tests/gpu`` runs the compiled kernels in this process) or
Triton was already imported (by ``torch.export``, say). In those cases the tests of
``test_kernels.py`` skip, and ``test_interpreter_process.py`` runs them in a fresh process with
the variable set.
"""

from __future__ import annotations

import os
import sys

import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
