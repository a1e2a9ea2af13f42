"""How to call a model: which forward arguments get its inputs and its targets.

One owner for every caller: the tracer (``autopar.trace``), verify's one-process reference
(``verify_reference``), the engine's program of a model no family describes
(``passes/program.py``) and the dry run all call the model through ``feed_of(model)``, so they
run the same computation. ``feed_of`` reads the forward's signature and the config:

* **Token models.** Zoo style: ``forward(tokens, targets=None)`` returning the loss with targets
  and the logits without (the first positional argument gets the token ids, the targets go to
  ``targets``/``labels``/``target``/``y``). transformers style: ``input_ids=``, ``labels=``, an
  output with ``.logits`` and ``.loss``. Token ids and targets are int64 (batch, seq).
* **Encoder-decoders** (``config.is_encoder_decoder``: T5, BART): the token ids are the encoder's
  input and, shifted right behind ``config.decoder_start_token_id``, the decoder's
  (``decoder_input_ids``), so the logits are (batch, seq, vocab) like a decoder's. The decoder
  input is always given, never derived by the model from the labels, so that a call with targets
  (the trace) and one without (the reference, the engine) compute the same logits.
* **Image models** (``main_input_name == "pixel_values"``: ViT): images of the config's
  ``num_channels`` x ``image_size`` x ``image_size`` in the model's dtype, one class label (int64)
  per image, the model's own classification loss (cross-entropy over ``num_labels``). A *token*
  is what the transformer runs on: one ``patch_size`` x ``patch_size`` patch, plus the extra
  tokens its position table holds (ViT's class token), so its sequence length is fixed by the
  config -- a 32-pixel image in 8-pixel patches is 16 patches + 1 = 17 tokens
  (``Feed.seq_len``) -- and a global batch counts images. No model family describes one, so it
  plans, dry-runs (``plan --check``) and verifies whole: data parallelism, ZeRO and activation
  checkpointing (``passes/whole_model.py``); ``training.synthetic_inputs`` draws its images and
  labels, ``training.loss_of`` its loss.

Every other forward argument keeps its default, except the cache: a transformers model whose
config has ``use_cache`` is called with ``use_cache=False``, whether its forward names it or takes
it through ``**kwargs`` (transformers 5's GraniteMoE, among others). A returned cache
(``DynamicCache``) is no tensor torch.export can trace, and training never reads it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

import torch
from torch import nn

from autopar.core.errors import AutoparError

__all__ = ["Feed", "FeedKind", "TARGET_NAMES", "check_seq_len", "feed_of", "fixed_seq_len",
           "logits_of", "no_token_input_error", "shift_right"]

def no_token_input_error(model: nn.Module, detail: str) -> AutoparError:
    """The error for a forward that has no token-id input autopar can feed."""
    cls = type(model).__name__
    return AutoparError(
        f"cannot feed {cls}.forward: {detail}",
        where=f"{type(model).__module__}.{cls}.forward",
        fix="give the model forward(tokens, targets=None) returning the loss for integer token "
            "ids of shape (batch, seq), or forward(input_ids=..., labels=...) returning an "
            "output with .loss (transformers causal LMs and encoder-decoders), or "
            "forward(pixel_values=..., labels=...) with num_channels, image_size and patch_size "
            "in its config (transformers image classifiers); other inputs need defaults",
    )


TARGET_NAMES = ("targets", "labels", "target", "y")
"""Forward argument names that receive the targets (token ids, or class labels)."""


class FeedKind(StrEnum):
    """What a model's main input is."""

    TOKENS = "tokens"
    """Integer token ids, (batch, seq)."""
    IMAGES = "images"
    """Pixel values, (batch, channels, height, width)."""


