"""ThroughputMeter: which steps it counts, that a counted step's time is in no figure, that a
timed step carries the flops of the last counted step with its input shapes, that every
reported MFU is model flops / (step time x peak) to the bit, and the GPU path's lazy reads
(a fake event that completes when told)."""

import time
import warnings

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

import dispatch_flops
from dispatch_flops import DeviceSpec, FlopCounter, ThroughputMeter
from dispatch_flops.workflows import throughput
from dispatch_flops.workflows.throughput import batch_tokens, input_signature
from helpers import FakeClock

CPU = DeviceSpec.cpu(peak_flops=1e9, memory_bandwidth=1e10)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8))


def train_step(model, ids):
    model(ids).sum().backward()
    model.zero_grad(set_to_none=True)  # every step alike: no gradient to add into


def reference_flops(model, ids):
    with FlopCounter(model) as fc:
        train_step(model, ids)
    return fc.model_flops(), fc.hardware_flops()


def run(meter, model, batches, clock, counted_s=100.0, timed_s=1.0):
    """Each step moves the fake clock: ``counted_s`` when counted, ``timed_s`` otherwise."""
    counted = []
    for ids in batches:
        with meter.step(ids):
            train_step(model, ids)
            counted.append(meter.counting)
            clock.now += counted_s if meter.counting else timed_s
    return counted


def test_counted_steps_are_in_no_figure():
    """The counted path takes 100 s on the clock, the timed one 1 s: every timed step reads
    1 s, and so does the mean."""
    model, clock = mlp(), FakeClock()
    meter = ThroughputMeter(model, device=CPU, every=3, warmup=1)
    meter._clock = clock
    ids = torch.randint(0, 16, (2, 5))
    counted = run(meter, model, [ids] * 10, clock)
    # step 0 untouched (warm-up), then every 3rd from step 1
    assert counted == [False, True, False, False, True, False, False, True, False, False]
    assert [s.index for s in meter.history] == [2, 3, 5, 6, 8, 9]
    assert all(s.step_s == 1.0 for s in meter.history)
    reading = meter.reading()
    assert reading.steps == 6 and reading.step_s == 1.0 and reading.counted_steps == 3
    model_flops, hardware_flops = reference_flops(model, ids)
    assert reading.model_flops == model_flops and reading.hardware_flops == hardware_flops
    assert reading.tokens == 10 and reading.tokens_per_s == 10.0
    assert reading.mfu_all_ops == model_flops / 1e9


def test_a_counted_step_is_left_out_on_the_real_clock():
    """The same with time.perf_counter: counted steps sleep 0.3 s, timed ones do not."""
    model = mlp()
    meter = ThroughputMeter(model, device=CPU, every=2, warmup=0)
    ids = torch.randint(0, 16, (2, 5))
    for _ in range(4):
        with meter.step(ids):
            train_step(model, ids)
            if meter.counting:
                time.sleep(0.3)
    assert [s.index for s in meter.history] == [1, 3]
    assert meter.reading().step_s < 0.3


def test_mfu_is_the_reported_figures_to_the_bit():
    """mfu_all_ops and hfu_all_ops equal model / hardware flops over (step_s x peak_flop_s)
    as logged, in float arithmetic, over a window of uneven steps."""
    model, clock = mlp(), FakeClock()
    meter = ThroughputMeter(model, device=CPU, every=4, warmup=0)
    meter._clock = clock
    ids = torch.randint(0, 16, (3, 7))
    for k in range(9):
        with meter.step(ids):
            train_step(model, ids)
            clock.now += 0.1 * (k + 1) / 3
    logged = meter.take().metrics()
    assert logged["peak_flop_s"] == CPU.peak_flops(torch.float32)
    per_s = logged["step_s"] * logged["peak_flop_s"]
    assert logged["mfu_all_ops"] == logged["model_flops"] / per_s
    assert logged["hfu_all_ops"] == logged["hardware_flops"] / per_s
    assert logged["hfu_all_ops"] > logged["mfu_all_ops"] > 0
    assert meter.take() is None  # the window was taken
    for step in meter.history:
        assert step.mfu_all_ops == step.model_flops / (step.step_s * step.peak_flop_s)


