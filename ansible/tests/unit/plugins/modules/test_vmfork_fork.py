# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import shutil
import tempfile
import unittest

from ansible_collections.vmfork.vmfork.plugins.modules import vmfork_fork
from ansible_collections.vmfork.vmfork.tests.unit.plugins.modules.utils import FakeVmfork, ModuleTestCase

NO_EGRESS = {'network': {'egress': 'none'}}
RECORDED_NO_EGRESS = {'network': {'egress': 'none', 'dns': 'host', 'connections': 'reset'}}
TOKEN = {'hosts': ['API.example.com'], 'format': 'Bearer {value}', 'value_from': {'exec': '/bin/mint'}}


class TestVmforkFork(ModuleTestCase):
    module = vmfork_fork

    def setUp(self):
        super(TestVmforkFork, self).setUp()
        self.fake.add_machine('web')

    def test_forks_count_children_with_a_hostname_pattern(self):
        res = self.ok(dict(parent='web', count=3, hostname='node{n}'))
        self.assertTrue(res['changed'])
        self.assertEqual([c['name'] for c in res['children']], ['web-1', 'web-2', 'web-3'])
        self.assertEqual([c['hostname'] for c in res['children']], ['node1', 'node2', 'node3'])
        self.assertTrue(all(c['created'] and c['mac'] and c['pause_ms'] == 68.5 for c in res['children']))
        self.assertEqual(res['children'][0]['identity']['steps'][0]['name'], 'vmfork.hostname')
        # One fork call for the three, so the parent paused once.
        self.assertEqual(self.fake.commands().count('fork'), 1)
        fork = [c for c in self.fake.calls if c[0] == 'fork'][0]
        self.assertEqual(fork[-1], '--json')
        self.assertEqual(fork[-5:-1], ['web', 'web-1', 'web-2', 'web-3'])

    def test_disk_policy(self):
        self.ok(dict(parent='web', count=1, disk_policy={'scratch': 'fresh', 'data': 'shared'}))
        fork = [c for c in self.fake.calls if c[0] == 'fork'][0]
        got = [fork[i + 1] for i, a in enumerate(fork) if a == '--disk-policy']
        self.assertEqual(got, ['data=shared', 'scratch=fresh'])

    def test_second_run_changes_nothing(self):
        self.ok(dict(parent='web', count=2))
        calls = len(self.fake.calls)
        res = self.ok(dict(parent='web', count=2))
        self.assertFalse(res['changed'])
        self.assertEqual([c['name'] for c in res['children']], ['web-1', 'web-2'])
        self.assertFalse(any(c['created'] for c in res['children']))
        self.assertNotIn('fork', self.fake.commands()[calls:])
        # wait_agent checks that the existing children answer.
        self.assertEqual(self.fake.commands()[calls:].count('exec'), 2)

    def test_only_missing_children_are_forked_and_keep_their_numbers(self):
        self.fake.add_machine('web-1', parent='web', template='web.9', hostname='node1')
        res = self.ok(dict(parent='web', count=3, hostname='node{n}'))
        self.assertTrue(res['changed'])
        forks = [c for c in self.fake.calls if c[0] == 'fork']
        # {n} is a child's position in its fork: web-2 and web-3 are forked
        # one by one with their own numbers filled in.
        self.assertEqual([f[-2] for f in forks], ['web-2', 'web-3'])
        self.assertEqual([f[f.index('--hostname') + 1] for f in forks], ['node2', 'node3'])
        self.assertEqual([c['hostname'] for c in res['children']], ['node1', 'node2', 'node3'])
        self.assertEqual([c['created'] for c in res['children']], [False, True, True])

    def test_check_mode_runs_dry_run_and_changes_nothing(self):
        res = self.ok(dict(parent='web', names=['a', 'b'], hostname='x-{n}'), check=True, diff=True)
        self.assertTrue(res['changed'])
        self.assertEqual(list(self.fake.machines), ['web'])
        self.assertEqual(self.fake.templates, [])
        fork = [c for c in self.fake.calls if c[0] == 'fork'][0]
        self.assertIn('--dry-run', fork)
        self.assertEqual(res['plans'][0]['children'][1]['hostname'], 'x-2')
        self.assertEqual(res['diff'], {'before': {'children': []}, 'after': {'children': ['a', 'b']}})
        self.assertNotIn('exec', self.fake.commands())

    def test_check_mode_with_nothing_missing_reports_no_change(self):
        self.ok(dict(parent='web', count=1))
        res = self.ok(dict(parent='web', count=1), check=True, diff=True)
        self.assertFalse(res['changed'])
        self.assertEqual(res['diff']['before'], res['diff']['after'])

    def test_partial_fork_returns_children_that_came_up_and_fails_with_exit_3(self):
        self.fake.fail_children = {'web-2'}
        res = self.failed(dict(parent='web', count=3))
        self.assertEqual(res['rc'], 3)
        self.assertIn('2 of 3 children came up', res['msg'])
        self.assertEqual([c['name'] for c in res['children']], ['web-1', 'web-3'])
        self.assertEqual([c['name'] for c in res['failed_children']], ['web-2'])
        self.assertTrue(res['changed'])

    def test_unknown_parent_fails_with_the_cli_error(self):
        for check in (False, True):
            res = self.failed(dict(parent='nope', count=1), check=check)
            self.assertEqual(res['rc'], 4)
            self.assertEqual(res['msg'], "fork: machine 'nope': not found")
            self.assertFalse(res['changed'])

    def test_bad_arguments_fail_with_ansible_messages(self):
        res = self.failed(dict(parent='web', names=['a'], count=2))
        self.assertIn('parameters are mutually exclusive: names|count', res['msg'])
        res = self.failed(dict(parent='web', count=0))
        self.assertEqual(res['msg'], 'count must be at least 1, got 0')
        res = self.failed(dict(parent='web', count='many'))
        self.assertIn("argument 'count' is of type", res['msg'])
        res = self.failed(dict(parent='web', colour='red'))
        self.assertIn('Unsupported parameters', res['msg'])
        res = self.failed(dict(count=1))
        self.assertIn('missing required arguments: parent', res['msg'])
        res = self.failed(dict(parent='web', identity='random'))
        self.assertIn('value of identity must be one of: fresh, reproducible', res['msg'])
        self.assertEqual(self.fake.calls, [])

    def test_parent_vm_alias_and_kept_template_parent(self):
        self.fake.add_template('golden', 'web')
        res = self.ok(dict(parent_vm='golden', count=2))
        self.assertEqual([c['name'] for c in res['children']], ['golden-1', 'golden-2'])
        self.assertEqual(res['children'][0]['pause_ms'], 0)
        res = self.ok(dict(parent_vm='golden', count=2))
        self.assertFalse(res['changed'])

    def test_a_machine_of_another_parent_is_not_taken_for_a_child(self):
        self.fake.add_machine('db')
        self.fake.add_machine('web-1', parent='db', template='db.1')
        res = self.failed(dict(parent='web', count=1))
        self.assertIn("is not a child of 'web'", res['msg'])
        self.assertNotIn('fork', self.fake.commands())

    def test_options_reach_the_cli(self):
        self.ok(dict(parent='web', names=['a'], identity='reproducible', network='static',
                     addresses=['10.0.2.21/24'], skip_steps=['vmfork.ssh-host-keys'], parallel=2,
                     uri='qemu:///system', state_dir='/srv/vmfork', timeout=30, customize={'hostname': 'h{n}'}))
        fork = [c for c in self.fake.calls if c[0] == 'fork'][0]
        for flag, value in (('--identity', 'reproducible'), ('--network', 'static'), ('--address', '10.0.2.21/24'),
                            ('--skip-step', 'vmfork.ssh-host-keys'), ('--parallel', '2')):
            self.assertEqual(fork[fork.index(flag) + 1], value)
        self.assertIn('--customize', fork)
        self.assertEqual(self.fake.globals[:6], ['--state-dir', '/srv/vmfork', '--connect', 'qemu:///system',
                                                 '--timeout', '30s'])


