"""Learned search: policies in replay mode, the task scheduler, features and the cost model."""
import dataclasses
import json
import math
import os
import random
import re
import signal

import numpy as np
import pytest
from conftest import REPLAY_LOG, REPLAY_TARGET, REPLAY_WORKLOADS, TARGET1

from tuner.cost_model.features import extract, feature_names, num_features
from tuner.cost_model.model import FINETUNE_ROUNDS, RandomModel, XGBModel, normalised_throughput
from tuner.database import records
from tuner.errors import UserError
from tuner.measure.runner import RunConfig
from tuner.ops import make
from tuner.schedule.lower import lower
from tuner.search.scheduler import GradientScheduler, RoundRobinScheduler, TaskProgress
from tuner.target import TargetError, parse_target
from tuner.task import Task
from tuner.te.layouts import CONV_LAYOUTS
from tuner.tuning import tune

(SMALL, _), (OTHER, _) = REPLAY_WORKLOADS
FAST = RunConfig(timeout=5.0, repeat=1, min_repeat_ms=0.5)
POLICIES = ["random", "evolutionary", "optuna:tpe", "optuna:cmaes"]


@pytest.fixture(scope="module")
def measured_log():
    """The checked-in log of 48 measured random schedules of SMALL and 24 of OTHER: the replay source."""
    try:
        parse_target(REPLAY_TARGET)
    except TargetError:
        pytest.skip(f"the replay log is for {REPLAY_TARGET}, which this host cannot read back")
    return REPLAY_LOG


