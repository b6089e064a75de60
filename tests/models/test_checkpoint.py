"""Checkpoints load only in the format of docs/models.md#checkpoint-format, with weights_only=True; anything
else is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from attnres_export.errors import CheckpointError
from attnres_export.models import load_checkpoint, save_checkpoint
from attnres_export.models.attnres_lm import AttnResLMConfig
from attnres_export.models.example import make_example
from tests.conftest import SMALL


def valid_payload() -> dict:
    cfg = AttnResLMConfig(**SMALL, n_layers=1)
    model = make_example(cfg, seed=0)
    return {"format": "attnres-checkpoint", "version": 1, "config": cfg.to_dict(),
            "state_dict": dict(model.state_dict())}


def refuses(path: Path, pattern: str) -> None:
    with pytest.raises(CheckpointError, match=pattern) as info:
        load_checkpoint(path)
    assert "\n" not in str(info.value)


def test_round_trip_restores_identical_weights(tmp_path):
    cfg = AttnResLMConfig(**SMALL, n_layers=2, block_size=2)
    model = make_example(cfg, seed=3)
    save_checkpoint(model, cfg, tmp_path / "m.pt")
    loaded, loaded_cfg = load_checkpoint(tmp_path / "m.pt")
    assert loaded_cfg == cfg
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)


def test_pickled_module_is_refused_without_running_its_code(tmp_path):
    torch.save(nn.Linear(2, 2), tmp_path / "module.pt")
    refuses(tmp_path / "module.pt", "pickled Python objects .*torch.nn.modules.linear.Linear")


def test_corrupted_file_is_refused(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"\x00garbage" * 10)
    refuses(tmp_path / "junk.pt", "not a PyTorch checkpoint")


def test_truncated_checkpoint_is_refused(tmp_path):
    torch.save(valid_payload(), tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    refuses(tmp_path / "cut.pt", "not a")


def test_missing_file_is_refused(tmp_path):
    refuses(tmp_path / "absent.pt", "no such file")


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda p: p.update(format="something-else"), "format is 'something-else'"),
        (lambda p: p.update(version=2), "version 2 is not supported"),
        (lambda p: p.pop("state_dict"), "no 'state_dict'"),
        (lambda p: p["config"].pop("d_model"), "missing keys: d_model"),
        (lambda p: p["config"].update(n_layers="two"), "'n_layers' must be int"),
        (lambda p: p["config"].update(flavour=1), "unknown keys: flavour"),
        (lambda p: p["config"].update(residual="dense"), "residual must be one of"),
        (lambda p: p["state_dict"].pop("norm.weight"), "missing norm.weight"),
        (lambda p: p["state_dict"].update(extra=torch.zeros(1)), "unexpected extra"),
        (lambda p: p["state_dict"].update({"norm.weight": torch.zeros(5)}), "norm.weight.*shape \\[5\\]"),
        (lambda p: p["state_dict"].update({"norm.weight": torch.zeros(SMALL["d_model"], dtype=torch.int64)}),
         "norm.weight'\\] is stored as int64; attnres reads weights stored as float32, float16 or bfloat16"),
    ],
)
def test_malformed_checkpoint_is_refused_with_what_is_wrong(tmp_path, mutate, pattern):
    payload = valid_payload()
    mutate(payload)
    torch.save(payload, tmp_path / "bad.pt")
    refuses(tmp_path / "bad.pt", pattern)


def test_non_dict_payload_is_refused(tmp_path):
    torch.save([torch.zeros(2)], tmp_path / "list.pt")
    refuses(tmp_path / "list.pt", "not an attnres checkpoint")
