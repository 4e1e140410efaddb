"""One home each (issue #45): the explainer registry and the random-group sampler are defined once and every
user takes them from there (the draws the tests of each user pin unchanged); prediction hashes through
``sopfast.integrity`` and identifies its data through ``data/identity.py``; one device helper; no room
imports another room's private names."""

from __future__ import annotations

import ast
import json
import re
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import sopfast
from sopfast.data.identity import data_identity
from sopfast.devices import module_device
from sopfast.evaluation import baselines as B
from sopfast.evaluation.methods import top_tau_masks
from sopfast.integrity import state_sha256
from sopfast.masking.adapt import KEEP_RANGE, _training_masks
from sopfast.masking.explainers import EXPLAINERS, Explainer, ExplainerName, get_explainer, register_explainer
from sopfast.masking.random_groups import random_group_scores, random_groups
from sopfast.ops import num_kept
from sopfast.ops.counts import num_kept_table
from sopfast.prediction import store
from sopfast.testing import make_bert, make_hf_vit, text_batch

PACKAGE = Path(sopfast.__file__).parent


def _definitions() -> dict[str, list[str]]:
    """Every function, class and module-level name the package defines → the modules defining it."""
    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        names += [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
        names += [n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        for name in names:
            found.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    return found


def test_the_explainer_registry_and_the_sampler_are_defined_once():
    defined = _definitions()
    assert defined["EXPLAINERS"] == ["masking/explainers.py"]
    assert defined["_quiet_surrogate_fit"] == ["masking/explainers.py"]
    assert defined["random_groups"] == defined["random_group_scores"] == ["masking/random_groups.py"]
    assert not {n for n in defined if re.search(r"random_group_masks|named_explainer|device_of$", n)}
    captum = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if "import captum" in p.read_text()]
    assert captum == ["masking/explainers.py"]  # Captum's methods are built in one place


def test_no_room_imports_another_rooms_private_names():
    found = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("sopfast")):
                continue
            base = list(parts[:-1])[: len(parts) - node.level] if node.level else []
            target = base + (node.module.split(".") if node.module else [])
            target = target[1:] if not node.level else target
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if target and target[0] != parts[0] and private:
                found.append(f"{path.relative_to(PACKAGE)} imports {private} from {'.'.join(target)}")
    assert not found, found


# -- the explainer registry ----------------------------------------------------------------------------------
def test_every_user_takes_its_explainers_from_the_registry():
    assert tuple(EXPLAINERS) == typing.get_args(ExplainerName)  # the choices of predict and its --explainer
    assert sopfast.prediction.EXPLAINERS is EXPLAINERS
    assert set(B.CAPTUM_METHODS) <= set(EXPLAINERS)
    with pytest.raises(ValueError, match="already registered"):
        register_explainer(EXPLAINERS["rise"])
    with pytest.raises(ValueError, match=r"explainer must be one of \('rise', .*'ig'\), got 'gradcam'"):
        get_explainer("gradcam")
    with pytest.raises(ValueError, match=r"options \['window'\] are not options of 'lime'"):
        EXPLAINERS["lime"].check_options({"window": 2})


def test_a_registered_explainer_is_offered_to_predict_and_agreement(monkeypatch, tmp_path):
    def ones(adapter, inputs, target, mode, seed, options):
        return adapter.candidate_mask(inputs).float() * options.get("scale", 1)

    monkeypatch.setitem(EXPLAINERS, "ones", Explainer("ones", ones, ("scale",)))
    vit = make_hf_vit()
    data = TensorDataset(torch.randn(2, 3, 32, 32))
    sopfast.predict(vit, data, tmp_path / "out", explainer="ones", explainer_options={"scale": 2}, progress=False)
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out" / "data")
    assert np.array(table["ones_attributions"].to_pylist()).tolist() == [[2.0] * 16] * 2
    assert float(sopfast.masking.agreement(vit, data.tensors[0], explainer="ones").median_spearman) == 1.0


@pytest.mark.parametrize("name", ["feature_ablation", "shapley_sampling", "ig"])
def test_predict_writes_every_registered_explainer_as_the_explainer_on_each_example(name, tmp_path):
    pytest.importorskip("captum")
    vit = make_hf_vit()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    options = {"n_samples": 2} if name == "shapley_sampling" else {"n_steps": 4} if name == "ig" else {}
    result = sopfast.predict(
        vit, TensorDataset(x), tmp_path / "out", explainer=name, explainer_options=options, seed=3, progress=False
    )
    import pyarrow.parquet as pq

    written = np.array(pq.read_table(result.output_dir + "/data")[f"{name}_attributions"].to_pylist())
    with torch.no_grad():
        target = vit(x).logits.argmax(-1)
    for i in range(2):
        alone = EXPLAINERS[name](vit, x[i : i + 1], target[i : i + 1], seed=3, **options)
        np.testing.assert_allclose(written[i], alone[0].numpy(), atol=1e-5)


def test_agreement_refuses_an_explainer_that_runs_no_masked_inputs():
    with pytest.raises(ValueError, match=r"explainer must be one of \('rise', .*'shapley_sampling'\) or a callable"):
        sopfast.masking.agreement(make_hf_vit(), torch.randn(1, 3, 32, 32), explainer="ig")


