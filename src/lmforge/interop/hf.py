"""Hugging Face interop: HF model folders (or in-memory ``transformers`` models) to lmforge, and back.

    HF folder / model --from_hf--> ModelConfig + Transformer (+ Tokenizer, + task head kept aside)
    lmforge model     --to_hf----> config.json + model.safetensors (+ tokenizer.json, tokenizer_config.json)

Each family is one small module (:mod:`~lmforge.interop.hf_bert`, ``hf_gpt2``, ``hf_t5``, ``hf_bart``,
``hf_llama`` (also Qwen2 and Mistral), ``hf_deberta``, ``hf_electra``, ``hf_mixtral``, ``hf_switch``) declaring a
:class:`Family`: the HF config <-> ModelConfig translation, the HF classes it reads (:class:`Arch`: which lmforge
head, where the body sits in the state dict) and a table of :class:`Rule` s from lmforge tensor names to HF ones,
in the vocabulary of :mod:`~lmforge.interop.hf_family`.
This module is the engine that applies those tables.

Why conversion is exact: a rule only renames, transposes, splits or concatenates tensors, so
``from_hf(to_hf(model))`` reproduces the state dict bit for bit. ``to_hf`` refuses a config the HF family
cannot express: it translates its own HF config back and names the first field that did not survive.

Weights are read from safetensors, or from ``pytorch_model.bin`` with ``torch.load(weights_only=True)``
only (a pickle that needs anything beyond tensors is refused rather than executed).

Example:
    >>> import tempfile, torch, transformers, lmforge
    >>> hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    ...     vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=64)).eval()
    >>> model = lmforge.from_hf(hf)
    >>> ids = torch.randint(0, 50, (2, 8))
    >>> bool((model(ids).logits - hf(ids).logits).abs().max() < 1e-4)
    True
    >>> path = lmforge.to_hf(model, tempfile.mkdtemp() + "/gpt2")
    >>> type(transformers.AutoModelForCausalLM.from_pretrained(path)).__name__
    'GPT2LMHeadModel'
"""

from __future__ import annotations

import json
import os
import pickle
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from lmforge.config import ConfigError, ModelConfig
from lmforge.interop.hf_bart import BART, MBART
from lmforge.interop.hf_bert import BERT, ROBERTA
from lmforge.interop.hf_deberta import DEBERTA_V2
from lmforge.interop.hf_electra import ELECTRA
from lmforge.interop.hf_family import Arch, Family, HFConfig, HFConversionError, Mapper, Rule
from lmforge.interop.hf_gpt2 import GPT2
from lmforge.interop.hf_llama import LLAMA, MISTRAL, QWEN2
from lmforge.interop.hf_mixtral import MIXTRAL
from lmforge.interop.hf_switch import SWITCH
from lmforge.interop.hf_t5 import T5
from lmforge.model_folder import is_model_folder, materialise, save
from lmforge.models import load_transformer
from lmforge.models.transformer import Transformer
from lmforge.tokenization import Tokenizer, TokenizerError
from lmforge.utils.faults import environment_errors
from lmforge.utils.io import atomic_dir, refuse_foreign_folder
from lmforge.utils.lock import remove_stale_temporaries

HF_CONFIG = "config.json"
HEAD_WEIGHTS, HEAD_CONFIG = "head.safetensors", "head.json"
# Files tried in order; an index names the shards of a large checkpoint.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")  # carried by HF configs
TASK_CONFIG_KEYS = ("id2label", "label2id", "problem_type", "classifier_dropout")
# Fields that only shape training (or that HF keeps in the tokenizer, not the config): to_hf writes them
# where the family has a field, and does not refuse a config whose family lacks one.
NOT_CARRIED = frozenset({"name", "extra", "unk_token_id", "mask_token_id", "cls_token_id", "sep_token_id",
                         "dropout", "attn_dropout", "ffn_dropout", "initializer_range",
                         "moe_aux_loss", "moe_z_loss", "moe_jitter"})
MOE_FIELDS = ("moe_experts", "moe_top_k", "moe_every", "moe_capacity_factor", "moe_expert_capacity",
              "moe_renormalize", "moe_shared_experts")


