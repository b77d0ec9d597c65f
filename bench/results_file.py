"""Where benchmark results go: one JSON file per run under bench/results/."""
from __future__ import annotations

import json
import time
from pathlib import Path


def write_results(kind: str, out: str | None, payload: dict) -> Path:
    """Write `payload` to `out`, or to bench/results/<kind>-<time>.json; say where."""
    path = Path(out or f"bench/results/{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    print(f"wrote {path}")
    return path
