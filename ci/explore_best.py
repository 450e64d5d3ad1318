"""From a `bench --exhaustive -o FILE.json` result, the fastest screened config for each value of
one knob, as JSON objects separated by '|' (for MM_PROFILE_CONFIGS of ci/gpu-session.sh).

Usage: python3 ci/explore_best.py FILE.json KNOB
"""

import json
import sys


def best_by(path: str, knob: str) -> list:
    data = json.load(open(path))
    data = data[0] if isinstance(data, list) else data
    best: dict = {}
    for text, us in data["screen_us"].items():
        c = json.loads(text)
        v = c.get(knob)
        if v not in best or us < best[v][0]:
            best[v] = (us, c)
    return [best[v][1] for v in sorted(best, key=str)]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print("|".join(json.dumps(c) for c in best_by(sys.argv[1], sys.argv[2])))
