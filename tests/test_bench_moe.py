"""benchmarks/bench_moe.py in a short run (a subprocess, minutes on a loaded machine): moved out
of tests/test_moe.py so that file stays fast enough for the mutation runs (benchmarks/mutation.py),
where a subprocess could not be mapped to a function anyway."""


def test_bench_moe_short_run_writes_its_table(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "moe.json"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_moe.py"), "--steps", "3",
                           "--seeds", "1", "--out", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    moe = result["models"]["MoE 8 experts, top-2"]
    dense = result["models"]["dense, equal active"]
    assert moe["total_params"][0] > 2.5 * dense["total_params"][0]
    assert abs(moe["active_params"][0] - dense["active_params"][0]) < 0.05 * dense["active_params"][0]
    assert len(result["balance"]["none"]["shares"][0]) == 3
    assert all(abs(sum(step) - 1) < 1e-3 for step in result["balance"]["bias"]["shares"][0])
