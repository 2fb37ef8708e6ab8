"""scripts/chaos.py at a small size: fault-injected episodes all end with a reason, nothing
escapes, the loop never stalls past a second and the thread count stays bounded."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "chaos.py"


def test_chaos_small():
    p = subprocess.run([sys.executable, str(SCRIPT), "--episodes", "200", "--json"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["episodes"] == 200  # 199 calculator episodes + the SQL attack
    assert out["hangs"] == 0 and out["escaped_exceptions"] == 0 and out["without_reason"] == 0
    assert out["end_reasons"].get("env_error") == 1 and out["end_reasons"].get("reward_error") == 1
    assert out["max_loop_stall_s"] < 1.0
    assert out["peak_threads"] < 80
    assert out["sql_attack_result"].startswith("Error")
