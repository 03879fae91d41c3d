# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import unittest

from ansible_collections.vmfork.vmfork.plugins.modules import vmfork_info, vmfork_template
from ansible_collections.vmfork.vmfork.tests.unit.plugins.modules.utils import ModuleTestCase


class TestVmforkTemplate(ModuleTestCase):
    module = vmfork_template

    def setUp(self):
        super(TestVmforkTemplate, self).setUp()
        self.fake.add_machine('web')

    def test_save_once_then_resize_the_pool(self):
        res = self.ok(dict(name='golden', source='web', pool=2), check=True, diff=True)
        self.assertTrue(res['changed'])
        self.assertEqual(self.fake.templates, [])
        self.assertEqual(res['diff']['after'], {'name': 'golden', 'source': 'web', 'pool_size': 2})
        res = self.ok(dict(name='golden', source='web', pool=2))
        self.assertTrue(res['changed'])
        self.assertEqual(res['template']['pool_size'], 2)
        res = self.ok(dict(name='golden', source='web', pool=2))
        self.assertFalse(res['changed'])
        self.assertEqual(self.fake.commands().count('template save'), 2)  # the dry run and the real one
        res = self.ok(dict(name='golden', pool=4), check=True)
        self.assertTrue(res['changed'])
        self.assertEqual(self.fake.kept('golden')['pool_size'], 2)
        # template pool has a dry run of its own now: check mode runs it.
        self.assertEqual(self.fake.calls[-1][:3], ['template', 'pool', '--dry-run'])
        self.assertEqual(res['plan']['command'], 'template pool')
        res = self.ok(dict(name='golden', pool=4))
        self.assertEqual(res['template']['pool_size'], 4)
        self.assertEqual(self.fake.commands().count('template pool'), 2)  # the dry run and the real one
        # No pool given: an existing template keeps its own.
        self.assertFalse(self.ok(dict(name='golden'))['changed'])

    def test_absent(self):
        self.fake.add_template('golden', 'web')
        res = self.ok(dict(name='golden', state='absent'), check=True)
        self.assertTrue(res['changed'])
        self.assertIsNotNone(self.fake.kept('golden'))
        res = self.ok(dict(name='golden', state='absent'))
        self.assertTrue(res['changed'] and res['removed'])
        self.assertFalse(self.ok(dict(name='golden', state='absent'))['changed'])

    def test_errors(self):
        res = self.failed(dict(name='golden'))
        self.assertIn('source is required', res['msg'])
        res = self.failed(dict(name='golden', source='nope'))
        self.assertEqual(res['rc'], 4)
        res = self.failed(dict(name='golden', source='web', state='kept'))
        self.assertIn('value of state must be one of: present, absent', res['msg'])


class TestVmforkTemplateContract(ModuleTestCase):
    module = vmfork_template

    def setUp(self):
        super(TestVmforkTemplateContract, self).setUp()
        self.fake.add_machine('web', contract={'network': {'egress': 'all'}})

    def test_save_with_a_contract_once(self):
        want = {'network': {'egress': {'allow': ['10.0.0.0/8:*']}}}
        res = self.ok(dict(name='golden', source='web', contract=want), check=True)
        self.assertTrue(res['changed'])
        self.assertEqual(res['plan']['contract']['network']['egress'], {'allow': ['10.0.0.0/8']})
        res = self.ok(dict(name='golden', source='web', contract=want))
        self.assertTrue(res['changed'])
        save = [c for c in self.fake.calls if c[:2] == ['template', 'save']][-1]
        path = save[save.index('--contract') + 1]
        self.assertFalse(os.path.exists(path))
        self.assertEqual(self.fake.contract_files[-1], (path, want))
        self.assertEqual(save[-3:-1], ['web', 'golden'])
        res = self.ok(dict(name='golden', source='web', contract=want))
        self.assertFalse(res['changed'])
        self.assertEqual(self.fake.commands()[-1], 'tree')
        # No contract given: the template's is not looked at.
        self.assertFalse(self.ok(dict(name='golden', source='web'))['changed'])
        self.assertEqual(self.fake.commands().count('tree'), 1)

    def test_without_contract_the_template_keeps_the_source_one(self):
        self.ok(dict(name='golden', source='web'))
        save = [c for c in self.fake.calls if c[:2] == ['template', 'save']][-1]
        self.assertNotIn('--contract', save)
        self.assertFalse(self.ok(dict(name='golden', contract={'network': {}}))['changed'])

    def test_another_contract_on_a_kept_template_fails_and_changes_nothing(self):
        self.fake.add_template('golden', 'web', contract={'network': {'egress': 'none'}})
        for check in (True, False):
            res = self.failed(dict(name='golden', pool=3, contract={'network': {'egress': 'all'}}), check=check)
            self.assertIn("template 'golden' gives its children another contract", res['msg'])
            self.assertEqual(res['contract']['network']['egress'], 'none')
        self.assertEqual(self.fake.kept('golden')['pool_size'], 0)
        self.assertNotIn('template pool', self.fake.commands())


class TestVmforkInfo(ModuleTestCase):
    module = vmfork_info

    def test_lineage(self):
        self.fake.add_machine('web')
        t = self.fake.add_template('golden', 'web')
        self.fake.add_machine('web-1', parent='web', template='web.7')
        self.fake.add_machine('golden-1', parent='web', template=t['id'])
        res = self.ok(dict())
        self.assertFalse(res['changed'])
        self.assertEqual(len(res['machines']), 3)
        self.assertEqual(res['lineage']['web']['children'], ['golden-1', 'web-1'])
        self.assertEqual(res['lineage']['golden-1']['kept_template'], 'golden')
        self.assertIsNone(res['lineage']['web-1']['kept_template'])
        res = self.ok(dict(name='web-1'))
        self.assertEqual([m['name'] for m in res['machines']], ['web-1'])
        self.assertEqual(list(res['lineage']), ['web-1'])
        self.assertNotIn('host', res)
        self.assertNotIn(['host', 'info', '--json'], self.fake.calls)

    def test_host(self):
        self.fake.add_machine('web')
        self.fake.add_template('golden', 'web')
        res = self.ok(dict(host=True))
        self.assertEqual(self.fake.calls[-1], ['host', 'info', '--json'])
        self.assertEqual(res['host']['machines']['running'], 1)
        self.assertEqual(res['host']['templates'][0]['name'], 'golden')
        self.assertEqual(res['host']['templates'][0]['children_that_fit'], 32)


if __name__ == '__main__':
    unittest.main()
