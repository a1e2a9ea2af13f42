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

# the CLI's cache of traced graphs (autopar/analysis/trace_cache.py): one folder of the run's
# own, not the user's ~/.cache
if "AUTOPAR_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["AUTOPAR_CACHE_DIR"] = tempfile.mkdtemp(prefix="autopar-test-cache-")
