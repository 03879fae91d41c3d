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

from ansible_collections.vmfork.vmfork.plugins.module_utils.vmfork import (
    load_spec, normalize_contract, normalize_dest, spec_file, spec_option_error)

# Allow-list entries and what vmfork's contract package records for each
# (contract.ParseDest, then Dest.String; go 1.26, vmfork 96d3a3c): the
# comparison with a machine's recorded contract depends on these matching.
DESTS = [
    ('API.Example.com.:443', 'api.example.com:443'),
    ('example.org:*', 'example.org:*'),
    ('Mixed-Case.Example:0080', 'mixed-case.example:80'),
    ('[example.com]:443', 'example.com:443'),
    ('10.0.0.1:*', '10.0.0.1'),
    ('10.0.0.0/8:*', '10.0.0.0/8'),
    ('10.1.0.0/16:53', '10.1.0.0/16:53'),
    ('10.0.0.7/32', '10.0.0.7'),
    ('  10.2.0.1:+80', '10.2.0.1:80'),
    ('[10.0.0.1]:22', '10.0.0.1:22'),
    ('0.0.0.0/0', '0.0.0.0/0'),
    ('169.254.169.254:80', '169.254.169.254:80'),
    ('[2001:DB8::1]:443', '[2001:db8::1]:443'),
    ('2001:db8:0:0::/64', '2001:db8::/64'),
    ('[2001:db8::]', '2001:db8::'),
    ('[2001:db8::/32]', '2001:db8::/32'),
    ('2001:db8::/128', '2001:db8::'),
    ('2001:0:0:1:0:0:0:1', '2001:0:0:1::1'),
    ('1:0:0:2:0:0:0:3', '1:0:0:2::3'),
    ('1:0:0:2:0:0:3:4', '1::2:0:0:3:4'),
    ('2001:db8:0:1:1:1:1:1', '2001:db8:0:1:1:1:1:1'),
    ('[::/0]:443', '[::/0]:443'),
    ('[fe80::1]', 'fe80::1'),
    ('[::1]:*', '::1'),
    ('::1.2.3.4', '::102:304'),
    ('::ffff:10.0.0.1', '::ffff:10.0.0.1'),
    ('[::ffff:1.2.3.4]:8080', '[::ffff:1.2.3.4]:8080'),
    ('[::ffff:10.0.0.0/104]:80', '[::ffff:10.0.0.0/104]:80'),
    ('::ffff:0:0/96', '::ffff:0.0.0.0/96'),
]

# Entries vmfork refuses: they are left as written, so they never compare
# equal to a recorded contract and vmfork's own check reports them.
BAD_DESTS = ['10.0.0.1/8', 'host', 'host:0', 'host:70000', 'host:-1', '10.0.0.0/255.0.0.0', 'fe80::1%eth0',
             'a..b:80', '10.0.0.0/08', '10.0.0.0/33', '10.0.0.1: 80', '010.0.0.1', '[10.0.0.1', '[::1]x',
             '_bad.example:80', '*:80', '::1:80:']


class TestNormalize(unittest.TestCase):
    def test_allow_list_entries_as_vmfork_records_them(self):
        for entry, want in DESTS:
            self.assertEqual(normalize_dest(entry), want, entry)
            self.assertEqual(normalize_dest(want), want, want)

    def test_entries_vmfork_refuses_are_left_as_written(self):
        for entry in BAD_DESTS:
            self.assertEqual(normalize_dest(entry), entry)

    def test_defaults_are_filled_in(self):
        self.assertEqual(normalize_contract({'network': {'egress': 'none'}}),
                         {'network': {'egress': 'none', 'dns': 'host', 'connections': 'reset'}})
        self.assertEqual(normalize_contract({'network': {}}),
                         {'network': {'egress': 'all', 'dns': 'host', 'connections': 'reset'}})
        got = normalize_contract({'secrets': {'TOKEN': {'hosts': ['API.example.com.'], 'header': None,
                                                        'value_from': {'env': 'T', 'exec': ''}}}})
        self.assertEqual(got, {'secrets': {'TOKEN': {'hosts': ['api.example.com.'], 'header': 'Authorization',
                                                     'format': '{value}', 'value_from': {'env': 'T'}}}})

    def test_a_contract_that_asks_for_nothing_is_none(self):
        for c in (None, {}, {'network': None}, {'secrets': {}}, {'network': None, 'secrets': None}):
            self.assertEqual(normalize_contract(c), {}, c)
        # A network part that says nothing still resets connections.
        self.assertNotEqual(normalize_contract({'network': {}}), normalize_contract(None))

    def test_normalizing_twice_changes_nothing(self):
        c = {'network': {'egress': {'allow': [e for e, dummy in DESTS] + BAD_DESTS}, 'dns': 'none'},
             'secrets': {'A': {'hosts': ['X.example'], 'format': 'Bearer {value}', 'value_from': {'file': '/t'}}}}
        once = normalize_contract(c)
        self.assertEqual(normalize_contract(once), once)
        self.assertEqual(once['network']['egress']['allow'], [w for dummy, w in DESTS] + BAD_DESTS)
        self.assertEqual(c['network'], {'egress': {'allow': [e for e, dummy in DESTS] + BAD_DESTS}, 'dns': 'none'})

    def test_what_vmfork_would_refuse_is_kept(self):
        self.assertEqual(normalize_contract({'network': {'egress': None}, 'colour': 'red'}),
                         {'network': {'egress': None, 'dns': 'host', 'connections': 'reset'}, 'colour': 'red'})
        self.assertEqual(normalize_contract({'network': {'egress': {'allow': [], 'deny': ['x']}}})['network']['egress'],
                         {'allow': [], 'deny': ['x']})
        self.assertEqual(normalize_contract('none'), 'none')


