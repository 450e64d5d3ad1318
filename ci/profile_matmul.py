"""Launch one matmul variant a few times on fresh data (for ncu / nsys to profile).

Usage: python3 ci/profile_matmul.py N K M 'CONFIG_JSON' [reps]
"""

import json
import sys

import torch

from tuner.families import MATMUL
from tuner.kernel.launch import bind, load_kernel
from tuner.vocabulary import Problem, m_bucket


def main(argv):
    n, k, m = (int(x) for x in argv[:3])
    knobs = json.loads(argv[3])
    reps = int(argv[4]) if len(argv) > 4 else 3
    prob = Problem((n, k), knobs.get("dtype", "bf16"), knobs.get("quant", "nf4"), 64, "matmul", m_bucket(m))
    config = MATMUL.from_dict(dict(knobs, m=prob.m))
    inputs = MATMUL.make_inputs(prob, (n, k, m, False), 1)
    out = MATMUL.new_output(inputs, poison=False)
    launch = bind(load_kernel(config), inputs, out)
    for _ in range(reps):
        launch()
    torch.cuda.synchronize()
    print(config.short(), "ok")


if __name__ == "__main__":
    main(sys.argv[1:])
