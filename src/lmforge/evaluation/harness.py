"""``lmforge evaluate --harness TASKS``: EleutherAI's lm-evaluation-harness run directly on a model folder.

The tasks come from lm_eval's registry, from lmforge's own set (:mod:`lmforge.evaluation.harness_tasks`, always
included) and from ``--include-path DIR`` folders of the user's YAML. The model is
:class:`~lmforge.evaluation.harness_lm.LmforgeLM`. Nothing is downloaded: the Hugging Face libraries run
offline, so a task whose data is neither a local file nor in the datasets cache fails in one line naming it.

A task YAML in an include folder may name its ``data_files`` relative to its own folder (lm_eval would read
them relative to the working folder): they are made absolute before lm_eval reads them, and a missing one is
reported with its path before any model is loaded.

Example (``lm_eval`` installed)::

    results = evaluate("runs/gpt/model", ["lmforge_next_verse"], limit=20)
    results["results"]["lmforge_next_verse"]["acc,none"]      # 0.35
"""

from __future__ import annotations

import contextlib
import difflib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Sequence

from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.evaluation.harness_lm import HARNESS_MISSING, LmforgeLM, register
from lmforge.evaluation.harness_tasks import FOLDER as TASK_FOLDER

LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow")  # datasets' builders that read local files
OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """The Hugging Face libraries in offline mode for the block. The variables are read once, at import, so
    modules imported earlier (by this process's other work) get their flags set too, and get them back after."""
    saved_env = {k: os.environ.get(k) for k in OFFLINE_VARIABLES}
    os.environ.update({k: "1" for k in OFFLINE_VARIABLES})
    import datasets.config
    import huggingface_hub.constants

    flags = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
             (huggingface_hub.constants, "HF_HUB_OFFLINE")]
    saved = [getattr(module, name) for module, name in flags]
    for module, name in flags:
        setattr(module, name, True)
    try:
        yield
    finally:
        for (module, name), value in zip(flags, saved):
            setattr(module, name, value)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _lm_eval():
    try:
        import lm_eval
    except ImportError:
        raise UserInputError(HARNESS_MISSING) from None
    return lm_eval


def include_folders(include_path: Sequence[str | Path] = ()) -> list[Path]:
    """lmforge's task folder, then the user's (later folders override a task of the same name)."""
    folders = [TASK_FOLDER]
    for path in include_path:
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise InputFileNotFound(f"--include-path {path}: no such folder")
        folders.append(folder)
    return folders


def task_manager(names: Sequence[str], include_path: Sequence[str | Path] = (), lm_eval_tasks: bool = True):
    """An lm_eval TaskManager that knows every name in ``names``, its local data files made absolute.

    lm_eval's own registry (~15,000 YAML files, many seconds to index) is read only when a name is not among
    the include folders' tasks (or never, with ``lm_eval_tasks=False``). An unknown name fails in one line with
    the close matches.
    """
    from lm_eval.tasks import TaskManager

    folders = include_folders(include_path)
    manager = TaskManager(include_path=[str(f) for f in folders], include_defaults=False)
    if lm_eval_tasks and _unknown(manager, names):
        manager = TaskManager(include_path=[str(f) for f in folders], include_defaults=True)
    missing = _unknown(manager, names)
    if missing:
        raise UserInputError("; ".join(_unknown_message(manager, name, lm_eval_tasks) for name in missing))
    resolve_data_files(manager, folders)
    return manager


def _unknown(manager, names: Sequence[str]) -> list[str]:
    known = set(manager.all_tasks)
    return [n for n in names if n not in known and not manager.match_tasks([n]) and not Path(n).is_file()]


def _unknown_message(manager, name: str, lm_eval_tasks: bool) -> str:
    close = difflib.get_close_matches(name, manager.all_tasks, n=5, cutoff=0.6)
    where = "lm_eval's registry or the include folders" if lm_eval_tasks else "the include folders"
    hint = f"did you mean {', '.join(close)}?" if close else "see `lm_eval ls tasks` for lm_eval's names"
    return f"--harness: unknown task {name!r} (not in {where}); {hint}"


