"""The HParams tab of an experiment with several trainers, as TensorBoard itself serves it.

Short real comparisons write the experiment folder; TensorBoard's own data
pipeline (event multiplexer, data provider) loads it and the hparams plugin's
``/experiment`` and ``/session_groups`` routes answer, as for a TensorBoard
pointed at the experiment folder.
"""

import json
import statistics

import pytest
import werkzeug.test
from tensorboard.backend.event_processing.data_provider import MultiplexerDataProvider
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import metadata
from tensorboard.plugins.hparams.hparams_plugin import HParamsPlugin

from gradengines.trainers.cli import compare_main
from gradengines.trainers.run.hparams import CONFIG_FILE, experiment_config, session_hparams, session_metrics
from gradengines.trainers.run.logger import read_metrics

FLAGS = ["--task", "digits", "--model", "mlp", "--orthogonal", "bjorck", "--depth", "2", "--width", "8",
         "--steps", "3", "--grad-agreement-every", "2", "--seeds", "0,1", "--progress", "false", "--experiment", "exp"]
RUNS = {"backprop": "backprop", "foton": "foton", "foton-T2": "foton", "pepita": "pepita"}  # run -> trainer
SESSIONS = sorted(f"{run}/seed{seed}" for run in RUNS for seed in (0, 1))
METRICS = ["best_val_accuracy", "final_val_accuracy", "test_accuracy", "timed_step_ms", "step_ms", "grad_cosine"]
STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """One experiment folder from two comparisons: three trainers, then one more foton run."""
    logdir = tmp_path_factory.mktemp("runs")
    assert compare_main([*FLAGS, "--logdir", str(logdir), "--trainers", "backprop,foton,pepita"]) == 0
    assert compare_main([*FLAGS, "--logdir", str(logdir), "--trainers", "foton", "--foton-temperature", "2",
                         "--run-name", "foton-T2"]) == 0
    return logdir / "exp"


def _multiplexer(logdir) -> EventMultiplexer:
    multiplexer = EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    return multiplexer


def _serve(logdir, route: str, request: dict) -> dict:
    """The JSON that TensorBoard pointed at ``logdir`` answers on ``/data/plugin/hparams/<route>``."""
    multiplexer = _multiplexer(logdir)
    context = base_plugin.TBContext(logdir=str(logdir), multiplexer=multiplexer,
                                    data_provider=MultiplexerDataProvider(multiplexer, str(logdir)))
    app = HParamsPlugin(context).get_plugin_apps()[f"/{route}"]
    response = werkzeug.test.Client(app).post("/", data=json.dumps(request))
    assert response.status_code == 200, response.get_data(as_text=True)
    return json.loads(response.get_data())


def _record(experiment, session: str) -> dict:
    return json.loads((experiment / session / "result.json").read_text())


def test_one_configuration_in_the_experiment_folder_and_one_session_per_run(experiment):
    assert [p.name for p in experiment.iterdir() if "tfevents" in p.name] == [CONFIG_FILE]
    tags = _multiplexer(experiment).PluginRunToTagToContent(metadata.PLUGIN_NAME)
    assert [run for run, t in tags.items() if metadata.EXPERIMENT_TAG in t] == ["."]
    assert sorted(run for run, t in tags.items() if metadata.SESSION_START_INFO_TAG in t) == SESSIONS
    assert sorted(run for run, t in tags.items() if metadata.SESSION_END_INFO_TAG in t) == SESSIONS


def _label(info: dict) -> str:
    """A column's header in the HParams tab: its display name, else its name."""
    return info.get("displayName") or info["name"]


def test_experiment_lists_every_trainer_run_and_engine_option(experiment):
    served = _serve(experiment, "experiment", {})["hparamInfos"]
    infos = {_label(h): h for h in served}
    assert infos["trainer"]["domainDiscrete"] == ["backprop", "foton", "pepita"]
    assert infos["run"]["domainDiscrete"] == sorted(RUNS)
    assert infos["foton.temperature"]["domainDiscrete"] == [1.0, 2.0]
    assert {"foton.mode", "pepita.variant", "pepita.feedback_scale", "model.depth", "lr", "optimizer"} <= set(infos)
    assert infos["lr"]["type"] == "DATA_TYPE_FLOAT64" and infos["optimizer"]["type"] == "DATA_TYPE_STRING"
    # differs: exactly where the runs' values differ (engine recipes set lr, optimizer, ... per trainer)
    values = {}
    for session in SESSIONS:
        for name, value in session_hparams(_record(experiment, session)).items():
            values.setdefault(name, set()).add(value)
    assert {h["name"]: h.get("differs", False) for h in served} == {n: len(v) > 1 for n, v in values.items()}
    assert {"trainer", "run", "seed", "foton.temperature"} <= {_label(h) for h in served if h.get("differs")}
    assert not infos["task"].get("differs") and not infos["model.depth"].get("differs")
    # the tab shows the first five after a stable sort putting differing hparams first
    shown = [_label(h) for h in sorted(served, key=lambda h: not h.get("differs"))][:5]
    assert shown[:3] == ["run", "trainer", "optimizer"]


