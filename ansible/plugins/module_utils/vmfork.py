# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs the vmfork CLI for the modules and reads its JSON.

The modules are thin on purpose: the CLI checks every request and prints
one JSON document on stdout with --json; what it prints is the contract
(golden-tested in cmd/vmfork). Failures keep the CLI's one-line error and
its exit code: 2 bad input, 3 partial success, 4 no such machine.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

EXIT_USAGE = 2
EXIT_PARTIAL = 3
EXIT_NOT_FOUND = 4


def common_argument_spec():
    """Options every module shares (doc fragment vmfork.vmfork.vmfork)."""
    return dict(
        binary=dict(type='str', default='vmfork'),
        state_dir=dict(type='path'),
        mem_dir=dict(type='path'),
        uri=dict(type='str'),
        timeout=dict(type='int'),
    )


def dry_run_args(args, words=1):
    """args with --dry-run after the command's words (1 for fork, 2 for
    template save): the CLI's check of the same request, changing nothing."""
    return args[:words] + ['--dry-run'] + args[words:]


def record_change(module, result, before, after):
    """Marks result changed when the module made (or, in check mode, would
    make) a change, after being the state it leads to (None: no change),
    with before and after as the diff in diff mode."""
    if after is None:
        return
    result['changed'] = True
    if module._diff:
        result['diff'] = dict(before=before, after=after)


class VmforkError(Exception):
    """A vmfork command failed: msg is its one-line error, rc its exit code."""

    def __init__(self, msg, rc, cmd, stdout='', stderr='', result=None):
        super(VmforkError, self).__init__(msg)
        self.msg, self.rc, self.cmd = msg, rc, cmd
        self.stdout, self.stderr, self.result = stdout, stderr, result


def error_line(stderr, rc):
    """The CLI's error: the last line it printed as 'vmfork: ...'."""
    lines = [ln.strip() for ln in (stderr or '').splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith('vmfork: '):
            return ln[len('vmfork: '):]
    if lines:
        return lines[-1]
    return 'vmfork exited with code %d' % rc


class Vmfork:
    """One module's view of the vmfork CLI."""

    def __init__(self, module):
        self.module = module
        p = module.params
        binary = p.get('binary') or 'vmfork'
        if '/' not in binary:
            binary = module.get_bin_path(binary, required=True)
        self.base = [binary]
        if p.get('state_dir'):
            self.base += ['--state-dir', p['state_dir']]
        if p.get('mem_dir'):
            self.base += ['--mem-dir', p['mem_dir']]
        if p.get('uri'):
            self.base += ['--connect', p['uri']]
        if p.get('timeout'):
            self.base += ['--timeout', '%ds' % p['timeout']]
        # Progress and logs stay on stderr; -q keeps them to errors, so
        # the last line there is the error when there is one.
        self.base += ['-q']

    def run(self, args, ok_codes=(0,), data=None):
        """Runs vmfork ARGS --json and returns its decoded JSON (or None
        when it printed nothing). Raises VmforkError on another exit code;
        the error carries what the CLI printed, JSON included (a partial
        fork lists the children that came up)."""
        args = list(args)
        # --json belongs to the command: before a "--" that ends its flags
        # (exec NAME -- CMD), else at the end.
        at = args.index('--') if '--' in args else len(args)
        cmd = self.base + args[:at] + ['--json'] + args[at:]
        rc, out, err = self.module.run_command(cmd, data=data, binary_data=data is not None)
        doc = None
        if out and out.strip():
            try:
                doc = json.loads(out)
            except ValueError:
                if rc in ok_codes:
                    raise VmforkError('vmfork printed no JSON: %s' % out.strip()[:200], rc, cmd, out, err)
        if rc not in ok_codes:
            raise VmforkError(error_line(err, rc), rc, cmd, out, err, doc)
        return doc

    def machines(self):
        """Every machine, by name (vmfork ls)."""
        return dict((m['name'], m) for m in (self.run(['ls']) or []))

    def templates(self):
        """Every template (vmfork template ls)."""
        return self.run(['template', 'ls']) or []

    def kept(self, name):
        """The kept template called name, or None."""
        for t in self.templates():
            if t.get('name') == name:
                return t
        return None

    def fail(self, e, **extra):
        """Fails the task with e's one-line error and exit code."""
        self.module.fail_json(msg=e.msg, rc=e.rc, cmd=' '.join(e.cmd), stdout=e.stdout, stderr=e.stderr, **extra)
