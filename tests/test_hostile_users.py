"""What hostile users do to a counter and the workflows around it (issue 43): an interrupt at
any point of entering or leaving a counter, a step that raises inside a trainer, validation in
the middle of a step, odd batches, odd modules, odd figures. Each test says what must hold."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch._C._autograd import _top_saved_tensors_default_hooks as top_saved_tensors_hooks
from torch.autograd.graph import saved_tensors_hooks
from torch.nn.modules import module as module_globals
from torch.optim import optimizer as optim_globals
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils.hooks import RemovableHandle

import strategies
from dispatch_flops import FlopCounter
from dispatch_flops.engine.counting import active, tracker

# -- entering and leaving is all or nothing ----------------------------------------------------
from dispatch_flops.engine.graphs import compiled


class Experts(nn.Module):
    """A list of experts (so expert-load hooks are installed) under a router."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(4, 2)
        self.experts = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x):
        chosen = self.gate(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            out = out + (chosen == i)[:, None] * expert(x)
        return out


def _globals() -> tuple:
    """Everything a counter installs outside itself, as counts and identities."""
    hooks = (module_globals._global_forward_pre_hooks, module_globals._global_forward_hooks,
             module_globals._global_forward_hooks_always_called,
             optim_globals._global_optimizer_pre_hooks,
             optim_globals._global_optimizer_post_hooks)
    return (tuple(len(d) for d in hooks), tuple(_get_current_dispatch_mode_stack()),
            top_saved_tensors_hooks(False), len(active.COUNTING))


def _module_hooks(model) -> list:
    return [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]


class Interrupts:
    """Wraps every point where a counter installs or removes something; the ``k``-th call
    (from 1, counted over all of them) raises ``KeyboardInterrupt``, ``after`` the real call
    (its effect done, the interrupt landing before the caller saw it) or before it."""

    POINTS = [
        (tracker, "register_module_forward_pre_hook"),
        (tracker, "register_module_forward_hook"),
        (tracker, "register_optimizer_step_pre_hook"),
        (tracker, "register_optimizer_step_post_hook"),
        (RemovableHandle, "remove"),
        (nn.Module, "register_forward_pre_hook"),
        (TorchDispatchMode, "__enter__"),
        (TorchDispatchMode, "__exit__"),
        (saved_tensors_hooks, "__enter__"),
        (saved_tensors_hooks, "__exit__"),
        (active, "enter"),
        (active, "leave"),
    ]

    def __init__(self, monkeypatch, k: int, after: bool):
        self.k, self.after, self.calls, self.fired = k, after, 0, False
        for owner, name in self.POINTS:
            monkeypatch.setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, fn):
        def wrapped(*args, **kwargs):
            self.calls += 1
            fire = self.calls == self.k and self.armed
            if fire and not self.after:
                self.fired = True
                raise KeyboardInterrupt
            out = fn(*args, **kwargs)
            if fire:
                self.fired = True
                raise KeyboardInterrupt
            return out

        return wrapped

    armed = False


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("saved", [False, True], ids=["plain", "saved_activations"])
def test_an_interrupt_at_any_install_or_remove_point_leaves_nothing(monkeypatch, after, saved):
    """A KeyboardInterrupt at the k-th install or remove step of ``__enter__`` / ``__exit__``,
    for every k: the interrupt reaches the user, and no hook, mode, saved-tensors hook or
    compiled-graph registration is left; the next counter counts as one never interrupted."""
    torch.manual_seed(0)
    model, x = Experts(), torch.randn(3, 4)
    before, module_hooks = _globals(), _module_hooks(model)
    with FlopCounter(model, saved_activations=saved) as reference:
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)  # every run below starts with no gradient to add to
    k = 0
    while True:
        k += 1
        with monkeypatch.context() as patch:
            interrupts = Interrupts(patch, k, after)
            try:
                counter = FlopCounter(model, saved_activations=saved)
                interrupts.armed = True
                with counter:
                    interrupts.armed = False
                    model(x).sum().backward()
                    interrupts.armed = True
            except KeyboardInterrupt:
                assert interrupts.fired
            interrupts.armed = False
        model.zero_grad(set_to_none=True)
        assert _globals() == before, k
        assert _module_hooks(model) == module_hooks, k
        with FlopCounter(model, saved_activations=saved) as again:
            model(x).sum().backward()
        model.zero_grad(set_to_none=True)
        assert again.total == reference.total, k
        if not interrupts.fired:
            break
    assert k > 8  # every point was reached


