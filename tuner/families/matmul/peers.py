"""What a matmul variant is judged against: bnb's ``matmul_4bit`` (the x-bnb basis), a dense
F.linear with the 16-bit weight, and the read bandwidth (a read-only reduction of 512 MiB)."""

from __future__ import annotations

from ...vocabulary import REF_READ, Problem

__all__ = ["MatmulPeers", "REF_BNB_MATMUL", "REF_DENSE", "READ_BYTES", "read_reduction"]

REF_BNB_MATMUL = "bnb matmul_4bit"
REF_DENSE = "dense F.linear (16-bit weight)"
#: the read-only reduction the ceiling is measured on
READ_BYTES = 512 << 20


class MatmulPeers:
    """The family's peers and ceiling (a part of :class:`~nf4tune.families.matmul.MatmulFamily`)."""

    def peers(self, inputs, problem: Problem) -> dict:
        """bnb's grad-free ``matmul_4bit`` (what users call: its fused kernel or dequantize +
        F.linear, by its heuristics), and a dense F.linear with the 16-bit weight (what the
        model would cost unquantized)."""
        import torch
        import bitsandbytes as bnb
        import bitsandbytes.functional as F

        A, B, qs, bias = inputs.A, inputs.B, inputs.qs, inputs.bias
        dense = F.dequantize_4bit(B, qs).to(A.dtype)

        def bnb_matmul():
            with torch.no_grad():
                return bnb.matmul_4bit(A, B.t(), qs, bias=bias)

        def dense_linear():
            return torch.nn.functional.linear(A, dense, bias)

        return {REF_BNB_MATMUL: bnb_matmul, REF_DENSE: dense_linear}

    def ceiling(self, inputs, problem: Problem):
        """(label, callable, bytes): a read-only reduction of 512 MiB (the read bandwidth)."""
        return REF_READ, read_reduction(inputs.A.device), READ_BYTES


def read_reduction(device, nbytes: int = READ_BYTES):
    """A callable that reads ``nbytes`` once (``torch.sum`` of a float32 buffer into a scalar): the
    family's read-only ceiling at 512 MiB, and a pure read of exactly a problem's bytes."""
    import torch

    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    sink = torch.empty((), dtype=torch.float32, device=buf.device)
    return lambda: torch.sum(buf, dim=0, out=sink)
