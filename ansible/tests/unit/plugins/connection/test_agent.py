# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import shlex
import shutil
import tempfile
import unittest
from unittest import mock

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.playbook.play_context import PlayContext

from ansible_collections.vmfork.vmfork.plugins.connection import agent

OPTIONS = dict(remote_addr='web-1', vmfork_binary='/usr/bin/vmfork', vmfork_state_dir='/srv/vmfork',
               vmfork_mem_dir=None, vmfork_uri=None, vmfork_ssh_host=None, vmfork_home='/root',
               vmfork_shell='/bin/sh')


class FakePopen:
    """Records each vmfork call; answers with the next scripted reply."""
    calls = []
    replies = []

    def __init__(self, cmd, **kwargs):
        self.cmd = cmd
        self.returncode, self.out, self.err = FakePopen.replies.pop(0)

    def communicate(self, data=None):
        FakePopen.calls.append((self.cmd, data))
        return self.out, self.err


class TestAgentConnection(unittest.TestCase):

    def setUp(self):
        FakePopen.calls, FakePopen.replies = [], []
        p = mock.patch.object(agent.subprocess, 'Popen', FakePopen)
        p.start()
        self.addCleanup(p.stop)
        self.options = dict(OPTIONS)
        self.conn = agent.Connection(PlayContext(), None)
        self.conn.get_option = lambda k: self.options[k]
        self.conn._connect()

    def test_exec_passes_the_guest_exit_code_and_output(self):
        FakePopen.replies = [(3, json.dumps(dict(exit_code=3, stdout='out', stderr='err')).encode(), b'')]
        rc, out, err = self.conn.exec_command('ls /nope')
        self.assertEqual((rc, out, err), (3, b'out', b'err'))
        cmd, data = FakePopen.calls[0]
        self.assertEqual(cmd[:4], ['/usr/bin/vmfork', '--state-dir', '/srv/vmfork', '-q'])
        self.assertEqual(cmd[4:], ['exec', 'web-1', '--json', '--env', 'HOME=/root', '--', '/bin/sh', '-c',
                                   'ls /nope'])

    def test_exec_with_input_uses_stdin(self):
        FakePopen.replies = [(0, b'{"exit_code": 0, "stdout": "", "stderr": ""}', b'')]
        self.conn.exec_command('python3', in_data=b'print(1)')
        cmd, data = FakePopen.calls[0]
        self.assertIn('--stdin', cmd[:cmd.index('--')])
        self.assertEqual(data, b'print(1)')

    def test_a_vmfork_failure_is_a_connection_failure(self):
        FakePopen.replies = [(4, b'', b'vmfork: exec: machine "web-1": not found\n')]
        with self.assertRaisesRegex(AnsibleConnectionFailure, 'machine "web-1": not found'):
            self.conn.exec_command('true')

    def test_files_travel_on_the_pipe(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        src = os.path.join(d, 'in')
        with open(src, 'wb') as f:
            f.write(b'payload')
        FakePopen.replies = [(0, b'', b''), (0, b'guest data', b'')]
        self.conn.put_file(src, '/tmp/x')
        self.conn.fetch_file('/etc/hostname', os.path.join(d, 'out'))
        (put, put_data), (fetch, dummy) = FakePopen.calls
        self.assertEqual(put[-3:], ['cp', '-', 'web-1:/tmp/x'])
        self.assertEqual(put_data, b'payload')
        self.assertEqual(fetch[-3:], ['cp', 'web-1:/etc/hostname', '-'])
        with open(os.path.join(d, 'out'), 'rb') as f:
            self.assertEqual(f.read(), b'guest data')
        FakePopen.replies = [(1, b'', b'vmfork: cp to web-1:/x: permission denied\n')]
        with self.assertRaisesRegex(AnsibleError, 'permission denied'):
            self.conn.put_file(src, '/x')

    def test_over_ssh_every_word_is_quoted(self):
        self.options['vmfork_ssh_host'] = 'root@hv1'
        FakePopen.replies = [(0, b'{"exit_code": 0, "stdout": "", "stderr": ""}', b'')]
        self.conn.exec_command("echo 'a b'")
        cmd, dummy = FakePopen.calls[0]
        self.assertEqual(cmd[:4], ['ssh', '-o', 'BatchMode=yes', 'root@hv1'])
        inner = ['/usr/bin/vmfork', '--state-dir', '/srv/vmfork', '-q', 'exec', 'web-1', '--json', '--env',
                 'HOME=/root', '--', '/bin/sh', '-c', "echo 'a b'"]
        self.assertEqual(cmd[4], ' '.join(shlex.quote(a) for a in inner))


if __name__ == '__main__':
    unittest.main()
