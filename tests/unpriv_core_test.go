//go:build integration

package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestUnprivilegedCore is the core suite as an ordinary user, in one guest:
// a user without capabilities or the kvm group (so under TCG) boots a
// machine on a bridge (through qemu-bridge-helper), forks it and the child,
// keeps a template and forks that, hibernates and resumes a child, explores,
// and exports the template; what needs root is refused in one line; a
// second user sees and touches none of it. Where the kernel has Yama, it
// runs under ptrace_scope 1, which the fork must get through.
func TestUnprivilegedCore(t *testing.T) {
	parallel(t)
	started := time.Now()
	step := func(what string) { t.Logf("%6.1f s: %s", time.Since(started).Seconds(), what) }
	yama1(t)
	br := newBridgeNet(t)
	helper, plainHelper := bridgeHelpers(t)
	u, other := newUnprivUser(t), newUnprivUser(t)
	// The binary and the guest where the user may read them: the test's
	// own copies, since the build tree or the guest cache may be closed.
	g := testGuest(t)
	bin := filepath.Join(u.home, "vmfork")
	u.copyFor(t, os.Getenv("VMFORK_BIN"), bin, 0o755)
	for _, p := range []*string{&g.Kernel, &g.Initrd, &g.Disk} {
		dst := filepath.Join(u.home, filepath.Base(*p))
		u.copyFor(t, *p, dst, 0o600)
		*p = dst
	}
	e := newEnvGuest(t, g)
	os.RemoveAll(e.memDir)
	// The user's defaults; passed explicitly as well, for the harness.
	e.bin = bin
	e.stateDir = filepath.Join(u.home, ".local", "state", "vmfork")
	e.memDir = "/dev/shm/vmfork-" + strconv.Itoa(u.uid)
	// In the bridge's namespace, with the helper named (setpriv resets
	// the environment; env sets it again).
	asUser := func(h string) []string {
		return slices.Concat([]string{"ip", "netns", "exec", br.ns}, u.as(), []string{"env", "VMFORK_BRIDGE_HELPER=" + h})
	}
	bridge := "bridge=" + br.bridge
	bootArgs := []string{"boot", "src", "--kernel", g.Kernel, "--initrd", g.Initrd, "--disk", g.Disk, "--memory", "256M", "--network", bridge}

	// Refused in one line each, before anything is made: a helper that
	// is not setuid; a tun device the user may not open (the helper
	// opens it as the user; root's own taps do not care); an allow list
	// without the bridge.
	e.runAs = asUser(plainHelper)
	oneLineRefusal(t, e.vmfork(bootArgs...), "chmod u+s "+plainHelper)
	e.runAs = asUser(helper)
	tunMode(t, 0o600)
	oneLineRefusal(t, e.vmfork(bootArgs...), "chmod 0666 /dev/net/tun")
	tunMode(t, 0o666) // udev's
	oneLineRefusal(t, e.vmfork(bootArgs...), "allow "+br.bridge)
	if ms := e.list(); len(ms) != 0 {
		t.Fatalf("refused boots left machines %v", ms)
	}
	allowBridge(t, br.bridge)

	step("boot on the bridge")
	e.ok(bootArgs...)
	out, err := exec.Command("ip", "-n", br.ns, "-o", "link", "show", "master", br.bridge).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tap") {
		t.Fatalf("ports of %s after the boot: %v: %s; want the helper's tap", br.bridge, err, out)
	}
	// A contract's network rules are nftables rules: root's.
	none := filepath.Join(u.home, "none.yaml")
	if err := os.WriteFile(none, []byte("network: {egress: none}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	oneLineRefusal(t, e.vmfork("fork", "src", "--contract", none), "CAP_NET_ADMIN")

	step("fork")
	var res forkJSON
	e.jsonOK(&res, "fork", "src", "kid")
	if len(res.Children) != 1 || res.Children[0].State != "running" || len(res.Failed) != 0 {
		t.Fatalf("fork as uid %d = %+v, want one running child", u.uid, res)
	}
	t.Logf("fork as uid %d on the bridge: pause %.1f ms, child ready in %.0f ms", u.uid, res.PauseMS, res.Children[0].ReadyMS)
	// Identity: its own name, and an address from the bridge's DHCP
	// server, which it reaches.
	if got := strings.TrimSpace(e.exec("kid", "hostname")); got != "kid" {
		t.Errorf("child's hostname %q, want kid", got)
	}
	if out := e.vmfork("exec", "kid", "--", "ping", "-c", "1", "-W", "3", br.gateway); out.code != 0 {
		t.Errorf("the child does not reach the bridge's gateway %s: %s", br.gateway, out)
	}
	// A child maps its template privately: forking it takes the Diff
	// path (its frozen file copied, its own pages read from its page map
	// and with process_vm_readv), all of it open to the same user.
	step("fork of the child")
	var res2 forkJSON
	e.jsonOK(&res2, "fork", "kid", "grandkid")
	if len(res2.Children) != 1 || res2.Children[0].State != "running" || len(res2.Failed) != 0 {
		t.Fatalf("fork of the child as uid %d = %+v, want one running child", u.uid, res2)
	}
	t.Logf("fork of the child: pause %.1f ms, ready in %.0f ms", res2.PauseMS, res2.Children[0].ReadyMS)
	if got := strings.TrimSpace(e.exec("grandkid", "sh", "-c", "echo alive")); got != "alive" {
		t.Fatalf("grandchild answers %q", got)
	}

	step("template save, fork of it")
	e.ok("exec", "src", "--", "sh", "-c", "mkdir -p /data && echo kept > /data/at-save && sync")
	e.ok("template", "save", "src", "gold")
	e.ok("fork", "gold", "tkid")
	if got := strings.TrimSpace(e.exec("tkid", "cat", "/data/at-save")); got != "kept" {
		t.Errorf("the template's child reads %q, want kept", got)
	}

	step("hibernate, resume")
	e.ok("exec", "tkid", "--", "sh", "-c", "echo before > /tmp/mark")
	e.ok("hibernate", "tkid")
	if ms := e.list(); !slices.ContainsFunc(ms, func(m machineJSON) bool { return m.Name == "tkid" && m.State == "hibernated" }) {
		t.Errorf("after hibernate: %+v, want tkid hibernated", ms)
	}
	e.ok("resume", "tkid")
	if got := strings.TrimSpace(e.exec("tkid", "cat", "/tmp/mark")); got != "before" {
		t.Errorf("resumed machine reads %q from its RAM, want before", got)
	}

	step("explore")
	var ex exploreJSON
	e.jsonOK(&ex, "explore", "src", "--try", "exit 1", "--try", "echo won > /data/w", "--keep-as", "best")
	if ex.Winner != "best" || ex.WinnerTry != 2 {
		t.Errorf("explore: winner %q from try %d, want best from try 2: %+v", ex.Winner, ex.WinnerTry, ex)
	}
	if got := strings.TrimSpace(e.exec("best", "cat", "/data/w")); got != "won" {
		t.Errorf("the kept winner reads %q, want won", got)
	}

	step("export, import")
	archive := filepath.Join(u.home, "gold.vmt")
	e.ok("template", "export", "gold", archive)
	e.ok("template", "import", archive, "--as", "gold2")
	privateTo(t, archive, u.uid)

	step("what is the user's alone")
	// The defaults are the same store: `ls` without dir flags sees it.
	lsArgv := slices.Concat(u.as(), []string{bin, "ls"})
	if out, err := exec.Command(lsArgv[0], lsArgv[1:]...).CombinedOutput(); err != nil || !strings.Contains(string(out), "grandkid") {
		t.Fatalf("vmfork ls as the user with default dirs: %v: %s", err, out)
	}
	privateTo(t, e.stateDir, u.uid)
	privateTo(t, e.memDir, u.uid)
	rams, _ := filepath.Glob(filepath.Join(e.memDir, "*"))
	if len(rams) < 4 {
		t.Fatalf("RAM files %v: want those of the source, the children and the templates", rams)
	}
	for _, p := range append(rams, filepath.Join(e.stateDir, "machines", "kid")) {
		privateTo(t, p, u.uid)
	}
	twoUsersApart(t, e, u, other)
}

// twoUsersApart: user other sees none of u's machines with its own
// defaults, cannot read u's RAM files or records, and its fork of u's
// source fails in one line, by name or with u's dirs; root's vmfork refuses
// u's store and u's refuses one root owns.
func twoUsersApart(t *testing.T, e *env, u, other *unprivUser) {
	obin := filepath.Join(other.home, "vmfork")
	other.copyFor(t, os.Getenv("VMFORK_BIN"), obin, 0o755)
	as := func(argv ...string) ([]byte, error) {
		a := slices.Concat(other.as(), argv)
		return exec.Command(a[0], a[1:]...).CombinedOutput()
	}
	if out, err := as(obin, "ls", "--json"); err != nil || strings.Contains(string(out), "src") {
		t.Errorf("the other user's ls: %v: %s; want none of %s's machines", err, out, u.name)
	}
	rams, _ := filepath.Glob(filepath.Join(e.memDir, "*"))
	for _, p := range []string{rams[0], filepath.Join(e.stateDir, "machines", "src", "machine.json")} {
		if out, err := as("head", "-c1", p); err == nil {
			t.Errorf("the other user read %s: %q", p, out)
		}
	}
	out, err := as(obin, "fork", "src")
	if err == nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("the other user's fork of src: %v: %s; want one line refusing it", err, out)
	}
	out, err = as(obin, "--state-dir", e.stateDir, "--mem-dir", e.memDir, "fork", "src")
	if err == nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("the other user's fork of src with %s's dirs: %v: %s; want one line refusing it", u.name, err, out)
	}
	if n := len(e.list()); n != 5 { // src, kid, grandkid, tkid, best
		t.Errorf("%s has %d machines after the other user's tries", u.name, n)
	}

	// Root's vmfork refuses the user's store, and the user's refuses one
	// root owns, in one line each.
	r := exec.Command(os.Getenv("VMFORK_BIN"), "--state-dir", e.stateDir, "--mem-dir", e.memDir, "ls")
	if out, err := r.CombinedOutput(); err == nil || !strings.Contains(string(out), "belongs to uid "+strconv.Itoa(u.uid)) {
		t.Errorf("root's vmfork on the user's store: %v: %s; want it refused", err, out)
	}
	rootStore, err := os.MkdirTemp("", "vmfork-rootstore-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(rootStore) })
	os.Chmod(rootStore, 0o755) // the user may look, not write
	rootState, rootMem := filepath.Join(rootStore, "state"), filepath.Join(rootStore, "mem")
	for _, d := range []string{rootState, rootMem} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := slices.Concat(u.as(), []string{e.bin, "--state-dir", rootState, "--mem-dir", rootMem, "ls"})
	if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err == nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("the user's vmfork on root's store: %v: %s; want one line refusing it", err, out)
	}
}

// oneLineRefusal fails the test unless r failed with one line on stderr
// saying want, besides progress logs ("level=info ...").
func oneLineRefusal(t *testing.T, r result, want string) {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		if !strings.HasPrefix(l, "level=") {
			lines = append(lines, l)
		}
	}
	msg := strings.Join(lines, "\n")
	if r.code == 0 || strings.Contains(msg, "\n") || !strings.Contains(msg, want) {
		t.Errorf("%s; want a one-line refusal saying %q", r, want)
	}
}