def resolve_data_files(manager, folders: Sequence[Path]) -> None:
    """Make the relative ``data_files`` of the tasks defined in ``folders`` absolute (relative to each YAML's
    folder), and check that every local data file exists (InputFileNotFound naming the task and the path)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    roots = [f.resolve() for f in folders]
    for name, entry in manager.task_index.items():
        path = entry.yaml_path
        if path is None or entry.cfg is None or not any(Path(path).resolve().is_relative_to(r) for r in roots):
            continue
        kwargs = entry.cfg.get("dataset_kwargs") or {}
        if entry.cfg.get("dataset_path") not in LOCAL_BUILDERS or "data_files" not in kwargs:
            continue
        absolute = _absolute(kwargs["data_files"], Path(path).parent)
        if absolute == kwargs["data_files"]:
            continue
        # lm_eval reloads a task's YAML when it builds it; an entry without a path is built from its config,
        # which is therefore loaded here in full (functions resolved), with the absolute paths.
        cfg = load_yaml(path, resolve_func=True, recursive=True)
        cfg["dataset_kwargs"] = {**cfg.get("dataset_kwargs", {}), "data_files": absolute}
        entry.cfg, entry.yaml_path = cfg, None


def _absolute(files, base: Path):
    if isinstance(files, str):
        return str(base / files) if not Path(files).is_absolute() and "://" not in files else files
    if isinstance(files, list):
        return [_absolute(f, base) for f in files]
    if isinstance(files, dict):
        return {k: _absolute(v, base) for k, v in files.items()}
    return files


def _local_files(cfg: dict) -> list[str]:
    files = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if cfg.get("dataset_path") not in LOCAL_BUILDERS or files is None:
        return []
    flat = files.values() if isinstance(files, dict) else [files]
    return [f for group in flat for f in ([group] if isinstance(group, str) else group)]


def load_tasks(manager, names: Sequence[str]) -> list:
    """lm_eval Task/Group objects for ``names``; a task whose data is not on disk fails in one line naming it."""
    loaded = []
    for name in expand(manager, names):
        entry = manager.task_index.get(name)
        cfg = (entry.cfg or {}) if entry is not None else {}
        for file in _local_files(cfg):
            if "://" not in file and not any(ch in file for ch in "*?[") and not Path(file).is_file():
                raise InputFileNotFound(f"--harness {name}: data file {file} not found")
        try:
            item = manager.load(name)
        except OSError as exc:  # datasets: a local file missing, or a Hub data set not in the cache (offline)
            source = cfg.get("dataset_path", name)
            raise InputFileNotFound(f"--harness {name}: its data ({source}) is not on disk and nothing is "
                                    f"downloaded: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                                    " (put it in the Hugging Face datasets cache, or point the task's YAML at "
                                    "local data_files)") from None
        # A group is passed whole (its subgroups are inside it); a task or a tag's tasks one by one.
        loaded.extend([item["groups"][name]] if name in item["groups"] else item["tasks"].values())
    return loaded


def expand(manager, names: Sequence[str]) -> list[str]:
    """Names with glob patterns (``lmforge_*``) replaced by the task names they match, in order, once each."""
    out: list[str] = []
    for name in names:
        matched = [name] if name in manager.task_index or Path(name).is_file() else manager.match_tasks([name])
        out.extend(m for m in matched if m not in out)
    return out


def evaluate(model: str | Path | LmforgeLM, tasks: Sequence[str], *, limit: int | float | None = None,
             num_fewshot: int | None = None, batch_size: int = 16, device: str = "cpu",
             include_path: Sequence[str | Path] = (), max_length: int | None = None,
             bootstrap_iters: int = 100000, lm_eval_tasks: bool = True, seed: int = 0) -> dict[str, Any]:
    """Run lm_eval's ``simple_evaluate`` on a model folder (or a built :class:`LmforgeLM`).

    Args:
        model: a decoder folder, or an LmforgeLM.
        tasks: task, group or tag names (lm_eval's, lmforge's, or the include folders'), or YAML paths.
        limit: documents per task (a fraction below 1: that share of them).
        num_fewshot: examples in each prompt (default: the task's, else 0).
        batch_size, device, max_length: of the model (see LmforgeLM).
        include_path: folders of task YAML besides lmforge's own.
        bootstrap_iters: resamples for the stderr of metrics that need them (0: no stderr).
        lm_eval_tasks: also look names up in lm_eval's registry (slow to index; only when a name needs it).
        seed: lm_eval's random, numpy, torch and few-shot seeds.

    Returns:
        lm_eval's results dict (``results``, ``configs``, ``versions``, ``n-shot``, ``n-samples``, ``config``...).
    """
    lm_eval = _lm_eval()
    register()
    names = [t.strip() for t in tasks if t.strip()]
    if not names:
        raise UserInputError("--harness: give at least one task name")
    with offline():
        manager = task_manager(names, include_path, lm_eval_tasks)
        loaded = load_tasks(manager, names)
        lm = model if isinstance(model, LmforgeLM) else LmforgeLM(str(model), batch_size=batch_size, device=device,
                                                                   max_length=max_length)
        results = lm_eval.simple_evaluate(model=lm, tasks=loaded, task_manager=manager, limit=limit,
                                          num_fewshot=num_fewshot, bootstrap_iters=bootstrap_iters,
                                          log_samples=False, random_seed=seed, numpy_random_seed=seed,
                                          torch_random_seed=seed, fewshot_random_seed=seed)
    results["config"].update(model="lmforge", model_args=f"pretrained={lm.source}", batch_size=lm.batch_size,
                             device=str(lm.device))
    return results


def metrics(results: dict) -> dict[str, dict[str, float]]:
    """``{task: {metric: value}}`` from lm_eval's results (filter suffixes and stderr left out)."""
    out = {}
    for task, row in results["results"].items():
        out[task] = {key.split(",")[0]: value for key, value in row.items()
                     if "," in key and "_stderr" not in key and isinstance(value, (int, float))}
    return out


def table_lines(results: dict) -> list[str]:
    """One line per task: ``task (n-shot, N docs): metric value ± stderr, ...``."""
    lines = []
    for task, row in results["results"].items():
        parts = []
        for key, value in row.items():
            if "," not in key or "_stderr" in key or not isinstance(value, (int, float)):
                continue
            metric, filt = key.split(",", 1)
            err = row.get(f"{metric}_stderr,{filt}")
            parts.append(f"{metric} {value:.4f}" + (f" ± {err:.4f}" if isinstance(err, (int, float)) else ""))
        shots = results.get("n-shot", {}).get(task)
        docs = (results.get("n-samples", {}).get(task) or {}).get("effective")
        about = ", ".join(x for x in (f"{shots}-shot" if shots is not None else "",
                                      f"{docs} docs" if docs is not None else "") if x)
        lines.append(f"{task}{f' ({about})' if about else ''}: {', '.join(parts)}")
    return lines


def write_results(results: dict, path: str | Path) -> Path:
    """lm_eval's results as JSON (its own encoder for what JSON lacks), written atomically."""
    import json

    from lm_eval.utils import handle_non_serializable

    from lmforge.utils.io import atomic_write_text

    path = Path(path)
    atomic_write_text(path, json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False)
                      + "\n")
    return path
