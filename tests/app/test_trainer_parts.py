"""The Trainer made of parts: each part alone, with a stand-in for the run it is a part of
(``FakeRun``); the loop's size; and one TrainingConfig, built once from a ``train`` command line,
reaching the Trainer and its optimiser with ``to_dict`` called only for config.json and checkpoints."""
import ast
import json
import signal
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

import tinygrad_caps as tc
from paths import ROOT
from tinygrad_caps.models import CapsNet, TrainingConfig
from tinygrad_caps.models.app.training.callbacks import Parts, StepDone, TrainingPart
from tinygrad_caps.models.app.training.evaluation import batch_losses
from tinygrad_caps.models.app.training.gradflow_log import GradflowSink
from tinygrad_caps.models.app.training.metrics_file import MetricsFile
from tinygrad_caps.models.app.training.progress import ProgressBar
from tinygrad_caps.models.app.training.run_folder import RunFolder
from tinygrad_caps.models.app.training.run_state import Interrupted, TimeLimitReached
from tinygrad_caps.models.app.training.stopping import StopConditions
from tinygrad_caps.models.app.training.tensorboard_log import TensorBoardLog, TensorBoardUnavailable
from tinygrad_caps.models.app.training.tensorboard_sink import TensorBoardSink

SMALL = dict(image_size=10, kernel_size=3, conv1_channels=4, primary_types=2, primary_dim=4, digit_dim=4, num_classes=3)


class FakeRun(SimpleNamespace):
    """What a part reads of its run (a Trainer): config, state, model, folder, checkpoints, shard, say."""

    def __init__(self, tmp_path, model=None, resuming=False, resumed_step=0, **config):
        super().__init__(config=TrainingConfig(**config), folder=RunFolder(tmp_path), out_dir=tmp_path,
                         folder_ready=True, model=model, shard=(0, 1), said=[],
                         state={"epoch": 0, "step": 0, "seconds": 0.0,
                                "sums": {"loss": 0.0, "margin_loss": 0.0, "reconstruction_loss": 0.0, "correct": 0,
                                         "seen": 0}},
                         checkpoints=SimpleNamespace(resuming=resuming, resumed_step=resumed_step),
                         optimizer=SimpleNamespace(lr=0.001), steps_per_epoch=5)
        self.parts = Parts()

    def say(self, text):
        self.said.append(text)

    def global_step(self):
        return self.state["epoch"] * self.steps_per_epoch + self.state["step"]


class RecordingWriter:
    """tensorboardX's SummaryWriter as far as TensorBoardLog uses it: the calls, by tag and step."""

    def __init__(self):
        self.calls = []

    def add_scalar(self, tag, value, step):
        self.calls.append(("scalar", tag, step, value))

    def add_histogram(self, tag, values, step):
        self.calls.append(("histogram", tag, step))

    def add_image(self, tag, image, step):
        self.calls.append(("image", tag, step))

    def flush(self):
        self.calls.append(("flush",))

    def close(self):
        self.calls.append(("close",))


def recording_log(opened):
    """A TensorBoardLog class whose writer records; ``opened`` gets (folder, purge_step) per log."""

    class RecordingLog(TensorBoardLog):
        def __init__(self, folder, purge_step=None):
            opened.append((folder, purge_step))
            self.writer = RecordingWriter()

    return RecordingLog


def traced_step(model, rng):
    """A CapsNet step's traces, after its backward (gradients retained), on a batch of 4."""
    x, y = rng.random((4, 1, 10, 10)).astype(np.float32), np.array([0, 1, 2, 1])
    traces = []
    loss, _, _, _ = batch_losses(model, x, y, 0.0005, train=True, traces=traces)
    loss.backward()
    return traces


def test_the_trainer_class_is_at_most_200_lines():
    source = (ROOT / "models" / "app" / "training" / "trainer.py").read_text()
    trainer = next(node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == "Trainer")
    assert trainer.end_lineno - trainer.lineno + 1 <= 200


