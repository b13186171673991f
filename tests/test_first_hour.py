"""The first hour of a new user (issue 46): one meaning per "model flops", every text view
fits the terminal, a view by module type, a roofline's bound that follows its own times,
calibration that says how far to trust it, and the meter's peak and tokens."""

from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.results.format import human
from helpers import tiny_gpt, tiny_ids


def _trained(loss_outside: bool = True):
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        out = model(tiny_ids())
        # a loss after the model runs in phase "other": hardware work, not model flops
        (nn.functional.cross_entropy(out.flatten(0, 1), tiny_ids().flatten())
         if loss_outside else out.sum()).backward()
    return fc


def _cells(text: str, row: str) -> dict:
    lines = text.splitlines()
    header = lines[0].split()
    line = next(s for s in lines if s.startswith(row + " "))
    values = [v for v in line[len(row):].split("  ") if v.strip()]
    return dict(zip(header[1:], (v.strip() for v in values)))


def test_the_model_column_and_the_footer_say_one_model_flops():
    """The root's Model cell is the footer's model flops (forward + backward), the loss in
    phase other included in neither."""
    fc = _trained()
    assert fc.by_phase()["other"].flops > 0
    text = fc.table(depth=1, width=200)
    assert _cells(text, "GPT")["Model"] == human(fc.model_flops())
    assert f"Model flops (forward + backward): {human(fc.model_flops())}," in text
    assert human(fc.by_module()[""].inclusive.model_flops) != human(fc.model_flops())


def test_a_forward_only_footer_says_forward():
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        model(tiny_ids())
    text = fc.table(width=200)
    assert "Model flops (forward): " in text and "forward + backward" not in text
