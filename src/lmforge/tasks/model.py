"""`TaskModel`: a Transformer body plus a task head, and its folder on disk.

Where the head reads from, per family (the formats of BERT, GPT and BART)::

    encoder          [CLS] A [SEP] B [SEP] -> encoder states                       -> head
    decoder          [bos] A [DELIM] B [EXTRACT] -> causal states                  -> head ("last" = EXTRACT)
    encoder-decoder  <s> A </s> -> encoder; the same ids, shifted right, -> decoder -> head ("last" = </s>)

Multiple choice (BERT's SWAG set-up): ``input_ids`` of shape (B, C, T) hold one (context, choice) pair per
choice; they run through the body as B*C sequences, the head gives each pooled pair one score, and the
scores come back as (B, C) logits for a softmax across the choices.

GPT-1's similarity transformation (``input_transform: gpt1-similarity``): ``input_ids`` of shape (B, 2, T) hold
a pair in both orders; the two pooled [extract] states are added, then classified (Radford et al. 2018, §3.3).

Generative tasks (seq2seq, text2text) have no head of their own: the body's LM head and loss do the work.

The forward pass follows the Trainer's contract: ``model(**batch)`` returns ``loss`` (a mean) and
``n_targets`` (how many targets that mean is over) when the batch has ``labels``, and ``logits`` always.

A task folder is a model folder plus two files::

    DIR/config.json, model.safetensors, tokenizer.json ...  the body: lmforge.load(DIR) reads it on its own
    DIR/task.json                                            the TaskSpec and format version
    DIR/task_head.safetensors                                the head's weights (head tasks only)

A PEFT task folder holds an adapter instead of the body's weights, and names the base model's folder
(see :mod:`lmforge.tasks.peft`); :func:`load_task_model` loads both.

Example:
    >>> import tempfile, torch, lmforge
    >>> from lmforge.tasks.spec import TaskSpec
    >>> body = lmforge.build_model("bert-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    >>> model = build_task_model(body, TaskSpec(task="classify", labels=["neg", "pos"]))
    >>> out = model(torch.randint(5, 100, (2, 7)), labels=torch.tensor([0, 1]))
    >>> out.logits.shape, out.n_targets
    (torch.Size([2, 2]), 2)
    >>> folder = save_task_model(model, tempfile.mkdtemp() + "/clf")
    >>> load_task_model(folder).spec.labels
    ['neg', 'pos']
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lmforge import checkpoint
from lmforge.interop.hf import TaskHead, hf_config_for
from lmforge.models.transformer import Transformer, shift_right
from lmforge.objectives.base import IGNORE_INDEX
from lmforge.peft.model import load_adapter
from lmforge.tasks.bilstm_head import BiLSTMFeatures, BiLSTMHead
from lmforge.tasks.heads import SequenceHead, SpanHead, TokenHead, pool
from lmforge.tasks.spec import TaskSpec
from lmforge.utils.io import atomic_dir
from lmforge.errors import UserInputError

TASK_FILE = "task.json"
HEAD_FILE = "task_head.safetensors"
FORMAT = "lmforge-task"


@dataclass
class TaskOutput:
    """What :class:`TaskModel` returns: ``logits`` (task shaped), and ``loss``/``n_targets`` with labels."""

    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    n_targets: int | None = None


def default_pooling(arch: str) -> str:
    """BERT pools [CLS]; GPT reads its [EXTRACT] token and BART its final </s>, both the last real token."""
    return "cls" if arch == "encoder" else "last"


def strip_lm_head(body: Transformer) -> Transformer:
    """Drop the LM/MLM/RTD head in place (``config.head = "none"``): a head task needs states, not vocabulary logits."""
    if body.config.head != "none":
        body.lm_head = body.mlm_head = body.rtd_head = None
        body.config = body.config.replace(head="none")
    return body


def build_head(spec: TaskSpec, body: Transformer) -> nn.Module | None:
    """The head module for ``spec`` on ``body`` (None for generative tasks); with ``spec.head_bilstm``, wrapped
    under a BiLSTM (:mod:`lmforge.tasks.bilstm_head`)."""
    if not spec.head_bilstm:
        return _build_head(spec, body, body.config.d_model)
    check_bilstm(spec, body.config.arch)
    bilstm = BiLSTMFeatures(body.config.d_model, spec.head_bilstm, spec.head_bilstm_hidden)
    return BiLSTMHead(bilstm, _build_head(spec, body, bilstm.width))


def check_bilstm(spec: TaskSpec, arch: str) -> None:
    """Refuse ``head_bilstm`` on a decoder or encoder-decoder body: BERT's ablation reads an encoder's states."""
    if spec.head_bilstm and arch != "encoder":
        raise UserInputError(f"TaskSpec.head_bilstm={spec.head_bilstm}: the BiLSTM head (BERT's feature-based "
                             f"ablation) reads an encoder's states; this model is arch={arch!r}")


def _build_head(spec: TaskSpec, body: Transformer, d: int) -> nn.Module | None:
    cfg = body.config
    n = len(spec.labels)
    if spec.task in ("classify", "multilabel", "tag") and n < 1:
        raise ValueError(f"task {spec.task!r} needs its labels (TaskSpec.labels); they come from the training data")
    if spec.task in ("classify", "regress", "multilabel", "multiple-choice", "reward"):
        pooling = spec.pooling or default_pooling(cfg.arch)
        # BART and RoBERTa put a tanh layer under the classifier; BERT has it already in its pooler.
        hidden = spec.head_hidden if spec.head_hidden is not None else (
            cfg.arch == "encoder-decoder" or (pooling == "cls" and not cfg.pooler and cfg.arch == "encoder"))
        problem = {"classify": "single", "regress": "regression", "multilabel": "multi",
                   "multiple-choice": "single", "reward": "pairwise"}[spec.task]
        # A head with its own tanh layer reads the raw first state (RoBERTa); BERT's reads the model's pooler.
        # One score per input: a regression, a reward, or each (context, choice) pair of a multiple-choice row.
        outputs = 1 if spec.task in ("regress", "multiple-choice", "reward") else n
        return SequenceHead(d, outputs, pooling, problem, hidden, spec.classifier_dropout, use_pooler=not hidden)
    if spec.task == "tag":
        return TokenHead(d, n, spec.classifier_dropout)
    if spec.task == "qa":
        return SpanHead(d)
    return None


def examples_with_targets(labels: torch.Tensor) -> int:
    """How many rows of (B, T) ``labels`` hold at least one target: the divisor of an example-mean loss."""
    return int((labels != IGNORE_INDEX).any(-1).sum())


def example_weights(labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Per-label loss weights that make a summed cross-entropy the mean over examples of each example's mean
    token cross-entropy (``TaskSpec.loss_average="example"``): 1 / (the example's targets x n).

    Args:
        labels: (B, T) target ids, -100 where there is no target.

    Returns:
        ``(weights, n)``: weights (B, T) (0 where there is no target) and n, the number of examples with at
        least one target (the Trainer weighs micro-batches by it).
    """
    selected = labels != IGNORE_INDEX  # (B, T)
    counts = selected.sum(1, keepdim=True)  # (B, 1) targets per example
    n = int((counts > 0).sum())  # examples_with_targets(labels), from the counts already at hand
    return selected / (counts.clamp_min(1) * max(n, 1)), n


