"""What the hardware does, measured, and the cost model held to it.

``profiling`` (``autopar profile``: operators and collectives timed on the ranks, through the
launcher of ``autopar.verify.launcher``; the rank side is ``profiling_worker``), ``calibration``
(``autopar calibrate``: the efficiency constants fitted to measured steps), ``validation``
(published runs, re-planned and compared with what they measured).
"""
