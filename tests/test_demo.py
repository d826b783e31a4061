"""`make demo` finds the fault it plants."""

from __future__ import annotations

from precguard.demo import main


def test_demo_localizes_planted_fault(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--layer", "1"]) == 0
    out = capsys.readouterr().out
    assert "model.layers.1.post_attention_layernorm" in out
    assert "localized" in out
    assert (tmp_path / "golden" / "manifest.json").is_file()
