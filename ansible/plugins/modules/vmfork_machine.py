#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: vmfork_machine
short_description: Boot, stop or remove a vmfork machine
version_added: 0.1.0
description:
  - Boots a machine from a kernel (with an initrd) or a disk image, or both, with C(vmfork boot);
    stops it with C(vmfork stop) or removes it with C(vmfork rm).
  - Idempotent by name. A machine that exists is left as it is; its spec is not compared
    (a warning says when memory or CPUs differ). Its fork contract is, see I(contract).
  - A machine booted here can be forked with M(vmfork.vmfork.vmfork_fork).
options:
  name:
    description: The machine's name (lowercase letters, digits and C(-)).
    type: str
    required: true
  state:
    description:
      - C(running) boots the machine if it does not exist.
      - C(stopped) shuts a running machine down and keeps its disk.
      - C(absent) kills the machine and deletes it with all its files.
      - vmfork has no start command, so C(running) fails for a machine that is stopped.
    type: str
    choices: [running, stopped, absent]
    default: running
  kernel:
    description: Kernel image to boot directly (C(--kernel)); a path on the managed host.
    type: path
  initrd:
    description: Initial ramdisk for I(kernel) (C(--initrd)).
    type: path
  append:
    description: Kernel command line for I(kernel) (C(--append)); vmfork's default when unset.
    type: str
  disk:
    description: Base disk image (qcow2 or raw); never written, the machine writes to an overlay on it.
    type: path
  disks:
    description:
      - Extra disks after I(disk), the boot disk (C(--disk id=ID,file=FILE,fork=POLICY)), each with the policy
        a fork applies to it.
      - C(cow) each child writes to its own overlay on the disk frozen at the fork; C(shared) one read-only
        image for the machine and every child; C(fresh) and C(keep) each child gets an empty disk of the same
        size and C(VMFORK_DISK_<ID>=fresh) in its post-fork hooks (C(keep) also keeps the disk out of
        templates' archives).
    type: list
    elements: dict
    default: []
    suboptions:
      id:
        description: The disk's id (a lowercase letter, then up to 15 lowercase letters, digits or C(_)).
        type: str
        required: true
      file:
        description: Its base image; never written.
        type: path
        required: true
      fork:
        description: Its fork policy.
        type: str
        choices: [cow, shared, fresh, keep]
        default: cow
  memory:
    description: Guest RAM, for example C(512M) or C(2G).
    type: str
    default: 512M
  cpus:
    description: Virtual CPUs.
    type: int
    default: 1
  ports:
    description: Loopback port forwards C(HOST:GUEST), or C(GUEST) for any free host port.
    type: list
    elements: str
    default: []
  force:
    description: With C(stopped), kill QEMU at once; with C(absent), remove even when the process cannot be stopped.
    type: bool
    default: false
  contract:
    description:
      - The machine's fork contract (C(vmfork boot --contract)), which its children inherit unless their fork
        names another; a dict, or the path of a YAML or JSON file (JSON if its name ends in C(.json)) on the
        managed host. The keys are those of M(vmfork.vmfork.vmfork_fork)'s I(contract) (C(network) with
        C(egress), C(dns) and C(connections); C(secrets)).
      - With C(state=running), a machine that runs with another contract has its network part changed in place
        (C(vmfork contract NAME --set); C(changed)). Secrets cannot change in place, so a difference there fails
        the task with vmfork's message. Contracts are compared as vmfork records them, with its defaults
        filled in (a YAML file is read with PyYAML on the managed host for that).
      - When unset, an existing machine's contract is left as it is.
    type: raw
extends_documentation_fragment:
  - action_common_attributes
  - vmfork.vmfork.vmfork
attributes:
  check_mode:
    support: full
    details:
      - Runs C(vmfork boot --dry-run), C(vmfork stop --dry-run), C(vmfork rm --dry-run) or
        C(vmfork contract NAME --set FILE --dry-run), which check everything as the real run does and change nothing.
  diff_mode:
    support: full
  platform:
    platforms: posix
author:
  - vmfork developers (@vmfork)