def test_users_saved_tensors_hooks_opened_inside_and_closed_after_keep_working():
    """A user's saved-tensors hooks entered inside the block and exited after it are still
    called after the counter exits, and exit cleanly (their own pop, not the counter's)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    packed = []
    users = saved_tensors_hooks(lambda t: packed.append(1) or t, lambda t: t)
    counter = FlopCounter(model, saved_activations=True)
    counter.__enter__()
    users.__enter__()
    counter.__exit__(None, None, None)
    packed.clear()
    model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert packed  # still the user's hooks
    users.__exit__(None, None, None)
    assert top_saved_tensors_hooks(False) is None


class ConfigBacked(nn.Module):
    """A module whose attributes come from a config dict, raising KeyError (not
    AttributeError) for a name it lacks: ``getattr(m, "num_experts", None)`` raises."""

    def __init__(self):
        super().__init__()
        self.config = {"hidden": 4}
        self.proj = nn.Linear(4, 4)

    def __getattr__(self, name):
        if name in ("config", "_parameters", "_buffers", "_modules") or name.startswith("__"):
            return super().__getattr__(name)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return self.config[name]  # KeyError

    def forward(self, x):
        return self.proj(x)


class SomeExperts(ConfigBacked):
    """Named like fused experts, with no num_experts in its config."""


def test_a_config_backed_getattr_does_not_break_entering():
    """Expert detection reads ``num_experts`` of modules named ``*Experts``: one whose
    ``__getattr__`` raises KeyError is no expert, and the counter enters, counts, leaves."""
    model = nn.Sequential(ConfigBacked(), SomeExperts())
    before = _globals()
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    assert fc.total.macs == 2 * 2 * 4 * 4
    assert fc.experts() == {}
    assert _globals() == before


# -- training loops close their counter on every exit path -------------------------------------


class Regressor(nn.Module):
    """A model the Trainer and Lightning run; its ``fail_at``-th forward call raises."""

    def __init__(self, fail_at=None):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.fail_at, self.calls = fail_at, 0

    def forward(self, x, labels=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("a step that raises")
        out = self.lin(x)
        return {"loss": ((out - labels) ** 2).mean()}


def regression_rows(n=8):
    torch.manual_seed(0)
    return [{"x": torch.randn(4), "labels": torch.randn(2)} for _ in range(n)]


@pytest.mark.slow
def test_transformers_step_that_raises_leaves_nothing_and_a_retry_counts(tmp_path):
    """A counted step raising inside ``Trainer.train()``, caught by the user: no counting
    mode, no global hook left; training again works and counts its steps."""
    transformers = pytest.importorskip("transformers")
    from dispatch_flops.integrations.transformers import FlopsCallback

    model = Regressor(fail_at=3)
    callback = FlopsCallback(every=1, warmup=0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, report_to=[],
        save_strategy="no", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
        logging_steps=1)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=regression_rows(),
                                   callbacks=[callback])
    before = _globals()
    with pytest.raises(RuntimeError, match="a step that raises"):
        trainer.train()
    assert _globals() == before
    trainer.train()  # the retry
    assert _globals() == before
    # forward and the weight gradient (the input needs none), per step of 2 rows
    assert callback.profile is not None and callback.profile.total.macs == 2 * (2 * 4 * 2)


@pytest.mark.slow
def test_lightning_step_that_raises_leaves_nothing_and_a_retry_counts():
    """The same with Lightning's ``trainer.fit()``."""
    lightning = pytest.importorskip("lightning")
    from dispatch_flops.integrations.lightning import FlopsCallback

    model = Regressor(fail_at=3)

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            return self.model(**batch)["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(callback):
        trainer = lightning.Trainer(max_steps=4, accelerator="cpu", logger=False,
                                    callbacks=[callback], enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Module(), torch.utils.data.DataLoader(regression_rows(), batch_size=2))

    callback = FlopsCallback(every=1, warmup=0)
    before = _globals()
    with pytest.raises(RuntimeError, match="a step that raises"):
        fit(callback)
    assert _globals() == before
    fit(callback)
    assert _globals() == before
    # forward and the weight gradient (the input needs none), per step of 2 rows
    assert callback.profile is not None and callback.profile.total.macs == 2 * (2 * 4 * 2)


@pytest.mark.slow
def test_lightning_validation_inside_a_step_is_not_the_steps(monkeypatch):
    """``accumulate_grad_batches=2, val_check_interval=3``: validation runs between two
    micro-batches of a step. A counted step is priced at its two micro-batches' flops (no
    validation forward), a timed step takes its micro-batches' time (no validation time)."""
    lightning = pytest.importorskip("lightning")
    from types import SimpleNamespace

    from dispatch_flops import DeviceSpec
    from dispatch_flops.integrations.lightning import FlopsCallback
    from dispatch_flops.workflows import throughput

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    model, rows = Regressor(), regression_rows(24)

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            clock.now += 0.25
            return self.model(**batch)["loss"]

        def validation_step(self, batch, batch_idx):
            clock.now += 100.0  # validation is slow
            return self.model(**batch)["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = FlopsCallback(every=2, warmup=1, device=DeviceSpec.cpu(1e11, 2e10))
    trainer = lightning.Trainer(max_steps=6, accelerator="cpu", logger=False,
                                callbacks=[callback], enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                accumulate_grad_batches=2, val_check_interval=3,
                                num_sanity_val_steps=0, limit_val_batches=2)
    loader = torch.utils.data.DataLoader(rows, batch_size=2)
    trainer.fit(Module(), loader, loader)
    batch = {k: torch.stack([r[k] for r in rows[:2]]) for k in rows[0]}
    with FlopCounter(model) as fc:
        for _ in range(2):  # a step: two micro-batches
            model(**batch)["loss"].backward()
    prices = {p.model_flops for p in callback.meter._step_flops.values()}
    assert prices == {fc.model_flops()}
    reading = callback.meter.reading()
    assert reading.steps >= 2 and reading.step_s == 2 * 0.25


# -- the meter sees through batches ---------------------------------------------------------


def _lm():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))


