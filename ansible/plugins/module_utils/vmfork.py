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

import ipaddress
import json
import os
import re
import tempfile
from contextlib import contextmanager

from ansible.module_utils.basic import missing_required_lib
from ansible.module_utils.common.yaml import HAS_YAML, yaml_load
from ansible.module_utils.six.moves import shlex_quote

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


def remote_argument_spec():
    """Options of the modules that reach another host over SSH as vmfork
    does (template push/pull, fork --to): its --ssh, --remote-vmfork and
    --idle-timeout."""
    return dict(
        ssh=dict(type='str', default='ssh'),
        remote_binary=dict(type='str', default='vmfork'),
        idle_timeout=dict(type='int'),
    )


def remote_flags(p):
    """vmfork's flags for the remote options in p (checked: idle_timeout > 0)."""
    flags = ['--ssh', p['ssh'], '--remote-vmfork', p['remote_binary']]
    if p['idle_timeout']:
        flags += ['--idle-timeout', '%ds' % p['idle_timeout']]
    return flags


def run_remote(module, p, host, args, what):
    """Runs REMOTE_BINARY -q ARGS --json on host over ssh, with the ssh
    command and remote vmfork of p, as vmfork itself reaches that host, and
    returns its decoded JSON. what says what was asked, for the error."""
    args = list(args)
    at = args.index('--') if '--' in args else len(args)
    words = [p['remote_binary'], '-q'] + [shlex_quote(a) for a in args[:at] + ['--json'] + args[at:]]
    cmd = p['ssh'].split() + [host, ' '.join(words)]
    rc, out, err = module.run_command(cmd)
    if rc != 0:
        lines = (err or out or '').strip().splitlines()
        last = lines[-1] if lines else 'ssh exited %d' % rc
        if last.startswith('vmfork: '):
            last = last[len('vmfork: '):]
        raise VmforkError('%s on %s: %s' % (what, host, last), rc, cmd, out, err)
    try:
        return json.loads(out) if out.strip() else None
    except ValueError:
        raise VmforkError('%s on %s: no JSON in %r' % (what, host, out.strip()[:200]), rc, cmd, out, err)


# --- Spec options: a dict, or the path of a file on the managed host --------

def spec_option_error(name, value):
    """The error for option name (customize, contract) that is neither a
    dict nor a path, or None."""
    if value is None or isinstance(value, (dict, str)):
        return None
    return '%s must be a dict or the path of a YAML or JSON file on the managed host' % name


@contextmanager
def spec_file(value, name):
    """Yields what to pass the CLI for a spec option (--customize FILE,
    --contract FILE): a dict is written to a temp JSON file, removed when
    the block ends, even on failure; a path is passed as it is; None
    yields None."""
    if not isinstance(value, dict):
        yield value or None
        return
    fd, path = tempfile.mkstemp(prefix='vmfork-%s-' % name, suffix='.json')
    try:
        with os.fdopen(fd, 'w') as f:
            json.dump(value, f)
        yield path
    finally:
        os.remove(path)


def load_spec(module, value, name):
    """A spec option's content: a dict as it is, a path read as vmfork
    reads it (JSON if the name ends in .json, else YAML). Fails the task
    when the file cannot be read."""
    if value is None or isinstance(value, dict):
        return value
    as_json = value.lower().endswith('.json')
    if not as_json and not HAS_YAML:
        module.fail_json(msg=missing_required_lib('PyYAML', reason='to read %s %s (or give it as a dict or a .json file)'
                                                  % (name, value)))
    try:
        with open(value) as f:
            doc = json.load(f) if as_json else yaml_load(f)
    except Exception as e:  # pylint: disable=broad-except  # I/O, JSON or YAML errors
        err = ' '.join(str(e).split())
    else:
        return doc if doc is not None else {}
    module.fail_json(msg='%s: cannot read %s: %s' % (name, value, err))


# --- Fork contracts ----------------------------------------------------------
#
# vmfork fills in a contract's defaults and canonical forms when it reads
# one (the contract package: Contract.Validate, ParseDest, Dest.String), and
# ls --json shows the result. normalize_contract does the same here, so a
# contract as a task gives it compares equal to the one vmfork recorded for
# it. The defaults, in one place:
CONTRACT_NETWORK_DEFAULTS = dict(egress='all', dns='host', connections='reset')
CONTRACT_SECRET_DEFAULTS = dict(header='Authorization', format='{value}')
# Beyond the defaults: secret hosts are lowercased; allow-list entries are
# written as Dest.String writes them (host names lowercased without a final
# dot; ADDR:* and CIDR:* without the port; /32 and /128 as the address;
# IPv6 compressed, in brackets before a port). Anything this does not
# recognise is left as written: it then differs from what vmfork recorded,
# and vmfork's own check of it (vmfork contract NAME --set) has the last
# word, so a spec vmfork would refuse is never taken for the one in force.

