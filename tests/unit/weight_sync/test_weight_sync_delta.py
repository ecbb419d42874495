"""Delta updates over shared storage: bit-exact after any chain, after a fallback, after a resume; bytes."""

from __future__ import annotations

import copy
import shutil
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from tied_model import tiny_tied_qwen2

from asyncrl.models.loading import state_dict_for_sync
from asyncrl.testing.allocated import AllocatedBytes
from asyncrl.weight_sync import delta
from asyncrl.weight_sync.delta import DeltaSync, encode_delta
from asyncrl.weight_sync.protocol import WeightSyncError
from asyncrl.weight_sync.receiver import InPlaceReceiver


def train_step(model: torch.nn.Module, seed: int, lr: float, share: float = 1.0) -> None:
    """A stand-in optimizer step: ``share`` of the weights move by about ``lr`` relative to their size."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=generator)
            mask = torch.rand(param.shape, generator=generator) < share
            param.add_((noise * mask * lr * param.float().abs().mean()).to(param.dtype))


def assert_bit_equal(engine: torch.nn.Module, trainer: torch.nn.Module) -> None:
    for (name, got), want in zip(engine.state_dict().items(), trainer.state_dict().values(), strict=True):
        width = {2: torch.int16, 4: torch.int32}[got.element_size()]
        assert torch.equal(got.view(width), want.view(width)), name


def models(dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    trainer = tiny_tied_qwen2().to(dtype)
    return trainer, copy.deepcopy(trainer)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_chain_of_deltas_is_bit_exact_including_skipped_versions(tmp_path, dtype):
    trainer, engine = models(dtype)
    sync, receiver = DeltaSync(tmp_path, full_every=100), InPlaceReceiver()
    serving = 0
    for version in range(1, 9):
        train_step(trainer, version, lr=1e-3)
        update = sync.publish(version, state_dict_for_sync(trainer))
        if version in (1, 2, 5, 8):  # the engine misses 3-4 and 6-7: chains of 1 to 3 deltas
            receiver.prefetch(update, serving)
            receiver.apply(engine, update, serving)
            serving = version
            assert_bit_equal(engine, trainer)
    assert {p.name for p in tmp_path.iterdir()} == {"full-00000001"} | {f"delta-{v:08d}" for v in range(2, 9)}


def test_small_bf16_steps_ship_a_small_share_of_the_model(tmp_path):
    """bf16 at an RL-sized step: most weights do not change, the delta is sparse; a frozen tensor costs 0."""
    trainer, _ = models(torch.bfloat16)
    sync = DeltaSync(tmp_path, full_every=100)
    full = sync.publish(1, state_dict_for_sync(trainer)).nbytes
    train_step(trainer, 1, lr=1e-3, share=0.05)
    delta = sync.publish(2, state_dict_for_sync(trainer)).nbytes
    assert delta < 0.2 * full
    assert encode_delta(torch.ones(4).view(torch.int32).numpy(), torch.ones(4).view(torch.int32).numpy()) == (
        "same",
        b"",
    )


def test_a_missing_link_falls_back_to_the_newest_snapshot_and_its_chain(tmp_path):
    trainer, engine = models(torch.float32)
    sync, receiver = DeltaSync(tmp_path, full_every=3, keep_full=5), InPlaceReceiver()
    receiver.apply(engine, sync.publish(1, state_dict_for_sync(trainer)), 0)
    for version in range(2, 6):
        train_step(trainer, version, lr=1e-3)
        update = sync.publish(version, state_dict_for_sync(trainer))
    shutil.rmtree(tmp_path / "delta-00000002")  # engine at v1 cannot chain to v5
    chain = sync.fetch(update, 1)
    assert chain.uses_full and [(s.kind, s.version) for s in chain.steps] == [
        ("full", 3),
        ("delta", 4),
        ("delta", 5),
    ]
    receiver.apply(engine, update, 1)
    assert_bit_equal(engine, trainer)


@pytest.mark.parametrize("damage", ["flip a payload byte", "truncate the payload"])
def test_a_corrupt_delta_falls_back_to_the_snapshot_and_ends_exact(tmp_path, damage):
    trainer, engine = models(torch.float32)
    sync, receiver = DeltaSync(tmp_path, full_every=2), InPlaceReceiver()
    receiver.apply(engine, sync.publish(1, state_dict_for_sync(trainer)), 0)
    train_step(trainer, 2, lr=1e-3)
    update = sync.publish(2, state_dict_for_sync(trainer))  # a delta and a full snapshot
    data = tmp_path / "delta-00000002" / "data.bin"
    raw = bytearray(data.read_bytes())
    if damage == "flip a payload byte":
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    else:
        data.write_bytes(bytes(raw[: len(raw) // 3]))
    receiver.apply(engine, update, 1)
    assert_bit_equal(engine, trainer)


def test_old_versions_are_collected_and_an_engine_behind_them_still_arrives(tmp_path):
    trainer, engine = models(torch.float32)
    sync, receiver = DeltaSync(tmp_path, full_every=3, keep_full=2), InPlaceReceiver()
    for version in range(1, 11):
        train_step(trainer, version, lr=1e-3)
        update = sync.publish(version, state_dict_for_sync(trainer))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["delta-00000006", "delta-00000007", "delta-00000008", "delta-00000009"] + [
        "delta-00000010",
        "full-00000006",
        "full-00000009",
    ]
    receiver.apply(engine, update, 0)  # from the base model: the chain is long gone
    assert_bit_equal(engine, trainer)


def test_a_resumed_writer_drops_the_dead_runs_future_and_stays_exact(tmp_path):
    """A run that died at v6 resumes from its v4 checkpoint: v5-v6 on disk are another history."""
    trainer, _ = models(torch.float32)
    first = DeltaSync(tmp_path, full_every=100)
    for version in range(1, 7):
        train_step(trainer, version, lr=1e-3)
        if version == 4:
            checkpoint = copy.deepcopy(trainer)
        first.publish(version, state_dict_for_sync(trainer))
    trainer, engine = checkpoint, copy.deepcopy(checkpoint)  # fresh engines on the resumed weights
    resumed, receiver = DeltaSync(tmp_path, full_every=100), InPlaceReceiver()
    receiver.apply(engine, resumed.publish(4, state_dict_for_sync(trainer)), 0)
    assert not (tmp_path / "delta-00000005").exists() and (tmp_path / "full-00000004").exists()
    for version in (5, 6):
        train_step(trainer, 100 + version, lr=1e-3)  # a different history than the dead run's
        update = resumed.publish(version, state_dict_for_sync(trainer))
    receiver.apply(engine, update, 4)
    assert_bit_equal(engine, trainer)


def test_a_prefetched_chain_needs_no_read_when_applied(tmp_path):
    """Fetch before the pause: once fetched, the files may vanish and the apply still lands."""
    trainer, engine = models(torch.bfloat16)
    sync, receiver = DeltaSync(tmp_path, full_every=100), InPlaceReceiver()
    receiver.apply(engine, sync.publish(1, state_dict_for_sync(trainer)), 0)
    train_step(trainer, 2, lr=1e-3)
    update = sync.publish(2, state_dict_for_sync(trainer))
    receiver.prefetch(update, 1)
    shutil.rmtree(tmp_path)
    receiver.apply(engine, update, 1)
    assert_bit_equal(engine, trainer)


def test_an_engine_of_another_dtype_is_refused_by_name(tmp_path):
    trainer, engine = models(torch.float32)
    sync = DeltaSync(tmp_path)
    update = sync.publish(1, state_dict_for_sync(trainer))
    with pytest.raises(ValueError, match="same dtype on both sides"):
        InPlaceReceiver().apply(engine.to(torch.bfloat16), update, 0)


def test_the_builtin_engine_patches_in_place_through_update_weights(tmp_path: Path):
    from asyncrl.config.engine import EngineConfig
    from asyncrl.engine import make_engine
    from asyncrl.models.loading import load_model_and_tokenizer

    trainer, tokenizer = load_model_and_tokenizer("", "float32", "cpu")
    engine = make_engine(copy.deepcopy(trainer), tokenizer, EngineConfig(), 1).core
    sync = DeltaSync(tmp_path)
    for version in (1, 2, 3):
        train_step(trainer, version, lr=1e-4)
        update = sync.publish(version, state_dict_for_sync(trainer))
        engine.prefetch_weights(update)
        engine.update_weights(update, version)
        assert engine.version == version
        assert_bit_equal(engine.model, trainer)


def _moved_state(seed: int) -> dict[str, torch.Tensor]:
    """An embedding-sized float32 matrix and a norm, as a model whose largest tensor dominates."""
    generator = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(1 << 20, generator=generator) * 0.02, "norm": torch.ones(1024)}


def _step_every_weight(state: dict[str, torch.Tensor], seed: int) -> None:
    """Every weight moves by ±1e-5 (the weight-sync benchmark's step): in float32 nearly every word changes."""
    generator = torch.Generator().manual_seed(seed)
    for tensor in state.values():
        sign = torch.randint(0, 2, tensor.shape, generator=generator, dtype=torch.int8) * 2 - 1
        tensor.add_(sign, alpha=1e-5)


def test_a_delta_publish_holds_its_new_copy_and_the_payload_not_copies_of_each_tensor(tmp_path, monkeypatch):
    """Beyond the previous version it diffs against, a delta publish must hold the new packed copy and the
    encoded payload of the tensor being written; the XOR, its changed positions and its byte-shuffled copy
    were each as large as the tensor or larger (4.5x the largest tensor, 2 GiB at Qwen2-0.5B in float32).
    Held bytes are counted by tracemalloc, which sees every numpy buffer and bytes object allocated: a count
    of bytes alive, not a sampled RSS."""
    monkeypatch.setattr(delta, "CHUNK_WORDS", 1 << 14)
    state = _moved_state(0)
    writer = delta.DeltaWriter(tmp_path, full_every=10**9)
    writer.write(0, [state])
    _step_every_weight(state, 1)
    tracemalloc.start()
    try:
        writer.write(1, [state])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    model = sum(t.numel() * t.element_size() for t in state.values())
    largest_payload = writer.last_written["delta"]
    assert largest_payload < 0.7 * model  # the xor encoding: the low mantissa bytes do not compress
    assert peak <= model + 1.25 * largest_payload + (1 << 20), (peak, model, largest_payload)


@pytest.mark.parametrize("share", [0.0, 0.01, 1.0])  # same, sparse, xor
@pytest.mark.parametrize("decode_chunk", [7, 5, 1 << 20])  # the encoder's chunks, others, one
@pytest.mark.parametrize("where", ["host view", "device path on CPU"])
def test_an_encoding_made_chunk_by_chunk_decodes_to_the_new_words(monkeypatch, share, decode_chunk, where):
    """Decoding reads the stream in its own chunks, whatever chunks encoded it; the path for tensors on an
    accelerator (``_DeviceWords``, never run on CUDA here) runs on CPU tensors with the same edits."""
    monkeypatch.setattr(delta, "CHUNK_WORDS", 7)  # chunk edges inside runs of changed words
    generator = torch.Generator().manual_seed(3)
    old = torch.randn(1000, generator=generator)
    mask = torch.rand(1000, generator=generator) < share
    new = torch.where(mask, old + 1e-3, old)
    encoding, payload = delta.encode_delta(old.view(torch.int32).numpy(), new.view(torch.int32).numpy())
    assert encoding == {0.0: "same", 0.01: "sparse", 1.0: "xor"}[share]
    engine = old.clone().view(torch.int32)
    words = delta._HostWords(engine.numpy()) if where == "host view" else delta._DeviceWords(engine)
    monkeypatch.setattr(delta, "CHUNK_WORDS", decode_chunk)
    delta._decode_into(encoding, payload, words)
    assert torch.equal(engine, new.view(torch.int32))
    assert words.crc32() == zlib.crc32(new.view(torch.int32).numpy())


def _engine_at_v0_and_chain(tmp_path: Path, share: float, snapshot: bool):
    """An engine at v0 of ``_moved_state`` and the fetched chain to v1 (``share`` of the weights moved):
    the v1 snapshot when ``snapshot``, else the v1 delta. Fetched before any counting: a chain's payload
    is read into memory by design (fetched before the engine pauses); what the apply holds beyond it is
    counted."""
    state = _moved_state(0)
    engine = {name: tensor.clone() for name, tensor in state.items()}
    sync = DeltaSync(tmp_path, full_every=1 if snapshot else 10**9)
    sync.publish(0, state)
    generator = torch.Generator().manual_seed(1)
    for tensor in state.values():
        tensor.add_((torch.rand(tensor.shape, generator=generator) < share) * 1e-3)
    update = sync.publish(1, state)
    chain = sync.fetch(update, None if snapshot else 0)
    return engine, state, chain


@pytest.mark.parametrize(
    ("share", "snapshot", "encoding"),
    [(1.0, False, "xor"), (0.2, False, "sparse"), (1.0, True, "raw")],
)
def test_an_apply_holds_a_few_chunks_beyond_the_engines_weights_not_copies_of_a_tensor(
    tmp_path, monkeypatch, share, snapshot, encoding
):
    """The engine patches its tensors in place and holds beside them a few chunks, whatever the tensor's
    size: on main the payload sliced out of the fetched bytes, the whole decompressed stream and its
    un-shuffled copy (XOR), or the stream and its positions as int64 (sparse), held 3x or 2x the tensor
    (7.5 or 5 GB at an 8B model's 2.5 GB float32 embedding). Now: zlib's output blocks and the input it
    has not consumed, and a chunk's gaps, positions and words for sparse, about ten chunks at most. Held
    bytes are counted by tracemalloc (every numpy buffer, bytes object and zlib state; the engine's tensors
    exist before counting starts)."""
    monkeypatch.setattr(delta, "CHUNK_WORDS", 1 << 14)  # 64 KiB of float32 words; the tensor is 4 MiB
    engine, trainer, chain = _engine_at_v0_and_chain(tmp_path, share, snapshot)
    assert chain.steps[-1].segments[0].encoding == encoding
    tracemalloc.start()
    try:
        delta.apply_chain(chain, engine)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for name, tensor in trainer.items():
        assert torch.equal(engine[name].view(torch.int32), tensor.view(torch.int32)), name
    largest = engine["embed"].numel() * engine["embed"].element_size()
    chunk = delta.CHUNK_WORDS * 4
    assert peak <= 16 * chunk <= largest / 4, (encoding, peak, largest)


def _damaged(payload: bytes, damage: str) -> bytes:
    middle = len(payload) // 2
    return {
        "cut mid-tensor": payload[:middle],
        "cut to nothing": b"",
        "a byte flipped mid-stream": payload[:middle]
        + bytes([payload[middle] ^ 0xFF])
        + payload[middle + 1 :],
        "bytes after the stream": payload + bytes(8),
    }[damage]


@pytest.mark.parametrize("encoding", ["xor", "sparse"])
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("cut mid-tensor", "its payload is cut short"),
        ("cut to nothing", "its payload is cut short"),
        ("a byte flipped mid-stream", "its payload is corrupt"),
        ("bytes after the stream", "bytes after the end of its zlib stream"),
    ],
)
def test_a_damaged_delta_fails_by_name_saying_what_is_wrong(monkeypatch, encoding, damage, message):
    """Decoded a chunk at a time, a delta cut mid-tensor, cut to nothing, corrupt or followed by other bytes
    still fails as ``DeltaPayloadError`` (a ``DeltaChecksumError``: the apply falls back to a snapshot)."""
    monkeypatch.setattr(delta, "CHUNK_WORDS", 1 << 10)  # a cut lands many chunks into the tensor
    generator = torch.Generator().manual_seed(5)
    old = torch.randn(1 << 14, generator=generator)
    share = {"xor": 1.0, "sparse": 0.1}[encoding]
    new = torch.where(torch.rand(old.shape, generator=generator) < share, old + 1e-3, old)
    kind, payload = delta.encode_delta(old.view(torch.int32).numpy(), new.view(torch.int32).numpy())
    assert kind == encoding
    with pytest.raises(delta.DeltaPayloadError, match=message):
        delta._decode_into(
            kind, _damaged(bytes(payload), damage), delta._HostWords(old.view(torch.int32).numpy())
        )


