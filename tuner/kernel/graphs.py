"""CUDA-graph capture of a callable's launches, so that they can be replayed as one launch.

A callable that makes several launches from Python (bnb's ``dequantize_4bit``: the nested
absmax decode, the offset add, the 4-bit kernel) leaves host time between them: when the host
stalls, the GPU waits, and a timing taken around the call counts the wait. Replaying the
captured graph queues every launch at once, so only the GPU's time is left between the events.
"""

from __future__ import annotations

from typing import Callable, Optional

__all__ = ["GraphReplay", "capture_graph", "replay_mismatch"]


class GraphReplay:
    """A captured CUDA graph as a callable: each call replays it on the current stream. Holds
    the graph (and its memory pool, where the capture's allocations live)."""

    def __init__(self, graph, fn: Callable):
        self.graph = graph
        self.fn = fn

    def __call__(self):
        self.graph.replay()


def capture_graph(fn: Callable[[], object], warmup: int = 2) -> GraphReplay:
    """Capture ``fn``'s launches into a CUDA graph, as torch requires: warm-up calls on a side
    stream first (lazy initialisation, allocator pools), then the capture (on torch's capture
    stream). Raises whatever the capture raises (a callable that synchronises, copies to the
    host or launches on another stream cannot be captured)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return GraphReplay(graph, fn)


def replay_mismatch(fn: Callable, replay: Callable, output) -> Optional[str]:
    """None when replaying writes ``output`` exactly as a direct call of ``fn`` does; else why
    not. ``output`` is poisoned (every byte 0xA5) before the replay, so a replay that writes
    nothing is caught."""
    import torch

    fn()
    torch.cuda.synchronize()
    want = output.detach().clone()
    output.view(torch.uint8).fill_(0xA5)
    replay()
    torch.cuda.synchronize()
    got, ref = output.view(torch.uint8).reshape(-1), want.view(torch.uint8).reshape(-1)
    diff = (got != ref).nonzero()
    if diff.numel() == 0:
        return None
    return f"the graph replay's output differs from a direct call's in {diff.numel()} of {got.numel()} bytes"
