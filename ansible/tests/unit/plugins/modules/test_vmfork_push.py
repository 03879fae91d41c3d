# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.vmfork.vmfork.plugins.modules import vmfork_push
from ansible_collections.vmfork.vmfork.tests.unit.plugins.modules.utils import FakeVmfork, ModuleTestCase


class TestVmforkPush(ModuleTestCase):
    module = vmfork_push

    def setUp(self):
        super(TestVmforkPush, self).setUp()
        self.fake.add_machine('web')
        self.fake.add_template('golden', 'web')
        self.other = FakeVmfork()
        self.fake.remotes['host2'] = self.other

    def test_push_once(self):
        args = dict(name='golden', to='root@host2', ssh='ssh -F cf', remote_binary='/opt/vmfork')
        res = self.ok(args, check=True, diff=True)
        self.assertTrue(res['changed'])
        self.assertFalse(res['held'])
        self.assertEqual(res['diff'], {'before': {'held': False}, 'after': {'held': True}})
        self.assertEqual(self.other.templates, [])
        self.assertNotIn('template push', self.fake.commands())
        # The other host is asked with the ssh command and remote vmfork given.
        self.assertEqual(self.fake.calls[-1], ['ssh', 'root@host2', '/opt/vmfork -q template ls --json'])

        res = self.ok(args)
        self.assertTrue(res['changed'])
        self.assertEqual(res['transfer']['received']['chunks_sent'], 3)
        push = [c for c in self.fake.calls if c[:2] == ['template', 'push']]
        self.assertEqual(push, [['template', 'push', '--ssh', 'ssh -F cf', '--remote-vmfork', '/opt/vmfork',
                                 'golden', 'root@host2:golden', '--json']])
        self.assertEqual(self.other.kept('golden')['id'], self.fake.kept('golden')['id'])

        # Held there now: nothing travels, in check mode or not.
        for check in (True, False):
            res = self.ok(args, check=check)
            self.assertFalse(res['changed'])
            self.assertTrue(res['held'])
        self.assertEqual(self.fake.commands().count('template push'), 1)

    def test_push_under_another_name(self):
        res = self.ok(dict(name='golden', to='host2:golden-v2', idle_timeout=30))
        self.assertTrue(res['changed'])
        self.assertIsNotNone(self.other.kept('golden-v2'))
        self.assertIn('30s', self.fake.calls[-1])
        self.assertFalse(self.ok(dict(name='golden', to='host2:golden-v2'))['changed'])
        # golden itself is still missing there.
        self.assertTrue(self.ok(dict(name='golden', to='host2'), check=True)['changed'])

    def test_another_instant_of_that_name_is_left_and_warned(self):
        self.other.add_machine('db')
        self.other.add_template('golden', 'db')
        res = self.ok(dict(name='golden', to='host2'))
        self.assertFalse(res['changed'])
        self.assertIn('another instant', ' '.join(res.get('warnings', [])))
        self.assertNotIn('template push', self.fake.commands())

    def test_pull_once(self):
        self.other.add_machine('db')
        self.other.add_template('base', 'db')
        args = dict(name='base-here', **{'from': 'host2:base'})
        res = self.ok(args, check=True)
        self.assertTrue(res['changed'])
        self.assertIsNone(self.fake.kept('base-here'))
        res = self.ok(args)
        self.assertTrue(res['changed'])
        self.assertEqual(res['transfer']['op'], 'pull')
        self.assertIsNotNone(self.fake.kept('base-here'))
        pull = [c for c in self.fake.calls if c[:2] == ['template', 'pull']][-1]
        self.assertEqual(pull[-2:], ['host2:base', '--json'])
        self.assertEqual(pull[pull.index('--as') + 1], 'base-here')
        self.assertFalse(self.ok(args)['changed'])
        self.assertEqual(self.fake.commands().count('template pull'), 1)

    def test_errors(self):
        res = self.failed(dict(name='nope', to='host2'))
        self.assertEqual(res['msg'], "template 'nope' is not kept on this host: nothing to push")
        res = self.failed(dict(name='golden', to='host9'))
        self.assertIn('ask which templates it holds on host9', res['msg'])
        self.assertIn('No route to host', res['msg'])
        res = self.failed(dict(name='golden'))
        self.assertIn('one of the following is required: to, from', res['msg'])
        res = self.failed(dict(name='golden', to='host2', **{'from': 'host2:x'}))
        self.assertIn('mutually exclusive', res['msg'])
        res = self.failed(dict(name='golden', to='host2', idle_timeout=0))
        self.assertEqual(res['msg'], 'idle_timeout must be above 0, got 0')
        res = self.failed(dict(name='x', **{'from': 'host2:missing'}))
        self.assertEqual(res['rc'], 4)
