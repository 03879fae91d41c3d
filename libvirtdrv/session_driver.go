//go:build cgo

package libvirtdrv

import "fmt"

// SessionProblem says, for a session daemon (session true), what keeps it
// from running vmfork's forks as they should, in one line ("" for nothing):
// a memory_backing_dir that is not on a tmpfs, where a fork of a fork child
// is refused and a first fork copies the source's RAM in the pause.
func (d *Driver) SessionProblem() (problem string, session bool) {
	if !isLocalSession(d.uri) {
		return "", false
	}
	conf := SessionQEMUConf()
	dir, err := configuredMemoryBackingDir(conf)
	if err != nil {
		return err.Error(), true
	}
	if dir == "" || !onTmpfs(dir) {
		return fmt.Sprintf("the session's guest RAM directory (memory_backing_dir in %s: %q) is not on a tmpfs: run `vmfork --connect %s libvirt setup`, then let the session daemon restart", conf, dir, d.uri), true
	}
	return "", true
}
