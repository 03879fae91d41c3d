// Package proc tells whether a process vmfork started (a QEMU, a daemon)
// is still alive: by PID, guarded by a marker in its command line against a
// PID reused after it exited, and counting a zombie as exited (this host's
// PID 1 reaps orphans late).
package proc
