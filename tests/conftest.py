"""Suite-wide set-up, before any test module imports torch or autopar.

Without a GPU the Triton kernels run in Triton's CPU interpreter, which Triton switches on at
its own import (``TRITON_INTERPRET=1``, ../shared/design/FINDINGS.md): ``import autopar``
imports Triton indirectly (``torch.distributed.pipelining`` -> ``torch._dynamo``), so the
variable is set here, first, for the whole run."""

import os
import sys

if "triton" not in sys.modules and "torch" not in sys.modules:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
