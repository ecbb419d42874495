"""Configuration of the RL objective: policy loss, KL penalty, mismatch correction and advantage estimator.

Key decision: each loss owns a parameter sub-section named after it (``loss.ppo``, ``loss.tis``, …). Only the
section of the chosen ``loss.name`` may be set, so a parameter that does not apply to the chosen loss is an
error rather than silently ignored. The same rule holds inside sub-configs: fields that do not apply to the
chosen mode default to ``None`` and setting them is an error; fields that apply are filled with their default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

LossName = Literal["ppo", "grpo", "decoupled_ppo", "tis", "cispo", "topr", "reinforce"]
LOSS_NAMES: tuple[str, ...] = get_args(LossName)
Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
AdvantageName = Literal["grpo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline"]
ADVANTAGE_NAMES: tuple[str, ...] = get_args(AdvantageName)
ProximalMode = Literal["recompute", "loglinear"]
MismatchGranularity = Literal["token", "sequence", "geometric"]
MismatchMode = Literal["truncate", "mask"]

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

    cap: float = 2.0
    """Truncation threshold c of the importance ratio."""

    def validate(self, prefix: str) -> None:
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
    """Train–inference mismatch correction: importance weight π_train_old / π_infer, truncated or masked.

    ``cap`` applies only to mode 'truncate'; ``low`` and ``high`` only to mode 'mask'. Left as None they take
    their defaults (cap 2.0; low 0.5, high 2.0); setting one that does not apply to the mode is an error.
    """

    granularity: MismatchGranularity = "token"
    """'token' (per-token ratio), 'sequence' (product over the sequence) or 'geometric' (geometric mean)."""
    mode: MismatchMode = "truncate"
    """'truncate': weight min(ratio, cap); 'mask': weight ratio inside [low, high], drop the unit outside."""
    cap: float | None = None
    """Truncation threshold C (mode 'truncate'; default 2.0)."""
    low: float | None = None
    """Lowest kept ratio (mode 'mask'; default 0.5)."""
    high: float | None = None
    """Highest kept ratio (mode 'mask'; default 2.0)."""

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
                raise ValueError(f"loss.mismatch.{name} applies only to loss.mismatch.mode='mask'")
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

    def __post_init__(self) -> None:
        _check_choice("loss.name", self.name, LOSS_NAMES)
        _check_choice("loss.aggregation", self.aggregation, AGGREGATIONS)
        self._check_norm_length()
        self._check_sections()
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Settings that are valid alone but contradict each other."""
        params = self.params
        if (
            self.mismatch is not None
            and isinstance(params, DecoupledPPOParams)
            and params.proximal == "loglinear"
        ):
            raise ValueError(
                "loss.decoupled_ppo.proximal='loglinear' cannot be combined with loss.mismatch: the mismatch "
                "correction's π_train_old is the step-start policy (π_prox) from a forward pass anyway; "
                "use loss.decoupled_ppo.proximal='recompute'"
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
        """Whether the trainer must recompute the behaviour log-probs with its own weights (mismatch)."""
        return self.mismatch is not None


@dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """Advantage estimator over per-sample rewards, broadcast over tokens by the trainer.

    ``eps`` applies to the estimators that divide by a standard deviation ('grpo', 'reinforce_pp',
    'reinforce_pp_baseline'); left as None it defaults to 1e-6; setting it for 'dr_grpo' is an error.
    """

    name: AdvantageName = "grpo"
    """'grpo' (group mean and std), 'dr_grpo' (group mean only), 'reinforce_pp' (batch mean and std) or
    'reinforce_pp_baseline' (group mean, then batch std)."""
    eps: float | None = None
    """Added to the standard deviation before dividing."""

    def __post_init__(self) -> None:
        _check_choice("advantage.name", self.name, ADVANTAGE_NAMES)
        if self.name == "dr_grpo":
            if self.eps is not None:
                raise ValueError(
                    "advantage.eps applies only to advantage.name in 'grpo', 'reinforce_pp', "
                    "'reinforce_pp_baseline' (dr_grpo does not divide by a std)"
                )
            return
        object.__setattr__(self, "eps", DEFAULT_ADVANTAGE_EPS if self.eps is None else self.eps)
        _check_positive("advantage.eps", self.eps)
