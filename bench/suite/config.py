"""The suite (bench.yaml) and scenarios (scenarios/*.yaml) as dataclasses, and their expansion into cases.

A scenario is a model (dims, dtype, batch) plus sweep lists. The sweep lists are written at the top level of
the file and, optionally, as a list of `sweeps`, each of which overrides some of them (for example a strong-
scaling sweep over seq_len and a weak-scaling sweep over local_seq_len in one file). Every combination of
the lists is one `Case`: one launch of `cp` ranks that times one pass of one mode.

Each dataclass checks its own fields in `__post_init__` (types from the annotations, then ranges) and raises
`FieldError("key", "problem; fix")`; bench.suite.loader adds the file and line. YAML keys are the field names,
except that a trailing underscore (`pass_`, a Python keyword) is dropped: the YAML key is `pass`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

from bench.errors import FieldError
from bench.suite.thresholds import Bars, ThresholdSpec
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.distributed import MODES, SUMMARY_MODES, ModeName
from gdn_cp.distributed.platform import DeviceKind
from gdn_cp.dtypes import DTYPES, dtype_name, to_dtype

Mode = ModeName
"""CP modes of gdn_cp.LinearAttentionContextParallel (the registry, gdn_cp.distributed.modes)."""
Pass = Literal["forward", "forward_backward"]
"""forward: the training forward (autograd on, no backward); forward_backward: forward then backward."""
Device = DeviceKind
"""Where ranks run (gdn_cp.distributed.DEVICES); auto picks npu, then cuda, then cpu."""
LayerType = Literal["linear_attention", "full_attention"]
"""Token mixer of a hybrid-model layer (gdn_cp.models.Qwen35HybridConfig.layer_types)."""
GradReduction = Literal["auto", "fsdp2", "all_reduce"]
MasterWeights = Literal["fp32", "model"]
"""How `bench verify --train` sums parameter gradients over the CP ranks."""

PASS_TAGS: dict[str, str] = {"forward": "fwd", "forward_backward": "fwd_bwd"}
"""How a pass is spelled in case ids."""

MODEL_KEYS: tuple[str, ...] = (
    "hidden_size",
    "num_k_heads",
    "num_v_heads",
    "head_k_dim",
    "head_v_dim",
    "conv_kernel_size",
    "chunk_size",
)
"""Scenario fields that are GatedDeltaNetConfig fields of the same name."""


def yaml_key(field_name: str) -> str:
    """The YAML spelling of a field: `pass_` -> `pass`."""
    return field_name.rstrip("_")


def config_fields(cls_or_obj: Any) -> tuple[dataclasses.Field, ...]:
    """The fields of a config dataclass that a YAML file sets (not the ones derived in __post_init__)."""
    return tuple(f for f in dataclasses.fields(cls_or_obj) if f.init)


def yaml_keys(cls: type) -> dict[str, str]:
    """YAML key -> field name, for the fields of a config dataclass."""
    return {yaml_key(f.name): f.name for f in config_fields(cls)}


# ----------------------------------------------------------------------------------------------------------
# Type checking from annotations: one place, so every config reports a wrong type the same way.


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(hint))
    if origin is list:
        return f"a list of {_describe(get_args(hint)[0])}"
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a) for a in get_args(hint) if a is not type(None)]
        return " or ".join([*parts, "null"] if type(None) in get_args(hint) else parts)
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        hint, getattr(hint, "__name__", str(hint))
    )


def _check_value(key: str, hint: Any, value: Any, expected: str | None = None) -> Any:
    """`value` if it matches `hint` (ints are accepted for floats), else FieldError naming key and fix.

    `expected` describes the declared type when `hint` is the inner type of an optional one."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        # `str | list[str]`: a list is checked as the list member, anything else as the other one
        if len(inner) > 1:
            lists = [a for a in inner if get_origin(a) is list]
            others = [a for a in inner if get_origin(a) is not list]
            if not (len(lists) == len(others) == 1):
                raise TypeError(f"{key}: unsupported annotation {hint!r}")  # a programming error
            inner = lists if isinstance(value, list) else others
        return _check_value(key, inner[0], value, _describe(hint))
    if origin is Literal:
        choices = get_args(hint)
        if not isinstance(value, str) or value not in choices:
            raise FieldError(key, f"unknown {key} {value!r}; use one of {', '.join(choices)}")
        return value
    if origin is list:
        (item,) = get_args(hint)
        if not isinstance(value, list):
            raise FieldError(
                key, f"expected a list, got {value!r}; write a YAML list such as {key}: [{value}]"
            )
        return [_check_value(key, item, v) for v in value]
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(hint)
    if ok is None:
        return value  # nested dataclasses are built and checked by their own __post_init__
    if not ok:
        raise FieldError(
            key,
            f"expected {expected or _describe(hint)}, got {value!r} ({type(value).__name__}); fix the value",
        )
    if hint is float and not math.isfinite(value):
        raise FieldError(
            key, f"expected a finite number, got {value!r}; write a plain number (not .nan or .inf)"
        )
    return float(value) if hint is float else value


