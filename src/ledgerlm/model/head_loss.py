"""The head scored a chunk of rows at a time, without the (N, V) logits: the loss
numerator ``head_loss`` and its autograd kernel (``GPT.forward(..., targets=,
weights=)``), and each target's loss without a gradient, for evaluation
(``head_losses``, ``GPT.forward(..., targets=)``)."""

from __future__ import annotations

import torch

# Rows of the head scored at once by ``head_loss``: fp32 logits per chunk. On the CPU a
# chunk that stays in cache (8 MB: 512 rows of a 4,096 vocabulary) measured fastest; on
# an accelerator chunks only bound memory, so they are large (one chunk at the demo shape).
HEAD_CHUNK_BYTES = 8 * 2**20
HEAD_CHUNK_BYTES_ACCELERATOR = 512 * 2**20


class _ChunkedHeadLoss(torch.autograd.Function):
    """``sum_r w_r * -log softmax(x_r @ W^T)[t_r]``, a chunk of rows at a time.

    The (N, V) logits are never held whole: each chunk's logits are made, scored and
    turned into their gradient ``w * (softmax - onehot)`` in place, which goes straight
    into the gradients of ``x`` and ``W``; the backward pass only scales those by the
    incoming gradient. A chunk stays in the CPU's cache, where the plain path makes
    about ten passes over the whole (N, V) array in main memory (the head matmul, the
    log-softmax, the NLL and their gradients).
    """

    @staticmethod
    def forward(ctx, x, weight, targets, weights, rows: int, dtype: torch.dtype):
        # x (N, d), weight (V, d), targets and weights (N,); matmuls in ``dtype``, the
        # softmax and the sums in fp32 (or the model's own fp64)
        acc = _accumulation(dtype)
        with torch.autocast(x.device.type, enabled=False):
            xc, wc, w_all = x.to(dtype), weight.to(dtype), weights.to(acc)
            grad_x = torch.empty_like(x)
            grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
            total = torch.zeros((), dtype=torch.float64, device=x.device)
            for start in range(0, x.shape[0], rows):
                end = min(start + rows, x.shape[0])
                t, w = targets[start:end, None], w_all[start:end, None]
                z, norm, loss = _scored(xc[start:end], wc, t, acc)
                total += (w * loss).sum(dtype=torch.float64)
                g = z.mul_(w / norm).scatter_add_(1, t, -w).to(dtype)  # w (softmax - onehot)
                grad_x[start:end] = g @ wc
                if g.dtype == acc:
                    grad_w.addmm_(g.t(), xc[start:end])
                else:
                    grad_w += (g.t() @ xc[start:end]).to(acc)
        ctx.save_for_backward(grad_x, grad_w.to(weight.dtype))
        return total.to(acc)

    @staticmethod
    def backward(ctx, grad):
        grad_x, grad_w = ctx.saved_tensors
        return grad_x * grad.to(grad_x.dtype), grad_w * grad.to(grad_w.dtype), *(None,) * 4


def head_loss(
    x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """``sum(weights * -log softmax(x @ weight^T)[targets])``: a loss numerator from the
    final hidden states x (..., d), the head ``weight`` (V, d), and targets and their
    weights (...), without the (..., V) logits.

    A position of weight 0 is zeroed before the head, so nothing it holds (even a NaN)
    reaches the sum or the gradient. The matmuls run in the autocast dtype when autocast
    is on; the softmax and the sums in fp32 (fp64 for an fp64 model).
    """
    keep = weights != 0
    x = x.masked_fill(~keep[..., None], 0.0).reshape(-1, x.shape[-1])
    targets = targets.masked_fill(~keep, 0).reshape(-1)
    weights = weights.reshape(-1)
    dtype, rows = _plan(x, weight)
    return _ChunkedHeadLoss.apply(x, weight, targets, weights, rows, dtype)


@torch.no_grad()
def head_losses(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``-log softmax(x @ weight^T)[targets]`` of every position, shape targets.shape
    (...), without the (..., V) logits and without a gradient: an evaluation's
    per-target losses, which it sums per domain (and over UTF-8 bytes).

    The same arithmetic as ``head_loss``, chunk by chunk: the matmul in the autocast
    dtype when autocast is on, the softmax in fp32 (fp64 for an fp64 model); the
    losses are returned in that accumulation dtype.
    """
    shape = targets.shape
    x, targets = x.reshape(-1, x.shape[-1]), targets.reshape(-1)
    dtype, rows = _plan(x, weight)
    acc = _accumulation(dtype)
    with torch.autocast(x.device.type, enabled=False):
        xc, wc = x.to(dtype), weight.to(dtype)
        out = torch.empty(x.shape[0], dtype=acc, device=x.device)
        for start in range(0, x.shape[0], rows):
            end = min(start + rows, x.shape[0])
            out[start:end] = _scored(xc[start:end], wc, targets[start:end, None], acc)[2][:, 0]
    return out.view(shape)


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    """The softmax's and the sums' dtype for matmuls in ``dtype``: fp32 for a 16-bit
    one, else the model's own (fp32, fp64)."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _scored(
    xc: torch.Tensor, wc: torch.Tensor, t: torch.Tensor, acc: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk of rows scored: ``exp(logits - max)`` (the chunk's (c, V) buffer, in
    place), the softmax's normaliser (c, 1) and each row's ``-log softmax[t]`` (c, 1)."""
    z = (xc @ wc.t()).to(acc)  # (c, V) logits
    picked = z.gather(1, t)
    top = z.amax(-1, keepdim=True)
    norm = z.sub_(top).exp_().sum(-1, keepdim=True)  # z: exp(logits - top)
    return z, norm, norm.log() + top - picked


def _plan(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.dtype, int]:
    """The matmuls' dtype (autocast's when it is on) and the rows of a chunk."""
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    budget = HEAD_CHUNK_BYTES if device == "cpu" else HEAD_CHUNK_BYTES_ACCELERATOR
    rows = max(64, budget // (4 * weight.shape[0]))
    if torch.compiler.is_compiling():  # the traced loop is unrolled: at most 16 chunks
        rows = max(rows, -(-x.shape[0] // 16))
    return dtype, rows
