#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: vmfork_fork
short_description: Fork a running machine or a kept template into children
version_added: 0.1.0
description:
  - Makes sure children of I(parent) exist, forking the missing ones with C(vmfork fork).
    A running parent pauses for a fraction of a second and carries on; every child continues
    from that instant, shares the parent's memory and disk copy-on-write and gets an identity
    of its own (hostname, MAC and address, machine-id, SSH host keys, clock, RNG) before its
    network link goes up. A kept template (M(vmfork.vmfork.vmfork_template)) as I(parent)
    is not touched at all.
  - Idempotent by name. Children are I(names), or I(prefix)-1 to I(prefix)-I(count).
    Children that already exist are reported, not recreated; only missing ones are forked.
  - The identity results of each new child are returned step by step.
  - With I(contract), new children get that fork contract, and children that exist already are
    brought to it in place (C(vmfork contract NAME --set)); without it, new children inherit their
    parent's contract (unless I(customize) has one) and existing ones are left as they are.
  - A fork where only some children came up fails the task with the CLI's exit code 3 and
    returns the children that did come up; they stay.
  - With I(to), the children are made on another host (C(vmfork fork --to HOST)). I(parent)'s instant is
    frozen here (the same pause as a local fork; a kept template is not touched), pushed there (only the
    chunks that host lacks) and forked there, where each child's identity chain runs. The children are
    machines of that host. Which exist is asked of that host over ssh (C(REMOTE_BINARY ls --json), with
    I(ssh) and I(remote_binary)), so a second run forks nothing and freezes nothing.
