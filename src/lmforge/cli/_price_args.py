"""The price-tag flags of the commands that run a model (generate, prompt, evaluate, embed, predict, chat).

Each such verb calls :func:`add_price_tag_flags`; :func:`lmforge.cli.main.main` then runs the verb inside
:func:`priced`, which counts its forwards (:mod:`lmforge.cost.inference`) and, once the verb succeeded, prints
one line on stderr and writes ``--price-tag FILE`` (read by ``lmforge cost FILE``).
"""

from __future__ import annotations

import contextlib
import sys


def add_price_tag_flags(parser, command: str) -> None:
    """``--price-tag FILE`` and the settings that turn device time into CO2e and dollars (as ``lmforge cost``)."""
    group = parser.add_argument_group("price tag (FLOPs, device time, energy, CO2e, $ of this command)")
    group.add_argument("--price-tag", default=None, metavar="FILE",
                       help="also write the price tag as JSON to FILE (a folder: FILE/price_tag.json); "
                            "`lmforge cost FILE` reads it")
    group.add_argument("--no-price-tag", dest="price_line", action="store_false",
                       help="do not print the price-tag line on stderr")
    add_price_flags(group)
    parser.set_defaults(price_command=command)


def add_price_flags(group, regions: str = "world, us, eu, fr, ...", run_defaults: bool = False) -> None:
    """The settings that turn device time into CO2e and dollars, one set for every verb that prices something
    (``run_defaults``: ``lmforge cost``, where an unset flag keeps the run's own setting)."""
    run = "the run's, else " if run_defaults else ""
    group.add_argument("--region", default=None, help=f"grid region for CO2e ({regions}; default: {run}world)")
    group.add_argument("--grid-intensity", type=float, default=None, metavar="G_PER_KWH",
                       help="grid carbon intensity in g CO2e per kWh (overrides --region)")
    group.add_argument("--price-per-hour", type=float, default=None, metavar="USD",
                       help=f"US dollars per device-hour (default: {run}0.05 CPU / 2.00 GPU)")
    group.add_argument("--power-watts", type=float, default=None, metavar="W",
                       help="estimated draw of one device, for energy not measured (default 65 W CPU, 300 W GPU)")


@contextlib.contextmanager
def priced(args):
    """Count the verb's price tag when it has the flags (else do nothing); report it only if it succeeded."""
    command = getattr(args, "price_command", None)
    if command is None:
        yield
        return
    from lmforge.cost.inference import InferenceTag
    from lmforge.training.price_tag import PriceSettings

    device = str(getattr(args, "device", None) or "cpu")
    settings = PriceSettings.resolve("cuda" if device.startswith("cuda") else "cpu", args.region,
                                     args.grid_intensity, args.power_watts, args.price_per_hour)
    tag = InferenceTag(settings, command=command)
    with tag:
        yield  # an exception leaves here: a failed command prints and writes no tag
    if args.price_tag:
        tag.write(args.price_tag)
    if args.price_line:
        print(tag.line(), file=sys.stderr, flush=True)
