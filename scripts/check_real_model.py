"""Run the README's real-model commands as written (SmolLM2-135M-Instruct on CPU), in order, and
print each one's exit code and wall time; a failed command stops the script with its code.

The suite only checks that these commands compose (``tests/test_readme.py``): on 2 cores the
evaluation takes ~1.5 minutes and the short LoRA RL job more than ten.

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
