"""Machines, forks and best-of-N explore over the vmfork CLI."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ._cli import CLI, VmforkError

# Exit codes of the CLI (vmfork --help).
EXIT_USAGE = 2
EXIT_PARTIAL = 3
EXIT_NOT_FOUND = 4


def _ttl(seconds: Optional[float]) -> List[str]:
    if seconds is None:
        return []
    if seconds <= 0:
        raise ValueError(f"ttl {seconds}: want a positive number of seconds")
    return ["--ttl", f"{int(seconds * 1000)}ms"]


@dataclass
class ExecResult:
    """A command's outcome in a guest."""

    exit_code: int
    stdout: str
    stderr: str
    signal: int = 0
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.signal == 0


@dataclass
class MachineInfo:
    """One machine as vmfork ls shows it."""

    name: str
    state: str
    parent: str = ""
    template: str = ""
    hostname: str = ""
    expires: str = ""


class Machine:
    """A vmfork machine by name. As a context manager it is removed on
    exit, whatever happened inside."""

    def __init__(self, name: str, client: "Client"):
        self.name = name
        self.client = client

    def __repr__(self) -> str:
        return f"Machine({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Machine) and other.name == self.name and other.client is self.client

    def __hash__(self) -> int:
        return hash(self.name)

    def __enter__(self) -> "Machine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.rm(missing_ok=True)

    def exec(
        self,
        command: Union[str, Sequence[str]],
        stdin: Optional[Union[str, bytes]] = None,
        env: Optional[Dict[str, str]] = None,
        check: bool = False,
    ) -> ExecResult:
        """Runs command (a list, or a string for /bin/sh -c) in the guest
        and waits for it. With check, a non-zero exit raises VmforkError."""
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        args = ["exec", self.name]
        for k, v in (env or {}).items():
            args += ["--env", f"{k}={v}"]
        data = None
        if stdin is not None:
            args.append("--stdin")
            data = stdin.encode() if isinstance(stdin, str) else stdin
        start = time.monotonic()
        # exec exits with the guest command's own code after printing its
        # JSON; any exit code can be the guest's.
        out = self.client.cli.run(args + ["--"] + argv, stdin=data, allow=range(1, 256))
        r = ExecResult(
            exit_code=int(out["exit_code"]),
            stdout=out.get("stdout", ""),
            stderr=out.get("stderr", ""),
            signal=int(out.get("signal", 0)),
            duration_s=time.monotonic() - start,
        )
        if check and not r.ok:
            raise VmforkError(f"exec in {self.name}: {argv[0]} exited {r.exit_code}: {r.stderr.strip()[-200:]}", r.exit_code)
        return r

    def read_file(self, path: str) -> bytes:
        """Returns guest file path's contents."""
        return self.client.cli.bytes(["cp", f"{self.name}:{path}", "-"])

    def write_file(self, path: str, data: Union[str, bytes]) -> None:
        """Replaces guest file path with data."""
        raw = data.encode() if isinstance(data, str) else data
        self.client.cli.run(["cp", "-", f"{self.name}:{path}"], stdin=raw)

    def checkpoint(self, name: Optional[str] = None) -> str:
        """Keeps this machine's instant as a checkpoint; returns its name."""
        args = ["checkpoint", self.name] + (["--as", name] if name else [])
        out = self.client.cli.run(args)
        return out.get("name") or name or ""

    def rewind(self, checkpoint: str) -> None:
        """Replaces this machine's live state with checkpoint's."""
        self.client.cli.run(["rewind", self.name, "--to", checkpoint])

    def fork(self, count: int = 1, names: Optional[Sequence[str]] = None, ttl: Optional[float] = None) -> "ForkResult":
        """Forks this machine (see Client.fork)."""
        return self.client.fork(self.name, count=count, names=names, ttl=ttl)

    def rm(self, missing_ok: bool = False) -> None:
        """Removes the machine (killing it)."""
        try:
            self.client.cli.run(["rm", "--force", self.name])
        except VmforkError as e:
            if not (missing_ok and e.exit_code == EXIT_NOT_FOUND):
                raise


@dataclass
class ForkResult:
    """A fork's children. As a context manager every child is removed on
    exit."""

    source: str
    template: str
    pause_ms: float
    children: List[Machine]
    failed: List[Dict[str, str]] = field(default_factory=list)

    def __enter__(self) -> "ForkResult":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.children:
            self.children[0].client.rm(self.children, missing_ok=True)

    def __iter__(self):
        return iter(self.children)

    def __len__(self) -> int:
        return len(self.children)

    def __getitem__(self, i: int) -> Machine:
        return self.children[i]


@dataclass
class TryOutcome:
    """One candidate of an explore, small enough for an agent to read."""

    index: int
    candidate: Any
    branch: str
    exit_code: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    score: Optional[float] = None
    error: str = ""


@dataclass
class ExploreResult:
    """An explore's outcome: the winner kept (None if no candidate won),
    every other branch removed."""

    winner: Optional[Machine]
    winner_index: Optional[int]
    tries: List[TryOutcome]
    removed: List[str]

    def __enter__(self) -> "ExploreResult":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.winner is not None:
            self.winner.rm(missing_ok=True)


Candidate = Union[str, Sequence[str], Callable[[Machine], Any]]
ScoreFn = Callable[[Machine, TryOutcome], Optional[float]]


