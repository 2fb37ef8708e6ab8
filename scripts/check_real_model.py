"""Run the README's real-model commands as written (SmolLM2-135M-Instruct on CPU), in order, and
print each one's exit code and wall time; a failed command stops the script with its code.

The suite only checks that these commands compose (``tests/test_readme.py``). On 2 cores (AMD
EPYC, jax 0.10.2) all three passed in 13.2 minutes: the evaluation 51 s (1 of 20 solved), the
short LoRA RL job 725 s (SmolLM2's GGUF already converted; its RL steps ~190-230 s each, the
zero-shot episodes running to the 96-token turn limit), the merged export 18 s.

    python scripts/check_real_model.py                  # in a fresh temporary folder
    python scripts/check_real_model.py --workdir /tmp/x # runs/ and the export land there
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## A real instruct model on CPU"


def commands() -> list[str]:
    """The section's bash block, one command a line (continuations joined, comments dropped)."""
    text = README.read_text().split(SECTION, 1)[1]
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).replace("\\\n", " ")
    lines = [ln.split("#", 1)[0].strip() for ln in block.splitlines()]
    return [ln for ln in lines if ln]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workdir", help="folder the commands run in (default: a new temporary one)")
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="real_model_"))
    work.mkdir(parents=True, exist_ok=True)
    venv_bin = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    root = README.parent
    for cmd in commands():
        argv = shlex.split(cmd)
        if argv[0].startswith(".venv/"):  # the README's path from the checkout's root
            argv[0] = str(root / argv[0])
        print(f"$ {cmd}", flush=True)
        t = time.perf_counter()
        rc = subprocess.run(argv, cwd=work, env=env).returncode
        print(f"-> rc {rc}, {time.perf_counter() - t:.0f} s", flush=True)
        if rc:
            sys.exit(rc)
    print(f"all {len(commands())} commands passed in {work}")


if __name__ == "__main__":
    main()
