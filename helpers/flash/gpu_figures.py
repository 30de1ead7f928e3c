"""The GPU measurements notebook 8 draws: load, validate and summarise the committed JSON files.

data/flash_gpu_benchmark.json is what `benchmarks/bench_flash.py --gpu` writes: the device, date
and versions, then one row per (method, pass, causal, head dim, N) with its time, TFLOP/s and peak
memory (all three None where the method ran out of memory). data/flash_gpu_accuracy.json holds
the largest errors of our kernels and of SDPA's flash backend against a float32 reference, a few
ragged lengths, and the losses of a short training run with each. Both are measurements, made on
a GPU: this module only reads them, so the notebook draws them on any machine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

OURS = "triton (ours)"
PASSES = ("forward", "forward+backward")
# NVIDIA H200 datasheet, H200 SXM: "FP16 Tensor Core 1,979 TFLOPS", a figure given with
# sparsity (2:4 structured sparsity doubles it); dense matrix products reach half of it.
H200_SXM_FP16_SPARSE_TFLOPS = 1979.0
H200_SXM_FP16_DENSE_TFLOPS = H200_SXM_FP16_SPARSE_TFLOPS / 2

_HEADER = {"device": str, "date": str, "torch": str, "triton": str, "cuda": str, "dtype": str}
_GRADS = ("O", "dQ", "dK", "dV")


def _fail(source: str, where: str, got: Any, expected: str) -> ValueError:
    return ValueError(f"{source}: {where} is {got!r}, expected {expected}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _read_json(path: str | Path) -> Any:
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or pathlib.Path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path {str(path)!r} is not a file: expected a JSON file of GPU "
                                "measurements (see benchmarks/bench_flash.py --gpu)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def check_benchmark(data: Any, source: str = "benchmark") -> dict[str, Any]:
    """Validate bench_flash's GPU results (the parsed JSON); returns `data` unchanged.

    Raises ValueError naming the field, what it holds and what was expected: a missing header
    field, a row with an unknown pass, a non-positive size, a negative or partial measurement, a
    duplicated row, or no row of our kernels.
    """
    if not isinstance(data, dict):
        raise _fail(source, "the top level", type(data).__name__, "a JSON object")
    for key, kind in _HEADER.items():
        if not isinstance(data.get(key), kind) or not data[key]:
            raise _fail(source, f"field {key!r}", data.get(key), "a non-empty string")
    for key in ("batch", "heads"):
        if not _is_int(data.get(key)) or data[key] < 1:
            raise _fail(source, f"field {key!r}", data.get(key), "a positive integer")
    rows = data.get("results")
    if not isinstance(rows, list) or not rows:
        raise _fail(source, "field 'results'", rows, "a non-empty list of rows")
    seen = set()
    for i, row in enumerate(rows):
        where = f"results[{i}]"
        if not isinstance(row, dict):
            raise _fail(source, where, row, "a JSON object")
        if not isinstance(row.get("method"), str) or not row["method"]:
            raise _fail(source, f"{where}['method']", row.get("method"), "a non-empty string")
        if row.get("pass") not in PASSES:
            raise _fail(source, f"{where}['pass']", row.get("pass"), f"one of {PASSES}")
        if not isinstance(row.get("causal"), bool):
            raise _fail(source, f"{where}['causal']", row.get("causal"), "true or false")
        for key in ("head_dim", "n"):
            if not _is_int(row.get(key)) or row[key] < 1:
                raise _fail(source, f"{where}[{key!r}]", row.get(key), "a positive integer")
        measured = [row.get(key) for key in ("ms", "tflops", "peak_mb")]
        if measured != [None] * 3 and not all(_is_number(m) and m > 0 for m in measured):
            raise _fail(source, f"{where} (ms, tflops, peak_mb)", tuple(measured),
                        "three positive numbers, or three nulls (out of memory)")
        key = (row["method"], row["pass"], row["causal"], row["head_dim"], row["n"])
        if key in seen:
            raise _fail(source, where, key, "each (method, pass, causal, head_dim, n) once")
        seen.add(key)
    if not any(row["method"] == OURS for row in rows):
        raise _fail(source, "the methods", sorted({r["method"] for r in rows}), f"{OURS!r} among them")
    return data


def check_accuracy(data: Any, source: str = "accuracy") -> dict[str, Any]:
    """Validate the accuracy measurements (the parsed JSON); returns `data` unchanged.

    `rows` holds error rows (dtype, d, n, causal, and [ours, SDPA flash] for each of O, dQ, dK,
    dV, plus worst_ratio) and ragged rows ([N_q, N_k], causal, O_err); `train` two equally long
    loss curves, `sdpa` and `ours`. Raises ValueError naming the first field that is wrong.
    """
    if not isinstance(data, dict):
        raise _fail(source, "the top level", type(data).__name__, "a JSON object")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise _fail(source, "field 'rows'", rows, "a non-empty list of rows")
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        if not isinstance(row, dict) or not isinstance(row.get("causal"), bool):
            raise _fail(source, f"{where}['causal']",
                        row.get("causal") if isinstance(row, dict) else row, "true or false")
        if "ragged" in row:
            lengths = row["ragged"]
            if not (isinstance(lengths, list) and len(lengths) == 2
                    and all(_is_int(n) and n > 0 for n in lengths)):
                raise _fail(source, f"{where}['ragged']", lengths, "[N_q, N_k], positive integers")
            if not _is_number(row.get("O_err")) or row["O_err"] < 0:
                raise _fail(source, f"{where}['O_err']", row.get("O_err"), "a number >= 0")
            continue
        if not isinstance(row.get("dtype"), str):
            raise _fail(source, f"{where}['dtype']", row.get("dtype"), "a dtype name")
        for key in ("d", "n"):
            if not _is_int(row.get(key)) or row[key] < 1:
                raise _fail(source, f"{where}[{key!r}]", row.get(key), "a positive integer")
        for key in _GRADS:
            pair = row.get(key)
            if not (isinstance(pair, list) and len(pair) == 2
                    and all(_is_number(e) and e >= 0 for e in pair)):
                raise _fail(source, f"{where}[{key!r}]", pair, "[ours, SDPA flash], numbers >= 0")
        if not _is_number(row.get("worst_ratio")) or row["worst_ratio"] < 0:
            raise _fail(source, f"{where}['worst_ratio']", row.get("worst_ratio"), "a number >= 0")
    train = data.get("train")
    curves = [train.get(k) for k in ("sdpa", "ours")] if isinstance(train, dict) else [None]
    if not (len(curves) == 2 and all(isinstance(c, list) and c and all(map(_is_number, c))
                                     for c in curves) and len(curves[0]) == len(curves[1])):
        raise _fail(source, "field 'train'", type(train).__name__ if not isinstance(train, dict)
                    else {k: (len(v) if isinstance(v, list) else v) for k, v in train.items()},
                    "{'sdpa': losses, 'ours': losses}, two equally long non-empty lists of numbers")
    return data


def load_benchmark(path: str | Path) -> dict[str, Any]:
    """Read and validate data/flash_gpu_benchmark.json (or another file like it)."""
    return check_benchmark(_read_json(path), str(path))


def load_accuracy(path: str | Path) -> dict[str, Any]:
    """Read and validate data/flash_gpu_accuracy.json (or another file like it)."""
    return check_accuracy(_read_json(path), str(path))


def tflops(results: dict[str, Any], method: str, pass_name: str, causal: bool, head_dim: int,
           n: int) -> float | None:
    """The TFLOP/s of one measured row (None where the method ran out of memory).

    Raises KeyError naming the row when the file has no such row."""
    for row in results["results"]:
        if (row["method"], row["pass"], row["causal"], row["head_dim"], row["n"]) == \
                (method, pass_name, causal, head_dim, n):
            return row["tflops"]
    raise KeyError(f"no row (method={method!r}, pass={pass_name!r}, causal={causal}, "
                   f"head_dim={head_dim}, n={n}) in the GPU results")


def speed_ratios(results: dict[str, Any], other: str, pass_name: str, min_n: int = 1
                 ) -> dict[tuple[bool, int, int], float]:
    """Our TFLOP/s over `other`'s for every (causal, head dim, N >= min_n) both measured."""
    if not isinstance(min_n, int) or min_n < 1:
        raise ValueError(f"min_n must be a positive integer, got {min_n!r}")
    ratios = {}
    for row in results["results"]:
        if row["method"] == OURS and row["pass"] == pass_name and row["n"] >= min_n:
            mine = row["tflops"]
            theirs = tflops(results, other, pass_name, row["causal"], row["head_dim"], row["n"])
            if mine is not None and theirs is not None:
                ratios[(row["causal"], row["head_dim"], row["n"])] = mine / theirs
    if not ratios:
        raise ValueError(f"no N >= {min_n} where both {OURS!r} and {other!r} ran {pass_name!r}")
    return ratios


def memory_by_n(results: dict[str, Any], method: str, pass_name: str, causal: bool,
                head_dim: int) -> dict[int, float]:
    """Peak memory (MiB) against N of one method, leaving out the lengths it could not run.

    Raises KeyError naming the setting when the file has no row of it at all (a misspelt
    method would otherwise draw an empty curve)."""
    rows = [row for row in sorted(results["results"], key=lambda r: r["n"])
            if (row["method"], row["pass"], row["causal"], row["head_dim"]) ==
            (method, pass_name, causal, head_dim)]
    if not rows:
        raise KeyError(f"no rows (method={method!r}, pass={pass_name!r}, causal={causal}, "
                       f"head_dim={head_dim}) in the GPU results")
    return {row["n"]: row["peak_mb"] for row in rows if row["peak_mb"] is not None}