# ---------------------------------------------------------------------------------------- registry
def families() -> dict[str, Family]:
    """All supported families by HF ``model_type``."""
    return {f.model_type: f for f in (BERT, ROBERTA, GPT2, T5, BART, MBART, LLAMA, DEBERTA_V2, ELECTRA,
                                                  QWEN2, MISTRAL, MIXTRAL, SWITCH)}


def _family(model_type: Any, source: str) -> Family:
    fams = families()
    if model_type not in fams:
        raise HFConversionError(
            f"{source}: model_type {model_type!r} is not supported (supported: {', '.join(sorted(fams))})"
        )
    return fams[model_type]


# ---------------------------------------------------------------------------------------- results
@dataclass
class TaskHead:
    """Task-specific HF weights (e.g. a sequence classifier) kept beside the body until task heads land.

    Stored in a model folder as ``head.safetensors`` (HF tensor names) and ``head.json`` (class and labels).
    """

    architecture: str
    tensors: dict[str, torch.Tensor]
    config: dict[str, Any] = field(default_factory=dict)

    def files(self) -> dict[str, bytes]:
        from safetensors.torch import save

        meta = {"format": "lmforge-hf-task-head", "version": 1, "architecture": self.architecture,
                "config": self.config, "tensors": {k: list(v.shape) for k, v in self.tensors.items()}}
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.tensors.items()}
        return {HEAD_WEIGHTS: save(tensors, metadata={"format": "pt"}),
                HEAD_CONFIG: (json.dumps(meta, indent=2) + "\n").encode()}

    @classmethod
    def load(cls, folder: str | Path) -> "TaskHead | None":
        folder = Path(folder)
        if not (folder / HEAD_CONFIG).is_file():
            return None
        from safetensors.torch import load_file

        meta = _read_json(folder / HEAD_CONFIG)
        if not (folder / HEAD_WEIGHTS).is_file() or "architecture" not in meta:
            raise HFConversionError(f"{folder}: {HEAD_CONFIG} needs an 'architecture' and {HEAD_WEIGHTS} beside it")
        return cls(meta["architecture"], load_file(str(folder / HEAD_WEIGHTS)), meta.get("config", {}))


@dataclass
class HFConversion:
    """What :func:`load_hf` read: the model, its tokenizer (if the folder had one), a task head kept
    aside (if any), the HF class it came from, and notes on anything not carried over."""

    model: torch.nn.Module
    tokenizer: Any = None
    task_head: TaskHead | None = None
    architecture: str = ""
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------- reading
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HFConversionError(f"{path}: not valid JSON ({exc})") from exc


def _read_weight_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise HFConversionError(f"{path}: unreadable or truncated safetensors file ({exc})") from exc
    try:
        # weights_only: a pickle may run arbitrary code on load; tensors and plain containers cannot.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HFConversionError(
            f"{path}: cannot be read with torch.load(weights_only=True) ({first}); "
            "re-save it as model.safetensors"
        ) from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise HFConversionError(f"{path}: expected a flat dict of tensors (a state dict)")
    return state