def test_each_shape_is_priced_by_its_own_counted_step():
    """Two sequence lengths alternate: each is counted on first sight (given the batch) and
    every timed step carries its own length's flops."""
    model, clock = mlp(), FakeClock()
    meter = ThroughputMeter(model, device=CPU, every=100, warmup=0)
    meter._clock = clock
    short, long = torch.randint(0, 16, (2, 3)), torch.randint(0, 16, (2, 9))
    assert meter.should_count(short)
    counted = run(meter, model, [short, long, short, long, short, long], clock)
    assert counted == [True, True, False, False, False, False]
    expected = {3: reference_flops(model, short)[0], 9: reference_flops(model, long)[0]}
    assert expected[3] < expected[9]
    for step in meter.history:
        assert step.model_flops == expected[step.tokens // 2]
    assert not meter.should_count(short) and meter.should_count(torch.randint(0, 16, (2, 4)))


def test_a_timed_step_with_shapes_never_counted_is_left_out_and_the_next_is_counted():
    """Without a batch, the meter learns the shapes from the model's inputs during the step:
    too late to count that step, so it is left out and the next one counted."""
    model, clock = mlp(), FakeClock()
    meter = ThroughputMeter(model, device=CPU, every=100, warmup=0)
    meter._clock = clock
    short, long = torch.randint(0, 16, (2, 3)), torch.randint(0, 16, (2, 9))
    counted = []
    for ids in (short, short, long, long, long):
        with meter.step():
            train_step(model, ids)
            counted.append(meter.counting)
            clock.now += 1.0
    assert counted == [True, False, False, True, False]
    assert [s.index for s in meter.history] == [1, 4]
    assert [s.tokens for s in meter.history] == [6, 18]
    reading = meter.reading()
    assert reading.unpriced_steps == 1 and "1 timed with inputs never counted" in str(reading)
    assert not model._forward_pre_hooks  # the step's hook is gone


def test_a_timed_step_runs_without_counter_or_hook():
    model = mlp()
    meter = ThroughputMeter(model, device=CPU, every=2, warmup=0)
    ids = torch.randint(0, 16, (2, 5))
    seen = []
    for _ in range(2):
        with meter.step(ids):
            seen.append((meter.counting, _get_current_dispatch_mode() is not None,
                         len(model._forward_pre_hooks)))
            train_step(model, ids)
    assert seen == [(True, True, 0), (False, False, 0)]


def test_a_step_that_raises_is_left_out():
    model = mlp()
    meter = ThroughputMeter(model, device=CPU, every=1, warmup=0)
    with pytest.raises(RuntimeError, match="boom"), meter.step():
        raise RuntimeError("boom")
    assert _get_current_dispatch_mode() is None and not model._forward_pre_hooks
    assert meter.reading() is None and meter.profile is None


def test_no_peak_warns_at_the_users_line_and_names_the_ways_to_give_one():
    model = mlp()
    meter = ThroughputMeter(model, every=2, warmup=0)
    ids = torch.randint(0, 16, (2, 5))
    if torch.cuda.is_available():
        pytest.skip("a CUDA device may have a built-in spec")
    with pytest.warns(RuntimeWarning, match=r"DeviceSpec\.cpu\(flop_s, bytes_s\)") as seen:
        for _ in range(3):
            with meter.step(ids):  # the warning points here
                train_step(model, ids)
    assert "DeviceSpec.calibrate()" in str(seen[0].message)
    assert seen[0].filename == __file__
    reading = meter.reading()
    assert reading.mfu_all_ops is None and "mfu_all_ops" not in reading.metrics()
    assert "no MFU" in str(reading) and reading.model_flops > 0


def test_an_mfu_above_one_is_flagged():
    model, clock = mlp(), FakeClock()
    meter = ThroughputMeter(model, device=DeviceSpec.cpu(10.0, 1e10), every=2, warmup=0)
    meter._clock = clock
    ids = torch.randint(0, 16, (2, 5))
    with pytest.warns(RuntimeWarning, match="above 100 %.*peak is too low"):
        run(meter, model, [ids] * 2, clock)
        assert meter.reading().mfu_all_ops > 1


def test_dtype_names_the_peak():
    model, clock = mlp(), FakeClock()
    spec = DeviceSpec("two-dtypes", {"float32": 1e9, "bfloat16": 4e9}, 1e10)
    meter = ThroughputMeter(model, device=spec, dtype=torch.bfloat16, every=2, warmup=0)
    meter._clock = clock
    run(meter, model, [torch.randint(0, 16, (2, 5))] * 2, clock)
    assert meter.peak_flop_s == 4e9 and meter.peak == "4 GFLOPS bfloat16 dense, two-dtypes"
    default = ThroughputMeter(model, device=spec, every=2, warmup=0)
    default._clock = clock
    run(default, model, [torch.randint(0, 16, (2, 5))] * 2, clock)
    assert default.peak_flop_s == 1e9  # the model computes in fp32
    with pytest.raises(ValueError, match="no peak for float16"):
        ThroughputMeter(model, device=spec, dtype=torch.float16)


def test_recomputation_is_hardware_flops_not_model_flops():
    """With activation checkpointing the recomputed forward is its own phase: the model flops
    are those of the plain model, the hardware flops add the recomputation."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    x = torch.randn(4, 8)
    with FlopCounter(block) as plain:
        block(x.requires_grad_()).sum().backward()
    block.zero_grad(set_to_none=True)  # nothing to add into: the same backward
    model = Checkpointed()
    with set_checkpoint_early_stop(False), FlopCounter(model) as fc:
        model(x.detach().requires_grad_()).sum().backward()
    profile = fc.to_profile()
    phases = profile.by_phase()
    assert phases["recompute"].macs == plain.by_phase()["forward"].macs > 0
    assert throughput.step_model_flops(profile) == plain.model_flops()
    assert throughput.step_hardware_flops(profile) == \
        plain.model_flops() + phases["recompute"].flops + phases["other"].flops


def test_the_gpu_path_reads_events_lazily(monkeypatch):
    """On a GPU a step's end is an event read once it has completed: end() neither waits nor
    reports; reading() waits for the rest."""

    class Event:
        made = []

        def __init__(self, at):
            self.at, self.done, self.synced = at, False, False
            Event.made.append(self)

        def query(self):
            return self.done

        def synchronize(self):
            self.synced = self.done = True

        def elapsed_time(self, other):
            return 1000.0 * (other.at - self.at)  # ms

    model = mlp()
    meter = ThroughputMeter(model, device=CPU, every=10, warmup=0)
    clock = FakeClock()
    monkeypatch.setattr(meter, "_cuda_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(meter, "_read_clock",
                        lambda device: Event(clock.now) if device is not None else None)
    ids = torch.randint(0, 16, (2, 5))
    returned = []
    for _ in range(4):
        meter.begin(ids)
        train_step(model, ids)
        clock.now += 0.5
        returned.append(meter.end())
    assert returned == [None] * 4 and not meter.history  # nothing completed yet
    Event.made[1].done = True  # the first timed step's end
    with meter.step(ids):
        clock.now += 0.5
    assert [s.index for s in meter.history] == [1]  # folded without waiting
    assert not any(e.synced for e in Event.made)
    reading = meter.reading()
    assert reading.steps == 4 and reading.step_s == 0.5
    assert Event.made[-1].synced


def test_signatures_and_tokens():
    a = {"input_ids": torch.zeros(2, 5, dtype=torch.long), "mask": torch.ones(2, 5),
         "num_items": 7, "use_cache": False}
    b = dict(a, num_items=9)  # a count changes from step to step; the work does not
    assert input_signature(a) == input_signature(b)
    assert input_signature(a) != input_signature(dict(a, use_cache=True))
    assert input_signature(a) != input_signature(dict(a, mask=torch.ones(2, 5).half()))
    assert batch_tokens(a) == 10 and batch_tokens([torch.ones(3), torch.zeros(4).long()]) == 4
    assert batch_tokens(torch.randn(3)) == 0


def test_bad_arguments_name_what_is_wanted():
    with pytest.raises(ValueError, match="every"):
        ThroughputMeter(every=0)
    with pytest.raises(ValueError, match="warmup"):
        ThroughputMeter(warmup=-1)
    with pytest.raises(ValueError, match="DeviceSpec"):
        ThroughputMeter(device="h100")  # type: ignore[arg-type]
    meter = ThroughputMeter(every=1, warmup=0)
    meter.begin()
    with pytest.raises(RuntimeError, match="end"):
        meter.begin()
    meter.abandon()


def test_the_meter_is_public():
    assert {"ThroughputMeter", "ThroughputReading", "StepTiming"} <= set(dispatch_flops.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dispatch_flops.ThroughputMeter is throughput.ThroughputMeter


def test_the_meters_mfu_is_named_apart_from_profile_mfu():
    """The meter's figure is ``mfu_all_ops`` (every op's model flops at one peak), logged
    under that key and printed with why it differs from ``Profile.mfu()`` (2 x model MACs,
    each op at its dtype's peak); the old ``mfu`` / ``hfu`` names still answer, with a
    DeprecationWarning naming the new one. On one timed block the two definitions are
    ``Profile.mfu(flops="all", dtype=...)`` and ``Profile.mfu()``, and they differ."""
    model, clock = mlp(), FakeClock()
    meter = ThroughputMeter(model, device=CPU, every=10, warmup=0)
    meter._clock = clock
    ids = torch.randint(0, 16, (2, 5))
    run(meter, model, [ids] * 3, clock)
    reading = meter.reading()
    assert "mfu" not in reading.metrics() and "mfu_all_ops" in reading.metrics()
    assert set(throughput.METRICS) == set(reading.metrics())
    for old, new in throughput.RENAMED.items():
        with pytest.warns(DeprecationWarning, match=new):
            assert getattr(reading, old) == getattr(reading, new)
        with pytest.warns(DeprecationWarning, match=new):
            assert getattr(meter.history[0], old) == getattr(meter.history[0], new)
    text = str(reading)
    assert "MFU (all ops, one peak)" in text and "Profile.mfu() counts 2 x model MACs" in text
    with FlopCounter(model, timing=True) as fc:
        train_step(model, ids)
    seconds = fc.wall_s * CPU.peak_flops(torch.float32)
    assert fc.mfu(CPU, dtype=torch.float32, flops="all") == pytest.approx(
        fc.model_flops() / seconds)
    assert fc.mfu(CPU) == pytest.approx(2 * sum(
        s.model_macs for p, s in fc.by_phase().items() if p in ("forward", "backward"))
        / seconds)
    assert fc.model_flops() > 2 * fc.total.macs  # the bias adds: all ops count more
    assert fc.mfu_text(CPU, flops="all").startswith("MFU (all ops) ")
    assert fc.mfu_text(CPU).startswith("MFU ") and "all ops" not in fc.mfu_text(CPU)
