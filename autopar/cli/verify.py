"""``autopar verify``: run a plan on CPU processes (or GPUs) and compare it with one process.

The plan comes from ``--plan plan.json`` or from ParallelConfig flags (``--dp 2 --tp 2 ...``),
which ``autopar.plan_for`` turns into a plan priced on a one-node cluster of ``--nproc`` GPUs
(every weight GEMM split when tp > 1). Exit status: 0 when every difference is within its
tolerance, 1 when one is not, 2 for an error a person can act on.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from autopar.cli.args import (add_parallel, config_from_fields, expert_dp_note, given_fields,
                              model_spec, positive, read_plan)
from autopar.core.errors import AutoparError
from autopar.core.specs import TrainSpec


def add_verify_parser(sub: argparse._SubParsersAction, parents: list) -> None:
    p = sub.add_parser("verify", parents=parents,
                       help="run a plan on CPU processes (gloo) and compare it with one process",
                       description=__doc__.splitlines()[0])
    g = p.add_argument_group("model and plan")
    g.add_argument("--model", default=None,
                   help="a zoo preset or family (autopar models), FILE.py:FACTORY, a "
                        "transformers config (folder or config.json), or a family's shorthand "
                        "(hf-llama: a tiny transformers Llama); "
                        "default: the model the --plan file records")
    g.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model (or transformers config) field (repeatable)")
    g.add_argument("--plan", default=None, metavar="F",
                   help="a plan.json from `autopar plan --json`; else the flags below")
    g.add_argument("--nproc", type=positive, default=None, metavar="N",
                   help="processes (default: the plan's world size)")
    g.add_argument("--steps", type=positive, default=3, metavar="K")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--global-batch", type=positive, default=None, metavar="N",
                   help="sequences per step (default: dp x micro-batch x 2 x pp)")
    g.add_argument("--seq-len", type=positive, default=None, metavar="N",
                   help="tokens per sequence (default: the model's)")
    g.add_argument("--precision", default=None,
                   help="fp32 (default) | bf16 | fp16 | bf16-pure | fp8")
    g.add_argument("--fp8-recipe", default=None,
                   help="with --precision fp8: tensorwise (default) | rowwise")
    g.add_argument("--grad-dtype", default=None,
                   help="under bf16 and fp8: fp32 (default) | bf16, the gradients' "
                        "accumulation and reduction dtype")
    g.add_argument("--priced-on", default=None, metavar="PRESET",
                   help="cluster preset a flags plan is priced on (default hgx-h100-80g)")
    g.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the ranks run: CPU processes with gloo (default), or one CUDA "
                        "GPU each with NCCL; the reference runs on the CPU either way")
    g.add_argument("--timeout", type=positive, default=300, metavar="S")
    g.add_argument("--logs", default=None, metavar="DIR",
                   help="keep the ranks' logs and results in DIR")
    add_parallel(p, "plan as flags (ParallelConfig fields)")


def _plan_from_flags(args: argparse.Namespace, fields: dict, spec, model, console):
    from autopar.api import plan_for
    from autopar.analysis.tracing import resolve_seq_len
    from autopar.costmodel.cluster import process_cluster

    config = config_from_fields(fields, args.nproc, "--nproc")
    if args.nproc is not None and args.nproc != config.world_size:
        raise AutoparError(f"--nproc {args.nproc} but dp*tp*pp*cp = {config.world_size}",
                           where="--nproc", fix="make them equal, or leave --nproc out (ep is "
                           "carved from dp: --dp counts the ep ranks, or the expert replicas "
                           "when dp*ep*tp*pp*cp is --nproc)")
    note = expert_dp_note(fields, config)
    if note is not None:
        console.print(note)
    batch = args.global_batch or config.dp * config.micro_batch * (
        config.num_microbatches or 2 * config.pp)
    seq = resolve_seq_len(model, None, args.seq_len)
    train = TrainSpec(global_batch=batch, seq_len=seq, precision=args.precision or "fp32",
                      fp8_recipe=args.fp8_recipe or "tensorwise",
                      grad_dtype=args.grad_dtype or "fp32")
    return plan_for(model, process_cluster(config.world_size, args.priced_on or "hgx-h100-80g"),
                    train, config, name=spec.label, model_spec=spec)


_FLAGS_PLAN_ONLY = (("global_batch", "--global-batch"), ("seq_len", "--seq-len"),
                    ("precision", "--precision"), ("fp8_recipe", "--fp8-recipe"),
                    ("grad_dtype", "--grad-dtype"), ("priced_on", "--priced-on"))
"""What a plan file fixes itself: given beside ``--plan`` they would be ignored."""


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from autopar.verify.run import check_device, verify

    fields = given_fields(args)
    if args.plan:
        if fields:
            raise AutoparError("both --plan and plan flags given", where=", ".join(
                f"--{k.replace('_', '-')}" for k in fields), fix="give one or the other")
        plan = read_plan(args.plan, where="--plan")
        ignored = [f"{flag} {getattr(args, name)}" for name, flag in _FLAGS_PLAN_ONLY
                   if getattr(args, name) is not None]
        if ignored:
            t = plan.train
            raise AutoparError(
                f"the plan fixes its batch ({t.global_batch} x {t.seq_len} tokens, "
                f"{t.precision.value}); {', '.join(ignored)} would be ignored",
                where=", ".join(i.split()[0] for i in ignored),
                fix="leave them out to verify the plan as it is, or re-plan with them "
                    "(autopar plan ... --json F) or verify with plan flags in place of --plan")
        spec = model_spec(args) if args.model else None
        if args.nproc is not None and args.nproc != plan.config.world_size:
            raise AutoparError(f"the plan runs on {plan.config.world_size} processes, "
                               f"--nproc is {args.nproc}", where="--nproc",
                               fix="leave --nproc out, or re-plan for that many GPUs")
    else:
        if not args.model:
            raise AutoparError("no model and no plan", where="--model / --plan",
                               fix="pass --model (and plan flags) or --plan plan.json")
        spec = model_spec(args)
        with console.status("planning..."):
            plan = _plan_from_flags(args, fields, spec, spec.build("meta"), console)
    check_device(args.device, plan.config.world_size)  # before the message that it starts
    where = "CPU processes" if args.device == "cpu" else "CUDA GPUs"
    console.print(f"verifying {plan.summary()} on {plan.config.world_size} {where}, "
                  f"{args.steps} steps, batch {plan.train.global_batch} x "
                  f"{plan.train.seq_len} tokens ({plan.train.precision.value})")
    with console.status("running the sharded program and the reference..."):
        result = verify(spec, plan, steps=args.steps, seed=args.seed,
                        timeout_s=args.timeout, folder=args.logs, device=args.device)
    console.file.write(result.table())
    return 0 if result.passed else 1



