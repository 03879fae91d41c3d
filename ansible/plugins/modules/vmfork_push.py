#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: vmfork_push
short_description: Send a kept template to another host over SSH, or fetch one, only the chunks it lacks
version_added: 0.2.0
description:
  - With I(to), sends kept template I(name) of the managed host to another host (C(vmfork template push NAME
    HOST[:NAME])); with I(from), fetches a template from another host and keeps it here as I(name)
    (C(vmfork template pull HOST:NAME --as NAME)). Only the chunks the receiving host lacks travel, as the
    pages that differ from its closest template's; the receiving host checks the manifest (QEMU version,
    machine type, CPU, devices) before any chunk is sent and every chunk's sha256 on arrival.
  - Idempotent by name. When the receiving host holds a template of that name already, nothing is sent and
    the task reports C(changed=false). For a push that is asked of the other host first
    (C(ssh HOST REMOTE_VMFORK template ls --json), with I(ssh) and I(remote_binary)).
  - A template of that name on the receiving host is never replaced; one with another id is reported with a
    warning. Remove it there first (M(vmfork.vmfork.vmfork_template) with C(state=absent)) to send a new one.
options:
  name:
    description:
      - With I(to), the kept template to send; with I(from), the name to keep the fetched template as here.
    type: str
    required: true
  to:
    description:
      - C([USER@]HOST[:NAME]) to push to; NAME on that host defaults to I(name). Mutually exclusive with I(from).
    type: str
  from:
    description:
      - C([USER@]HOST[:NAME]) to pull from; NAME there defaults to I(name). Mutually exclusive with I(to).
    type: str
  ssh:
    description:
      - The ssh command and its options, split on spaces (vmfork's C(--ssh)), e.g. C(ssh -F ./ssh_config -p 2222).
    type: str
    default: ssh
  remote_binary:
    description: The command that runs vmfork on the other host, as its shell reads it (vmfork's C(--remote-vmfork)).
    type: str
    default: vmfork
  idle_timeout:
    description: Give up when the other host sends nothing for this many seconds (vmfork's C(--idle-timeout)).
    type: int
extends_documentation_fragment:
  - action_common_attributes
  - vmfork.vmfork.vmfork
attributes:
  check_mode:
    support: full
    details: Asks whether the receiving host holds the template and reports the transfer it would make; sends
      nothing (vmfork's push has no dry run, so the manifest check runs only on the real transfer).
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - vmfork developers (@vmfork)
'''

EXAMPLES = r'''
- name: Give host2 template golden; a second run sends nothing
  vmfork.vmfork.vmfork_push:
    name: golden
    to: root@host2

- name: Fetch golden from host1 here, as golden-v2
  vmfork.vmfork.vmfork_push:
    name: golden-v2
    from: root@host1:golden
    ssh: ssh -p 2222
'''

RETURN = r'''
held:
  description: Whether the receiving host held a template of that name before the task.
  returned: always
  type: bool
transfer:
  description:
    - What C(vmfork template push|pull --json) printed; chunks sent, bytes out and in, elapsed time, and
      C(codec) (C(zstd)) when the chunks travelled compressed (both hosts' vmfork take it; each chunk is
      compressed only where that pays).
  returned: when a template was sent
  type: dict
  sample: {"op": "push", "name": "golden", "bytes_out": 5242880, "bytes_in": 4096, "codec": "zstd", "elapsed_ms": 812.4,
           "received": {"name": "golden", "id": "web.1", "chunks": 66, "chunks_sent": 3}}
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vmfork.vmfork.plugins.module_utils.vmfork import (
    Vmfork, VmforkError, common_argument_spec, record_change, remote_argument_spec, remote_flags, run_remote)


def split_remote(spec, default_name):
    """[USER@]HOST[:NAME] as (host, name), as vmfork's ParseRemote reads it."""
    host, dummy, name = spec.partition(':')
    return host, name or default_name


def remote_templates(module, p, host):
    """The kept templates of host, asked over ssh as vmfork would reach it."""
    return run_remote(module, p, host, ['template', 'ls'], 'ask which templates it holds') or []


def main():
    spec = common_argument_spec()
    spec.update(
        name=dict(type='str', required=True),
        to=dict(type='str'),
    )
    spec.update(remote_argument_spec())
    spec['from'] = dict(type='str')
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True,
                           mutually_exclusive=[('to', 'from')], required_one_of=[('to', 'from')])
    p = module.params
    if p['idle_timeout'] is not None and p['idle_timeout'] <= 0:
        module.fail_json(msg='idle_timeout must be above 0, got %d' % p['idle_timeout'])
    vm = Vmfork(module)
    name = p['name']
    flags = remote_flags(p)
    try:
        if p['to']:
            host, dest = split_remote(p['to'], name)
            mine = vm.kept(name)
            if not mine:
                module.fail_json(msg='template %r is not kept on this host: nothing to push' % name, rc=4)
            theirs = next((t for t in remote_templates(module, p, host) if t.get('name') == dest), None)
            args = ['template', 'push'] + flags + [name, '%s:%s' % (host, dest)]
            if theirs and theirs.get('id') != mine.get('id'):
                module.warn('%s holds a template %r of another instant (%s, not %s); it is left as it is'
                            % (host, dest, theirs.get('id'), mine.get('id')))
        else:
            host, src = split_remote(p['from'], name)
            theirs = vm.kept(name)
            args = ['template', 'pull'] + flags + ['--as', name, '%s:%s' % (host, src)]
        result = dict(changed=False, held=theirs is not None)
        after = None
        if theirs is None:
            after = {'held': True}
            if not module.check_mode:
                result['transfer'] = vm.run(args)
        record_change(module, result, {'held': theirs is not None}, after)
    except VmforkError as e:
        vm.fail(e)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
