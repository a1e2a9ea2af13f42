"""A plan run on CPU processes (gloo) and compared with one process: ``autopar verify``.

``launcher`` (start the ranks, wait for them, say how they failed; ``autopar profile`` reuses it),
``run`` (``verify``: reference and ranks, then the comparison), ``worker`` (one rank's program),
``reference`` (the single-process run), ``measures`` (what is compared, and the tolerances),
``dropout`` (training noise turned off for a comparison), and the property run's drawing:
``cases``, ``models`` (tiny transformers configs), ``decoders`` (hand-written decoders).

The names the old module ``autopar.verify`` had (``verify``, ``start_ranks``, ...) are still
read from here.
"""

from importlib import import_module

_OWNERS = {"verify": "autopar.verify.run", "VerifyResult": "autopar.verify.measures",
           "ProgramFailed": "autopar.verify.launcher", "start_ranks": "autopar.verify.launcher",
           "wait_ranks": "autopar.verify.launcher", "check_device": "autopar.verify.launcher",
           "DEVICES": "autopar.verify.launcher", "WORKER": "autopar.verify.launcher"}


def __getattr__(name: str) -> object:
    if name in _OWNERS:
        return getattr(import_module(_OWNERS[name]), name)
    raise AttributeError(f"module 'autopar.verify' has no attribute {name!r}")
