# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shutil
import tempfile
import unittest

from ansible_collections.vmfork.vmfork.plugins.modules import vmfork_machine
from ansible_collections.vmfork.vmfork.tests.unit.plugins.modules.utils import ModuleTestCase

BOOT = dict(name='web', kernel='/srv/vmlinuz', initrd='/srv/initrd.gz', disk='/srv/data.qcow2', memory='256M')
ALLOW = {'network': {'egress': {'allow': ['Mirror.example:443']}},
         'secrets': {'TOKEN': {'hosts': ['registry.example'], 'value_from': {'env': 'TOKEN'}}}}
RECORDED_ALLOW = {'network': {'egress': {'allow': ['mirror.example:443']}, 'dns': 'host', 'connections': 'reset'},
                  'secrets': {'TOKEN': {'hosts': ['registry.example'], 'header': 'Authorization', 'format': '{value}',
                                        'value_from': {'env': 'TOKEN'}}}}


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

    def test_boots_with_extra_disks(self):
        disks = [dict(id='data', file='/srv/d.qcow2'), dict(id='scratch', file='/srv/s.qcow2', fork='fresh')]
        self.ok(dict(BOOT, disks=disks))
        boot = [c for c in self.fake.calls if c[0] == 'boot'][0]
        got = [boot[i + 1] for i, a in enumerate(boot) if a == '--disk']
        self.assertEqual(got, ['/srv/data.qcow2', 'id=data,file=/srv/d.qcow2,fork=cow',
                               'id=scratch,file=/srv/s.qcow2,fork=fresh'])

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


class TestVmforkMachineContract(ModuleTestCase):
    module = vmfork_machine

    def calls(self, word):
        return [c for c in self.fake.calls if c[0] == word]

    def test_boots_with_a_contract_once(self):
        res = self.ok(dict(BOOT, contract=ALLOW), diff=True)
        self.assertTrue(res['changed'])
        boot = self.calls('boot')[0]
        path = boot[boot.index('--contract') + 1]
        self.assertEqual(self.fake.contract_files, [(path, ALLOW)])
        self.assertFalse(os.path.exists(path))
        self.assertEqual(res['machine']['contract'], RECORDED_ALLOW)
        res = self.ok(dict(BOOT, contract=ALLOW), diff=True)
        self.assertFalse(res['changed'], res)
        self.assertEqual(self.calls('contract'), [])

    def test_check_mode_plans_the_boot_with_the_contract(self):
        res = self.ok(dict(BOOT, contract=ALLOW), check=True)
        self.assertTrue(res['changed'])
        self.assertEqual(res['plan']['contract'], RECORDED_ALLOW)
        self.assertEqual(self.fake.machines, {})

    def test_a_contract_file(self):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        path = os.path.join(d, 'contract.yml')
        with open(path, 'w') as f:
            f.write('network:\n  egress: none\n  connections: keep\n')
        self.ok(dict(BOOT, contract=path))
        boot = self.calls('boot')[0]
        self.assertEqual(boot[boot.index('--contract') + 1], path)
        self.assertTrue(os.path.exists(path))
        self.assertFalse(self.ok(dict(BOOT, contract=path))['changed'])
        with open(path, 'w') as f:
            f.write('network:\n  egress: all\n')
        res = self.ok(dict(BOOT, contract=path))
        self.assertTrue(res['changed'])
        self.assertEqual(self.calls('contract')[0][-2:], ['web', '--json'])
        self.assertEqual(res['machine']['contract']['network'], {'egress': 'all', 'dns': 'host', 'connections': 'reset'})

    def test_a_running_machine_gets_the_new_network_in_place(self):
        self.fake.add_machine('web', contract=ALLOW)
        want = dict(ALLOW, network={'egress': 'none'})
        res = self.ok(dict(name='web', contract=want), check=True, diff=True)
        self.assertTrue(res['changed'])
        self.assertEqual(self.calls('contract')[0][:2], ['contract', '--dry-run'])
        self.assertEqual(res['plan']['command'], 'contract')
        self.assertEqual(self.fake.machines['web']['contract'], RECORDED_ALLOW)
        self.assertEqual(res['diff']['before']['contract'], RECORDED_ALLOW)
        self.assertEqual(res['diff']['after']['contract']['network'],
                         {'egress': 'none', 'dns': 'host', 'connections': 'reset'})
        res = self.ok(dict(name='web', contract=want))
        self.assertTrue(res['changed'])
        self.assertEqual(res['contract']['name'], 'web')
        self.assertEqual(res['machine']['contract']['network']['egress'], 'none')
        self.assertEqual(self.fake.machines['web']['contract']['network']['egress'], 'none')
        self.assertFalse(any(os.path.exists(c[c.index('--set') + 1]) for c in self.calls('contract')))
        self.assertFalse(self.ok(dict(name='web', contract=want))['changed'])
        # No contract given: the machine's is left as it is.
        self.assertFalse(self.ok(dict(name='web'))['changed'])
        self.assertEqual(len(self.calls('contract')), 2)

    def test_lifting_the_contract(self):
        self.fake.add_machine('web', contract={'network': {'egress': 'none'}})
        res = self.ok(dict(name='web', contract={}))
        self.assertTrue(res['changed'])
        self.assertNotIn('contract', self.fake.machines['web'])
        self.assertNotIn('contract', res['machine'])
        self.assertFalse(self.ok(dict(name='web', contract={}))['changed'])

    def test_a_change_of_secrets_fails_with_the_cli_message(self):
        self.fake.add_machine('web', contract=ALLOW)
        for check in (True, False):
            res = self.failed(dict(name='web', contract={'network': {'egress': 'none'}}), check=check)
            self.assertEqual(res['rc'], 2)
            self.assertIn('secrets: only the network part changes in place', res['msg'])
        self.assertEqual(self.fake.machines['web']['contract'], RECORDED_ALLOW)

    def test_stopping_or_removing_ignores_the_contract(self):
        self.fake.add_machine('web', contract=ALLOW)
        self.assertTrue(self.ok(dict(name='web', state='stopped', contract={}))['changed'])
        self.assertFalse(self.ok(dict(name='web', state='stopped', contract={}))['changed'])
        self.assertTrue(self.ok(dict(name='web', state='absent', contract={}))['changed'])
        self.assertEqual(self.calls('contract'), [])


if __name__ == '__main__':
    unittest.main()
