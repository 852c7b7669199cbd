"""CLIP's symmetric contrastive (InfoNCE) objective, and one forward/backward pass over a batch.

The loss is CLIP's: cosine similarities scaled by the learnable temperature ``exp(logit_scale)``
(kept at most 100 by the trainer, as CLIP does), cross-entropy from images to texts and from
texts to images, averaged. One refinement: pairs that the model cannot tell apart are not
used as negatives of each other. Two lines with the same image, or with captions that are
equal once lower-cased (CLIP tokenizers lower-case), are both positives: the target of a row
is spread evenly over its positives. Without that, "A flower." on two different stamps would
ask the model to rank one flower above the other for the very same text.

Large effective batches (``batch_size x grad_accum``) are processed in micro-batches of
``batch_size`` pairs, two ways:

- ``gradcache`` (default): the GradCache method (Gao et al., 2021). All embeddings of the
  batch are computed without a graph, the loss over the *whole* batch gives the gradient with
  respect to each embedding, then each micro-batch is encoded again with a graph and
  back-propagated with that gradient. The gradients are those of one big batch (every pair
  sees all ``batch_size x grad_accum - 1`` negatives) at the memory of one micro-batch, for
  one extra forward pass.
- ``micro``: each micro-batch computes its own loss, whose negatives are only the pairs of
  that micro-batch, and the gradients are averaged. Cheaper, but it is *not* the loss of the
  big batch: with InfoNCE the number of negatives matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

ACCUM_MODES: tuple[str, ...] = ("gradcache", "micro")
FREEZE_CHOICES: tuple[str, ...] = ("none", "vision", "text")


@dataclass(frozen=True)
class PairBatch:
    """One optimizer step's pairs, ready for the model.

    Attributes:
        pixels: float32 ``(n, 3, h, w)`` preprocessed images.
        input_ids, attention_mask: ``(n, t)`` tokenized captions.
        positives: bool ``(n, n)``: True where image i and caption j belong together.
    """

    pixels: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    positives: torch.Tensor

    def __len__(self) -> int:
        return int(self.pixels.shape[0])


def positive_mask(image_groups: torch.Tensor, caption_groups: torch.Tensor) -> torch.Tensor:
    """``(n, n)`` bool: same image or same (lower-cased) caption. The diagonal is always True."""
    same_image = image_groups[:, None] == image_groups[None, :]
    same_caption = caption_groups[:, None] == caption_groups[None, :]
    return same_image | same_caption


def clip_loss(
    image_embeds: torch.Tensor, text_embeds: torch.Tensor, logit_scale: torch.Tensor, positives: torch.Tensor
) -> torch.Tensor:
    """Symmetric InfoNCE over a batch (see the module docstring for the positives).

    Args:
        image_embeds, text_embeds: ``(n, d)`` projected embeddings, not yet normalised.
        logit_scale: CLIP's log temperature (a scalar parameter).
        positives: bool ``(n, n)`` from :func:`positive_mask`.

    Returns:
        A scalar: the mean of the image-to-text and text-to-image cross-entropies.
    """
    import torch.nn.functional as F

    image = F.normalize(image_embeds.float(), dim=-1)
    text = F.normalize(text_embeds.float(), dim=-1)
    logits = logit_scale.exp() * image @ text.T
    targets = positives.to(logits.dtype)
    # positives is symmetric, so one normalisation serves both directions.
    targets = targets / targets.sum(dim=1, keepdim=True)
    image_to_text = -(targets * logits.log_softmax(dim=1)).sum(dim=1).mean()
    text_to_image = -(targets * logits.T.log_softmax(dim=1)).sum(dim=1).mean()
    return (image_to_text + text_to_image) / 2


def encode_images(model: Any, pixels: torch.Tensor) -> torch.Tensor:
    """Projected image embeddings of a ``CLIPModel`` (as ``get_image_features``), unnormalised."""
    return model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output)


def encode_texts(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Projected text embeddings of a ``CLIPModel`` (as ``get_text_features``), unnormalised."""
    return model.text_projection(model.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output)


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    import torch

    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    import torch

    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def forward_backward(model: Any, batch: PairBatch, micro_batch: int, mode: str = "gradcache", freeze: str = "none") -> float:
    """Accumulate the gradients of one optimizer step's loss into ``model``'s parameters.

    The caller zeroes the gradients before and steps the optimizer after.

    Args:
        model: a ``CLIPModel`` in train mode.
        batch: the step's pairs.
        micro_batch: most pairs encoded at once (with a graph).
        mode: ``gradcache`` or ``micro`` (see the module docstring).
        freeze: ``vision`` or ``text`` skips back-propagation into that tower (its
            embeddings are computed without a graph); ``none`` trains both.

    Returns:
        The step's loss: over the whole batch for ``gradcache``, the size-weighted mean of
        the micro-batch losses for ``micro``.
    """
    import torch

    n = len(batch)
    chunks = [slice(s, min(s + micro_batch, n)) for s in range(0, n, micro_batch)]
    train_image, train_text = freeze != "vision", freeze != "text"

    def image(c: slice, grad: bool) -> torch.Tensor:
        with torch.set_grad_enabled(grad):
            return encode_images(model, batch.pixels[c])

    def text(c: slice, grad: bool) -> torch.Tensor:
        with torch.set_grad_enabled(grad):
            return encode_texts(model, batch.input_ids[c], batch.attention_mask[c])

    if mode == "micro" or len(chunks) == 1:
        total = 0.0
        for c in chunks:
            loss = clip_loss(image(c, train_image), text(c, train_text), model.logit_scale, batch.positives[c, c])
            weight = (c.stop - c.start) / n
            (loss * weight).backward()
            total += float(loss.detach()) * weight
        return total

    # GradCache. The RNG state before each encoder call is recorded so that the second pass
    # sees the same dropout masks as the first (CLIP checkpoints usually have no dropout, but
    # the gradients must be right for those that do).
    device = batch.pixels.device
    states: list[tuple[Any, Any]] = []
    images: list[torch.Tensor] = []
    texts: list[torch.Tensor] = []
    for c in chunks:
        states.append(_rng_state(device))
        images.append(image(c, False))
        states.append(_rng_state(device))
        texts.append(text(c, False))
    all_images = torch.cat(images).requires_grad_(train_image)
    all_texts = torch.cat(texts).requires_grad_(train_text)
    loss = clip_loss(all_images, all_texts, model.logit_scale, batch.positives)
    loss.backward()  # gradients w.r.t. the cached embeddings, and logit_scale's own
    end_state = _rng_state(device)
    for k, c in enumerate(chunks):
        outputs: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        if train_image:
            _set_rng_state(states[2 * k], device)
            outputs.append(image(c, True))
            grads.append(all_images.grad[c])  # type: ignore[index]  # backward() set .grad: requires_grad when train_image
        if train_text:
            _set_rng_state(states[2 * k + 1], device)
            outputs.append(text(c, True))
            grads.append(all_texts.grad[c])  # type: ignore[index]  # backward() set .grad: requires_grad when train_text
        torch.autograd.backward(outputs, grads)
    _set_rng_state(end_state, device)
    return float(loss.detach())


def parameter_groups(model: Any, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: weight decay on weight matrices only.

    Biases, LayerNorm parameters, embeddings (token, position, class) and ``logit_scale`` get
    no weight decay, as in CLIP and open_clip: decaying them pulls normalisation gains and
    the temperature towards zero, and shrinks the rows of rarely seen tokens for nothing.
    Frozen parameters are left out.
    """
    from torch import nn

    exempt: set[int] = set()
    for module in model.modules():
        if isinstance(module, (nn.Embedding, nn.LayerNorm)):
            exempt.update(id(p) for p in module.parameters(recurse=False))
    decay: list[Any] = []
    no_decay: list[Any] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim < 2 or id(param) in exempt or name.endswith(("class_embedding", "logit_scale")):
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def freeze_tower(model: Any, freeze: str) -> None:
    """Stop gradients into the vision (``vision_model`` + ``visual_projection``) or text tower."""
    modules: Sequence[Any] = ()
    if freeze == "vision":
        modules = (model.vision_model, model.visual_projection)
    elif freeze == "text":
        modules = (model.text_model, model.text_projection)
    for module in modules:
        for param in module.parameters():
            param.requires_grad_(False)
