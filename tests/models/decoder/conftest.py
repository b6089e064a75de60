"""transformers is the reference of every test here (it is in the project's virtual environment)."""

import pytest

pytest.importorskip("transformers", reason="transformers is the reference for the decoder bodies")
