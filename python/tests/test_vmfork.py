"""The vmfork package against real guests: the README's best-of-N example,
a scoring function that raises, checkpoint and rewind, files, errors."""

import stat

import pytest

import vmfork

# The project in the source: a calculator with a bug, and its test suite.
CALC = "#!/bin/sh\necho $(($1 - $2))\n"
SUITE = "#!/bin/sh\n[ \"$(sh /tmp/work/calc.sh 2 3)\" = 5 ] && [ \"$(sh /tmp/work/calc.sh 10 -4)\" = 6 ]\n"

PATCHES = [
    "echo 'echo $(($1 * $2))' > /tmp/work/calc.sh",  # wrong
    "echo 'echo $(($1 + $2))' > /tmp/work/calc.sh",  # right
    "rm /tmp/work/calc.sh",  # breaks it
]


@pytest.fixture(scope="module")
def project(env):
    src = env.machine("src")
    src.exec(["mkdir", "-p", "/tmp/work"], check=True)
    src.write_file("/tmp/work/calc.sh", CALC)
    src.write_file("/tmp/work/test.sh", SUITE)
    assert not src.exec(["sh", "/tmp/work/test.sh"]).ok, "the suite passes before any patch"
    return src


def passes_suite(machine, outcome):
    """Score: 1 if the test suite passes in the branch, else no contender."""
    if outcome.exit_code != 0:
        return None
    return 1.0 if machine.exec(["sh", "/tmp/work/test.sh"]).ok else None


def test_best_of_n(client, project):
    res = client.explore("src", PATCHES, passes_suite, ttl=600)
    with res:
        assert res.winner is not None and res.winner_index == 2, res.tries
        assert res.winner.exec(["sh", "/tmp/work/test.sh"]).ok
        assert sorted(m.name for m in client.ls()) == sorted(["src", res.winner.name])
        assert len(res.removed) == 2
        assert [t.score for t in res.tries] == [None, 1.0, None]
    # The context manager removed the winner too.


def test_score_fn_raises(client, project):
    def boom(machine, outcome):
        raise RuntimeError(f"scoring {machine.name} failed")

    with pytest.raises(RuntimeError, match="scoring"):
        client.explore("src", PATCHES[:2], boom, ttl=600)
    # Nothing left: the client fixture checks only the source stays.


def test_no_winner(client, project):
    res = client.explore("src", ["exit 1", "exit 2"], ttl=600)
    assert res.winner is None and len(res.removed) == 2
    assert [t.exit_code for t in res.tries] == [1, 2]


def test_fork_checkpoint_rewind_files(client, project):
    with client.fork("src", count=2, ttl=600) as kids:
        assert len(kids) == 2
        a, b = kids
        assert a.exec("hostname").stdout.strip() != b.exec("hostname").stdout.strip()
        a.write_file("/tmp/note", b"\x00binary\xff")
        assert a.read_file("/tmp/note") == b"\x00binary\xff"
        with pytest.raises(vmfork.VmforkError):
            b.read_file("/tmp/note")  # a child's changes are its own
        cp = a.checkpoint()
        a.write_file("/tmp/note", "changed")
        a.rewind(cp)
        assert a.read_file("/tmp/note") == b"\x00binary\xff"
        r = a.exec("echo out; echo err >&2; exit 7")
        assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
        assert a.exec(["cat"], stdin="piped").stdout == "piped"
        client.cli.run(["template", "rm", cp])


def test_errors_carry_message_and_exit_code(client):
    with pytest.raises(vmfork.VmforkError) as e:
        client.machine("nosuch").exec("true")
    assert e.value.exit_code == 4 and "nosuch" in e.value.message and not e.value.message.startswith("vmfork:")
    with pytest.raises(vmfork.VmforkError) as e:
        client.fork("src", names=["bad name"])
    assert e.value.exit_code == 2


def test_error_line_from_a_fake_cli(tmp_path):
    # No guest: a stand-in CLI that fails like vmfork does.
    fake = tmp_path / "vmfork"
    fake.write_text("#!/bin/sh\necho 'some log line' >&2\necho 'vmfork: machine \"x\": not found' >&2\nexit 4\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    c = vmfork.Client(binary=str(fake))
    with pytest.raises(vmfork.VmforkError) as e:
        c.ls()
    assert e.value.message == 'machine "x": not found' and e.value.exit_code == 4
