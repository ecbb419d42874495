"""``asyncrl eval`` scores the shipped checkpoint through the real engine and prints the numbers as JSON."""

from __future__ import annotations

import json

from asyncrl.cli.main import main


def test_eval_scores_the_shipped_model(capsys) -> None:
    status = main(
        ["eval", "controller.eval_prompts=4", "rollout.max_new_tokens=32", "engine.max_model_len=64"]
    )
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    assert result["eval/num_prompts"] == 4.0
    assert 0.0 <= result["eval/reward_mean"] <= 1.0
    assert result["eval/failed"] == 0.0


def test_eval_rejects_a_bad_key_in_one_line(capsys) -> None:
    assert main(["eval", "controler.eval_prompts=4"]) == 2
    assert "controller" in capsys.readouterr().err


def test_eval_of_an_agentic_config_plays_held_out_episodes(capsys) -> None:
    status = main(["eval", "asyncrl/examples/agentic.yaml", "controller.eval_prompts=3"])
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    assert result["eval/num_prompts"] == 3.0
    assert result["eval/turns_mean"] >= 1.0
    assert 0.0 <= result["eval/reward_mean"] <= 1.0
