"""The TensorRT fake is as strict as the bindings it mirrors: only members each version binds exist.

With ATTNRES_TENSORRT_GIT set to a clone (or bare mirror) of NVIDIA/TensorRT, the fake's tables are checked
against the pybind11 sources at the tag of each version; without it that test is skipped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.tensorrt.conftest import FAKE_ROOT, FAKE_VERSIONS

_spec = importlib.util.spec_from_file_location("fake_tensorrt_bindings", FAKE_ROOT / "tensorrt" / "_bindings.py")
_bindings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bindings)


def test_set_plugins_to_serialize_is_no_method_of_any_version_only_the_property(fake_trt):
    config = fake_trt.Builder(fake_trt.Logger()).create_builder_config()
    with pytest.raises(AttributeError, match="set_plugins_to_serialize"):
        config.set_plugins_to_serialize(["lib.so"])
    config.plugins_to_serialize = ["lib.so"]
    assert config.plugins_to_serialize == ["lib.so"]


def test_plugin_creator_list_exists_only_before_tensorrt_11(fake_trt):
    registry = fake_trt.get_plugin_registry()
    assert hasattr(registry, "plugin_creator_list") == fake_trt.__version__.startswith("10.")
    assert registry.all_creators == []


def test_strongly_typed_flag_value_and_explicit_batch_follow_the_version(fake_trt):
    flags = fake_trt.NetworkDefinitionCreationFlag
    if fake_trt.__version__.startswith("11."):
        assert int(flags.STRONGLY_TYPED) == 0 and not hasattr(flags, "EXPLICIT_BATCH")
    else:
        assert int(flags.STRONGLY_TYPED) == 1 and int(flags.EXPLICIT_BATCH) == 0


def test_unknown_attributes_can_be_neither_read_nor_set(fake_trt):
    runtime = fake_trt.Runtime(fake_trt.Logger())
    with pytest.raises(AttributeError):
        runtime.allow_host_code = True
    with pytest.raises(AttributeError):
        runtime.load_library("x.so")
    with pytest.raises(AttributeError):
        fake_trt.Builder(fake_trt.Logger()).build_engine(None, None)
    assert not hasattr(fake_trt, "json") and not hasattr(fake_trt, "os")


def test_a_subprocess_imports_the_same_version_from_pythonpath(fake_trt):
    out = subprocess.run([sys.executable, "-c", "import tensorrt; print(tensorrt.__version__)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == fake_trt.__version__


# --- the tables against the pybind11 sources -------------------------------------------------------------------------


def _statement(text: str, start: int) -> str:
    """From ``start`` to the ``;`` that ends the statement (outside brackets)."""
    depth = 0
    for index in range(start, len(text)):
        char = text[index]
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        elif char == ";" and depth <= 0:
            return text[start:index]
    return text[start:]


def bound_members(texts: list[str]) -> tuple[dict[str, set[str]], set[str]]:
    """Python class/enum name -> member names bound by its pybind11 statements; and the module functions."""
    members: dict[str, set[str]] = {}
    functions: set[str] = set()
    for text in texts:
        variables = {}
        for match in re.finditer(r'py::(?:class_|enum_)<[^;]*?>\s*(\w+)?\s*[({]\s*(\w+)\s*,\s*"(\w+)"', text):
            variable, scope, name = match.groups()
            body = _statement(text, match.end())
            names = set(re.findall(r'\.def\w*\(\s*"(\w+)"', body)) | set(re.findall(r'\.value\(\s*"(\w+)"', body))
            members.setdefault(name, set()).update(names)
            if variable:
                variables[variable] = name
            if scope in variables:
                members[variables[scope]].add(name)
                if ".export_values()" in body:
                    members[variables[scope]].update(names)
        for variable, name in variables.items():
            for match in re.finditer(rf"\b{variable}\s*\.", text):
                members[name].update(re.findall(r'\.def\w*\(\s*"(\w+)"', _statement(text, match.start())))
        functions.update(re.findall(r'\bm\.def\(\s*"(\w+)"', text))
    return members, functions


@pytest.fixture(scope="module")
def tensorrt_git() -> str:
    git_dir = os.environ.get("ATTNRES_TENSORRT_GIT")
    if not git_dir or not Path(git_dir).exists():
        pytest.skip("set ATTNRES_TENSORRT_GIT to a clone of NVIDIA/TensorRT to check the fake against its bindings")
    return git_dir


@pytest.mark.parametrize("version", FAKE_VERSIONS)
def test_every_fake_member_is_bound_exactly_where_the_table_says(tensorrt_git, version):
    tag = _bindings.TAGS[version]
    files = sorted(set(_bindings.SOURCES.values()) | set(_bindings.FUNCTIONS.values()))
    texts = [subprocess.run(["git", "--git-dir", tensorrt_git, "show", f"{tag}:{f}"], capture_output=True,
                            text=True, check=True).stdout for f in files]
    members, functions = bound_members(texts)
    wrong = [f"{cls}.{name}" for cls, table in _bindings.MEMBERS.items() for name, versions in table.items()
             if (version in versions) != (name in members.get(cls, set()))]
    wrong += [f"{enum}.{name}" for enum, table in _bindings.ENUMS.items() for name, values in table.items()
              if (version in values) != (name in members.get(enum, set()))]
    wrong += [name for name in _bindings.FUNCTIONS if name not in functions]
    assert wrong == [], f"{tag}: the fake's table disagrees with the bindings on {wrong}"
