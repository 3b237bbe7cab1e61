"""Does the model pair each parallel tool result with the right call? Accuracy with and without toolpair.

Each case is a conversation in which the assistant called one tool (``read_meter``) 2-4 times in
parallel, for different meters, and each result is a fresh random number the model cannot know. The
user asked for one meter's reading; the model's answer is right when it holds that meter's number and
no other meter's. Every case is sent three ways, in one run:

- ``call order, direct``: the results in the order of the calls, straight to the engine;
- ``finish order, direct``: the same results shuffled (as they arrive when tools finish in another
  order), straight to the engine: what a position-only template makes of them;
- ``finish order, toolpair``: the same shuffled request through toolpair, which puts it back into
  call order.

Accuracy per condition comes with a 95% Wilson interval, for all cases and per case shape (number of
parallel calls).

    python bench/pairing.py --base-url http://127.0.0.1:8787 --engine-url http://127.0.0.1:8080 \\
        [--cases 40] [--shapes 2,3,4] [--model NAME] [--api-key K] [--engine-api-key K] [--out results.json]

``--base-url`` is toolpair (``toolpair serve`` or ``toolpair proxy --upstream ENGINE``); ``--engine-url`` is
the engine behind it. ``toolpair serve`` keeps its engine on a private port with a private key, so to
measure the direct conditions run the same model and template a second time yourself (llama-cpp-python
or llama-server) and give its URL; without ``--engine-url`` the call-order requests go through toolpair,
which forwards a request whose results are already in call order unchanged, and ``finish order, direct``
is not measured. The bundled 270M model is far too small to answer these: use a capable model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

METERS = (
    "north-gate",
    "river-pump",
    "east-tower",
    "old-mill",
    "harbour-crane",
    "south-depot",
    "hill-station",
    "west-lock",
)

TOOL = {
    "type": "function",
    "function": {
        "name": "read_meter",
        "description": "The current reading of a meter, a whole number.",
        "parameters": {"type": "object", "properties": {"meter": {"type": "string"}}, "required": ["meter"]},
    },
}


@dataclass(frozen=True)
class Case:
    """One conversation: ``meters[i]`` was called as ``ids[i]`` and read ``values[i]``."""

    meters: tuple[str, ...]
    ids: tuple[str, ...]
    values: tuple[str, ...]
    finish_order: tuple[int, ...]
    """The order the results are sent in when shuffled: never the call order."""
    target: int
    """The call whose value the user asks for."""

    @property
    def shape(self) -> int:
        return len(self.meters)


@dataclass(frozen=True)
class Condition:
    name: str
    shuffled: bool
    through_toolpair: bool


CONDITIONS = (
    Condition("call order, direct", shuffled=False, through_toolpair=False),
    Condition("finish order, direct", shuffled=True, through_toolpair=False),
    Condition("finish order, toolpair", shuffled=True, through_toolpair=True),
)


def make_cases(shapes: Sequence[int], per_shape: int, rng: random.Random) -> list[Case]:
    """``per_shape`` cases of each shape, with fresh values, IDs, finish orders and targets.

    >>> cases = make_cases([2, 4], 3, random.Random(1))
    >>> [c.shape for c in cases], all(c.finish_order != tuple(range(c.shape)) for c in cases)
    ([2, 2, 2, 4, 4, 4], True)
    """
    cases = []
    for shape in shapes:
        if not 2 <= shape <= len(METERS):
            raise ValueError(f"a case shape is 2 to {len(METERS)} parallel calls, not {shape}")
        for _ in range(per_shape):
            values = rng.sample(range(10_000, 100_000), shape)
            order = list(range(shape))
            while order == sorted(order):
                rng.shuffle(order)
            cases.append(
                Case(
                    meters=tuple(rng.sample(METERS, shape)),
                    ids=tuple(f"call_{rng.getrandbits(48):012x}" for _ in range(shape)),
                    values=tuple(str(v) for v in values),
                    finish_order=tuple(order),
                    target=rng.randrange(shape),
                )
            )
    return cases


def messages(case: Case, shuffled: bool) -> list[dict[str, Any]]:
    """The conversation up to the model's answer, results in call order or in finish order."""
    names = ", ".join(case.meters[:-1]) + " and " + case.meters[-1]
    ask = (
        f"Read the meters {names}, then tell me the reading of {case.meters[case.target]}. Reply with the number only."
    )
    calls = [
        {
            "id": case.ids[i],
            "type": "function",
            "function": {"name": "read_meter", "arguments": json.dumps({"meter": case.meters[i]})},
        }
        for i in range(case.shape)
    ]
    order = case.finish_order if shuffled else range(case.shape)
    results = [{"role": "tool", "tool_call_id": case.ids[i], "content": case.values[i]} for i in order]
    return [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": "", "tool_calls": calls},
        *results,
    ]


def body(case: Case, condition: Condition, model: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": messages(case, condition.shuffled),
        "tools": [TOOL],
        "temperature": 0,
        "seed": 7,
        "max_tokens": max_tokens,
    }


def is_right(case: Case, answer: str) -> bool:
    """The asked-for value is in the answer, and no other value of the case is.

    >>> case = Case(("a", "b"), ("x", "y"), ("11111", "22222"), (1, 0), 1)
    >>> is_right(case, "22222"), is_right(case, "11111"), is_right(case, "22222 or 11111")
    (True, False, False)
    """
    others = [v for i, v in enumerate(case.values) if i != case.target]
    return case.values[case.target] in answer and not any(v in answer for v in others)


