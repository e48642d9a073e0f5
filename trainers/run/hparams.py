"""The experiment's HParams view: one session per run, one configuration per experiment.

TensorBoard's HParams tab (``tensorboard.plugins.hparams``) reads

* one session per run, in the run's own directory: its hparam values (a
  session start), a session end, and its metrics as scalars ``hparam/<key>``;
* one experiment configuration: every hparam with its domain, and the metrics
  with display names. TensorBoard keeps the first configuration it finds, so a
  configuration per run would show the domain of one run only (one trainer in
  the trainer filter). It is written once, directly in the experiment folder
  (run ``.`` of a TensorBoard pointed at that folder), from every run's
  ``result.json``, and rewritten whenever runs are added.
"""

import json
import statistics
import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2, summary_v2
from tensorboard.summary.writer.record_writer import RecordWriter

from gradengines.trainers.run.checkpoint import write_atomic
from gradengines.trainers.run.records import read_records

__all__ = ["METRIC_PREFIX", "CONFIG_FILE", "SHOWN_FIRST", "metric_display_names", "session_metrics", "session_hparams",
           "session_summaries", "experiment_config", "write_experiment_config"]

METRIC_PREFIX = "hparam/"  # tag prefix of a session's metric scalars
CONFIG_FILE = "events.out.tfevents.hparams-experiment"  # "tfevents" in the name: TensorBoard loads it
# options of how a run reports and keeps itself, not of what it trains
REPORTING_OPTIONS = ("progress", "progress_seconds", "log_axis", "checkpoint_seconds")
# The HParams tab lists hparams by (differs, name) and shows the first five: the
# "_" of these names sorts before every lowercase name, so run, trainer and the
# optimizer come first; TensorBoard shows their display names.
SHOWN_FIRST = {"_run": "run", "_trainer": "trainer", "_trainer_optimizer": "optimizer"}  # name -> display name
# options an optimizer or schedule does not read: left out of its runs' HParams rows (blank), not shown as defaults
UNUSED_BY = {("optimizer", "adam"): ("momentum", "nesterov"), ("optimizer", "adamw"): ("momentum", "nesterov"),
             ("schedule", "constant"): ("warmup_steps", "step_size", "gamma"),
             ("schedule", "step"): ("warmup_steps",), ("schedule", "cosine"): ("step_size", "gamma")}
CHECKBOX_LIMIT = 10  # the HParams tab filters a discrete domain of fewer values with checkboxes


def metric_display_names(metric: str) -> dict[str, str]:
    """Summary key -> display name of the metrics of a run whose task reports ``metric`` (e.g. accuracy)."""
    return {f"best_val_{metric}": f"best val {metric}",
            f"final_val_{metric}": f"final val {metric}",
            f"test_{metric}": f"test {metric} (best val model)",
            "timed_step_ms": "step ms (timed round-robin)",
            "step_ms": "step ms (the run's own clock, median)",
            "grad_cosine": "mean grad cosine vs backprop"}


def session_metrics(report: dict, metric: str, history: list[dict], timed_step_ms: float | None = None
                    ) -> dict[str, float]:
    """A run's summary numbers (keys of ``metric_display_names``) from its final report and
    logged records; each only where the run has it (no test for a tuning trial, no
    ``grad_cosine`` without ``grad/cosine_global``). ``step_ms``: the median of the run's own clock, which a
    busy machine distorts; ``timed_step_ms``: the comparison's round-robin timing of this trainer's step
    (``trainers.experiments.step_timing``), the one its compute times use."""
    step_ms = [float(r["time/step_ms"]) for r in history if "time/step_ms" in r]
    cosine = [float(r["grad/cosine_global"]) for r in history if "grad/cosine_global" in r]
    values = {f"{split}_{metric}": report[split][metric]
              for split in ("best_val", "final_val", "test") if report[split]}
    if timed_step_ms is not None:
        values["timed_step_ms"] = timed_step_ms
    if step_ms:
        values["step_ms"] = statistics.median(step_ms)
    if cosine:
        values["grad_cosine"] = statistics.mean(cosine)
    return values


