"""Prompt and generation tokens/s of the engine's CPU options, measured in one run.

Each option runs ``python -m engine_launcher.inside.speed`` in a child process of its own (one model load
each), on the same model, prompt and thread count; the options take turns for ``--rounds`` rounds
(A B C, A B C, ...) so that a burst of load elsewhere on a shared machine hits them alike, and each
option's median over the rounds is reported:

- ``native``: the engine ``make test`` installs (``-march=native``, AMX left out), weights in
  llama.cpp's extra buffers (its repacked CPU kernels, ``CPU_REPACK``) as the engine loads them;
- ``native, no extra buffers``: the same build loaded with ``use_extra_bufts = false``, what the
  engine falls back to on a CPU with AMX when the build has llama.cpp's AMX path in it;
- ``portable``: the ``--portable`` build (x86-64-v3, as the Docker image has it), when a virtualenv
  with it is given (``make portable-check`` makes ``.venv-portable``).

Ratios are to ``native``. This machine is shared and noisy: compare the ratios within one run.

    python bench/cpu_builds.py [--model PATH] [--portable-venv .venv-portable] [--prompt-tokens 256]

Results are printed and written to bench/results/cpu_builds.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_launcher.builder.machine import physical_cores  # noqa: E402
from engine_launcher.builder.models import bundled_model  # noqa: E402


def run(python: str, model: Path, extra: list[str], args: argparse.Namespace) -> dict[str, Any]:
    command = [
        python, "-m", "engine_launcher.inside.speed", str(model), "--prompt-tokens", str(args.prompt_tokens),
        "--gen-tokens", str(args.gen_tokens), "--threads", str(args.threads), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        return {"error": f"exit status {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median prompt and generation speeds of one option's runs (an error when any run failed)."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    out = dict(runs[-1])
    for key in ("prompt_tps", "gen_tps"):
        out[key] = statistics.median(r[key] for r in runs)
        out[key + "_runs"] = [r[key] for r in runs]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--portable-venv", type=Path, default=ROOT / ".venv-portable")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = args.model or bundled_model()
    options: list[tuple[str, str, list[str]]] = [
        ("native", sys.executable, []),
        ("native, no extra buffers", sys.executable, ["--no-extra-buffers"]),
    ]
    portable = args.portable_venv / "bin" / "python"
    if portable.exists():
        options.append(("portable (x86-64-v3)", str(portable), []))
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in options}
    for _ in range(args.rounds):
        for name, python, extra in options:
            rounds[name].append(run(python, model, extra, args))
    results = {name: median_of(runs) for name, runs in rounds.items()}
    base = results["native"]
    shape = (
        f"{args.prompt_tokens} prompt tokens, {args.gen_tokens} generated, {args.threads} threads, "
        f"median of {args.rounds} rounds"
    )
    print(f"model {model.name}, {shape}")
    print(f"{'option':28} {'prompt tok/s':>13} {'ratio':>6} {'gen tok/s':>10} {'ratio':>6}  extra buffers")
    for name, result in results.items():
        if "error" in result:
            print(f"{name:28} {result['error']}")
            continue
        prompt, gen = result["prompt_tps"], result["gen_tps"]
        print(
            f"{name:28} {prompt:13.1f} {prompt / base['prompt_tps']:6.2f} {gen:10.1f} {gen / base['gen_tps']:6.2f}"
            f"  {','.join(result['extra_buffers']) or '-'}"
        )
    out = ROOT / "bench" / "results" / "cpu_builds.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
