"""Saving, loading and sharing SOP models the way Hugging Face models are (``save_pretrained`` /
``from_pretrained`` / ``push_to_hub``, a model card), and the inputs' preprocessing they carry.

A saved model is a directory (:mod:`sopfast.model.checkpoint`: ``sop_model.safetensors``,
``sop_config.json``) plus ``README.md``, its model card: backbone, data, recipe, τ, m, mode, the last
validation accuracy and the backbone diagnostic of its training run, with the metadata the Hub reads
(``library_name: sopfast``, tags, pipeline).  ``from_pretrained`` takes a local directory (or a run
folder) or a Hub id (``user/name``), fetched with ``huggingface_hub.snapshot_download`` (from the local
cache with ``local_files_only=True`` or ``HF_HUB_OFFLINE=1``); ``push_to_hub`` uploads with ``HfApi``.
sopfast writes its own directory format rather than ``huggingface_hub.ModelHubMixin``'s
``config.json``, which would make a saved SOP model look like a Hugging Face backbone directory.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from ..adapters.preprocessing import Preprocessing, preprocessing_for
from ..adapters.sources import Backbone, load_recorded, one_line
from ..checks import check_bool
from ..version import __version__
from .checkpoint import CARD_NAME as CARD_NAME
from .checkpoint import check_provenance, pretrained_directory, read_config, read_pretrained, save_pretrained
from .recipes import followers_of_given

DIAGNOSIS_FILE = "diagnosis.json"  # what a run folder of sopfast.train holds beside best/ and last/
PIPELINES = {"image": "image-classification", "text": "text-classification"}
#: a Hub repository id, ``user/name``, as opposed to a local path (whose first folder exists here)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _needs_hub(what: str) -> ImportError:
    return ImportError(f"{what} needs the 'huggingface_hub' package: pip install 'sopfast[hub]'")


def local_directory(
    name_or_path: str | os.PathLike,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    token: str | bool | None = None,
) -> Path:
    """``name_or_path`` itself when it exists here, else the Hub repository ``user/name`` it names, fetched
    (or found in the cache) by ``huggingface_hub.snapshot_download``."""
    path = Path(name_or_path)
    text = os.fspath(name_or_path)
    if path.exists() or not HUB_ID.fullmatch(text) or os.path.isdir(text.split("/")[0]):
        return path  # a local path (a missing one fails when it is read, naming it)
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError as err:
        raise _needs_hub(f"loading the Hub model {name_or_path!r}") from err
    try:
        return Path(
            snapshot_download(
                str(name_or_path),
                revision=revision,
                cache_dir=None if cache_dir is None else Path(cache_dir),
                local_files_only=local_files_only,
                token=token,
            )
        )
    except HFValidationError as err:
        raise FileNotFoundError(f"no SOP checkpoint at {name_or_path}: no such directory") from err
    except LocalEntryNotFoundError as err:
        raise FileNotFoundError(
            f"no SOP checkpoint at {name_or_path}: no such directory, and the Hub model {name_or_path!r} is not in "
            "the local cache (offline, or local_files_only=True)"
        ) from err


def backbone_module(backbone: object) -> nn.Module:
    """The ``nn.Module`` of ``backbone`` (a module, or a :func:`sopfast.adapters.load_backbone` record)."""
    module = backbone.model if isinstance(backbone, Backbone) else backbone
    if not isinstance(module, nn.Module):
        raise TypeError(f"backbone must be a torch.nn.Module, got {module!r} ({type(module).__name__})")
    return module


class SOPConfig(dict):
    """The constructor arguments (a plain ``dict`` for saving); training loops such as Hugging Face
    ``Trainer`` may set attributes on it (``model.config.use_cache = ...``), which are not saved.  Its
    ``to_dict`` / ``to_json_string`` / ``from_dict`` are what ``Trainer``'s loggers (``report_to``) read."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self)

    def to_json_string(self, use_diff: bool = True) -> str:
        return json.dumps(self, indent=2, sort_keys=True, default=str) + "\n"

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> SOPConfig:
        return cls({**config_dict, **kwargs})


