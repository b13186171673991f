"""The training-loop callbacks, with the real libraries on a tiny Llama built from its config:
a few Trainer steps each, the logged model flops equal to a FlopCounter run of the same step,
counted steps in no timed figure (a fake clock that counted steps move by 100 s), and every
logged mfu_all_ops / hfu_all_ops equal to the logged flops / (step_s x peak_flop_s) to the bit."""

from types import SimpleNamespace

import pytest
import torch

from dispatch_flops import DeviceSpec, FlopCounter
from dispatch_flops.workflows import throughput
from helpers import FakeClock

CPU = DeviceSpec.cpu(peak_flops=1e11, memory_bandwidth=2e10)
TIMED_S, COUNTED_S = 0.25, 100.0  # what the fake clock moves by in a timed / counted step
TOKENS = 2 * 16  # a batch: 2 rows of 16 token ids


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=64, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config)


def token_rows(n=16, tokens=16):
    torch.manual_seed(1)
    return [{"input_ids": (ids := torch.randint(0, 64, (tokens,))), "labels": ids.clone()}
            for _ in range(n)]


def first_batch(rows):
    batch = {"input_ids": torch.stack([r["input_ids"] for r in rows[:2]])}
    batch["labels"] = batch["input_ids"].clone()
    return batch


def check_identities(metrics, model_flops):
    """What a reader checks on one log line."""
    assert metrics["model_flops"] == model_flops
    assert metrics["step_s"] == TIMED_S  # no counted step's 100 s in it
    assert metrics["peak_flop_s"] == CPU.peak_flops(torch.float32)
    assert metrics["mfu_all_ops"] == \
        metrics["model_flops"] / (metrics["step_s"] * metrics["peak_flop_s"])
    assert metrics["hfu_all_ops"] == \
        metrics["hardware_flops"] / (metrics["step_s"] * metrics["peak_flop_s"])
    assert metrics["tokens_per_s"] == TOKENS / TIMED_S
    assert metrics["hardware_flops"] > metrics["model_flops"]  # clipping, the optimizer


def trainer_args(transformers, tmp_path, steps):
    return transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=2,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, max_grad_norm=1.0,
        dataloader_num_workers=0, disable_tqdm=True)


@pytest.mark.slow
def test_transformers_callback_logs_mfu_of_uncounted_steps(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from dispatch_flops.integrations.transformers import FlopsCallback

    seen, clock = [], FakeClock(TIMED_S, COUNTED_S)
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=clock))
    callback = FlopsCallback(every=3, warmup=1, device=CPU)

    class Reporter(transformers.TrainerCallback):
        """Stands in for report_to's loggers (placed before ours); moves the clock."""

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            clock.tick(callback.meter)

        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs))

    model, rows = tiny_llama(), token_rows()
    trainer = transformers.Trainer(model=model, args=trainer_args(transformers, tmp_path, 8),
                                   train_dataset=rows, callbacks=[Reporter, callback])
    trainer.train()
    step_logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(step_logs) == 8
    # step 0 untouched, 1, 4, 7 counted; the log after a step carries the timed steps since
    # the previous log: steps 2, 3, 5, 6 (global_step 3, 4, 6, 7)
    assert [h["step"] for h in step_logs if "mfu_all_ops" in h] == [3, 4, 6, 7]
    assert [("mfu_all_ops" in s) for s in seen if "loss" in s] == \
        [("mfu_all_ops" in h) for h in step_logs]
    # the same step, as the Trainer runs it (its loss is scaled by the tokens it counts)
    batch = first_batch(rows)
    items = trainer._get_num_items_in_batch([batch], torch.device("cpu"))
    with FlopCounter(model) as fc:
        trainer.training_step(model, batch, items)
    for logs in step_logs:
        if "mfu_all_ops" in logs:
            check_identities(logs, fc.model_flops())
    reading = callback.meter.reading()
    assert (reading.steps, reading.counted_steps, reading.unpriced_steps) == (4, 3, 0)
    assert callback.profile.by_phase()["other"].flops > 0  # the gradient clipping


@pytest.mark.slow
def test_transformers_callback_without_a_peak_says_so_at_the_users_call(tmp_path):
    transformers = pytest.importorskip("transformers")
    from dispatch_flops.integrations.transformers import FlopsCallback

    if torch.cuda.is_available():
        pytest.skip("a CUDA device may have a built-in spec")
    callback = FlopsCallback(every=1, warmup=0)
    trainer = transformers.Trainer(model=tiny_llama(),
                                   args=trainer_args(transformers, tmp_path, 1),
                                   train_dataset=token_rows(4), callbacks=[callback])
    with pytest.warns(RuntimeWarning, match="no mfu_all_ops / hfu_all_ops") as warned:
        trainer.train()  # the warning points here
    message = next(w for w in warned if "no mfu_all_ops" in str(w.message))
    assert message.filename == __file__
    assert "DeviceSpec.cpu(flop_s, bytes_s)" in str(message.message)
    assert "DeviceSpec.calibrate()" in str(message.message)


@pytest.mark.slow
def test_lightning_callback_logs_mfu_of_uncounted_steps(monkeypatch):
    lightning = pytest.importorskip("lightning")
    from dispatch_flops.integrations.lightning import METRICS, FlopsCallback

    model, rows, clock = tiny_llama(), token_rows(), FakeClock(TIMED_S, COUNTED_S)
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=clock))
    callback = FlopsCallback(every=3, warmup=1, device=CPU)

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Clock(lightning.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            clock.tick(callback.meter)

    logged = []

    class Recorder(lightning.pytorch.loggers.logger.Logger):
        name, version = "recorder", 0

        @property
        def experiment(self):
            return None

        def log_hyperparams(self, params, *args, **kwargs):
            pass

        def log_metrics(self, metrics, step=None):
            logged.append((step, dict(metrics)))

    loader = torch.utils.data.DataLoader(rows, batch_size=2)
    trainer = lightning.Trainer(max_steps=8, accelerator="cpu", logger=Recorder(),
                                log_every_n_steps=1, callbacks=[callback, Clock()],
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, gradient_clip_val=1.0)
    trainer.fit(Module(), loader)
    with_mfu = [(step, m) for step, m in logged if "mfu_all_ops" in m]
    # steps 1, 4, 7 counted, 2, 3, 5, 6 timed: each written at its own step, and a counted
    # step's line repeats the last timed figures
    assert [step for step, _ in with_mfu] == [2, 3, 4, 5, 6, 7]
    by_step = dict(with_mfu)
    for counted in (4, 7):
        assert {k: by_step[counted][k] for k in METRICS} == \
            {k: by_step[counted - 1][k] for k in METRICS}
    model.train()
    model.zero_grad(set_to_none=True)  # as at a step's start: no gradient to add into
    with FlopCounter(model) as fc:
        model(**first_batch(rows)).loss.backward()
    model.zero_grad(set_to_none=True)
    for _, metrics in with_mfu:
        check_identities(metrics, fc.model_flops())
    assert callback.meter.reading().counted_steps == 3
