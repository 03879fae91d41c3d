package vmfork

import (
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFileAtomic replaces path with data, mode perm, through a temporary
// file in the same directory, synced, and a rename: a reader (or a crash)
// sees the old file or the new one, never half of one, and a failure
// leaves no temporary file. The one helper for records, caches and the
// files the CLI and drivers write (lima's qemuimgutil does the same).
func WriteFileAtomic(path string, data []byte, perm fs.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// CreateTemp makes 0600 files; Chmod is not subject to the umask.
	if err = tmp.Chmod(perm); err != nil {
		return err
	}
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