def test_parts_are_called_in_order_and_a_part_may_do_nothing(tmp_path):
    calls = []

    class Recording(TrainingPart):
        def __init__(self, name):
            self.name = name

        def on_step(self, run, step):
            calls.append((self.name, step.images))

        def wants_traces(self, run, step):
            return self.name == "b" and step % 2 == 0

    parts = Parts([Recording("a"), TrainingPart(), Recording("b")])
    run = FakeRun(tmp_path)
    parts.on_step(run, StepDone(8))
    parts.on_epoch_end(run, {})  # no part does anything there
    assert calls == [("a", 8), ("b", 8)]
    assert parts.wants_traces(run, 2) and not parts.wants_traces(run, 3)
    with pytest.raises(AttributeError, match="no hook"):
        parts.on_stpe


def test_the_tensorboard_sink_writes_todays_tags_at_each_point(tmp_path):
    opened = []
    sink = TensorBoardSink(None, writer=recording_log(opened))
    tc.manual_seed(0)
    model = CapsNet(**SMALL)
    run = FakeRun(tmp_path, model=model, resuming=True, resumed_step=6)
    run.data = SimpleNamespace(spec=SimpleNamespace(preprocess=lambda images: images.astype(np.float32) / 255),
                               test_images=np.full((8, 1, 10, 10), 128, dtype=np.uint8))
    run.parts.append(sink)
    sink.on_epoch_start(run)
    run.state["sums"].update(loss=3.0, correct=5, seen=8)
    run.state["step"] = 7
    sink.on_interval(run)
    assert opened == [(run.folder.tensorboard, 7)]  # events past the checkpoint's step 6 are hidden
    traces = traced_step(model, np.random.default_rng(0))
    record = GradflowSink(tmp_path / "gradflow.jsonl", 1).log.write(1, 7, 7, "full", traces)
    sink.on_gradflow(run, record, traces)
    sink.on_epoch_end(run, {"epoch": 1, "train_loss": 0.4, "test_accuracy": 0.5, "lr": 0.001, "step": 7})
    sink.close(run)
    calls = sink.log.writer.calls
    scalars = {(tag, step) for kind, tag, step, *_ in (c for c in calls if c[0] == "scalar")}
    assert {("train/loss", 7), ("train/accuracy", 7), ("train/lr", 7), ("train/images_per_second", 7)} <= scalars
    assert ("scalar", "train/loss", 7, 3.0 / 8) in calls and ("scalar", "train/accuracy", 7, 5 / 8) in calls
    assert {("epoch/train_loss", 7), ("epoch/test_accuracy", 7), ("epoch/lr", 7)} <= scalars
    assert ("gradflow/digit/iteration_0/coupling_entropy", 7) in scalars and ("network/t_score", 7) in scalars
    assert ("histogram", "coupling/digit/iteration_0", 7) in calls and ("image", "reconstructions", 7) in calls
    assert any(c[0] == "histogram" and c[1].startswith("gradient/") for c in calls)
    assert calls[-2:] == [("flush",), ("close",)]


def test_the_tensorboard_sink_waits_for_the_folder_and_says_once_it_cannot_write(tmp_path):
    opened = []
    run = FakeRun(tmp_path)
    run.folder_ready = False
    sink = TensorBoardSink(tmp_path / "tb", writer=recording_log(opened))
    assert sink.writer(run) is None and opened == []
    run.folder_ready = True
    assert sink.writer(run) is sink.writer(run) and opened == [(tmp_path / "tb", 0)]

    def unavailable(folder, purge_step=None):
        raise TensorBoardUnavailable("TensorBoard logs need tensorboardX")

    missing = TensorBoardSink(writer=unavailable)
    assert missing.writer(run) is None and missing.writer(run) is None
    assert run.said == ["tensorboard: not written (TensorBoard logs need tensorboardX); metrics.jsonl and "
                        "gradflow.jsonl are"]