options:
  parent:
    description: The running or stopped machine, or the kept template, to fork.
    type: str
    required: true
    aliases: [parent_vm, source]
  names:
    description: The children's names. Mutually exclusive with I(count).
    type: list
    elements: str
  count:
    description: How many children, named I(prefix)-1 to I(prefix)-I(count). Default 1 when I(names) is not given.
    type: int
  prefix:
    description: Name prefix for I(count) children; defaults to I(parent).
    type: str
  hostname:
    description:
      - Hostname pattern (C(--hostname)) with C({n}) the child's index (its number in I(prefix)-I(n),
        or its position in I(names)), C({name}) its name and C({parent}) the parent's.
      - vmfork's default is C({name}).
    type: str
  customize:
    description:
      - An identity spec, as C(vmfork fork --customize) reads it (identity, hostname, network,
        skip, timeouts, steps, on_failure); a dict, or the path of a YAML or JSON file on the managed host.
      - The other options override it, and I(contract) overrides its C(contract) section.
    type: raw
  contract:
    description:
      - The fork contract of the children (C(vmfork fork --contract)), enforced by the host where the guest
        cannot undo it; a dict, or the path of a YAML or JSON file (JSON if its name ends in C(.json)) on the
        managed host. When unset, new children get the C(contract) section of I(customize), or else inherit
        their parent's (or their kept template's) contract, and existing children are left as they are.
      - C(network.egress) is C(all), C(none) or a dict with C(allow), a list of destinations, each C(HOST:PORT),
        C(CIDR:PORT) or C(CIDR) (PORT may be C(*)). C(network.dns) is C(host) (the default) or C(none).
        C(network.connections) is C(reset) (the default; the connections a child inherits from its parent are
        closed in the child) or C(keep).
      - C(secrets) maps a name to a dict of C(hosts), C(header), C(format) and C(value_from). The guest holds a
        placeholder, and the host puts the value (from C(value_from.exec), C(value_from.env) or C(value_from.file)
        on the host) in the C(header) (default C(Authorization)) of requests to C(hosts) only, as C(format) says
        (default C({value}), for example C(Bearer {value})).
      - A child that exists with another contract has its network part changed in place (C(changed)).
        Secrets cannot change in place (the guest holds their placeholders already), so a difference there
        fails the task with vmfork's message; fork new children with the new contract instead.
      - Contracts are compared as vmfork records them, with its defaults filled in, so a second run with the
        same contract changes nothing. A YAML file is read with PyYAML on the managed host for that
        comparison, when children exist already.
      - See C(vmfork contract --help) and vmfork's docs/SECURITY.md.
    type: raw
  identity:
    description: C(fresh) gives each child a new vmgenid, clock and RNG state; C(reproducible) keeps the template's.
    type: str
    choices: [fresh, reproducible]
  network:
    description: C(dhcp), C(static) (with I(addresses)) or C(none) (only a new MAC).
    type: str
    choices: [dhcp, static, none]
  addresses:
    description: Static addresses in CIDR form, one per new child in order.
    type: list
    elements: str
  skip_steps:
    description: Identity steps not to run, for example C(vmfork.ssh-host-keys).
    type: list
    elements: str
    default: []
  disk_policy:
    description:
      - Fork policies for this fork by disk id, overriding those the parent was booted with
        (C(--disk-policy ID=POLICY)), each C(cow), C(shared), C(fresh) or C(keep). The boot disk always forks C(cow).
    type: dict
  parallel:
    description: Children started at once.
    type: int
  max_children:
    description: Refuse a fork of more children than this (vmfork's default is 128).
    type: int
  on_identity_failure:
    description: Kill a child whose identity fails (C(kill)), or keep it with its network link down (C(keep)).
    type: str
    choices: [kill, keep]
  to:
    description:
      - C([USER@]HOST) to fork onto (C(vmfork fork --to)); the children become machines of that host.
      - I(customize) and I(contract) name files on this host and cannot be used with it (vmfork refuses them);
        give the identity options one by one.
      - Check mode forks nothing and plans the missing children without a dry run (C(fork --to) has none).
      - A machine of a wanted name on that host must be a child of I(parent) (or of its kept template's
        source), as for a local fork.
    type: str
  ssh:
    description: With I(to), the ssh command and its options, split on spaces (vmfork's C(--ssh)).
    type: str
    default: ssh
  remote_binary:
    description: With I(to), the command that runs vmfork on that host, as its shell reads it (C(--remote-vmfork)).
    type: str
    default: vmfork
  idle_timeout:
    description: With I(to), give up when that host sends nothing for this many seconds (C(--idle-timeout)).
    type: int
  wait_agent:
    description:
      - Check that the guest agent of every child that already existed answers, and fail if one does not.
        New children are ready when the fork returns (their identity was set through the agent).
    type: bool
    default: true
extends_documentation_fragment:
  - action_common_attributes
  - vmfork.vmfork.vmfork
attributes:
  check_mode:
    support: full
    details:
      - Runs C(vmfork fork --dry-run) for the missing children, and C(vmfork contract NAME --set FILE --dry-run)
        for existing children whose contract differs; they check everything as the real run does and change nothing.
  diff_mode:
    support: full
  platform:
    platforms: posix
seealso:
  - module: vmfork.vmfork.vmfork_template
  - module: vmfork.vmfork.vmfork_info
author:
  - vmfork developers (@vmfork)
'''

EXAMPLES = r'''
- name: Three children web-1..web-3 with their own hostnames
  vmfork.vmfork.vmfork_fork:
    parent: web
    count: 3
    hostname: "node{n}"
  register: burst

- name: Named children from a kept template, static addresses
  vmfork.vmfork.vmfork_fork:
    parent: golden
    names: [try-a, try-b]
    network: static
    addresses: [10.0.2.21/24, 10.0.2.22/24]
    skip_steps: [vmfork.ssh-host-keys]

- name: On a libvirt host, with an identity spec
  vmfork.vmfork.vmfork_fork:
    parent: desktop
    count: 20
    prefix: vdi
    uri: qemu:///system
    customize:
      hostname: "vdi-{n}"
      timeouts:
        vmfork.agent: 30s

- name: Children that reach nothing; their inherited connections are reset
  vmfork.vmfork.vmfork_fork:
    parent: golden
    count: 4
    prefix: sandbox
    contract:
      network:
        egress: none

- name: Children that reach only the API and the package mirror, with a token the guests never hold
  vmfork.vmfork.vmfork_fork:
    parent: golden
    count: 2
    prefix: agent
    contract:
      network:
        egress:
          allow: ["api.example.com:443", "10.0.5.0/24:3142"]
        dns: host
      secrets:
        API_TOKEN:
          hosts: [api.example.com]
          header: Authorization
          format: "Bearer {value}"
          value_from:
            exec: /usr/local/bin/mint-token   # run on the host for each child (VMFORK_NAME, VMFORK_INDEX)

- name: Two children on host2 from web's instant here; a second run forks nothing
  vmfork.vmfork.vmfork_fork:
    parent: web
    names: [web-far-1, web-far-2]
    to: root@host2
    ssh: ssh -F /etc/vmfork/ssh_config
    hostname: "far{n}"

- name: The same contract from a file on the managed host
  vmfork.vmfork.vmfork_fork:
    parent: golden
    count: 2
    prefix: agent
    contract: /etc/vmfork/agent-contract.yaml
'''

RETURN = r'''
children:
  description: Every wanted child, in order, those forked now and those that existed.
  returned: always
  type: list
  elements: dict
  contains:
    name: {description: Machine name., type: str}
    created: {description: Whether this task forked it., type: bool}
    state: {description: Its state., type: str}
    pid: {description: Its QEMU process., type: int}
    mac: {description: The MAC its guest uses now., type: str}
    hostname: {description: Its hostname., type: str}
    addresses: {description: Its addresses in CIDR form., type: list, elements: str}
    template: {description: The template it was forked from., type: str}
    contract: {description: "Its fork contract as vmfork records it (defaults filled in); absent when it has none.", type: dict}
    host: {description: "With I(to), the host it runs on, as I(to) names it.", type: str}
    contract_changed: {description: "Whether this task changed (in check mode, would change) the contract of a child that existed, in place.", type: bool}
    pause_ms: {description: How long the parent paused for the fork that made it (0 from a kept template)., type: float}
    running_ms: {description: From the start of its creation until its vCPUs ran., type: float}
    ready_ms: {description: From the start of its creation until its identity was set., type: float}
    identity: {description: "What the identity chain did, step by step (C(steps)), with mode, MAC, hostname, machine-id and vmgenid.", type: dict}
  sample: [{"name": "web-1", "created": true, "state": "running", "pid": 4301, "mac": "52:54:00:32:2e:f8",
            "hostname": "node1", "addresses": ["10.0.2.16/24"], "template": "web.1", "pause_ms": 68.0,
            "running_ms": 54.0, "ready_ms": 640.0,
            "identity": {"mode": "fresh", "steps": [{"name": "vmfork.hostname", "status": "ok", "detail": "node1"}]}}]
failed_children:
  description: Children that did not come up, with the error of each.
  returned: when some failed
  type: list
  elements: dict
  sample: [{"name": "web-2", "error": "QEMU exited: ..."}]
forks:
  description:
    - The JSON of each C(vmfork fork) run (one, or one per child when an C({n}) hostname must keep its numbering).
    - With I(to), of each C(vmfork fork --to), whose C(fork) is the other host's fork.
  returned: when children were forked
  type: list
  elements: dict
contracts:
  description: The JSON of each C(vmfork contract NAME --set) run on an existing child (name, state, contract, rules).
  returned: when existing children's contracts were changed
  type: list
  elements: dict
  sample: [{"name": "web-1", "state": "running", "contract": {"network": {"egress": "none", "dns": "host",
            "connections": "reset"}}, "rules": []}]
plans:
  description:
    - In check mode, what each vmfork command would do (its C(--dry-run --json)); C(command) says which,
      C(fork) for the missing children, C(contract) for each existing child whose contract would change.
  returned: in check mode, when children are missing or a contract would change
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vmfork.vmfork.plugins.module_utils.vmfork import (
    EXIT_PARTIAL, Vmfork, VmforkError, common_argument_spec, converge_contract, dry_run_args, load_spec,
    normalize_contract, remote_argument_spec, remote_flags, run_remote, spec_file, spec_option_error)


def wanted(p):
    """The wanted children as (name, index) pairs."""
    if p['names']:
        return [(n, i + 1) for i, n in enumerate(p['names'])]
    prefix = p['prefix'] or p['parent']
    return [('%s-%d' % (prefix, i), i) for i in range(1, (p['count'] or 1) + 1)]


def batches(p, missing):
    """Splits the missing children into fork calls. vmfork's {n} is the
    child's position in its fork; one call keeps it right when the missing
    children are exactly 1..k. Otherwise each child is forked alone with
    its own number filled in, so that a child forked later gets the
    hostname it would have had in the first run."""
    pattern = p['hostname']
    if pattern is None and isinstance(p['customize'], dict):
        pattern = p['customize'].get('hostname')
    if pattern and '{n}' in pattern and [i for dummy, i in missing] != list(range(1, len(missing) + 1)):
        return [([n], pattern.replace('{n}', str(i))) for n, i in missing]
    return [([n for n, dummy in missing], p['hostname'])]


def fork_args(p, names, hostname, customize_file, contract_file):
    args = ['fork']
    if p['to']:
        args += ['--to', p['to']] + remote_flags(p)
    if hostname:
        args += ['--hostname', hostname]
    if customize_file:
        args += ['--customize', customize_file]
    if contract_file:
        args += ['--contract', contract_file]
    for opt in ('identity', 'network', 'parallel', 'max_children', 'on_identity_failure'):
        if p[opt] is not None:
            args += ['--%s' % opt.replace('_', '-'), str(p[opt])]
    for a in p['addresses'] or []:
        args += ['--address', a]
    for s in p['skip_steps']:
        args += ['--skip-step', s]
    for disk_id, policy in sorted((p.get('disk_policy') or {}).items()):
        args += ['--disk-policy', '%s=%s' % (disk_id, policy)]
    return args + [p['parent']] + names


def view_of_existing(m):
    keys = ('name', 'state', 'pid', 'mac', 'hostname', 'addresses', 'parent', 'template', 'contract')
    v = dict((k, m.get(k)) for k in keys if k in m)
    v['created'] = False
    v['contract_changed'] = False
    return v


def view_of_new(child, fork):
    ident = child.get('identity') or {}
    return dict(name=child['name'], created=True, state=child.get('state'), pid=child.get('pid'),
                mac=ident.get('mac'), hostname=ident.get('hostname'), addresses=ident.get('addresses') or [],
                template=fork.get('template'), pause_ms=fork.get('pause_ms'), running_ms=child.get('running_ms'),
                ready_ms=child.get('ready_ms'), identity=ident, ports=child.get('ports') or [], contract_changed=False)


def belongs(m, parent, kept_id):
    return parent in (m.get('parent'), m.get('template')) or (kept_id and m.get('template') == kept_id)


def main():
    spec = common_argument_spec()
    spec.update(
        parent=dict(type='str', required=True, aliases=['parent_vm', 'source']),
        names=dict(type='list', elements='str'),
        count=dict(type='int'),
        prefix=dict(type='str'),
        hostname=dict(type='str'),
        customize=dict(type='raw'),
        contract=dict(type='raw'),
        identity=dict(type='str', choices=['fresh', 'reproducible']),
        network=dict(type='str', choices=['dhcp', 'static', 'none']),
        addresses=dict(type='list', elements='str'),
        skip_steps=dict(type='list', elements='str', default=[]),
        disk_policy=dict(type='dict'),
        parallel=dict(type='int'),
        max_children=dict(type='int'),
        on_identity_failure=dict(type='str', choices=['kill', 'keep']),
        wait_agent=dict(type='bool', default=True),
        to=dict(type='str'),
    )
    spec.update(remote_argument_spec())
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True,
                           mutually_exclusive=[('names', 'count'), ('names', 'prefix')])
    p = module.params
    if p['count'] is not None and p['count'] < 1:
        module.fail_json(msg='count must be at least 1, got %d' % p['count'])
    if p['names'] is not None and not p['names']:
        module.fail_json(msg='names must list at least one child')
    if p['idle_timeout'] is not None and p['idle_timeout'] <= 0:
        module.fail_json(msg='idle_timeout must be above 0, got %d' % p['idle_timeout'])
    if p['to']:
        for opt in ('customize', 'contract'):
            if p[opt] not in (None, ''):
                module.fail_json(msg='%s cannot be used with to (vmfork fork --to refuses it: it names a file on this '
                                     'host); give the identity options one by one' % opt, rc=2)
    for opt in ('customize', 'contract'):
        if spec_option_error(opt, p[opt]):
            module.fail_json(msg=spec_option_error(opt, p[opt]))
        if p[opt] == '':
            p[opt] = None  # as when unset, so that a template may say "{{ x | default('') }}"
    vm = Vmfork(module)
    want = wanted(p)
    result = dict(changed=False, children=[])
    try:
        if p['to']:
            return fork_to(module, vm, p, result, want)
        machines = vm.machines()
        kept = None if p['parent'] in machines else vm.kept(p['parent'])
        kept_id = kept and kept.get('id')
        existing = [(n, i) for n, i in want if n in machines]
        for n, dummy in existing:
            if not belongs(machines[n], p['parent'], kept_id):
                module.fail_json(msg='machine %r exists but is not a child of %r (its parent is %r)'
                                     % (n, p['parent'], machines[n].get('parent')), rc=2)
        missing = [(n, i) for n, i in want if n not in machines]
        views = dict((n, view_of_existing(machines[n])) for n, dummy in existing)
        # Read only when it is compared: a YAML file needs PyYAML here.
        want_contract = load_spec(module, p['contract'], 'contract') if existing else None
        with spec_file(p['customize'], 'customize') as customize_file:
            with spec_file(p['contract'], 'contract') as contract_file:
                if p['contract'] is not None:
                    converge(module, vm, result, views, [machines[n] for n, dummy in existing], want_contract,
                             contract_file)
                if missing:
                    fork(module, vm, p, result, views, want, missing, customize_file, contract_file)
        if p['wait_agent'] and not module.check_mode:
            for n, dummy in existing:
                vm.run(['exec', n, '--', 'true'])
        result['children'] = [views[n] for n, dummy in want if n in views]
        if module._diff:
            result['diff'] = dict(before={'children': [n for n, dummy in existing]},
                                  after={'children': [n for n, dummy in want]})
            changed = [n for n, dummy in existing if views[n]['contract_changed']]
            if changed:
                result['diff']['before']['contracts'] = dict(
                    (n, normalize_contract(machines[n].get('contract'))) for n in changed)
                result['diff']['after']['contracts'] = dict((n, normalize_contract(want_contract)) for n in changed)
    except VmforkError as e:
        extra = dict((k, result[k]) for k in ('children', 'failed_children', 'forks', 'contracts') if k in result)
        extra['changed'] = result['changed']
        if e.rc == EXIT_PARTIAL:
            extra['msg_detail'] = 'only some children came up; those stay and are listed in children'
        vm.fail(e, **extra)
    module.exit_json(**result)


def fork_to(module, vm, p, result, want):
    """The children on host p['to']: those there are reported, the missing
    ones forked with vmfork fork --to (in check mode, planned)."""
    host = p['to']
    local = vm.machines()
    kept = None if p['parent'] in local else vm.kept(p['parent'])
    if p['parent'] not in local and kept is None:
        module.fail_json(msg='parent %r is neither a machine nor a kept template here' % p['parent'], rc=4)
    # The other host's children of a fork --to name the source machine as
    # their parent (a kept template's source, for a template).
    parents = (p['parent'], kept.get('source') if kept else None)
    there = dict((m['name'], m) for m in (run_remote(module, p, host, ['ls'], 'list the machines') or []))
    existing = [(n, i) for n, i in want if n in there]
    for n, dummy in existing:
        if there[n].get('parent') not in parents:
            module.fail_json(msg='machine %r exists on %s but is not a child of %r (its parent is %r)'
                                 % (n, host, p['parent'], there[n].get('parent')), rc=2)
    missing = [(n, i) for n, i in want if n not in there]
    views = dict((n, dict(view_of_existing(there[n]), host=host)) for n, dummy in existing)
    key = 'plans' if module.check_mode else 'forks'
    if missing:
        result[key] = []
    for names, hostname in batches(p, missing) if missing else []:
        args = fork_args(p, names, hostname, None, None)
        if module.check_mode:
            result['changed'] = True
            result[key].append(dict(command='fork --to', host=host, source=p['parent'], children=names))
            for n in names:
                views[n] = dict(name=n, created=True, state='planned', host=host, contract_changed=False)
            continue
        try:
            out = vm.run(args)
        except VmforkError as e:
            out = e.result if isinstance(e.result, dict) else {}
            for c in (out.get('fork') or {}).get('children') or []:
                views[c['name']] = dict(view_of_new(c, out['fork']), host=host, pause_ms=out.get('pause_ms'))
            result['children'] = [views[n] for n, dummy in want if n in views]
            result['failed_children'] = (out.get('fork') or {}).get('failed') or []
            result['forks'].append(out)
            result['changed'] = bool(len(result['forks']) > 1 or (out.get('fork') or {}).get('children'))
            raise
        result['changed'] = True
        result[key].append(out)
        for c in (out.get('fork') or {}).get('children') or []:
            views[c['name']] = dict(view_of_new(c, out['fork']), host=host, pause_ms=out.get('pause_ms'))
    if p['wait_agent'] and not module.check_mode:
        for n, dummy in existing:
            run_remote(module, p, host, ['exec', n, '--', 'true'], 'reach the agent of %s' % n)
    result['children'] = [views[n] for n, dummy in want if n in views]
    if module._diff:
        result['diff'] = dict(before={'children': [n for n, dummy in existing], 'host': host},
                              after={'children': [n for n, dummy in want], 'host': host})
    module.exit_json(**result)


def converge(module, vm, result, views, machines, want_contract, contract_file):
    """Brings existing children to contract want_contract in place (its
    network part; vmfork refuses a change of secrets)."""
    for m in machines:
        out = converge_contract(vm, m, want_contract, contract_file)
        if out is None:
            continue
        result['changed'] = True
        view = views[m['name']]
        view['contract_changed'] = True
        if module.check_mode:
            result.setdefault('plans', []).append(out)
            view['contract'] = normalize_contract(want_contract)
        else:
            result.setdefault('contracts', []).append(out)
            view['contract'] = out.get('contract')


def fork(module, vm, p, result, views, want, missing, customize_file, contract_file):
    """Forks the missing children (in check mode, plans it)."""
    key = 'plans' if module.check_mode else 'forks'
    result.setdefault(key, [])
    for names, hostname in batches(p, missing):
        args = fork_args(p, names, hostname, customize_file, contract_file)
        if module.check_mode:
            plan = vm.run(dry_run_args(args))
            result['changed'] = True  # not before: a dry run that fails changes nothing
            result[key].append(plan)
            for c in plan.get('children') or []:
                views[c['name']] = dict(name=c['name'], created=True, hostname=c.get('hostname'), state='planned',
                                        contract_changed=False)
                if plan.get('contract') is not None:
                    views[c['name']]['contract'] = plan['contract']
            continue
        try:
            out = vm.run(args)
        except VmforkError as e:
            out = e.result if isinstance(e.result, dict) else {}
            for c in out.get('children') or []:
                views[c['name']] = view_of_new(c, out)
            result['children'] = [views[n] for n, dummy in want if n in views]
            result['failed_children'] = out.get('failed') or []
            result['forks'].append(out)
            result['changed'] = bool(out.get('children')) or bool(result['forks'][:-1]) or bool(result.get('contracts'))
            raise
        result['changed'] = True
        result[key].append(out)
        for c in out.get('children') or []:
            views[c['name']] = view_of_new(c, out)
    if not module.check_mode:
        # fork's JSON does not say which contract a child got (its own, or
        # the one it inherited): ls does.
        now = vm.machines()
        for n, dummy in missing:
            if n in views and (now.get(n) or {}).get('contract') is not None:
                views[n]['contract'] = now[n]['contract']


if __name__ == '__main__':
    main()
