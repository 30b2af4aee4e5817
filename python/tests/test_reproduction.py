"""A few steps of the composition reproduction (python/reproduction/composition.py), so that
the script keeps working: MHA and IHA train through iha.torch and report their accuracies."""

import importlib.util
import json
from pathlib import Path


def load_composition():
    path = Path(__file__).resolve().parents[1] / "reproduction" / "composition.py"
    spec = importlib.util.spec_from_file_location("composition", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_composition_smoke(tmp_path):
    composition = load_composition()
    out = tmp_path / "runs.json"
    runs = composition.main(["--n", "2", "--pseudo", "1", "2", "--seeds", "0", "--steps", "3", "--batch", "8",
                             "--eval-every", "3", "--eval-examples", "16", "--out", str(out)])
    assert [r["pseudo"] for r in runs] == [1, 2]
    for run in runs:
        assert 0.0 <= run["exact_match"] <= run["position_acc"] <= 1.0
    assert "| 2 | 1 |" in json.loads(out.read_text())["table"]


def test_targets_are_the_boolean_product():
    composition = load_composition()
    import torch
    tokens, targets = composition.examples(4, 3, torch.Generator().manual_seed(0))
    a, b = tokens[:, :9].reshape(4, 3, 3), tokens[:, 9:18].reshape(4, 3, 3)
    for s in range(4):
        for i in range(3):
            for k in range(3):
                assert targets[s, i * 3 + k] == int(any(a[s, i, j] and b[s, j, k] for j in range(3)))
    assert (tokens[:, 18:] == 2).all()
