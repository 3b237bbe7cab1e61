"""What a CUDA build of the engine costs, by kind of file, from a (possibly stopped) build.

scripts/cuda_build_check.sh builds with scripts/compile_cost.sh as the CUDA compiler launcher,
which logs each compile's CPU seconds and, once, every CUDA object of the build. On two shared
cores the build stops long before the end; this says how far it got, which kind of file the time
goes to, and, from the mean cost of each kind compiled so far, what the whole build would take.

    python bench/cuda_build_cost.py COMPILE_COST_LOG
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KINDS = (
    ("template-instances/fattn-", "flash-attention template instances"),
    ("template-instances/mmq-", "MMQ (quantized matmul) template instances"),
    ("template-instances/mmf-", "MMF template instances"),
    ("template-instances/", "other template instances"),
    ("", "kernels (the rest of ggml-cuda)"),
)


def kind_of(source: str) -> str:
    """The kind a CUDA source belongs to, by its path under ggml-cuda/.

    >>> kind_of("template-instances/mmq-instance-q4_0.cu")
    'MMQ (quantized matmul) template instances'
    >>> kind_of("ggml-cuda.cu")
    'kernels (the rest of ggml-cuda)'
    """
    return next(name for prefix, name in KINDS if source.startswith(prefix))


def source_of(target: str) -> str:
    """A CUDA object's source, as the launcher logs it (the path under ggml-cuda/).

    >>> source_of("ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/template-instances/x.cu.o")
    'template-instances/x.cu'
    >>> source_of("ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/mmq.cu.o")
    'mmq.cu'
    """
    path = target.removesuffix(".o")
    if "template-instances/" in path:
        return "template-instances/" + path.rsplit("template-instances/", 1)[1]
    return path.rsplit("/", 1)[-1]


@dataclass
class Kind:
    name: str
    total: int = 0
    done: int = 0
    cpu_s: float = 0.0

    @property
    def mean_s(self) -> float | None:
        return self.cpu_s / self.done if self.done else None

    @property
    def estimate_s(self) -> float | None:
        """CPU seconds for every file of this kind, from the mean of those compiled."""
        return None if self.mean_s is None else self.mean_s * self.total


def cost_by_kind(log_lines: Iterable[str], targets: Iterable[str]) -> dict[str, Kind]:
    """Pure: the cost log's ``user sys wall source`` lines and the build's CUDA objects, by kind."""
    kinds = {name: Kind(name) for _, name in KINDS}
    for target in targets:
        if target.strip():
            kinds[kind_of(source_of(target.strip()))].total += 1
    for line in log_lines:
        parts = line.split(maxsplit=3)
        if len(parts) != 4:
            continue  # a compiler message that went to the log
        try:
            user, system = float(parts[0]), float(parts[1])
        except ValueError:
            continue
        kind = kinds[kind_of(parts[3].strip())]
        kind.done += 1
        kind.cpu_s += user + system
    return {name: kind for name, kind in kinds.items() if kind.total or kind.done}


def report(kinds: dict[str, Kind]) -> str:
    lines = [f"{'kind':<44} {'done':>9} {'CPU s':>8} {'mean s':>7} {'all, est. CPU h':>16}"]
    known = unknown = 0
    for kind in kinds.values():
        mean = "-" if kind.mean_s is None else f"{kind.mean_s:.0f}"
        estimate = "-" if kind.estimate_s is None else f"{kind.estimate_s / 3600:.2f}"
        lines.append(f"{kind.name:<44} {kind.done:>4}/{kind.total:<4} {kind.cpu_s:>8.0f} {mean:>7} {estimate:>16}")
        if kind.estimate_s is None:
            unknown += kind.total
        else:
            known += 1
    done_s = sum(k.cpu_s for k in kinds.values())
    lines.append(f"CPU time spent compiling CUDA: {done_s / 3600:.2f} h")
    if unknown:
        lines.append(f"{unknown} files of kinds not yet compiled: no estimate for them")
    else:
        total = sum(k.estimate_s or 0.0 for k in kinds.values())
        lines.append(
            f"whole CUDA part, estimated: {total / 3600:.1f} CPU h = {total / 3600 / 2:.1f} h on 2 idle cores, "
            f"{total / 3600 / 16 * 60:.0f} min on 16"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="COMPILE_COST_LOG of scripts/compile_cost.sh")
    args = parser.parse_args(argv)
    targets_path = Path(str(args.log) + ".targets")
    if not args.log.exists():
        print(f"{args.log}: no compile was logged (a cached wheel is not compiled again)", file=sys.stderr)
        return 1
    targets = targets_path.read_text().splitlines() if targets_path.exists() else []
    print(report(cost_by_kind(args.log.read_text(errors="replace").splitlines(), targets)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