def test_the_gradflow_sink_chooses_its_steps_writes_their_lines_and_tells_the_other_parts(tmp_path):
    tc.manual_seed(0)
    model = CapsNet(**SMALL)
    run = FakeRun(tmp_path, model=model)
    sink = GradflowSink(run.folder.gradflow, every=3)
    assert [step for step in range(1, 10) if sink.wants_traces(run, step)] == [3, 6, 9]
    assert not GradflowSink(run.folder.gradflow).wants_traces(run, 3)  # no --log-gradflow
    assert not sink.wants_traces(FakeRun(tmp_path, model=SimpleNamespace()), 3)  # a CNN has no routing
    rank1 = FakeRun(tmp_path, model=model)
    rank1.shard = (1, 2)
    assert not sink.wants_traces(rank1, 3)
    heard = []

    class Listener(TrainingPart):
        def on_gradflow(self, run, record, traces):
            heard.append(record["step"])

    run.parts += [sink, Listener()]
    run.state.update(epoch=0, step=3)
    traces = traced_step(model, np.random.default_rng(1))
    sink.on_step(run, StepDone(4, None))  # an untraced step writes nothing
    sink.on_step(run, StepDone(4, traces))
    line = json.loads(run.folder.gradflow.read_text())
    assert (line["epoch"], line["batch"], line["step"], line["mode"]) == (1, 3, 3, "full") and heard == [3]
    assert "mode_cosine" not in line and [layer["name"] for layer in line["layers"]] == ["digit"]


def test_the_gradflow_sink_logs_the_mode_cosine_after_the_backward(tmp_path):
    tc.manual_seed(0)
    model = CapsNet(**SMALL)
    run = FakeRun(tmp_path, model=model, log_gradflow=1, log_mode_cosine=True)
    sink = GradflowSink(run.folder.gradflow, every=1)
    rng = np.random.default_rng(2)
    x, labels = rng.random((4, 1, 10, 10)).astype(np.float32), np.array([0, 1, 2, 0])
    batch_losses(model, x, labels, 0.0005, train=True)[0].backward()  # the step's own backward
    images = tc.tensor(x)
    sink.after_backward(run, images, labels, None)  # an untraced step: no extra backward
    assert sink.mode_cosine is None
    sink.after_backward(run, images, labels, [])
    assert set(sink.mode_cosine) >= {"all"} and -1.0 <= sink.mode_cosine["all"] <= 1.0


def test_the_gradflow_sink_cuts_the_log_back_to_the_checkpoint_on_resume(tmp_path):
    run = FakeRun(tmp_path, resuming=True, resumed_step=2)
    lines = [json.dumps({"epoch": 1, "batch": s, "step": s, "layers": []}) for s in (1, 2, 3, 4)]
    run.folder.gradflow.write_text("\n".join(lines) + "\n")
    GradflowSink(run.folder.gradflow, every=1, fresh=False).on_folder_ready(run)
    assert run.folder.gradflow.read_text().splitlines() == lines[:2]
    assert run.said == [f"dropped 2 lines of {tmp_path / 'gradflow.jsonl'} beyond the checkpoint's step 2 "
                        "(or cut short)"]


def test_the_metrics_file_is_emptied_or_cut_and_gets_one_line_per_epoch(tmp_path):
    fresh = FakeRun(tmp_path / "fresh")
    fresh.folder.path.mkdir()
    fresh.folder.metrics.write_text('{"epoch": 1}\n')
    MetricsFile().on_folder_ready(fresh)
    assert fresh.folder.metrics.read_text() == "" and fresh.said == []
    MetricsFile().on_epoch_end(fresh, {"epoch": 1, "train_loss": 0.5})
    assert fresh.folder.metrics.read_text() == '{"epoch": 1, "train_loss": 0.5}\n'
    resumed = FakeRun(tmp_path / "resumed", resuming=True)
    resumed.folder.path.mkdir()
    resumed.state["epoch"] = 2
    resumed.folder.metrics.write_text("".join(f'{{"epoch": {e}}}\n' for e in (1, 2, 3)) + '{"epo')
    MetricsFile().on_folder_ready(resumed)
    assert resumed.folder.metrics.read_text() == '{"epoch": 1}\n{"epoch": 2}\n'
    assert resumed.said == [f"dropped 2 lines of {resumed.folder.metrics} beyond the checkpoint's epoch 2"]