@dataclass(frozen=True)
class Feed:
    """How to call one model's forward (see the module docstring)."""

    kind: FeedKind
    main: str
    """Argument name of the token ids or images."""
    target: str | None
    """Argument name of the targets; None: the forward takes none (it returns the logits)."""
    fixed: Mapping[str, object] = field(default_factory=dict)
    """Other arguments with fixed values (their defaults; ``use_cache=False``)."""
    decoder: str | None = None
    """An encoder-decoder's decoder-input argument (``decoder_input_ids``), else None."""
    decoder_start: int = 0
    """The token the decoder input starts with (``config.decoder_start_token_id``)."""
    image: tuple[int, int, int] | None = None
    """An image model's (channels, height, width)."""
    image_tokens: int | None = None
    """An image model's sequence length: patches plus extra tokens (its class token)."""
    classes: int | None = None
    """An image model's number of classes (``config.num_labels``)."""
    dtype: torch.dtype = torch.float32
    """The dtype of an image model's pixel values (its parameters')."""

    @property
    def seq_len(self) -> int | None:
        """The sequence length the model fixes (an image model's tokens), else None."""
        return self.image_tokens

    @property
    def fed(self) -> tuple[str, ...]:
        """The argument names that receive tensors."""
        return tuple(n for n in (self.main, self.decoder, self.target) if n is not None)

    def kwargs(self, inputs: torch.Tensor, targets: torch.Tensor | None = None
               ) -> dict[str, object]:
        """The forward's keyword arguments for ``inputs`` (and ``targets``, where it takes
        them)."""
        if self.kind is FeedKind.IMAGES and inputs.dtype != self.dtype:
            inputs = inputs.to(self.dtype)  # fp32 images into a bf16 copy (verify's reference)
        out: dict[str, object] = {self.main: inputs}
        if self.decoder is not None:
            out[self.decoder] = shift_right(inputs, self.decoder_start)
        if targets is not None and self.target is not None:
            out[self.target] = targets
        return {**out, **self.fixed}

    def example(self, batch: int, seq_len: int, device: torch.device | str
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of zeros to trace with: token ids and next-token targets of
        (batch, seq_len), or images of the config's size and a class label per image."""
        if self.image is not None:
            images = torch.zeros(batch, *self.image, dtype=self.dtype, device=device)
            return images, torch.zeros(batch, dtype=torch.long, device=device)
        tokens = torch.zeros(batch, seq_len, dtype=torch.long, device=device)
        return tokens, torch.zeros(batch, seq_len, dtype=torch.long, device=device)

    def logits(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """The model's logits for ``inputs``, called without targets: (batch, seq, vocab) for a
        token model, (batch, classes) for an image model."""
        out = model(**self.kwargs(inputs))
        return out.logits if hasattr(out, "logits") else out  # type: ignore[return-value]


def shift_right(tokens: torch.Tensor, start: int) -> torch.Tensor:
    """``tokens`` one position to the right behind ``start`` (an encoder-decoder's decoder
    input: position i sees the tokens before i)."""
    return torch.cat([torch.full_like(tokens[:, :1], start), tokens[:, :-1]], dim=1)


def logits_of(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The whole model's logits for ``inputs`` (``feed_of(model).logits``): the reference's and
    a whole-model program's forward."""
    return feed_of(model).logits(model, inputs)


def feed_of(model: nn.Module) -> Feed:
    """How to call ``model`` (see the module docstring); ``AutoparError`` for a forward autopar
    cannot feed."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError) as err:
        raise no_token_input_error(model, f"its signature cannot be read ({err})") from None
    params = sig.parameters
    config = getattr(model, "config", None)
    main = getattr(model, "main_input_name", None)  # transformers: "pixel_values" for a ViT
    named = [p for p in params.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if main == "pixel_values" and main in params:
        feed = Feed(FeedKind.IMAGES, main, None)
    elif isinstance(main, str) and main != "input_ids":
        raise no_token_input_error(model, f"its input is {main!r}: autopar feeds integer token "
                                          "ids (input_ids) or images (pixel_values)")
    elif "input_ids" in params:  # transformers convention
        feed = Feed(FeedKind.TOKENS, "input_ids", None)
    else:
        positional = [p for p in named if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not positional:
            raise no_token_input_error(model, "forward takes no positional argument for token ids")
        feed = Feed(FeedKind.TOKENS, positional[0].name, None)
    target = next((n for n in TARGET_NAMES if n in params and n != feed.main), None)
    feed = replace(feed, target=target)
    if feed.kind is FeedKind.IMAGES:
        feed = _with_images(feed, model, config)
    elif (feed.main == "input_ids" and getattr(config, "is_encoder_decoder", False)
          and "decoder_input_ids" in params):
        feed = replace(feed, decoder="decoder_input_ids",
                       decoder_start=_decoder_start(model, config))
    fixed: dict[str, object] = {}
    if hasattr(config, "use_cache") and ("use_cache" in params or takes_kwargs):
        fixed["use_cache"] = False
    for p in named:
        if p.name in feed.fed or p.name in fixed:
            continue
        if p.default is p.empty:
            raise no_token_input_error(
                model, f"argument {p.name!r} has no default and is neither the "
                f"{feed.kind.value} ({feed.main!r}) nor the targets ({', '.join(TARGET_NAMES)})")
        fixed[p.name] = p.default
    return replace(feed, fixed=fixed)


def _decoder_start(model: nn.Module, config: object) -> int:
    start = getattr(config, "decoder_start_token_id", None)
    if not isinstance(start, int) or isinstance(start, bool):
        raise AutoparError(
            f"{type(model).__name__} is an encoder-decoder without a decoder_start_token_id in "
            "its config: autopar cannot make its decoder input (the token ids shifted right "
            "behind that token)", where="config.json: decoder_start_token_id",
            fix="set decoder_start_token_id in the config (T5 uses 0, its pad token)")
    return start


def _with_images(feed: Feed, model: nn.Module, config: object) -> Feed:
    """``feed`` with an image model's (channels, height, width), sequence length, classes and
    pixel dtype, from its config: ``num_channels``, ``image_size`` and ``patch_size`` (each an
    int or a (height, width) pair), ``num_labels``; the sequence is the patches, or the rows of
    its position table where that holds more (ViT's class token)."""
    def pair(value: object) -> tuple[int, int] | None:
        if isinstance(value, int) and not isinstance(value, bool):
            return value, value
        if isinstance(value, (tuple, list)) and len(value) == 2 and all(
                isinstance(v, int) for v in value):
            return int(value[0]), int(value[1])
        return None

    channels = getattr(config, "num_channels", None)
    size = pair(getattr(config, "image_size", None))
    patch = pair(getattr(config, "patch_size", None))
    if not isinstance(channels, int) or size is None or patch is None:
        raise no_token_input_error(
            model, "it reads pixel_values but its config gives no num_channels, image_size and "
                   "patch_size to make images of and count their patches by")
    patches = (size[0] // patch[0]) * (size[1] // patch[1])
    tables = [p.shape[-2] for name, p in model.named_parameters()
              if name.endswith("position_embeddings") and p.dim() == 3]
    classes = getattr(config, "num_labels", None)
    return replace(
        feed, image=(channels, *size),
        image_tokens=tables[0] if len(tables) == 1 and tables[0] >= patches else patches,
        classes=classes if isinstance(classes, int) and classes > 0 else None,
        dtype=next((p.dtype for p in model.parameters() if p.is_floating_point()),
                   torch.float32))


def fixed_seq_len(model: nn.Module) -> int | None:
    """The sequence length ``model`` fixes: an image model's tokens (``Feed.seq_len``); None for
    a token model, which takes any."""
    if getattr(model, "main_input_name", None) != "pixel_values":
        return None
    return feed_of(model).seq_len


def check_seq_len(model: nn.Module, seq_len: int) -> None:
    """``AutoparError`` when ``seq_len`` is not the one ``model`` fixes (an image model's)."""
    fixed = fixed_seq_len(model)
    if fixed is None or seq_len == fixed:
        return
    _, height, width = feed_of(model).image or (0, 0, 0)
    raise AutoparError(
        f"{type(model).__name__} reads {height} x {width} images, so its sequence is fixed by its "
        f"config at {fixed} tokens (the image's patches and the extra tokens of its position "
        f"table), not {seq_len}",
        where="--seq-len / TrainSpec.seq_len",
        fix=f"pass --seq-len {fixed} or leave it out (a global batch counts images)")