class TaskModel(nn.Module):
    """``body`` (an lmforge Transformer) + ``head`` (None for generative tasks), described by ``spec``.

    ``config`` is the body's ModelConfig, so Trainer checkpoints (which record it) work unchanged.
    """

    def __init__(self, body: Transformer, head: nn.Module | None, spec: TaskSpec) -> None:
        super().__init__()
        self.body, self.head, self.spec = body, head, spec

    @property
    def config(self):
        return self.body.config

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) ids -> token states (B, T, D) and the model's pooler output (B, D) or None (see module doc)."""
        cfg = self.body.config
        if cfg.arch == "encoder-decoder":
            # BART: the uncorrupted input goes to both sides; decoder states at every position are the features.
            start = cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else (cfg.pad_token_id or 0)
            out = self.body(input_ids, attention_mask, decoder_input_ids=shift_right(input_ids, start,
                            cfg.pad_token_id or 0), decoder_attention_mask=attention_mask)
        else:
            out = self.body(input_ids, attention_mask, token_type_ids)
        return out.last_hidden_state, out.pooler_output

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None,
                decoder_attention_mask: torch.Tensor | None = None) -> TaskOutput:
        if self.head is None:
            weights, n = None, None
            if labels is not None and self.spec.loss_average == "example":
                weights, n = example_weights(labels)  # the body's loss becomes the example mean
            out = self.body(input_ids, attention_mask, token_type_ids, decoder_input_ids=decoder_input_ids,
                            decoder_attention_mask=decoder_attention_mask, labels=labels, label_weights=weights)
            return TaskOutput(out.logits, out.loss, out.n_targets if n is None else n)
        choices = input_ids.shape[:2] if input_ids.dim() == 3 else None
        if choices is not None:  # multiple choice: (B, C, T) -> (B*C, T), one score per (context, choice) pair
            input_ids, attention_mask, token_type_ids = (None if x is None else x.flatten(0, 1)
                                                         for x in (input_ids, attention_mask, token_type_ids))
        h, pooled = self.features(input_ids, attention_mask, token_type_ids)
        if choices is not None and self.spec.input_transform == "gpt1-similarity":
            both = pool(h, attention_mask, self.head.pooling).view(*choices, -1)  # (B, 2, D): h_AB, h_BA
            logits = self.head.classify(both.sum(1))  # h_AB + h_BA -> the linear output layer
            choices = None
        else:
            logits = self.head(h, attention_mask, pooled)
        if choices is not None:
            logits = logits.view(choices)  # (B*C, 1) -> (B, C): the softmax runs across the choices
        if labels is None:
            return TaskOutput(logits)
        loss, n = self.head.loss(logits, labels)
        return TaskOutput(logits, loss, n)


