"""``asyncrl generate`` end to end: a tiny model saved to disk, loaded the HF way, served by the engine."""

from __future__ import annotations

import json

import pytest
import torch

from asyncrl.cli.main import main
from asyncrl.models.corpus import sample_texts
from asyncrl.models.loading import load_model_and_tokenizer, save_tiny
from asyncrl.models.tiny import build_tiny


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    model, tokenizer = build_tiny(sample_texts(seed=0), vocab_size=300, hidden_size=64, num_layers=2)
    return str(save_tiny(model, tokenizer, tmp_path_factory.mktemp("tiny")))


def test_generate_prints_greedy_completions_in_prompt_order(model_dir, capsys):
    prompts = ["12 + 7 =", "count: 1 2 3"]
    argv = ["generate", model_dir, "--temperature", "0", "--max-new-tokens", "8", "--json", "--device", "cpu"]
    assert main([*argv, *(a for p in prompts for a in ("--prompt", p))]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    model, tokenizer = load_model_and_tokenizer(model_dir, device="cpu")
    for prompt, record in zip(prompts, records, strict=True):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=8, do_sample=False)
        expected = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert record["prompt"] == prompt and record["completion"] == expected


def test_generate_rejects_bad_sampling_values(model_dir, capsys):
    assert main(["generate", model_dir, "--prompt", "hi", "--top-p", "0"]) == 2
    assert "request prompt-0: top_p must be in (0, 1]" in capsys.readouterr().err
