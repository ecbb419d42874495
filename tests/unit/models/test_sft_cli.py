"""``asyncrl sft`` end to end on a minute budget: checkpoint, README with the command, loadable output."""

from asyncrl.cli.main import main
from asyncrl.models.loading import load_model_and_tokenizer


def test_sft_command_writes_a_loadable_checkpoint_and_readme(tmp_path, capsys):
    out = tmp_path / "tiny"
    args = [
        "sft",
        f"output_dir={out}",
        "max_steps=3",
        "hidden_size=32",
        "num_layers=1",
        "num_heads=2",
        "batch_size=4",
        "warmup_steps=1",
        "task.num_train=40",
        "task.num_eval=4",
        "eval_prompts=2",
        "eval_samples_per_prompt=2",
        "max_new_tokens=4",
    ]
    assert main(args) == 0
    assert f"checkpoint written to {out}" in capsys.readouterr().out
    readme = (out / "README.md").read_text()
    assert "asyncrl sft " + " ".join(args[1:]) in readme
    assert "pass@2" in readme and "steps: 3" in readme
    model, tokenizer = load_model_and_tokenizer(str(out), device="cpu")
    assert model.config.hidden_size == 32 and len(tokenizer) <= 384


def test_sft_builds_a_qwen3_shape(tmp_path):
    """architecture=qwen3 with grouped-query attention, its own MLP width and head_dim: the shape of the
    long-tail benchmark's warm start (bench/workloads.py), loadable by the engine's model family."""
    out = tmp_path / "tiny-qwen3"
    args = ["sft", f"output_dir={out}", "max_steps=1", "batch_size=2", "task.num_train=8", "eval_prompts=0"]
    shape = ["architecture=qwen3", "hidden_size=32", "num_layers=1", "num_heads=4", "num_kv_heads=2"]
    assert main([*args, *shape, "intermediate_size=48", "head_dim=16", "max_position_embeddings=300"]) == 0
    model, _ = load_model_and_tokenizer(str(out), device="cpu")
    config = model.config
    assert config.model_type == "qwen3" and type(model).__name__ == "Qwen3ForCausalLM"
    assert (config.num_key_value_heads, config.intermediate_size, config.head_dim) == (2, 48, 16)
    assert config.max_position_embeddings == 300 and config.tie_word_embeddings
