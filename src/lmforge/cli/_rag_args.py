"""The retrieval flags of ``generate`` and ``serve``: an index, how many passages, the template they go in."""

from __future__ import annotations

from lmforge.cli.main import UserError
from lmforge.prompting.rag import DEFAULT_TEMPLATE, check_template


def add_rag_flags(parser, *, k_help: str = "passages to retrieve per prompt (default: 3)",
                  template: str = DEFAULT_TEMPLATE, question: str = "the prompt") -> None:
    group = parser.add_argument_group("retrieval (RAG)")
    group.add_argument("--index", default=None, metavar="DIR",
                       help="an `lmforge index build` folder: each prompt becomes the template filled with its "
                       f"top-k passages (found with the index's own encoder) and {question} as the question")
    group.add_argument("-k", type=int, default=None, metavar="N", help=k_help)
    shown = template.replace("\n", "\\n")
    group.add_argument("--rag-template", default=None, metavar="T",
                       help="prompt with {passages} (numbered lines '[1] text', best first) and {question}; \\n is "
                       f"unescaped (default: '{shown}')")
    group.add_argument("--rag-model", default=None, metavar="DIR",
                       help="encoder of the questions (default: the one the index records; another is refused)")


def rag_settings(args, default: str = DEFAULT_TEMPLATE) -> tuple[int, str] | None:
    """(k, template) with ``--index``, None without; retrieval flags without ``--index`` are refused."""
    if args.index is None:
        for flag, value in (("-k", args.k), ("--rag-template", args.rag_template), ("--rag-model", args.rag_model)):
            if value is not None:
                raise UserError(f"{flag} needs --index DIR (the index to retrieve from)")
        return None
    k = 3 if args.k is None else args.k
    if k < 1:
        raise UserError(f"-k {k}: retrieve at least 1 passage")
    template = default if args.rag_template is None else \
        check_template(args.rag_template.replace("\\n", "\n").replace("\\t", "\t"))
    return k, template
