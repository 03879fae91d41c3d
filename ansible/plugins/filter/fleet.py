# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""fleet_place: where the children of a fleet go (role vmfork.vmfork.fleet).

Pure, so every host of the play computes the same placement from the same
facts, and the unit tests check it without a CLI.

The children are PREFIX-1 .. PREFIX-COUNT. A child that exists on a host
(in that host's vmfork_info machines) stays there. The missing ones are
shared among the hosts in proportion to each host's room,
host.ram_for_new_bytes (what admission lets new machines take there), by
largest remainder: each host gets floor(missing * room / total room), and
the children left over go one each to the hosts with the largest
remainders, ties to the host that comes first in the play. No host gets
more than fit there (room // one child's estimate, the template's
child_ram_bytes as the source host measured it): what a full host cannot
take is shared among the others the same way. Missing names go to the
hosts in play order, lowest numbers first. Fewer fits in total than are
missing is an error, as the fork on a full host would be (exit 5).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError


def child_estimate(infos, order, template):
    """One child's RAM as placement counts it: the template's
    child_ram_bytes on the first host that holds it (the source, when it
    comes first), else 0 (nothing caps a host)."""
    for h in order:
        for t in ((infos[h] or {}).get('host') or {}).get('templates') or []:
            if t.get('name') == template and t.get('child_ram_bytes'):
                return int(t['child_ram_bytes'])
    return 0


def share(k, rooms, fits):
    """k children over hosts of rooms (in play order), none above its fit:
    largest remainder, ties to the earlier host; a full host's share goes
    to the others the same way."""
    n = len(rooms)
    got = [0] * n
    open_ = [i for i in range(n) if fits[i] > 0 and rooms[i] > 0]
    while k > 0 and open_:
        total = sum(rooms[i] for i in open_)
        quota = dict((i, k * rooms[i] // total) for i in open_)
        rem = dict((i, k * rooms[i] % total) for i in open_)
        left = k - sum(quota.values())
        for i in sorted(open_, key=lambda i: (-rem[i], i))[:left]:
            quota[i] += 1
        placed = 0
        for i in open_:
            take = min(quota[i], fits[i] - got[i])
            got[i] += take
            placed += take
        k -= placed
        open_ = [i for i in open_ if got[i] < fits[i]]
        if placed == 0:
            break
    return got, k


def fleet_place(hosts, infos, count, template, prefix=None):
    """The placement of count children of template over hosts (a list, in
    play order) whose vmfork_info results (with host: true) infos gives by
    host name. Returns {'child_ram_bytes', 'total_room_bytes', 'hosts':
    {host: {'room_bytes', 'fit', 'names' (its children, existing and new,
    by number), 'new' (those to fork)}}}."""
    try:
        count = int(count)
    except (TypeError, ValueError):
        raise AnsibleFilterError('fleet_place: count %r is not a number' % (count,))
    if count < 0:
        raise AnsibleFilterError('fleet_place: count must be at least 0, got %d' % count)
    hosts = list(hosts)
    if not hosts:
        raise AnsibleFilterError('fleet_place: no hosts')
    infos = dict((h, infos[h]) for h in hosts)
    for h in hosts:
        if not isinstance(infos[h], dict) or 'host' not in infos[h]:
            raise AnsibleFilterError('fleet_place: host %s has no vmfork_info result with host: true' % h)
    prefix = prefix or template
    names = ['%s-%d' % (prefix, i) for i in range(1, count + 1)]
    where = {}
    for h in hosts:
        for m in infos[h].get('machines') or []:
            if m.get('name') in names and m['name'] not in where:
                where[m['name']] = h
    missing = [n for n in names if n not in where]
    child = child_estimate(infos, hosts, template)
    rooms = [max(0, int(infos[h]['host'].get('ram_for_new_bytes') or 0)) for h in hosts]
    fits = [r // child if child else len(missing) for r in rooms]
    got, short = share(len(missing), rooms, fits)
    if short:
        raise AnsibleFilterError('fleet_place: %d of %d children of %s fit on hosts %s (room %s bytes, %d bytes each)'
                                 % (len(missing) - short, len(missing), template, ', '.join(hosts),
                                    '/'.join(str(r) for r in rooms), child))
    out = dict(child_ram_bytes=child, total_room_bytes=sum(rooms), hosts={})
    at = 0
    for i, h in enumerate(hosts):
        new = missing[at:at + got[i]]
        at += got[i]
        mine = [n for n in names if where.get(n) == h or n in new]
        out['hosts'][h] = dict(room_bytes=rooms[i], fit=fits[i], names=mine, new=new)
    return out


class FilterModule(object):
    def filters(self):
        return {'fleet_place': fleet_place}
