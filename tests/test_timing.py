"""The timing harness's scheduling (nf4tune.measure.timing.measure_interleaved) on the CPU, with a
test double for the device side (events, synchronisation, graph capture) that keeps a virtual
GPU clock; the GPU tests time bnb itself."""

import pytest

from nf4tune.measure.timing import DIRECT, GRAPH, Graphed, measure_interleaved


class FakeGPU:
    """A virtual GPU: work advances a clock; the host's time enters only where the GPU would
    have waited for the host between two launches of one callable."""

    def __init__(self, fail_capture=False, replay_differs=False):
        self.clock = 0.0
        self.log = []
        self.fail_capture = fail_capture
        self.replay_differs = replay_differs
        self.captured = []

    # the device side of the harness
    def event(self):
        return {}

    def record(self, event):
        event["t"] = self.clock
        self.log.append("record")

    @staticmethod
    def elapsed_us(start, end):
        return end["t"] - start["t"]

    def synchronize(self):
        self.log.append("sync")

    def capture(self, fn):
        self.log.append(f"capture {fn.name}")
        self.captured.append(fn.name)
        if self.fail_capture:
            raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

        def replay():
            self.log.append(f"replay {fn.name}")
            self.clock += sum(fn.launch_us)          # launches queued at once: no host gaps

        return replay

    def replay_mismatch(self, fn, replay, output):
        fn()
        replay()
        return "3 of 8 bytes differ" if self.replay_differs else None


class Launches:
    """A callable of several launches with host work between them (bnb's dequantize_4bit): timed
    directly, each gap the host takes beyond what the GPU has queued shows up."""

    def __init__(self, gpu, name, launch_us, host_gap_us=0.0):
        self.gpu, self.name, self.launch_us, self.host_gap_us = gpu, name, launch_us, host_gap_us

    def __call__(self):
        self.gpu.log.append(f"call {self.name}")
        for i, us in enumerate(self.launch_us):
            if i:
                self.gpu.clock += self.host_gap_us
            self.gpu.clock += us


def _flush(gpu):
    def flush():
        gpu.log.append("flush")
        gpu.clock += 50.0
    return flush


def _timed_sequences(log):
    """The work between each pair of event records."""
    out, inside, current = [], False, []
    for entry in log:
        if entry == "record":
            if inside:
                out.append(current)
            inside, current = not inside, []
        elif inside:
            current.append(entry)
    return out


def test_a_graph_candidate_is_captured_once_after_warm_up_and_replayed_between_the_events():
    gpu = FakeGPU()
    bnb = Launches(gpu, "bnb", [3.0, 2.0, 21.0], host_gap_us=40.0)     # a host stall between launches
    kernel = Launches(gpu, "kernel", [14.0])
    samples = measure_interleaved({"bnb": Graphed(bnb), "kernel": kernel}, flush=_flush(gpu), device=gpu,
                                  warmup=3, min_reps=20, max_reps=20)
    assert gpu.captured == ["bnb"]
    first_capture = gpu.log.index("capture bnb")
    assert gpu.log[:first_capture].count("call bnb") >= 3                   # warm-up calls come first
    assert "call bnb" not in gpu.log[first_capture + 1:]                     # never called directly again
    timed = _timed_sequences(gpu.log)
    assert len(timed) == 40 and all(len(t) == 1 for t in timed)              # only the candidate between events
    assert sorted(set(t[0] for t in timed)) == ["call kernel", "replay bnb"]
    # after the capture: one untimed replay round, then rounds of flush, event, candidate, event,
    # back to back, in rotating order
    after = gpu.log[first_capture + 1:]
    rounds = " ".join(after[after.index("sync") + 1:]).split(" sync")
    assert [r.strip() for r in rounds if r.strip()][:2] == [
        "flush record replay bnb record flush record call kernel record",
        "flush record call kernel record flush record replay bnb record"]
    assert samples["bnb"].mode == GRAPH and samples["bnb"].note == "" and samples["bnb"].timing == "graph"
    assert samples["kernel"].mode == DIRECT and samples["kernel"].timing == "direct"
    assert samples["bnb"].median == pytest.approx(26.0)      # the launches alone: the stall did not enter
    assert samples["kernel"].median == pytest.approx(14.0)


def test_without_the_graph_the_host_stall_enters_the_time():
    gpu = FakeGPU()
    bnb = Launches(gpu, "bnb", [3.0, 2.0, 21.0], host_gap_us=40.0)
    samples = measure_interleaved({"bnb": bnb}, flush=_flush(gpu), device=gpu, warmup=1, min_reps=5, max_reps=5)
    assert gpu.captured == [] and samples["bnb"].mode == DIRECT
    assert samples["bnb"].median == pytest.approx(106.0)


def test_a_failed_capture_falls_back_to_direct_calls_and_says_so():
    gpu = FakeGPU(fail_capture=True)
    bnb = Launches(gpu, "bnb", [3.0, 2.0, 21.0], host_gap_us=1.0)
    samples = measure_interleaved({"bnb": Graphed(bnb)}, flush=_flush(gpu), device=gpu, warmup=1, min_reps=5,
                                  max_reps=5)
    s = samples["bnb"]
    assert s.mode == DIRECT and len(s.us) == 5 and s.median == pytest.approx(28.0)
    assert s.note == "graph capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert s.timing.startswith("direct (graph capture failed")
    assert "replay bnb" not in gpu.log


def test_a_replay_that_writes_another_output_is_not_used():
    gpu = FakeGPU(replay_differs=True)
    bnb = Launches(gpu, "bnb", [3.0, 2.0, 21.0])
    samples = measure_interleaved({"bnb": Graphed(bnb, output=object())}, flush=_flush(gpu), device=gpu, warmup=1,
                                  min_reps=3, max_reps=3)
    assert samples["bnb"].mode == DIRECT and "graph not used: 3 of 8 bytes differ" in samples["bnb"].note
    # without an output to compare, the replay is used
    gpu = FakeGPU()
    bnb = Launches(gpu, "bnb", [3.0, 2.0, 21.0])
    assert measure_interleaved({"bnb": Graphed(bnb)}, flush=_flush(gpu), device=gpu, warmup=1, min_reps=3,
                               max_reps=3)["bnb"].mode == GRAPH


def test_the_family_peers_are_marked_for_graphs():
    """The family declares it (time_peers_in_graph), a peer can opt out (graph = False), and a
    peer's output (the tensor it writes) goes with it for the replay check."""
    from nf4tune.families import DEQUANT
    from nf4tune.family import Family
    from nf4tune.measure.bench import peer_candidates

    def full():
        pass

    def alone():
        pass

    def syncs():
        pass

    full.output = "out tensor"
    syncs.graph = False
    assert Family.time_peers_in_graph is True and DEQUANT.time_peers_in_graph is True
    got = peer_candidates(DEQUANT, {"full": full, "alone": alone, "syncs": syncs})
    assert isinstance(got["full"], Graphed) and got["full"].fn is full and got["full"].output == "out tensor"
    assert isinstance(got["alone"], Graphed) and got["alone"].output is None
    assert got["syncs"] is syncs
    plain = DEQUANT.extended(time_peers_in_graph=False)
    assert all(not isinstance(f, Graphed) for f in peer_candidates(plain, {"full": full, "alone": alone}).values())
