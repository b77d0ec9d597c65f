"""`tuner analyze` of a model tune's log: the model view, from a replayed tune (no timing but --compiled)."""
import json
import math

import pytest
from conftest import MODEL_REPLAY, MODEL_REPLAY_LOG, REPLAY_TARGET

import tuner
from tuner.analysis.model_report import analyze_model
from tuner.cli import main
from tuner.database import records
from tuner.errors import UserError
from tuner.graph.models import tiny


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    log = tmp_path_factory.mktemp("model") / "tiny.jsonl"
    res = tuner.tune(target=REPLAY_TARGET, log=str(log), policy="random", replay=str(MODEL_REPLAY_LOG),
                     progress=False, **MODEL_REPLAY)         # the public name of model_tuning.tune_model
    return log, res


def test_the_model_view_prices_the_logged_plan_like_the_tune(tuned):
    log, res = tuned
    [rep] = analyze_model(str(log))
    assert rep.plan == res.record and rep.plan.candidates == MODEL_REPLAY["layouts"]
    assert math.isclose(rep.estimate_s, res.estimate_s) and rep.solved.layouts == res.plan.layouts
    assert rep.trials == MODEL_REPLAY["trials"] == sum(r.trials for r in rep.rows)
    in_plan = {r.workload.key: r.uses for r in rep.rows if r.uses}
    assert in_plan == rep.space.used(res.plan.layouts)
    assert math.isclose(sum(r.uses * r.best_s for r in rep.rows), res.estimate_s)
    assert {c.conv: c.chosen for c in rep.choices} == res.plan.layouts
    assert all(c.costs[c.chosen] <= min(c.costs.values()) * 10 for c in rep.choices)
    assert rep.curve and rep.curve[-1][0] == rep.trials and math.isclose(rep.curve[-1][2], res.estimate_s)
    assert all(a[0] < b[0] and a[1] <= b[1] for a, b in zip(rep.curve, rep.curve[1:]))
    text = rep.table()
    for part in ("tasks of the plan", "layout per convolution", "layout transforms the plan keeps", "budget:"):
        assert part in text


def test_second_timings_of_front_runners_are_not_counted_as_trials(tuned, tmp_path):
    """A model tune times each task's front-runners again (records.CONFIRM): the model view and the
    per-task report count the search's trials only, and price a kernel timed twice at its slower timing."""
    from dataclasses import replace

    from tuner.analysis.report import analyze
    log, res = tuned
    [before] = analyze_model(str(log))
    copy = tmp_path / "confirmed.jsonl"
    copy.write_text(log.read_text())
    plan_keys = {r.workload.key for r in before.rows if r.uses}
    logged = records.load(copy).records
    bests = [records.best_of([x for x in logged if x.workload.key == k]) for k in sorted(plan_keys)]
    again = [replace(r, policy=records.CONFIRM, costs=tuple(c * 1.5 for c in r.costs)) for r in bests if r]
    assert again
    records.append(copy, again)
    [rep] = analyze_model(str(copy))
    assert rep.trials == before.trials == MODEL_REPLAY["trials"] and rep.second_timings == len(again)
    assert [r.trials for r in rep.rows] == [r.trials for r in before.rows]
    assert rep.curve[-1][0] == rep.trials and rep.estimate_s > before.estimate_s
    assert f"(and {len(again)} second timings of front-runners)" in rep.table()
    confirmed = records.load(copy).records
    tasks = {(t.spec, t.layout): t for t in analyze(str(copy)).tasks}
    plain = {(t.spec, t.layout): t for t in analyze(str(log)).tasks}
    assert sum(t.trials for t in tasks.values()) == MODEL_REPLAY["trials"]
    for r in again:
        t, p = tasks[r.workload.spec, r.workload.layout], plain[r.workload.spec, r.workload.layout]
        mine = [x for x in confirmed if x.workload.key == r.workload.key]
        best = records.best_of(mine)        # the kernel timed twice counts as its slower timing
        assert t.trials == p.trials and math.isclose(t.best_latency, best.latency)
        assert [x for x in mine if x.policy != records.CONFIRM][t.best_trial - 1].code_hash == best.code_hash