def read_hf_weights(folder: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """All tensors of an HF folder (single file or sharded), and the file (or index) they came from."""
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return _read_weight_file(path), path
        weight_map = _read_json(path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise HFConversionError(f"{path}: no 'weight_map' in the index")
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise HFConversionError(f"{path}: shard {shard!r} is missing")
            tensors.update(_read_weight_file(folder / shard))
        return tensors, path
    raise HFConversionError(f"{folder}: no weights found (expected one of {', '.join(WEIGHT_FILES)})")


def _read_tokenizer(folder: Path, family: Family, notes: list[str]):
    present = [n for n in ("tokenizer.json", "vocab.txt", "vocab.json", "encoder.json") if (folder / n).is_file()]
    if not present:
        notes.append(f"{folder}: no tokenizer.json, vocab.txt or vocab.json + merges.txt; "
                     "converted without a tokenizer")
        return None
    try:
        return Tokenizer.load(folder, family=family.tokenizer_family)
    except TokenizerError as exc:
        raise HFConversionError(f"{folder}: tokenizer: {exc}") from exc


# ---------------------------------------------------------------------------------------- conversion core
def _normalise(tensors: dict[str, torch.Tensor], family: Family) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Strip the body prefix (``bert.``, ``model.``) and old ``gamma``/``beta`` LayerNorm names, and apply the
    family's ``renames``.

    Returns the renamed tensors and new name -> original name (for error messages).
    """
    out, original = {}, {}
    for name, tensor in tensors.items():
        new = name[len(family.prefix):] if family.prefix and name.startswith(family.prefix) else name
        new = re.sub(r"(LayerNorm|layer_norm)\.gamma$", r"\1.weight", new)
        new = re.sub(r"(LayerNorm|layer_norm)\.beta$", r"\1.bias", new)
        for pattern, replacement in family.renames:
            new = re.sub(pattern, replacement, new)
        out[new], original[new] = tensor, name
    return out, original


def _special_tokens(c: HFConfig, vocab_size: int, tokenizer) -> dict[str, int | None]:
    """Token ids from config.json (in range), else from the tokenizer's roles."""
    out: dict[str, int | None] = {}
    from_tok = tokenizer.special_token_ids() if tokenizer is not None else {}
    for name in TOKEN_FIELDS + ("unk_token_id", "mask_token_id", "cls_token_id", "sep_token_id"):
        value = c.data.get(name)
        if isinstance(value, list):  # e.g. several end-of-turn ids; lmforge keeps one
            c.notes.append(f"{name}={value} is a list; kept {value[0] if value else None}")
            value = value[0] if value else None
        if value is None:
            value = from_tok.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size:
            out[name] = value
    return out


def _model_config(family: Family, arch_name: str, c: HFConfig, has: Callable[[str], bool], tie: bool,
                  tokenizer=None, name: str = "hf") -> ModelConfig:
    arch = family.architectures[arch_name]
    fields = family.config_from_hf(c, arch)
    fields["head"] = arch.head
    fields["tie_embeddings"] = tie
    for key, tensor in arch.optional:
        fields[key] = has(tensor)
    fields.update(_special_tokens(c, fields["vocab_size"], tokenizer))
    fields.setdefault("name", name)
    fields["extra"] = {"hf_model_type": family.model_type, "hf_architecture": arch_name}
    try:
        return ModelConfig.from_dict(fields, source=c.source)
    except ConfigError as exc:
        raise HFConversionError(str(exc)) from exc


def _architecture(family: Family, c: HFConfig, architecture: str | None) -> str:
    if architecture is None:
        listed = c("architectures", None) or []
        architecture = listed[0] if listed else next(iter(family.architectures))
        if not listed:
            c.notes.append(f"{c.source} names no architectures; converted as {architecture}")
    if architecture not in family.architectures:
        raise c.fail(f"architecture {architecture!r} is not supported for {family.model_type} "
                     f"(supported: {', '.join(family.architectures)})")
    return architecture


def _map_to_ours(shell, family: Family, arch: Arch, tensors: dict[str, torch.Tensor], original: dict[str, str],
                 where: str, source: str) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Every tensor of ``shell`` (a meta-device model) from its HF source, shape-checked.

    Returns our state dict and the HF names it used.
    """
    expected = shell.state_dict()
    mapper = Mapper(family.rules(shell.config))
    state, used = {}, set()

    def fetch(key: str, rule: Rule, theirs: str, target_shape: tuple[int, ...]) -> torch.Tensor:
        shown = original.get(theirs, (family.prefix if arch.prefixed and not rule.top_level else "") + theirs)
        if theirs not in tensors:
            raise HFConversionError(f"{where}: tensor {shown!r} is missing (lmforge {key!r} needs it)")
        tensor, shape = tensors[theirs], rule.hf_shape(target_shape)
        if tuple(tensor.shape) != shape:
            raise HFConversionError(
                f"{where}: tensor {shown!r} has shape {tuple(tensor.shape)}, but {source} implies {shape}")
        used.add(theirs)
        return rule.to_ours(tensor)

    for key, target in expected.items():
        rule, theirs = mapper(key)
        if rule.experts:  # (E, ...) from E tensors, one per expert
            state[key] = torch.stack([fetch(key, rule, theirs.replace("{e}", str(e)), tuple(target.shape[1:]))
                                      for e in range(target.shape[0])])
        else:
            state[key] = fetch(key, rule, theirs, tuple(target.shape))
    return state, used


def _convert(hf_config: dict, tensors: dict[str, torch.Tensor], source: str, architecture: str | None = None,
             tokenizer=None, name: str = "hf", dtype: torch.dtype | None = None,
             where: str = "weights") -> HFConversion:
    c = HFConfig(hf_config, source)
    family = _family(c("model_type"), source)
    architecture = _architecture(family, c, architecture)
    arch = family.architectures[architecture]
    if family.unfuse is not None:
        tensors = family.unfuse(tensors)
    tensors, original = _normalise(tensors, family)

    # Tying: trust config.json unless both matrices are stored and differ (HF then leaves them untied too).
    tie = bool(c("tie_word_embeddings", family.tie_default))
    out_name, emb_name = family.output_embedding, family.embedding
    if tie and arch.head != "none" and out_name in tensors and emb_name in tensors:
        tie = torch.equal(tensors[out_name], tensors[emb_name])
    cfg = _model_config(family, architecture, c, tensors.__contains__, tie, tokenizer, name)

    with torch.device("meta"):  # shapes only: nothing is allocated until every tensor has checked out
        shell = Transformer(cfg)
    state, used = _map_to_ours(shell, family, arch, tensors, original, where, source)
    for copy, canonical in family.aliases + (((out_name, emb_name),) if cfg.tie_embeddings else ()):
        if copy in tensors and canonical in tensors:
            if not torch.equal(tensors[copy], tensors[canonical]):
                raise HFConversionError(
                    f"{where}: tensor {original[copy]!r} differs from {original[canonical]!r}, but lmforge ties them")
            used.add(copy)
    task = {original[k]: v for k, v in tensors.items() if arch.task and k.startswith(arch.task)}
    ignored = re.compile("|".join(family.ignore or ("$^",)))
    unused = sorted(original[k] for k in tensors
                    if k not in used and original[k] not in task and not ignored.fullmatch(k))
    if unused:
        c.notes.append(f"{len(unused)} tensor(s) of {architecture} not used: {', '.join(unused[:5])}"
                       + (" ..." if len(unused) > 5 else ""))

    model = materialise(shell)
    model.load_state_dict(state, strict=True)
    floats = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if dtype is None and len(floats) == 1 and floats != {torch.float32}:
        dtype = floats.pop()  # keep a half-precision checkpoint in half precision
    if dtype is not None:
        model = model.to(dtype)
    task_head = TaskHead(architecture, task, {k: c.data[k] for k in TASK_CONFIG_KEYS if k in c.data}) if task else None
    return HFConversion(model.eval(), tokenizer, task_head, architecture, c.notes)


# ---------------------------------------------------------------------------------------- public: from HF
def load_hf(source, *, architecture: str | None = None, dtype: torch.dtype | None = None,
            tokenizer: bool = True) -> HFConversion:
    """Read an HF model folder, or an in-memory ``transformers`` model, into lmforge.

    Args:
        source: a folder with ``config.json`` and weights (``model.safetensors``, sharded safetensors or
            ``pytorch_model.bin``), or a ``transformers.PreTrainedModel``.
        architecture: HF class to read it as (default: the first of ``config.json``'s ``architectures``).
        dtype: cast the model (default: the checkpoint's own precision).
        tokenizer: also load the folder's tokenizer (tokenizer.json, vocab.txt or GPT-2 BPE files).

    Returns:
        :class:`HFConversion` with ``model`` (eval mode), ``tokenizer``, ``task_head`` and ``notes``.

    Example:
        >>> import tempfile, transformers
        >>> folder = tempfile.mkdtemp()   # stands for a downloaded checkpoint such as all-MiniLM-L6-v2
        >>> transformers.BertModel(transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
        ...     num_attention_heads=2, intermediate_size=64)).save_pretrained(folder)
        >>> conv = load_hf(folder)
        >>> conv.architecture, conv.model.config.d_model, conv.tokenizer  # no tokenizer files in this folder
        ('BertModel', 32, None)
    """
    if hasattr(source, "state_dict") and hasattr(source, "config") and not isinstance(source, (str, Path)):
        hf_config = source.config.to_dict()
        state = {k: v.detach().cpu() for k, v in source.state_dict().items()}
        name = hf_config.get("_name_or_path") or hf_config.get("model_type", "hf")
        return _convert(hf_config, state, f"{type(source).__name__}.config", architecture or type(source).__name__,
                        None, str(name), dtype, "state_dict()")
    folder = Path(source)
    # The same checks as model_folder.read_config, for the other format and its own error and wording.
    if not folder.is_dir():
        raise HFConversionError(f"{folder}: not a folder (expected a Hugging Face model folder with {HF_CONFIG})")
    cfg_path = folder / HF_CONFIG
    if not cfg_path.is_file():
        raise HFConversionError(f"{folder}: no {HF_CONFIG}; not a Hugging Face model folder")
    hf_config = _read_json(cfg_path)
    if not isinstance(hf_config, dict):
        raise HFConversionError(f"{cfg_path}: expected a JSON object")
    # Fail on the model type before reading any weights.
    family = _family(HFConfig(hf_config, str(cfg_path))("model_type"), str(cfg_path))
    tensors, weights = read_hf_weights(folder)
    notes: list[str] = []
    tok = _read_tokenizer(folder, family, notes) if tokenizer else None
    conv = _convert(hf_config, tensors, str(cfg_path), architecture, tok, folder.name, dtype, str(weights))
    conv.notes[:0] = notes
    if tok is not None and tok.vocab_size > conv.model.config.vocab_size:
        conv.notes.append(f"the tokenizer has {tok.vocab_size} ids but the model only {conv.model.config.vocab_size}")
    return conv


def from_hf(source, *, architecture: str | None = None, dtype: torch.dtype | None = None):
    """An lmforge Transformer from an HF model folder or an in-memory ``transformers`` model.

    Notes about anything not carried over (e.g. an unused NSP head) are issued as warnings; use
    :func:`load_hf` to get the tokenizer and a task head as well.

    Example:
        >>> import transformers, lmforge
        >>> hf = transformers.BertModel(transformers.BertConfig(
        ...     vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64))
        >>> model = lmforge.from_hf(hf)
        >>> model.config.arch, model.config.norm_position, model.config.pooler
        ('encoder', 'post', True)
    """
    conv = load_hf(source, architecture=architecture, dtype=dtype, tokenizer=False)
    for note in conv.notes:
        warnings.warn(note, stacklevel=2)
    return conv.model


def _check_destination(path: Path, overwrite: bool) -> None:
    if path.exists() and not path.is_dir():
        raise HFConversionError(f"{path}: it is a file, not a folder; remove it or choose another path")
    if path.exists() and not overwrite:
        raise HFConversionError(f"{path}: already exists (use --overwrite / overwrite=True to replace it)")
    refuse_foreign_folder(path, is_model_folder, "a model folder")  # a user's files or a run folder stay
    # A conversion killed mid-write left its temporary folder beside the destination; this one replaces it.
    remove_stale_temporaries(path.parent, path.name)


def convert_from_hf(source, dst: str | Path, *, architecture: str | None = None, dtype: torch.dtype | None = None,
                    overwrite: bool = True) -> HFConversion:
    """HF folder (or model) -> lmforge model folder (config.json, model.safetensors, tokenizer, task head).

    Written atomically: on any error ``dst`` is left as it was (not created).
    """
    dst = Path(dst)
    _check_destination(dst, overwrite)
    conv = load_hf(source, architecture=architecture, dtype=dtype)
    with atomic_dir(dst) as tmp:
        # save is atomic on its own; stage it inside our folder so the task head joins atomically.
        staged = save(conv.model, tmp / "model", tokenizer=conv.tokenizer)
        for child in staged.iterdir():
            os.replace(child, tmp / child.name)
        staged.rmdir()
        for name, data in (conv.task_head.files() if conv.task_head else {}).items():
            (tmp / name).write_bytes(data)
    return conv


# ---------------------------------------------------------------------------------------- public: to HF
def _relevant_fields(cfg: ModelConfig) -> list[str]:
    """ModelConfig fields that change what ``cfg`` computes (those a target family must reproduce)."""
    skip = set(NOT_CARRIED)
    if cfg.position != "relative":
        skip |= {"relative_k", "relative_values"}
    if cfg.position != "t5-bias":
        skip |= {"t5_num_buckets", "t5_max_distance"}
    if cfg.position != "rope":
        skip |= {"rope_theta", "rotary_pct"}
    if cfg.position != "deberta":
        skip |= {"position_buckets", "max_relative_positions", "share_att_key", "pos_att_type", "norm_rel_embeddings"}
    if cfg.position != "learned":
        skip.add("position_offset")
    if cfg.head != "mlm":
        skip.add("mlm_head_activation")
    if cfg.head != "lm":
        skip |= {"lm_head_bias", "lm_head_scale"}
    if cfg.head == "none":
        skip.add("tie_embeddings")
    if cfg.arch != "encoder-decoder":
        skip |= {"share_embeddings", "n_decoder_layers"}
    if cfg.attention != "linformer":
        skip |= {"linformer_k", "linformer_sharing"}
    if cfg.attention not in ("lightconv", "dynamicconv"):  # attention and block themselves stay: no family has them
        skip.add("conv_kernel")
    if not cfg.moe_experts:
        skip |= set(MOE_FIELDS)
    if not cfg.pkm_layers:  # product-key memory's shape, which nothing reads without a memory layer
        skip |= {"pkm_keys", "pkm_topk", "pkm_heads", "pkm_key_dim"}
    if not (cfg.adaptive_input_cutoffs or cfg.adaptive_softmax_cutoffs):
        skip.add("adaptive_factor")
    return [k for k in cfg.to_dict() if k not in skip]


def _canonical(cfg: ModelConfig) -> dict[str, Any]:
    # Explicit and implied values are the same model: n_kv_heads None means n_heads, and so on.
    d = cfg.to_dict()
    d.update(n_kv_heads=cfg.kv_heads, head_dim=cfg.dim_per_head, embedding_dim=cfg.embed_dim,
             n_decoder_layers=cfg.decoder_layers, qkv_bias=cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias,
             o_bias=cfg.bias if cfg.o_bias is None else cfg.o_bias,
             moe_renormalize=cfg.moe_renormalizes)
    return d


def hf_config_for(cfg: ModelConfig, task: str | None = None) -> tuple[Family, str, dict[str, Any]]:
    """The family, HF class and ``config.json`` content that express ``cfg`` exactly.

    Each family translates ``cfg`` to its HF config and back; the first whose round trip keeps every
    relevant field wins. Otherwise the error names the closest family and the fields it cannot express.
    """
    relevant = _relevant_fields(cfg)
    want = _canonical(cfg)
    misses: list[tuple[int, str]] = []
    # A converted model goes back to the family it came from when that one expresses it (ElectraModel is a
    # BertModel without a pooler: both would do, and its own is the one its users expect).
    came_from = cfg.extra.get("hf_model_type") if isinstance(cfg.extra, dict) else None
    for family in sorted(families().values(), key=lambda f: f.model_type != came_from):
        arch_name = family.arch_for(cfg, task)
        if arch_name is None:
            what = f"task head {task}" if task else f"head={cfg.head!r}"
            misses.append((len(relevant), f"{family.model_type} has no architecture for {what}"))
            continue
        try:
            hf = family.config_to_hf(cfg)
            hf.update({k: getattr(cfg, k) for k in TOKEN_FIELDS})
            hf.update(model_type=family.model_type, architectures=[arch_name], tie_word_embeddings=cfg.tie_embeddings)
            arch = family.architectures[arch_name]
            back = _model_config(family, arch_name, HFConfig(hf, "to_hf"),
                                 lambda t: any(getattr(cfg, f) for f, n in arch.optional if n == t), cfg.tie_embeddings)
        except (HFConversionError, ConfigError, KeyError) as exc:
            misses.append((len(relevant), f"{family.model_type}: {exc}"))
            continue
        got = _canonical(back)
        wrong = [k for k in relevant if got[k] != want[k]]
        if not wrong:
            return family, arch_name, hf
        detail = ", ".join(f"{k}={want[k]!r} (it has {got[k]!r})" for k in wrong[:3])
        misses.append((len(wrong), f"{family.model_type} cannot express {detail}"))
    best = min(misses, key=lambda m: m[0])[1]
    raise HFConversionError(f"no Hugging Face architecture expresses model {cfg.name!r}; closest: {best}")


def _write_hf_tokenizer(tokenizer, folder: Path, cfg: ModelConfig, chat_template: str | None = None) -> None:
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(tokenizer)
    tok.save(folder)  # tokenizer.json (HF format) + lmforge_tokenizer.json (roles, for the way back)
    specials = {f"{role}_token": token for role, token in tok.roles.items()
                if role in ("bos", "eos", "unk", "pad", "mask", "cls", "sep")}
    # The generic fast class loads tokenizer.json as it is; family classes could rebuild the pipeline.
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_seq_len, **specials}
    if tok.sentinels:
        tok_config["additional_special_tokens"] = list(tok.sentinels)
    if chat_template is not None:
        tok_config["chat_template"] = chat_template  # what tokenizer.apply_chat_template renders
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")


def to_hf(model, path: str | Path, *, tokenizer=None, task_head: TaskHead | None = None,
          dtype: torch.dtype | None = None, overwrite: bool = True, chat_template: str | None = None) -> Path:
    """Write an lmforge model as an HF folder that ``transformers.AutoModel*.from_pretrained`` loads.

    Args:
        model: an lmforge Transformer.
        path: destination folder (written atomically).
        tokenizer: an lmforge Tokenizer or a tokenizer path; written as tokenizer.json + tokenizer_config.json.
        task_head: weights kept aside by :func:`load_hf` (e.g. BertForSequenceClassification's classifier).
        dtype: cast the weights (default: as they are).
        overwrite: replace an existing folder.
        chat_template: a Jinja chat template for tokenizer_config.json (with a tokenizer; ``lmforge convert
            to-hf`` passes the folder's chat_template.json as :meth:`ChatTemplate.to_jinja` writes it).

    Returns:
        ``path``.

    Example:
        >>> import tempfile, lmforge
        >>> path = lmforge.to_hf(lmforge.build_model("llama-tiny"), tempfile.mkdtemp() + "/llama")
        >>> json.loads((path / "config.json").read_text())["architectures"]
        ['LlamaForCausalLM']
    """
    path = Path(path)
    cfg = model.config
    family, arch_name, hf_config = hf_config_for(cfg, task_head.architecture if task_head else None)
    arch = family.architectures[arch_name]
    _check_destination(path, overwrite)
    mapper = Mapper(family.rules(cfg))
    grouped: dict[str, tuple[Rule, dict[int, torch.Tensor]]] = {}
    for key, tensor in model.state_dict().items():
        rule, theirs = mapper(key)
        if arch.prefixed and not rule.top_level:
            theirs = family.prefix + theirs
        tensor = tensor.detach().cpu()
        pieces = enumerate(tensor.unbind(0)) if rule.experts else [(None, tensor)]  # one HF tensor per expert
        for e, piece in pieces:
            name = theirs if e is None else theirs.replace("{e}", str(e))
            grouped.setdefault(name, (rule, {}))[1][rule.part[0] if rule.part else 0] = piece.to(dtype or piece.dtype)
    tensors = {name: rule.to_theirs([parts[k] for k in sorted(parts)]) for name, (rule, parts) in grouped.items()}
    floats = {t.dtype for t in tensors.values() if t.is_floating_point()}
    hf_config["dtype"] = str(floats.pop()).removeprefix("torch.") if len(floats) == 1 else "float32"
    if task_head is not None:
        tensors.update({k: v.detach().contiguous().cpu() for k, v in task_head.tensors.items()})
        hf_config.update(task_head.config)
    from safetensors.torch import save_file

    with atomic_dir(path) as tmp:
        (tmp / HF_CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")
        with environment_errors(tmp / "model.safetensors", "write"):  # safetensors names the errno in words
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            _write_hf_tokenizer(tokenizer, tmp, cfg, chat_template)
    return path


def convert_to_hf(source: str | Path, dst: str | Path, *, dtype: torch.dtype | None = None,
                  overwrite: bool = True, chat_template: str | None = None) -> Path:
    """lmforge model folder -> HF folder, with its tokenizer and task head (if it has them), and
    ``chat_template`` (Jinja) in its tokenizer_config.json."""
    source = Path(source)
    if not (source / "config.json").is_file():
        raise HFConversionError(f"{source}: not an lmforge model folder (no config.json)")
    model = load_transformer(source).eval()
    tokenizer = source if (source / "tokenizer.json").is_file() else None
    return to_hf(model, dst, tokenizer=tokenizer, task_head=TaskHead.load(source), dtype=dtype, overwrite=overwrite,
                 chat_template=chat_template if tokenizer is not None else None)