def test_the_deadline_counts_only_once_the_run_has_moved_on(tmp_path):
    stop = StopConditions(deadline=time.monotonic() - 1)
    assert stop.deadline_now((3, 5)) is None and stop.deadline_now((3, 5)) is None  # where it started
    passed = stop.deadline_now((3, 6))
    assert passed == stop.deadline
    with pytest.raises(TimeLimitReached):
        stop.check_deadline(passed)
    stop.check_deadline(None)
    assert StopConditions().deadline_now((0, 1)) is None


def test_a_stop_file_and_a_closed_stdout_stop_the_run(tmp_path):
    stop = StopConditions(stop_file=tmp_path / "study.stop")
    stop.check_signals(None)
    (tmp_path / "study.stop").write_text("")
    with pytest.raises(Interrupted) as stopped:
        stop.check_signals(None)
    assert stopped.value.signum == signal.SIGINT
    closed = StopConditions()
    closed.stdout_closed = True
    with pytest.raises(Interrupted) as piped:
        closed.check_signals(None)
    assert piped.value.signum == signal.SIGPIPE
    assert closed.resume_command(SimpleNamespace(out_dir=tmp_path / "my run")) == \
        f"tinygrad-caps train --resume --out '{tmp_path / 'my run'}'"


def test_the_progress_bar_draws_nothing_when_disabled_and_says_through_the_log(tmp_path):
    run = FakeRun(tmp_path, batch_size=8, epochs=2)
    run.data = SimpleNamespace(train_images=np.zeros((40, 1, 2, 2)))
    bar, said = ProgressBar(False), []
    bar.on_epoch_start(run)
    assert bar.bar is None or bar.bar.disable
    run.state["sums"].update(loss=1.0, correct=4, seen=8)
    bar.on_step(run, StepDone(8, flushed=True))
    bar.say("a line", said.append)
    bar.on_epoch_trained(run)
    assert bar.bar is None and said == ["a line"]


@pytest.mark.slow
def test_one_training_config_travels_from_the_command_line_to_the_optimiser(data_dir, tmp_path, monkeypatch):
    """``train --lr``: the argv parsed once, one TrainingConfig built (TrainingConfig.from_dict once, in
    the CLI), its lr the optimiser's, and to_dict called only to write config.json and checkpoints."""
    from cli_helpers import train
    from tinygrad_caps.models.app.cli import parser as cli_parser

    built, dict_callers, rates, parses = [], [], [], []
    from_dict, to_dict, adam = TrainingConfig.from_dict.__func__, TrainingConfig.to_dict, tc.optim.Adam.__init__
    parse_args = cli_parser.OneLineErrorParser.parse_args

    def counting_from_dict(cls, d):
        built.append(sys._getframe(1).f_code.co_name)
        return from_dict(cls, d)

    def recording_to_dict(self):
        frame = sys._getframe(1)
        dict_callers.append(f"{type(frame.f_locals.get('self')).__name__}.{frame.f_code.co_name}")
        return to_dict(self)

    def recording_adam(self, params, lr=1e-3, **kwargs):
        rates.append(lr)
        adam(self, params, lr=lr, **kwargs)

    def counting_parse(self, args=None, namespace=None):
        parses.append(self.prog)
        return parse_args(self, args, namespace)

    monkeypatch.setattr(TrainingConfig, "from_dict", classmethod(counting_from_dict))
    monkeypatch.setattr(TrainingConfig, "to_dict", recording_to_dict)
    monkeypatch.setattr(tc.optim.Adam, "__init__", recording_adam)
    monkeypatch.setattr(cli_parser.OneLineErrorParser, "parse_args", counting_parse)
    assert train(data_dir, tmp_path / "run", "--epochs", "1", "--lr", "0.0025", "--device", "cpu") == 0
    assert parses == ["tinygrad-caps"] and built == ["training_config"] and rates == [0.0025]
    assert set(dict_callers) == {"Trainer.ensure_run_folder", "RunCheckpoints.save"}
    assert json.loads((tmp_path / "run" / "config.json").read_text())["lr"] == 0.0025
