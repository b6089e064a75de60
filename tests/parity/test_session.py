"""One model's check (parity/session.py): the checkpoint is opened once per command and its weights read once for
the references (again only for a routing-aware comparison), the model is released before ONNX Runtime runs, the
export's check (``check_onnx``) is ``attnres check``'s, and the parity modules do not import each other in a cycle."""

from __future__ import annotations

import ast
import math
import weakref
from pathlib import Path

import pytest

import attnres_export
from attnres_export.dtypes import Tolerance
from attnres_export.models import load_checkpoint
from attnres_export.models.registry import ARCHITECTURES, build_model
from attnres_export.models.store import Checkpoint, open_checkpoint
from attnres_export.parity.check import check_artifacts, checkpoint_input_names, weightless_model
from attnres_export.parity.feeds import has_past
from attnres_export.parity.metrics import tolerance_for
from attnres_export.parity.session import CheckSession, check_onnx
from tests.models.test_registry import tiny_config

PARITY = Path(attnres_export.__file__).parent / "parity"


class Opened:
    """Counts the opens of checkpoints and the models read from them; refuses the one-call loader."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from attnres_export.models import store

        self.opens, self.models = 0, 0
        real_open, real_model = store.open_checkpoint, Checkpoint.model

        def open_checkpoint(path):
            self.opens += 1
            return real_open(path)

        def model(checkpoint, dtype="float32"):
            self.models += 1
            assert dtype is None, "the check reads the weights as stored"
            return real_model(checkpoint, dtype)

        def refused(*args, **kwargs):
            raise AssertionError("the check opened the checkpoint again (load_checkpoint)")

        monkeypatch.setattr(store, "open_checkpoint", open_checkpoint)
        monkeypatch.setattr(Checkpoint, "model", model)
        monkeypatch.setattr("attnres_export.models.load_checkpoint", refused)
        monkeypatch.setattr("attnres_export.models.checkpoint.load_checkpoint", refused)


def test_attnres_check_opens_the_checkpoint_once_and_reads_its_weights_once(artifacts, monkeypatch):
    opened = Opened(monkeypatch)
    result = check_artifacts(artifacts.checkpoint, [artifacts.tensorrt, artifacts.portable, artifacts.perturbed])
    assert (opened.opens, opened.models) == (1, 1)
    assert [check.ok for check in result.report.checks] == [True, True, True, True, False, False]


def test_a_refused_checkpoint_reads_no_weight(artifacts, monkeypatch, tmp_path):
    from tests.parity.test_check import checkpoint

    opened = Opened(monkeypatch)
    with pytest.raises(attnres_export.errors.ParityError, match="exported from another model"):
        check_artifacts(checkpoint(tmp_path / "wide.pt", d_model=32), [artifacts.tensorrt])
    assert (opened.opens, opened.models) == (1, 0)


def test_the_references_release_the_model_before_onnx_runtime_runs(artifacts):
    alive = []

    def reference_model():
        model = load_checkpoint(artifacts.checkpoint, dtype=None)[0]
        alive.append(weakref.ref(model))
        return model

    session = CheckSession(reference_model, seed=3)
    references = session.references([(1, 4)], False, ["float32"])
    assert list(references) == [None] and references[None].exact is not None
    assert len(alive) == 1 and alive[0]() is None


def test_check_onnx_is_the_check_attnres_check_runs_with_the_exports_status_lines(artifacts):
    lines = []
    opened = open_checkpoint(artifacts.checkpoint)
    report = check_onnx(artifacts.perturbed, "staged-name.onnx", lambda: opened.model(None), False, "float32", 7,
                        [(2, 4), (3, 1)], tolerance_for("float32", {}), lines.append)
    checked = check_artifacts(artifacts.checkpoint, [artifacts.perturbed], shapes=[(2, 4), (3, 1)], seed=7).report
    assert lines and all(line.startswith("parity: ") for line in lines)
    assert {check.artifact for check in report.checks} == {"staged-name.onnx"}
    assert [(c.shape, c.backend, c.dtype, c.ok) for c in report.checks] == [
        (c.shape, c.backend, c.dtype, c.ok) for c in checked.checks]
    for ours, theirs in zip(report.checks, checked.checks, strict=True):
        for name, metrics in ours.outputs.items():
            assert math.isclose(metrics.rel_l2, theirs.outputs[name].rel_l2, rel_tol=1e-9, abs_tol=1e-15)
            assert (metrics.rel_l2_bar, metrics.cosine_bar) == (theirs.outputs[name].rel_l2_bar,
                                                                theirs.outputs[name].cosine_bar)
    assert not report.ok


def test_check_onnx_uses_the_tolerance_it_is_given(artifacts):
    opened = open_checkpoint(artifacts.checkpoint)
    report = check_onnx(artifacts.perturbed, "p.onnx", lambda: opened.model(None), False, "float32", 0, [(1, 4)],
                        Tolerance(10.0, -1.0))
    assert report.ok


def imported_parity_modules(name: str) -> set[str]:
    tree = ast.parse((PARITY / f"{name}.py").read_text())
    return {node.module.rsplit(".", 1)[-1] for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnres_export.parity.")}


def test_the_parity_modules_import_each_other_in_one_direction():
    """check -> session -> routing -> types: the shared types live in parity/types.py."""
    assert "check" not in imported_parity_modules("session") | imported_parity_modules("routing")
    assert "session" not in imported_parity_modules("routing")
    assert not imported_parity_modules("types")


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_the_weightless_model_the_refusals_read_is_the_models_contract(name):
    """``refuse_other_model`` reads a model built on the meta device (no weight read before the refusals): its
    config, inputs and with-past graph are the loaded model's."""
    cfg = tiny_config(name)
    model, weightless = build_model(cfg), weightless_model(cfg)
    assert weightless.config == model.config
    assert has_past(weightless) == has_past(model)
    for with_past in (False, True) if has_past(model) else (False,):
        assert checkpoint_input_names(weightless, with_past) == checkpoint_input_names(model, with_past)