def _meter_run(batches, ids_of, **kwargs):
    """Steps over ``batches`` (every step after the first timed unless its signature is new);
    the meter and what each step priced."""
    from dispatch_flops import DeviceSpec, ThroughputMeter

    model = _lm()
    meter = ThroughputMeter(model, every=100, warmup=0, device=DeviceSpec.cpu(1e11, 2e10))
    for batch in batches:
        with meter.step(batch, **kwargs):
            model(ids_of(batch)).sum().backward()
    return meter, model


def test_a_dataclass_batch_is_priced_by_its_fields():
    """A dataclass batch whose length goes 8 -> 64: the 64-token steps are counted anew and
    timed at their own flops, with their tokens."""
    import dataclasses

    @dataclasses.dataclass
    class Batch:
        input_ids: torch.Tensor
        note: str = "train"

    batches = [Batch(torch.zeros(2, n, dtype=torch.long)) for n in (8, 8, 64, 64)]
    meter, model = _meter_run(batches, lambda b: b.input_ids)
    with FlopCounter(model) as fc:
        model(batches[-1].input_ids).sum().backward()
    last = meter.history[-1]
    assert last.model_flops == fc.model_flops() and last.tokens == 2 * 64
    assert [s.tokens for s in meter.history] == [16, 128]


def test_a_list_of_strings_is_its_length_and_other_objects_are_said():
    """Texts differ every step: a list of strings is its length (steps are timed, not all
    counted); a batch object the meter cannot see into is a warning, once."""
    texts = [["a b", "c"], ["d e f", "g"], ["h", "i j"]]
    meter, _ = _meter_run([{"text": t, "ids": torch.zeros(2, 4, dtype=torch.long)}
                           for t in texts], lambda b: b["ids"])
    assert len(meter.history) == 2

    class Opaque:
        def __init__(self, n):
            self.ids = torch.zeros(2, n, dtype=torch.long)

    with pytest.warns(RuntimeWarning, match="cannot see") as warned:
        _meter_run([Opaque(4), Opaque(8)], lambda b: b.ids)
    assert len([w for w in warned if "cannot see" in str(w.message)]) == 1


