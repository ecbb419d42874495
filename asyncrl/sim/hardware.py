"""Accelerator profiles for the cost model: ceilings from a spec sheet or a measurement, and efficiency factors
measured on a real device (``asyncrl calibrate``), from which ``asyncrl.sim.derive`` computes every engine and
trainer cost.

Key decision: one measurement, every profile. Efficiency factors (how much of its ceiling a decode step, a
prefill or a training step reaches) come from one calibration probe, stored relative to that device's *spec*
ceilings, and every spec profile applies them to its own spec ceilings. So an H800 profile predicts with the
efficiencies our kernels reached on an H200, scaled to the H800's peak and bandwidth — an assumption, stated,
instead of a guess per GPU. A profile fitted from a probe replaces spec ceilings by measured ones.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from asyncrl.sim.calibrate import fit_line
from asyncrl.sim.model_shape import ModelShape

GB = 1e9
TB = 1e12


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Fractions of a profile's ceilings its work reaches, and the per-layer cost of a decode step's small
    kernels. Measured by ``asyncrl calibrate`` (``profile_from_probe``), never fitted to a run predicted."""

    decode_weights: float = 0.5
    """Fraction of ``hbm_bandwidth`` a decode step's weight reads reach (skinny GEMMs at small batch)."""
    decode_kv: float = 0.9
    """Fraction of ``hbm_bandwidth`` a decode step's attention reaches reading the KV cache (large batches)."""
    decode_compute: float = 0.45
    """Fraction of ``peak_flops`` a decode step's GEMMs reach once compute-bound (a few hundred rows)."""
    decode_overhead_per_layer_s: float = 1.4e-4
    """Fixed time per layer per decode step: norms, rotary, residuals, launches (CUDA-graphed, unfused)."""
    prefill: float = 0.5
    """Fraction of ``peak_flops`` a prefill reaches (model FLOPs utilisation, attention counted)."""
    train: float = 0.3
    """Fraction of ``peak_flops`` a training step reaches: forward, backward and the optimizer step."""
    logprob: float = 0.35
    """Fraction of ``peak_flops`` a no-grad log-prob pass reaches (old or reference log-probs)."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "decode_overhead_per_layer_s":
                if value < 0:
                    raise ValueError(f"efficiency.{item.name} must be >= 0, got {value}")
            elif not 0 < value <= 1.5:  # a little above 1: a ceiling measured below the true one
                raise ValueError(f"efficiency.{item.name} must be in (0, 1.5], got {value}")


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """One accelerator model and the links around it. ``source`` says where the ceilings come from."""

    name: str
    source: str = "spec"
    """``spec`` (a datasheet) or what was measured (a probe file)."""
    peak_flops: float
    """Dense bf16 matrix FLOP/s (no sparsity)."""
    hbm_bandwidth: float
    """Device memory bandwidth, bytes/s."""
    hbm_bytes: float
    """Device memory, bytes."""
    gpus_per_node: int = 8
    intra_node_bandwidth: float
    """Per-GPU, one direction, bytes/s (NVLink): tensor-parallel all-reduces, colocated weight sync."""
    intra_node_latency_s: float = 5e-6
    """One hop of a ring all-reduce inside a node."""
    inter_node_bandwidth: float
    """Per-GPU network bandwidth between nodes, one direction, bytes/s: weight sync from trainer to engines."""
    inter_node_latency_s: float = 2e-5
    host_link_bandwidth: float = 25 * GB
    """Pinned host <-> device copies, bytes/s (offloading a colocated trainer)."""
    host_memory_bytes: float = 2 * TB
    """One node's host RAM, bytes: where staged weight updates, a colocated trainer's offloaded state and Ray's
    object store live (``asyncrl doctor --hardware``'s host line). 2 TB is a DGX node's (H100, H200, A100
    640 GB); a node with less is planned with ``--host-gb`` or this key in a profile file."""
    efficiency: Efficiency = Efficiency()

    def __post_init__(self) -> None:
        for name in (
            "peak_flops",
            "hbm_bandwidth",
            "hbm_bytes",
            "intra_node_bandwidth",
            "inter_node_bandwidth",
            "host_memory_bytes",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"hardware {self.name!r}: {name} must be > 0, got {getattr(self, name)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _spec(
    name: str, tflops: float, tb_s: float, gb: float, nvlink_gb_s: float, net_gb_s: float, host_tb: float
) -> HardwareProfile:
    return HardwareProfile(
        name=name,
        peak_flops=tflops * TB,
        hbm_bandwidth=tb_s * TB,
        hbm_bytes=gb * GB,
        intra_node_bandwidth=nvlink_gb_s * GB,
        inter_node_bandwidth=net_gb_s * GB,
        host_memory_bytes=host_tb * TB,
    )


SPEC_SHEETS: dict[str, HardwareProfile] = {
    profile.name: profile
    for profile in (
        # name, dense bf16 TFLOP/s, HBM TB/s, HBM GB, NVLink GB/s one direction, network GB/s per GPU,
        # host RAM TB per 8-GPU node (DGX H100 / H200 / A100 640 GB: 2 TB; HGX H800 and H20 vary by vendor)
        _spec("h100", 989, 3.35, 80, 450, 50, 2),  # SXM5; 400 Gb/s NDR per GPU
        _spec("h200", 989, 4.8, 141, 450, 50, 2),
        _spec("h800", 989, 3.35, 80, 200, 50, 2),  # NVLink cut to 400 GB/s both ways; 8 x 400 Gb/s per node
        _spec("h20", 148, 4.0, 96, 450, 50, 2),
        _spec("a100", 312, 2.039, 80, 300, 25, 2),  # SXM4 80 GB; 200 Gb/s HDR per GPU
    )
}
"""Public datasheet ceilings (SXM parts), before any efficiency is applied."""

PROFILE_DIR = Path(__file__).with_name("profiles")
REFERENCE_MEASUREMENT = PROFILE_DIR / "h200-measured.json"
"""The measured profile whose efficiencies every spec profile applies (``asyncrl calibrate --fit``)."""


def spec_profile(name: str, reference: HardwareProfile | None = None) -> HardwareProfile:
    """The spec sheet ``name`` with the reference measurement's efficiencies, rescaled from the measured
    device's own ceilings to spec ceilings (so "fraction of the datasheet peak" carries over)."""
    if name not in SPEC_SHEETS:
        raise ValueError(f"hardware {name!r} is not a named profile ({', '.join(sorted(SPEC_SHEETS))})")
    reference = reference or read_profile(REFERENCE_MEASUREMENT)
    measured_sheet = SPEC_SHEETS[reference.name.split("-")[0]]
    flops = reference.peak_flops / measured_sheet.peak_flops
    bandwidth = reference.hbm_bandwidth / measured_sheet.hbm_bandwidth
    eff = reference.efficiency
    scaled = replace(
        eff,
        decode_weights=eff.decode_weights * bandwidth,
        decode_kv=eff.decode_kv * bandwidth,
        decode_compute=eff.decode_compute * flops,
        prefill=eff.prefill * flops,
        train=eff.train * flops,
        logprob=eff.logprob * flops,
    )
    source = f"spec; efficiencies measured on {reference.name} ({reference.source})"
    return replace(SPEC_SHEETS[name], source=source, efficiency=scaled)


def read_profile(path: str | Path) -> HardwareProfile:
    """A profile written by ``write_profile`` (JSON or YAML), or fitted from a calibration probe's JSON."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        from asyncrl.config.loader import parse_yaml

        data = parse_yaml(text, str(path))
    else:
        data = json.loads(text)
    if isinstance(data, dict) and data.get("kind") == "asyncrl.probe":
        return profile_from_probe(data, source=str(path))
    return profile_from_dict(data, str(path))


def profile_from_dict(data: Any, source: str) -> HardwareProfile:
    """A profile from a mapping of ``HardwareProfile`` fields (``efficiency`` a mapping too)."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a hardware profile must be a mapping, got {type(data).__name__}")
    known = {item.name for item in fields(HardwareProfile)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{source}: unknown hardware profile key(s) {unknown}; known: {sorted(known)}")
    values = dict(data)
    efficiency = values.pop("efficiency", {}) or {}
    eff_known = {item.name for item in fields(Efficiency)}
    if set(efficiency) - eff_known:
        raise ValueError(f"{source}: unknown efficiency key(s) {sorted(set(efficiency) - eff_known)}")
    try:
        return HardwareProfile(**values, efficiency=Efficiency(**efficiency))
    except TypeError as err:
        raise ValueError(f"{source}: {err}") from err


def write_profile(profile: HardwareProfile, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    return path


def resolve_profile(spec: str) -> HardwareProfile:
    """A named spec profile (``h100``, ``h200``, ``h800``, ``h20``, ``a100``), a measured one by its file name
    under ``asyncrl/sim/profiles`` (``h200-measured``), or a path to a profile or probe file."""
    if spec.lower() in SPEC_SHEETS:
        return spec_profile(spec.lower())
    packaged = PROFILE_DIR / f"{spec}.json"
    if packaged.is_file():
        return read_profile(packaged)
    if Path(spec).is_file():
        return read_profile(spec)
    named = sorted([*SPEC_SHEETS, *(p.stem for p in PROFILE_DIR.glob("*.json"))])
    raise ValueError(f"hardware {spec!r} is neither a named profile ({', '.join(named)}) nor a profile file")


# ---- fitting a probe --------------------------------------------------------------------------------------

DECODE_BASIS = (
    "decode fitted to the probe's static CUDA-graph loop: for the built-in engine a static-loop bound, "
    "not its measured step"
)
"""What a fitted profile's decode costs stand for. The fit reads ``decode_static`` points only: no probe so
far has timed the engine's own captured decode path (``engine.decode_graphs``), so a built-in engine's
predicted step is what that path could reach, not what it was measured to reach."""


def profile_from_probe(probe: dict[str, Any], source: str) -> HardwareProfile:
    """A measured profile: ceilings from the probe's GEMM and bandwidth sections, efficiencies from its model
    sections (each defined in ``Efficiency``), links from the device's spec sheet (one GPU measures none)."""
    device = probe["device"]
    sheet = _sheet_of(device.get("name", ""))
    peak = max(point["flops_per_s"] for point in probe["gemm"])
    bandwidth = probe["bandwidth"]["read"]["bytes_per_s"]
    shapes = [ModelShape(**model["shape"]) for model in probe["models"]]
    kv = _fit_decode_kv(probe, shapes, bandwidth)
    overhead, weights = _fit_decode_weights(probe, shapes, bandwidth, kv)
    efficiency = Efficiency(
        decode_weights=weights,
        decode_kv=kv,
        decode_compute=_decode_compute(probe, peak),
        decode_overhead_per_layer_s=overhead,
        prefill=_median_mfu(probe, shapes, peak, "prefill"),
        train=_median_mfu(probe, shapes, peak, "train"),
        logprob=_median_mfu(probe, shapes, peak, "logprob"),
    )
    host = probe["bandwidth"].get("host_to_device", {}).get("bytes_per_s", sheet.host_link_bandwidth)
    return replace(
        sheet,
        name=f"{sheet.name}-measured",
        source=f"measured: {source} (links from the {sheet.name} spec sheet; {DECODE_BASIS})",
        peak_flops=peak,
        hbm_bandwidth=bandwidth,
        hbm_bytes=float(device.get("memory_bytes", sheet.hbm_bytes)),
        host_link_bandwidth=host,
        efficiency=efficiency,
    )


def _sheet_of(device_name: str) -> HardwareProfile:
    words = device_name.lower().split()
    for name, sheet in SPEC_SHEETS.items():
        if name in words:
            return sheet
    raise ValueError(f"no spec sheet for device {device_name!r}: known {', '.join(sorted(SPEC_SHEETS))}")


def _points(model: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [point for point in model.get(key, []) if "median_s" in point]


def _fit_decode_weights(
    probe: dict[str, Any], shapes: list[ModelShape], bandwidth: float, kv_efficiency: float
) -> tuple[float, float]:
    """(overhead per layer, weight-read efficiency) from the smallest static decode step of each model:
    ``step = layers · overhead + weight bytes / (bandwidth · efficiency)``.

    The two unknowns are nearly collinear over Qwen3 shapes (bigger models have more layers), so the joint
    least-squares fit is kept only if its efficiency is physical: at most the KV reads' (the best streaming
    rate a decode step showed). Otherwise the efficiency is that bound and the overhead is the median of what
    each model leaves per layer."""
    rows = []
    for model, shape in zip(probe["models"], shapes, strict=True):
        points = _points(model, "decode_static")
        if points:
            smallest = min(points, key=lambda p: (p["batch"], p["kv_len"]))
            weight_bytes = 2 * shape.active_params_per_token  # bf16 layers and output layer, read once a step
            rows.append((shape.num_layers, weight_bytes / bandwidth, smallest["median_s"]))
    if len(rows) < 2:
        raise ValueError("fitting decode needs static decode points of at least two model shapes")
    s_ll = sum(n * n for n, _, _ in rows)  # normal equations of y = a·layers + b·(bytes/bandwidth)
    s_lw = sum(n * w for n, w, _ in rows)
    s_ww = sum(w * w for _, w, _ in rows)
    s_ly = sum(n * y for n, _, y in rows)
    s_wy = sum(w * y for _, w, y in rows)
    det = s_ll * s_ww - s_lw * s_lw
    per_layer = (s_ly * s_ww - s_wy * s_lw) / det
    inverse_efficiency = (s_ll * s_wy - s_lw * s_ly) / det
    if per_layer >= 0 and inverse_efficiency > 0 and 1 / inverse_efficiency <= kv_efficiency:
        return per_layer, 1 / inverse_efficiency
    per_layer = statistics.median((y - w / kv_efficiency) / n for n, w, y in rows)
    return max(0.0, per_layer), kv_efficiency


def _fit_decode_kv(probe: dict[str, Any], shapes: list[ModelShape], bandwidth: float) -> float:
    """KV-read efficiency: the slope of step time against KV bytes read, over the static decode points of the
    largest batch measured at two or more lengths, median over models."""
    efficiencies = []
    for model, shape in zip(probe["models"], shapes, strict=True):
        points = _points(model, "decode_static")
        by_batch: dict[int, list[dict[str, Any]]] = {}
        for point in points:
            by_batch.setdefault(point["batch"], []).append(point)
        batches = [b for b, pts in by_batch.items() if len(pts) >= 2]
        if not batches:
            continue
        batch = max(batches)
        pts = by_batch[batch]
        per_token = shape.kv_bytes_per_token(2)
        _, slope = fit_line([batch * p["kv_len"] * per_token for p in pts], [p["median_s"] for p in pts])
        if slope > 0:
            efficiencies.append(1.0 / (slope * bandwidth))
    if not efficiencies:
        raise ValueError("fitting decode KV reads needs static decode points at two KV lengths")
    return min(1.5, statistics.median(efficiencies))


def _decode_compute(probe: dict[str, Any], peak: float) -> float:
    """The skinny GEMMs' efficiency at their largest row count up to 256 (a decode batch's rows)."""
    skinny = [point for point in probe["gemm"] if point["m"] <= 256]
    if not skinny:
        raise ValueError("fitting decode compute needs the probe's decode-shaped GEMMs")
    return max(skinny, key=lambda p: p["m"])["flops_per_s"] / peak


def _median_mfu(probe: dict[str, Any], shapes: list[ModelShape], peak: float, kind: str) -> float:
    """Model FLOPs utilisation of prefill passes, training steps or no-grad log-prob passes, median over
    models (FLOPs: ``ModelShape.forward_flops_per_token``; training counts 3 forwards)."""
    values = []
    for model, shape in zip(probe["models"], shapes, strict=True):
        if kind == "prefill":
            for point in _points(model, "prefill"):
                flops = shape.forward_flops_per_token(point["row_tokens"] / 2)
                values.append(flops * point["tokens_per_s"] / peak)
        elif "train" in model:
            train = model["train"]
            measured = shape.with_layers(train["layers_measured"])
            per_token = measured.forward_flops_per_token(train["sample_tokens"] / 2)
            section, passes = ("step", 3) if kind == "train" else ("logprob_pass", 1)
            values.append(passes * per_token * train[section]["tokens_per_s"] / peak)
    if not values:
        raise ValueError(f"fitting {kind} efficiency needs the probe's {kind} sections")
    return statistics.median(values)