class TestVmforkForkContract(ModuleTestCase):
    module = vmfork_fork

    def setUp(self):
        super(TestVmforkForkContract, self).setUp()
        self.fake.add_machine('web')
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)

    def calls(self, word):
        return [c for c in self.fake.calls if c[0] == word]

    def test_a_dict_goes_to_the_fork_as_a_temp_file_removed_afterwards(self):
        res = self.ok(dict(parent='web', count=2, contract=NO_EGRESS))
        fork = self.calls('fork')[0]
        path = fork[fork.index('--contract') + 1]
        self.assertEqual(self.fake.contract_files, [(path, NO_EGRESS)])
        self.assertTrue(os.path.basename(path).startswith('vmfork-contract-'))
        self.assertFalse(os.path.exists(path))
        self.assertEqual([c['contract'] for c in res['children']], [RECORDED_NO_EGRESS] * 2)
        self.assertEqual(self.fake.machines['web-1']['contract'], RECORDED_NO_EGRESS)

    def test_the_temp_file_is_removed_when_the_fork_fails(self):
        self.fake.fail_children = {'web-1'}
        self.failed(dict(parent='web', count=1, contract=NO_EGRESS))
        path = self.fake.contract_files[0][0]
        self.assertFalse(os.path.exists(path))

    def test_a_path_is_passed_as_it_is(self):
        for name, text in (('c.yaml', 'network:\n  egress: none\n'), ('c.json', json.dumps(NO_EGRESS))):
            path = os.path.join(self.dir, name)
            with open(path, 'w') as f:
                f.write(text)
            res = self.ok(dict(parent='web', names=['child-' + name[2:]], contract=path))
            fork = self.calls('fork')[-1]
            self.assertEqual(fork[fork.index('--contract') + 1], path)
            self.assertTrue(os.path.exists(path))
            self.assertEqual(res['children'][0]['contract'], RECORDED_NO_EGRESS)
            # The second run reads the file to compare: nothing changes.
            res = self.ok(dict(parent='web', names=['child-' + name[2:]], contract=path))
            self.assertFalse(res['changed'], res)
        self.assertEqual(self.calls('contract'), [])

    def test_second_run_with_the_same_contract_changes_nothing(self):
        allow = {'allow': ['API.example.com:443', '10.0.0.0/8:*']}
        spec = dict(parent='web', count=2, contract={'network': {'egress': allow}, 'secrets': {'TOKEN': TOKEN}})
        self.ok(spec)
        self.assertEqual(self.fake.machines['web-1']['contract']['network']['egress'],
                         {'allow': ['api.example.com:443', '10.0.0.0/8']})
        res = self.ok(spec, diff=True)
        self.assertFalse(res['changed'], res)
        self.assertEqual(self.calls('contract'), [])
        self.assertFalse(any(c['contract_changed'] for c in res['children']))
        self.assertEqual(res['diff']['before'], res['diff']['after'])

    def test_without_contract_children_inherit_and_existing_ones_are_left_alone(self):
        self.fake.machines['web']['contract'] = RECORDED_NO_EGRESS
        res = self.ok(dict(parent='web', count=1))
        self.assertNotIn('--contract', self.calls('fork')[0])
        self.assertEqual(res['children'][0]['contract'], RECORDED_NO_EGRESS)  # inherited, as ls shows it
        self.fake.machines['web-1']['contract'] = {'network': {'egress': 'all', 'dns': 'host', 'connections': 'keep'}}
        res = self.ok(dict(parent='web', count=1))
        self.assertFalse(res['changed'])
        self.assertEqual(self.calls('contract'), [])

    def test_a_contract_section_of_the_customize_spec_reaches_the_fork(self):
        res = self.ok(dict(parent='web', count=1, customize={'contract': NO_EGRESS}))
        self.assertNotIn('--contract', self.calls('fork')[0])
        self.assertEqual(res['children'][0]['contract'], RECORDED_NO_EGRESS)

    def test_an_existing_child_with_another_network_is_changed_in_place(self):
        self.fake.add_machine('web-1', parent='web', template='web.9', contract={'network': {'egress': 'all'}})
        self.fake.add_machine('web-2', parent='web', template='web.9', contract=NO_EGRESS)
        res = self.ok(dict(parent='web', count=3, contract=NO_EGRESS), diff=True)
        self.assertTrue(res['changed'])
        sets = self.calls('contract')
        self.assertEqual(len(sets), 1)
        self.assertEqual(sets[0][-2:], ['web-1', '--json'])
        path = sets[0][sets[0].index('--set') + 1]
        self.assertFalse(os.path.exists(path))
        self.assertEqual(self.fake.machines['web-1']['contract'], RECORDED_NO_EGRESS)
        self.assertEqual([c['contract_changed'] for c in res['children']], [True, False, False])
        self.assertEqual([c['contract'] for c in res['children']], [RECORDED_NO_EGRESS] * 3)
        self.assertEqual([c['name'] for c in res['contracts']], ['web-1'])
        self.assertEqual(res['diff']['before']['contracts'],
                         {'web-1': {'network': {'egress': 'all', 'dns': 'host', 'connections': 'reset'}}})
        self.assertEqual(res['diff']['after']['contracts'], {'web-1': RECORDED_NO_EGRESS})
        # Only web-3 was missing.
        self.assertEqual(self.calls('fork')[0][-3:-1], ['web', 'web-3'])
        res = self.ok(dict(parent='web', count=3, contract=NO_EGRESS))
        self.assertFalse(res['changed'])
        self.assertEqual(len(self.calls('contract')), 1)

    def test_check_mode_runs_the_dry_run_of_the_change(self):
        self.fake.add_machine('web-1', parent='web', template='web.9')
        res = self.ok(dict(parent='web', count=2, contract=NO_EGRESS), check=True, diff=True)
        self.assertTrue(res['changed'])
        sets = self.calls('contract')
        self.assertEqual(sets[0][:2], ['contract', '--dry-run'])
        self.assertNotIn('contract', self.fake.machines['web-1'])
        self.assertNotIn('web-2', self.fake.machines)
        self.assertEqual([p['command'] for p in res['plans']], ['contract', 'fork'])
        self.assertEqual(res['plans'][1]['contract'], RECORDED_NO_EGRESS)
        self.assertEqual([c['contract'] for c in res['children']], [RECORDED_NO_EGRESS] * 2)
        self.assertEqual(res['diff']['before']['contracts'], {'web-1': {}})
        self.assertEqual(res['diff']['after']['contracts'], {'web-1': RECORDED_NO_EGRESS})

    def test_a_change_of_secrets_fails_with_the_cli_message(self):
        self.fake.add_machine('web-1', parent='web', template='web.9', contract={'secrets': {'TOKEN': TOKEN}})
        other = dict(TOKEN, hosts=['other.example.com'])
        for check in (True, False):
            res = self.failed(dict(parent='web', count=2, contract={'network': {'egress': 'none'},
                                                                    'secrets': {'TOKEN': other}}), check=check)
            self.assertEqual(res['rc'], 2)
            self.assertIn('secrets: only the network part changes in place', res['msg'])
            self.assertFalse(res['changed'])
        self.assertEqual(self.fake.machines['web-1']['contract']['secrets']['TOKEN']['hosts'], ['api.example.com'])
        self.assertNotIn('fork', self.fake.commands())
        self.assertFalse(any(os.path.exists(c[c.index('--set') + 1]) for c in self.calls('contract')))

    def test_the_same_secrets_with_a_new_network_are_fine(self):
        self.fake.add_machine('web-1', parent='web', template='web.9', contract={'secrets': {'TOKEN': TOKEN}})
        res = self.ok(dict(parent='web', count=1, contract={'network': {'egress': 'none'},
                                                            'secrets': {'TOKEN': dict(TOKEN, header='')}}))
        self.assertTrue(res['changed'])
        self.assertEqual(self.fake.machines['web-1']['contract']['network'], RECORDED_NO_EGRESS['network'])

    def test_a_stopped_child_cannot_change_its_contract(self):
        self.fake.add_machine('web-1', state='stopped', parent='web', template='web.9')
        res = self.failed(dict(parent='web', count=1, contract=NO_EGRESS, wait_agent=False))
        self.assertEqual(res['rc'], 1)
        self.assertIn('changes in place only while it runs', res['msg'])

    def test_a_bad_contract_fails_with_the_cli_message(self):
        res = self.failed(dict(parent='web', count=1, contract={'colour': 'red'}))
        self.assertEqual(res['rc'], 2)
        self.assertIn("unknown key 'colour'", res['msg'])
        res = self.failed(dict(parent='web', count=1, contract=['none']))
        self.assertEqual(res['msg'], 'contract must be a dict or the path of a YAML or JSON file on the managed host')
        res = self.failed(dict(parent='web', count=1, contract=os.path.join(self.dir, 'nope.json')))
        self.assertIn('no such file', res['msg'].lower())
        self.fake.add_machine('web-1', parent='web', template='web.9')
        res = self.failed(dict(parent='web', count=1, contract=os.path.join(self.dir, 'nope.json')))
        self.assertIn('contract: cannot read', res['msg'])


