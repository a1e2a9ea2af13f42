"""Resharding between layouts on the tp axis: which collectives an edge needs, each way.

An edge joins an op's output (in the producer's layout) to an input of a consumer (in the layout
the consumer's strategy requires). The forward pass converts the value, the backward pass
converts its gradient back; the table below lists both. ``R*`` is a replicated input whose
gradient comes back as partial sums (the input of a column split), so its backward needs the
reduction that a plain ``R`` input does not. Sizes are the full tensor's elements, except the
all-to-all, which moves what one rank holds (``collectives`` prices each so).

======== ======== ========================== ==========================
producer consumer forward                    backward
======== ======== ========================== ==========================
R        R*       --                         all-reduce
R        Q        -- (a local slice)         all-gather
S, Q     R        all-gather                 -- (a local slice)
S, Q     R*       all-gather                 reduce-scatter
P        R        all-reduce                 --
P        R*       all-reduce                 all-reduce
P        S, Q     reduce-scatter             all-gather
R*       R*       -- (the fork reduces once) --
======== ======== ========================== ==========================

Any other pair with different layouts is impossible (``None``). Three that collectives could
do are left out because the engine the plan runs on has no parallel style for them
(``passes/tensor_parallel.py``): a replicated activation cut by width (``R`` to ``S``: the engine
makes width shards only as a column split's output), and sequence shards turned into width
shards or back (``Q``/``S``, an all-to-all). A plan needing them could not run.
"""

from __future__ import annotations

from autopar.core.layout import Layout
from autopar.core.collectives import Collective

R, S, Q, P, RP = Layout.R, Layout.S, Layout.Q, Layout.P, Layout.R_PARTIAL_GRAD

Conversion = tuple[tuple[Collective, ...], tuple[Collective, ...]]
"""(forward collectives, backward collectives)."""

NONE: Conversion = ((), ())
AR, AG, RS = Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER

TABLE: dict[tuple[Layout, Layout], Conversion] = {
    (R, R): NONE, (S, S): NONE, (Q, Q): NONE, (RP, RP): NONE,
    (R, RP): ((), (AR,)),
    (R, Q): ((), (AG,)),
    (S, R): ((AG,), ()), (Q, R): ((AG,), ()),
    (S, RP): ((AG,), (RS,)), (Q, RP): ((AG,), (RS,)),
    (P, R): ((AR,), ()), (P, RP): ((AR,), (AR,)),
    (P, S): ((RS,), (AG,)), (P, Q): ((RS,), (AG,)),
}


def conversion(producer: Layout, consumer: Layout, *, has_grad: bool = True
               ) -> Conversion | None:
    """The collectives turning ``producer`` into ``consumer`` (None: impossible). Without a
    gradient (integer indices, constants) the backward needs nothing."""
    conv = TABLE.get((producer, consumer))
    if conv is None:
        return None
    return conv if has_grad else (conv[0], ())
