"""Runs spin on the protocol model (or a mutated copy of it) and reads its verdict."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.model.sql_hashes import MODEL

# the steps of a trail worth reading: grants, expiry, deadlines, fence, commits, faults
_EVENT = re.compile(
    r"\[(ltoken = |expired = |fence = |fence_lock = h|lstate = |ldl\[h?\d?\]? ?= |"
    r"lost\[\d\] = |crash\[h\] = |killed\[|faults = |effect\[i\] = |assert)"
)

# pan's memory cap (MB): a model that outgrows it fails instead of taking the shared machine
MEMLIM_MB = 3000


@dataclass(frozen=True)
class Verdict:
    """What one spin run said."""

    errors: int
    states: int
    depth: int
    complete: bool  # the search was exhaustive: no depth or memory limit hit
    failed: str  # the first violation spin names, "" when none
    trail: list[str]  # the counterexample's steps (spin -t), empty when none
    output: str

    def summary(self) -> str:
        """A few lines for the test output: the verdict and the end of the counterexample."""
        head = f"errors={self.errors} states={self.states} depth={self.depth}"
        if not self.failed:
            return head
        events = [line for line in self.trail if _EVENT.search(line)][-14:]
        steps = "\n    ".join(events)
        return (
            f"{head}\n  violation: {self.failed}\n"
            f"  the trail's {len(self.trail)} steps, those that move the protocol:\n    {steps}"
        )


def _run(cmd: list[str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    return done.stdout + done.stderr


def verify(
    *,
    faults: int,
    liveness: bool = False,
    replace: Sequence[tuple[str, str]] = (),
    timeout: float = 240.0,
) -> Verdict:
    """Checks the model exhaustively with at most ``faults`` faults.

    Args:
        faults: the fault budget (the model's FAULTS).
        liveness: check the ``completes`` claim under weak fairness instead of the safety
            assertions and end states.
        replace: (old, new) texts, each found once in the model and replaced: a mutation.
        timeout: seconds for the search.

    Raises:
        RuntimeError: spin or a C compiler is missing, or the mutation text is not found.
    """
    for tool in ("spin", "gcc"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is not installed (scripts/services installs it)")
    text = MODEL.read_text()
    for old, new in replace:
        if text.count(old) != 1:
            raise RuntimeError(f"the mutation's text is not in the model once: {old!r}")
        text = text.replace(old, new)
    with tempfile.TemporaryDirectory(prefix="runlease-spin-") as tmp:
        work = Path(tmp)
        (work / "model.pml").write_text(text)
        out = _run(["spin", f"-DFAULTS={faults}", "-a", "model.pml"], work, 60)
        if not (work / "pan.c").exists():
            raise RuntimeError(f"spin could not read the model:\n{out}")
        flags = ["-O2", "-DCOLLAPSE", f"-DMEMLIM={MEMLIM_MB}"]
        if not liveness:
            flags += ["-DSAFETY", "-DNOCLAIM"]
        out = _run(["gcc", *flags, "-o", "pan", "pan.c"], work, 120)
        if not (work / "pan").exists():
            raise RuntimeError(f"pan did not compile:\n{out}")
        args = ["./pan", "-m2000000"] + (["-a", "-f", "-N", "completes"] if liveness else [])
        out = _run(args, work, timeout)
        trail: list[str] = []
        if any(work.glob("*.trail")):
            replay = _run(["spin", f"-DFAULTS={faults}", "-t", "-p", "model.pml"], work, 60)
            trail = [
                " ".join(line.split())
                for line in replay.splitlines()
                if re.match(r"\s*\d+:\s+proc", line)
            ]
    return _verdict(out, trail)


def _verdict(out: str, trail: list[str]) -> Verdict:
    def number(pattern: str) -> int:
        m = re.search(pattern, out)
        return int(float(m.group(1))) if m else -1

    failed = ""
    m = re.search(r"pan:\d+: (.*?) \(at depth", out) or re.search(r"pan:\d+: (.*)", out)
    if m:
        failed = m.group(1).strip()
    limited = "max search depth too small" in out or "out of memory" in out.lower()
    return Verdict(
        errors=number(r"errors: (\d+)"),
        states=number(r"([\d.e+]+) states, stored"),
        depth=number(r"depth reached (\d+)"),
        complete=not limited and "errors:" in out,
        failed=failed,
        trail=trail,
        output=out,
    )
