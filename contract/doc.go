// Package contract is the fork contract: a per-machine spec of what a
// machine may be, enforced outside the guest, where the guest cannot undo
// it (DESIGN, "The fork contract"). A child is a perfect copy of its
// parent; its contract decides what the copy may reach and hold:
//
//   - network: egress (all, none, or an allow list of HOST:PORT, CIDR:PORT
//     and CIDR entries, TCP and UDP alike), what DNS it may use, and
//     whether the TCP connections it inherited are reset before its NIC
//     comes up;
//   - secrets: values the guest never holds. The guest gets a placeholder;
//     the host's broker puts each child's own value into its requests to
//     the hosts the secret is bound to, and only there;
//   - secret_files: secrets the guest does hold, in its own files. Each
//     child gets the files listed under wipe deleted, and those under
//     rotate rewritten with its own value (a host command's output for
//     that child: mode 0600, the file's owner kept), before its NIC comes
//     up; the parent's files never change. The rest of the guest's memory
//     is its parent's still: a program that read a secret before the fork
//     holds the parent's value until it reads the file again.
//
// A contract is stored in the machine's record and its templates'
// manifests, and children inherit their parent's unless a fork names
// another. This package parses and validates contracts (YAML or JSON,
// unknown keys refused, every error naming its field) and holds no
// enforcement: the drivers and the broker enforce, the identity chain
// applies the guest's part (package customize: the connections reset, the
// secrets' placeholders, the secret files), and the Manager refuses,
// before anything is paused, a contract the driver or the network kind
// cannot enforce.
//
// It is a leaf: it imports nothing of the project.
package contract
