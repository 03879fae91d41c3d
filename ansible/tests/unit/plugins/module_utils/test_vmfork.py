# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import unittest

from ansible_collections.vmfork.vmfork.plugins.module_utils.vmfork import (
    dry_run_args, record_change)


class FakeModule:
    def __init__(self, diff):
        self._diff = diff


class TestResultHelpers(unittest.TestCase):
    def test_dry_run_goes_after_the_command_words(self):
        self.assertEqual(dry_run_args(['fork', '--hostname', 'h', 'web']), ['fork', '--dry-run', '--hostname', 'h', 'web'])
        self.assertEqual(dry_run_args(['template', 'save', 'web', 'g'], 2), ['template', 'save', '--dry-run', 'web', 'g'])

    def test_record_change(self):
        result = dict(changed=False)
        record_change(FakeModule(True), result, {'state': 'absent'}, None)
        self.assertEqual(result, dict(changed=False))
        record_change(FakeModule(False), result, {'state': 'absent'}, {'state': 'running'})
        self.assertEqual(result, dict(changed=True))
        result = dict(changed=False)
        record_change(FakeModule(True), result, {'state': 'absent'}, {'state': 'running'})
        self.assertEqual(result, dict(changed=True, diff=dict(before={'state': 'absent'}, after={'state': 'running'})))


if __name__ == '__main__':
    unittest.main()
