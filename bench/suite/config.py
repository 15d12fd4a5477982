"""The suite (bench.yaml) and scenarios (scenarios/*.yaml) as dataclasses, and their expansion into cases.

A scenario is a model (dims, dtype, batch) plus sweep lists. The sweep lists are written at the top level of
the file and, optionally, as a list of `sweeps`, each of which overrides some of them (for example a strong-
scaling sweep over seq_len and a weak-scaling sweep over local_seq_len in one file). Every combination of
the lists is one `Case`: one launch of `cp` ranks that times one pass of one mode.

Each dataclass checks its own fields in `__post_init__` (types from the annotations, bench.suite.fields, then
ranges) and raises `FieldError("key", "problem; fix")`; bench.suite.loader adds the file and line. YAML keys
are the field names, except that a trailing underscore (`pass_`, a Python keyword) is dropped: the YAML key
is `pass`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from itertools import product
from typing import Any, Literal

from pydantic import computed_field

from bench.errors import FieldError
from bench.records import DROP_DERIVED, RECORD_CONFIG, to_dict
from bench.suite.documents import Documents, parse_documents
from bench.suite.fields import check_fields, require_positive, yaml_key
from bench.suite.thresholds import Bars, ThresholdSpec
from gdn_cp import GatedDeltaNetConfig
from gdn_cp.distributed import DEFAULT_LAYOUT, MODES, SUMMARY_MODES, Layout, ModeName
from gdn_cp.distributed.modes import CommCase, CPOptions
from gdn_cp.distributed.platform import DeviceKind
from gdn_cp.dtypes import DTYPES, Precision, dtype_name, to_dtype
from gdn_cp.ops.backends import DEFAULT_BACKEND, backend_names, is_known

Mode = ModeName
"""CP modes of gdn_cp.LinearAttentionContextParallel (the registry, gdn_cp.distributed.modes)."""
Pass = Literal["forward", "forward_backward", "prefill"]
"""forward: the training forward (autograd on, no backward); forward_backward: forward then backward;
prefill: the serving forward (GatedDeltaNet.prefill under torch.inference_mode: no autograd, and the final
conv and recurrent states returned on every rank, what decoding continues from; summary checkpointing has no
effect on it, as nothing is saved for a backward)."""
Device = DeviceKind
"""Where ranks run (gdn_cp.distributed.DEVICES); auto picks npu, then cuda, then cpu."""
LayerType = Literal["linear_attention", "full_attention"]
"""Token mixer of a hybrid-model layer (gdn_cp.models.Qwen35HybridConfig.layer_types)."""
GradReduction = Literal["auto", "fsdp2", "all_reduce"]
"""How `bench verify --train` sums parameter gradients over the CP ranks."""
MasterWeights = Literal["fp32", "model"]
"""Where `bench verify --train` keeps parameters, gradients and AdamW state: fp32, or the model's dtype."""

PASS_TAGS: dict[str, str] = {"forward": "fwd", "forward_backward": "fwd_bwd", "prefill": "prefill"}
"""How a pass is spelled in case ids."""

DEFAULT_ROUNDS = 5
"""Rounds per case unless bench.yaml or the scenario says otherwise. Three are the fewest that give an
interval with some power (t_{0.975, 2} = 4.3; two rounds: 12.7); five (t_{0.975, 4} = 2.8, over sqrt(5))
narrow it about 2.5x, and rounds are cheap: a pool starts in tens of milliseconds."""

LAYER_KEYS = tuple(
    f.name for f in dataclasses.fields(GatedDeltaNetConfig) if f.name not in ("dtype", "backend")
)
"""The keys of a scenario file that set its layer (Scenario.layer: GatedDeltaNetConfig's fields; the dtype
and the backend are swept: Scenario.dtype, Sweep.backend)."""