'''

EXAMPLES = r'''
- name: Boot the parent once
  vmfork.vmfork.vmfork_machine:
    name: web
    kernel: /srv/guest/vmlinuz
    initrd: /srv/guest/initrd.gz
    disk: /srv/guest/data.qcow2
    memory: 256M

- name: Boot a domain on a libvirt host
  vmfork.vmfork.vmfork_machine:
    name: db
    disk: /srv/images/debian.qcow2
    cpus: 2
    uri: qemu:///system

- name: A parent whose children reach only the package mirror, with a token they never hold
  vmfork.vmfork.vmfork_machine:
    name: builder
    disk: /srv/images/debian.qcow2
    contract:
      network:
        egress:
          allow: ["deb.debian.org:443", "10.0.5.0/24:3142"]
      secrets:
        REGISTRY_TOKEN:
          hosts: [registry.example.com]
          format: "Bearer {value}"
          value_from: {file: /etc/vmfork/registry-token}

- name: Cut a running machine off the network, in place
  vmfork.vmfork.vmfork_machine:
    name: builder
    contract:
      network: {egress: none}
      secrets:
        REGISTRY_TOKEN:
          hosts: [registry.example.com]
          format: "Bearer {value}"
          value_from: {file: /etc/vmfork/registry-token}

- name: Remove it with everything it owns
  vmfork.vmfork.vmfork_machine:
    name: web
    state: absent
'''

RETURN = r'''
machine:
  description: The machine as C(vmfork ls --json) shows it; empty when it is absent.
  returned: always
  type: dict
  sample: {"name": "web", "state": "running", "driver": "qemu", "pid": 4242, "memory_mib": 256, "cpus": 1,
           "mac": "52:54:00:d7:9b:6b", "ports": [], "disk": "/var/lib/vmfork/machines/web/disk.qcow2",
           "contract": {"network": {"egress": "none", "dns": "host", "connections": "reset"}}}
contract:
  description: What C(vmfork contract NAME --set) said when this task changed the machine's contract in place.
  returned: when the contract was changed
  type: dict
  sample: {"name": "web", "state": "running", "contract": {"network": {"egress": "none", "dns": "host",
           "connections": "reset"}}, "rules": []}
plan:
  description: In check mode, what vmfork would do (C(--dry-run --json)).
  returned: when check mode made a change
  type: dict
  sample: {"dry_run": true, "command": "boot", "changed": true, "machines": ["web"],
           "actions": ["create machine \"web\" (256 MiB, 1 CPUs) with driver \"qemu\" and start it"]}
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vmfork.vmfork.plugins.module_utils.vmfork import (
    Vmfork, VmforkError, common_argument_spec, converge_contract, dry_run_args, load_spec, normalize_contract,
    record_change, spec_file, spec_option_error)


def boot_args(p, contract_file):
    args = []
    if contract_file:
        args += ['--contract', contract_file]
    for opt in ('kernel', 'initrd', 'append', 'disk', 'memory'):
        if p.get(opt):
            args += ['--%s' % opt, p[opt]]
    for d in p.get('disks') or []:
        args += ['--disk', 'id=%s,file=%s,fork=%s' % (d['id'], d['file'], d.get('fork') or 'cow')]
    args += ['--cpus', str(p['cpus'])]
    for port in p['ports']:
        args += ['--port', port]
    return args + [p['name']]


def mib(size):
    """Memory size as the CLI reads it (512M, 2G; a bare number is MiB), in
    MiB; None when it is not one."""
    s = (size or '').strip().upper()
    for suffix in ('B', 'I'):
        if s.endswith(suffix):
            s = s[:-1]
    mult = 1
    if s.endswith('G'):
        mult, s = 1024, s[:-1]
    elif s.endswith('M'):
        s = s[:-1]
    try:
        return int(s) * mult
    except ValueError:
        return None


def state_of(m, contract=None):
    """The diff's view of machine m, with its contract when the task gives one."""
    if not m:
        return {'state': 'absent'}
    v = {'name': m['name'], 'state': m['state']}
    if contract is not None:
        v['contract'] = normalize_contract(m.get('contract'))
    return v


