"""A rank that dies in native code is named as the cause of the failure.

When a rank aborts (SIGABRT from a C++ check, SIGSEGV) no ``except`` runs and it writes no
``rank<R>.error``; its peers then fail on a lost connection and write theirs. The launcher
must name the dead rank, with how it died and the Python stack ``faulthandler`` left in its
log, not a peer's "Connection reset by peer". Two gloo ranks run this file: rank 1 aborts
while rank 0 waits for it in an all-reduce.
"""

from __future__ import annotations

import os
import sys

import pytest

from autopar.verify.launcher import ProgramFailed, start_ranks, wait_ranks


def test_a_rank_killed_by_a_signal_is_named_as_the_cause(tmp_path):
    procs = start_ranks({}, 2, tmp_path, worker=(__file__,))
    with pytest.raises(ProgramFailed) as failed:
        wait_ranks(procs, tmp_path, timeout_s=120.0)
    message = str(failed.value)
    assert "rank1 was killed by SIGABRT" in message and "no error file" in message, message
    assert "_abort_on_rank_one" in message, message  # faulthandler's stack, from the log


# ----- one rank (this file run as a script, by verify_worker.main) -----

def _abort_on_rank_one(job: dict) -> dict:
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os.abort()
    dist.all_reduce(torch.ones(1))  # rank 0 waits here until gloo sees its peer gone
    return {}


if __name__ == "__main__":
    from autopar.verify.worker import main

    main(sys.argv[1:], work=_abort_on_rank_one)
