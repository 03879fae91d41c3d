# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
name: vmfork
short_description: vmfork machines as inventory hosts
version_added: 0.1.0
description:
  - Lists the machines of a vmfork state directory (C(vmfork ls --json), C(vmfork template ls --json))
    as hosts, on the controller.
  - Groups C(vmfork) (every machine), C(vmfork_state_<state>), C(vmfork_parent_<parent>) and
    C(vmfork_template_<template>) (the kept template's name, else the template's id), with
    characters other than letters, digits and C(_) turned into C(_).
  - Host variables C(vmfork_state), C(vmfork_parent), C(vmfork_template), C(vmfork_kept_template),
    C(vmfork_mac), C(vmfork_addresses), C(vmfork_hostname), C(vmfork_pid), C(vmfork_driver) and
    C(vmfork_machine).
  - Hosts use the connection vmfork.vmfork.agent unless I(use_agent_connection) is false.
  - The file must end in C(vmfork.yml) or C(vmfork.yaml).
author:
  - vmfork developers (@vmfork)
extends_documentation_fragment:
  - constructed
options:
  plugin:
    description: The name of this plugin.
    required: true
    choices: [vmfork.vmfork.vmfork]
  binary:
    description: The vmfork executable.
    type: str
    default: vmfork
  state_dir:
    description: vmfork's state directory; vmfork's default when unset.
    type: str
    env:
      - name: VMFORK_STATE_DIR
  mem_dir:
    description: vmfork's mem directory; vmfork's default when unset.
    type: str
    env:
      - name: VMFORK_MEM_DIR
  uri:
    description: libvirt connection URI (C(--connect)).
    type: str
  use_agent_connection:
    description: Set C(ansible_connection) to vmfork.vmfork.agent for every host.
    type: bool
    default: true
  states:
    description: Only machines in these states; all when empty.
    type: list
    elements: str
    default: []
'''

EXAMPLES = r'''
# children.vmfork.yml
plugin: vmfork.vmfork.vmfork
states: [running]
keyed_groups:
  - key: vmfork_hostname
    prefix: host
'''

import json
import re
import subprocess

from ansible.errors import AnsibleParserError
from ansible.module_utils.common.text.converters import to_native, to_text
from ansible.plugins.inventory import BaseInventoryPlugin, Constructable


def group_name(prefix, value):
    return '%s_%s' % (prefix, re.sub(r'[^A-Za-z0-9_]', '_', value))


class InventoryModule(BaseInventoryPlugin, Constructable):

    NAME = 'vmfork.vmfork.vmfork'

    def verify_file(self, path):
        return super(InventoryModule, self).verify_file(path) and path.endswith(('vmfork.yml', 'vmfork.yaml'))

    def _vmfork(self, args):
        cmd = [self.get_option('binary')]
        for opt, flag in (('state_dir', '--state-dir'), ('mem_dir', '--mem-dir'), ('uri', '--connect')):
            if self.get_option(opt):
                cmd += [flag, self.get_option(opt)]
        cmd += ['-q'] + args + ['--json']
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
        except OSError as e:
            raise AnsibleParserError('vmfork inventory: cannot run %s: %s' % (cmd[0], to_native(e)))
        if p.returncode != 0:
            lines = [ln for ln in to_text(p.stderr).splitlines() if ln.strip()]
            raise AnsibleParserError('vmfork inventory: %s: %s' % (' '.join(args),
                                     lines[-1] if lines else 'exit %d' % p.returncode))
        return json.loads(to_text(p.stdout))

    def parse(self, inventory, loader, path, cache=True):
        super(InventoryModule, self).parse(inventory, loader, path, cache)
        self._read_config_data(path)
        machines = self._vmfork(['ls']) or []
        templates = self._vmfork(['template', 'ls']) or []
        kept = dict((t['id'], t['name']) for t in templates if t.get('name'))
        states = self.get_option('states')
        strict = self.get_option('strict')
        self.inventory.add_group('vmfork')
        for m in machines:
            if states and m.get('state') not in states:
                continue
            name = m['name']
            self.inventory.add_host(name, group='vmfork')
            hostvars = dict(
                vmfork_machine=name,
                vmfork_state=m.get('state'),
                vmfork_driver=m.get('driver'),
                vmfork_pid=m.get('pid', 0),
                vmfork_parent=m.get('parent'),
                vmfork_template=m.get('template'),
                vmfork_kept_template=kept.get(m.get('template')),
                vmfork_mac=m.get('mac'),
                vmfork_hostname=m.get('hostname'),
                vmfork_addresses=m.get('addresses') or [],
            )
            if self.get_option('use_agent_connection'):
                hostvars['ansible_connection'] = 'vmfork.vmfork.agent'
                for opt in ('state_dir', 'mem_dir', 'uri'):
                    if self.get_option(opt):
                        hostvars['vmfork_' + opt] = self.get_option(opt)
                if self.get_option('binary') != 'vmfork':
                    hostvars['vmfork_binary'] = self.get_option('binary')
            for k, v in hostvars.items():
                self.inventory.set_variable(name, k, v)
            groups = [group_name('vmfork_state', m.get('state') or 'unknown')]
            if m.get('parent'):
                groups.append(group_name('vmfork_parent', m['parent']))
            if m.get('template'):
                groups.append(group_name('vmfork_template', kept.get(m['template']) or m['template']))
            for g in groups:
                self.inventory.add_group(g)
                self.inventory.add_child(g, name)
            self._set_composite_vars(self.get_option('compose'), hostvars, name, strict=strict)
            self._add_host_to_composed_groups(self.get_option('groups'), hostvars, name, strict=strict)
            self._add_host_to_keyed_groups(self.get_option('keyed_groups'), hostvars, name, strict=strict)