@pytest.mark.parametrize("damage", ["cut mid-tensor", "cut to nothing", "bytes after the stream"])
def test_a_snapshot_of_the_wrong_length_fails_by_name(damage):
    """A snapshot has no stream to check (a flipped byte is the checksum's to find): its length is checked."""
    payload = _damaged(bytes(range(256)) * 16, damage)
    words = delta._HostWords(np.zeros(1024, dtype=np.int32))
    with pytest.raises(
        delta.DeltaPayloadError, match=rf"its snapshot has {len(payload)} bytes, the tensor 4096"
    ):
        delta._decode_into("raw", payload, words)


def test_an_apply_names_the_version_and_tensor_of_a_payload_cut_mid_tensor(tmp_path):
    """Through ``apply_chain`` (no fallback there): the error says which version and tensor, and why."""
    state = _moved_state(0)
    engine = {name: tensor.clone() for name, tensor in state.items()}
    sync = DeltaSync(tmp_path, full_every=10**9)
    sync.publish(0, state)
    _step_every_weight(state, 1)
    update = sync.publish(1, state)
    data = tmp_path / "delta-00000001" / "data.bin"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 3])  # inside the first tensor's stream
    with pytest.raises(delta.DeltaPayloadError, match=r"v1: tensor 'embed': its payload is cut short"):
        delta.apply_chain(sync.fetch(update, 0), engine)