# ----------------------------------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class SuiteConfig:
    """Suite defaults, from bench.yaml. Scenario values (warmup, repeat, device) override these."""

    device: Device = "auto"
    """Where ranks run: auto (npu, then cuda, then cpu), cpu (gloo), cuda (nccl), npu (hccl)."""
    warmup: int = 2
    """Untimed passes before timing, per case and round (the first also reads the peak memory)."""
    repeat: int = 5
    """Timed passes per case and round; a round's time is the median over repeats of the rank-max."""
    rounds: int = DEFAULT_ROUNDS
    """Rounds per case: each round is a separate lifetime of the ranks (a pool), every case once per round,
    in a shuffled order, so that drift spreads over all cases; the case's time and its 95% interval come
    from the round medians (bench.measure.statistics: one round gives no interval)."""
    compare_rounds: int = 10
    """Rounds each case gets in a `bench compare` or `bench gate` of two git refs, where its scenario plans
    fewer and no `--set rounds` is given: a verdict on a ratio needs more than an estimate of one time does
    (on the 2-core VM, 5 paired rounds of cpu-smoke called a 1.25x slower forward on 14 of 19 cases)."""
    threads_per_rank: int | None = None
    """torch threads per rank; null: cores // ranks (at least 1)."""
    timeout_s: float = 600.0
    """Per case and round, in seconds: the wall-clock limit of the case (a rank stopped or stuck outside a
    collective fails the case too, naming that rank), and a few seconds more the collective timeout."""
    results_dir: str = "runs"
    """Where `bench run` and `bench verify` write result files, and where `latest`, `latest~1`, ... find
    them (bench.results.names); the new folders of compare, plot, report, history and profile go under it
    too (relative to bench.yaml). Not results/, whose files are the committed baselines: git ignores runs/
    (.gitignore), so a user's runs never sit beside them."""
    plots_dir: str = "plots"
    """The committed charts (relative to bench.yaml), which the README embeds. No command writes there unless
    it is named (`bench plot RESULT --out plots`); by default `bench plot`, `bench report` and `bench run`
    write new folders under results_dir."""
    scenarios_dir: str = "scenarios"
    """Where scenario names are looked up (relative to bench.yaml)."""
    default_scenario: str = "cpu-smoke"
    """The scenario `bench run` runs when none is named."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.warmup < 0:
            raise FieldError("warmup", f"must be >= 0, got {self.warmup}; use 0 for no warmup")
        require_positive(self, "repeat", "rounds", "compare_rounds", "threads_per_rank")
        if self.timeout_s <= 0:
            raise FieldError("timeout_s", f"must be > 0 seconds, got {self.timeout_s}; e.g. timeout_s: 600")


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
    """CP modes; default: every registered mode (gdn_cp.distributed.MODES: ulysses, p2p, all_gather, scan)."""
    checkpoint: list[bool] | None = None
    """Summary checkpoint on/off (the modes with a summary only; ulysses runs once); default [true]."""
    overlap: list[bool] | None = None
    """The summary exchange overlapped with the outputs' state-free part, on/off (the modes with a summary
    only: LinearAttentionContextParallel.overlap); default [false]."""
    pass_: list[Pass] | None = None
    """Passes to time (YAML key `pass`: forward, forward_backward, prefill); default [forward,
    forward_backward]."""
    layout: list[Layout] | None = None
    """How the sequence is cut over the ranks (gdn_cp.distributed.LAYOUTS): contiguous (rank r holds the
    r-th slice) and/or zigzag (pieces r and 2 cp - 1 - r of 2 cp); default [contiguous]."""
    backend: list[str] | None = None
    """The local op of every rank (gdn_cp.ops.backends: gdn_cp, fla, transformers or a registered name), the
    layer's GatedDeltaNetConfig.backend; default [gdn_cp]. Case ids of another backend end with its name
    (`p2p-ckpt-cp2-T4096-fwd_bwd-fla`)."""
    documents: list[Documents | None] | Documents | None = None
    """Packed documents (bench.suite.documents): a list of mappings such as {count: 64, lengths: lognormal}
    and/or null (one unpacked sequence), e.g. [null, {count: 64, lengths: lognormal}] to compare both; a
    single mapping means a list of it; default [null]. Packing needs batch 1."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.documents is not None:
            entries = self.documents if isinstance(self.documents, list) else [self.documents]
            self.documents = [parse_documents(d) for d in entries]
        for f in dataclasses.fields(self):
            if getattr(self, f.name) == []:
                raise FieldError(
                    yaml_key(f.name), "the list is empty; give at least one value or remove the key"
                )
        require_positive(self, "cp", "seq_len", "local_seq_len")
        for name in self.backend or ():
            if not is_known(name):  # the installed plugins loaded first, as a lookup does
                raise FieldError(
                    "backend",
                    f"unknown backend {name!r}; use one of {', '.join(backend_names())} (for your own, put "
                    "its gdn_cp.ops.register_backend call in a module and pass --backend-module MODULE or "
                    "BENCH_BACKENDS=MODULE, or declare a `gdn_cp.backends` entry point)",
                )
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


DEFAULT_SWEEP = Sweep(
    mode=list(MODES),
    checkpoint=[True],
    overlap=[False],
    pass_=["forward", "forward_backward"],
    layout=[DEFAULT_LAYOUT],
    backend=[DEFAULT_BACKEND],
    documents=[None],
)
"""What a scenario sweeps when it does not say: every mode, checkpoint on, no overlap, both training passes
(prefill only when asked), the contiguous layout, one unpacked sequence."""


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
        require_positive(self, "steps", "vocab_size", "intermediate_size", "num_attention_heads")
        require_positive(self, "num_key_value_heads", "head_dim")
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


