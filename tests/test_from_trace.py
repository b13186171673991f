"""``from_trace``: a recorded torch.profiler trace priced offline, against the live counter.

Oracles: a live ``FlopCounter`` count of the same run (a trace recorded here on the CPU, with
backward and an optimizer step; and the H100/MI300X BERT traces of tests/traces, whose model
is rebuilt from a config matching their recorded shapes), and the trace's own kernel records.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from dispatch_flops import FlopCounter, Profile, device_spec, from_trace
from dispatch_flops.__main__ import main
from dispatch_flops.engine.timing.trace_file import TraceFileError
from dispatch_flops.models import GPT, GPTConfig
from dispatch_flops.results.rows import KERNEL_ROW_PREFIX

TRACES = Path(__file__).parent / "traces"
BERT = {"h100": TRACES / "tracelens/h100_bert_small.json.gz",
        "mi300": TRACES / "tracelens/mi300_bert_small.json.gz"}
GELU = ("aten.gelu", "aten.gelu_backward")


def _raw(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


def _device_ns(trace: dict) -> int:
    return sum(round(float(e["dur"]) * 1000) for e in trace["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))


def _call_order(model: torch.nn.Module, run) -> list:
    """Module names in the order of their forward calls (the order a trace's module labels
    follow), each call once."""
    order: list = []
    hooks = [m.register_forward_pre_hook(lambda mod, args, name=name: order.append(name))
             for name, m in model.named_modules()]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return order


def _trace_modules_in_call_order(p: Profile) -> list:
    return list(p.module_facts.names)  # from_trace names them in the order they were called


# -- a trace recorded here: forward, backward and the optimizer --------------------------------


@pytest.fixture(scope="module")
def cpu_step(tmp_path_factory):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, max_seq_len=16, d_model=32, n_layer=2, n_head=2))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 64, (2, 16))

    def step():
        loss = model(x).float().logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    step()  # the optimizer's state made: the same ops in both runs below
    order = _call_order(model, lambda: model(x))
    with FlopCounter(model) as fc:
        step()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_modules=True,
                 with_stack=True) as prof:
        step()
    path = tmp_path_factory.mktemp("trace") / "step.json"
    prof.export_chrome_trace(str(path))
    return fc.to_profile(), from_trace(path), order, path


def _without(p: Profile, ops=GELU):
    """Per (module, phase): flops, MACs, bytes read and written of every op but ``ops``."""
    out: Counter = Counter()
    for key, counts in p.rows:
        if key.operator in ops:
            continue
        stats = dict(zip(("calls", "flops", "macs", "read", "written"), counts[:5]))
        for name in ("flops", "macs", "read", "written"):
            out[key.stack[-1], key.phase, name] += stats[name]
    return out


def test_a_cpu_trace_prices_as_the_live_counter_per_module_and_phase(cpu_step):
    live, priced, order, _ = cpu_step
    assert priced.run.pricing_errors[0].startswith("priced with string arguments")
    names = _trace_modules_in_call_order(priced)
    assert len(names) == len(order)  # one name per module, called once each
    rename = dict(zip(names, order))  # the trace's labels -> the live model's names
    found = Counter({(rename[m], phase, name): v for (m, phase, name), v in
                     _without(priced).items()})
    assert found == _without(live)  # every phase: forward, backward, optimizer, other
    # calls per phase alike, but for two conventions: the live counter sees record_function's
    # own ops (profiler.*), which a trace records as ranges; and the aten.detach calls
    # autograd makes when it saves an op's output, which a trace records inside that op's
    # range (no arithmetic, no bytes)
    def calls(p: Profile) -> Counter:
        return Counter({phase: sum(s.calls for op, s in p.by_operator(phase).items()
                                   if op != "aten.detach" and not op.startswith("profiler."))
                        for phase in ("forward", "backward", "optimizer", "other")})
    assert calls(priced) == calls(live)
    assert live.by_phase()["optimizer"].flops > 0 and live.by_phase()["backward"].flops > 0


def test_gelu_tanh_is_priced_as_its_default_and_said_so(cpu_step):
    """The convention that makes a trace differ: strings are not recorded, so gelu's
    approximate='tanh' (the GPT's) is priced as 'none'; the difference is exactly the two
    formulas' difference on the same shapes."""
    live, priced, _, _ = cpu_step
    assert "approximate='none'" in priced.run.pricing_errors[0]
    x = torch.randn(2, 16, 128, requires_grad=True)
    with FlopCounter() as tanh:
        torch.nn.functional.gelu(x, approximate="tanh").sum().backward()
    with FlopCounter() as erf:
        torch.nn.functional.gelu(x).sum().backward()
    per_layer = sum(tanh.by_operator()[op].flops - erf.by_operator()[op].flops for op in GELU)
    assert per_layer != 0
    assert live.total.flops - priced.total.flops == 2 * per_layer  # two layers
    assert live.total.macs == priced.total.macs


def test_a_cpu_trace_has_no_kernel_time(cpu_step):
    _, priced, _, _ = cpu_step
    assert not priced.timing and priced.kernel_time is None


# -- the real BERT traces: H100 and MI300X ---------------------------------------------------


@pytest.fixture(scope="module")
def bert_live():
    transformers = pytest.importorskip("transformers")
    trace = _raw(BERT["h100"])
    layers = sum(1 for e in trace["traceEvents"] if e.get("cat") == "python_function"
                 and e["name"].startswith("nn.Module: BertLayer_"))
    config = transformers.BertConfig(vocab_size=30522, hidden_size=512, num_hidden_layers=layers,
                                     num_attention_heads=8, intermediate_size=2048)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.BertLMHeadModel(config).eval().to(torch.bfloat16)
    x = torch.randint(0, 30522, (1, 141))  # the trace's recorded input: [1, 141] token ids
    with torch.no_grad():
        order = _call_order(model, lambda: model(input_ids=x))
        with FlopCounter(model) as fc:
            model(input_ids=x)
    return fc.to_profile(), order, layers


@pytest.mark.parametrize("device", sorted(BERT))
def test_bert_trace_equals_the_live_count_per_module(bert_live, device):
    live, order, layers = bert_live
    assert layers == 4
    priced = from_trace(BERT[device])
    names = _trace_modules_in_call_order(priced)
    assert len(names) == len(order) == 84
    rename = dict(zip(names, order))
    trace_modules = priced.by_module()
    live_modules = live.by_module()
    # what the recorded run ran and this one does not: transformers (4.5x, when it was
    # recorded) checked its mask with (mask == 1).all() on the [1, 141] mask in BertModel;
    # ours does not: aten.eq and aten.all, 141 flops each, stated and checked here
    extra = {op: s.flops for op, s in priced.by_operator().items() if op in ("aten.eq",
                                                                             "aten.all")}
    assert extra == {"aten.eq": 141, "aten.all": 141}
    assert "aten.eq" not in live.by_operator()
    for name, stats in trace_modules.items():
        other = live_modules[rename[name]]
        differs = sum(extra.values()) if rename[name] in ("", "bert") else 0
        assert stats.flops == other.flops + differs, name
        assert stats.macs == other.macs, name
    assert priced.total.macs == live.total.macs == 4_096_029_696


@pytest.mark.parametrize("device", sorted(BERT))
def test_bert_trace_kernel_time_and_device(device):
    priced = from_trace(BERT[device])
    raw = _raw(BERT[device])
    kernels = priced.kernel_time
    assert kernels is not None and kernels.device_s * 1e9 == pytest.approx(_device_ns(raw),
                                                                          abs=1)
    assert kernels.attributed_share == 1.0
    # every row's time adds up to the trace's kernel time
    assert sum(counts[-1] for _, counts in priced.rows) == _device_ns(raw)
    spec = device_spec(priced.run.device_name)
    assert spec is not None and spec.name == {"h100": "H100-SXM", "mi300": "MI300X"}[device]
    roofs = priced.roofline_by_operator(spec)
    assert roofs["aten.addmm"].efficiency is not None and 0 < roofs["aten.addmm"].efficiency
    assert priced.mfu(spec) > 0
    table = priced.table(depth=1)
    assert "BertModel_0" in table and "Kernel time" in table


def test_h100_and_mi300_traces_price_alike():
    h100, mi300 = from_trace(BERT["h100"]), from_trace(BERT["mi300"])
    assert h100.by_module().keys() == mi300.by_module().keys()
    for name, stats in h100.by_module().items():
        assert (stats.flops, stats.macs) == (mi300.by_module()[name].flops,
                                             mi300.by_module()[name].macs)


def test_a_priced_trace_round_trips_through_json(tmp_path):
    priced = from_trace(BERT["h100"])
    priced.to_json(tmp_path / "bert.json")
    back = Profile.from_json(tmp_path / "bert.json")
    assert back.total == priced.total
    assert back.kernel_time == priced.kernel_time
    assert back.by_module().keys() == priced.by_module().keys()


# -- traces with what cannot be priced -------------------------------------------------------


def test_b200_lists_what_it_cannot_price_with_its_kernel_time():
    priced = from_trace(TRACES / "tracelens/b200_vllm_gpt_oss.json.gz")
    raw = _raw(TRACES / "tracelens/b200_vllm_gpt_oss.json.gz")
    assert sum(counts[-1] for _, counts in priced.rows) == _device_ns(raw)
    unsupported = priced.unsupported_ops()
    assert "_C.fused_add_rms_norm" in unsupported  # vLLM's op: not registered here
    assert any(e.startswith("_C::fused_add_rms_norm: not an op this process knows")
               for e in priced.run.pricing_errors)
    by_op = priced.by_operator()
    assert by_op["_C.fused_add_rms_norm"].latency_s > 0  # its kernels' time, kept
    raw_triton = [op for op in by_op if op.startswith(KERNEL_ROW_PREFIX) and "triton" in op]
    assert raw_triton  # the raw Triton kernel launched by cuLaunchKernelEx: a row
    assert priced.total.flops > 0 and priced.run.device_name == "NVIDIA B200"


def test_a100_old_trace_states_its_shares():
    path = TRACES / "hta/a100_compiled_ddp.json.gz"
    priced = from_trace(path)
    kernels = priced.kernel_time
    assert kernels is not None
    assert kernels.unlinked == 872 and kernels.graph_replays == 70
    assert kernels.attributed_s + kernels.outside_s == pytest.approx(kernels.device_s)
    assert sum(counts[-1] for _, counts in priced.rows) == _device_ns(_raw(path))
    # torch of 2023: no scalar values recorded: stand-ins, said so
    assert any(e.startswith("priced with stand-in scalars") for e in priced.run.pricing_errors)
    assert priced.run.rank == 0 and priced.run.world_size == 16


def test_malformed_and_missing_files_are_refused(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(TraceFileError, match="not JSON"):
        from_trace(bad)
    with pytest.raises(ValueError, match="cannot read trace"):
        from_trace(tmp_path / "missing.json")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": []}))
    p = from_trace(empty)
    assert p.total.flops == 0 and not p.timing


def test_an_op_with_no_shapes_is_listed_not_zero():
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0,
               "dur": 2.0, "args": {"External id": 1}}]
    p = from_trace({"traceEvents": events})
    assert p.unsupported_ops() == {"aten.mm": 1}
    assert "record_shapes=True" in p.run.pricing_errors[0]


