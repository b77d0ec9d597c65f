"""The log survives damage, resuming never re-measures, and records mean the same everywhere."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import TARGET1

from tuner.build import build_op
from tuner.database import records
from tuner.database.union import Database
from tuner.measure.runner import RunConfig
from tuner.ops import make
from tuner.tuning import tune_op

SMALL = make("conv2d", dict(C=8, H=6, W=6, K=8, R=3, S=3, pad=1), "NCHW8c")
FAST = RunConfig(timeout=5.0, repeat=1, min_repeat_ms=0.5)


@pytest.fixture(scope="module")
def tuned_log(tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "small.jsonl"
    tune_op(SMALL, target=TARGET1, trials=6, log=str(log), run_config=FAST, progress=False, batch_size=3)
    return log


@pytest.mark.slow
def test_corrupt_and_truncated_lines_are_skipped_and_counted(tuned_log, tmp_path):
    damaged = tmp_path / "damaged.jsonl"
    lines = tuned_log.read_text().splitlines()
    damaged.write_text("\n".join([lines[0], "{not json", lines[1], '{"workload": 3}', lines[2][:40]]) + "\n")
    with pytest.warns(UserWarning, match=r"3 line\(s\) of .* skipped \(2 not JSON, 1 workload is not an object\)"):
        contents = records.load(damaged)
    assert contents.skipped == 3 and len(contents.records) == 2
    # appending after a truncated last line starts a fresh line instead of gluing onto it
    damaged.write_text(lines[0] + "\n" + lines[1][:30])
    records.append(damaged, [records.Record.from_json(json.loads(lines[2]))])
    assert len(records.load(damaged, warn=False).records) == 2


def test_a_gzipped_log_reads_as_its_lines_a_cut_stream_up_to_the_cut_and_is_never_appended_to(tmp_path):
    """A corpus ships gzipped: load reads it (known by its first bytes, whatever its name) as the
    plain log; a stream cut short gives the lines before the cut, the damage counted; a tune or
    an append into a gzipped log is refused by name before anything is written."""
    import gzip
    from pathlib import Path

    from tuner.errors import UserError
    plain = Path(__file__).parent / "data" / "model-replay.jsonl"
    packed = gzip.compress(plain.read_bytes())
    want = records.load(plain, warn=False)
    for name in ("log.jsonl.gz", "named-plain.jsonl"):
        (tmp_path / name).write_bytes(packed)
        got = records.load(tmp_path / name, warn=False)
        assert got.records and got.plans and got.skipped == 0
        assert [r.to_json() for r in got.records] == [r.to_json() for r in want.records]
        assert [p.to_json() for p in got.plans] == [p.to_json() for p in want.plans]
        with pytest.raises(UserError, match=rf"--log .*{name} is gzipped.*give a \.jsonl path"):
            records.append(tmp_path / name, want.records[:1])
        with pytest.raises(UserError, match=rf"--log .*{name} is gzipped"):
            tune_op(SMALL, target=TARGET1, trials=1, log=str(tmp_path / name), run_config=FAST, progress=False)
        assert (tmp_path / name).read_bytes() == packed
    (tmp_path / "cut.jsonl.gz").write_bytes(packed[:len(packed) // 2])
    with pytest.warns(UserWarning, match="the gzip stream is damaged or cut short"):
        part = records.load(tmp_path / "cut.jsonl.gz")
    assert 0 < len(part.records) < len(want.records) and part.skipped == 1


@pytest.mark.slow
def test_resume_counts_the_log_and_never_remeasures(tuned_log, tmp_path):
    log = tmp_path / "resume.jsonl"
    log.write_text(tuned_log.read_text())
    again = tune_op(SMALL, target=TARGET1, trials=6, log=str(log), run_config=FAST, progress=False)
    assert again.new == 0 and again.trials == 6
    more = tune_op(SMALL, target=TARGET1, trials=9, log=str(log), run_config=FAST, progress=False, batch_size=3)
    assert more.new == 3 and more.trials == 9
    hashes = [r.code_hash for r in records.load(log).records]
    assert len(hashes) == len(set(hashes)) == 9


def test_records_another_version_generated_are_no_head_start(tuned_log, tmp_path):
    """A log whose records no longer replay (the code they measured is not what this version
    generates) is said so, and the task is tuned from the start rather than counted as done."""
    log = tmp_path / "stale.jsonl"
    stale = [dict(json.loads(ln), code_hash="0" * 16) for ln in tuned_log.read_text().splitlines()]
    log.write_text("".join(json.dumps(r) + "\n" for r in stale))
    with pytest.warns(UserWarning, match=r"none of the 6 records of .* replays .* tuning it from the start"):
        again = tune_op(SMALL, target=TARGET1, trials=3, log=str(log), run_config=FAST, progress=False, batch_size=3)
    assert again.new == 3 and again.trials == 3 and again.best is not None


def test_record_fields(tuned_log):
    rec = json.loads(tuned_log.read_text().splitlines()[0])
    for field in ("workload", "target", "steps", "costs", "error", "message", "build_s", "run_s", "timestamp",
                  "tool", "policy", "seed", "code_hash"):
        assert field in rec
    assert rec["workload"]["key"] == SMALL.key and rec["target"] == str(TARGET1)
    assert rec["target"].startswith("cpu -isa=") and "-threads=1" in rec["target"]
    assert records.Record.from_json(rec).to_json() == rec          # the parser keeps every field


def test_a_record_builds_the_same_code_in_another_process(tuned_log):
    best, _ = Database.open(tuned_log, TARGET1, use_shipped=False).best(SMALL, TARGET1)
    script = (
        "import json,sys\n"
        "from tuner.task import Task\nfrom tuner.target import parse_target\nfrom tuner.ops import parse_spec\n"
        "rec = json.loads(sys.stdin.read())\n"
        "wl = parse_spec(rec['workload']['spec'], rec['workload']['layout'])\n"
        "assert wl.key == rec['workload']['key']\n"
        "print(Task(wl, parse_target(rec['target'])).candidate(rec['steps']).code_hash)\n")
    out = subprocess.run([sys.executable, "-c", script], input=json.dumps(best.to_json()), capture_output=True, text=True,
                         env={"PYTHONHASHSEED": "123", **__import__("os").environ})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == best.code_hash


def test_build_op_applies_the_best_record(tuned_log):
    k = build_op(SMALL, target=TARGET1, log=str(tuned_log), use_shipped=False)
    best, _ = Database.open(tuned_log, TARGET1, use_shipped=False).best(SMALL, TARGET1)
    assert k.tuned and k.steps == best.steps and k.code_hash == best.code_hash
    arrays = SMALL.random_inputs(seed=7)
    import numpy as np
    np.testing.assert_allclose(k(*arrays), SMALL.reference(arrays), rtol=1e-4, atol=1e-4)


def test_build_op_says_loudly_when_it_falls_back(tmp_path):
    with pytest.warns(UserWarning, match="no tuning record for conv2d.*default"):
        k = build_op(SMALL, target=TARGET1, log=str(tmp_path / "empty.jsonl"), use_shipped=False)
    assert not k.tuned


@pytest.mark.slow
def test_a_process_that_loaded_an_openmp_kernel_exits_cleanly():
    """cffi closes libraries at exit; the OpenMP runtime must outlive its threads (no segfault)."""
    script = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from tuner.build import build_op\nfrom tuner.ops import make\n"
        "wl = make('conv2d', dict(C=8, H=6, W=6, K=8, R=3, S=3, pad=1), 'NCHW8c')\n"
        "k = build_op(wl, threads=2, use_shipped=False, quiet=True)\n"
        "assert 'omp parallel' in k.source\n"
        "print(float(abs(k(*wl.random_inputs()) - wl.reference(wl.random_inputs())).max()))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 1e-3


@pytest.mark.slow
def test_time_limit_stops_the_tune_early(tmp_path):
    log = tmp_path / "limited.jsonl"
    s = tune_op(SMALL, target=TARGET1, trials=10_000, log=str(log), run_config=FAST, progress=False,
                batch_size=2, time_limit=1.0)
    assert 0 < s.trials < 10_000 and s.seconds < 30
    assert len(records.load(log).records) == s.trials


def test_layout_plans_share_the_log_with_records_and_the_newest_applicable_one_wins(tuned_log, tmp_path):
    log = tmp_path / "model.jsonl"
    log.write_text(tuned_log.read_text())
    old = records.make_plan_record("m", "h1", "cpu -isa=avx2 -threads=1 -cores=8", {"conv1": "NHWC"}, 1e-3, True)
    new = records.make_plan_record("m", "h1", "cpu -isa=avx2 -threads=1 -cores=2", {"conv1": "NCHW8c"}, 9e-4, False)
    other = records.make_plan_record("m", "h1", "cpu -isa=avx2 -threads=2 -cores=2", {"conv1": "NCHW"}, 1e-3, True)
    records.append(log, [old, new, other])
    with log.open("a") as f:
        f.write(json.dumps(dict(new.to_json(), layouts={"conv1": 3})) + "\n")        # damaged: skipped
    c = records.load(log, warn=False)
    assert len(c.records) == len(records.load(tuned_log, warn=False).records) > 0
    assert c.plans == [old, new, other]
    assert c.reasons == {"plan layouts is not an object of strings": 1}
    assert c.plan("h1", "cpu -isa=avx2 -threads=1 -cores=4") == new       # any core count, same threads
    assert c.plan("h1", "cpu -isa=avx2 -threads=2 -cores=4") == other
    assert c.plan("h2", "cpu -isa=avx2 -threads=1 -cores=4") is None


@pytest.mark.parametrize("choices", [[], {"fuse_attention": True}, {"fuse_attention": {"on": 1, "s": [1e-3, 2e-3]}},
                                     {"fuse_attention": {"on": True, "s": [1e-3]}},
                                     {"fuse_attention": {"on": True, "s": [1e-3, -2e-3]}},
                                     {"fuse_attention": {"on": True, "s": [1e-3, float("nan")]}}])
def test_a_plan_line_whose_timed_choices_are_malformed_is_refused_by_name(choices):
    """A plan keeps each graph choice its tune timed as {"on": bool, "s": [on, off]} (positive
    seconds); anything else in a log is refused with the field named, and a good one round-trips."""
    good = records.make_plan_record("m", "h1", "cpu -isa=avx2 -threads=1", {}, 1e-3, True,
                                    choices={"fuse_attention": {"on": False, "s": [2e-3, 1e-3]}})
    assert records.PlanRecord.from_json(json.loads(json.dumps(good.to_json()))) == good
    with pytest.raises(records.RecordError, match="plan choices is not"):
        records.PlanRecord.from_json(dict(good.to_json(), choices=choices))


END = {"upto": 96, "code": "1a505e692e596de6ea5a", "above": "2b505e692e596de6ea5a"}


@pytest.mark.parametrize("field, value", [("shapes", {"x": [1, 0]}), ("shapes", {"x": [1, 2.5]}), ("shapes", {"x": "1x8"}),
                                          ("shapes", {"": [1]}), ("shapes", {"x": [1] * 9}), ("shapes", [[1, 8]]),
                                          ("shapes", {"x": [True]}), ("shapes", {"x": [1 << 40]}),
                                          ("shapes", {"x": [1 << 31]}), ("shapes", {"x": [1 << 16, 1 << 16]}),
                                          ("dynamic", "yes"), ("dynamic", 1), ("padded", "true"), ("padded", 0),
                                          ("untuned", "true"), ("untuned", 1), ("untuned", None),
                                          ("ends", {"k": 96}),
                                          *[("ends", {"k": dict(END, **bad)}) for bad in (
                                              {"upto": 0}, {"upto": 96.0}, {"upto": True}, {"upto": 1 << 31},
                                              {"upto": "96); system(\"x\""}, {"code": 5}, {"above": ""},
                                              {"extra": 1})],
                                          ("ends", {"": END}), ("ends", {"k" * 5000: END}), ("ends", [END]),
                                          ("defaults", {"k": 5}), ("defaults", {"": "c0de"}), ("defaults", ["k"]),
                                          ("defaults", {"k": "x" * 5000}),
                                          ("run_time", [["pos"]]), ("run_time", [["pos", 7]]), ("run_time", {"pos": "row"}),
                                          ("run_time", [["", "row"]]), ("run_time", [["pos", "r" * 5000]])])
def test_a_plan_line_whose_shapes_flags_or_ends_are_malformed_is_refused_by_name(field, value):
    """A plan names the input shapes its model was tuned at, whether it is a bucket of a range,
    whether it compiles padded as an untuned compile, how far above it its kernels serve and whether
    its tune timed the untuned compile faster; a good one round-trips, anything else in a log is
    refused with the field named."""
    good = records.make_plan_record("m", "h1", "cpu -isa=avx2 -threads=1", {}, 1e-3, True,
                                    shapes={"input_ids": [1, 64]}, dynamic=True, ends={"a0c302c6a5d30412": END},
                                    padded=True, defaults={"a0c302c6a5d30412": "5f1c0de"}, untuned=True,
                                    run_time=[("pos", "row")])
    assert records.PlanRecord.from_json(json.loads(json.dumps(good.to_json()))) == good
    assert good.to_json()["run_time"] == [["pos", "row"]] and "run_time" not in dataclasses.replace(good, run_time=()).to_json()
    assert good.to_json()["defaults"] == {"a0c302c6a5d30412": "5f1c0de"}
    assert "defaults" not in dataclasses.replace(good, defaults={}).to_json()
    assert good.to_json()["shapes"] == {"input_ids": [1, 64]} and good.to_json()["dynamic"] is True
    assert good.to_json()["padded"] is True and "padded" not in dataclasses.replace(good, padded=False).to_json()
    assert good.to_json()["untuned"] is True and "untuned" not in dataclasses.replace(good, untuned=False).to_json()
    assert good.to_json()["ends"] == {"a0c302c6a5d30412": END}
    widest = dict(good.to_json(), shapes={"x": [(1 << 31) - 1]})          # the most a C int indexes
    assert records.PlanRecord.from_json(widest).shapes == {"x": [(1 << 31) - 1]}
    with pytest.raises(records.RecordError, match=f"plan {field} is not"):
        records.PlanRecord.from_json(dict(good.to_json(), **{field: value}))


def test_records_timed_with_the_weights_cold_are_a_measurement_of_their_own(tuned_log, tmp_path):
    """A tune under RunConfig.cold_weights marks its records cold (written as "weights": "cold"), does
    not resume from warm records (a cold time is not comparable with a warm one), and the apply-best
    rule takes the fastest cold record over a faster warm one."""
    log = tmp_path / "both.jsonl"
    log.write_text(tuned_log.read_text())
    cold_cfg = dataclasses.replace(FAST, cold_weights=True)
    with pytest.warns(UserWarning, match="6 records of these tasks were timed with the weights warm"):
        cold = tune_op(SMALL, target=TARGET1, trials=3, log=str(log), run_config=cold_cfg, progress=False,
                       batch_size=3)
    assert cold.new == 3 and cold.trials == 3 and cold.best.cold
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert [ln.get("weights") for ln in lines] == [None] * 6 + ["cold"] * 3
    c = records.load(log)
    assert [r.cold for r in c.for_task(SMALL.key, str(TARGET1), cold=True)] == [True] * 3
    assert len(c.for_task(SMALL.key, str(TARGET1))) == 6
    with pytest.warns(UserWarning, match="6 records of these tasks were timed with the weights warm"):
        again = tune_op(SMALL, target=TARGET1, trials=3, log=str(log), run_config=cold_cfg, progress=False)
    assert again.new == 0                                   # resumes from its own kind of record
    warm = records.best_of(c.records[:6])
    faster = dataclasses.replace(warm, costs=(min(r.latency for r in c.records) / 10,), code_hash=None)
    assert records.best_of(c.records + [faster]).cold
    assert records.best_of(c.records + [faster]).latency == min(r.latency for r in c.records[6:])
    assert records.best_of(c.records[:6] + [faster]) is faster
    with pytest.raises(records.RecordError, match="weights is not 'warm' or 'cold'"):
        records.Record.from_json(dict(lines[0], weights="tepid"))


def test_a_kernel_timed_twice_counts_as_its_slower_timing(tuned_log):
    """The best of a task is the fastest code by its slowest timing: a kernel whose first timing was
    the fastest of the log but whose second is slow loses to the next code, and the record that
    stands for it is the slow one; a second timing that is faster changes nothing."""
    recs = [r for r in records.load(tuned_log).records if r.ok]
    ranked = records.fastest_that_replay(recs, 2)
    assert len(ranked) == 2 and ranked[0].latency < ranked[1].latency
    lucky, next_best = ranked
    again = dataclasses.replace(lucky, costs=(2 * next_best.latency,), policy=records.CONFIRM)
    assert records.best_of(recs + [again]) is next_best
    standing = records.fastest_that_replay(recs + [again], len(recs))
    assert any(r is again for r in standing) and not any(r is lucky for r in standing)
    held = dataclasses.replace(lucky, costs=(lucky.latency / 2,), policy=records.CONFIRM)
    assert records.best_of(recs + [held]) is lucky


def test_a_heat_outranks_the_logs_fastest_timing_until_the_search_measures_again(tuned_log):
    """A heat (its task's front-runners and default timed side by side, each twice) decides the
    best by each code's slower timing there, over a faster timing logged in another minute; a
    search result logged after it hands the choice back to the log's own ranking; a heat id
    that is not a short string is refused when read."""
    recs = [r for r in records.load(tuned_log).records if r.ok]
    ranked = records.fastest_that_replay(recs, 2)
    assert len(ranked) == 2
    lucky, other = ranked
    heat = [dataclasses.replace(r, costs=(c,), policy=records.CONFIRM, heat="d1")
            for r, c in ((lucky, 3e-3), (other, 2e-3), (other, 2.5e-3), (lucky, 2.2e-3))]
    assert records.best_of(recs + heat) is heat[2]          # other's slower heat timing, 2.5 < 3 ms
    later = [dataclasses.replace(r, heat="d2", costs=(1e-3 if r.code_hash == lucky.code_hash else 4e-3,))
             for r in heat]
    assert records.best_of(recs + heat + later).code_hash == lucky.code_hash   # the last heat counts
    searched = dataclasses.replace(lucky, costs=(lucky.latency,))                # a trial after the heat
    assert records.heat_winner(recs + heat + [searched]) is None
    assert records.best_of(recs + heat + [searched]) is records.first_that_replays(recs + heat + [searched])
    line = heat[0].to_json()
    assert line["heat"] == "d1" and records.Record.from_json(line) == heat[0]
    for bad in (7, "x" * 65):
        with pytest.raises(records.RecordError, match="heat is not a short string"):
            records.Record.from_json(dict(line, heat=bad))


def test_a_faster_record_whose_code_changed_is_applied_without_its_time_and_named(tuned_log, tmp_path):
    """The fastest record's steps now give other code (the generator changed since it was timed):
    its schedule is still the best known, so apply-best takes it, but its time is not promised and
    the compile warning names the task. Steps that no longer apply at all are passed over, and so
    is a stale record whose code today the log has timed itself (that timing ranks it)."""
    lines = [json.loads(ln) for ln in tuned_log.read_text().splitlines()]
    recs = [records.Record.from_json(r) for r in lines]
    fresh_best = min(recs, key=lambda r: r.latency)
    victim = max(recs, key=lambda r: r.latency)
    assert victim.code_hash != fresh_best.code_hash
    rest = [ln for ln, r in zip(lines, recs) if r.code_hash != victim.code_hash]
    stale = dict(victim.to_json(), code_hash="0" * 20, costs=[fresh_best.latency / 2])
    junk = dict(lines[0], steps=[["split", "no_such_stage", "i", [2]]], code_hash="1" * 20, costs=[1e-9])
    log = tmp_path / "log.jsonl"

    def best(logged):
        log.write_text("".join(json.dumps(r) + "\n" for r in logged))
        db = Database.open(str(log), TARGET1, use_shipped=False)
        return db, db.best(SMALL, TARGET1)[0]

    db, rec = best([junk, stale] + rest)
    assert rec is not None and rec.code_hash == stale["code_hash"] and db.is_stale(rec)
    assert [label for label, _ in db.stale.values()] == [SMALL.label]
    assert SMALL.label in db.stale_warning() and "tune them again" in db.stale_warning()
    k = build_op(SMALL, target=TARGET1, log=str(log), use_shipped=False, quiet=True)
    assert k.steps == stale["steps"]
    arrays = [np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32) for shape in k.input_shapes]
    np.testing.assert_allclose(k(*arrays), k.workload.reference(arrays), rtol=1e-4, atol=1e-4)
    for logged in ([stale] + lines, [dict(stale, costs=[fresh_best.latency * 2])] + rest):
        db, rec = best(logged)       # its code timed (slower), or the stale claim slower than the best
        assert rec.code_hash == fresh_best.code_hash and not db.is_stale(rec) and db.stale_warning() == ""
    assert Database.open(str(tuned_log), TARGET1, use_shipped=False).stale_warning() == ""


def test_distill_keeps_the_newest_layout_plan_of_each_model_and_target(tmp_path):
    """A shipped database is a distilled log, and a compile applies the plans it holds: distilling
    keeps each (model, target)'s newest plan beside the best records, and keeps it again when the
    output is distilled into once more; a plan whose tune kept the untuned compile is not shipped."""
    from tuner.analysis.distill import distill
    from tuner.database.result import MeasureResult
    from tuner.ops import make
    from tuner.task import Task
    wl = make("conv2d", dict(N=1, C=8, H=6, W=6, K=8, R=3, S=3, stride=1, pad=1), "NCHW8c")
    task = Task(wl, TARGET1)
    steps = task.space.steps(task.space.default())
    log, out = tmp_path / "log.jsonl", tmp_path / "db.jsonl"
    plan = lambda target, when, layout: records.PlanRecord("m", "h1", target, {"conv": layout}, 1e-3, timestamp=when)  # noqa: E731
    records.append(log, [records.make_record(wl, TARGET1, steps, MeasureResult("OK", "", [1e-3]), task.candidate(steps).code_hash,
                                             "random", 0),
                         plan(str(TARGET1), "2026-11-26T10:00:00+00:00", "NCHW8c"),
                         plan(str(TARGET1), "2026-11-26T11:00:00+00:00", "NCHW16c"),
                         dataclasses.replace(plan(str(TARGET1), "2026-11-26T12:00:00+00:00", "NHWC"), untuned=True),
                         plan("cpu -isa=avx2 -cores=2 -threads=2", "2026-11-26T09:00:00+00:00", "NCHW8c")])
    for _ in range(2):
        assert distill([str(log)], str(out)) == 1
        kept = records.load(out).plans
        assert sorted((p.target, p.layouts["conv"]) for p in kept) == sorted(
            [(str(TARGET1), "NCHW16c"), ("cpu -isa=avx2 -cores=2 -threads=2", "NCHW8c")])


def test_distill_check_plans_replaces_a_plan_the_untuned_compiles_plan_outruns_and_keeps_one_it_does_not(
        tmp_path, monkeypatch):
    """A plan tuned against an older version's defaults: timed whole against the plan an untuned
    compile applies, with the same records, it gives way to that plan (a line marked padded, its
    estimate the time measured) where that is faster, and stays where it is not; a plan of a model
    this host does not have is left as it is."""
    import tuner.model_tuning as mt
    from tuner.analysis.distill import distill
    from tuner.graph import load
    from tuner.graph.ir import graph_digest
    from tuner.graph.layout_plan import default_plan
    from tuner.target import parse_target
    tgt = str(parse_target("cpu", 1))
    graph = load("tiny")
    slow = {"conv1": "NCHW", "conv4": "NCHW8c"}
    assert default_plan(graph, "NCHW16c", parse_target("cpu", 1).lanes) != slow
    log, out = tmp_path / "log.jsonl", tmp_path / "db.jsonl"
    records.append(log, [records.make_plan_record("tiny", graph_digest(graph), tgt, slow, 1e-3, True),
                         records.make_plan_record("no_such_model", "h", tgt, {"c": "NCHW"}, 1e-3, True)])
    for faster, replaced in (("default", True), ("plan", False)):
        seen = []

        def fake(runners, inputs, rounds=5, **kw):
            seen.append((sorted(runners), rounds))
            [r(inputs) for r in runners.values()]            # both compiled models run
            return {k: [1e-3 if k == faster else 2e-3] * rounds for k in runners}

        monkeypatch.setattr(mt, "interleaved", fake)          # whole_times times the compiled models
        lines = []
        assert distill([str(log)], str(out), rounds=4, check_plans=True, progress=lines.append) == 0
        plans = {p.model: p for p in records.load(out).plans}
        assert seen == [(["default", "plan"], 4)] and plans["no_such_model"].layouts == {"c": "NCHW"}
        p = plans["tiny"]
        if replaced:
            assert p.padded and p.layouts == default_plan(graph, "NCHW16c", 16) and p.estimate_s == 1e-3
            assert any("the untuned compile's plan replaces it" in ln and "0.500x paired" in ln for ln in lines)
        else:
            assert not p.padded and p.layouts == slow and any(ln.endswith(": kept") for ln in lines)
        assert any("no_such_model" in ln and "not checked" in ln for ln in lines)
        assert not [q.name for q in tmp_path.iterdir() if ".tmp" in q.name]     # nor its temporary file's lock
        out.unlink()


def test_shipped_records_timed_on_this_kind_of_cpu_come_before_the_general_ones(tuned_log, tmp_path, monkeypatch):
    """Shipped files per kind of CPU (<backend>-<vendor>-<family>-<model>.jsonl): this model's first,
    then its family's nearest model, then the general file; another vendor's or family's never,
    nor any host file for a target of another ISA than this host's."""
    recs = sorted((records.Record.from_json(json.loads(ln)) for ln in tuned_log.read_text().splitlines()),
                  key=lambda r: r.latency)
    assert len({r.code_hash for r in recs}) >= 3
    by_file = {"cpu": recs[0], "cpu-GenuineIntel-6-207": recs[1], "cpu-GenuineIntel-6-143": recs[2],
               "cpu-GenuineIntel-6-85": recs[0], "cpu-AuthenticAMD-6-207": recs[0], "cpu-GenuineIntel-61-207": recs[0]}
    for stem, r in by_file.items():
        (tmp_path / f"{stem}.jsonl").write_text(json.dumps(r.to_json()) + "\n")
    monkeypatch.setattr(records, "shipped_database", lambda target: tmp_path / "cpu.jsonl")
    monkeypatch.setattr(records, "host_kind", lambda: "GenuineIntel-6-207")
    names = [p.stem for p in records.shipped_databases(TARGET1)]
    assert names == ["cpu-GenuineIntel-6-207", "cpu-GenuineIntel-6-143", "cpu-GenuineIntel-6-85", "cpu"]
    for stem in names:
        best, source = Database.open(None, TARGET1).best(SMALL, TARGET1)
        assert source == "shipped" and best.code_hash == by_file[stem].code_hash, stem
        (tmp_path / f"{stem}.jsonl").unlink()
    assert Database.open(None, TARGET1).best(SMALL, TARGET1) == (None, "default")
    (tmp_path / "cpu.jsonl").write_text("")
    (tmp_path / "cpu-GenuineIntel-6-207.jsonl").write_text("")
    other = next(isa for isa in ("sse", "avx2") if isa != TARGET1.isa)
    assert [p.stem for p in records.shipped_databases(f"cpu -isa={other} -cores=2 -threads=1")] == ["cpu"]
    monkeypatch.setattr(records, "host_kind", lambda: "")
    assert [p.stem for p in records.shipped_databases(TARGET1)] == ["cpu"]


@pytest.mark.parametrize("host, order", [
    ("GenuineIntel-6-143", ["6-207", "6-106", "6-85"]),    # Sapphire Rapids: Emerald Rapids' design first
    ("GenuineIntel-6-106", ["6-106", "6-85", "6-207"]),    # its own model, then no design: the nearest number
    ("GenuineIntel-6-108", ["6-106", "6-85", "6-207"]),    # Ice Lake-D: Ice Lake-SP's design
    ("GenuineIntel-6-150", ["6-106", "6-207", "6-85"]),    # a model the table does not know: the nearest number
    ("AuthenticAMD-25-160", ["25-17"]),                     # Zen 4c takes Zen 4's; no other family's
])
def test_shipped_files_of_the_same_core_design_come_before_nearer_model_numbers(host, order, tmp_path, monkeypatch):
    for stem in ("cpu", "cpu-GenuineIntel-6-207", "cpu-GenuineIntel-6-106", "cpu-GenuineIntel-6-85",
                 "cpu-AuthenticAMD-25-17", "cpu-AuthenticAMD-26-2"):
        (tmp_path / f"{stem}.jsonl").write_text("")
    monkeypatch.setattr(records, "shipped_database", lambda target: tmp_path / "cpu.jsonl")
    monkeypatch.setattr(records, "host_kind", lambda: host)
    names = [p.stem for p in records.shipped_databases(TARGET1)]
    assert names == [f"cpu-{host.split('-')[0]}-{o}" for o in order] + ["cpu"]

@pytest.mark.slow
def test_the_shipped_generic_schedules_hold_this_versions_code_on_every_isa_this_host_runs():
    """A change to the C generator leaves the shipped records' times another code's, and every
    compile of a built-in model then warned that they were (27 of ResNet-50's tasks, for a week).
    Where this host can time them: `tuner distill tuner/schedules/cpu.jsonl -o
    tuner/schedules/cpu.jsonl --retime-stale --lower-isa` (docs/records.md)."""
    from tuner.analysis.distill import _runnable_here
    from tuner.target import parse_target
    db = records.load(records.shipped_database(parse_target("cpu")), warn=False)
    groups: dict = {}
    for r in db.records:
        if _runnable_here(r.target, lower_isa=True):
            groups.setdefault((r.workload.key, records.code_target(r.target)), []).append(r)
    assert len(groups) > 100
    stale = [f"{recs[0].workload.spec} {recs[0].target}" for recs in groups.values() if records.best_applicable(recs)[1]]
    assert stale == [], f"{len(stale)} stale, e.g. {stale[:3]}"


def test_no_shipped_record_is_of_a_workload_this_version_defines_otherwise():
    """A redefined operator (the Winograd GEMM over one axis of tiles) takes new workload keys, and the
    shipped records under its old keys apply to nothing: every built-in compile then warned that 3-14
    tasks had no record. `tuner distill` leaves such records out; their workloads are tuned again."""
    from tuner.analysis.distill import _disowned
    shipped = sorted(records.shipped_database(TARGET1).parent.glob("*.jsonl"))
    recs = [r for p in shipped for r in records.load(p, warn=False).records]
    assert len(shipped) >= 3 and len(recs) > 1000
    disowned = sorted({f"{r.workload.spec} [{r.workload.layout}] in {r.target}" for r in recs if _disowned(r)})
    assert disowned == [], f"{len(disowned)}, e.g. {disowned[:3]}"


@pytest.mark.slow
def test_every_task_of_a_shipped_plan_has_a_shipped_record():
    """A compile of a built-in model with its shipped plan finds a record for every task the plan runs
    (in the plan's own file or the generic one), so it does not warn of tasks with no record; a plan
    marked padded (the untuned compile won) runs its Winograd convs with records, the rest padded."""
    from tuner.compiler.compile_model import DEFAULT_LAYOUT
    from tuner.graph import load
    from tuner.graph.layout_plan import model_layouts, padded_graph, winograd_convs
    from tuner.target import parse_target
    general = records.shipped_database(TARGET1)
    every = {(r.workload.key, r.target) for r in records.load(general, warn=False).records if r.ok}
    checked, missing, spaces = 0, [], {}

    def space_of(model: str, plan: dict, padded: bool, lanes: int):     # plans of one model and layouts share one
        key = (model, lanes, padded and tuple(sorted(plan.items())), tuple(sorted(set(plan.values()) - {DEFAULT_LAYOUT})))
        if key not in spaces:
            graph = load(model)
            if padded:
                graph = padded_graph(graph, DEFAULT_LAYOUT, plan, lanes) or graph
            space = model_layouts(graph, (DEFAULT_LAYOUT, *key[3]), lanes)
            spaces[key] = space, {wl.key: wl for wl, _ in space.workloads()}
        return spaces[key]

    for path in sorted(general.parent.glob("cpu*.jsonl")):
        db = records.load(path, warn=False)
        have = every | {(r.workload.key, r.target) for r in db.records if r.ok}
        for p in db.plans:
            plan = winograd_convs(p.layouts) if p.padded else p.layouts
            space, names = space_of(p.model, plan, p.padded, parse_target(p.target, check_host=False).lanes)
            for key in space.used({v: plan.get(v, DEFAULT_LAYOUT) for v in space.domains}):
                checked += 1
                if (key, p.target) not in have and not (p.padded and not names[key].op.startswith("winograd")):
                    missing.append(f"{path.name} {p.model} {p.target}: {names[key].label}")
    assert checked > 500
    assert missing == [], f"{len(missing)} task(s) with no record, e.g. {missing[:3]}"