@pytest.mark.slow
def test_analyze_cli_writes_a_self_contained_html_report_and_times_a_compiled_model(tuned, tmp_path, tmp_cache,
                                                                                    capsys):
    log, res = tuned
    out = tmp_path / "m"
    assert main(["compile", "tiny", "--log", str(log), "--target", REPLAY_TARGET, "-o", str(out)]) == 0
    html = tmp_path / "r.html"
    assert main(["analyze", str(log), "--compiled", str(out), "--html", str(html),
                 "--plot", str(tmp_path / "r.png")]) == 0
    said = capsys.readouterr().out
    assert "compiled model" in said and "against the estimate" in said
    page = html.read_text()
    assert page.count("<table>") == 4 and "data:image/png;base64," in page and "src=\"http" not in page
    [rep] = analyze_model(str(log), compiled=str(out), repeat=2)
    assert rep.compiled["same_plan"] and rep.compiled["measured_s"] > 0
    # every step of the artifact is in one kind; the tuned ones carry what their records logged
    from tuner.runtime import load
    m = load(out)
    kinds = rep.compiled["kinds"]
    assert sum(k.steps for k in kinds.values()) == len(m.steps) > 0
    assert math.isclose(sum(k.logged_s for k in kinds.values()), sum(s.expected_s or 0 for s in m.steps))
    assert any(kind.startswith("conv2d") and k.logged_s > 0 for kind, k in kinds.items())
    assert all(k.alone_s > 0 and k.in_context_s > 0 for k in kinds.values())
    assert "against their records, by kind" in said


def test_names_from_the_log_are_escaped_in_html(tuned, tmp_path):
    log, res = tuned
    hostile = tmp_path / "h.jsonl"
    lines = [ln for ln in log.read_text().splitlines() if '"layout_plan"' not in ln]
    plan = dict(res.record.to_json(), model="<script>alert(1)</script>")
    hostile.write_text("\n".join(lines + [json.dumps(plan)]) + "\n")
    [rep] = analyze_model(str(hostile), model=tiny())
    page = (tmp_path / "h.html")
    rep.html(str(page))
    page = page.read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_the_wrong_model_or_artifact_is_a_one_line_error(tuned, tmp_path, capsys):
    log, _ = tuned
    with pytest.raises(UserError, match="is not the model the log's plan was made for"):
        analyze_model(str(log), model="resnet18")
    moved = tmp_path / "moved.jsonl"          # the plan names an ONNX file that is not here any more
    moved.write_text(log.read_text().replace('"model":"tiny"', '"model":"gone/model.onnx"'))
    with pytest.raises(UserError, match="does not load here .* give the model with --model"):
        analyze_model(str(moved))
    assert len(analyze_model(str(moved), model="tiny")) == 1
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(ln + "\n" for ln in log.read_text().splitlines() if '"layout_plan"' not in ln))
    assert main(["analyze", str(plain), "--html", str(tmp_path / "x.html")]) == 2
    assert main(["analyze", str(log), "--compiled", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert "holds no layout plan" in err and len(err.strip().splitlines()) == 2
    assert records.load(plain).plans == []


def test_the_report_rebuilds_each_tasks_progress_and_duels_as_the_tune_kept_them(tuned):
    from tuner.model_tuning import TaskProgress, equal_effort_losers
    log, res = tuned
    recs = records.load(str(log), warn=False).records
    tasks = res.session.tasks
    assert tasks and all(len(s.curve) == s.trials for s in tasks)
    for s in tasks:
        rebuilt = TaskProgress.from_records(s.workload, [r for r in recs if r.workload.key == s.workload.key])
        assert rebuilt.curve == s.curve and rebuilt.best_latency == s.best_latency
    [rep] = analyze_model(str(log))
    lost = equal_effort_losers(res.space, res.plan.layouts, tasks)
    assert {(c.conv, lay) for c in rep.choices for lay in c.lost} == {
        (v, lay) for v, d in res.space.unary.items() for lay, wls in d.items() if any(w.key in lost for w in wls)}
