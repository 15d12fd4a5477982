"""Every validation error of bench.yaml, scenario files and --set: one line naming file (and line), key
and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.launch import estimate
from bench.launch.preflight import check_cases
from bench.suite.loader import (
    ConfigError,
    find_scenario,
    load_scenario,
    load_suite,
    parse_overrides,
    read_scenario,
)
from gdn_cp.distributed import Platform, resolve_platform

BASE = """\
hidden_size: 64
num_k_heads: 2
num_v_heads: 4
head_k_dim: 16
head_v_dim: 16
cp: [1, 2]
seq_len: [128]
"""


def error_of(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message  # one line
    return message


def load(write_scenario, text: str, sets: list[str] | None = None):
    path = write_scenario("s", text)
    return load_scenario(path, parse_overrides(sets or []))


def check(write_scenario, text: str, sets: list[str] | None = None, **kwargs):
    path = write_scenario("s", text)
    scenario, locate = read_scenario(path, parse_overrides(sets or []))
    kwargs.setdefault("platform", None)
    kwargs.setdefault("ranks_on_host", lambda c: c.cp)
    kwargs.setdefault("max_local_ranks", None)
    check_cases(locate, scenario, scenario.cases(warmup=1, repeat=1), **kwargs)


def test_valid_base_loads(write_scenario):
    s = load(write_scenario, BASE)
    assert s.name == "s" and len(s.cases(warmup=1, repeat=1)) == 16  # 2 lengths x 2 passes x 4 modes


def test_malformed_yaml_names_the_line(write_scenario):
    msg = error_of(load, write_scenario, BASE + "mode: [p2p\nchunk_size: 8\n")
    assert msg.startswith("scenarios/s.yaml:") and "malformed YAML" in msg and "fix the syntax" in msg
    line = int(msg.split(":")[1])
    assert line in (8, 9)


@pytest.mark.parametrize(
    ("nesting", "message"),
    [
        ("[" * 2000 + "]" * 2000, "scenarios/s.yaml: nested far more than the 32 levels"),  # PyYAML recurses
        ("[" * 40 + "]" * 40, "scenarios/s.yaml:8: nested 33 levels deep, more than the 32"),
    ],
    ids=["2000-levels", "40-levels"],
)
def test_deep_nesting_is_refused_with_one_line(write_scenario, nesting, message):
    msg = error_of(load, write_scenario, BASE + f"description: {nesting}\n")
    assert msg.startswith(message) and msg.endswith("flatten it"), msg


def test_a_huge_file_is_refused_before_it_is_parsed(write_scenario):
    msg = error_of(load, write_scenario, BASE + "description: [" + "1, " * 400_000 + "1]\n")
    assert msg.startswith("scenarios/s.yaml: 1.1 MiB, more than the 1 MiB"), msg


def test_yaml_is_parsed_once(write_scenario, monkeypatch):
    composed = []
    real = yaml.SafeLoader.get_single_node
    monkeypatch.setattr(yaml.SafeLoader, "get_single_node", lambda self: composed.append(1) or real(self))
    monkeypatch.setattr(yaml, "safe_load", lambda *a: pytest.fail("parsed a second time"))
    load(write_scenario, BASE)
    assert composed == [1]


def test_not_a_mapping(write_scenario):
    msg = error_of(load, write_scenario, "- a\n- b\n")
    assert msg.startswith("scenarios/s.yaml: expected a mapping")


def test_unknown_key_suggests_the_closest(write_scenario):
    msg = error_of(load, write_scenario, BASE + "repeats: 3\n")
    assert msg == "scenarios/s.yaml:8: repeats: unknown key; did you mean 'repeat'?"


def test_unknown_key_without_a_close_match_lists_known_keys(write_scenario):
    msg = error_of(load, write_scenario, BASE + "zzz: 3\n")
    assert msg.startswith("scenarios/s.yaml:8: zzz: unknown key; use one of ") and "seq_len" in msg


def test_name_key_is_refused(write_scenario):
    msg = error_of(load, write_scenario, "name: other\n" + BASE)
    assert msg.startswith("scenarios/s.yaml:1: name: a scenario is named by its file (s)")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("mode: [ring]", "mode: unknown mode 'ring'; use one of ulysses, p2p, all_gather, scan"),
        ("pass: [fwd]", "pass: unknown pass 'fwd'; use one of forward, forward_backward"),
        ("device: gpu", "device: unknown device 'gpu'; use one of auto, cpu, cuda, npu"),
        ("dtype: fp8", "dtype: unknown dtype 'fp8'; use one of bf16, bfloat16"),
        ("batch: two", "batch: expected an integer, got 'two' (str); fix the value"),
        ("batch: 0", "batch: must be positive, got 0"),
        ("checkpoint: [yes, maybe]", "checkpoint: expected true or false, got 'maybe'"),
        ("mode: p2p", "mode: expected a list, got 'p2p'; write a YAML list such as mode: [p2p]"),
        ("mode: []", "mode: the list is empty; give at least one value or remove the key"),
        ("warmup: -1", "warmup: must be >= 0, got -1; use 0 for no warmup"),
        ("cp: [0]", "cp: must be positive, got 0; use an integer >= 1"),
    ],
)
def test_wrong_values_name_file_line_key_and_fix(write_scenario, line, expected):
    base = BASE.replace("cp: [1, 2]", "# cp: below") if line.startswith("cp:") else BASE  # a key once
    msg = error_of(load, write_scenario, base + line + "\n")
    assert msg.startswith("scenarios/s.yaml:8: ") and expected in msg, msg


def test_value_heads_not_a_multiple_of_key_heads(write_scenario):
    msg = error_of(load, write_scenario, BASE.replace("num_v_heads: 4", "num_v_heads: 3"))
    assert msg.startswith("scenarios/s.yaml:3: num_v_heads: 3 is not a multiple of num_k_heads (2)")
    assert "choose a multiple" in msg


def test_missing_required_key(write_scenario):
    msg = error_of(load, write_scenario, BASE.replace("head_v_dim: 16\n", ""))
    assert msg == "scenarios/s.yaml: head_v_dim: required but missing; add head_v_dim: <value>"


def test_both_seq_len_and_local_seq_len(write_scenario):
    msg = error_of(load, write_scenario, BASE + "local_seq_len: [64]\n")
    assert msg.startswith("scenarios/s.yaml:") and "local_seq_len: set seq_len" in msg and "not both" in msg


def test_neither_seq_len_nor_local_seq_len(write_scenario):
    msg = error_of(load, write_scenario, BASE.replace("seq_len: [128]\n", ""))
    assert msg.startswith("scenarios/s.yaml: seq_len: no sequence lengths to sweep; add seq_len:")


def test_no_cp(write_scenario):
    msg = error_of(load, write_scenario, BASE.replace("cp: [1, 2]\n", ""))
    assert msg == "scenarios/s.yaml: cp: no CP degrees to sweep; add a list such as cp: [1, 2]"


def test_sweep_entry_errors_name_the_entry(write_scenario):
    text = BASE + "sweeps:\n  - {seq_len: [64]}\n  - {cp: [2], hidden_size: 8}\n"
    msg = error_of(load, write_scenario, text)
    assert msg.startswith("scenarios/s.yaml:10: sweeps[1].hidden_size: unknown key")
    msg = error_of(load, write_scenario, BASE + "sweeps:\n  - mode: [ring]\n")
    assert msg.startswith("scenarios/s.yaml:9: sweeps[0].mode: unknown mode 'ring'")
    msg = error_of(load, write_scenario, BASE + "sweeps: [3]\n")
    assert msg.startswith("scenarios/s.yaml:8: sweeps[0]: expected a mapping")


def test_ulysses_heads_not_divisible_by_cp(write_scenario):
    msg = error_of(check, write_scenario, BASE.replace("cp: [1, 2]", "cp: [4]"))
    assert msg.startswith("scenarios/s.yaml:6: cp: case ulysses-cp4-T128-fwd: ulysses shards heads over cp=4")
    assert msg.endswith(
        "ulysses shards heads over cp=4 ranks, but num_k_heads=2 is not divisible by 4 (num_v_heads=4 is); "
        "choose a cp that divides both (1, 2), or a mode that runs it: p2p, all_gather, scan"
    )


def test_a_cp_the_host_cannot_run_is_said_before_the_heads_it_cannot_split(write_scenario):
    """Issue 46: `--set cp=[64]` said the heads (twice over) and advised "mode p2p / all_gather", advice
    that led to the next error, "needs 64 ranks". What the host can run comes first, and the shape's
    advice names every mode that runs it (scan too)."""
    msg = error_of(check, write_scenario, BASE, ["cp=[64]"], max_local_ranks=8)
    assert msg.startswith("scenarios/s.yaml (--set cp=[64]): cp: case ulysses-cp64-T128-fwd needs 64 ranks")
    assert "use a cp of at most 8, or launch across hosts with torchrun (docs/clusters.md)" in msg
    msg = error_of(check, write_scenario, BASE, ["cp=[8]"], max_local_ranks=8)
    assert (
        "num_k_heads=2 and num_v_heads=4 are not divisible by 8; choose a cp that divides both (1, 2)" in msg
    )
    assert msg.count("num_k_heads") == 1 and msg.endswith("or a mode that runs it: p2p, all_gather, scan")


def test_seq_len_not_divisible_by_cp(write_scenario):
    msg = error_of(check, write_scenario, BASE.replace("seq_len: [128]", "seq_len: [129]"))
    assert msg.startswith("scenarios/s.yaml:7: seq_len: case ulysses-cp2-T129-fwd:")
    assert "use a multiple of 2" in msg


def test_too_many_local_ranks(write_scenario):
    msg = error_of(
        check, write_scenario, BASE.replace("cp: [1, 2]", "cp: [16]") + "mode: [p2p]\n", max_local_ranks=8
    )
    assert msg.startswith("scenarios/s.yaml:6: cp: case p2p-ckpt-cp16-T128-fwd needs 16 ranks on this host")
    assert "use a cp of at most 8, or launch across hosts with torchrun" in msg


def test_case_that_cannot_fit_in_memory(write_scenario, monkeypatch):
    monkeypatch.setattr(estimate, "host_available_bytes", lambda: 100 * 2**20)  # a host with 100 MiB free
    text = BASE.replace("seq_len: [128]", "seq_len: [1048576]")
    msg = error_of(check, write_scenario, text, platform=resolve_platform("cpu"))
    assert msg.startswith("scenarios/s.yaml:7: seq_len: case ulysses-cp1-T1048576-fwd needs about")
    assert "GiB per rank by a rough estimate" in msg and "but 100.0 MiB is available" in msg
    assert "use a shorter seq_len, a smaller batch or a larger cp, or leave the case out with --filter" in msg
    # the same case fits when the host has room
    monkeypatch.setattr(estimate, "host_available_bytes", lambda: 2**50)
    check(write_scenario, text, platform=resolve_platform("cpu"))


def test_fp64_on_an_npu_is_refused_before_any_rank_starts(write_scenario, monkeypatch):
    monkeypatch.setattr(estimate, "probe_devices", lambda p: pytest.fail("refused before memory is read"))
    text = BASE + "dtype: fp64\n"
    msg = error_of(check, write_scenario, text, platform=Platform("npu", "hccl"))
    assert msg.startswith("scenarios/s.yaml:") and ": dtype: case " in msg, msg
    assert "fp64 on npu: Ascend NPUs have no fp64 matrix units; use fp32 or bf16 there" in msg


def test_weak_scaling_memory_error_names_local_seq_len(write_scenario, monkeypatch):
    monkeypatch.setattr(estimate, "host_available_bytes", lambda: 2**20)
    text = BASE.replace("seq_len: [128]", "local_seq_len: [4096]").replace("cp: [1, 2]", "cp: [2]")
    msg = error_of(check, write_scenario, text, platform=resolve_platform("cpu"))
    assert msg.startswith("scenarios/s.yaml:7: local_seq_len: case ulysses-cp2-T8192-fwd needs about")
    assert "MiB per rank by a rough estimate (bench/launch/estimate.py) x 2 ranks on this host = " in msg


# --set


def test_set_values_are_yaml_and_apply_to_every_sweep(write_scenario):
    text = BASE + "sweeps:\n  - {cp: [1]}\n  - {cp: [2], seq_len: [256]}\n"
    s = load(write_scenario, text, ["cp=[4]", "mode=[p2p]", "repeat=3"])
    cases = s.cases(warmup=1, repeat=10)
    assert (
        {c.cp for c in cases} == {4}
        and {c.mode for c in cases} == {"p2p"}
        and {c.repeat for c in cases} == {3}
    )
    assert {c.seq_len for c in cases} == {128, 256}


def test_set_length_replaces_the_other_length(write_scenario):
    s = load(write_scenario, BASE, ["local_seq_len=[32]"])
    assert {c.seq_len for c in s.cases(warmup=1, repeat=1)} == {32, 64}


def test_set_errors_name_the_flag(write_scenario):
    msg = error_of(load, write_scenario, BASE, ["mode=[ring]"])
    assert (
        msg == "scenarios/s.yaml (--set mode=[ring]): mode: unknown mode 'ring'; use one of ulysses, p2p, "
        "all_gather, scan"
    )
    msg = error_of(check, write_scenario, BASE, ["cp=[3]"])
    assert msg.startswith("scenarios/s.yaml (--set cp=[3]): cp: case ulysses-cp3-T128-fwd:")


def test_a_dotted_set_key_sets_inside_a_mapping_and_keeps_the_rest(write_scenario):
    """Issue 37: `--set train.vocab_size=512` was refused; the whole mapping had to be given."""
    text = BASE + "train:\n  steps: 7\n  vocab_size: 256\n"
    s = load(write_scenario, text, ["train.vocab_size=512", "thresholds.bf16.rel_l2=0.02"])
    assert s.train is not None and s.train.vocab_size == 512 and s.train.steps == 7  # the rest kept
    assert s.thresholds == {"bf16": {"rel_l2": 0.02}}  # a mapping the file did not have is made
    assert load(write_scenario, BASE, ["train.steps=3"]).train.steps == 3
    msg = error_of(load, write_scenario, text, ["train.steps.x=1"])
    assert msg == (
        "--set train.steps.x=1: train.steps is not a mapping here, so no key can be set inside it; set it "
        "whole, e.g. --set 'train.steps={...}'"
    )
    msg = error_of(load, write_scenario, text, ["train.vocab_sise=512"])
    assert "vocab_sise" in msg and "--set train.vocab_sise=512" in msg  # the unknown inner key, named


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("repeat", "--set repeat: expected key=value, e.g. --set repeat=3"),
        ("train.=3", "--set train.=3: expected key=value"),
        ("=3", "--set =3: expected key=value"),
        ("rpeat=3", "--set rpeat=3: unknown key 'rpeat'; did you mean 'repeat'?"),
        ("cp=[1,", "--set cp=[1,: cp: the value is not valid YAML"),
    ],
)
def test_set_parsing_errors(item, expected):
    msg = error_of(parse_overrides, [item])
    assert msg.startswith(expected), msg


def test_set_parses_yaml_values():
    (a, b, c) = parse_overrides(["repeat=3", "cp=[1, 2]", "device=cpu"])
    assert (a.key, a.value, b.value, c.value) == ("repeat", 3, [1, 2], "cpu")
    assert b.text == "--set cp=[1, 2]"


# suite and scenario lookup


def test_suite_file_errors(suite_dir: Path):
    (suite_dir / "bench.yaml").write_text("warmup: 1\nrepeet: 2\n")
    assert error_of(load_suite) == "bench.yaml:2: repeet: unknown key; did you mean 'repeat'?"
    (suite_dir / "bench.yaml").write_text("timeout_s: soon\n")
    assert error_of(load_suite).startswith("bench.yaml:1: timeout_s: expected a number, got 'soon'")
    assert error_of(load_suite, "nowhere.yaml").startswith("nowhere.yaml: no such suite file")


def test_suite_set_overrides(suite_dir: Path):
    suite = load_suite(None, parse_overrides(["repeat=7", "device=cpu"]))
    assert suite.config.repeat == 7 and suite.config.device == "cpu" and suite.root == suite_dir.resolve()
    msg = error_of(load_suite, None, parse_overrides(["timeout_s=-1"]))
    assert msg.startswith("bench.yaml (--set timeout_s=-1): timeout_s: must be > 0")


def test_suite_defaults_without_bench_yaml(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    suite = load_suite()
    assert suite.path is None and suite.config.default_scenario == "cpu-smoke" and suite.root == tmp_path


def test_find_scenario(suite_dir: Path):
    suite = load_suite()
    assert find_scenario(suite, "tiny") == suite.scenarios_dir / "tiny.yaml"
    assert find_scenario(suite, "scenarios/tiny.yaml") == Path("scenarios/tiny.yaml")
    assert error_of(find_scenario, suite, "tinny").startswith(
        "scenario 'tinny': no scenarios/tinny.yaml; did you mean 'tiny'? (see `bench list`)"
    )
    assert error_of(find_scenario, suite, "x/y.yaml").startswith("x/y.yaml: no such scenario file")


def test_shipped_scenarios_are_valid():
    root = Path(__file__).resolve().parents[3]
    suite = load_suite(root / "bench.yaml")
    names = sorted(p.stem for p in suite.scenarios_dir.glob("*.yaml"))
    assert {"cpu-smoke", "cpu-scaling", "npu-cp4-32k", "npu-cp8-scaling", "npu-checkpoint-ablation"} <= set(
        names
    )
    for name in names:
        path = find_scenario(suite, name)
        scenario, locate = read_scenario(path)
        cases = scenario.cases(warmup=suite.config.warmup, repeat=suite.config.repeat)
        check_cases(
            locate, scenario, cases, platform=None, ranks_on_host=lambda c: c.cp, max_local_ranks=None
        )
        assert cases, name


# bad input the loader meets before YAML


def test_a_file_that_is_not_utf8_names_its_line(suite_dir: Path, write_scenario):
    path = write_scenario("s", BASE)
    path.write_bytes(BASE.encode() + b"description: caf\xe9\n")  # Latin-1
    msg = error_of(load_scenario, path)
    assert msg == "scenarios/s.yaml:8: not UTF-8 text (byte 0xe9); save the file as UTF-8"
    (suite_dir / "bench.yaml").write_bytes(b"\xff\xfew\x00a\x00")  # UTF-16
    assert error_of(load_suite) == "bench.yaml:1: not UTF-8 text (byte 0xff); save the file as UTF-8"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "cp: [4]\n", "scenarios/s.yaml:8: cp: given twice (lines 6 and 8); keep one of them"),
        (
            BASE + "sweeps:\n  - {seq_len: [64], seq_len: [32]}\n",
            "scenarios/s.yaml:9: seq_len: given twice (lines 9 and 9); keep one of them",
        ),
        (
            BASE + "train:\n  lr: 1.0e-4\n  steps: 3\n  lr: 1.0e-3\n",
            "scenarios/s.yaml:11: lr: given twice (lines 9 and 11); keep one of them",
        ),
    ],
)
def test_a_key_given_twice_names_both_lines(write_scenario, text, expected):
    assert error_of(load, write_scenario, text) == expected


def test_suite_key_given_twice(suite_dir: Path):
    (suite_dir / "bench.yaml").write_text("repeat: 3\nwarmup: 1\nrepeat: 5\n")
    assert error_of(load_suite) == "bench.yaml:3: repeat: given twice (lines 1 and 3); keep one of them"


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_timeout_must_be_finite(suite_dir: Path, value):
    (suite_dir / "bench.yaml").write_text(f"timeout_s: {value}\n")
    assert error_of(load_suite).startswith("bench.yaml:1: timeout_s: expected a finite number, got ")


def test_an_absurd_chunk_size_is_refused_by_the_memory_estimate(write_scenario, monkeypatch):
    monkeypatch.setattr(estimate, "host_available_bytes", lambda: 64 * 2**30)  # a host with 64 GiB free
    text = BASE + "chunk_size: 1000000\n"
    msg = error_of(check, write_scenario, text, platform=resolve_platform("cpu"))
    assert msg.startswith("scenarios/s.yaml:8: chunk_size: case ulysses-cp1-T128-fwd needs about ")
    assert "chunk_size 1000000 pads each rank's 128 tokens to a whole chunk" in msg
    assert msg.endswith("use a chunk_size of at most 128")
    # a chunk a little larger than the shard is allowed when it fits
    check(write_scenario, BASE + "chunk_size: 256\n", platform=resolve_platform("cpu"))


# layouts and packed documents


def test_documents_and_layout_load_from_yaml(write_scenario):
    text = BASE + "layout: [contiguous, zigzag]\ndocuments: [null, {count: 4, lengths: lognormal, seed: 1}]\n"
    cases = load(write_scenario, text).cases(warmup=1, repeat=1)
    packed = [c for c in cases if c.documents is not None]
    assert {c.documents.tag for c in packed} == {"docs4-lognormal-seed1"}
    assert {c.layout for c in cases if c.cp == 2} == {"contiguous", "zigzag"}
    assert "ulysses-cp2-T128-zigzag-docs4-lognormal-seed1-fwd" in {c.case_id for c in cases}
    # a single mapping is a list of it, from the top level, a sub-sweep or --set
    (single,) = {
        c.documents for c in load(write_scenario, BASE + "documents: {count: 2}\n").cases(warmup=1, repeat=1)
    }
    assert single.count == 2
    overridden = load(write_scenario, text, ["documents={count: 3, lengths: uniform}", "layout=[zigzag]"])
    cases = overridden.cases(warmup=1, repeat=1)
    assert {c.documents.tag for c in cases} == {"docs3-uniform"} and {
        c.layout for c in cases if c.cp == 2
    } == {"zigzag"}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("layout: [ring]", "layout: unknown layout 'ring'; use one of contiguous, zigzag"),
        ("documents: {count: 0}", "documents: count: must be >= 1, got 0; e.g. count: 64"),
        (
            "documents: [{count: 4, lenghts: fixed}]",
            "documents: lenghts: unknown key; did you mean 'lengths'?",
        ),
        ("documents: [{count: 4, lengths: zipf}]", "documents: lengths: unknown lengths 'zipf'; use one of"),
        ("documents: {lengths: fixed}", "documents: count: required but missing"),
        ("documents: [64]", "documents: expected a mapping such as {count: 64, lengths: lognormal, seed: 0}"),
        (
            "documents: [{count: 129}]",
            "documents: count: 129 documents do not fit in a sequence of 128 tokens",
        ),
    ],
)
def test_documents_and_layout_errors_name_file_line_key_and_fix(write_scenario, line, expected):
    msg = error_of(load, write_scenario, BASE + line + "\n")
    assert msg.startswith("scenarios/s.yaml:8: ") and expected in msg, msg


def test_documents_in_a_sub_sweep_name_the_entry(write_scenario):
    msg = error_of(load, write_scenario, BASE + "sweeps:\n  - documents: [{count: 0}]\n")
    assert msg.startswith("scenarios/s.yaml:9: sweeps[0].documents: count: must be >= 1"), msg


def test_documents_with_a_batch_name_batch(write_scenario):
    msg = error_of(load, write_scenario, BASE + "batch: 2\ndocuments: [null, {count: 4}]\n")
    assert msg.startswith("scenarios/s.yaml:8: batch: documents pack one sequence"), msg
    assert "use batch: 1" in msg


def test_zigzag_needs_a_length_that_splits_into_two_pieces_per_rank(write_scenario):
    text = BASE.replace("seq_len: [128]", "seq_len: [130]") + "layout: [zigzag]\nmode: [p2p]\n"
    msg = error_of(check, write_scenario, text)
    assert msg.startswith(
        "scenarios/s.yaml:7: seq_len: case p2p-ckpt-cp2-T130-zigzag-fwd: layout='zigzag'"
    ), msg
    assert "does not divide by 4" in msg and "use layout='contiguous'" in msg
    check(write_scenario, text.replace("layout: [zigzag]", "layout: [contiguous]"))  # 130 splits over 2


def test_rounds_is_a_suite_and_scenario_key_and_a_set_target(suite_dir: Path, write_scenario):
    """rounds: the suite's default, a scenario's own value over it, --set over both; a bad value is one line
    naming the file, line and key."""
    assert load_suite().config.rounds == 2  # the test suite's bench.yaml
    s = load(write_scenario, BASE + "rounds: 4\n")
    assert {c.rounds for c in s.cases(warmup=1, repeat=1, rounds=2)} == {4}
    assert {c.rounds for c in load(write_scenario, BASE).cases(warmup=1, repeat=1, rounds=2)} == {2}
    assert load_suite(None, parse_overrides(["rounds=5"])).config.rounds == 5
    assert {
        c.rounds for c in load(write_scenario, BASE + "rounds: 4\n", ["rounds=6"]).cases(warmup=1, repeat=1)
    } == {6}
    assert error_of(load, write_scenario, BASE + "rounds: 0\n") == (
        "scenarios/s.yaml:8: rounds: must be positive, got 0; use an integer >= 1"
    )
    assert error_of(load, write_scenario, BASE + "rounds: three\n").startswith(
        "scenarios/s.yaml:8: rounds: expected an integer or null, got 'three'"
    )
    (suite_dir / "bench.yaml").write_text("rounds: 1.5\n")
    assert error_of(load_suite).startswith("bench.yaml:1: rounds: expected an integer, got 1.5")
    msg = error_of(load_suite, None, parse_overrides(["rounds=-1"]))
    assert msg.startswith("bench.yaml (--set rounds=-1): rounds: must be positive, got -1")