def build_task_model(body: Transformer, spec: TaskSpec) -> TaskModel:
    """Wrap ``body`` for ``spec``: head tasks drop the LM head and get a fresh task head.

    This is the one place a task model is assembled, so a PEFT wrapper can take its result (or its body).
    """
    if spec.generative and body.config.head != "lm":
        raise UserInputError(f"task {spec.task!r} generates text and needs a model with an LM head "
                             f"(this one has head={body.config.head!r}); use a decoder or encoder-decoder LM")
    if spec.generative and body.config.arch == "encoder":
        raise UserInputError(f"task {spec.task!r} generates text; an encoder-only model cannot (use a decoder or "
                             "an encoder-decoder model)")
    check_bilstm(spec, body.config.arch)  # before the body loses its LM head
    if spec.task in ("tag", "qa", "classify", "regress", "multilabel", "multiple-choice", "reward"):
        strip_lm_head(body)
    return TaskModel(body, build_head(spec, body), spec)


# ------------------------------------------------------------------------------------------- folders
def save_task_model(model: TaskModel, path: str | Path, tokenizer=None, extra: dict | None = None) -> Path:
    """Write a task folder (see the module docstring) atomically and return its path.

    ``extra`` is stored in ``task.json`` beside the spec (e.g. the step and metric of a best checkpoint).
    """
    path = Path(path)
    with atomic_dir(path) as tmp:
        # checkpoint.save is atomic on its own: stage it inside our folder, so that the head joins atomically.
        staged = checkpoint.save(model.body, tmp / "body", tokenizer=tokenizer)
        for child in staged.iterdir():
            os.replace(child, tmp / child.name)
        staged.rmdir()
        meta = {"format": FORMAT, "version": 1, "spec": model.spec.to_dict(), **(extra or {})}
        (tmp / TASK_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if model.head is not None:
            tensors = {k: v.detach().contiguous().cpu() for k, v in model.head.state_dict().items()}
            save_file(tensors, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        checkpoint.write_manifest(tmp)  # the body's, extended to task.json and the head
    return path


def read_task_meta(path: str | Path) -> dict | None:
    """The parsed ``task.json`` of a folder, or None when it has none (a plain model folder)."""
    file = Path(path) / TASK_FILE
    if not file.is_file():
        return None
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise checkpoint.CheckpointError(f"{file}: not valid JSON ({exc})") from exc
    if meta.get("format") != FORMAT or "spec" not in meta:
        raise checkpoint.CheckpointError(f"{file}: not an lmforge task file (format {meta.get('format')!r})")
    return meta


def hf_head(path: str | Path) -> tuple[TaskSpec, dict[str, torch.Tensor]] | None:
    """(spec, head state) from a Hugging Face sequence classifier's head kept aside by ``convert from-hf``.

    ``BertForSequenceClassification`` (pooler -> dropout -> ``classifier``) and
    ``RobertaForSequenceClassification`` (<s> -> ``classifier.dense`` -> tanh -> ``classifier.out_proj``) map onto
    :class:`SequenceHead`, and so do ``BertForMultipleChoice`` / ``RobertaForMultipleChoice`` (pooler -> dropout ->
    ``classifier``, one score per choice); ``problem_type`` and ``id2label`` give the task and the labels. None when the
    folder holds no HF head.
    """
    head = TaskHead.load(path)
    if head is None:
        return None
    cfg, t = head.config, head.tensors
    id2label = cfg.get("id2label") or {}
    labels = [str(id2label[k]) for k in sorted(id2label, key=int)]
    problem = cfg.get("problem_type")
    task = ("regress" if problem == "regression" or len(labels) == 1 else
            "multilabel" if problem == "multi_label_classification" else "classify")
    if head.architecture.endswith("ForMultipleChoice"):  # pooler -> dropout -> classifier (D -> 1) per pair
        task, labels = "multiple-choice", []
    fields = {"task": task, "labels": [] if task in ("regress", "multiple-choice") else labels, "pooling": "cls"}
    if "classifier.weight" in t:
        state = {"out.weight": t["classifier.weight"], "out.bias": t["classifier.bias"]}
        return TaskSpec(**fields, head_hidden=False), state
    if "classifier.out_proj.weight" in t:
        state = {"dense.weight": t["classifier.dense.weight"], "dense.bias": t["classifier.dense.bias"],
                 "out.weight": t["classifier.out_proj.weight"], "out.bias": t["classifier.out_proj.bias"]}
        return TaskSpec(**fields, head_hidden=True), state
    raise checkpoint.CheckpointError(f"{path}: the {head.architecture} head ({', '.join(sorted(t))}) has no "
                                     "lmforge task head to map onto")


def to_hf_head(model: TaskModel) -> TaskHead:
    """The task head of ``model`` under Hugging Face's names, for :func:`lmforge.interop.hf.to_hf`: the inverse
    of :func:`hf_head` for classify / regress / multilabel (``*ForSequenceClassification``) and
    multiple-choice (``*ForMultipleChoice``) heads of BERT and RoBERTa bodies."""
    spec, head, cfg = model.spec, model.head, model.config
    if isinstance(head, BiLSTMHead):
        raise UserInputError("a task head with a BiLSTM (head_bilstm) has no Hugging Face class that lmforge writes")
    if not isinstance(head, SequenceHead) or spec.task not in ("classify", "regress", "multilabel", "multiple-choice"):
        raise UserInputError(f"task {spec.task!r} has no Hugging Face head that lmforge writes")
    model_type = hf_config_for(cfg)[0].model_type
    if model_type not in ("bert", "roberta"):
        raise UserInputError(f"a {model_type} body has no Hugging Face task class that lmforge writes (bert, roberta)")
    family = {"bert": "Bert", "roberta": "Roberta"}[model_type]
    kind = "MultipleChoice" if spec.task == "multiple-choice" else "SequenceClassification"
    state = {k: v.detach() for k, v in head.state_dict().items()}
    if head.dense is not None:
        if kind == "MultipleChoice":
            raise UserInputError("a multiple-choice head with its own dense layer has no Hugging Face class "
                                 "(HF's reads the pooler); fine-tune with head_hidden=false")
        tensors = {"classifier.dense.weight": state["dense.weight"], "classifier.dense.bias": state["dense.bias"],
                   "classifier.out_proj.weight": state["out.weight"], "classifier.out_proj.bias": state["out.bias"]}
    else:
        tensors = {"classifier.weight": state["out.weight"], "classifier.bias": state["out.bias"]}
    config: dict = {"classifier_dropout": spec.classifier_dropout}
    if spec.task != "multiple-choice":
        labels = spec.labels or ["0"]
        config.update(id2label={str(i): lbl for i, lbl in enumerate(labels)},
                      label2id={lbl: i for i, lbl in enumerate(labels)},
                      problem_type={"classify": "single_label_classification", "regress": "regression",
                                    "multilabel": "multi_label_classification"}[spec.task])
    return TaskHead(f"{family}For{kind}", tensors, config)


def load_task_model(path: str | Path, spec: TaskSpec | None = None, device: str = "cpu") -> TaskModel:
    """Rebuild a task model from a task folder (in eval mode).

    A folder converted from a Hugging Face sequence classifier (``head.json``) loads with its head (see
    :func:`hf_head`). A plain model folder works for generative tasks when ``spec`` says which; a head task
    needs a trained head and raises otherwise.
    """
    path = Path(path)
    meta = read_task_meta(path)
    converted = hf_head(path) if meta is None else None
    if converted is not None:
        hf_spec, state = converted
        if spec is not None and spec.task != hf_spec.task:
            raise checkpoint.CheckpointError(f"{path}: the Hugging Face head is a {hf_spec.task!r} head, "
                                             f"not {spec.task!r}")
        spec = hf_spec.replace(**{k: v for k, v in (spec.to_dict() if spec else {}).items()
                                  if k.endswith("_column") or k in ("max_length",)})
        model = build_task_model(checkpoint.load(path), spec)
        model.head.load_state_dict(state)
        return model.eval().to(device)
    if meta is None and spec is None:
        raise checkpoint.CheckpointError(f"{path}: no {TASK_FILE}; this is not a fine-tuned task model "
                                         "(fine-tune one with `lmforge finetune`, or name a generative --task)")
    spec = spec or TaskSpec.from_dict(meta["spec"], source=str(path / TASK_FILE))
    if meta is not None and meta.get("peft"):  # adapter + head + where the base is (lmforge.tasks.peft)
        return load_peft_task_model(path, meta, spec, device)
    body = checkpoint.load(path)
    if spec.generative:
        return build_task_model(body, spec).eval().to(device)
    if meta is None:
        raise checkpoint.CheckpointError(f"{path}: no {TASK_FILE}; task {spec.task!r} needs a trained head "
                                         "(fine-tune one with `lmforge finetune`)")
    model = build_task_model(body, spec)
    load_head(model, path, spec)
    model.head.to(next(body.parameters()).dtype)  # a body loaded in bf16 (--dtype) feeds the head bf16 states
    return model.eval().to(device)


def load_head(model: TaskModel, path: str | Path, spec: TaskSpec) -> None:
    """Fill ``model.head`` from ``path/task_head.safetensors`` (nothing to do for generative tasks)."""
    if model.head is None:
        return
    head_file = Path(path) / HEAD_FILE
    if not head_file.is_file():
        raise checkpoint.CheckpointError(f"{head_file}: missing; the folder's task {spec.task!r} needs its head")
    state = load_file(str(head_file))
    mine = model.head.state_dict()
    for name, tensor in mine.items():
        if name not in state or state[name].shape != tensor.shape:
            raise checkpoint.CheckpointError(f"{head_file}: tensor {name!r} is missing or has the wrong shape "
                                             f"(need {tuple(tensor.shape)})")
    model.head.load_state_dict(state)


# ------------------------------------------------------------------------------------------- PEFT folders
def resolve_base(reference: str, folder: str | Path) -> Path:
    """The base folder a PEFT task folder's ``reference`` names (relative ones are relative to the folder)."""
    path = Path(reference)
    return path if path.is_absolute() else (Path(folder) / path).resolve()


def load_peft_task_model(path: str | Path, meta: dict, spec, device: str = "cpu", base: str | Path | None = None,
                         check_base: bool = True) -> nn.Module:
    """Rebuild a PEFT task model from its folder (in eval mode): base from the recorded place, adapter, head.

    The folder is written by :func:`lmforge.tasks.peft.save_peft_task_model`. ``base`` overrides the recorded
    base folder; ``check_base=False`` skips the base weights' checksum (see :func:`lmforge.peft.load_adapter`).

    Raises:
        lmforge.checkpoint.CheckpointError: the base folder is gone.
        lmforge.peft.AdapterMismatchError: the base there is not the one the adapter was trained on.
    """

    path = Path(path)
    reference = (meta.get("peft") or {}).get("base")
    if base is None and (not isinstance(reference, str) or not reference):
        raise checkpoint.CheckpointError(f"{path / TASK_FILE}: a PEFT task folder must name its base model (peft.base)")
    base = Path(base) if base is not None else resolve_base(reference, path)
    if not base.is_dir():
        raise checkpoint.CheckpointError(f"{path / TASK_FILE}: its base model folder {base} is missing; the adapter "
                                         "needs the base it was trained on")
    body, _ = checkpoint.read_model_folder(base, with_tokenizer=False)
    model = build_task_model(body, spec)
    model.body = load_adapter(model.body, path, check_base=check_base)
    load_head(model, path, spec)
    return model.eval().to(device)