def wilson(right: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of ``right`` out of ``total`` (95% for z = 1.96).

    >>> [round(x, 3) for x in wilson(8, 10)]
    [0.49, 0.943]
    >>> wilson(0, 0)
    (0.0, 1.0)
    """
    if total == 0:
        return 0.0, 1.0
    p = right / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Outcome:
    case: int
    shape: int
    condition: str
    answer: str | None
    right: bool
    error: str | None = None


@dataclass
class Target:
    url: str
    api_key: str | None = None


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Conditions not measured, with the reason."""


async def _ask(
    session: aiohttp.ClientSession, target: Target, payload: dict[str, Any]
) -> tuple[str | None, str | None]:
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        async with session.post(target.url.rstrip("/") + "/v1/chat/completions", json=payload, headers=headers) as r:
            text = await r.text()
            if r.status != 200:
                return None, f"HTTP {r.status}: {text[:200]}"
            reply = json.loads(text)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        content = reply["choices"][0]["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        return None, f"not a chat completion: {text[:200]}"
    return str(content), None


async def run(
    cases: Sequence[Case],
    toolpair: Target,
    engine: Target | None,
    *,
    model: str = "any",
    max_tokens: int = 24,
    concurrency: int = 4,
    request_timeout: float = 300.0,
) -> Run:
    """Send every case under every condition that can be measured; a failed request is an outcome too."""
    result = Run()
    conditions = []
    for condition in CONDITIONS:
        if condition.through_toolpair or engine is not None:
            conditions.append((condition, toolpair if condition.through_toolpair else engine))
        elif condition.shuffled:
            result.skipped[condition.name] = "no --engine-url: the engine behind toolpair is not reachable directly"
        else:  # toolpair forwards a request whose results are already in call order unchanged
            conditions.append((condition, toolpair))
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=request_timeout)) as session:

        async def one(index: int, case: Case, condition: Condition, target: Target) -> Outcome:
            async with gate:
                answer, error = await _ask(session, target, body(case, condition, model, max_tokens))
            right = answer is not None and is_right(case, answer)
            return Outcome(index, case.shape, condition.name, answer, right, error)

        jobs = [one(i, c, cond, t) for i, c in enumerate(cases) for cond, t in conditions if t is not None]
        result.outcomes = list(await asyncio.gather(*jobs))
    return result


def summary(result: Run) -> list[dict[str, Any]]:
    """One row per (shape or "all", condition): right, total, errors, accuracy and its interval."""
    rows = []
    shapes = sorted({o.shape for o in result.outcomes})
    for shape in [*shapes, None]:
        for condition in CONDITIONS:
            picked = [
                o for o in result.outcomes if o.condition == condition.name and (shape is None or o.shape == shape)
            ]
            if not picked:
                continue
            right = sum(o.right for o in picked)
            low, high = wilson(right, len(picked))
            rows.append(
                {
                    "shape": "all" if shape is None else shape,
                    "condition": condition.name,
                    "right": right,
                    "total": len(picked),
                    "errors": sum(o.error is not None for o in picked),
                    "accuracy": right / len(picked),
                    "ci95": [round(low, 4), round(high, 4)],
                }
            )
    return rows


def table(result: Run) -> str:
    lines = [
        "| parallel calls | condition | right | accuracy | 95% interval | errors |",
        "|---|---|---:|---:|---|---:|",
    ]
    for row in summary(result):
        low, high = row["ci95"]
        lines.append(
            f"| {row['shape']} | {row['condition']} | {row['right']}/{row['total']} | {row['accuracy']:.0%} "
            f"| {low:.0%} - {high:.0%} | {row['errors']} |"
        )
    lines += [f"\n{name}: not measured ({why})" for name, why in result.skipped.items()]
    return "\n".join(lines)


def _shapes(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of whole numbers: {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8787", help="toolpair (default %(default)s)")
    parser.add_argument("--api-key", help="a key toolpair accepts, if it asks for one")
    parser.add_argument("--engine-url", help="the engine behind toolpair, for the direct conditions")
    parser.add_argument("--engine-api-key", help="the engine's key, if it asks for one")
    parser.add_argument("--model", default="any", help="the model name to send (default %(default)s)")
    parser.add_argument("--cases", type=int, default=40, help="cases per shape (default %(default)s)")
    parser.add_argument("--shapes", type=_shapes, default=[2, 3, 4], help="parallel calls per case (default 2,3,4)")
    parser.add_argument("--seed", type=int, default=20260, help="makes the cases (default %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=24, help="per answer (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests at once (default %(default)s)")
    parser.add_argument("--out", help="write every answer and the summary to this JSON file")
    args = parser.parse_args(argv)
    try:
        cases = make_cases(args.shapes, args.cases, random.Random(args.seed))
    except ValueError as exc:
        parser.error(str(exc))
    engine = Target(args.engine_url, args.engine_api_key) if args.engine_url else None
    result = asyncio.run(
        run(
            cases,
            Target(args.base_url, args.api_key),
            engine,
            model=args.model,
            max_tokens=args.max_tokens,
            concurrency=args.concurrency,
        )
    )
    print(table(result))
    errors = [o for o in result.outcomes if o.error]
    if errors:
        print(f"\n{len(errors)} of {len(result.outcomes)} requests failed; the first: {errors[0].error}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            report = {"summary": summary(result), "skipped": result.skipped, "cases": [asdict(c) for c in cases]}
            json.dump({**report, "outcomes": [asdict(o) for o in result.outcomes]}, out, indent=1)
    return 1 if errors and len(errors) == len(result.outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
