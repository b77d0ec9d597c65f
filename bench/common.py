"""What the benchmark scripts share: the workloads the learned search is judged on, and where results go."""
from __future__ import annotations

import json
import time
from pathlib import Path

# issue 3's four: ResNet-50's 3x3 convs at 56x56 and 7x7, a 1x1 conv and the 2048->1000 dense layer
SEARCH_WORKLOADS = "r50.s1.conv3x3,r50.s1.conv1x1c,r50.s4.conv3x3,dense.2048x1000"


def bench_workload(name: str, conv_layout: str):
    """A workload by name or spec; convolutions in `conv_layout`, other operators in their own."""
    from tuner.te.workloads import resolve
    return resolve(name, conv_layout if resolve(name).op == "conv2d" else None)


def write_results(kind: str, out: str | None, payload: dict) -> Path:
    """Write `payload` to `out`, or to bench/results/<kind>-<time>.json; say where."""
    path = Path(out or f"bench/results/{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")
    return path
