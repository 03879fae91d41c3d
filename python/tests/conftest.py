"""The fixtures of the vmfork package's tests: one state dir with one booted
busybox test guest (VMFORK_GUEST), forked by every test; everything it
started is killed and removed at the end."""

import json
import os
import shutil
import signal
import subprocess
import tempfile

import pytest

import vmfork


def _pids_of(state_dir):
    """PIDs of processes whose command line names state_dir: the QEMUs,
    the reaper and the ledger server the tests' vmfork commands started."""
    out = []
    for ent in os.listdir("/proc"):
        if not ent.isdigit() or int(ent) == os.getpid():
            continue
        try:
            with open(f"/proc/{ent}/cmdline", "rb") as f:
                if state_dir.encode() in f.read():
                    out.append(int(ent))
        except OSError:
            pass
    return out


@pytest.fixture(scope="session")
def env():
    binary, guest = os.environ.get("VMFORK_BIN"), os.environ.get("VMFORK_GUEST")
    if not binary or not guest:
        pytest.fail("set VMFORK_BIN and VMFORK_GUEST (make python-test does)")
    state = tempfile.mkdtemp(prefix="vmfork-py-")
    mem = tempfile.mkdtemp(prefix="vmfork-py-", dir="/dev/shm")
    client = vmfork.Client(binary=binary, state_dir=state, mem_dir=mem)
    try:
        client.cli.run([
            "boot", "src", "--kernel", f"{guest}/vmlinuz", "--initrd", f"{guest}/initrd.gz",
            "--disk", f"{guest}/data.qcow2", "--memory", "256M",
        ])
        yield client
    finally:
        for pid in _pids_of(state):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(mem, ignore_errors=True)


@pytest.fixture
def client(env):
    """The session's client; each test must leave only the source."""
    yield env
    left = sorted(m.name for m in env.ls())
    assert left == ["src"], f"the test left machines behind: {left}"
