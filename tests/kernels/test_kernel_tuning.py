"""Kernel variants chosen by measurement (tinygrad_caps.kernels.tune), on the CPU with a fake timer:
the fastest variant that runs and agrees with the default is chosen, a failing, wrong or slower one
never; choices are kept on disk and reused by later processes; an unreadable cache is ignored with a
warning; nothing is measured inside a CUDA-graph capture, with a runner of one's own, or with tuning
off. The launchers' variants themselves are checked against NumPy on the emulation
(test_kernels_emulation.py) and on a GPU (test_gpu_kernels.py)."""
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from tinygrad_caps.kernels import capsule, conv, launch, routing, tune


class FakeTimer:
    """Seconds per variant from a table; counts its calls."""

    def __init__(self, seconds):
        self.seconds, self.calls = dict(seconds), []

    def __call__(self, variant, replay):
        replay()
        self.calls.append(variant)
        return self.seconds[variant]


def outputs(value=1.0):
    return lambda runner: np.full(4, value, np.float32)


def failing(runner):
    raise RuntimeError("too many resources requested for launch")


KEY = tune.cache_key(np.float32, ((100, 1152, 8), (1152, 10, 16, 8)))


def test_the_fastest_variant_that_runs_and_agrees_is_chosen(tmp_path):
    timer = FakeTimer({"shared": 3e-4, "registers": 9e-4, "registers-128": 1e-4, "registers-512": 2e-4})
    tuner = tune.Tuner(tmp_path, timer)
    with pytest.warns(RuntimeWarning) as caught:
        choice = tuner.tune("NVIDIA H200", "capsule_predict", KEY,
                            {"shared": outputs(), "registers": outputs(), "registers-128": failing,
                             "registers-512": outputs(2.0)})
    # registers-128 would be fastest but fails; registers-512 is next but computes something else
    assert choice.variant == "shared" and choice.how == "tuned"
    assert set(choice.seconds) == {"shared", "registers"}
    assert "RuntimeError" in choice.failed["registers-128"] and "differs" in choice.failed["registers-512"]
    assert sorted(str(w.message).split(" variant ")[1].split()[0] for w in caught) == ["registers-128", "registers-512"]


@pytest.mark.parametrize("seconds", [
    {"one-pass": 2.0, "shared": 1.0, "split": 3.0},
    {"one-pass": 1.0, "shared": 1.0, "split": 0.5},
    {"one-pass": 5.0, "shared": 4.0, "split": 4.5},
])
def test_a_slower_variant_is_never_chosen(tmp_path, seconds):
    choice = tune.Tuner(tmp_path, FakeTimer(seconds)).tune(
        "GPU", "capsule_grad", KEY, {name: outputs() for name in seconds})
    assert seconds[choice.variant] == min(seconds.values())


def test_the_default_wins_a_tie(tmp_path):
    timer = FakeTimer({"one-pass": 1.0, "shared": 1.0, "split": 1.0})
    choice = tune.Tuner(tmp_path, timer).tune("GPU", "capsule_grad", KEY,
                                              {"split": outputs(), "shared": outputs(), "one-pass": outputs()})
    assert choice.variant == "one-pass"


def test_when_no_variant_runs_the_error_says_why(tmp_path):
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="no variant of im2col runs.*too many"):
        tune.Tuner(tmp_path, FakeTimer({})).tune("GPU", "im2col", KEY, {"planes": failing, "rows": failing})


def test_an_unknown_variant_is_refused(tmp_path):
    with pytest.raises(ValueError, match="im2col has no variant"):
        tune.Tuner(tmp_path, FakeTimer({})).tune("GPU", "im2col", KEY, {"tiles": outputs()})


