// Package sharedmem freezes guest RAM into template files and accounts for
// the memory that fork children share. It also holds the pause window of a
// freeze (window.go), which both drivers use to keep a source from ever
// being left paused.
//
// A booted machine maps its RAM file on tmpfs share=on: the file is the
// guest's memory. A freeze does not copy it while the guest is paused: the
// file becomes the template, and the paused QEMU is remapped in place
// (Remap, remap_linux_amd64.go) to a private copy-on-write mapping of it at
// the same address, so that the guest's later writes go to private pages.
// A machine mapped that way is frozen again by copying its frozen file
// before the pause and only its private pages (CopyPrivate, found in
// /proc/PID/pagemap) in it, or, where the caller allows it, by a delta
// (delta.go): the frozen file as the template's base plus a sparse file of
// the private pages, the source's writes tracked between deltas so that the
// pause writes only what changed (track.go). Plan (plan.go) is that recipe,
// the same for both drivers: they hand it QEMU's pid and a QMP client that
// passes files.
// Freeze, a copy of the whole file in the pause, remains for QEMUs that
// cannot be remapped.
//
// Every copy of a RAM file, here and in the root package (a hibernation's
// copy on disk, an exported archive), finds its data the same way
// (extents.go): the data extents that SEEK_DATA and SEEK_HOLE report. The
// copies that leave zero pages out as holes find them there too.
//
// A frozen template file is never written again: not by vmfork, and not by
// the children, which map it privately, so that their writes go to private
// copy-on-write pages. On Linux, changes to a file show through a
// MAP_PRIVATE mapping for pages a child has not written yet, so any later
// write, truncation or hole punched in a template would silently corrupt
// every child. The file is only ever removed, when no child maps it; a file
// that no longer has a template's name and that no other process maps
// (Exclusive) is its source's own again.
package sharedmem
