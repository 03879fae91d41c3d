# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import unittest

from ansible.errors import AnsibleFilterError

from ansible_collections.vmfork.vmfork.plugins.filter.fleet import fleet_place, share

MIB = 1 << 20


def info(room_mib, machines=(), templates=()):
    """A vmfork_info result with host: true."""
    return dict(machines=[dict(name=n) for n in machines],
                host=dict(ram_for_new_bytes=room_mib * MIB,
                          templates=[dict(name=t, child_ram_bytes=128 * MIB) for t in templates]))


class TestFleetPlace(unittest.TestCase):
    def test_in_proportion_to_room(self):
        # 1 : 4, as two hosts with --overcommit 1 and 4 over the same free RAM.
        p = fleet_place(['a', 'b'], dict(a=info(2000, templates=['golden']), b=info(8000)), 10, 'golden')
        self.assertEqual(p['hosts']['a']['names'], ['golden-1', 'golden-2'])
        self.assertEqual(p['hosts']['b']['new'], ['golden-%d' % i for i in range(3, 11)])
        self.assertEqual(p['child_ram_bytes'], 128 * MIB)
        self.assertEqual(p['hosts']['b']['fit'], 8000 // 128)
        # A room a little off either way still gives 2 : 8.
        for a in (1990, 2010):
            p = fleet_place(['a', 'b'], dict(a=info(a, templates=['golden']), b=info(10000 - a)), 10, 'golden')
            self.assertEqual([len(p['hosts'][h]['new']) for h in 'ab'], [2, 8])

    def test_largest_remainder_and_ties(self):
        self.assertEqual(share(10, [1, 1, 1], [99] * 3), ([4, 3, 3], 0))   # tie: the earlier host
        self.assertEqual(share(10, [1, 3], [99] * 2), ([3, 7], 0))         # 2.5 / 7.5: tie to a
        self.assertEqual(share(7, [5, 3, 2], [99] * 3), ([4, 2, 1], 0))    # 3.5 2.1 1.4
        self.assertEqual(share(3, [0, 5], [0, 99]), ([0, 3], 0))           # no room, nothing
        # A full host's share goes to the others.
        self.assertEqual(share(10, [1, 4], [99, 5]), ([5, 5], 0))
        self.assertEqual(share(10, [1, 4], [3, 5]), ([3, 5], 2))

    def test_second_run_places_nothing(self):
        first = fleet_place(['a', 'b'], dict(a=info(2000, templates=['golden']), b=info(8000)), 10, 'golden', 'c')
        # The room has changed since (the children take some, other loads move),
        # but every child exists: nothing is new, each stays where it is.
        again = dict(a=info(5000, first['hosts']['a']['names'], ['golden']),
                     b=info(100, first['hosts']['b']['names'], ['golden']))
        p = fleet_place(['a', 'b'], again, 10, 'golden', 'c')
        for h in 'ab':
            self.assertEqual(p['hosts'][h]['new'], [])
            self.assertEqual(p['hosts'][h]['names'], first['hosts'][h]['names'])
        # Two more: only those are placed, by today's room.
        p = fleet_place(['a', 'b'], again, 12, 'golden', 'c')
        self.assertEqual(p['hosts']['a']['new'], ['c-11', 'c-12'])
        self.assertEqual(p['hosts']['b']['new'], [])
        self.assertEqual(len(p['hosts']['a']['names']), 4)

    def test_a_lost_child_is_placed_again(self):
        p = fleet_place(['a', 'b'], dict(a=info(1000, ['c-1', 'c-3'], ['golden']), b=info(1000, ['c-2'])), 4,
                        'golden', 'c')
        self.assertEqual(p['hosts']['a']['names'], ['c-1', 'c-3', 'c-4'])
        self.assertEqual(p['hosts']['b']['names'], ['c-2'])

    def test_too_little_room(self):
        with self.assertRaises(AnsibleFilterError) as e:
            fleet_place(['a', 'b'], dict(a=info(256, templates=['golden']), b=info(256)), 5, 'golden')
        self.assertIn('4 of 5 children of golden fit on hosts a, b', str(e.exception))

    def test_bad_input(self):
        for args, msg in [((['a'], dict(a=info(1)), 'x', 'g'), "count 'x' is not a number"),
                          ((['a'], dict(a=info(1)), -1, 'g'), 'count must be at least 0'),
                          (([], {}, 1, 'g'), 'no hosts'),
                          ((['a'], dict(a={'machines': []}), 1, 'g'), 'host a has no vmfork_info result')]:
            with self.assertRaises(AnsibleFilterError) as e:
                fleet_place(*args)
            self.assertIn(msg, str(e.exception))
