"""GPU check of LoRA: peft on CUDA in the trainer, FSDP2 + LoRA over NCCL, adapter merging in a CUDA engine.

Needs only torch with CUDA, transformers, safetensors, tokenizers, pyyaml and peft (asyncrl installed with
``--no-deps``); run it from the repository root on a lent GPU machine:

    python scripts/gpu_lora_check.py

Three checks, each printed with its measured error and bound; the exit status is non-zero if one fails:
1. a LoRA train step over NCCL (FSDP2, one rank per GPU, up to 4) against one process on GPU 0: the largest
   relative adapter-gradient error (on one GPU that checks NCCL's group, FSDP2's wrapping of peft's layers with
   frozen base weights beside trainable adapters, and DTensor adapters, not sharding across devices);
2. the trainer's log-probs through the adapters on CUDA against a plain forward of peft's own model on the same
   weights;
3. a CUDA engine after an adapter-only update (kind ``lora``): its weights against peft's merge on the same
   device (bit for bit: the same arithmetic), and its sampled tokens against an engine built on the merged model.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
from gpu_fsdp_check import check_groups, gathered, relative_error  # this script's directory

from asyncrl.config.algorithm import AdvantageConfig, LossConfig
from asyncrl.config.engine import EngineConfig
from asyncrl.config.trainer import LoraConfig, TrainerConfig
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.testing.gradients import stepped_gradients
from asyncrl.testing.models import tiny_qwen2
from asyncrl.testing.ranks import run_ranks
from asyncrl.trainer.batching import build_train_batch
from asyncrl.trainer.distributed.parallel import FullyShardedParallel, Parallelism, SingleProcess
from asyncrl.trainer.trainer import Trainer
from asyncrl.types import Request, SamplingParams
from asyncrl.weight_sync import InProcessSync

LORA = LoraConfig(rank=8, alpha=16.0)
GRADIENT_BOUND = 1e-4
"""TF32 and NCCL's reduction order, as scripts/gpu_fsdp_check.py allows."""
LOGPROB_BOUND = 1e-4


def lora_trainer(parallel: Parallelism, device: str) -> Trainer:
    config = TrainerConfig(lr=1e-3, lora=LORA)
    return Trainer(
        tiny_qwen2().to(device),
        config,
        LossConfig(name="ppo"),
        AdvantageConfig(name="grpo"),
        parallel=parallel,
    )


def adapter_gradients(parallel: Parallelism, device: str) -> dict[str, torch.Tensor] | None:
    """Two LoRA steps (the second has non-zero B, so A gets gradients too); the second step's adapter gradients."""
    trainer = lora_trainer(parallel, device)
    trainer.train_step(check_groups(), policy_version=0)
    with stepped_gradients(trainer, gathered) as stepped:  # read on every rank: gathering is a collective
        trainer.train_step(check_groups(), policy_version=1)
    return stepped[-1] if parallel.rank == 0 else None


def sharded_gradients() -> dict[str, torch.Tensor] | None:
    return adapter_gradients(FullyShardedParallel("cuda"), f"cuda:{torch.cuda.current_device()}")


def check_fsdp() -> bool:
    world = min(torch.cuda.device_count(), 4)
    single = adapter_gradients(SingleProcess(), "cuda:0")
    sharded = run_ranks(sharded_gradients, world, device="cuda")[0]
    error = relative_error(single, sharded)
    print(
        f"1. LoRA step, FSDP2 over NCCL ({world} rank(s)) vs one process: relative gradient error {error:.2e} "
        f"(bound {GRADIENT_BOUND:.0e})"
    )
    return error <= GRADIENT_BOUND


def check_logprobs(trainer: Trainer) -> bool:
    batch = build_train_batch(check_groups(), [0.0] * 8).to("cuda:0")
    with torch.no_grad():
        got = trainer._forward(trainer.policy, batch).logprobs
        logits = trainer.peft_model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).logits.float()
    taken = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    want = torch.cat([torch.zeros_like(taken[:, :1]), taken], dim=1) * batch.loss_mask
    error = float((got * batch.loss_mask - want).abs().max())
    print(
        f"2. trainer log-probs through the adapters vs peft's forward, CUDA: max error {error:.2e} "
        f"(bound {LOGPROB_BOUND:.0e})"
    )
    return error <= LOGPROB_BOUND


def check_engine(trainer: Trainer) -> bool:
    update = InProcessSync().publish(1, trainer.sync_tensors(), adapter=trainer.adapter)
    config = EngineConfig(max_running_requests=4, max_kv_tokens=1024, max_model_len=64, dtype="float32")
    served = LLMEngine(tiny_qwen2().to("cuda:0"), None, config)
    served.update_weights(update, 1)
    merged = copy.deepcopy(trainer.peft_model).merge_and_unload()
    weights_equal = all(torch.equal(served.model.state_dict()[n], t) for n, t in merged.state_dict().items())
    reference = LLMEngine(merged, None, config)
    tokens = [generate(engine) for engine in (served, reference)]
    print(
        f"3. CUDA engine after an adapter update: weights equal peft's merge: {weights_equal}; "
        f"sampled tokens equal the merged model's: {tokens[0] == tokens[1]}"
    )
    return weights_equal and tokens[0] == tokens[1]


def generate(engine: LLMEngine) -> dict[str, list[int]]:
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3, ignore_eos=True)
    for index, prompt in enumerate([[3, 17, 9, 41], [5, 5, 8], [60, 2, 33, 12, 7, 1]]):
        engine.add_request(Request(request_id=f"r{index}", prompt_token_ids=prompt, sampling=sampling))
    finished = {}
    while engine.has_work():
        finished.update({g.request_id: list(g.token_ids) for g in engine.step()})
    return finished


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: this check is for a lent GPU machine")
    ok = check_fsdp()
    trainer = lora_trainer(SingleProcess(), "cuda:0")
    trainer.train_step(check_groups(), policy_version=0)  # non-zero B
    ok &= check_logprobs(trainer)
    ok &= check_engine(trainer)
    print("LoRA GPU check:", "passed" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
