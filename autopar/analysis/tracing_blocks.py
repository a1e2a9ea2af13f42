"""Repeated-block detection for ``autopar.trace``.

The block group is found on the module tree (``autopar.models.blocks.find_block_group``, the
one search, which the admissibility facts and the generic decoder family read too).

``assign_blocks`` marks each node whose ``module_path`` lies inside instance ``i`` with
``block = i`` (one dictionary lookup per node) and checks that every instance runs the same op
sequence as instance 0; if not, the group is kept but marked ``uniform=False``.
"""

from __future__ import annotations

from dataclasses import replace

from autopar.analysis.graph import NodeInfo
from autopar.models.blocks import BlockGroup


def assign_blocks(nodes: list[NodeInfo], group: BlockGroup) -> BlockGroup:
    """Set ``node.block`` for nodes inside an instance; return ``group`` with ``uniform`` set."""
    index = {inst: i for i, inst in enumerate(group.instances)}
    depth = group.path.count(".") + 1 if group.path else 0  # components of the container path
    prefix = f"{group.path}." if group.path else ""
    sequences: list[list[str]] = [[] for _ in group.instances]
    for node in nodes:
        path = node.module_path
        if not path or (prefix and not path.startswith(prefix)):
            continue
        parts = path.split(".", depth + 1)
        if len(parts) <= depth:
            continue
        inst = ".".join(parts[: depth + 1])
        i = index.get(inst)
        if i is not None:
            node.block = i
            sequences[i].append(node.op)
    uniform = all(seq == sequences[0] for seq in sequences[1:])
    return replace(group, uniform=uniform)