# -- the random-group sampler: the draws each user's tests pin ---------------------------------------------
def _diagnose_masks_before(candidates, tau, m, generator):
    """``masking/diagnose.random_group_masks`` before #45, as it was."""
    valid = candidates.cpu()
    b, d = valid.shape
    k = torch.tensor(num_kept_table(float(tau), d))[valid.sum(dim=1)]
    scores = torch.rand(b, m, d, generator=generator).masked_fill(~valid.unsqueeze(1), -1.0)
    rank = scores.argsort(dim=-1, descending=True).argsort(dim=-1)
    return (rank < k.view(b, 1, 1)) & valid.unsqueeze(1)


def _adapt_masks_before(candidates, equal_sizes, generator):
    """``masking/adapt._training_masks`` before #45, as it was."""
    low, high = KEEP_RANGE
    b, d = candidates.shape
    keep = torch.rand(1 if equal_sizes else b, generator=generator) * (high - low) + low
    k = (keep * candidates.sum(dim=1)).floor().clamp_min(1)
    scores = torch.rand(b, d, generator=generator).masked_fill(~candidates, -1.0)
    rank = scores.argsort(dim=-1, descending=True).argsort(dim=-1)
    return ((rank < k.view(-1, 1)) & candidates).unsqueeze(1)


def _text_candidates():
    adapter = sopfast.adapters.get_adapter(make_bert())
    return adapter, adapter.prepare(*text_batch())


def test_diagnose_draws_the_groups_it_drew_before():
    _, inputs = _text_candidates()
    valid = sopfast.adapters.get_adapter(make_bert()).candidate_mask(inputs)
    for tau, m, seed in ((0.2, 5, 0), (0.5, 3, 7)):
        new = random_groups(valid, tau, m, torch.Generator().manual_seed(seed))
        assert torch.equal(new, _diagnose_masks_before(valid, tau, m, torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("mode", ["exact", "drop"])
def test_adapt_draws_the_groups_it_drew_before(mode):
    for adapter, inputs in (_text_candidates(), (sopfast.adapters.get_adapter(make_hf_vit()), None)):
        inputs = inputs if inputs is not None else adapter.prepare(torch.randn(3, 3, 32, 32))
        valid = adapter.candidate_mask(inputs)
        new = _training_masks(adapter, inputs, mode, torch.Generator().manual_seed(4))
        equal = mode in adapter.equal_size_modes
        assert torch.equal(new, _adapt_masks_before(valid, equal, torch.Generator().manual_seed(4)))


def test_the_random_baseline_keeps_the_top_of_the_samplers_groups():
    model = sopfast.SOP(make_bert(), num_groups=4)
    inputs = model.prepare(*text_batch())
    valid = model.adapter.candidate_mask(inputs)
    scores = B.RandomGroups(seed=5).scores(model, inputs)
    assert torch.equal(scores, random_group_scores(valid, 4, torch.Generator().manual_seed(5)))
    for tau in (0.2, 0.5):
        masks = top_tau_masks(scores, valid, tau)
        assert torch.equal(masks, random_groups(valid, tau, 4, torch.Generator().manual_seed(5)))
        assert masks.sum(-1).tolist() == [[num_kept(tau, int(c))] * 4 for c in valid.sum(1)]


# -- hashing, data identity and devices through their one owner ------------------------------------------
def test_prediction_hashes_through_integrity_and_identifies_data_through_identity():
    assert "hashlib" not in (PACKAGE / "prediction" / "store.py").read_text()
    vit = make_hf_vit()
    settings = {"outputs": ["logits"], "mode": None}
    expected = state_sha256({"class": type(vit).__name__, "settings": settings, "state": vit.state_dict()})
    assert store.model_fingerprint(vit, settings) == expected
    data = TensorDataset(torch.randn(4, 3, 32, 32))
    assert store.data_fingerprint(data) == data_identity(data)


def test_a_dataset_of_another_kind_is_identified_by_its_examples_contents():
    """Five examples read: arrays (a PIL image too) by their values, not by a repr that names an address."""
    pil = pytest.importorskip("PIL.Image")

    def images(value: int) -> list:
        return [{"image": pil.fromarray(np.full((4, 4), value, np.uint8)), "label": i % 2} for i in range(7)]

    first, again, other = (store.data_fingerprint(images(v)) for v in (3, 3, 4))
    assert first == again != other and first["basis"] == "5 examples read" and first["examples"] == 7
    assert data_identity(images(3))["basis"].startswith("count only")  # what a training resume records, unchanged


def test_an_earlier_prediction_format_is_refused_saying_why(tmp_path):
    data = TensorDataset(torch.randn(2, 3, 32, 32))
    out = tmp_path / "out"
    sopfast.predict(make_hf_vit(), data, out, progress=False)
    manifest = json.loads((out / "predict.json").read_text())
    (out / "predict.json").write_text(json.dumps({**manifest, "format": "sopfast-predict/1"}))
    with pytest.raises(ValueError, match=r"predictions of an earlier sopfast \(sopfast-predict/1\).*new directory"):
        sopfast.predict(make_hf_vit(), data, out, progress=False)


def test_the_device_of_a_module_is_asked_of_devices_alone():
    assert module_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert module_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters: the CPU
    assert "_device_of" not in _definitions()
