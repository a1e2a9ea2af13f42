"""The emitted program run at full scale on fake tensors, for its memory.

``run`` (``dry_run``, ``DryRun``: one rank's program under the fake process group, its
allocations counted), ``memory_account`` (the allocator's view, by kind), ``gpu_kernels``
(stand-ins for the CUDA-only kernels a fake run meets on CPU), ``fake_setup`` (torch's
set-up made for the role's one rank), ``plan_check`` (the dry run of a
plan and its runner-ups, compared with the cost model's peak). Imports the passes, never the
verification, the measurement or the command line.
"""
