"""Regenerate tests/data/model-replay.jsonl, the measured log that model-tune tests replay (no hardware).

    python tests/data/make_model_replay_log.py

A whole-model tune of the built-in `tiny` model in three layouts (29 tasks: convolutions, pools
and layout transforms) with random search, measured on this host for REPLAY_TARGET (AVX2). Run it
again when a change to lowering, C generation or the model's tasks changes code hashes or keys.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import MODEL_REPLAY, MODEL_REPLAY_LOG, REPLAY_TARGET  # noqa: E402

from tuner.measure.runner import RunConfig  # noqa: E402
from tuner.model_tuning import tune_model  # noqa: E402


def main():
    out = Path(MODEL_REPLAY_LOG)
    out.unlink(missing_ok=True)
    fast = RunConfig(timeout=5.0, repeat=2, min_repeat_ms=0.5)
    res = tune_model(target=REPLAY_TARGET, log=str(out), policy="random", run_config=fast, progress=False,
                     **MODEL_REPLAY)
    print(res.table())
    print(f"wrote {out} ({len(out.read_text().splitlines())} lines)")


if __name__ == "__main__":
    main()
