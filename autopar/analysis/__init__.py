"""What a model is, read for the planner: the traced graph and its costs, the admissibility
check every entry point calls, the tensor-parallel styles of its modules.

``graph`` (``GraphIR``), ``tracing`` (torch.fx on the meta device; ``torch.export`` where plain
tracing fails) with ``tracing_blocks`` and ``tracing_errors``, ``ops`` (the one registry of op
rules: FLOPs, bytes, saved activations, layouts), ``workload`` (the cost model's view of a
graph), ``admissibility`` (what a plan may be for this model; every entry point asks it),
``module_strategies`` (the tensor-parallel styles a module may take). Imports the core, the
models and the cost model; never the search, the passes or anything above.
"""