def test_receive_rebuilds_one_tensor_at_a_time_bit_exact_through_a_chain(tmp_path):
    """An engine that cannot patch in place (vLLM) reads ``receive``; it rebuilt every tensor of the update
    before handing out the first, a whole model in host memory beside the engine's own. Now each tensor is
    built (snapshot, then each delta of the chain) when the reader reaches it, so a reader that drops each
    tensor holds one: torch's allocator peak (``AllocatedBytes``; the chain's payloads are numpy's and
    bytes, fetched before by design) stays within the largest tensor, the model is several times it."""
    trainer, _ = models(torch.float32)
    sync = DeltaSync(tmp_path, full_every=100)
    for version in (1, 2, 3):
        train_step(trainer, version, lr=1e-3)
        update = sync.publish(version, state_dict_for_sync(trainer))
    want = state_dict_for_sync(trainer)
    assert [step.kind for step in delta.fetch_chain(update.handle, None).steps] == ["full", "delta", "delta"]
    sizes = {id(t): t.numel() * t.element_size() for t in trainer.parameters()}.values()
    model, largest = sum(sizes), max(sizes)
    assert model > 3 * largest
    received, tied = set(), {}
    with AllocatedBytes() as trace:
        for name, tensor in sync.receive(update):
            assert torch.equal(tensor.view(torch.int32), want[name].view(torch.int32)), name
            received.add(name)
            tied[name] = id(tensor)
            del tensor
    assert received == set(want)
    assert tied["lm_head.weight"] == tied["model.embed_tokens.weight"], "a tied matrix is rebuilt once"
    assert trace.peak <= largest, (trace.peak, largest, model)


def test_receive_refuses_a_delta_whose_tensors_are_not_its_snapshots_by_name(tmp_path):
    state = _moved_state(0)
    sync = DeltaSync(tmp_path, full_every=100)
    sync.publish(1, state)
    update = sync.publish(2, state)
    index = tmp_path / "delta-00000002" / "index.json"
    index.write_text(index.read_text().replace('"norm"', '"model.norm"'))
    with pytest.raises(WeightSyncError, match=r"v2: tensor 'model.norm' is in only one of the delta"):
        sync.receive(update)  # before any tensor is handed out
