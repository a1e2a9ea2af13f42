"""The dry run's stand-ins compute what the op computes and keep what the GPU kernel keeps."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autopar.dryrun.gpu_kernels import gpu_saved_tensors, rms_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_matches_torch_forward_and_backward(dtype, with_weight):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    w = torch.randn(16, dtype=dtype, requires_grad=True) if with_weight else None
    ref_x = x.detach().clone().requires_grad_()
    ref_w = w.detach().clone().requires_grad_() if w is not None else None
    out = rms_norm(x, (16,), w, 1e-5)
    ref = F.rms_norm(ref_x, (16,), ref_w, 1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    # fp32: rounding only (measured max 1e-6); bf16: one bf16 ulp at |x| ~ 4 (2**-6)
    tol = 1e-5 if dtype is torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    torch.testing.assert_close(x.grad, ref_x.grad, atol=tol, rtol=tol)
    if w is not None:
        torch.testing.assert_close(w.grad, ref_w.grad, atol=5 * tol, rtol=tol)


def test_rms_norm_keeps_the_input_and_the_fp32_rstd_only():
    x = torch.randn(4, 8, 32, dtype=torch.bfloat16, requires_grad=True)
    kept = []

    def pack(t):
        kept.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), gpu_saved_tensors():
        torch.nn.RMSNorm(32, dtype=torch.bfloat16)(x)
    assert (tuple(x.shape), torch.float32) not in kept  # no fp32 copy of the input
    assert (tuple(x.shape), torch.bfloat16) in kept and ((4, 8, 1), torch.float32) in kept
    assert F.rms_norm is not rms_norm  # restored


def test_an_fp32_plan_of_stacked_experts_dry_runs():
    # torch's fake grouped_mm takes bf16 only, as the CUDA kernel does: an fp32 plan of
    # transformers' stacked experts failed its dry run (plan --check) on it
    import autopar
    from autopar.core.specs import ParallelConfig, TrainSpec
    from autopar.costmodel.cluster import process_cluster
    from autopar.dryrun.plan_check import check_plans
    from autopar.verify.models import transformers_spec

    spec = transformers_spec("mixtral")
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2),
                            TrainSpec(global_batch=4, seq_len=32, precision="fp32"),
                            ParallelConfig(dp=2), model_spec=spec)
    (checked,) = check_plans(plan, workers=1).checked
    assert checked.kept and checked.run is not None and checked.run.peak_bytes > 0
