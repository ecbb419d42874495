"""Configuration of the RL objective: policy loss, KL penalty, mismatch correction and advantage estimator.

Key decision: each loss owns a parameter sub-section named after it (``loss.ppo``, ``loss.tis``, …). Only the
section of the chosen ``loss.name`` may be set, so a parameter that does not apply to the chosen loss is an
error rather than silently ignored. The same rule holds inside sub-configs: fields that do not apply to the
chosen mode default to ``None`` and setting them is an error; fields that apply are filled with their default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

LossName = Literal["ppo", "grpo", "decoupled_ppo", "tis", "cispo", "topr", "reinforce"]
LOSS_NAMES: tuple[str, ...] = get_args(LossName)
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
AdvantageName = Literal["grpo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline", "gae"]
ADVANTAGE_NAMES: tuple[str, ...] = get_args(AdvantageName)
ProximalMode = Literal["recompute", "loglinear"]
MismatchGranularity = Literal["token", "sequence", "geometric"]
MismatchMode = Literal["truncate", "mask", "reject"]

DEFAULT_ADVANTAGE_EPS = 1e-6


def _check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")


def _check_positive(key: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{key} must be > 0, got {value}")


def _check_clip(prefix: str, eps_low: float, eps_high: float) -> None:
    if not 0 < eps_low < 1:
        raise ValueError(f"{prefix}.eps_low must be in (0, 1), got {eps_low}")
    _check_positive(f"{prefix}.eps_high", eps_high)


@dataclass(frozen=True, kw_only=True)
class ClipParams:
    """PPO-clip parameters, used by ``ppo`` and ``grpo``."""

    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped at 1 - eps_low."""
    eps_high: float = 0.2
    """Upper clip range: the ratio is clipped at 1 + eps_high (raise it for DAPO's clip-higher, e.g. 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens at c·|A|; None disables it."""

    def validate(self, prefix: str) -> None:
        _check_clip(prefix, self.eps_low, self.eps_high)
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"{prefix}.dual_clip must be > 1 (or null to disable), got {self.dual_clip}")


@dataclass(frozen=True, kw_only=True)
class DecoupledPPOParams:
    """Decoupled PPO: clip π_θ/π_prox around the proximal policy, importance-weight π_prox/π_old."""

    eps_low: float = 0.2
    """Lower clip range of π_θ/π_prox."""
    eps_high: float = 0.2
    """Upper clip range of π_θ/π_prox."""
    proximal: ProximalMode = "recompute"
    """How π_prox is obtained: 'recompute' (one extra forward pass per step) or 'loglinear' (interpolated)."""

    def validate(self, prefix: str) -> None:
        _check_clip(prefix, self.eps_low, self.eps_high)
        _check_choice(f"{prefix}.proximal", self.proximal, get_args(ProximalMode))


@dataclass(frozen=True, kw_only=True)
class TISParams:
    """Truncated importance sampling: weight sg(min(π_θ/π_old, cap))."""

    cap: float | None = 2.0
    """Truncation threshold c of the importance ratio; null leaves the ratio untruncated (plain importance
    sampling, as M2PO uses it: its second-moment mask, not a cap, bounds the weights)."""

    def validate(self, prefix: str) -> None:
        if self.cap is not None:
            _check_positive(f"{prefix}.cap", self.cap)


@dataclass(frozen=True, kw_only=True)
class CISPOParams:
    """CISPO: weight sg(clip(π_θ/π_old, 1 - eps_low, 1 + eps_high)); every token keeps its gradient."""

    eps_low: float = 0.2
    """Lower clip range of the importance weight (1 - eps_low >= 0)."""
    eps_high: float = 0.28
    """Upper clip range of the importance weight."""

    def validate(self, prefix: str) -> None:
        if not 0 <= self.eps_low <= 1:
            raise ValueError(f"{prefix}.eps_low must be in [0, 1], got {self.eps_low}")
        _check_positive(f"{prefix}.eps_high", self.eps_high)


