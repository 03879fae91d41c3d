#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: vmfork_info
short_description: List vmfork machines, templates and their lineage
version_added: 0.1.0
description:
  - Returns every machine (C(vmfork ls --json)) and every template (C(vmfork template ls --json))
    on the managed host, and the lineage between them (which machine each was forked from,
    through which template, and which children each has).
options:
  name:
    description: Only this machine or kept template (and its lineage entry).
    type: str
  host:
    description:
      - Also return C(host), this host's room for new machines (C(vmfork host info --json)), to place
        children across a fleet.
    type: bool
    default: false
extends_documentation_fragment:
  - action_common_attributes
  - vmfork.vmfork.vmfork
attributes:
  check_mode:
    support: full
  diff_mode:
    support: N/A
    details: It changes nothing.
  platform:
    platforms: posix
author:
  - vmfork developers (@vmfork)
'''

EXAMPLES = r'''
- name: What runs here
  vmfork.vmfork.vmfork_info:
  register: vmf

- name: Room for more children of the kept template golden on this host
  vmfork.vmfork.vmfork_info:
    host: true
  register: vmf

- name: How many more children of golden fit here
  ansible.builtin.debug:
    msg: "{{ (vmf.host.templates | selectattr('name', 'equalto', 'golden') | first).children_that_fit }}"

- name: Names of web's children
  ansible.builtin.debug:
    msg: "{{ vmf.lineage.web.children }}"
'''

RETURN = r'''
machines:
  description: Every machine, as C(vmfork ls --json) shows it.
  returned: always
  type: list
  elements: dict
templates:
  description: Every template, kept ones (with a name) and those of live forks, as C(vmfork template ls --json) shows them.
  returned: always
  type: list
  elements: dict
host:
  description:
    - With I(host), as C(vmfork host info --json) shows it; C(ram_for_new_bytes) is the memory admission lets
      new machines take here, and each of C(templates) says C(children_that_fit).
  returned: when I(host) is true
  type: dict
lineage:
  description:
    - By machine name, its C(parent), its C(template) (id) and C(kept_template) (name, when it was forked
      from a kept one), and its C(children), in name order.
  returned: always
  type: dict
  sample: {"web": {"parent": null, "template": null, "kept_template": null, "children": ["web-1", "web-2"]},
           "web-1": {"parent": "web", "template": "web.1", "kept_template": null, "children": []}}
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vmfork.vmfork.plugins.module_utils.vmfork import (
    Vmfork, VmforkError, common_argument_spec)


def lineage(machines, templates):
    kept = dict((t['id'], t.get('name')) for t in templates if t.get('name'))
    out = {}
    for m in machines:
        out[m['name']] = dict(parent=m.get('parent'), template=m.get('template'),
                              kept_template=kept.get(m.get('template')), children=[])
    for m in sorted(machines, key=lambda m: m['name']):
        if m.get('parent') in out:
            out[m['parent']]['children'].append(m['name'])
    return out


def main():
    spec = common_argument_spec()
    spec.update(name=dict(type='str'), host=dict(type='bool', default=False))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    vm = Vmfork(module)
    try:
        machines = list(vm.machines().values())
        templates = vm.templates()
        host = vm.run(['host', 'info']) if module.params['host'] else None
    except VmforkError as e:
        vm.fail(e)
    tree = lineage(machines, templates)
    name = module.params['name']
    if name:
        machines = [m for m in machines if m['name'] == name]
        templates = [t for t in templates if t.get('name') == name]
        tree = dict((k, v) for k, v in tree.items() if k == name)
    extra = dict(host=host) if module.params['host'] else {}
    module.exit_json(changed=False, machines=machines, templates=templates, lineage=tree, **extra)


if __name__ == '__main__':
    main()
