"""Fused LM head and loss: ``F.cross_entropy(hidden @ weight.T, target)`` without the logits.

The loss is the mean over the targets that are not ``ignore_index``, as ``F.cross_entropy``; with
every target ignored it is nan (0 / 0), as there, and the gradients are zero.

Memory, not time, is the point. Eager PyTorch materialises the (tokens x vocab) logits, then their
log-softmax and, in the backward, their gradient: at 8192 tokens and Llama 3's vocabulary of 128256
each is 2.1 GB in bf16. Here the tokens go through in chunks (the Liger-Kernel scheme, Hsu et al.,
2024): for each chunk of c tokens

1. ``logits = hidden_chunk @ weight.T`` (torch matmul, fp32 accumulation), c x vocab;
2. a Triton kernel, one program per row, makes two passes over the row: an online max and sum of
   exponentials give the log-sum-exp and the row's loss ``lse - logit[target]``; then it overwrites
   the logits in place with their gradient ``(softmax - onehot(target)) / n_valid``;
3. that gradient goes straight into ``grad_hidden[chunk] = g @ weight`` and
   ``grad_weight += g.T @ hidden_chunk``, and the chunk buffer is reused.

So the forward already computes both gradients, and the backward only scales them by the incoming
gradient (in place: one backward per forward; a second one, e.g. with ``retain_graph``, fails on the
saved tensors' version check instead of scaling twice). Extra memory is O(c x vocab) for the chunk,
plus the gradients the eager backward produces as well; c is chosen so a chunk of logits is about
the size of ``hidden`` (c = tokens / ceil(vocab / hidden), to a power of two). The gradient of
``weight`` accumulates in weight's dtype across chunks, as Liger-Kernel does (fp32 inside each
matmul); the loss is fp32. When no gradient is wanted, only the loss is computed.

Roofline. The two matmuls per chunk in the forward (three with the gradient, as the eager
backward) hold nearly all the FLOPs and run at cuBLAS speed; the kernel reads each logit twice and
writes it once (3 x tokens x vocab x element-size bytes, about 6.3 GB at the sizes above, some
2 ms at H100 bandwidth against ~26 ms for the 6 x tokens x hidden x vocab matmul FLOPs).

Registered as ``torch.library.custom_op("autopar::linear_cross_entropy")`` with a fake and its
autograd (the tutorial's ``torch.autograd.Function`` in the form torch.fx and torch.export keep
opaque); the op returns (loss, grad_hidden, grad_weight), and ``linear_cross_entropy`` the loss.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autopar.kernels._launch import check_launchable, interpreting, num_warps_for

BLOCK_V_MAX = 32768
"""Vocabulary block of the row kernel on a GPU (as Liger-Kernel's cross-entropy)."""


@triton.jit
def _cross_entropy_rows_kernel(logits_ptr, target_ptr, loss_ptr, scale_ptr, n_vocab,
                               logits_stride, ignore_index,
                               COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_stride
    target = tl.load(target_ptr + row)
    valid = target != ignore_index
    m = float("-inf")
    total = 0.0
    for start in range(0, n_vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        z = tl.load(row_ptr + cols, mask=cols < n_vocab, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(z, axis=0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m = m_new
    lse = m + tl.log(total)
    z_target = tl.load(row_ptr + tl.where(valid, target, 0)).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(valid, lse - z_target, 0.0))
    if COMPUTE_GRAD:
        # 1 / n_valid; an ignored row gets 0, not 0 x inf when every row is ignored.
        scale = tl.where(valid, tl.load(scale_ptr), 0.0)
        for start in range(0, n_vocab, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            col_mask = cols < n_vocab
            z = tl.load(row_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
            grad = (tl.exp(z - lse) - tl.where(cols == target, 1.0, 0.0)) * scale
            tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=col_mask)


def _check_inputs(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> None:
    if weight.dim() != 2 or hidden.shape[-1:] != weight.shape[1:]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)}: weight "
                         "must be (vocab, hidden.shape[-1])")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden is {hidden.dtype} and weight {weight.dtype}: one dtype")
    if target.shape != hidden.shape[:-1]:
        raise ValueError(f"target {tuple(target.shape)} must be hidden's leading dims "
                         f"{tuple(hidden.shape[:-1])}")


def chunk_tokens(n_tokens: int, n_vocab: int, n_hidden: int) -> int:
    """Tokens per chunk: a chunk of logits about as large as ``hidden``, a power of two."""
    return triton.next_power_of_2(triton.cdiv(n_tokens, triton.cdiv(n_vocab, n_hidden)))


def linear_cross_entropy_forward(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
    compute_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss in fp32, grad_hidden, grad_weight) of a unit upstream gradient; the two
    gradients are empty (0 elements) without ``compute_grad``."""
    _check_inputs(hidden, weight, target)
    check_launchable(hidden, weight, target)
    h2 = hidden.reshape(-1, hidden.shape[-1]).contiguous()
    t = target.reshape(-1).contiguous()
    weight = weight.contiguous()
    n_tokens, (n_vocab, n_hidden) = h2.shape[0], weight.shape
    inv_valid = 1.0 / (t != ignore_index).sum().to(torch.float32)  # a tensor: no host sync
    loss_rows = torch.empty(n_tokens, dtype=torch.float32, device=h2.device)
    grad_hidden = torch.empty_like(h2) if compute_grad else h2.new_empty(0)
    grad_weight = torch.zeros_like(weight) if compute_grad else weight.new_empty(0)
    block_v = triton.next_power_of_2(n_vocab)
    if not interpreting():
        block_v = min(block_v, BLOCK_V_MAX)
    chunk = chunk_tokens(n_tokens, n_vocab, n_hidden)
    for start in range(0, n_tokens, chunk):
        h_chunk = h2[start:start + chunk]
        logits = h_chunk @ weight.T  # (c, vocab), becomes its own gradient in place
        _cross_entropy_rows_kernel[(h_chunk.shape[0],)](
            logits, t[start:], loss_rows[start:], inv_valid, n_vocab, logits.stride(0),
            ignore_index, COMPUTE_GRAD=compute_grad, BLOCK_V=block_v,
            num_warps=num_warps_for(block_v))
        if compute_grad:
            torch.mm(logits, weight, out=grad_hidden[start:start + chunk])
            grad_weight.addmm_(logits.T, h_chunk)
    loss = loss_rows.sum() * inv_valid
    return loss, grad_hidden.view(hidden.shape) if compute_grad else grad_hidden, grad_weight


@torch.library.custom_op("autopar::linear_cross_entropy", mutates_args=())
def _linear_cross_entropy_op(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
    compute_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return linear_cross_entropy_forward(hidden, weight, target, ignore_index, compute_grad)


@_linear_cross_entropy_op.register_fake
def _(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
      compute_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_inputs(hidden, weight, target)
    loss = hidden.new_empty((), dtype=torch.float32)
    if not compute_grad:
        return loss, hidden.new_empty(0), weight.new_empty(0)
    return loss, hidden.new_empty(hidden.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    _, grad_hidden, grad_weight = output
    ctx.compute_grad = inputs[4]
    ctx.mark_non_differentiable(grad_hidden, grad_weight)
    # Undefined gradients of the two gradient outputs stay None: materialised, they would be
    # zeros as large as the gradients themselves, a second weight gradient at the backward's
    # peak (measured on an H200: 584 MB above the inputs where the saved gradients are 272 MB)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(grad_hidden, grad_weight)


def _backward(ctx, grad_loss: torch.Tensor, *_: torch.Tensor) -> tuple:
    if not ctx.compute_grad:
        raise RuntimeError("autopar::linear_cross_entropy ran without computing gradients (no "
                           "input required grad, or grad mode was off) and cannot backpropagate")
    grad_hidden, grad_weight = ctx.saved_tensors
    # In place: grad_weight is vocab x hidden, and a scaled copy would double it at the peak.
    return grad_hidden * grad_loss, grad_weight.mul_(grad_loss), None, None, None


_linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)


def _may_require_grad(t: torch.Tensor) -> bool:
    # A torch.fx Proxy is no Tensor and says nothing: compute the gradients to be safe.
    return not isinstance(t, torch.Tensor) or t.requires_grad


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``target``, chunked; fp32 scalar.

    hidden is (..., hidden_size), weight (vocab, hidden_size) like ``nn.Linear.weight``, target the
    leading dims of hidden, int64.
    """
    compute_grad = torch.is_grad_enabled() and (
        _may_require_grad(hidden) or _may_require_grad(weight))
    loss, _, _ = _linear_cross_entropy_op(hidden, weight, target, ignore_index, compute_grad)
    return loss


def linear_cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor,
                                   target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Plain PyTorch: the full logits, in fp32, then ``F.cross_entropy``."""
    logits = (hidden @ weight.T).float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             target.reshape(-1), ignore_index=ignore_index)
