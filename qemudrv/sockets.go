package qemudrv

import (
	"os"
	"path/filepath"
)

// privateSockets makes the unix sockets in a machine's directory 0600. QEMU
// binds its QMP and agent sockets with the process umask (vmfork's 077
// leaves them 0700) and has no option for their mode; by the time QMP
// answers, every chardev socket is bound. The directory is 0700 already:
// this is the second lock on the door.
func privateSockets(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			os.Chmod(filepath.Join(dir, e.Name()), 0o600)
		}
	}
}
