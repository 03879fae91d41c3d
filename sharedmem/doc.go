// Package sharedmem freezes guest RAM into template files and accounts for
// the memory that fork children share. It also holds the pause window of a
// freeze (window.go), which both drivers use to keep a source from ever
// being left paused.
//
// A forkable machine maps its RAM file on tmpfs share=on: the file is the
// guest's memory. Freeze copies that file, while the guest is paused, into a
// new template file: only the allocated extents (tmpfs keeps untouched guest
// pages as holes), to a temporary name, renamed into place when complete.
//
// A frozen template file is never written again: not by vmfork, and not by
// the children, which map it share=off (MAP_PRIVATE) so that their writes go
// to private copy-on-write pages. On Linux, changes to a file show through a
// MAP_PRIVATE mapping for pages a child has not written yet, so any later
// write, truncation or hole punched in a template would silently corrupt
// every child. The file is only ever removed, when no child maps it.
package sharedmem
