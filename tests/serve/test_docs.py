"""The usage lines of the serving commands in docs/cli.md and docs/serving.md name exactly their options."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from attnres_export.cli import app

ROOT = Path(__file__).resolve().parents[2]


def usage_options(text: str, command: str) -> set[str]:
    """The --options of the usage block that starts with ``attnres COMMAND ARTIFACT`` (up to the closing fence)."""
    found = re.search(rf"^attnres {command} ARTIFACT (.*?)^```", text, flags=re.S | re.M)
    assert found, f"no usage block for attnres {command}"
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-o)\b", found.group(1)))


def command_options(name: str) -> set[str]:
    command = typer.main.get_command(app).commands[name]
    return {o for p in command.params for o in p.opts if o.startswith("-") and o not in ("--debug", "--output")}


@pytest.mark.parametrize("document", ["docs/cli.md", "docs/serving.md"])
@pytest.mark.parametrize("name", ["serve", "triton-repo"])
def test_usage_lines_match_the_commands(document, name):
    assert usage_options((ROOT / document).read_text(), name) == command_options(name)