@dataclass(kw_only=True, slots=True)
class Scenario:
    """One scenario file: a model and the lists to sweep over it."""

    __pydantic_config__ = RECORD_CONFIG

    name: str
    """The file name without .yaml (not a YAML key)."""
    description: str = ""
    """One line: what the scenario measures and why."""
    device: Device | None = None
    """Where it runs; null: the suite's device. `bench run --device` overrides both."""
    layer: GatedDeltaNetConfig
    """The layer's sizes (its fields are top-level keys of the file: hidden_size, num_k_heads, num_v_heads,
    head_k_dim, head_v_dim, conv_kernel_size, rms_norm_eps, chunk_size); its dtype is each case's, `dtype`."""
    dtype: str | list[str] | None = None
    """Parameter and activation dtype: fp32, bf16, fp16, fp64 (or their long names), null: the layer's (fp32
    unless a Python caller's layer says otherwise); a list sweeps several
    (each case takes one, and case ids then end with it: `p2p-ckpt-cp2-T128-fwd_bwd-bf16`)."""
    precision: Precision = "fp32"
    """How the layer's fp32 matmuls run on a device: fp32 (TF32 off), or tf32 (TF32 on a GPU, HF32 on an
    NPU, fp32 accumulation; gdn_cp.dtypes.Precision); the same on cpu. Case ids of tf32 end with `-tf32`."""
    batch: int = 1
    """Sequences per step (B)."""
    seed: int = 0
    """Seed of the weights, the input and the output gradient (identical on every rank). `bench verify
    --seeds N` runs seeds seed, seed + 1, ..., seed + N - 1."""
    warmup: int | None = None
    """Untimed passes per case; null: the suite's."""
    repeat: int | None = None
    """Timed passes per case and round; null: the suite's."""
    rounds: int | None = None
    """Rounds per case (separate lifetimes of the ranks, see SuiteConfig.rounds); null: the suite's."""
    thresholds: dict[str, Any] | None = None
    """`bench verify` pass bars: a mapping of bar -> value for every dtype, and optionally per dtype
    (`fp32: {rel_l2: 1.0e-4}`) on top; unset bars are the PR's. Keys and resolution:
    bench/suite/thresholds.py."""
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
        require_positive(self, "batch", "repeat", "rounds")
        if self.warmup is not None and self.warmup < 0:
            raise FieldError("warmup", f"must be >= 0, got {self.warmup}; use 0 for no warmup")
        dtypes = self.dtypes
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
            self._check_documents(sweep)

    def _check_documents(self, sweep: Sweep) -> None:
        """FieldError when a sweep packs documents into a batch of several sequences, or more documents
        than a sequence of its has tokens."""
        packed = [d for d in sweep.documents or () if d is not None]
        if packed and self.batch != 1:
            raise FieldError(
                "batch",
                f"documents pack one sequence (the layer's cu_seqlens needs batch 1), got batch "
                f"{self.batch}; use batch: 1 (the documents are the batch), or documents: [null]",
            )
        lengths = sweep.seq_len or [n * cp for n in sweep.local_seq_len or () for cp in sweep.cp or ()]
        for documents in packed:
            try:
                documents.check(min(lengths))
            except FieldError as exc:
                raise FieldError("documents", f"{exc.key}: {exc.message}") from None

    def effective_sweeps(self) -> list[Sweep]:
        """Each sweep with the top level and the defaults filled in."""
        top = self.sweep.over(DEFAULT_SWEEP)
        return [s.over(top) for s in self.sweeps] if self.sweeps else [top]

    @property
    def dtypes(self) -> list[str]:
        """The dtype names the scenario sweeps, as it spells them (the layer's when it names none)."""
        if self.dtype is None:
            return [dtype_name(self.layer.dtype)]
        return list(self.dtype) if isinstance(self.dtype, list) else [self.dtype]

    def layer_config(self, dtype: str | None = None, backend: str | None = None) -> GatedDeltaNetConfig:
        """The layer at `dtype` on `backend` (defaults: the scenario's first dtype, the layer's backend)."""
        return dataclasses.replace(
            self.layer,
            dtype=self.dtypes[0] if dtype is None else dtype,
            backend=self.layer.backend if backend is None else backend,
        )

    def bars(self, dtype: str) -> Bars:
        """`bench verify`'s pass bars for cases of `dtype` (bench/suite/thresholds.py)."""
        return self.threshold_spec.for_dtype(dtype)

    def cases(self, *, warmup: int, repeat: int, rounds: int = 1) -> list[Case]:
        """Every combination of every sweep, duplicates removed (first occurrence kept), in sweep order.

        `warmup`/`repeat`/`rounds` are the suite's; the scenario's own values win. Checkpoint only matters for
        p2p and all_gather: ulysses gets one case with checkpoint None whatever the list says; likewise the
        layout only matters at cp > 1 (cp 1 runs once, contiguous). A list of dtypes is the outermost loop
        of every sweep; per point the order is backend, checkpoint, overlap, layout, documents, pass (overlap
        only at cp > 1, where there is an exchange to overlap).
        """
        common: dict[str, Any] = dict(
            scenario=self.name,
            batch=self.batch,
            seed=self.seed,
            warmup=warmup if self.warmup is None else self.warmup,
            repeat=repeat if self.repeat is None else self.repeat,
            rounds=rounds if self.rounds is None else self.rounds,
            dtype_in_id=isinstance(self.dtype, list) and len(self.dtype) > 1,
            precision=self.precision,
        )
        out: dict[str, Case] = {}
        for sweep in self.effective_sweeps():
            # filled by __post_init__ and DEFAULT_SWEEP
            assert (
                sweep.cp
                and sweep.mode
                and sweep.checkpoint
                and sweep.overlap
                and sweep.pass_
                and sweep.layout
                and sweep.backend
            )
            assert isinstance(sweep.documents, list)
            for dtype, cp in product(self.dtypes, sweep.cp):
                lengths = sweep.seq_len or [n * cp for n in sweep.local_seq_len or ()]
                for seq_len, mode in product(lengths, sweep.mode):
                    checkpoints = sweep.checkpoint if mode in SUMMARY_MODES else [None]
                    overlaps = sweep.overlap if mode in SUMMARY_MODES and cp > 1 else [False]
                    # one rank holds zigzag's two pieces in order: at cp 1 it is the contiguous layout
                    layouts = sweep.layout if cp > 1 else [DEFAULT_LAYOUT]
                    inputs = product(
                        sweep.backend, checkpoints, overlaps, layouts, sweep.documents, sweep.pass_
                    )
                    for backend, ckpt, overlap, layout, documents, pass_ in inputs:
                        case = Case(
                            mode=mode,
                            checkpoint=ckpt,
                            overlap=overlap,
                            cp=cp,
                            seq_len=seq_len,
                            pass_=pass_,
                            layer=self.layer_config(dtype, backend),
                            layout=layout,
                            documents=documents,
                            **common,
                        )
                        out.setdefault(case.case_id, case)
        return list(out.values())

    def to_dict(self) -> dict[str, Any]:
        """The scenario as the keys of its file (its definition, stored with results so that runs can be
        compared): the layer's and the top-level sweep's keys at the top, unset sweep lists left out."""
        out = to_dict(self)
        del out["name"]
        out.update({k: v for k, v in out.pop("layer").items() if k not in ("dtype", "backend")})
        out["dtype"] = self.dtypes if isinstance(self.dtype, list) else self.dtypes[0]
        out.update({k: v for k, v in out.pop("sweep").items() if v is not None})
        out["sweeps"] = [{k: v for k, v in sweep.items() if v is not None} for sweep in out["sweeps"]]
        return out