@dataclass(frozen=True, kw_only=True)
class TOPRParams:
    """(Weighted) TOPR: plain REINFORCE on positive trajectories, truncated IS on negative ones."""

    cap: float = 1.0
    """Truncation threshold c of the importance ratio on negative trajectories."""
    positive_weight: float = 1.0
    """Weight of the positive-trajectory term (weighted TOPR)."""
    negative_weight: float = 1.0
    """Weight of the negative-trajectory term (weighted TOPR)."""
    reward_threshold: float = 0.0
    """A trajectory is positive when its sequence reward is strictly greater than this."""

    def validate(self, prefix: str) -> None:
        _check_positive(f"{prefix}.cap", self.cap)
        for name in ("positive_weight", "negative_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{prefix}.{name} must be >= 0, got {getattr(self, name)}")


LOSS_PARAM_TYPES: dict[str, type | None] = {
    "ppo": ClipParams,
    "grpo": ClipParams,
    "decoupled_ppo": DecoupledPPOParams,
    "tis": TISParams,
    "cispo": CISPOParams,
    "topr": TOPRParams,
    "reinforce": None,
}
"""Which parameter sub-section each loss reads (None: the loss has no parameters)."""


@dataclass(frozen=True, kw_only=True)
class KLConfig:
    """KL(π_θ‖π_ref) penalty added to any loss: β · estimator, aggregated like the policy term."""

    beta: float = 0.0
    """Penalty coefficient β; 0 disables the penalty (the KL is still reported when reference log-probs exist)."""
    estimator: KLEstimator = "k3"
    """Per-token estimator: 'k1' (log-ratio), 'k2' (half squared log-ratio) or 'k3' (r - 1 - log r)."""

    def __post_init__(self) -> None:
        if self.beta < 0:
            raise ValueError(f"loss.kl.beta must be >= 0, got {self.beta}")
        _check_choice("loss.kl.estimator", self.estimator, KL_ESTIMATORS)


@dataclass(frozen=True, kw_only=True)
class MismatchConfig:
    """Train–inference mismatch correction: importance weight π_train_old / π_infer, truncated, masked or used
    only to reject.

    ``cap`` applies only to mode 'truncate'; ``low`` and ``high`` only to modes 'mask' and 'reject'. Left as
    None they take their defaults (cap 2.0; low 0.5, high 2.0); setting one that does not apply to the mode is
    an error.
    """

    granularity: MismatchGranularity = "token"
    """'token' (per-token ratio), 'sequence' (product over the sequence) or 'geometric' (geometric mean)."""
    mode: MismatchMode = "truncate"
    """'truncate': weight min(ratio, cap); 'mask': weight ratio inside [low, high], drop the unit outside
    (masked IS); 'reject': weight 1 inside [low, high], drop the unit outside (rejection sampling, no IS weight)."""
    cap: float | None = None
    """Truncation threshold C (mode 'truncate'; default 2.0)."""
    low: float | None = None
    """Lowest kept ratio (modes 'mask' and 'reject'; default 0.5)."""
    high: float | None = None
    """Highest kept ratio (modes 'mask' and 'reject'; default 2.0)."""

    def __post_init__(self) -> None:
        _check_choice("loss.mismatch.granularity", self.granularity, get_args(MismatchGranularity))
        _check_choice("loss.mismatch.mode", self.mode, get_args(MismatchMode))
        if self.mode == "truncate":
            self._truncate_defaults()
        else:
            self._mask_defaults()

    def _truncate_defaults(self) -> None:
        for name in ("low", "high"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"loss.mismatch.{name} applies only to loss.mismatch.mode 'mask' or 'reject'"
                )
        object.__setattr__(self, "cap", 2.0 if self.cap is None else self.cap)
        _check_positive("loss.mismatch.cap", self.cap)

    def _mask_defaults(self) -> None:
        if self.cap is not None:
            raise ValueError("loss.mismatch.cap applies only to loss.mismatch.mode='truncate'")
        object.__setattr__(self, "low", 0.5 if self.low is None else self.low)
        object.__setattr__(self, "high", 2.0 if self.high is None else self.high)
        if not 0 <= self.low < 1 < self.high:
            raise ValueError(f"loss.mismatch needs 0 <= low < 1 < high, got low={self.low}, high={self.high}")


