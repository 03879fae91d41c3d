# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import unittest

from ansible_collections.vmfork.vmfork.plugins.modules import vmfork_machine
from ansible_collections.vmfork.vmfork.tests.unit.plugins.modules.utils import ModuleTestCase

BOOT = dict(name='web', kernel='/srv/vmlinuz', initrd='/srv/initrd.gz', disk='/srv/data.qcow2', memory='256M')


class TestVmforkMachine(ModuleTestCase):
    module = vmfork_machine

    def test_boots_once(self):
        res = self.ok(BOOT)
        self.assertTrue(res['changed'])
        self.assertEqual(res['machine']['name'], 'web')
        boot = [c for c in self.fake.calls if c[0] == 'boot'][0]
        self.assertEqual(boot[boot.index('--kernel') + 1], '/srv/vmlinuz')
        self.assertEqual(boot[boot.index('--memory') + 1], '256M')
        res = self.ok(BOOT)
        self.assertFalse(res['changed'])
        self.assertEqual(self.fake.commands().count('boot'), 1)

    def test_check_mode_boots_nothing(self):
        res = self.ok(BOOT, check=True, diff=True)
        self.assertTrue(res['changed'])
        self.assertEqual(self.fake.machines, {})
        self.assertIn('--dry-run', [c for c in self.fake.calls if c[0] == 'boot'][0])
        self.assertEqual(res['plan']['command'], 'boot')
        self.assertEqual(res['diff'], {'before': {'state': 'absent'}, 'after': {'name': 'web', 'state': 'running'}})

    def test_bad_boot_carries_the_cli_error_and_exit_code(self):
        res = self.failed(dict(name='web'))
        self.assertEqual(res['rc'], 2)
        self.assertIn('a kernel (--kernel) or a disk image (--disk) is required', res['msg'])
        res = self.failed(dict(name='web'), check=True)
        self.assertEqual(res['rc'], 2)

    def test_absent_removes_and_is_idempotent(self):
        self.fake.add_machine('web')
        res = self.ok(dict(name='web', state='absent'), check=True, diff=True)
        self.assertTrue(res['changed'])
        self.assertIn('web', self.fake.machines)
        self.assertEqual(res['diff']['after'], {'state': 'absent'})
        res = self.ok(dict(name='web', state='absent'))
        self.assertTrue(res['changed'])
        self.assertNotIn('web', self.fake.machines)
        res = self.ok(dict(name='web', state='absent'))
        self.assertFalse(res['changed'])

    def test_stopped(self):
        self.fake.add_machine('web')
        res = self.ok(dict(name='web', state='stopped'), check=True)
        self.assertTrue(res['changed'])
        self.assertEqual(self.fake.machines['web']['state'], 'running')
        # stop has a dry run of its own now: check mode runs it.
        self.assertEqual(self.fake.calls[-1][:2], ['stop', '--dry-run'])
        self.assertEqual(res['plan']['command'], 'stop')
        res = self.ok(dict(name='web', state='stopped'))
        self.assertTrue(res['changed'])
        self.assertEqual(res['machine']['state'], 'stopped')
        res = self.ok(dict(name='web', state='stopped'))
        self.assertFalse(res['changed'])
        res = self.failed(dict(name='web', state='running'))
        self.assertIn('vmfork has no start command', res['msg'])
        res = self.failed(dict(name='nope', state='stopped'))
        self.assertEqual(res['rc'], 4)

    def test_memory_sizes(self):
        self.assertEqual(vmfork_machine.mib('512M'), 512)
        self.assertEqual(vmfork_machine.mib('2G'), 2048)
        self.assertEqual(vmfork_machine.mib('2GiB'), 2048)
        self.assertEqual(vmfork_machine.mib('768'), 768)
        self.assertIsNone(vmfork_machine.mib('lots'))

    def test_a_different_spec_is_warned_about_not_changed(self):
        self.fake.add_machine('web')
        res = self.ok(dict(BOOT, memory='1G', cpus=1))
        self.assertFalse(res['changed'])
        self.assertTrue(any('memory_mib=256' in w for w in res.get('warnings', [])), res)


if __name__ == '__main__':
    unittest.main()
