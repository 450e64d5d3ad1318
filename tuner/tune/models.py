"""The 4-bit weight shapes of a whole model, from its Hugging Face ``config.json``.

QLoRA (bitsandbytes ``load_in_4bit``) quantizes every ``nn.Linear`` of the decoder layers;
``lm_head`` stays in 16 bits (transformers keeps the output layer out of the conversion) and
the embeddings are not linear layers, so neither is tuned. A linear layer's weight is
``[out_features, in_features]``, which is the shape a :class:`~nf4tune.vocabulary.Problem` takes.

Per decoder layer (``h`` hidden size, ``H`` attention heads, ``K`` key/value heads, ``d`` head
dimension, ``I`` MLP intermediate size):

- attention: ``q_proj [H*d, h]``, ``k_proj`` and ``v_proj [K*d, h]``, ``o_proj [h, H*d]``;
- MLP: ``gate_proj`` and ``up_proj [I, h]``, ``down_proj [h, I]``;
- Mixtral: the same attention, and per expert ``w1`` and ``w3 [I, h]``, ``w2 [h, I]`` (every
  expert has these shapes), plus the router ``gate [E, h]`` for ``E`` experts (a plain
  ``nn.Linear``, which ``load_in_4bit`` quantizes too).

``head_dim`` is taken from the config where given (Qwen3 sets it apart from ``h / H``), else
``h // H``; ``num_key_value_heads`` defaults to ``H`` (no grouped-query attention).

With tensor parallelism over ``tp`` GPUs (Megatron-style, as vLLM and TGI shard): the
column-parallel layers (q, k, v, gate, up, the experts' w1 and w3) split ``out_features``; the
row-parallel layers (o, down, the experts' w2) split ``in_features``; the router is
replicated. Heads split whole: ``H`` must divide by ``tp``; ``K`` must divide by ``tp``, or
``tp`` by ``K`` (then each GPU holds one key/value head, replicated ``tp / K`` times, as vLLM
does). ``I`` must divide by ``tp``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ModelError", "ModelShapes", "LinearShape", "ARCHITECTURES", "model_shapes", "load_config",
           "shapes_from_config", "shapes_of_models"]

#: model_type -> the kind of decoder layer
ARCHITECTURES = {"llama": "dense", "mistral": "dense", "qwen2": "dense", "qwen3": "dense", "mixtral": "moe"}
#: Hugging Face class names of each model_type (for a config without model_type)
_CLASSES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
            "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral"}


class ModelError(ValueError):
    """A model config that cannot be read or turned into shapes (one line, for the user)."""


@dataclass(frozen=True)
class LinearShape:
    """One distinct weight shape and the layers that have it."""

    shape: tuple           # (out_features, in_features) on one GPU
    layers: tuple          # e.g. ("q_proj", "o_proj")

    @property
    def text(self) -> str:
        return f"{self.shape[0]}x{self.shape[1]}"


@dataclass
class ModelShapes:
    """The distinct 4-bit weight shapes of one model at one tensor-parallel degree."""

    source: str
    model_type: str
    tp: int
    shapes: list                          # of LinearShape, in layer order
    excluded: list = field(default_factory=list)    # what is not tuned, and why
    notes: list = field(default_factory=list)

    def shape_tuples(self) -> list:
        return [s.shape for s in self.shapes]

    def describe(self) -> str:
        """What was derived, for the user: one line per shape, then what is left out."""
        lines = [f"{self.source}: {self.model_type}, tensor parallel {self.tp}: {len(self.shapes)} distinct 4-bit "
                 "weight shape(s) [out_features x in_features]"]
        for s in self.shapes:
            lines.append(f"  {s.text:<13} {', '.join(s.layers)}")
        for text in self.notes + self.excluded:
            lines.append(f"  {text}")
        return "\n".join(lines)


def load_config(path) -> dict:
    """A config.json as a dict; ModelError for a missing or unreadable file or one that is not
    a JSON object."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ModelError(f"--model {path}: no such file") from None
    except IsADirectoryError:
        raise ModelError(f"--model {path}: is a folder; give its config.json") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelError(f"--model {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelError(f"--model {path}: not JSON ({e})") from None
    if not isinstance(config, dict):
        raise ModelError(f"--model {path}: a model config is a JSON object, this is a {type(config).__name__}")
    return config


def _model_type(config: dict, source: str) -> str:
    mt = config.get("model_type")
    if mt is None:
        for cls in config.get("architectures") or []:
            if cls in _CLASSES:
                return _CLASSES[cls]
    if mt in ARCHITECTURES:
        return mt
    named = f"model_type {mt!r}" if mt is not None else "no model_type"
    raise ModelError(f"{source}: {named} is not a supported architecture (supported: {', '.join(ARCHITECTURES)})")


def _positive(config: dict, key: str, source: str, model_type: str, default=None) -> int:
    value = config.get(key, default)
    if value is None:
        raise ModelError(f"{source}: missing field {key!r} (a {model_type} config needs it)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelError(f"{source}: {key} = {value!r} is not a positive whole number")
    return value


def _split(value: int, tp: int, what: str, source: str) -> int:
    if value % tp:
        raise ModelError(f"{source}: tensor parallel {tp} does not divide {what} ({value}) evenly")
    return value // tp


def shapes_from_config(config: dict, tp: int = 1, source: str = "config") -> ModelShapes:
    """The distinct 4-bit weight shapes of the model ``config`` describes, on one of ``tp``
    tensor-parallel GPUs. ModelError (one line) for an unknown architecture, a missing or
    invalid field, or a ``tp`` that does not split the model evenly."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ModelError(f"--tp {tp!r} must be a positive whole number")
    mt = _model_type(config, source)
    h = _positive(config, "hidden_size", source, mt)
    heads = _positive(config, "num_attention_heads", source, mt)
    kv = _positive(config, "num_key_value_heads", source, mt, default=heads)
    inter = _positive(config, "intermediate_size", source, mt)
    if "head_dim" in config and config["head_dim"] is not None:
        d = _positive(config, "head_dim", source, mt)
    else:
        if h % heads:
            raise ModelError(f"{source}: hidden_size {h} is not a multiple of num_attention_heads {heads} and "
                             "there is no head_dim")
        d = h // heads
    if heads % kv:
        raise ModelError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    notes = []
    heads_tp = _split(heads, tp, "num_attention_heads", source)
    if kv % tp == 0:
        kv_tp = kv // tp
    elif tp % kv == 0:
        kv_tp = 1
        notes.append(f"tensor parallel {tp} > {kv} key/value heads: each GPU holds one, replicated {tp // kv}x")
    else:
        raise ModelError(f"{source}: tensor parallel {tp} does not divide num_key_value_heads ({kv}) evenly, "
                         "nor does it divide by it")
    inter_tp = _split(inter, tp, "intermediate_size", source)

    layers: list = [("q_proj", (heads_tp * d, h)), ("k_proj", (kv_tp * d, h)), ("v_proj", (kv_tp * d, h)),
                    ("o_proj", (h, heads_tp * d))]
    if ARCHITECTURES[mt] == "dense":
        layers += [("gate_proj", (inter_tp, h)), ("up_proj", (inter_tp, h)), ("down_proj", (h, inter_tp))]
    else:
        experts = _positive(config, "num_local_experts", source, mt)
        layers += [("experts.w1", (inter_tp, h)), ("experts.w3", (inter_tp, h)), ("experts.w2", (h, inter_tp)),
                   ("router gate", (experts, h))]
        notes.append(f"{experts} experts share the w1/w3/w2 shapes; the router is replicated under tensor parallelism")

    by_shape: dict = {}
    for name, shape in layers:
        by_shape.setdefault(shape, []).append(name)
    shapes = [LinearShape(shape, tuple(names)) for shape, names in by_shape.items()]
    excluded = []
    vocab = config.get("vocab_size")
    head_text = f"lm_head [{vocab} x {h}]" if isinstance(vocab, int) else "lm_head"
    excluded.append(f"not tuned: {head_text} stays unquantized in QLoRA (bnb's load_in_4bit keeps the output layer "
                    "in 16 bits); the embeddings are not linear layers")
    return ModelShapes(source=source, model_type=mt, tp=tp, shapes=shapes, excluded=excluded, notes=notes)


def model_shapes(path, tp: int = 1) -> ModelShapes:
    """:func:`shapes_from_config` of the config.json at ``path``."""
    return shapes_from_config(load_config(path), tp, source=str(path))


def shapes_of_models(paths, tp: int = 1) -> tuple[list, list]:
    """(the distinct shapes of every model at ``paths`` in order, the :class:`ModelShapes` of
    each)."""
    models = [model_shapes(p, tp) for p in paths]
    seen: dict = {}
    for m in models:
        for s in m.shapes:
            seen.setdefault(s.shape, None)
    return list(seen), models