def _replay(measured_log, out, policy, trials, seed=0, workloads=(SMALL,), **kw):
    return tune(list(workloads), target=REPLAY_TARGET, trials=trials, log=str(out), policy=policy, seed=seed,
                replay=str(measured_log), progress=False, batch_size=8, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_policy_respects_budget_never_remeasures_and_resumes(measured_log, tmp_path, policy):
    out = tmp_path / "replayed.jsonl"
    s = _replay(measured_log, out, policy, 12)
    assert s.trials == 12 and len(records.load(out).records) == 12
    s = _replay(measured_log, out, policy, 28)                  # resume: continues where the log ends
    recs = records.load(out).records
    assert s.tasks[0].new == 16 and len(recs) == 28
    hashes = [r.code_hash for r in recs]
    assert len(set(hashes)) == len(hashes)                      # nothing proposed twice, across the resume
    assert all(r.replayed_from == str(measured_log) for r in recs)
    assert any(r.ok for r in recs)
    assert {r.error for r in recs} <= {"OK", "NOT_IN_LOG", "WRONG_ANSWER", "COMPILE_ERROR"}


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_same_seed_same_sequence(measured_log, tmp_path, policy):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    _replay(measured_log, a, policy, 20, seed=3)
    _replay(measured_log, b, policy, 20, seed=3)
    seq = [[r.code_hash for r in records.load(p).records] for p in (a, b)]
    assert seq[0] == seq[1]


def test_replayed_costs_are_the_logged_ones(measured_log, tmp_path):
    out = tmp_path / "r.jsonl"
    _replay(measured_log, out, "random", 16)
    logged = {r.code_hash: r.costs for r in records.load(measured_log).records}
    replayed = [r for r in records.load(out).records if r.error != "NOT_IN_LOG"]
    assert replayed
    for r in replayed:
        assert r.costs == logged[r.code_hash]


def test_a_replay_gives_only_records_timed_as_the_tune_times(measured_log, tmp_path):
    """The checked-in log was timed with the weights warm: a tune that times them cold finds none of
    its candidates there, and says why, rather than taking warm costs for cold ones."""
    from tuner.measure.runner import RunConfig
    out = tmp_path / "cold.jsonl"
    _replay(measured_log, out, "random", 8, run_config=RunConfig(cold_weights=True))
    recs = records.load(out).records
    assert len(recs) == 8 and all(r.error == "NOT_IN_LOG" and r.cold for r in recs)
    assert all("with its weights cold" in r.message for r in recs)


def test_all_failing_task_is_reported_and_the_others_go_on(measured_log, tmp_path):
    """OTHER's every candidate fails here (its log entries are rewritten as wrong answers)."""
    broken = tmp_path / "broken.jsonl"
    recs = records.load(measured_log).records
    recs = [dataclasses.replace(r, error="WRONG_ANSWER", costs=(), message="injected failure")
            if r.workload.key == OTHER.key else r for r in recs]
    records.append(broken, recs)
    s = tune([SMALL, OTHER], target=REPLAY_TARGET, trials=40, log=str(tmp_path / "out.jsonl"), policy="random",
             replay=str(broken), progress=False, batch_size=8)
    small, other = s.tasks
    assert other.all_failed and "every candidate failed" in other.retired
    assert small.errors.get("OK", 0) > 0 and small.trials > other.trials
    assert s.trials == 40


# ---------------------------------------------------------------- scheduler

def _simulate(sched_cls, tasks, rounds, improve):
    sched = sched_cls(tasks)
    picks = []
    for _ in range(rounds):
        k, why = sched.next()
        picks.append(k)
        t = tasks[k]
        best = improve(k, t.rounds)
        sched.record_round(k, best, failures_only=False)
    return picks


def test_gradient_scheduler_spends_more_on_weight_and_headroom():
    # same op and layout, same FLOPs and the same improvement curve; only the weight differs
    tasks = [TaskProgress("light", 1, 1e9, "conv"), TaskProgress("heavy", 4, 1e9, "conv")]
    picks = _simulate(GradientScheduler, tasks, 30, lambda k, r: 0.01 * (1 + 1 / (r + 1)))
    assert picks.count(1) > picks.count(0) >= 1
    # equal weight; task 0 is already at the FLOP rate of its similar task, task 1 far below it
    tasks = [TaskProgress("done", 1, 1e9, "conv"), TaskProgress("headroom", 1, 1e9, "conv")]
    picks = _simulate(GradientScheduler, tasks, 30, lambda k, r: 0.01 if k == 0 else 0.04 * (1 + 1 / (r + 1)))
    assert picks.count(1) > picks.count(0)


def test_round_robin_and_early_stopping():
    tasks = [TaskProgress(f"t{i}", 1, 1e9, "conv") for i in range(3)]
    assert _simulate(RoundRobinScheduler, tasks, 9, lambda k, r: 0.01) == [0, 1, 2] * 3
    tasks = [TaskProgress("flat", 1, 1e9, "conv"), TaskProgress("improving", 1, 1e9, "conv")]
    sched = GradientScheduler(tasks, early_stopping=2)
    for _ in range(12):
        k, _ = sched.next()
        if k is None:
            break
        sched.record_round(k, 0.01 if k == 0 else 0.02 / (tasks[k].rounds + 1), failures_only=False)
    assert tasks[0].retired.startswith("no improvement") and not tasks[1].retired


def test_identical_workloads_are_one_task(measured_log, tmp_path):
    s = tune([(SMALL, 2), (make("conv2d", SMALL.p, "NCHW8c"), 3)], target=REPLAY_TARGET, trials=8,
             log=str(tmp_path / "o.jsonl"), policy="random", replay=str(measured_log), progress=False)
    assert len(s.tasks) == 1 and s.tasks[0].weight == 5


# ---------------------------------------------------------------- features and model

def _all_op_workloads():
    out = [make("dense", dict(N=2, C=24, K=32, bias=1), "OI16o"), make("dense", dict(C=16, K=8), "OI")]
    shape = dict(C=16, H=8, W=8)
    for lay in CONV_LAYOUTS:
        out += [make("conv2d", dict(shape, K=16, R=3, S=3, pad=1, bias=1, residual=1, relu=1), lay),
                make("conv2d", dict(shape, K=16, R=3, S=3, stride=2, pad=1, groups=16), lay),
                make("max_pool2d", dict(shape, R=3, S=3, stride=2, pad=1), lay),
                make("avg_pool2d", dict(shape, R=3, S=3, pad=1), lay), make("global_avg_pool2d", shape, lay),
                make("relu", shape, lay), make("sigmoid", shape, lay), make("add", shape, lay),
                make("layout_transform", dict(shape, dst="NHWC" if lay != "NHWC" else "NCHW"), lay)]
    return out


def test_features_have_fixed_length_and_no_nan_on_every_operator():
    names = feature_names()
    assert len(names) == num_features() == len(set(names))
    rng = random.Random(0)
    for wl in _all_op_workloads():
        task = Task(wl, TARGET1)
        for dec in [task.space.default()] + [task.space.sample(rng) for _ in range(3)]:
            f = extract(lower(task.space.schedule(task.space.steps(dec))), wl.flops)
            assert f.ndim == 2 and f.shape[1] == num_features(), wl.label
            assert np.isfinite(f).all(), wl.label


@pytest.mark.slow
def test_features_see_the_unrolling_and_vector_width_the_c_generator_emits():
    """The C generator unrolls small nests under auto_unroll_max_step and picks the vector width;
    features that guessed otherwise misled the model (dense: 0.856 -> 0.881 pairwise)."""
    names = feature_names()
    col = {n: names.index(f"stmt.{n}") for n in ("num_unroll_loops", "vec_lanes_emitted", "vec_chunks")}
    rng = random.Random(1)
    checked, seen = 0, set()
    avx512 = parse_target("cpu -isa=avx512 -cores=2 -threads=1", check_host=False)   # code only: any host
    for wl in _all_op_workloads():
        task = Task(wl, avx512)
        for dec in [task.space.default()] + [task.space.sample(rng) for _ in range(4)]:
            steps = task.space.steps(dec)
            f = extract(task.lowered(steps), wl.flops, avx512.lanes)
            src = task.candidate(steps).source
            for lanes in {int(x) for x in f[:, col["vec_lanes_emitted"]] if x}:
                assert f"f32x{lanes}" in src, wl.label
                seen.add(lanes)
            # chunks > 1 means log2(1 + chunks) > 1: the chunk loop is unrolled too
            unrolled = (f[:, col["num_unroll_loops"]] > 0).any() or (f[:, col["vec_chunks"]] > 1).any()
            # (`unroll 1` on a loop of more trips keeps it whole: codegen's mark, not unrolling)
            pragmas = re.findall(r"#pragma GCC unroll (\d+)\n\s*for \(int \w+ = 0; \w+ < (\w+);", src)
            assert pragmas or "#pragma GCC unroll" not in src
            assert unrolled == any(n != "1" or t == "1" for n, t in pragmas), (wl.label, dec)
            seen.add(unrolled)
            checked += 1
    assert checked > 50 and {True, False, 8, 16} <= seen


def _dataset(n=60, seed=0):
    task = Task(SMALL, TARGET1)
    rng = random.Random(seed)
    feats = [extract(lower(task.space.schedule(task.space.steps(task.space.sample(rng)))), SMALL.flops)
             for _ in range(n)]
    # a synthetic target that the features determine (so there is something to learn)
    y = np.asarray([1.0 / (1.0 + abs(f[:, 11].max() - 4.0)) for f in feats], np.float32)
    return feats, y


@pytest.mark.parametrize("objective", ["pack-sum", "rank"])
def test_model_save_load_predicts_the_same(tmp_path, objective):
    feats, y = _dataset()
    m = XGBModel(objective, seed=1, rounds=20)
    m.fit(feats, y, ["t"] * len(feats))
    path = tmp_path / f"{objective}.xgb"
    m.save(str(path))
    m2 = XGBModel.load(str(path))
    np.testing.assert_allclose(m.predict(feats), m2.predict(feats), rtol=1e-6)
    assert m2.objective == objective and m2.trained_on == len(feats)


def test_model_learns_a_ranking_better_than_random():
    feats, y = _dataset(120, seed=1)
    train, test = slice(0, 80), slice(80, 120)
    m = XGBModel("pack-sum", seed=0, rounds=40)
    m.fit(feats[train], y[train], ["t"] * 80)
    from tuner.cost_model.metrics import pairwise_accuracy
    acc = pairwise_accuracy(m.predict(feats[test]), y[test])
    rnd = pairwise_accuracy(RandomModel(0).predict(feats[test]), y[test])
    assert acc > 0.75 and acc > rnd


def test_normalised_throughput():
    y = normalised_throughput([2.0, 1.0, math.inf, 4.0], ["a", "a", "a", "b"])
    np.testing.assert_allclose(y, [0.5, 1.0, 0.0, 1.0])


# ---------------------------------------------------------------- transfer (pre-trained models)

def test_pretrained_model_is_fine_tuned_without_changing_the_saved_one(tmp_path):
    feats, y = _dataset(80, seed=2)
    base = XGBModel("pack-sum", seed=0, rounds=20)
    base.fit(feats[:60], y[:60], ["t"] * 60)
    path = tmp_path / "base.ubj"
    base.save(str(path), about={"records": 60, "workloads": ["small"]})
    m = XGBModel.pretrained_from(str(path))
    assert m.pretrained and m.base_info["records"] == 60
    m.fit(feats[:1], y[:1], ["t"])                   # too little to fine-tune: predicts as the saved model
    np.testing.assert_allclose(m.predict(feats[60:]), base.predict(feats[60:]), rtol=1e-6)
    m.fit(feats[60:], y[60:], ["u"] * 20)
    assert m.residual.num_boosted_rounds() == FINETUNE_ROUNDS
    assert m.booster.num_boosted_rounds() == base.booster.num_boosted_rounds()
    assert not np.allclose(m.predict(feats[60:]), base.predict(feats[60:]))
    # the session's trees on the base's cached scores are the trees continued training would add
    import xgboost as xgb
    rows = np.concatenate(feats[60:])
    owner = np.repeat(np.arange(20), [len(f) for f in feats[60:]])
    target = np.log(np.maximum(y[60:], 1e-3))

    def obj(preds, _):
        g = 2.0 * (np.bincount(owner, weights=preds, minlength=20) - target)
        return g[owner].astype(np.float32), np.full(len(rows), 2.0, np.float32)
    continued = xgb.train(dict(m.params, max_depth=4, base_score=0.0, disable_default_eval_metric=1),
                          xgb.DMatrix(rows), FINETUNE_ROUNDS, obj=obj, xgb_model=base.booster)
    want = np.bincount(owner, weights=continued.predict(xgb.DMatrix(rows)), minlength=20)
    np.testing.assert_allclose(m.predict(feats[60:]), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="fine-tuned"):
        m.save(str(tmp_path / "session.ubj"))
    np.testing.assert_allclose(XGBModel.load(str(path)).predict(feats[60:]), base.predict(feats[60:]), rtol=1e-6)


def test_model_trained_on_other_features_is_refused(tmp_path):
    import json
    feats, y = _dataset(20)
    m = XGBModel("pack-sum", rounds=5)
    m.fit(feats, y, ["t"] * 20)
    path = tmp_path / "old.ubj"
    m.save(str(path))
    meta = json.loads((tmp_path / "old.ubj.meta.json").read_text())
    meta["features"] = "0000000000000000"
    (tmp_path / "old.ubj.meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="tuner pretrain"):
        XGBModel.load(str(path))
    with pytest.raises(UserError, match="no cost model"):
        XGBModel.load(str(tmp_path / "missing.ubj"))


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_shipped_pretrained_model_loads_with_these_features(isa):
    """A feature change without retraining the shipped models fails here, not in a user's search."""
    from tuner.cost_model.pretrain import shipped_model
    from tuner.target import parse_target
    path = shipped_model(parse_target(f"cpu -isa={isa} -threads=1", check_host=False))
    assert path is not None and path.stem == f"cpu-{isa}", f"tuner/cost_model/pretrained/cpu-{isa}.ubj is missing"
    m = XGBModel.pretrained_from(str(path))
    feats, _ = _dataset(8)
    assert np.isfinite(m.predict(feats)).all() and m.base_info["records"] > 1000


def test_the_shipped_gpu_model_ranks_the_shipped_gpu_schedules_and_stands_in_for_other_gpus():
    from tuner.cost_model.dataset import FeatureCache, from_records
    from tuner.cost_model.pretrain import shipped_model
    from tuner.database import records
    from tuner.search.evolutionary import shared_model
    sm90 = parse_target("cuda -arch=sm_90")
    path = shipped_model(sm90)
    assert path is not None and path.stem == "cuda-sm_90", "tuner/cost_model/pretrained/cuda-sm_90.ubj is missing"
    recs = records.load(str(records.shipped_database(sm90)), warn=False).records
    feats, lats, _ = from_records(recs, FeatureCache())
    assert len(feats) == len(recs) >= 8
    m = XGBModel.pretrained_from(str(path))
    assert np.isfinite(m.predict(feats)).all() and m.base_info["records"] > 1000
    sm80 = parse_target("cuda -arch=sm_80")
    assert shipped_model(sm80).stem == "cuda-sm_90"
    assert "the cuda-sm_90 model stands in" in shared_model(sm80, 0, None).describe()
    assert "stands in" not in shared_model(sm90, 0, None).describe()


def test_an_isa_without_a_shipped_model_gets_a_stand_in_and_says_so():
    from tuner.cost_model.pretrain import shipped_model
    from tuner.search.evolutionary import shared_model
    sse = parse_target("cpu -isa=sse -cores=2 -threads=1", check_host=False)
    assert shipped_model(sse).stem == "cpu-avx2"
    shared = shared_model(sse, 0, None)
    assert shared.model.pretrained and "the cpu-avx2 model stands in" in shared.describe()
    own = shared_model(parse_target("cpu -isa=avx2 -cores=2 -threads=1", check_host=False), 0, None)
    assert own.model.pretrained and "stands in" not in own.describe()
    assert not shared_model(sse, 0, ["none"]).model.pretrained


@pytest.mark.slow
def test_pretrain_leaves_out_excluded_workloads_and_tune_starts_from_it(measured_log, tmp_path, capsys):
    from tuner.cli import main
    from tuner.cost_model.pretrain import pretrain
    model, summary = pretrain([measured_log], exclude={SMALL.key}, progress=False)
    assert summary["workloads"] == [OTHER.spec] and summary["records"] == 24
    with pytest.raises(ValueError, match="left out"):
        pretrain([measured_log], exclude={SMALL.key, OTHER.key}, progress=False)
    path = tmp_path / "other.ubj"
    assert main(["pretrain", str(measured_log), "-o", str(path), "--exclude", SMALL.key, "--no-progress"]) == 0
    assert "trained on 24 records of 1 workloads" in capsys.readouterr().out
    out = tmp_path / "from-pretrained.jsonl"
    s = _replay(measured_log, out, "evolutionary", 16, cost_model_from=[str(path)])
    assert s.trials == 16 and "pre-trained on 24 records" in capsys.readouterr().out
    recs = records.load(out).records
    assert len({r.code_hash for r in recs}) == 16 and any(r.ok for r in recs)


class _CutTask:
    """A FirstLookCut that probes every look with 2 candidates and stops the look of task `k`."""

    def __init__(self, k):
        self.k, self.asked = k, []

    def probe(self, tasks, k):
        return 2

    def go_on(self, tasks, k):
        self.asked.append((k, tasks[k].trials))
        return k != self.k


@pytest.mark.parametrize("cut_task", [None, 0, 1])
def test_a_first_look_cut_after_its_probe_measures_no_more_and_gives_its_rest_back(measured_log, tmp_path, cut_task):
    """The rest of a look is measured only where go_on says so, asked once the probe's results are
    in; what is cut is neither measured nor spent on other rounds: the session ends sooner."""
    out = tmp_path / "cut.jsonl"
    cut = _CutTask(cut_task)
    s = _replay(measured_log, out, "random", 16, workloads=(SMALL, OTHER), warmup_batch=8, scheduler="round-robin",
                first_look_cut=cut)
    keys = [r.workload.key for r in records.load(out).records]
    counts = [keys.count(wl.key) for wl in (SMALL, OTHER)]
    assert sorted(cut.asked) == [(0, 2), (1, 2)]           # each asked once, its two probe results in
    assert counts == [2 if k == cut_task else 8 for k in range(2)]
    assert s.trials == len(keys) == sum(counts)
    assert keys[:2] == [SMALL.key] * 2 and len(set(keys[:counts[0]])) == 1     # a look's batches stay together


@pytest.mark.slow
def test_a_first_look_larger_than_the_policys_first_batch_is_measured_whole(measured_log, tmp_path):
    """With a pre-trained model, evolutionary search proposes small first batches (8); a task whose
    first look is 16 (a Winograd GEMM in a model tune) still gets all 16 in its first round."""
    from tuner.cost_model.pretrain import pretrain
    model, _ = pretrain([measured_log], exclude={SMALL.key}, progress=False)
    path = tmp_path / "other.ubj"
    model.save(str(path))
    out = tmp_path / "looks.jsonl"
    s = _replay(measured_log, out, "evolutionary", 32, workloads=(SMALL, OTHER), cost_model_from=[str(path)],
                warmup_batch=lambda wl: 16, scheduler="round-robin")
    keys = [r.workload.key for r in records.load(out).records]
    assert s.trials == 32 and len(keys) == 32
    assert len(set(keys[:16])) == 1 and len(set(keys[16:])) == 1 and keys[0] != keys[16]


def test_int_and_float_constants_are_different_expressions():
    from tuner.te.expr import Add, Const, Var, linear
    assert Const(1) != Const(1.0) and Const(1) == Const(1)
    assert linear(Add(Var("i"), Const(1))) == ({Var("i"): 1}, 1)
    assert linear(Add(Var("i"), Const(1.0))) is None         # the memo of the int form must not answer


@pytest.mark.slow
def test_evolutionary_batch_keeps_the_structure_the_model_ranks_second():
    """A model that always prefers one pad placement (the interior version: the most store
    statements) still gets every other placement measured, each a share of the batch."""
    from tuner.search.evolutionary import EvolutionarySearch, SharedModel
    from tuner.space.sketch import PAD_PLACES

    class PrefersMoreStatements:    # more store statements: more rows, higher score
        name, pretrained, trained_on = "stub", True, 0

        def fit(self, *args):
            pass

        def predict(self, feats):
            return np.asarray([float(len(f)) for f in feats])

    task = Task(SMALL, TARGET1)
    search = EvolutionarySearch(task, seed=0, shared=SharedModel(PrefersMoreStatements()), first_batches=0)
    batch = search.propose(16, set())
    pads = [c.decisions["pad"]["conv_pad"] for c in batch if c.decisions and "pad" in c.decisions]
    assert set(pads) == set(PAD_PLACES)
    assert all(pads.count("interior") > pads.count(p) for p in PAD_PLACES if p != "interior")


def test_feature_pool_computes_what_the_search_would_and_marks_illegal_schedules():
    """Worker processes featurise a share of the candidates; the numbers must be the caller's own."""
    import warnings

    from tuner.cost_model.dataset import FeatureCache
    from tuner.cost_model.parallel import FeaturePool

    task, other = Task(SMALL, TARGET1), Task(SMALL, TARGET1)
    rng = random.Random(1)
    steps = [task.space.steps(task.space.sample(rng)) for _ in range(40)]
    broken = [["split", "no_such_stage", "x", [2]]]
    pool = FeaturePool([task], workers=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")        # a worker given up on would warn
            got = FeatureCache().of_many(task, steps[:30] + [broken] + steps[30:] + [None], pool)  # broken: a worker's
            again = FeatureCache().of_many(other, steps[:3], pool)       # a task the workers do not hold
        assert pool.alive
    finally:
        pool.close()
    want = [extract(lower(task.space.schedule(s)), SMALL.flops) for s in steps]
    assert got[30] is None and got[-1] is None and len(got) == 42
    for g, w in zip(got[:30] + got[31:41], want):
        np.testing.assert_array_equal(g, w)
    for g, w in zip(again, want[:3]):
        np.testing.assert_array_equal(g, w)


@pytest.mark.slow
@pytest.mark.parametrize("signum, why", [(signal.SIGSTOP, "gave no answer"), (signal.SIGKILL, "is gone|died")])
def test_a_hung_or_dead_feature_worker_costs_a_timeout_not_the_search(monkeypatch, signum, why):
    """A worker that never answers (stopped, as one waiting on a lock would be) is given up on
    after TIMEOUT, one that died at once; the caller featurises its share, and every later call
    too, with the same numbers, and no worker process is left behind."""
    from tuner.cost_model import parallel

    task = Task(SMALL, TARGET1)
    rng = random.Random(2)
    steps = [task.space.steps(task.space.sample(rng)) for _ in range(20)]
    monkeypatch.setattr(parallel.FeaturePool, "TIMEOUT", 1.0)
    pool = parallel.FeaturePool([task], workers=1)
    proc = pool.workers[0].proc
    try:
        os.kill(proc.pid, signum)
        if signum == signal.SIGKILL:
            proc.wait()
        with pytest.warns(RuntimeWarning, match=why):
            got = pool.map(task, steps)
        assert not pool.alive and proc.poll() is not None
        later = pool.map(task, steps[:16])
    finally:
        pool.close()
    want = [extract(lower(task.space.schedule(s)), SMALL.flops) for s in steps]
    assert len(got) == 20 and len(later) == 16
    for g, w in zip(got + later, want + want[:16]):
        np.testing.assert_array_equal(g, w)


def test_feature_pool_does_not_outlive_a_runner_that_fails_to_start(monkeypatch, tmp_path):
    import tuner.measure.runner
    from tuner.cost_model import parallel

    def broken_runner(*_):
        raise RuntimeError("no runner today")

    started = []
    real_init = parallel.FeaturePool.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        started.extend(w.proc for w in self.workers)

    monkeypatch.setattr(parallel.FeaturePool, "__init__", init)
    monkeypatch.setitem(tuner.measure.runner.RUNNERS, "cpu", broken_runner)
    with pytest.raises(RuntimeError, match="no runner today"):
        tune([SMALL], target=TARGET1, trials=4, log=str(tmp_path / "x.jsonl"), policy="evolutionary",
             progress=False, cost_model_from=["none"])
    # closed: its workers were started and are gone
    assert started and all(proc.poll() is not None for proc in started)


def test_a_depthwise_conv_is_held_to_depthwise_rates_not_a_dense_convs():
    """The optimistic bound compares FLOP rates within a family: a depthwise conv far below a
    dense conv's rate is not promised that rate. (With one family for both and no stall rule, the
    big depthwise conv took 56 of these 60 rounds.)"""
    from tuner.search.scheduler import family
    dense = make("conv2d", dict(C=64, H=28, W=28, K=64, R=1, S=1), "NCHW8c")
    dw = make("conv2d", dict(C=96, H=112, W=112, K=96, R=3, S=3, stride=2, pad=1, groups=96), "NCHW8c")
    assert family(dense) != family(dw) and family(dw).endswith("/depthwise")
    assert family(make("conv2d", dict(C=16, H=8, W=8, K=32, R=3, S=3, pad=1, groups=4), "NCHW")).endswith("/grouped")

    def picks(tags):
        # MobileNetV2's figures at 1 thread: 1x1 convs near 170 GFLOPS, still improving a little;
        # its biggest depthwise conv flat at 27 GFLOPS (0.2 ms) from its first look
        flops = [21.7e6] * 4 + [dw.flops]
        tasks = [TaskProgress(f"t{k}", 1, f, tag) for k, (f, tag) in enumerate(zip(flops, tags))]
        return _simulate(GradientScheduler, tasks, 60,
                         lambda k, r: flops[k] / (27e9 if k == 4 else 170e9 * (1 + 0.01 * r)))
    split = picks([family(dense)] * 4 + [family(dw)])
    assert split.count(4) < 25 and all(split.count(k) >= 7 for k in range(4)), split


def test_a_task_that_stopped_improving_loses_the_promise_of_its_familys_rate():
    """Within the depthwise family the small convs reach 60 GFLOPS, the big one stays at 27: once
    its best has not moved for a window of rounds, the family's rate no longer draws rounds to it."""
    flops = [21.7e6] * 4 + [5.42e6, 1.35e6]
    tags = ["dense"] * 4 + ["depthwise"] * 2
    tasks = [TaskProgress(f"t{k}", 1, f, tag) for k, (f, tag) in enumerate(zip(flops, tags))]
    rate = [170e9] * 4 + [27e9, 60e9]
    picks = _simulate(GradientScheduler, tasks, 80, lambda k, r: flops[k] / (rate[k] * (1 + 0.01 * r * (k < 4))))
    assert picks.count(4) < 25 and all(picks.count(k) >= 10 for k in range(4)), picks


class _Prefers:
    """A stub cost model scoring `score` the candidates whose features are `liked`'s, 0 the others."""
    pretrained = True

    def __init__(self, liked, score: float = 1.0):
        self.liked, self.score = liked, score

    def predict(self, feats):
        return np.array([self.score if np.array_equal(f, self.liked) else 0.0 for f in feats])


@pytest.mark.predict
def test_the_cost_models_pick_is_the_candidate_it_ranks_first_among_the_default_seeds_and_a_sample():
    """search.predict.pick: a step list logged on another target (a seed) is among the candidates,
    and so is the default; whichever the model scores highest is the pick; a seed this space cannot
    lower is passed over."""
    from tuner.search.predict import pick
    task = Task(SMALL, TARGET1)
    seed = task.space.steps(task.space.sample(random.Random(5)))
    default = task.space.steps(task.space.default())
    bad = [["split", "no_such_stage", "x", [2]]]
    feats = lambda steps: extract(lower(task.space.schedule(steps)), task.workload.flops)   # noqa: E731
    assert pick(task, _Prefers(feats(seed)), [bad, seed]) == seed
    assert pick(task, _Prefers(feats(default)), [bad, seed]) == default
    assert pick(task, XGBModel.pretrained_from(str(_shipped())), [seed]) == \
        pick(task, XGBModel.pretrained_from(str(_shipped())), [seed])      # deterministic


@pytest.mark.predict
def test_the_cost_models_pick_replaces_the_default_only_where_it_expects_a_margin_over_it():
    """Its scores are log throughputs: a seed scored a little above the default (less than
    MARGIN times its throughput) leaves the default in place; one scored above the margin is taken."""
    from tuner.search.predict import MARGIN, pick
    task = Task(SMALL, TARGET1)
    seed = task.space.steps(task.space.sample(random.Random(5)))
    default = task.space.steps(task.space.default())
    feats = lambda steps: extract(lower(task.space.schedule(steps)), task.workload.flops)   # noqa: E731
    assert seed != default and MARGIN > 1
    below, above = np.log(MARGIN) * 0.9, np.log(MARGIN) * 1.1
    assert pick(task, _Prefers(feats(seed), below), [seed]) == default
    assert pick(task, _Prefers(feats(seed), above), [seed]) == seed
    assert pick(task, _Prefers(feats(seed), below), [seed], margin=1.0) == seed


def _shipped():
    from tuner.cost_model.pretrain import shipped_model
    path = shipped_model(TARGET1)
    if path is None:
        pytest.skip(f"no pre-trained cost model ships for {TARGET1}")
    return path


def test_the_database_seeds_a_pick_with_the_records_of_other_targets_only(tmp_path):
    """Database.elsewhere: the fastest records of the workload on another ISA or thread count, not
    the target's own (those are its records) nor another workload's."""
    from tuner.database.result import MeasureResult
    from tuner.database.union import Database
    own = parse_target("cpu -isa=avx2 -threads=1", check_host=False)     # the same on any host
    task = Task(SMALL, own)
    rng = random.Random(0)
    log = tmp_path / "log.jsonl"
    rows = []
    for k, target in enumerate(["cpu -isa=avx2 -threads=2", "cpu -isa=avx2 -threads=2", "cpu -isa=avx2 -threads=2",
                                "cpu -isa=avx512 -threads=1", str(own)]):
        steps = task.space.steps(task.space.sample(rng))
        rec = records.make_record(SMALL, parse_target(target, check_host=False), steps,
                                  MeasureResult("OK", "", [1e-3 * (k + 1)]), "h", "random", k)
        rows.append((target, steps))
        records.append(str(log), [rec])
    other = Task(OTHER, own)
    records.append(str(log), [records.make_record(OTHER, parse_target("cpu -isa=avx512 -threads=1", check_host=False),
                                                 other.space.steps(other.space.default()),
                                                  MeasureResult("OK", "", [1e-4]), "h", "random", 9)])
    got = [r.steps for r in Database.open([log], own, use_shipped=False).elsewhere(SMALL, own, per_target=2)]
    assert got == [rows[0][1], rows[1][1], rows[3][1]]     # the two fastest at 2 threads, the AVX-512 one


def test_a_cost_model_picks_only_for_the_isa_and_thread_count_it_was_trained_on(tmp_path):
    """search.predict.trained_for reads the model's .meta.json: a model trained at 1 thread does not
    pick 2-thread schedules (it never saw what a parallel loop is worth), nor another ISA's."""
    from tuner.search.predict import trained_for
    path = tmp_path / "cpu-avx2.ubj"
    from tuner.space.sketch import SPACE_VERSION
    (tmp_path / "cpu-avx2.ubj.meta.json").write_text(json.dumps({"targets": ["cpu -isa=avx2 -cores=2 -threads=1"],
                                                                 "space": SPACE_VERSION}))
    assert trained_for(path, parse_target("cpu -isa=avx2 -cores=16 -threads=1", check_host=False))
    assert not trained_for(path, parse_target("cpu -isa=avx2 -cores=2 -threads=2", check_host=False))
    assert not trained_for(path, parse_target("cpu -isa=avx512 -cores=2 -threads=1", check_host=False))
    assert not trained_for(tmp_path / "missing.ubj", parse_target("cpu -isa=avx2 -threads=1", check_host=False))


def test_a_cost_model_trained_on_another_version_of_the_cpu_space_does_not_pick(tmp_path):
    """A model whose metadata names no space version, or an older one, never learnt the structures
    the space has since gained (pad: interior, the default's): it picks nothing."""
    from tuner.search.predict import trained_for
    from tuner.space.sketch import SPACE_VERSION
    target = parse_target("cpu -isa=avx2 -cores=2 -threads=1", check_host=False)
    path = tmp_path / "cpu-avx2.ubj"
    for space, ok in ((None, False), (SPACE_VERSION - 1, False), (SPACE_VERSION, True)):
        meta = {"targets": [str(target)], **({"space": space} if space is not None else {})}
        (tmp_path / "cpu-avx2.ubj.meta.json").write_text(json.dumps(meta))
        assert trained_for(path, target) is ok


def test_a_cost_model_picks_only_for_operators_it_learnt_from_enough_workloads_of():
    """operators_seen: the shipped AVX2 model learnt CNN tunes (convolutions, Winograd, pools, two
    one-row dense layers), so it picks convolutions' schedules and leaves dense and batch_matmul
    (BERT's GEMMs, which its picks made 2.4x slower) to their defaults; names and old log names
    count as their operators."""
    from tuner.cost_model.pretrain import PRETRAINED_DIR
    from tuner.search.predict import MIN_SEEN, operators_seen
    path = PRETRAINED_DIR / "cpu-avx2.ubj"
    seen = operators_seen(path)
    assert {"conv2d", "max_pool2d"} <= seen and not {"dense", "batch_matmul"} & seen and MIN_SEEN > 2


def test_a_fresh_tune_tries_the_tasks_record_of_another_thread_count_right_after_the_default(tmp_path):
    """A task with no records for this thread count starts with its default and then the decisions
    of its best record for another thread count of the ISA (here 1 thread, the tune at 2), rendered
    by this target's space; a resumed task does not (its log is its start)."""
    from tuner.database.result import MeasureResult
    two = parse_target("cpu", threads=2)
    one = parse_target(f"cpu -isa={two.isa} -cores=2 -threads=1", check_host=False)
    task1, task2 = Task(SMALL, one), Task(SMALL, two)
    rng = random.Random(3)
    dec = next(d for d in (task1.space.sample(rng) for _ in range(50))
               if task2.space.steps(d) != task2.space.steps(task2.space.default()))
    steps = task1.space.steps(dec)
    log = tmp_path / "log.jsonl"
    records.append(str(log), [records.make_record(SMALL, one, steps, MeasureResult("OK", "", [1e-3]),
                                                  task1.candidate(steps).code_hash, "random", 0, decisions=dec)])
    tune([SMALL], two, log=str(log), trials=2, policy="random", progress=False)
    mine = [r for r in records.load(log).records if r.target == str(two)]
    assert [r.decisions for r in mine] == [task2.space.default(), dec]
    assert mine[1].steps == task2.space.steps(dec) and any(s[-1] == "parallel" for s in mine[1].steps)
    tune([SMALL], two, log=str(log), trials=4, policy="random", progress=False)
    assert sum(r.decisions == dec for r in records.load(log).records if r.target == str(two)) == 1


def test_a_first_look_proposes_no_more_than_asked_even_with_seeds_from_another_thread_count():
    """The default and the task's seeds open its first look, but only as many as the look asks for,
    and those left out are not marked seen: a first look longer than its share took the budget of
    the last tasks' first looks (compile --quick measured nothing of them)."""
    from tuner.search.random_search import RandomSearch
    task = Task(SMALL, TARGET1)
    rng = random.Random(3)
    task.seeds = [task.space.sample(rng) for _ in range(3)]
    seen: set = set()
    one = RandomSearch(task).propose(1, seen, first=True)
    assert [c.code_hash for c in one] == [task.default_candidate().code_hash] and len(seen) == 1
    rest = RandomSearch(task).default_if_new(seen, 10)
    assert 1 <= len(rest) <= 3 and task.default_candidate().code_hash not in {c.code_hash for c in rest}


def test_a_small_space_drawn_again_and_again_lowers_each_point_once():
    """Random proposals of a task with fewer distinct schedules than asked for (a Winograd output
    transform's table space) lower every point drawn once, however often it is drawn again, and
    still return every distinct schedule the draws reach, each once."""
    from tuner.search.random_search import RandomSearch
    task = Task(make("winograd_output", dict(H=14, W=14, K=32, pad=1, bias=1, relu=1), "NCHW16c"), TARGET1)
    lowered = []
    real = task.from_decisions
    task.from_decisions = lambda dec: lowered.append(json.dumps(dec, sort_keys=True)) or real(dec)
    seen: set = set()
    out = RandomSearch(task, seed=1).propose(64, seen)
    assert 0 < len(out) < 64 and len({c.code_hash for c in out}) == len(out) == len(seen)
    assert len(lowered) == len(set(lowered)) < 64 * 50        # every draw beyond the first is free


def test_a_first_look_of_the_default_alone_ranks_nothing():
    """An evolutionary first look of one candidate (a layout transform's, or compile --quick 1) is
    the default schedule, with no cost-model ranking of a pool it would throw away."""
    from tuner.search.evolutionary import EvolutionarySearch, SharedModel

    class Counts:
        name, pretrained, trained_on, calls = "stub", True, 0, 0

        def fit(self, *args):
            pass

        def predict(self, feats):
            Counts.calls += 1
            return np.zeros(len(feats))

    task = Task(SMALL, TARGET1)
    search = EvolutionarySearch(task, seed=0, shared=SharedModel(Counts()))
    assert [c.code_hash for c in search.propose(1, set(), first=True)] == [task.default_candidate().code_hash]
    assert Counts.calls == 0
    assert len(search.propose(4, set())) == 4 and Counts.calls > 0