def main():
    spec = common_argument_spec()
    spec.update(
        name=dict(type='str', required=True),
        state=dict(type='str', default='running', choices=['running', 'stopped', 'absent']),
        kernel=dict(type='path'),
        initrd=dict(type='path'),
        append=dict(type='str'),
        disk=dict(type='path'),
        disks=dict(type='list', elements='dict', default=[], options=dict(
            id=dict(type='str', required=True),
            file=dict(type='path', required=True),
            fork=dict(type='str', default='cow', choices=['cow', 'shared', 'fresh', 'keep']),
        )),
        memory=dict(type='str', default='512M'),
        cpus=dict(type='int', default=1),
        ports=dict(type='list', elements='str', default=[]),
        force=dict(type='bool', default=False),
        contract=dict(type='raw'),
    )
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    p = module.params
    if spec_option_error('contract', p['contract']):
        module.fail_json(msg=spec_option_error('contract', p['contract']))
    if p['contract'] == '':
        p['contract'] = None
    vm = Vmfork(module)
    name, want = p['name'], p['state']
    force = ['--force'] if p['force'] else []
    try:
        m = vm.machines().get(name)
        result = dict(changed=False, machine=m or {})
        with spec_file(p['contract'], 'contract') as contract_file:
            before, after = state_of(m, p['contract']), apply(module, vm, m, contract_file, result)
        record_change(module, result, before, after)
    except VmforkError as e:
        vm.fail(e)
    module.exit_json(**result)


def apply(module, vm, m, contract_file, result):
    """Brings machine m (None: absent) to the task's state; returns the
    diff's view of what it leads to, or None when nothing changes."""
    p = module.params
    name, want = p['name'], p['state']
    force = ['--force'] if p['force'] else []
    if want == 'absent' and m:
        if module.check_mode:
            result['plan'] = vm.run(dry_run_args(['rm', name]))
        else:
            vm.run(['rm'] + force + [name])
        result['machine'] = {}
        return {'state': 'absent'}
    if want == 'running' and not m:
        if module.check_mode:
            result['plan'] = vm.run(dry_run_args(['boot'] + boot_args(p, contract_file)))
        else:
            result['machine'] = vm.run(['boot'] + boot_args(p, contract_file))
        return {'name': name, 'state': 'running'}
    if want == 'running' and m['state'] == 'stopped':
        module.fail_json(msg='machine %r is stopped and vmfork has no start command: '
                             'remove it (state: absent) and boot it again' % name, machine=m)
    if want == 'stopped' and not m:
        module.fail_json(msg='machine %r does not exist: nothing to stop' % name, rc=4)
    if want == 'stopped' and m['state'] != 'stopped':
        if module.check_mode:
            result['plan'] = vm.run(dry_run_args(['stop'] + force + [name]))
        else:
            result['machine'] = (vm.run(['stop'] + force + [name]) or [{}])[0]
        return dict(state_of(m, p['contract']), state='stopped')
    if m and want == 'running':
        for key, value in (('memory_mib', mib(p['memory'])), ('cpus', p['cpus'])):
            if value is not None and m.get(key) != value:
                module.warn('machine %r exists with %s=%s, not %s; it is left as it is'
                            % (name, key, m.get(key), value))
        if p['contract'] is not None:
            return converge(module, vm, m, contract_file, result)
    return None


def converge(module, vm, m, contract_file, result):
    """Changes running machine m's contract in place when it is not the
    task's (vmfork refuses a change of its secrets)."""
    want = load_spec(module, module.params['contract'], 'contract')
    out = converge_contract(vm, m, want, contract_file)
    if out is None:
        return None
    if module.check_mode:
        result['plan'] = out
    else:
        result['contract'] = out
        result['machine'] = dict((k, v) for k, v in m.items() if k != 'contract')
        if out.get('contract') is not None:
            result['machine']['contract'] = out['contract']
    return dict(state_of(m), contract=normalize_contract(want))


if __name__ == '__main__':
    main()
