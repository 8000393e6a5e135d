"""Command-line flags from declared settings (options.py, settings.py): one helper adds any of them."""

from __future__ import annotations

import argparse
from typing import Any

from quickdraft.errors import QuickdraftError
from quickdraft.option import Option
from quickdraft.options import OPTIONS


def add_flag(parser: argparse.ArgumentParser, option: Option, note: str = "", declared_default: bool = True) -> None:
    """Add `option` as a flag: its name, help (and this command's note), its parse and checks.
    declared_default False: the flag defaults to None, so only what a user gives reaches the library
    (which applies the declared default itself)."""
    default = option.default if declared_default else None
    shown = f" (default: {option.default})" if option.default is not None else ""
    text = option.help + shown + (f"; {note}" if note else "")
    if option.kind is bool:  # --lookup / --no-lookup
        parser.add_argument(
            option.flag, dest=option.name, action=argparse.BooleanOptionalAction, default=default, help=text
        )
        return
    metavar = "{" + ",".join(option.choices) + "}" if option.choices else option.name.upper()
    parser.add_argument(
        option.flag,
        dest=option.name,
        type=_flag_parser(option),
        metavar=metavar,
        default=default,
        action="append" if option.repeat else "store",
        help=text,
    )


def add_option_flags(parser: argparse.ArgumentParser, model_only: bool = False) -> None:
    """A flag for every declared method option (quickdraft.options.OPTIONS); default None, so only the
    flags a user gives reach the decoder and the declared defaults apply."""
    for option in OPTIONS:
        if option.model or not model_only:
            add_flag(parser, option, declared_default=False)


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The declared method options the user set on the command line."""
    return {o.name: getattr(args, o.name) for o in OPTIONS if getattr(args, o.name, None) is not None}


def _flag_parser(option: Option):
    def parse(text: str) -> Any:
        try:
            return option.parse(text)
        except QuickdraftError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse
