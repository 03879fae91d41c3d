//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// secretFilesContract wipes /etc/app/cache and gives each child its own
// /etc/app/token, from a host command run for it.
const secretFilesContract = `network: {egress: all, connections: keep}
secret_files:
  wipe: [/etc/app/cache]
  rotate:
    /etc/app/token: {exec: 'echo "tok-$VMFORK_NAME"'}
`

// plantSecretFiles gives machine name the files the contract acts on: a
// token of mode 0640 owned by owner (uid:gid), and a cache.
func plantSecretFiles(e *env, name, owner string) {
	e.t.Helper()
	e.exec(name, "sh", "-c", `mkdir -p /etc/app && echo parent-token >/etc/app/token && chown "$1" /etc/app/token &&
chmod 640 /etc/app/token && echo parent-cache >/etc/app/cache`, "sh", owner)
}

// forkSecretFiles forks parent into 2 children under secretFilesContract
// and checks them (checkSecretFiles).
func forkSecretFiles(t *testing.T, e *env, parent, owner string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "contract.yaml")
	if err := os.WriteFile(file, []byte(secretFilesContract), 0o600); err != nil {
		t.Fatal(err)
	}
	res, r := e.forkID(0, parent, "--count", "2", "--contract", file)
	if len(res.Children) != 2 {
		t.Fatalf("fork: %+v (%s)", res, r)
	}
	for _, c := range res.Children {
		id := c.Identity
		var names []string
		for _, s := range id.Steps {
			names = append(names, s.Name)
		}
		// Their own steps in the fork's JSON, before the NIC comes up.
		wipe, rotate, network := slices.Index(names, "vmfork.secret-files.wipe"), slices.Index(names, "vmfork.secret-files.rotate"), slices.Index(names, "vmfork.network")
		if wipe < 0 || rotate != wipe+1 || network < rotate {
			t.Errorf("%s: steps %v, want wipe then rotate before vmfork.network", c.Name, names)
		}
		t.Logf("%s: wipe %.1f ms, rotate %.1f ms (its hook included), %d guest commands in the chain", c.Name,
			id.step("vmfork.secret-files.wipe").DurationMS, id.step("vmfork.secret-files.rotate").DurationMS, id.GuestCommands)
		if s := id.step("vmfork.secret-files.wipe"); s.Status != "ok" || s.Detail != "1 wiped, 0 absent" {
			t.Errorf("%s: wipe step %+v", c.Name, s)
		}
		if s := id.step("vmfork.secret-files.rotate"); s.Status != "ok" || s.Detail != "1 rotated (mode 0600, owner kept)" {
			t.Errorf("%s: rotate step %+v", c.Name, s)
		}
		if got, want := e.exec(c.Name, "cat", "/etc/app/token"), "tok-"+c.Name+"\n"; got != want {
			t.Errorf("%s: token %q, want %q", c.Name, got, want)
		}
		if got := strings.TrimSpace(e.exec(c.Name, "stat", "-c", "%a %u:%g", "/etc/app/token")); got != "600 "+owner {
			t.Errorf("%s: token mode and owner %q, want 600 %s", c.Name, got, owner)
		}
		if r := e.vmfork("exec", c.Name, "--", "test", "-e", "/etc/app/cache"); r.code == 0 {
			t.Errorf("%s: /etc/app/cache is still there", c.Name)
		}
		if got := strings.Fields(e.exec(c.Name, "ls", "-a", "/etc/app")); strings.Join(got, " ") != ". .. token" {
			t.Errorf("%s: /etc/app holds %v, want the token alone (no temporary file left)", c.Name, got)
		}
	}
	// The parent's files never change.
	if got := e.exec(parent, "cat", "/etc/app/token", "/etc/app/cache"); got != "parent-token\nparent-cache\n" {
		t.Errorf("parent: files %q, want its own", got)
	}
	if got := strings.TrimSpace(e.exec(parent, "stat", "-c", "%a %u:%g", "/etc/app/token")); got != "640 "+owner {
		t.Errorf("parent: token mode and owner %q, want 640 %s", got, owner)
	}
}

// TestSecretFiles is issue 23's secrets on disk on the busybox guest: a
// fork's contract wipes a file and rotates another in each child, before
// its NIC comes up, each child's value its own; the parent is unchanged.
func TestSecretFiles(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("src")
	plantSecretFiles(e, "src", "1000:1001")
	forkSecretFiles(t, e, "src", "1000:1001")
}

// TestSecretFilesDebian is the same on the stock Debian 12 guest (its
// coreutils, ext4 root disk): a machine forked from the shared template
// (tests/doc.go), one fork of two children.
func TestSecretFilesDebian(t *testing.T) {
	parallel(t) // heavy and self-contained (tests/doc.go, "Parallel")
	e := newDebianEnv(t)
	e.forkDebian("deb")
	e.settle("deb")
	// www-data, a user every Debian has.
	plantSecretFiles(e.env, "deb", "33:33")
	forkSecretFiles(t, e.env, "deb", "33:33")
}
