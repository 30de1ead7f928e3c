"""helpers.flash.gpu_figures: the committed H200 measurements load, summarise to the numbers in
the files, and a malformed file is refused with an error naming the field."""

import copy
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.flash import gpu_figures as gf

DATA = Path(__file__).resolve().parents[2] / "data"
BENCHMARK = DATA / "flash_gpu_benchmark.json"
ACCURACY = DATA / "flash_gpu_accuracy.json"


@pytest.fixture(scope="module")
def raw_benchmark():
    return json.loads(BENCHMARK.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def raw_accuracy():
    return json.loads(ACCURACY.read_text(encoding="utf-8"))


def test_committed_files_load_unchanged(raw_benchmark, raw_accuracy):
    assert gf.load_benchmark(BENCHMARK) == raw_benchmark
    assert gf.load_accuracy(str(ACCURACY)) == raw_accuracy
    assert raw_benchmark["device"] == "NVIDIA H200"
    assert {r["method"] for r in raw_benchmark["results"]} >= {gf.OURS, "sdpa flash", "sdpa cuDNN"}


def test_datasheet_peak_is_the_dense_half_of_the_sparse_figure():
    assert gf.H200_SXM_FP16_SPARSE_TFLOPS == 1979
    assert gf.H200_SXM_FP16_DENSE_TFLOPS == 989.5


def test_summary_equals_the_rows_of_the_file(raw_benchmark):
    """What the notebook prints and draws is the file's numbers: every lookup against the rows."""
    for row in raw_benchmark["results"]:
        assert gf.tflops(raw_benchmark, row["method"], row["pass"], row["causal"], row["head_dim"],
                         row["n"]) == row["tflops"]
    rows = {(r["method"], r["pass"], r["causal"], r["head_dim"], r["n"]): r for r in raw_benchmark["results"]}
    for pass_name in gf.PASSES:
        ratios = gf.speed_ratios(raw_benchmark, "sdpa cuDNN", pass_name, 4096)
        expected = {(c, d, n): rows[gf.OURS, pass_name, c, d, n]["tflops"] / rows["sdpa cuDNN", pass_name, c, d, n]["tflops"]
                    for (m, p, c, d, n) in rows if m == gf.OURS and p == pass_name and n >= 4096}
        assert ratios == expected and len(ratios) == 12
    memory = gf.memory_by_n(raw_benchmark, "naive", "forward+backward", False, 64)
    assert memory == {n: rows["naive", "forward+backward", False, 64, n]["peak_mb"] for n in memory}
    assert list(memory) == sorted(memory) and 16384 not in memory  # out of memory there


@pytest.mark.parametrize("method, pass_name, causal, head_dim", [
    ("nave", "forward+backward", False, 64), ("naive", "backward", False, 64),
    ("naive", "forward", False, 96)])
def test_memory_of_a_setting_the_file_lacks_is_refused_by_name(raw_benchmark, method, pass_name,
                                                               causal, head_dim):
    with pytest.raises(KeyError, match=re.escape(f"no rows (method={method!r}, pass={pass_name!r}")):
        gf.memory_by_n(raw_benchmark, method, pass_name, causal, head_dim)


def test_the_figures_say_what_the_notebook_says(raw_benchmark):
    """The prose of notebook 8 rests on these: faster than SDPA flash forward, within a few
    percent of it or faster forward+backward, and 10-40 % slower than cuDNN from N = 4096 on."""
    forward = gf.speed_ratios(raw_benchmark, "sdpa flash", "forward", 4096).values()
    both = gf.speed_ratios(raw_benchmark, "sdpa flash", "forward+backward", 4096).values()
    assert min(forward) > 1.1 and 0.97 < min(both) < 1 < max(both)
    for pass_name in gf.PASSES:
        gap = [1 - r for r in gf.speed_ratios(raw_benchmark, "sdpa cuDNN", pass_name, 4096).values()]
        assert 0.1 < min(gap) and max(gap) < 0.4


def test_lookups_refuse_what_is_not_there(raw_benchmark):
    with pytest.raises(KeyError, match="method='sdpa tpu'"):
        gf.tflops(raw_benchmark, "sdpa tpu", "forward", False, 64, 512)
    with pytest.raises(ValueError, match="min_n must be a positive integer, got 0"):
        gf.speed_ratios(raw_benchmark, "sdpa flash", "forward", 0)
    with pytest.raises(ValueError, match="no N >= 100000"):
        gf.speed_ratios(raw_benchmark, "sdpa flash", "forward", 100000)


def test_loaders_refuse_a_bad_path(tmp_path):
    with pytest.raises(TypeError, match="path must be a str or pathlib.Path, got int"):
        gf.load_benchmark(3)
    with pytest.raises(FileNotFoundError, match="is not a file"):
        gf.load_accuracy(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        gf.load_benchmark(broken)


def _set(path, value):
    def change(data):
        *parents, last = path
        for key in parents:
            data = data[key]
        if value is KeyError:
            del data[last]
        else:
            data[last] = value
    return change


@pytest.mark.parametrize("change, message", [
    (_set(["device"], ""), "field 'device' is '', expected a non-empty string"),
    (_set(["date"], KeyError), "field 'date' is None"),
    (_set(["batch"], 0), "field 'batch' is 0, expected a positive integer"),
    (_set(["heads"], True), "field 'heads' is True"),
    (_set(["results"], []), "field 'results' is \\[\\]"),
    (_set(["results", 3, "pass"], "backward"), "results\\[3\\]\\['pass'\\] is 'backward', expected one of"),
    (_set(["results", 0, "causal"], "no"), "results\\[0\\]\\['causal'\\] is 'no', expected true or false"),
    (_set(["results", 1, "n"], -512), "results\\[1\\]\\['n'\\] is -512"),
    (_set(["results", 2, "tflops"], None), "results\\[2\\] \\(ms, tflops, peak_mb\\)"),
    (_set(["results", 2, "ms"], -1.0), "three positive numbers, or three nulls"),
    (_set(["results", 2, "peak_mb"], math.nan), "results\\[2\\] \\(ms, tflops, peak_mb\\)"),
])
def test_a_malformed_benchmark_is_refused_naming_the_field(raw_benchmark, change, message):
    data = copy.deepcopy(raw_benchmark)
    change(data)
    with pytest.raises(ValueError, match=message):
        gf.check_benchmark(data)


def test_a_benchmark_without_our_rows_or_with_a_repeated_row_is_refused(raw_benchmark):
    data = copy.deepcopy(raw_benchmark)
    data["results"].append(dict(data["results"][5]))
    with pytest.raises(ValueError, match="results\\[288\\] .* expected each \\(method, pass"):
        gf.check_benchmark(data)
    data["results"] = [r for r in raw_benchmark["results"] if r["method"] != gf.OURS]
    with pytest.raises(ValueError, match="'triton \\(ours\\)' among them"):
        gf.check_benchmark(data, "mine.json")
    with pytest.raises(ValueError, match="^benchmark: the top level is 'list', expected a JSON object"):
        gf.check_benchmark([])


@pytest.mark.parametrize("change, message", [
    (_set(["rows"], None), "field 'rows' is None"),
    (_set(["rows", 0, "causal"], 1), "rows\\[0\\]\\['causal'\\] is 1"),
    (_set(["rows", 0, "d"], 0), "rows\\[0\\]\\['d'\\] is 0"),
    (_set(["rows", 4, "dK"], [0.1]), "rows\\[4\\]\\['dK'\\] is \\[0.1\\], expected \\[ours, SDPA flash\\]"),
    (_set(["rows", 4, "O"], [0.1, -0.1]), "rows\\[4\\]\\['O'\\]"),
    (_set(["rows", 5, "worst_ratio"], "big"), "rows\\[5\\]\\['worst_ratio'\\] is 'big'"),
    (_set(["rows", 33, "ragged"], [777]), "rows\\[33\\]\\['ragged'\\] is \\[777\\]"),
    (_set(["rows", 33, "O_err"], None), "rows\\[33\\]\\['O_err'\\] is None"),
    (_set(["train", "ours"], [1.0]), "field 'train' is \\{'sdpa': 300, 'ours': 1\\}"),
    (_set(["train"], KeyError), "field 'train' is 'NoneType'"),
])
def test_malformed_accuracy_is_refused_naming_the_field(raw_accuracy, change, message):
    data = copy.deepcopy(raw_accuracy)
    change(data)
    with pytest.raises(ValueError, match=message):
        gf.check_accuracy(data)


def test_the_committed_benchmark_meets_the_bench_budgets_and_matches_the_bench(raw_benchmark, capsys):
    """The file is what benchmarks/bench_flash.py --gpu writes (its sizes, its FLOP count), and
    its own budget check passes on it."""
    spec = importlib.util.spec_from_file_location("bench_flash_for_figures", DATA.parent / "benchmarks" / "bench_flash.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    assert bench.GPU_RESULTS == BENCHMARK
    assert (raw_benchmark["batch"], raw_benchmark["heads"]) == (bench.GPU_BATCH, bench.GPU_HEADS)
    assert {r["n"] for r in raw_benchmark["results"]} == set(bench.GPU_SEQ_LENS)
    assert {r["head_dim"] for r in raw_benchmark["results"]} == set(bench.GPU_HEAD_DIMS)
    for row in raw_benchmark["results"]:  # nominal_flops counts all B * H heads
        if row["ms"] is not None:
            flops = bench.nominal_flops(row["n"], row["head_dim"], row["pass"], row["causal"])
            assert row["tflops"] == pytest.approx(flops / (row["ms"] * 1e-3) / 1e12, rel=1e-9)
    assert bench.gpu_budgets(raw_benchmark)
    assert "MISSED" not in capsys.readouterr().out


def test_notebook_8_prints_the_numbers_of_the_file(raw_benchmark, raw_accuracy):
    """The stored outputs of notebook 8 are the committed files' numbers, recomputed here."""
    cells = json.loads((DATA.parent / "notebooks" / "08_flash_attention.ipynb").read_text(encoding="utf-8"))["cells"]
    printed = "".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code"
                      for o in c.get("outputs", []))
    assert f"measured on an {raw_benchmark['device']} on {raw_benchmark['date']}" in printed
    for pass_name in gf.PASSES:
        ratios = gf.speed_ratios(raw_benchmark, "sdpa flash", pass_name, 4096).values()
        assert f"{pass_name}, N >= 4096: ours / SDPA flash {min(ratios):.2f}-{max(ratios):.2f}x" in printed
    top = max(gf.tflops(raw_benchmark, gf.OURS, p, c, d, 16384) for p in gf.PASSES
              for c in (False, True) for d in (64, 128))
    assert f"best: ours {top:.0f} TFLOP/s = {top / gf.H200_SXM_FP16_DENSE_TFLOPS:.0%} of peak" in printed
    final = raw_accuracy["train"]
    assert f"final loss SDPA {final['sdpa'][-1]:.4f}, ours {final['ours'][-1]:.4f}" in printed


HOPPER_PTX = """
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from helpers.flash import triton_kernels as kernels

ints = ["stride_qb", "stride_qh", "stride_qn", "stride_kb", "stride_kh", "stride_kn", "stride_vb",
        "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_on", "n_heads", "n_q", "n_k"]
constants = {"HEAD_DIM": 128, "BLOCK_D": 128, "CAUSAL": False, "DOT_PRECISION": "tf32",
             "ACC_DTYPE": tl.float32, "BLOCK_Q": 128, "BLOCK_K": 64, "COUNT_TILES": False}
signature = ({name: "*fp16" for name in ("Q", "K", "V", "Out")} | {"Lse": "*fp32", "Visits": "*i32"}
             | dict.fromkeys(ints, "i32") | {"qk_scale": "fp32"} | dict.fromkeys(constants, "constexpr"))
compiled = triton.compile(ASTSource(kernels.flash_forward_kernel, signature, constants),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 2})
ptx = compiled.asm["ptx"]
print("wgmma", "wgmma.mma_async" in ptx, "tma", "cp.async.bulk.tensor" in ptx)
"""


def test_on_hopper_our_forward_gets_wgmma_from_the_compiler_but_no_tma_copies():
    """What notebook 8 says of the gap to cuDNN: compiled for sm_90 (H100, H200), Triton turns
    our tl.dot into Hopper's wgmma instructions by itself, while the tiles still travel by
    ordinary loads, not the tensor memory accelerator's bulk copies."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run([sys.executable, "-c", HOPPER_PTX], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wgmma True tma False" in result.stdout, result.stdout
