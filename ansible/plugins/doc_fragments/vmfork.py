# -*- coding: utf-8 -*-
# Copyright: vmfork developers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # Options of every vmfork module, passed to the CLI as global flags.
    DOCUMENTATION = r'''
options:
  binary:
    description:
      - The vmfork executable on the managed host, a name looked up on C(PATH) or a path.
    type: str
    default: vmfork
  state_dir:
    description:
      - vmfork's state directory (C(--state-dir)).
      - Defaults to C(VMFORK_STATE_DIR), else C(/var/lib/vmfork) for root.
    type: path
  mem_dir:
    description:
      - Directory for guest RAM files, a tmpfs (C(--mem-dir)). Defaults to C(/dev/shm/vmfork).
    type: path
  uri:
    description:
      - libvirt connection URI, as in community.libvirt (for example C(qemu:///system)).
      - When set, vmfork uses its libvirt driver and machines are libvirt domains.
      - Without it, the embedded QEMU driver runs machines without a daemon.
    type: str
  timeout:
    description:
      - Give up on each vmfork command after this many seconds (C(--timeout)); no limit when unset.
    type: int
notes:
  - The modules run the C(vmfork) CLI on the managed host with C(--json) and return its JSON.
  - A failed command fails the task with the CLI's one-line error as C(msg) and its exit code as C(rc)
    (2 bad input, nothing changed; 3 partial success; 4 no such machine or template).
requirements:
  - vmfork on the managed host
'''
