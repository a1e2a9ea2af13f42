"""Multi-process tests: several gloo CPU processes per test (``OMP_NUM_THREADS=1`` each,
set by ``autopar.verify.run``'s launcher and here for anything started from the test process)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