class HubMixin:
    """``save_pretrained`` / ``from_pretrained`` / ``push_to_hub``, the model card and ``preprocess`` of
    :class:`sopfast.SOP` (which builds the model from the constructor options these methods save)."""

    provenance: dict[str, Any]

    def save_pretrained(
        self,
        directory: str | os.PathLike,
        *,
        model_card: bool = True,
        backbone_sha256: str | None = None,
        overwrite: bool = False,
    ) -> str:
        """Write the trainable weights (safetensors), the config, the backbone's hash and (``model_card``)
        the model card ``README.md`` to ``directory``, all-or-nothing (``backbone_sha256``: the hash, when
        known).  A folder holding another model is refused unless ``overwrite=True`` (its model files are
        replaced), and the backbone's own folder always (:func:`sopfast.model.checkpoint.save_pretrained`)."""
        check_bool("model_card", model_card)
        check_provenance(self)
        card = self.model_card() if model_card else None
        path = save_pretrained(self, directory, backbone_sha256=backbone_sha256, model_card=card, overwrite=overwrite)
        return str(path)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | os.PathLike,
        backbone: nn.Module | Backbone | None = None,
        *,
        strict_backbone: bool = True,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
        token: str | bool | None = None,
        **overrides: Any,
    ) -> Any:
        """Rebuild a model saved with :meth:`save_pretrained` — a directory, a run folder of
        :func:`sopfast.train` (its ``best/``, else ``last/``) or a Hub id ``user/name`` (``revision``,
        ``cache_dir``, ``local_files_only``, ``token``: as ``huggingface_hub.snapshot_download`` takes them)
        — over its backbone: ``backbone``, or without one the backbone the checkpoint recorded (a Hugging
        Face directory, ``timm:`` / ``torchvision:`` weights).

        A ValueError names what does not fit: another backbone, another adapter, missing or reshaped
        weights; without ``backbone``, a checkpoint that records none it can load.

        Args:
            strict_backbone: refuse a backbone other than the one the model was saved with (``False``:
                warn and load anyway).
            overrides: constructor options that replace the saved ones (``tau``, ``mode`` …).
        """
        check_bool("strict_backbone", strict_backbone)
        check_bool("local_files_only", local_files_only)
        if backbone is not None:
            backbone_module(backbone)  # a wrong type fails before any file is read
        found = local_directory(
            directory, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token
        )
        path = pretrained_directory(found)
        if backbone is None:
            recorded = (read_config(path).get("provenance") or {}).get("backbone") or {}
            backbone = load_recorded(recorded, f"the checkpoint {path}")
        saved = read_pretrained(path, backbone_module(backbone), strict_backbone=strict_backbone)
        options = followers_of_given({**saved.options, **overrides}, overrides)
        model: Any = cls(backbone, **options)  # type: ignore[call-arg]  # SOP's constructor
        saved.load_into(model, adapter_given="adapter" in overrides)
        loaded = {k: v for k, v in model.provenance.items() if v is not None}
        model.provenance = {**saved.provenance, **loaded}
        run_diagnosis = path.parent / DIAGNOSIS_FILE
        if model.provenance.get("diagnosis") is None and path != found and run_diagnosis.is_file():
            model.provenance["diagnosis"] = _read_diagnosis(run_diagnosis)
        return model

    def push_to_hub(
        self,
        repo_id: str,
        *,
        private: bool | None = None,
        token: str | None = None,
        commit_message: str = "Upload SOP model (sopfast)",
        branch: str | None = None,
        create_pr: bool | None = None,
    ) -> Any:
        """Upload the model (:meth:`save_pretrained`: weights, config, model card) to the Hub repository
        ``repo_id`` (created if needed) in one commit; returns the commit's info (its ``commit_url``).
        Load it with ``SOP.from_pretrained(repo_id)``."""
        try:
            from huggingface_hub import HfApi
        except ImportError as err:
            raise _needs_hub("push_to_hub") from err
        api = HfApi(token=token)
        with tempfile.TemporaryDirectory() as parent:
            folder = os.path.join(parent, "model")
            self.save_pretrained(folder)
            try:
                repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
                return api.upload_folder(
                    repo_id=repo_id,
                    folder_path=folder,
                    commit_message=commit_message,
                    revision=branch,
                    create_pr=create_pr,
                )
            except Exception as err:
                if not _unreachable(err):
                    raise
                raise ConnectionError(
                    f"push_to_hub({repo_id!r}): no network reachable, the Hub cannot be reached ({one_line(err)}); "
                    "save the model locally with save_pretrained(directory) instead, and upload it when online"
                ) from err

    def model_card(self) -> str:
        """The model card (``README.md``): Hub metadata, then what the model is and how it was made."""
        return model_card(self)

    @property
    def preprocessing(self) -> Preprocessing:
        """How raw inputs become this model's inputs: what it was trained with (its ``provenance``), else its
        backbone's own (:func:`sopfast.adapters.preprocessing.preprocessing_for`)."""
        model: Any = self
        return preprocessing_for(model.adapter, _source(model), saved=self.provenance.get("preprocessing"))

    def preprocess(self, inputs: Any, text_pair: Any = None) -> dict[str, torch.Tensor]:
        """Raw inputs as the model was trained on them: images (PIL images or paths) →
        ``{"pixel_values": [B, C, H, W]}``, texts (and ``text_pair``) → ``input_ids`` / ``attention_mask`` /
        ``token_type_ids``; ``model(**model.preprocess(inputs))`` predicts."""
        return self.preprocessing.batch(inputs, text_pair)


