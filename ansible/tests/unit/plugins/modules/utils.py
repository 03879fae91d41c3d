# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helpers for the module tests: module arguments, exit capture, and a fake
vmfork CLI that keeps machines and templates in memory and answers with the
JSON shapes the real CLI prints (cmd/vmfork/testdata has the golden files)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import shlex
import unittest
from unittest import mock

import yaml

from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes
from ansible.module_utils.common.warnings import get_warning_messages

from ansible_collections.vmfork.vmfork.plugins.module_utils.vmfork import normalize_contract


def set_module_args(args):
    args = dict(args)
    args.setdefault('_ansible_remote_tmp', '/tmp')
    args.setdefault('_ansible_keep_remote_files', False)
    basic._ANSIBLE_ARGS = to_bytes(json.dumps({'ANSIBLE_MODULE_ARGS': args}))


class ExitJson(Exception):
    pass


class FailJson(Exception):
    pass


def exit_json(self, **kwargs):
    kwargs.setdefault('changed', False)
    # The real exit_json adds the module's warnings; they are kept globally.
    kwargs['warnings'] = list(get_warning_messages())
    raise ExitJson(kwargs)


def fail_json(self, **kwargs):
    kwargs['failed'] = True
    raise FailJson(kwargs)


GLOBAL_FLAGS = ('--state-dir', '--mem-dir', '--connect', '--timeout')
VALUE_FLAGS = ('--hostname', '--customize', '--identity', '--network', '--parallel', '--max-children',
               '--on-identity-failure', '--address', '--skip-step', '--disk-policy', '--kernel', '--initrd', '--append',
               '--disk', '--memory', '--cpus', '--port', '--pool', '--count', '--prefix', '--contract', '--set',
               '--ssh', '--remote-vmfork', '--idle-timeout', '--as', '--to')