@pytest.mark.parametrize("tokens", [-5, float("nan"), float("inf"), 2.5, "8", True])
def test_tokens_must_be_a_count(tokens):
    from dispatch_flops import ThroughputMeter

    meter = ThroughputMeter(_lm())
    with pytest.raises(ValueError, match="tokens must be"):
        meter.begin(tokens=tokens)


# -- figures and devices ------------------------------------------------------------------


@pytest.mark.parametrize("peaks, bandwidth", [
    ({"float32": float("nan")}, 1e9), ({"float32": float("inf")}, 1e9),
    ({"float32": 1e12}, float("nan")), ({"float32": 1e12}, float("inf"))])
def test_device_spec_refuses_non_finite_figures(peaks, bandwidth):
    from dispatch_flops import DeviceSpec

    with pytest.raises(ValueError, match="positive"):
        DeviceSpec("x", peaks, bandwidth)
    with pytest.raises(ValueError, match="interconnect_bandwidth"):
        DeviceSpec("x", {"float32": 1e12}, 1e9, interconnect_bandwidth=float("nan"))


def test_calibrate_runs_outside_an_open_counter_and_leaves_the_rng():
    """Its matmuls are not the user's counts; the global generator draws what it would
    have."""
    from dispatch_flops import DeviceSpec

    torch.manual_seed(7)
    expected = torch.rand(3)
    model = nn.Linear(4, 4)
    with FlopCounter(model) as fc:
        spec = DeviceSpec.calibrate("cpu", budget_s=0.5)
        model(torch.zeros(1, 4))
    assert fc.total.macs == 16 and spec.peak_flops("float32") > 0
    torch.manual_seed(7)
    DeviceSpec.calibrate("cpu", budget_s=0.5)
    assert torch.equal(torch.rand(3), expected)


def test_device_spec_takes_an_index_or_says_why_not():
    from dispatch_flops.results.roofline import device_spec

    assert device_spec(torch.device("cpu")) is None
    if torch.cuda.is_available():
        assert device_spec(0) == device_spec()
    else:
        with pytest.raises(ValueError, match="no such CUDA device"):
            device_spec(0)
    with pytest.raises(ValueError, match="a CUDA device index"):
        device_spec(1.5)


def test_experts_table_of_a_file_with_a_layer_listing_no_expert(tmp_path):
    """A loadable JSON whose experts entry lists no expert: the table still prints."""
    import json

    from moe_models import ListMoE

    from dispatch_flops import Profile

    model = ListMoE(4, 8, 2, [0, 1, 0])
    with FlopCounter(model) as fc:
        model(torch.randn(3, 4))
    data = fc.to_profile().to_dict()
    data["experts"] = [{**data["experts"][0], "tokens": [], "rows": []}]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    assert "experts" in Profile.from_json(path).experts_table()


# -- conventions read the model right ----------------------------------------------------------


