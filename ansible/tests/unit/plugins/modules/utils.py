# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Helpers for the module tests: module arguments, exit capture, and a fake
vmfork CLI that keeps machines and templates in memory and answers with the
JSON shapes the real CLI prints (cmd/vmfork/testdata has the golden files)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import unittest
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes
from ansible.module_utils.common.warnings import get_warning_messages


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
               '--on-identity-failure', '--address', '--skip-step', '--kernel', '--initrd', '--append',
               '--disk', '--memory', '--cpus', '--port', '--pool', '--count', '--prefix')


class FakeVmfork:
    """A vmfork CLI in memory. calls holds every argv (without the binary
    and global flags); fail_children makes a fork of those names fail."""

    def __init__(self):
        self.machines = {}
        self.templates = []
        self.calls = []
        self.globals = []
        self.fail_children = set()
        self.next_template = 1

    # --- state helpers -------------------------------------------------
    def add_machine(self, name, state='running', parent=None, template=None, hostname=None):
        m = dict(name=name, state=state, driver='qemu', pid=4000 + len(self.machines), memory_mib=256, cpus=1,
                 mac='52:54:00:00:00:%02x' % len(self.machines), ports=[], qmp_socket='/s/%s/qmp.sock' % name)
        if parent:
            m.update(parent=parent, template=template, hostname=hostname or name, addresses=['10.0.2.16/24'])
        self.machines[name] = m
        return m

    def add_template(self, name, source, pool=0):
        t = dict(name=name, id='%s.%d' % (source, self.next_template), source=source, memory_mib=256,
                 has_memory=True, ram_bytes=1 << 20, pause_ms=70.5, children=0, pool_size=pool, pooled=pool)
        self.next_template += 1
        self.templates.append(t)
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
        if '--dry-run' in flags:
            return 0, dict(dry_run=True, command='boot', changed=True, machines=[name],
                           actions=['create machine %r' % name], source_pauses=False), None
        return 0, self.add_machine(name), None

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

    def cmd_fork(self, flags, pos, multi):
        src, names = pos[0], pos[1:]
        kept = self.kept(src)
        if src not in self.machines and not kept:
            return 4, None, 'fork: machine %r: not found' % src
        for n in names:
            if n in self.machines:
                return 2, None, 'fork %r: machine %r: already exists' % (src, n)
        pattern = flags.get('--hostname', '{name}')
        parent = kept['source'] if kept else src

        def host(n, i):
            return pattern.replace('{n}', str(i)).replace('{name}', n).replace('{parent}', parent)
        if '--dry-run' in flags:
            return 0, dict(dry_run=True, command='fork', changed=True, source=src, source_pauses=not kept,
                           template=kept['name'] if kept else None, actions=['start %d children' % len(names)],
                           children=[dict(name=n, index=i + 1, hostname=host(n, i + 1))
                                     for i, n in enumerate(names)]), None
        tid = kept['id'] if kept else self.add_template(None, src)['id']
        res = dict(source=src, template=tid, pause_ms=0 if kept else 68.5, children=[], failed=[])
        for i, n in enumerate(names):
            if n in self.fail_children:
                res['failed'].append(dict(name=n, error='QEMU exited: injected'))
                continue
            m = self.add_machine(n, parent=parent, template=tid, hostname=host(n, i + 1))
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
        if '--dry-run' in flags:
            return 0, dict(dry_run=True, command='template save', changed=True, source=src, template=name,
                           source_pauses=True, actions=['keep']), None
        return 0, self.add_template(name, src, pool), None

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