class FakeVmfork:
    """A vmfork CLI in memory. calls holds every argv (without the binary
    and global flags); fail_children makes a fork of those names fail;
    contract_files holds (path, contract) for every contract file a
    command read, as it was then."""

    def __init__(self):
        self.machines = {}
        self.templates = []
        self.calls = []
        self.globals = []
        self.fail_children = set()
        self.next_template = 1
        self.contract_files = []
        self.template_contracts = {}  # template id: contract, or None
        self.remotes = {}  # host (no user): the FakeVmfork ssh reaches there

    # --- state helpers -------------------------------------------------
    def add_machine(self, name, state='running', parent=None, template=None, hostname=None, contract=None):
        """Adds a machine; contract is stored as vmfork records one (its
        defaults filled in), and ls shows it only when there is one."""
        m = dict(name=name, state=state, driver='qemu', pid=4000 + len(self.machines), memory_mib=256, cpus=1,
                 mac='52:54:00:00:00:%02x' % len(self.machines), ports=[], qmp_socket='/s/%s/qmp.sock' % name)
        if parent:
            m.update(parent=parent, template=template, hostname=hostname or name, addresses=['10.0.2.16/24'])
        if contract is not None:
            m['contract'] = normalize_contract(contract)
        self.machines[name] = m
        return m

    def add_template(self, name, source, pool=0, contract=None):
        """Adds a template; its contract (what its children get) is kept
        apart, as template ls does not show it (tree does)."""
        t = dict(name=name, id='%s.%d' % (source, self.next_template), source=source, memory_mib=256,
                 has_memory=True, ram_bytes=1 << 20, pause_ms=70.5, children=0, pool_size=pool, pooled=pool)
        self.next_template += 1
        self.templates.append(t)
        self.template_contracts[t['id']] = normalize_contract(contract) if contract is not None else None
        return t

    def kept(self, name):
        return next((t for t in self.templates if t.get('name') == name), None)

    def commands(self):
        """The command words of every call, such as 'fork' or 'template save'."""
        out = []
        for c in self.calls:
            out.append(' '.join(c[:2]) if c[0] == 'template' else c[0])
        return out

    # --- the CLI -------------------------------------------------------
    def run_command(self, module, cmd, data=None, binary_data=False, **kwargs):
        if cmd[0] == 'ssh':
            return self.ssh(cmd)
        argv = list(cmd[1:])
        while argv and (argv[0] in GLOBAL_FLAGS or argv[0] == '-q'):
            if argv[0] == '-q':
                argv.pop(0)
            else:
                self.globals += argv[:2]
                argv = argv[2:]
        self.calls.append(argv)
        words = 2 if argv[0] == 'template' else 1
        name, rest = ' '.join(argv[:words]), argv[words:]
        flags, pos, multi = {}, [], {}
        i = 0
        while i < len(rest):
            a = rest[i]
            if a == '--':
                pos += rest[i + 1:]
                break
            if a in VALUE_FLAGS:
                flags[a] = rest[i + 1]
                multi.setdefault(a, []).append(rest[i + 1])
                i += 2
                continue
            if a.startswith('--'):
                flags[a] = True
            else:
                pos.append(a)
            i += 1
        handler = getattr(self, 'cmd_' + name.replace(' ', '_'))
        rc, doc, err = handler(flags, pos, multi)
        out = json.dumps(doc) if doc is not None else ''
        return rc, out, ('vmfork: %s\n' % err) if err else ''

    def ssh(self, cmd):
        """ssh [OPTIONS] [USER@]HOST 'REMOTE_VMFORK ARGS': the FakeVmfork of
        HOST in self.remotes runs ARGS; the call is recorded here as
        ['ssh', HOST, REMOTE COMMAND]."""
        host, remote = cmd[-2], cmd[-1]
        self.calls.append(['ssh', host, remote])
        other = self.remotes.get(host.split('@')[-1])
        if other is None:
            return 255, '', 'ssh: connect to host %s port 22: No route to host\n' % host
        return other.run_command(None, ['vmfork'] + shlex.split(remote)[1:])

    def transfer(self, src, name, dst, as_name):
        """Copies kept template name of src to dst as as_name, keeping its id
        (a template travels with its id); the transfer's JSON, or an error."""
        t = src.kept(name)
        if t is None:
            return 4, None, 'template %r: not found' % name
        if dst.kept(as_name) is not None:
            return 2, None, 'template %s is kept as %r here: exists' % (dst.kept(as_name)['id'], as_name)
        dst.templates.append(dict(t, name=as_name, children=0, pool_size=0, pooled=0))
        dst.template_contracts[t['id']] = src.template_contracts.get(t['id'])
        return 0, dict(op='', name=name, id=t['id'], bytes_out=3 << 20, bytes_in=4096, elapsed_ms=12.5,
                       received=dict(name=as_name, id=t['id'], chunks=66, chunks_sent=3)), None

    def remote(self, spec, need_name):
        host, dummy, name = spec.partition(':')
        other = self.remotes.get(host.split('@')[-1])
        if other is None:
            return None, None, 'ssh to %s: exit status 255: No route to host' % host
        if need_name and not name:
            return None, None, 'remote %r names no template: give HOST:NAME' % spec
        return other, name, None

    def cmd_template_push(self, flags, pos, multi):
        other, name, err = self.remote(pos[1], False)
        if err:
            return 2, None, err
        rc, doc, err = self.transfer(self, pos[0], other, name or pos[0])
        if doc:
            doc['op'] = 'push'
        return rc, doc, err

    def cmd_template_pull(self, flags, pos, multi):
        other, name, err = self.remote(pos[0], True)
        if err:
            return 2, None, err
        rc, doc, err = self.transfer(other, name, self, flags.get('--as') or name)
        if doc:
            doc['op'] = 'pull'
        return rc, doc, err

    def load_contract(self, flag, path):
        """Reads a contract file as vmfork does: (contract, error)."""
        try:
            with open(path) as f:
                c = json.load(f) if path.lower().endswith('.json') else yaml.safe_load(f)
        except (IOError, OSError, ValueError) as e:
            return None, '%s: contract: %s' % (flag, e)
        c = c or {}
        self.contract_files.append((path, c))
        unknown = sorted(set(c) - set(['network', 'secrets']))
        if unknown:
            return None, '%s: contract %s: unknown key %r: invalid contract' % (flag, path, unknown[0])
        return normalize_contract(c), None

    def contract_of(self, flags):
        """--contract's contract, else the --customize spec's contract:
        section (as vmfork's contractOf), else None: (contract, error)."""
        if '--contract' in flags:
            return self.load_contract('--contract', flags['--contract'])
        if '--customize' in flags:
            with open(flags['--customize']) as f:
                spec = json.load(f) if flags['--customize'].endswith('.json') else yaml.safe_load(f)
            if (spec or {}).get('contract') is not None:
                return normalize_contract(spec['contract']), None
        return None, None

    def cmd_host(self, flags, pos, multi):
        if pos != ['info']:
            return 2, None, 'host: unknown subcommand %r' % pos
        running = len([m for m in self.machines.values() if m['state'] == 'running'])
        return 0, dict(hostname='fake', driver='qemu', cpus=2, ram_for_new_bytes=8 << 30,
                       machines=dict(running=running, stopped=len(self.machines) - running, hibernated=0, other=0),
                       templates=[dict(name=t.get('name'), id=t['id'], source=t['source'], child_ram_bytes=256 << 20,
                                       child_ram_basis='guest_ram', children_that_fit=32) for t in self.templates]), None

    def cmd_contract(self, flags, pos, multi):
        name = pos[0]
        m = self.machines.get(name)
        if not m:
            return 4, None, 'contract: machine "%s": not found' % name
        if '--set' not in flags:
            if '--dry-run' in flags:
                return 2, None, '--dry-run goes with --set: showing a contract changes nothing'
            return 0, dict(name=name, state=m['state'], contract=m.get('contract'), rules=[]), None
        c, err = self.load_contract('--set', flags['--set'])
        if err:
            return 2, None, err
        if m['state'] != 'running':
            return 1, None, ('contract "%s": machine is %s; a contract changes in place only while it runs '
                             '(a fork names another one): not running' % (name, m['state']))
        if (m.get('contract') or {}).get('secrets') != c.get('secrets'):
            return 2, None, ('contract "%s": secrets: only the network part changes in place; the guest holds its '
                             'secrets\' placeholders already (fork it with the new contract instead): invalid argument'
                             % name)
        if '--dry-run' in flags:
            return 0, dict(dry_run=True, command='contract', changed=True, machines=[name], source_pauses=False,
                           actions=['replace running machine "%s"\'s host rules: ...' % name]), None
        if c:
            m['contract'] = c
        else:
            m.pop('contract', None)
        return 0, dict(name=name, state=m['state'], contract=m.get('contract'), rules=['egress rule']), None

    def cmd_tree(self, flags, pos, multi):
        def node(t):
            n = dict(kind='template', name=t['id'], kept_as=t.get('name'), ram_bytes=1 << 20, disk_bytes=0)
            if self.template_contracts.get(t['id']) is not None:
                n['contract'] = self.template_contracts[t['id']]
            return n
        roots = []
        for m in self.machines.values():
            if m.get('parent'):
                continue
            r = dict(kind='machine', name=m['name'], state=m['state'], ram_bytes=1 << 20, disk_bytes=0,
                     children=[node(t) for t in self.templates if t['source'] == m['name']])
            if m.get('contract') is not None:
                r['contract'] = m['contract']
            roots.append(r)
        if pos and not any(pos[0] in (r['name'], c.get('kept_as')) for r in roots for c in r['children']):
            return 4, None, 'tree: machine or template "%s": not found' % pos[0]
        return 0, dict(roots=roots, saved_bytes=0, held_bytes=0), None

    def cmd_ls(self, flags, pos, multi):
        return 0, list(self.machines.values()), None

    def cmd_template_ls(self, flags, pos, multi):
        for t in self.templates:
            t['children'] = len([m for m in self.machines.values() if m.get('template') == t['id']])
        return 0, self.templates, None

    def cmd_boot(self, flags, pos, multi):
        name = pos[0]
        if name in self.machines:
            return 2, None, 'boot: machine %r: already exists' % name
        if '--kernel' not in flags and '--disk' not in flags:
            return 2, None, 'boot %r: a kernel (--kernel) or a disk image (--disk) is required: invalid argument' % name
        c, err = self.contract_of(flags)
        if err:
            return 2, None, err
        if '--dry-run' in flags:
            plan = dict(dry_run=True, command='boot', changed=True, machines=[name],
                        actions=['create machine %r' % name], source_pauses=False)
            if c is not None:
                plan['contract'] = c
            return 0, plan, None
        return 0, self.add_machine(name, contract=c), None

    def cmd_stop(self, flags, pos, multi):
        views = []
        for n in pos:
            if n not in self.machines:
                return 4, None, 'stop: machine %r: not found' % n
            if '--dry-run' in flags:
                return 0, dict(dry_run=True, command='stop', changed=True, machines=[n], source_pauses=False,
                               actions=['shut machine "%s" down' % n]), None
            self.machines[n].update(state='stopped', pid=0)
            views.append(self.machines[n])
        return 0, views, None

    def cmd_rm(self, flags, pos, multi):
        missing = [n for n in pos if n not in self.machines]
        if '--dry-run' in flags:
            doc = dict(dry_run=True, command='rm', changed=bool(set(pos) - set(missing)),
                       machines=[n for n in pos if n in self.machines], actions=['kill ...'], source_pauses=False)
        else:
            for n in pos:
                self.machines.pop(n, None)
            doc = dict(removed=[n for n in pos if n not in missing], forgotten=[])
        if missing:
            return 4, doc, 'rm: machine %r: not found' % missing[0]
        return 0, doc, None

    def cmd_exec(self, flags, pos, multi):
        if pos[0] not in self.machines:
            return 4, None, 'exec: machine %r: not found' % pos[0]
        return 0, dict(exit_code=0, signal=0, stdout='', stderr=''), None

    def fork_to(self, flags, pos, multi):
        """fork --to HOST: the instant goes to HOST as a template that is
        given up once its children are made there, as vmfork does."""
        src = pos[0]
        kept = self.kept(src)
        if src not in self.machines and not kept:
            return 4, None, 'fork: machine %r: not found' % src
        if '--dry-run' in flags or '--customize' in flags or '--contract' in flags:
            return 2, None, '--dry-run, --customize and --contract cannot be used with --to'
        other, dummy, err = self.remote(flags['--to'], False)
        if err:
            return 1, None, err
        t = other.add_template('fork-to-%d' % len(self.calls), kept['source'] if kept else src)
        rest = dict((k, v) for k, v in flags.items() if k not in ('--to', '--ssh', '--remote-vmfork', '--idle-timeout'))
        rc, res, err = other.cmd_fork(rest, [t['name']] + pos[1:], multi)
        other.templates.remove(t)
        doc = dict(host=flags['--to'], source=src, pause_ms=0 if kept else 8.8, fork=res, running_ms=1365.0,
                   ready_ms=1988.0, push=dict(op='push', bytes_out=3 << 20, received=dict(chunks=75, chunks_sent=29)))
        return rc, doc, err

    def cmd_fork(self, flags, pos, multi):
        if '--to' in flags:
            return self.fork_to(flags, pos, multi)
        src, names = pos[0], pos[1:]
        kept = self.kept(src)
        if src not in self.machines and not kept:
            return 4, None, 'fork: machine %r: not found' % src
        for n in names:
            if n in self.machines:
                return 2, None, 'fork %r: machine %r: already exists' % (src, n)
        pattern = flags.get('--hostname', '{name}')
        parent = kept['source'] if kept else src
        c, err = self.contract_of(flags)
        if err:
            return 2, None, err
        if c is None:  # the children inherit the parent's, or the kept template's
            c = self.template_contracts.get(kept['id']) if kept else self.machines[src].get('contract')

        def host(n, i):
            return pattern.replace('{n}', str(i)).replace('{name}', n).replace('{parent}', parent)
        if '--dry-run' in flags:
            plan = dict(dry_run=True, command='fork', changed=True, source=src, source_pauses=not kept,
                        template=kept['name'] if kept else None, actions=['start %d children' % len(names)],
                        children=[dict(name=n, index=i + 1, hostname=host(n, i + 1)) for i, n in enumerate(names)])
            if c is not None:
                plan['contract'] = c
            return 0, plan, None
        tid = kept['id'] if kept else self.add_template(None, src)['id']
        res = dict(source=src, template=tid, pause_ms=0 if kept else 68.5, children=[], failed=[])
        for i, n in enumerate(names):
            if n in self.fail_children:
                res['failed'].append(dict(name=n, error='QEMU exited: injected'))
                continue
            m = self.add_machine(n, parent=parent, template=tid, hostname=host(n, i + 1), contract=c)
            res['children'].append(dict(name=n, pid=m['pid'], state='running', ports=[], running_ms=54.0,
                                        ready_ms=640.0, identity=dict(mode='fresh', mac=m['mac'],
                                                                      hostname=m['hostname'],
                                                                      addresses=m['addresses'],
                                                                      steps=[dict(name='vmfork.hostname',
                                                                                  status='ok')])))
        if not res['failed']:
            del res['failed']
            return 0, res, None
        if not res['children']:
            return 1, res, 'fork %r: no child came up' % src
        return 3, res, 'fork %r: %d of %d children came up; failed: ...: partial success' % (
            src, len(res['children']), len(names))

    def cmd_template_save(self, flags, pos, multi):
        src, name = pos
        if name in self.machines or self.kept(name):
            return 2, None, 'keep %r as %r: already exists' % (src, name)
        if src not in self.machines:
            return 4, None, 'keep: machine %r: not found' % src
        pool = int(flags.get('--pool', 0))
        c, err = self.contract_of(flags)
        if err:
            return 2, None, err
        if c is None:
            c = self.machines[src].get('contract')
        if '--dry-run' in flags:
            plan = dict(dry_run=True, command='template save', changed=True, source=src, template=name,
                        source_pauses=True, actions=['keep'])
            if c is not None:
                plan['contract'] = c
            return 0, plan, None
        return 0, self.add_template(name, src, pool, contract=c), None

    def cmd_template_pool(self, flags, pos, multi):
        t = self.kept(pos[0])
        if not t:
            return 4, None, 'template %r: not found' % pos[0]
        if '--dry-run' in flags:
            return 0, dict(dry_run=True, command='template pool', changed=int(pos[1]) != t['pool_size'],
                           template=pos[0], source_pauses=False,
                           actions=['record template "%s"\'s pool size as %s' % (pos[0], pos[1])]), None
        t.update(pool_size=int(pos[1]), pooled=int(pos[1]))
        return 0, t, None

    def cmd_template_rm(self, flags, pos, multi):
        t = self.kept(pos[0])
        if not t:
            return 4, None, 'template %r: not found' % pos[0]
        if '--dry-run' in flags:
            return 0, dict(dry_run=True, command='template rm', changed=True, template=pos[0], actions=['rm'],
                           source_pauses=False), None
        self.templates.remove(t)
        return 0, dict(name=pos[0], removed=True), None