class DenseTopK(nn.Module):
    """A dense model: four layers in a ModuleList, all run, and a top-2 of 4 candidate
    scores in its head (no router, no experts)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.score = nn.Linear(8, 4)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.score(x).topk(2, dim=-1).values


def test_a_dense_model_with_a_topk_over_a_module_list_has_no_experts():
    model = DenseTopK()
    with FlopCounter(model) as fc:
        model(torch.zeros(2, 3, dtype=torch.long)).sum().backward()
    c = fc.conventions(tokens=6)
    assert c.shape.experts == () and c.shape.inactive == 0
    assert c.shape.parameters == sum(p.numel() for p in model.parameters())
    text = str(c)
    assert "experts" not in text.splitlines()[1]
    assert "varies" not in text and "attention: none counted" in text  # no attention at all


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x).view(1, x.shape[0], 2, 4).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(h, h, h)


class EncoderDecoder(nn.Module):
    """One encoder attention over 12 tokens, one decoder attention over 4."""

    def __init__(self):
        super().__init__()
        self.encoder = SelfAttention()
        self.decoder = SelfAttention()

    def forward(self, source, target):
        return self.encoder(source).sum() + self.decoder(target).sum()


def test_an_encoder_decoder_says_which_tokens_the_figures_are_per():
    model = EncoderDecoder()
    with FlopCounter(model) as fc:
        model(torch.randn(12, 8), torch.randn(4, 8))
    c = fc.conventions()
    assert c.shape.token_counts == (12, 4)
    assert "12 and 4 tokens" in str(c) and "tokens=" in str(c)
    assert fc.conventions(tokens=16).shape.tokens == 16


def test_a_reused_block_mask_follows_its_captured_tensors_changed_in_place():
    """A BlockMask whose mask_mod reads document ids that the user changes in place: the
    masked pairs of the next call are the new ids' (the cache knows the tensor's version)."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    docs = torch.tensor([0] * 8 + [1] * 8)

    def same_document(b, h, q, kv):
        return docs[q] == docs[kv]

    block_mask = flex.create_block_mask(same_document, None, None, 16, 16, device="cpu")
    q = torch.randn(1, 1, 16, 8)

    def masked():
        with FlopCounter() as fc:
            flex.flex_attention(q, q, q, block_mask=block_mask)
        return fc.total.flops - fc.total.model_flops

    before = masked()
    docs.copy_(torch.tensor([0] * 4 + [1] * 12))
    after = masked()
    # unmasked pairs: 2 x 8 x 8 = 128, then 4 x 4 + 12 x 12 = 160, of 256
    assert before * (256 - 160) == after * (256 - 128)


# -- compiled graphs with scalar inputs -------------------------------------------------------


@pytest.mark.slow
def test_a_compiled_graph_taking_a_python_float_is_counted_not_a_crash():
    """``torch.compile``d ``x * s + 1`` called with a second float: dynamo passes ``s`` as a
    0-d tensor it reads with ``item()``; pricing on fake tensors reads it as a symbol (a shape
    environment): the counts are eager's."""

    @torch.compile  # inductor: what users run
    def scale(x, s):
        return x * s + 1

    x = torch.randn(4, 4)
    scale(x, 2.0)
    with FlopCounter() as fc:
        scale(x, 3.0)
        scale(x, 4.0)
    with FlopCounter() as eager:
        for s in (3.0, 4.0):
            x * s + 1
    assert fc.total.flops == eager.total.flops == 2 * 2 * 16
    assert not fc.unsupported_ops()


@pytest.mark.slow
def test_a_graph_that_cannot_be_priced_is_counted_as_eager_with_a_warning(monkeypatch):
    """A fake run that fails on fake tensors (whatever the reason): a warning, and the graph's
    runs inside the counter are the traced graph run op by op: eager's counts, eager's
    result."""

    def refuse(*args, **kwargs):
        raise RuntimeError("fake tensors cannot run this")

    @torch.compile
    def mlp(x, w):
        return torch.relu(x @ w).sum()

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    mlp(x, w)
    monkeypatch.setattr(compiled.Graph, "_count_on_fake", refuse)
    with pytest.warns(RuntimeWarning, match="counted as eager"):
        with FlopCounter() as fc:
            out = mlp(x, w)
    assert torch.allclose(out, torch.relu(x @ w).sum())
    assert fc.total.macs == 4 * 8 * 8


@settings(max_examples=25, deadline=None)
@given(build=strategies.batch_builders(), lengths=st.tuples(st.integers(1, 9),
                                                           st.integers(1, 9)))
def test_a_batch_signature_sees_its_lengths_through_any_container(build, lengths):
    """However the batch nests its tensors, two batches have one signature exactly when
    their lengths are equal, and no container is opaque."""
    from dispatch_flops.workflows.throughput import _opaque, input_signature

    a, b = (input_signature(build(n)) for n in lengths)
    assert (a == b) == (lengths[0] == lengths[1])
    assert _opaque(a) is None