def test_the_command_line_prices_a_trace(capsys, tmp_path):
    out = tmp_path / "priced.json"
    os.environ.setdefault("COLUMNS", "100")
    main(["trace", str(BERT["h100"]), "--depth", "1", "--ops", "3", "--json", str(out)])
    text = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3" in text and "BertModel_0" in text
    assert "H100-SXM" in text and "aten.addmm" in text and "MFU" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert Profile.from_json(out).total.flops == from_trace(BERT["h100"]).total.flops
    with pytest.raises(SystemExit) as exc:
        main(["trace", str(tmp_path / "nope.json")])
    assert "cannot read trace" in str(exc.value.code)  # sys.exit(message): status 1


def test_an_int_list_never_picks_a_names_overload():
    """sum's recorded ['float', 'ScalarList', 'Scalar', ''] fit dim_IntList, never
    dim_DimnameList (a list of names, which torch 2.8 still has): a composite, which the
    pricing would walk into and lose the sum."""
    from dispatch_flops.engine.timing.trace_file import OpEvent
    from dispatch_flops.workflows.traces import _overload

    op = OpEvent(0, "aten::sum", 1, 0, 1, dims=((2, 16), (), (), ()),
                 types=("float", "ScalarList", "Scalar", ""), concrete=("", "[-1]", "False", ""))
    assert _overload(torch.ops.aten.sum, op) is torch.ops.aten.sum.dim_IntList
