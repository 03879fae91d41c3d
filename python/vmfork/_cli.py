"""The vmfork CLI, run as a subprocess with --json: the one place this
package reaches vmfork. The Go API behind the CLI is the source of truth;
nothing here decides what a fork, a checkpoint or a rewind is."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Optional, Sequence


class VmforkError(Exception):
    """A vmfork command failed. ``message`` is the CLI's one-line error
    (without its "vmfork: " prefix), ``exit_code`` its exit code: 2 bad
    input (nothing changed), 3 partial success, 4 no such machine or
    template, 1 anything else."""

    def __init__(self, message: str, exit_code: int, argv: Sequence[str] = ()):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.argv = list(argv)

    def __str__(self) -> str:
        return f"{self.message} (exit {self.exit_code})"


def _error_line(stderr: str) -> str:
    """The CLI's error: its last line that starts with "vmfork: "."""
    for line in reversed(stderr.splitlines()):
        if line.startswith("vmfork: "):
            return line[len("vmfork: "):]
    lines = [l for l in stderr.splitlines() if l.strip()]
    return lines[-1] if lines else "vmfork failed with no message"


class CLI:
    """Runs one vmfork binary against one state dir."""

    def __init__(
        self,
        binary: Optional[str] = None,
        state_dir: Optional[str] = None,
        mem_dir: Optional[str] = None,
        env: Optional[dict] = None,
    ):
        self.binary = binary or os.environ.get("VMFORK_BIN", "vmfork")
        self.state_dir = state_dir
        self.mem_dir = mem_dir
        self.env = env

    def argv(self, args: Sequence[str]) -> list:
        out = [self.binary]
        if self.state_dir:
            out += ["--state-dir", self.state_dir]
        if self.mem_dir:
            out += ["--mem-dir", self.mem_dir]
        return out + list(args)

    def raw(self, args: Sequence[str], stdin: Optional[bytes] = None) -> subprocess.CompletedProcess:
        env = None
        if self.env:
            env = dict(os.environ)
            env.update(self.env)
        return subprocess.run(
            self.argv(args),
            input=stdin if stdin is not None else b"",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            check=False,
        )

    def run(self, args: Sequence[str], stdin: Optional[bytes] = None, allow: Sequence[int] = ()) -> Any:
        """Runs vmfork ARGS --json and returns its decoded stdout. A
        non-zero exit not in ``allow`` raises VmforkError."""
        argv = list(args)
        # Flags go before "--": after it everything is the guest command's.
        argv.insert(argv.index("--") if "--" in argv else len(argv), "--json")
        p = self.raw(argv, stdin)
        stderr = p.stderr.decode(errors="replace")
        if p.returncode != 0 and p.returncode not in allow:
            raise VmforkError(_error_line(stderr), p.returncode, self.argv(argv))
        out = p.stdout.decode(errors="replace").strip()
        if not out:
            if p.returncode != 0:
                raise VmforkError(_error_line(stderr), p.returncode, self.argv(argv))
            return None
        return json.loads(out)

    def bytes(self, args: Sequence[str], stdin: Optional[bytes] = None) -> bytes:
        """Runs vmfork ARGS and returns its raw stdout (vmfork cp NAME:PATH -)."""
        p = self.raw(args, stdin)
        if p.returncode != 0:
            raise VmforkError(_error_line(p.stderr.decode(errors="replace")), p.returncode, self.argv(args))
        return p.stdout