def test_a_cached_choice_is_reused_by_a_later_process(tmp_path):
    first = FakeTimer({"heuristic": 2.0, "one-block": 1.0})
    tune.Tuner(tmp_path, first).tune("NVIDIA H200", "routing_forward", KEY,
                                     {"heuristic": outputs(), "one-block": outputs()})
    assert first.calls == ["heuristic", "one-block"]
    data = json.loads((tmp_path / "nvidia-h200.json").read_text())
    assert data["gpu"] == "NVIDIA H200" and data["kernels"]["routing_forward"][KEY]["variant"] == "one-block"
    later = tune.Tuner(tmp_path, FakeTimer({}))  # a new process's tuner: it reads the file
    choice = later.lookup("NVIDIA H200", "routing_forward", KEY)
    assert choice.variant == "one-block" and choice.how == "cached" and choice.seconds == {"heuristic": 2.0,
                                                                                         "one-block": 1.0}
    assert later.lookup("NVIDIA H100 80GB HBM3", "routing_forward", KEY) is None  # another GPU: its own file
    assert later.lookup("NVIDIA H200", "routing_forward", KEY, candidates={"heuristic": None}) is None
    code = ("import sys; from tinygrad_caps.kernels import tune; "
            "print(tune.Tuner(sys.argv[1]).lookup('NVIDIA H200', 'routing_forward', sys.argv[2]).variant)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), KEY], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "one-block", done.stderr


def test_a_choice_for_other_kernel_code_is_measured_again(tmp_path, monkeypatch):
    tune.Tuner(tmp_path, FakeTimer({"planes": 2.0, "rows": 1.0})).tune(
        "GPU", "im2col", KEY, {"planes": outputs(), "rows": outputs()})
    monkeypatch.setattr(tune, "code_digest", lambda kernel: "an edited im2col.cu")
    assert tune.Tuner(tmp_path).lookup("GPU", "im2col", KEY) is None


@pytest.mark.parametrize("content", ["{not json", '{"format": 1, "kernels": {"im2col": {"k": {"variant": 3}}}}',
                                     '{"format": 99, "kernels": {}}', "[]"])
def test_a_corrupt_cache_file_is_ignored_with_a_warning_and_rewritten(tmp_path, content):
    (tmp_path / "gpu.json").write_text(content)
    tuner = tune.Tuner(tmp_path, FakeTimer({"planes": 2.0, "rows": 1.0}))
    with pytest.warns(tune.TuningCacheWarning, match="ignoring the unreadable cache file"):
        assert tuner.lookup("GPU", "im2col", KEY) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tuner.tune("GPU", "im2col", KEY, {"planes": outputs(), "rows": outputs()})
        assert tune.Tuner(tmp_path).lookup("GPU", "im2col", KEY).variant == "rows"


def test_an_unwritable_cache_keeps_the_choice_in_the_process_and_says_so(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    tuner = tune.Tuner(blocker / "tune", FakeTimer({"planes": 2.0, "rows": 1.0}))
    with pytest.warns(tune.TuningCacheWarning, match="cannot write"):
        tuner.tune("GPU", "im2col", KEY, {"planes": outputs(), "rows": outputs()})
    assert tuner.lookup("GPU", "im2col", KEY).variant == "rows"


# ----- choose(): when a launcher measures -----
class FakeDevice:
    id = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeGpuArray:
    """What choose() reads of a CuPy array: its type's module, device and dtype."""

    __module__ = "cupy.fake"
    device = FakeDevice()
    dtype = np.dtype(np.float32)


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(tune, "gpu_name", lambda device_id: "Fake GPU")
    monkeypatch.setattr(tune, "_capturing", lambda: False)
    monkeypatch.delenv(tune.ENV_SWITCH, raising=False)
    timer = FakeTimer({"threads-256": 3.0, "threads-128": 2.0, "threads-512": 1.0})
    with tune.using_tuner(tune.Tuner(tmp_path, timer)):
        yield timer


CANDIDATES = {name: outputs() for name in ("threads-256", "threads-128", "threads-512")}


def choose(runner=launch.run_on_gpu, shapes=((2, 3, 4, 8),)):
    with tune.recording() as log:
        variant = tune.choose("routing_agreement", FakeGpuArray(), shapes, CANDIDATES, runner)
    assert log[-1].variant == variant
    return log[-1]


def test_a_launcher_measures_once_then_reuses_the_choice(fake_gpu):
    first = choose()
    assert (first.variant, first.how) == ("threads-512", "tuned")
    again = choose()
    assert (again.variant, again.how) == ("threads-512", "cached") and len(fake_gpu.calls) == 3


def test_nothing_is_measured_inside_a_capture(fake_gpu, monkeypatch):
    monkeypatch.setattr(tune, "_capturing", lambda: True)
    choice = choose()
    assert (choice.variant, choice.how) == ("threads-256", "default") and "captured" in choice.reason
    assert fake_gpu.calls == []
    monkeypatch.setattr(tune, "_capturing", lambda: False)
    choose(shapes=((9, 9),))  # a warm-up step measures ...
    monkeypatch.setattr(tune, "_capturing", lambda: True)
    assert choose(shapes=((9, 9),)).variant == "threads-512"  # ... and the capture finds its choice
    assert len(fake_gpu.calls) == 3


def test_a_runner_of_ones_own_measures_nothing(fake_gpu):
    choice = choose(runner=lambda launch_record: None)
    assert choice.how == "default" and fake_gpu.calls == []


@pytest.mark.parametrize("value", ["off", "0", "OFF"])
def test_tuning_off_gives_the_fixed_defaults(fake_gpu, monkeypatch, value):
    monkeypatch.setenv(tune.ENV_SWITCH, value)
    choice = choose()
    assert (choice.variant, choice.how) == ("threads-256", "default") and fake_gpu.calls == []


def test_an_unknown_tuning_switch_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv(tune.ENV_SWITCH, "sometimes")
    with pytest.raises(ValueError, match="TINYGRAD_CAPS_KERNEL_TUNING must be 'on' or 'off', got 'sometimes'"):
        tune.tuning_enabled()


def test_the_cache_lives_beside_cupys_kernel_cache_unless_moved(monkeypatch, tmp_path):
    monkeypatch.delenv(tune.ENV_DIR, raising=False)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "kernel_cache"))
    assert tune.tune_dir() == tmp_path / "tinygrad_caps_tune"
    monkeypatch.setenv(tune.ENV_DIR, str(tmp_path / "elsewhere"))
    assert tune.tune_dir() == tmp_path / "elsewhere"


