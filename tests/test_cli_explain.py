"""The command line (help, config files, clear errors) and the explanation pictures."""

from __future__ import annotations

import json

import pytest
import torch

import sopfast
from sopfast.cli.app import CLIError, build_parser, main
from sopfast.model.pictures import distinct_used_groups, explain_image, explain_text, used_groups
from sopfast.testing import make_bert, make_hf_vit, text_batch

SUBCOMMANDS = ("demo", "train", "evaluate", "explain", "bench", "theory")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: sopfast " + command in capsys.readouterr().out


def test_unknown_subcommand_is_an_error(capsys):
    assert main(["fly"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and err.count("\n") == 1


def test_missing_backbone_directory(tmp_path, capsys):
    code = main(["evaluate", "--backbone", str(tmp_path / "nope"), "--checkpoint", str(tmp_path)])
    assert code == 2
    assert "nope' not found: give a Hugging Face directory" in capsys.readouterr().err


def test_missing_config_file(tmp_path, capsys):
    code = main(["theory", "--config", str(tmp_path / "missing.yaml")])
    assert code == 2
    assert "--config file not found" in capsys.readouterr().err


def test_config_file_with_unknown_key(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"max_d": 4, "colour": "red"}))
    assert main(["theory", "--config", str(cfg)]) == 2
    assert "unknown option(s) ['colour']" in capsys.readouterr().err


def test_config_file_supplies_defaults_and_flags_win(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max-d: 5\nkind: monomial-deletion\nout: " + str(tmp_path / "t.png") + "\n")
    assert main(["theory", "--config", str(cfg), "--max-d", "4", "--verify-max-d", "4"]) == 0
    out = capsys.readouterr().out
    assert "\n 4 " in out or " 4 " in out
    assert (tmp_path / "t.png").exists()


def test_parser_rejects_bad_choice():
    with pytest.raises(CLIError, match="invalid choice: 'gpt'"):
        build_parser().parse_args(["bench", "--model", "gpt"])


def _is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_explain_image_draws_used_groups(tmp_path):
    import matplotlib.image

    model = sopfast.SOP(make_hf_vit(), num_groups=6, tau=0.25).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        out = model(x)
    path = tmp_path / "pic.png"
    panels = explain_image(x[0], out, 0, (4, 4), str(path), class_names=["a", "b", "c"], label=1, max_groups=6)
    used = used_groups(out, 0, int(out.logits[0].argmax()))
    assert panels == 2 + len(distinct_used_groups(out, 0, int(out.logits[0].argmax())))
    assert _is_png(path) and matplotlib.image.imread(str(path)).shape[2] in (3, 4)
    weights = sum(w for _, w in used)
    assert weights == pytest.approx(float(out.logits[0].max()), abs=1e-5)


def test_explain_text_highlights_group_tokens(tmp_path):
    model = sopfast.SOP(make_bert(), num_groups=3, tau=0.25).eval()
    ids, mask, types = text_batch()
    with torch.no_grad():
        out = model(ids[:1], mask[:1], types[:1])
    tokens = [f"tok{i}" for i in range(ids.shape[1])]
    path = tmp_path / "t.html"
    spans = explain_text(tokens, out, 0, str(path))
    pred = int(out.logits[0].argmax())
    shown = distinct_used_groups(out, 0, pred)  # groups with the same tokens drawn once
    assert shown and sum(len(d.groups) for d in shown) <= len(used_groups(out, 0, pred))
    expected = sum(int(out.group_masks[0, d.first].sum()) for d in shown)
    page = path.read_text()
    assert spans == expected == page.count('class="sop-group"')
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert page.count("<p><b>group") == len(shown)
