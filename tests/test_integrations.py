"""The training-loop callbacks, with the real libraries: 3 Trainer steps on a tiny GPT-2, the
logged model flops equal to a FlopCounter run of the same step."""

import pytest
import torch

from dispatch_flops import DeviceSpec, FlopCounter

CPU = DeviceSpec.cpu(peak_flops=1e11, memory_bandwidth=2e10)


def tiny_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=32)
    return transformers.GPT2LMHeadModel(config)


def token_batches(n=3, batch=2, tokens=16):
    torch.manual_seed(1)
    return [{"input_ids": (ids := torch.randint(0, 64, (tokens,))), "labels": ids.clone()}
            for _ in range(n * batch)]


def reference_model_flops(model, batch: dict) -> int:
    """One training step's forward + backward, counted directly."""
    model.train()
    model.zero_grad(set_to_none=True)  # as at a step's start: no gradient to add into
    with FlopCounter(model) as fc:
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return fc.model_flops()


@pytest.mark.slow
def test_transformers_callback_logs_flops_of_counted_steps(tmp_path):
    transformers = pytest.importorskip("transformers")
    from dispatch_flops.integrations.transformers import FlopsCallback

    seen = []

    class Reporter(transformers.TrainerCallback):
        """Stands in for report_to's loggers: a callback placed before ours."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs))

    model = tiny_gpt2()
    callback = FlopsCallback(every=1, warmup=1, device=CPU)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=2, logging_steps=1,
        report_to=[], save_strategy="no", use_cpu=True, max_grad_norm=1.0,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=token_batches(),
                                   callbacks=[Reporter, callback])
    trainer.train()
    step_logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(step_logs) == 3
    assert "model_flops" not in step_logs[0]  # the warm-up step is not counted
    batch = {"input_ids": torch.stack([b["input_ids"] for b in token_batches()[:2]])}
    batch["labels"] = batch["input_ids"].clone()
    # the same step, as the Trainer runs it (its loss is scaled by the tokens it counts)
    items = trainer._get_num_items_in_batch([batch], torch.device("cpu"))
    with FlopCounter(model) as fc:
        trainer.training_step(model, batch, items)
    expected = fc.model_flops()
    for logs in step_logs[1:]:
        assert logs["model_flops"] == expected
        # clipping and the optimizer are hardware flops only
        assert logs["hardware_flops"] > logs["model_flops"]
        assert logs["tokens_per_s"] > 0 and 0 < logs["mfu"] <= logs["hfu"]
    assert [("model_flops" in s) for s in seen if "loss" in s] == [False, True, True]
    assert callback.profile.by_phase()["other"].flops > 0  # the gradient clipping


def test_uncounted_steps_cost_nothing():
    """Between counted steps no counter and no hook is installed."""
    from dispatch_flops.integrations._sampler import StepSampler

    model = torch.nn.Linear(4, 4)
    sampler = StepSampler(every=3, warmup=1, device=None)
    assert [s for s in range(10) if sampler.counts(s)] == [1, 4, 7]
    sampler.begin(model, 0)
    assert sampler._counter is None and not model._forward_pre_hooks
    with pytest.raises(ValueError, match="every"):
        StepSampler(every=0, warmup=1, device=None)


def test_unknown_device_logs_no_mfu_and_says_why():
    from dispatch_flops.integrations._sampler import StepSampler

    model = torch.nn.Linear(4, 4)
    sampler = StepSampler(every=1, warmup=0, device=None)
    sampler.begin(model, 0)
    model(torch.randn(2, 4)).sum().backward()
    if torch.cuda.is_available():
        pytest.skip("a CUDA device may have a built-in spec")
    with pytest.warns(RuntimeWarning, match="no mfu / hfu logged"):
        metrics = sampler.end()
    assert "mfu" not in metrics and metrics["model_flops"] > 0


@pytest.mark.slow
def test_lightning_callback_logs_flops_of_counted_steps(tmp_path):
    lightning = pytest.importorskip("lightning")
    from dispatch_flops.integrations.lightning import FlopsCallback

    model = tiny_gpt2()

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

    rows = token_batches()
    loader = torch.utils.data.DataLoader(rows, batch_size=2)
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

    callback = FlopsCallback(every=1, warmup=1, device=CPU)
    trainer = lightning.Trainer(max_steps=3, accelerator="cpu", logger=Recorder(),
                                log_every_n_steps=1, callbacks=[callback],
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, gradient_clip_val=1.0)
    trainer.fit(Module(), loader)
    with_flops = [m for _, m in logged if "model_flops" in m]
    assert len(with_flops) == 2  # steps 1 and 2; step 0 is the warm-up
    batch = {"input_ids": torch.stack([b["input_ids"] for b in rows[:2]])}
    batch["labels"] = batch["input_ids"].clone()
    expected = reference_model_flops(model, batch)
    for metrics in with_flops:
        assert metrics["model_flops"] == float(expected)
        assert metrics["hardware_flops"] > metrics["model_flops"]
        assert metrics["tokens_per_s"] > 0 and 0 < metrics["mfu"] <= metrics["hfu"]