@dataclass(frozen=True, kw_only=True)
class OPSMConfig:
    """Off-policy sequence masking (DeepSeek-V3.2): drop a negative-advantage sequence whose behaviour-to-current
    KL, (1/|o|)·Σ_t log π_old/π_θ with π_old the engine's log-probs, exceeds ``delta``."""

    delta: float = 1e-4
    """KL threshold δ (slime's default; DeepSeek does not publish theirs)."""

    def __post_init__(self) -> None:
        if self.delta < 0:
            raise ValueError(f"loss.opsm.delta must be >= 0, got {self.delta}")


@dataclass(frozen=True, kw_only=True)
class M2POConfig:
    """M2PO's second-moment trust region: at step start, mask the tokens with the largest (log π_θ/π_old)² until
    the batch's mean of the rest is at most ``threshold``."""

    threshold: float = 0.04
    """τ_M2, the bound on the second moment of the log-ratio (the paper's default)."""

    def __post_init__(self) -> None:
        _check_positive("loss.m2po.threshold", self.threshold)


@dataclass(frozen=True, kw_only=True)
class K3RejectionConfig:
    """K3-based sequence rejection: drop a sequence whose mean per-token K3 estimate of KL(π_infer‖π_train),
    ρ − 1 − log ρ with ρ = π_train_old/π_infer, exceeds ``threshold``; kept sequences are not reweighted."""

    threshold: float = 0.01
    """Largest kept mean K3 (verl's K3-RS default)."""

    def __post_init__(self) -> None:
        _check_positive("loss.k3_rejection.threshold", self.threshold)


PRESETS: dict[str, dict[str, Any]] = {
    "decoupled_ppo": {"name": "decoupled_ppo", "decoupled_ppo": {"proximal": "recompute"}},
    "icepop": {"mismatch": {"granularity": "token", "mode": "mask", "low": 0.5, "high": 5.0}},
    "seq_mis": {"mismatch": {"granularity": "sequence", "mode": "mask", "low": 0.5, "high": 2.0}},
    "geo_rs": {"mismatch": {"granularity": "geometric", "mode": "reject", "low": 0.999, "high": 1.001}},
    "k3_rs": {"k3_rejection": {"threshold": 0.01}},
    "opsm": {"opsm": {"delta": 1e-4}},
    "m2po": {"name": "tis", "tis": {"cap": None}, "m2po": {"threshold": 0.04}},
}
"""Named off-policy recipes: the ``loss`` keys each one sets (docs/algorithms.md maps them to verl's, slime's
and OpenRLHF's names). Keys written next to ``loss.preset`` win over the preset's."""


def expand_preset(data: Mapping[str, Any]) -> dict[str, Any]:
    """The ``loss`` section's plain data with its preset's keys filled in beneath the keys given (deep merge:
    ``loss.preset=geo_rs loss.mismatch.high=1.002`` keeps the preset's mode and low)."""
    name = data.get("preset")
    if name is None:
        return dict(data)
    _check_choice("loss.preset", name, tuple(PRESETS))
    return _merge(PRESETS[name], data)


def preset_keys(name: str) -> list[str]:
    """The dotted ``loss.*=value`` settings preset ``name`` stands for (as docs/algorithms.md lists them)."""
    _check_choice("loss.preset", name, tuple(PRESETS))
    return _dotted("loss", PRESETS[name])