_HOST_LABEL = re.compile(r'^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$')
_PORT = re.compile(r'^[+-]?[0-9]+$')
_BITS = re.compile(r'^(0|[1-9][0-9]*)$')


def _valid_host(h):
    if not h or len(h) > 253:
        return False
    try:
        ipaddress.ip_address(h)
        return False
    except ValueError:
        pass
    return all(_HOST_LABEL.match(label) for label in (h[:-1] if h.endswith('.') else h).split('.'))


def _addr_str(a):
    """An address as Go's netip.Addr.String writes it."""
    if a.version == 6 and a.ipv4_mapped is not None:
        return '::ffff:%s' % a.ipv4_mapped
    return str(a)


def _parse_ip(addr):
    """(address, bits) for an address or a masked prefix, else None."""
    if '%' in addr:
        return None  # zones cannot be filtered
    try:
        if '/' in addr:
            bits = addr.rsplit('/', 1)[1]
            if not _BITS.match(bits):
                return None
            net = ipaddress.ip_network(addr, strict=True)
            return net.network_address, net.prefixlen
        a = ipaddress.ip_address(addr)
        return a, a.max_prefixlen
    except ValueError:
        return None


def normalize_dest(entry):
    """An egress allow-list entry as vmfork records it, or entry itself
    when it is not one vmfork takes."""
    if not isinstance(entry, str):
        return entry
    s = entry.strip()
    addr, port, has_port = s, '', False
    if s.startswith('['):
        end = s.find(']')
        if end < 0:
            return entry
        addr, rest = s[1:end], s[end + 1:]
        if rest:
            if not rest.startswith(':'):
                return entry
            port, has_port = rest[1:], True
    elif s.count(':') == 1:
        addr, port = s.split(':')
        has_port = True
    number = 0
    if has_port and port != '*':
        if not _PORT.match(port) or not 1 <= int(port) <= 65535:
            return entry
        number = int(port)
    ip = _parse_ip(addr)
    if ip is None:
        if '/' in addr or not _valid_host(addr) or not has_port:
            return entry
        return '%s:%s' % ((addr[:-1] if addr.endswith('.') else addr).lower(), number or '*')
    a, bits = ip
    text = _addr_str(a) if bits == a.max_prefixlen else '%s/%d' % (_addr_str(a), bits)
    if number == 0:
        return text
    if a.version == 6:
        return '[%s]:%d' % (text, number)
    return '%s:%d' % (text, number)


def normalize_contract(c):
    """Contract c (a dict, as a task or vmfork ls --json gives it; None for
    none) with vmfork's defaults and canonical forms, for comparing. A
    contract that asks for nothing is {}, as no contract is."""
    if not isinstance(c, dict):
        return {} if c is None else c
    out = dict((k, v) for k, v in c.items() if k not in ('network', 'secrets'))
    net = c.get('network')
    if isinstance(net, dict):
        n = dict(net)
        if 'egress' not in n:
            n['egress'] = CONTRACT_NETWORK_DEFAULTS['egress']
        egress = n['egress']
        if isinstance(egress, dict) and isinstance(egress.get('allow'), list):
            n['egress'] = dict(egress, allow=[normalize_dest(d) for d in egress['allow']])
        for key in ('dns', 'connections'):
            if n.get(key) in (None, ''):
                n[key] = CONTRACT_NETWORK_DEFAULTS[key]
        out['network'] = n
    elif net is not None:
        out['network'] = net
    secrets = c.get('secrets')
    if isinstance(secrets, dict):
        if secrets:
            out['secrets'] = dict((name, _normalize_secret(s)) for name, s in secrets.items())
    elif secrets is not None:
        out['secrets'] = secrets
    return out


def _normalize_secret(s):
    if not isinstance(s, dict):
        return s
    s = dict(s)
    if isinstance(s.get('hosts'), list):
        s['hosts'] = [h.lower() if isinstance(h, str) else h for h in s['hosts']]
    for key, default in CONTRACT_SECRET_DEFAULTS.items():
        if s.get(key) in (None, ''):
            s[key] = default
    if isinstance(s.get('value_from'), dict):
        s['value_from'] = dict((k, v) for k, v in s['value_from'].items() if v not in (None, ''))
    return s


def converge_contract(vm, machine, want, path):
    """Makes existing machine's contract want (the spec, as loaded) by
    running vmfork contract NAME --set PATH, with --dry-run in check mode;
    returns its JSON (the new contract, or the plan), or None when the
    machine has that contract already. Only the network part changes in
    place: when the secrets differ, vmfork refuses (exit 2) with its own
    message and changes nothing, and so does its dry run."""
    if normalize_contract(machine.get('contract')) == normalize_contract(want):
        return None
    args = ['contract', '--set', path, machine['name']]
    if vm.module.check_mode:
        args = dry_run_args(args)
    return vm.run(args)
