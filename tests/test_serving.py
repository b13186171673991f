"""Serving's cost model (workflows.serving): found by counting, checked by counting.

Oracle: a live FlopCounter count of each request's forward on meta (``count_forward``: the
prefix run into a fresh cache, the new tokens counted with their logit rows). A batch's cost
is the sum of its requests' forwards (the per-request accounting engines use), so 200 drawn
batches per family are checked against the live counts of a pool of drawn requests.
"""

from __future__ import annotations

import random

import pytest
import torch

from dispatch_flops.workflows.serving import (
    FIGURES,
    SGLANG,
    VLLM,
    CostModel,
    FitError,
    Request,
    ServingMeter,
    _windowed_pairs,
    count_forward,
)

transformers = pytest.importorskip("transformers")

FAMILIES = {
    "gpt2": lambda: transformers.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=2,
                                            n_positions=256),
    "llama-gqa": lambda: transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
}
MISTRAL = lambda: transformers.MistralConfig(  # noqa: E731
    vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, sliding_window=6, max_position_embeddings=256)


def _model(config):
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    config = FAMILIES[request.param]()
    model = _model(config)
    cost = CostModel.from_model(model)
    rng = random.Random(7)
    pool = []
    for _ in range(30):  # requests drawn across the window, decode steps and prefills
        n = rng.choice((1, rng.randint(1, 20)))
        p = rng.choice((0, rng.randint(0, 30)))
        pool.append(Request(n, p, rng.choice((1, n))))
    counted = {r: count_forward(model, r) for r in set(pool)}
    return request.param, cost, pool, counted


def test_two_hundred_drawn_batches_equal_live_counts(family):
    name, cost, pool, counted = family
    rng = random.Random(11)
    for _ in range(200):
        batch = rng.sample(pool, rng.randint(1, 6))
        want = [sum(counted[r][k] for r in batch) for k in range(len(FIGURES))]
        got = cost.cost(batch)
        assert [got[f] for f in FIGURES] == want, (name, batch)
        n, p, lg = zip(*batch)
        assert cost.cost_arrays(list(n), list(p), list(lg)) == got


def test_model_flops_are_the_causal_pairs_and_flops_the_rectangle(family):
    """A fresh prefill's attention: hardware flops bill the whole score rectangle (vLLM's
    T²), model flops the causal pairs (SGLang's c(c+1)/2)."""
    name, cost, _, counted = family
    one = cost.cost([Request(12, 0, 1)])
    assert one["model_flops"] < one["flops"]
    assert cost.cost([Request(1, 0, 1)])["flops"] >= cost.cost([Request(1, 0, 1)])[
        "model_flops"]


def test_windowed_pairs_closed_form_against_a_loop():
    for n in range(1, 9):
        for p in range(0, 12):
            for w in (0, 1, 3, 5):
                loop = sum(min(p + t, w) if w else p + t for t in range(1, n + 1))
                assert _windowed_pairs(n, p, w) == loop


def test_bad_batches_are_refused(family):
    _, cost, _, _ = family
    with pytest.raises(ValueError, match="at least one request"):
        cost.cost([])
    with pytest.raises(ValueError, match="new >= 1"):
        cost.cost([Request(0, 3, 0)])
    with pytest.raises(ValueError, match="logits"):
        cost.cost([Request(2, 0, 3)])


def test_a_sliding_window_model_is_refused_with_the_figure_named():
    """Mistral's sliding-window cache while it is not yet full and the step overflows it
    (0 < cached < window - 1) takes paths no term of the basis follows yet: the fit says so
    (the family waits, docs/serving.md), it never gives a wrong figure."""
    with pytest.raises(FitError, match="MistralForCausalLM: .* windows \\(6,\\)"):
        CostModel.from_model(_model(MISTRAL()))


def test_a_figure_outside_the_terms_is_named():
    """A forward whose cost depends on more than (new, cached, logits): the fit says which
    figure, never a silent wrong table."""
    def count(r):  # flops grow with the square of the prefix: no term of the basis does
        n, p, _ = r
        return (n * 10 + p * p, n, n, n, n)
    with pytest.raises(FitError, match="flops"):
        CostModel.fit(count, (), checks=8)


def test_the_meter_keeps_engine_names_per_gpu():
    _, cost, _, _ = _gpt2()
    meter = ServingMeter(cost, device="H100-SXM", tensor_parallel=2)
    first = meter.record([Request(8, 0, 1), Request(1, 20, 1)], wall_s=0.01, busy_s=0.005)
    second = meter.record([Request(1, 9, 1)], wall_s=0.01)
    counters = meter.counters()
    total = {f: first[f] + second[f] for f in FIGURES}
    assert counters[VLLM[0]] == total["flops"] / 2
    assert counters[SGLANG[0]] == total["model_flops"] / 2
    assert counters[VLLM[1]] == counters[SGLANG[1]] == total["bytes_read"] / 2
    assert counters["dispatch_flops:tokens_total"] == 10
    use = meter.utilisation()
    peak = meter.device.peak_flops_by_dtype["bfloat16"]
    assert use["mfu_wall"] == pytest.approx(total["model_flops"] / 2 / (0.02 * peak))
    assert use["mfu_busy"] == pytest.approx(total["model_flops"] / 2 / (0.005 * peak))
    with pytest.raises(ValueError, match="tensor_parallel"):
        ServingMeter(cost, tensor_parallel=0)
    with pytest.raises(ValueError, match="DEVICES"):
        ServingMeter(cost, device="no-such-gpu")


def _gpt2():
    config = FAMILIES["gpt2"]()
    return config, CostModel.from_model(_model(config), checks=2), None, None


def test_prometheus_exposition_or_a_clear_error():
    _, cost, _, _ = _gpt2()
    meter = ServingMeter(cost)
    meter.record([Request(4, 0, 1)])
    try:
        import prometheus_client
    except ImportError:
        with pytest.raises(ImportError, match="prometheus_client"):
            meter.prometheus()
        return
    registry = prometheus_client.CollectorRegistry()
    meter.prometheus(registry)
    text = prometheus_client.generate_latest(registry).decode()
    assert "vllm:estimated_flops_per_gpu_total" in text
