"""The quickstart's run folder: what is finished is on disk, whole, and a re-run picks up from there.

    OUT/settings.json          minutes and device the run was started with (a re-run must match)
    OUT/stages/<stage>.json    a finished stage's results, written atomically as its last act
    OUT/stages/<stage>.plan.json  a training stage's step plan, written before it trains, so that a resumed
                               stage continues the same schedule instead of re-planning a new one
    OUT/tokenizers/ OUT/data/ OUT/runs/<stage>/ ...   the stages' own outputs
    OUT/report.json OUT/report.html                   written last, from the stage files

A stage counts as finished exactly when its JSON file exists, and that file is written after everything
the stage produced, so Ctrl-C at any moment leaves finished stages whole and at most one stage partial;
that one is resumed from its checkpoints (training stages) or redone (the others).

Example:
    >>> import tempfile
    >>> folder = RunFolder(tempfile.mkdtemp())
    >>> folder.start({"minutes": 3.0, "device": "cpu"})
    >>> folder.finish("data", {"summary": "ok"}); folder.done("data"), folder.done("tokenizers")
    (True, False)
    >>> try:
    ...     folder.start({"minutes": 5.0, "device": "cpu"})
    ... except SettingsMismatch as exc:
    ...     print(str(exc).split(" was started with ")[1].split(";")[0])
    --minutes 3.0, not 5.0
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from lmforge.errors import LmforgeError, UserInputError
from lmforge.utils.io import atomic_write_text
from lmforge.utils.lock import LOCK_FILE, OWNER_FILE

SETTINGS = "settings.json"
STAGES = "stages"
# The settings a re-run must repeat: its stages were planned and measured under them.
COMPARED = ("minutes", "device")
LOCK_FILES = (LOCK_FILE, OWNER_FILE)  # the run folder's lock (lmforge.utils.lock), not the run's own files


class SettingsMismatch(LmforgeError, ValueError):
    """A re-run into an existing folder asked for different settings than the run there was started with."""


class RunFolder:
    """Paths and the finished-stage records of one quickstart run folder (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # ------------------------------------------------------------------ settings
    @property
    def settings_file(self) -> Path:
        return self.root / SETTINGS

    def settings(self) -> dict[str, Any] | None:
        return _read_json(self.settings_file)

    def check(self, settings: dict[str, Any], restart: bool = False) -> None:
        """What :meth:`start` (after :meth:`restart` when ``restart``) would refuse, found by reading only.

        Raises:
            SettingsMismatch: the folder holds a run started with other settings (the message says which, and
                how to restart), or is not a quickstart folder.
        """
        if restart:
            if self.root.exists() and self.settings() is None and not self.has_stages():
                raise SettingsMismatch(f"{self.root}: not a quickstart run folder (no {SETTINGS}); "
                                       "refusing to delete it")
            return
        saved = self.settings()
        if saved is None:
            if self.root.exists() and any(p.name not in (STAGES, *LOCK_FILES) for p in self.root.iterdir()) \
                    and not self.has_stages():
                # Not a quickstart folder (no settings.json, other files): never write into a stranger's folder.
                raise SettingsMismatch(f"{self.root}: exists and is not a quickstart run folder; "
                                       "choose another --out")
            return
        for key in COMPARED:
            if saved.get(key) != settings.get(key):
                flag = f"--{key}"
                raise SettingsMismatch(
                    f"{self.root} was started with {flag} {saved.get(key)}, not {settings.get(key)}; run it with "
                    f"{flag} {saved.get(key)} to resume, add --restart to start over, or choose another --out")

    def start(self, settings: dict[str, Any]) -> None:
        """Record ``settings`` in a new folder, or check that an existing run was started with the same ones.

        Raises:
            SettingsMismatch: as :meth:`check`.
        """
        self.check(settings)
        if self.settings() is None:
            atomic_write_text(self.settings_file, json.dumps(settings, indent=2) + "\n")

    def restart(self) -> None:
        """Delete everything the quickstart wrote into the folder (it must be a quickstart folder); the lock
        files stay, since the caller holds the lock."""
        if not self.root.exists():
            return
        self.check({}, restart=True)
        for child in self.root.iterdir():
            if child.name not in LOCK_FILES:
                shutil.rmtree(child) if child.is_dir() else child.unlink()

    # ------------------------------------------------------------------ stages
    def stage_file(self, name: str) -> Path:
        return self.root / STAGES / f"{name}.json"

    def has_stages(self) -> bool:
        return (self.root / STAGES).is_dir()

    def done(self, name: str) -> bool:
        return self.stage_file(name).is_file()

    def result(self, name: str) -> dict[str, Any] | None:
        """A finished stage's record (None if it has not finished)."""
        return _read_json(self.stage_file(name))

    def results(self) -> dict[str, dict[str, Any]]:
        """Every finished stage's record, by name."""
        folder = self.root / STAGES
        if not folder.is_dir():
            return {}
        return {p.name[:-5]: _read_json(p) for p in sorted(folder.glob("*.json")) if not p.name.endswith(".plan.json")}

    def finish(self, name: str, record: dict[str, Any]) -> None:
        """Mark ``name`` finished with ``record`` (atomically: the file is either absent or complete)."""
        atomic_write_text(self.stage_file(name), json.dumps(record, indent=2, default=_plain) + "\n")

    def plan_file(self, name: str) -> Path:
        return self.root / STAGES / f"{name}.plan.json"

    def plan(self, name: str, make: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """The stage's saved plan, or ``make()``'s, saved now; and whether it was saved by an earlier attempt."""
        file = self.plan_file(name)
        saved = _read_json(file)
        if saved is not None:
            return saved, True
        plan = make()
        atomic_write_text(file, json.dumps(plan, indent=2, default=_plain) + "\n")
        return plan, False

    def forget_plan(self, name: str) -> None:
        self.plan_file(name).unlink(missing_ok=True)

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)


def _plain(value: Any) -> Any:
    """JSON for the odd non-JSON value in a record (paths, numpy numbers)."""
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in a stage record")


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # written atomically, so only a hand edit gets here
        raise UserInputError(f"{path}: not valid JSON ({exc}); delete it to redo that stage") from exc
    return data if isinstance(data, dict) else None