def test_every_kernel_with_variants_is_registered_with_its_default_among_them():
    assert set(tune.KERNELS) == {"capsule_predict", "capsule_grad", "routing_forward", "im2col", "routing_agreement"}
    for spec in tune.KERNELS.values():
        # the default runs first: the others' results are compared with its
        assert len(spec.variants) > 1 and next(iter(spec.variants)) == spec.default and spec.default_why
        assert (launch.SOURCE_DIR / spec.source).exists()
    # the launchers' own tables name exactly the registered variants
    assert set(capsule.PREDICT_VARIANTS) == set(tune.KERNELS["capsule_predict"].variants)
    assert set(routing.AGREEMENT_VARIANTS) == set(tune.KERNELS["routing_agreement"].variants)
    assert set(conv.IM2COL_VARIANTS) == set(tune.KERNELS["im2col"].variants)
    # the fixed default follows the H200's measurement (shared memory 3.9x the register kernel)
    assert tune.KERNELS["capsule_predict"].default == "shared"


def test_on_the_emulation_launchers_take_the_fixed_defaults():
    from tinygrad_caps.kernels.checking.emulation import Emulator

    rng = np.random.default_rng(0)
    u, w = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((3, 2, 4, 4)).astype(np.float32)
    g = rng.standard_normal((2, 3, 2, 4)).astype(np.float32)
    emulator = Emulator(max_blocks=2)
    with tune.recording() as log:
        capsule.capsule_predict(u, w, emulator)
        capsule.capsule_grad(g, u, w, emulator)
    assert [(c.kernel, c.variant, c.how) for c in log] == [("capsule_predict", "shared", "default"),
                                                           ("capsule_grad", "one-pass", "default")]
    assert [name for name, *_ in emulator.launches] == ["capsule_predict_shared_f32", "capsule_grad_f32"]


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the stand-in runs the kernels on their emulation")
def test_on_the_stand_in_warm_up_steps_tune_and_the_capture_and_later_processes_reuse(tmp_path, monkeypatch):
    from paths import SUPPORT
    from standin import run_standin

    monkeypatch.setenv(tune.ENV_SWITCH, "on")
    monkeypatch.setenv(tune.ENV_DIR, str(tmp_path))
    output = run_standin([str(SUPPORT / "tuning_scenarios.py"), "warm_up_steps_tune_and_the_capture_reuses",
                          str(tmp_path)], devices=1)
    assert output.split() == ["ok"]


