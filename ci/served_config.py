"""The config the runtime serves a matmul problem with on this machine's GPU (tuner.serve.matmul's
serve_decision: an exact table entry measured faster than bnb), as JSON on one line; nothing is
printed where bnb serves it. For screens that time the served kernel beside
new candidates (ci/explore-screen.sh's GIVEN).

Usage: python3 ci/served_config.py NxK M [--dtype bf16] [--quant nf4] [--blocksize 64] [--gpu NAME] [--table FILE]
"""

import argparse
import json
import sys

sys.path.insert(0, __file__.rsplit("/ci/", 1)[0])

from tuner.serve import table as T  # noqa: E402
from tuner.serve.matmul import serve_decision  # noqa: E402
from tuner.vocabulary import Problem  # noqa: E402


def served_config(gpu: str, problem: Problem):
    """The served config (a dict), or None where bnb serves."""
    d = serve_decision(gpu, problem)
    return d.choice.config.to_dict() if d.served else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", metavar="NxK")
    ap.add_argument("m", type=int)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--quant", default="nf4")
    ap.add_argument("--blocksize", type=int, default=64)
    ap.add_argument("--gpu", help="GPU model name (default: this machine's first GPU)")
    ap.add_argument("--table", help="a configs.json (default: the runtime's table)")
    a = ap.parse_args(argv)
    try:
        problem = Problem(Problem.parse_shape(a.shape), a.dtype, a.quant, a.blocksize, "matmul", a.m)
        if a.table:
            T.use_configs(a.table)
        gpu = a.gpu
        if gpu is None:
            import torch
            if not torch.cuda.is_available():
                raise ValueError("no GPU is visible: give --gpu NAME")
            gpu = torch.cuda.get_device_name(0)
        cfg = served_config(gpu, problem)
    except (OSError, ValueError) as e:
        print(f"served_config: {e}", file=sys.stderr)
        return 1
    if cfg is not None:
        print(json.dumps(cfg, separators=(",", ":"), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