class FakeModule:
    def __init__(self):
        self.failed = None

    def fail_json(self, **kwargs):
        self.failed = kwargs
        raise RuntimeError(kwargs['msg'])


class TestSpecFiles(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)

    def test_a_dict_goes_to_a_temp_json_file_removed_afterwards(self):
        with spec_file({'network': {'egress': 'none'}}, 'contract') as path:
            self.assertTrue(os.path.basename(path).startswith('vmfork-contract-'))
            self.assertTrue(path.endswith('.json'))
            with open(path) as f:
                self.assertEqual(json.load(f), {'network': {'egress': 'none'}})
        self.assertFalse(os.path.exists(path))

    def test_the_temp_file_goes_also_on_failure(self):
        seen = []
        with self.assertRaises(ValueError):
            with spec_file({}, 'contract') as path:
                seen.append(path)
                raise ValueError('boom')
        self.assertFalse(os.path.exists(seen[0]))

    def test_a_path_is_passed_as_it_is_and_kept(self):
        path = os.path.join(self.dir, 'c.yaml')
        with open(path, 'w') as f:
            f.write('network: {egress: none}\n')
        with spec_file(path, 'contract') as got:
            self.assertEqual(got, path)
        self.assertTrue(os.path.exists(path))
        with spec_file(None, 'contract') as got:
            self.assertIsNone(got)

    def test_load_reads_yaml_or_json_by_name(self):
        module = FakeModule()
        y = os.path.join(self.dir, 'c.yaml')
        with open(y, 'w') as f:
            f.write('network:\n  egress:\n    allow: ["a.example:443"]\n')
        self.assertEqual(load_spec(module, y, 'contract'), {'network': {'egress': {'allow': ['a.example:443']}}})
        j = os.path.join(self.dir, 'c.JSON')
        with open(j, 'w') as f:
            f.write('{"network": {"egress": "none"}}')
        self.assertEqual(load_spec(module, j, 'contract'), {'network': {'egress': 'none'}})
        e = os.path.join(self.dir, 'empty.yaml')
        open(e, 'w').close()
        self.assertEqual(load_spec(module, e, 'contract'), {})
        self.assertEqual(load_spec(module, {'a': 1}, 'contract'), {'a': 1})
        self.assertIsNone(load_spec(module, None, 'contract'))

    def test_load_fails_with_the_file_and_the_reason(self):
        module = FakeModule()
        with self.assertRaises(RuntimeError):
            load_spec(module, os.path.join(self.dir, 'nope.yaml'), 'contract')
        self.assertIn('contract: cannot read %s/nope.yaml' % self.dir, module.failed['msg'])
        bad = os.path.join(self.dir, 'bad.json')
        with open(bad, 'w') as f:
            f.write('{"network": ')
        with self.assertRaises(RuntimeError):
            load_spec(module, bad, 'contract')
        self.assertIn('cannot read %s' % bad, module.failed['msg'])

    def test_option_types(self):
        self.assertIsNone(spec_option_error('contract', None))
        self.assertIsNone(spec_option_error('contract', {}))
        self.assertIsNone(spec_option_error('contract', '/etc/c.yaml'))
        self.assertEqual(spec_option_error('contract', ['none']),
                         'contract must be a dict or the path of a YAML or JSON file on the managed host')


if __name__ == '__main__':
    unittest.main()
