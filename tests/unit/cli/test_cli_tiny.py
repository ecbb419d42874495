"""``asyncrl tiny build`` writes a directory that loads through from_pretrained / AutoTokenizer."""

from __future__ import annotations

import json

from asyncrl.cli.main import main
from asyncrl.models.loading import load_model_and_tokenizer


def test_tiny_build_writes_a_loadable_model(tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("count 1 to 3: 1 2 3\nreverse a b c: c b a\n\nsum 1 2: 1 3 = 3\n" * 20)
    out_dir = tmp_path / "tiny"
    argv = ["tiny", "build", str(out_dir), "--hidden", "32", "--heads", "2", "--layers", "1",
            "--vocab", "300", "--texts", str(texts), "--untied"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["out_dir"] == str(out_dir) and summary["model_type"] == "qwen2"
    assert summary["tie_word_embeddings"] is False
    model, tokenizer = load_model_and_tokenizer(str(out_dir), device="cpu")
    assert model.config.vocab_size == len(tokenizer) == summary["vocab_size"]
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (32, 1)


def test_tiny_build_rejects_an_empty_texts_file(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("\n\n")
    assert main(["tiny", "build", str(tmp_path / "out"), "--texts", str(tmp_path / "empty.txt")]) == 2
    assert "no non-empty lines to train a tokenizer on" in capsys.readouterr().err
