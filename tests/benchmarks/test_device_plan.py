"""The device plan in benchmarks/README.md against the scripts it calls: the next session lent a GPU copies these
calls as they are, so their limits, order, wheel and budgets must be the scripts' own, and fit 15 minutes."""

from __future__ import annotations

import ast
import re

from tests.benchmark_scripts import BENCHMARKS, load_benchmark

gc, gp, gm = (load_benchmark(name) for name in ("gpu_check", "gpu_probes", "gpu_modern"))
README = (BENCHMARKS / "README.md").read_text()
DEVICE_SECONDS, START_UP_S, COMMAND_CHARS = 900.0, 120.0, 2000  # 15 minutes; a machine's start; run()'s limit


def run_calls() -> list[dict]:
    """Every ``run(...)`` call in the README's code blocks, its keywords evaluated (adjacent strings joined)."""
    calls = []
    for block in re.findall(r"((?:^    .*\n)+)", README, re.M):
        text = "\n".join(line[4:] for line in block.splitlines())
        for match in re.finditer(r"^run\(", text, re.M):
            depth, end = 0, match.start()
            for end in range(match.start(), len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0 and text[end] == ")":
                    break
            call = ast.parse(text[match.start():end + 1], mode="eval").body
            calls.append({keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords})
    return calls


def test_the_readme_gives_two_runs_that_fit_the_scripts_limits_and_fifteen_minutes():
    first, second = run_calls()
    assert first == {"command": "PYTHONPATH=. PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py",
                     "timeout_s": gc.CALL_LIMIT_S} and gc.CALL_LIMIT_S <= 420
    assert second["timeout_s"] == gm.CALL_LIMIT_S == gp.CALL_LIMIT_S <= 300 and second["carry"] == [".wheels"]
    assert first["timeout_s"] + second["timeout_s"] + START_UP_S <= DEVICE_SECONDS
    assert all(len(call["command"]) <= COMMAND_CHARS for call in (first, second))


def test_the_second_run_installs_the_carried_wheel_offline_then_probes_then_modern_on_one_budget():
    command = run_calls()[1]["command"]
    install, probes, modern = (command.index(part) for part in ("pip install", "gpu_probes.py", "gpu_modern.py"))
    assert command.startswith("T0=$(date +%s.%N); ") and install < probes < modern
    assert "--no-index --no-deps" in command and "--target /tmp/site .wheels/*.whl" in command
    assert "PYTHONPATH=/tmp/site:." in command
    assert "gpu_probes.py --call-start $T0" in command and "gpu_modern.py --call-start $T0" in command
    assert gp.DEFAULT_BUDGET_S < gm.DEFAULT_BUDGET_S == gp.CALL_LIMIT_S - gp.CALL_RESERVE_S


def test_the_wheel_downloaded_here_is_the_torchao_the_script_checks_for():
    (line,) = [line for line in README.splitlines() if "-d .wheels torchao==" in line]
    assert f"torchao=={gm.TORCHAO_VERSION} " in line and gm.TORCHAO_VERSION == "0.17.0"
    download = README[README.index("python3 -m pip download"):README.index(line) + len(line)]
    for option in ("--no-deps", "--only-binary=:all:", "--python-version 3.12", "--platform manylinux_2_28_x86_64"):
        assert option in download
