"""docs/cli.md against the real command line: every command has a section, each section's options table lists
exactly the options its command's ``--help`` lists, and the options read from the command objects are the ones
``--help`` prints. The commands and options come from the typer/click objects of ``attnres_export.cli``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from attnres_export.cli import app, export_app

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
COMMON_SECTION = "Options of every command"
COMMON_OPTIONS = frozenset({"--debug", "--help"})
"""Options every command takes, documented once in the common section rather than under each command."""
OPTION = re.compile(r"(?<![\w-])--?[A-Za-z][\w-]*")


Command = typer.core.TyperCommand | typer.core.TyperGroup


def _walk(command: Command, path: str) -> dict[str, Command]:
    """``{command path: command object}`` of ``command`` and everything under it."""
    found: dict[str, Command] = {path: command}
    if isinstance(command, typer.core.TyperGroup):
        context = command.context_class(command, info_name=path)
        for name in command.list_commands(context):
            found |= _walk(command.get_command(context, name), f"{path} {name}")
    return found


def all_commands() -> dict[str, Command]:
    """Every command of both console scripts, keyed by how a user types it (``attnres plugin build``)."""
    return _walk(typer.main.get_command(app), "attnres") | _walk(typer.main.get_command(export_app), "attnres-export")


def help_options(command: Command) -> set[str]:
    """Every option spelling ``--help`` lists for ``command`` (both halves of a ``--x/--no-x`` pair, and
    ``--help`` itself), read from the command object."""
    context = command.context_class(command)
    return {spelling for param in command.get_params(context) if param.param_type_name == "option"
            and not getattr(param, "hidden", False) for spelling in (*param.opts, *param.secondary_opts)}


def documented_commands() -> list[str]:
    """The commands whose options a user sets: the leaves, and a group that has options of its own."""
    return sorted(path for path, command in all_commands().items()
                  if not isinstance(command, typer.core.TyperGroup) or help_options(command) - {"--help"})


def doc_sections() -> dict[str, str]:
    """``{level-2 heading: body}`` of docs/cli.md (fenced code is kept: headings never start inside it here)."""
    sections: dict[str, str] = {}
    heading = None
    for line in CLI_DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            sections[heading] = ""
        elif heading is not None:
            sections[heading] += line + "\n"
    return sections


def section_of(command_path: str) -> str:
    """The heading whose backticked names include ``command_path`` (``## `attnres-export` / `attnres export` ``)."""
    aliases = {command_path, command_path.replace("attnres-export", "attnres export")}
    matches = [h for h in doc_sections() if aliases & set(re.findall(r"`([^`]+)`", h))]
    assert len(matches) == 1, f"docs/cli.md needs exactly one '## `{command_path}`' heading, found {matches}"
    return matches[0]


def table_options(body: str) -> set[str]:
    """The options named in the first column of a section's options table (the table headed ``| option |``)."""
    options: set[str] = set()
    in_table = False
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            in_table = False
        elif cells[0] == "option":
            in_table = True
        elif in_table:
            options |= set(OPTION.findall(cells[0].replace("\\|", " ")))
    return options


def test_every_command_has_a_section_in_the_cli_reference() -> None:
    for path in documented_commands():
        section_of(path)


def test_every_section_of_the_cli_reference_names_a_real_command() -> None:
    real = set(all_commands()) | {"attnres export"}
    for heading in doc_sections():
        if heading == COMMON_SECTION:
            continue
        names = re.findall(r"`([^`]+)`", heading)
        assert names and set(names) <= real, f"docs/cli.md section {heading!r} names no command that exists"


@pytest.mark.parametrize("command_path", documented_commands())
def test_the_section_documents_exactly_the_options_the_commands_help_lists(command_path: str) -> None:
    command = all_commands()[command_path]
    wanted = help_options(command) - COMMON_OPTIONS
    documented = table_options(doc_sections()[section_of(command_path)])
    assert documented == wanted, (f"docs/cli.md, section of `{command_path}`: missing {sorted(wanted - documented)}, "
                                  f"not in --help {sorted(documented - wanted)}")


def test_the_options_every_command_shares_are_on_every_command_and_documented_once() -> None:
    for path in documented_commands():
        assert help_options(all_commands()[path]) >= COMMON_OPTIONS, path
    assert table_options(doc_sections()[COMMON_SECTION]) == COMMON_OPTIONS


@pytest.mark.parametrize("command_path", sorted(all_commands()))
def test_the_options_read_from_the_command_objects_are_the_ones_help_prints(command_path: str) -> None:
    script, *args = command_path.split()
    result = CliRunner().invoke(app if script == "attnres" else export_app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    printed = set(OPTION.findall(result.output.split("Options:", 1)[-1]))
    assert help_options(all_commands()[command_path]) <= printed