def test_the_tuning_command_without_a_gpu_says_so_in_one_line():
    done = subprocess.run([sys.executable, "-m", "tinygrad_caps.kernels.tune", "--batch", "2"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line.startswith("tune:")]
    assert len(lines) == 1 and "GPU" in lines[0], done.stderr


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="the stand-in runs the kernels on their emulation")
def test_the_tuning_command_prints_each_candidate_and_the_choice_then_reuses_it(tmp_path, monkeypatch):
    from paths import ROOT
    from standin import run_standin

    monkeypatch.setenv(tune.ENV_SWITCH, "on")
    monkeypatch.setenv(tune.ENV_DIR, str(tmp_path))
    command = ["-c", "import sys; from tinygrad_caps.kernels import tune; tune.TIMED_ROUNDS = tune.TIMED_REPEATS = 1; "
                     "sys.exit(tune.main(sys.argv[1:]))", "--batch", "2", "--image-size", "12", "--kernel-size", "3",
               "--conv1-channels", "4", "--primary-types", "2", "--primary-dim", "4", "--digit-dim", "4", "--classes", "3"]
    first = run_standin(command, devices=1, cwd=ROOT).splitlines()
    assert first[0].startswith("cuda:0 CPU stand-in for CuPy, float32, B=2 (choices kept in ")
    kernels = [line.split()[0] for line in first[1:]]
    assert kernels == ["capsule_predict", "capsule_grad", "routing_agreement", "routing_forward", "im2col", "im2col"]
    for line in first[1:]:
        assert line.endswith("(tuned)") and line.count("*") == 1 and " us" in line, line
    again = run_standin(command, devices=1, cwd=ROOT).splitlines()
    assert all(line.endswith("(cached)") for line in again[1:]), again
    assert [line.split(" -> ")[1] for line in again[1:]] == [line.split(" -> ")[1].replace("tuned", "cached")
                                                             for line in first[1:]]


@pytest.mark.gpu
def test_on_the_gpu_every_variant_is_timed_the_choice_kept_and_a_capture_measures_nothing(tmp_path, monkeypatch):
    """The paper's DigitCaps prediction (B=32): each variant timed once, the fastest kept on disk and
    reused; a capture at shapes never measured takes the fixed default and measures nothing."""
    import cupy

    monkeypatch.setenv(tune.ENV_SWITCH, "on")
    rng = np.random.default_rng(0)
    u = rng.standard_normal((32, 1152, 8)).astype(np.float32)
    w = (rng.standard_normal((1152, 10, 16, 8)) * 0.05).astype(np.float32)
    u_gpu, w_gpu = cupy.asarray(u), cupy.asarray(w)
    with tune.using_tuner(tune.Tuner(tmp_path)), tune.recording() as log:
        got = capsule.capsule_predict(u_gpu, w_gpu)
        capsule.capsule_predict(u_gpu, w_gpu)
        first, second = log
        assert first.how == "tuned" and set(first.seconds) == set(capsule.PREDICT_VARIANTS) and not first.failed
        assert all(seconds > 0 for seconds in first.seconds.values())
        assert (second.how, second.variant) == ("cached", first.variant)
        np.testing.assert_allclose(got.get(), np.einsum("ijdk,bik->bijd", w, u), rtol=1e-4, atol=1e-5)
        stream = cupy.cuda.Stream(non_blocking=True)
        small = cupy.asarray(u[:8])
        with stream:
            stream.begin_capture()
            capsule.capsule_predict(small, w_gpu)
            graph = stream.end_capture()
        del graph
        assert (log[-1].how, log[-1].variant) == ("default", "shared") and "captured" in log[-1].reason
    later = tune.Tuner(tmp_path).lookup(tune.gpu_name(cupy.cuda.Device().id), "capsule_predict", first.key)
    assert later.variant == first.variant and later.seconds == first.seconds
