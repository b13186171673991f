"""Coverage you can see: tag-based estimates, coverage(), estimated_ops(), has_formula, and
the lookup order overload -> packet -> tag estimate -> unsupported."""

import json

import pytest
import torch

from dispatch_flops import (
    ESTIMATED,
    EXACT,
    NO_ARITHMETIC,
    UNSUPPORTED,
    Cost,
    CountingWarning,
    FlopCounter,
    has_formula,
)
from dispatch_flops.formulas import Registry
from dispatch_flops.formulas.estimates import pointwise_estimate

aten = torch.ops.aten


# tags as a tuple: torch < 2.12 takes only a sequence
@torch.library.custom_op("dispatch_flops_test::scaled_sin", mutates_args=(),
                         tags=(torch.Tag.pointwise,))
def scaled_sin(x: torch.Tensor) -> torch.Tensor:
    return 3 * torch.sin(x)


@scaled_sin.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("dispatch_flops_test::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def test_tag_estimate_is_flagged_and_listed():
    """A pointwise-tagged op with no formula costs one flop per output element, is recorded as
    estimated (not exact, not unsupported) and is listed by estimated_ops() and the table."""
    x = torch.randn(3, 5)
    with FlopCounter() as fc:
        scaled_sin(x)
        scaled_sin(x)
        opaque(x)
    op = "dispatch_flops_test.scaled_sin"
    assert fc.estimated_ops() == {op: 2}
    assert fc.unsupported_ops() == {"dispatch_flops_test.opaque": 1}
    assert fc.by_operator()[op].flops == 2 * 15
    assert {r.category for r in fc.records() if r.operator == op} == {ESTIMATED}
    assert not has_formula(torch.ops.dispatch_flops_test.scaled_sin)
    table = fc.table()
    assert f"Estimated ops (flops from the op's tag family): {op} x2" in table
    assert "Unsupported ops (bytes counted, flops unknown): dispatch_flops_test.opaque x1" in table


def test_registered_formula_wins_over_the_estimate():
    """Lookup order: overload, packet, tag estimate, unsupported; a registration always wins."""
    reg = Registry()
    reg.estimate(torch.Tag.pointwise, pointwise_estimate)
    x = torch.randn(4)
    with FlopCounter(registry=reg) as fc:
        x.sin()
    assert fc.estimated_ops() == {"aten.sin": 1} and fc.total.flops == 4
    reg.formula(aten.sin)(lambda x, *, out_shape: Cost(10))
    with FlopCounter(registry=reg) as fc:
        x.sin()
    assert fc.estimated_ops() == {} and fc.total.flops == 10
    reg.formula(aten.sin.default, override=True)(lambda x, *, out_shape: Cost(20))
    with FlopCounter(registry=reg) as fc:
        x.sin()
    assert fc.total.flops == 20
    with pytest.raises(ValueError, match="override=True"):
        reg.estimate(torch.Tag.pointwise, pointwise_estimate)
    with pytest.raises(TypeError, match="torch.Tag"):
        reg.estimate("pointwise", pointwise_estimate)


def test_coverage_shares_by_calls_and_bytes():
    """coverage() splits calls and bytes moved over the four categories; no-arithmetic counts
    as priced exactly, and is also shown on its own; shares sum to 1."""
    reg = Registry()
    reg.formula(aten.mm)(
        lambda a, b, *, out_shape: Cost(2 * a[0] * a[1] * b[1], a[0] * a[1] * b[1]))
    reg.estimate(torch.Tag.pointwise, pointwise_estimate)
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    with FlopCounter(registry=reg) as fc:
        c = a @ b  # exact: 128 + 32 bytes read, 32 written
        c.t()  # not declared in this fresh registry: unsupported
        c.sin()  # estimated: 32 read, 32 written
    cov = fc.coverage()
    assert dict(cov.calls) == {EXACT: 1, NO_ARITHMETIC: 0, ESTIMATED: 1, UNSUPPORTED: 1,
                               "communication": 0}
    assert cov.bytes_moved[EXACT] == (32 + 16 + 8) * 4
    assert cov.bytes_moved[ESTIMATED] == 16 * 4
    assert cov.share(EXACT, "calls") == pytest.approx(1 / 3)
    assert cov.priced_exactly("calls") == pytest.approx(1 / 3)
    assert sum(cov.share(c, "bytes") for c in (EXACT, NO_ARITHMETIC, ESTIMATED, UNSUPPORTED)) == (
        pytest.approx(1.0))
    with pytest.raises(ValueError, match="calls"):
        cov.share(EXACT, "flops")
    with pytest.raises(ValueError, match="category"):
        cov.share("formula")
    line = next(s for s in fc.table(width=1000).splitlines() if s.startswith("Coverage"))
    assert line.startswith("Coverage (calls / bytes moved): priced exactly 33.3% / ")
    assert "estimated 33.3% / " in line and "unsupported 33.3% / " in line
    data = json.loads(json.dumps(fc.to_dict()))
    assert data["coverage"]["calls"][ESTIMATED] == 1
    assert data["estimated_ops"] == {"aten.sin": 1}
    assert data["unsupported_ops"] == {"aten.t": 1}


def test_coverage_of_an_empty_run_is_zero_not_an_error():
    with FlopCounter() as fc:
        pass
    with pytest.warns(CountingWarning, match="counted nothing"):
        assert fc.coverage().priced_exactly("bytes") == 0.0
    assert "Coverage (calls / bytes moved): priced exactly 0.0% / 0.0%" in fc.table()


def test_no_arithmetic_counts_as_exactly_priced():
    """Views and copies are exactly priced at 0 flops: in priced_exactly, and apart."""
    x = torch.randn(4, 4)
    with FlopCounter() as fc:
        x.t().contiguous()
    cov = fc.coverage()
    assert cov.calls[NO_ARITHMETIC] == 2 and cov.priced_exactly("calls") == 1.0


# ---- every core op classified --------------------------------------------------------------


def core_packets():
    """Every aten packet with an overload tagged torch.Tag.core in the installed torch,
    enumerated from the schema registry (``dir(torch.ops.aten)`` lists only loaded packets)."""
    names = {s.name.split("::", 1)[1] for s in torch._C._jit_get_all_schemas()
             if s.name.startswith("aten::")}
    packets = []
    for name in sorted(names):
        packet = getattr(aten, name, None)
        if packet is not None and any(torch.Tag.core in getattr(packet, o).tags
                                      for o in packet.overloads()):
            packets.append(packet)
    return packets


def test_every_core_aten_op_is_classified():
    """A torch upgrade that adds a core op fails here until the op gets a formula or a
    no-arithmetic declaration."""
    packets = core_packets()
    assert len(packets) >= 150
    unclassified = [str(p) for p in packets if not has_formula(p)]
    assert unclassified == []


def test_has_formula_takes_packets_and_overloads():
    assert has_formula(aten.add) and has_formula(aten.add.Tensor) and has_formula(aten.add_.Tensor)
    assert has_formula(aten.embedding) and has_formula(aten.view.default)
    assert has_formula(aten._fused_adamw_) and has_formula(aten._foreach_addcdiv_.Scalar)
    assert not has_formula(aten.special_bessel_j0)  # estimated from its tag only
    with pytest.raises(TypeError, match="OpOverload"):
        has_formula("aten.add")


def test_element_costs_are_read_at_call_time():
    """Overriding ELEMENT_COSTS changes the next count (formulas never capture the table)."""
    from dispatch_flops.formulas import ELEMENT_COSTS

    x = torch.randn(4, 8)
    before = {k: ELEMENT_COSTS[k] for k in ("gelu", "softmax", "adam_step")}
    try:
        with FlopCounter() as fc:
            torch.nn.functional.gelu(x).softmax(-1)
        assert fc.total.flops == 32 * (before["gelu"] + before["softmax"])
        ELEMENT_COSTS["gelu"], ELEMENT_COSTS["softmax"] = 1, 1  # DeepSpeed's convention
        with FlopCounter() as fc:
            torch.nn.functional.gelu(x).softmax(-1)
        assert fc.total.flops == 32 * 2
    finally:
        ELEMENT_COSTS.update(before)
