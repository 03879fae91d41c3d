# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: agent
short_description: Run tasks in a vmfork machine through its guest agent
version_added: 0.1.0
description:
  - Runs commands in a vmfork machine with C(vmfork exec) and moves files with C(vmfork cp),
    both through qemu-guest-agent, so plays configure fork children that have no network or SSH yet.
  - Like community.libvirt's C(libvirt_qemu), but through the vmfork CLI, on the embedded QEMU
    driver as on libvirt hosts.
  - vmfork runs on the controller, or over SSH on the host with the machines (I(vmfork_ssh_host)).
    Commands go through C(/bin/sh -c) in the guest.
  - C(raw) needs only a shell in the guest; other modules need Python in it.
author:
  - vmfork developers (@vmfork)
options:
  remote_addr:
    description: The machine's name.
    type: str
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: vmfork_machine
  vmfork_binary:
    description: The vmfork executable.
    type: str
    default: vmfork
    vars:
      - name: vmfork_binary
    env:
      - name: VMFORK_BIN
  vmfork_state_dir:
    description: vmfork's state directory (C(--state-dir)); vmfork's default when unset.
    type: str
    vars:
      - name: vmfork_state_dir
    env:
      - name: VMFORK_STATE_DIR
  vmfork_mem_dir:
    description: vmfork's mem directory (C(--mem-dir)); vmfork's default when unset.
    type: str
    vars:
      - name: vmfork_mem_dir
    env:
      - name: VMFORK_MEM_DIR
  vmfork_uri:
    description: libvirt connection URI for machines on a libvirt host (C(--connect)).
    type: str
    vars:
      - name: vmfork_uri
    env:
      - name: LIBVIRT_DEFAULT_URI
  vmfork_ssh_host:
    description:
      - Run vmfork on this host over C(ssh) (C([user@]host)) instead of on the controller, for fleets
        where each libvirt host forks its own children. Files then travel on the ssh pipe.
      - The vmfork.vmfork.burst role sets it for children of hosts it reaches over SSH.
    type: str
    vars:
      - name: vmfork_ssh_host
  vmfork_home:
    description:
      - C(HOME) for the guest commands. qemu-guest-agent runs them as root with no C(HOME),
        and Ansible's remote temp dir (C(~/.ansible/tmp)) needs one.
    type: str
    default: /root
    vars:
      - name: vmfork_home
  vmfork_shell:
    description: The guest's shell that runs each command.
    type: str
    default: /bin/sh
    vars:
      - name: vmfork_shell
'''

EXAMPLES = r'''
# inventory: children added by the vmfork.vmfork.burst role, or
#   web-1 ansible_connection=vmfork.vmfork.agent
- hosts: burst
  gather_facts: false
  tasks:
    - ansible.builtin.raw: hostname
'''

import json
import os
import shlex
import subprocess

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_native, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

display = Display()


class Connection(ConnectionBase):
    """Local vmfork CLI to a machine's guest agent."""

    transport = 'vmfork.vmfork.agent'
    has_pipelining = True

    def __init__(self, play_context, new_stdin, *args, **kwargs):
        super(Connection, self).__init__(play_context, new_stdin, *args, **kwargs)
        self._machine = None

    def _vmfork(self, args, data=None):
        """Runs vmfork with the configured dirs; returns rc, stdout, stderr (bytes)."""
        cmd = [self.get_option('vmfork_binary')]
        for opt, flag in (('vmfork_state_dir', '--state-dir'), ('vmfork_mem_dir', '--mem-dir'),
                          ('vmfork_uri', '--connect')):
            if self.get_option(opt):
                cmd += [flag, self.get_option(opt)]
        cmd += ['-q'] + args
        if self.get_option('vmfork_ssh_host'):
            # ssh runs its command through the remote shell: quote every word.
            cmd = ['ssh', '-o', 'BatchMode=yes', self.get_option('vmfork_ssh_host'),
                   ' '.join(shlex.quote(to_text(a)) for a in cmd)]
        display.vvv(u'VMFORK %s' % u' '.join(to_text(a) for a in cmd), host=self._machine)
        try:
            p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as e:
            raise AnsibleConnectionFailure('vmfork: cannot run %s: %s' % (cmd[0], to_native(e)))
        out, err = p.communicate(data)
        return p.returncode, out, err

    @staticmethod
    def _error(err, rc):
        lines = [ln for ln in to_text(err, errors='surrogate_or_strict').splitlines() if ln.strip()]
        return lines[-1] if lines else 'vmfork exited with code %d' % rc

    def _connect(self):
        if not self._connected:
            self._machine = self.get_option('remote_addr')
            display.vvv(u'VMFORK agent connection to machine %s' % self._machine, host=self._machine)
            self._connected = True
        return self

    def exec_command(self, cmd, in_data=None, sudoable=True):
        super(Connection, self).exec_command(cmd, in_data=in_data, sudoable=sudoable)
        args = ['exec', self._machine, '--json', '--env', 'HOME=%s' % self.get_option('vmfork_home')]
        if in_data is not None:
            args.append('--stdin')
        args += ['--', self.get_option('vmfork_shell'), '-c', to_text(cmd)]
        rc, out, err = self._vmfork(args, data=to_bytes(in_data) if in_data is not None else b'')
        # vmfork exec --json exits with the guest command's code and prints
        # its result; without a result vmfork itself failed.
        try:
            res = json.loads(to_text(out))
        except ValueError:
            raise AnsibleConnectionFailure('vmfork exec in %s: %s' % (self._machine, self._error(err, rc)))
        return rc, to_bytes(res.get('stdout', '')), to_bytes(res.get('stderr', ''))

    def put_file(self, in_path, out_path):
        super(Connection, self).put_file(in_path, out_path)
        display.vvv(u'PUT %s TO %s' % (in_path, out_path), host=self._machine)
        if not os.path.exists(to_bytes(in_path, errors='surrogate_or_strict')):
            raise AnsibleFileNotFound('file or module does not exist: %s' % in_path)
        # The file travels on stdin, so that the same call works over ssh.
        with open(to_bytes(in_path, errors='surrogate_or_strict'), 'rb') as f:
            data = f.read()
        rc, dummy, err = self._vmfork(['cp', '-', '%s:%s' % (self._machine, out_path)], data=data)
        if rc != 0:
            raise AnsibleError('vmfork cp to %s:%s: %s' % (self._machine, out_path, self._error(err, rc)))

    def fetch_file(self, in_path, out_path):
        super(Connection, self).fetch_file(in_path, out_path)
        display.vvv(u'FETCH %s TO %s' % (in_path, out_path), host=self._machine)
        rc, out, err = self._vmfork(['cp', '%s:%s' % (self._machine, in_path), '-'])
        if rc != 0:
            raise AnsibleError('vmfork cp from %s:%s: %s' % (self._machine, in_path, self._error(err, rc)))
        with open(to_bytes(out_path, errors='surrogate_or_strict'), 'wb') as f:
            f.write(out)

    def close(self):
        self._connected = False
