"""Child process for E4: evaluate a Gate at a given wall time (which persists the clock
high-water mark), print the decision, then kill -9 itself — no clean shutdown of any kind.

Usage: python -m tests.entitlement.gate_child DATA_DIR DEVICE_ID WALL_SECS PUBLIC_KEY
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from syncd.entitlement.gate import Gate
from syncd.entitlement.token import pin


def main() -> None:
    data, device, wall, key = sys.argv[1:5]
    gate = Gate(Path(data), pin([key]), device, wall=lambda: float(wall))
    decision = gate.evaluate()
    sys.stdout.write(json.dumps(decision.as_dict()) + "\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