def _dotted(prefix: str, data: Mapping[str, Any]) -> list[str]:
    keys = []
    for key, value in data.items():
        if isinstance(value, Mapping):
            keys += _dotted(f"{prefix}.{key}", value)
        else:
            keys.append(f"{prefix}.{key}={'null' if value is None else value}")
    return keys


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        both_sections = isinstance(value, Mapping) and isinstance(below, Mapping)
        merged[key] = _merge(below, value) if both_sections else value
    return merged


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """The policy loss, its aggregation, an optional KL penalty and optional mismatch correction.

    Only the parameter section named by ``name`` may be set (``reinforce`` has none); it is filled with its
    defaults when left unset.
    """

    name: LossName = "ppo"
    """Registered policy loss: 'ppo', 'grpo', 'decoupled_ppo', 'tis', 'cispo', 'topr' or 'reinforce'."""
    aggregation: Aggregation = "token-mean"
    """How per-token losses become a scalar; masked tokens never count (see docs/algorithms.md)."""
    norm_length: int | None = None
    """Normaliser L of 'seq-mean-token-sum-norm' (e.g. max response length); None uses the batch width T."""
    ppo: ClipParams | None = None
    """Parameters of loss 'ppo'."""
    grpo: ClipParams | None = None
    """Parameters of loss 'grpo' (the KL term is loss.kl and must have beta > 0)."""
    decoupled_ppo: DecoupledPPOParams | None = None
    """Parameters of loss 'decoupled_ppo'."""
    tis: TISParams | None = None
    """Parameters of loss 'tis'."""
    cispo: CISPOParams | None = None
    """Parameters of loss 'cispo'."""
    topr: TOPRParams | None = None
    """Parameters of loss 'topr'."""
    kl: KLConfig = field(default_factory=KLConfig)
    """KL(π_θ‖π_ref) penalty, applicable to every loss."""
    mismatch: MismatchConfig | None = None
    """Train–inference mismatch correction; None disables it (the engine's log-probs are then π_old)."""
    k3_rejection: K3RejectionConfig | None = None
    """K3-based sequence rejection on π_train_old/π_infer (like mismatch, π_old becomes the trainer's
    recompute); None disables it."""
    opsm: OPSMConfig | None = None
    """Off-policy sequence masking of negative-advantage sequences; None disables it."""
    m2po: M2POConfig | None = None
    """M2PO's second-moment token mask; None disables it."""
    preset: str | None = None
    """A named off-policy recipe filling the keys above (see ``PRESETS``): decoupled_ppo, icepop, seq_mis,
    geo_rs, k3_rs, opsm or m2po. Keys set alongside it win over the preset's."""

    @classmethod
    def expand_data(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """Plain data with the preset's keys merged in beneath the given ones (the config loader calls this)."""
        return expand_preset(data)

    def __post_init__(self) -> None:
        self._fill_preset()
        _check_choice("loss.name", self.name, LOSS_NAMES)
        _check_choice("loss.aggregation", self.aggregation, AGGREGATIONS)
        self._check_norm_length()
        self._check_sections()
        self._check_combinations()

    def _fill_preset(self) -> None:
        """For configs built in Python: the preset's sections fill those left unset, and its loss name replaces
        the default one (the loader merges key by key instead, see ``expand_data``)."""
        if self.preset is None:
            return
        _check_choice("loss.preset", self.preset, tuple(PRESETS))
        for key, value in PRESETS[self.preset].items():
            if key == "name":
                if self.name == "ppo":
                    object.__setattr__(self, "name", value)
            elif getattr(self, key) is None:
                object.__setattr__(self, key, _SECTION_TYPES[key](**value))

    def _check_combinations(self) -> None:
        """Settings that are valid alone but contradict each other."""
        params = self.params
        if (
            self.needs_train_behaviour
            and isinstance(params, DecoupledPPOParams)
            and params.proximal == "loglinear"
        ):
            raise ValueError(
                "loss.decoupled_ppo.proximal='loglinear' cannot be combined with loss.mismatch, "
                "loss.k3_rejection or loss.m2po: they read the step-start policy (π_prox) from a forward pass "
                "anyway; use loss.decoupled_ppo.proximal='recompute'"
            )
        if self.name == "grpo" and self.kl.beta <= 0:
            raise ValueError(
                "loss.kl.beta must be > 0 for loss.name='grpo' (GRPO is PPO-clip plus β·KL(π_θ‖π_ref)); "
                "use loss.name='ppo' for PPO-clip without a KL term"
            )

    def _check_norm_length(self) -> None:
        if self.norm_length is None:
            return
        if self.aggregation != "seq-mean-token-sum-norm":
            raise ValueError("loss.norm_length applies only to loss.aggregation='seq-mean-token-sum-norm'")
        if self.norm_length < 1:
            raise ValueError(f"loss.norm_length must be >= 1, got {self.norm_length}")

    def _check_sections(self) -> None:
        for section in LOSS_PARAM_TYPES:
            if section != self.name and getattr(self, section, None) is not None:
                raise ValueError(
                    f"loss.{section} is set but loss.name is {self.name!r}; only loss.{self.name} "
                    f"parameters apply (valid sections: {', '.join(s for s in LOSS_PARAM_TYPES if s != 'reinforce')})"
                )
        param_type = LOSS_PARAM_TYPES[self.name]
        if param_type is None:
            return
        params = getattr(self, self.name)
        if params is None:
            params = param_type()
            object.__setattr__(self, self.name, params)
        if not isinstance(params, param_type):
            raise ValueError(f"loss.{self.name} must be a {param_type.__name__}, got {type(params).__name__}")
        params.validate(f"loss.{self.name}")

    @property
    def params(self) -> ClipParams | DecoupledPPOParams | TISParams | CISPOParams | TOPRParams | None:
        """The parameter section of the chosen loss (None for 'reinforce')."""
        return getattr(self, self.name, None)

    @property
    def needs_proximal_forward(self) -> bool:
        """Whether the trainer must recompute π_prox with a forward pass at the start of each step."""
        return isinstance(self.params, DecoupledPPOParams) and self.params.proximal == "recompute"

    @property
    def needs_reference(self) -> bool:
        """Whether the trainer must compute reference-model log-probs."""
        return self.kl.beta > 0

    @property
    def needs_train_behaviour(self) -> bool:
        """Whether the trainer must recompute the behaviour log-probs with its own weights at step start
        (mismatch, K3 rejection and M2PO read them)."""
        return self.mismatch is not None or self.k3_rejection is not None or self.m2po is not None

    @property
    def replaces_behaviour(self) -> bool:
        """Whether the loss uses the trainer's recompute as π_old (mismatch and K3 rejection: decoupled)."""
        return self.mismatch is not None or self.k3_rejection is not None


_SECTION_TYPES: dict[str, type] = {
    "mismatch": MismatchConfig,
    "k3_rejection": K3RejectionConfig,
    "opsm": OPSMConfig,
    "m2po": M2POConfig,
    **{name: t for name, t in LOSS_PARAM_TYPES.items() if t is not None},
}
"""The section class of each ``loss`` key a preset can fill."""


@dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """Advantage estimator: over per-sample rewards (broadcast over tokens), or GAE over per-token rewards and a
    critic's values.

    ``eps`` applies to the estimators that divide by a standard deviation ('grpo', 'reinforce_pp',
    'reinforce_pp_baseline', and 'gae' when it whitens); left as None it defaults to 1e-6; setting it for
    'dr_grpo' is an error. ``gamma``, ``lam`` and ``whiten`` apply only to 'gae' (defaults 1.0, 0.95, true).
    """

    name: AdvantageName = "grpo"
    """'grpo' (group mean and std), 'dr_grpo' (group mean only), 'reinforce_pp' (batch mean and std),
    'reinforce_pp_baseline' (group mean, then batch std) or 'gae' (generalised advantage estimation with the
    critic's values; needs a ``critic`` section)."""
    eps: float | None = None
    """Added to the standard deviation before dividing."""
    gamma: float | None = None
    """GAE discount γ per model token (1.0: no discount, the usual choice for LLMs)."""
    lam: float | None = None
    """GAE λ: 1 is the Monte-Carlo return minus the value (unbiased, noisy), 0 the one-step TD error."""
    whiten: bool | None = None
    """GAE: normalise the batch's advantages to mean 0 and std 1 over every model token."""

    def __post_init__(self) -> None:
        _check_choice("advantage.name", self.name, ADVANTAGE_NAMES)
        self._gae_defaults()
        if self.name == "dr_grpo":
            if self.eps is not None:
                raise ValueError(
                    "advantage.eps applies only to advantage.name in 'grpo', 'reinforce_pp', "
                    "'reinforce_pp_baseline', 'gae' (dr_grpo does not divide by a std)"
                )
            return
        object.__setattr__(self, "eps", DEFAULT_ADVANTAGE_EPS if self.eps is None else self.eps)
        _check_positive("advantage.eps", self.eps)

    def _gae_defaults(self) -> None:
        names = ("gamma", "lam", "whiten")
        if self.name != "gae":
            for name in names:
                if getattr(self, name) is not None:
                    raise ValueError(f"advantage.{name} applies only to advantage.name='gae'")
            return
        for name, default in zip(names, (1.0, 0.95, True), strict=True):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"advantage.{name} must be in [0, 1], got {getattr(self, name)}")
