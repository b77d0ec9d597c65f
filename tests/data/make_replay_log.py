"""Regenerate tests/data/replay.jsonl, the measured log that policy tests replay (no hardware).

    python tests/data/make_replay_log.py

48 random schedules of a small 3x3 conv and 24 of a small 1x1 conv, measured on this host for the
target REPLAY_TARGET (AVX2, so that any x86-64-v3 machine can read it back). Run it again when a
change to lowering or C generation changes code hashes (the replay tests then find no record and
fail, which is how one notices).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import REPLAY_LOG, REPLAY_TARGET, REPLAY_WORKLOADS  # noqa: E402

from tuner.measure.runner import RunConfig  # noqa: E402
from tuner.tuning import tune  # noqa: E402


def main():
    out = Path(REPLAY_LOG)
    out.unlink(missing_ok=True)
    fast = RunConfig(timeout=5.0, repeat=1, min_repeat_ms=0.5)
    for wl, trials in REPLAY_WORKLOADS:
        tune([wl], target=REPLAY_TARGET, trials=trials, log=str(out), policy="random", run_config=fast,
             progress=False, batch_size=16)
    print(f"wrote {out} ({len(out.read_text().splitlines())} records)")


if __name__ == "__main__":
    main()
