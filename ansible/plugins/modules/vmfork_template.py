#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: vmfork_template
short_description: Keep a running machine's instant as a named template, with a warm pool
version_added: 0.1.0
description:
  - C(present) keeps running machine I(source)'s current instant as template I(name)
    (C(vmfork template save)); the source pauses for a fraction of a second, as for a fork,
    and carries on. M(vmfork.vmfork.vmfork_fork) with I(parent=name) then makes children of
    that instant any time later without touching the source.
  - I(pool) keeps that many QEMU processes of the template started ahead, so a fork only
    loads the device state (embedded driver only). An existing template's pool is resized
    (C(vmfork template pool)).
  - C(absent) gives the template up (C(vmfork template rm)); its memory goes once no child maps it.
  - Idempotent by name. A kept instant is never saved again; to take a new one, remove the
    template first.
  - With I(contract), the template gives its children that fork contract (unless their fork names another).
options:
  name:
    description: The template's name; it shares the namespace of machine names.
    type: str
    required: true
  source:
    description: The running machine to keep an instant of; needed when the template does not exist.
    type: str
  pool:
    description: Processes to keep started ahead (0 to 64). When unset, a new template has none and an existing one keeps its pool.
    type: int
  contract:
    description:
      - The fork contract the template's children get (C(vmfork template save --contract)) unless their fork
        names another; a dict, or the path of a YAML or JSON file (JSON if its name ends in C(.json)) on the
        managed host. The keys are those of M(vmfork.vmfork.vmfork_fork)'s I(contract). When unset, the
        template keeps I(source)'s contract.
      - A kept template's contract does not change. When the template exists with another contract (compared
        as vmfork records them, with its defaults filled in, from C(vmfork tree NAME --json)), the task fails
        and changes nothing. Remove the template and save it again, or give the forks their own contract.
    type: raw
  state:
    description: Whether the template is kept.
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - action_common_attributes
  - vmfork.vmfork.vmfork
attributes:
  check_mode:
    support: full
    details: Runs C(vmfork template save --dry-run), C(vmfork template pool --dry-run) or C(vmfork template rm --dry-run),
      which check everything as the real run does and change nothing.
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - vmfork developers (@vmfork)
'''

EXAMPLES = r'''
- name: Keep the warmed parent's instant with four processes waiting
  vmfork.vmfork.vmfork_template:
    name: golden
    source: web
    pool: 4

- name: A template whose children reach only the internal API
  vmfork.vmfork.vmfork_template:
    name: sandbox
    source: web
    contract:
      network:
        egress:
          allow: ["api.internal:443"]

- name: Give it up
  vmfork.vmfork.vmfork_template:
    name: golden
    state: absent
'''

RETURN = r'''
template:
  description: The template as C(vmfork template ls --json) shows it; empty when absent.
  returned: always
  type: dict
  sample: {"name": "golden", "id": "web.2", "source": "web", "memory_mib": 256, "has_memory": true,
           "ram_bytes": 135286784, "pause_ms": 70.5, "children": 0, "pool_size": 4, "pooled": 4}
removed:
  description: With C(absent), whether the template's files are gone already (else they go with its last child).
  returned: when a template was removed
  type: bool
plan:
  description: In check mode, what vmfork would do.
  returned: when check mode made a change
  type: dict
'''

import json

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vmfork.vmfork.plugins.module_utils.vmfork import (
    Vmfork, VmforkError, common_argument_spec, dry_run_args, load_spec, normalize_contract, record_change,
    spec_file, spec_option_error)


def summary(t):
    if not t:
        return {'state': 'absent'}
    return {'name': t['name'], 'source': t.get('source'), 'pool_size': t.get('pool_size', 0)}


def tree_node(tree, name):
    """Kept template name's node in vmfork tree --json, or None."""
    nodes = list(tree.get('roots') or [])
    while nodes:
        n = nodes.pop()
        if n.get('kind') == 'template' and n.get('kept_as') == name:
            return n
        nodes.extend(n.get('children') or [])
    return None


def check_contract(module, vm, name):
    """Fails when kept template name gives its children another contract
    than the task's: a template's contract never changes."""
    want = normalize_contract(load_spec(module, module.params['contract'], 'contract'))
    node = tree_node(vm.run(['tree', name]) or {}, name) or {}
    have = normalize_contract(node.get('contract'))
    if have != want:
        module.fail_json(msg='template %r gives its children another contract (%s), and a kept template\'s contract '
                             'does not change: remove it (state: absent) and save it again, or give the forks '
                             'their own contract' % (name, json.dumps(have, sort_keys=True)),
                         contract=have, wanted_contract=want)


def main():
    spec = common_argument_spec()
    spec.update(
        name=dict(type='str', required=True),
        source=dict(type='str'),
        pool=dict(type='int'),
        state=dict(type='str', default='present', choices=['present', 'absent']),
        contract=dict(type='raw'),
    )
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    if spec_option_error('contract', p['contract']):
        module.fail_json(msg=spec_option_error('contract', p['contract']))
    if p['contract'] == '':
        p['contract'] = None
    vm = Vmfork(module)
    name = p['name']
    try:
        t = vm.kept(name)
        result = dict(changed=False, template=t or {})
        after = None
        if p['state'] == 'absent':
            if t:
                after = {'state': 'absent'}
                if module.check_mode:
                    result['plan'] = vm.run(dry_run_args(['template', 'rm', name], 2))
                else:
                    result['removed'] = (vm.run(['template', 'rm', name]) or {}).get('removed', False)
                result['template'] = {}
        elif not t:
            if not p['source']:
                module.fail_json(msg='template %r is not kept: source is required to save it' % name)
            after = {'name': name, 'source': p['source'], 'pool_size': p['pool'] or 0}
            with spec_file(p['contract'], 'contract') as contract_file:
                args = ['template', 'save', '--pool', str(p['pool'] or 0)]
                if contract_file:
                    args += ['--contract', contract_file]
                args += [p['source'], name]
                if module.check_mode:
                    result['plan'] = vm.run(dry_run_args(args, 2))
                else:
                    result['template'] = vm.run(args)
        else:
            if p['contract'] is not None:
                check_contract(module, vm, name)
            if p['source'] and t.get('source') != p['source']:
                module.warn('template %r keeps an instant of %r, not %r; remove it first to keep a new one'
                            % (name, t.get('source'), p['source']))
            if p['pool'] is not None and p['pool'] != t.get('pool_size'):
                after = dict(summary(t), pool_size=p['pool'])
                args = ['template', 'pool', name, str(p['pool'])]
                if module.check_mode:
                    result['plan'] = vm.run(dry_run_args(args, 2))
                else:
                    result['template'] = vm.run(args)
        record_change(module, result, summary(t), after)
    except VmforkError as e:
        vm.fail(e)
    module.exit_json(**result)


if __name__ == '__main__':
    main()