class ModuleTestCase(unittest.TestCase):
    """Runs a module's main() against a FakeVmfork."""

    module = None  # the module under test

    def setUp(self):
        self.fake = FakeVmfork()
        fake = self.fake

        def run_command(module, cmd, **kwargs):
            return fake.run_command(module, cmd, **kwargs)

        patches = [
            mock.patch.multiple(basic.AnsibleModule, exit_json=exit_json, fail_json=fail_json),
            mock.patch.object(basic.AnsibleModule, 'run_command', run_command),
        ]
        for p in patches:
            p.start()
            self.addCleanup(p.stop)

    def run_module(self, args, check=False, diff=False):
        """Runs the module; returns (failed, result)."""
        args = dict(args)
        args.setdefault('binary', '/usr/bin/vmfork')
        args['_ansible_check_mode'] = check
        args['_ansible_diff'] = diff
        set_module_args(args)
        try:
            self.module.main()
        except ExitJson as e:
            return False, e.args[0]
        except FailJson as e:
            return True, e.args[0]
        self.fail('module exited neither with exit_json nor with fail_json')

    def ok(self, args, **kw):
        failed, res = self.run_module(args, **kw)
        self.assertFalse(failed, res)
        return res

    def failed(self, args, **kw):
        failed, res = self.run_module(args, **kw)
        self.assertTrue(failed, res)
        return res
