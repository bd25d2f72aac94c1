"""The ``autoslapo`` command: one argparse parser, one module a subcommand.

Each subcommand lives in ``autoslapo/cli/<name>.py`` and defines ``add_arguments(parser)`` and
``run(args) -> int``. Those modules import nothing heavy at module level (torch, ray, sqlalchemy
load inside ``run``), so ``autoslapo --help`` stays fast. Errors become one line on stderr: exit 2
for bad input, 1 for a runtime failure, never a traceback (``AUTOSLAPO_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from autoslapo.errors import AutoslapoError
from autoslapo.redact import redact

# name -> one-line help. Registered explicitly; the module is autoslapo.cli.<name>.
SUBCOMMANDS: dict[str, str] = {
    "run": "run one real training trial of a configuration on this machine (CPU ranks when no GPU)",
    "tune": "search schedules for a model on a cluster (sim, local or Ray trials); every trial goes to the store",
    "best": "the best recorded schedule for a model on a cluster, from the store",
    "verify": "apply a model family's default schedule on local ranks and check outputs and gradients",
    "studies": "list the studies in the store: model, cluster, backend, trials, best, status",
    "show": "show a study's trials: knobs, status, metrics, reason (sortable)",
    "export": "write a study's trials to a CSV or Parquet file",
    "report": "write a study's report: PNG figures and a self-contained HTML page",
    "estimate": "predict throughput and memory of a schedule on a described cluster (cost model, no devices)",
    "profile": "measure this machine's compute rate and gloo bandwidth for the cost model",
    "models": "list the model presets with their family and shape (hidden, layers, heads, ffn, ...)",
    "serve": "serve the HTTP API and web page over the store (127.0.0.1 unless --host); --workers N runs jobs",
    "worker": "claim the service's queued study jobs and run them as `autoslapo tune` does",
    "token": "create, list or revoke the service's API tokens (the store keeps only a hash)",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad input as one line and exit code 2, and takes no abbreviated flag.

    ``allow_abbrev`` is off: ``--trial`` must not silently mean ``--trials`` (nor ``--gpu``
    ``--gpus``); a flag not spelled out is refused, with the close ones named (``_unknown_flags``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {redact(message)} (see {self.prog} --help)\n")
        raise SystemExit(2)


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"autoslapo.cli.{name.replace('-', '_')}")


def _version() -> str:
    from autoslapo import __version__

    return __version__


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that subcommand's arguments are loaded (fast start-up).

    Every subcommand is listed in the top-level help from ``SUBCOMMANDS`` without importing it.
    """
    parser = _Parser(prog="autoslapo", description="Automatic schedule tuner for distributed PyTorch training.")
    parser.add_argument("--version", action="version", version=f"autoslapo {_version()}",
                        help="print autoslapo's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, help_text in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or name == only:
            _module(name).add_arguments(p)
    return parser


def _unknown_flags(parser: argparse.ArgumentParser, command: str | None, extra: Sequence[str]) -> str:
    """``": --trial: did you mean --trials?"`` for the flags in ``extra`` the command does not take
    (``""`` when it takes them all), naming the close ones it takes."""
    hints = [f"{redact(flag)}: did you mean {' or '.join(close[:3])}?" if close else redact(flag)
             for _, flag, close in _misspelt(_flag_actions(parser, command), extra)]
    return ": " + "; ".join(hints) if hints else ""


def _flag_actions(parser: argparse.ArgumentParser, command: str | None) -> dict[str, argparse.Action]:
    """The flags ``command`` takes (the top-level parser's without one; every command's with ``"*"``)."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is not None and command == "*":
        return {k: v for p in sub.choices.values() for k, v in p._option_string_actions.items()}
    target = sub.choices.get(command) if sub is not None and command else parser
    return dict((target or parser)._option_string_actions)


def _misspelt(actions: dict[str, argparse.Action], words: Sequence[str]) -> list[tuple[int, str, list[str]]]:
    """``(index, flag, close)`` for each flag in ``words`` not among ``actions``, with the close flags taken
    (at most 3): ``-gpus`` (one dash) and ``--TRIALS`` (case) meant ``--gpus`` and ``--trials``."""
    known = sorted(s for s in actions if s.startswith("--"))
    out = []
    for i, word in enumerate(words):
        flag = word.split("=", 1)[0]
        if flag == "--" or flag in actions or not _is_flag(flag):
            continue
        if not flag.startswith("--") and flag[:2] in actions:  # a short option with its value: -o/tmp/x
            continue
        before = actions.get(words[i - 1]) if i else None
        if before is not None and before.nargs != 0:  # the value of the option before it (--study -x): argparse says
            continue
        # "-gpus" (one dash), "--TRIALS" (case): what was meant, spelled as the command takes it
        spelled = "--" + flag.lstrip("-").lower()
        close = ([spelled] if spelled in known else [k for k in known if k.startswith(spelled)]
                 or difflib.get_close_matches(spelled, known, n=3, cutoff=0.7))
        out.append((i, flag, close[:3]))
    return out


def _is_flag(word: str) -> bool:
    """Whether ``word`` reads as a flag: ``--x`` or ``-x...``, not a negative number (``--seed -1``)."""
    if not word.startswith("-") or len(word) < 2:
        return False
    try:
        float(word)
    except ValueError:
        return True
    return False


def _flags_before_command(args: Sequence[str]) -> str:
    """The error for flags written before the command (``autoslapo --storage URL studies``), or "".

    The command it suggests spells each flag as the command takes it where only its dashes or case
    differ (``-gpus`` -> ``--gpus``, as ``_misspelt`` corrects a flag after the command); any other
    keeps its spelling, and the close flags are named (or that none is)."""
    at = next((i for i, a in enumerate(args) if a in SUBCOMMANDS), None)
    head = list(args[:at] if at is not None else args)
    if not head or not _is_flag(head[0]) or head[0] in ("-h", "--help", "--version"):
        return ""
    command = args[at] if at is not None else None
    fixed, hints = list(head), []
    for i, flag, close in _misspelt(_flag_actions(build_parser(only=command), command or "*"), head):
        if close == ["--" + flag.lstrip("-").lower()]:  # only its dashes or case: "-gpus=8" -> "--gpus=8"
            fixed[i] = close[0] + head[i][len(flag):]
        else:  # another flag is a guess (--bogus is not --gpus): named, not written in
            hints.append(f"; {flag}: did you mean {' or '.join(close)}?" if close else
                         f"; {'autoslapo ' + command + ' takes no' if command else 'no command takes'} {flag}")
    fix = f"autoslapo {command} {' '.join(fixed)} ..." if command is not None else (
        f"autoslapo COMMAND {' '.join(fixed)}, a COMMAND of {', '.join(SUBCOMMANDS)}")
    return f"flags go after the command: got {redact(' '.join(head))} before it; write {redact(fix)}" + \
        redact("".join(hints))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list == ["--version"]:  # argparse's action would exit the process
        print(f"autoslapo {_version()}")
        return 0
    early = _flags_before_command(args_list)
    if early:  # else the flag's value ("URL") was read as the command
        sys.stderr.write(f"autoslapo: error: {early} (see autoslapo --help)\n")
        return 2
    command = next((a for a in args_list if not a.startswith("-")), None)
    if command is not None and command not in SUBCOMMANDS:
        close = difflib.get_close_matches(command, SUBCOMMANDS, n=1)
        hint = f"; did you mean {close[0]}?" if close else f"; the commands: {', '.join(SUBCOMMANDS)}"
        sys.stderr.write(f"autoslapo: error: no command {redact(command)!r}{hint} (see autoslapo --help)\n")
        return 2
    parser = build_parser(only=command if command in SUBCOMMANDS else "")
    flags = args_list[:args_list.index("--") if "--" in args_list else None]  # words: a flag's neighbours matter
    hint = _unknown_flags(parser, command, flags)
    if hint:  # before argparse, whose "--gpus is required" would hide that "--gpu" was meant for it
        prog = f"autoslapo {command}" if command else "autoslapo"
        sys.stderr.write(f"{prog}: error: unrecognized arguments{hint} (see {prog} --help)\n")
        return 2
    args, extra = parser.parse_known_args(args_list)
    if extra:  # named by the subcommand that did not take them (argparse leaves them to the top parser)
        prog = f"autoslapo {args.command}" if args.command else "autoslapo"
        sys.stderr.write(f"{prog}: error: unrecognized arguments: {redact(' '.join(extra))} (see {prog} --help)\n")
        return 2
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(_module(args.command).run(args) or 0)
    except AutoslapoError as e:
        sys.stderr.write(f"autoslapo {args.command}: error: {redact(str(e))}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"autoslapo {args.command}: interrupted\n")
        return 130
    except BrokenPipeError:  # the reader went away (``autoslapo models | head``): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1 if args.command == "tune" else 0  # a tune cut short: its study stopped, --resume continues it
    except Exception as e:  # last line of defence: one line, no traceback
        if os.environ.get("AUTOSLAPO_DEBUG"):
            raise
        first = redact(str(e)).strip().splitlines()[0] if str(e).strip() else ""
        sys.stderr.write(
            f"autoslapo {args.command}: internal error: {type(e).__name__}: {first} "
            "(set AUTOSLAPO_DEBUG=1 for the traceback)\n"
        )
        return 1


def entry() -> NoReturn:
    """Console-script entry point."""
    raise SystemExit(main())
