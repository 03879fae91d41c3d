"""vmfork from Python: fork running VMs, run commands in them, checkpoint
and rewind, and keep the best of N tries (explore) with a scoring function
in Python.

A thin client of the vmfork CLI's --json output (vmfork's Go API is the
source of truth); no dependency beyond the standard library.

    import vmfork

    vm = vmfork.Client()
    with vm.fork("web", count=3, ttl=600) as kids:
        for k in kids:
            print(k.name, k.exec("hostname").stdout)

Errors are VmforkError, carrying the CLI's one-line message and exit code.
"""

from ._cli import VmforkError
from ._client import (
    Client,
    ExecResult,
    ExploreResult,
    ForkResult,
    Machine,
    MachineInfo,
    TryOutcome,
    default_client,
    exit_zero,
    explore,
    fork,
)

__all__ = [
    "Client",
    "ExecResult",
    "ExploreResult",
    "ForkResult",
    "Machine",
    "MachineInfo",
    "TryOutcome",
    "VmforkError",
    "default_client",
    "exit_zero",
    "explore",
    "fork",
]