def _read_diagnosis(path: Path) -> dict[str, Any] | None:
    """A run folder's ``diagnosis.json``; ``None``, with a warning naming the file, when it is damaged."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        report = err
    if isinstance(report, dict):
        return report
    warnings.warn(f"{path} is damaged ({report}): the model is loaded without its diagnosis", stacklevel=3)
    return None


#: The names of the exception classes (or their bases) of an unreachable network: httpx's, requests', the Hub's.
_NETWORK_ERRORS = frozenset({"TransportError", "ConnectionError", "ConnectError", "Timeout", "OfflineModeIsEnabled"})


def _unreachable(err: BaseException) -> bool:
    """Whether ``err`` (or what caused it) says the network or the Hub cannot be reached."""
    while err is not None:
        if isinstance(err, (ConnectionError, TimeoutError, socket.gaierror)) or _NETWORK_ERRORS & {
            c.__name__ for c in type(err).__mro__
        }:
            return True
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    return False


def _source(model: Any) -> Backbone:
    """The backbone as :func:`preprocessing_for` reads it: where the model recorded it came from."""
    recorded = model.provenance.get("backbone") or {}
    kind = recorded.get("kind") or "module"
    spec = str(recorded.get("spec") or "")
    directory = spec if kind == "hf" and os.path.isdir(spec) else None
    return Backbone(model.backbone, kind, spec, directory=directory)


def _backbone_line(model: Any) -> str:
    recorded = model.provenance.get("backbone") or {}
    where = recorded.get("spec") or "not recorded"
    weights = f", weights {recorded['weights']}" if recorded.get("weights") else ""
    options = f", options {recorded['options']}" if recorded.get("options") else ""
    return f"`{where}`{weights}{options} ({type(model.backbone).__name__}, adapter {type(model.adapter).__name__})"


def _data_line(model: Any) -> str:
    data = model.provenance.get("data") or {}
    if not data:
        return "not recorded"
    rest = ", ".join(f"{k} {v}" for k, v in data.items() if k != "data")
    return f"`{data.get('data')}`" + (f" ({rest})" if rest else "")


def _validation_line(model: Any) -> str:
    validation = model.provenance.get("validation") or {}
    names = {
        "val_agreement": "agreement with the backbone's full-input prediction",
        "val_distinct_groups": f"distinct groups per input (of {model.num_groups})",
    }
    metrics = [
        f"{names.get(k, k[4:])} {v:.4f}" for k, v in validation.items() if k.startswith("val_") and isinstance(v, float)
    ]
    if not metrics:
        return "not recorded"
    return f"{', '.join(metrics)} at training step {validation.get('step')} (the run's validation data)"


def _diagnosis_lines(model: Any) -> list[str]:
    report = model.provenance.get("diagnosis")
    if not report:
        return ["No backbone diagnostic was recorded (`sopfast.diagnose` measures one)."]
    mode = report.get("mode")
    group = (report.get("random_groups") or {}).get(mode) or {}
    return [
        f"Measured before training on {report.get('examples')} examples (chance {report.get('chance', 0):.3f}): "
        f"the backbone scores {report.get('full_accuracy', 0):.3f} on whole inputs and "
        f"{group.get('one_group', 0):.3f} on one random group of τ = {report.get('tau')} in `{mode}` mode; "
        f"groups that are not learned reach {report.get('to_beat', 0):.3f}.",
        "",
        f"Verdict: {report.get('verdict', '')}",
    ]


def model_card(model: Any) -> str:
    """The model card of ``model`` (a :class:`sopfast.SOP`): YAML metadata for the Hub and a summary."""
    config = model.config
    metadata = {
        "library_name": "sopfast",
        "tags": ["sopfast", "sum-of-parts", "self-attributing", "interpretability"],
        "pipeline_tag": PIPELINES.get(model.adapter.modality, "other"),
    }
    rows = [
        ("backbone (frozen)", _backbone_line(model)),
        ("data", _data_line(model)),
        ("recipe", f"`{config.get('recipe')}`"),
        ("τ (fraction of the features per group)", f"{model.tau:g}"),
        ("m (groups per input)", str(model.num_groups)),
        ("mode", f"`{model.mode}`"),
        ("validation", _validation_line(model)),
    ]
    table = ["| | |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    lines = [
        "---",
        yaml.safe_dump(metadata, sort_keys=False).strip(),
        "---",
        "",
        "# Sum-of-Parts model",
        "",
        f"A self-attributing Sum-of-Parts model (SOP, ICML 2025) made with sopfast {__version__}: "
        f"every prediction is an exact, sparse sum of the contributions of {model.num_groups} learned groups of "
        "input features, each run through the frozen backbone alone.",
        "",
        *table,
        "",
        "## Backbone diagnostic",
        "",
        *_diagnosis_lines(model),
        "",
        "## Use",
        "",
        "```python",
        "import sopfast",
        "",
        'model = sopfast.SOP.from_pretrained("THIS_REPO_OR_DIRECTORY")  # backbone= if it lives elsewhere now',
        "out = model(**model.preprocess(inputs))  # images (PIL or paths) or texts, preprocessed as in training",
        "out.logits, out.group_masks, out.attributions",
        "```",
        "",
    ]
    return "\n".join(lines)
