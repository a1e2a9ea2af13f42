"""``autopar verify``'s result as a table (``VerifyResult.table``)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from autopar.verify.measures import VerifyResult


def verify_table(result: VerifyResult, width: int = 110) -> str:
    """``autopar verify``'s table: each measure against its tolerance, the losses, what noise
    was off, the expert load, and PASSED or FAILED."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    t = Table(title=f"autopar verify: {result.model}, {result.plan.summary()}, "
                    f"{result.nproc} processes, {result.steps} steps ({result.wall_s:.1f} s)")
    for col in ("compared", "max abs diff", "measured as", "value", "tolerance", "worst",
                "ok"):
        t.add_column(col, justify="left" if col in ("compared", "worst", "measured as")
                     else "right")
    tol = result.tolerance
    rows = (("loss per step", result.loss, "loss", tol.loss),
            ("gradients (last step)", result.grads, "grads", tol.grads),
            ("parameters (after step)", result.params, "params", tol.params))
    for label, d, quantity, bound in rows:
        t.add_row(label, f"{d.max_abs:.3e}", tol.measure(quantity).value, f"{d.measure:.3e}",
                  f"{bound:.0e}", d.where, "yes" if d.measure <= bound else "NO")
    console.print(t)
    if result.dropout_off:
        fields = ", ".join(f"{k}={v:g}" for k, v in result.dropout_off.items())
        console.print(f"training noise off on both sides ({fields} set to 0): a sharded "
                      "run and one process draw different random numbers (dropout masks, "
                      "router jitter), so the program is compared without them; the plan "
                      "trains with the model's noise")
    steps = "  ".join(f"{r:.6f}/{s:.6f}" for r, s in zip(result.reference_losses, result.losses))
    console.print(f"losses (reference/sharded): {steps}")
    if result.ep_busiest_share is not None:
        ep = result.plan.config.ep
        console.print(f"expert load: the busiest of {ep} ep ranks received "
                      f"{result.ep_busiest_share:.1%} of its group's assignments "
                      f"(imbalance {result.ep_busiest_share * ep:.2f} x the mean)")
    if result.missing:
        console.print(f"missing parameters: {', '.join(result.missing)}")
    console.print("PASSED" if result.passed else "FAILED")
    return buf.getvalue()