def check_fields(obj: Any) -> None:
    """Check every field of a config dataclass against its annotation (converting int -> float)."""
    hints = _hints(type(obj))
    for f in config_fields(obj):
        value = _check_value(yaml_key(f.name), hints[f.name], getattr(obj, f.name))
        object.__setattr__(obj, f.name, value)


def _require_positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        values = value if isinstance(value, list) else [value]
        bad = [v for v in values if v is not None and v <= 0]
        if bad:
            raise FieldError(yaml_key(name), f"must be positive, got {bad[0]!r}; use an integer >= 1")


# ----------------------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class SuiteConfig:
    """Suite defaults, from bench.yaml. Scenario values (warmup, repeat, device) override these."""

    device: Device = "auto"
    """Where ranks run: auto (npu, then cuda, then cpu), cpu (gloo), cuda (nccl), npu (hccl)."""
    warmup: int = 3
    """Untimed passes before timing, per case."""
    repeat: int = 10
    """Timed passes per case; the reported time is the median over repeats of the rank-max."""
    threads_per_rank: int | None = None
    """torch threads per rank; null: cores // ranks (at least 1)."""
    timeout_s: float = 600.0
    """Collective timeout per case, in seconds: a rank stuck longer than this fails the case."""
    results_dir: str = "results"
    """Where `bench run` writes result files (relative to bench.yaml)."""
    plots_dir: str = "plots"
    """The committed charts (relative to bench.yaml), which the README embeds. No command writes there unless
    it is named (`bench plot RESULT --out plots`); by default `bench plot` and `bench report` write new
    folders under results_dir."""
    scenarios_dir: str = "scenarios"
    """Where scenario names are looked up (relative to bench.yaml)."""
    default_scenario: str = "cpu-smoke"
    """The scenario `bench run` runs when none is named."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.warmup < 0:
            raise FieldError("warmup", f"must be >= 0, got {self.warmup}; use 0 for no warmup")
        _require_positive(self, "repeat", "threads_per_rank")
        if self.timeout_s <= 0:
            raise FieldError("timeout_s", f"must be > 0 seconds, got {self.timeout_s}; e.g. timeout_s: 600")

    def to_dict(self) -> dict[str, Any]:
        return {yaml_key(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(kw_only=True, slots=True)
class Sweep:
    """Lists to sweep; every combination is a case. Unset (null) fields come from the scenario's top level."""

    cp: list[int] | None = None
    """CP degrees (ranks per case)."""
    seq_len: list[int] | None = None
    """Global sequence lengths (strong scaling: the work is fixed, ranks share it). Excludes local_seq_len."""
    local_seq_len: list[int] | None = None
    """Tokens per rank (weak scaling: the global sequence is local_seq_len * cp). Excludes seq_len."""
    mode: list[Mode] | None = None
    """CP modes; default: all of ulysses, p2p, all_gather."""
    checkpoint: list[bool] | None = None
    """Summary checkpoint on/off (p2p and all_gather only; ulysses runs once); default [true]."""
    pass_: list[Pass] | None = None
    """Passes to time (YAML key `pass`); default [forward, forward_backward]."""

    def __post_init__(self) -> None:
        check_fields(self)
        for f in dataclasses.fields(self):
            if getattr(self, f.name) == []:
                raise FieldError(
                    yaml_key(f.name), "the list is empty; give at least one value or remove the key"
                )
        _require_positive(self, "cp", "seq_len", "local_seq_len")
        if self.seq_len is not None and self.local_seq_len is not None:
            raise FieldError(
                "local_seq_len",
                "set seq_len (global tokens; strong scaling) or local_seq_len (tokens per rank; weak "
                "scaling), not both; remove one",
            )

    def over(self, base: Sweep) -> Sweep:
        """This sweep with its unset fields taken from `base`. seq_len and local_seq_len go together: a
        sweep that sets either replaces both of the base's."""
        merged = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name, value in merged.items():
            if value is None and not (name in ("seq_len", "local_seq_len") and self._sets_length()):
                merged[name] = getattr(base, name)
        return Sweep(**merged)

    def _sets_length(self) -> bool:
        return self.seq_len is not None or self.local_seq_len is not None


