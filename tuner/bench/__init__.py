"""Benchmarks of what users run: the serving runtime against bnb (``runtime``), its host time per call,
model decoding (``decode``: HF ``generate`` eager and as a CUDA-graph step) and the served config of an
untuned problem against its own tuned best (``fallback``). They measure, so they sit above the runtime
they measure: ``nf4tune.serve`` imports none of this."""
