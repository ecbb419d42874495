"""An unset ``engine.max_model_len`` becomes the run's own bound, not the model's whole window."""

from __future__ import annotations

from asyncrl.app.context_length import with_max_model_len
from asyncrl.config.run import load_run_config
from asyncrl.data.base import prompt_token_ids
from asyncrl.data.registry import make_task
from asyncrl.engine import make_engine
from asyncrl.models.loading import load_model_and_tokenizer

RLVR = ("task.type=copy", "task.num_train=200", "task.num_eval=50", "rollout.max_new_tokens=32")


def test_an_rlvr_run_gets_its_longest_prompt_plus_max_new_tokens():
    config, bound = with_max_model_len(load_run_config(None, RLVR))
    model, tokenizer = load_model_and_tokenizer("")
    task = make_task(config.task)
    longest = max(
        len(prompt_token_ids(s, tokenizer)) for split in ("train", "eval") for s in task.split(split)
    )
    assert bound is not None and config.engine.max_model_len == bound.tokens == longest + 32
    assert longest < bound.tokens < model.config.max_position_embeddings  # the window it replaces
    engine = make_engine(model, tokenizer, config.engine)
    try:
        assert engine.core.max_model_len == bound.tokens  # what the KV pool is sized by
    finally:
        engine.shutdown()


def test_a_set_value_an_external_producer_and_vllm_keep_what_they_have():
    for overrides in (
        (*RLVR, "engine.max_model_len=100"),
        ("producer=external",),
        (*RLVR, "engine.backend=vllm"),
    ):
        config = load_run_config(None, overrides)
        assert with_max_model_len(config) == (config, None), overrides


def test_an_agentic_run_gets_its_context_bound_and_one_past_the_window_keeps_the_window():
    agentic = ("producer=agentic", "env.type=copy_chain")
    config, bound = with_max_model_len(
        load_run_config(None, (*agentic, "env_manager.max_context_tokens=512"))
    )
    assert bound is not None and config.engine.max_model_len == 512
    wide = load_run_config(None, (*agentic, "env_manager.max_context_tokens=4096"))  # the window is 2048
    assert with_max_model_len(wide) == (wide, None)
