"""The training loop: AdamW over a fixed schedule, a checkpoint per epoch, an exact resume.

A :class:`Trainer` owns the optimizer, the learning-rate schedule and the random generators;
everything that changes as it runs is in one :class:`~indexer.training.progress.TrainState`
(what a checkpoint saves). The order of the random draws (one permutation per epoch, then
each batch's crops) is part of the resume contract: a run stopped and resumed takes the same
steps as one that never stopped.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retrieval.errors import FinetuneError

from . import train_state
from .contrastive import forward_backward, freeze_tower, parameter_groups
from .data import Log, TrainingData, make_batch
from .finetune_config import FinetuneConfig
from .model import LoadedModel
from .progress import Schedule, TrainState, lr_factor
from .report import metrics_text, row_text
from .validate import DEFAULT_KS, ValidationSet, evaluate_model

# CLIP's AdamW settings (Radford et al., 2021).
ADAM_BETAS = (0.9, 0.98)
ADAM_EPS = 1e-6
# CLIP clips the temperature so that logits are scaled by at most 100.
MAX_LOGIT_SCALE = math.log(100.0)


class Trainer:
    """One run's optimisation of ``loaded.model`` over ``data`` (validated on ``vset``, if any).

    Made fresh, it starts at step 0; :meth:`restore` moves it to a checkpoint's state. Building
    it seeds torch's global generator with ``config.seed`` (the dropout draws).
    """

    def __init__(
        self,
        config: FinetuneConfig,
        loaded: LoadedModel,
        data: TrainingData,
        vset: ValidationSet | None,
        schedule: Schedule,
        out: Path,
        run: Mapping[str, Any],
        log: Log,
    ) -> None:
        import torch

        self.config, self.loaded, self.data, self.vset = config, loaded, data, vset
        self.schedule, self.out, self.run, self.log = schedule, out, run, log
        self.state = TrainState()
        model = loaded.model
        freeze_tower(model, config.freeze)
        self.optimizer = torch.optim.AdamW(
            parameter_groups(model, config.weight_decay), lr=config.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS
        )
        warmup, total = schedule.warmup, schedule.total_steps
        # A lambda, not a callable object: LambdaLR saves a callable object's attributes in its
        # state_dict, which would change what a checkpoint holds.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, warmup, total))
        self.generator = torch.Generator().manual_seed(config.seed)
        torch.manual_seed(config.seed)
        self._t0 = time.perf_counter()
        self._last_lr: float | None = None

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's state (``train_state.load_state``)."""
        import torch

        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.generator.set_state(saved["generator"])
        torch.set_rng_state(saved["torch_rng"])
        step = int(saved["step"])
        self.state = TrainState(
            step=step,
            epoch=int(saved["epoch"]),
            batch_in_epoch=int(saved["batch_in_epoch"]),
            perm=saved.get("perm"),
            losses=list(saved["losses"]),
            history=list(saved["history"]),
            before=saved.get("before"),
            elapsed=float(saved["elapsed"]),
            resumed_from=step,
        )

    def validate(self) -> dict[str, float] | None:
        """Held-out metrics of the current weights (None without validation pairs)."""
        if self.vset is None:
            return None
        return evaluate_model(self.loaded.model, self.loaded.tokenizer, self.vset, self.loaded.max_length).to_dict()

    def train_seconds(self) -> float:
        """Training time so far, earlier runs of a resumed one included."""
        return self.state.elapsed + time.perf_counter() - self._t0

    def save(self) -> None:
        """Checkpoint the weights and the state (atomically; see :mod:`indexer.training.train_state`)."""
        import torch

        st = self.state
        train_state.save_checkpoint(
            self.out,
            self.loaded.model,
            self.loaded.tokenizer,
            self.loaded.preprocessor,
            {
                "step": st.step,
                "epoch": st.epoch,
                "batch_in_epoch": st.batch_in_epoch,
                "perm": st.perm if 0 < st.batch_in_epoch else None,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "generator": self.generator.get_state(),
                "torch_rng": torch.get_rng_state(),
                "losses": st.losses,
                "history": st.history,
                "before": st.before,
                "elapsed": st.elapsed + (time.perf_counter() - self._t0),
            },
            self.run,
        )

    def train(self) -> bool:
        """Validate (a fresh run), then train to the end or to ``stop_after_steps``.

        Returns:
            True when every epoch is done, False when ``stop_after_steps`` stopped the run
            early (its checkpoint is saved).

        Raises:
            FinetuneError: the loss is not finite (before that step changes the weights).
        """
        import torch

        config, st, schedule, model = self.config, self.state, self.schedule, self.loaded.model
        if st.resumed_from is None:
            st.before = self.validate()
            self._add_row({"epoch": 0, "step": 0, "loss": None, "lr": None, **(st.before or {}), "seconds": 0.0})
        self._t0 = time.perf_counter()
        model.train()
        frozen = {"vision": (model.vision_model, model.visual_projection), "text": (model.text_model, model.text_projection)}
        for module in frozen.get(config.freeze, ()):
            module.eval()  # no dropout in a tower that does not learn
        while st.epoch < config.epochs:
            if st.batch_in_epoch == 0 or st.perm is None:
                st.perm = torch.randperm(schedule.pairs, generator=self.generator)
                st.batch_in_epoch = 0
            epoch_losses = st.losses[len(st.losses) - st.batch_in_epoch :] if st.batch_in_epoch else []
            while st.batch_in_epoch < schedule.steps_per_epoch:
                epoch_losses.append(self._step())
                stop = config.stop_after_steps is not None and st.step >= config.stop_after_steps
                if stop or (config.save_every is not None and st.step % config.save_every == 0):
                    self.save()
                if stop and not (st.batch_in_epoch == schedule.steps_per_epoch and st.epoch + 1 == config.epochs):
                    return False
            metrics = self.validate()
            st.epoch += 1
            st.batch_in_epoch = 0
            self._add_row(
                {
                    "epoch": st.epoch,
                    "step": st.step,
                    "loss": sum(epoch_losses) / len(epoch_losses) if epoch_losses else None,
                    "lr": self._last_lr if epoch_losses else None,
                    **(metrics or {}),
                    "seconds": st.elapsed + time.perf_counter() - self._t0,
                }
            )
            self.save()
        return True

    def _step(self) -> float:
        """One optimizer step on the next batch of the epoch's order; returns its loss."""
        import torch

        config, st, schedule = self.config, self.state, self.schedule
        idx = st.perm[st.batch_in_epoch * schedule.per_step : (st.batch_in_epoch + 1) * schedule.per_step]
        batch = make_batch(self.data, idx, self.loaded.preprocess, config.augment, self.generator, self.loaded.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss = forward_backward(self.loaded.model, batch, config.batch_size, config.accum_mode, config.freeze)
        if not math.isfinite(loss):
            # Before the optimizer step: the last checkpoint and the weights stay usable.
            raise FinetuneError(f"the loss became {loss} at step {st.step + 1}; lower --lr (now {config.learning_rate:g})")
        self._last_lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        with torch.no_grad():
            self.loaded.model.logit_scale.clamp_(0.0, MAX_LOGIT_SCALE)
        st.step += 1
        st.batch_in_epoch += 1
        st.losses.append(loss)
        return loss

    def _add_row(self, row: dict[str, Any]) -> None:
        self.state.history.append(row)
        self.log(row_text(row))

    def final_metrics(self) -> dict[str, float] | None:
        """Held-out metrics of the weights as saved (after the cast to ``save_dtype``; None without validation)."""
        import torch

        if self.vset is None:
            return None
        after = self.state.history[-1]
        metrics = {k: after[k] for k in ("mrr", *(f"recall@{k}" for k in DEFAULT_KS))}
        if self.config.save_dtype != "float32":
            # Measure the weights as they will be saved and loaded (rounded, then back to fp32).
            dtype = getattr(torch, self.config.save_dtype)
            rounded = copy.deepcopy(self.loaded.model).to(dtype).to(torch.float32)
            metrics = evaluate_model(rounded, self.loaded.tokenizer, self.vset, self.loaded.max_length).to_dict()
            self.log(f"saved as {self.config.save_dtype}: {metrics_text(metrics)}")
            del rounded
        return metrics


__all__ = ["ADAM_BETAS", "ADAM_EPS", "MAX_LOGIT_SCALE", "Trainer"]
