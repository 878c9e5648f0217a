"""A plain script that calls run_burst at top level, with no ``if __name__ == "__main__":`` guard.

multiprocessing runs the main script again in every child it starts from a forkserver; for such a
script each rank would build the model again and call run_burst from inside itself. The ranks are
prepared without the main script (the workload travels by value), so the script runs once.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import os
    import sys

    with open(sys.argv[1], "a") as marker:  # one line per execution of this file's top level
        marker.write(f"{os.getpid()} {__name__}\\n")

    import torch
    import torch.nn.functional as F
    from torch import nn

    import accel_widgets as aw


    class Net(nn.Module):  # defined in __main__: travels by value
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(8, 2)

        def forward(self, x):
            return self.layer(x)


    x = torch.randn(256, 8)
    workload = aw.Workload(model=Net(), dataset=(x, x[:, 0].gt(0).long()), loss_fn=F.cross_entropy, batch_size=32)
    one = aw.run_burst(workload, aw.Config(num_workers=2), steps=3)
    two = aw.run_burst(workload, aw.Config(world_size=2, parallel="ddp"), steps=3)
    print("statuses", one.status, two.status, len(one.steps), len(two.steps))
''')


def run_script(source: str, where: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``source`` as a script in ``where`` (its temp files there too); return it and its executions."""
    script, marker = where / "train.py", where / "executions.txt"
    script.write_text(source)
    env = {**os.environ, "TMPDIR": str(where), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), str(marker)], capture_output=True, text=True, timeout=180,
                          cwd=where, env=env)
    return done, marker.read_text().splitlines()


def test_a_script_without_a_main_guard_runs_once_and_trains(short_tmp: Path) -> None:
    done, executions = run_script(SCRIPT, short_tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["statuses", "ok", "ok", "5", "10"], done.stdout
    assert len(executions) == 1 and executions[0].endswith(" __main__"), executions


def test_a_forkserver_started_before_the_import_is_named_as_the_cause(short_tmp: Path) -> None:
    """A server someone else started runs the main script in each child, as multiprocessing does: the
    rank dies while starting, and the error says why and what to do."""
    early = SCRIPT.replace("import torch\n", "import multiprocessing.forkserver\n"
                           "multiprocessing.forkserver.ensure_running()\nimport torch\n", 1)
    done, executions = run_script(early, short_tmp)
    assert done.returncode != 0
    assert "died while starting" in done.stderr and "import accel_widgets first" in done.stderr, done.stderr[-2000:]
    assert [line.split()[1] for line in executions] == ["__main__", "__mp_main__"]
