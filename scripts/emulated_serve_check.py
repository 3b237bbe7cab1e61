"""Start the engine as ``toolpair serve`` would, but under an emulated CPU, and print what toolpair says.

    python scripts/emulated_serve_check.py QEMU CPU

The engine's process runs as ``QEMU -cpu CPU python -m engine_launcher.inside.engine_main llama_cpp.server ...``
under toolpair's own supervisor, warm-up included, so a build that cannot run on CPU is diagnosed
exactly as serve diagnoses it on such a machine. Prints the supervisor's verdict; exit 0 when the
engine generated, 1 when it could not (the verdict says why). Used by scripts/portable_check.sh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_launcher.builder.models import DEFAULT_TEMPLATE, bundled_model  # noqa: E402
from engine_launcher.supervise.launch import EngineLaunch, free_port  # noqa: E402
from engine_launcher.supervise.process import EngineSupervisor, EngineUnavailable, RestartPolicy  # noqa: E402
from proxy.serve import engine_child  # noqa: E402


async def main(qemu: str, cpu: str) -> int:
    launch = EngineLaunch(bundled_model(), free_port(), secrets.token_hex(8), 512, chat_template=DEFAULT_TEMPLATE)
    spec = engine_child(launch)
    spec = dataclasses.replace(spec, argv=[qemu, "-cpu", cpu, *spec.argv])
    engine = EngineSupervisor(spec, RestartPolicy(start_timeout=900))
    try:
        await engine.ensure_ready()
    except EngineUnavailable as exc:
        print(f"toolpair on an emulated {cpu}: {exc}")
        return 1
    finally:
        await engine.shutdown()
    print(f"toolpair on an emulated {cpu}: the engine generated (warm-up {engine.warmup_seconds or 0:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