def test_experiment_metrics(experiment):
    metrics = _serve(experiment, "experiment", {})["metricInfos"]
    assert [m["name"]["tag"] for m in metrics] == [f"hparam/{k}" for k in METRICS]
    assert all(m["displayName"] for m in metrics)


def test_session_groups_hold_each_run_with_its_values(experiment):
    infos = _serve(experiment, "experiment", {})["hparamInfos"]
    # as the HParams tab asks by default: every value of every discrete column checked
    columns = [{"hparam": h["name"], "filterDiscrete": h["domainDiscrete"]} for h in infos if "domainDiscrete" in h]
    groups = _serve(experiment, "session_groups", {"startIndex": 0, "sliceSize": 100, "allowedStatuses": STATUSES,
                                                     "colParams": columns})["sessionGroups"]
    assert sorted(s["name"] for g in groups for s in g["sessions"]) == SESSIONS
    for group in groups:
        (session,) = group["sessions"]
        assert group["name"] == session["name"]  # a group per session, named after its run
        record = _record(experiment, session["name"])
        assert group["hparams"]["_trainer"] == RUNS[record["run"]] == record["trainer"]
        assert group["hparams"] == session_hparams(record)
        assert group["hparams"]["_trainer_optimizer"] == record["config"]["optimizer"]
        # options the run's optimizer or schedule never reads are blank, not shown as defaults
        assert ("momentum" in group["hparams"]) == (record["config"]["optimizer"] == "sgd")
        assert not {"warmup_steps", "step_size", "gamma"} & set(group["hparams"])  # constant schedule
        assert session["status"] == "STATUS_SUCCESS"
        served = {m["name"]["tag"]: m["value"] for m in session["metricValues"]}
        assert served == pytest.approx({f"hparam/{k}": v for k, v in record["summary"].items()}, rel=1e-6)


def test_result_summary(experiment):
    for session in SESSIONS:
        record, history = _record(experiment, session), read_metrics(experiment / session)
        assert list(record["summary"]) == METRICS
        assert record["summary"]["best_val_accuracy"] == record["best_val"]["accuracy"]
        assert record["summary"]["final_val_accuracy"] == record["final_val"]["accuracy"]
        assert record["summary"]["test_accuracy"] == record["test"]["accuracy"]
        # two clocks, each named: the comparison's round-robin timing (what compute times use) and the run's own
        assert record["summary"]["timed_step_ms"] == record["timing"]["step_ms"] > 0
        assert record["timing"]["compute_ms"] == pytest.approx(record["steps"] * record["timing"]["step_ms"])
        assert record["summary"]["step_ms"] == statistics.median(r["time/step_ms"] for r in history
                                                                 if "time/step_ms" in r) > 0
        assert record["summary"]["grad_cosine"] == statistics.mean(
            r["grad/cosine_global"] for r in history if "grad/cosine_global" in r)


def test_domains_of_many_numbers_and_of_mixed_types(experiment):
    """Ten numbers or more: an interval (the tab's text filter fails on numbers); mixed types:
    no domain (a domain's filter drops every session of the other type)."""
    record = _record(experiment, "backprop/seed0")
    records = [{**record, "config": {**record["config"], "seed": seed}} for seed in range(12)]
    records[0] = {**records[0], "model": {**record["model"], "width": "8,4"}}
    summary = experiment_config(records)
    infos = {h.name: h for h in metadata.parse_experiment_plugin_data(summary.value[0].metadata.plugin_data.content)
             .hparam_infos}
    assert infos["seed"].HasField("domain_interval") and infos["seed"].differs
    assert (infos["seed"].domain_interval.min_value, infos["seed"].domain_interval.max_value) == (0, 11)
    width = infos["model.width"]
    assert width.differs and not width.HasField("domain_discrete") and not width.HasField("domain_interval")


def test_session_metrics_keep_what_the_run_has():
    report = {"best_val": {"accuracy": 0.5}, "final_val": {"accuracy": 0.4}, "test": None}  # a tuning trial
    history = [{"step": 1, "time/step_ms": 3.0}, {"step": 2, "time/step_ms": 1.0}, {"step": 3, "time/step_ms": 2.0}]
    assert session_metrics(report, "accuracy", history) == {
        "best_val_accuracy": 0.5, "final_val_accuracy": 0.4, "step_ms": 2.0}
