"""The DeepSpeed-compatible API and printout: get_model_profile, FlopsProfiler, the torch
FlopCounterMode surface, activation bytes and shapes, and the number formatter."""

import os
import re
import socket
import time
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from bert import BertModel
from torch import nn
from torch.nn.modules import module as module_globals
from torch.optim import optimizer as optimizer_globals

import helpers
from dispatch_flops import (
    BACKWARD,
    FORWARD,
    OPTIMIZER,
    ROOT,
    FlopCounter,
    FlopsProfiler,
    get_model_profile,
    human,
)
from dispatch_flops.models import MLP, GPTConfig
from dispatch_flops.results.format import duration

TINY = GPTConfig(n_layer=2, d_model=32, n_head=2, vocab_size=64, max_seq_len=16)


def hook_state(model):
    """Every hook registry a profile could touch: global module and optimizer hooks, each
    module's hook dicts, and the dispatch mode stack."""
    globals_ = {name: len(value) for name, value in vars(module_globals).items()
                if name.startswith("_global_") and "hook" in name and hasattr(value, "__len__")}
    globals_.update({name: len(getattr(optimizer_globals, name)) for name in
                     ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")})
    per_module = [{k: len(v) for k, v in vars(m).items() if "hook" in k and hasattr(v, "__len__")}
                  for m in model.modules()]
    return globals_, per_module, torch._C._len_torch_dispatch_stack()


def detailed_lines(text):
    """The detailed profile's module lines (named_modules order), each cut after the class."""
    section = text.split("Detailed Profile per device")[1]
    return [line.strip() for line in section.splitlines() if "% Params" in line]


def items_of(line, n=8):
    """The first ``n`` comma-separated items of a module line (they hold no commas)."""
    body = re.sub(r"^(\([^)]*\): )?\w+\(", "", line)  # a one-line (leaf) module
    return body.split(", ", n)[:n]


def summary_value(text, label):
    """The value printed after ``label`` on a summary line."""
    found = re.search(rf"^{re.escape(label)}\s+(.+)$", text, re.M)
    return found.group(1) if found else None


def mask_timing(text):
    """The printout without anything measured in time."""
    text = re.sub(r"fwd latency - \{.*\}", "fwd latency - <top>", text)  # ranked by time
    text = re.sub(r"-?\d+(\.\d+)? (s|ms|us|ns)\b", "<t>", text)
    text = re.sub(r"[\d.]+ [KMGTP]?FLOPS", "<F>", text)
    text = re.sub(r"[\d.]+% latency", "<p> latency", text)
    text = re.sub(r"'latency%': '[^']*'", "'latency%': <p>", text)
    return re.sub(r"samples/second:\s+\S+", "samples/second: <r>", text)


# -- printout -----------------------------------------------------------------------------
def test_golden_forward_profile(golden):
    """The full printout of a small GPT forward, timing off: summary, aggregated, detailed."""
    model, idx = helpers.tiny_gpt(TINY), helpers.tiny_ids(config=TINY)
    prof = FlopsProfiler(model, timing=False)
    with torch.no_grad():
        prof.start_profile()
        model(idx)
        prof.stop_profile()
    golden("deepspeed_gpt_forward.txt", prof.model_profile(top_modules=2))


def test_golden_training_step_profile(golden):
    """A profiled training step prints measured backward and optimizer lines."""
    model, idx = helpers.tiny_gpt(TINY), helpers.tiny_ids(config=TINY)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = FlopsProfiler(model, timing=False, batch_size=2)
    with prof:
        model(idx).logsumexp(-1).mean().backward()
        optimizer.step()
    text = prof.model_profile(profile_step=3, module_depth=1, module_ops=False)
    golden("deepspeed_gpt_train_step.txt", text)
    phases = prof.counter.by_phase()
    # flops lines are DeepSpeed's figure, 2 x MACs; the optimizer has no MACs: its all-ops
    assert summary_value(text, "bwd flops per device:") == human(2 * phases[BACKWARD].macs,
                                                                 compact=True)
    assert summary_value(text, "step flops per device (all ops):") == human(
        phases[OPTIMIZER].flops, compact=True)


def test_printed_module_numbers_equal_by_module():
    """Each detailed line's params, MACs, latency, FLOPS and activation bytes are
    by_module(phase="forward")'s, formatted by the one formatter."""
    model, idx = helpers.tiny_gpt(TINY), helpers.tiny_ids(config=TINY)
    prof = FlopsProfiler(model)
    with prof:
        model(idx)
    text = prof.model_profile()
    modules = prof.counter.by_module(phase=FORWARD)
    acts = prof.activations()
    lines = detailed_lines(text)
    names = [name for name, _ in model.named_modules()]
    assert len(lines) == len(names)
    for name, line in zip(names, lines):
        params, _, macs, _, latency, _, flops_s, act = items_of(line)
        m = modules.get(name)
        assert params == human(sum(p.numel() for p in model.get_submodule(name).parameters()),
                               compact=True), name
        assert params == human(m.params, compact=True), name
        assert macs == human(m.macs, "MACs", compact=True), name
        assert latency == duration(m.latency_s, compact=True), name
        assert flops_s == human(2 * m.macs / m.latency_s, "FLOPS", compact=True), name
        output_bytes = acts[name].output_bytes if name in acts else 0  # containers: none
        assert act == human(output_bytes, "B", compact=True) + " activation", name
    assert summary_value(text, "fwd latency:") == duration(modules[ROOT].latency_s, compact=True)


@pytest.mark.slow
def test_bert_base_printout_reproduces_seed_macs(tmp_path):
    """BERT-base, batch 1, 128 tokens: the printed MACs of the root, the self-attention, the
    query Linear, the intermediate block and the pooler are flops-profiler's seed figures."""
    torch.manual_seed(0)
    model = BertModel()
    ids = torch.randint(0, 30522, (1, 128))
    out = tmp_path / "bert.txt"
    flops, macs, params = get_model_profile(model, args=[ids], output_file=str(out),
                                            module_ops=False)
    assert (macs, params) == ("11.17 GMACs", "109.48 M")
    lines = dict(zip((name for name, _ in model.named_modules()),
                     detailed_lines(out.read_text()), strict=True))
    seed = {ROOT: "11.17 GMACs", "encoder.layer.0.attention.self": "251.66 MMACs",
            "encoder.layer.0.attention.self.query": "75.5 MMACs",
            "encoder.layer.0.intermediate": "301.99 MMACs", "pooler": "589.82 KMACs"}
    assert {name: items_of(lines[name])[2] for name in seed} == seed


def test_module_depth_top_modules_and_ignored_modules():
    """module_depth cuts both views, top_modules the aggregated dicts; an ignored class is
    not shown, its work stays in its parent (totals unchanged, ops folded in)."""
    model, idx = helpers.tiny_gpt(TINY), helpers.tiny_ids(config=TINY)
    prof = FlopsProfiler(model, timing=False)
    with prof:
        model(idx)
    total = prof.get_total_flops()
    text = prof.model_profile(module_depth=1, top_modules=3)
    assert "depth 1:" in text and "depth 2:" not in text
    assert len(detailed_lines(text)) == 1 + len(list(model.children()))
    depth_1 = text.split("depth 1:")[1].splitlines()[1]  # Embedding, ModuleList, LayerNorm, Linear
    assert depth_1.startswith("    params      - {") and depth_1.count("': '") == 3

    prof.start_profile(ignore_list=[MLP])
    model(idx)
    prof.stop_profile()
    text = prof.model_profile()
    assert prof.get_total_flops() == total
    assert "(mlp): MLP(" not in text and "(fc): Linear" not in text
    shown = [name for name, _ in model.named_modules() if ".mlp" not in name]
    lines = dict(zip(shown, detailed_lines(text), strict=True))
    assert "'aten.gelu'" in lines["blocks.0"] and "'aten.addmm'" in lines["blocks.0"]
    forward_macs = prof.counter.by_module(phase=FORWARD)["blocks.0"].macs
    assert items_of(lines["blocks.0"])[2] == human(forward_macs, "MACs", compact=True)


# -- get_model_profile --------------------------------------------------------------------
class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.drop = nn.Dropout(0.1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.drop(self.fc(x))

    def generate(self, x, steps=3):
        for _ in range(steps):
            x = torch.cat([x[:, 4:], self(x)], dim=1)
        return x


def test_get_model_profile_returns_strings_or_numbers_and_restores_the_model(tmp_path):
    """DeepSpeed's return values; input_shape gives the batch size; the model's train/eval
    flags and hooks are as before, even when the profiled call raises."""
    model = Tiny()
    model.train()
    model.drop.eval()
    before = hook_state(model)
    out = tmp_path / "profile.txt"
    flops, macs, params = get_model_profile(model, input_shape=(4, 8), output_file=str(out),
                                            warm_up=2)
    assert (macs, params) == ("128 MACs", "36")
    numbers = get_model_profile(model, input_shape=(4, 8), as_string=False, print_profile=False)
    assert numbers[1] == 4 * 8 * 4 and numbers[2] == 36
    text = out.read_text()
    assert "Profile Summary at step 2:" in text and "batch size per device:" in text
    assert re.search(r"samples/second:\s+\d", text)
    assert (model.training, model.fc.training, model.drop.training) == (True, True, False)
    assert hook_state(model) == before

    def fail_on_profiled_call(x):
        if model.calls >= 2:
            raise RuntimeError("boom")
        return x
    model.calls = 0
    model.fc.register_forward_hook(lambda m, a, out: fail_on_profiled_call(out))
    before = hook_state(model)
    with pytest.raises(RuntimeError, match="boom"):
        get_model_profile(model, input_shape=(4, 8), print_profile=False)
    assert hook_state(model) == before
    assert (model.training, model.drop.training) == (True, False)


def test_func_name_profiles_any_method():
    """func_name="generate" profiles model.generate: every forward it makes is counted."""
    model = Tiny().eval()  # as get_model_profile runs it: dropout off
    x = torch.ones(2, 8)
    with FlopCounter(model) as fc:
        model.generate(x, steps=3)
    flops, macs, _ = get_model_profile(model, args=[x], kwargs={"steps": 3}, print_profile=False,
                                       func_name="generate", as_string=False)
    assert (flops, macs) == (2 * fc.by_phase()[FORWARD].macs, fc.by_phase()[FORWARD].macs)
    assert macs == 3 * 2 * 8 * 4


# -- FlopsProfiler in a training loop -----------------------------------------------------
def test_training_loop_profiles_each_step_afresh_and_leaves_no_hooks(tmp_path):
    """The DeepSpeed tutorial's loop: the totals printed at step 5 are those at step 6 (no
    accumulation, with or without reset_profile), and no hook is left behind."""
    model, idx = helpers.tiny_gpt(TINY), helpers.tiny_ids(config=TINY)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = hook_state(model)
    prof = FlopsProfiler(model)
    printed, totals = {}, {}
    for step in range(8):
        if step in (5, 6):
            prof.start_profile()
        loss = model(idx).logsumexp(-1).mean()
        if step in (5, 6):
            prof.stop_profile()
            totals[step] = (prof.get_total_flops(), prof.get_total_macs(),
                            prof.get_total_params(), prof.get_total_flops(as_string=True))
            out = tmp_path / f"step{step}.txt"
            prof.print_model_profile(profile_step=step, output_file=str(out))
            printed[step] = mask_timing(out.read_text()).replace(f"step {step}:", "step N:")
            assert prof.get_total_duration() > 0
            prof.end_profile()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert totals[5] == totals[6] and totals[5][0] > 0
    assert printed[5] == printed[6]
    assert hook_state(model) == before

    prof.start_profile()
    model(idx).logsumexp(-1).mean()
    prof.reset_profile()  # still profiling, from zero
    model(idx).logsumexp(-1).mean()
    prof.stop_profile()
    assert prof.get_total_flops() == totals[5][0]
    assert prof.counter.by_module()[ROOT].calls == 1
    prof.end_profile()
    assert prof.counter is None and hook_state(model) == before


def test_backward_inside_the_profile_is_measured():
    """Backward and optimizer run between start and stop are counted and timed: the summary
    prints their measured flops and latency, not 2 x forward."""
    model, idx = helpers.tiny_gpt(TINY), helpers.tiny_ids(config=TINY)
    optimizer = torch.optim.Adam(model.parameters())
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(idx).logsumexp(-1).mean().backward()
    optimizer.step()
    prof.stop_profile()
    phases = prof.counter.by_phase()
    text = prof.model_profile()
    assert phases[BACKWARD].flops not in (0, 2 * phases[FORWARD].flops)
    assert summary_value(text, "bwd MACs per device:") == human(phases[BACKWARD].macs, "MACs",
                                                                compact=True)
    assert summary_value(text, "bwd latency:") == duration(phases[BACKWARD].latency_s,
                                                           compact=True)
    assert summary_value(text, "step flops per device (all ops):") == human(
        phases[OPTIMIZER].flops, compact=True)
    assert "fwd+bwd FLOPS per device" in text and "iter latency:" in text
    prof.end_profile()


# -- torch.distributed ----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_world_sizes_from_a_real_gloo_group(tmp_path):
    """Two spawned ranks in a gloo group print world size 2; dp = world / mp."""
    import dist_worker

    context = mp.start_processes(dist_worker.profile_rank, args=(2, _free_port(), str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, "the gloo ranks did not finish in 120 s"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
    for rank in (0, 1):
        for mp_size, dp_size in ((1, 2), (2, 1)):
            text = (tmp_path / f"rank{rank}_mp{mp_size}.txt").read_text()
            for label, value in (("world size:", 2), ("data parallel size:", dp_size),
                                 ("model parallel size:", mp_size)):
                assert summary_value(text, label) == str(value), (rank, label)
            params = summary_value(text, "params per device:")
            of_model = summary_value(text, "params of model = params per device * mp_size:")
            assert int(of_model) == mp_size * int(params)


def test_no_world_lines_without_a_process_group():
    model = Tiny()
    prof = FlopsProfiler(model, timing=False)
    with prof:
        model(torch.ones(1, 8))
    assert "world size" not in prof.model_profile(detailed=False)


# -- DeepSpeed's engine surface -------------------------------------------------------------
def engine(**sizes):
    """What DeepSpeed's profiler reads from its engine (a stand-in, no deepspeed needed)."""
    fields = dict(world_size=8, dp_world_size=2, seq_dp_world_size=None, mp_world_size=1,
                  has_moe_layers=False, train_micro_batch_size_per_gpu=lambda: 3,
                  wall_clock_breakdown=lambda: False)
    fields.update(sizes)
    return SimpleNamespace(**fields)


def test_engine_builds_the_profiler_and_reads_flops_macs_params():
    """FlopsProfiler(module, engine, recompute_fwd_factor), positionally as the engine builds
    it; print_model_profile (here while still profiling, as the engine may) sets .flops
    (2 x MACs), .macs and .params, DeepSpeed's figures: a Linear(10, 10) on 3 rows is 300
    MACs; its bias add and the loss are in counter.total.flops only."""
    model = nn.Sequential(nn.Linear(10, 10))
    prof = FlopsProfiler(model, engine(), 0.5)
    assert (prof.flops, prof.macs, prof.params, prof.recompute_fwd_factor) == (None, None,
                                                                              None, 0.5)
    prof.start_profile()
    nn.functional.cross_entropy(model(torch.randn(3, 10)), torch.tensor([0, 1, 2]))
    text = prof.model_profile(detailed=False)
    prof.print_model_profile(detailed=False, output_file=os.devnull)
    assert (prof.flops, prof.macs, prof.params) == (2 * 300, 300, 10 * 10 + 10)
    assert prof.counter.by_phase()[FORWARD].flops > prof.flops
    assert summary_value(text, "fwd flops per device:") == "600"
    assert summary_value(text, "batch size per device:") == "3"
    prof.end_profile()
    with pytest.raises(ValueError, match="recompute_fwd_factor"):
        FlopsProfiler(model, None, -1.0)


def test_world_lines_whenever_an_engine_is_given():
    """No process group: the engine's sizes are printed; dp is the sequence-data-parallel size
    when the engine's dp size is None (Ulysses); an engine set after construction counts."""
    model = nn.Sequential(nn.Linear(4, 4))
    prof = FlopsProfiler(model, timing=False)
    prof.ds_engine = engine(dp_world_size=None, seq_dp_world_size=4, mp_world_size=2)
    with prof:
        model(torch.ones(2, 4))
    text = prof.model_profile(detailed=False)
    for label, value in (("world size:", "8"), ("data parallel size:", "4"),
                         ("model parallel size:", "2")):
        assert summary_value(text, label) == value, label
    assert summary_value(text, "params of model = params per device * mp_size:") == "40"
    prof.ds_engine = engine()
    assert summary_value(prof.model_profile(detailed=False), "data parallel size:") == "2"


def test_mode_names_the_method_as_func_name_does():
    """get_model_profile(mode=...) is DeepSpeed's name for func_name."""
    model = Tiny()
    x = torch.ones(2, 8)
    by_mode = get_model_profile(model, args=[x], print_profile=False, mode="generate",
                                as_string=False)
    by_name = get_model_profile(model, args=[x], print_profile=False, func_name="generate",
                                as_string=False)
    assert by_mode == by_name and by_mode[1] == 3 * 2 * 8 * 4  # three forwards of fc
    with pytest.raises(ValueError, match="give one"):
        get_model_profile(model, args=[x], func_name="generate", mode="forward")