def session_hparams(record: dict) -> dict[str, bool | int | float | str]:
    """A run's hparam values from its ``result.json`` record: ``_run``, ``_trainer`` (``SHOWN_FIRST``),
    ``task``, the training options (``lr``, ``optimizer``, ...; not ``REPORTING_OPTIONS``), the engine's options
    as ``engine.hparams()`` names them (``foton.temperature``) and the model's (``model.depth``).

    Options that are off (None) are left out, so TensorBoard shows an empty cell
    rather than a value of another type, and so are options the run's optimizer or schedule does
    not read (``UNUSED_BY``: momentum on an Adam run); other non-scalars become their JSON text.
    The optimizer is ``_trainer_optimizer`` (shown as "optimizer", among the first columns).
    """
    config = record["config"]
    unused = {k for (option, value), keys in UNUSED_BY.items() if config.get(option) == value for k in keys}
    values = {"_run": record["run"], "_trainer": record["trainer"], "task": record["task"],
              "_trainer_optimizer": config.get("optimizer"),
              **{k: v for k, v in config.items() if k not in REPORTING_OPTIONS and k not in unused
                 and k != "optimizer"},
              **{k: v for k, v in record["engine"].items() if k != "trainer"},
              **{f"model.{k}": v for k, v in record["model"].items()}}
    return {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v, default=str)
            for k, v in values.items() if v is not None}


def _summary(tag: str, data: plugin_data_pb2.HParamsPluginData) -> Summary:
    """A summary holding ``data`` under ``tag``, as the hparams plugin reads it."""
    summary = Summary()
    summary.value.add(tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR)
    return summary


def session_summaries(hparams: dict[str, bool | int | float | str]) -> list[Summary]:
    """A finished session: its start (``hparams``) and a successful end.

    The start names no session group, so TensorBoard groups the session alone under
    its run name, unique below any logdir (``summary_v2.hparams_pb`` always names one).
    """
    start = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in hparams.items():
        kind = "bool_value" if isinstance(value, bool) else "string_value" if isinstance(value, str) else "number_value"
        setattr(start.hparams[name], kind, value)
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return [_summary(metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=start)),
            _summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=end))]


def _hparam_info(name: str, values: list) -> api_pb2.HParamInfo:
    """``name`` with the domain of every value the runs have: discrete, except numbers of
    ``CHECKBOX_LIMIT`` values or more, which get their interval (a min..max filter; the tab
    would offer a text filter that fails on numbers).

    Where runs disagree on the type, the column gets no domain: TensorBoard would
    otherwise filter out every session whose value is not of the domain's type.
    """
    info = api_pb2.HParamInfo(name=name, display_name=SHOWN_FIRST.get(name, ""))
    kinds = {float if type(v) is int else type(v) for v in values}
    if len(kinds) > 1:
        info.type, info.differs = api_pb2.DATA_TYPE_STRING, True
        return info
    (kind,) = kinds
    distinct = {kind(v) for v in values}
    info.differs = len(distinct) > 1
    if kind is float and len(distinct) >= CHECKBOX_LIMIT:
        summary_v2.RealInterval(min(distinct), max(distinct)).update_hparam_info(info)
    else:
        summary_v2.Discrete(distinct, dtype=kind).update_hparam_info(info)
    return info


def experiment_config(records: list[dict]) -> Summary:
    """The experiment configuration of ``records`` (every run's ``result.json``): each hparam any
    run has, with its domain over all runs (``differs`` where runs set it to different values),
    and each metric any run's ``summary`` reports."""
    values: dict[str, list] = {}
    for record in records:
        for name, value in session_hparams(record).items():
            values.setdefault(name, []).append(value)
    metrics: dict[str, str] = {}
    for record in records:
        metrics |= {k: d for k, d in metric_display_names(record["metric"]).items() if k in record.get("summary", {})}
    experiment = api_pb2.Experiment(
        hparam_infos=[_hparam_info(name, v) for name, v in sorted(values.items())],
        metric_infos=[summary_v2.Metric(METRIC_PREFIX + k, display_name=d).as_proto() for k, d in metrics.items()],
        time_created_secs=time.time(),
    )
    return _summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment))


def write_experiment_config(experiment_dir) -> Path:
    """(Re)write the configuration of every run below ``experiment_dir`` (each ``result.json``,
    tuning trials included: TensorBoard shows their sessions too) as the events file
    ``experiment_dir/CONFIG_FILE``, replacing the previous one atomically.

    A TensorBoard already running keeps the configuration it read first; restart it to see added runs.
    """
    experiment_dir = Path(experiment_dir)
    records = [record for _, record in read_records(sorted(experiment_dir.rglob("result.json")))]  # damaged: noted
    events = [Event(wall_time=time.time(), file_version="brain.Event:2"),
              Event(wall_time=time.time(), summary=experiment_config(records))]

    def write(f):
        writer = RecordWriter(f)
        for event in events:
            writer.write(event.SerializeToString())

    return write_atomic(experiment_dir / CONFIG_FILE, write)