@dataclass(kw_only=True, slots=True, frozen=True)
class Case:
    """One point of a sweep: `cp` ranks time `pass_` of `mode` on a global sequence of `seq_len` tokens."""

    __pydantic_config__ = RECORD_CONFIG

    scenario: str
    """Name of the scenario it came from."""
    mode: Mode
    """CP mode."""
    checkpoint: bool | None
    """Summary checkpoint (the modes with a summary: p2p, all_gather, scan); None for ulysses."""
    cp: int
    """CP degree: ranks."""
    seq_len: int
    """Global sequence length; each rank holds seq_len // cp tokens."""
    pass_: Pass
    """The timed pass (JSON key `pass`)."""
    layer: GatedDeltaNetConfig
    """The layer, in the case's dtype."""
    batch: int
    """B."""
    seed: int
    """Seed of weights, input and output gradient."""
    warmup: int
    """Untimed passes."""
    repeat: int
    """Timed passes per round."""
    rounds: int = 1
    """Rounds (separate lifetimes of the ranks)."""
    dtype_in_id: bool = False
    """The scenario sweeps several dtypes, so the case id ends with the dtype (`...-fwd_bwd-bf16`)."""
    layout: Layout = DEFAULT_LAYOUT
    """How the sequence is cut over the ranks: contiguous, or zigzag (pieces r and 2 cp - 1 - r of 2 cp)."""
    documents: Documents | None = None
    """Packed documents (bench.suite.documents; their global boundaries are the layer's cu_seqlens), or
    null: unpacked sequences."""
    overlap: bool = False
    """The summary exchange overlapped with the outputs' state-free part (modes with a summary, cp > 1)."""
    precision: Precision = "fp32"
    """How the layer's fp32 matmuls ran on the device (gdn_cp.dtypes.Precision)."""

    _derived = DROP_DERIVED

    def __post_init__(self) -> None:
        check_fields(self)
        if self.documents is not None:
            if self.batch != 1:
                raise FieldError(
                    "batch", f"documents pack one sequence (cu_seqlens needs batch 1), got batch {self.batch}"
                )
            try:
                self.documents.check(self.seq_len)
            except FieldError as exc:
                raise FieldError("documents", f"{exc.key}: {exc.message}") from None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def local_seq_len(self) -> int:
        """Tokens per rank: seq_len // cp (derived)."""
        return self.seq_len // self.cp

    @property
    def dtype(self) -> str:
        """The layer's dtype by its short name (fp32, bf16, fp16, fp64)."""
        return dtype_name(self.layer.dtype)

    @property
    def backend(self) -> str:
        """The local op the case ran on (the layer's backend, gdn_cp.ops.backends)."""
        return self.layer.backend

    @property
    def options(self) -> CPOptions:
        """The CP options the case asks for, the one record every rank function builds its layer or model
        with (gdn_cp.distributed.CPOptions; checkpoint None, ulysses', keeps the record's default, which a
        mode without a summary ignores)."""
        fields: dict[str, object] = (
            {"checkpoint_summary": self.checkpoint} if self.checkpoint is not None else {}
        )
        return CPOptions(
            mode=self.mode, layout=self.layout, overlap=self.overlap, backend=self.backend, **fields
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def case_id(self) -> str:
        """Stable and readable, e.g. `p2p-ckpt-cp4-T32768-fwd_bwd`, `ulysses-cp2-T4096-fwd`; with a dtype
        sweep `p2p-ckpt-cp4-T32768-fwd_bwd-bf16`, then `-tf32` and a backend other than gdn_cp
        (`...-fwd_bwd-bf16-tf32-fla`); overlap on adds `-overlap` after the checkpoint tag; the
        zigzag layout and packed documents add their tags
        after the length, `p2p-ckpt-cp4-T32768-zigzag-docs64-lognormal-fwd_bwd` (the ids of cases in the
        contiguous layout without documents are what they always were)."""
        ckpt = "" if self.checkpoint is None else ("-ckpt" if self.checkpoint else "-nockpt")
        ckpt += "-overlap" if self.overlap else ""
        dtype = f"-{self.dtype}" if self.dtype_in_id else ""
        dtype += "" if self.precision == "fp32" else f"-{self.precision}"
        dtype += "" if self.backend == DEFAULT_BACKEND else f"-{self.backend}"
        return f"{self.mode}{ckpt}-cp{self.cp}-T{self.seq_len}{self.input_tag}-{PASS_TAGS[self.pass_]}{dtype}"

    @property
    def input_tag(self) -> str:
        """The case id's part for the layout and documents: "" (contiguous, unpacked), `-zigzag`,
        `-docs64-lognormal`, `-zigzag-docs64-lognormal`."""
        layout = "" if self.layout == DEFAULT_LAYOUT else f"-{self.layout}"
        return layout + ("" if self.documents is None else f"-{self.documents.tag}")

    def cu_seqlens(self) -> list[int] | None:
        """The global document boundaries [0, ..., seq_len] the layer takes, or None (unpacked)."""
        return None if self.documents is None else self.documents.bounds(self.seq_len)

    def key(self) -> str:
        """Identity across runs (resume, compare): scenario and case id."""
        return f"{self.scenario}/{self.case_id}"

    def comm_case(self, rank: int) -> CommCase:
        """What the communication model reads of this case for one of its ranks."""
        return CommCase(
            self.layer,
            cp=self.cp,
            rank=rank,
            seq_len=self.seq_len,
            batch=self.batch,
            backward=self.pass_ == "forward_backward",
            layout=self.layout,
            final_states=self.final_states,
        )

    @property
    def final_states(self) -> int:
        """Sequences whose final states the pass returns: a prefill's batch, or the documents packed in it;
        0 for the training passes."""
        if self.pass_ != "prefill":
            return 0
        bounds = self.cu_seqlens()
        return self.batch if bounds is None else len(bounds) - 1
