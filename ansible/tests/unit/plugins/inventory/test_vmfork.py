# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import subprocess
import unittest
from unittest import mock

from ansible.inventory.data import InventoryData

from ansible_collections.vmfork.vmfork.plugins.inventory import vmfork as inv

MACHINES = [
    dict(name='web', state='running', driver='qemu', pid=10, mac='52:54:00:00:00:01'),
    dict(name='web-1', state='running', driver='qemu', pid=11, mac='52:54:00:00:00:02', parent='web',
         template='web.2', hostname='node1', addresses=['10.0.2.16/24']),
    dict(name='web.x-2', state='stopped', driver='qemu', parent='web', template='web.1'),
]
TEMPLATES = [dict(id='web.2', name='golden', source='web'), dict(id='web.1', source='web')]


def fake_run(cmd, **kwargs):
    doc = TEMPLATES if 'template' in cmd else MACHINES
    return subprocess.CompletedProcess(cmd, 0, json.dumps(doc).encode(), b'')


class TestInventory(unittest.TestCase):

    def parse(self, **options):
        opts = dict(binary='vmfork', state_dir='/srv/vmfork', mem_dir=None, uri=None, use_agent_connection=True,
                    states=[], strict=False, compose={}, groups={}, keyed_groups=[])
        opts.update(options)
        plugin = inv.InventoryModule()
        plugin.get_option = lambda k: opts[k]
        plugin._read_config_data = lambda path: None
        plugin.inventory = InventoryData()
        plugin.loader = None
        with mock.patch.object(inv.subprocess, 'run', side_effect=fake_run) as run:
            plugin.parse(plugin.inventory, None, 'x.vmfork.yml')
        return plugin.inventory, run

    def test_groups_and_host_vars(self):
        inventory, run = self.parse()
        self.assertEqual(run.call_args_list[0][0][0], ['vmfork', '--state-dir', '/srv/vmfork', '-q', 'ls', '--json'])
        groups = inventory.groups
        self.assertEqual(sorted(h.name for h in groups['vmfork'].get_hosts()), ['web', 'web-1', 'web.x-2'])
        self.assertEqual([h.name for h in groups['vmfork_template_golden'].get_hosts()], ['web-1'])
        self.assertEqual([h.name for h in groups['vmfork_template_web_1'].get_hosts()], ['web.x-2'])
        self.assertEqual(sorted(h.name for h in groups['vmfork_parent_web'].get_hosts()), ['web-1', 'web.x-2'])
        self.assertEqual([h.name for h in groups['vmfork_state_stopped'].get_hosts()], ['web.x-2'])
        v = inventory.get_host('web-1').vars
        self.assertEqual(v['vmfork_mac'], '52:54:00:00:00:02')
        self.assertEqual(v['vmfork_addresses'], ['10.0.2.16/24'])
        self.assertEqual(v['vmfork_kept_template'], 'golden')
        self.assertEqual(v['ansible_connection'], 'vmfork.vmfork.agent')
        self.assertEqual(v['vmfork_state_dir'], '/srv/vmfork')

    def test_states_filter_and_no_agent_connection(self):
        inventory, dummy = self.parse(states=['stopped'], use_agent_connection=False)
        self.assertEqual([h.name for h in inventory.groups['vmfork'].get_hosts()], ['web.x-2'])
        self.assertNotIn('ansible_connection', inventory.get_host('web.x-2').vars)

    def test_verify_file(self):
        plugin = inv.InventoryModule()
        with mock.patch('os.path.exists', return_value=True), mock.patch('os.access', return_value=True):
            self.assertTrue(plugin.verify_file('/etc/ansible/hosts.vmfork.yml'))
            self.assertFalse(plugin.verify_file('/etc/ansible/hosts.yml'))


if __name__ == '__main__':
    unittest.main()
