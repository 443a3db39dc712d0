"""PEFT on a task model: a :class:`~lmforge.tasks.model.TaskModel` whose body is a PeftModel, the state its
training checkpoints hold, its folder (adapter + head + where the base is) and the record of a PEFT run.

    TaskModel(body=Transformer, head)  --apply_task_peft(cfg)-->  TaskModel(body=PeftModel, head)

The task head is new, so it trains in full beside the adapter (HF peft's ``modules_to_save``); everything of
the body, its pooler included, stays frozen, as in HF peft's sequence classification.

A PEFT task folder is a task folder without the body's weights::

    DIR/task.json              the TaskSpec, plus "peft": {"base": where the base model folder is}
    DIR/adapter_config.json    the adapter and its base's identity and weight checksum (lmforge.peft.io)
    DIR/adapter.safetensors
    DIR/task_head.safetensors  the head (head tasks only)
    DIR/tokenizer.json

The base path is absolute, or relative to DIR when the base lives in the same run folder (``OUT/base``, a
snapshot of a base that no folder holds: a preset, random weights, a model passed in memory).
:func:`lmforge.tasks.model.load_task_model`, and so ``lmforge evaluate``/``predict``, load the base from there,
check it against the adapter's record (a different base fails, naming what differs) and attach the adapter.

Example:
    >>> import tempfile, torch, lmforge
    >>> from lmforge.peft import PeftConfig
    >>> from lmforge.tasks.model import build_task_model, load_task_model
    >>> from lmforge.tasks.spec import TaskSpec
    >>> body = lmforge.build_model("bert-tiny", n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=100)
    >>> run = tempfile.mkdtemp()
    >>> base = str(lmforge.checkpoint.save(body, run + "/base"))
    >>> model = apply_task_peft(build_task_model(body, TaskSpec(task="classify", labels=["n", "p"])),
    ...                         PeftConfig(method="lora", r=2))
    >>> print(parameter_report(model))   # LoRA on q and v + the head
    trainable params: 1,378 || all params: 21,442 || trainable%: 6.4266
    >>> folder = save_peft_task_model(model.eval(), run + "/best", base)
    >>> ids = torch.randint(5, 100, (2, 6))
    >>> torch.equal(load_task_model(folder)(ids).logits, model(ids).logits)
    True
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from lmforge import checkpoint
from lmforge.config import ConfigError
from lmforge.errors import UserInputError
from lmforge.peft.config import PeftConfig
from lmforge.peft.io import save_adapter, verify_base
from lmforge.peft.model import ParameterReport, PeftModel, apply_peft
from lmforge.tasks.model import (
    FORMAT,
    HEAD_FILE,
    TASK_FILE,
    TaskModel,
    load_peft_task_model,
    read_task_meta,
    save_task_model,
)
from lmforge.tasks.spec import TaskSpec
from lmforge.tokenization import Tokenizer
from lmforge.utils.io import atomic_dir, atomic_write_text

PEFT_BASE_DIR = "base"  # PEFT runs: a snapshot of a base model that lives in no folder
PEFT_FILE = "peft.json"  # PEFT runs: the method and the base's identity, checked on resume


def is_peft_task_model(model: nn.Module) -> bool:
    """True when ``model`` is a task model whose body is a PeftModel."""
    return isinstance(getattr(model, "body", None), PeftModel)


def apply_task_peft(model: nn.Module, cfg: PeftConfig, tokenizer=None, name: str = "default") -> nn.Module:
    """Attach a PEFT adapter to ``model.body`` in place and return ``model``; the head stays trainable.

    Args:
        model: a TaskModel (its body a plain Transformer).
        cfg: the method and its options.
        tokenizer: needed only for prompt tuning initialised from a text.
        name: the adapter's name.
    """
    if is_peft_task_model(model):
        raise ValueError("this task model already has a PEFT body")
    model.body = apply_peft(model.body, cfg, name=name, tokenizer=tokenizer)
    if model.head is not None:
        model.head.requires_grad_(True)
    return model


def parameter_report(model: nn.Module) -> ParameterReport:
    """Trainable/total parameters of a PEFT task model: the PeftModel's report plus the head's parameters."""
    report = model.body.parameter_report()
    head = list(model.head.parameters()) if model.head is not None else []
    trainable = sum(p.numel() for p in head if p.requires_grad)
    return ParameterReport(report.trainable + trainable, report.total + sum(p.numel() for p in head),
                           report.per_adapter)


class TrainableState:
    """The tensors a PEFT run's training checkpoints hold: the parameters that train (adapter and head).

    The frozen base is not stored: a resumed run rebuilds it from its source, as the first run did. (Storing
    the whole model would also fail for QLoRA, whose NF4 weights are not plain tensors.) The object offers the
    three things checkpoint code uses of a model: ``config``, ``state_dict()`` and ``load_state_dict()``;
    loading copies into the model's own parameters, in place.

    Args:
        model: the task model.
        names: names (as in ``model.named_parameters()``) of the parameters to hold.
    """

    def __init__(self, model: nn.Module, names) -> None:
        self.model = model
        self.names = set(names)

    @property
    def config(self):
        return self.model.config

    def _params(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if n in self.names}

    def state_dict(self, keep_vars: bool = False) -> dict[str, torch.Tensor]:
        return {n: (p if keep_vars else p.detach()) for n, p in self._params().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        params = self._params()
        if strict and set(state) != set(params):
            raise ValueError(f"trainable state mismatch: missing {sorted(set(params) - set(state))[:3]}, "
                             f"unexpected {sorted(set(state) - set(params))[:3]}")
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)


# ------------------------------------------------------------------------------------------- folders
def base_reference(base: str | Path, folder: str | Path) -> str:
    """How ``folder`` records its base: relative when both live in one run folder (it can move), else absolute."""
    base, folder = Path(base).resolve(), Path(folder).resolve()
    if base.parent == folder.parent:
        return os.path.relpath(base, folder)
    return str(base)


def save_peft_task_model(model: nn.Module, path: str | Path, base: str | Path, tokenizer=None,
                         extra: dict | None = None) -> Path:
    """Write a PEFT task folder (see the module docstring) atomically and return its path.

    Args:
        model: a task model with a PeftModel body (the active adapter is saved; a prefix is saved folded).
        path: the folder to write (replaced as a whole).
        base: the folder holding the base model (lmforge or Hugging Face) the adapter was trained on.
        tokenizer: saved beside (an object with ``save(folder)``).
        extra: more entries for ``task.json`` (e.g. the step and metric of a best checkpoint).
    """
    path = Path(path)
    with atomic_dir(path) as tmp:
        # save_adapter is atomic on its own: stage it inside our folder, so that the head joins atomically.
        staged = save_adapter(model.body, tmp / "adapter")
        for child in staged.iterdir():
            os.replace(child, tmp / child.name)
        staged.rmdir()
        meta = {"format": FORMAT, "version": 1, "spec": model.spec.to_dict(),
                "peft": {"base": base_reference(base, path)}, **(extra or {})}
        (tmp / TASK_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if model.head is not None:
            tensors = {k: v.detach().contiguous().cpu() for k, v in model.head.state_dict().items()}
            save_file(tensors, str(tmp / HEAD_FILE), metadata={"format": "pt"})
        if tokenizer is not None:
            tokenizer.save(tmp)
        checkpoint.write_manifest(tmp, tokenizer=checkpoint.tokenizer_identity(tokenizer) if tokenizer else None)
    return path


def merged_task_model(model: nn.Module) -> nn.Module:
    """A plain task model (Transformer body) with the active adapter merged in; ``model`` is used up.

    Only LoRA, QLoRA, (IA)^3 and BitFit fold into the weights (others raise ValueError).
    """
    body = model.body.merge_and_unload()
    return TaskModel(body, model.head, model.spec)


def merge_task_folder(source: str | Path, dest: str | Path, base: str | Path | None = None,
                      check_base: bool = True) -> Path:
    """Write ``dest``: the PEFT task folder ``source`` as a plain task folder, its adapter folded into the body.

    ``lmforge evaluate``/``predict`` read it without the base folder or lmforge.peft; its predictions equal the
    adapter's up to float rounding (QLoRA: against the dequantised weights it was trained on).

    Args:
        base: the base model folder (default: the one ``source`` records); its LM head, which a head task
            drops, may be there: the adapter is checked against the body the task trained.
        check_base: verify the base weights' checksum too (the architecture is always checked).
    """
    source = Path(source)
    meta = read_task_meta(source) or {}
    if not meta.get("peft"):
        raise UserInputError(f"{source}: not a PEFT task folder (its task.json names no peft base)")
    spec = TaskSpec.from_dict(meta["spec"], source=str(source / "task.json"))
    model = merged_task_model(load_peft_task_model(source, meta, spec, base=base, check_base=check_base))
    tokenizer = Tokenizer.load(source) if (source / "tokenizer.json").is_file() else None
    extra = {k: v for k, v in meta.items() if k not in ("format", "version", "spec", "peft")}
    return save_task_model(model.eval(), dest, tokenizer, extra=extra)


# ------------------------------------------------------------------------------------------- PEFT runs
def peft_base(source, random_init: bool, body: nn.Module, out: Path, tokenizer) -> Path:
    """The folder holding a PEFT run's base: ``source`` when it is a folder used as it is, else a snapshot of
    ``body`` written to ``OUT/base`` (a preset's or a random initialisation's weights exist nowhere else)."""
    if isinstance(source, (str, Path)) and Path(source).is_dir() and not random_init:
        return Path(source).resolve()
    return checkpoint.save(body, out / PEFT_BASE_DIR, tokenizer=tokenizer).resolve()


def record_peft_run(out: Path, cfg: PeftConfig, peft_body, base: Path, resume: bool) -> None:
    """Write ``OUT/peft.json`` (method, base folder and identity); on resume, check the run is the same.

    A resumed PEFT run rebuilds its frozen base from the source, so a base folder that changed in between
    would silently change the result: the identity recorded at the start catches that.
    """
    file = out / PEFT_FILE
    if resume and file.is_file():
        saved = json.loads(file.read_text(encoding="utf-8"))
        if saved.get("peft") != cfg.to_dict():
            raise ConfigError(f"{file}: this run trains {PeftConfig.from_dict(saved.get('peft')).options()}, "
                              f"not {cfg.options()}; resume it with the same PEFT settings")
        verify_base(saved.get("base_identity", {}), peft_body.base_identity, f"{out} (resume)")
        return
    record = {"peft": cfg.to_dict(), "base": str(base), "base_identity": peft_body.base_identity}
    atomic_write_text(file, json.dumps(record, indent=2) + "\n")
