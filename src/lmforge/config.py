"""`ModelConfig`: one flat, plain-data description of every model lmforge can build.

A config is a dataclass of strings, numbers and booleans, so it round-trips through JSON and YAML
unchanged. Variants are named by strings (``position="rope"``, ``activation="swiglu"``) rather than
by classes, as in litgpt. :meth:`ModelConfig.validate` checks every field and names the one to fix.

The same fields express the classic families::

    BERT     encoder          learned  layernorm post  gelu       segments, embedding norm, MLM head
    GPT-2    decoder          learned  layernorm pre   gelu-tanh  tied LM head, final norm
    T5       encoder-decoder  t5-bias  rmsnorm   pre   relu       shared + tied embeddings, no attn scale
    BART     encoder-decoder  learned  layernorm post  gelu       embedding norm, position offset 2
    Llama    decoder          rope     rmsnorm   pre   swiglu     GQA (n_kv_heads < n_heads), no bias
    DeBERTa  encoder          deberta  layernorm post  gelu       disentangled attention, embedding norm, MLM head

Example:
    >>> from lmforge.config import ModelConfig
    >>> cfg = ModelConfig.from_preset("gpt-tiny")
    >>> cfg.d_model, cfg.n_layers
    (384, 6)
    >>> ModelConfig.from_dict(cfg.to_dict()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from lmforge.errors import LmforgeError
from lmforge.utils.io import atomic_write_text, read_mapping_file

ARCHS = ("encoder", "decoder", "encoder-decoder")
POSITIONS = ("sinusoidal", "learned", "relative", "t5-bias", "rope", "alibi", "deberta", "none")
DEBERTA_TERMS = ("c2p", "p2c")  # DeBERTa's position terms: content->position, position->content
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
# "-tanh" variants use the tanh approximation of GELU (GPT-2's gelu_new, T5 v1.1's gated-gelu).
# Narang et al. 2021's rows: elu, selu, sigmoid, softplus; glu (sigmoid gate), liglu (bilinear: no gate function).
ACTIVATIONS = ("relu", "gelu", "gelu-tanh", "silu", "geglu", "geglu-tanh", "reglu", "swiglu",
               "elu", "selu", "sigmoid", "softplus", "glu", "liglu")
GATED_ACTIVATIONS = ("geglu", "geglu-tanh", "reglu", "swiglu", "glu", "liglu")
ATTENTIONS = ("full", "linformer")  # linformer: keys/values projected to linformer_k along the sequence
# C2: Tay et al. 2020's synthesizers (lmforge.nn.synthesizer): attention weights not from query-key pairs
SYNTHESIZERS = ("synthesizer-dense", "synthesizer-random", "synthesizer-factorized-dense",
                "synthesizer-factorized-random")
ATTENTIONS = ATTENTIONS + SYNTHESIZERS
SYNTHESIZER_MIXES = ("none", "plus", "plus-alpha")  # C2: with dot-product logits: summed, or a learned mixture
FUNNEL_POOLS = ("mean", "strided")  # C2: the Funnel Transformer's pooling by 2 (lmforge.nn.funnel)
CONV_ATTENTIONS = ("lightconv", "dynamicconv")  # C1: Wu et al. 2019's convolutions in place of self-attention
ATTENTIONS += CONV_ATTENTIONS
BLOCKS = ("transformer", "evolved")  # C1: the layer a stack repeats (evolved: So et al. 2019)
LINFORMER_SHARING = ("headwise", "key-value", "none")  # one E, F per layer; E = F; E_h, F_h per kv head
HEADS = ("lm", "mlm", "rtd", "none")  # rtd: ELECTRA's replaced-token detection head (B, T)
# share_layers: which stacks run one layer's weights at every depth (True = "both"; Narang et al. 2021's rows).
SHARED_STACKS = ("encoder", "decoder", "both")

PRESET_DIR = Path(__file__).parent / "presets"


class ConfigError(LmforgeError, ValueError):
    """A config field has a bad value; the message names the field and what is allowed."""


C = TypeVar("C", bound="ConfigBase")


def underscore_keys(data: dict[Any, Any], source: str = "config") -> dict[str, Any]:
    """``data`` with dashes in its keys turned into underscores (``max-steps`` -> ``max_steps``); two keys that
    become the same one are an error naming both, rather than the last one silently winning.

    Example:
        >>> underscore_keys({"max-steps": 10, "lr": 0.1})
        {'max_steps': 10, 'lr': 0.1}
        >>> underscore_keys({"max-steps": 10, "max_steps": 20}, source="run.yaml")
        Traceback (most recent call last):
        ...
        lmforge.config.ConfigError: run.yaml: 'max-steps' and 'max_steps' are the same setting; keep one of them
    """
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key in spelled:
            raise ConfigError(f"{source}: {spelled[key]!r} and {str(raw_key)!r} are the same setting; keep one of them")
        spelled[key], out[key] = str(raw_key), value
    return out


class ConfigBase:
    """What every lmforge config dataclass shares: ``from_dict`` (unknown keys are an error that names them),
    ``load`` (.json/.yaml), ``replace``, ``to_dict`` and ``save``. Each class keeps its own validation (in
    ``__post_init__`` or ``from_dict``) and says how its keys are called in messages (``config_noun``).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Point(ConfigBase):
        ...     config_noun = "Point field(s)"
        ...     x: int = 0
        ...     y: int = 0
        >>> Point.from_dict({"x": 1}).replace(y=2)
        Point(x=1, y=2)
        >>> Point.from_dict({"z": 1}, source="p.yaml")
        Traceback (most recent call last):
        ...
        lmforge.config.ConfigError: p.yaml: unknown Point field(s) z; known: x, y
    """

    config_noun: ClassVar[str] = "field(s)"  # "unknown <config_noun> a, b"
    quote_keys: ClassVar[bool] = False  # unknown keys shown as 'a' rather than a
    config_file_kind: ClassVar[str] = "config"  # "PATH: no such <config_file_kind> file"

    @classmethod
    def config_keys(cls) -> list[str]:
        """The field names, in declaration order."""
        return [f.name for f in fields(cls)]

    @classmethod
    def check_keys(cls, data: Any, source: str = "config") -> None:
        """Raise ConfigError unless ``data`` is a mapping whose keys are all fields: the message names the unknown
        keys and suggests the closest field (one unknown key) or lists the known ones."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping of {cls.__name__} fields, got {type(data).__name__}")
        known = cls.config_keys()
        unknown = [str(k) for k in data if k not in known]
        if not unknown:
            return
        keys = ", ".join(repr(k) if cls.quote_keys else k for k in sorted(unknown))
        close = difflib.get_close_matches(unknown[0], known, n=1) if len(unknown) == 1 else []
        hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(known)}"
        raise ConfigError(f"{source}: unknown {cls.config_noun} {keys}{hint}")

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any], source: str = "config") -> C:
        """Build from plain data; unknown keys and bad values raise ConfigError naming ``source``."""
        cls.check_keys(data, source)
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:  # TypeError: a value dataclass init cannot take
            raise ConfigError(f"{source}: {exc}") from exc

    def check_kinds(self) -> None:
        """Raise ConfigError unless each field holds its annotated kind (int, float, bool, str, dict, or one of
        them ``| None``; other annotations are not checked). A YAML typo such as ``dropout: /tmp/x`` must not
        reach range checks, whose comparison would fail with an unrelated TypeError."""
        kinds = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "dict[str, Any]": (dict,)}
        for f in fields(self):
            value, annotation = getattr(self, f.name), str(f.type)
            optional = annotation.endswith(" | None")
            allowed = kinds.get(annotation.removesuffix(" | None"))
            if allowed is None or (optional and value is None):
                continue
            if not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool)):
                raise ConfigError(f"{type(self).__name__}.{f.name}={value!r} must be "
                                  f"{annotation.replace(' | None', ' or null')}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self: C, **changes: Any) -> C:
        """A validated copy with some fields changed."""
        return type(self).from_dict({**self.to_dict(), **changes})

    def save(self, path: str | Path) -> None:
        """Write atomically: YAML for .yaml/.yml, else JSON."""
        path = Path(path)
        text = yaml.safe_dump(self.to_dict(), sort_keys=False) if path.suffix in (".yaml", ".yml") else (
            json.dumps(self.to_dict(), indent=2) + "\n"
        )
        atomic_write_text(path, text)

    @classmethod
    def load(cls: type[C], path: str | Path) -> C:
        """Read a .json or .yaml file of fields; errors name the file."""
        try:
            data = read_mapping_file(path, cls.config_file_kind)
        except FileNotFoundError:
            raise
        except ValueError as exc:  # the file does not parse
            raise ConfigError(str(exc)) from exc
        return cls.from_dict({} if data is None else data, source=str(path))


@dataclass
class ModelConfig(ConfigBase):
    """Every knob of an lmforge Transformer. See the module docstring for how families map onto it.

    Field groups:
        shape: ``arch, vocab_size, d_model, n_heads, n_kv_heads, head_dim, d_ff, n_layers,
            n_decoder_layers, max_seq_len``.
        regularisation: ``dropout`` (residual + embeddings), ``attn_dropout``, ``ffn_dropout``.
        positions: ``position`` and its parameters (``position_offset`` for RoBERTa/BART learned
            tables, ``relative_k``/``relative_values`` for Shaw, ``t5_num_buckets``/``t5_max_distance``,
            ``rope_theta``/``rotary_pct``, DeBERTa's ``position_buckets``/``max_relative_positions``/
            ``share_att_key``/``pos_att_type``/``norm_rel_embeddings``).
        embeddings: ``embedding_dim`` (ALBERT factorisation when < d_model), ``type_vocab_size``
            (segments; 0 = none), ``scale_embeddings`` (multiply by sqrt(d_model)), ``embedding_norm``,
            ``tie_embeddings`` (input/output), ``share_embeddings`` (encoder/decoder).
        layers: ``norm``, ``norm_position``, ``final_norm``, ``activation``, ``bias``, ``attn_scale``
            (False for T5, which folds 1/sqrt(d) into its init), ``share_layers`` (ALBERT: one layer's weights at
            every depth; ``encoder`` / ``decoder`` / ``both`` (= True) pick the stacks), ``share_encoder_decoder``
            (T5's "Enc-dec, shared" row: the decoder's layers reuse the encoder's, see
            :mod:`lmforge.models.transformer`).
        residual/init rows (Narang et al. 2021): ``rezero_norm`` (ReZero keeping its pre-norm,
            :mod:`lmforge.nn.rezero`), ``fixup`` (:mod:`lmforge.nn.fixup`), ``transparent_attention``
            (encoder-decoders, :mod:`lmforge.nn.transparent_attention`).
        mixture of experts (:mod:`lmforge.nn.moe`): ``moe_experts`` (0 = dense FFNs), ``moe_top_k`` (1 = Switch,
            2 = Mixtral/GShard), ``moe_every`` (layers k-1, 2k-1, ... of each stack are MoE), ``moe_capacity_factor``
            or ``moe_expert_capacity`` (neither = dropless), ``moe_renormalize`` (None: when top_k > 1),
            ``moe_aux_loss`` / ``moe_z_loss`` (coefficients), ``moe_jitter``, ``moe_shared_experts``.
        heads: ``head`` (lm | mlm | rtd | none; rtd is ELECTRA's replaced-token detector), ``lm_head_bias``,
            ``lm_head_scale`` (T5 v1.0 scales the decoder output by d_model**-0.5 before its tied head), ``pooler``,
            ``nsp_head`` (BERT's next-sentence classifier on the pooler output; needs ``pooler``).
        special tokens: ids recorded from the tokenizer (None when absent).
    """

    # --- shape -------------------------------------------------------------------------------
    arch: str = "decoder"
    vocab_size: int = 8192
    d_model: int = 384
    n_heads: int = 6
    n_kv_heads: int | None = None  # None = n_heads (MHA); 1 = MQA; in between = GQA
    head_dim: int | None = None  # None = d_model // n_heads (T5 v1.1 decouples them)
    d_ff: int = 1536
    n_layers: int = 6  # encoder layers, or decoder layers for a decoder-only model
    n_decoder_layers: int | None = None  # encoder-decoder only; None = n_layers
    max_seq_len: int = 256
    # --- regularisation ----------------------------------------------------------------------
    dropout: float = 0.0
    attn_dropout: float = 0.0
    ffn_dropout: float = 0.0
    # --- positions ---------------------------------------------------------------------------
    position: str = "learned"
    position_offset: int = 0  # RoBERTa/BART learned tables start at index 2 (padding_idx + 1)
    relative_k: int = 16  # Shaw et al.: distances beyond +-k share the clipped embedding
    relative_values: bool = False  # Shaw et al. also add a relative term to the values
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    rope_theta: float = 10000.0
    rotary_pct: float = 1.0  # fraction of each head's dims that rotate (GPT-NeoX-style partial)
    position_buckets: int = 256  # DeBERTa-v2/v3 log buckets of relative distance (0 = exact distances)
    max_relative_positions: int = 512  # DeBERTa: the distance the last log bucket reaches (the span without buckets)
    share_att_key: bool = True  # DeBERTa-v2/v3: positions are projected by the layer's own W_q, W_k
    pos_att_type: str = "c2p|p2c"  # DeBERTa's position terms, joined by |
    norm_rel_embeddings: bool = True  # DeBERTa-v2/v3 LayerNorm the relative-position table
    # --- embeddings --------------------------------------------------------------------------
    embedding_dim: int | None = None  # ALBERT-style factorisation E < d_model; None = d_model
    type_vocab_size: int = 0
    scale_embeddings: bool = False
    embedding_norm: bool = False
    tie_embeddings: bool = True
    share_embeddings: bool = True
    # --- layers ------------------------------------------------------------------------------
    norm: str = "layernorm"
    norm_position: str = "pre"
    final_norm: bool = True
    layer_norm_eps: float = 1e-5
    activation: str = "gelu"
    bias: bool = True
    attn_scale: bool = True
    share_layers: bool | str = False  # False, True (= "both"), "encoder", "decoder" or "both"
    share_encoder_decoder: bool = False
    # --- attention variants and residual gates (see the docstring's "attention" and "residuals") ------
    attention: str = "full"
    linformer_k: int = 256
    linformer_sharing: str = "headwise"
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    attn_scale_by_layer: bool = False
    sliding_window: int | None = None
    rezero: bool = False
    step_embeddings: bool = False
    # --- Narang's table, part A: residual/init rows (ReZero+norm, Fixup, transparent attention) ---------
    rezero_norm: bool = False  # ReZero keeps each branch's pre-norm: x + alpha * F(Norm(x)) (lmforge.nn.rezero)
    fixup: bool = False  # Zhang et al. 2019: no norms, zero-init branch outputs, L^-1/2 inside (lmforge.nn.fixup)
    transparent_attention: bool = False  # Bapna et al. 2018: cross-attend a learned mix of all encoder layers
    # --- Narang's table, part B: embedding/softmax rows (adaptive input/softmax, MoS, product-key memory) ---
    # Cutoffs are band ends below vocab_size; the bands assume ids sorted by frequency (lmforge.nn.adaptive_input).
    adaptive_input_cutoffs: list[int] | None = None  # Baevski & Auli 2019: banded token tables; None = one table
    adaptive_softmax_cutoffs: list[int] | None = None  # Grave et al. 2017: clustered output layer; None = softmax
    adaptive_factor: float = 4.0  # band / cluster i is d_model / adaptive_factor**i wide
    mos_experts: int = 0  # Yang et al. 2018: a mixture of this many softmaxes; 0 = one softmax
    pkm_layers: list[int] | None = None  # Lample et al. 2019: these layers' FFN (0-based) is a product-key memory
    pkm_keys: int = 32  # sub-keys per half: pkm_keys**2 memory slots
    pkm_topk: int = 4  # slots each head reads
    pkm_heads: int = 4  # query heads (each with its own sub-keys), their reads summed
    pkm_key_dim: int | None = None  # query width, split in two halves; None = d_model
    # --- Narang's table, part C: layer-type rows (convolutions, Evolved, Synthesizer, Funnel, Weighted) ----
    # C2: Synthesizer (attention='synthesizer-*'), Funnel (funnel_*), Weighted Transformer (weighted_branches)
    synthesizer_mix: str = "none"  # none | plus (+ dot-product logits) | plus-alpha (a learned convex mix of the two)
    synthesizer_factor: int = 8  # factorized-random: rank k of R1 R2^T; factorized-dense: k, with k * (L/k) = L
    synthesizer_trainable: bool = True  # random synthesizers: learn R, or keep its random draw fixed
    funnel_blocks: list[int] | None = None  # Funnel (Dai et al. 2020): layers per group, pooled by 2 between groups
    funnel_pool: str = "mean"  # mean | strided
    funnel_decoder_layers: int = 2  # full-length layers after upsampling, for token-level heads (0: compressed out)
    weighted_branches: bool = False  # Ahmed et al. 2017: each head its own W^O and FFN, mixed by kappa and alpha
    # C1: attention="lightconv"/"dynamicconv" (Wu et al. 2019, lmforge.nn.lightconv / nn.dynamicconv) and
    # block="evolved" (So et al. 2019's Evolved Transformer layers, lmforge.nn.evolved).
    conv_kernel: int = 7  # width k of the light/dynamic convolution kernels (the paper grows it 3..31 with depth)
    block: str = "transformer"  # "evolved": the Evolved Transformer's encoder/decoder layers instead of Block
    # --- mixture of experts (lmforge.nn.moe) ---------------------------------------------------
    moe_experts: int = 0  # experts per MoE layer; 0 = every FFN is dense
    moe_top_k: int = 1  # experts per token: 1 = Switch, 2 = Mixtral / GShard
    moe_every: int = 1  # every k-th layer of a stack is MoE (0-based layers k-1, 2k-1, ...)
    moe_capacity_factor: float | None = None  # slots per expert = ceil(factor * T * top_k / experts); None = no limit
    moe_expert_capacity: int | None = None  # a fixed capacity per sequence instead (HF Switch's expert_capacity)
    moe_renormalize: bool | None = None  # gate weights = top-k probabilities / their sum; None = when top_k > 1
    moe_aux_loss: float = 0.01  # Switch load-balancing loss coefficient (alpha)
    moe_z_loss: float = 0.001  # ST-MoE router z-loss coefficient
    moe_jitter: float = 0.0  # training only: router input times U(1 - j, 1 + j) (Switch)
    moe_shared_experts: int = 0  # always-on experts beside the routed ones (DeepSeekMoE)
    # --- heads -------------------------------------------------------------------------------
    head: str = "lm"
    lm_head_bias: bool = False
    lm_head_scale: bool = False
    pooler: bool = False
    nsp_head: bool = False  # BERT's [CLS] IsNext/NotNext classifier (HF cls.seq_relationship) on the pooler
    mlm_head_activation: str = "gelu"
    initializer_range: float = 0.02
    # --- special tokens (recorded from the tokenizer) ----------------------------------------
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    unk_token_id: int | None = None
    mask_token_id: int | None = None
    cls_token_id: int | None = None
    sep_token_id: int | None = None
    decoder_start_token_id: int | None = None
    # --- bookkeeping -------------------------------------------------------------------------
    name: str = "custom"
    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes (e.g. HF provenance)

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived quantities
    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def embed_dim(self) -> int:
        return self.embedding_dim if self.embedding_dim is not None else self.d_model

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def gated(self) -> bool:
        return self.activation in GATED_ACTIVATIONS

    @property
    def moe_renormalizes(self) -> bool:
        """Whether the top-k gate weights are renormalised to sum to 1 (``moe_renormalize``, default top_k > 1)."""
        return self.moe_top_k > 1 if self.moe_renormalize is None else self.moe_renormalize

    def moe_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based, within its stack) has an MoE FFN: every ``moe_every``-th layer."""
        return self.moe_experts > 0 and (index + 1) % self.moe_every == 0

    # ------------------------------------------------------------------ validation
    def validate(self) -> "ModelConfig":
        """Check every field; raise :class:`ConfigError` naming the first bad one."""

        def choice(name: str, allowed: tuple[str, ...]) -> None:
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(f"ModelConfig.{name}={value!r} is not one of {', '.join(allowed)}")

        def positive(name: str) -> None:  # the kind (int) is already checked by check_kinds
            value = getattr(self, name)
            if value <= 0:
                raise ConfigError(f"ModelConfig.{name}={value!r} must be a positive integer")

        self.check_kinds()
        choice("arch", ARCHS)
        choice("position", POSITIONS)
        choice("norm", NORMS)
        choice("norm_position", NORM_POSITIONS)
        choice("activation", ACTIVATIONS)
        choice("mlm_head_activation", ACTIVATIONS[:4])
        choice("head", HEADS)
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_seq_len"):
            positive(name)
        for name in ("n_kv_heads", "head_dim", "n_decoder_layers", "embedding_dim"):
            if getattr(self, name) is not None:
                positive(name)
        for name in ("dropout", "attn_dropout", "ffn_dropout"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"ModelConfig.{name}={p!r} must be in [0, 1)")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"ModelConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                "change one of them or set head_dim explicitly"
            )
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"ModelConfig.n_kv_heads={self.kv_heads} must divide n_heads={self.n_heads} "
                "(each group of query heads shares one key/value head)"
            )
        if self.position == "rope":
            rot = int(self.dim_per_head * self.rotary_pct)
            if not 0.0 < self.rotary_pct <= 1.0 or rot % 2:
                raise ConfigError(
                    f"ModelConfig.rotary_pct={self.rotary_pct} gives {rot} rotary dims per head; "
                    "it must be in (0, 1] and give an even number"
                )
        if self.position == "sinusoidal" and self.embed_dim % 2:
            raise ConfigError("ModelConfig.position='sinusoidal' needs an even embedding width")
        if self.position == "relative" and self.relative_k <= 0:
            raise ConfigError(f"ModelConfig.relative_k={self.relative_k} must be positive")
        if self.position == "deberta":
            self._validate_deberta()
        self._validate_sharing()
        self._validate_attention_variants()
        self._validate_narang_c2()  # C2: synthesizer, funnel, weighted branches
        self._validate_convolution_rows()
        self._validate_narang_b()
        self._validate_residual_rows()
        if self.layer_norm_eps <= 0:
            raise ConfigError(f"ModelConfig.layer_norm_eps={self.layer_norm_eps} must be positive")
        if self.position_offset < 0:
            raise ConfigError(f"ModelConfig.position_offset={self.position_offset} must be >= 0")
        if self.type_vocab_size < 0:
            raise ConfigError(f"ModelConfig.type_vocab_size={self.type_vocab_size} must be >= 0")
        if self.head in ("mlm", "rtd") and self.arch != "encoder":
            raise ConfigError(f"ModelConfig.head={self.head!r} needs arch='encoder' (got arch={self.arch!r})")
        if self.pooler and self.arch != "encoder":
            raise ConfigError(f"ModelConfig.pooler=True needs arch='encoder' (got arch={self.arch!r})")
        if self.nsp_head and (self.arch != "encoder" or not self.pooler):
            raise ConfigError(f"ModelConfig.nsp_head=True needs arch='encoder' and pooler=True (got arch={self.arch!r}, "
                              f"pooler={self.pooler}); the NSP classifier reads the pooler output")
        if self.n_decoder_layers is not None and self.arch != "encoder-decoder":
            raise ConfigError("ModelConfig.n_decoder_layers is only meaningful for arch='encoder-decoder'")
        if self.moe_experts:
            self._validate_moe()
        for name in (f.name for f in fields(self) if f.name.endswith("_token_id")):
            tid = getattr(self, name)
            if tid is not None and not 0 <= tid < self.vocab_size:
                raise ConfigError(f"ModelConfig.{name}={tid} is outside the vocabulary [0, {self.vocab_size})")
        return self

    def layers_shared(self, stack: str) -> bool:
        """Whether the ``stack`` ("encoder" or "decoder") runs one layer's weights at every depth.

        Example:
            >>> ModelConfig(arch="encoder-decoder", share_layers="encoder").layers_shared("decoder")
            False
        """
        return self.share_layers is True or self.share_layers in ("both", stack)

    def _validate_sharing(self) -> None:
        value = self.share_layers
        if not isinstance(value, bool) and value not in SHARED_STACKS:
            raise ConfigError(f"ModelConfig.share_layers={value!r} must be true, false or one of "
                              f"{', '.join(SHARED_STACKS)}")
        if value in ("encoder", "decoder") and self.arch != "encoder-decoder" and value != self.arch:
            raise ConfigError(f"ModelConfig.share_layers={value!r} names a stack that arch={self.arch!r} does not "
                              f"have; use share_layers=true")
        if self.share_encoder_decoder:
            if self.arch != "encoder-decoder":
                raise ConfigError(f"ModelConfig.share_encoder_decoder=True needs arch='encoder-decoder' (got "
                                  f"arch={self.arch!r}): there is no second stack to share with")
            if self.decoder_layers != self.n_layers or self.layers_shared("encoder") != self.layers_shared("decoder"):
                raise ConfigError(f"ModelConfig.share_encoder_decoder=True needs stacks of the same shape (got "
                                  f"n_layers={self.n_layers}, n_decoder_layers={self.decoder_layers}, "
                                  f"share_layers={value!r}); make them equal")

    def _validate_attention_variants(self) -> None:
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"ModelConfig.attention={self.attention!r} is not one of {', '.join(ATTENTIONS)}")
        if self.attention == "linformer":
            if self.arch != "encoder":
                raise ConfigError(f"ModelConfig.attention='linformer' needs arch='encoder' (got arch={self.arch!r}): "
                                  "its projection along the sequence mixes future positions into every key, "
                                  "so it cannot be causal")
            if not 0 < self.linformer_k <= self.max_seq_len:
                raise ConfigError(f"ModelConfig.linformer_k={self.linformer_k} must be in [1, max_seq_len="
                                  f"{self.max_seq_len}] (keys are projected from max_seq_len positions to k)")
            if self.linformer_sharing not in LINFORMER_SHARING:
                raise ConfigError(f"ModelConfig.linformer_sharing={self.linformer_sharing!r} is not one of "
                                  f"{', '.join(LINFORMER_SHARING)}")
            if self.position not in ("learned", "sinusoidal", "rope", "none"):
                raise ConfigError(f"ModelConfig.position={self.position!r} adds a (T, S) bias, which has no meaning "
                                  "over Linformer's projected keys; use learned, sinusoidal, rope or none")
        if self.sliding_window is not None:
            if self.sliding_window <= 0:
                raise ConfigError(f"ModelConfig.sliding_window={self.sliding_window} must be a positive integer")
            if self.arch != "decoder":
                raise ConfigError(f"ModelConfig.sliding_window needs arch='decoder' (got arch={self.arch!r})")
        if self.attn_scale_by_layer and self.share_layers:
            raise ConfigError("ModelConfig.attn_scale_by_layer=True cannot combine with share_layers=True "
                              "(one shared layer has one attention scale)")
        if self.step_embeddings and not self.share_layers:
            raise ConfigError("ModelConfig.step_embeddings=True needs share_layers=True (the Universal Transformer "
                              "applies one layer repeatedly and tells the steps apart by these embeddings)")
        if self.step_embeddings and self.d_model % 2:
            raise ConfigError(f"ModelConfig.step_embeddings=True needs an even d_model (got {self.d_model})")

    def _validate_convolution_rows(self) -> None:
        """C1: light/dynamic convolutions (lmforge.nn.lightconv) and the Evolved Transformer (lmforge.nn.evolved)."""
        if self.block not in BLOCKS:
            raise ConfigError(f"ModelConfig.block={self.block!r} is not one of {', '.join(BLOCKS)}")
        conv = self.attention in CONV_ATTENTIONS
        if not (conv or self.block == "evolved"):
            return
        what = f"attention={self.attention!r}" if conv else "block='evolved'"
        if self.position not in ("learned", "sinusoidal", "none"):
            raise ConfigError(f"ModelConfig.position={self.position!r} acts inside attention, which {what} replaces "
                              "or re-heads; use learned, sinusoidal or none")
        # A shared encoder layer would make the decoder's convolutions see the future; the others rebuild the layer.
        others = ("sliding_window", "rezero", "share_encoder_decoder", "fixup", "weighted_branches", "funnel_blocks")
        for name in others + (("pkm_layers",) if not conv else ()):
            value = getattr(self, name, None)
            if value not in (None, False):
                raise ConfigError(f"ModelConfig.{name}={value!r} cannot combine with {what}")
        if conv:
            if self.conv_kernel < 1:
                raise ConfigError(f"ModelConfig.conv_kernel={self.conv_kernel} must be a positive integer")
            if self.d_model % self.n_heads:
                raise ConfigError(f"ModelConfig.n_heads={self.n_heads} must divide d_model={self.d_model} with "
                                  f"{what} (each head's kernel serves d_model / n_heads channels)")
            return
        if self.attention != "full" or self.moe_experts or self.norm_position != "pre":
            raise ConfigError(f"ModelConfig.block='evolved' needs attention='full', moe_experts=0 and norm_position="
                              f"'pre' (got {self.attention!r}, {self.moe_experts}, {self.norm_position!r}): its "
                              "searched layers fix their own sublayers")
        wide = max(16, self.n_heads)  # the decoder's wide self-attention branch
        if self.d_model % 2 or (self.arch != "encoder" and self.d_model % wide):
            raise ConfigError(f"ModelConfig.d_model={self.d_model} must be even for block='evolved', and divisible "
                              f"by {wide} in a decoder (its wide self-attention has max(16, n_heads) heads)")

    def _validate_residual_rows(self) -> None:
        """Narang et al. 2021's residual/init rows: ReZero + norm, Fixup, transparent attention."""
        if self.rezero_norm and (not self.rezero or self.norm_position != "pre"):
            raise ConfigError(f"ModelConfig.rezero_norm=True needs rezero=True and norm_position='pre' (got rezero="
                              f"{self.rezero}, norm_position={self.norm_position!r}): it keeps ReZero's pre-norm")
        if self.fixup and (self.rezero or self.moe_experts):
            raise ConfigError(f"ModelConfig.fixup=True cannot combine with rezero or MoE FFNs (got rezero="
                              f"{self.rezero}, moe_experts={self.moe_experts}): Fixup sets its own residual gates")
        # Fixup's init knows the plain layer's branches (attn.q/k/v/o, ffn.up/gate/down); other layer types differ.
        plain = {"attention": ("full", "linformer"), "block": ("transformer",), "weighted_branches": (False,),
                 "pkm_layers": (None, []), "funnel_blocks": (None,)}
        for name, allowed in plain.items():
            if self.fixup and getattr(self, name, allowed[0]) not in allowed:
                raise ConfigError(f"ModelConfig.fixup=True cannot combine with {name}={getattr(self, name)!r}: its "
                                  "initialisation rescales the standard attention and FFN layers only")
        if self.transparent_attention and self.arch != "encoder-decoder":
            raise ConfigError(f"ModelConfig.transparent_attention=True needs arch='encoder-decoder' (got arch="
                              f"{self.arch!r}): the decoder's cross-attention reads a mix of the encoder's layers")

    def pkm_layer(self, index: int) -> bool:
        """Whether layer ``index`` (0-based, within its stack) reads a product-key memory instead of an FFN."""
        return index in (self.pkm_layers or ())

    def _validate_narang_b(self) -> None:
        """Adaptive input / softmax, mixture of softmaxes and product-key memory (lmforge.nn.adaptive_input, ...)."""
        def bad(name: str, rule: str) -> ConfigError:
            return ConfigError(f"ModelConfig.{name}={getattr(self, name)!r} {rule}")

        def int_list(name: str) -> list[int] | None:
            value = getattr(self, name)
            if value is None:
                return None
            if not isinstance(value, (list, tuple)) or not value or not all(
                    isinstance(v, int) and not isinstance(v, bool) for v in value):
                raise bad(name, "must be a non-empty list of integers (null: off)")
            setattr(self, name, list(value))  # a tuple would not compare equal to its JSON round trip
            return list(value)

        if not self.adaptive_factor >= 1:  # also refuses NaN
            raise bad("adaptive_factor", "must be >= 1 (band i is d_model / adaptive_factor**i wide)")
        tied_head = self.tie_embeddings and self.head in ("lm", "mlm")
        for name in ("adaptive_input_cutoffs", "adaptive_softmax_cutoffs"):
            cuts = int_list(name)
            if cuts is None:
                continue
            if cuts != sorted(set(cuts)) or cuts[0] < 1 or cuts[-1] >= self.vocab_size:
                raise bad(name, f"must be strictly increasing ids in [1, vocab_size={self.vocab_size}) (the band ends)")
            if self.d_model // self.adaptive_factor ** len(cuts) < 1:
                raise bad("adaptive_factor", f"makes the last of {name}'s {len(cuts) + 1} bands 0 wide at "
                                             f"d_model={self.d_model}; lower it or use fewer cutoffs")
            if tied_head:
                raise bad(name, "needs tie_embeddings=false (banded weights have no (V, E) matrix to tie)")
        if self.adaptive_input_cutoffs is not None and self.embedding_dim not in (None, self.d_model):
            raise bad("embedding_dim", "must be null with adaptive_input_cutoffs (the bands set their own widths)")
        if self.mos_experts < 0:
            raise bad("mos_experts", "must be >= 0 (0: one softmax)")
        for name in ("adaptive_softmax_cutoffs", "mos_experts"):
            if getattr(self, name) and self.head != "lm":
                raise bad(name, f"replaces the LM head's softmax; it needs head='lm' (got head={self.head!r})")
        if self.adaptive_softmax_cutoffs is not None and self.mos_experts:
            raise bad("mos_experts", "and adaptive_softmax_cutoffs both replace the output softmax; keep one")
        layers = int_list("pkm_layers")
        if layers is None:
            return
        depth = max(self.n_layers, self.decoder_layers)
        if len(set(layers)) != len(layers) or not all(0 <= i < depth for i in layers):
            raise bad("pkm_layers", f"must be distinct 0-based layer indices below {depth}")
        if self.share_layers:
            raise bad("pkm_layers", "cannot combine with share_layers (one shared layer has one FFN)")
        if any(self.moe_layer(i) for i in layers):
            raise bad("pkm_layers", "names a layer that moe_every makes MoE; a layer has one FFN")
        if getattr(self, "fixup", False):
            raise bad("pkm_layers", "cannot combine with fixup (its init zeroes each FFN's last layer; a memory has none)")
        for name in ("weighted_branches", "funnel_blocks", "block"):  # layers built otherwise: a memory would be lost
            if getattr(self, name, None) != getattr(type(self), name, None):  # not the field's default
                raise bad("pkm_layers", f"cannot combine with {name}={getattr(self, name)!r} (those layers are built "
                                        "without a product-key memory)")
        for name in ("pkm_keys", "pkm_topk", "pkm_heads"):
            if getattr(self, name) < 1:
                raise bad(name, "must be a positive integer")
        if self.pkm_topk > self.pkm_keys:
            raise bad("pkm_topk", f"must be <= pkm_keys={self.pkm_keys} (each half picks its top k sub-keys)")
        if self.pkm_key_dim is not None and (self.pkm_key_dim < 2 or self.pkm_key_dim % 2):
            raise bad("pkm_key_dim", "must be a positive even integer (a query splits in two halves; null: d_model)")
        if self.pkm_key_dim is None and self.d_model % 2:
            raise bad("pkm_key_dim", f"must be set (even) when d_model={self.d_model} is odd")

    def _validate_narang_c2(self) -> None:
        """C2: Synthesizer attention, the Funnel Transformer's encoder and the Weighted Transformer's branches."""
        def bad(name: str, rule: str) -> ConfigError:
            return ConfigError(f"ModelConfig.{name}={getattr(self, name)!r} {rule}")

        if self.synthesizer_mix not in SYNTHESIZER_MIXES:
            raise bad("synthesizer_mix", f"is not one of {', '.join(SYNTHESIZER_MIXES)}")
        if self.attention in SYNTHESIZERS:
            if self.kv_heads != self.n_heads:
                raise bad("n_kv_heads", f"must equal n_heads with attention={self.attention!r} (no grouped keys)")
            if self.sliding_window is not None or self.position in ("relative", "deberta"):
                raise bad("attention", "cannot combine with sliding_window or Shaw/DeBERTa relative positions "
                                       "(its weights are tied to absolute positions 0 .. max_seq_len - 1)")
            if self.synthesizer_factor < 1:
                raise bad("synthesizer_factor", "must be a positive integer")
            if self.attention == "synthesizer-factorized-dense" and self.max_seq_len % self.synthesizer_factor:
                raise bad("synthesizer_factor", f"must divide max_seq_len={self.max_seq_len} (factorized-dense "
                                                "logits are the outer product of k and max_seq_len/k of them)")
        elif self.synthesizer_mix != "none":
            raise bad("synthesizer_mix", f"needs a synthesizer attention (got attention={self.attention!r})")
        blocks = self.funnel_blocks
        if self.funnel_pool not in FUNNEL_POOLS:
            raise bad("funnel_pool", f"is not one of {', '.join(FUNNEL_POOLS)}")
        if blocks is not None:
            if not isinstance(blocks, (list, tuple)) or len(blocks) < 2 or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in blocks):
                raise bad("funnel_blocks", "must be a list of at least 2 positive layer counts, e.g. [2, 2] "
                                           "(null: no funnel)")
            self.funnel_blocks = list(blocks)  # a tuple would not compare equal to its JSON round trip
            if self.arch == "decoder":
                raise bad("funnel_blocks", "needs arch='encoder' or 'encoder-decoder' (got arch='decoder'): a causal "
                                           "stack cannot pool future tokens into a position")
            if sum(blocks) != self.n_layers:
                raise bad("funnel_blocks", f"must sum to n_layers={self.n_layers} (the encoder's layers)")
            if self.position not in ("learned", "sinusoidal", "none"):
                raise bad("position", "must be learned, sinusoidal or none with funnel_blocks (relative positions "
                                      "across pooled lengths are not built)")
            if self.funnel_decoder_layers < 0:
                raise bad("funnel_decoder_layers", "must be >= 0")
            if self.funnel_decoder_layers == 0 and self.head != "none":
                raise bad("funnel_decoder_layers", f"must be >= 1 for head={self.head!r}: a token-level head needs "
                                                   "the upsampled sequence")
            if (self.share_layers or self.moe_experts or self.pkm_layers or self.fixup or self.attention != "full"
                    or self.share_encoder_decoder or self.transparent_attention):
                raise bad("funnel_blocks", "cannot combine with share_layers, share_encoder_decoder, "
                                           "transparent_attention, MoE, pkm_layers, fixup or another attention")
        if self.weighted_branches:
            if self.arch == "encoder-decoder":
                raise bad("weighted_branches", "needs arch='encoder' or 'decoder' (its branches replace a "
                                               "self-attention block's output projection and FFN)")
            if self.moe_experts or self.share_layers or self.pkm_layers or self.fixup:
                raise bad("weighted_branches", "cannot combine with MoE, share_layers, pkm_layers or fixup (its "
                                               "branches are the layer's FFNs)")

    def _validate_moe(self) -> None:
        def bad(name: str, rule: str) -> ConfigError:
            return ConfigError(f"ModelConfig.{name}={getattr(self, name)!r} {rule}")

        if self.moe_experts < 0:
            raise bad("moe_experts", "must be >= 0 (0: dense FFNs)")
        if not 1 <= self.moe_top_k <= self.moe_experts:
            raise bad("moe_top_k", f"must be between 1 and moe_experts={self.moe_experts}")
        if self.moe_every < 1:
            raise bad("moe_every", "must be a positive integer")
        if self.moe_every > max(self.n_layers, self.decoder_layers):
            raise bad("moe_every", f"puts no MoE FFN in any layer (the model has {self.n_layers} layers); "
                                   "lower it, or set moe_experts=0")
        if self.share_layers and self.moe_every != 1:
            raise bad("moe_every", "must be 1 with share_layers (one shared layer is either MoE or dense)")
        cf = self.moe_capacity_factor
        if cf is not None and not cf > 0:  # also refuses NaN
            raise bad("moe_capacity_factor", "must be > 0 (null: no capacity limit)")
        if self.moe_expert_capacity is not None:
            if self.moe_expert_capacity < 1:
                raise bad("moe_expert_capacity", "must be a positive integer (null: no fixed capacity)")
            if cf is not None:
                raise bad("moe_expert_capacity", "and moe_capacity_factor both set a capacity; keep one of them")
        for name in ("moe_aux_loss", "moe_z_loss", "moe_shared_experts"):
            if not getattr(self, name) >= 0:
                raise bad(name, "must be >= 0")
        if not 0 <= self.moe_jitter < 1:
            raise bad("moe_jitter", "must be in [0, 1)")

    def _validate_deberta(self) -> None:
        terms = self.pos_att_type.split("|")
        if not set(terms) <= set(DEBERTA_TERMS) or len(set(terms)) != len(terms):
            raise ConfigError(f"ModelConfig.pos_att_type={self.pos_att_type!r} must be 'c2p|p2c', 'c2p' or 'p2c' "
                              "(DeBERTa's content->position and position->content terms)")
        if self.max_relative_positions < 1:
            raise ConfigError(f"ModelConfig.max_relative_positions={self.max_relative_positions} must be positive")
        if self.position_buckets < 0 or self.position_buckets == 1:
            raise ConfigError(f"ModelConfig.position_buckets={self.position_buckets} must be 0 (exact distances) "
                              "or at least 2")
        if self.position_buckets and self.max_relative_positions - 1 <= self.position_buckets // 2:
            raise ConfigError(
                f"ModelConfig.max_relative_positions={self.max_relative_positions} must exceed position_buckets // 2 "
                f"+ 1 = {self.position_buckets // 2 + 1} (log buckets cover distances from position_buckets // 2 "
                "to max_relative_positions - 1)"
            )

    # ------------------------------------------------------------------ serialisation
    config_noun = "ModelConfig field(s)"

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "ModelConfig":
        """A named preset (see :func:`list_presets`), with optional field overrides."""
        path = PRESET_DIR / f"{name}.yaml"
        if not path.is_file():
            close = closest_preset(name)
            hint = f"did you mean {close!r}? " if close else ""
            raise ConfigError(f"unknown preset {name!r}; {hint}available: {', '.join(list_presets())}")
        cfg = cls.load(path)
        return cfg.replace(**overrides) if overrides else cfg


def closest_preset(name: str) -> str | None:
    """The bundled preset nearest to a mistyped ``name``, its own family first (``gpt-tny``: ``gpt-tiny``, not
    ``bart-tiny``); None when nothing is close."""
    presets = list_presets()
    family = [p for p in presets if p.split("-")[0] == name.lower().split("-")[0]]
    close = (difflib.get_close_matches(name.lower(), family, n=1, cutoff=0.6)
             or difflib.get_close_matches(name.lower(), presets, n=1, cutoff=0.6))
    return close[0] if close else None


def list_presets() -> list[str]:
    """Names of the bundled presets, e.g. ``['bart-base', ..., 'gpt-tiny', ...]``."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def resolve_config(name_or_path: str | Path) -> ModelConfig:
    """A preset name, a config file (.json/.yaml), or a checkpoint folder holding config.json."""
    path = Path(name_or_path)
    if path.is_dir():
        return ModelConfig.load(path / "config.json")
    if path.is_file():
        return ModelConfig.load(path)
    return ModelConfig.from_preset(str(name_or_path))