if __name__ == '__main__':
    unittest.main()


class TestVmforkForkTo(ModuleTestCase):
    module = vmfork_fork

    def setUp(self):
        super(TestVmforkForkTo, self).setUp()
        self.fake.add_machine('web')
        self.other = FakeVmfork()
        self.fake.remotes['host2'] = self.other

    def test_fork_onto_another_host_once(self):
        args = dict(parent='web', names=['far-1', 'far-2'], to='root@host2', ssh='ssh -F cf',
                    remote_binary='/opt/vmfork', hostname='far{n}')
        res = self.ok(args, check=True, diff=True)
        self.assertTrue(res['changed'])
        self.assertEqual([c['state'] for c in res['children']], ['planned', 'planned'])
        self.assertEqual(res['plans'], [dict(command='fork --to', host='root@host2', source='web',
                                             children=['far-1', 'far-2'])])
        self.assertNotIn('fork', self.fake.commands())
        # Which children exist is asked of host2, as vmfork reaches it.
        self.assertEqual(self.fake.calls[-1], ['ssh', 'root@host2', '/opt/vmfork -q ls --json'])

        res = self.ok(args)
        self.assertTrue(res['changed'])
        fork = [c for c in self.fake.calls if c[0] == 'fork']
        self.assertEqual(fork, [['fork', '--to', 'root@host2', '--ssh', 'ssh -F cf', '--remote-vmfork', '/opt/vmfork',
                                 '--hostname', 'far{n}', 'web', 'far-1', 'far-2', '--json']])
        self.assertEqual([(c['name'], c['host'], c['hostname'], c['created']) for c in res['children']],
                         [('far-1', 'root@host2', 'far1', True), ('far-2', 'root@host2', 'far2', True)])
        self.assertEqual(res['children'][0]['pause_ms'], 8.8)
        self.assertEqual(sorted(self.other.machines), ['far-1', 'far-2'])
        self.assertNotIn('far-1', self.fake.machines)

        # A second run: both exist there; nothing is frozen or forked, their agents are reached there.
        for check in (True, False):
            res = self.ok(args, check=check)
            self.assertFalse(res['changed'])
            self.assertEqual([c['created'] for c in res['children']], [False, False])
        self.assertEqual(self.fake.commands().count('fork'), 1)
        self.assertIn(['ssh', 'root@host2', '/opt/vmfork -q exec far-1 --json -- true'], self.fake.calls)

        # A third child: only it is forked, with the hostname it would have had.
        res = self.ok(dict(args, names=['far-1', 'far-2', 'far-3']))
        self.assertEqual([c['created'] for c in res['children']], [False, False, True])
        self.assertEqual(res['children'][2]['hostname'], 'far3')

    def test_from_a_kept_template_count_and_prefix(self):
        self.fake.add_template('golden', 'web')
        res = self.ok(dict(parent='golden', count=2, to='host2', idle_timeout=30))
        self.assertEqual([c['name'] for c in res['children']], ['golden-1', 'golden-2'])
        self.assertEqual(res['children'][0]['pause_ms'], 0)
        self.assertIn('30s', [c for c in self.fake.calls if c[0] == 'fork'][0])
        self.assertFalse(self.ok(dict(parent='golden', count=2, to='host2'))['changed'])

    def test_refusals(self):
        res = self.failed(dict(parent='web', count=1, to='host2', contract={'network': {'egress': 'none'}}))
        self.assertIn('contract cannot be used with to', res['msg'])
        res = self.failed(dict(parent='nope', count=1, to='host2'))
        self.assertEqual(res['rc'], 4)
        res = self.failed(dict(parent='web', count=1, to='host9'))
        self.assertIn('list the machines on host9', res['msg'])
        self.other.add_machine('db')
        self.other.add_machine('web-1', parent='db', template='db.1')
        res = self.failed(dict(parent='web', count=1, to='host2'))
        self.assertIn("exists on host2 but is not a child of 'web'", res['msg'])
        self.assertNotIn('fork', self.fake.commands())