DEFAULT_SWEEP = Sweep(mode=list(MODES), checkpoint=[True], pass_=list(get_args(Pass)))
"""What a scenario sweeps when it does not say: every mode, checkpoint on, both passes."""


@dataclass(kw_only=True, slots=True)
class TrainSettings:
    """The hybrid model and optimizer of `bench verify --train` (YAML: a `train:` mapping in a scenario).

    The model is gdn_cp.models.Qwen35Hybrid: its GDN layers take the scenario's layer fields (hidden_size,
    num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel_size, chunk_size, dtype); the fields
    here add what the layer does not have. Every step draws a new random batch of `batch` sequences of
    seq_len + 1 tokens (inputs and next-token labels), the same for the reference and the CP model.
    """

    steps: int = 100
    """Optimizer steps when `bench verify --train` is given without a number (the reference PR ran 100)."""
    lr: float = 1e-4
    """AdamW learning rate (the reference PR's)."""
    weight_decay: float = 0.01
    """AdamW weight decay (the reference PR's)."""
    layer_types: list[LayerType] = field(
        default_factory=lambda: ["linear_attention"] * 3 + ["full_attention"]
    )
    """Token mixer per layer, in order; default the reference PR's 3 linear : 1 full attention."""
    vocab_size: int = 256
    """Token vocabulary."""
    intermediate_size: int = 256
    """SwiGLU MLP width."""
    num_attention_heads: int = 4
    """Full-attention query heads; must be divisible by every cp of the scenario (Ulysses over heads)."""
    num_key_value_heads: int = 2
    """Full-attention key/value heads (GQA); repeated to the query heads when fewer than cp."""
    head_dim: int = 16
    """Full-attention head dim."""
    grad_reduction: GradReduction = "auto"
    """How CP parameter gradients are summed over the ranks: fsdp2 (torch.distributed.fsdp.fully_shard over
    a 1-D mesh of the CP ranks, gradient divide factor 1 so that the partial gradients are summed), all_reduce
    (gdn_cp.distributed.all_reduce_gradients), or auto: fsdp2 where torch has fully_shard, else all_reduce."""
    master_weights: MasterWeights = "fp32"
    """fp32: parameters, gradients and AdamW state in fp32, forward and backward in the scenario's dtype
    (mixed precision: FSDP2's MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=fp32); the reference
    and the all_reduce path make the same casts by hand). model: everything in the scenario's dtype (pure
    bf16 training when dtype is bf16). The same for fp32 scenarios."""

    def __post_init__(self) -> None:
        check_fields(self)
        _require_positive(self, "steps", "vocab_size", "intermediate_size", "num_attention_heads")
        _require_positive(self, "num_key_value_heads", "head_dim")
        if self.lr <= 0:
            raise FieldError("lr", f"must be > 0, got {self.lr}; e.g. lr: 1.0e-4")
        if self.weight_decay < 0:
            raise FieldError(
                "weight_decay", f"must be >= 0, got {self.weight_decay}; e.g. weight_decay: 0.01"
            )
        if not self.layer_types:
            raise FieldError(
                "layer_types", "the list is empty; give at least one layer, e.g. [linear_attention]"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise FieldError(
                "num_attention_heads",
                f"{self.num_attention_heads} is not a multiple of num_key_value_heads "
                f"({self.num_key_value_heads}); choose a multiple",
            )

    def to_dict(self) -> dict[str, Any]:
        return {yaml_key(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(kw_only=True, slots=True)
class Scenario:
    """One scenario file: a model and the lists to sweep over it."""

    name: str
    """The file name without .yaml (not a YAML key)."""
    description: str = ""
    """One line: what the scenario measures and why."""
    device: Device | None = None
    """Where it runs; null: the suite's device. `bench run --device` overrides both."""
    hidden_size: int
    """Model width."""
    num_k_heads: int
    """Query/key heads (Hk)."""
    num_v_heads: int
    """Value heads (Hv), a multiple of num_k_heads."""
    head_k_dim: int
    """Query/key head dim (K)."""
    head_v_dim: int
    """Value head dim (V)."""
    conv_kernel_size: int = 4
    """Depthwise causal Conv1D width."""
    chunk_size: int = 64
    """Chunk size of the chunked GDN."""
    dtype: str | list[str] = "fp32"
    """Parameter and activation dtype: fp32, bf16, fp16, fp64 (or their long names); a list sweeps several
    (each case takes one, and case ids then end with it: `p2p-ckpt-cp2-T128-fwd_bwd-bf16`)."""
    batch: int = 1
    """Sequences per step (B)."""
    seed: int = 0
    """Seed of the weights, the input and the output gradient (identical on every rank). `bench verify
    --seeds N` runs seeds seed, seed + 1, ..., seed + N - 1."""
    warmup: int | None = None
    """Untimed passes per case; null: the suite's."""
    repeat: int | None = None
    """Timed passes per case; null: the suite's."""
    thresholds: dict[str, Any] | None = None
    """`bench verify` pass bars: a mapping of bar -> value for every dtype, and optionally per dtype
    (`fp32: {rel_l2: 1.0e-4}`) on top; unset bars are the PR's. Keys and resolution: bench/thresholds.py."""
    train: TrainSettings | None = None
    """The hybrid model and optimizer of `bench verify --train` (a mapping; see TrainSettings); null: the
    scenario has no training trajectory."""
    sweep: Sweep = field(default_factory=Sweep)
    """The top-level sweep lists (cp, seq_len or local_seq_len, mode, checkpoint, pass)."""
    sweeps: list[Sweep] = field(default_factory=list)
    """Optional sub-sweeps; each overrides some top-level lists. None: the top level is the one sweep."""
    threshold_spec: ThresholdSpec = field(init=False, repr=False, compare=False)
    """`thresholds`, checked and parsed once (derived, not a YAML key)."""

    def __post_init__(self) -> None:
        check_fields(self)
        _require_positive(self, *MODEL_KEYS, "batch", "repeat")
        if self.warmup is not None and self.warmup < 0:
            raise FieldError("warmup", f"must be >= 0, got {self.warmup}; use 0 for no warmup")
        if self.num_v_heads % self.num_k_heads:
            raise FieldError(
                "num_v_heads",
                f"{self.num_v_heads} is not a multiple of num_k_heads ({self.num_k_heads}); each key head "
                "serves num_v_heads // num_k_heads value heads, so choose a multiple",
            )
        dtypes = self.dtype if isinstance(self.dtype, list) else [self.dtype]
        if not dtypes:
            raise FieldError("dtype", "the list is empty; give at least one dtype, e.g. dtype: [fp32, bf16]")
        for dtype in dtypes:
            if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
                raise FieldError("dtype", f"unknown dtype {dtype!r}; use one of {', '.join(sorted(DTYPES))}")
        short = [dtype_name(to_dtype(d)) for d in dtypes]
        if len(set(short)) < len(short):
            raise FieldError("dtype", f"{self.dtype} names a dtype twice; list each once")
        self.threshold_spec = ThresholdSpec.parse(self.thresholds)  # FieldError("thresholds", ...)
        # The loader builds TrainSettings from the YAML mapping (naming the line of a bad key); Python
        # callers pass one.
        if self.train is not None and not isinstance(self.train, TrainSettings):
            raise FieldError("train", f"expected a mapping such as {{lr: 1.0e-4}}, got {self.train!r}")
        for sweep in self.effective_sweeps():
            if sweep.cp is None:
                raise FieldError("cp", "no CP degrees to sweep; add a list such as cp: [1, 2]")
            if sweep.seq_len is None and sweep.local_seq_len is None:
                raise FieldError(
                    "seq_len",
                    "no sequence lengths to sweep; add seq_len: [...] (global tokens; strong scaling) or "
                    "local_seq_len: [...] (tokens per rank; weak scaling)",
                )

    def effective_sweeps(self) -> list[Sweep]:
        """Each sweep with the top level and the defaults filled in."""
        top = self.sweep.over(DEFAULT_SWEEP)
        return [s.over(top) for s in self.sweeps] if self.sweeps else [top]

    @property
    def dtypes(self) -> list[str]:
        """The dtype names the scenario sweeps, as it spells them."""
        return list(self.dtype) if isinstance(self.dtype, list) else [self.dtype]

    def layer_config(self, dtype: str | None = None) -> GatedDeltaNetConfig:
        """The layer at `dtype` (default: the scenario's first dtype)."""
        dtype = self.dtypes[0] if dtype is None else dtype
        return GatedDeltaNetConfig(**{k: getattr(self, k) for k in MODEL_KEYS}, dtype=to_dtype(dtype))

    def bars(self, dtype: str) -> Bars:
        """`bench verify`'s pass bars for cases of `dtype` (bench/thresholds.py)."""
        return self.threshold_spec.for_dtype(dtype)

    def cases(self, *, warmup: int, repeat: int) -> list[Case]:
        """Every combination of every sweep, duplicates removed (first occurrence kept), in sweep order.

        `warmup`/`repeat` are the suite's; the scenario's own values win. Checkpoint only matters for p2p
        and all_gather: ulysses gets one case with checkpoint None whatever the list says. A list of dtypes
        is the outermost loop of every sweep.
        """
        common = {k: getattr(self, k) for k in MODEL_KEYS}
        common.update(
            scenario=self.name,
            batch=self.batch,
            seed=self.seed,
            warmup=warmup if self.warmup is None else self.warmup,
            repeat=repeat if self.repeat is None else self.repeat,
            dtype_in_id=isinstance(self.dtype, list) and len(self.dtype) > 1,
        )
        out: dict[str, Case] = {}
        for sweep in self.effective_sweeps():
            assert sweep.cp and sweep.mode and sweep.checkpoint and sweep.pass_  # filled by __post_init__
            for dtype in self.dtypes:
                for cp in sweep.cp:
                    lengths = sweep.seq_len or [n * cp for n in sweep.local_seq_len or ()]
                    for seq_len in lengths:
                        for mode in sweep.mode:
                            for ckpt in sweep.checkpoint if mode in SUMMARY_MODES else [None]:
                                for pass_ in sweep.pass_:
                                    case = Case(
                                        mode=mode,
                                        checkpoint=ckpt,
                                        cp=cp,
                                        seq_len=seq_len,
                                        pass_=pass_,
                                        dtype=dtype,
                                        **common,
                                    )
                                    out.setdefault(case.case_id, case)
        return list(out.values())

    def to_dict(self) -> dict[str, Any]:
        """The scenario as YAML keys (its definition, stored with results so that runs can be compared)."""
        out = {yaml_key(f.name): getattr(self, f.name) for f in config_fields(self) if f.name != "sweep"}
        out.update({yaml_key(k): v for k, v in dataclasses.asdict(self.sweep).items() if v is not None})
        out["sweeps"] = [
            {yaml_key(k): v for k, v in dataclasses.asdict(s).items() if v is not None} for s in self.sweeps
        ]
        out["train"] = None if self.train is None else self.train.to_dict()
        return out


@dataclass(kw_only=True, slots=True, frozen=True)
class Case:
    """One point of a sweep: `cp` ranks time `pass_` of `mode` on a global sequence of `seq_len` tokens."""

    scenario: str
    """Name of the scenario it came from."""
    mode: Mode
    """CP mode."""
    checkpoint: bool | None
    """Summary checkpoint (p2p, all_gather); None for ulysses, which has no summary."""
    cp: int
    """CP degree: ranks."""
    seq_len: int
    """Global sequence length; each rank holds seq_len // cp tokens."""
    pass_: Pass
    """The timed pass (JSON key `pass`)."""
    hidden_size: int
    """Model width."""
    num_k_heads: int
    """Hk."""
    num_v_heads: int
    """Hv."""
    head_k_dim: int
    """K."""
    head_v_dim: int
    """V."""
    conv_kernel_size: int
    """Conv1D width."""
    chunk_size: int
    """GDN chunk size."""
    dtype: str
    """Dtype name as the scenario spells it."""
    batch: int
    """B."""
    seed: int
    """Seed of weights, input and output gradient."""
    warmup: int
    """Untimed passes."""
    repeat: int
    """Timed passes."""
    dtype_in_id: bool = False
    """The scenario sweeps several dtypes, so the case id ends with the dtype (`...-fwd_bwd-bf16`)."""

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def local_seq_len(self) -> int:
        return self.seq_len // self.cp

    @property
    def case_id(self) -> str:
        """Stable and readable, e.g. `p2p-ckpt-cp4-T32768-fwd_bwd`, `ulysses-cp2-T4096-fwd`; with a dtype
        sweep `p2p-ckpt-cp4-T32768-fwd_bwd-bf16`."""
        ckpt = "" if self.checkpoint is None else ("-ckpt" if self.checkpoint else "-nockpt")
        dtype = f"-{dtype_name(to_dtype(self.dtype))}" if self.dtype_in_id else ""
        return f"{self.mode}{ckpt}-cp{self.cp}-T{self.seq_len}-{PASS_TAGS[self.pass_]}{dtype}"

    def key(self) -> str:
        """Identity across runs (resume, compare): scenario and case id."""
        return f"{self.scenario}/{self.case_id}"

    def layer_config(self) -> GatedDeltaNetConfig:
        return GatedDeltaNetConfig(**{k: getattr(self, k) for k in MODEL_KEYS}, dtype=to_dtype(self.dtype))

    def to_dict(self) -> dict[str, Any]:
        """JSON form with YAML key names (`pass`), plus the derived case_id and local_seq_len."""
        out = {"case_id": self.case_id}
        out.update({yaml_key(f.name): getattr(self, f.name) for f in dataclasses.fields(self)})
        out["local_seq_len"] = self.local_seq_len
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        keys = yaml_keys(cls)
        return cls(**{keys[k]: v for k, v in data.items() if k in keys})