def exit_zero(_m: Machine, t: TryOutcome) -> Optional[float]:
    """The default score: a candidate that exits 0 wins, the fastest first."""
    return -t.duration_s if t.exit_code == 0 and not t.error else None


class Client:
    """vmfork on this host: one binary, one state dir."""

    def __init__(self, binary: Optional[str] = None, state_dir: Optional[str] = None, mem_dir: Optional[str] = None):
        self.cli = CLI(binary, state_dir, mem_dir)

    def machine(self, name: str) -> Machine:
        return Machine(name, self)

    def ls(self) -> List[MachineInfo]:
        return [
            MachineInfo(
                name=m["name"], state=m["state"], parent=m.get("parent", ""), template=m.get("template", ""),
                hostname=m.get("hostname", ""), expires=m.get("expires", ""),
            )
            for m in self.cli.run(["ls"]) or []
        ]

    def fork(
        self,
        source: Union[str, Machine],
        count: int = 1,
        names: Optional[Sequence[str]] = None,
        ttl: Optional[float] = None,
        contract: Optional[str] = None,
    ) -> ForkResult:
        """Forks source into children that continue from the same instant.
        ttl (seconds) gives each a deadline, after which vmfork removes it
        even if this program is gone. When only some children come up, the
        others are removed and VmforkError (exit 3) is raised: a caller
        gets all it asked for or nothing."""
        src = source.name if isinstance(source, Machine) else source
        args = ["fork", src] + list(names or [])
        if not names:
            args += ["--count", str(count)]
        args += _ttl(ttl)
        if contract:
            args += ["--contract", contract]
        out = self.cli.run(args, allow=(EXIT_PARTIAL,))
        kids = [Machine(c["name"], self) for c in out.get("children", [])]
        failed = out.get("failed") or []
        if failed:
            self.rm(kids, missing_ok=True)
            raise VmforkError(
                f"fork {src}: {len(failed)} of {len(failed) + len(kids)} children failed: {failed[0].get('error', '')}", EXIT_PARTIAL
            )
        return ForkResult(source=out["source"], template=out.get("template", ""), pause_ms=out.get("pause_ms", 0.0), children=kids)

    def rm(self, machines: Sequence[Union[str, Machine]], missing_ok: bool = False) -> None:
        """Removes machines, killing them."""
        names = [m.name if isinstance(m, Machine) else m for m in machines]
        if not names:
            return
        if missing_ok:
            present = {m.name for m in self.ls()}
            names = [n for n in names if n in present]
            if not names:
                return
        self.cli.run(["rm", "--force"] + names)

    def explore(
        self,
        source: Union[str, Machine],
        candidates: Sequence[Candidate],
        score_fn: ScoreFn = exit_zero,
        ttl: Optional[float] = 600,
        parallel: int = 4,
    ) -> ExploreResult:
        """Best-of-N: forks one branch of source per candidate, runs each
        candidate in its branch (a shell command, an argv list, or a
        function of the Machine), scores each branch with score_fn(machine,
        outcome) (higher wins; None: not a contender), keeps the winner and
        removes every other branch. The branches carry ttl from the start,
        so they die even if this program does. If score_fn raises, every
        branch is removed and the exception goes to the caller."""
        if not candidates:
            raise ValueError("explore: give at least one candidate")
        kids = self.fork(source, count=len(candidates), ttl=ttl)
        branches = list(kids.children)
        winner: Optional[Machine] = None
        try:
            def attempt(i: int) -> TryOutcome:
                m, c = branches[i], candidates[i]
                t = TryOutcome(index=i + 1, candidate=c, branch=m.name)
                start = time.monotonic()
                try:
                    if callable(c):
                        r = c(m)
                        if isinstance(r, ExecResult):
                            t.exit_code, t.stdout, t.stderr = r.exit_code, r.stdout, r.stderr
                        else:
                            t.exit_code = 0
                    else:
                        r = m.exec(c)
                        t.exit_code, t.stdout, t.stderr = r.exit_code, r.stdout, r.stderr
                except VmforkError as e:
                    t.error = str(e)
                t.duration_s = time.monotonic() - start
                return t

            with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
                tries = list(pool.map(attempt, range(len(branches))))
            # score_fn is the caller's code: an exception ends the explore,
            # and the finally below removes every branch first.
            for t, m in zip(tries, branches):
                t.score = score_fn(m, t)
            ranked = [t for t in tries if t.score is not None]
            best = max(ranked, key=lambda t: t.score) if ranked else None
            if best is not None:
                winner = branches[best.index - 1]
            return ExploreResult(
                winner=winner,
                winner_index=best.index if best else None,
                tries=tries,
                removed=[m.name for m in branches if m != winner],
            )
        finally:
            self.rm([m for m in branches if m != winner], missing_ok=True)


_default: Optional[Client] = None


def default_client() -> Client:
    """The Client of the module-level functions: vmfork on PATH (or
    $VMFORK_BIN), its default state dir (or $VMFORK_STATE_DIR)."""
    global _default
    if _default is None:
        _default = Client()
    return _default


def fork(source: Union[str, Machine], count: int = 1, names: Optional[Sequence[str]] = None, ttl: Optional[float] = None) -> ForkResult:
    return default_client().fork(source, count=count, names=names, ttl=ttl)


def explore(source: Union[str, Machine], candidates: Sequence[Candidate], score_fn: ScoreFn = exit_zero, ttl: Optional[float] = 600) -> ExploreResult:
    return default_client().explore(source, candidates, score_fn, ttl=ttl)
